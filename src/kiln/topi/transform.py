"""Data-movement ops (injective): reshape, transpose, concat, split, slices, gathers, tile, pad."""

from __future__ import annotations

from typing import Any, Sequence

from .. import te
from .registry import register_compute
from .util import TAG_BROADCAST, TAG_INJECTIVE, bload, load, norm_axis

__all__ = ["reshape", "flat_index", "unravel"]


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
    """Join along ``axis`` with a chain of lazy selects (only the right input is read)."""
    xs = list(inputs)
    nd = len(xs[0].shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    sizes = [t.shape[axis] for t in xs]
    shape = list(xs[0].shape)
    shape[axis] = sum(sizes)
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)

    def body(*i: Any) -> Any:
        parts = [(t, o) for t, o, s in zip(xs, offs, sizes) if s > 0]
        t, o = parts[-1]
        val = t[tuple(i[:axis]) + (i[axis] - o,) + tuple(i[axis + 1:])]
        for t, o in reversed(parts[:-1]):
            end = o + t.shape[axis]
            val = te.if_then_else(i[axis] < end, t[tuple(i[:axis]) + (i[axis] - o,) + tuple(i[axis + 1:])], val)
        return val

    return [te.compute(tuple(shape), body, name="concatenate", tag=TAG_INJECTIVE)]


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


def _norm_index(v: Any, n: int) -> Any:
    """Negative indices count from the end; the result is clamped into ``[0, n)``."""
    v = te.cast(v, "int64")
    v = te.if_then_else(v < te.const(0, "int64"), v + te.const(n, "int64"), v)
    v = te.minimum(te.maximum(v, te.const(0, "int64")), te.const(max(n - 1, 0), "int64"))
    return te.cast(v, "int32")


@register_compute("take")
def take(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX Gather along ``axis`` (out-of-range indices clamp, like the reference)."""
    x, ind = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    ki = len(ind.shape)
    shape = tuple(x.shape[:axis]) + tuple(ind.shape) + tuple(x.shape[axis + 1:])

    def body(*i: Any) -> Any:
        j = _norm_index(load(ind, i[axis:axis + ki]), x.shape[axis])
        return load(x, list(i[:axis]) + [j] + list(i[axis + ki:]))

    return [te.compute(shape, body, name="take", tag=TAG_INJECTIVE)]


@register_compute("gather_elements")
def gather_elements(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX GatherElements (``take_along_axis``), indices clamped like the reference."""
    x, ind = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)

    def body(*i: Any) -> Any:
        j = _norm_index(ind[i], x.shape[axis])
        return x[tuple(i[:axis]) + (j,) + tuple(i[axis + 1:])]

    return [te.compute(tuple(ind.shape), body, name="gather_elements", tag=TAG_INJECTIVE)]


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
                value: Any = 0.0, name: str = "pad", tag: str = TAG_INJECTIVE) -> te.Tensor:
    """Pad every dim by ``(before, after)``: constant / reflect / edge / wrap."""
    shape = tuple(d + a + b for d, (a, b) in zip(x.shape, pad_width))
    if mode == "constant":
        if x.dtype == "bool":
            fill = te.const(bool(value), "bool")
        else:
            fill = te.cast(te.const(float(value), "float64"), x.dtype)

        def body(*i: Any) -> Any:
            conds = []
            src = []
            for v, d, (a, b) in zip(i, x.shape, pad_width):
                if a:
                    conds.append(v >= a)
                if b:
                    conds.append(v < a + d)
                src.append(v - a if a else v)
            if not conds:
                return load(x, src)
            return te.if_then_else(te.all(*conds), load(x, src), fill)

        return te.compute(shape, body, name=name, tag=tag)

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
