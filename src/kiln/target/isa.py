"""The instruction-set model of a CPU target: the one place that says how wide a vector is.

Owns :class:`ISA` (vector width, register count, features, cache sizes, FMA timing) and
:func:`isa_of`, which derives it from a target's ``-mtriple`` / ``-mcpu`` / ``-mattr`` — or
from the machine itself for ``-mcpu=native`` and for a ``c`` target without ``-mcpu`` /
``-mtriple`` (the C compiler is then run with ``-march=native``).  The code generators
(:func:`kiln.codegen.c.target_vector_bytes`) and the CPU schedules
(:mod:`kiln.topi.schedule.x86`) both ask it, so a kernel is tiled for the registers the
emitted code actually has.

What the default means (no ``-mcpu``):

* ``llvm``: LLVM's generic CPU of the triple — for x86-64 the SSE2 baseline (16 ``xmm``
  registers of 16 bytes, no FMA).  This is what LLVM emits for ``cpu=""`` and it is what
  ``str(Target("llvm"))`` — the compile-cache key — promises: an object built for it runs on
  any x86-64.  Ask for ``-mcpu=native`` for speed.
* ``c``: this machine (``-march=native`` is what :func:`kiln.codegen.c_module.c_compile_options`
  passes), unless ``-mtriple`` names another machine, which gives that triple's baseline.

The host is read from ``/proc/cpuinfo`` and ``/sys/devices/system/cpu/cpu0/cache`` (never
``cpuid`` nor llvmlite: this module sits in the ``target`` layer, below every compiler);
when they cannot be read the host's architecture baseline is used.

Must never import: llvmlite, ``kiln.codegen``, ``kiln.topi`` or anything above ``target``
(``tests/test_layers.py``).
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from ..runtime.cpu_features import machine_arch, parse_cpuinfo_flags
from ..runtime.errors import TargetError

__all__ = ["ISA", "isa_of", "host_isa", "baseline_isa", "cpu_isa", "parse_cpuinfo", "KNOWN_CPUS"]

KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class ISA:
    """A CPU's vector instruction set, as far as tiling and vector code need it.

    Parameters
    ----------
    arch : str
        Architecture family: ``"x86"``, ``"arm"``, ``"riscv"`` or ``"other"``.
    cpu : str
        The CPU it describes (an LLVM CPU name, ``"generic"`` or ``"native"``).
    vector_bytes : int
        Width of one vector register in bytes (16 SSE / NEON, 32 AVX, 64 AVX-512); 0 for a
        scalar-only ISA (RISC-V without V), which :meth:`lanes` treats as one lane.
    vector_registers : int
        Architectural registers that hold one vector (16 ``xmm``/``ymm``, 32 with AVX-512 —
        EVEX encodes 32 at every width —, 32 NEON ``v`` registers, 32 RVV ``v`` registers); for
        a scalar ISA the floating-point registers (32 on RISC-V ``F``/``D``).
    features : frozenset of str
        Enabled features in LLVM's spelling without the sign (``"avx2"``, ``"avx512f"``,
        ``"neon"``, ``"v"`` ...), closed under implication (``avx512f`` ⇒ ``avx2`` ⇒ ``avx``).
    l1d_bytes, l2_bytes : int
        Level-1 data cache and level-2 cache *per core*.
    fma_latency : int
        Cycles from an FMA's inputs to its result (a dependent FMA waits this long).
    fma_per_cycle : int
        Full-width vector FMAs a core can start per cycle.  Without an FMA instruction (x86
        below ``fma``) both figures are the core's and stand for the multiply + add pair that
        replaces it; the pair's true latency is a few cycles longer.
    origin : str
        Where the figures come from: ``"table"`` (the CPU table below: vendor optimisation
        manuals, not measured by Kiln), ``"host"`` (``/proc/cpuinfo`` and sysfs of this
        machine), ``"baseline"`` (the architecture's generic CPU; cache and FMA figures are
        assumptions).  ``-mattr`` changes the features, never the origin.

    Notes
    -----
    Equal inputs give equal (and hashable) models, so schedules may key caches on them.
    """

    arch: str
    cpu: str
    vector_bytes: int
    vector_registers: int
    features: frozenset[str] = field(default_factory=frozenset)
    l1d_bytes: int = 32 * KiB
    l2_bytes: int = 256 * KiB
    fma_latency: int = 4
    fma_per_cycle: int = 2
    origin: str = "baseline"

    # ------------------------------------------------------------------ derived
    def lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector register (1 on a scalar ISA).

        Parameters
        ----------
        dtype : str
            ``"float32"``, ``"int8"``, ``"float16"``, ``"bool"`` ... (the number is the width).
        """
        bits = _dtype_bits(dtype)
        return max(1, self.vector_bytes * 8 // bits)

    def has(self, feature: str) -> bool:
        """Whether ``feature`` (LLVM spelling, with or without a leading ``+``) is enabled."""
        return feature.lstrip("+") in self.features

    @property
    def fma(self) -> bool:
        """Fused multiply-add on vectors (x86 FMA3, always on AArch64 NEON, RVV ``vfmacc``)."""
        if self.arch == "x86":
            return "fma" in self.features
        if self.arch == "arm":
            return "neon" in self.features
        return "v" in self.features or "d" in self.features or "f" in self.features

    @property
    def avx2(self) -> bool:
        """x86 AVX2 (256-bit integer and float vectors)."""
        return "avx2" in self.features

    @property
    def avx512f(self) -> bool:
        """x86 AVX-512 Foundation (512-bit ``zmm`` registers, 32 of them)."""
        return "avx512f" in self.features

    @property
    def avx512bw(self) -> bool:
        """AVX-512 byte and word instructions (8/16-bit integer lanes)."""
        return "avx512bw" in self.features

    @property
    def avx512dq(self) -> bool:
        """AVX-512 doubleword and quadword instructions."""
        return "avx512dq" in self.features

    @property
    def avx512vl(self) -> bool:
        """AVX-512 at 128/256-bit widths (EVEX ``xmm``/``ymm``, masks, 32 registers)."""
        return "avx512vl" in self.features

    @property
    def vnni(self) -> bool:
        """int8 dot products: AVX512-VNNI or AVX-VNNI on x86, ``dotprod`` on Arm."""
        return bool({"avx512vnni", "avxvnni", "dotprod"} & self.features)

    @property
    def neon(self) -> bool:
        """Arm Advanced SIMD (32 × 128-bit registers on AArch64)."""
        return "neon" in self.features

    @property
    def rvv(self) -> bool:
        """RISC-V vector extension.  A placeholder: VLEN is implementation-defined; the model
        assumes the 128 bits every ``V`` implementation guarantees (``Zvl128b``)."""
        return "v" in self.features

    @property
    def min_accumulators(self) -> int:
        """Independent accumulators that keep the FMA units busy: latency × throughput.

        A register tile with fewer accumulators stalls on its own dependency chains (Haswell:
        5 cycles × 2 per cycle = 10; Zen 3: 4 × 2 = 8).
        """
        return max(1, self.fma_latency * self.fma_per_cycle)

    def describe(self) -> str:
        """One line for logs and the CLI: ``x86 znver3: 32-byte vectors × 16 registers ...``."""
        feats = ",".join(sorted(f for f in self.features if f in _SHOWN))
        return (f"{self.arch} {self.cpu}: {self.vector_bytes}-byte vectors x {self.vector_registers} registers, "
                f"{self.lanes('float32')} float32 lanes, FMA {self.fma_latency} cycles x {self.fma_per_cycle}/cycle, "
                f"L1d {self.l1d_bytes // KiB} KiB, L2 {self.l2_bytes // KiB} KiB [{feats}] ({self.origin})")


_SHOWN = frozenset({"sse2", "sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                    "avx512vnni", "avxvnni", "avx512bf16", "avx512fp16", "neon", "dotprod", "fullfp16", "i8mm",
                    "sve", "sve2", "v", "f", "d"})


def _dtype_bits(dtype: str) -> int:
    # kiln.tir.dtype owns the dtype table but sits above this layer; a dtype's width is
    # the number in its name (float32, int8, bfloat16), bool is one byte.
    if dtype == "bool":
        return 8
    m = re.fullmatch(r"[a-z]+?(\d+)(?:x\d+)?", dtype)
    if m is None:
        raise TargetError(f"ISA.lanes: cannot tell the width of dtype {dtype!r}")
    return max(8, int(m.group(1)))


# ---------------------------------------------------------------------------- features
#: x86 feature -> the features it directly implies (LLVM's X86.td, vector subset).  Adding a
#: feature adds its closure; removing one removes everything that implies it, as LLVM does
#: (``-mattr=-avx2`` also drops AVX-512 and FMA-dependent AVX-512 features).
_X86_IMPLIES: dict[str, tuple[str, ...]] = {
    "sse": (), "sse2": ("sse",), "sse3": ("sse2",), "ssse3": ("sse3",), "sse4.1": ("ssse3",),
    "sse4.2": ("sse4.1",), "sse4a": ("sse3",), "avx": ("sse4.2",), "avx2": ("avx",), "fma": ("avx",),
    "f16c": ("avx",), "avxvnni": ("avx2",),
    "avx512f": ("avx2", "fma", "f16c"), "avx512bw": ("avx512f",), "avx512dq": ("avx512f",),
    "avx512vl": ("avx512f",), "avx512cd": ("avx512f",), "avx512vnni": ("avx512f",),
    "avx512vbmi": ("avx512bw",), "avx512vbmi2": ("avx512bw",), "avx512bitalg": ("avx512bw",),
    "avx512ifma": ("avx512f",), "avx512vpopcntdq": ("avx512f",), "avx512bf16": ("avx512bw",),
    "avx512fp16": ("avx512bw", "avx512dq", "avx512vl"),
    "avx10.1": ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512vnni", "avx512bf16",
                "avx512fp16", "avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512ifma", "avx512vpopcntdq"),
}
_ARM_IMPLIES: dict[str, tuple[str, ...]] = {
    "neon": ("fp-armv8",), "dotprod": ("neon",), "fullfp16": ("fp-armv8",), "i8mm": ("neon",),
    "bf16": ("neon",), "sve": ("fullfp16", "neon"), "sve2": ("sve",),
}
_RISCV_IMPLIES: dict[str, tuple[str, ...]] = {"d": ("f",), "v": ("d",), "zvfh": ("v",)}
_IMPLIES = {"x86": _X86_IMPLIES, "arm": _ARM_IMPLIES, "riscv": _RISCV_IMPLIES}


