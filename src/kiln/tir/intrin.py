"""``kiln.*`` statement intrinsics a hand-written loop-IR kernel calls for its effect.

Owns :data:`SET_EXTENT` (a kernel reporting a data-dependent output extent) and its helpers.
Imports only the loop IR's expressions and statements; never a code generator.
"""

from __future__ import annotations

from typing import Any

from ..runtime.errors import CompileError
from .expr import Call, IntImm, PrimExpr, cast, convert
from .functor import post_order_visit
from .stmt import Evaluate, PrimFunc, Stmt

__all__ = ["SET_EXTENT", "set_extent", "set_extent_targets"]

#: ``Evaluate(Call("int32", SET_EXTENT, [IntImm(param), IntImm(dim), value]))``: write ``value``
#: into ``shape[dim]`` of the DLTensor of parameter ``param`` (``PrimFunc.params`` order, an
#: output). This is how a kernel reports a data-dependent dim it decides (NonZero's count): the
#: executor reads the extent from that output after the kernel ran
#: (``kiln.runtime.dynamic_shapes``). CPU code generators only; GPU ones reject it.
SET_EXTENT = "kiln.set_extent"


def set_extent(param_index: int, dim: int, value: Any) -> Stmt:
    """The statement reporting ``value`` as the runtime extent of ``dim`` of parameter ``param_index``.

    Parameters
    ----------
    param_index : int
        Index of the output buffer in the kernel's ``PrimFunc.params``.
    dim : int
        The dimension whose extent the kernel decided.
    value : PrimExpr or int
        The extent (any integer type; stored as int64). It must lie in ``[0, shape[dim]]``: the
        executor checks the declared range after the kernel.

    Returns
    -------
    Stmt
        An :class:`~kiln.tir.Evaluate` of the :data:`SET_EXTENT` intrinsic.
    """
    if int(param_index) < 0 or int(dim) < 0:
        raise CompileError(f"set_extent: parameter index {param_index} and dim {dim} must be >= 0")
    v: PrimExpr = convert(value)
    if v.dtype not in ("int32", "int64"):
        v = cast(v, "int64")
    return Evaluate(Call("int32", SET_EXTENT, [IntImm(int(param_index)), IntImm(int(dim)), v]))


def set_extent_targets(f: PrimFunc) -> list[tuple[int, int]]:
    """``(param index, dim)`` of every :data:`SET_EXTENT` in ``f``, checked against its params.

    Raises
    ------
    CompileError
        A parameter index or dim out of range, or a non-constant one.
    """
    found: list[tuple[int, int]] = []
    name = f.attrs.get("global_symbol", f.name)

    def visit(n: Any) -> None:
        if not (isinstance(n, Call) and n.op == SET_EXTENT):
            return
        p, d = n.args[0], n.args[1]
        if not (isinstance(p, IntImm) and isinstance(d, IntImm)):
            raise CompileError(f"{name}: {SET_EXTENT} needs a constant parameter index and dim")
        if not 0 <= p.value < len(f.params) or not 0 <= d.value < f.params[p.value].ndim:
            raise CompileError(f"{name}: {SET_EXTENT} of parameter {p.value} dim {d.value}: no such "
                               f"parameter dim ({len(f.params)} parameters)")
        if (p.value, d.value) not in found:
            found.append((p.value, d.value))

    post_order_visit(f.body, visit)
    return found
