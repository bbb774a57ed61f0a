"""Data-movement ops (injective unless noted): reshape, transpose, concat, split, slices, gathers, scatters, one-hot,
tile, pad. Every index read from data goes through :func:`data_index` (checked at run time)."""

from __future__ import annotations

from typing import Any, Sequence, cast

from .. import te
from .registry import register_compute
from ..te.dynamic import PADDED_EXTENTS
from .util import TAG_BROADCAST, TAG_INJECTIVE, bload, load, norm_axis

__all__ = ["reshape", "reshape_padded", "flat_index", "unravel", "data_index", "index_subject"]


def flat_index(idx: Sequence[Any], shape: Sequence[int]) -> Any:
    """Row-major linear index of ``idx`` in ``shape``."""
    out: Any = te.const(0)
    for i, d in zip(idx, shape):
        out = out * d + i
    return out


def unravel(flat: Any, shape: Sequence[int]) -> list[Any]:
    """Row-major multi-index of ``flat`` in ``shape``."""
    if not shape:
        return []
    idx: list[Any] = []
    for d in reversed(shape[1:]):
        idx.append(te.floormod(flat, d) if d != 1 else te.const(0))
        flat = te.floordiv(flat, d) if d != 1 else flat
    # the outermost index needs no modulo (flat < size)
    idx.append(flat if shape[0] != 1 else te.const(0))
    return list(reversed(idx))


def reshape(x: te.Tensor, shape: Sequence[int], name: str = "reshape") -> te.Tensor:
    """Row-major reshape as an injective compute."""
    shape = tuple(int(s) for s in shape)
    if shape == tuple(x.shape):
        return te.compute(shape, lambda *i: load(x, i), name=name, tag=TAG_INJECTIVE)
    return te.compute(shape, lambda *i: load(x, unravel(flat_index(i, shape), x.shape)), name=name,
                      tag=TAG_INJECTIVE)


def reshape_padded(x: te.Tensor, shape: Sequence[int], in_ext: Sequence[Any], out_ext: Sequence[Any],
                   name: str = "reshape") -> te.Tensor:
    """A reshape of a tensor with dynamic dims that moves data in the padded layout.

    Row-major order is over the *actual* extents (``in_ext`` / ``out_ext``: an int or the
    runtime-extent Var per dim), not the upper bounds the storage is laid out for, so the
    element at ``out[i]`` comes from ``x[unravel(ravel(i, out_ext), in_ext)]`` — the runtime
    extents appear in the index arithmetic. Every read stays inside ``x``'s valid box by
    construction, which the dynamic-extent analysis cannot see: the compute says so
    (``dyn_reads_in_bounds``).
    """
    shape = tuple(int(s) for s in shape)
    nd = len(x.shape)

    def body(*i: Any) -> Any:
        flat: Any = te.const(0)
        for idx, e in zip(i, out_ext):
            flat = flat * e + idx
        src: list[Any] = [te.const(0)] * nd
        for k in reversed(range(nd)):
            if k == 0:
                src[0] = flat
            else:
                src[k] = te.floormod(flat, in_ext[k])
                flat = te.floordiv(flat, in_ext[k])
        return load(x, src)

    return te.compute(shape, body, name=name, tag=TAG_INJECTIVE, attrs={"dyn_reads_in_bounds": True})


@register_compute("reshape")
def _reshape(attrs: dict, inputs: list, out_types: list) -> list:
    return [reshape(inputs[0], attrs["newshape"])]


@register_compute("transpose")
def transpose(attrs: dict, inputs: list, out_types: list) -> list:
    """``out.shape[i] = in.shape[axes[i]]``."""
    x = inputs[0]
    nd = len(x.shape)
    axes = [norm_axis(a, nd) for a in attrs["axes"]]
    shape = tuple(x.shape[a] for a in axes)

    def body(*i: Any) -> Any:
        src: list[Any] = [None] * nd
        for k, a in enumerate(axes):
            src[a] = i[k]
        return load(x, src)

    return [te.compute(shape, body, name="transpose", tag=TAG_INJECTIVE)]


