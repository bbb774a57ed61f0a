"""``kiln inspect`` lists device modules, their kernels and binary sizes (from the blob only:
no library code runs and no device runtime is needed), for ``cuda``, ``opencl`` and plug-in
module types that register a payload describer."""

from __future__ import annotations

import json
import shutil

import pytest

import kiln.runtime as rt
from kiln.cli import main
from kiln.cli.inspect_cmd import inspect_library
from kiln.runtime import registry
from kiln.runtime.module import Module

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t host_fn(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  rv->v_int64 = 1; *rc = kKilnArgInt; return 0;
}
"""


class _DevModule(Module):
    """A plug-in device module: its payload is 'name:grid:block;...' text."""

    type_key = "test_inspect_dev"

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    def save_to_binary(self) -> bytes:
        return self.data


def _describe(payload: bytes) -> dict:
    text = payload.decode()
    if text.startswith("bad"):
        raise ValueError("corrupt device payload")
    kernels = []
    for item in text.split(";"):
        name, grid, block = item.split(":")
        kernels.append({"name": name, "grid": [int(grid), 1, 1], "block": [int(block), 1, 1]})
    return {"format": "toy", "binary_bytes": len(payload), "functions": ["f"], "kernels": kernels}


@pytest.fixture
def plugin_describer():
    registry.register_loader(_DevModule.type_key, lambda p: _DevModule(bytes(p)), override=True)
    registry.register_payload_describer(_DevModule.type_key, _describe, override=True)
    yield
    registry.remove_global_func(registry.LOADER_PREFIX + _DevModule.type_key)
    registry.remove_global_func(registry.DESCRIBE_PREFIX + _DevModule.type_key)


def _export(tmp_path, *devmods: Module) -> str:
    root = rt.csource_module(KERNEL, ["host_fn"])
    for m in devmods:
        root.import_module(m)
    return root.export_library(str(tmp_path / "lib.so"))


def test_plugin_device_module_is_described(tmp_path, plugin_describer, capsys) -> None:
    path = _export(tmp_path, _DevModule(b"k0:4:256;k1:2:64"))
    info = inspect_library(path)
    dev = [e for e in info["blob"]["entries"] if e["type_key"] == _DevModule.type_key][0]
    assert dev["device_module"]["kernels"][1] == {"name": "k1", "grid": [2, 1, 1], "block": [64, 1, 1]}
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "device code: toy, binary 16 B, 1 functions, 2 kernels" in out
    assert "kernel k0  grid 4x1x1 block 256x1x1" in out and "kernel k1  grid 2x1x1 block 64x1x1" in out


def test_failing_describer_does_not_stop_inspection(tmp_path, plugin_describer, capsys) -> None:
    path = _export(tmp_path, _DevModule(b"bad bytes"))
    assert main(["inspect", "--json", path]) == 0
    info = json.loads(capsys.readouterr().out)
    dev = [e for e in info["blob"]["entries"] if e["type_key"] == _DevModule.type_key][0]
    assert dev["device_module"] == {"error": "ValueError: corrupt device payload"}
    assert info["functions"] == ["host_fn"]
    assert main(["inspect", path]) == 0
    assert "cannot describe payload: ValueError: corrupt device payload" in capsys.readouterr().out


def test_type_without_describer_shows_only_its_size(tmp_path, capsys) -> None:
    class Plain(_DevModule):
        type_key = "test_inspect_plain"

    path = _export(tmp_path, Plain(b"12345"))
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "test_inspect_plain  (payload 5 B)" in out and "device code" not in out


def _vexp():
    from kiln import te
    from kiln.te.schedule import thread_axis
    from kiln.te.lower_schedule import lower

    A = te.placeholder((1000,), name="A")
    C = te.compute((1000,), lambda i: te.exp(A[i]), name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=128)
    s[C].bind(xo, thread_axis("blockIdx.x"))
    s[C].bind(xi, thread_axis("threadIdx.x"))
    return lower(s, [A, C], name="vexp")


def test_cuda_module_is_described_without_a_driver(tmp_path, monkeypatch, capsys) -> None:
    from kiln.contrib.nvrtc import find_nvrtc

    if find_nvrtc() is None and shutil.which("nvcc") is None:
        pytest.skip("neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is installed")
    from kiln.codegen import build_module
    from kiln.runtime import cuda_driver

    mod = build_module([_vexp()], "cuda -arch=sm_86")
    path = _export(tmp_path, mod)
    monkeypatch.setenv("KILN_CUDA_LIBRARY", str(tmp_path / "absent" / "libcuda.so.1"))
    cuda_driver._reset_driver()
    try:
        assert main(["inspect", path]) == 0
        out = capsys.readouterr().out
        ptx_bytes = len(mod.data)
        assert f"device code: ptx for sm_86, binary {ptx_bytes / 1024:.1f} KiB" in out or \
            f"binary {ptx_bytes} B" in out
        assert "kernel vexp_kernel0  grid 8x1x1 block 128x1x1" in out
        lib = rt.load_module(path)  # loading needs no driver either; running on the device does
        (dev_mod,) = [m for m in lib.walk() if m.type_key == "cuda"]
        with pytest.raises(rt.DeviceError, match="cannot run a cuda device module.*install the NVIDIA driver"):
            dev_mod.require_runtime()
    finally:
        cuda_driver._reset_driver()


def test_opencl_module_is_described(tmp_path, capsys) -> None:
    from kiln.codegen import build_module
    from kiln.runtime.errors import TargetError
    from kiln.target import Target

    try:
        Target("opencl")
    except TargetError:
        pytest.skip("no opencl target in this tree")
    mod = build_module([_vexp()], "opencl")
    path = _export(tmp_path, mod)
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "opencl  (payload" in out
    assert "kernel vexp_kernel0  grid 8x1x1 block 128x1x1" in out
