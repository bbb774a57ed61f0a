"""Scalar expressions shared by tensor expressions (:mod:`kiln.te`) and the loop IR.

Every node is immutable once built.  Python operators build new nodes; the constructors
(:func:`binary`) fold constants and drop trivial identities (``x * 1``, ``x + 0``) as they
go, so index arithmetic produced by schedules stays small without a separate pass.

Equality: ``==`` keeps Python's identity semantics so that expressions can be dict keys and
set members; use :func:`kiln.te.equal` to build an equality *expression* and
:func:`structural_equal` to compare two trees.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from ..runtime.errors import CompileError
from .dtype import check_dtype, is_bool, is_float, is_low_precision, is_uint, bits_of

__all__ = [
    "PrimExpr",
    "ExprOp",
    "Var",
    "IntImm",
    "FloatImm",
    "BinaryOp",
    "Not",
    "Cast",
    "Call",
    "CHECKED_INDEX",
    "checked_index",
    "Select",
    "Load",
    "ProducerLoad",
    "Reduce",
    "const",
    "convert",
    "binary",
    "cast",
    "call",
    "select",
    "logical_not",
    "structural_equal",
    "conjuncts",
    "ARITH_OPS",
    "CMP_OPS",
    "LOGIC_OPS",
    "BIT_OPS",
]

ARITH_OPS = ("add", "sub", "mul", "div", "floordiv", "floormod", "truncdiv", "truncmod", "min", "max")
CMP_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC_OPS = ("and", "or")
BIT_OPS = ("bitand", "bitor", "bitxor", "shl", "shr")


class ExprOp:
    """Python operator overloading shared by expressions and iteration variables."""

    __slots__ = ()

    def __add__(self, o: Any) -> "PrimExpr":
        return binary("add", self, o)

    def __radd__(self, o: Any) -> "PrimExpr":
        return binary("add", o, self)

    def __sub__(self, o: Any) -> "PrimExpr":
        return binary("sub", self, o)

    def __rsub__(self, o: Any) -> "PrimExpr":
        return binary("sub", o, self)

    def __mul__(self, o: Any) -> "PrimExpr":
        return binary("mul", self, o)

    def __rmul__(self, o: Any) -> "PrimExpr":
        return binary("mul", o, self)

    def __truediv__(self, o: Any) -> "PrimExpr":
        return _truediv(self, o)

    def __rtruediv__(self, o: Any) -> "PrimExpr":
        return _truediv(o, self)

    def __floordiv__(self, o: Any) -> "PrimExpr":
        return binary("floordiv", self, o)

    def __rfloordiv__(self, o: Any) -> "PrimExpr":
        return binary("floordiv", o, self)

    def __mod__(self, o: Any) -> "PrimExpr":
        return binary("floormod", self, o)

    def __rmod__(self, o: Any) -> "PrimExpr":
        return binary("floormod", o, self)

    def __neg__(self) -> "PrimExpr":
        e = convert(self)
        return binary("sub", const(0, e.dtype), e)

    def __lt__(self, o: Any) -> "PrimExpr":
        return binary("lt", self, o)

    def __le__(self, o: Any) -> "PrimExpr":
        return binary("le", self, o)

    def __gt__(self, o: Any) -> "PrimExpr":
        return binary("gt", self, o)

    def __ge__(self, o: Any) -> "PrimExpr":
        return binary("ge", self, o)

    def __and__(self, o: Any) -> "PrimExpr":
        return _bitwise_or_logical("bitand", "and", self, o)

    def __rand__(self, o: Any) -> "PrimExpr":
        return _bitwise_or_logical("bitand", "and", o, self)

    def __or__(self, o: Any) -> "PrimExpr":
        return _bitwise_or_logical("bitor", "or", self, o)

    def __ror__(self, o: Any) -> "PrimExpr":
        return _bitwise_or_logical("bitor", "or", o, self)

    def __xor__(self, o: Any) -> "PrimExpr":
        return binary("bitxor", self, o)

    def __lshift__(self, o: Any) -> "PrimExpr":
        return binary("shl", self, o)

    def __rshift__(self, o: Any) -> "PrimExpr":
        return binary("shr", self, o)

    def __invert__(self) -> "PrimExpr":
        e = convert(self)
        if is_bool(e.dtype):
            return logical_not(e)
        return binary("bitxor", e, const(-1 if not is_uint(e.dtype) else (1 << bits_of(e.dtype)) - 1, e.dtype))

    def astype(self, dtype: str) -> "PrimExpr":
        """Cast to ``dtype`` (no-op when already of that dtype)."""
        return cast(self, dtype)


class PrimExpr(ExprOp):
    """Base class of scalar expressions; ``dtype`` is the result's scalar type."""

    __slots__ = ("dtype",)
    dtype: str

    def __bool__(self) -> bool:
        raise CompileError(
            f"cannot use the symbolic expression {self} as a Python bool; "
            "use te.if_then_else / te.all / te.any to build conditions"
        )

    def __str__(self) -> str:
        from .printer import expr_to_str

        return expr_to_str(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"

    def same_as(self, other: object) -> bool:
        """Identity test (the node, not its structure)."""
        return self is other

    __hash__ = object.__hash__
    __eq__ = object.__eq__  # identity: expressions must stay usable as dict keys


class Var(PrimExpr):
    """A scalar variable (loop index, or ``dtype="handle"`` for a buffer's data pointer)."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str = "int32") -> None:
        self.name = name
        self.dtype = check_dtype(dtype)


class IntImm(PrimExpr):
    """An integer (or bool) constant."""

    __slots__ = ("value",)

    def __init__(self, value: int, dtype: str = "int32") -> None:
        self.dtype = check_dtype(dtype)
        self.value = int(value)

    def __bool__(self) -> bool:  # constants are usable in Python conditions
        return bool(self.value)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


class FloatImm(PrimExpr):
    """A floating-point constant."""

    __slots__ = ("value",)

    def __init__(self, value: float, dtype: str = "float32") -> None:
        self.dtype = check_dtype(dtype)
        self.value = float(value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __float__(self) -> float:
        return self.value


class BinaryOp(PrimExpr):
    """``a <op> b`` for op in :data:`ARITH_OPS`, :data:`CMP_OPS`, :data:`LOGIC_OPS`, :data:`BIT_OPS`."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: PrimExpr, b: PrimExpr, dtype: str) -> None:
        self.op, self.a, self.b, self.dtype = op, a, b, dtype


class Not(PrimExpr):
    """Logical negation of a bool expression."""

    __slots__ = ("a",)

    def __init__(self, a: PrimExpr) -> None:
        self.a, self.dtype = a, "bool"


class Cast(PrimExpr):
    """Value conversion to ``dtype`` (C semantics; float16/bfloat16 round to nearest even)."""

    __slots__ = ("value",)

    def __init__(self, dtype: str, value: PrimExpr) -> None:
        self.dtype, self.value = check_dtype(dtype), value


class Call(PrimExpr):
    """An intrinsic: a pure math function (``exp``, ``log``, ``sqrt``, ``tanh``, ``pow``, ...)
    or one of the ``kiln.*`` intrinsics (:data:`CHECKED_INDEX`).

    ``op`` is the intrinsic's name; the code generators map it to libm / LLVM intrinsics.
    ``text`` is a compile-time string operand (the error message subject of
    :data:`CHECKED_INDEX`); it is empty for math functions.
    """

    __slots__ = ("op", "args", "text")

    def __init__(self, dtype: str, op: str, args: Sequence[PrimExpr], text: str = "") -> None:
        self.dtype, self.op, self.args, self.text = check_dtype(dtype), op, tuple(args), text


#: ``Call("int64", CHECKED_INDEX, [value, extent], text=what)``: an index read from data,
#: with ONNX semantics.  It evaluates to ``value + extent`` for ``-extent <= value < 0``, to
#: ``value`` for ``0 <= value < extent``; any other value makes the kernel fail (CPU: it
#: records "<function>: <what>: index V is out of range ..." and returns -1; GPU dialects,
#: which have no error path, clamp).  ``extent`` is a constant, or (an axis of dynamic
#: extent) the runtime-extent Var of that axis.  Build it with :func:`checked_index`.
CHECKED_INDEX = "kiln.checked_index"


def checked_index(value: Any, extent: Any, what: str) -> PrimExpr:
    """The :data:`CHECKED_INDEX` intrinsic: ``value`` (any integer type) wrapped and checked
    against ``[-extent, extent)``; the result is an int64 in ``[0, extent)``. ``extent`` is an
    int or a runtime-extent :class:`Var`."""
    v = cast(convert(value), "int64")
    n = cast(extent, "int64") if isinstance(extent, Var) else IntImm(int(extent), "int64")
    return Call("int64", CHECKED_INDEX, [v, n], text=what)


class Select(PrimExpr):
    """``cond ? t : f`` with *lazy* evaluation: only the chosen branch is evaluated.

    Laziness matters for padding (``if_then_else(in_bounds, A[i - 1], 0)``): the untaken
    load may be out of bounds.
    """

    __slots__ = ("cond", "true_value", "false_value")

    def __init__(self, cond: PrimExpr, t: PrimExpr, f: PrimExpr) -> None:
        self.cond, self.true_value, self.false_value, self.dtype = cond, t, f, t.dtype


class Load(PrimExpr):
    """Read of ``buffer[indices]`` (multi-dimensional; codegen flattens row-major)."""

    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: Any, indices: Sequence[PrimExpr]) -> None:
        self.buffer, self.indices, self.dtype = buffer, tuple(indices), buffer.dtype


