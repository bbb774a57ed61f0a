"""ctypes bindings of OpenCL 1.2 (``libOpenCL.so.1``, the ICD loader): the opened runtime.

Owns the signature table, the process's :class:`CLRuntime` (opened lazily, once, on first
use), device enumeration (all devices of all platforms, in platform order), one context and
in-order command queue per device, device info queries and error names. It knows nothing of
arrays or modules: :mod:`kiln.runtime.opencl_device` (the device API) and
:mod:`kiln.runtime.opencl_driver` (the ``opencl`` module type) build on it. Imports ctypes and
the standard library only; importing it opens nothing. ``KILN_OPENCL_LIBRARY`` overrides the
library name or path (tests use it to simulate a missing runtime).
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import TYPE_CHECKING, Any

from .device import Device
from .errors import DeviceError
from .lazy_library import LazyLibrary

__all__ = ["CLRuntime", "runtime", "reset_runtime", "err_name", "OPENCL_LIBRARY_ENV", "INSTALL_HINT", "INFO"]

#: Environment variable naming the OpenCL ICD loader library to open.
OPENCL_LIBRARY_ENV = "KILN_OPENCL_LIBRARY"
INSTALL_HINT = "install ocl-icd-libopencl1 and a driver such as pocl-opencl-icd"
_DEFAULT_LIB = "libOpenCL.so.1"

_c = ctypes
_vp = _c.c_void_p
_sz = _c.c_size_t
_u32 = _c.c_uint32
_i32 = _c.c_int32
_u64 = _c.c_uint64

# cl.h constants used here
_CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_MEM_READ_WRITE = 1
CL_PROGRAM_BUILD_LOG = 0x1183
INFO = {
    "device_name": (0x102B, "str"),
    "max_threads_per_block": (0x1004, "size_t"),
    "multi_processor_count": (0x1002, "uint"),
    "total_global_memory": (0x101F, "ulong"),
    "max_shared_memory_per_block": (0x1023, "ulong"),
    "max_clock_rate": (0x100C, "uint"),
    "api_version": (0x102F, "str"),
    "driver_version": (0x102D, "str"),
    "extensions": (0x1030, "str"),
}
_ERRORS = {
    -1: "CL_DEVICE_NOT_FOUND", -2: "CL_DEVICE_NOT_AVAILABLE", -3: "CL_COMPILER_NOT_AVAILABLE",
    -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE", -5: "CL_OUT_OF_RESOURCES", -6: "CL_OUT_OF_HOST_MEMORY",
    -11: "CL_BUILD_PROGRAM_FAILURE", -30: "CL_INVALID_VALUE", -33: "CL_INVALID_DEVICE",
    -34: "CL_INVALID_CONTEXT", -36: "CL_INVALID_COMMAND_QUEUE", -38: "CL_INVALID_MEM_OBJECT",
    -46: "CL_INVALID_KERNEL_NAME", -48: "CL_INVALID_KERNEL", -49: "CL_INVALID_ARG_INDEX",
    -50: "CL_INVALID_ARG_VALUE", -51: "CL_INVALID_ARG_SIZE", -52: "CL_INVALID_KERNEL_ARGS",
    -54: "CL_INVALID_WORK_GROUP_SIZE", -55: "CL_INVALID_WORK_ITEM_SIZE", -61: "CL_INVALID_BUFFER_SIZE",
    -1001: "CL_PLATFORM_NOT_FOUND_KHR",
}


def err_name(code: int) -> str:
    """The name of an OpenCL error code (``CL_INVALID_VALUE``), or ``error <code>``."""
    return _ERRORS.get(code, f"error {code}")


class CLRuntime:
    """The opened ``libOpenCL`` with typed entry points, its devices, contexts and queues."""

    if TYPE_CHECKING:  # the entry points are bound by name in __init__ from the signature table
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, lib: Any, name: str) -> None:
        self.lib, self.name = lib, name
        P = _c.POINTER
        sig: dict[str, tuple[Any, list[Any]]] = {
            "clGetPlatformIDs": (_i32, [_u32, P(_vp), P(_u32)]),
            "clGetDeviceIDs": (_i32, [_vp, _u64, _u32, P(_vp), P(_u32)]),
            "clGetDeviceInfo": (_i32, [_vp, _u32, _sz, _vp, P(_sz)]),
            "clCreateContext": (_vp, [_vp, _u32, P(_vp), _vp, _vp, P(_i32)]),
            "clCreateCommandQueue": (_vp, [_vp, _vp, _u64, P(_i32)]),
            "clCreateBuffer": (_vp, [_vp, _u64, _sz, _vp, P(_i32)]),
            "clReleaseMemObject": (_i32, [_vp]),
            "clEnqueueWriteBuffer": (_i32, [_vp, _vp, _u32, _sz, _sz, _vp, _u32, _vp, _vp]),
            "clEnqueueReadBuffer": (_i32, [_vp, _vp, _u32, _sz, _sz, _vp, _u32, _vp, _vp]),
            "clEnqueueCopyBuffer": (_i32, [_vp, _vp, _vp, _sz, _sz, _sz, _u32, _vp, _vp]),
            "clFinish": (_i32, [_vp]),
            "clCreateProgramWithSource": (_vp, [_vp, _u32, P(_c.c_char_p), P(_sz), P(_i32)]),
            "clBuildProgram": (_i32, [_vp, _u32, P(_vp), _c.c_char_p, _vp, _vp]),
            "clGetProgramBuildInfo": (_i32, [_vp, _vp, _u32, _sz, _vp, P(_sz)]),
            "clCreateKernel": (_vp, [_vp, _c.c_char_p, P(_i32)]),
            "clSetKernelArg": (_i32, [_vp, _u32, _sz, _vp]),
            "clEnqueueNDRangeKernel": (_i32, [_vp, _vp, _u32, P(_sz), P(_sz), P(_sz), _u32, _vp, _vp]),
            "clReleaseKernel": (_i32, [_vp]),
            "clReleaseProgram": (_i32, [_vp]),
        }
        for fname, (res, args) in sig.items():
            try:
                f = getattr(lib, fname)
            except AttributeError:
                raise DeviceError(f"OpenCL runtime {name} lacks {fname}; it is not a usable OpenCL 1.2 "
                                  f"library ({INSTALL_HINT})") from None
            f.restype, f.argtypes = res, args
            setattr(self, fname, f)
        self.devices: list[int] = self._enumerate()
        self.contexts: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()

    def check(self, code: int, what: str) -> None:
        """Raise :class:`DeviceError` naming ``what`` and the error unless ``code`` is 0."""
        if code != 0:
            raise DeviceError(f"OpenCL {what} failed: {err_name(code)}")

    def _enumerate(self) -> list[int]:
        n = _u32(0)
        rc = self.clGetPlatformIDs(0, None, _c.byref(n))
        if rc != 0 or n.value == 0:
            return []  # -1001: the ICD loader found no platform (no driver installed)
        plats = (_vp * n.value)()
        self.check(self.clGetPlatformIDs(n.value, plats, None), "clGetPlatformIDs")
        out: list[int] = []
        for p in plats:
            nd = _u32(0)
            if self.clGetDeviceIDs(p, _CL_DEVICE_TYPE_ALL, 0, None, _c.byref(nd)) != 0 or nd.value == 0:
                continue
            devs = (_vp * nd.value)()
            self.check(self.clGetDeviceIDs(p, _CL_DEVICE_TYPE_ALL, nd.value, devs, None), "clGetDeviceIDs")
            out.extend(int(d) for d in devs)  # type: ignore[arg-type]  # device ids are never NULL
        return out

    def device(self, dev: Device) -> int:
        """The ``cl_device_id`` of ``dev``; :class:`DeviceError` if there is no such device."""
        if dev.device_id >= len(self.devices):
            raise DeviceError(
                f"{dev} does not exist: the OpenCL runtime ({self.name}) reports {len(self.devices)} device(s)"
                + ("" if self.devices else f"; no OpenCL driver is installed ({INSTALL_HINT})")
            )
        return self.devices[dev.device_id]

    def context_queue(self, dev: Device) -> tuple[int, int]:
        """(cl_context, cl_command_queue) of ``dev``, created on first use."""
        cq = self.contexts.get(dev.device_id)
        if cq is not None:
            return cq
        with self.lock:
            cq = self.contexts.get(dev.device_id)
            if cq is None:
                did = _vp(self.device(dev))
                err = _i32(0)
                ctx = self.clCreateContext(None, 1, _c.byref(did), None, None, _c.byref(err))
                self.check(err.value, f"clCreateContext for {dev}")
                q = self.clCreateCommandQueue(ctx, did, 0, _c.byref(err))
                self.check(err.value, f"clCreateCommandQueue for {dev}")
                cq = (int(ctx), int(q))
                self.contexts[dev.device_id] = cq
        return cq

    def device_info(self, dev: Device, key: str) -> Any:
        """Attribute ``key`` of :data:`INFO` (``"device_name"``, ...) of ``dev``."""
        code, kind = INFO[key]
        did = self.device(dev)
        if kind == "str":
            n = _sz(0)
            self.check(self.clGetDeviceInfo(did, code, 0, None, _c.byref(n)), "clGetDeviceInfo")
            buf = _c.create_string_buffer(n.value)
            self.check(self.clGetDeviceInfo(did, code, n.value, buf, None), "clGetDeviceInfo")
            return buf.value.decode("utf-8", "replace").strip()
        val = {"size_t": _sz, "uint": _u32, "ulong": _u64}[kind]()
        self.check(self.clGetDeviceInfo(did, code, _c.sizeof(val), _c.byref(val), None), "clGetDeviceInfo")
        return int(val.value)


_LIBRARY = LazyLibrary("OpenCL runtime", lambda: os.environ.get(OPENCL_LIBRARY_ENV) or _DEFAULT_LIB, CLRuntime,
                       INSTALL_HINT)


def runtime() -> CLRuntime:
    """The process's OpenCL runtime, opened on first use.

    Raises
    ------
    DeviceError
        When the library is missing, naming it and what to install.
    """
    return _LIBRARY.get()


def reset_runtime() -> None:
    """Forget the opened runtime (tests that switch ``KILN_OPENCL_LIBRARY`` call this)."""
    _LIBRARY.reset()
