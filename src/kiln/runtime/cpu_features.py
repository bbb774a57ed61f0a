"""What this CPU can execute, and the check a library's instruction-set requirement gets at load.

A library built for ``-mcpu=native`` (or any CPU with more than the architecture's baseline)
contains instructions an older CPU does not have; running one would kill the process with
``SIGILL``. ``export_library`` therefore writes the features its kernels may use into the
section :data:`ISA_SECTION` (a ``.tar`` records them in its manifest), and ``load_module``
compares them with this machine **before** ``dlopen``: a missing feature raises
:class:`~kiln.runtime.errors.UnsupportedHostError` naming it. The format is in
``docs/library_format.md``.

Features are spelled as LLVM spells them (``avx2``, ``avx512f``, ``neon``, ``v``). Only the
features in :data:`CHECKED` are recorded and checked: those a code generator may emit from
arithmetic code. The host's are read from ``/proc/cpuinfo``; where it cannot be read, or
has no feature line for this architecture (some emulators), the check cannot tell and the
library is loaded as before.

This module owns the ``/proc/cpuinfo`` spelling of features; ``kiln.target.isa`` builds the
compiler's ISA model on top of it. Imports the standard library only.
"""

from __future__ import annotations

import functools
import json
import platform
import re

from .errors import FormatError, UnsupportedHostError

__all__ = [
    "ISA_SECTION", "ISA_SYMBOL", "CHECKED", "machine_arch", "parse_cpuinfo_flags", "host_cpu",
    "encode_requirement", "decode_requirement", "check_requirement",
]

#: ELF section (allocated, read-only) that holds a library's requirement.
ISA_SECTION = ".kiln_isa"
#: Global symbol at the start of :data:`ISA_SECTION`.
ISA_SYMBOL = "__kiln_isa"
_FORMAT = "kiln-isa"
_VERSION = 1

#: ``/proc/cpuinfo`` flag -> LLVM feature name, where the two differ.
CPUINFO_RENAME: dict[str, str] = {
    "pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni",
    "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16", "avx512_vbmi2": "avx512vbmi2",
    "avx512_bitalg": "avx512bitalg", "avx512_vpopcntdq": "avx512vpopcntdq", "bmi1": "bmi", "abm": "lzcnt",
    # Arm
    "asimd": "neon", "asimddp": "dotprod", "asimdhp": "fullfp16",
}

#: Per architecture family, the features a library records and the loader checks: vector and
#: bit-manipulation extensions that LLVM uses on its own from ordinary arithmetic. System
#: features (``xsave``, ``rdrand``, ``aes`` ...) are left out: generated kernels never use them.
CHECKED: dict[str, frozenset[str]] = {
    "x86": frozenset({
        "sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "popcnt", "avx", "avx2", "fma", "f16c",
        "bmi", "bmi2", "lzcnt", "movbe", "fma4", "xop", "avxvnni", "avx512f", "avx512bw", "avx512dq",
        "avx512vl", "avx512cd", "avx512vnni", "avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512ifma",
        "avx512vpopcntdq", "avx512bf16", "avx512fp16",
    }),
    "arm": frozenset({"neon", "dotprod", "fullfp16", "i8mm", "bf16", "sve", "sve2"}),
    "riscv": frozenset({"f", "d", "v"}),
}


def machine_arch(machine: str) -> str:
    """Architecture family (``"x86"``, ``"arm"``, ``"riscv"``, ``"other"``) of a triple's first
    component or of ``platform.machine()``."""
    m = machine.lower()
    if m in ("x86_64", "amd64", "x86-64", "x64") or re.fullmatch(r"i[3-6]86", m):
        return "x86"
    if m.startswith(("aarch64", "arm64", "arm")):
        return "arm"
    if m.startswith("riscv"):
        return "riscv"
    return "other"