def _closure(feats: Iterable[str], implies: Mapping[str, tuple[str, ...]]) -> set[str]:
    out: set[str] = set()
    todo = list(feats)
    while todo:
        f = todo.pop()
        if f not in out:
            out.add(f)
            todo.extend(implies.get(f, ()))
    return out


def _apply_mattr(arch: str, feats: set[str], mattr: Iterable[str]) -> set[str]:
    """``feats`` after ``+f`` / ``-f`` / bare ``f`` entries, in order (as LLVM applies them)."""
    implies = _IMPLIES.get(arch, {})
    out = set(feats)
    for raw in mattr:
        item = str(raw).strip()
        if not item:
            continue
        name = item.lstrip("+-")
        if item.startswith("-"):
            out = {f for f in out if name not in _closure((f,), implies)}
        else:
            out |= _closure((name,), implies)
    return out


# ---------------------------------------------------------------------------- CPU table
# Figures per core from the vendors' optimisation manuals and public instruction tables
# (Agner Fog, uops.info); none were measured by Kiln except where a doc says so.  They only
# steer tile choice: a wrong cache size costs speed, never correctness.
_SSE2 = ("sse2",)
_V2 = ("sse4.2", "popcnt")
_AVX = _V2 + ("avx",)
# psABI x86-64-v3 (and every Haswell / Zen core): AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE on top of v2
_V3 = _V2 + ("avx2", "fma", "f16c", "bmi", "bmi2", "lzcnt", "movbe")
_SKX = _V3 + ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")
_CLX = _SKX + ("avx512vnni",)
_ICX = _CLX + ("avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512ifma", "avx512vpopcntdq")
_SPR = _ICX + ("avx512bf16", "avx512fp16", "avxvnni")
_ZEN4 = _ICX + ("avx512bf16",)
_A64 = ("neon",)
_A64_DOT = ("neon", "dotprod", "fullfp16")

