"""Ops whose output extent depends on input *values*: NonZero, Compress, NonMaxSuppression,
Unique, TopK with a run-time k, Range with run-time bounds.

Each op names the data-dependent symbol its output carries in the ``out_dim`` attribute (the
frontend declares it with ``Graph.declare_dim(name, 0, hi, data_dependent=True)``). The type
relation gives the upper-bound shape *and* the symbol, so the symbol is there even when every
input is static (symbolic rules only run for dynamic inputs); the symbolic rule adds the inputs'
own symbolic dims where they pass through. The kernels (``kiln.topi.data_dependent``) count as
they write and report the count with ``kiln.tir.set_extent``.

References (``ref``) follow ONNX and return arrays of the *actual* shape.

Imports only the IR types, the op registry and :mod:`kiln.runtime.sym`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime import sym
from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType
from ._util import Attrs, norm_axis

__all__ = ["nms_reference", "unique_reference", "dim_value_attrs"]

_OUT_DIM = {"out_dim": ("str", REQUIRED)}


def _name(attrs: Attrs) -> str:
    d = attrs["out_dim"]
    if not isinstance(d, str) or not sym.is_symbolic(d) or sym.canonical(d) != d:
        raise InputError(f"out_dim must name a data-dependent symbol, got {d!r}")
    return d


def _flat_dim(t: TensorType) -> Any:
    """The element count of ``t`` as a dim (an expression when ``t`` is dynamic)."""
    n: Any = 1
    for d in t.dims:
        n = sym.mul(n, d)
    return n


# ----------------------------------------------------------------------------- nonzero
def _nonzero_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ts[0]
    if x.ndim == 0:
        raise InputError("nonzero of a scalar is not supported (give it a 1-D input)")
    return [TensorType((x.ndim, x.size), "int64", (None, _name(attrs)))]


def _nonzero_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    return [(None, _name(attrs))]


def _nonzero_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [np.array(np.nonzero(xs[0]), dtype=np.int64).reshape(xs[0].ndim, -1)]


register_op("nonzero", attrs=dict(_OUT_DIM), type_rel=_nonzero_rel, pattern=OpPattern.OPAQUE,
            ref=_nonzero_ref, inputs=("x",), sym_rel=_nonzero_sym,
            doc="int64 (rank, nz) indices of the non-zero elements in row-major order (ONNX NonZero); "
                "nz is the data-dependent symbol out_dim")


# ----------------------------------------------------------------------------- compress
def _compress_axis(x: TensorType, attrs: Attrs) -> int | None:
    return None if attrs["axis"] is None else norm_axis(attrs["axis"], x.ndim)


def _compress_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x, cond = ts
    if cond.ndim != 1:
        raise InputError(f"condition must be 1-D, got shape {cond.shape}")
    axis = _compress_axis(x, attrs)
    d = _name(attrs)
    if axis is None:
        return [TensorType((min(x.size, cond.shape[0]),), x.dtype, (d,))]
    shape = list(x.shape)
    shape[axis] = min(x.shape[axis], cond.shape[0])
    return [TensorType(tuple(shape), x.dtype, tuple(d if i == axis else None for i in range(x.ndim)))]


def _compress_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    x = ts[0]
    axis = _compress_axis(x, attrs)
    if axis is None:
        return [(_name(attrs),)]
    return [tuple(_name(attrs) if i == axis else (d if isinstance(d, str) else None)
                  for i, d in enumerate(x.dims))]


def _compress_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, cond = xs
    c = np.asarray(cond).astype(bool).reshape(-1)
    axis = _compress_axis(TensorType(x.shape, "float32"), attrs)
    n = x.size if axis is None else x.shape[axis]
    c = c[:n]
    return [np.compress(c, x, axis=axis)]


register_op("compress", attrs={"axis": ("int", None), **_OUT_DIM}, type_rel=_compress_rel,
            pattern=OpPattern.OPAQUE, ref=_compress_ref, num_inputs=2, inputs=("x", "condition"),
            sym_rel=_compress_sym,
            doc="the slices of x along axis (or the elements of flattened x) where condition is true "
                "(ONNX Compress; a shorter condition drops the tail); their count is out_dim")


# ----------------------------------------------------------------------------- NMS
def _nms_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    boxes, scores = ts
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise InputError(f"boxes must be (batch, boxes, 4), got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise InputError(f"scores must be (batch, classes, boxes) = ({boxes.shape[0]}, C, {boxes.shape[1]}), "
                         f"got {scores.shape}")
    if boxes.dims[:2] != scores.dims[::2]:
        raise InputError(f"boxes {boxes} and scores {scores} disagree on the batch or the number of boxes")
    # symbolic dims (the candidates of a detection head, a data-dependent count) are stored at
    # their upper bounds, which bound the selection; the kernel loops over the runtime extents
    b, c, n = scores.shape
    per_class = max(0, min(n, attrs["max_output_boxes_per_class"]))
    return [TensorType((b * c * per_class, 3), "int64", (_name(attrs), None))]


def _nms_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    return [(_name(attrs), None)]


def _iou_suppresses(a: np.ndarray, b: np.ndarray, center: int, thr: float) -> bool:
    """ONNX Runtime's ``SuppressByIOU`` (float32): whether box ``b`` suppresses box ``a``."""
    f = np.float32
    if center:
        ax0, ax1 = f(a[0] - a[2] / f(2)), f(a[0] + a[2] / f(2))
        ay0, ay1 = f(a[1] - a[3] / f(2)), f(a[1] + a[3] / f(2))
        bx0, bx1 = f(b[0] - b[2] / f(2)), f(b[0] + b[2] / f(2))
        by0, by1 = f(b[1] - b[3] / f(2)), f(b[1] + b[3] / f(2))
    else:
        ay0, ay1 = min(a[0], a[2]), max(a[0], a[2])
        ax0, ax1 = min(a[1], a[3]), max(a[1], a[3])
        by0, by1 = min(b[0], b[2]), max(b[0], b[2])
        bx0, bx1 = min(b[1], b[3]), max(b[1], b[3])
    ix0, ix1 = max(ax0, bx0), min(ax1, bx1)
    iy0, iy1 = max(ay0, by0), min(ay1, by1)
    if ix1 <= ix0 or iy1 <= iy0:
        return False
    inter = f(f(ix1 - ix0) * f(iy1 - iy0))
    area_a = f(f(ax1 - ax0) * f(ay1 - ay0))
    area_b = f(f(bx1 - bx0) * f(by1 - by0))
    union = f(f(area_a + area_b) - inter)
    if area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(f(inter / union) > f(thr))


