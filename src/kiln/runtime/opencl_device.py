"""The ``opencl`` device API: allocation, copies and attributes of DLPack device type 4.

:class:`OpenCLDeviceAPI` serves ``kiln.opencl(i)`` over :mod:`kiln.runtime.opencl_api`.
Pointers handed out are ``cl_mem`` handles (not host addresses); copies go through
``clEnqueueRead/Write/CopyBuffer`` (blocking, so host memory is ready on return). Importing
this module registers the API and opens no runtime.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .device import Device, DeviceType, register_device_api
from .errors import DeviceError
from .gpu_module import GPUDeviceAPI
from .opencl_api import CL_MEM_READ_WRITE, INFO, err_name, runtime

__all__ = ["OpenCLDeviceAPI"]

_c = ctypes


class OpenCLDeviceAPI(GPUDeviceAPI):
    """DeviceAPI of OpenCL devices (DLPack device type 4). Pointers are ``cl_mem`` handles."""

    device_type = DeviceType.OPENCL
    device_label = "OpenCL"

    def get_attr(self, dev: Device, kind: str) -> Any:
        if kind == "exist":
            try:
                return dev.device_id < len(runtime().devices)
            except DeviceError:
                return False
        if kind not in INFO:
            return None
        return runtime().device_info(dev, kind)

    def alloc_data_space(self, dev: Device, nbytes: int, alignment: int, dtype: Any = None) -> int:
        rt = runtime()
        ctx, _ = rt.context_queue(dev)
        err = _c.c_int32(0)
        # a zero-byte cl_mem is invalid; one byte keeps empty tensors addressable
        mem = rt.clCreateBuffer(ctx, CL_MEM_READ_WRITE, max(int(nbytes), 1), None, _c.byref(err))
        if err.value != 0 or not mem:
            raise DeviceError(f"OpenCL: cannot allocate {nbytes} bytes on {dev}: {err_name(err.value)}")
        return int(mem)

    def free_data_space(self, dev: Device, ptr: int) -> None:
        rt = runtime()
        rt.check(rt.clReleaseMemObject(ptr), f"clReleaseMemObject on {dev}")

    def _copy(self, kind: str, src: tuple[int, int], dst: tuple[int, int], nbytes: int, src_dev: Device,
              dst_dev: Device, stream: Any) -> None:
        rt = runtime()
        if kind == "peer":  # two OpenCL devices (two contexts): stage through host memory
            tmp = (_c.c_ubyte * nbytes)()
            self.copy_data_from_to(*src, _c.addressof(tmp), 0, nbytes, src_dev, Device(1, 0))
            self.copy_data_from_to(_c.addressof(tmp), 0, *dst, nbytes, Device(1, 0), dst_dev)
            return
        _, q = rt.context_queue(dst_dev if kind == "HtoD" else src_dev)
        if kind == "DtoD":
            rt.check(rt.clEnqueueCopyBuffer(q, src[0], dst[0], src[1], dst[1], nbytes, 0, None, None),
                     "clEnqueueCopyBuffer")
            rt.check(rt.clFinish(q), "clFinish")
        elif kind == "DtoH":  # blocking read: the host memory is ready on return
            rt.check(rt.clEnqueueReadBuffer(q, src[0], 1, src[1], nbytes, dst[0] + dst[1], 0, None, None),
                     f"clEnqueueReadBuffer from {src_dev}")
        else:
            rt.check(rt.clEnqueueWriteBuffer(q, dst[0], 1, dst[1], nbytes, src[0] + src[1], 0, None, None),
                     f"clEnqueueWriteBuffer to {dst_dev}")

    def stream_sync(self, dev: Device, stream: Any) -> None:
        rt = runtime()
        _, q = rt.context_queue(dev)
        rt.check(rt.clFinish(q), f"clFinish on {dev}")


register_device_api(DeviceType.OPENCL, OpenCLDeviceAPI(), override=True)