class ProducerLoad(PrimExpr):
    """Read of a :class:`kiln.te.Tensor` element; lowering turns it into a :class:`Load`."""

    __slots__ = ("producer", "indices")

    def __init__(self, producer: Any, indices: Sequence[PrimExpr]) -> None:
        self.producer, self.indices, self.dtype = producer, tuple(indices), producer.dtype


class Reduce(PrimExpr):
    """A commutative reduction (``sum``, ``max``, ``min``, ``prod``) over reduce axes.

    Only legal as the whole body of a :func:`kiln.te.compute`.
    """

    __slots__ = ("combiner", "source", "axis", "condition", "identity")

    def __init__(self, combiner: str, source: PrimExpr, axis: Sequence[Any], condition: PrimExpr | None,
                 identity: PrimExpr) -> None:
        self.combiner, self.source, self.axis = combiner, source, tuple(axis)
        self.condition, self.identity, self.dtype = condition, identity, source.dtype

    def combine(self, acc: PrimExpr, value: PrimExpr) -> PrimExpr:
        """The combiner applied to an accumulator and a new value."""
        op = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}[self.combiner]
        return binary(op, acc, value)


# --------------------------------------------------------------------------- constructors


def const(value: Any, dtype: str | None = None) -> PrimExpr:
    """A constant; ``dtype`` defaults to int32 for ints/bools... and float32 for floats."""
    if isinstance(value, PrimExpr):
        return value if dtype is None else cast(value, dtype)
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = "int32" if -(2**31) <= value < 2**31 else "int64"
        elif isinstance(value, float):
            dtype = "float32"
        else:
            raise CompileError(f"cannot make a constant of {value!r}")
    dtype = check_dtype(dtype)
    if is_low_precision(dtype):
        return _low_precision_const(value, dtype)
    if is_float(dtype):
        return FloatImm(float(value), dtype)
    if isinstance(value, float) and not value.is_integer():
        value = math.trunc(value)
    return IntImm(int(bool(value)) if is_bool(dtype) else _wrap_int(int(value), dtype), dtype)