def nms_reference(boxes: np.ndarray, scores: np.ndarray, max_per_class: int, iou_threshold: float,
                  score_threshold: float | None, center_point_box: int) -> np.ndarray:
    """ONNX NonMaxSuppression in NumPy: int64 ``(num_selected, 3)`` rows ``[batch, class, box]``.

    Per batch and class: the boxes scoring above ``score_threshold`` (strictly), best first
    (ties: lower box index first), each kept unless its IoU with a kept one exceeds
    ``iou_threshold``, at most ``max_per_class`` kept — ONNX Runtime's order and arithmetic.
    """
    boxes = np.asarray(boxes, np.float32)
    scores = np.asarray(scores, np.float32)
    out: list[tuple[int, int, int]] = []
    limit = max(0, int(max_per_class))
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = [i for i in range(s.shape[0]) if score_threshold is None or s[i] > np.float32(score_threshold)]
            cand.sort(key=lambda i: (-s[i], i))
            kept: list[int] = []
            for i in cand:
                if len(kept) >= limit:
                    break
                if not any(_iou_suppresses(boxes[b, i], boxes[b, k], center_point_box, iou_threshold) for k in kept):
                    kept.append(i)
            out.extend((b, c, k) for k in kept)
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def _nms_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return [nms_reference(xs[0], xs[1], attrs["max_output_boxes_per_class"], attrs["iou_threshold"],
                          attrs["score_threshold"], attrs["center_point_box"])]


