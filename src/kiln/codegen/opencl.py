"""OpenCL code generator: PrimFuncs -> an ``opencl`` runtime module (``target.build.opencl``).

The kernel text comes from :class:`~kiln.codegen.gpu_source.GPUSourceGenerator` with the
:class:`OpenCLDialect` (OpenCL C 1.2: ``__kernel``, ``__global`` / ``__local`` address spaces,
``get_group_id`` / ``get_local_id``, ``barrier``). Buffers are passed as ``cl_mem`` plus a
byte offset, since OpenCL buffers are handles, not addresses. The result is an
:class:`kiln.runtime.opencl_driver.OpenCLModule` holding the source and launch metadata; the
device driver compiles the source when the module first runs on a device.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.opencl_driver import OpenCLModule
from ..tir.stmt import PrimFunc
from .gpu_source import Dialect, generate_gpu_source
from .registry import register_codegen

__all__ = ["OpenCLDialect", "build_opencl", "generate_opencl", "default_host_target"]

_AXIS = {"x": 0, "y": 1, "z": 2}


class OpenCLDialect(Dialect):
    """OpenCL C 1.2 (math builtins, ``isnan`` & co. and ``INFINITY`` / ``NAN`` as in the
    :class:`~kiln.codegen.cstyle.CDialect` defaults)."""

    name = "opencl"
    kernel_prefix = "__kernel void"
    global_qualifier = "__global"
    shared_qualifier = "__local"
    func_qualifier = "inline"
    restrict = "restrict"
    buffer_offset_args = True
    offset_type = "long"
    preamble = "#ifdef cl_khr_fp64\n#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#endif"
    type_names = {
        "bool": "uchar", "int8": "char", "int16": "short", "int32": "int", "int64": "long",
        "uint8": "uchar", "uint16": "ushort", "uint32": "uint", "uint64": "ulong",
        "float32": "float", "float64": "double",
    }

    def thread_index(self, tag: str) -> str:
        scope, axis = tag.split(".")
        fn = "get_group_id" if scope == "blockIdx" else "get_local_id"
        return f"{fn}({_AXIS[axis]})"

    def barrier(self) -> str:
        return "barrier(CLK_LOCAL_MEM_FENCE);"

    def dtype_guard(self, dtype: str) -> tuple[str, str] | None:
        return ("#ifdef cl_khr_fp64", "#endif") if dtype == "float64" else None


def generate_opencl(funcs: Sequence[PrimFunc]) -> tuple[str, list[dict[str, Any]]]:
    """OpenCL C source of ``funcs`` and their launch metadata (list of dicts)."""
    src, infos = generate_gpu_source(funcs, OpenCLDialect())
    return src, [fi.to_dict() for fi in infos]


def build_opencl(funcs: Sequence[PrimFunc], target: Any = None) -> OpenCLModule:
    """``target.build.opencl``: compile PrimFuncs into an :class:`OpenCLModule`.

    Parameters
    ----------
    funcs : sequence of PrimFunc
    target : Target, optional
        An ``opencl`` target (unused beyond dispatch).

    Returns
    -------
    OpenCLModule
    """
    src, meta = generate_opencl(funcs)
    return OpenCLModule(src, meta, "cl")


def default_host_target() -> Any:
    """The host target of device kinds: ``llvm -mcpu=native``, or ``c`` without llvmlite."""
    from ..target import Target

    try:
        import llvmlite  # noqa: F401
    except ImportError:
        return Target("c")
    return Target("llvm -mcpu=native")


register_codegen("opencl", build_opencl, override=True)
