"""Generic traversal of expressions and statements: a rebuilding mutator and a visitor.

Subclass :class:`Mutator` and override ``visit_<NodeClass>`` for the nodes you change; the
default rebuilds a node only when a child changed, through the folding constructors, so a
substitution also re-simplifies.
"""

from __future__ import annotations

from typing import Any, Callable

from .expr import (
    BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var,
    binary, cast, logical_not,
)
from .stmt import Allocate, BufferStore, Evaluate, For, IfThenElse, LetStmt, SeqStmt, Stmt, seq

__all__ = ["loop_closure", "Mutator", "children", "post_order_visit", "substitute", "collect_vars", "uses_var"]


class Mutator:
    """Rebuilds expression / statement trees; override ``visit_<Class>`` to change nodes."""

    def expr(self, e: PrimExpr) -> PrimExpr:
        f = getattr(self, "visit_" + type(e).__name__, None)
        if f is not None:
            return f(e)
        return self.generic_expr(e)

    def stmt(self, s: Stmt) -> Stmt:
        f = getattr(self, "visit_" + type(s).__name__, None)
        if f is not None:
            return f(s)
        return self.generic_stmt(s)

    # ---- default rebuilding
    def generic_expr(self, e: PrimExpr) -> PrimExpr:
        if isinstance(e, (Var, IntImm, FloatImm)):
            return e
        if isinstance(e, BinaryOp):
            a, b = self.expr(e.a), self.expr(e.b)
            return e if (a is e.a and b is e.b) else binary(e.op, a, b)
        if isinstance(e, Not):
            a = self.expr(e.a)
            return e if a is e.a else logical_not(a)
        if isinstance(e, Cast):
            v = self.expr(e.value)
            return e if v is e.value else cast(v, e.dtype)
        if isinstance(e, Call):
            args = [self.expr(a) for a in e.args]
            return e if all(x is y for x, y in zip(args, e.args)) else Call(e.dtype, e.op, args, e.text)
        if isinstance(e, Select):
            c, t, f = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
            if c is e.cond and t is e.true_value and f is e.false_value:
                return e
            from .expr import select

            return select(c, t, f)
        if isinstance(e, Load):
            idx = [self.expr(i) for i in e.indices]
            return e if all(x is y for x, y in zip(idx, e.indices)) else Load(e.buffer, idx)
        if isinstance(e, ProducerLoad):
            idx = [self.expr(i) for i in e.indices]
            return e if all(x is y for x, y in zip(idx, e.indices)) else ProducerLoad(e.producer, idx)
        if isinstance(e, Reduce):
            src = self.expr(e.source)
            cond = None if e.condition is None else self.expr(e.condition)
            if src is e.source and cond is e.condition:
                return e
            return Reduce(e.combiner, src, e.axis, cond, e.identity)
        raise TypeError(f"unknown expression node {type(e).__name__}")

    def generic_stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, For):
            mn, ext, body = self.expr(s.min), self.expr(s.extent), self.stmt(s.body)
            if mn is s.min and ext is s.extent and body is s.body:
                return s
            return For(s.loop_var, mn, ext, s.kind, body, s.annotations)
        if isinstance(s, BufferStore):
            v = self.expr(s.value)
            idx = [self.expr(i) for i in s.indices]
            if v is s.value and all(x is y for x, y in zip(idx, s.indices)):
                return s
            return BufferStore(s.buffer, v, idx)
        if isinstance(s, Allocate):
            b = self.stmt(s.body)
            return s if b is s.body else Allocate(s.buffer, b)
        if isinstance(s, SeqStmt):
            items = [self.stmt(x) for x in s.seq]
            return s if all(x is y for x, y in zip(items, s.seq)) else seq(*items)
        if isinstance(s, IfThenElse):
            c = self.expr(s.cond)
            t = self.stmt(s.then_case)
            f = None if s.else_case is None else self.stmt(s.else_case)
            if c is s.cond and t is s.then_case and f is s.else_case:
                return s
            return IfThenElse(c, t, f)
        if isinstance(s, LetStmt):
            v, b = self.expr(s.value), self.stmt(s.body)
            return s if (v is s.value and b is s.body) else LetStmt(s.var, v, b)
        if isinstance(s, Evaluate):
            v = self.expr(s.value)
            return s if v is s.value else Evaluate(v)
        raise TypeError(f"unknown statement node {type(s).__name__}")


