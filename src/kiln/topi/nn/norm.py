"""Normalisations and softmax: batch_norm (inference), instance_norm, layer_norm, lrn,
softmax / log_softmax.

Statistics are reduction stages (tag ``"norm_stat"``) accumulated in float32 for half
inputs; variance is the two-pass ``mean((x - mean)^2)`` like the reference (one-pass
``E[x^2] - E[x]^2`` loses digits when the mean is large).  Softmax subtracts the row
maximum before exponentiating.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ..registry import register_compute
from ..util import TAG_BROADCAST, TAG_ELEMWISE, compute_dtype, norm_axis, prod

__all__ = ["TAG_NORM_STAT", "TAG_NORM_OUT", "softmax"]

TAG_NORM_STAT = "norm_stat"
#: Final stage of a multi-stage op (softmax, layer_norm, ...): injective, but the group's output.
TAG_NORM_OUT = TAG_ELEMWISE


@register_compute("batch_norm")
def batch_norm(attrs: dict, inputs: list, out_types: list) -> list:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` per channel along ``axis``."""
    x, gamma, beta, mean, var = inputs
    axis = norm_axis(int(attrs.get("axis", 1)), len(x.shape))
    eps = float(attrs.get("epsilon", 1e-5))
    cd = compute_dtype(x.dtype)

    def body(*i: Any) -> Any:
        c = i[axis]
        f = lambda t: te.cast(t[c], cd)  # noqa: E731
        v = (te.cast(x[i], cd) - f(mean)) / te.sqrt(f(var) + te.const(eps, cd)) * f(gamma) + f(beta)
        return te.cast(v, x.dtype)

    return [te.compute(x.shape, body, name="batch_norm", tag=TAG_BROADCAST)]


def _moments(x: te.Tensor, axes: Sequence[int], name: str) -> tuple[te.Tensor, te.Tensor]:
    """Mean and (biased) variance over ``axes``, both keepdims, in the compute dtype."""
    nd = len(x.shape)
    cd = compute_dtype(x.dtype)
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    cnt = float(prod(x.shape[a] for a in axes))

    def src(i: Sequence[Any], rv: dict[int, Any]) -> list[Any]:
        return [rv[d] if d in rv else i[d] for d in range(nd)]

    rv1 = {a: te.reduce_axis((0, x.shape[a]), name=f"r{a}") for a in axes}
    ssum = te.compute(shape, lambda *i: te.sum(te.cast(x[tuple(src(i, rv1))], cd), axis=list(rv1.values())),
                      name=name + "_sum", tag=TAG_NORM_STAT)
    rv2 = {a: te.reduce_axis((0, x.shape[a]), name=f"s{a}") for a in axes}
    zero = [0] * nd

    def var_body(*i: Any) -> Any:
        mi = [zero[d] if d in rv2 else i[d] for d in range(nd)]
        d = te.cast(x[tuple(src(i, rv2))], cd) - ssum[tuple(mi)] / te.const(cnt, cd)
        return te.sum(d * d, axis=list(rv2.values()))

    vsum = te.compute(shape, var_body, name=name + "_sqsum", tag=TAG_NORM_STAT)
    return ssum, vsum


@register_compute("instance_norm")
def instance_norm(attrs: dict, inputs: list, out_types: list) -> list:
    """Normalise every ``(n, c)`` over the spatial dims, then scale/shift per channel."""
    x, gamma, beta = inputs
    nd = len(x.shape)
    axes = list(range(2, nd))
    eps = float(attrs.get("epsilon", 1e-5))
    cd = compute_dtype(x.dtype)
    cnt = float(prod(x.shape[a] for a in axes))
    ssum, vsum = _moments(x, axes, "instance_norm")

    def body(*i: Any) -> Any:
        mi = tuple(i[:2]) + (0,) * (nd - 2)
        mean = ssum[mi] / te.const(cnt, cd)
        inv = te.const(1.0, cd) / te.sqrt(vsum[mi] / te.const(cnt, cd) + te.const(eps, cd))
        v = (te.cast(x[i], cd) - mean) * inv * te.cast(gamma[i[1]], cd) + te.cast(beta[i[1]], cd)
        return te.cast(v, x.dtype)

    return [te.compute(x.shape, body, name="instance_norm", tag=TAG_NORM_OUT)]


