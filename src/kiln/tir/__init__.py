"""``kiln.tir``: the loop IR every code generator consumes (lowering from ``kiln.te`` lives in te).

* expressions (:mod:`.expr`): ``Var``, ``IntImm``, ``FloatImm``, ``BinaryOp`` (add, sub, mul,
  div, floordiv, floormod, truncdiv, truncmod, min, max, comparisons, and/or, bit ops),
  ``Not``, ``Cast``, ``Call`` (math intrinsics), ``Select`` (lazy), ``Load`` (BufferLoad);
* statement intrinsics (:mod:`.intrin`): :func:`set_extent` (a kernel reports a data-dependent
  output extent);
* statements (:mod:`.stmt`): ``For`` (kinds serial / parallel / vectorized / unrolled),
  ``BufferStore``, ``Allocate``, ``SeqStmt``, ``IfThenElse``, ``LetStmt``, ``Evaluate``;
* ``Buffer(name, shape, dtype)``, ``PrimFunc(name, params, body, attrs)``;
* :func:`lower` (schedule → PrimFunc), :func:`simplify` / :func:`simplify_stmt`,
  :class:`Mutator`, :func:`post_order_visit`, :func:`substitute`.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.errors import CompileError
from .dtype import SUPPORTED_DTYPES  # noqa: F401
from .expr import (  # noqa: F401
    BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var, cast, const,
    structural_equal,
)
from .functor import Mutator, collect_vars, post_order_visit, substitute  # noqa: F401
from .intrin import SET_EXTENT, set_extent  # noqa: F401
from .simplify import Analyzer, simplify, simplify_stmt  # noqa: F401
from .stmt import (  # noqa: F401
    Allocate, Buffer, BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt, seq,
)

BufferLoad = Load


def lower(sch: Any, args: Sequence[Any], name: str = "main", simple_mode: bool = False) -> PrimFunc:
    """Lower a :class:`kiln.te.Schedule` to a :class:`PrimFunc` (TVM's ``tvm.lower`` shape).

    The lowering reads te's stages, so it lives in :mod:`kiln.te.lower_schedule` (te sits above
    tir); it is reached through the schedule's own :meth:`~kiln.te.Schedule.lower`.

    Raises
    ------
    CompileError
        If ``sch`` is not a schedule.
    """
    lower_schedule = getattr(sch, "lower", None)
    if not callable(lower_schedule):
        raise CompileError(f"tir.lower expects a kiln.te.Schedule, got {type(sch).__name__}")
    return lower_schedule(args, name, simple_mode)


__all__ = [
    "BinaryOp", "Call", "Cast", "FloatImm", "IntImm", "Load", "BufferLoad", "Not", "PrimExpr", "ProducerLoad",
    "Reduce", "Select", "Var", "cast", "const", "structural_equal", "Mutator", "collect_vars", "post_order_visit",
    "substitute", "Analyzer", "simplify", "simplify_stmt", "Allocate", "Buffer", "BufferStore", "Evaluate", "For",
    "ForKind", "IfThenElse", "LetStmt", "PrimFunc", "SeqStmt", "Stmt", "seq", "lower", "SUPPORTED_DTYPES",
    "SET_EXTENT", "set_extent",
]