def _low_precision_const(value: Any, dtype: str) -> PrimExpr:
    """A constant of a low-precision storage type: its storage byte, rounded here at compile time
    (``ml_dtypes``; out-of-range values saturate), reinterpreted as ``dtype``."""
    import numpy as np

    from ..runtime.dtype import np_dtype

    dt = np_dtype(dtype)
    v = np.asarray(value, dtype=np.float64)
    if dt.name.startswith("float"):
        import ml_dtypes

        fi = ml_dtypes.finfo(dt)
        v = np.clip(v, float(fi.min), float(fi.max)) if not np.isnan(v) else v
    bits = int(v.astype(dt).reshape(1).view(np.uint8)[0])
    return Call(dtype, "kiln.reinterpret", [IntImm(bits, "uint8")], text=dtype)


def _wrap_int(v: int, dtype: str) -> int:
    b = bits_of(dtype)
    v &= (1 << b) - 1
    if not is_uint(dtype) and v >= 1 << (b - 1):
        v -= 1 << b
    return v


def convert(value: Any, dtype: str | None = None) -> PrimExpr:
    """Turn ints, floats, bools, iteration variables and expressions into a :class:`PrimExpr`."""
    if isinstance(value, PrimExpr):
        return value
    var = getattr(value, "var", None)  # IterVar
    if isinstance(var, Var):
        return var
    if hasattr(value, "op") and hasattr(value, "shape") and hasattr(value, "value_index"):
        if len(value.shape) == 0:
            return value()
        raise CompileError(f"tensor {value.name} used as a scalar; index it first")
    if isinstance(value, (bool, int, float)):
        return const(value, dtype)
    try:  # NumPy scalars
        import numpy as np

        if isinstance(value, np.generic):
            return const(value.item(), dtype or str(value.dtype))
    except ImportError:  # pragma: no cover
        pass
    raise CompileError(f"cannot convert {value!r} ({type(value).__name__}) to an expression")


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) or isinstance(x, bool)


