"""The ``cuda`` target: CUDA C kernels compiled to PTX by NVRTC, packaged as a ``cuda`` module.

Importing this module registers the code generator ``target.build.cuda``
(:func:`kiln.codegen.register_codegen`); :mod:`kiln.codegen.registry` imports it the first time a
build asks for ``cuda``. The target kind itself (its options) is declared in
:mod:`kiln.target.target`, so that naming a target never imports a code generator.

* :class:`CUDADialect` — what CUDA C needs on top of the shared GPU source generator
  (:mod:`kiln.codegen.gpu_source`): ``extern "C" __global__`` kernels, ``__shared__``,
  ``__syncthreads()``, ``blockIdx``/``threadIdx``, single-precision math names, and
  infinities/NaNs spelled without ``<math.h>`` (NVRTC has no system headers).
* :func:`build_cuda` — ``PrimFunc`` s → CUDA C → PTX (:func:`kiln.contrib.nvrtc.compile_cuda`)
  → :class:`kiln.runtime.cuda_driver.CUDAModule` with the function table (arguments, temporaries,
  kernels with their grid/block sizes). Compiling needs NVRTC (or nvcc), never a GPU.

Target options (``Target("cuda -arch=sm_90")``): ``arch`` (default ``sm_80``; PTX for it is
JIT-compiled by the driver on newer GPUs), ``max_num_threads`` (threads per block the
schedules may use, default 1024), ``thread_warp_size`` (32), ``max_shared_memory_per_block``
(bytes, 48 KiB), ``fast_math`` (NVRTC ``--use_fast_math``), ``options`` (extra NVRTC flags),
``binary`` (``ptx``, the default, JIT-compiled by the driver for whatever GPU is present; or
``cubin``: machine code for ``arch``'s GPU generation only, loaded without JIT and by any
driver of the same CUDA major version).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.errors import CompileError
from ..target import Target
from ..tir.stmt import PrimFunc
from .gpu_source import Dialect, GPUFunctionInfo, generate_gpu_source
from .registry import register_codegen

__all__ = ["CUDADialect", "build_cuda", "generate_cuda", "function_table"]

class CUDADialect(Dialect):
    """CUDA C++ as compiled by NVRTC (see the module docstring)."""

    name = "cuda"
    kernel_prefix = 'extern "C" __global__ void'
    global_qualifier = ""
    shared_qualifier = "__shared__"
    func_qualifier = "static __device__ __forceinline__"
    restrict = "__restrict__"
    buffer_offset_args = False  # device pointers are addresses: the host adds byte offsets
    offset_type = "long long"
    preamble = ""
    type_names = {
        "bool": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
        "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
        "uint64": "unsigned long long", "float32": "float", "float64": "double",
    }

    def thread_index(self, tag: str) -> str:
        return tag  # blockIdx.x, threadIdx.y, ... are CUDA built-ins of the same names

    def barrier(self) -> str:
        return "__syncthreads();"

    def math_function(self, op: str, dtype: str) -> str:
        # in CUDA C++ ``exp(float)`` would resolve to the float overload too, but the
        # f-suffixed C names make the precision explicit in the generated source
        fn = super().math_function(op, dtype)
        return fn + "f" if dtype == "float32" else fn

    def vector_type(self, dtype: str, lanes: int) -> str:
        base = {"float32": "float", "float64": "double", "int32": "int", "uint32": "uint"}.get(dtype)
        if base is None:
            raise CompileError(f"cuda codegen: no CUDA vector type for {lanes} x {dtype}")
        return f"{base}{lanes}"

    def inf_literal(self, dtype: str) -> str:
        if dtype == "float64":
            return "__longlong_as_double(0x7ff0000000000000LL)"
        return "__int_as_float(0x7f800000)"

    def nan_literal(self, dtype: str) -> str:
        if dtype == "float64":
            return "__longlong_as_double(0x7ff8000000000000LL)"
        return "__int_as_float(0x7fc00000)"

    def is_special_float(self, op: str, arg: str, dtype: str) -> str:
        return f"({op}({arg}) ? 1 : 0)"


def generate_cuda(funcs: Sequence[PrimFunc]) -> tuple[str, list[GPUFunctionInfo]]:
    """CUDA C source and launch metadata of ``funcs`` (no compiler needed).

    Returns
    -------
    source : str
    functions : list of GPUFunctionInfo
    """
    source, infos = generate_gpu_source(list(funcs), CUDADialect())
    return _add_launch_bounds(source, infos), infos


def _add_launch_bounds(source: str, infos: Sequence[GPUFunctionInfo]) -> str:
    """Declare each kernel's exact block size with ``__launch_bounds__``.

    Without it the compiler may use more registers per thread than a large block can get
    (65536 registers per block / 1024 threads = 64), and the launch would fail with
    ``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`` on the GPU only; with it, it spills instead.
    """
    prefix = CUDADialect.kernel_prefix
    for fi in infos:
        for k in fi.kernels:
            threads = k.block[0] * k.block[1] * k.block[2]
            old = f"{prefix} {k.name}("
            if source.count(old) != 1:
                raise CompileError(f"cuda codegen: kernel {k.name} not found once in the generated source")
            source = source.replace(old, f"{prefix} __launch_bounds__({threads}) {k.name}(")
    return source


def function_table(infos: Sequence[GPUFunctionInfo]) -> list[Any]:
    """Turn generator metadata into the ``cuda`` module's function table.

    Kernel arguments refer to the function's parameters by index, to its temporaries by
    ``len(params) + j`` and to its runtime extents (dynamic dims) by ``len(params) +
    len(temps) + j`` (the encoding of :class:`kiln.runtime.cuda_driver.CUDAFunction`).
    """
    from ..runtime.cuda_driver import CUDAFunction

    return [CUDAFunction.from_dict(fi.to_dict(), "cuda codegen") for fi in infos]


def _check_launch_limits(infos: Sequence[GPUFunctionInfo], target: Target) -> None:
    limit = int(target.attrs.get("max_num_threads") or 1024)
    for fi in infos:
        for k in fi.kernels:
            threads = k.block[0] * k.block[1] * k.block[2]
            if threads > limit:
                raise CompileError(
                    f"cuda codegen: kernel {k.name} of {fi.name} uses {threads} threads per block "
                    f"(block {list(k.block)}), more than the target's max_num_threads={limit}; "
                    "the schedule must bind smaller thread extents"
                )
            smem = int(target.attrs.get("max_shared_memory_per_block") or 48 * 1024)
            if k.shared_bytes > smem:
                raise CompileError(
                    f"cuda codegen: kernel {k.name} of {fi.name} declares {k.shared_bytes} bytes of shared memory, "
                    f"more than the target's max_shared_memory_per_block={smem}; use smaller tiles")
            if k.block[2] > 64 or k.grid[1] > 65535 or k.grid[2] > 65535:
                raise CompileError(f"cuda codegen: kernel {k.name} of {fi.name}: launch grid {list(k.grid)} / block "
                                   f"{list(k.block)} exceeds CUDA limits (grid y,z <= 65535, block z <= 64)")


def build_cuda(funcs: Sequence[PrimFunc], target: Any) -> Any:
    """``target.build.cuda``: compile PrimFuncs into a :class:`kiln.runtime.cuda_driver.CUDAModule`.

    Parameters
    ----------
    funcs : sequence of PrimFunc
        Kernels, normally scheduled with bound ``blockIdx``/``threadIdx`` loops.
    target : Target or str
        A ``cuda`` target (``-arch``, ``-fast_math``, ``-options`` are used here).

    Returns
    -------
    kiln.runtime.cuda_driver.CUDAModule
        Holds the PTX, the CUDA C source (``get_source()``) and the function table; it is
        binary-serializable, so ``export_library`` puts it in the library's blob.

    Raises
    ------
    CompileError
        If a kernel exceeds the launch limits, NVRTC/nvcc is missing (the message says what to
        install), or compilation fails (with the compiler log).
    """
    from ..contrib.nvrtc import compile_cuda, compile_cuda_cubin, ptx_entries
    from ..runtime.cuda_driver import CUDAModule

    tgt = target if isinstance(target, Target) else Target(target)
    source, infos = generate_cuda(funcs)
    _check_launch_limits(infos, tgt)
    arch = str(tgt.attrs.get("arch") or "sm_80")
    opts = list(tgt.attrs.get("options") or [])
    if tgt.attrs.get("fast_math"):
        opts.append("--use_fast_math")
    kind = str(tgt.attrs.get("binary") or "ptx")
    names = [k.name for fi in infos for k in fi.kernels]
    if kind == "cubin":
        cubin = compile_cuda_cubin(source, arch=arch, options=opts, name="kiln_kernels.cu")
        missing = [n for n in names if n.encode() + b"\0" not in cubin]  # ELF string table entries
        if missing:
            raise CompileError(f"cuda codegen: the cubin lacks kernels {missing[:5]}")
        return CUDAModule(cubin, "cubin", function_table(infos), source=source, arch=arch)
    if kind != "ptx":
        raise CompileError(f"cuda target: -binary must be 'ptx' or 'cubin', got {kind!r}")
    ptx = compile_cuda(source, arch=arch, options=opts, name="kiln_kernels.cu")
    entries = set(ptx_entries(ptx))
    missing = [n for n in names if n not in entries]
    if missing:
        raise CompileError(f"cuda codegen: the PTX lacks entries for kernels {missing[:5]}")
    return CUDAModule(ptx, "ptx", function_table(infos), source=source, arch=arch)


def _register() -> None:
    register_codegen("cuda", build_cuda, override=True)


_register()
