"""A small arithmetic simplifier for index expressions and loop nests.

What it does (enough for the index arithmetic schedules produce):

* integer expressions are normalised to a linear form ``sum(c_i * atom_i) + c`` and rebuilt,
  so ``(i*4 + j) - i*4`` becomes ``j``;
* constant integer bounds of expressions are derived from loop ranges
  (:meth:`Analyzer.const_int_bound`), which lets it drop ``floordiv`` / ``floormod`` when
  the remainder provably stays in ``[0, c)``, resolve ``min`` / ``max`` and prove or refute
  comparisons (so split guards that always hold disappear);
* loops of extent 1 are replaced by their single iteration, loops of extent 0 and
  branches with a constant condition are removed.
"""

from __future__ import annotations

import math
from typing import Any

from .dtype import is_integer, is_bool
from .expr import (
    CHECKED_INDEX, BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Select, Var, binary,
    const, logical_not,
)
from .functor import Mutator, substitute
from .stmt import Evaluate, For, IfThenElse, LetStmt, Stmt, seq

__all__ = ["Analyzer", "simplify", "simplify_stmt"]

INF = math.inf
Bound = tuple[float, float]  # ints, or +-inf when unknown


def _mul_b(x: float, y: float) -> float:
    if x == 0 or y == 0:
        return 0
    return x * y


def _key(e: PrimExpr) -> Any:
    """A hashable structural key (variables by identity)."""
    if isinstance(e, Var):
        return ("v", id(e))
    if isinstance(e, (IntImm, FloatImm)):
        return ("c", e.dtype, e.value)
    if isinstance(e, BinaryOp):
        return ("b", e.op, _key(e.a), _key(e.b))
    if isinstance(e, Cast):
        return ("cast", e.dtype, _key(e.value))
    if isinstance(e, Not):
        return ("not", _key(e.a))
    if isinstance(e, Call):
        return ("call", e.op, e.text, tuple(_key(a) for a in e.args))
    if isinstance(e, Select):
        return ("sel", _key(e.cond), _key(e.true_value), _key(e.false_value))
    if isinstance(e, Load):
        return ("ld", id(e.buffer), tuple(_key(i) for i in e.indices))
    if isinstance(e, ProducerLoad):
        return ("pl", id(e.producer), tuple(_key(i) for i in e.indices))
    return ("id", id(e))


def _divmod_by_const(e: PrimExpr, op: str) -> bool:
    """``e`` is ``a // c`` (op ``floordiv``) or ``a % c`` (``floormod``) with a constant ``c > 0``."""
    return isinstance(e, BinaryOp) and e.op == op and isinstance(e.b, IntImm) and e.b.value > 0


