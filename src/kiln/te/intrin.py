"""Scalar operators of tensor expressions: math intrinsics, reducers, conditions, casts."""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.errors import CompileError
from ..tir.dtype import check_dtype, is_float, max_value as _dt_max, min_value as _dt_min
from ..tir.expr import _match  # the usual arithmetic conversions
from ..tir.expr import (
    PrimExpr, Reduce, binary, call, cast as _cast, checked_index as _checked_index, const as _const, convert,
    logical_not as _lnot, select,
)
from .tensor import IterVar

__all__ = [
    "const", "cast", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "tanh",
    "sigmoid", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "abs", "floor", "ceil", "trunc", "round", "pow", "atan2", "fmod", "isnan", "isinf", "isfinite",
    "maximum", "minimum", "if_then_else", "floordiv", "floormod", "truncdiv", "truncmod", "equal", "not_equal",
    "logical_and", "logical_or", "logical_not", "all", "any", "sum", "reduce_max", "reduce_min", "reduce_prod",
    "max_value", "min_value", "checked_index", "UNARY_FLOAT_INTRINSICS", "BINARY_FLOAT_INTRINSICS",
]

#: Float intrinsics (one argument) every code generator implements.
UNARY_FLOAT_INTRINSICS = (
    "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "tanh", "erf", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "trunc", "round", "fabs",
)
#: Float intrinsics with two arguments.
BINARY_FLOAT_INTRINSICS = ("pow", "atan2", "fmod")


def const(value: Any, dtype: str | None = None) -> PrimExpr:
    """A constant (dtype defaults to int32 for ints, float32 for floats, bool for bools)."""
    return _const(value, dtype)


def cast(x: Any, dtype: str) -> PrimExpr:
    """Convert ``x`` to ``dtype`` (float → int truncates; float16/bfloat16 round to nearest even)."""
    return _cast(x, dtype)


def max_value(dtype: str) -> PrimExpr:
    """Largest value of ``dtype`` as a constant (``inf`` for floats)."""
    return _const(_dt_max(check_dtype(dtype)), dtype)


def min_value(dtype: str) -> PrimExpr:
    """Smallest value of ``dtype`` as a constant (``-inf`` for floats)."""
    return _const(_dt_min(check_dtype(dtype)), dtype)


def _float_arg(name: str, x: Any) -> PrimExpr:
    e = convert(x)
    if not is_float(e.dtype):
        raise CompileError(f"te.{name} needs a floating-point argument, got {e.dtype}; cast it first")
    return e


def _unary(name: str):  # noqa: ANN202 - factory
    def f(x: Any) -> PrimExpr:
        e = _float_arg(name, x)
        return call(e.dtype, name, [e])

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}`` (floating point; float16/bfloat16 computed in float32)."
    return f


exp = _unary("exp")
exp2 = _unary("exp2")
log = _unary("log")
log2 = _unary("log2")
log10 = _unary("log10")
log1p = _unary("log1p")
expm1 = _unary("expm1")
sqrt = _unary("sqrt")
tanh = _unary("tanh")
erf = _unary("erf")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
sinh = _unary("sinh")
cosh = _unary("cosh")
asinh = _unary("asinh")
acosh = _unary("acosh")
atanh = _unary("atanh")
floor = _unary("floor")
ceil = _unary("ceil")
trunc = _unary("trunc")
round = _unary("round")  # noqa: A001 - TVM name; rounds half to even like NumPy / ONNX Round
round.__doc__ = "Round to nearest integer, ties to even (NumPy / ONNX semantics)."


def rsqrt(x: Any) -> PrimExpr:
    """``1 / sqrt(x)``."""
    e = _float_arg("rsqrt", x)
    return binary("div", _const(1.0, e.dtype), call(e.dtype, "sqrt", [e]))


def sigmoid(x: Any) -> PrimExpr:
    """``1 / (1 + exp(-x))``."""
    e = _float_arg("sigmoid", x)
    return binary("div", _const(1.0, e.dtype), binary("add", _const(1.0, e.dtype), call(e.dtype, "exp", [-e])))


def abs(x: Any) -> PrimExpr:  # noqa: A001
    """Absolute value (integers and floats)."""
    e = convert(x)
    if is_float(e.dtype):
        return call(e.dtype, "fabs", [e])
    if e.dtype.startswith("uint") or e.dtype == "bool":
        return e
    return select(binary("lt", e, _const(0, e.dtype)), -e, e)


def _binary_float(name: str):  # noqa: ANN202
    def f(a: Any, b: Any) -> PrimExpr:
        ea, eb = _match(a, b)
        if not is_float(ea.dtype):
            raise CompileError(f"te.{name} needs floating-point arguments, got {ea.dtype}")
        return call(ea.dtype, name, [ea, eb])

    f.__name__ = name
    f.__doc__ = f"Elementwise ``{name}(a, b)`` (floating point)."
    return f


pow = _binary_float("pow")  # noqa: A001
atan2 = _binary_float("atan2")
fmod = _binary_float("fmod")


def _pred(name: str):  # noqa: ANN202
    def f(x: Any) -> PrimExpr:
        e = convert(x)
        if not is_float(e.dtype):
            return _const(name == "isfinite", "bool")
        return call("bool", name, [e])

    f.__name__ = name
    f.__doc__ = f"``{name}(x)`` as a bool expression (constant for integer inputs)."
    return f


isnan = _pred("isnan")
isinf = _pred("isinf")
isfinite = _pred("isfinite")


def maximum(a: Any, b: Any) -> PrimExpr:
    """Elementwise maximum (propagates NaN like ``numpy.maximum``)."""
    return binary("max", a, b)


