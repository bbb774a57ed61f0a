"""Elementwise (one-input) ops: unary math, activations, clip, cast, predicates.

Half-precision inputs (float16/bfloat16) are evaluated in float32 and rounded back once,
matching the references, which compute in float64 and cast to the input dtype.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .. import te
from ..tir.dtype import is_bool, is_float, is_uint
from .lowp_cast import convert as lowp_convert, is_lowp_conversion
from .registry import register_compute
from .util import TAG_ELEMWISE, compute_dtype, load

__all__ = ["elemwise", "float_unary"]


def elemwise(x: te.Tensor, f: Callable[[Any], Any], name: str, dtype: str | None = None) -> te.Tensor:
    """``out[i] = f(x[i])`` with the elementwise tag; ``dtype`` casts the result."""
    dt = dtype or x.dtype

    def body(*idx: Any) -> Any:
        return te.cast(f(load(x, idx)), dt)

    return te.compute(x.shape, body, name=name, tag=TAG_ELEMWISE)


def float_unary(x: te.Tensor, f: Callable[[Any], Any], name: str) -> te.Tensor:
    """``f`` evaluated in the compute dtype (float32 for half types) and cast back."""
    cd = compute_dtype(x.dtype)
    return elemwise(x, lambda v: f(te.cast(v, cd)), name, x.dtype)


def _c(v: float, like: Any) -> Any:
    return te.const(v, like.dtype)


def _softplus(v: Any) -> Any:
    # log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|.
    return te.maximum(v, _c(0.0, v)) + te.log1p(te.exp(-te.abs(v)))


def _hard_sigmoid_clamp(v: Any) -> Any:
    return te.minimum(te.maximum(v, _c(0.0, v)), _c(1.0, v))


_FLOAT_UNARY: dict[str, Callable[[Any], Any]] = {
    "sigmoid": te.sigmoid,
    "tanh": te.tanh,
    "exp": te.exp,
    "log": te.log,
    "sqrt": te.sqrt,
    "rsqrt": lambda v: _c(1.0, v) / te.sqrt(v),
    "erf": te.erf,
    "reciprocal": lambda v: _c(1.0, v) / v,
    "floor": te.floor,
    "ceil": te.ceil,
    "round": te.round,
    "sin": te.sin,
    "cos": te.cos,
    "softplus": _softplus,
    "softsign": lambda v: v / (_c(1.0, v) + te.abs(v)),
    "hard_swish": lambda v: v * _hard_sigmoid_clamp(v / _c(6.0, v) + _c(0.5, v)),
    "tan": te.tan,
    "asin": te.asin,
    "acos": te.acos,
    "atan": te.atan,
    "sinh": te.sinh,
    "cosh": te.cosh,
    "asinh": te.asinh,
    "acosh": te.acosh,
    "atanh": te.atanh,
    "mish": lambda v: v * te.tanh(_softplus(v)),
}


def _register_float_unary(name: str, f: Callable[[Any], Any]) -> None:
    @register_compute(name)
    def _compute(attrs: dict, inputs: list, out_types: list) -> list:
        return [float_unary(inputs[0], f, name)]


for _n, _f in _FLOAT_UNARY.items():
    _register_float_unary(_n, _f)


# ----------------------------------------------------------------------------- numeric unary
def _relu(v: Any) -> Any:
    if is_bool(v.dtype):
        return v
    return te.maximum(v, te.const(0, v.dtype))


def _negative(v: Any) -> Any:
    return te.const(0, v.dtype) - v


def _sign(v: Any) -> Any:
    zero, one = te.const(0, v.dtype), te.const(1, v.dtype)
    if is_uint(v.dtype):
        return te.if_then_else(v > zero, one, zero)
    # x itself for 0 / -0 / NaN, which keeps NumPy's sign(NaN) = NaN.
    return te.if_then_else(v > zero, one, te.if_then_else(v < zero, te.const(-1, v.dtype), v))


for _n, _f in (("relu", _relu), ("negative", _negative), ("abs", te.abs), ("sign", _sign)):
    def _mk(name: str, f: Callable[[Any], Any]) -> None:
        @register_compute(name)
        def _compute(attrs: dict, inputs: list, out_types: list) -> list:
            x = inputs[0]
            if x.dtype in ("float16", "bfloat16") and name != "relu":
                return [float_unary(x, f, name)]
            return [elemwise(x, f, name)]

    _mk(_n, _f)


@register_compute("identity")
def identity(attrs: dict, inputs: list, out_types: list) -> list:
    """A copy (normally removed by Simplify; kept for completeness)."""
    return [elemwise(inputs[0], lambda v: v, "identity")]


@register_compute("dropout")
def dropout(attrs: dict, inputs: list, out_types: list) -> list:
    """Inference dropout is the identity."""
    return [elemwise(inputs[0], lambda v: v, "dropout")]


@register_compute("logical_not")
def logical_not(attrs: dict, inputs: list, out_types: list) -> list:
    """``not x`` on bool tensors."""
    return [elemwise(inputs[0], te.logical_not, "logical_not", "bool")]


@register_compute("isnan")
def isnan(attrs: dict, inputs: list, out_types: list) -> list:
    """``x != x``."""
    x = inputs[0]
    return [elemwise(x, lambda v: te.isnan(te.cast(v, compute_dtype(x.dtype))), "isnan", "bool")]


@register_compute("isinf")
def isinf(attrs: dict, inputs: list, out_types: list) -> list:
    """``x`` is +inf (``detect_positive``) or -inf (``detect_negative``)."""
    x = inputs[0]
    pos, neg = attrs.get("detect_positive", True), attrs.get("detect_negative", True)

    def f(v: Any) -> Any:
        v = te.cast(v, compute_dtype(x.dtype))
        inf = te.const(math.inf, v.dtype)
        if pos and neg:
            return te.isinf(v)
        if pos:
            return te.equal(v, inf)
        if neg:
            return te.equal(v, -inf)
        return te.const(False, "bool")

    return [elemwise(x, f, "isinf", "bool")]


# ----------------------------------------------------------------------------- activations
@register_compute("leaky_relu")
def leaky_relu(attrs: dict, inputs: list, out_types: list) -> list:
    """``x if x >= 0 else alpha * x``."""
    a = float(attrs.get("alpha", 0.01))
    return [float_unary(inputs[0], lambda v: te.if_then_else(v >= _c(0.0, v), v, v * _c(a, v)), "leaky_relu")]


def _elu_neg(v: Any, alpha: float) -> Any:
    return _c(alpha, v) * te.expm1(te.minimum(v, _c(0.0, v)))


@register_compute("elu")
def elu(attrs: dict, inputs: list, out_types: list) -> list:
    """``x if x > 0 else alpha * (exp(x) - 1)``."""
    a = float(attrs.get("alpha", 1.0))
    return [float_unary(inputs[0], lambda v: te.if_then_else(v > _c(0.0, v), v, _elu_neg(v, a)), "elu")]


@register_compute("selu")
def selu(attrs: dict, inputs: list, out_types: list) -> list:
    """``gamma * (x if x > 0 else alpha * (exp(x) - 1))``."""
    a, g = float(attrs["alpha"]), float(attrs["gamma"])
    return [float_unary(inputs[0],
                        lambda v: _c(g, v) * te.if_then_else(v > _c(0.0, v), v, _elu_neg(v, a)), "selu")]


@register_compute("hard_sigmoid")
def hard_sigmoid(attrs: dict, inputs: list, out_types: list) -> list:
    """``clip(alpha * x + beta, 0, 1)``."""
    a, b = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    return [float_unary(inputs[0], lambda v: _hard_sigmoid_clamp(_c(a, v) * v + _c(b, v)), "hard_sigmoid")]


@register_compute("celu")
def celu(attrs: dict, inputs: list, out_types: list) -> list:
    """``x if x > 0 else alpha * (exp(x / alpha) - 1)``."""
    a = float(attrs.get("alpha", 1.0))
    return [float_unary(inputs[0], lambda v: te.if_then_else(
        v > _c(0.0, v), v, _c(a, v) * te.expm1(te.minimum(v, _c(0.0, v)) / _c(a, v))), "celu")]


@register_compute("swish")
def swish(attrs: dict, inputs: list, out_types: list) -> list:
    """``x * sigmoid(alpha * x)``."""
    a = float(attrs.get("alpha", 1.0))
    return [float_unary(inputs[0], lambda v: v * te.sigmoid(_c(a, v) * v), "swish")]


@register_compute("shrink")
def shrink(attrs: dict, inputs: list, out_types: list) -> list:
    """``x + bias if x < -lambd, x - bias if x > lambd, else 0``.

    Integer inputs are compared and shifted in float64 and truncated back (ONNX Runtime's result
    for a fractional ``bias``).
    """
    x = inputs[0]
    lam, b = float(attrs.get("lambd", 0.5)), float(attrs.get("bias", 0.0))

    def f(v: Any) -> Any:
        return te.if_then_else(v < _c(-lam, v), v + _c(b, v),
                               te.if_then_else(v > _c(lam, v), v - _c(b, v), _c(0.0, v)))

    if is_float(x.dtype):
        return [float_unary(x, f, "shrink")]
    return [elemwise(x, lambda v: f(te.cast(v, "float64")), "shrink")]


@register_compute("thresholded_relu")
def thresholded_relu(attrs: dict, inputs: list, out_types: list) -> list:
    """``x if x > alpha else 0``."""
    a = float(attrs.get("alpha", 1.0))
    return [float_unary(inputs[0], lambda v: te.if_then_else(v > _c(a, v), v, _c(0.0, v)), "thresholded_relu")]


@register_compute("gelu")
def gelu(attrs: dict, inputs: list, out_types: list) -> list:
    """GELU: exact (erf) or ``approximate="tanh"``."""
    approx = attrs.get("approximate", "none")

    def f(v: Any) -> Any:
        half, one = _c(0.5, v), _c(1.0, v)
        if approx == "tanh":
            inner = _c(math.sqrt(2.0 / math.pi), v) * (v + _c(0.044715, v) * v * v * v)
            return half * v * (one + te.tanh(inner))
        return half * v * (one + te.erf(v * _c(1.0 / math.sqrt(2.0), v)))

    return [float_unary(inputs[0], f, "gelu")]


@register_compute("clip")
def clip(attrs: dict, inputs: list, out_types: list) -> list:
    """``min(max(x, a_min), a_max)``; ``None`` bounds are open.

    Integer inputs use ``ceil(a_min)`` / ``floor(a_max)`` clamped to the dtype's range, so a
    bound like 2.5 behaves like the reference.
    """
    x = inputs[0]
    lo, hi = attrs.get("a_min"), attrs.get("a_max")
    dt = x.dtype
    if not is_float(dt):
        from ..tir.dtype import max_value, min_value

        dmin, dmax = min_value(dt), max_value(dt)
        lo_i = dmin if lo is None or lo == -math.inf else max(int(math.ceil(lo)), dmin)
        hi_i = dmax if hi is None or hi == math.inf else min(int(math.floor(hi)), dmax)
        lo_i, hi_i = min(max(lo_i, dmin), dmax), max(min(hi_i, dmax), dmin)

        def fi(v: Any) -> Any:
            out = v
            if lo_i > dmin:
                out = te.maximum(out, te.const(lo_i, dt))
            if hi_i < dmax:
                out = te.minimum(out, te.const(hi_i, dt))
            return out

        return [elemwise(x, fi, "clip")]

    def ff(v: Any) -> Any:
        out = v
        if lo is not None:
            out = te.maximum(out, te.const(lo, dt))
        if hi is not None:
            out = te.minimum(out, te.const(hi, dt))
        return out

    # Half types: the bounds are rounded to the dtype first (NumPy's weak-scalar rule).
    return [elemwise(x, ff, "clip")]


@register_compute("cast")
def cast(attrs: dict, inputs: list, out_types: list) -> list:
    """Convert to ``attrs["dtype"]`` (float → int truncates; → bool is ``x != 0``).

    bfloat16 goes through float32 on either side, exactly as the reference does. A conversion
    to or from a low-precision storage type (float8, float4, int4, ...) is the integer bit
    manipulation of :func:`kiln.topi.lowp_cast.convert`, with the ``saturate`` and
    ``round_mode`` attributes of ONNX Cast.
    """
    x = inputs[0]
    dt = attrs["dtype"]
    src = x.dtype
    if is_lowp_conversion(src, dt):
        saturate, round_mode = bool(attrs.get("saturate", True)), str(attrs.get("round_mode", "up"))
        return [elemwise(x, lambda v: lowp_convert(v, dt, saturate, round_mode), "cast", dt)]

    def f(v: Any) -> Any:
        if dt == "bool":
            return te.not_equal(v, te.const(0, src))
        if src == "bfloat16" and dt != "float32":
            v = te.cast(v, "float32")
        if dt == "bfloat16" and not is_float(src):
            v = te.cast(v, "float32")
        return te.cast(v, dt)

    return [elemwise(x, f, "cast", dt)]


del _n, _f
