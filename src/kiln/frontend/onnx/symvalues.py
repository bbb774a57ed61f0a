"""Shape values with symbolic dims: import-time evaluation of shape computations.

Exported models compute reshape targets, masks and position ids from tensor shapes at run time
(``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``, ``Shape -> ConstantOfShape``,
``Range(0, seq)``). For a static graph the converter folds those chains to constants. For a
graph with symbolic dims (:mod:`kiln.runtime.sym`) a ``Shape`` of a dynamic tensor is not a
constant, and must never be folded to its upper bounds: its *content* is known symbolically,
as dims (``("batch", "sequence", 384)``).

This module owns that representation and its arithmetic. A *symbolic value* is a NumPy object
array of canonical dims (``int`` or canonical ``str``) standing for a small integer tensor; the
converter keeps one per IR value whose content mentions a symbol (:attr:`Context.sym_values`)
and never adds such a value to the graph. :func:`evaluate` computes an IR op on symbolic values
(``take``, ``concatenate``, ``add``, ``equal``, ``where`` ... the ops ONNX shape arithmetic
converts to) or raises :class:`Unresolved` with the reason when the result is not a function
of the dims alone (a symbolic dim divided by another, a comparison the dim ranges do not decide,
a float power). Consumers that take shapes (Reshape, Expand, ConstantOfShape, Range, Slice,
Tile) read the dims and give their output symbolic dims.

Imports only NumPy, :mod:`kiln.runtime.sym` and the IR op registry; never the converter.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...runtime import sym
from ...runtime.sym import Dim

__all__ = ["Unresolved", "evaluate", "has_symbols", "to_object", "to_dim", "describe", "symbolic_ops",
           "dim_hi", "broadcast_dims", "infer_reshape_dim"]

Ranges = Mapping[str, tuple[int, int]]


class Unresolved(Exception):
    """A shape computation whose result the symbolic dims do not determine (the message says why)."""


def to_object(arr: np.ndarray) -> np.ndarray:
    """A constant array as an object array of Python scalars (ints stay ints)."""
    arr = np.asarray(arr)
    out = np.empty(arr.shape, dtype=object)
    flat = out.reshape(-1)
    for i, x in enumerate(arr.reshape(-1).tolist()):
        flat[i] = x
    return out


def has_symbols(arr: np.ndarray) -> bool:
    """Whether an object array holds a symbolic dim."""
    return any(isinstance(x, str) for x in arr.reshape(-1))


def describe(arr: np.ndarray) -> str:
    """``[batch, sequence, 384]``: the content of a symbolic value for messages."""
    items = [str(x) for x in arr.reshape(-1)[:8]]
    more = ", ..." if arr.size > 8 else ""
    return ("[" + ", ".join(items) + more + "]") if arr.ndim else items[0]


def dim_hi(d: Dim, ranges: Ranges) -> int:
    """Upper bound of a dim over the declared ranges."""
    return d if isinstance(d, int) else sym.bounds(d, ranges)[1]


def to_dim(x: Any) -> Dim:
    """An entry of a shape value as a dim (``int`` or canonical ``str``).

    Raises
    ------
    Unresolved
        A float entry that is not an integer.
    """
    return sym.canonical(x) if isinstance(x, str) else _as_dim(x)


# ----------------------------------------------------------------------------- scalar rules
def _as_dim(x: Any) -> Dim:
    """A Python scalar of a shape value as a dim; floats must hold integers."""
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        if not math.isfinite(x) or not float(x).is_integer():
            raise Unresolved(f"the value {x!r} is not an integer")
        return int(x)
    return int(x)


def _sign(d: Dim, ranges: Ranges) -> int | None:
    """-1, 0 or 1 when the ranges decide the sign of ``d``, else None."""
    if isinstance(d, int):
        return (d > 0) - (d < 0)
    lo, hi = sym.bounds(d, ranges)
    if lo > 0:
        return 1
    if hi < 0:
        return -1
    if lo == hi == 0:
        return 0
    return None


def _compare(a: Any, b: Any, ranges: Ranges, ok: Callable[[int], bool], what: str) -> bool:
    """``ok(sign(a - b))`` when the ranges decide it (for ``==``/``!=`` only zero-ness matters)."""
    if not isinstance(a, str) and not isinstance(b, str):
        d = a - b
        return ok((d > 0) - (d < 0))
    d = sym.sub(_as_dim(a), _as_dim(b))
    s = _sign_or_zero(d, ranges) if what in ("==", "!=") else _sign(d, ranges)
    if s is None:
        raise Unresolved(f"whether {a} {what} {b} depends on the runtime dims")
    return ok(s)


def _sign_or_zero(d: Dim, ranges: Ranges) -> int | None:
    """For ==/!=: 0 if ``d`` is identically 0, 1 if the ranges exclude 0, else None."""
    if d == 0:
        return 0
    lo, hi = sym.bounds(d, ranges)
    return 1 if lo > 0 or hi < 0 else None


def _div(a: Any, b: Any, integer: bool) -> Dim:
    """``a / b`` of a shape value: truncating for integers, exact-only for floats."""
    if not isinstance(a, str) and not isinstance(b, str):
        if integer:
            a, b = _as_dim(a), _as_dim(b)
            if b == 0:
                return 0  # the IR's integer division: x / 0 = 0
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        q = a / b
        return int(q) if float(q).is_integer() else q
    a, b = _as_dim(a), _as_dim(b)
    if isinstance(b, str):
        if sym.canonical(a) == sym.canonical(b):
            return 1
        raise Unresolved(f"{a} / {b} divides by a symbolic dim")
    if b == 0:
        raise Unresolved(f"{a} / 0")
    # Symbolic dims are non-negative extents (or sums of them), so truncation is floor division.
    q = sym.floordiv(a, abs(b))
    if not integer and sym.mul(q, abs(b)) != sym.canonical(a):
        raise Unresolved(f"{a} / {b} is not an integer")
    return q if b > 0 else sym.mul(q, -1)


def _binary_rules(ranges: Ranges, out_dtype: str) -> dict[str, Callable[[Any, Any], Any]]:
    integer = out_dtype.startswith(("int", "uint"))
    return {
        "add": lambda a, b: sym.add(_as_dim(a), _as_dim(b)) if _sym2(a, b) else a + b,
        "subtract": lambda a, b: sym.sub(_as_dim(a), _as_dim(b)) if _sym2(a, b) else a - b,
        "multiply": lambda a, b: sym.mul(_as_dim(a), _as_dim(b)) if _sym2(a, b) else a * b,
        "divide": lambda a, b: _div(a, b, integer),
        "maximum": lambda a, b: a if _compare(a, b, ranges, lambda s: s >= 0, ">=") else b,
        "minimum": lambda a, b: a if _compare(a, b, ranges, lambda s: s <= 0, "<=") else b,
        "equal": lambda a, b: _compare(a, b, ranges, lambda s: s == 0, "=="),
        "not_equal": lambda a, b: _compare(a, b, ranges, lambda s: s != 0, "!="),
        "less": lambda a, b: _compare(a, b, ranges, lambda s: s < 0, "<"),
        "less_equal": lambda a, b: _compare(a, b, ranges, lambda s: s <= 0, "<="),
        "greater": lambda a, b: _compare(a, b, ranges, lambda s: s > 0, ">"),
        "greater_equal": lambda a, b: _compare(a, b, ranges, lambda s: s >= 0, ">="),
        "mod": lambda a, b: _mod(a, b),
    }


def _sym2(a: Any, b: Any) -> bool:
    return isinstance(a, str) or isinstance(b, str)


def _mod(a: Any, b: Any) -> Dim:
    if not _sym2(a, b):
        return 0 if b == 0 else a % b
    a, b = _as_dim(a), _as_dim(b)
    if isinstance(b, int) and b > 0 and sym.mul(sym.floordiv(a, b), b) == sym.canonical(a):
        return 0
    raise Unresolved(f"{a} mod {b} depends on the runtime dims")


def _unary(name: str, ranges: Ranges, out_dtype: str) -> Callable[[Any], Any] | None:
    def cast(x: Any) -> Any:
        if out_dtype == "bool":
            if isinstance(x, str):
                s = _sign_or_zero(x, ranges)
                if s is None:
                    raise Unresolved(f"whether {x} != 0 depends on the runtime dims")
                return bool(s)
            return bool(x)
        if isinstance(x, str):
            return x  # a dim is an integer: exact in every numeric dtype Kiln casts shapes to
        if out_dtype.startswith(("int", "uint")):
            return int(x)
        return float(x)

    rules: dict[str, Callable[[Any], Any]] = {
        "cast": cast,
        "identity": lambda x: x,
        "negative": lambda x: sym.mul(x, -1) if isinstance(x, str) else -x,
        # floor / ceil / round of an integer-valued dim (a float Cast of a shape) change nothing
        "floor": lambda x: x if isinstance(x, str) else math.floor(x),
        "ceil": lambda x: x if isinstance(x, str) else math.ceil(x),
        "round": lambda x: x if isinstance(x, str) else round(x),
        "abs": lambda x: _abs(x, ranges),
        "logical_not": lambda x: not x,
    }
    return rules.get(name)


def _abs(x: Any, ranges: Ranges) -> Any:
    if not isinstance(x, str):
        return abs(x)
    s = _sign(x, ranges)
    if s is None:
        raise Unresolved(f"the sign of {x} depends on the runtime dims")
    return x if s >= 0 else sym.mul(x, -1)


# ----------------------------------------------------------------------------- array rules
def _elementwise(fn: Callable[..., Any], arrays: Sequence[np.ndarray]) -> np.ndarray:
    bs = np.broadcast_arrays(*arrays)
    out = np.empty(bs[0].shape, dtype=object)
    flat = out.reshape(-1)
    for i, xs in enumerate(zip(*(b.reshape(-1) for b in bs))):
        flat[i] = fn(*xs)
    return out


def _where(arrays: Sequence[np.ndarray]) -> np.ndarray:
    cond, a, b = arrays
    if has_symbols(cond):
        raise Unresolved("the condition is itself a symbolic dim")
    return _elementwise(lambda c, x, y: x if c else y, [cond, a, b])


def _reduce(name: str, x: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    fn = {"reduce_prod": lambda a, b: sym.mul(_as_dim(a), _as_dim(b)),
          "reduce_sum": lambda a, b: sym.add(_as_dim(a), _as_dim(b))}[name]
    start = 1 if name == "reduce_prod" else 0
    axes = attrs.get("axes")
    axes = tuple(range(x.ndim)) if axes is None or axes == () else tuple(a % x.ndim for a in axes)
    keep = bool(attrs.get("keepdims", False))
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0))) if axes else x
    moved = moved.reshape(moved.shape[:moved.ndim - len(axes)] + (-1,))
    out = np.empty(moved.shape[:-1], dtype=object)
    for idx in np.ndindex(*out.shape):
        out[idx] = functools.reduce(fn, moved[idx].tolist(), start)  # type: ignore[arg-type]
    return out.reshape(out_shape)


#: IR ops whose NumPy reference is pure data movement: it runs unchanged on object arrays.
_MOVEMENT = frozenset({"reshape", "take", "concatenate", "strided_slice", "broadcast_to", "tile",
                       "transpose", "split", "squeeze", "expand_dims"})
_BINARY_OPS = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "equal",
                         "not_equal", "less", "less_equal", "greater", "greater_equal", "mod"})
_LOGICAL = {"logical_and": lambda a, b: bool(a) and bool(b),
            "logical_or": lambda a, b: bool(a) or bool(b),
            "logical_xor": lambda a, b: bool(a) != bool(b)}
_UNARY_OPS = frozenset({"cast", "identity", "negative", "floor", "ceil", "round", "abs",
                        "logical_not"})


def symbolic_ops() -> frozenset[str]:
    """IR ops :func:`evaluate` computes on symbolic values."""
    return _MOVEMENT | _BINARY_OPS | frozenset(_LOGICAL) | _UNARY_OPS | {"where", "reduce_prod",
                                                                          "reduce_sum"}


def evaluate(op: str, ref: Callable[..., Any], values: Sequence[np.ndarray], attrs: Mapping[str, Any],
             out_dtypes: Sequence[str], ranges: Ranges) -> list[np.ndarray]:
    """The outputs of IR op ``op`` on symbolic values (object arrays of dims).

    Parameters
    ----------
    op : str
        IR op name.
    ref : callable
        The op's NumPy reference (used for pure data movement).
    values : sequence of numpy.ndarray
        Every input as an object array (constants converted with :func:`to_object`).
    attrs : mapping
        Normalised attributes.
    out_dtypes : sequence of str
        The IR dtype of every output.
    ranges : mapping
        The graph's dim ranges, to decide comparisons.

    Returns
    -------
    list of numpy.ndarray
        Object arrays of dims (and of Python bools / numbers where no symbol is involved).

    Raises
    ------
    Unresolved
        The op is not one of :func:`symbolic_ops`, or its result depends on more than the dims.
    """
    if op in _MOVEMENT:
        try:
            return [np.asarray(o, dtype=object) for o in ref(list(values), dict(attrs))]
        except Unresolved:
            raise
        except Exception as exc:  # noqa: BLE001  (NumPy's reference on object arrays)
            raise Unresolved(f"{op} on symbolic dims failed ({type(exc).__name__}: {exc})") from None
    if op in _BINARY_OPS:
        fn = _binary_rules(ranges, out_dtypes[0])[op]
        return [_elementwise(fn, values)]
    if op in _LOGICAL:
        return [_elementwise(_LOGICAL[op], values)]
    if op in _UNARY_OPS:
        fn1 = _unary(op, ranges, out_dtypes[0])
        assert fn1 is not None
        return [_elementwise(fn1, values)]
    if op == "where":
        return [_where(values)]
    if op in ("reduce_prod", "reduce_sum"):
        return [_reduce(op, values[0], attrs)]
    raise Unresolved(f"Kiln does not evaluate {op!r} on symbolic dims")


# ----------------------------------------------------------------------------- shape helpers
def broadcast_dims(a: Sequence[Dim], b: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy broadcasting of two shapes of dims.

    A symbolic dim against 1 gives the symbol; against an int ``k != 1`` gives ``k`` (the model
    is only valid when the symbol is 1 or ``k``). Two different symbols cannot be decided.

    Raises
    ------
    Unresolved
        Two different symbolic dims, or two different ints neither of which is 1.
    """
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out: list[Dim] = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif isinstance(x, str) and isinstance(y, int):
            out.append(y)
        elif isinstance(y, str) and isinstance(x, int):
            out.append(x)
        else:
            raise Unresolved(f"cannot broadcast {tuple(a)} with {tuple(b)}: {x} vs {y}")
    return tuple(out)


