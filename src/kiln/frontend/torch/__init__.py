"""PyTorch frontend: :func:`from_exported_program` and :func:`from_torch` (``torch.export``).

Importing this package does not import ``torch``; the functions do, when called.
"""

from .converter import Args, Context, aten_op, from_exported_program, from_torch, supported_ops

__all__ = ["from_exported_program", "from_torch", "aten_op", "supported_ops", "Context", "Args"]
