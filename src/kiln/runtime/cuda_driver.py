"""The ``cuda`` module type: PTX or a cubin plus a function table, launched through the driver API.

(The file is ``cuda_driver.py``, not ``cuda.py``: a submodule named ``cuda`` would replace
the ``kiln.runtime.cuda()`` device constructor as soon as it is imported.)

CUDA support in the runtime is three modules, one concept each:

* :mod:`kiln.runtime.cuda_api` — ctypes bindings of ``libcuda.so.1`` (the CUDA driver API,
  installed with the NVIDIA driver, so a deploy machine needs no toolkit), opened lazily;
* :mod:`kiln.runtime.cuda_device` — the device API of ``kiln.cuda()`` (allocation, copies,
  streams, attributes);
* this module — :class:`CUDAModule`, a :class:`~kiln.runtime.gpu_module.GPUModule` that loads
  its image with ``cuModuleLoadDataEx`` and launches with ``cuLaunchKernel``. The function
  table, payload format (``docs/devices.md``), argument checks and temporaries are the GPU
  base's. Importing it registers the loader, the payload describer and the device API.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from . import cuda_api as _cu
from .binary import Reader
from .cuda_api import driver, is_available, ptx_isa_for_driver
from .cuda_device import CUDADeviceAPI, current_stream
from .device import DeviceType
from .errors import DeviceError, KernelError, KilnError
from .gpu_module import (ARG_FLOAT, ARG_INT, ARG_TENSOR, PAYLOAD_VERSION, GPUArg, GPUFunction, GPULaunch, GPUModule,
                         GPUPayload)
from .registry import register_loader, register_payload_describer

__all__ = [
    "CUDADeviceAPI", "CUDAModule", "CUDAArg", "CUDALaunch", "CUDAFunction", "CUDAPayload", "ARG_TENSOR", "ARG_INT",
    "ARG_FLOAT", "encode_payload", "decode_payload", "describe_payload", "loadbinary_cuda", "is_available",
    "PAYLOAD_MAGIC", "PAYLOAD_VERSION", "ptx_isa_for_driver",
]

TYPE_KEY = "cuda"
#: First 8 bytes of a ``cuda`` module payload.
PAYLOAD_MAGIC = b"KILNCUDA"

# The function table is the GPU base's; these names are the ones CUDA code has always used.
CUDAArg, CUDALaunch, CUDAFunction, CUDAPayload = GPUArg, GPULaunch, GPUFunction, GPUPayload
_reset_driver = _cu.reset_driver


class CUDAModule(GPUModule):
    """A module of CUDA kernels (type key ``"cuda"``).

    Parameters
    ----------
    data : bytes or str
        PTX text (``fmt="ptx"``) or a cubin image.
    fmt : str
        ``"ptx"`` or ``"cubin"``.
    functions : sequence of GPUFunction
        The function table (see :mod:`kiln.runtime.gpu_module`).
    source : str, optional
        The CUDA C source the binary was compiled from (kept for ``get_source``).
    arch : str, optional
        The architecture it was compiled for (``"sm_80"``), informative.

    Notes
    -----
    The binary is handed to the driver the first time a function runs on a device; a PTX
    image is JIT-compiled by the driver then, for the GPU present.
    """

    type_key = TYPE_KEY
    device_type = DeviceType.CUDA
    device_label = "CUDA"
    payload_magic = PAYLOAD_MAGIC
    binary_formats = ("ptx", "cubin")
    legacy_versions = (1,)

    # ---- the GPU module hooks --------------------------------------------------------------
    @classmethod
    def _check_runtime(cls) -> None:
        driver().require_device(0)

    @classmethod
    def _decode_legacy(cls, r: Reader, version: int) -> GPUPayload:
        # version 1: the version-2 layout without argument names
        return cls._read_body(r, arg_names=False)

    def _load(self, device_id: int) -> int:
        d = driver()
        d.context(device_id)
        image = self.data + (b"\0" if self.fmt == "ptx" else b"")  # PTX must be NUL-terminated
        log = ctypes.create_string_buffer(8192)
        opts = (ctypes.c_int * 2)(_cu.CU_JIT_ERROR_LOG_BUFFER, _cu.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
        mod = ctypes.c_void_p()
        rc = d.cuModuleLoadDataEx(ctypes.byref(mod), image, 2, opts, vals)
        if rc == _cu.CUDA_ERROR_UNSUPPORTED_PTX_VERSION and self.fmt == "ptx":
            # An older driver refuses NVRTC's newest ISA stamp: retry once with its own.
            retry = _cu.restamp_ptx(image, d)
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
            raise DeviceError(f"the CUDA driver rejected the {self.fmt} of this module (arch {self.arch or '?'}) on "
                              f"cuda({device_id}): {d.error_text(rc)}{hint}" + (f"\n{jit}" if jit else ""))
        return int(mod.value or 0)

    def _kernel(self, program: int, device_id: int, launch: GPULaunch) -> int:
        d = driver()
        fn = ctypes.c_void_p()
        rc = d.cuModuleGetFunction(ctypes.byref(fn), program, launch.kernel.encode("utf-8"))
        if rc != 0:
            raise KernelError(f"cuda module has no kernel {launch.kernel!r}: {d.error_text(rc)}")
        if launch.shared_bytes > _cu.STATIC_SHARED_LIMIT and hasattr(d, "cuFuncSetAttribute"):
            d.check(d.cuFuncSetAttribute(fn.value, _cu.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         launch.shared_bytes), f"cuFuncSetAttribute({launch.kernel})")
        return int(fn.value or 0)

    def _prepare(self, device_id: int, func: GPUFunction, kernels: list[Any], values: list[Any]) -> Any:
        # a buffer is one CUdeviceptr (address + offset); the parameter arrays point into
        # ``cvals``, which the plan therefore keeps
        cvals = [_cu.CUdeviceptr(v[0] + v[1]) if isinstance(v, tuple) else v for v in values]
        launches = []
        # ``ln.grid`` is the grid to launch: a run-time grid is already evaluated (GPUModule)
        for ln, h in zip(func.launches, kernels):
            params = (ctypes.c_void_p * max(len(ln.args), 1))(
                *[ctypes.cast(ctypes.byref(cvals[j]), ctypes.c_void_p) for j in ln.args])
            dims = tuple(ctypes.c_uint(int(v)) for v in (*ln.grid, *ln.block, ln.shared_bytes))
            launches.append(((ctypes.c_void_p(h), *dims), params, ln))
        return launches, cvals

    def _run(self, device_id: int, func: GPUFunction, plan: Any) -> None:
        d = driver()
        d.context(device_id)
        stream = current_stream(device_id)
        stream = None if stream is None else ctypes.c_void_p(stream)
        launch = d.launch_raw
        for head, params, ln in plan[0]:
            rc = launch(*head, stream, params, None)
            if rc != 0:
                raise KernelError(f"launching CUDA kernel {ln.kernel!r} of {func.name!r} (grid {ln.grid}, block "
                                  f"{ln.block}) failed: {d.error_text(rc)}")

    # ---- inspection ------------------------------------------------------------------------
    @property
    def is_runnable(self) -> bool:
        return is_available()

    def get_source(self, fmt: str = "") -> str:
        """``"cu"``/``"cuda"`` (default): the CUDA C source; ``"ptx"``: the PTX text."""
        ptx = self.data.decode("utf-8", "replace") if self.fmt == "ptx" else ""
        if fmt in ("", "cu", "cuda"):
            return self.source or ptx
        if fmt == "ptx":
            return ptx
        raise KilnError(f"cuda module: unknown source format {fmt!r}; use 'cu' or 'ptx'")

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Write the binary (``.ptx``/``.cubin``) or, for ``.cu``, the source."""
        p = os.fspath(path)
        fmt = fmt or os.path.splitext(p)[1].lstrip(".")
        if fmt not in ("cu", "cuda", "ptx", "cubin"):
            raise KilnError(f"cuda module: cannot save as {fmt!r}; use .cu, .ptx or .cubin")
        with open(p, "wb") as fh:
            fh.write(self.source.encode("utf-8") if fmt in ("cu", "cuda") else self.data)


encode_payload = CUDAModule.encode_payload
decode_payload = CUDAModule.decode_payload
describe_payload = CUDAModule.describe_payload
loadbinary_cuda = CUDAModule.load_binary

register_loader(TYPE_KEY, loadbinary_cuda, override=True)
register_payload_describer(TYPE_KEY, describe_payload, override=True)
