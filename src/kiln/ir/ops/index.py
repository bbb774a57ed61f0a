"""IR ops: index, scatter and scan-like ops (ScatterElements, ScatterND, GatherND, TensorScatter,
Trilu, CumSum, CumProd, OneHot, EyeLike, ReverseSequence, Det, window functions).

GatherND, GatherElements, OneHot and the plain (``reduction='none'``) scatters live in
:mod:`.transform`; this module adds the scatters with a reduction, the triangular mask, the
cumulative scans, ReverseSequence, TensorScatter and the determinant. EyeLike, the window
functions, MelWeightMatrix and Compress (with a constant condition) need no op of their own:
the ONNX frontend builds them from constants and existing ops.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from ...runtime.errors import InputError
from ..op import OpPattern, register_op
from ..types import FLOAT_DTYPES, TensorType
from ._util import Attrs, norm_axis, to_dtype, wide
from .transform import data_indices

INJ = OpPattern.INJECTIVE
OPAQUE = OpPattern.OPAQUE

#: Reductions of ScatterElements / ScatterND other than ``none`` (which :mod:`.transform` has).
SCATTER_REDUCTIONS = ("add", "mul", "max", "min")
#: Largest matrix whose determinant ``det`` expands (Leibniz: n! products of n factors).
DET_MAX_N = 5


def _require_index(op: str, t: TensorType, what: str = "indices") -> None:
    if t.dtype not in ("int32", "int64"):
        raise InputError(f"{op}: {what} must be int32 or int64, got {t.dtype}")


def _require_numeric(op: str, t: TensorType, what: str = "data") -> None:
    if t.dtype == "bool":
        raise InputError(f"{op}: {what} must be numeric, got bool")


# ----------------------------------------------------------------------------- trilu
def _trilu_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ts[0]
    if x.ndim < 2:
        raise InputError(f"trilu: data must have rank >= 2 (matrices in the last two dims), got shape {x.shape}")
    return [x]


def _trilu_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    fn = np.triu if attrs["upper"] else np.tril
    return [np.ascontiguousarray(fn(x, attrs["k"]))]


register_op("trilu", attrs={"upper": ("bool", True), "k": ("int", 0)}, type_rel=_trilu_rel, pattern=INJ,
            ref=_trilu_ref, inputs=("data",),
            doc="ONNX Trilu: keep the upper (j - i >= k) or lower (j - i <= k) triangle of the matrices in "
                "the last two dims, zero elsewhere")


# ----------------------------------------------------------------------------- cumsum / cumprod
_Rel = Callable[[list[TensorType], Attrs], list[TensorType]]
_Ref = Callable[[list[np.ndarray], Attrs], list[np.ndarray]]


def _scan_rel(op: str) -> _Rel:
    def rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
        x = ts[0]
        _require_numeric(op, x)
        if x.ndim == 0:
            raise InputError(f"{op}: data must have rank >= 1, got a scalar")
        norm_axis(attrs["axis"], x.ndim)
        return [x]

    return rel


def _scan_ref(fn: Callable[..., np.ndarray]) -> _Ref:
    def ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        x = xs[0]
        axis = norm_axis(attrs["axis"], x.ndim)
        w = wide(x)
        if attrs["reverse"]:
            w = np.flip(w, axis)
        y = fn(w, axis=axis)
        if attrs["exclusive"]:
            # shift by one along the axis, the identity first
            ident = np.zeros_like(y) if fn is np.cumsum else np.ones_like(y)
            y = np.concatenate([np.take(ident, [0], axis=axis), np.delete(y, -1, axis=axis)], axis=axis) \
                if x.shape[axis] else y
        if attrs["reverse"]:
            y = np.flip(y, axis)
        with np.errstate(all="ignore"):
            return [np.ascontiguousarray(to_dtype(y, x.dtype))]

    return ref


_SCAN_ATTRS = {"axis": ("int", 0), "exclusive": ("bool", False), "reverse": ("bool", False)}
register_op("cumsum", attrs=_SCAN_ATTRS, type_rel=_scan_rel("cumsum"), pattern=OPAQUE, ref=_scan_ref(np.cumsum),
            inputs=("data",),
            doc="ONNX CumSum: running sum along axis; exclusive leaves out the element itself, reverse runs "
                "from the end")
register_op("cumprod", attrs=_SCAN_ATTRS, type_rel=_scan_rel("cumprod"), pattern=OPAQUE, ref=_scan_ref(np.cumprod),
            inputs=("data",),
            doc="ONNX CumProd: running product along axis; exclusive leaves out the element itself, reverse "
                "runs from the end")


# ----------------------------------------------------------------------------- reverse_sequence
def _reverse_sequence_axes(x: TensorType, attrs: Attrs) -> tuple[int, int]:
    if x.ndim < 2:
        raise InputError(f"reverse_sequence: data must have rank >= 2, got shape {x.shape}")
    b = norm_axis(attrs["batch_axis"], x.ndim, "batch_axis")
    t = norm_axis(attrs["time_axis"], x.ndim, "time_axis")
    if b == t or b > 1 or t > 1:
        raise InputError(f"reverse_sequence: batch_axis ({attrs['batch_axis']}) and time_axis "
                         f"({attrs['time_axis']}) must be 0 and 1 in some order")
    return b, t


def _reverse_sequence_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x, lens = ts
    b, _ = _reverse_sequence_axes(x, attrs)
    _require_index("reverse_sequence", lens, "sequence_lens")
    if lens.shape != (x.shape[b],):
        raise InputError(f"reverse_sequence: sequence_lens must have shape ({x.shape[b]},) (the batch size), "
                         f"got {lens.shape}")
    return [x]


def _reverse_sequence_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, lens = xs
    b, t = _reverse_sequence_axes(TensorType(x.shape, "float32"), attrs)
    n = x.shape[t]
    bad = (lens < 0) | (lens > n)
    if bad.any():
        raise InputError(f"reverse_sequence: sequence length {int(lens[bad][0])} is out of range [0, {n}]")
    out = x.copy()
    for i, m in enumerate(lens.astype(np.int64)):
        src: list[Any] = [slice(None)] * x.ndim
        src[b], src[t] = i, slice(0, int(m))
        out[tuple(src)] = np.flip(x[tuple(src)], axis=0 if t < b else t - 1)
    return [out]


register_op("reverse_sequence", attrs={"batch_axis": ("int", 1), "time_axis": ("int", 0)},
            type_rel=_reverse_sequence_rel, pattern=INJ, ref=_reverse_sequence_ref, num_inputs=2,
            inputs=("data", "sequence_lens"),
            doc="ONNX ReverseSequence: reverse the first sequence_lens[b] steps along time_axis of each batch "
                "entry b; a length outside [0, time size] is an error")


# ----------------------------------------------------------------------------- tensor_scatter
def _tensor_scatter_axis(cache: TensorType, attrs: Attrs) -> int:
    axis = norm_axis(attrs["axis"], cache.ndim)
    if axis == 0:
        raise InputError("tensor_scatter: axis may not be the batch axis 0")
    if attrs["mode"] not in ("linear", "circular"):
        raise InputError(f"tensor_scatter: mode must be 'linear' or 'circular', got {attrs['mode']!r}")
    return axis


def _tensor_scatter_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    cache, upd = ts[0], ts[1]
    if cache.ndim < 2:
        raise InputError(f"tensor_scatter: past_cache must have rank >= 2, got shape {cache.shape}")
    axis = _tensor_scatter_axis(cache, attrs)
    if upd.dtype != cache.dtype or upd.ndim != cache.ndim or any(
            u != c for m, (u, c) in enumerate(zip(upd.shape, cache.shape)) if m != axis) \
            or upd.shape[axis] > cache.shape[axis]:
        raise InputError(f"tensor_scatter: update {upd.dtype}{list(upd.shape)} must have the dtype and shape of "
                         f"past_cache {cache.dtype}{list(cache.shape)} except along axis {axis}, where it may "
                         "not be longer")
    if len(ts) > 2:
        _require_index("tensor_scatter", ts[2], "write_indices")
        if ts[2].shape != (cache.shape[0],):
            raise InputError(f"tensor_scatter: write_indices must have shape ({cache.shape[0]},) (the batch "
                             f"size), got {ts[2].shape}")
    return [cache]


def _tensor_scatter_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    cache, upd = xs[0], xs[1]
    axis = _tensor_scatter_axis(TensorType(cache.shape, "float32"), attrs)
    m, s = cache.shape[axis], upd.shape[axis]
    wi = xs[2].astype(np.int64) if len(xs) > 2 else np.zeros(cache.shape[0], np.int64)
    circular = attrs["mode"] == "circular"
    if not circular and ((wi < 0) | (wi + s > m)).any():
        raise InputError(f"tensor_scatter: write index {int(wi[(wi < 0) | (wi + s > m)][0])} is out of range "
                         f"[0, {m - s}] (linear mode, {s} updates along an axis of size {m})")
    if circular and m == 0 and s:
        raise InputError("tensor_scatter: circular writes into an axis of size 0")
    out = cache.copy()
    for pre in np.ndindex(*cache.shape[:axis]):
        for q in range(s):
            t = int(wi[pre[0]]) + q
            out[pre + (t % m if circular else t,)] = upd[pre + (q,)]
    return [out]


register_op("tensor_scatter", attrs={"axis": ("int", -2), "mode": ("str", "linear")},
            type_rel=_tensor_scatter_rel, pattern=INJ, ref=_tensor_scatter_ref, num_inputs=(2, 3),
            inputs=("past_cache", "update", "write_indices"),
            doc="ONNX TensorScatter (KV-cache update): update written into past_cache along axis starting at "
                "write_indices[batch] (0 if absent); mode 'circular' wraps modulo the axis size, in 'linear' "
                "mode a write past the end (or a negative index) is an error")


# ----------------------------------------------------------------------------- det
def _det_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x = ts[0]
    if x.dtype not in FLOAT_DTYPES:
        raise InputError(f"det: input must be a floating-point tensor, got {x.dtype}")
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise InputError(f"det: input must be square matrices [*, M, M], got shape {x.shape}")
    if x.shape[-1] > DET_MAX_N:
        raise InputError(f"det: matrices larger than {DET_MAX_N}x{DET_MAX_N} are not supported "
                         f"(got {x.shape[-1]}x{x.shape[-1]})")
    return [TensorType(x.shape[:-2], x.dtype)]


def _det_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    n = x.shape[-1]
    if n == 0:
        return [np.ones(x.shape[:-2], x.dtype)]
    return [to_dtype(np.linalg.det(x.astype(np.float64)), x.dtype)]


register_op("det", type_rel=_det_rel, pattern=OPAQUE, ref=_det_ref, inputs=("data",),
            doc=f"ONNX Det: determinant of the [*, M, M] matrices (M <= {DET_MAX_N}), shape [*]")


def permutation_terms(n: int) -> list[tuple[int, tuple[int, ...]]]:
    """The Leibniz expansion of an ``n x n`` determinant: ``(sign, permutation)`` pairs.

    Parameters
    ----------
    n : int
        Matrix size.

    Returns
    -------
    list of (int, tuple of int)
        ``det(A) = sum(sign * prod(A[i, perm[i]] for i in range(n)))`` over the list.
    """
    terms = []
    for perm in itertools.permutations(range(n)):
        inv = sum(1 for i in range(n) for j in range(i + 1, n) if perm[i] > perm[j])
        terms.append((-1 if inv % 2 else 1, perm))
    return terms


# ----------------------------------------------------------------------------- scatters with a reduction
def _check_reduction(op: str, attrs: Attrs) -> None:
    if attrs["reduction"] not in SCATTER_REDUCTIONS:
        raise InputError(f"{op}: reduction must be one of {SCATTER_REDUCTIONS}, got {attrs['reduction']!r}")


def _scatter_reduce_common(op: str, data: TensorType, idx: TensorType, upd: TensorType, attrs: Attrs) -> None:
    _check_reduction(op, attrs)
    _require_index(op, idx)
    if upd.dtype != data.dtype:
        raise InputError(f"{op}: updates dtype {upd.dtype} differs from data dtype {data.dtype}")
    _require_numeric(op, data)


def _scatter_elements_reduce_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, idx, upd = ts
    op = "scatter_elements_reduce"
    _scatter_reduce_common(op, data, idx, upd, attrs)
    axis = norm_axis(attrs["axis"], data.ndim)
    if idx.shape != upd.shape or idx.ndim != data.ndim or any(
            i > d for m, (i, d) in enumerate(zip(idx.shape, data.shape)) if m != axis):
        raise InputError(f"{op}: indices {idx.shape} and updates {upd.shape} must have one shape, of data's rank "
                         f"and not larger than data {data.shape} off axis {axis}")
    if data.shape[axis] == 0 and idx.size:
        raise InputError(f"{op}: {idx.size} indices into axis {axis} of size 0 (none can be valid)")
    return [data]


_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_reduce_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, idx, upd = xs
    axis = norm_axis(attrs["axis"], x.ndim)
    idx = data_indices("scatter_elements_reduce", idx, x.shape[axis], axis)
    fn = _COMBINE[attrs["reduction"]]
    out = x.copy()
    with np.errstate(all="ignore"):
        for u in np.ndindex(*idx.shape):
            p = list(u)
            p[axis] = idx[u]
            out[tuple(p)] = fn(out[tuple(p)], upd[u])
    return [out]


register_op("scatter_elements_reduce", attrs={"axis": ("int", 0), "reduction": ("str", "add")},
            type_rel=_scatter_elements_reduce_rel, pattern=OPAQUE, ref=_scatter_elements_reduce_ref,
            num_inputs=3, inputs=("data", "indices", "updates"),
            doc="ONNX ScatterElements with reduction add|mul|max|min: every update is combined into data at "
                "its index along axis (duplicates accumulate); an index outside [-n, n) is an error")


def _scatter_nd_reduce_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, idx, upd = ts
    op = "scatter_nd_reduce"
    _scatter_reduce_common(op, data, idx, upd, attrs)
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or not 1 <= k <= data.ndim:
        raise InputError(f"{op}: the last dim of indices {idx.shape} must be in [1, {data.ndim}]")
    want = idx.shape[:-1] + data.shape[k:]
    if upd.shape != want:
        raise InputError(f"{op}: updates shape {upd.shape} must be {want} (indices {idx.shape}, data {data.shape})")
    if 0 in data.shape[:k] and upd.size:
        raise InputError(f"{op}: indices into data {data.shape}, whose first {k} dims are empty (none can be valid)")
    return [data]


def _scatter_nd_reduce_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, idx, upd = xs
    k = idx.shape[-1]
    idx = np.stack([data_indices("scatter_nd_reduce", idx[..., m], x.shape[m], m) for m in range(k)], -1)
    fn = _COMBINE[attrs["reduction"]]
    out = x.copy()
    with np.errstate(all="ignore"):
        for q in np.ndindex(*idx.shape[:-1]):
            p = tuple(idx[q])
            out[p] = fn(out[p], upd[q])
    return [out]


register_op("scatter_nd_reduce", attrs={"reduction": ("str", "add")}, type_rel=_scatter_nd_reduce_rel,
            pattern=OPAQUE, ref=_scatter_nd_reduce_ref, num_inputs=3, inputs=("data", "indices", "updates"),
            doc="ONNX ScatterND with reduction add|mul|max|min: each row of indices (last dim) addresses a slice "
                "of data that its updates are combined into (duplicates accumulate); an index outside [-n, n) "
                "is an error")
