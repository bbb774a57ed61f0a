"""Compile CUDA C to PTX with NVRTC (or ``nvcc``): the compile side of the ``cuda`` target.

NVRTC (``libnvrtc.so``) is NVIDIA's runtime compilation library. Kiln calls it through ctypes,
so no CUDA toolkit is needed to *build* for CUDA: the PyPI wheel ``nvidia-cuda-nvrtc-cu12``
(``pip install "kiln[cuda]"``) ships it. Search order of :func:`find_nvrtc`:

1. ``$KILN_NVRTC_LIBRARY`` (a path);
2. the ``nvidia-cuda-nvrtc-cu12`` (or ``-cu11``) wheel: ``nvidia/cuda_nvrtc/lib/libnvrtc.so.*``;
3. a CUDA toolkit: ``$CUDA_HOME`` / ``$CUDA_PATH`` / ``/usr/local/cuda`` ``lib64``;
4. the dynamic loader's search path (``libnvrtc.so.12``, ``libnvrtc.so.11.2``, ``libnvrtc.so``).

When no NVRTC is found, :func:`compile_cuda` falls back to ``nvcc --ptx`` if ``nvcc`` is on the
``PATH``; with neither it raises :class:`~kiln.runtime.errors.CompileError` saying what to install.
A GPU is never needed to compile.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Sequence

from ..runtime.errors import CompileError

__all__ = ["compile_cuda", "compile_cuda_cubin", "find_nvrtc", "nvrtc_version", "arch_to_compute", "NVRTCNotFoundError",
           "DEFAULT_ARCH", "ptx_entries"]

#: Architecture compiled for when the target gives none (Ampere; PTX JITs forward to newer GPUs).
DEFAULT_ARCH = "sm_80"

_INSTALL_HINT = ('install NVRTC with `pip install nvidia-cuda-nvrtc-cu12` (or `pip install "kiln[cuda]"`), '
                 "or a CUDA toolkit (then set CUDA_HOME, or put nvcc on PATH); or set KILN_NVRTC_LIBRARY to "
                 "the path of libnvrtc.so")


class NVRTCNotFoundError(CompileError):
    """Neither NVRTC nor ``nvcc`` is available to compile CUDA code."""


def _wheel_candidates() -> list[str]:
    out: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        for pat in ("cuda_nvrtc/lib/libnvrtc.so.*", "cu13/lib/libnvrtc.so.*", "cuda_nvrtc/bin/nvrtc64_*.dll"):
            # libnvrtc.alt.so.* is the variant without the builtins' static linkage; prefer the plain one
            found = glob.glob(os.path.join(root, pat))
            out.extend(sorted(p for p in found if ".alt." not in p and "builtins" not in p))
    return out


def _toolkit_candidates() -> list[str]:
    out: list[str] = []
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for h in homes:
        if h:
            out.extend(sorted(glob.glob(os.path.join(h, "lib64", "libnvrtc.so*")), reverse=True))
    return [p for p in out if "builtins" not in p and ".alt." not in p]


def _candidates() -> list[str]:
    env = os.environ.get("KILN_NVRTC_LIBRARY")
    if env:
        return [env]
    return [*_wheel_candidates(), *_toolkit_candidates(), "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"]


class _NVRTC:
    """The opened NVRTC library with typed entry points."""

    if TYPE_CHECKING:  # the entry points are bound by name in __init__ from the signature table
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        P = ctypes.POINTER
        sigs = {
            "nvrtcVersion": [P(ctypes.c_int), P(ctypes.c_int)],
            "nvrtcCreateProgram": [P(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                   P(ctypes.c_char_p), P(ctypes.c_char_p)],
            "nvrtcCompileProgram": [ctypes.c_void_p, ctypes.c_int, P(ctypes.c_char_p)],
            "nvrtcGetProgramLogSize": [ctypes.c_void_p, P(ctypes.c_size_t)],
            "nvrtcGetProgramLog": [ctypes.c_void_p, ctypes.c_char_p],
            "nvrtcGetPTXSize": [ctypes.c_void_p, P(ctypes.c_size_t)],
            "nvrtcGetPTX": [ctypes.c_void_p, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [ctypes.c_void_p, P(ctypes.c_size_t)],
            "nvrtcGetCUBIN": [ctypes.c_void_p, ctypes.c_char_p],
            "nvrtcDestroyProgram": [P(ctypes.c_void_p)],
        }
        for name, argtypes in sigs.items():
            fn = getattr(lib, name, None)
            if fn is None and name.startswith("nvrtcGetCUBIN"):  # NVRTC < 11.1 has no cubin output
                continue
            if fn is None:
                raise AttributeError(f"{path} has no {name}")
            fn.restype = ctypes.c_int
            fn.argtypes = argtypes
            setattr(self, name, fn)
        es = lib.nvrtcGetErrorString
        es.restype = ctypes.c_char_p
        es.argtypes = [ctypes.c_int]
        self.nvrtcGetErrorString = es
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)

    def err(self, rc: int) -> str:
        s = self.nvrtcGetErrorString(rc)
        return s.decode() if s else f"nvrtcResult {rc}"


_LIB: _NVRTC | None = None
_LIB_TRIED: list[str] | None = None
_LOCK = threading.Lock()


def _load() -> _NVRTC | None:
    global _LIB, _LIB_TRIED
    with _LOCK:
        if _LIB is not None:
            return _LIB
        tried: list[str] = []
        for cand in _candidates():
            try:
                lib = ctypes.CDLL(cand)
                _LIB = _NVRTC(lib, cand)
                return _LIB
            except (OSError, AttributeError) as err:
                tried.append(f"{cand} ({err})")
        _LIB_TRIED = tried
        return None


def find_nvrtc() -> str | None:
    """Path (or loader name) of the NVRTC library Kiln would use, or None if there is none."""
    lib = _load()
    return lib.path if lib is not None else None


def nvrtc_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the NVRTC in use, or None."""
    lib = _load()
    return lib.version if lib is not None else None


