"""``kiln.target``: compilation targets and the target-kind registry.

>>> from kiln.target import Target
>>> t = Target("llvm -mcpu=znver4 -mattr=+avx2,+fma")
>>> t.kind == "llvm", t.attrs["mcpu"], t.mattr
(True, 'znver4', ['+avx2', '+fma'])

Built-in kinds: ``c`` (C source compiled by the system compiler) and ``llvm`` (llvmlite).
New kinds: :func:`register_target_kind` plus a codegen registered with
:func:`kiln.codegen.register_codegen`.
"""

from __future__ import annotations

from typing import Any

from .kind import COMMON_OPTIONS, TargetKind, get_target_kind, list_target_kinds, register_target_kind
from .target import Target, host_cpu_features, host_cpu_name


def create(target: Any) -> Target:
    """``Target(target)`` (TVM-style alias)."""
    return Target(target)


__all__ = [
    "Target", "TargetKind", "register_target_kind", "get_target_kind", "list_target_kinds", "COMMON_OPTIONS",
    "host_cpu_name", "host_cpu_features", "create",
]
