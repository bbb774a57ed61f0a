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


register_op("reshape", attrs={"newshape": ("ints", REQUIRED), "alias": ("bool", False),
                              "sym_shape": ("dims", None)},
            type_rel=_reshape_rel, pattern=INJ,
            ref=lambda xs, a: [xs[0].reshape(a["newshape"]).copy()], inputs=("data",),
            doc="row-major reshape to a static shape (ONNX Reshape/Flatten/Squeeze/Unsqueeze); "
                "alias=True (set by Simplify) means the output may share the input's storage "
                "(the build emits __nop); sym_shape (optional, dynamic graphs) is the symbolic "
                "target, one dim per newshape entry (see kiln.ir.sym_rules)")


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


def data_indices(op: str, idx: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Indices read from data, ONNX style: ``[-n, n)`` is valid, negative ones count from the
    end; anything else is an :class:`InputError` naming the op, the value and the range (the
    compiled kernels report the same through ``KernelError``)."""
    idx = idx.astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        v = int(idx[bad].flat[0])
        rng = f"[{-n}, {n - 1}]" if n else "empty: the axis has size 0"
        raise InputError(f"{op}: index {v} into axis {axis} (size {n}) is out of range {rng}")
    return np.where(idx < 0, idx + n, idx)


def _take_ref(xs, attrs):
    x, idx = xs
    axis = norm_axis(attrs["axis"], x.ndim)
    return [np.take(x, data_indices("take", idx, x.shape[axis], axis), axis=axis)]


register_op("take", attrs={"axis": ("int", 0)}, type_rel=_take_rel, pattern=INJ, ref=_take_ref,
            num_inputs=2, inputs=("data", "indices"),
            doc="ONNX Gather: out = data indexed by indices along axis; negative indices count "
                "from the end, an index outside [-n, n) is an error")


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
    return [np.take_along_axis(x, data_indices("gather_elements", idx, x.shape[axis], axis), axis=axis)]


register_op("gather_elements", attrs={"axis": ("int", 0)}, type_rel=_gather_elements_rel,
            pattern=INJ, ref=_gather_elements_ref, num_inputs=2, inputs=("data", "indices"),
            doc="ONNX GatherElements (take_along_axis); an index outside [-n, n) is an error")


def _gather_nd_rel(ts, attrs):
    data, idx = ts
    b = attrs["batch_dims"]
    if idx.dtype not in ("int32", "int64"):
        raise InputError(f"gather_nd: indices must be int32 or int64, got {idx.dtype}")
    if idx.ndim < 1 or not 0 <= b < min(data.ndim, idx.ndim):
        raise InputError(f"gather_nd: batch_dims {b} must be in [0, min(data rank {data.ndim}, "
                         f"indices rank {idx.ndim}))")
    k = idx.shape[-1]
    if not 1 <= k <= data.ndim - b:
        raise InputError(f"gather_nd: the last dim of indices ({k}) must be in [1, {data.ndim - b}] "
                         f"(data rank {data.ndim} minus batch_dims {b})")
    if data.shape[:b] != idx.shape[:b]:
        raise InputError(f"gather_nd: the first {b} (batch) dims of data {data.shape} and indices "
                         f"{idx.shape} differ")
    return [TensorType(idx.shape[:-1] + data.shape[b + k:], data.dtype)]


def _gather_nd_ref(xs, attrs):
    x, idx = xs
    b = attrs["batch_dims"]
    k = idx.shape[-1]
    idx = np.stack([data_indices("gather_nd", idx[..., m], x.shape[b + m], b + m) for m in range(k)], -1)
    out = np.empty(idx.shape[:-1] + x.shape[b + k:], x.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        out[pos] = x[tuple(pos[:b]) + tuple(idx[pos])]
    return [out]


register_op("gather_nd", attrs={"batch_dims": ("int", 0)}, type_rel=_gather_nd_rel, pattern=INJ,
            ref=_gather_nd_ref, num_inputs=2, inputs=("data", "indices"),
            doc="ONNX GatherND: each row of indices (last dim) addresses a slice of data after "
                "batch_dims leading dims; an index outside [-n, n) is an error")


def _one_hot_rel(ts, attrs):
    idx, values = ts
    if idx.dtype == "bool" or values.shape != (2,):
        raise InputError(f"one_hot: expected numeric indices and values of shape (2,) = (off, on), got "
                         f"indices {idx.dtype} and values of shape {values.shape}")
    if attrs["depth"] < 0:
        raise InputError(f"one_hot: depth must be non-negative, got {attrs['depth']}")
    axis = norm_axis(attrs["axis"], idx.ndim + 1)
    shape = idx.shape[:axis] + (attrs["depth"],) + idx.shape[axis:]
    return [TensorType(shape, values.dtype)]


def _one_hot_ref(xs, attrs):
    idx, values = xs
    depth = attrs["depth"]
    axis = norm_axis(attrs["axis"], idx.ndim + 1)
    idx = idx.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)  # still outside [0, depth) when out of range: no match
    hot = np.expand_dims(idx, axis) == np.arange(depth).reshape([-1 if a == axis else 1
                                                                  for a in range(idx.ndim + 1)])
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


register_op("one_hot", attrs={"depth": ("int", REQUIRED), "axis": ("int", -1)}, type_rel=_one_hot_rel,
            pattern=INJ, ref=_one_hot_ref, num_inputs=2, inputs=("indices", "values"),
            doc="ONNX OneHot with a constant depth: values = (off, on); a negative index counts from "
                "the end; one outside [-depth, depth) gives an all-off row (the spec), not an error")


# ----------------------------------------------------------------------------- scatters
def _scatter_common(op: str, data: TensorType, idx: TensorType, upd: TensorType, attrs) -> None:
    if idx.dtype not in ("int32", "int64"):
        raise InputError(f"{op}: indices must be int32 or int64, got {idx.dtype}")
    if upd.dtype != data.dtype:
        raise InputError(f"{op}: updates dtype {upd.dtype} differs from data dtype {data.dtype}")
    if attrs["reduction"] != "none":
        raise InputError(f"{op}: reduction {attrs['reduction']!r} is not supported (only 'none')")


def _scatter_elements_rel(ts, attrs):
    data, idx, upd = ts
    _scatter_common("scatter_elements", data, idx, upd, attrs)
    axis = norm_axis(attrs["axis"], data.ndim)
    if idx.shape != upd.shape or idx.ndim != data.ndim or any(
            i > d for m, (i, d) in enumerate(zip(idx.shape, data.shape)) if m != axis):
        raise InputError(f"scatter_elements: indices {idx.shape} and updates {upd.shape} must have one shape, "
                         f"of data's rank and not larger than data {data.shape} off axis {axis}")
    if data.shape[axis] == 0 and idx.size:
        raise InputError(f"scatter_elements: {idx.size} indices into axis {axis} of size 0 (none can be valid)")
    return [TensorType(data.shape, data.dtype)]


def _scatter_elements_ref(xs, attrs):
    x, idx, upd = xs
    axis = norm_axis(attrs["axis"], x.ndim)
    idx = data_indices("scatter_elements", idx, x.shape[axis], axis)
    out = x.copy()
    for u in np.ndindex(*idx.shape):
        p = list(u)
        p[axis] = idx[u]
        out[tuple(p)] = upd[u]
    return [out]


register_op("scatter_elements", attrs={"axis": ("int", 0), "reduction": ("str", "none")},
            type_rel=_scatter_elements_rel, pattern=OpPattern.OPAQUE, ref=_scatter_elements_ref, num_inputs=3,
            inputs=("data", "indices", "updates"),
            doc="ONNX ScatterElements (reduction 'none'): a copy of data with updates written at indices "
                "along axis (the last of duplicate indices wins); an index outside [-n, n) is an error")


def _scatter_nd_rel(ts, attrs):
    data, idx, upd = ts
    _scatter_common("scatter_nd", data, idx, upd, attrs)
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= k <= data.ndim:
        raise InputError(f"scatter_nd: the last dim of indices {idx.shape} must be in [1, {data.ndim}]")
    want = idx.shape[:-1] + data.shape[k:]
    if upd.shape != want:
        raise InputError(f"scatter_nd: updates shape {upd.shape} must be {want} (indices {idx.shape}, data "
                         f"{data.shape})")
    if 0 in data.shape[:k] and upd.size:
        raise InputError(f"scatter_nd: indices into data {data.shape}, whose first {k} dims are empty "
                         "(none can be valid)")
    return [TensorType(data.shape, data.dtype)]


def _scatter_nd_ref(xs, attrs):
    x, idx, upd = xs
    k = idx.shape[-1]
    idx = np.stack([data_indices("scatter_nd", idx[..., m], x.shape[m], m) for m in range(k)], -1)
    out = x.copy()
    for q in np.ndindex(*idx.shape[:-1]):
        out[tuple(idx[q])] = upd[q]
    return [out]


register_op("scatter_nd", attrs={"reduction": ("str", "none")}, type_rel=_scatter_nd_rel,
            pattern=OpPattern.OPAQUE, ref=_scatter_nd_ref, num_inputs=3, inputs=("data", "indices", "updates"),
            doc="ONNX ScatterND (reduction 'none'): a copy of data with each row of indices (last dim) "
                "addressing a slice replaced by updates (the last duplicate wins); an index outside "
                "[-n, n) is an error")


# ----------------------------------------------------------------------------- broadcast / tile
def _bcast_rel(ts, attrs):
    data = ts[0]
    shape = attrs["shape"]
    if broadcast_shapes(data.shape, shape) != shape:
        raise InputError(f"cannot broadcast {data.shape} to {shape}")
    return [TensorType(shape, data.dtype)]


register_op("broadcast_to", attrs={"shape": ("ints", REQUIRED), "sym_shape": ("dims", None)},
            type_rel=_bcast_rel,
            pattern=OpPattern.BROADCAST,
            ref=lambda xs, a: [np.ascontiguousarray(np.broadcast_to(xs[0], a["shape"]))],
            inputs=("data",), doc="numpy broadcast to a static shape (ONNX Expand); sym_shape "
                                  "(optional) is the symbolic target in dynamic graphs")


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