#: name -> (arch, features, L1d bytes, L2 bytes, FMA latency, full-width FMAs per cycle)
_CPU_TABLE: dict[str, tuple[str, tuple[str, ...], int, int, int, int]] = {
    # x86 psABI levels (LLVM CPU names); caches are those of a typical core of the level
    "x86-64": ("x86", _SSE2, 32 * KiB, 256 * KiB, 4, 2),
    "x86-64-v2": ("x86", _V2, 32 * KiB, 256 * KiB, 4, 2),
    "x86-64-v3": ("x86", _V3, 32 * KiB, 256 * KiB, 4, 2),
    "x86-64-v4": ("x86", _SKX, 32 * KiB, 1 * MiB, 4, 2),
    "nehalem": ("x86", _V2, 32 * KiB, 256 * KiB, 5, 2),
    "sandybridge": ("x86", _AVX, 32 * KiB, 256 * KiB, 5, 2),
    "ivybridge": ("x86", _AVX + ("f16c",), 32 * KiB, 256 * KiB, 5, 2),
    "haswell": ("x86", _V3, 32 * KiB, 256 * KiB, 5, 2),
    "broadwell": ("x86", _V3, 32 * KiB, 256 * KiB, 5, 2),
    "skylake": ("x86", _V3, 32 * KiB, 256 * KiB, 4, 2),
    "alderlake": ("x86", _V3 + ("avxvnni",), 48 * KiB, 1280 * KiB, 4, 2),
    "raptorlake": ("x86", _V3 + ("avxvnni",), 48 * KiB, 2 * MiB, 4, 2),
    # Xeon Scalable Gold/Platinum have two 512-bit FMA units (Silver/Bronze one)
    "skylake-avx512": ("x86", _SKX, 32 * KiB, 1 * MiB, 4, 2),
    "cascadelake": ("x86", _CLX, 32 * KiB, 1 * MiB, 4, 2),
    "cooperlake": ("x86", _CLX + ("avx512bf16",), 32 * KiB, 1 * MiB, 4, 2),
    "cannonlake": ("x86", _SKX + ("avx512vbmi", "avx512ifma"), 32 * KiB, 256 * KiB, 4, 1),
    "icelake-client": ("x86", _ICX, 48 * KiB, 512 * KiB, 4, 1),
    "icelake-server": ("x86", _ICX, 48 * KiB, 1280 * KiB, 4, 2),
    "tigerlake": ("x86", _ICX, 48 * KiB, 1280 * KiB, 4, 1),
    "sapphirerapids": ("x86", _SPR, 48 * KiB, 2 * MiB, 4, 2),
    "emeraldrapids": ("x86", _SPR, 48 * KiB, 2 * MiB, 4, 2),
    "graniterapids": ("x86", _SPR, 48 * KiB, 2 * MiB, 4, 2),
    "knl": ("x86", ("avx512f", "avx512cd"), 32 * KiB, 512 * KiB, 6, 2),
    "btver2": ("x86", _AVX + ("f16c",), 32 * KiB, 512 * KiB, 5, 1),
    "bdver2": ("x86", _AVX + ("fma", "f16c"), 16 * KiB, 1 * MiB, 6, 1),
    # Zen 1/2: 128/256-bit FMA pipes; Zen 4 runs a zmm FMA as two 256-bit halves (1 zmm/cycle)
    "znver1": ("x86", _V3, 32 * KiB, 512 * KiB, 5, 1),
    "znver2": ("x86", _V3, 32 * KiB, 512 * KiB, 5, 2),
    "znver3": ("x86", _V3, 32 * KiB, 512 * KiB, 4, 2),
    "znver4": ("x86", _ZEN4, 32 * KiB, 1 * MiB, 4, 1),
    "znver5": ("x86", _ZEN4 + ("avxvnni", "avx512vp2intersect"), 48 * KiB, 1 * MiB, 4, 2),
    # AArch64 (L2 per core, or the cluster's share where it is shared)
    "generic-arm": ("arm", _A64, 32 * KiB, 256 * KiB, 4, 2),
    "cortex-a53": ("arm", _A64, 32 * KiB, 256 * KiB, 8, 1),
    "cortex-a55": ("arm", _A64_DOT, 32 * KiB, 256 * KiB, 8, 1),
    "cortex-a57": ("arm", _A64, 32 * KiB, 512 * KiB, 7, 1),
    "cortex-a72": ("arm", _A64, 32 * KiB, 512 * KiB, 7, 1),
    "cortex-a73": ("arm", _A64, 32 * KiB, 512 * KiB, 7, 1),
    "cortex-a75": ("arm", _A64_DOT, 64 * KiB, 256 * KiB, 5, 2),
    "cortex-a76": ("arm", _A64_DOT, 64 * KiB, 512 * KiB, 4, 2),
    "cortex-a78": ("arm", _A64_DOT, 64 * KiB, 512 * KiB, 4, 2),
    "cortex-x1": ("arm", _A64_DOT, 64 * KiB, 1 * MiB, 4, 4),
    "neoverse-n1": ("arm", _A64_DOT, 64 * KiB, 1 * MiB, 4, 2),
    "neoverse-n2": ("arm", _A64_DOT + ("i8mm", "bf16", "sve2"), 64 * KiB, 1 * MiB, 4, 2),
    "neoverse-v1": ("arm", _A64_DOT + ("i8mm", "bf16", "sve"), 64 * KiB, 1 * MiB, 4, 4),
    "neoverse-v2": ("arm", _A64_DOT + ("i8mm", "bf16", "sve2"), 64 * KiB, 2 * MiB, 4, 4),
    "apple-m1": ("arm", _A64_DOT, 128 * KiB, 3 * MiB, 4, 4),
    "apple-m2": ("arm", _A64_DOT + ("i8mm", "bf16"), 128 * KiB, 4 * MiB, 4, 4),
    # RISC-V: placeholders (no RVV implementation was available to measure)
    "generic-rv64": ("riscv", ("f", "d"), 32 * KiB, 256 * KiB, 4, 1),
    "sifive-u74": ("riscv", ("f", "d"), 32 * KiB, 512 * KiB, 5, 1),
    "sifive-x280": ("riscv", ("f", "d", "v", "zvfh"), 32 * KiB, 256 * KiB, 4, 1),
    "spacemit-x60": ("riscv", ("f", "d", "v"), 32 * KiB, 256 * KiB, 5, 1),
}
#: CPU names ``isa_of`` knows; any other ``-mcpu`` gets its triple's baseline plus ``-mattr``.
KNOWN_CPUS: tuple[str, ...] = tuple(sorted(_CPU_TABLE))

