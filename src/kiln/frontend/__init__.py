"""Model importers.

``kiln.frontend.from_onnx(model_or_path, shape=None, dtype=None, freeze=None) -> (Graph, params)``
``kiln.frontend.from_exported_program(ep) -> (Graph, params)`` (imports torch when called)
``kiln.frontend.from_torch(module, example_inputs, dynamic_shapes=None) -> (Graph, params)``
"""

from .onnx import from_onnx, load_onnx, supported_ops
from .torch import from_exported_program, from_torch

__all__ = ["from_onnx", "load_onnx", "supported_ops", "from_exported_program", "from_torch"]
