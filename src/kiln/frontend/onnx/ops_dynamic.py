"""Converters of ONNX ops whose output shape depends on input values: NonZero, Compress,
NonMaxSuppression, Unique, and TopK / Range when K / the bounds are computed at run time.

Each converter declares a fresh data-dependent symbol (``nonzero_0``, ``unique_1`` ...) with
the range ``0..upper bound`` and emits the ``kiln.ir.ops.dynamic`` op naming it (``out_dim``);
downstream ops then carry the symbol like any symbolic dim (``docs/dynamic_shapes.md``). When
every input that decides the shape is static, the result is computed at import instead (or
the static converter of ``ops_index`` / ``ops_math`` / ``ops_tensor`` handles the node).

Registered after those modules (``converter._load_converters``), so these converters take over
Compress, TopK and Range and hand the static cases back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir.ops.dynamic import nms_reference, unique_reference
from ...ir.types import np_dtype
from .converter import Context, onnx_op
from .ops_index import _compress as _static_compress
from .ops_math import _topk as _static_topk
from .ops_tensor import _range as _static_range

#: Upper bound of the length of a Range whose start / limit / delta are computed at run time
#: (storage is planned for it; a longer range fails at run time naming the dim and its range).
RANGE_MAX_LENGTH = 65536


def _fresh_dim(ctx: Context, base: str, hi: int) -> str:
    """Declare and return a new data-dependent symbol ``<base>_<k>`` with range ``0..hi``."""
    k = 0
    while f"{base}_{k}" in ctx.graph.dim_ranges:
        k += 1
    name = f"{base}_{k}"
    ctx.graph.declare_dim(name, 0, int(hi), data_dependent=True)
    return name


def _present(ins: list, i: int) -> Any:
    return ins[i] if len(ins) > i else None


@onnx_op("NonZero")
def _nonzero(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x = ins[0]
    if x.type.ndim == 0:
        raise ctx.unsupported("NonZero of a scalar (0-D input)")
    arr = ctx.try_static(x)
    if arr is not None:
        return ctx.const(np.array(np.nonzero(arr), dtype=np.int64).reshape(x.type.ndim, -1))
    d = _fresh_dim(ctx, "nonzero", x.type.size)
    return ctx.emit("nonzero", [x], {"out_dim": d})


@onnx_op("Compress")
def _compress(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x, cond = ins
    if ctx.is_static(cond):
        return _static_compress(ctx, node, ins, attrs)
    if cond.type.ndim != 1:
        raise ctx.bad(f"input 'condition' must be 1-D, got shape {cond.shape}")
    axis = ctx.axis(attrs["axis"], x.type.ndim) if "axis" in attrs else None
    n = x.type.size if axis is None else x.shape[axis]
    d = _fresh_dim(ctx, "compress", min(n, cond.shape[0]))
    return ctx.emit("compress", [x, ctx.cast(cond, "bool")], {"axis": axis, "out_dim": d})


def _scalar(ctx: Context, v: Any, what: str, default: Any) -> Any:
    if v is None:
        return default
    arr = np.asarray(ctx.static(v, what)).reshape(-1)
    if arr.size != 1:
        raise ctx.bad(f"input {what!r} must hold one value, got shape {np.asarray(ctx.static(v, what)).shape}")
    return arr[0].item()


@onnx_op("NonMaxSuppression")
def _nms(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    boxes, scores = ins[0], ins[1]
    max_out = int(_scalar(ctx, _present(ins, 2), "max_output_boxes_per_class", 0))
    iou = float(_scalar(ctx, _present(ins, 3), "iou_threshold", 0.0))
    thr = _scalar(ctx, _present(ins, 4), "score_threshold", None)
    center = int(attrs.get("center_point_box", 0))
    if center not in (0, 1):
        raise ctx.bad(f"center_point_box must be 0 or 1, got {center}")
    if boxes.type.ndim != 3 or scores.type.ndim != 3:
        raise ctx.bad(f"boxes and scores must be 3-D, got {boxes.shape} and {scores.shape}")
    if ctx.dims(boxes)[:2] != ctx.dims(scores)[::2] or ctx.dims(boxes)[2] != 4:
        raise ctx.bad(f"boxes must be (batch, boxes, 4) and scores (batch, classes, boxes), got dims "
                      f"{ctx.dims(boxes)} and {ctx.dims(scores)}")
    thr = None if thr is None else float(thr)
    bv, sv = ctx.try_static(boxes), ctx.try_static(scores)
    if bv is not None and sv is not None:
        return ctx.const(nms_reference(bv, sv, max_out, iou, thr, center))
    b, c, n = scores.shape
    d = _fresh_dim(ctx, "nms", b * c * max(0, min(n, max_out)))
    f32 = [ctx.cast(v, "float32") for v in (boxes, scores)]
    return ctx.emit("non_max_suppression", f32,
                    {"max_output_boxes_per_class": max_out, "iou_threshold": iou, "score_threshold": thr,
                     "center_point_box": center, "out_dim": d})


@onnx_op("Unique")
def _unique(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x = ins[0]
    axis = ctx.axis(attrs["axis"], x.type.ndim) if "axis" in attrs else None
    is_sorted = bool(attrs.get("sorted", 1))
    arr = ctx.try_static(x)
    if arr is not None:
        return [ctx.const(a) for a in unique_reference(arr, is_sorted, axis)]
    d = _fresh_dim(ctx, "unique", x.type.size if axis is None else x.shape[axis])
    return ctx.emit("unique", [x], {"sorted": is_sorted, "axis": axis, "out_dim": d})


@onnx_op("TopK")
def _topk(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    if ctx.opset < 10 or ctx.is_static(ins[1]):
        return _static_topk(ctx, node, ins, attrs)
    x, k = ins
    if k.type.size != 1:
        raise ctx.bad(f"input 'K' must hold one value, got shape {k.shape}")
    axis = ctx.axis(attrs.get("axis", -1), x.type.ndim)
    # the axis may be symbolic (torchvision's detection heads take the top min(k, n) of the
    # n = NonZero count scores above a threshold): the kernel scans the runtime extent
    d = _fresh_dim(ctx, "topk", x.shape[axis])
    return ctx.emit("topk_runtime_k", [x, ctx.cast(k, "int64")],
                    {"axis": axis, "largest": bool(attrs.get("largest", 1)),
                     "sorted": bool(attrs.get("sorted", 1)), "out_dim": d})


@onnx_op("Range")
def _range(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    if any(v in ctx.sym_values for v in ins) or all(ctx.is_static(v) for v in ins):
        return _static_range(ctx, node, ins, attrs)
    dts = {v.dtype for v in ins}
    if len(dts) != 1:
        raise ctx.bad(f"start, limit and delta must have one dtype, got {sorted(dts)}")
    for v, what in zip(ins, ("start", "limit", "delta")):
        if v.type.size != 1:
            raise ctx.bad(f"input {what!r} must be a scalar, got shape {v.shape}")
    np_dtype(ins[0].dtype)  # rejects dtypes NumPy cannot hold before any kernel is built
    d = _fresh_dim(ctx, "range", RANGE_MAX_LENGTH)
    return ctx.emit("range_runtime", list(ins), {"max_length": RANGE_MAX_LENGTH, "out_dim": d})
