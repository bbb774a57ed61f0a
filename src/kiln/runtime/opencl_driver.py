"""OpenCL devices and the ``opencl`` module type, over ``libOpenCL.so.1`` through ctypes.

(The file is ``opencl_driver.py``: a submodule named ``opencl`` would replace the
``kiln.runtime.opencl()`` device constructor as soon as it is imported.)

Nothing here touches the OpenCL runtime at import time: the library is opened on first use
(first allocation, attribute query or kernel launch), so a library built for OpenCL can be
loaded and inspected on a machine without it. ``KILN_OPENCL_LIBRARY`` overrides the
library name or path (used by tests to simulate a missing runtime).

Device API
----------
:class:`OpenCLDeviceAPI` serves DLPack device type 4 (``kiln.opencl(i)``). Devices are all
devices of all platforms, in platform order; device ``i`` has its own context and in-order
command queue. Pointers handed out are ``cl_mem`` handles (not host addresses); copies go
through ``clEnqueueRead/Write/CopyBuffer`` (blocking, so host memory is ready on return).

Module ``opencl``
-----------------
:class:`OpenCLModule` holds kernel source and launch metadata (see
:mod:`kiln.codegen.gpu_source`). ``get_function(name)`` returns a packed function taking the
function's tensors (NDArrays on an OpenCL device) that launches its kernels in order.
The program is built for a device the first time a function runs on it.

Binary format (``save_to_binary``, read by ``loadbinary_opencl``), little-endian::

    8 bytes  magic b"KILNOCL\\0"
    u32      format version (1)
    u32      reserved (0)
    u64 n, n bytes   kernel source (UTF-8)
    u64 n, n bytes   metadata JSON (UTF-8): {"fmt": "cl", "functions": [GPUFunctionInfo...]}
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .device import Device, DeviceAPI, DeviceType, register_device_api
from .errors import DeviceError, FormatError, InputError, KernelError
from .module import Module
from . import registry as _registry
from .registry import register_loader

__all__ = ["OpenCLDeviceAPI", "OpenCLModule", "opencl_module", "OPENCL_LIBRARY_ENV", "MAGIC", "FORMAT_VERSION"]

#: Environment variable naming the OpenCL ICD loader library to open.
OPENCL_LIBRARY_ENV = "KILN_OPENCL_LIBRARY"
MAGIC = b"KILNOCL\0"
FORMAT_VERSION = 1
_DEFAULT_LIB = "libOpenCL.so.1"
_INSTALL_HINT = "install ocl-icd-libopencl1 and a driver such as pocl-opencl-icd"

_c = ctypes
_vp = _c.c_void_p
_sz = _c.c_size_t
_u32 = _c.c_uint32
_i32 = _c.c_int32
_u64 = _c.c_uint64

# cl.h constants used here
_CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
_CL_MEM_READ_WRITE = 1
_CL_PROGRAM_BUILD_LOG = 0x1183
_INFO = {
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


def _err_name(code: int) -> str:
    return _ERRORS.get(code, f"error {code}")


class _CLRuntime:
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
                                  f"library ({_INSTALL_HINT})") from None
            f.restype, f.argtypes = res, args
            setattr(self, fname, f)
        self.devices: list[int] = self._enumerate()
        self.contexts: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise DeviceError(f"OpenCL {what} failed: {_err_name(code)}")

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
        if dev.device_id >= len(self.devices):
            raise DeviceError(
                f"{dev} does not exist: the OpenCL runtime ({self.name}) reports {len(self.devices)} device(s)"
                + ("" if self.devices else f"; no OpenCL driver is installed ({_INSTALL_HINT})")
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
        code, kind = _INFO[key]
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


_RUNTIME: _CLRuntime | None = None
_RUNTIME_LOCK = threading.Lock()


def _runtime() -> _CLRuntime:
    """Open the OpenCL library (once); raises :class:`DeviceError` naming what to install."""
    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME
    with _RUNTIME_LOCK:
        if _RUNTIME is None:
            name = os.environ.get(OPENCL_LIBRARY_ENV) or _DEFAULT_LIB
            try:
                lib = ctypes.CDLL(name)
            except OSError as err:
                raise DeviceError(f"OpenCL runtime {name} not found ({err}); {_INSTALL_HINT}") from None
            _RUNTIME = _CLRuntime(lib, name)
    return _RUNTIME


class OpenCLDeviceAPI(DeviceAPI):
    """DeviceAPI of OpenCL devices (DLPack device type 4). Pointers are ``cl_mem`` handles."""

    host_visible = False

    def get_attr(self, dev: Device, kind: str) -> Any:
        if kind == "exist":
            try:
                return dev.device_id < len(_runtime().devices)
            except DeviceError:
                return False
        if kind not in _INFO:
            return None
        return _runtime().device_info(dev, kind)

    def alloc_data_space(self, dev: Device, nbytes: int, alignment: int, dtype: Any = None) -> int:
        rt = _runtime()
        ctx, _ = rt.context_queue(dev)
        err = _i32(0)
        # a zero-byte cl_mem is invalid; one byte keeps empty tensors addressable
        mem = rt.clCreateBuffer(ctx, _CL_MEM_READ_WRITE, max(int(nbytes), 1), None, _c.byref(err))
        if err.value != 0 or not mem:
            raise DeviceError(f"OpenCL: cannot allocate {nbytes} bytes on {dev}: {_err_name(err.value)}")
        return int(mem)

    def free_data_space(self, dev: Device, ptr: int) -> None:
        rt = _runtime()
        rt.check(rt.clReleaseMemObject(ptr), f"clReleaseMemObject on {dev}")

    def copy_data_from_to(self, src_ptr: int, src_offset: int, dst_ptr: int, dst_offset: int, nbytes: int,
                          src_dev: Device, dst_dev: Device, stream: Any = None) -> None:
        if not nbytes:
            return
        rt = _runtime()
        s_cl = src_dev.device_type == DeviceType.OPENCL
        d_cl = dst_dev.device_type == DeviceType.OPENCL
        if s_cl and d_cl and src_dev == dst_dev:
            _, q = rt.context_queue(src_dev)
            rt.check(rt.clEnqueueCopyBuffer(q, src_ptr, dst_ptr, src_offset, dst_offset, nbytes, 0, None, None),
                     "clEnqueueCopyBuffer")
            rt.check(rt.clFinish(q), "clFinish")
        elif s_cl and d_cl:  # two OpenCL devices (two contexts): stage through host memory
            tmp = (_c.c_ubyte * nbytes)()
            self.copy_data_from_to(src_ptr, src_offset, _c.addressof(tmp), 0, nbytes, src_dev, Device(1, 0))
            self.copy_data_from_to(_c.addressof(tmp), 0, dst_ptr, dst_offset, nbytes, Device(1, 0), dst_dev)
        elif s_cl:
            if not dst_dev.host_visible:
                raise DeviceError(f"OpenCL cannot copy from {src_dev} to {dst_dev} directly")
            _, q = rt.context_queue(src_dev)
            rt.check(rt.clEnqueueReadBuffer(q, src_ptr, 1, src_offset, nbytes, dst_ptr + dst_offset, 0, None, None),
                     f"clEnqueueReadBuffer from {src_dev}")
        elif d_cl:
            if not src_dev.host_visible:
                raise DeviceError(f"OpenCL cannot copy from {src_dev} to {dst_dev} directly")
            _, q = rt.context_queue(dst_dev)
            rt.check(rt.clEnqueueWriteBuffer(q, dst_ptr, 1, dst_offset, nbytes, src_ptr + src_offset, 0, None, None),
                     f"clEnqueueWriteBuffer to {dst_dev}")
        else:
            raise DeviceError(f"the OpenCL device API cannot copy between {src_dev} and {dst_dev}")

    def stream_sync(self, dev: Device, stream: Any) -> None:
        rt = _runtime()
        _, q = rt.context_queue(dev)
        rt.check(rt.clFinish(q), f"clFinish on {dev}")


# ------------------------------------------------------------------------------------------
# the module type


class _Program:
    """The program and kernel objects of one module on one device."""

    def __init__(self, rt: _CLRuntime, dev: Device, source: str, kernel_names: Sequence[str]) -> None:
        ctx, self.queue = rt.context_queue(dev)
        did = _vp(rt.device(dev))
        src = source.encode("utf-8")
        strings = (_c.c_char_p * 1)(src)
        lengths = (_sz * 1)(len(src))
        err = _i32(0)
        prog = rt.clCreateProgramWithSource(ctx, 1, strings, lengths, _c.byref(err))
        rt.check(err.value, f"clCreateProgramWithSource on {dev}")
        rc = rt.clBuildProgram(prog, 1, _c.byref(did), b"", None, None)
        if rc != 0:
            n = _sz(0)
            rt.clGetProgramBuildInfo(prog, did, _CL_PROGRAM_BUILD_LOG, 0, None, _c.byref(n))
            log = _c.create_string_buffer(max(n.value, 1))
            rt.clGetProgramBuildInfo(prog, did, _CL_PROGRAM_BUILD_LOG, n.value, log, None)
            text = log.value.decode("utf-8", "replace").strip()
            raise KernelError(f"OpenCL program build failed on {dev} ({_err_name(rc)}):\n{text[:4000]}")
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


class OpenCLModule(Module):
    """A module of OpenCL kernels (type key ``"opencl"``), see the module docstring.

    Parameters
    ----------
    source : str
        OpenCL C source of every kernel.
    functions : list of dict
        Launch metadata per function (``GPUFunctionInfo.to_dict()`` of
        :mod:`kiln.codegen.gpu_source`).
    fmt : str
        Source format (``"cl"``).
    """

    type_key = "opencl"

    def __init__(self, source: str, functions: Sequence[dict[str, Any]], fmt: str = "cl") -> None:
        super().__init__()
        self.source = source
        self.fmt = fmt
        self.functions: dict[str, dict[str, Any]] = {}
        for f in functions:
            try:
                name = f["name"]
                for k in f["kernels"]:
                    k["name"], k["args"], k["grid"], k["block"]  # noqa: B018 - validate the layout
                f["params"], f["temps"]  # noqa: B018
            except (KeyError, TypeError) as err:
                raise FormatError(f"opencl module: malformed function metadata ({err!r}) in {f!r:.200}") from None
            self.functions[name] = f
        self._programs: dict[int, _Program] = {}
        self._temps: dict[tuple[int, str], list[Any]] = {}
        self._lock = threading.Lock()

    # ---- inspection --------------------------------------------------------------------
    def get_source(self, fmt: str = "") -> str:
        return self.source

    @property
    def function_names(self) -> list[str]:
        """Names of the functions this module defines."""
        return list(self.functions)

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Write the kernel source (``.cl``) and, next to it, the metadata (``.json``)."""
        base, _ = os.path.splitext(os.fspath(path))
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.source)
        with open(base + ".json", "w", encoding="utf-8") as fh:
            json.dump({"fmt": self.fmt, "functions": list(self.functions.values())}, fh, indent=1)

    def save_to_binary(self) -> bytes:
        src = self.source.encode("utf-8")
        meta = json.dumps({"fmt": self.fmt, "functions": list(self.functions.values())}).encode("utf-8")
        return b"".join([MAGIC, struct.pack("<II", FORMAT_VERSION, 0), struct.pack("<Q", len(src)), src,
                         struct.pack("<Q", len(meta)), meta])

    # ---- running -----------------------------------------------------------------------
    def _program(self, dev: Device) -> _Program:
        p = self._programs.get(dev.device_id)
        if p is None:
            with self._lock:
                p = self._programs.get(dev.device_id)
                if p is None:
                    names = [k["name"] for f in self.functions.values() for k in f["kernels"]]
                    p = _Program(_runtime(), dev, self.source, names)
                    self._programs[dev.device_id] = p
        return p

    def _temp_arrays(self, dev: Device, fname: str, temps: list[dict[str, Any]]) -> list[Any]:
        key = (dev.device_id, fname)
        arrs = self._temps.get(key)
        if arrs is None:
            from . import ndarray as nd

            arrs = [nd.empty((max(int(t["nbytes"]), 1),), "uint8", dev) for t in temps]
            self._temps[key] = arrs
        return arrs

    def _get_local_function(self, name: str) -> Callable[..., Any] | None:
        info = self.functions.get(name)
        if info is None:
            return None
        params = info["params"]
        shapes = [tuple(p["shape"]) for p in params]
        dtypes = [p["dtype"] for p in params]
        kernels = info["kernels"]
        temps = info["temps"]

        def launch(*args: Any) -> None:
            if len(args) != len(params):
                raise InputError(f"{name}: expected {len(params)} arguments "
                                 f"({', '.join(p['name'] for p in params)}), got {len(args)}")
            dev = None
            for i, a in enumerate(args):
                adev = getattr(a, "device", None)
                if not isinstance(adev, Device) or adev.device_type != DeviceType.OPENCL:
                    raise InputError(f"{name}: argument {i} ({params[i]['name']}) must be an NDArray on an OpenCL "
                                     f"device, got {type(a).__name__} on {adev}")
                if dev is None:
                    dev = adev
                elif adev != dev:
                    raise InputError(f"{name}: arguments are on different devices ({dev} and {adev})")
                if tuple(a.shape) != shapes[i] or a.dtype != dtypes[i]:
                    raise InputError(f"{name}: argument {i} ({params[i]['name']}) must be "
                                     f"{dtypes[i]}{list(shapes[i])}, "
                                     f"got {a.dtype}{list(a.shape)}")
            assert dev is not None
            rt = _runtime()
            prog = self._program(dev)
            tarrs = self._temp_arrays(dev, name, temps)
            handles = [(a.handle.data or 0, a.handle.byte_offset) for a in args]
            thandles = [(t.handle.data or 0, t.handle.byte_offset) for t in tarrs]
            with self._lock:  # kernel objects hold their arguments: one launcher at a time
                for k in kernels:
                    kern = prog.kernels[k["name"]]
                    for j, (kind, idx) in enumerate(k["args"]):
                        mem, off = handles[idx] if kind == "param" else thandles[idx]
                        m = _vp(mem)
                        o = _c.c_int64(off)
                        where = f"clSetKernelArg({k['name']})"
                        rt.check(rt.clSetKernelArg(kern, 2 * j, _c.sizeof(m), _c.byref(m)), where)
                        rt.check(rt.clSetKernelArg(kern, 2 * j + 1, 8, _c.byref(o)), where)
                    block = [int(x) for x in k["block"]]
                    glob = (_sz * 3)(*[int(g) * b for g, b in zip(k["grid"], block)])
                    loc = (_sz * 3)(*block)
                    rc = rt.clEnqueueNDRangeKernel(prog.queue, kern, 3, None, glob, loc, 0, None, None)
                    if rc != 0:
                        raise KernelError(f"{name}: launching OpenCL kernel {k['name']} (grid {k['grid']}, "
                                          f"block {k['block']}) on {dev} failed: {_err_name(rc)}")

        return launch

    def __repr__(self) -> str:
        return f"OpenCLModule(functions={len(self.functions)}, source={len(self.source)} chars)"


