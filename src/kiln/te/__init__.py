"""``kiln.te``: tensor expressions and schedules (TVM-shaped).

Operator authors (``kiln.topi``) describe *what* a kernel computes with
:func:`placeholder` / :func:`compute` and scalar operators, and *how* its loops run with a
:class:`Schedule`; :func:`kiln.tir.lower` turns both into a :class:`kiln.tir.PrimFunc` and
:func:`kiln.codegen.build_module` into a runnable module.

Example
-------
>>> from kiln import te, tir, codegen
>>> A = te.placeholder((n,), name="A")
>>> B = te.compute((n,), lambda i: te.exp(A[i]) + 1.0, name="B")
>>> s = te.create_schedule(B)
>>> f = tir.lower(s, [A, B], name="add_one")
>>> mod = codegen.build_module([f], "llvm")

Module layout (contract for the other layers)
---------------------------------------------
* ``kiln.te``      — this package: tensors, operators, schedules.  Dynamic dimensions:
  ``placeholder(shape, dtype, name, dyn=(n, None))`` with ``n = te.var("n")`` (shape holds
  the upper bounds), ``set_dyn(out, dyn)`` for an output; see :mod:`kiln.te.dynamic`.
* ``kiln.tir``     — loop IR (``PrimFunc``, ``Buffer``, statements), ``lower``, simplifier.
* ``kiln.codegen`` — ``build_module(funcs, target)``; codegens are global functions
  ``target.build.<kind>(funcs, target) -> runtime.Module`` (``c`` and ``llvm`` built in),
  ``register_codegen(kind, fn)``, and the compile cache (``kiln.codegen.cache``).
* ``kiln.target``  — ``Target``, ``register_target_kind``.
"""

from __future__ import annotations

from ..tir.expr import PrimExpr, Var, IntImm, FloatImm, Reduce  # noqa: F401
from .intrin import *  # noqa: F401,F403
from .intrin import __all__ as _intrin_all
from .schedule import Schedule, Stage, create_schedule, inline_injective, thread_axis  # noqa: F401
from . import schedule  # noqa: F401
from .tensor import (  # noqa: F401
    ComputeOp, IterVar, Operation, PlaceholderOp, Tensor, compute, placeholder, reduce_axis, set_dyn,
)


def var(name: str = "v", dtype: str = "int32") -> Var:
    """A free scalar variable: a dynamic dimension (``te.placeholder(..., dyn=(n, None))``) or
    a variable of hand-written loop IR."""
    return Var(name, dtype)


__all__ = [
    "PrimExpr", "Var", "IntImm", "FloatImm", "Reduce", "Schedule", "Stage", "create_schedule", "inline_injective",
    "thread_axis",
    "ComputeOp", "IterVar", "Operation", "PlaceholderOp", "Tensor", "compute", "placeholder", "reduce_axis",
    "set_dyn", "var", *_intrin_all,
]
