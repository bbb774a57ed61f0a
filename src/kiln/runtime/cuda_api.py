"""ctypes bindings of the CUDA driver API (``libcuda.so.1``): the opened driver and its contexts.

Owns the signature table, the process's :class:`Driver` (opened lazily, once, on the first
call that needs it), primary-context handling, error texts and the PTX ISA a driver accepts.
It knows nothing of arrays or modules: :mod:`kiln.runtime.cuda_device` (the device API) and
:mod:`kiln.runtime.cuda_driver` (the ``cuda`` module type) build on it. Imports ctypes and
the standard library only; importing it opens nothing.

Environment: ``KILN_CUDA_LIBRARY`` names the driver library to open instead of
``libcuda.so.1`` (tests point it at a missing file, or at the mock driver of ``tests/cuda``).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any

from .errors import DeviceError
from .lazy_library import LazyLibrary

__all__ = ["Driver", "CUdeviceptr", "driver", "reset_driver", "opened_driver", "is_available", "driver_library_name",
           "ptx_isa_for_driver", "restamp_ptx", "INSTALL_HINT"]

INSTALL_HINT = (
    "install the NVIDIA driver (it provides libcuda.so.1; the CUDA toolkit is not needed to run "
    "a compiled model), or set KILN_CUDA_LIBRARY to the driver library's path"
)


def driver_library_name() -> str:
    """The driver library Kiln opens: ``$KILN_CUDA_LIBRARY`` or the platform's default."""
    env = os.environ.get("KILN_CUDA_LIBRARY")
    if env:
        return env
    return "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


_c_int, _c_uint, _c_size = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_c_void_p, _c_char_p = ctypes.c_void_p, ctypes.c_char_p
CUdeviceptr = ctypes.c_uint64
_P = ctypes.POINTER

# (name, argtypes). All return CUresult (int). ``_v2`` names are the 64-bit-size ABI that
# the header macros select; the plain names are the legacy 32-bit ones.
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_c_uint],
    "cuDriverGetVersion": [_P(_c_int)],
    "cuDeviceGetCount": [_P(_c_int)],
    "cuDeviceGet": [_P(_c_int), _c_int],
    "cuDeviceGetName": [_c_char_p, _c_int, _c_int],
    "cuDeviceGetAttribute": [_P(_c_int), _c_int, _c_int],
    "cuDeviceTotalMem_v2": [_P(_c_size), _c_int],
    "cuDevicePrimaryCtxRetain": [_P(_c_void_p), _c_int],
    "cuCtxSetCurrent": [_c_void_p],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [_P(CUdeviceptr), _c_size],
    "cuMemFree_v2": [CUdeviceptr],
    "cuMemGetInfo_v2": [_P(_c_size), _P(_c_size)],
    "cuMemcpyHtoD_v2": [CUdeviceptr, _c_void_p, _c_size],
    "cuMemcpyDtoH_v2": [_c_void_p, CUdeviceptr, _c_size],
    "cuMemcpyDtoD_v2": [CUdeviceptr, CUdeviceptr, _c_size],
    "cuMemcpyHtoDAsync_v2": [CUdeviceptr, _c_void_p, _c_size, _c_void_p],
    "cuMemcpyDtoHAsync_v2": [_c_void_p, CUdeviceptr, _c_size, _c_void_p],
    "cuMemcpyDtoDAsync_v2": [CUdeviceptr, CUdeviceptr, _c_size, _c_void_p],
    "cuMemcpyPeer": [CUdeviceptr, _c_void_p, CUdeviceptr, _c_void_p, _c_size],
    "cuStreamCreate": [_P(_c_void_p), _c_uint],
    "cuStreamDestroy_v2": [_c_void_p],
    "cuStreamSynchronize": [_c_void_p],
    "cuModuleLoadDataEx": [_P(_c_void_p), _c_void_p, _c_uint, _P(_c_int), _P(_c_void_p)],
    "cuModuleUnload": [_c_void_p],
    "cuModuleGetFunction": [_P(_c_void_p), _c_void_p, _c_char_p],
    "cuFuncSetAttribute": [_c_void_p, _c_int, _c_int],
    "cuLaunchKernel": [_c_void_p, _c_uint, _c_uint, _c_uint, _c_uint, _c_uint, _c_uint, _c_uint, _c_void_p,
                       _P(_c_void_p), _P(_c_void_p)],
    "cuGetErrorName": [_c_int, _P(_c_char_p)],
    "cuGetErrorString": [_c_int, _P(_c_char_p)],
}

# CUdevice_attribute codes (cuda.h).
ATTR_CODES = {
    "max_threads_per_block": 1,
    "max_shared_memory_per_block": 8,
    "warp_size": 10,
    "max_registers_per_block": 12,
    "max_clock_rate": 13,
    "multi_processor_count": 16,
    "l2_cache_size_bytes": 38,
}
CC_MAJOR, CC_MINOR = 75, 76
MAX_BLOCK_DIM = (2, 3, 4)
CUDA_ERROR_NO_DEVICE = 100
CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
STATIC_SHARED_LIMIT = 48 * 1024