def opencl_module(source: str, functions: Sequence[dict[str, Any]], fmt: str = "cl") -> OpenCLModule:
    """Create an :class:`OpenCLModule` from kernel source and launch metadata."""
    return OpenCLModule(source, functions, fmt)


def _read_blob(payload: bytes) -> OpenCLModule:
    mv = memoryview(payload)
    if len(mv) < 16 or bytes(mv[:8]) != MAGIC:
        raise FormatError("opencl module blob: bad magic (expected b'KILNOCL\\0'); not an OpenCL module payload")
    version, _ = struct.unpack_from("<II", mv, 8)
    if version != FORMAT_VERSION:
        raise FormatError(f"opencl module blob: format version {version}, this Kiln reads {FORMAT_VERSION}")
    pos = 16
    parts = []
    for what in ("source", "metadata"):
        if pos + 8 > len(mv):
            raise FormatError(f"opencl module blob: truncated before the {what} length")
        (n,) = struct.unpack_from("<Q", mv, pos)
        pos += 8
        if pos + n > len(mv):
            raise FormatError(f"opencl module blob: {what} needs {n} bytes, {len(mv) - pos} left")
        try:
            parts.append(bytes(mv[pos:pos + n]).decode("utf-8"))
        except UnicodeDecodeError as err:
            raise FormatError(f"opencl module blob: {what} is not valid UTF-8 "
                              f"({err.reason} at byte {err.start})") from None
        pos += n
    try:
        meta = json.loads(parts[1])
        return OpenCLModule(parts[0], meta["functions"], meta.get("fmt", "cl"))
    except (ValueError, KeyError, TypeError) as err:
        raise FormatError(f"opencl module blob: bad metadata: {err}") from None