#: The generic CPU of each architecture: what LLVM targets for ``cpu=""``.
_BASELINE = {"x86": "x86-64", "arm": "generic-arm", "riscv": "generic-rv64"}


_arch_of_machine = machine_arch  # one spelling of "which family is this machine": the runtime's


def _shape(arch: str, feats: set[str]) -> tuple[int, int]:
    """(vector bytes, vector registers) that ``feats`` give on ``arch``."""
    if arch == "x86":
        if "avx512f" in feats:
            return 64, 32
        if "avx" in feats:
            return 32, 16
        if "sse" in feats or "sse2" in feats:
            return 16, 16
        return 0, 8  # x87 only: no SIMD at all
    if arch == "arm":
        return (16, 32) if "neon" in feats else (0, 32)
    if arch == "riscv":
        # RVV: 32 registers of VLEN bits; VLEN >= 128 is all the V extension promises
        return (16, 32) if "v" in feats else (0, 32)
    return 0, 16


def _make(arch: str, cpu: str, feats: set[str], l1d: int, l2: int, lat: int, tput: int, origin: str) -> ISA:
    vb, regs = _shape(arch, feats)
    return ISA(arch, cpu, vb, regs, frozenset(feats), l1d, l2, lat, tput, origin)


def cpu_isa(cpu: str, mattr: Iterable[str] = ()) -> ISA:
    """The model of a named CPU (``"haswell"``, ``"cortex-a72"`` ...) with ``mattr`` applied.

    Raises
    ------
    TargetError
        If the CPU is not in :data:`KNOWN_CPUS`.
    """
    row = _CPU_TABLE.get(cpu)
    if row is None:
        raise TargetError(f"no ISA model for CPU {cpu!r}; known: {', '.join(KNOWN_CPUS)}")
    arch, feats, l1d, l2, lat, tput = row
    have = _apply_mattr(arch, _closure(feats, _IMPLIES.get(arch, {})), mattr)
    return _make(arch, cpu, have, l1d, l2, lat, tput, "table")