def arch_to_compute(arch: str) -> str:
    """Map ``"sm_86"`` / ``"compute_86"`` / ``"86"`` to the virtual arch ``"compute_86"``.

    Raises
    ------
    CompileError
        If ``arch`` is not of those forms.
    """
    m = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3}[a-z]?)", arch.strip())
    if not m:
        raise CompileError(f"cuda: invalid -arch {arch!r}; expected e.g. sm_80, sm_90 or compute_80")
    return f"compute_{m.group(1)}"


def ptx_entries(ptx: str) -> list[str]:
    """Names of the ``.entry`` (kernel) declarations in PTX text."""
    return re.findall(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$][\w$]*)", ptx, flags=re.M)


def compile_cuda(source: str, arch: str = DEFAULT_ARCH, options: Sequence[str] = (), name: str = "kiln.cu",
                 use_nvcc: bool | None = None) -> str:
    """Compile CUDA C source to PTX text.

    Parameters
    ----------
    source : str
        CUDA C++ source; kernels should be ``extern "C" __global__`` so their PTX names are
        plain.
    arch : str
        Target architecture, ``"sm_80"`` (default) or ``"compute_XX"``. PTX for a virtual
        architecture is JIT-compiled by the driver for the actual GPU, so ``sm_80`` PTX
        also runs on Hopper and later.
    options : sequence of str
        Extra compiler options (e.g. ``"--use_fast_math"``).
    name : str
        Program name, shown in compiler messages.
    use_nvcc : bool, optional
        Force (True) or forbid (False) ``nvcc``; default: NVRTC when found, else ``nvcc``.

    Returns
    -------
    str
        The PTX.

    Raises
    ------
    NVRTCNotFoundError
        If neither NVRTC nor nvcc is available (says what to install).
    CompileError
        If compilation fails; the message holds the compiler log.
    """
    compute = arch_to_compute(arch)
    lib = None if use_nvcc else _load()
    if lib is not None:
        return _compile_nvrtc(lib, source, compute, options, name).decode("utf-8")
    nvcc = shutil.which("nvcc")
    if use_nvcc is not False and nvcc:
        return _compile_nvcc(nvcc, source, compute, options, "ptx").decode("utf-8")
    tried = "; tried: " + ", ".join(_LIB_TRIED or []) if _LIB_TRIED and not use_nvcc else ""
    raise NVRTCNotFoundError(f"cannot compile CUDA code: no NVRTC library and no nvcc found; {_INSTALL_HINT}{tried}")


