"""The ``cuda`` device API: allocation, copies, streams and attributes of DLPack device type 2.

:class:`CUDADeviceAPI` serves ``kiln.cuda(i)`` over the driver bindings of
:mod:`kiln.runtime.cuda_api`. Every device is used through its *primary context*, the context
the CUDA runtime and other frameworks (PyTorch, CuPy) share, so memory can be exchanged with
them. Importing this module registers the API and opens no driver.
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import cuda_api as _cu
from .cuda_api import driver, is_available
from .device import ALLOC_ALIGNMENT, Device, DeviceType, register_device_api
from .errors import DeviceError
from .gpu_module import GPUDeviceAPI

__all__ = ["CUDADeviceAPI", "current_stream"]


class CUDADeviceAPI(GPUDeviceAPI):
    """Device type 2 over the CUDA driver API (see the module docstring).

    Pointers are ``CUdeviceptr`` values (plain ints in the device's address space). Copies
    and launches go to the legacy default stream unless a stream is given, so a blocking
    device-to-host copy after a kernel already waits for that kernel.
    """

    device_type = DeviceType.CUDA
    device_label = "CUDA"

    def set_device(self, dev: Device) -> None:
        driver().context(dev.device_id)

    def get_attr(self, dev: Device, kind: str) -> Any:
        if kind == "exist":
            return is_available(dev.device_id)
        d = driver()
        d.context(dev.device_id)
        cudev = ctypes.c_int()
        d.check(d.cuDeviceGet(ctypes.byref(cudev), dev.device_id), "cuDeviceGet")

        def attr(code: int) -> int:
            v = ctypes.c_int()
            d.check(d.cuDeviceGetAttribute(ctypes.byref(v), code, cudev.value), f"cuDeviceGetAttribute({code})")
            return v.value

        if kind in _cu.ATTR_CODES:
            return attr(_cu.ATTR_CODES[kind])
        if kind == "compute_version":
            return f"{attr(_cu.CC_MAJOR)}.{attr(_cu.CC_MINOR)}"
        if kind == "device_name":
            buf = ctypes.create_string_buffer(256)
            d.check(d.cuDeviceGetName(buf, 256, cudev.value), "cuDeviceGetName")
            return buf.value.decode(errors="replace")
        if kind == "max_thread_dimensions":
            return [attr(c) for c in _cu.MAX_BLOCK_DIM]
        if kind == "driver_version":
            v = ctypes.c_int()
            d.check(d.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
            return v.value
        if kind == "total_global_memory":
            n = ctypes.c_size_t()
            d.check(d.cuDeviceTotalMem_v2(ctypes.byref(n), cudev.value), "cuDeviceTotalMem")
            return n.value
        if kind == "available_global_memory":
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            d.check(d.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
            return free.value
        return None

    def alloc_data_space(self, dev: Device, nbytes: int, alignment: int = ALLOC_ALIGNMENT, dtype: Any = None) -> int:
        nbytes = int(nbytes)
        if nbytes < 0:
            raise DeviceError(f"cannot allocate a negative number of bytes ({nbytes}) on {dev}")
        if alignment > 256:
            # cuMemAlloc guarantees 256-byte alignment and nothing more.
            raise DeviceError(f"{dev}: alignment {alignment} is not supported (at most 256)")
        d = driver()
        d.context(dev.device_id)
        ptr = _cu.CUdeviceptr()
        # A zero-byte array still needs a unique, valid pointer.
        rc = d.cuMemAlloc_v2(ctypes.byref(ptr), max(nbytes, 1))
        if rc != 0:
            raise DeviceError(f"CUDA allocation of {nbytes} bytes on {dev} failed: {d.error_text(rc)}")
        return int(ptr.value)

    def free_data_space(self, dev: Device, ptr: int) -> None:
        d = _cu.opened_driver()
        if d is None:
            # The driver that allocated ptr was forgotten (_reset_driver): its context is gone
            # and ptr means nothing to a new one. Calling driver() here could also deadlock:
            # NDArray.__del__ runs from garbage collection, possibly inside driver()'s lock.
            return
        d.context(dev.device_id)
        d.check(d.cuMemFree_v2(ptr), f"cuMemFree on {dev}")

    def _copy(self, kind: str, src: tuple[int, int], dst: tuple[int, int], nbytes: int, src_dev: Device,
              dst_dev: Device, stream: Any) -> None:
        d = driver()
        s, t = src[0] + src[1], dst[0] + dst[1]
        if kind == "peer":
            sctx, dctx = d.context(src_dev.device_id), d.context(dst_dev.device_id)
            if not hasattr(d, "cuMemcpyPeer"):
                raise DeviceError(f"copy {src_dev} -> {dst_dev}: this CUDA driver has no cuMemcpyPeer")
            d.check(d.cuMemcpyPeer(t, dctx, s, sctx, nbytes), "cuMemcpyPeer")
            return
        d.context((dst_dev if kind == "HtoD" else src_dev).device_id)
        # cuMemcpy{kind}_v2 or, on a stream, cuMemcpy{kind}Async_v2 (same arguments + stream)
        if stream is None:
            d.check(getattr(d, f"cuMemcpy{kind}_v2")(t, s, nbytes), f"cuMemcpy{kind}")
        else:
            d.check(getattr(d, f"cuMemcpy{kind}Async_v2")(t, s, nbytes, stream), f"cuMemcpy{kind}Async")

    def create_stream(self, dev: Device) -> Any:
        d = driver()
        d.context(dev.device_id)
        s = ctypes.c_void_p()
        d.check(d.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return int(s.value or 0)

    def free_stream(self, dev: Device, stream: Any) -> None:
        if stream:
            d = driver()
            d.context(dev.device_id)
            d.check(d.cuStreamDestroy_v2(stream), "cuStreamDestroy")

    def stream_sync(self, dev: Device, stream: Any) -> None:
        d = driver()
        d.context(dev.device_id)
        if stream is None:
            d.check(d.cuCtxSynchronize(), f"synchronize {dev}")
        else:
            d.check(d.cuStreamSynchronize(stream), f"cuStreamSynchronize on {dev}")

    def set_stream(self, dev: Device, stream: Any) -> None:
        _STREAMS[dev.device_id] = stream


# Stream that kernels of a device are launched on (None: legacy default stream).
_STREAMS: dict[int, Any] = {}


def current_stream(device_id: int) -> Any:
    """The stream kernels of ``cuda(device_id)`` are launched on (``set_stream``), or None."""
    return _STREAMS.get(device_id)


_API = CUDADeviceAPI()
register_device_api(DeviceType.CUDA, _API, override=True)
