"""CUDA support in the runtime: the ``cuda`` device API and the ``cuda`` module type.

(The file is ``cuda_driver.py``, not ``cuda.py``: a submodule named ``cuda`` would replace
the ``kiln.runtime.cuda()`` device constructor as soon as it is imported.)

Everything here talks to the **CUDA driver API** (``libcuda.so.1``, installed with the NVIDIA
driver) through ctypes, so the runtime keeps its NumPy + standard-library-only rule and a
deploy machine needs no CUDA toolkit. The driver is opened lazily, on the first call that
needs it: importing this module, constructing ``kiln.cuda()`` or asking ``.exist`` on a
machine without a GPU is cheap and never raises.

Pieces:

* :class:`CUDADeviceAPI` — allocation, copies, streams and attributes of device type 2
  (``kiln.cuda()``), registered with :func:`~kiln.runtime.device.register_device_api`.
  Every device is used through its *primary context*, the context the CUDA runtime and
  other frameworks (PyTorch, CuPy) share, so memory can be exchanged with them.
* :class:`CUDAModule` — type key ``"cuda"``: PTX (or a cubin) plus a function table that
  says, for every packed function, which kernels to launch with which grid/block sizes and
  which of the function's arguments each kernel takes. ``get_function(name)`` returns a
  Python-callable function that launches them; the graph executor calls it between its
  native segments.
* :func:`encode_payload` / :func:`decode_payload` — the binary format of the module in a
  library blob (``docs/devices.md``, section "CUDA module binary format");
  :func:`describe_payload` summarizes a payload for ``kiln inspect`` without a driver.

Environment: ``KILN_CUDA_LIBRARY`` names the driver library to open instead of
``libcuda.so.1`` (tests point it at a missing file to see the "no CUDA" error).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .device import ALLOC_ALIGNMENT, Device, DeviceAPI, DeviceType, register_device_api
from .errors import DeviceError, FormatError, InputError, KernelError, KilnError
from .module import Module
from .registry import register_loader, register_payload_describer

__all__ = [
    "CUDADeviceAPI",
    "CUDAModule",
    "CUDAArg",
    "CUDALaunch",
    "CUDAFunction",
    "encode_payload",
    "decode_payload",
    "describe_payload",
    "loadbinary_cuda",
    "driver_library_name",
    "is_available",
    "PAYLOAD_MAGIC",
    "PAYLOAD_VERSION",
    "ptx_isa_for_driver",
]

TYPE_KEY = "cuda"

#: First 8 bytes of a ``cuda`` module payload.
PAYLOAD_MAGIC = b"KILNCUDA"
#: Version of the payload layout written by :func:`encode_payload`.
PAYLOAD_VERSION = 1

#: Argument kinds in the function table.
ARG_TENSOR, ARG_INT, ARG_FLOAT = 0, 1, 2
_ARG_KIND_NAMES = {ARG_TENSOR: "tensor", ARG_INT: "int", ARG_FLOAT: "float"}

_INSTALL_HINT = (
    "install the NVIDIA driver (it provides libcuda.so.1; the CUDA toolkit is not needed to run "
    "a compiled model), or set KILN_CUDA_LIBRARY to the driver library's path"
)


# =====================================================================================
# binary format
# =====================================================================================
@dataclass(frozen=True)
class CUDAArg:
    """One argument of a packed function in a ``cuda`` module.

    Attributes
    ----------
    kind : int
        ``ARG_TENSOR`` (0; passed to kernels as a device pointer), ``ARG_INT`` (1) or
        ``ARG_FLOAT`` (2) scalars.
    dtype : str
        Element dtype of a tensor, or the scalar's dtype (``"int32"``, ``"float32"`` ...).
    shape : tuple of int
        Static shape of a tensor argument (``()`` for scalars); checked at call time.
    """

    kind: int
    dtype: str
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class CUDALaunch:
    """One kernel launch of a packed function.

    Attributes
    ----------
    kernel : str
        Name of the ``.entry`` in the PTX (``extern "C"`` kernel name).
    grid, block : tuple of 3 ints
        Launch dimensions (shapes are static, so they are fixed at compile time).
    shared_bytes : int
        Dynamic shared memory per block.
    args : tuple of int
        Indices into the packed function's arguments, in the kernel's parameter order.
    """

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    args: tuple[int, ...] = ()


@dataclass(frozen=True)
class CUDAFunction:
    """A packed function of a ``cuda`` module: its arguments and the launches it makes.

    Attributes
    ----------
    name : str
        The packed function's name (what the graph JSON's ``func_name`` says).
    args : tuple of CUDAArg
        Its arguments, in call order.
    launches : tuple of CUDALaunch
        The kernels it runs, in order, on one stream (the stream orders them).
    temps : tuple of int
        Byte sizes of device scratch buffers (intermediate tensors of multi-stage kernels,
        e.g. softmax row maxima). A launch argument index ``i >= len(args)`` means
        ``temps[i - len(args)]``. They are allocated once per device and reused.
    """

    name: str
    args: tuple[CUDAArg, ...]
    launches: tuple[CUDALaunch, ...]
    temps: tuple[int, ...] = ()


@dataclass
class CUDAPayload:
    """Decoded contents of a ``cuda`` module payload."""

    fmt: str  # "ptx" or "cubin"
    data: bytes
    source: str = ""
    arch: str = ""
    functions: list[CUDAFunction] = field(default_factory=list)


_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def _w_str(parts: list[bytes], s: str | bytes) -> None:
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    parts.append(_U64.pack(len(b)))
    parts.append(b)


def encode_payload(p: CUDAPayload) -> bytes:
    """Serialize a module to its blob payload (layout in ``docs/devices.md``).

    Parameters
    ----------
    p : CUDAPayload
        Format, binary, optional CUDA C source, target arch and function table.

    Returns
    -------
    bytes
    """
    if p.fmt not in ("ptx", "cubin"):
        raise KilnError(f"cuda module: binary format must be 'ptx' or 'cubin', got {p.fmt!r}")
    parts: list[bytes] = [PAYLOAD_MAGIC, _U32.pack(PAYLOAD_VERSION)]
    _w_str(parts, p.fmt)
    _w_str(parts, p.arch)
    _w_str(parts, p.data)
    _w_str(parts, p.source)
    parts.append(_U64.pack(len(p.functions)))
    for f in p.functions:
        _w_str(parts, f.name)
        parts.append(_U64.pack(len(f.args)))
        for a in f.args:
            parts.append(_U8.pack(a.kind))
            _w_str(parts, a.dtype)
            parts.append(_U64.pack(len(a.shape)))
            parts.extend(_I64.pack(int(d)) for d in a.shape)
        parts.append(_U64.pack(len(f.temps)))
        parts.extend(_U64.pack(int(n)) for n in f.temps)
        parts.append(_U64.pack(len(f.launches)))
        for ln in f.launches:
            _w_str(parts, ln.kernel)
            parts.extend(_U32.pack(int(v)) for v in (*ln.grid, *ln.block, ln.shared_bytes))
            parts.append(_U64.pack(len(ln.args)))
            parts.extend(_U32.pack(int(i)) for i in ln.args)
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes | memoryview, where: str) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.where = where

    def fail(self, msg: str) -> FormatError:
        return FormatError(f"{self.where}: {msg} at offset {self.pos} (payload is {len(self.data)} bytes)")

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise self.fail(f"truncated: {what} needs {n} bytes, {len(self.data) - self.pos} left")
        b = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return b

    def unpack(self, s: struct.Struct, what: str) -> int:
        return s.unpack(self.take(s.size, what))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        n = self.unpack(_U64, what)
        # Bound every count by the bytes left so a corrupt count fails before allocating.
        if n * min_item_bytes > len(self.data) - self.pos:
            raise self.fail(f"implausible {what} {n} (only {len(self.data) - self.pos} bytes left)")
        return n

    def string(self, what: str) -> str:
        b = self.take(self.unpack(_U64, f"{what} length"), what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def decode_payload(data: bytes | memoryview, where: str = "cuda module") -> CUDAPayload:
    """Parse a ``cuda`` module payload (pure parsing; needs no driver).

    Raises
    ------
    FormatError
        On a bad magic, an unknown version or a truncated/corrupt payload (with the offset).
    """
    r = _Reader(data, where)
    magic = r.take(len(PAYLOAD_MAGIC), "magic")
    if magic != PAYLOAD_MAGIC:
        raise FormatError(f"{where}: not a Kiln cuda module payload (magic {magic!r}, expected {PAYLOAD_MAGIC!r})")
    version = r.unpack(_U32, "version")
    if version != PAYLOAD_VERSION:
        raise FormatError(
            f"{where}: cuda module payload version {version} is not supported (this Kiln reads version "
            f"{PAYLOAD_VERSION}); rebuild the library with this Kiln"
        )
    fmt = r.string("binary format")
    if fmt not in ("ptx", "cubin"):
        raise FormatError(f"{where}: binary format must be 'ptx' or 'cubin', got {fmt!r}")
    arch = r.string("arch")
    binary = r.take(r.unpack(_U64, "binary length"), "binary")
    source = r.string("source")
    funcs: list[CUDAFunction] = []
    for _ in range(r.count("function count", 24)):
        name = r.string("function name")
        args = []
        for _ in range(r.count(f"argument count of {name!r}", 17)):
            kind = r.unpack(_U8, "argument kind")
            if kind not in _ARG_KIND_NAMES:
                raise r.fail(f"function {name!r}: unknown argument kind {kind}")
            dtype = r.string("argument dtype")
            ndim = r.count("argument ndim", 8)
            shape = tuple(r.unpack(_I64, "argument shape") for _ in range(ndim))
            args.append(CUDAArg(kind, dtype, shape))
        temps = tuple(r.unpack(_U64, "temp size") for _ in range(r.count(f"temp count of {name!r}", 8)))
        launches = []
        for _ in range(r.count(f"launch count of {name!r}", 40)):
            kernel = r.string("kernel name")
            dims = [r.unpack(_U32, "launch dims") for _ in range(7)]
            kargs = tuple(r.unpack(_U32, "kernel argument index") for _ in range(r.count("kernel argument count", 4)))
            for i in kargs:
                if i >= len(args) + len(temps):
                    raise r.fail(f"kernel {kernel!r} of {name!r} takes argument {i}, but {name!r} has "
                                 f"{len(args)} arguments and {len(temps)} temporaries")
            launches.append(CUDALaunch(kernel, tuple(dims[0:3]), tuple(dims[3:6]), dims[6], kargs))  # type: ignore[arg-type]
        funcs.append(CUDAFunction(name, tuple(args), tuple(launches), temps))
    if r.pos != len(r.data):
        raise r.fail(f"{len(r.data) - r.pos} trailing bytes after the function table")
    return CUDAPayload(fmt, binary, source, arch, funcs)


def describe_payload(data: bytes | memoryview) -> dict[str, Any]:
    """Summarize a ``cuda`` payload for ``kiln inspect`` (no driver, no library code).

    Returns
    -------
    dict
        ``format``, ``arch``, ``binary_bytes``, ``source_bytes``, ``functions`` (name and
        argument count) and ``kernels`` (name, grid, block, shared bytes).
    """
    p = decode_payload(data)
    kernels: dict[str, dict[str, Any]] = {}
    for f in p.functions:
        for ln in f.launches:
            kernels.setdefault(
                ln.kernel,
                {"name": ln.kernel, "grid": list(ln.grid), "block": list(ln.block), "shared_bytes": ln.shared_bytes},
            )
    return {
        "format": p.fmt,
        "arch": p.arch,
        "binary_bytes": len(p.data),
        "source_bytes": len(p.source.encode("utf-8")),
        "functions": [{"name": f.name, "num_args": len(f.args), "launches": len(f.launches),
                       "temp_bytes": sum(f.temps)} for f in p.functions],
        "kernels": list(kernels.values()),
    }


# =====================================================================================
# the driver
# =====================================================================================
def driver_library_name() -> str:
    """The driver library Kiln opens: ``$KILN_CUDA_LIBRARY`` or the platform's default."""
    env = os.environ.get("KILN_CUDA_LIBRARY")
    if env:
        return env
    return "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"