@register_compute("concatenate")
def concatenate(attrs: dict, inputs: list, out_types: list) -> list:
    """Join along ``axis`` with lazy selects (only the right input is read), nested as a
    balanced tree on the offsets: an unrolled 1000-step Scan concatenates 1000 rows, and a
    chain that deep overflowed Python's recursion limit in every pass over the expression."""
    xs = list(inputs)
    nd = len(xs[0].shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    sizes = [t.shape[axis] for t in xs]
    shape = list(xs[0].shape)
    shape[axis] = sum(sizes)
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)
    if any(t.dyn is not None and t.dyn[axis] is not None for t in xs):
        return [_concatenate_dynamic(xs, axis, tuple(shape))]

    def body(*i: Any) -> Any:
        parts = [(t, o) for t, o, s in zip(xs, offs, sizes) if s > 0]

        def pick(lo: int, hi: int) -> Any:  # the value from parts[lo:hi]
            if hi - lo == 1:
                t, o = parts[lo]
                return t[tuple(i[:axis]) + (i[axis] - o,) + tuple(i[axis + 1:])]
            mid = (lo + hi) // 2
            return te.if_then_else(i[axis] < parts[mid][1], pick(lo, mid), pick(mid, hi))

        return pick(0, len(parts))

    return [te.compute(tuple(shape), body, name="concatenate", tag=TAG_INJECTIVE)]


def _concatenate_dynamic(xs: list, axis: int, shape: tuple) -> te.Tensor:
    """Concatenate along an axis that is dynamic in some input (a runtime-length sequence
    grown by a Loop): in the padded layout each input's rows start after the *runtime* extents
    of the inputs before it, so the offsets are runtime values and every read is guarded by
    ``index < extent`` of its input (past the last one: zeros, the output's padding)."""
    sizes = [t.dyn[axis] if t.dyn is not None and t.dyn[axis] is not None else te.const(t.shape[axis])
             for t in xs]

    def body(*i: Any) -> Any:
        reads = []
        off: Any = None
        for t, n in zip(xs, sizes):
            if int(t.shape[axis]) == 0:
                continue
            j = i[axis] if off is None else i[axis] - off
            reads.append((j < n, t[tuple(i[:axis]) + (j,) + tuple(i[axis + 1:])]))
            off = n if off is None else off + n
        val = te.const(0, xs[0].dtype)
        for cond, read in reversed(reads):
            val = te.if_then_else(cond, read, val)
        return val

    return te.compute(shape, body, name="concatenate", tag=TAG_INJECTIVE)


@register_compute("split")
def split(attrs: dict, inputs: list, out_types: list) -> list:
    """One slice compute per section (outputs of different shapes cannot share one op)."""
    x = inputs[0]
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    outs = []
    off = 0
    for k, s in enumerate(attrs["sections"]):
        shape = list(x.shape)
        shape[axis] = s

        def body(*i: Any, _o: int = off) -> Any:
            return x[tuple(i[:axis]) + (i[axis] + _o,) + tuple(i[axis + 1:])]

        outs.append(te.compute(tuple(shape), body, name=f"split_{k}", tag=TAG_INJECTIVE))
        off += s
    return outs


