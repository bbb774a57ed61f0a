"""Readable TVMScript-like text for expressions, statements and PrimFuncs (for humans only)."""

from __future__ import annotations

from typing import Any

from .expr import (
    BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var,
)
from .stmt import Allocate, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt

__all__ = ["expr_to_str", "stmt_to_str", "func_to_str"]

_INFIX = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
    "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "and", "or": "or",
    "bitand": "&", "bitor": "|", "bitxor": "^", "shl": "<<", "shr": ">>",
}
_PREC = {"or": 1, "and": 2, "lt": 4, "le": 4, "gt": 4, "ge": 4, "eq": 4, "ne": 4, "bitor": 5, "bitxor": 6,
         "bitand": 7, "shl": 8, "shr": 8, "add": 9, "sub": 9, "mul": 10, "div": 10, "floordiv": 10, "floormod": 10}


def expr_to_str(e: Any, prec: int = 0) -> str:
    """Render an expression with minimal parentheses."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, IntImm):
        if e.dtype == "bool":
            return "True" if e.value else "False"
        return str(e.value) if e.dtype in ("int32",) else f"{e.dtype}({e.value})"
    if isinstance(e, FloatImm):
        return repr(e.value) + ("f" if e.dtype == "float32" else f"_{e.dtype}" if e.dtype != "float64" else "")
    if isinstance(e, BinaryOp):
        if e.op in _INFIX:
            p = _PREC[e.op]
            s = f"{expr_to_str(e.a, p)} {_INFIX[e.op]} {expr_to_str(e.b, p + 1)}"
            return f"({s})" if p < prec else s
        return f"{e.op}({expr_to_str(e.a)}, {expr_to_str(e.b)})"
    if isinstance(e, Not):
        return f"not {expr_to_str(e.a, 11)}"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_to_str(e.value)})"
    if isinstance(e, Call):
        text = [repr(e.text)] if e.text else []
        return f"{e.op}({', '.join([expr_to_str(a) for a in e.args] + text)})"
    if isinstance(e, Select):
        return (f"if_then_else({expr_to_str(e.cond)}, {expr_to_str(e.true_value)}, "
                f"{expr_to_str(e.false_value)})")
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(expr_to_str(i) for i in e.indices)}]"
    if isinstance(e, ProducerLoad):
        return f"{e.producer.name}[{', '.join(expr_to_str(i) for i in e.indices)}]"
    if isinstance(e, Reduce):
        axes = ", ".join(iv.var.name for iv in e.axis)
        cond = "" if e.condition is None else f", where={expr_to_str(e.condition)}"
        return f"{e.combiner}({expr_to_str(e.source)}, axis=[{axes}]{cond})"
    return f"<{type(e).__name__}>"


def _lines(s: Stmt, ind: int, out: list[str]) -> None:
    pad = "    " * ind
    if isinstance(s, SeqStmt):
        for x in s.seq:
            _lines(x, ind, out)
    elif isinstance(s, For):
        kind = "" if s.kind == "serial" else f"  # {s.kind}"
        rng = (f"range({expr_to_str(s.extent)})" if isinstance(s.min, IntImm) and s.min.value == 0
               else f"range({expr_to_str(s.min)}, {expr_to_str(s.min)} + {expr_to_str(s.extent)})")
        out.append(f"{pad}for {s.loop_var.name} in {rng}:{kind}")
        _lines(s.body, ind + 1, out)
    elif isinstance(s, BufferStore):
        idx = ", ".join(expr_to_str(i) for i in s.indices)
        out.append(f"{pad}{s.buffer.name}[{idx}] = {expr_to_str(s.value)}")
    elif isinstance(s, Allocate):
        b = s.buffer
        out.append(f"{pad}{b.name} = allocate({list(b.shape)}, \"{b.dtype}\", scope=\"{b.scope}\")")
        _lines(s.body, ind, out)
    elif isinstance(s, IfThenElse):
        out.append(f"{pad}if {expr_to_str(s.cond)}:")
        _lines(s.then_case, ind + 1, out)
        if s.else_case is not None:
            out.append(f"{pad}else:")
            _lines(s.else_case, ind + 1, out)
    elif isinstance(s, LetStmt):
        out.append(f"{pad}{s.var.name} = {expr_to_str(s.value)}")
        _lines(s.body, ind, out)
    elif isinstance(s, Evaluate):
        out.append(f"{pad}{'pass' if isinstance(s.value, IntImm) else expr_to_str(s.value)}")
    else:
        out.append(f"{pad}<{type(s).__name__}>")


def stmt_to_str(s: Stmt) -> str:
    """Render a statement as indented pseudo code."""
    out: list[str] = []
    _lines(s, 0, out)
    return "\n".join(out)


def func_to_str(f: PrimFunc) -> str:
    """Render a PrimFunc as ``def name(A: Buffer((shape), "dtype"), ...):`` plus its body."""
    params = ", ".join(f'{b.name}: Buffer({tuple(b.shape)}, "{b.dtype}")' for b in f.params)
    out = [f"@prim_func  # {', '.join(f'{k}={v!r}' for k, v in f.attrs.items())}", f"def {f.name}({params}):"]
    _lines(f.body, 1, out)
    return "\n".join(out)


_ = PrimExpr
