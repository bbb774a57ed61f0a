"""Data-movement ops (all INJECTIVE unless noted) and ``constant``."""

from __future__ import annotations

import numpy as np

from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType, normalize_dtype
from ._util import Attrs, broadcast_shapes, norm_axis, same_dtype

INJ = OpPattern.INJECTIVE


# ----------------------------------------------------------------------------- constant
def _constant_rel(ts, attrs):
    v = attrs["value"]
    return [TensorType(v.shape, normalize_dtype(v.dtype))]


register_op("constant", attrs={"value": ("ndarray", REQUIRED)}, type_rel=_constant_rel,
            pattern=OpPattern.OPAQUE, ref=lambda xs, a: [a["value"]], num_inputs=0,
            doc="a literal tensor (attrs['value'], read-only); the build turns these into params")


# ----------------------------------------------------------------------------- reshape
def _reshape_rel(ts, attrs):
    data = ts[0]
    shape = attrs["newshape"]
    if any(d < 0 for d in shape):
        raise InputError(f"newshape must be fully static (no -1 / 0 codes), got {shape}")
    n = 1
    for d in shape:
        n *= d
    if n != data.size:
        raise InputError(f"cannot reshape {data.shape} ({data.size} elements) to {shape} "
                         f"({n} elements)")
    return [TensorType(shape, data.dtype)]


register_op("reshape", attrs={"newshape": ("ints", REQUIRED), "alias": ("bool", False)},
            type_rel=_reshape_rel, pattern=INJ,
            ref=lambda xs, a: [xs[0].reshape(a["newshape"]).copy()], inputs=("data",),
            doc="row-major reshape to a static shape (ONNX Reshape/Flatten/Squeeze/Unsqueeze); "
                "alias=True (set by Simplify) means the output may share the input's storage "
                "(the build emits __nop)")


# ----------------------------------------------------------------------------- transpose
def _transpose_rel(ts, attrs):
    data = ts[0]
    axes = attrs["axes"]
    if sorted(norm_axis(a, data.ndim) for a in axes) != list(range(data.ndim)):
        raise InputError(f"axes {axes} is not a permutation of {data.ndim} dims")
    return [TensorType(tuple(data.shape[a] for a in axes), data.dtype)]


register_op("transpose", attrs={"axes": ("ints", REQUIRED)}, type_rel=_transpose_rel, pattern=INJ,
            ref=lambda xs, a: [np.ascontiguousarray(np.transpose(xs[0], a["axes"]))],
            inputs=("data",), doc="out.shape[i] = in.shape[axes[i]]")


# ----------------------------------------------------------------------------- concat / split
def _concat_rel(ts, attrs):
    dt = same_dtype(ts)
    first = ts[0]
    axis = norm_axis(attrs["axis"], first.ndim)
    total = 0
    for t in ts:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if i != axis):
            raise InputError(f"cannot concatenate shapes {[x.shape for x in ts]} on axis {axis}")
        total += t.shape[axis]
    return [TensorType(first.shape[:axis] + (total,) + first.shape[axis + 1:], dt)]


register_op("concatenate", attrs={"axis": ("int", 0)}, type_rel=_concat_rel, pattern=INJ,
            ref=lambda xs, a: [np.concatenate(xs, axis=a["axis"])], num_inputs=(1, None),
            inputs=("*data",), doc="join tensors along axis")


def _split_rel(ts, attrs):
    data = ts[0]
    axis = norm_axis(attrs["axis"], data.ndim)
    sec = attrs["sections"]
    if not sec or any(s < 0 for s in sec) or sum(sec) != data.shape[axis]:
        raise InputError(f"split sizes {sec} must be non-negative and sum to {data.shape[axis]}")
    return [TensorType(data.shape[:axis] + (s,) + data.shape[axis + 1:], data.dtype) for s in sec]


def _split_ref(xs, attrs):
    x = xs[0]
    axis = norm_axis(attrs["axis"], x.ndim)
    cuts = np.cumsum(attrs["sections"])[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=axis)]


