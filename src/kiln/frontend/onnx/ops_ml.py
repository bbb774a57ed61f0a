"""Converters for the ``ai.onnx.ml`` domain (classical ML operators), built from IR ops.

Registered as ``"ai.onnx.ml.<OpType>"`` (see :func:`~kiln.frontend.onnx.converter.onnx_op`).
String-typed variants (LabelEncoder on strings, ZipMap) need string tensors, which Kiln does
not have yet.
"""

from __future__ import annotations

import numpy as np

from .converter import Context, onnx_op

_NUMERIC = ("float32", "float64", "int32", "int64")


@onnx_op("ai.onnx.ml.Binarizer")
def _binarizer(ctx: Context, node, ins, attrs):
    """``1`` where ``x > threshold``, else ``0``, in the input's type."""
    x = ins[0]
    if x.dtype not in _NUMERIC:
        raise ctx.bad(f"input must be one of {', '.join(_NUMERIC)}, got {x.dtype}")
    thr = ctx.const(np.array(attrs.get("threshold", 0.0), dtype=np.dtype(x.dtype)))
    return ctx.cast(ctx.emit1("greater", x, thr), x.dtype)


@onnx_op("ai.onnx.ml.ArrayFeatureExtractor")
def _array_feature_extractor(ctx: Context, node, ins, attrs):
    """The columns ``Y`` (int64 indices into the last axis) of ``X``; a 1-D ``X`` is one row."""
    x, idx = ins
    if idx.dtype != "int64":
        raise ctx.bad(f"indices must be int64, got {idx.dtype}")
    if len(x.shape) == 0:
        raise ctx.bad("X must have at least one dimension")
    if len(x.shape) == 1:
        x = ctx.reshape(x, (1,) + tuple(x.shape))
    flat = ctx.reshape(idx, (int(np.prod(idx.shape, dtype=np.int64)),))
    return ctx.emit1("take", x, flat, axis=len(x.shape) - 1)