_c_int, _c_uint, _c_size = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t
_c_void_p, _c_char_p = ctypes.c_void_p, ctypes.c_char_p
_CUdeviceptr = ctypes.c_uint64
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
    "cuMemAlloc_v2": [_P(_CUdeviceptr), _c_size],
    "cuMemFree_v2": [_CUdeviceptr],
    "cuMemGetInfo_v2": [_P(_c_size), _P(_c_size)],
    "cuMemcpyHtoD_v2": [_CUdeviceptr, _c_void_p, _c_size],
    "cuMemcpyDtoH_v2": [_c_void_p, _CUdeviceptr, _c_size],
    "cuMemcpyDtoD_v2": [_CUdeviceptr, _CUdeviceptr, _c_size],
    "cuMemcpyHtoDAsync_v2": [_CUdeviceptr, _c_void_p, _c_size, _c_void_p],
    "cuMemcpyDtoHAsync_v2": [_c_void_p, _CUdeviceptr, _c_size, _c_void_p],
    "cuMemcpyDtoDAsync_v2": [_CUdeviceptr, _CUdeviceptr, _c_size, _c_void_p],
    "cuMemcpyPeer": [_CUdeviceptr, _c_void_p, _CUdeviceptr, _c_void_p, _c_size],
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
_ATTR_CODES = {
    "max_threads_per_block": 1,
    "max_shared_memory_per_block": 8,
    "warp_size": 10,
    "max_registers_per_block": 12,
    "max_clock_rate": 13,
    "multi_processor_count": 16,
    "l2_cache_size_bytes": 38,
}
_CC_MAJOR, _CC_MINOR = 75, 76
_MAX_BLOCK_DIM = (2, 3, 4)
_CUDA_ERROR_NO_DEVICE = 100
_CU_JIT_ERROR_LOG_BUFFER, _CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 5, 6
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
_STATIC_SHARED_LIMIT = 48 * 1024


