"""Vectorizable single-precision ``exp``, ``erf`` and ``tanh`` for both codegens.

libm's ``expf`` / ``erff`` / ``tanhf`` are calls the loop vectorizers cannot turn into
vector code, so a fused GELU epilogue or a softmax ran one element at a time.  These are
branch-free polynomial versions written once against a tiny emitter interface
(:class:`MathEmitter`); the C codegen instantiates them as ``static inline`` functions
over GCC vector types (and plain ``float``), the LLVM codegen as internal always-inline
functions over ``float`` / ``<N x float>``.

Accuracy (float32, measured against float64 references by ``tests/codegen``): relative
error ≲ 3e-7 for ``exp`` on its whole range (including the subnormal results down to
``x = -103.97``), ``erf`` and ``tanh`` ≲ 5e-7 except where the result is below ~1e-30;
NaN propagates; ``exp(+inf) = inf``, ``exp(-inf) = 0``, ``erf/tanh(±inf) = ±1``.

Method: ``exp`` uses Cody–Waite range reduction ``x = k ln2 + r`` (``|r| ≤ ln2/2``), a
degree-7 polynomial for ``e^r`` and the scaling ``2^k`` applied as two exact powers of two so
subnormal results round once.  ``erf`` uses ``x P(x²)`` for ``|x| < 1`` and
``1 - exp(Q(|x|) - x²)`` on ``[1, 4]`` (``Q`` fits ``log erfc(x) + x²``; beyond 4 the result
rounds to ±1).  ``tanh`` uses ``x + x³ R(x²)`` for ``|x| < 0.625`` and
``1 - 2 / (e^{2|x|} + 1)`` above.  The coefficients are least-squares fits (reweighted
towards minimax) computed for Kiln with NumPy in float64 and rounded to float32.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["MathEmitter", "VECTOR_MATH", "emit_math"]

#: The float32 intrinsics implemented here (``Call.op`` names).
VECTOR_MATH = ("exp", "erf", "tanh")

_EXP_P = (0.5, 0.1666666716337204, 0.04166652262210846, 0.00833327230066061, 0.001392858917824924,
          0.00019918727048207074)
_ERF_P = (1.128379225730896, -0.37612637877464294, 0.11283779889345169, -0.026865320280194283,
          0.005220786202698946, -0.0008481152472086251, 0.00011248275404796004, -9.624595804780256e-06)
_ERFC_Q = (0.00036199126043356955, -1.1304274797439575, 0.3685610294342041, -0.11051589995622635,
           0.026726530864834785, -0.004897864069789648, 0.0006373084615916014, -5.347232217900455e-05,
           2.4081105038931128e-06, -3.47569688585736e-08)
_TANH_R = (-0.3333333432674408, 0.1333330124616623, -0.05395913124084473, 0.021769661456346512,
           -0.00834937859326601, 0.0023008917924016714)
_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # 9 significant bits: k * _LN2_HI is exact for |k| < 2^15
_LN2_LO = -2.12194440e-4
_ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: (t + M) - M rounds t to an integer for |t| < 2^22


class MathEmitter(Protocol):
    """Operations a backend provides (values are opaque handles of the backend).

    Floats are float32 scalars or vectors; masks are what comparisons return; ints are
    int32 of the same lane count.
    """

    def c(self, v: float) -> Any: ...
    def ic(self, v: int) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def sub(self, a: Any, b: Any) -> Any: ...
    def mul(self, a: Any, b: Any) -> Any: ...
    def div(self, a: Any, b: Any) -> Any: ...
    def lt(self, a: Any, b: Any) -> Any: ...
    def isnan(self, a: Any) -> Any: ...
    def sel(self, m: Any, a: Any, b: Any) -> Any: ...
    def f2i(self, a: Any) -> Any: ...
    def bits(self, a: Any) -> Any: ...
    def from_bits(self, i: Any) -> Any: ...
    def iadd(self, a: Any, b: Any) -> Any: ...
    def isub(self, a: Any, b: Any) -> Any: ...
    def iand(self, a: Any, b: Any) -> Any: ...
    def ior(self, a: Any, b: Any) -> Any: ...
    def ishl(self, a: Any, n: int) -> Any: ...
    def ishr(self, a: Any, n: int) -> Any: ...


def _poly(o: MathEmitter, x: Any, coefs: Sequence[float]) -> Any:
    """``sum(c_i x^i)`` by Estrin's scheme: pairs ``c_2j + c_2j+1 x`` combined with ``x^2``,
    then their pairs with ``x^4`` ...  Horner's rule is one chain of ``n`` dependent
    multiply-adds; a vector erf (three polynomials) was then latency bound at ~40 cycles per
    512-bit vector on Zen 5.  Estrin's chain is ``log2 n`` deep for a few more operations."""
    terms = [o.c(c) for c in coefs]
    power = x
    while len(terms) > 1:
        paired = [o.add(terms[i], o.mul(terms[i + 1], power)) for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            paired.append(terms[-1])
        terms = paired
        if len(terms) > 1:
            power = o.mul(power, power)
    return terms[0]


def _min(o: MathEmitter, a: Any, b: Any) -> Any:
    return o.sel(o.lt(a, b), a, b)  # b when a is NaN: callers restore NaN at the end


def _max(o: MathEmitter, a: Any, b: Any) -> Any:
    return o.sel(o.lt(b, a), a, b)


def _abs(o: MathEmitter, x: Any) -> Any:
    return o.from_bits(o.iand(o.bits(x), o.ic(0x7FFFFFFF)))


def _with_sign_of(o: MathEmitter, mag: Any, x: Any) -> Any:
    sign = o.iand(o.bits(x), o.ic(-0x80000000))
    return o.from_bits(o.ior(o.bits(mag), sign))


def _exp(o: MathEmitter, x: Any) -> Any:
    xc = _min(o, _max(o, x, o.c(-104.0)), o.c(88.8))
    t = o.mul(xc, o.c(_LOG2E))
    k = o.sub(o.add(t, o.c(_ROUND_MAGIC)), o.c(_ROUND_MAGIC))
    r = o.sub(xc, o.mul(k, o.c(_LN2_HI)))
    r = o.sub(r, o.mul(k, o.c(_LN2_LO)))
    y = o.add(o.add(o.c(1.0), r), o.mul(o.mul(r, r), _poly(o, r, _EXP_P)))
    ki = o.f2i(k)
    k1 = o.ishr(ki, 1)
    k2 = o.isub(ki, k1)
    s1 = o.from_bits(o.ishl(o.iadd(k1, o.ic(127)), 23))
    s2 = o.from_bits(o.ishl(o.iadd(k2, o.ic(127)), 23))
    y = o.mul(o.mul(y, s1), s2)
    return o.sel(o.isnan(x), x, y)


def _erf(o: MathEmitter, x: Any) -> Any:
    ax = _abs(o, x)
    small = o.mul(x, _poly(o, o.mul(x, x), _ERF_P))
    axc = _max(o, _min(o, ax, o.c(4.0)), o.c(1.0))
    e = _exp(o, o.sub(_poly(o, axc, _ERFC_Q), o.mul(axc, axc)))
    big = _with_sign_of(o, o.sub(o.c(1.0), e), x)
    y = o.sel(o.lt(ax, o.c(1.0)), small, big)
    return o.sel(o.isnan(x), x, y)


def _tanh(o: MathEmitter, x: Any) -> Any:
    ax = _abs(o, x)
    t = o.mul(x, x)
    small = o.add(x, o.mul(o.mul(x, t), _poly(o, t, _TANH_R)))
    axc = _min(o, ax, o.c(9.0))
    e = _exp(o, o.add(axc, axc))
    big = _with_sign_of(o, o.sub(o.c(1.0), o.div(o.c(2.0), o.add(e, o.c(1.0)))), x)
    y = o.sel(o.lt(ax, o.c(0.625)), small, big)
    return o.sel(o.isnan(x), x, y)


_ALGOS = {"exp": _exp, "erf": _erf, "tanh": _tanh}


def emit_math(name: str, o: MathEmitter, x: Any) -> Any:
    """Emit ``name(x)`` (one of :data:`VECTOR_MATH`) through emitter ``o``."""
    return _ALGOS[name](o, x)