def describe_payload(payload: bytes) -> dict[str, Any]:
    """Summary of an ``opencl`` payload for ``kiln inspect`` (parses bytes only; no driver)."""
    m = _read_blob(payload)
    return {"format": "OpenCL C source" if m.fmt == "cl" else m.fmt,
            "source_bytes": len(m.source.encode("utf-8")),
            "functions": list(m.functions),
            "kernels": [{"name": k["name"], "grid": list(k["grid"]), "block": list(k["block"])}
                        for f in m.functions.values() for k in f["kernels"]]}


def loadbinary_opencl(payload: bytes) -> OpenCLModule:
    """Loader of ``opencl`` modules: parse the payload, then check the OpenCL runtime.

    Raises
    ------
    FormatError
        On a malformed payload.
    DeviceError
        When the OpenCL runtime or an OpenCL device is missing; the message names the
        kernels and says what to install. A library holding an ``opencl`` module can still
        be inspected without either (``kiln inspect`` reads the payload only).
    """
    mod = _read_blob(payload)
    names = list(mod.functions)
    what = f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"
    try:
        ndev = len(_runtime().devices)
    except DeviceError as err:
        raise DeviceError(f"cannot load an opencl device module (kernels: {what}): {err}") from None
    if ndev == 0:
        raise DeviceError(f"cannot load an opencl device module (kernels: {what}): the OpenCL runtime "
                          f"finds no device; {_INSTALL_HINT}")
    return mod


register_loader("opencl", loadbinary_opencl, override=True)
# registry.register_payload_describer exists in newer runtimes only; inspection is optional
if hasattr(_registry, "register_payload_describer"):
    _registry.register_payload_describer("opencl", describe_payload, override=True)
register_device_api(DeviceType.OPENCL, OpenCLDeviceAPI(), override=True)