def _match(a: Any, b: Any) -> tuple[PrimExpr, PrimExpr]:
    """Bring two operands to a common dtype (the usual arithmetic conversions)."""
    if _is_num(a) and not _is_num(b):
        b = convert(b)
        a = const(a, b.dtype if not (isinstance(a, float) and not is_float(b.dtype)) else "float32")
    elif _is_num(b) and not _is_num(a):
        a = convert(a)
        b = const(b, a.dtype if not (isinstance(b, float) and not is_float(a.dtype)) else "float32")
    else:
        a, b = convert(a), convert(b)
    if a.dtype == b.dtype:
        return a, b
    da, db = a.dtype, b.dtype
    if is_float(da) != is_float(db):
        if is_float(da):
            return a, cast(b, da)
        return cast(a, db), b
    if is_bool(da) or is_bool(db):
        other = db if is_bool(da) else da
        return cast(a, other), cast(b, other)
    target = da if bits_of(da) > bits_of(db) else db
    if bits_of(da) == bits_of(db):
        target = da if is_float(da) else (da if not is_uint(da) else db)
    return cast(a, target), cast(b, target)


def _truediv(a: Any, b: Any) -> PrimExpr:
    ea, eb = _match(a, b)
    if not is_float(ea.dtype):
        raise CompileError(
            "ambiguous '/' on integer expressions; use te.floordiv / te.truncdiv (or '//')"
        )
    return binary("div", ea, eb)


def _bitwise_or_logical(bitop: str, logop: str, a: Any, b: Any) -> PrimExpr:
    ea, eb = _match(a, b)
    return binary(logop if is_bool(ea.dtype) else bitop, ea, eb)


def _ival(e: PrimExpr) -> int | None:
    return e.value if isinstance(e, IntImm) else None


def _fval(e: PrimExpr) -> float | None:
    if isinstance(e, (IntImm, FloatImm)):
        return e.value
    return None


def _fold_int(op: str, x: int, y: int, dtype: str) -> int | None:
    if op in ("floordiv", "floormod", "truncdiv", "truncmod") and y == 0:
        return None
    if op == "add":
        r = x + y
    elif op == "sub":
        r = x - y
    elif op == "mul":
        r = x * y
    elif op == "floordiv":
        r = x // y
    elif op == "floormod":
        r = x % y
    elif op == "truncdiv":
        r = abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)
    elif op == "truncmod":
        r = x - (abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1)) * y
    elif op == "min":
        r = min(x, y)
    elif op == "max":
        r = max(x, y)
    elif op == "bitand":
        r = x & y
    elif op == "bitor":
        r = x | y
    elif op == "bitxor":
        r = x ^ y
    elif op == "shl":
        r = x << y if 0 <= y < 64 else None
    elif op == "shr":
        r = x >> y if 0 <= y < 64 else None
    else:
        return None
    return None if r is None else _wrap_int(r, dtype)