def minimum(a: Any, b: Any) -> PrimExpr:
    """Elementwise minimum (propagates NaN like ``numpy.minimum``)."""
    return binary("min", a, b)


def checked_index(index: Any, extent: Any, what: str) -> PrimExpr:
    """An index read from data, with ONNX semantics, checked at run time.

    Parameters
    ----------
    index : PrimExpr
        The index value (any integer type), typically a load from an indices tensor.
    extent : int or Var
        Size of the indexed axis; valid indices are ``-extent <= index < extent``. For an axis
        of dynamic extent, its runtime-extent Var (so an index into the padding is an error).
    what : str
        Subject of the error message, e.g. ``"take: index into axis 1 of data (7, 5)"``.

    Returns
    -------
    PrimExpr
        ``index + extent`` for a negative index, else ``index`` (int64, in ``[0, extent)``).
        An index outside the range makes the kernel fail with a message naming ``what``,
        the bad value and the valid range, which the executor raises as ``KernelError``
        naming the graph node. Use the result only to index ``extent``-sized axes: a
        kernel never reads with an unchecked index, so for ``extent == 0`` every evaluation
        is an error and the read it guards never happens.
    """
    return _checked_index(index, extent, what)


def if_then_else(cond: Any, t: Any, f: Any) -> PrimExpr:
    """``t`` where ``cond`` else ``f``; only the chosen side is evaluated (safe for padding loads)."""
    return select(cond, t, f)


def floordiv(a: Any, b: Any) -> PrimExpr:
    """Integer division rounding toward minus infinity (Python ``//``)."""
    return binary("floordiv", a, b)


def floormod(a: Any, b: Any) -> PrimExpr:
    """Remainder with the divisor's sign (Python ``%``)."""
    return binary("floormod", a, b)


def truncdiv(a: Any, b: Any) -> PrimExpr:
    """Integer division rounding toward zero (C ``/``)."""
    return binary("truncdiv", a, b)


def truncmod(a: Any, b: Any) -> PrimExpr:
    """Remainder with the dividend's sign (C ``%``)."""
    return binary("truncmod", a, b)


def equal(a: Any, b: Any) -> PrimExpr:
    """``a == b`` as an expression (``==`` on expressions keeps identity semantics)."""
    return binary("eq", a, b)


def not_equal(a: Any, b: Any) -> PrimExpr:
    """``a != b`` as an expression."""
    return binary("ne", a, b)


def logical_and(a: Any, b: Any) -> PrimExpr:
    """Short-circuit-free logical and of two bool expressions."""
    return binary("and", a, b)


def logical_or(a: Any, b: Any) -> PrimExpr:
    """Logical or of two bool expressions."""
    return binary("or", a, b)


def logical_not(a: Any) -> PrimExpr:
    """Logical negation."""
    return _lnot(a)


def all(*conds: Any) -> PrimExpr:  # noqa: A001
    """Conjunction of conditions (``True`` when empty)."""
    if len(conds) == 1 and isinstance(conds[0], (list, tuple)):
        conds = tuple(conds[0])
    out: PrimExpr = _const(True, "bool")
    for c in conds:
        out = binary("and", out, c)
    return out


def any(*conds: Any) -> PrimExpr:  # noqa: A001
    """Disjunction of conditions (``False`` when empty)."""
    if len(conds) == 1 and isinstance(conds[0], (list, tuple)):
        conds = tuple(conds[0])
    out: PrimExpr = _const(False, "bool")
    for c in conds:
        out = binary("or", out, c)
    return out


# ----------------------------------------------------------------------------- reducers


def _axes(axis: IterVar | Sequence[IterVar]) -> list[IterVar]:
    axes = [axis] if isinstance(axis, IterVar) else list(axis)
    for a in axes:
        if not isinstance(a, IterVar) or a.iter_type != IterVar.REDUCE:
            raise CompileError(f"reduction axis must be created with te.reduce_axis, got {a!r}")
    if not axes:
        raise CompileError("reduction needs at least one axis")
    return axes


def _reduce(combiner: str, expr: Any, axis: Any, where: Any, identity: Any | None) -> PrimExpr:
    src = convert(expr)
    if identity is None:
        identity = {"sum": 0, "prod": 1, "max": _dt_min(src.dtype), "min": _dt_max(src.dtype)}[combiner]
    cond = None if where is None else _cast(convert(where), "bool")
    return Reduce(combiner, src, _axes(axis), cond, _const(identity, src.dtype))


def sum(expr: Any, axis: IterVar | Sequence[IterVar], where: Any = None, init: Any = None) -> PrimExpr:  # noqa: A001
    """Sum of ``expr`` over reduce axes (terms where ``where`` is false are skipped)."""
    return _reduce("sum", expr, axis, where, init)


def reduce_max(expr: Any, axis: IterVar | Sequence[IterVar], where: Any = None, init: Any = None) -> PrimExpr:
    """Maximum over reduce axes (identity ``-inf`` / the dtype's minimum)."""
    return _reduce("max", expr, axis, where, init)


def reduce_min(expr: Any, axis: IterVar | Sequence[IterVar], where: Any = None, init: Any = None) -> PrimExpr:
    """Minimum over reduce axes (identity ``+inf`` / the dtype's maximum)."""
    return _reduce("min", expr, axis, where, init)


def reduce_prod(expr: Any, axis: IterVar | Sequence[IterVar], where: Any = None, init: Any = None) -> PrimExpr:
    """Product over reduce axes."""
    return _reduce("prod", expr, axis, where, init)