def baseline_isa(arch: str, mattr: Iterable[str] = ()) -> ISA:
    """The generic CPU of an architecture family (what LLVM emits for no ``-mcpu``).

    x86: SSE2 (x86-64 baseline); arm: AArch64 NEON (mandatory in ARMv8-A); riscv: RV64GC,
    scalar (``+v`` in ``mattr`` adds RVV); other: scalar.
    """
    name = _BASELINE.get(arch)
    if name is None:
        return _make(arch, "generic", _apply_mattr(arch, set(), mattr), 32 * KiB, 256 * KiB, 4, 1, "baseline")
    return replace(cpu_isa(name, mattr), origin="baseline")


# ---------------------------------------------------------------------------- host
def parse_cpuinfo(text: str, machine: str | None = None) -> tuple[str, set[str]]:
    """Architecture family and LLVM-spelled features from ``/proc/cpuinfo`` text.

    x86 reads the ``flags`` line, Arm the ``Features`` line, RISC-V the ``isa`` line
    (``rv64imafdcv`` → ``f``, ``d``, ``v``), as :func:`kiln.runtime.cpu_features.parse_cpuinfo_flags`
    does; the features are then closed under implication.  Flags with no vector meaning are
    kept as they are (harmless: nothing asks for them).

    Parameters
    ----------
    text : str
        The file's contents.
    machine : str, optional
        ``platform.machine()`` of the machine it came from (default: this one).
    """
    arch, feats = parse_cpuinfo_flags(text, machine)
    return arch, _closure(feats or (), _IMPLIES.get(arch, {}))