def binary(op: str, a: Any, b: Any) -> PrimExpr:
    """Build ``a <op> b`` with dtype matching, constant folding and trivial simplification."""
    if op in LOGIC_OPS:
        ea, eb = cast(convert(a), "bool"), cast(convert(b), "bool")
    else:
        ea, eb = _match(a, b)
    dt = ea.dtype
    if op in ("floordiv", "floormod", "truncdiv", "truncmod", "shl", "shr", "bitand", "bitor", "bitxor"):
        if is_float(dt) and op in ("floordiv", "floormod"):
            # floor division of floats: numpy semantics
            if op == "floordiv":
                return call(dt, "floor", [binary("div", ea, eb)])
            return binary("sub", ea, binary("mul", call(dt, "floor", [binary("div", ea, eb)]), eb))
        if is_float(dt):
            raise CompileError(f"{op} needs integer operands, got {dt}")
    out_dt = "bool" if op in CMP_OPS or op in LOGIC_OPS else dt
    x, y = _ival(ea), _ival(eb)
    # ---- constant folding
    if x is not None and y is not None:
        if op in CMP_OPS:
            return IntImm(int(_cmp(op, x, y)), "bool")
        if op in LOGIC_OPS:
            return IntImm(int((x and y) if op == "and" else (x or y)), "bool")
        r = _fold_int(op, x, y, dt)
        if r is not None:
            return IntImm(r, dt)
    fx, fy = (_fval(ea), _fval(eb)) if is_float(dt) else (None, None)
    if fx is not None and fy is not None:
        if op in CMP_OPS:
            return IntImm(int(_cmp(op, fx, fy)), "bool")
        if op in ("add", "sub", "mul", "div", "min", "max") and not (op == "div" and fy == 0):
            r = {"add": fx + fy, "sub": fx - fy, "mul": fx * fy, "div": fx / fy if fy else 0.0,
                 "min": min(fx, fy), "max": max(fx, fy)}[op]
            if dt == "float32":
                import numpy as np

                r = float(np.float32(r))
            return FloatImm(r, dt)
    # ---- identities (integers only where floats would change NaN/inf/-0 semantics)
    integral = not is_float(dt)
    if op == "add":
        # (for floats x + 0.0 differs from x only for x = -0.0; we accept that)
        if y == 0 or (fy is not None and fy == 0.0):
            return ea
        if x == 0 or (fx is not None and fx == 0.0):
            return eb
    elif op == "sub":
        if y == 0 or (fy is not None and fy == 0.0):
            return ea
        if integral and ea is eb:
            return IntImm(0, dt)
    elif op == "mul":
        if y == 1 or fy == 1.0:
            return ea
        if x == 1 or fx == 1.0:
            return eb
        if integral and (x == 0 or y == 0):
            return IntImm(0, dt)
    elif op == "div":
        if fy == 1.0:
            return ea
    elif op in ("floordiv", "truncdiv"):
        if y == 1:
            return ea
        if x == 0 and y is not None and y != 0:
            return IntImm(0, dt)
    elif op in ("floormod", "truncmod"):
        if y == 1:
            return IntImm(0, dt)
    elif op in ("min", "max") and ea is eb:
        return ea
    elif op == "and":
        if x is not None:
            return eb if x else IntImm(0, "bool")
        if y is not None:
            return ea if y else IntImm(0, "bool")
    elif op == "or":
        if x is not None:
            return IntImm(1, "bool") if x else eb
        if y is not None:
            return IntImm(1, "bool") if y else ea
    return BinaryOp(op, ea, eb, out_dt)