def infer_reshape_dim(total: Sequence[Dim], known: Sequence[Dim]) -> Dim:
    """The dim a Reshape's ``-1`` stands for: ``prod(total) / prod(known)``.

    Equal dims cancel first (``(batch, seq, 384) -> (-1, 384)`` gives ``batch*seq``); what remains
    must divide by an integer exactly.

    Raises
    ------
    Unresolved
        When the quotient is not a polynomial of the symbols (division by a symbol that does not
        cancel, or a remainder).
    """
    num = [sym.canonical(d) for d in total]
    den: list[Dim] = []
    for d in known:
        c = sym.canonical(d)
        if c in num:
            num.remove(c)
        else:
            den.append(c)
    n: Dim = functools.reduce(sym.mul, num, 1)  # type: ignore[arg-type]
    q: Dim = functools.reduce(sym.mul, den, 1)  # type: ignore[arg-type]
    if isinstance(q, str):
        # symbols left in the divisor: cancel them from the single-symbol factors of the rest
        raise Unresolved(f"-1 would be ({n}) / ({q})")
    if q == 0:
        raise Unresolved("-1 with a zero-sized dim in the target")
    res = sym.floordiv(n, q)
    if sym.mul(res, q) != sym.canonical(n):
        raise Unresolved(f"{n} elements do not divide into ({q})")
    return res
