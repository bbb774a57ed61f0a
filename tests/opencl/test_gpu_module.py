"""The GPU device-module base (``kiln.runtime.gpu_module``) that ``opencl`` and ``cuda`` share.

A toy backend on the CPU (device type 1, no driver) shows what a backend must write and
checks the shared parts: argument checks, temporaries, the launch-plan cache and the
payload codec. Then the OpenCL side: payloads of format version 1 (JSON metadata) in the
fuzz corpus still load, new exports use the common layout, and scalar arguments, which
only the CUDA launcher knew before, now run on OpenCL (PoCL) too.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.runtime import blob
from kiln.runtime.errors import FormatError, InputError
from kiln.runtime.gpu_module import (ARG_INT, ARG_TENSOR, GPUArg, GPUFunction, GPULaunch, GPUModule, GPUPayload,
                                     read_function_table)
from tests.fuzz.fuzz_support import CORPUS_DIR

HAS_CL = kiln.opencl().exist


def _f32(value: Any, n: int) -> np.ndarray:
    """The ``n`` float32 values at a ``(host address, byte offset)`` buffer value."""
    ptr, off = value
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr + off))


class ToyModule(GPUModule):
    """A whole backend: kernels are Python functions over host memory (CPU device type 1)."""

    type_key = "test_gpu_toy"
    device_type = 1
    device_label = "Toy"
    payload_magic = b"KILNTOY\0"
    binary_formats = ("py",)
    kernels = {
        "double": lambda src, dst: _f32(dst, 8).__setitem__(slice(None), _f32(src, 8) * 2),
        "add_n": lambda src, dst, n: _f32(dst, 8).__setitem__(slice(None), _f32(src, 8) + n.value),
    }
    loads: list[int] = []
    plans: list[str] = []

    @classmethod
    def _check_runtime(cls) -> None:
        pass

    def _load(self, device_id: int) -> Any:
        self.loads.append(device_id)
        return self.kernels

    def _kernel(self, program: Any, device_id: int, launch: GPULaunch) -> Any:
        return program[launch.kernel]

    def _prepare(self, device_id: int, func: GPUFunction, kernels: list[Any], values: list[Any]) -> Any:
        self.plans.append(func.name)
        return [(k, [values[j] for j in ln.args]) for k, ln in zip(kernels, func.launches)]

    def _run(self, device_id: int, func: GPUFunction, plan: Any) -> None:
        for kern, vals in plan:
            kern(*vals)


def _toy() -> ToyModule:
    # y = 2x + n, through one temporary
    f = GPUFunction("f", (GPUArg(ARG_TENSOR, "float32", (8,), "x"), GPUArg(ARG_INT, "int32", (), "n"),
                          GPUArg(ARG_TENSOR, "float32", (8,), "y")),
                    (GPULaunch("double", (1, 1, 1), (8, 1, 1), 0, (0, 3)),
                     GPULaunch("add_n", (1, 1, 1), (8, 1, 1), 0, (3, 2, 1))), temps=(32,))
    return ToyModule(b"", "py", [f, GPUFunction("g", (), ())], source="# toy")


def test_a_backend_is_five_hooks_and_the_base_does_the_rest() -> None:
    ToyModule.loads.clear()
    ToyModule.plans.clear()
    m = _toy()
    x = kiln.nd.array(np.arange(8, dtype=np.float32))
    y = kiln.nd.empty((8,), "float32")
    m["f"](x, 3, y)
    np.testing.assert_array_equal(y.numpy(), np.arange(8) * 2 + 3)
    m["f"](x, 3, y)  # same values: the plan of the previous call is reused
    m["f"](x, 5, y)
    np.testing.assert_array_equal(y.numpy(), np.arange(8) * 2 + 5)
    assert ToyModule.loads == [0] and ToyModule.plans == ["f", "f"]
    assert len(m._launchers["f"]._temp_allocs) == 1  # allocated once per device, then reused


@pytest.mark.parametrize("call, match", [
    (lambda m, x, y: m["f"](x, 3), r"takes 3 arguments \(x, n, y\), got 2"),
    (lambda m, x, y: m["f"](np.zeros(8, np.float32), 3, y), r"argument 0 \(x\) must be an NDArray on a Toy device"),
    (lambda m, x, y: m["f"](x, 3, kiln.nd.empty((7,), "float32")), r"argument 2 \(y\) is float32\[7\], expected "
                                                                    r"float32\[8\]"),
    (lambda m, x, y: m["f"](x, 3, kiln.nd.empty((8,), "float64")), r"is float64\[8\]"),
])
def test_argument_errors_name_the_parameter(call, match) -> None:
    x, y = kiln.nd.array(np.zeros(8, np.float32)), kiln.nd.empty((8,), "float32")
    with pytest.raises(InputError, match=match):
        call(_toy(), x, y)


def test_zero_dim_tensor_arguments_are_checked() -> None:
    # a 0-d tensor parameter must not accept tensors of any shape (the CUDA launcher did)
    m = ToyModule(b"", "py", [GPUFunction("s", (GPUArg(ARG_TENSOR, "float32", ()),), ())])
    m["s"](kiln.nd.empty((), "float32"))
    with pytest.raises(InputError, match=r"is float32\[4\], expected float32\[\]"):
        m["s"](kiln.nd.empty((4,), "float32"))


def test_payload_roundtrip_describe_and_errors() -> None:
    m = _toy()
    raw = m.save_to_binary()
    assert raw[:8] == b"KILNTOY\0" and int.from_bytes(raw[8:12], "little") == 2
    p = ToyModule.decode_payload(raw)
    assert (p.fmt, p.data, p.source) == ("py", b"", "# toy")
    assert p.functions == list(m.functions.values())  # argument names included
    d = ToyModule.describe_payload(raw)
    assert "binary_bytes" not in d and d["source_bytes"] == 5
    assert d["functions"][0] == {"name": "f", "num_args": 3, "launches": 2, "temp_bytes": 32}
    with pytest.raises(FormatError, match="version 7 is not supported"):
        ToyModule.decode_payload(raw[:8] + (7).to_bytes(4, "little") + raw[12:])
    with pytest.raises(FormatError, match="binary format must be one of"):
        ToyModule.decode_payload(ToyModule.encode_payload(GPUPayload("py", b"", "", "", []))
                                 .replace(b"\x02\x00\x00\x00\x00\x00\x00\x00py", b"\x02\x00\x00\x00\x00\x00\x00\x00pz"))
    with pytest.raises(FormatError, match="trailing"):
        ToyModule.decode_payload(raw + b"\0")
    bad = GPUPayload("py", b"", "", "", [GPUFunction("h", (), (GPULaunch("k", (1, 1, 1), (1, 1, 1), 0, (0,)),))])
    with pytest.raises(FormatError, match="takes argument 0"):
        ToyModule.decode_payload(ToyModule.encode_payload(bad))


@pytest.mark.parametrize("meta, match", [
    ({"name": "f", "params": [], "temps": []}, "kernels"),
    ({"name": "f", "params": [], "temps": [], "kernels": [{"name": "k", "args": [["param", 0]], "grid": [1, 1, 1],
                                                           "block": [1, 1, 1]}]}, "takes argument 0"),
    ({"name": "f", "params": [], "temps": [], "kernels": [{"name": "k", "args": [["local", 0]], "grid": [1, 1, 1],
                                                           "block": [1, 1, 1]}]}, "neither 'param' nor 'temp'"),
    ({"name": "f", "params": [], "temps": [], "kernels": [{"name": "k", "args": [], "grid": [1, 1],
                                                           "block": [1, 1, 1]}]}, "3 positive u32"),
    (["not", "a", "dict"], "malformed function metadata"),
])
def test_codegen_metadata_errors_are_format_errors(meta, match) -> None:
    with pytest.raises(FormatError, match=match):
        GPUFunction.from_dict(meta)


# ---------------------------------------------------------------------------------- opencl
def _corpus_payload(name: str, type_key: str) -> bytes:
    decoded = blob.decode((CORPUS_DIR / "blob" / f"{name}.blob").read_bytes())
    (entry,) = [e for e in decoded.entries if e.type_key == type_key]
    return bytes(entry.payload)


def test_opencl_version1_payloads_still_load_and_resave_in_the_common_layout() -> None:
    from kiln.runtime.opencl_driver import OpenCLModule

    old = _corpus_payload("opencl", "opencl")
    assert old[:12] == b"KILNOCL\0\x01\x00\x00\x00"  # written by Kiln before the common layout
    p = OpenCLModule.decode_payload(old)
    assert p.fmt == "cl" and "__kernel" in p.source and p.functions
    new = OpenCLModule.from_payload(p).save_to_binary()
    assert new[:12] == b"KILNOCL\0\x02\x00\x00\x00"
    assert OpenCLModule.decode_payload(new).functions == p.functions
    assert OpenCLModule.describe_payload(new)["format"] == "OpenCL C source"
    assert OpenCLModule.describe_payload(new)["kernels"] == OpenCLModule.describe_payload(old)["kernels"]


def test_cuda_version1_payloads_still_decode() -> None:
    from kiln.runtime.cuda_driver import CUDAModule

    old = _corpus_payload("cuda", "cuda")
    assert old[8:12] == b"\x01\x00\x00\x00"
    p = CUDAModule.decode_payload(old)
    assert p.fmt == "ptx" and p.functions and all(a.name == "" for f in p.functions for a in f.args)
    assert CUDAModule.decode_payload(CUDAModule.from_payload(p).save_to_binary()).functions == p.functions


_SCALE = """
__kernel void scale_kernel0(__global float* x, long x_off, int n, __global float* y, long y_off) {
  int i = get_global_id(0);
  if (i < 16) ((__global float*)((__global char*)y + y_off))[i] = ((__global float*)((__global char*)x + x_off))[i] * n;
}
"""


@pytest.mark.skipif(not HAS_CL, reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")
def test_opencl_runs_a_function_with_a_scalar_argument() -> None:
    from kiln.runtime.opencl_driver import OpenCLModule

    f = GPUFunction("scale", (GPUArg(ARG_TENSOR, "float32", (16,), "x"), GPUArg(ARG_INT, "int32", (), "n"),
                              GPUArg(ARG_TENSOR, "float32", (16,), "y")),
                    (GPULaunch("scale_kernel0", (1, 1, 1), (16, 1, 1), 0, (0, 1, 2)),))
    m = kiln.runtime.registry.get_loader("opencl")(OpenCLModule(_SCALE, [f]).save_to_binary())
    dev = kiln.opencl()
    x = np.arange(16, dtype=np.float32)
    y = kiln.nd.empty((16,), "float32", dev)
    m["scale"](kiln.nd.array(x, device=dev), 3, y)
    np.testing.assert_array_equal(y.numpy(), x * 3)


def test_function_table_reader_is_bounded() -> None:
    from kiln.runtime.binary import Reader

    with pytest.raises(FormatError, match="function count .* cannot fit"):
        read_function_table(Reader((1 << 40).to_bytes(8, "little") + bytes(16), "table"))


def test_lazy_library_opens_once_and_remembers_a_missing_library(tmp_path) -> None:
    from kiln.runtime.errors import DeviceError
    from kiln.runtime.lazy_library import LazyLibrary

    names = [str(tmp_path / "libabsent.so"), "libc.so.6"]
    asked: list[str] = []

    def name() -> str:
        asked.append(names[0])
        return names[0]

    lib = LazyLibrary("Toy driver", name, lambda cdll, n: (cdll, n), "install the toy driver")
    assert lib.opened() is None and asked == []  # creating it opens nothing
    for _ in range(2):
        with pytest.raises(DeviceError, match=r"Toy driver .*libabsent\.so not found .*install the toy driver"):
            lib.get()
    assert len(asked) == 1  # the failure is remembered, not retried per call
    names.pop(0)
    lib.reset()
    first = lib.get()
    assert lib.get() is first and lib.opened() is first and first[1] == "libc.so.6"


def test_gpu_device_api_sorts_copies_into_four_kinds() -> None:
    from kiln.runtime.device import Device
    from kiln.runtime.errors import DeviceError
    from kiln.runtime.gpu_module import GPUDeviceAPI

    class Api(GPUDeviceAPI):
        device_type, device_label = 2, "Toy"
        seen: list[tuple[Any, ...]] = []

        def get_attr(self, dev: Device, kind: str) -> Any:
            return None

        def alloc_data_space(self, dev: Device, nbytes: int, alignment: int, dtype: Any = None) -> int:
            return 1

        def free_data_space(self, dev: Device, ptr: int) -> None:
            pass

        def _copy(self, kind, src, dst, nbytes, src_dev, dst_dev, stream) -> None:
            self.seen.append((kind, src, dst, nbytes))

    api, gpu0, gpu1, cpu = Api(), Device(2, 0), Device(2, 1), Device(1, 0)
    for s, d in ((gpu0, gpu0), (gpu0, gpu1), (gpu0, cpu), (cpu, gpu1)):
        api.copy_data_from_to(10, 1, 20, 2, 8, s, d)
    api.copy_data_from_to(10, 1, 20, 2, 0, gpu0, cpu)  # nothing to copy: no call
    assert [k[0] for k in api.seen] == ["DtoD", "peer", "DtoH", "HtoD"]
    assert api.seen[0][1:] == ((10, 1), (20, 2), 8)
    with pytest.raises(DeviceError, match=r"the Toy device API cannot copy between cuda\(0\) and opencl\(0\)"):
        api.copy_data_from_to(10, 0, 20, 0, 8, gpu0, Device(4, 0))
