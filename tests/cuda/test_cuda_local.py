"""CUDA code for work-group (shared) memory: ``cache_read`` tiles, barriers, tree reductions.

The CUDA C checks need nothing; the PTX checks compile with NVRTC (skipped without it).
"""

from __future__ import annotations

import re

import pytest

from kiln.runtime.errors import CompileError
from kiln.target import Target
from tests.opencl.local_kernels import shared_matmul, tree_reduce


def test_shared_tiles_in_cuda_source() -> None:
    from kiln.codegen.cuda import generate_cuda

    src, infos = generate_cuda([shared_matmul(37, 45, 29), tree_reduce(3, 1001, "max")])
    assert "__shared__ float A_shared[256];" in src and "__shared__ float B_shared[256];" in src
    assert "__shared__ float C_red[64];" in src
    assert src.count("__syncthreads();") == 2 + 6  # matmul: after load + after use; tree: 6 of 7 steps
    assert [k.shared_bytes for fi in infos for k in fi.kernels] == [2048, 256]


def test_shared_memory_limit_is_checked() -> None:
    from kiln.codegen.cuda import build_cuda

    with pytest.raises(CompileError, match="max_shared_memory_per_block=1024"):
        build_cuda([shared_matmul(37, 45, 29)], Target("cuda -max_shared_memory_per_block=1024"))


def test_shared_tiles_compile_to_ptx(needs_nvrtc) -> None:
    from kiln.codegen.cuda import build_cuda

    mod = build_cuda([shared_matmul(37, 45, 29), tree_reduce(None, 77, "sum")], Target("cuda -arch=sm_80"))
    ptx = mod.get_source("ptx")
    assert ".shared" in ptx and "bar.sync" in ptx
    assert ".entry mm_kernel0" in ptx and ".entry red_kernel0" in ptx


def test_gpu_schedules_with_local_tiles_compile_to_ptx(needs_nvrtc, monkeypatch) -> None:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import kiln
    from kiln.topi.schedule import gpu

    assert gpu.SHARED_TAGS["cuda"]["dense"]  # CUDA selects the local tiles by default
    r = np.random.default_rng(0)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [70, 45])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 999])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 13, 12, 12])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, None)
    wc = numpy_helper.from_array(r.standard_normal((64, 13, 3, 3)).astype(np.float32), "wc")
    w = numpy_helper.from_array(r.standard_normal((45, 67)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"]),
                           helper.make_node("ReduceSum", ["x", "axes"], ["z"], keepdims=0),
                           helper.make_node("Conv", ["c", "wc"], ["v"], pads=[1, 1, 1, 1])], "g", [a, x, c], [y, z, v],
                          [w, axes, wc])
    mod, params = kiln.frontend.from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    f = kiln.build(mod, target="cuda -arch=sm_80", params=params)
    (cu,) = [m for m in f.get_lib().imported_modules if m.type_key == "cuda"]
    ptx = cu.get_source("ptx")
    assert ".shared" in ptx and "bar.sync" in ptx
    shared = re.findall(r"__shared__ float (\w+)\[(\d+)\];", cu.get_source("cu"))
    sizes = sorted(int(n) for _, n in shared)
    # dense: 64 rows x 8 of A and 4 panels x 8 x 16 of the packed B; tree: 64 partial sums;
    # conv: 8 channels x 6 x 6 input patch of a 4x4 pixel tile and 64 x 8 x 3 x 3 weights
    assert sizes == [64, 288, 512, 512, 4608], shared
