"""``kiln.tir``: the loop IR every code generator consumes, and lowering from ``kiln.te``.

* expressions (:mod:`.expr`): ``Var``, ``IntImm``, ``FloatImm``, ``BinaryOp`` (add, sub, mul,
  div, floordiv, floormod, truncdiv, truncmod, min, max, comparisons, and/or, bit ops),
  ``Not``, ``Cast``, ``Call`` (math intrinsics), ``Select`` (lazy), ``Load`` (BufferLoad);
* statements (:mod:`.stmt`): ``For`` (kinds serial / parallel / vectorized / unrolled),
  ``BufferStore``, ``Allocate``, ``SeqStmt``, ``IfThenElse``, ``LetStmt``, ``Evaluate``;
* ``Buffer(name, shape, dtype)``, ``PrimFunc(name, params, body, attrs)``;
* :func:`lower` (schedule → PrimFunc), :func:`simplify` / :func:`simplify_stmt`,
  :class:`Mutator`, :func:`post_order_visit`, :func:`substitute`.
"""

from __future__ import annotations

from typing import Any, Sequence

from .dtype import SUPPORTED_DTYPES  # noqa: F401
from .expr import (  # noqa: F401
    BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var, cast, const,
    structural_equal,
)
from .functor import Mutator, collect_vars, post_order_visit, substitute  # noqa: F401
from .simplify import Analyzer, simplify, simplify_stmt  # noqa: F401
from .stmt import (  # noqa: F401
    Allocate, Buffer, BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt, seq,
)

BufferLoad = Load


def lower(sch: Any, args: Sequence[Any], name: str = "main", simple_mode: bool = False) -> PrimFunc:
    """Lower a :class:`kiln.te.Schedule` to a :class:`PrimFunc` (see :mod:`kiln.tir.lower`)."""
    from .lower_schedule import lower as _lower  # late import: kiln.te imports this package

    return _lower(sch, args, name, simple_mode)


__all__ = [
    "BinaryOp", "Call", "Cast", "FloatImm", "IntImm", "Load", "BufferLoad", "Not", "PrimExpr", "ProducerLoad",
    "Reduce", "Select", "Var", "cast", "const", "structural_equal", "Mutator", "collect_vars", "post_order_visit",
    "substitute", "Analyzer", "simplify", "simplify_stmt", "Allocate", "Buffer", "BufferStore", "Evaluate", "For",
    "ForKind", "IfThenElse", "LetStmt", "PrimFunc", "SeqStmt", "Stmt", "seq", "lower", "SUPPORTED_DTYPES",
]
