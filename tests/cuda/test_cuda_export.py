"""Acceptance without a GPU: the CUDA export of ResNet-18 holds a ``cuda`` module in its blob
whose PTX has an ``.entry`` per kernel; loading it where CUDA is absent is a clear error, and
``kiln inspect`` still describes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import kiln
from kiln.runtime.errors import DeviceError

from tests.cuda.resnet_onnx import resnet18

HW = 64  # the ResNet-18 graph and kernels are those of 224x224; smaller shapes build faster


@pytest.fixture(scope="module")
def resnet18_cuda_so(tmp_path_factory: pytest.TempPathFactory) -> str:
    from kiln.contrib.nvrtc import find_nvrtc
    import shutil

    if find_nvrtc() is None and shutil.which("nvcc") is None:
        pytest.skip("neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is installed")
    model, _ = resnet18(hw=HW)
    mod, params = kiln.frontend.from_onnx(model, shape={"data": (1, 3, HW, HW)})
    factory = kiln.build(mod, target="cuda", params=params)
    path = str(tmp_path_factory.mktemp("r18cuda") / "resnet18_cuda.so")
    factory.export_library(path)
    return path


def _blob_entries(path: str) -> dict[str, bytes]:
    from kiln.cli.inspect_cmd import _raw_blob
    from kiln.runtime import blob

    return {e.type_key: e.payload for e in blob.decode(_raw_blob(path)).entries if e.payload is not None}


def test_blob_holds_a_cuda_module_with_an_entry_per_kernel(resnet18_cuda_so: str) -> None:
    from kiln.cli.inspect_cmd import compiled_model_info
    from kiln.contrib.nvrtc import ptx_entries
    from kiln.runtime.cuda_driver import decode_payload

    entries = _blob_entries(resnet18_cuda_so)
    assert "cuda" in entries and "GraphExecutorFactory" in entries
    p = decode_payload(entries["cuda"])
    assert p.fmt == "ptx" and p.arch == "sm_80"
    ptx = p.data.decode()
    kernels = [ln.kernel for f in p.functions for ln in f.launches]
    assert kernels and sorted(ptx_entries(ptx)) == sorted(kernels)  # one .entry per kernel, no more
    # every kernel the graph calls is a function of the cuda module
    graph = json.loads(compiled_model_info(resnet18_cuda_so)["graph_json"])
    called = {n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] == "tvm_op"} - {"__nop", "__copy"}
    assert called and called <= {f.name for f in p.functions}
    # convolutions are spread over threads (GPU schedules), not run by a single work-item
    assert any(ln.block[0] * ln.block[1] * ln.block[2] >= 64 for f in p.functions for ln in f.launches)


def test_inspect_lists_device_kernels_and_sizes(resnet18_cuda_so: str, capsys) -> None:
    from kiln.cli import main

    assert main(["inspect", resnet18_cuda_so]) == 0
    out = capsys.readouterr().out
    assert "cuda  (payload" in out
    assert "device code: ptx for sm_80, binary" in out
    assert "kernel kilngen_default_fused_" in out and " grid " in out and " block " in out
    assert main(["inspect", "--json", resnet18_cuda_so]) == 0
    info = json.loads(capsys.readouterr().out)
    dev = [e for e in info["blob"]["entries"] if e["type_key"] == "cuda"][0]["device_module"]
    assert dev["binary_bytes"] > 0 and len(dev["kernels"]) >= len(dev["functions"]) > 10


def test_loads_without_cuda_and_the_executor_says_what_is_missing(resnet18_cuda_so: str, no_cuda) -> None:
    lib = kiln.runtime.load_module(resnet18_cuda_so)  # device runtimes are lazy: loading needs none
    assert any(m.type_key == "cuda" for m in lib.walk())
    with pytest.raises(DeviceError, match=r"cannot run a cuda device module.*libcuda_absent\.so\.1 not found.*"
                                          r"install the NVIDIA driver"):
        lib["default"](kiln.cuda())


def test_fresh_process_without_cuda(resnet18_cuda_so: str, tmp_path) -> None:
    """The same in a fresh process (as a deployment would see it), and the CLI still inspects."""
    env = dict(os.environ, KILN_CUDA_LIBRARY=str(tmp_path / "nope" / "libcuda.so.1"))
    code = ("import kiln, sys\n"
            "lib = kiln.runtime.load_module(sys.argv[1])\n"
            "try:\n    lib['default'](kiln.cuda())\n"
            "except kiln.runtime.DeviceError as e:\n    print('ERR', e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, resnet18_cuda_so], env=env, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert "libcuda.so.1 not found" in r.stdout and "install the NVIDIA driver" in r.stdout
    r = subprocess.run([sys.executable, "-m", "kiln.cli", "inspect", resnet18_cuda_so], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "device code: ptx" in r.stdout


def test_executor_runs_the_library_on_the_mock_driver(resnet18_cuda_so: str, mock_cuda) -> None:
    """Load + executor + launches end to end through the driver API (the mock cannot run PTX,
    so only the plumbing is checked: storage on the device, copies, every kernel launched
    with arguments whose dtype/shape match the function table)."""
    import numpy as np

    from kiln.cli.inspect_cmd import compiled_model_info
    from kiln.runtime.cuda_driver import decode_payload

    p = decode_payload(_blob_entries(resnet18_cuda_so)["cuda"])
    nlaunch = {f.name: len(f.launches) for f in p.functions}
    graph = json.loads(compiled_model_info(resnet18_cuda_so)["graph_json"])
    expected = sum(nlaunch[n["attrs"]["func_name"]] for n in graph["nodes"]
                   if n["op"] == "tvm_op" and n["attrs"]["func_name"] not in ("__nop", "__copy"))
    lib = kiln.runtime.load_module(resnet18_cuda_so)
    assert any(m.type_key == "cuda" for m in lib._walk())
    g = kiln.GraphModule(lib["default"](kiln.cuda()))
    before = mock_cuda.mock_launch_count()
    g.set_input("data", np.zeros((1, 3, HW, HW), np.float32))
    g.run()
    assert mock_cuda.mock_launch_count() - before == expected
    assert g.get_output(0).numpy().shape == (1, 1000)
