"""Broadcasting binary/ternary ops (NumPy broadcasting rules, ONNX semantics)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import te
from ..tir.dtype import is_float, is_int
from .registry import register_compute
from .util import TAG_BROADCAST, bload, compute_dtype, norm_axis

__all__ = ["broadcast_compute", "broadcast_shape"]


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy broadcast of static shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        off = ndim - len(s)
        for i, d in enumerate(s):
            if d != 1:
                out[off + i] = d
    return tuple(out)


def broadcast_compute(ins: Sequence[te.Tensor], f: Callable[..., Any], name: str,
                      shape: Sequence[int] | None = None, dtype: str | None = None) -> te.Tensor:
    """``out[i] = f(*[x[bcast(i)] for x in ins])`` over the broadcast shape."""
    shp = tuple(shape) if shape is not None else broadcast_shape(*(t.shape for t in ins))

    def body(*idx: Any) -> Any:
        v = f(*[bload(t, idx) for t in ins])
        return v if dtype is None else te.cast(v, dtype)

    return te.compute(shp, body, name=name, tag=TAG_BROADCAST)


def _half_wrap(f: Callable[[Any, Any], Any], dt: str) -> Callable[[Any, Any], Any]:
    cd = compute_dtype(dt)
    if cd == dt:
        return f
    return lambda a, b: te.cast(f(te.cast(a, cd), te.cast(b, cd)), dt)


def _div(dt: str) -> Callable[[Any, Any], Any]:
    if is_float(dt):
        return lambda a, b: a / b
    zero, one = te.const(0, dt), te.const(1, dt)

    def f(a: Any, b: Any) -> Any:
        # Integer division truncates toward zero and x / 0 = 0 (reference semantics).  The
        # divisor is made safe before dividing so a vectorised select cannot trap.
        safe = te.if_then_else(te.equal(b, zero), one, b)
        q = te.truncdiv(a, safe)
        if is_int(dt):
            # INT_MIN / -1 traps on x86; its wrapped result is -a.
            q = te.if_then_else(te.equal(b, te.const(-1, dt)), zero - a, q)
        return te.if_then_else(te.equal(b, zero), zero, q)

    return f


def _mod(dt: str, fmod: bool) -> Callable[[Any, Any], Any]:
    if is_float(dt) and fmod:
        return te.fmod
    zero, one = te.const(0, dt), te.const(1, dt)

    if is_float(dt):
        def floored(a: Any, b: Any) -> Any:
            # NumPy / Python float ``%``: C fmod moved into the divisor's sign, a zero result
            # signed like the divisor (the ONNX reference for fmod=0).
            r = te.fmod(a, b)
            wrong_sign = te.logical_and(te.not_equal(r, zero), te.not_equal(r < zero, b < zero))
            r = te.if_then_else(wrong_sign, r + b, r)
            return te.if_then_else(te.equal(r, zero), te.if_then_else(b < zero, te.const(-0.0, dt), zero), r)

        return floored

    def f(a: Any, b: Any) -> Any:
        safe = te.if_then_else(te.equal(b, zero), one, b)
        if is_int(dt):
            # x % -1 == 0 (and avoids the INT_MIN % -1 trap).
            safe = te.if_then_else(te.equal(b, te.const(-1, dt)), one, safe)
        return (te.truncmod if fmod else te.floormod)(a, safe)

    return f


def _arith(name: str, dt: str, attrs: dict) -> Callable[[Any, Any], Any]:
    if name == "add":
        return lambda a, b: a + b
    if name == "subtract":
        return lambda a, b: a - b
    if name == "multiply":
        return lambda a, b: a * b
    if name == "maximum":
        return te.maximum
    if name == "minimum":
        return te.minimum
    if name == "divide":
        return _div(compute_dtype(dt))
    if name == "mod":
        return _mod(compute_dtype(dt), bool(attrs.get("fmod", False)))
    raise KeyError(name)


def _register_arith(name: str) -> None:
    @register_compute(name)
    def _compute(attrs: dict, inputs: list, out_types: list) -> list:
        a, b = inputs
        dt = a.dtype
        f = _arith(name, dt, attrs)
        if name in ("divide", "mod"):
            f = _half_wrap(f, dt)
        return [broadcast_compute([a, b], f, name, out_types[0].shape if out_types else None, dt)]


for _n in ("add", "subtract", "multiply", "maximum", "minimum", "divide", "mod"):
    _register_arith(_n)


@register_compute("power")
def power(attrs: dict, inputs: list, out_types: list) -> list:
    """``a ** b``; the exponent may have another dtype; the result has the base's dtype.

    Integer bases are evaluated with float64 ``pow`` (exact while results stay below 2^53);
    the exponent is truncated to an integer first, like the reference.
    """
    a, b = inputs
    dt = a.dtype

    def f(x: Any, y: Any) -> Any:
        if is_float(dt):
            cd = compute_dtype(dt)
            return te.cast(te.pow(te.cast(x, cd), te.cast(y, cd)), dt)
        yi = y if not is_float(y.dtype) else te.cast(y, "int64")
        return te.cast(te.cast(te.pow(te.cast(x, "float64"), te.cast(yi, "float64")), "int64"), dt)

    return [broadcast_compute([a, b], f, "power", out_types[0].shape if out_types else None, dt)]


_CMP = {
    "equal": te.equal, "not_equal": te.not_equal,
    "less": lambda a, b: a < b, "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b, "greater_equal": lambda a, b: a >= b,
    "logical_and": te.logical_and, "logical_or": te.logical_or,
    "logical_xor": lambda a, b: te.not_equal(te.cast(a, "bool"), te.cast(b, "bool")),
}


def _register_cmp(name: str, f: Callable[[Any, Any], Any]) -> None:
    @register_compute(name)
    def _compute(attrs: dict, inputs: list, out_types: list) -> list:
        a, b = inputs
        return [broadcast_compute([a, b], f, name, None, "bool")]


for _n, _f in _CMP.items():
    _register_cmp(_n, _f)


@register_compute("prelu")
def prelu(attrs: dict, inputs: list, out_types: list) -> list:
    """``x if x >= 0 else slope * x``; the slope broadcasts to x (unidirectional)."""
    x, s = inputs
    return [broadcast_compute([x, s], lambda a, b: te.if_then_else(a < te.const(0, a.dtype), a * b, a),
                              "prelu", x.shape, x.dtype)]


@register_compute("bias_add")
def bias_add(attrs: dict, inputs: list, out_types: list) -> list:
    """``data + bias`` with the 1-D bias along ``axis``."""
    x, b = inputs
    axis = norm_axis(int(attrs.get("axis", 1)), len(x.shape))
    return [te.compute(x.shape, lambda *i: x[i] + b[i[axis]], name="bias_add", tag=TAG_BROADCAST)]


@register_compute("where")
def where(attrs: dict, inputs: list, out_types: list) -> list:
    """``cond ? x : y`` with three-way broadcasting."""
    c, x, y = inputs
    return [broadcast_compute([c, x, y], lambda cv, xv, yv: te.if_then_else(cv, xv, yv), "where", None, x.dtype)]


del _n, _f