register_op("split", attrs={"sections": ("ints", REQUIRED), "axis": ("int", 0)},
            type_rel=_split_rel, pattern=INJ, ref=_split_ref, num_outputs=None, inputs=("data",),
            doc="split into len(sections) outputs of the given sizes along axis")


# ----------------------------------------------------------------------------- strided_slice
def normalize_slice(shape: tuple[int, ...], attrs: Attrs) -> list[tuple[int, int, int]]:
    """Per-dimension ``(begin, end, step)`` with ONNX Slice clamping.

    ``begin`` is a valid start index (or the clamped bound when the slice is empty) and
    ``end`` may be ``-1`` for negative steps, so element ``i`` of the output along a dim is
    ``begin + i * step`` and its length is ``len(range(begin, end, step))``.
    """
    begin, end, strides, axes = attrs["begin"], attrs["end"], attrs["strides"], attrs["axes"]
    if not (len(begin) == len(end) == len(strides) == len(axes)):
        raise InputError(f"begin/end/strides/axes lengths differ: {begin}, {end}, {strides}, "
                         f"{axes}")
    res = [(0, d, 1) for d in shape]
    seen = set()
    for b, e, s, a in zip(begin, end, strides, axes):
        ax = norm_axis(a, len(shape))
        if ax in seen:
            raise InputError(f"axis {a} repeated in strided_slice axes {axes}")
        seen.add(ax)
        if s == 0:
            raise InputError("strided_slice step may not be 0")
        n = shape[ax]
        if b < 0:
            b += n
        if e < 0:
            e += n
        if s > 0:
            b, e = min(max(b, 0), n), min(max(e, 0), n)
        else:
            b, e = min(max(b, 0), n - 1), min(max(e, -1), n - 1)
        res[ax] = (b, e, s)
    return res


def _slice_rel(ts, attrs):
    data = ts[0]
    dims = normalize_slice(data.shape, attrs)
    return [TensorType(tuple(len(range(b, e, s)) for b, e, s in dims), data.dtype)]


def _slice_ref(xs, attrs):
    x = xs[0]
    dims = normalize_slice(x.shape, attrs)
    idx = tuple(slice(b, e if e >= 0 else None, s) for b, e, s in dims)
    return [np.ascontiguousarray(x[idx])]


register_op("strided_slice",
            attrs={"begin": ("ints", REQUIRED), "end": ("ints", REQUIRED),
                   "strides": ("ints", REQUIRED), "axes": ("ints", REQUIRED)},
            type_rel=_slice_rel, pattern=INJ, ref=_slice_ref, inputs=("data",),
            doc="ONNX Slice: per listed axis begin/end (negative = from the end, clamped) and "
                "non-zero step; see normalize_slice")


# ----------------------------------------------------------------------------- gathers
def _take_rel(ts, attrs):
    data, idx = ts
    if idx.dtype not in ("int32", "int64"):
        raise InputError(f"indices must be int32 or int64, got {idx.dtype}")
    axis = norm_axis(attrs["axis"], data.ndim)
    return [TensorType(data.shape[:axis] + idx.shape + data.shape[axis + 1:], data.dtype)]


def _take_ref(xs, attrs):
    x, idx = xs
    axis = norm_axis(attrs["axis"], x.ndim)
    n = x.shape[axis]
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + n, idx)
    return [np.take(x, idx, axis=axis, mode="clip")]


register_op("take", attrs={"axis": ("int", 0)}, type_rel=_take_rel, pattern=INJ, ref=_take_ref,
            num_inputs=2, inputs=("data", "indices"),
            doc="ONNX Gather: out = data indexed by indices along axis; negative indices count "
                "from the end, out-of-range ones are clamped")


