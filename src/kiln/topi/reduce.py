"""Reductions, arg-reductions and top-k.

Reduction stages carry the tag ``"reduce"`` (their schedules parallelise the outer spatial
axes); a cast/finalise stage after them is injective and fuses into the consumer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import te
from ..tir.dtype import is_bool, is_float, is_int, is_uint
from .registry import register_compute
from .util import TAG_ELEMWISE, load, norm_axis, prod

__all__ = ["reduce_compute", "TAG_REDUCE", "TAG_ARGREDUCE", "TAG_TOPK"]

TAG_REDUCE = "reduce"
TAG_ARGREDUCE = "argreduce"
TAG_TOPK = "topk"


def _split_axes(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[tuple[int, ...], list[int]]:
    out_shape = tuple((1 if i in axes else d) for i, d in enumerate(shape) if keepdims or i not in axes)
    return out_shape, list(axes)


def reduce_compute(x: te.Tensor, axes: Sequence[int], keepdims: bool, reducer: Callable[..., Any],
                   acc: str, pre: Callable[[Any], Any] | None = None, name: str = "reduce",
                   tag: str = TAG_REDUCE) -> te.Tensor:
    """``reducer(pre(x[...]) as acc dtype, over axes)``; output keeps or drops the reduced dims."""
    nd = len(x.shape)
    axes = sorted(norm_axis(a, nd) for a in axes)
    out_shape, _ = _split_axes(x.shape, axes, keepdims)
    rvs = {a: te.reduce_axis((0, x.shape[a]), name=f"r{a}") for a in axes}

    def body(*i: Any) -> Any:
        it = iter(i)
        src = []
        for d in range(nd):
            if d in rvs:
                if keepdims:
                    next(it)
                src.append(rvs[d])
            else:
                src.append(next(it))
        v = te.cast(load(x, src), acc)
        if pre is not None:
            v = pre(v)
        return reducer(v, axis=[rvs[a] for a in axes])

    return te.compute(out_shape, body, name=name, tag=tag)


def _sum_acc(dt: str) -> str:
    # Integer means need the exact wide sum; plain sums/products wrap identically in the
    # narrow type, but the reference's float64 sum of float32 is closer to a float32 sum
    # than to anything else we could do cheaply.
    if dt in ("float16", "bfloat16"):
        return "float32"
    if is_bool(dt):
        return "int64"
    return dt


def _reduce(kind: str) -> Callable[[dict, list, list], list]:
    def compute(attrs: dict, inputs: list, out_types: list) -> list:
        x = inputs[0]
        dt = x.dtype
        nd = len(x.shape)
        axes = sorted(norm_axis(a, nd) for a in attrs["axes"])
        keep = bool(attrs.get("keepdims", False))
        name = f"reduce_{kind}"
        if not axes:
            return [te.compute(x.shape, lambda *i: load(x, i), name=name, tag=TAG_ELEMWISE)]
        if kind in ("max", "min"):
            red = te.reduce_max if kind == "max" else te.reduce_min
            return [reduce_compute(x, axes, keep, red, dt, name=name)]
        if kind == "mean":
            acc = _sum_acc(dt)
            if is_int(dt):
                acc = "int64"
            elif is_uint(dt):
                acc = "uint64"
            s = reduce_compute(x, axes, keep, te.sum, acc, name=name + "_sum")
            n = prod(x.shape[a] for a in axes)
            dyn = [x.dyn[a] for a in axes if x.dyn is not None and x.dyn[a] is not None]
            if dyn:
                # the count is the runtime extent (the padded layout's upper bound is not)
                count = te.const(prod(x.shape[a] for a in axes if x.dyn[a] is None), "int32")
                for v in dyn:
                    count = count * v
                if is_float(acc):
                    f = lambda v: v / te.cast(count, acc)  # noqa: E731
                else:
                    f = lambda v: te.truncdiv(v, te.cast(te.maximum(count, te.const(1, "int32")), acc))  # noqa: E731
                return [te.compute(s.shape, lambda *i: te.cast(f(load(s, i)), dt), name=name, tag=TAG_ELEMWISE)]
            if is_float(acc):
                f = (lambda v: v / te.const(float(n), acc)) if n else (lambda v: v / te.const(0.0, acc))
            else:
                f = lambda v: te.truncdiv(v, te.const(max(n, 1), acc))  # noqa: E731
            return [te.compute(s.shape, lambda *i: te.cast(f(load(s, i)), dt), name=name, tag=TAG_ELEMWISE)]
        red = te.sum if kind == "sum" else te.reduce_prod
        acc = _sum_acc(dt)
        s = reduce_compute(x, axes, keep, red, acc, name=name if acc == dt else name + "_acc")
        if acc == dt:
            return [s]
        if is_bool(dt):
            return [te.compute(s.shape, lambda *i: te.not_equal(load(s, i), te.const(0, acc)), name=name,
                               tag=TAG_ELEMWISE)]
        return [te.compute(s.shape, lambda *i: te.cast(load(s, i), dt), name=name, tag=TAG_ELEMWISE)]

    return compute


for _k in ("sum", "mean", "prod", "max", "min"):
    register_compute(f"reduce_{_k}", _reduce(_k))


def _argreduce(is_max: bool) -> Callable[[dict, list, list], list]:
    def compute(attrs: dict, inputs: list, out_types: list) -> list:
        """Two passes: the extreme value, then the first (or last) index holding it."""
        x = inputs[0]
        nd = len(x.shape)
        axis = norm_axis(int(attrs.get("axis", 0)), nd)
        keep = bool(attrs.get("keepdims", True))
        last = bool(attrs.get("select_last_index", False))
        n = x.shape[axis]
        name = "argmax" if is_max else "argmin"
        ext = reduce_compute(x, [axis], True, te.reduce_max if is_max else te.reduce_min, x.dtype,
                             name=name + "_val", tag=TAG_REDUCE)
        k = te.reduce_axis((0, n), name="k")
        out_shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape) if keep or d != axis)

        def body(*i: Any) -> Any:
            full = list(i) if keep else list(i[:axis]) + [te.const(0)] + list(i[axis:])
            src = list(full)
            src[axis] = k
            hit = te.equal(load(x, src), load(ext, full))
            kk = te.cast(k.var, "int64")
            if last:
                return te.reduce_max(te.if_then_else(hit, kk, te.const(-1, "int64")), axis=k)
            return te.reduce_min(te.if_then_else(hit, kk, te.const(n, "int64")), axis=k)

        idx = te.compute(out_shape, body, name=name, tag=TAG_ARGREDUCE)
        # NaN never compares equal: clamp so the result stays a valid index.
        fin = te.compute(out_shape, lambda *i: te.minimum(te.maximum(load(idx, i), te.const(0, "int64")),
                                                          te.const(n - 1, "int64")),
                         name=name + "_clamp", tag=TAG_ELEMWISE)
        return [fin]

    return compute


register_compute("argmax", _argreduce(True))
register_compute("argmin", _argreduce(False))


@register_compute("topk")
def topk(attrs: dict, inputs: list, out_types: list) -> list:
    """Top-k by rank counting (``O(n^2)`` comparisons per row along ``axis``).

    ``rank[i] = #{j : x[j] beats x[i] or (x[j] == x[i] and j < i)}`` is a permutation of
    ``0..n-1`` that orders the axis exactly like a stable sort (ties keep the lower index);
    ``index[p]`` is the ``i`` with ``rank[i] == p``, and ``values[p] = x[index[p]]``.
    Cheap for the small axes top-k usually sees (scores, classes); a sorting-network
    kernel is future work.
    """
    x = inputs[0]
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", -1)), nd)
    k = int(attrs["k"])
    largest = bool(attrs.get("largest", True))
    n = x.shape[axis]

    def at(idx: Sequence[Any], v: Any) -> list[Any]:
        out = list(idx)
        out[axis] = v
        return out

    j = te.reduce_axis((0, n), name="j")

    def rank_body(*i: Any) -> Any:
        xi = load(x, i)
        xj = load(x, at(i, j))
        beats = (xj > xi) if largest else (xj < xi)
        tie = te.logical_and(te.equal(xj, xi), j.var < i[axis])
        return te.sum(te.if_then_else(te.logical_or(beats, tie), te.const(1, "int32"), te.const(0, "int32")),
                      axis=j)

    rank = te.compute(x.shape, rank_body, name="topk_rank", tag=TAG_TOPK)
    out_shape = tuple(k if d == axis else s for d, s in enumerate(x.shape))
    r = te.reduce_axis((0, n), name="r")

    def idx_body(*p: Any) -> Any:
        hit = te.equal(load(rank, at(p, r)), p[axis])
        return te.reduce_min(te.if_then_else(hit, te.cast(r.var, "int64"), te.const(n, "int64")), axis=r)

    index = te.compute(out_shape, idx_body, name="topk_index", tag=TAG_TOPK)
    # Clamp only guards against NaN inputs (whose ranks may collide); it costs nothing.
    values = te.compute(out_shape, lambda *p: load(x, at(p, te.cast(te.minimum(load(index, p),
                                                                                te.const(n - 1, "int64")),
                                                                     "int32"))),
                        name="topk_values", tag=TAG_TOPK)
    return [values, index]


del _k
