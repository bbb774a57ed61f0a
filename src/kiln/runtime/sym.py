"""Symbolic dimensions: integer expressions over named dims (``"batch"``, ``"batch*seq"``).

A dimension of a dynamic tensor is either an ``int`` or a *symbolic expression* written as a
string in a small grammar::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "//") factor)*       # "//" only by a positive integer
    factor := NAME | INT | "(" expr ")"

Expressions are kept in one canonical form — a polynomial with integer coefficients over the
symbols (``"seq*batch"`` and ``"batch*seq"`` are the same dim) — so two dims are equal exactly
when their canonical strings are. Floor division by a constant that does not divide every
coefficient stays an opaque atom (``"(seq+1)//2"``), except that a constant term alone may
be off (``(2*h-1)//2`` is ``h-1``) and an atom divided again folds into it (``((h-1)//2)//2``
is ``(h-1)//4``): the output sizes of strided windows in a row, which must compare equal
whichever path reached them.

Every symbol has a range ``lo..hi`` (``lo >= 1``) declared with the model; tensors are stored
at the shape the ranges give as upper bounds (:func:`bounds`). The compiler builds dims with
:func:`add`, :func:`mul` ...; the executor evaluates them (:func:`shape_function`). This module
lives in the runtime (standard library only) because both sides need the same rules.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Mapping, Sequence

from .errors import InputError

__all__ = ["Dim", "canonical", "is_symbolic", "symbols", "dims_symbols", "evaluate", "expand", "bounds", "add",
           "sub", "mul", "floordiv", "shape_function", "check_name", "parse_range"]

#: A dimension: a static extent or a canonical symbolic expression.
Dim = int | str

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*()]))")

# A polynomial: {monomial: coefficient}; a monomial is a sorted tuple of atom names (repeats
# are powers), () is the constant term. Atoms are symbol names or opaque "(p)//c" strings.
_Poly = dict[tuple[str, ...], int]


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid symbol name, else raise :class:`InputError`."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"invalid dimension name {name!r}: use letters, digits and '_' (not first a digit)")
    return name


def _add(a: _Poly, b: _Poly, sign: int = 1) -> _Poly:
    out = dict(a)
    for m, c in b.items():
        out[m] = out.get(m, 0) + sign * c
        if out[m] == 0:
            del out[m]
    return out


def _mul(a: _Poly, b: _Poly) -> _Poly:
    out: _Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
            if out[m] == 0:
                del out[m]
    return out


def _floordiv(a: _Poly, c: int) -> _Poly:
    if c <= 0:
        raise InputError(f"symbolic dims divide only by a positive integer, got {c}")
    r = a.get((), 0)
    if all(v % c == 0 for m, v in a.items() if m):
        # floor((c*q + r) / c) == q + floor(r / c) for an integer q: (2*h-1)//2 is h-1 (a
        # constant alone is the case q = 0)
        out = {m: v // c for m, v in a.items() if m}
        if r // c:
            out[()] = r // c
        return out
    atoms = [m for m in a if m]
    if len(atoms) == 1 and a[atoms[0]] == 1 and len(atoms[0]) == 1 and not _NAME.match(atoms[0][0]):
        # floor((floor(x / k) + r) / c) == floor((x + r*k) / (k*c)): strided windows in a row
        atom = atoms[0][0]
        k = int(atom[atom.rindex("//") + 2:])
        return _floordiv(_add(_poly(atom[1:atom.rindex(")")]), {(): r * k} if r else {}), k * c)
    return {(f"({_render(a)})//{c}",): 1}


def _render(p: _Poly) -> str:
    if not p:
        return "0"
    parts: list[str] = []
    # highest degree first, then by name: a stable, readable order
    for m in sorted(p, key=lambda m: (-len(m), m)):
        c = p[m]
        # an opaque "(p)//c" atom in a product is parenthesised: "//" binds like "*"
        wrap = len(m) > 1 or abs(c) != 1
        body = "*".join(f"({a})" if wrap and not _NAME.match(a) else a for a in m)
        if not m:
            term = str(abs(c))
        elif abs(c) == 1:
            term = body
        else:
            term = f"{abs(c)}*{body}"
        if not parts:
            parts.append(term if c > 0 else f"-{term}")
        else:
            parts.append(("+" if c > 0 else "-") + term)
    return "".join(parts)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[str] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise InputError(f"bad symbolic dimension {self.text!r}: unexpected {text[pos:]!r}")
            self.toks.append(m.group(0).strip())
            pos = m.end()
        self.i = 0

    def fail(self) -> InputError:
        return InputError(f"bad symbolic dimension {self.text!r}: expected NAME, INT, + - * // ( )")

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        t = self.peek()
        if t is None:
            raise self.fail()
        self.i += 1
        return t

    def expr(self) -> _Poly:
        p = self.term()
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            p = _add(p, self.term(), sign)
        return p

    def term(self) -> _Poly:
        p = self.factor()
        while self.peek() in ("*", "//"):
            if self.take() == "*":
                p = _mul(p, self.factor())
            else:
                d = self.factor()
                if set(d) - {()}:
                    raise InputError(f"bad symbolic dimension {self.text!r}: '//' needs an integer divisor")
                p = _floordiv(p, d.get((), 0))
        return p

    def factor(self) -> _Poly:
        t = self.take()
        if t == "(":
            p = self.expr()
            if self.take() != ")":
                raise self.fail()
            return p
        if t == "-":
            return _mul({(): -1}, self.factor())
        if t.isdigit():
            return {(): int(t)} if int(t) else {}
        if _NAME.match(t):
            return {(t,): 1}
        raise self.fail()


_CACHE: dict[str, _Poly] = {}


def _poly(d: Dim) -> _Poly:
    if isinstance(d, bool):
        raise InputError(f"bad dimension {d!r}")
    if isinstance(d, int):
        return {(): d} if d else {}
    if not isinstance(d, str):
        try:
            return _poly(int(d))  # NumPy integers
        except (TypeError, ValueError):
            raise InputError(f"a dimension must be an int or a symbolic expression string, got {d!r}") from None
    p = _CACHE.get(d)
    if p is None:
        ps = _Parser(d)
        p = ps.expr()
        if ps.peek() is not None:
            raise ps.fail()
        if len(_CACHE) < 65536:
            _CACHE[d] = p
    return p


def _dim(p: _Poly) -> Dim:
    if not (p.keys() - {()}):
        return p.get((), 0)
    return _render(p)


def canonical(d: Dim) -> Dim:
    """The canonical form of a dim: an ``int`` when it is constant, else the canonical string.

    Raises
    ------
    InputError
        ``d`` is not an int or a valid expression.
    """
    return _dim(_poly(d))


def is_symbolic(d: object) -> bool:
    """Whether ``d`` is a symbolic dim (a string), not a static extent."""
    return isinstance(d, str)


def _atoms(p: _Poly) -> set[str]:
    return {a for m in p for a in m}


def symbols(d: Dim) -> frozenset[str]:
    """The symbol names ``d`` depends on."""
    out: set[str] = set()
    for a in _atoms(_poly(d)):
        if _NAME.match(a):
            out.add(a)
        else:  # "(p)//c": the symbols inside
            out |= symbols(a[1:a.rindex(")")])
    return frozenset(out)


def dims_symbols(dims: Iterable[Dim]) -> frozenset[str]:
    """The symbol names any of ``dims`` (a shape: static ints and canonical strings) depends on."""
    out: frozenset[str] = frozenset()
    for d in dims:
        if isinstance(d, str):
            out |= symbols(d)
    return out


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    """The value of ``d`` with every symbol given by ``env``."""
    return int(expand(d, {k: int(v) for k, v in env.items()}))  # type: ignore[call-overload]


def expand(d: Dim, env: Mapping[str, object]) -> object:
    """``d`` built from ``env``'s values with ``+``, ``*`` and ``//`` only — for values that are
    not ints (a code generator's expressions for the runtime extents)."""
    total: object = None
    for m, c in _poly(d).items():
        v: object = None if c == 1 and m else c  # a unit coefficient is left out
        for a in m:
            if _NAME.match(a):
                if a not in env:
                    raise InputError(f"dimension {a!r} has no value")
                atom = env[a]
            else:
                atom = expand(a[1:a.rindex(")")], env) // int(a[a.rindex("//") + 2:])  # type: ignore[operator]
            v = atom if v is None else v * atom  # type: ignore[operator]
        total = v if total is None else total + v  # type: ignore[operator]
    return 0 if total is None else total


def bounds(d: Dim, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """``(lo, hi)`` of ``d`` over the symbols' ranges (interval arithmetic: exact for sums of
    products of symbols with positive coefficients, a safe over-approximation otherwise)."""
    lo_total, hi_total = 0, 0
    for m, c in _poly(d).items():
        lo, hi = c, c
        for a in m:
            if _NAME.match(a):
                if a not in ranges:
                    raise InputError(f"dimension {a!r} has no declared range")
                alo, ahi = ranges[a]
            else:
                inner, k = a[1:a.rindex(")")], int(a[a.rindex("//") + 2:])
                ilo, ihi = bounds(inner, ranges)
                alo, ahi = ilo // k, ihi // k
            cands = (lo * alo, lo * ahi, hi * alo, hi * ahi)
            lo, hi = min(cands), max(cands)
        lo_total += lo
        hi_total += hi
    return lo_total, hi_total


def add(a: Dim, b: Dim) -> Dim:
    """``a + b`` as a canonical dim."""
    return _dim(_add(_poly(a), _poly(b)))


def sub(a: Dim, b: Dim) -> Dim:
    """``a - b`` as a canonical dim."""
    return _dim(_add(_poly(a), _poly(b), -1))


def mul(a: Dim, b: Dim) -> Dim:
    """``a * b`` as a canonical dim."""
    return _dim(_mul(_poly(a), _poly(b)))


def floordiv(a: Dim, b: int) -> Dim:
    """``a // b`` for a positive integer ``b``, as a canonical dim."""
    return _dim(_floordiv(_poly(a), int(b)))


def parse_range(text: str) -> tuple[str, tuple[int, int]]:
    """Parse ``"name=lo..hi"`` (or ``"name=hi"``, meaning ``1..hi``) from a command line."""
    name, sep, rng = text.partition("=")
    if not sep:
        raise InputError(f"bad dimension range {text!r}: expected NAME=LO..HI, e.g. seq=1..512")
    lo_s, dots, hi_s = rng.partition("..")
    try:
        lo, hi = (int(lo_s), int(hi_s)) if dots else (1, int(lo_s))
    except ValueError:
        raise InputError(f"bad dimension range {text!r}: expected NAME=LO..HI with integers") from None
    return check_name(name.strip()), check_range(name.strip(), (lo, hi))


def check_range(name: str, rng: Sequence[int], allow_zero: bool = False) -> tuple[int, int]:
    """Validate a symbol's ``(lo, hi)`` range: ``1 <= lo <= hi``, or ``0 <= lo <= hi`` with
    ``allow_zero`` (a data-dependent dim, such as the count of NonZero, may be empty; a dim
    an input gives may not)."""
    try:
        lo, hi = (int(x) for x in rng)
    except (TypeError, ValueError):
        raise InputError(f"range of dimension {name!r} must be (lo, hi) integers, got {rng!r}") from None
    least = 0 if allow_zero else 1
    if not least <= lo <= hi:
        raise InputError(f"range of dimension {name!r} must satisfy {least} <= lo <= hi, got {lo}..{hi}")
    return lo, hi


def _py(d: Dim) -> str:
    """Python source computing ``d`` from a dict ``e`` of symbol values."""
    terms = []
    for m, c in _poly(d).items():
        f = [str(c)] + [f"e[{a!r}]" if _NAME.match(a) else
                        f"(({_py(a[1:a.rindex(')')])})//{int(a[a.rindex('//') + 2:])})" for a in m]
        terms.append("*".join(f))
    return "+".join(terms) or "0"


def shape_function(shapes: Iterable[Sequence[Dim]]) -> Callable[[Mapping[str, int]], list[tuple[int, ...]]]:
    """Compile the shapes of many tensors into one function of the symbol values.

    Called once when a model loads; each call of the result is a single Python expression,
    so recomputing every entry's shape on a new input shape costs microseconds.
    """
    rows = []
    for shape in shapes:
        rows.append("(" + "".join(f"{d}," if isinstance(d, int) else f"{_py(d)}," for d in shape) + ")")
    src = "lambda e: [" + ", ".join(rows) + "]"
    # The source is built only from canonical expressions (names checked by the grammar).
    return eval(compile(src, "<kiln shape function>", "eval"), {"__builtins__": {}})  # noqa: S307
