"""The ``opencl`` module type: OpenCL C source plus a function table, built and enqueued per device.

(The file is ``opencl_driver.py``: a submodule named ``opencl`` would replace the
``kiln.runtime.opencl()`` device constructor as soon as it is imported.)

OpenCL support in the runtime is three modules, one concept each:

* :mod:`kiln.runtime.opencl_api` — ctypes bindings of ``libOpenCL.so.1``, opened lazily, so a
  library built for OpenCL can be loaded and inspected on a machine without it;
* :mod:`kiln.runtime.opencl_device` — the device API of ``kiln.opencl(i)``;
* this module — :class:`OpenCLModule`, a :class:`~kiln.runtime.gpu_module.GPUModule` whose
  program is built from source for a device the first time a function runs there. Buffers are
  passed to kernels as a ``cl_mem`` and a ``long`` byte offset each. The function table,
  payload format (``docs/devices.md``), argument checks and temporaries are the GPU base's;
  payloads of format version 1 (JSON metadata) are still read. Importing it registers the
  loader, the payload describer and the device API.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from typing import Any, Mapping, Sequence

from .binary import Reader
from .device import Device, DeviceType
from .errors import DeviceError, KernelError
from .gpu_module import GPUFunction, GPULaunch, GPUModule, GPUPayload
from .opencl_api import CL_PROGRAM_BUILD_LOG, INSTALL_HINT, CLRuntime, err_name, runtime
from .opencl_device import OpenCLDeviceAPI
from .registry import register_loader, register_payload_describer

__all__ = ["OpenCLDeviceAPI", "OpenCLModule", "opencl_module", "loadbinary_opencl", "describe_payload", "MAGIC",
           "FORMAT_VERSION"]

MAGIC = b"KILNOCL\0"
#: The payload version written (the GPU modules' common layout); version 1 is still read.
FORMAT_VERSION = 2

_c = ctypes


class _Program:
    """The program and kernel objects of one module on one device."""

    def __init__(self, rt: CLRuntime, dev: Device, source: str, kernel_names: Sequence[str]) -> None:
        ctx, self.queue = rt.context_queue(dev)
        did = _c.c_void_p(rt.device(dev))
        src = source.encode("utf-8")
        err = _c.c_int32(0)
        prog = rt.clCreateProgramWithSource(ctx, 1, (_c.c_char_p * 1)(src), (_c.c_size_t * 1)(len(src)),
                                            _c.byref(err))
        rt.check(err.value, f"clCreateProgramWithSource on {dev}")
        rc = rt.clBuildProgram(prog, 1, _c.byref(did), b"", None, None)
        if rc != 0:
            n = _c.c_size_t(0)
            rt.clGetProgramBuildInfo(prog, did, CL_PROGRAM_BUILD_LOG, 0, None, _c.byref(n))
            log = _c.create_string_buffer(max(n.value, 1))
            rt.clGetProgramBuildInfo(prog, did, CL_PROGRAM_BUILD_LOG, n.value, log, None)
            text = log.value.decode("utf-8", "replace").strip()
            rt.clReleaseProgram(prog)
            raise KernelError(f"OpenCL program build failed on {dev} ({err_name(rc)}):\n{text[:4000]}")
        self.rt = rt
        self.program = prog
        self.kernels: dict[str, int] = {}
        for k in kernel_names:
            kern = rt.clCreateKernel(prog, k.encode(), _c.byref(err))
            if err.value != 0:
                self.release()
                rt.check(err.value, f"clCreateKernel({k})")
            self.kernels[k] = int(kern)

    def release(self) -> None:
        """Release the kernel and program objects (the driver frees them once idle)."""
        for kern in self.kernels.values():
            self.rt.clReleaseKernel(kern)
        self.kernels = {}
        if self.program:
            self.rt.clReleaseProgram(self.program)
            self.program = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (e.g. at shutdown)
            pass


class OpenCLModule(GPUModule):
    """A module of OpenCL kernels (type key ``"opencl"``), see the module docstring.

    Parameters
    ----------
    source : str
        OpenCL C source of every kernel.
    functions : sequence of GPUFunction or dict
        The function table; dicts are the codegen's metadata (``GPUFunctionInfo.to_dict()``
        of :mod:`kiln.codegen.gpu_source`, read by :meth:`GPUFunction.from_dict`).
    fmt : str
        Source format (``"cl"``).
    """

    type_key = "opencl"
    device_type = DeviceType.OPENCL
    device_label = "OpenCL"
    payload_magic = MAGIC
    binary_formats = ("cl",)
    format_names = {"cl": "OpenCL C source"}
    legacy_versions = (1,)

    def __init__(self, source: str, functions: Sequence[GPUFunction | Mapping[str, Any]], fmt: str = "cl") -> None:
        table = [f if isinstance(f, GPUFunction) else GPUFunction.from_dict(f, "opencl module") for f in functions]
        super().__init__(b"", fmt, table, source)
        # kernel objects hold their arguments between clSetKernelArg and the enqueue
        self._launch_lock = threading.Lock()

    @classmethod
    def from_payload(cls, p: GPUPayload) -> "OpenCLModule":
        return cls(p.source, p.functions, p.fmt)

    # ---- the GPU module hooks --------------------------------------------------------------
    @classmethod
    def _check_runtime(cls) -> None:
        if not runtime().devices:
            raise DeviceError(f"the OpenCL runtime finds no device; {INSTALL_HINT}")

    @classmethod
    def _decode_legacy(cls, r: Reader, version: int) -> GPUPayload:
        # version 1: u32 reserved, the source, then JSON metadata {"fmt", "functions": [dict]}
        r.u32("reserved")
        source = r.string("source")
        text = r.string("metadata")
        try:
            meta = json.loads(text)
            fmt, funcs = meta.get("fmt", "cl"), meta["functions"]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise r.error(f"bad metadata: {err!r}") from None
        if fmt not in cls.binary_formats or not isinstance(funcs, list):
            raise r.error(f"bad metadata: format {fmt!r}, functions of type {type(funcs).__name__}")
        return GPUPayload(fmt, b"", source, "", [GPUFunction.from_dict(f, r.where) for f in funcs])

    def _load(self, device_id: int) -> _Program:
        names = {ln.kernel for f in self.functions.values() for ln in f.launches}
        return _Program(runtime(), Device(DeviceType.OPENCL, device_id), self.source, sorted(names))

    def _kernel(self, program: _Program, device_id: int, launch: GPULaunch) -> int:
        return program.kernels[launch.kernel]

    def _prepare(self, device_id: int, func: GPUFunction, kernels: list[Any], values: list[Any]) -> Any:
        # a buffer is two kernel parameters, the cl_mem and its byte offset; a scalar is one
        cargs = [(_c.c_void_p(v[0]), _c.c_int64(v[1])) if isinstance(v, tuple) else (v,) for v in values]
        plan = []
        # ``ln.grid`` is the grid to launch: a run-time grid is already evaluated (GPUModule)
        for ln, kern in zip(func.launches, kernels):
            params = [p for j in ln.args for p in cargs[j]]
            glob = (_c.c_size_t * 3)(*[g * b for g, b in zip(ln.grid, ln.block)])
            plan.append((kern, params, glob, (_c.c_size_t * 3)(*ln.block), ln))
        return plan

    def _run(self, device_id: int, func: GPUFunction, plan: Any) -> None:
        rt = runtime()
        queue = self.program(device_id).queue
        with self._launch_lock:
            for kern, params, glob, loc, ln in plan:
                for i, p in enumerate(params):
                    rt.check(rt.clSetKernelArg(kern, i, _c.sizeof(p), _c.byref(p)), f"clSetKernelArg({ln.kernel})")
                rc = rt.clEnqueueNDRangeKernel(queue, kern, 3, None, glob, loc, 0, None, None)
                if rc != 0:
                    raise KernelError(f"{func.name}: launching OpenCL kernel {ln.kernel} (grid {list(ln.grid)}, block "
                                      f"{list(ln.block)}) on opencl({device_id}) failed: {err_name(rc)}")

    # ---- inspection ------------------------------------------------------------------------
    def get_source(self, fmt: str = "") -> str:
        return self.source

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Write the kernel source (``.cl``) and, next to it, the function table (``.json``)."""
        base, _ = os.path.splitext(os.fspath(path))
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.source)
        with open(base + ".json", "w", encoding="utf-8") as fh:
            json.dump({"fmt": self.fmt, "functions": [f.to_dict() for f in self.functions.values()]}, fh, indent=1)


def opencl_module(source: str, functions: Sequence[GPUFunction | Mapping[str, Any]], fmt: str = "cl") -> OpenCLModule:
    """Create an :class:`OpenCLModule` from kernel source and its function table."""
    return OpenCLModule(source, functions, fmt)


describe_payload = OpenCLModule.describe_payload
loadbinary_opencl = OpenCLModule.load_binary

register_loader(OpenCLModule.type_key, loadbinary_opencl, override=True)
register_payload_describer(OpenCLModule.type_key, describe_payload, override=True)