def compile_cuda_cubin(source: str, arch: str = DEFAULT_ARCH, options: Sequence[str] = (), name: str = "kiln.cu",
                       use_nvcc: bool | None = None) -> bytes:
    """Compile CUDA C source to a cubin (machine code) for one real architecture.

    Unlike PTX, a cubin needs no JIT at load time and loads on any driver of the same CUDA
    major version, but runs only on GPUs of ``arch``'s major compute capability (an
    ``sm_80`` cubin runs on sm_80/sm_86/sm_89, not on sm_90).

    Parameters and errors are those of :func:`compile_cuda`; ``arch`` must be ``sm_XX``.

    Returns
    -------
    bytes
        The cubin (an ELF image).
    """
    compute = arch_to_compute(arch)
    sm = "sm_" + compute[len("compute_"):]
    lib = None if use_nvcc else _load()
    if lib is not None:
        if not hasattr(lib, "nvrtcGetCUBIN"):
            raise CompileError(f"NVRTC {lib.path} ({lib.version}) cannot produce cubins (needs 11.1+)")
        return _compile_nvrtc(lib, source, sm, options, name, cubin=True)
    nvcc = shutil.which("nvcc")
    if use_nvcc is not False and nvcc:
        return _compile_nvcc(nvcc, source, sm, options, "cubin")
    raise NVRTCNotFoundError(f"cannot compile CUDA code: no NVRTC library and no nvcc found; {_INSTALL_HINT}")


def _compile_nvrtc(lib: _NVRTC, source: str, gpu_arch: str, options: Sequence[str], name: str,
                   cubin: bool = False) -> bytes:
    compute = gpu_arch
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode("utf-8"), name.encode(), 0, None, None)
    if rc != 0:
        raise CompileError(f"nvrtcCreateProgram failed: {lib.err(rc)}")
    try:
        opts = [f"--gpu-architecture={compute}", "--std=c++17", *options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(max(n.value, 1))
        lib.nvrtcGetProgramLog(prog, log)
        log_text = log.value.decode(errors="replace").strip()
        if rc != 0:
            raise CompileError(f"NVRTC ({lib.path}) failed to compile {name} for {compute} ({lib.err(rc)}):\n"
                               f"{log_text}\n--- options: {' '.join(opts)}")
        get_size, get = (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if cubin else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
        what = "CUBIN" if cubin else "PTX"
        rc = get_size(prog, ctypes.byref(n))
        if rc != 0:
            raise CompileError(f"nvrtcGet{what}Size failed: {lib.err(rc)}")
        buf = ctypes.create_string_buffer(n.value)
        rc = get(prog, buf)
        if rc != 0:
            raise CompileError(f"nvrtcGet{what} failed: {lib.err(rc)}")
        return buf.raw if cubin else buf.value
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _compile_nvcc(nvcc: str, source: str, gpu_arch: str, options: Sequence[str], kind: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="kiln_nvcc_") as d:
        src, out = os.path.join(d, "kernels.cu"), os.path.join(d, f"kernels.{kind}")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(source)
        cmd = [nvcc, f"--{kind}", f"-arch={gpu_arch}", "-o", out, *options, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr.strip() or proc.stdout.strip()}")
        with open(out, "rb") as fh:
            return fh.read()