class Driver:
    """The opened driver library with typed entry points; one per process."""

    if TYPE_CHECKING:  # the entry points are bound by name in __init__ from the signature table
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        self._lib = lib
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                if name in ("cuFuncSetAttribute", "cuMemcpyPeer"):  # optional (old drivers)
                    continue
                raise DeviceError(
                    f"CUDA driver {path} lacks {name}; the NVIDIA driver is too old for Kiln (needs CUDA 11+)"
                ) from None
            fn.restype = ctypes.c_int
            fn.argtypes = argtypes
            setattr(self, name, fn)
        # cuLaunchKernel without argtypes: the launcher passes ready ctypes values, which skips
        # ctypes' per-argument conversion (more than half the host cost of a launch).
        address = ctypes.cast(self.cuLaunchKernel, ctypes.c_void_p).value  # non-NULL: the symbol was found
        self.launch_raw = ctypes.CFUNCTYPE(ctypes.c_int)(address)  # type: ignore[arg-type]
        self._contexts: dict[int, int] = {}
        self._lock = threading.Lock()
        rc = self.cuInit(0)
        self.init_error = None if rc == 0 else rc
        n = ctypes.c_int(0)
        self.device_count = 0
        if rc == 0 and self.cuDeviceGetCount(ctypes.byref(n)) == 0:
            self.device_count = n.value

    def error_text(self, rc: int) -> str:
        """``"CUDA_ERROR_NAME: description"`` of a ``CUresult`` (best effort)."""
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        try:
            self.cuGetErrorName(rc, ctypes.byref(name))
            self.cuGetErrorString(rc, ctypes.byref(text))
        except Exception:  # noqa: BLE001 - error text is best effort
            pass
        n = name.value.decode() if name.value else f"CUresult {rc}"
        t = text.value.decode() if text.value else ""
        return f"{n}: {t}" if t else n

    def check(self, rc: int, what: str) -> None:
        """Raise :class:`DeviceError` naming ``what`` and the error unless ``rc`` is 0."""
        if rc != 0:
            raise DeviceError(f"CUDA {what} failed: {self.error_text(rc)}")

    def context(self, device_id: int) -> int:
        """Retain (once) and make current the primary context of ``device_id``."""
        ctx = self._contexts.get(device_id)
        if ctx is None:
            with self._lock:
                ctx = self._contexts.get(device_id)
                if ctx is None:
                    self.require_device(device_id)
                    dev = ctypes.c_int()
                    self.check(self.cuDeviceGet(ctypes.byref(dev), device_id), f"cuDeviceGet({device_id})")
                    c = ctypes.c_void_p()
                    self.check(self.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev.value), "cuDevicePrimaryCtxRetain")
                    ctx = int(c.value or 0)
                    self._contexts[device_id] = ctx
        self.check(self.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return ctx

    def require_device(self, device_id: int) -> None:
        """Raise :class:`DeviceError` saying why unless ``cuda(device_id)`` can be used."""
        if self.init_error is not None:
            detail = self.error_text(self.init_error)
            if self.init_error == CUDA_ERROR_NO_DEVICE:
                raise DeviceError(f"no CUDA device found (cuInit: {detail}); is an NVIDIA GPU present and visible "
                                  "(CUDA_VISIBLE_DEVICES)?")
            raise DeviceError(f"the CUDA driver {self.path} failed to initialize (cuInit: {detail})")
        if not 0 <= device_id < self.device_count:
            raise DeviceError(f"CUDA device {device_id} does not exist; this machine has {self.device_count} "
                              f"CUDA device(s)")


_LIBRARY = LazyLibrary("CUDA driver library", driver_library_name, Driver, INSTALL_HINT)


def driver() -> Driver:
    """The process's driver, opened on first use.

    Raises
    ------
    DeviceError
        When the driver library is missing, naming it and what to install.
    """
    return _LIBRARY.get()


def opened_driver() -> Driver | None:
    """The driver if it is open, else None (never opens it: safe from finalizers)."""
    return _LIBRARY.opened()


def reset_driver() -> None:
    """Forget the opened driver (tests that switch ``KILN_CUDA_LIBRARY`` call this)."""
    _LIBRARY.reset()


def is_available(device_id: int = 0) -> bool:
    """Whether the CUDA driver loads and device ``device_id`` exists (never raises)."""
    try:
        d = driver()
        d.require_device(device_id)
        return True
    except DeviceError:
        return False


def ptx_isa_for_driver(driver_version: int) -> tuple[int, int] | None:
    """Newest PTX ISA version a driver of CUDA version ``driver_version`` (e.g. 12040) accepts.

    From NVIDIA's PTX ISA release notes: CUDA 11.x accepts ISA 7.x, CUDA 12.0-12.5 accept
    8.0-8.5, 12.6 accepts 8.5, 12.8 accepts 8.7, 12.9 accepts 8.8. None for unknown versions.
    """
    major, minor = driver_version // 1000, (driver_version % 1000) // 10
    if major == 11:
        return (7, min(minor, 8))
    if major == 12:
        return {6: (8, 5), 7: (8, 6), 8: (8, 7)}.get(minor, (8, min(minor, 8)))
    return None


def restamp_ptx(image: bytes, d: Driver) -> bytes | None:
    """``image`` stamped with the newest PTX ISA version driver ``d`` accepts, or None.

    NVRTC stamps its own (newest) ISA version even on code that uses no new instruction,
    which an older driver refuses; Kiln's plain kernels are exact under the older stamp.
    """
    v = ctypes.c_int()
    if d.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    isa = ptx_isa_for_driver(v.value)
    if isa is None:
        return None
    out, n = re.subn(rb"^\.version\s+\d+\.\d+", f".version {isa[0]}.{isa[1]}".encode(), image, count=1, flags=re.M)
    return out if n else None