def _sysfs_caches(root: str) -> tuple[int, int]:
    """(L1d, L2) bytes of cpu0 from sysfs ``cache/index*``; 0 where unknown."""
    l1d = l2 = 0
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return 0, 0
    for ent in entries:
        if not ent.startswith("index"):
            continue
        try:
            with open(os.path.join(root, ent, "level"), encoding="ascii") as f:
                level = int(f.read().strip())
            with open(os.path.join(root, ent, "type"), encoding="ascii") as f:
                typ = f.read().strip()
            with open(os.path.join(root, ent, "size"), encoding="ascii") as f:
                size = _parse_size(f.read().strip())
        except (OSError, ValueError):
            continue
        if level == 1 and typ in ("Data", "Unified"):
            l1d = size
        elif level == 2 and typ in ("Data", "Unified"):
            l2 = size
    return l1d, l2


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.upper())
    if m is None:
        raise ValueError(text)
    return int(m.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": 1024 * MiB}[m.group(2)]


def _host_from(cpuinfo: str | None, machine: str, caches: tuple[int, int]) -> ISA:
    """The host model from already-read inputs (``cpuinfo`` None: unreadable)."""
    arch = _arch_of_machine(machine)
    base = baseline_isa(arch)
    if cpuinfo is None:
        return base  # safe default: the architecture's baseline runs everywhere
    _, feats = parse_cpuinfo(cpuinfo, machine)
    if arch == "arm" and machine.lower().startswith(("aarch64", "arm64")):
        feats |= _closure(("neon",), _ARM_IMPLIES)  # AArch64 always has Advanced SIMD
    if arch == "x86":
        feats |= _closure(("sse2",), _X86_IMPLIES)  # every x86-64
    l1d, l2 = caches
    return _make(arch, "native", feats, l1d or base.l1d_bytes, l2 or base.l2_bytes,
                 base.fma_latency, base.fma_per_cycle, "host")


@functools.lru_cache(maxsize=1)
def host_isa() -> ISA:
    """This machine's model, from ``/proc/cpuinfo`` and sysfs (the baseline if unreadable).

    The CPU is not named (that needs LLVM's host detection, which lives above this layer), so
    FMA timing is the architecture's generic figure; features and caches are the machine's.
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text: str | None = f.read()
    except OSError:
        text = None
    return _host_from(text, platform.machine(), _sysfs_caches("/sys/devices/system/cpu/cpu0/cache"))


# ---------------------------------------------------------------------------- targets
def isa_of(target: Any) -> ISA:
    """The instruction-set model of a CPU target (memoised per canonical target string).

    Rules, in order:

    1. ``-mcpu=native`` (a ``c`` target keeps it), or a ``c`` target with neither ``-mcpu`` nor
       ``-mtriple``: :func:`host_isa`.
    2. A ``-mcpu`` in :data:`KNOWN_CPUS`: its table row.
    3. Otherwise (no ``-mcpu``, ``generic``, or a CPU the table lacks): the baseline of the
       architecture of ``-mtriple`` (default: this machine's) — for ``llvm`` without ``-mcpu``
       that is exactly what LLVM emits (SSE2 on x86-64).

    ``-mattr`` is then applied in order: ``+f`` adds ``f`` and what it implies, ``-f`` removes
    ``f`` and everything that implies it.  ``llvm -mcpu=native`` reaches rule 2 with the full
    host feature list in ``-mattr`` (the target resolves ``native`` when it is built), so a VM
    that hides AVX-512 from a ``znver4`` guest gets a 32-byte model.

    Parameters
    ----------
    target : Target, str or dict
        A target of a CPU kind (device type 1).

    Returns
    -------
    ISA

    Raises
    ------
    TargetError
        For a device (GPU) target; its host code has a CPU target of its own.
    """
    from .target import Target  # target.py imports this module for Target.isa

    t = target if isinstance(target, Target) else Target(target)
    return _isa_of_cached(t)


@functools.lru_cache(maxsize=256)
def _isa_of_cached(t: Any) -> ISA:
    # keyed by the Target (hash and equality are its canonical string)
    if t.kind.device_type != 1:
        raise TargetError(f"target {t} is a device target (kind {t.kind.name!r}); it has no CPU ISA, "
                          f"ask for the ISA of its host target")
    attrs = t.attrs
    mcpu = str(attrs.get("mcpu") or "")
    mattr = [str(f) for f in (attrs.get("mattr") or [])]
    triple = str(attrs.get("mtriple") or "")
    if mcpu == "native" or (not mcpu and not triple and t.kind.name == "c"):
        host = host_isa()
        if not mattr:
            return host
        feats = _apply_mattr(host.arch, set(host.features), mattr)
        return _make(host.arch, host.cpu, feats, host.l1d_bytes, host.l2_bytes, host.fma_latency,
                     host.fma_per_cycle, host.origin)
    arch = _arch_of_machine(triple.split("-")[0]) if triple else _arch_of_machine(platform.machine())
    if mcpu in _CPU_TABLE and _CPU_TABLE[mcpu][0] == arch:
        return cpu_isa(mcpu, mattr)
    return baseline_isa(arch, mattr)