class _Substituter(Mutator):
    def __init__(self, vmap: dict[Var, PrimExpr]) -> None:
        self.vmap = vmap

    def visit_Var(self, v: Var) -> PrimExpr:
        return self.vmap.get(v, v)


def substitute(node: Any, vmap: dict[Var, PrimExpr]) -> Any:
    """Replace variables by expressions in an expression or statement (re-folding)."""
    if not vmap:
        return node
    m = _Substituter(vmap)
    return m.stmt(node) if isinstance(node, Stmt) else m.expr(node)


def _children(n: Any) -> list[Any]:
    if isinstance(n, BinaryOp):
        return [n.a, n.b]
    if isinstance(n, Not):
        return [n.a]
    if isinstance(n, Cast):
        return [n.value]
    if isinstance(n, Call):
        return list(n.args)
    if isinstance(n, Select):
        return [n.cond, n.true_value, n.false_value]
    if isinstance(n, (Load, ProducerLoad)):
        return list(n.indices)
    if isinstance(n, Reduce):
        return [n.source] + ([n.condition] if n.condition is not None else [])
    if isinstance(n, For):
        return [n.min, n.extent, n.body]
    if isinstance(n, BufferStore):
        return [n.value, *n.indices]
    if isinstance(n, Allocate):
        return [n.body]
    if isinstance(n, SeqStmt):
        return list(n.seq)
    if isinstance(n, IfThenElse):
        return [n.cond, n.then_case] + ([n.else_case] if n.else_case is not None else [])
    if isinstance(n, LetStmt):
        return [n.value, n.body]
    if isinstance(n, Evaluate):
        return [n.value]
    return []


def children(node: Any) -> list[Any]:
    """The direct sub-expressions / sub-statements of ``node`` (none for a leaf)."""
    return _children(node)


def post_order_visit(node: Any, fvisit: Callable[[Any], None]) -> None:
    """Call ``fvisit`` on every node of the tree, children first (iterative: deep trees are fine)."""
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        n, done = stack.pop()
        if done:
            fvisit(n)
            continue
        stack.append((n, True))
        for c in reversed(_children(n)):
            stack.append((c, False))


def collect_vars(node: Any) -> set[Var]:
    """Every :class:`Var` referenced in ``node``."""
    out: set[Var] = set()

    def f(n: Any) -> None:
        if isinstance(n, Var):
            out.add(n)

    post_order_visit(node, f)
    return out


def uses_var(node: Any, vs: set[Var]) -> bool:
    """True when ``node`` references any variable of ``vs``."""
    return bool(collect_vars(node) & vs)


def loop_closure(loop: Any) -> tuple[list[Any], list[Var]]:
    """What the body of ``loop`` uses from outside it: ``(buffers, scalar variables)``.

    Buffers are those loaded or stored and not allocated inside the body, in first-use order;
    scalars are the non-handle variables bound outside (the loop's own variable excluded), in
    no particular order. The code generators pass exactly these to an outlined parallel body.
    """
    inner: set[int] = set()
    used: dict[int, Any] = {}

    def visit(n: Any) -> None:
        if isinstance(n, For):
            inner.add(id(n.loop_var))
        elif isinstance(n, LetStmt):
            inner.add(id(n.var))
        elif isinstance(n, Allocate):
            inner.add(id(n.buffer.data))
        elif isinstance(n, (Load, BufferStore)):
            used[id(n.buffer.data)] = n.buffer

    post_order_visit(loop.body, visit)
    bufs = [b for key, b in used.items() if key not in inner]
    scalars = [v for v in collect_vars(loop.body)
               if v.dtype != "handle" and id(v) not in inner and v is not loop.loop_var]
    return bufs, scalars