class _Driver:
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
        if self.init_error is not None:
            detail = self.error_text(self.init_error)
            if self.init_error == _CUDA_ERROR_NO_DEVICE:
                raise DeviceError(f"no CUDA device found (cuInit: {detail}); is an NVIDIA GPU present and visible "
                                  "(CUDA_VISIBLE_DEVICES)?")
            raise DeviceError(f"the CUDA driver {self.path} failed to initialize (cuInit: {detail})")
        if not 0 <= device_id < self.device_count:
            raise DeviceError(f"CUDA device {device_id} does not exist; this machine has {self.device_count} "
                              f"CUDA device(s)")


_DRIVER: _Driver | None = None
_DRIVER_ERROR: DeviceError | None = None
_DRIVER_LOCK = threading.Lock()


def _driver() -> _Driver:
    """The process's driver, opened on first use.

    Raises
    ------
    DeviceError
        When the driver library is missing, naming it and what to install.
    """
    global _DRIVER, _DRIVER_ERROR
    if _DRIVER is not None:
        return _DRIVER
    with _DRIVER_LOCK:
        if _DRIVER is None:
            if _DRIVER_ERROR is not None:
                raise _DRIVER_ERROR
            name = driver_library_name()
            try:
                lib = ctypes.CDLL(name)
            except OSError as err:
                _DRIVER_ERROR = DeviceError(f"CUDA driver library {name} not found ({err}); {_INSTALL_HINT}")
                raise _DRIVER_ERROR from None
            _DRIVER = _Driver(lib, name)
    return _DRIVER