@register_compute("strided_slice")
def strided_slice(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX Slice (static): ``out[i] = x[begin + i * step]`` per dimension."""
    from ..ir.ops import normalize_slice

    x = inputs[0]
    dims = normalize_slice(tuple(x.shape), attrs)
    shape = tuple(len(range(b, e, s)) for b, e, s in dims)

    def body(*i: Any) -> Any:
        return load(x, [b + v * s if s != 1 else v + b for v, (b, _, s) in zip(i, dims)])

    return [te.compute(shape, body, name="strided_slice", tag=TAG_INJECTIVE)]


def data_index(v: Any, x: te.Tensor, axis: int, op: str) -> Any:
    """An index read from data into ``x``'s ``axis``, with ONNX semantics (negative counts from
    the end, out of range is a run-time error of the kernel, see :func:`kiln.te.checked_index`).

    Every index-from-data op goes through here, so each one reads memory only with an index
    proven to be in bounds, and reports a bad one the same way.
    """
    n = int(x.shape[axis])
    # an axis of dynamic extent checks against (and wraps negatives by) its runtime extent:
    # an index into the padding is as out of range as one past the storage
    rt = x.dyn[axis] if x.dyn is not None else None
    what = index_subject(op, x.shape, axis, rt is not None)
    # the checked value lies in [0, n): int32 keeps the offset arithmetic as narrow as a loop
    # index's (the codegens widen offsets of buffers with 2**31 or more elements)
    return te.cast(te.checked_index(v, n if rt is None else rt, what), "int32")


def index_subject(op: str, shape: Sequence[Any], axis: int, dynamic: bool) -> str:
    """Subject of the run-time error of a bad index from data (:func:`data_index`).

    Loop-IR kernels that check their indices themselves use it too, so an out-of-range index
    reads the same whichever form of a kernel met it.

    Parameters
    ----------
    op : str
        The op, first word of the message.
    shape : sequence of int
        The indexed data's shape (upper bounds for dynamic dims).
    axis : int
        The indexed axis.
    dynamic : bool
        Whether ``axis`` has a runtime extent (the message then gives its bound only).

    Returns
    -------
    str
    """
    n = int(shape[axis])
    if dynamic:
        return f"{op}: index into axis {axis} (dynamic size, at most {n}) of data"
    return f"{op}: index into axis {axis} (size {n}) of data with shape {tuple(int(d) for d in shape)}"


@register_compute("take")
def take(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX Gather along ``axis`` (an out-of-range index is an error, see :func:`data_index`)."""
    x, ind = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    ki = len(ind.shape)
    shape = tuple(x.shape[:axis]) + tuple(ind.shape) + tuple(x.shape[axis + 1:])

    def body(*i: Any) -> Any:
        j = data_index(load(ind, i[axis:axis + ki]), x, axis, "take")
        return load(x, list(i[:axis]) + [j] + list(i[axis + ki:]))

    return [te.compute(shape, body, name="take", tag=TAG_INJECTIVE)]


