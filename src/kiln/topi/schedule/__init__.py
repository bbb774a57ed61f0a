"""Schedules: target-independent defaults (:mod:`.generic`) and CPU anchor schedules (:mod:`.x86`)."""

from __future__ import annotations

from .generic import schedule_injective, schedule_reduce
from .x86 import schedule_dense, schedule_matmul
from .x86_conv import schedule_conv2d
from . import x86_resize  # noqa: F401  (registers the resize2d schedule)
from . import x86_winograd  # noqa: F401  (registers the Winograd transform schedules)

__all__ = ["schedule_injective", "schedule_reduce", "schedule_conv2d", "schedule_dense", "schedule_matmul"]