register_op("non_max_suppression",
            attrs={"max_output_boxes_per_class": ("int", 0), "iou_threshold": ("float", 0.0),
                   "score_threshold": ("float", None), "center_point_box": ("int", 0), **_OUT_DIM},
            type_rel=_nms_rel, pattern=OpPattern.OPAQUE, ref=_nms_ref, num_inputs=2,
            inputs=("boxes", "scores"), sym_rel=_nms_sym,
            doc="int64 (num_selected, 3) [batch, class, box] rows of ONNX NonMaxSuppression; "
                "num_selected is out_dim")


# ----------------------------------------------------------------------------- unique
def _unique_axis(x: TensorType, attrs: Attrs) -> int | None:
    return None if attrs["axis"] is None else norm_axis(attrs["axis"], x.ndim)


def _unique_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ts[0]
    d = _name(attrs)
    axis = _unique_axis(x, attrs)
    if axis is None:
        n = x.size
        return [TensorType((n,), x.dtype, (d,)), TensorType((n,), "int64", (d,)), TensorType((n,), "int64"),
                TensorType((n,), "int64", (d,))]
    n = x.shape[axis]
    ysym = tuple(d if i == axis else (x.sym[i] if x.sym else None) for i in range(x.ndim))
    inv = (x.sym[axis],) if x.sym and x.sym[axis] is not None else None
    return [TensorType(x.shape, x.dtype, ysym), TensorType((n,), "int64", (d,)), TensorType((n,), "int64", inv),
            TensorType((n,), "int64", (d,))]


def _unique_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    d = _name(attrs)
    if _unique_axis(ts[0], attrs) is not None:
        return [o.sym for o in outs]
    n = _flat_dim(ts[0])
    return [(d,), (d,), (n,) if isinstance(n, str) else None, (d,)]


