"""Model importers.

``kiln.frontend.from_onnx(model_or_path, shape=None, dtype=None, freeze=None) -> (Graph, params)``
"""

from .onnx import from_onnx, load_onnx, supported_ops

__all__ = ["from_onnx", "load_onnx", "supported_ops"]
