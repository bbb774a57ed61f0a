"""``kiln.topi``: a compute definition (tensor expression) and default schedules per IR op.

Registry API (see :mod:`kiln.topi.registry`)
--------------------------------------------
* :func:`register_compute` / :func:`get_compute` / :func:`has_compute` / :func:`list_computes` —
  ``fn(attrs, inputs: list[te.Tensor], out_types: list[TensorType]) -> list[te.Tensor]``.
* :func:`register_schedule` ``(op_name_or_pattern, target_kind="generic")`` —
  ``fn(outs, target) -> te.Schedule``.
* :func:`schedule_group` ``(anchor_op_name, pattern, outs, target)`` — the most specific
  schedule for a fused group (op+kind, op+generic, pattern+kind, pattern+generic).

Every op of :func:`kiln.ir.list_ops` except ``constant`` has a compute; see ``docs/topi.md``.
"""

from __future__ import annotations

from .registry import (
    get_compute, get_prim_kernel, get_schedule, has_compute, list_computes, register_compute, register_prim_kernel,
    register_schedule, schedule_group, target_kind,
)
from . import _builtin  # noqa: F401  (registers the built-in computes and schedules)
from .schedule import schedule_conv2d, schedule_dense, schedule_injective, schedule_matmul, schedule_reduce

__all__ = [
    "register_compute", "get_compute", "has_compute", "list_computes", "register_schedule", "get_schedule",
    "schedule_group", "target_kind", "schedule_injective", "schedule_reduce", "schedule_conv2d",
    "schedule_dense", "schedule_matmul", "register_prim_kernel", "get_prim_kernel",
]
