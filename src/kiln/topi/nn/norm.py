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
from ...te.dynamic import VALID_BOX_ONLY
from ..registry import register_compute
from ..util import TAG_BROADCAST, TAG_ELEMWISE, compute_dtype, norm_axis, prod

__all__ = ["TAG_NORM_STAT", "TAG_NORM_OUT", "SOFTMAX_ROLE", "SOFTMAX_MAX_ROW", "softmax"]

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


#: ``attrs["softmax"]`` of the stages of a row softmax (:func:`softmax`), for its CPU schedule:
#: ``"max_part"`` / ``"max_tail"`` / ``"max"``, ``"exp"`` (the row of exponentials),
#: ``"sum_part"`` / ``"sum_tail"`` / ``"sum"``, ``"row"`` (``1 / sum`` or ``log(sum)``).
SOFTMAX_ROLE = "softmax"
#: Longest row whose exponentials are kept in a scratch row (float32): the codegens put
#: temporaries up to 32 KiB on the stack; a longer row would allocate per row, so it gets the
#: three-stage form (the exponential computed twice) instead.
SOFTMAX_MAX_ROW = 8192


#: Clamp of the row softmax's ``exp`` argument: ``exp(-87.3) = 1.23e-38`` is still a normal
#: float32 (``ln FLT_MIN`` = -87.3365), so no step of the vector ``exp`` produces a subnormal.
_EXP_NORMAL_MIN = -87.3
#: Exponentials below this give a softmax output of 0: ``e * (1 / sum)`` with ``sum <= n <=``
#: :data:`SOFTMAX_MAX_ROW` stays a normal float32 (>= 1.2e-34) for every ``e`` at or above it.
_OUT_FLUSH = 1e-30


def _softmax_lanes() -> int | None:
    """Partial accumulators per row statistic (two float32 vectors of the kernel's CPU ISA), or
    None for a device target (its schedules get the plain three-stage form)."""
    # imported here: the x86 schedules import this module (for the tags)
    from ...runtime.errors import TargetError
    from ..knobs import current_kernel_target
    from ..schedule.x86 import schedule_isa

    try:
        return 2 * schedule_isa(current_kernel_target()).lanes("float32")
    except TargetError:
        return None


def softmax(x: te.Tensor, axis: int, log: bool = False, lanes: int | None = -1) -> te.Tensor:
    """Numerically stable (log-)softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``.

    Along the last axis (a contiguous row) on a CPU the exponential is computed once per
    element: into a row-sized scratch stage (``exp``) that the sum reads and the output scales
    by ``1 / sum`` (log_softmax needs no scratch: ``x - max - log(sum)``).  The row maximum and
    sum are each split into ``lanes`` partial accumulators over whole blocks of ``lanes``
    elements (``*_part``, vectorised by the schedule: a single scalar accumulator is a serial
    dependency chain, and LLVM vectorises neither a NaN-propagating max nor, in the C
    backend, a float sum), a scalar stage for the ``n % lanes`` tail elements (``*_tail``)
    and a balanced tree over the partials (``max`` / ``sum``).  Exponentials that would be
    subnormal (``x - max < -87.3``: masked entries) are flushed to 0, as ONNX Runtime does,
    because producing subnormals is slow on x86.  ``lanes=-1``: from the kernel target
    (:func:`_softmax_lanes`); ``None`` (device targets, other axes, rows longer than
    :data:`SOFTMAX_MAX_ROW`): three stages, max / sum of exponentials / output, which the
    generic and GPU schedules handle like any reduction.
    """
    nd = len(x.shape)
    axis = norm_axis(axis, nd)
    cd = compute_dtype(x.dtype)
    n = int(x.shape[axis])
    if lanes == -1:
        lanes = _softmax_lanes()
    if lanes is not None and (axis != nd - 1 or n > SOFTMAX_MAX_ROW or n < 1):
        lanes = None
    if lanes is not None:
        return _row_softmax(x, log, lanes)
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


