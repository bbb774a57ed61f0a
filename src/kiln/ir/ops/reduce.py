"""Reductions, arg-reductions and top-k."""

from __future__ import annotations

import numpy as np

from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType
from ._util import Attrs, norm_axis, wide


def normalize_axes(axes, ndim: int) -> tuple[int, ...]:
    """Sorted, non-negative, duplicate-free axes; InputError when out of range / repeated."""
    res = sorted(norm_axis(a, ndim) for a in axes)
    if len(set(res)) != len(res):
        raise InputError(f"repeated axis in {tuple(axes)}")
    return tuple(res)


def _reduce_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data = ts[0]
    axes = normalize_axes(attrs["axes"], data.ndim)
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(data.shape))
    else:
        shape = tuple(d for i, d in enumerate(data.shape) if i not in axes)
    return [TensorType(shape, data.dtype)]


def _reduce_ref(fn, accumulate: bool):
    def run(xs, attrs):
        x = xs[0]
        axes = normalize_axes(attrs["axes"], x.ndim)
        if not axes:
            return [x.copy()]
        src = wide(x) if accumulate else x
        with np.errstate(all="ignore"):
            y = fn(src, axis=axes, keepdims=attrs["keepdims"])
        if accumulate and x.dtype.kind in "iu" and fn is np.mean:
            y = np.trunc(y)
        return [np.asarray(y).astype(x.dtype)]
    return run


_REDUCE_ATTRS = {"axes": ("ints", REQUIRED), "keepdims": ("bool", False)}
for _name, _fn, _acc in (("reduce_sum", np.sum, True), ("reduce_mean", np.mean, True),
                         ("reduce_prod", np.prod, True), ("reduce_max", np.max, False),
                         ("reduce_min", np.min, False)):
    register_op(_name, attrs=_REDUCE_ATTRS, type_rel=_reduce_rel, pattern=OpPattern.COMM_REDUCE,
                ref=_reduce_ref(_fn, _acc), inputs=("data",),
                doc=f"{_name[7:]} over axes (explicit; () = no-op); keepdims keeps size-1 dims")


def _arg_rel(ts, attrs):
    data = ts[0]
    axis = norm_axis(attrs["axis"], data.ndim)
    if data.shape[axis] == 0:
        raise InputError("arg-reduction over an empty axis")
    if attrs["keepdims"]:
        shape = tuple(1 if i == axis else d for i, d in enumerate(data.shape))
    else:
        shape = tuple(d for i, d in enumerate(data.shape) if i != axis)
    return [TensorType(shape, "int64")]


def _arg_ref(fn):
    def run(xs, attrs):
        x = xs[0]
        axis = norm_axis(attrs["axis"], x.ndim)
        if attrs["select_last_index"]:
            n = x.shape[axis]
            idx = n - 1 - fn(np.flip(x, axis=axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        if attrs["keepdims"]:
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, dtype=np.int64)]
    return run


_ARG_ATTRS = {"axis": ("int", 0), "keepdims": ("bool", True), "select_last_index": ("bool", False)}
register_op("argmax", attrs=_ARG_ATTRS, type_rel=_arg_rel, pattern=OpPattern.COMM_REDUCE,
            ref=_arg_ref(np.argmax), inputs=("data",),
            doc="int64 index of the max along axis (first, or last if select_last_index)")
register_op("argmin", attrs=_ARG_ATTRS, type_rel=_arg_rel, pattern=OpPattern.COMM_REDUCE,
            ref=_arg_ref(np.argmin), inputs=("data",),
            doc="int64 index of the min along axis (first, or last if select_last_index)")


def _topk_rel(ts, attrs):
    data = ts[0]
    axis = norm_axis(attrs["axis"], data.ndim)
    k = attrs["k"]
    if not 0 <= k <= data.shape[axis]:
        raise InputError(f"k={k} out of range for axis {axis} of size {data.shape[axis]}")
    shape = data.shape[:axis] + (k,) + data.shape[axis + 1:]
    return [TensorType(shape, data.dtype), TensorType(shape, "int64")]


def _topk_ref(xs, attrs):
    x = xs[0]
    axis = norm_axis(attrs["axis"], x.ndim)
    k = attrs["k"]
    # Ties resolve to the lower index (ONNX); a stable sort on the key gives exactly that.
    key = -wide(x) if attrs["largest"] else wide(x)
    if x.dtype.kind == "u" and attrs["largest"]:
        key = -x.astype(np.float64)
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    vals = np.take_along_axis(x, idx, axis=axis)
    return [vals, idx.astype(np.int64)]


register_op("topk", attrs={"k": ("int", REQUIRED), "axis": ("int", -1), "largest": ("bool", True),
                           "sorted": ("bool", True)},
            type_rel=_topk_rel, pattern=OpPattern.OPAQUE, ref=_topk_ref, num_outputs=2,
            inputs=("data",),
            doc="(values, int64 indices) of the k largest/smallest along axis, sorted; ties "
                "keep the lower index")