@register_compute("layer_norm")
def layer_norm(attrs: dict, inputs: list, out_types: list) -> list:
    """Normalise over dims ``axis..end``; gamma/beta broadcast to ``data.shape[axis:]``."""
    x, gamma, beta = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", -1)), nd)
    axes = list(range(axis, nd))
    eps = float(attrs.get("epsilon", 1e-5))
    cd = compute_dtype(x.dtype)
    cnt = float(prod(x.shape[a] for a in axes))
    ssum, vsum = _moments(x, axes, "layer_norm")

    def pidx(t: te.Tensor, i: Sequence[Any]) -> tuple[Any, ...]:
        tail = list(i[axis:])
        off = len(tail) - len(t.shape)
        return tuple(0 if d == 1 else tail[off + q] for q, d in enumerate(t.shape))

    def body(*i: Any) -> Any:
        mi = tuple(i[:axis]) + (0,) * (nd - axis)
        mean = ssum[mi] / te.const(cnt, cd)
        inv = te.const(1.0, cd) / te.sqrt(vsum[mi] / te.const(cnt, cd) + te.const(eps, cd))
        g = gamma[pidx(gamma, i)] if len(gamma.shape) else gamma()
        b = beta[pidx(beta, i)] if len(beta.shape) else beta()
        v = (te.cast(x[i], cd) - mean) * inv * te.cast(g, cd) + te.cast(b, cd)
        return te.cast(v, x.dtype)

    return [te.compute(x.shape, body, name="layer_norm", tag=TAG_NORM_OUT)]


def softmax(x: te.Tensor, axis: int, log: bool = False) -> te.Tensor:
    """Numerically stable (log-)softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``."""
    nd = len(x.shape)
    axis = norm_axis(axis, nd)
    cd = compute_dtype(x.dtype)
    n = x.shape[axis]
    red_shape = tuple(s for d, s in enumerate(x.shape) if d != axis)

    def with_axis(i: Sequence[Any], v: Any) -> tuple[Any, ...]:
        return tuple(i[:axis]) + (v,) + tuple(i[axis:])

    k1 = te.reduce_axis((0, n), name="k")
    mx = te.compute(red_shape, lambda *i: te.reduce_max(te.cast(x[with_axis(i, k1)], cd), axis=k1),
                    name="softmax_max", tag=TAG_NORM_STAT)
    k2 = te.reduce_axis((0, n), name="k")

    def ld(t: te.Tensor, i: Sequence[Any]) -> Any:
        return t[tuple(i)] if len(i) else t()

    esum = te.compute(red_shape,
                      lambda *i: te.sum(te.exp(te.cast(x[with_axis(i, k2)], cd) - ld(mx, i)), axis=k2),
                      name="softmax_expsum", tag=TAG_NORM_STAT)

    def body(*i: Any) -> Any:
        ri = tuple(i[:axis]) + tuple(i[axis + 1:])
        z = te.cast(x[i], cd) - ld(mx, ri)
        v = z - te.log(ld(esum, ri)) if log else te.exp(z) / ld(esum, ri)
        return te.cast(v, x.dtype)

    return te.compute(x.shape, body, name="log_softmax" if log else "softmax", tag=TAG_NORM_OUT)


@register_compute("softmax")
def _softmax(attrs: dict, inputs: list, out_types: list) -> list:
    return [softmax(inputs[0], int(attrs.get("axis", -1)))]


@register_compute("log_softmax")
def _log_softmax(attrs: dict, inputs: list, out_types: list) -> list:
    return [softmax(inputs[0], int(attrs.get("axis", -1)), log=True)]


@register_compute("lrn")
def lrn(attrs: dict, inputs: list, out_types: list) -> list:
    """``x / (bias + alpha / size * sum of x^2 over the channel window) ** beta``.

    The window along ``axis`` is ``[c - (size-1)//2, c + ceil((size-1)/2)]``, clipped.
    """
    x = inputs[0]
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 1)), nd)
    size = int(attrs["size"])
    alpha, beta, bias = float(attrs["alpha"]), float(attrs["beta"]), float(attrs["bias"])
    cd = compute_dtype(x.dtype)
    n = x.shape[axis]
    lo = (size - 1) // 2
    r = te.reduce_axis((0, size), name="r")

    def sq_body(*i: Any) -> Any:
        c = i[axis] - lo + r
        src = tuple(i[:axis]) + (c,) + tuple(i[axis + 1:])
        v = te.cast(x[src], cd)
        return te.sum(v * v, axis=r, where=te.all(c >= 0, c < n))

    sq = te.compute(x.shape, sq_body, name="lrn_sqsum", tag=TAG_NORM_STAT)

    def body(*i: Any) -> Any:
        den = te.const(bias, cd) + te.const(alpha / size, cd) * sq[i]
        if beta == 0.75:
            # d^0.75 = sqrt(d * sqrt(d)): two square roots instead of pow
            p = te.sqrt(den * te.sqrt(den))
        else:
            p = te.pow(den, te.const(beta, cd))
        return te.cast(te.cast(x[i], cd) / p, x.dtype)

    return [te.compute(x.shape, body, name="lrn", tag=TAG_NORM_OUT)]