def parse_cpuinfo_flags(text: str, machine: str | None = None) -> tuple[str, set[str] | None]:
    """Architecture family and LLVM-spelled features from ``/proc/cpuinfo`` text.

    x86 reads the ``flags`` line, Arm ``Features``, RISC-V ``isa`` (``rv64imafdcv`` → ``f``,
    ``d``, ``v``). Features come back as listed: what they imply is the ISA model's business.

    Returns
    -------
    (str, set of str or None)
        The family, and the features — ``None`` when the text has no line for this family.
    """
    arch = machine_arch(machine if machine is not None else platform.machine())
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if (arch == "x86" and key == "flags") or (arch == "arm" and key == "features"):
            return arch, {CPUINFO_RENAME.get(f, f) for f in value.split()}
        if arch == "riscv" and key == "isa":
            base = value.strip().lower().split("_")[0]  # rv64imafdcv_zicsr_... -> rv64imafdcv
            return arch, {c for c in re.sub(r"^rv\d+", "", base) if c.isalpha()}
    return arch, None


@functools.lru_cache(maxsize=1)
def host_cpu() -> tuple[str, frozenset[str] | None]:
    """This machine's architecture family and features (``None``: cannot be told)."""
    arch = machine_arch(platform.machine())
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return arch, None
    _, feats = parse_cpuinfo_flags(text)
    if feats is None:
        return arch, None
    if arch == "x86":
        feats |= {"sse", "sse2"}  # every x86-64
    elif arch == "arm" and platform.machine().lower().startswith(("aarch64", "arm64")):
        feats.add("neon")  # AArch64 always has Advanced SIMD
    return arch, frozenset(feats)


def encode_requirement(arch: str, features: set[str] | frozenset[str] | list[str]) -> bytes:
    """The bytes of :data:`ISA_SECTION` for code that needs ``features`` on ``arch``.

    Only :data:`CHECKED` features are kept. UTF-8 JSON, sorted, NUL-terminated.
    """
    keep = sorted(set(features) & CHECKED.get(arch, frozenset()))
    doc = {"format": _FORMAT, "version": _VERSION, "arch": arch, "features": keep}
    return json.dumps(doc, sort_keys=True).encode("utf-8") + b"\0"


def decode_requirement(data: bytes, where: str) -> tuple[str, list[str]]:
    """``(arch, features)`` from :data:`ISA_SECTION` bytes (or a manifest's ``isa`` entry as JSON).

    Raises
    ------
    FormatError
        If the bytes are not a requirement this version understands.
    """
    try:
        doc = json.loads(bytes(data).rstrip(b"\0").decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"{where}: section {ISA_SECTION} is not valid UTF-8 JSON") from None
    return requirement_from_dict(doc, where)


def requirement_from_dict(doc: object, where: str) -> tuple[str, list[str]]:
    """Validate a decoded requirement (see :func:`decode_requirement`)."""
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise FormatError(f"{where}: ISA requirement is not a {_FORMAT!r} record")
    if doc.get("version") != _VERSION:
        raise FormatError(f"{where}: ISA requirement version {doc.get('version')!r} is not supported "
                          f"(this Kiln reads version {_VERSION}); load it with a newer Kiln")
    arch, feats = doc.get("arch"), doc.get("features")
    if not isinstance(arch, str) or not isinstance(feats, list) or not all(isinstance(f, str) for f in feats):
        raise FormatError(f"{where}: ISA requirement needs a string 'arch' and a list of string 'features'")
    return arch, feats


def check_requirement(arch: str, features: list[str], where: str) -> None:
    """Raise unless this machine can run code that needs ``features`` on ``arch``.

    Raises
    ------
    UnsupportedHostError
        If the architecture differs, or a recorded feature is missing here.
    """
    host_arch, host = host_cpu()
    if arch != host_arch:
        raise UnsupportedHostError(f"{where}: built for the {arch} architecture; this machine is {host_arch} "
                                   f"({platform.machine()})")
    if host is None:
        return  # nothing to compare with: as before the check existed
    missing = [f for f in features if f not in host]
    if missing:
        raise UnsupportedHostError(
            f"{where}: built for CPU features this machine lacks: {', '.join(missing)} "
            f"(it needs {', '.join(features)}). Rebuild it for this machine (e.g. target \"llvm -mcpu=native\") "
            "or for a CPU that every machine you deploy to has (e.g. \"llvm -mcpu=x86-64-v3\")."
        )