class Analyzer:
    """Holds known integer ranges of variables and simplifies expressions using them."""

    def __init__(self) -> None:
        self.ranges: dict[Var, Bound] = {}

    def bind(self, var: Var, lo: float, hi: float) -> None:
        """Declare ``lo <= var <= hi`` (inclusive)."""
        self.ranges[var] = (lo, hi)

    # ------------------------------------------------------------------ bounds
    def const_int_bound(self, e: PrimExpr) -> Bound:
        """Inclusive constant bounds ``(lo, hi)`` of an integer expression (``+-inf`` if unknown)."""
        if isinstance(e, IntImm):
            return (e.value, e.value)
        if isinstance(e, Var):
            return self.ranges.get(e, (-INF, INF))
        if isinstance(e, Cast) and (is_integer(e.dtype) or is_bool(e.dtype)) and (
                is_integer(e.value.dtype) or is_bool(e.value.dtype)):
            return self.const_int_bound(e.value)
        if isinstance(e, BinaryOp):
            if e.op in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or"):
                return (0, 1)
            a = self.const_int_bound(e.a)
            b = self.const_int_bound(e.b)
            if e.op == "add":
                return (a[0] + b[0], a[1] + b[1])
            if e.op == "sub":
                return (a[0] - b[1], a[1] - b[0])
            if e.op == "mul":
                c = [_mul_b(x, y) for x in a for y in b]
                return (min(c), max(c))
            if e.op in ("floordiv", "truncdiv") and b[0] == b[1] and b[0] > 0:
                d = b[0]
                lo = a[0] // d if a[0] != -INF else -INF
                hi = a[1] // d if a[1] != INF else INF
                if e.op == "truncdiv" and a[0] < 0:
                    return (-INF, INF) if lo == -INF else (math.trunc(a[0] / d), hi)
                return (lo, hi)
            if e.op == "floormod" and b[0] == b[1] and b[0] > 0:
                if a[0] >= 0 and a[1] < b[0]:
                    return a
                return (0, b[0] - 1)
            if e.op == "truncmod" and b[0] == b[1] and b[0] > 0:
                if a[0] >= 0:
                    return (0, min(a[1], b[0] - 1))
                return (-(b[0] - 1), b[0] - 1)
            if e.op == "min":
                return (min(a[0], b[0]), min(a[1], b[1]))
            if e.op == "max":
                return (max(a[0], b[0]), max(a[1], b[1]))
        if isinstance(e, Select):
            a = self.const_int_bound(e.true_value)
            b = self.const_int_bound(e.false_value)
            return (min(a[0], b[0]), max(a[1], b[1]))
        if isinstance(e, Not):
            return (0, 1)
        if isinstance(e, Call) and e.op == CHECKED_INDEX and isinstance(e.args[1], IntImm):
            return (0, max(e.args[1].value - 1, 0))  # any other value never gets past the check
        return (-INF, INF)

    def can_prove(self, cond: PrimExpr) -> bool:
        """True when ``cond`` simplifies to the constant true."""
        c = self.simplify(cond)
        return isinstance(c, IntImm) and c.value != 0

    # ------------------------------------------------------------------ linear forms
    def linear(self, e: PrimExpr) -> tuple[dict[Any, list[Any]], int]:
        """``e`` as a sum ``(terms, const)``: ``terms`` maps a structural key to ``[atom,
        coefficient]``, each atom a simplified non-linear part (a variable, ``x // c``, ...)
        under this analyzer's ranges; ``e == sum(coefficient * atom) + const``."""
        return self._linear(e)

    def _linear(self, e: PrimExpr) -> tuple[dict[Any, list[Any]], int]:
        """``e`` as ``({key: [atom, coeff]}, const)``; atoms are simplified non-linear parts."""
        if isinstance(e, IntImm):
            return {}, e.value
        if isinstance(e, BinaryOp) and e.op in ("add", "sub"):
            ta, ca = self._linear(e.a)
            tb, cb = self._linear(e.b)
            sign = 1 if e.op == "add" else -1
            for k, (atom, c) in tb.items():
                if k in ta:
                    ta[k][1] += sign * c
                else:
                    ta[k] = [atom, sign * c]
            return ta, ca + sign * cb
        if isinstance(e, BinaryOp) and e.op == "mul":
            ta, ca = self._linear(e.a)
            tb, cb = self._linear(e.b)
            if not tb:
                return {k: [a, c * cb] for k, (a, c) in ta.items()}, ca * cb
            if not ta:
                return {k: [a, c * ca] for k, (a, c) in tb.items()}, ca * cb
            atom = binary("mul", self._rebuild(ta, ca, e.dtype), self._rebuild(tb, cb, e.dtype))
            return {_key(atom): [atom, 1]}, 0
        atom = self._simplify_atom(e)
        if isinstance(atom, IntImm):
            return {}, atom.value
        if isinstance(atom, BinaryOp) and atom.op in ("add", "sub", "mul") and atom is not e:
            return self._linear(atom)
        return {_key(atom): [atom, 1]}, 0

    def _fold_divmod(self, terms: dict[Any, list[Any]], c: int) -> int:
        """Merge quotient/remainder pairs of ``terms`` in place; returns the new constant.

        ``m*(x // m) + x % m`` is ``x`` and ``m*((x // m) % n) + x % m`` is ``x % (m*n)`` (both
        scaled by the remainder's coefficient). Flattening the indices of a fused loop back into
        a row-major offset produces exactly these sums; folding them makes the offset linear in
        the loop variable, so a vectorized loop gets contiguous loads instead of gathers.
        """
        changed = True
        while changed:
            changed = False
            for key, (atom, co) in list(terms.items()):
                if co == 0 or key not in terms or not _divmod_by_const(atom, "floormod"):
                    continue
                x, m = atom.a, atom.b.value
                xk = _key(x)
                for pkey, (partner, pco) in list(terms.items()):
                    if pkey == key or pco != co * m:
                        continue
                    if _divmod_by_const(partner, "floordiv") and partner.b.value == m \
                            and _key(partner.a) == xk:
                        folded = x  # m*(x // m) + x % m
                    elif _divmod_by_const(partner, "floormod") and _divmod_by_const(partner.a, "floordiv") \
                            and partner.a.b.value == m and _key(partner.a.a) == xk:
                        folded = self._divmod("floormod", x, m * partner.b.value, atom.dtype)
                    else:
                        continue
                    del terms[key], terms[pkey]
                    ft, fc = self._linear(folded)
                    for k2, (a2, c2) in ft.items():
                        if k2 in terms:
                            terms[k2][1] += co * c2
                        else:
                            terms[k2] = [a2, co * c2]
                    c += co * fc
                    changed = True
                    break
        for key in [k for k, (_, co) in terms.items() if co == 0]:
            del terms[key]
        return c

    @staticmethod
    def _rebuild(terms: dict[Any, list[Any]], c: int, dtype: str) -> PrimExpr:
        pos = [(a, k) for a, k in terms.values() if k > 0]
        neg = [(a, -k) for a, k in terms.values() if k < 0]
        out: PrimExpr | None = None
        if not pos and neg and c > 0:
            out, c = const(c, dtype), 0  # "5 - 2*x" rather than "0 - 2*x + 5"
        for a, k in pos:
            t = a if k == 1 else binary("mul", a, const(k, dtype))
            out = t if out is None else binary("add", out, t)
        for a, k in neg:
            t = a if k == 1 else binary("mul", a, const(k, dtype))
            out = binary("sub", const(0, dtype) if out is None else out, t)
        if out is None:
            return const(c, dtype)
        if c > 0:
            out = binary("add", out, const(c, dtype))
        elif c < 0:
            out = binary("sub", out, const(-c, dtype))
        return out

    def _simplify_atom(self, e: PrimExpr) -> PrimExpr:
        """Simplify a non add/sub/mul integer node (children first)."""
        if isinstance(e, BinaryOp) and e.op in ("floordiv", "floormod") and is_integer(e.dtype):
            a = self.simplify(e.a)
            b = self.simplify(e.b)
            if isinstance(b, IntImm) and b.value > 0:
                return self._divmod(e.op, a, b.value, e.dtype)
            return binary(e.op, a, b)
        if isinstance(e, BinaryOp) and e.op in ("min", "max"):
            a, b = self.simplify(e.a), self.simplify(e.b)
            ba, bb = self.const_int_bound(a), self.const_int_bound(b)
            if e.op == "min":
                if ba[1] <= bb[0]:
                    return a
                if bb[1] <= ba[0]:
                    return b
            else:
                if ba[0] >= bb[1]:
                    return a
                if bb[0] >= ba[1]:
                    return b
            return binary(e.op, a, b)
        return self._generic(e)

    def _divmod(self, op: str, a: PrimExpr, c: int, dtype: str) -> PrimExpr:
        # nested: (x // p) // c == x // (p*c) for positive p, c
        if op == "floordiv" and isinstance(a, BinaryOp) and a.op == "floordiv" and isinstance(a.b, IntImm) \
                and a.b.value > 0:
            return self._divmod("floordiv", a.a, a.b.value * c, dtype)
        if op == "floormod" and isinstance(a, BinaryOp) and a.op == "floormod" and isinstance(a.b, IntImm) \
                and a.b.value > 0 and a.b.value % c == 0:
            return self._divmod("floormod", a.a, c, dtype)
        terms, k = self._linear(a)
        k = self._fold_divmod(terms, k)
        q_terms = {key: [at, co // c] for key, (at, co) in terms.items() if co % c == 0 and co != 0}
        r_terms = {key: [at, co] for key, (at, co) in terms.items() if co % c != 0}
        qc, rc = divmod(k, c)
        r = self._rebuild(r_terms, rc, dtype)
        lo, hi = self.const_int_bound(r)
        if lo != -INF and hi != INF and lo // c == hi // c:
            inner_q, inner_r = lo // c, binary("sub", r, const((lo // c) * c, dtype)) if lo // c else r
        else:
            inner_q, inner_r = None, None
        if op == "floordiv":
            q = self._rebuild(q_terms, qc, dtype)
            if inner_q is not None:
                return self.simplify(binary("add", q, const(inner_q, dtype)))
            return binary("add", q, binary("floordiv", r, const(c, dtype)))
        if inner_r is not None:
            return self.simplify(inner_r)
        return binary("floormod", r, const(c, dtype))

    def _generic(self, e: PrimExpr) -> PrimExpr:
        return _Simp(self).generic_expr(e)

    # ------------------------------------------------------------------ entry points
    def simplify(self, e: PrimExpr) -> PrimExpr:
        """Simplify an expression under the known variable ranges."""
        if isinstance(e, (IntImm, FloatImm, Var)):
            return e
        if is_integer(e.dtype) and isinstance(e, BinaryOp) and e.op in ("add", "sub", "mul"):
            terms, c = self._linear(e)
            c = self._fold_divmod(terms, c)
            return self._rebuild(terms, c, e.dtype)
        if isinstance(e, BinaryOp) and e.op in ("lt", "le", "gt", "ge", "eq", "ne") and is_integer(e.a.dtype):
            d = self.simplify(binary("sub", e.a, e.b))
            lo, hi = self.const_int_bound(d)
            verdict = {
                "lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0), "gt": (lo > 0, hi <= 0),
                "ge": (lo >= 0, hi < 0), "eq": (lo == hi == 0, lo > 0 or hi < 0),
                "ne": (lo > 0 or hi < 0, lo == hi == 0),
            }[e.op]
            if verdict[0]:
                return IntImm(1, "bool")
            if verdict[1]:
                return IntImm(0, "bool")
            a, b = self.simplify(e.a), self.simplify(e.b)
            # move constants to the right: (x + 3 < 10) -> (x < 7)
            ta, ca = self._linear(a)
            if isinstance(b, IntImm) and ca != 0:
                a, b = self._rebuild(ta, 0, a.dtype), const(b.value - ca, b.dtype)
            return binary(e.op, a, b)
        if is_integer(e.dtype):
            return self._simplify_atom(e)
        return self._generic(e)


class _Simp(Mutator):
    """Expression/statement simplifier driven by an :class:`Analyzer`."""

    def __init__(self, ana: Analyzer) -> None:
        self.ana = ana

    def expr(self, e: PrimExpr) -> PrimExpr:
        if isinstance(e, (IntImm, FloatImm, Var)):
            return e
        if is_integer(e.dtype) or (isinstance(e, BinaryOp) and e.op in ("lt", "le", "gt", "ge", "eq", "ne")):
            return self.ana.simplify(e)
        return self.generic_expr(e)

    def visit_Select(self, e: Select) -> PrimExpr:
        c = self.expr(e.cond)
        if isinstance(c, IntImm):
            return self.expr(e.true_value if c.value else e.false_value)
        from .expr import select

        return select(c, self.expr(e.true_value), self.expr(e.false_value))

    def visit_For(self, s: For) -> Stmt:
        mn, ext = self.expr(s.min), self.expr(s.extent)
        if isinstance(ext, IntImm) and ext.value <= 0:
            return Evaluate(0)
        if isinstance(ext, IntImm) and ext.value == 1 and not s.annotations.get("keep"):
            return self.stmt(substitute(s.body, {s.loop_var: mn}))
        lo, _ = self.ana.const_int_bound(mn)
        _, mhi = self.ana.const_int_bound(mn)
        _, ehi = self.ana.const_int_bound(ext)
        old = self.ana.ranges.get(s.loop_var)
        self.ana.bind(s.loop_var, lo, mhi + ehi - 1 if ehi != INF and mhi != INF else INF)
        body = self.stmt(s.body)
        if old is None:
            self.ana.ranges.pop(s.loop_var, None)
        else:
            self.ana.ranges[s.loop_var] = old
        if isinstance(body, Evaluate) and isinstance(body.value, IntImm):
            return body
        return For(s.loop_var, mn, ext, s.kind, body, s.annotations)

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        c = self.expr(s.cond)
        if isinstance(c, IntImm):
            if c.value:
                return self.stmt(s.then_case)
            return self.stmt(s.else_case) if s.else_case is not None else Evaluate(0)
        t = self.stmt(s.then_case)
        f = None if s.else_case is None else self.stmt(s.else_case)
        return IfThenElse(c, t, f)

    def visit_LetStmt(self, s: LetStmt) -> Stmt:
        v = self.expr(s.value)
        if isinstance(v, (IntImm, Var)):
            return self.stmt(substitute(s.body, {s.var: v}))
        if is_integer(v.dtype):
            self.ana.bind(s.var, *self.ana.const_int_bound(v))
        return LetStmt(s.var, v, self.stmt(s.body))

    def generic_stmt(self, s: Stmt) -> Stmt:
        out = super().generic_stmt(s)
        return out


def simplify(e: PrimExpr, ranges: dict[Var, tuple[int, int]] | None = None) -> PrimExpr:
    """Simplify an expression; ``ranges`` maps variables to inclusive ``(lo, hi)`` bounds."""
    ana = Analyzer()
    for v, (lo, hi) in (ranges or {}).items():
        ana.bind(v, lo, hi)
    return _Simp(ana).expr(e)


def simplify_stmt(s: Stmt, ranges: dict[Var, tuple[int, int]] | None = None) -> Stmt:
    """Simplify every expression of a statement, using loop ranges as they are entered."""
    ana = Analyzer()
    for v, (lo, hi) in (ranges or {}).items():
        ana.bind(v, lo, hi)
    return _Simp(ana).stmt(s)


# silence "imported but unused" for names re-exported for convenience
_ = (logical_not, seq)
