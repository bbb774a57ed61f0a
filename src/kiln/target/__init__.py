"""``kiln.target``: compilation targets and the target-kind registry.

>>> from kiln.target import Target
>>> t = Target("llvm -mcpu=znver4 -mattr=+avx2,+fma")
>>> t.kind == "llvm", t.attrs["mcpu"], t.mattr
(True, 'znver4', ['+avx2', '+fma'])

The instruction-set model of a CPU target (vector width, registers, features, caches):

>>> from kiln.target import isa_of
>>> isa_of("llvm -mcpu=haswell").lanes("float32"), isa_of("llvm -mcpu=skylake-avx512").vector_registers
(8, 32)

Built-in kinds: ``c`` (C source compiled by the system compiler) and ``llvm`` (llvmlite).
New kinds: :func:`register_target_kind` plus a codegen registered with
:func:`kiln.codegen.register_codegen`.
"""

from __future__ import annotations

from typing import Any

from .kind import COMMON_OPTIONS, TargetKind, get_target_kind, list_target_kinds, register_target_kind
from .isa import ISA, KNOWN_CPUS, baseline_isa, cpu_isa, host_isa, isa_of, parse_cpuinfo
from .target import Target, host_cpu_features, host_cpu_name


def create(target: Any) -> Target:
    """``Target(target)`` (TVM-style alias)."""
    return Target(target)


__all__ = [
    "Target", "TargetKind", "register_target_kind", "get_target_kind", "list_target_kinds", "COMMON_OPTIONS",
    "host_cpu_name", "host_cpu_features", "create",
    "ISA", "isa_of", "host_isa", "baseline_isa", "cpu_isa", "parse_cpuinfo", "KNOWN_CPUS",
]