def _gather_elements_rel(ts, attrs):
    data, idx = ts
    if idx.dtype not in ("int32", "int64"):
        raise InputError(f"indices must be int32 or int64, got {idx.dtype}")
    if idx.ndim != data.ndim:
        raise InputError(f"indices rank {idx.ndim} differs from data rank {data.ndim}")
    norm_axis(attrs["axis"], data.ndim)
    return [TensorType(idx.shape, data.dtype)]


def _gather_elements_ref(xs, attrs):
    x, idx = xs
    axis = norm_axis(attrs["axis"], x.ndim)
    n = x.shape[axis]
    idx = idx.astype(np.int64)
    idx = np.clip(np.where(idx < 0, idx + n, idx), 0, n - 1)
    return [np.take_along_axis(x, idx, axis=axis)]


register_op("gather_elements", attrs={"axis": ("int", 0)}, type_rel=_gather_elements_rel,
            pattern=INJ, ref=_gather_elements_ref, num_inputs=2, inputs=("data", "indices"),
            doc="ONNX GatherElements (take_along_axis)")


# ----------------------------------------------------------------------------- broadcast / tile
def _bcast_rel(ts, attrs):
    data = ts[0]
    shape = attrs["shape"]
    if broadcast_shapes(data.shape, shape) != shape:
        raise InputError(f"cannot broadcast {data.shape} to {shape}")
    return [TensorType(shape, data.dtype)]


register_op("broadcast_to", attrs={"shape": ("ints", REQUIRED)}, type_rel=_bcast_rel,
            pattern=OpPattern.BROADCAST,
            ref=lambda xs, a: [np.ascontiguousarray(np.broadcast_to(xs[0], a["shape"]))],
            inputs=("data",), doc="numpy broadcast to a static shape (ONNX Expand)")


def _tile_rel(ts, attrs):
    data = ts[0]
    reps = attrs["reps"]
    if len(reps) != data.ndim or any(r < 0 for r in reps):
        raise InputError(f"reps {reps} must have {data.ndim} non-negative entries")
    return [TensorType(tuple(d * r for d, r in zip(data.shape, reps)), data.dtype)]


register_op("tile", attrs={"reps": ("ints", REQUIRED)}, type_rel=_tile_rel, pattern=INJ,
            ref=lambda xs, a: [np.tile(xs[0], a["reps"])], inputs=("data",),
            doc="repeat the whole tensor reps[i] times along dim i")


# ----------------------------------------------------------------------------- pad
_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_rel(ts, attrs):
    data = ts[0]
    pw = attrs["pad_width"]
    if len(pw) != data.ndim:
        raise InputError(f"pad_width needs {data.ndim} (before, after) pairs, got {pw}")
    if any(a < 0 or b < 0 for a, b in pw):
        raise InputError(f"pad_width must be non-negative, got {pw}")
    mode = attrs["mode"]
    if mode not in _PAD_MODES:
        raise InputError(f"pad mode must be one of {_PAD_MODES}, got {mode!r}")
    for (a, b), d in zip(pw, data.shape):
        if (a or b) and d == 0 and mode != "constant":
            raise InputError(f"{mode} padding of an empty dim")
        if mode == "reflect" and (a >= d or b >= d) and (a or b):
            raise InputError(f"reflect padding {(a, b)} must be smaller than the dim ({d})")
    return [TensorType(tuple(d + a + b for (a, b), d in zip(pw, data.shape)), data.dtype)]


def _pad_ref(xs, attrs):
    x = xs[0]
    mode = attrs["mode"]
    if mode == "constant":
        value = np.array(attrs["value"]).astype(x.dtype)
        return [np.pad(x, attrs["pad_width"], mode="constant", constant_values=value)]
    return [np.pad(x, attrs["pad_width"], mode=mode)]


register_op("pad", attrs={"pad_width": ("pairs", REQUIRED), "mode": ("str", "constant"),
                          "value": ("float", 0.0)},
            type_rel=_pad_rel, pattern=INJ, ref=_pad_ref, inputs=("data",),
            doc="pad each dim by (before, after); mode constant (value)|reflect|edge|wrap")