def _reset_driver() -> None:
    """Forget the opened driver (tests that switch ``KILN_CUDA_LIBRARY`` call this)."""
    global _DRIVER, _DRIVER_ERROR
    with _DRIVER_LOCK:
        _DRIVER, _DRIVER_ERROR = None, None


def is_available(device_id: int = 0) -> bool:
    """Whether the CUDA driver loads and device ``device_id`` exists (never raises)."""
    try:
        d = _driver()
        d.require_device(device_id)
        return True
    except DeviceError:
        return False


# =====================================================================================
# the device API
# =====================================================================================
class CUDADeviceAPI(DeviceAPI):
    """Device type 2 over the CUDA driver API (see the module docstring).

    Pointers are ``CUdeviceptr`` values (plain ints in the device's address space). Copies
    and launches go to the legacy default stream unless a stream is given, so a blocking
    device-to-host copy after a kernel already waits for that kernel.
    """

    host_visible = False

    def set_device(self, dev: Device) -> None:
        _driver().context(dev.device_id)

    def get_attr(self, dev: Device, kind: str) -> Any:
        if kind == "exist":
            return is_available(dev.device_id)
        d = _driver()
        d.context(dev.device_id)
        cudev = ctypes.c_int()
        d.check(d.cuDeviceGet(ctypes.byref(cudev), dev.device_id), "cuDeviceGet")

        def attr(code: int) -> int:
            v = ctypes.c_int()
            d.check(d.cuDeviceGetAttribute(ctypes.byref(v), code, cudev.value), f"cuDeviceGetAttribute({code})")
            return v.value

        if kind in _ATTR_CODES:
            return attr(_ATTR_CODES[kind])
        if kind == "compute_version":
            return f"{attr(_CC_MAJOR)}.{attr(_CC_MINOR)}"
        if kind == "device_name":
            buf = ctypes.create_string_buffer(256)
            d.check(d.cuDeviceGetName(buf, 256, cudev.value), "cuDeviceGetName")
            return buf.value.decode(errors="replace")
        if kind == "max_thread_dimensions":
            return [attr(c) for c in _MAX_BLOCK_DIM]
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
        d = _driver()
        d.context(dev.device_id)
        ptr = _CUdeviceptr()
        # A zero-byte array still needs a unique, valid pointer.
        rc = d.cuMemAlloc_v2(ctypes.byref(ptr), max(nbytes, 1))
        if rc != 0:
            raise DeviceError(f"CUDA allocation of {nbytes} bytes on {dev} failed: {d.error_text(rc)}")
        return int(ptr.value)

    def free_data_space(self, dev: Device, ptr: int) -> None:
        d = _DRIVER
        if d is None:
            # The driver that allocated ptr was forgotten (_reset_driver): its context is gone
            # and ptr means nothing to a new one. Calling _driver() here could also deadlock:
            # NDArray.__del__ runs from garbage collection, possibly inside _driver()'s lock.
            return
        d.context(dev.device_id)
        d.check(d.cuMemFree_v2(ptr), f"cuMemFree on {dev}")

    def copy_data_from_to(
        self,
        src_ptr: int,
        src_offset: int,
        dst_ptr: int,
        dst_offset: int,
        nbytes: int,
        src_dev: Device,
        dst_dev: Device,
        stream: Any = None,
    ) -> None:
        if not nbytes:
            return
        d = _driver()
        s, dst = src_ptr + src_offset, dst_ptr + dst_offset
        src_cuda = src_dev.device_type == DeviceType.CUDA
        dst_cuda = dst_dev.device_type == DeviceType.CUDA
        if src_cuda and dst_cuda:
            if src_dev.device_id == dst_dev.device_id:
                d.context(src_dev.device_id)
                if stream is None:
                    d.check(d.cuMemcpyDtoD_v2(dst, s, nbytes), "cuMemcpyDtoD")
                else:
                    d.check(d.cuMemcpyDtoDAsync_v2(dst, s, nbytes, stream), "cuMemcpyDtoDAsync")
            else:
                sctx, dctx = d.context(src_dev.device_id), d.context(dst_dev.device_id)
                if not hasattr(d, "cuMemcpyPeer"):
                    raise DeviceError(f"copy {src_dev} -> {dst_dev}: this CUDA driver has no cuMemcpyPeer")
                d.check(d.cuMemcpyPeer(dst, dctx, s, sctx, nbytes), "cuMemcpyPeer")
        elif dst_cuda and src_dev.host_visible:
            d.context(dst_dev.device_id)
            if stream is None:
                d.check(d.cuMemcpyHtoD_v2(dst, s, nbytes), "cuMemcpyHtoD")
            else:
                d.check(d.cuMemcpyHtoDAsync_v2(dst, s, nbytes, stream), "cuMemcpyHtoDAsync")
        elif src_cuda and dst_dev.host_visible:
            d.context(src_dev.device_id)
            if stream is None:
                d.check(d.cuMemcpyDtoH_v2(dst, s, nbytes), "cuMemcpyDtoH")
            else:
                d.check(d.cuMemcpyDtoHAsync_v2(dst, s, nbytes, stream), "cuMemcpyDtoHAsync")
        else:
            raise DeviceError(f"the CUDA device API cannot copy between {src_dev} and {dst_dev}")

    def create_stream(self, dev: Device) -> Any:
        d = _driver()
        d.context(dev.device_id)
        s = ctypes.c_void_p()
        d.check(d.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return int(s.value or 0)

    def free_stream(self, dev: Device, stream: Any) -> None:
        if stream:
            d = _driver()
            d.context(dev.device_id)
            d.check(d.cuStreamDestroy_v2(stream), "cuStreamDestroy")

    def stream_sync(self, dev: Device, stream: Any) -> None:
        d = _driver()
        d.context(dev.device_id)
        if stream is None:
            d.check(d.cuCtxSynchronize(), f"synchronize {dev}")
        else:
            d.check(d.cuStreamSynchronize(stream), f"cuStreamSynchronize on {dev}")

    def set_stream(self, dev: Device, stream: Any) -> None:
        _STREAMS[dev.device_id] = stream


# Stream that kernels of a device are launched on (None: legacy default stream).
_STREAMS: dict[int, Any] = {}

_API = CUDADeviceAPI()
register_device_api(DeviceType.CUDA, _API, override=True)


# =====================================================================================
# the module
# =====================================================================================
_NDArray: Any = None


def _ndarray_cls() -> Any:
    global _NDArray
    if _NDArray is None:
        from .ndarray import NDArray

        _NDArray = NDArray
    return _NDArray


_SCALAR_CTYPES: dict[str, Any] = {
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool,
}


class _Launcher:
    """The Python packed function that launches one function's kernels on its argument's device."""

    def __init__(self, module: "CUDAModule", func: CUDAFunction) -> None:
        self.module = module
        self.func = func
        self.name = func.name
        self._handles: dict[int, list[int]] = {}  # device id -> CUfunction per launch
        self._temps: dict[int, list[Any]] = {}  # device id -> CUdeviceptr per temp (kept for reuse)
        self._temp_allocs: list[tuple[Device, int]] = []
        # (device id + argument values) -> launch plan of the previous call: the graph executor
        # calls each function with the same arrays every run, so the plan is built once.
        self._last: tuple[tuple[Any, ...], list[Any]] | None = None

    def _kernels(self, device_id: int) -> list[int]:
        hs = self._handles.get(device_id)
        if hs is None:
            hs = [self.module._kernel_handle(device_id, ln) for ln in self.func.launches]
            self._handles[device_id] = hs
        return hs

    def _temp_ptrs(self, device_id: int) -> list[Any]:
        ts = self._temps.get(device_id)
        if ts is None:
            dev = Device(DeviceType.CUDA, device_id)
            ts = []
            for n in self.func.temps:
                p = _API.alloc_data_space(dev, n)
                self._temp_allocs.append((dev, p))
                ts.append(_CUdeviceptr(p))
            self._temps[device_id] = ts
        return ts

    def __del__(self) -> None:
        for dev, p in getattr(self, "_temp_allocs", ()):
            try:
                _API.free_data_space(dev, p)
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    def _bad_arg(self, i: int, a: Any, device_id: int | None) -> InputError:
        f, spec = self.func, self.func.args[i]
        dev: Any = getattr(a, "device", None)
        if not isinstance(a, _ndarray_cls()):
            return InputError(f"cuda function {f.name!r}: argument {i} must be an NDArray on a CUDA device, "
                              f"got {type(a).__name__}")
        if dev.device_type != DeviceType.CUDA:
            return InputError(f"cuda function {f.name!r}: argument {i} is on {dev}, expected a cuda device")
        if device_id is not None and dev.device_id != device_id:
            return InputError(f"cuda function {f.name!r}: argument {i} is on {dev}, but the first tensor "
                              f"argument is on cuda({device_id})")
        return InputError(f"cuda function {f.name!r}: argument {i} is {a.dtype}{list(a.shape)}, "
                          f"expected {spec.dtype}{list(spec.shape)}")

    def _prepare(self, device_id: int, key: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Kernel handles and parameter arrays for one set of argument values (cached)."""
        f = self.func
        values: list[Any] = []
        for spec, v in zip(f.args, key):
            if spec.kind == ARG_TENSOR:
                values.append(_CUdeviceptr(v))
            else:
                ct = _SCALAR_CTYPES.get(spec.dtype)
                if ct is None:
                    raise KilnError(f"cuda function {f.name!r}: unsupported scalar dtype {spec.dtype!r}")
                values.append(ct(v))
        if f.temps:
            values.extend(self._temp_ptrs(device_id))
        plan = []
        for ln, h in zip(f.launches, self._kernels(device_id)):
            params = (ctypes.c_void_p * max(len(ln.args), 1))(
                *[ctypes.cast(ctypes.byref(values[j]), ctypes.c_void_p) for j in ln.args])
            dims = tuple(ctypes.c_uint(int(v)) for v in (*ln.grid, *ln.block, ln.shared_bytes))
            plan.append(((ctypes.c_void_p(h), *dims), params, ln))
        # ``values`` must outlive ``params`` (which point into it): keep it in the plan.
        plan.append(values)  # type: ignore[arg-type]
        return plan

    def __call__(self, *args: Any) -> None:
        specs = self.func.args
        if len(args) != len(specs):
            raise InputError(f"cuda function {self.name!r} takes {len(specs)} arguments, got {len(args)}")
        key: list[Any] = []
        device_id: int | None = None
        for i, a in enumerate(args):
            spec = specs[i]
            if spec.kind == ARG_TENSOR:
                # Attribute access on NDArray's slots, checked cheaply: this runs per kernel call.
                try:
                    dev, h = a._device, a.handle
                    ok = dev.device_type == 2 and a._dtype == spec.dtype and (not spec.shape or a._shape == spec.shape)
                except AttributeError:
                    ok = False
                if not ok or (device_id is not None and dev.device_id != device_id):
                    raise self._bad_arg(i, a, device_id)
                device_id = dev.device_id
                key.append((h.data or 0) + h.byte_offset)
            else:
                key.append(a)
        if device_id is None:
            device_id = 0
        k = (device_id, *key)
        last = self._last
        if last is None or last[0] != k:
            last = (k, self._prepare(device_id, tuple(key)))
            self._last = last
        d = _driver()
        d.context(device_id)
        stream = _STREAMS.get(device_id)
        stream = None if stream is None else ctypes.c_void_p(stream)
        launch = d.launch_raw
        plan = last[1]
        for j in range(len(plan) - 1):
            head, params, ln = plan[j]
            rc = launch(*head, stream, params, None)
            if rc != 0:
                raise KernelError(
                    f"launching CUDA kernel {ln.kernel!r} of {self.name!r} (grid {ln.grid}, block {ln.block}) "
                    f"failed: {d.error_text(rc)}"
                )

    def __repr__(self) -> str:
        return f"<cuda function {self.name} ({len(self.func.launches)} launches)>"


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


def _restamp_ptx(image: bytes, d: "_Driver") -> bytes | None:
    import re

    v = ctypes.c_int()
    if d.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    isa = ptx_isa_for_driver(v.value)
    if isa is None:
        return None
    out, n = re.subn(rb"^\.version\s+\d+\.\d+", f".version {isa[0]}.{isa[1]}".encode(), image, count=1, flags=re.M)
    return out if n else None


class CUDAModule(Module):
    """A module of CUDA kernels (type key ``"cuda"``).

    Parameters
    ----------
    data : bytes or str
        PTX text (``fmt="ptx"``) or a cubin image.
    fmt : str
        ``"ptx"`` or ``"cubin"``.
    functions : sequence of CUDAFunction
        The function table (see :class:`CUDAFunction`).
    source : str, optional
        The CUDA C source the binary was compiled from (kept for ``get_source``).
    arch : str, optional
        The architecture it was compiled for (``"sm_80"``), informative.

    Notes
    -----
    The binary is handed to the driver (``cuModuleLoadDataEx``) the first time a function
    runs on a device; a PTX image is JIT-compiled by the driver then, for the GPU present.
    """

    type_key = TYPE_KEY

    def __init__(self, data: bytes | str, fmt: str, functions: Sequence[CUDAFunction], source: str = "",
                 arch: str = "") -> None:
        super().__init__()
        if isinstance(data, str):
            data = data.encode("utf-8")
        if fmt not in ("ptx", "cubin"):
            raise KilnError(f"CUDAModule: fmt must be 'ptx' or 'cubin', got {fmt!r}")
        self.data = bytes(data)
        self.fmt = fmt
        self.source = source
        self.arch = arch
        self.functions = {f.name: f for f in functions}
        self._modules: dict[int, int] = {}  # device id -> CUmodule
        self._launchers: dict[str, _Launcher] = {}
        self._lock = threading.Lock()

    # -------------------------------------------------------------- functions
    def _get_local_function(self, name: str) -> Callable[..., Any] | None:
        f = self.functions.get(name)
        if f is None:
            return None
        la = self._launchers.get(name)
        if la is None:
            la = self._launchers.setdefault(name, _Launcher(self, f))
        return la

    def _cu_module(self, device_id: int) -> int:
        m = self._modules.get(device_id)
        if m is not None:
            return m
        with self._lock:
            m = self._modules.get(device_id)
            if m is None:
                d = _driver()
                d.context(device_id)
                image = self.data + (b"\0" if self.fmt == "ptx" else b"")  # PTX must be NUL-terminated
                log = ctypes.create_string_buffer(8192)
                opts = (ctypes.c_int * 2)(_CU_JIT_ERROR_LOG_BUFFER, _CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
                vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
                mod = ctypes.c_void_p()
                rc = d.cuModuleLoadDataEx(ctypes.byref(mod), image, 2, opts, vals)
                if rc == _CUDA_ERROR_UNSUPPORTED_PTX_VERSION and self.fmt == "ptx":
                    # NVRTC stamps its own (newest) PTX ISA version even on code that uses no
                    # new instruction; an older driver refuses it. Retry once stamped with the
                    # newest ISA this driver accepts, which is exact for Kiln's plain kernels.
                    retry = _restamp_ptx(image, d)
                    if retry is not None:
                        log = ctypes.create_string_buffer(8192)
                        vals[0] = ctypes.cast(log, ctypes.c_void_p)
                        rc = d.cuModuleLoadDataEx(ctypes.byref(mod), retry, 2, opts, vals)
                if rc != 0:
                    jit = log.value.decode(errors="replace").strip()
                    hint = ""
                    if self.fmt == "ptx" and "UNSUPPORTED_PTX_VERSION" in d.error_text(rc):
                        hint = ("; the PTX was made by a newer NVRTC than this driver supports: update the driver "
                                "or compile with an NVRTC no newer than the driver's CUDA version")
                    raise DeviceError(
                        f"the CUDA driver rejected the {self.fmt} of this module (arch {self.arch or '?'}) on "
                        f"cuda({device_id}): {d.error_text(rc)}{hint}" + (f"\n{jit}" if jit else "")
                    )
                m = int(mod.value or 0)
                self._modules[device_id] = m
        return m

    def _kernel_handle(self, device_id: int, ln: CUDALaunch) -> int:
        d = _driver()
        m = self._cu_module(device_id)
        fn = ctypes.c_void_p()
        rc = d.cuModuleGetFunction(ctypes.byref(fn), m, ln.kernel.encode("utf-8"))
        if rc != 0:
            raise KernelError(f"cuda module has no kernel {ln.kernel!r}: {d.error_text(rc)}")
        if ln.shared_bytes > _STATIC_SHARED_LIMIT and hasattr(d, "cuFuncSetAttribute"):
            d.check(d.cuFuncSetAttribute(fn.value, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ln.shared_bytes),
                    f"cuFuncSetAttribute({ln.kernel})")
        return int(fn.value or 0)

    # -------------------------------------------------------------- serialization
    @property
    def is_runnable(self) -> bool:
        return is_available()

    def save_to_binary(self) -> bytes:
        return encode_payload(CUDAPayload(self.fmt, self.data, self.source, self.arch, list(self.functions.values())))

    def get_source(self, fmt: str = "") -> str:
        """``"cu"``/``"cuda"`` (default): the CUDA C source; ``"ptx"``: the PTX text."""
        if fmt in ("", "cu", "cuda"):
            return self.source or (self.data.decode("utf-8", "replace") if self.fmt == "ptx" else "")
        if fmt == "ptx":
            return self.data.decode("utf-8", "replace") if self.fmt == "ptx" else ""
        raise KilnError(f"cuda module: unknown source format {fmt!r}; use 'cu' or 'ptx'")

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Write the binary (``.ptx``/``.cubin``) or, for ``.cu``, the source."""
        p = os.fspath(path)
        fmt = fmt or os.path.splitext(p)[1].lstrip(".")
        if fmt in ("cu", "cuda"):
            with open(p, "w", encoding="utf-8") as fh:
                fh.write(self.source)
        elif fmt in ("ptx", "cubin", self.fmt):
            with open(p, "wb") as fh:
                fh.write(self.data)
        else:
            raise KilnError(f"cuda module: cannot save as {fmt!r}; use .cu, .ptx or .cubin")

    def __repr__(self) -> str:
        return (f"CUDAModule({self.fmt}, {len(self.data)} bytes, arch={self.arch or '?'}, "
                f"functions={sorted(self.functions)})")


def loadbinary_cuda(payload: bytes) -> CUDAModule:
    """Loader of ``cuda`` modules (``loadbinary_cuda``): parse the payload, check the driver.

    Raises
    ------
    FormatError
        On a malformed payload.
    DeviceError
        When the CUDA driver or a GPU is missing; the message says what to install. A library
        holding a ``cuda`` module can still be inspected (``kiln inspect``) without either.
    """
    p = decode_payload(payload)
    try:
        _driver().require_device(0)
    except DeviceError as err:
        raise DeviceError(f"cannot load a cuda device module (kernels: "
                          f"{', '.join(f.name for f in p.functions[:5])}{', ...' if len(p.functions) > 5 else ''}): "
                          f"{err}") from None
    return CUDAModule(p.data, p.fmt, p.functions, p.source, p.arch)


register_loader(TYPE_KEY, loadbinary_cuda, override=True)
register_payload_describer(TYPE_KEY, describe_payload, override=True)