@register_compute("gather_elements")
def gather_elements(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX GatherElements (``take_along_axis``; an out-of-range index is an error)."""
    x, ind = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)

    def body(*i: Any) -> Any:
        j = data_index(ind[i], x, axis, "gather_elements")
        return x[tuple(i[:axis]) + (j,) + tuple(i[axis + 1:])]

    return [te.compute(tuple(ind.shape), body, name="gather_elements", tag=TAG_INJECTIVE)]


@register_compute("gather_nd")
def gather_nd(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX GatherND: ``out[i, j] = data[batch(i), *indices[i, :], j]`` (each index checked)."""
    x, ind = inputs
    b = int(attrs.get("batch_dims", 0))
    k = int(ind.shape[-1])
    q = len(ind.shape) - 1  # output dims that come from indices
    shape = tuple(ind.shape[:-1]) + tuple(x.shape[b + k:])

    def body(*i: Any) -> Any:
        lead = list(i[:q])
        src = list(i[:b]) + [data_index(load(ind, lead + [te.const(m)]), x, b + m, "gather_nd") for m in range(k)]
        return load(x, src + list(i[q:]))

    return [te.compute(shape, body, name="gather_nd", tag=TAG_INJECTIVE)]


@register_compute("one_hot")
def one_hot(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX OneHot: ``values[1]`` where the (wrapped) index equals the position on ``axis``, else
    ``values[0]``; an index outside ``[-depth, depth)`` matches nothing (an all-off row, as the
    spec says), so nothing is read with it and there is nothing to check."""
    ind, values = inputs
    depth = int(attrs["depth"])
    axis = norm_axis(int(attrs.get("axis", -1)), len(ind.shape) + 1)
    shape = tuple(ind.shape[:axis]) + (depth,) + tuple(ind.shape[axis:])

    def body(*i: Any) -> Any:
        v = te.cast(load(ind, list(i[:axis]) + list(i[axis + 1:])), "int64")
        v = te.if_then_else(v < te.const(0, "int64"), v + te.const(depth, "int64"), v)
        return te.if_then_else(te.equal(v, te.cast(i[axis], "int64")), values[1], values[0])

    return [te.compute(shape, body, name="one_hot", tag=TAG_INJECTIVE)]


#: Tag of the search (reduction) stage of the scatters.
TAG_SCATTER = "scatter"


def _copy(x: te.Tensor, name: str) -> te.Tensor:
    return te.compute(tuple(x.shape), lambda *i: load(x, i), name=name, tag=TAG_INJECTIVE)


@register_compute("scatter_elements")
def scatter_elements(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX ScatterElements (reduction ``none``) as a search: ``found[p]`` is the last update
    position along ``axis`` whose index is ``p[axis]`` (``O(size * updates along axis)``);
    ``out[p]`` is that update, or ``data[p]``. Every index is checked (see
    :func:`data_index`): each one is compared with every position of the axis. The form of
    device targets; CPU targets use the copy-then-scatter kernel of :mod:`.index`."""
    x, ind, upd = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    us = tuple(int(d) for d in ind.shape)
    if 0 in us:
        return [_copy(x, "scatter_elements")]
    k = te.reduce_axis((0, us[axis]), name="k")
    none = te.const(-1, "int32")

    def found_body(*p: Any) -> Any:
        u = list(p)
        u[axis] = k.var
        hit = te.equal(data_index(load(ind, u), x, axis, "scatter_elements"), p[axis])
        v = te.if_then_else(hit, te.cast(k.var, "int32"), none)
        # positions past the updates' extent (off axis) read no index: the select is lazy
        inside = [p[m] < us[m] for m in range(nd) if m != axis and us[m] < x.shape[m]]
        if inside:
            v = te.if_then_else(te.all(*inside), v, none)
        return te.reduce_max(v, axis=k)

    found = cast(te.Tensor, te.compute(tuple(x.shape), found_body, name="scatter_elements_src", tag=TAG_SCATTER))

    # the updates' axis may be dynamic (torchvision's RoI pooling scatters each FPN level's
    # NonZero-selected rows back): found < its runtime extent always holds, and saying so in
    # the guard lets kiln.te.dynamic prove the read stays inside it
    dyn = upd.dyn[axis] if upd.dyn is not None else None

    def body(*p: Any) -> Any:
        f = load(found, p)
        src = list(p)
        src[axis] = f
        ok = f >= 0 if dyn is None else te.all(f >= 0, f < dyn)
        return te.if_then_else(ok, load(upd, src), load(x, p))

    return [te.compute(tuple(x.shape), body, name="scatter_elements", tag=TAG_INJECTIVE)]


@register_compute("scatter_nd")
def scatter_nd(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX ScatterND (reduction ``none``) as a search: ``found[p]`` (over the ``k`` indexed
    dims) is the last index row equal to ``p`` (``O(prod(data.shape[:k]) * rows * k)``);
    ``out[p, j]`` is ``updates[row, j]``, or ``data[p, j]``. Every index is checked. The form
    of device targets; CPU targets use the copy-then-scatter kernel of :mod:`.index`."""
    x, ind, upd = inputs
    k = int(ind.shape[-1])
    qs = tuple(int(d) for d in ind.shape[:-1])
    nq = 1
    for d in qs:
        nq *= d
    if nq == 0:
        return [_copy(x, "scatter_nd")]
    r = te.reduce_axis((0, nq), name="r")

    def found_body(*p: Any) -> Any:
        q = unravel(r.var, qs)
        hit = te.all(*[te.equal(data_index(load(ind, q + [te.const(m)]), x, m, "scatter_nd"), p[m])
                       for m in range(k)])
        return te.reduce_max(te.if_then_else(hit, r.var, te.const(-1, "int32")), axis=r)

    found = cast(te.Tensor, te.compute(tuple(x.shape[:k]), found_body, name="scatter_nd_src", tag=TAG_SCATTER))

    def body(*p: Any) -> Any:
        f = load(found, p[:k])
        return te.if_then_else(f >= 0, load(upd, unravel(f, qs) + list(p[k:])), load(x, p))

    return [te.compute(tuple(x.shape), body, name="scatter_nd", tag=TAG_INJECTIVE)]


@register_compute("broadcast_to")
def broadcast_to(attrs: dict, inputs: list, out_types: list) -> list:
    """NumPy broadcast to a static shape."""
    x = inputs[0]
    shape = tuple(attrs["shape"])
    return [te.compute(shape, lambda *i: bload(x, i), name="broadcast_to", tag=TAG_BROADCAST)]


@register_compute("tile")
def tile(attrs: dict, inputs: list, out_types: list) -> list:
    """``out[i] = x[i % x.shape]``."""
    x = inputs[0]
    reps = attrs["reps"]
    shape = tuple(d * r for d, r in zip(x.shape, reps))
    return [te.compute(shape, lambda *i: load(x, [v if r == 1 else te.floormod(v, d)
                                                  for v, d, r in zip(i, x.shape, reps)]),
                       name="tile", tag=TAG_INJECTIVE)]


def pad_compute(x: te.Tensor, pad_width: Sequence[tuple[int, int]], mode: str = "constant",
                value: Any = 0.0, name: str = "pad", tag: str = TAG_INJECTIVE,
                read_to_padded_extent: bool = False) -> te.Tensor:
    """Pad every dim by ``(before, after)``: constant / reflect / edge / wrap.

    In constant mode a dynamic axis of ``x`` (``x.dyn``) is padded after its runtime extent:
    the result holds ``x``'s valid box at offset ``before`` and the fill everywhere else.
    ``read_to_padded_extent``: the caller reads a dynamic axis only below ``extent + before +
    after`` (a window op whose output size is the window formula), so a kernel-internal copy
    stops there at run time instead of filling the padded upper bound
    (:data:`kiln.te.dynamic.PADDED_EXTENTS`).
    """
    shape = tuple(d + a + b for d, (a, b) in zip(x.shape, pad_width))
    if mode == "constant":
        if x.dtype == "bool":
            fill = te.const(bool(value), "bool")
        else:
            fill = te.cast(te.const(float(value), "float64"), x.dtype)

        dyn = x.dyn or (None,) * x.ndim

        def body(*i: Any) -> Any:
            conds = []
            src = []
            for v, d, (a, b), rt in zip(i, x.shape, pad_width, dyn):
                j = v - a if a else v
                if a:
                    conds.append(v >= a)
                if rt is not None and (a or b):
                    # a dynamic axis: the end padding starts at the runtime extent, not at
                    # the upper bound (the storage past it holds stale data)
                    conds.append(j < rt)
                elif b:
                    conds.append(v < a + d)
                src.append(j)
            if not conds:
                return load(x, src)
            return te.if_then_else(te.all(*conds), load(x, src), fill)

        ext = tuple((k, rt, a + b) for k, (rt, (a, b)) in enumerate(zip(dyn, pad_width))
                    if rt is not None and read_to_padded_extent)
        return te.compute(shape, body, name=name, tag=tag, attrs={PADDED_EXTENTS: ext} if ext else None)

    def src_index(v: Any, d: int, a: int, b: int) -> Any:
        if not a and not b:
            return v
        j = v - a
        if mode == "edge":
            return te.minimum(te.maximum(j, te.const(0)), te.const(d - 1))
        if mode == "wrap":
            return te.floormod(j, d)
        # reflect (pad < d, checked by the type relation): mirror without repeating the edge
        j = te.if_then_else(j < 0, te.const(0) - j, j)
        return te.if_then_else(j >= d, te.const(2 * (d - 1)) - j, j)

    return te.compute(shape, lambda *i: load(x, [src_index(v, d, a, b) for v, d, (a, b)
                                                 in zip(i, x.shape, pad_width)]),
                      name=name, tag=tag)


@register_compute("pad")
def pad(attrs: dict, inputs: list, out_types: list) -> list:
    """``pad`` with modes constant (``value`` cast to the dtype) / reflect / edge / wrap."""
    return [pad_compute(inputs[0], attrs["pad_width"], attrs.get("mode", "constant"), attrs.get("value", 0.0))]