def unique_reference(x: np.ndarray, sorted_: bool, axis: int | None = None) -> list[np.ndarray]:
    """ONNX Unique of ``x`` (flattened when ``axis`` is None, else of its slices along ``axis``):
    ``[Y, indices, inverse_indices, counts]``; ``Y`` ascending (slices lexicographically) when
    ``sorted_``, else in order of first occurrence."""
    x = np.asarray(x)
    src = x.reshape(-1) if axis is None else x
    y, idx, inv, cnt = np.unique(src, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inv = inv.reshape(-1)
    if not sorted_:
        order = np.argsort(idx, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = y[order] if axis is None else np.take(y, order, axis=axis)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
    return [y.astype(x.dtype), idx.astype(np.int64), inv.astype(np.int64), cnt.astype(np.int64)]


def _unique_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    axis = _unique_axis(TensorType(xs[0].shape, "float32"), attrs)
    return unique_reference(xs[0], attrs["sorted"], axis)


register_op("unique", attrs={"sorted": ("bool", True), "axis": ("int", None), **_OUT_DIM}, type_rel=_unique_rel,
            pattern=OpPattern.OPAQUE, ref=_unique_ref, num_outputs=4, inputs=("x",), sym_rel=_unique_sym,
            doc="ONNX Unique of flattened x, or of its slices along axis: (Y, first indices, inverse "
                "indices, counts); the number of unique values (slices) is out_dim")


# ----------------------------------------------------------------------------- topk, run-time k
def _topk_k_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x, k = ts
    if k.size != 1 or k.dtype not in ("int64", "int32"):
        raise InputError(f"k must hold one int64, got {k}")
    axis = norm_axis(attrs["axis"], x.ndim)
    # a symbolic axis is stored at its upper bound, which bounds k; the kernel checks k
    # against the runtime extent
    d = _name(attrs)
    s = tuple(d if i == axis else (x.sym[i] if x.sym else None) for i in range(x.ndim))
    return [TensorType(x.shape, x.dtype, s), TensorType(x.shape, "int64", s)]


def _topk_k_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    if ts[1].sym is not None:
        raise InputError("k must be static-shaped")
    return [outs[0].sym, outs[1].sym]


def _topk_k_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    from .reduce import _topk_ref

    k = int(np.asarray(xs[1]).reshape(-1)[0])
    axis = norm_axis(attrs["axis"], xs[0].ndim)
    if not 0 <= k <= xs[0].shape[axis]:
        raise InputError(f"k={k} out of range for axis {axis} of size {xs[0].shape[axis]}")
    return _topk_ref([xs[0]], dict(attrs, k=k))


register_op("topk_runtime_k", attrs={"axis": ("int", -1), "largest": ("bool", True), "sorted": ("bool", True),
                                     **_OUT_DIM},
            type_rel=_topk_k_rel, pattern=OpPattern.OPAQUE, ref=_topk_k_ref, num_inputs=2, num_outputs=2,
            inputs=("data", "k"), sym_rel=_topk_k_sym,
            doc="topk with k a run-time int64 input: the extent along axis is out_dim (= k, checked "
                "against the axis)")


# ----------------------------------------------------------------------------- range, run-time bounds
def _range_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    if any(t.size != 1 for t in ts) or len({t.dtype for t in ts}) != 1:
        raise InputError(f"start, limit and delta must be scalars of one dtype, got {ts}")
    return [TensorType((attrs["max_length"],), ts[0].dtype, (_name(attrs),))]


def _range_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    raise InputError("start, limit and delta must be static-shaped scalars")


def _range_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    s, lim, d = (np.asarray(v).reshape(-1)[0] for v in xs)
    n = max(int(np.ceil((float(lim) - float(s)) / float(d))), 0) if d != 0 else 0
    dt = np.asarray(xs[0]).dtype
    return [(s + np.arange(n).astype(dt) * d).astype(dt)]


register_op("range_runtime", attrs={"max_length": ("int", REQUIRED), **_OUT_DIM}, type_rel=_range_rel,
            pattern=OpPattern.OPAQUE, ref=_range_ref, num_inputs=3, inputs=("start", "limit", "delta"),
            sym_rel=_range_sym,
            doc="ONNX Range of run-time scalars: max(ceil((limit - start) / delta), 0) elements (out_dim), "
                "at most max_length")


# ----------------------------------------------------------------------------- dim_value
def _dim_sources(ts: list[TensorType], attrs: Attrs) -> dict[str, tuple[int, int]]:
    d = attrs["dim"]
    try:
        canon = sym.canonical(d)
    except InputError as exc:
        raise InputError(f"dim: {exc}") from None
    if isinstance(canon, int):
        raise InputError(f"dim must be a symbolic expression, got {d!r} (a constant needs no kernel)")
    src = {}
    for s in sorted(sym.symbols(canon)):
        hit = next(((i, k) for i, t in enumerate(ts) for k, x in enumerate(t.dims) if x == s), None)
        if hit is None:
            raise InputError(f"dimension {s!r} of {canon!r} is a plain dim of no input; an input must carry it "
                             f"(inputs: {', '.join(str(t) for t in ts)})")
        src[s] = hit
    return src


def _dim_value_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    _dim_sources(ts, attrs)
    return [TensorType((1,), "int64")]


def _dim_value_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    return [None]


def _dim_value_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    # the reference sees actual arrays: each symbol is the extent of the axis that carries it
    # (found by position in the types, which the reference does not have: every input's every
    # axis is tried by name through the recorded sources)
    src = attrs.get("sources") or ()
    env = {s: int(np.asarray(xs[i]).shape[k]) for s, i, k in src}
    return [np.array([sym.evaluate(attrs["dim"], env)], dtype=np.int64)]


def dim_value_attrs(carriers: list[TensorType], dim: str) -> dict[str, Any]:
    """The attributes of a ``dim_value`` node over ``carriers`` (the types of its inputs)."""
    src = _dim_sources(carriers, {"dim": dim})
    return {"dim": sym.canonical(dim), "sources": tuple((s, i, k) for s, (i, k) in sorted(src.items()))}


register_op("dim_value", attrs={"dim": ("str", REQUIRED), "sources": ("any", None)}, type_rel=_dim_value_rel,
            pattern=OpPattern.OPAQUE, ref=_dim_value_ref, num_inputs=(1, None), sym_rel=_dim_value_sym,
            doc="the run-time value of the symbolic dim expression dim, as int64 (1,); the inputs carry its "
                "symbols as plain dims (only their shapes are read); sources = ((symbol, input, axis), ...)")
