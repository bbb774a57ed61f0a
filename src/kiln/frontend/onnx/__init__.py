"""ONNX frontend: :func:`from_onnx`."""

from .converter import Context, from_onnx, load_onnx, onnx_op, supported_ops

__all__ = ["from_onnx", "load_onnx", "onnx_op", "supported_ops", "Context"]