def _cmp(op: str, x: Any, y: Any) -> bool:
    return {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[op]


def logical_not(a: Any) -> PrimExpr:
    """``!a`` (folds constants and double negation)."""
    e = cast(convert(a), "bool")
    if isinstance(e, IntImm):
        return IntImm(int(not e.value), "bool")
    if isinstance(e, Not):
        return e.a
    return Not(e)


def cast(value: Any, dtype: str) -> PrimExpr:
    """Convert ``value`` to ``dtype`` (folds constants; no-op for the same dtype)."""
    dtype = check_dtype(dtype)
    e = convert(value)
    if e.dtype == dtype:
        return e
    if is_low_precision(dtype) or is_low_precision(e.dtype):
        if isinstance(e, (IntImm, FloatImm)) and is_low_precision(dtype):  # a constant: encoded now
            return _low_precision_const(e.value, dtype)
        raise CompileError(f"cast from {e.dtype} to {dtype}: low-precision storage types convert through "
                           f"kiln.topi.lowp_cast.convert (ONNX rounding, saturation and NaN rules), not a plain cast")
    if isinstance(e, (IntImm, FloatImm)):
        if is_float(dtype):
            v = float(e.value)
            if dtype in ("float16", "bfloat16", "float32"):
                import numpy as np

                if dtype == "bfloat16":
                    import ml_dtypes

                    v = float(np.float32(ml_dtypes.bfloat16(v)))
                else:
                    v = float(np.dtype(dtype).type(v))
            return FloatImm(v, dtype)
        if is_bool(dtype):
            return IntImm(int(e.value != 0), "bool")
        if isinstance(e, FloatImm) and (math.isnan(e.value) or math.isinf(e.value)):
            return Cast(dtype, e)
        return IntImm(_wrap_int(int(math.trunc(e.value)), dtype), dtype)
    return Cast(dtype, e)


def call(dtype: str, op: str, args: Iterable[Any]) -> PrimExpr:
    """Build an intrinsic call (no folding; the simplifier folds calls on constants)."""
    return Call(dtype, op, [convert(a) for a in args])


def select(cond: Any, t: Any, f: Any) -> PrimExpr:
    """Lazy ``cond ? t : f`` (folds a constant condition)."""
    c = cast(convert(cond), "bool")
    et, ef = _match(t, f)
    if isinstance(c, IntImm):
        return et if c.value else ef
    return Select(c, et, ef)


def structural_equal(a: Any, b: Any) -> bool:
    """True when two expressions have the same tree (vars compared by identity)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (IntImm, FloatImm)):
        return a.dtype == b.dtype and a.value == b.value
    if isinstance(a, Var):
        return False
    if isinstance(a, BinaryOp):
        return a.op == b.op and structural_equal(a.a, b.a) and structural_equal(a.b, b.b)
    if isinstance(a, Not):
        return structural_equal(a.a, b.a)
    if isinstance(a, Cast):
        return a.dtype == b.dtype and structural_equal(a.value, b.value)
    if isinstance(a, Call):
        return (a.op == b.op and a.dtype == b.dtype and a.text == b.text and len(a.args) == len(b.args)
                and all(structural_equal(x, y) for x, y in zip(a.args, b.args)))
    if isinstance(a, Select):
        return (structural_equal(a.cond, b.cond) and structural_equal(a.true_value, b.true_value)
                and structural_equal(a.false_value, b.false_value))
    if isinstance(a, Load):
        return a.buffer is b.buffer and all(structural_equal(x, y) for x, y in zip(a.indices, b.indices))
    if isinstance(a, ProducerLoad):
        return a.producer is b.producer and all(structural_equal(x, y) for x, y in zip(a.indices, b.indices))
    return False


def conjuncts(cond: PrimExpr) -> tuple[PrimExpr, ...]:
    """The terms of a chain of ``and`` s, left to right (``(cond,)`` for anything else)."""
    if isinstance(cond, BinaryOp) and cond.op == "and":
        return conjuncts(cond.a) + conjuncts(cond.b)
    return (cond,)
