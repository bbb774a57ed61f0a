"""Loop unswitching of tile guards.

A register-tiled kernel whose extent is not a multiple of the tile gets guards such as
``if mo * 6 + i < M`` around rows of the tile, *inside* the reduction loop.  The guards
are invariant in that loop but compilers keep the guarded accumulators in memory (a
conditional update of a register tile defeats LLVM's SROA), which made every tile slow,
not only the last.  :func:`unswitch_loops` versions such a loop once::

    for k: ... if c: S ...      →      if c: (for k: ... S ...) else: (for k: ... if c: S ...)

``unrolled`` loops with a constant extent (≤ 64) are unrolled here first, so a guard on
the unrolled row index becomes one invariant condition per row.  A ``vectorized`` loop whose
whole body is a guard invariant in it becomes the guard around the loop.  Only serial loops are
versioned, only for guard ``if`` s without ``else`` that contain a
``vectorized`` or ``unrolled`` loop (the tile body), and only at the outermost loop that the
condition is invariant in, so code size grows by at most one copy per tiled loop nest.
"""

from __future__ import annotations

from functools import reduce

from .expr import IntImm, PrimExpr, Var, binary
from .functor import collect_vars, substitute
from .simplify import simplify_stmt
from .stmt import Allocate, BufferStore, Evaluate, For, IfThenElse, LetStmt, SeqStmt, Stmt, seq

__all__ = ["unswitch_loops"]


def _bound_vars(s: Stmt, out: set[Var]) -> None:
    if isinstance(s, For):
        out.add(s.loop_var)
        _bound_vars(s.body, out)
    elif isinstance(s, LetStmt):
        out.add(s.var)
        _bound_vars(s.body, out)
    elif isinstance(s, SeqStmt):
        for x in s.seq:
            _bound_vars(x, out)
    elif isinstance(s, IfThenElse):
        _bound_vars(s.then_case, out)
        if s.else_case is not None:
            _bound_vars(s.else_case, out)
    elif isinstance(s, Allocate):
        _bound_vars(s.body, out)


def _has_loop(s: Stmt, kinds: tuple[str, ...]) -> bool:
    """Whether ``s`` holds a loop of one of ``kinds``."""
    if isinstance(s, For):
        return s.kind in kinds or _has_loop(s.body, kinds)
    if isinstance(s, SeqStmt):
        return any(_has_loop(x, kinds) for x in s.seq)
    if isinstance(s, (LetStmt, Allocate)):
        return _has_loop(s.body, kinds)
    if isinstance(s, IfThenElse):
        return _has_loop(s.then_case, kinds) or (s.else_case is not None and _has_loop(s.else_case, kinds))
    return False


def _guards(s: Stmt, bound: set[Var], out: list[PrimExpr]) -> None:
    """Conditions of guard ifs in ``s`` that use none of the ``bound`` variables."""
    if isinstance(s, IfThenElse):
        if (s.else_case is None and not (collect_vars(s.cond) & bound)
                and _has_loop(s.then_case, ("vectorized", "unrolled")) and not any(c is s.cond for c in out)):
            out.append(s.cond)
        _guards(s.then_case, bound, out)
        if s.else_case is not None:
            _guards(s.else_case, bound, out)
    elif isinstance(s, SeqStmt):
        for x in s.seq:
            _guards(x, bound, out)
    elif isinstance(s, (For, LetStmt, Allocate)):
        _guards(s.body, bound, out)


def _assume(s: Stmt, conds: list[PrimExpr]) -> Stmt:
    """``s`` with the guard ifs on ``conds`` replaced by their bodies."""
    if isinstance(s, IfThenElse):
        then = _assume(s.then_case, conds)
        els = None if s.else_case is None else _assume(s.else_case, conds)
        if els is None and any(c is s.cond for c in conds):
            return then
        return IfThenElse(s.cond, then, els)
    if isinstance(s, SeqStmt):
        return SeqStmt([_assume(x, conds) for x in s.seq])
    if isinstance(s, For):
        return For(s.loop_var, s.min, s.extent, s.kind, _assume(s.body, conds), s.annotations)
    if isinstance(s, LetStmt):
        return LetStmt(s.var, s.value, _assume(s.body, conds))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _assume(s.body, conds))
    return s


def unswitch_loops(s: Stmt) -> Stmt:
    """Version serial loops on their loop-invariant tile guards (see the module docstring)."""
    if isinstance(s, For):
        if (s.kind == "unrolled" and isinstance(s.min, IntImm) and isinstance(s.extent, IntImm)
                and s.extent.value <= 64):
            # unroll here so that guards on the unrolled variable become per-row constants
            v, lo = s.loop_var, s.min.value
            return unswitch_loops(seq(*[simplify_stmt(substitute(s.body, {v: IntImm(lo + i, v.dtype)}))
                                        for i in range(s.extent.value)]))
        ann = s.annotations
        if s.kind == "serial" and _has_loop(s.body, ("unrolled",)):
            ann = {**ann, "unroll": False}  # llvm: not unrolled again (llvm.loop.unroll.disable)
        body = unswitch_loops(s.body)
        if (s.kind == "vectorized" and isinstance(body, IfThenElse) and body.else_case is None
                and s.loop_var not in collect_vars(body.cond)):
            # a guard the same for every lane (a padded pool's window tap): test it once, outside
            # the vector loop, whose body is then plain stores the codegens vectorise
            return IfThenElse(body.cond, For(s.loop_var, s.min, s.extent, s.kind, body.then_case, s.annotations))
        if s.kind == "serial":
            bound: set[Var] = {s.loop_var}
            _bound_vars(body, bound)
            conds: list[PrimExpr] = []
            _guards(body, bound, conds)
            if conds:
                fast = For(s.loop_var, s.min, s.extent, s.kind, _assume(body, conds), ann)
                slow = For(s.loop_var, s.min, s.extent, s.kind, body, ann)
                return IfThenElse(reduce(lambda a, b: binary("and", a, b), conds), fast, slow)
        return For(s.loop_var, s.min, s.extent, s.kind, body, ann)
    if isinstance(s, SeqStmt):
        return SeqStmt([unswitch_loops(x) for x in s.seq])
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, unswitch_loops(s.then_case),
                          None if s.else_case is None else unswitch_loops(s.else_case))
    if isinstance(s, LetStmt):
        return LetStmt(s.var, s.value, unswitch_loops(s.body))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, unswitch_loops(s.body))
    if isinstance(s, (BufferStore, Evaluate)):
        return s
    return s