def _row_reduce(src: Any, rows: tuple[int, ...], n: int, lanes: int, kind: str, name: str,
                cd: str, nv: Any = None) -> te.Tensor:
    """Per-row max or sum of ``src(row_index, k)`` for ``k < n``, as partial accumulators.

    ``lanes`` partials over the ``n // lanes`` whole blocks (element ``k = b * lanes + l`` goes
    to partial ``l``), a scalar reduction of the ``n % lanes`` tail, then a per-row stage
    (role ``"row"``) that combines the partials and the tail as a balanced tree: a reduction
    over the partials would be a serial chain of ``lanes`` dependent operations per row
    (~60 cycles for 16 NaN-propagating maxes, as much as the rest of a 128-element row's max).
    Rows shorter than ``lanes`` are one scalar reduction.  Sums are not bit-identical to a
    sequential sum (a different association), like any vectorised reduction.

    A row of runtime length ``nv`` (a symbolic dim; ``n`` is its upper bound) counts its whole
    blocks at run time: a block is reduced when its last element is inside the row (one
    condition per block, so the block stays one vector operation), and the tail is the
    ``nv % lanes`` elements after the last whole block, each guarded.
    """
    red = te.reduce_max if kind == "max" else te.sum
    nb, tail = divmod(n, lanes)
    r = len(rows)

    def stat(shape: tuple[int, ...], f: Any, role: str, k: Any, where: Any = None) -> te.Tensor:
        return te.compute(shape, lambda *i: red(f(*i), axis=k, where=where(*i) if where else None),
                          name=f"{name}_{role}", tag=TAG_NORM_STAT, attrs={SOFTMAX_ROLE: role})

    if nb == 0:
        k = te.reduce_axis((0, n), name="k")
        return stat(rows, lambda *i: src(i, k), kind, k)
    kb = te.reduce_axis((0, nb), name="kb")
    if nv is None:
        part = stat(rows + (lanes,), lambda *i: src(i[:r], kb * lanes + i[r]), f"{kind}_part", kb)
    else:
        part = stat(rows + (lanes,), lambda *i: src(i[:r], kb * lanes + i[r]), f"{kind}_part", kb,
                    where=lambda *i: kb * lanes + (lanes - 1) < nv)
    rest = None
    if nv is not None:
        kt = te.reduce_axis((0, lanes - 1), name="kt")
        start = te.floordiv(nv, lanes) * lanes
        rest = stat(rows, lambda *i: src(i, start + kt), f"{kind}_tail", kt, where=lambda *i: start + kt < nv)
    elif tail:
        kt = te.reduce_axis((0, tail), name="kt")
        rest = stat(rows, lambda *i: src(i, nb * lanes + kt), f"{kind}_tail", kt)

    def combine(i: Sequence[Any]) -> Any:
        vals = [part[tuple(i) + (j,)] for j in range(lanes)]
        if rest is not None:
            vals.append(rest[tuple(i)] if r else rest())
        while len(vals) > 1:
            pairs = [te.maximum(a, b) if kind == "max" else a + b for a, b in zip(vals[0::2], vals[1::2])]
            vals = pairs + vals[len(pairs) * 2:]
        return vals[0]

    return _per_row(rows, combine, f"{name}_{kind}")


def _per_row(rows: tuple[int, ...], f: Any, name: str) -> te.Tensor:
    """A per-row value (role ``"row"``); injective, so schedules that do not know it inline it."""
    return te.compute(rows, lambda *i: f(i), name=name, tag=TAG_ELEMWISE, attrs={SOFTMAX_ROLE: "row"})


def _row_softmax(x: te.Tensor, log: bool, lanes: int) -> te.Tensor:
    """(Log-)softmax along the last axis with the exponential computed once (see :func:`softmax`)."""
    cd = compute_dtype(x.dtype)
    rows = tuple(int(s) for s in x.shape[:-1])
    n = int(x.shape[-1])
    nv = x.dyn[-1] if x.dyn is not None else None  # a row of runtime length

    def xv(i: Sequence[Any], k: Any) -> Any:
        return te.cast(x[tuple(i) + (k,)], cd)

    def row(t: te.Tensor, i: Sequence[Any]) -> Any:
        return t[tuple(i)] if len(i) else t()

    mx = _row_reduce(xv, rows, n, lanes, "max", "softmax_max", cd, nv)

    def exp_shifted(i: Sequence[Any], k: Any) -> Any:
        # exp(x - max) <= 1, its argument clamped where the result would be subnormal (every
        # -inf of an attention mask): producing a subnormal costs a microcode assist on x86,
        # which made a softmax with a quarter of its inputs masked 2.3x slower (1.19 vs 0.51
        # ms for 1x12x197x197) -- the clamp costs ~10-20% on unmasked rows.  Clamped entries
        # add < 1.3e-38 each to a sum >= 1; the output flushes them to 0.  te.maximum, not an
        # if_then_else: a select whose branches load is evaluated lane by lane.
        return te.exp(te.maximum(xv(i, k) - row(mx, i), te.const(_EXP_NORMAL_MIN, cd)))

    if log:
        ssum = _row_reduce(exp_shifted, rows, n, lanes, "sum", "softmax_expsum", cd, nv)

        # one log per row: a row stage, not an expression the element loop would repeat
        lse = _per_row(rows, lambda i: te.log(row(ssum, i)), "softmax_logsum")

        def log_body(*i: Any) -> Any:
            ri = i[:-1]
            return te.cast(xv(ri, i[-1]) - row(mx, ri) - row(lse, ri), x.dtype)

        return te.compute(x.shape, log_body, name="log_softmax", tag=TAG_NORM_OUT)
    # injective tag: schedules that do not know it inline it (the exponential computed twice,
    # as before); the CPU softmax schedule keeps it as one row of scratch
    # (its readers -- the sum's blocks and tail, the output -- read a row of runtime length
    # only inside it, so the scratch row stops there too)
    e = te.compute(x.shape, lambda *i: exp_shifted(i[:-1], i[-1]), name="softmax_exp",
                   tag=TAG_ELEMWISE, attrs={SOFTMAX_ROLE: "exp", VALID_BOX_ONLY: True})
    ssum = _row_reduce(lambda i, k: e[tuple(i) + (k,)], rows, n, lanes, "sum", "softmax_expsum", cd, nv)

    # one division per row, a multiply per element
    rcp = _per_row(rows, lambda i: te.const(1.0, cd) / row(ssum, i), "softmax_rcp")

    def body(*i: Any) -> Any:
        # below _OUT_FLUSH an output could be subnormal (an assist again): 0, like the clamped
        # entries, which are exact zeros in the reference (and in ONNX Runtime).  The select
        # picks between constants so it stays one vector blend; NaN compares false, stays NaN.
        keep = te.if_then_else(e[i] < te.const(_OUT_FLUSH, cd), te.const(0.0, cd), te.const(1.0, cd))
        return te.cast(e[i] * row(rcp, i[:-1]) * keep, x.dtype)

    return te.compute(x.shape, body, name="softmax", tag=TAG_NORM_OUT)


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

