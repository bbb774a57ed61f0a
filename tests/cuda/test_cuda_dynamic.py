"""CUDA kernels with runtime extents (dynamic dims) without a GPU: the generated source, the
function table and its payload, and the launcher passing the extents as kernel parameters
(against the mock driver of ``conftest.py``)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import kiln
from kiln import te, tir
from kiln.runtime import cuda_driver as rc
from tests.cuda.mock_support import hook_type, view
from kiln.runtime.errors import InputError
from kiln.runtime.gpu_module import GPUExtent


def _dyn_reduce():
    """``S[i] = sum_j X[i, j]`` over dynamic ``rows <= 64`` and ``cols <= 48``, one thread per row."""
    rows, cols = tir.Var("rows", "int32"), tir.Var("cols", "int64")
    X = te.placeholder((64, 48), name="X", dyn=(rows, cols))
    j = te.reduce_axis((0, 48), name="j")
    S = te.compute((64,), lambda i: te.sum(X[i, j], axis=j), name="S")
    s = te.create_schedule(S)
    bx, tx = s[S].split(S.op.axis[0], factor=32)
    s[S].bind(bx, te.thread_axis("blockIdx.x"))
    s[S].bind(tx, te.thread_axis("threadIdx.x"))
    return tir.lower(s, [X, S], "rowsum")


def test_cuda_source_takes_the_extents_after_the_buffers() -> None:
    from kiln.codegen.cuda import function_table, generate_cuda

    src, infos = generate_cuda([_dyn_reduce()])
    sig = src.split("rowsum_kernel0(")[1].split(")")[0]
    assert sig.endswith("const int rows, const long long cols")
    assert "__launch_bounds__(32)" in src
    body = src.split("rowsum_kernel0(")[1]
    assert "< rows)" in body and "< cols)" in body  # the threads and the reduction stop at the extents
    (f,) = function_table(infos)
    assert f.extents == (GPUExtent("rows", "int32", ((0, 0), (1, 0))), GPUExtent("cols", "int64", ((0, 1),)))
    assert f.launches[0].args == (0, 1, 2, 3) and f.launches[0].grid == (2, 1, 1)
    assert f.launches[0].dyn_grid == ("(rows+31)//32", "", "")  # one block per 32 actual rows
    raw = rc.encode_payload(rc.CUDAPayload("ptx", b".version 8.0", src, "sm_80", [f]))
    assert int.from_bytes(raw[8:12], "little") == 4
    assert rc.decode_payload(raw).functions == [f]


def test_mock_launch_passes_the_runtime_extents(mock_cuda) -> None:
    """The launcher reads the extents from the actual shapes, checks them and passes each as a
    by-value kernel parameter of its dtype; the hook runs the kernel on the host with them."""
    from kiln.codegen.cuda import function_table, generate_cuda

    _, infos = generate_cuda([_dyn_reduce()])
    ptx = ".version 8.0\n.target sm_80\n.visible .entry rowsum_kernel0(\n)\n"
    mod = rc.loadbinary_cuda(rc.encode_payload(rc.CUDAPayload("ptx", ptx.encode(), "", "sm_80",
                                                              function_table(infos))))
    seen = []

    @hook_type()
    def hook(name, gx, gy, gz, bx, by, bz, shared, params):
        rows = ctypes.cast(params[2], ctypes.POINTER(ctypes.c_int32))[0]
        cols = ctypes.cast(params[3], ctypes.POINTER(ctypes.c_int64))[0]
        seen.append((gx * bx, rows, cols))
        x = view(params, 0, 64 * 48).reshape(64, 48)
        view(params, 1, 64)[:rows] = x[:rows, :cols].sum(1)

    mock_cuda.mock_set_launch_hook(hook)
    xv = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    x = kiln.nd.array(xv, device=kiln.cuda())
    out = kiln.nd.array(np.zeros(64, "float32"), device=kiln.cuda())
    launch = mod.get_function("rowsum")._pyfunc
    launch(x, out, shapes=[(5, 7), (5,)])
    got = out.numpy()
    np.testing.assert_allclose(got[:5], xv[:5, :7].sum(1), rtol=1e-6)
    assert (got[5:] == 0).all()
    launch(x, out)  # no shapes: the upper bounds
    assert seen == [(32, 5, 7), (64, 64, 48)]  # 5 rows need one block of 32, 64 rows two
    with pytest.raises(InputError, match=r"argument 0 \(X\) dim 1 \(the dynamic extent cols\) is 49, expected 0\.\.48"):
        launch(x, out, shapes=[(5, 49), (5,)])
    with pytest.raises(InputError, match=r"argument 1 \(S\) dim 0 is 6 but argument 0 dim 0 is 5"):
        launch(x, out, shapes=[(5, 7), (6,)])


def test_mock_launches_use_the_grid_of_the_actual_extents(mock_cuda) -> None:
    """The driver sees ``ceil(rows / 32)`` blocks (the launch records of the mock), recomputed
    only when the extents change; an empty extent launches nothing rather than a 0-block grid
    (an invalid launch on a real driver)."""
    from kiln.codegen.cuda import function_table, generate_cuda

    _, infos = generate_cuda([_dyn_reduce()])
    ptx = ".version 8.0\n.target sm_80\n.visible .entry rowsum_kernel0(\n)\n"
    mod = rc.loadbinary_cuda(rc.encode_payload(rc.CUDAPayload("ptx", ptx.encode(), "", "sm_80",
                                                              function_table(infos))))
    grids = []

    @hook_type()
    def hook(name, gx, gy, gz, bx, by, bz, shared, params):
        grids.append(((gx, gy, gz), (bx, by, bz)))

    mock_cuda.mock_set_launch_hook(hook)
    x = kiln.nd.array(np.zeros((64, 48), "float32"), device=kiln.cuda())
    out = kiln.nd.array(np.zeros(64, "float32"), device=kiln.cuda())
    launch = mod.get_function("rowsum")._pyfunc
    rows = [1, 32, 33, 64, 0, 0, 17]
    for r in rows:
        launch(x, out, shapes=[(r, 48), (r,)])
    want = [((-(-r // 32), 1, 1), (32, 1, 1)) for r in rows if r]
    assert grids == want and want[:4] == [((1, 1, 1), (32, 1, 1)), ((1, 1, 1), (32, 1, 1)),
                                          ((2, 1, 1), (32, 1, 1)), ((2, 1, 1), (32, 1, 1))]
    assert launch.grids == ((1, 1, 1),)  # the plan of rows=17


def test_dynamic_graph_builds_for_cuda_and_the_executor_passes_the_extents(mock_cuda, needs_nvrtc,
                                                                           tmp_path) -> None:
    """NVRTC compiles the kernels with their extent parameters; on the mock driver the graph
    executor launches them with the actual batch, which the hook uses to emulate the kernel."""
    from kiln import ir

    g = ir.Graph("dyn_relu")
    g.declare_dim("batch", 1, 8)
    x = g.add_input("x", ("batch", 16))
    g.outputs = [g.add("relu", x)]
    path = str(tmp_path / "relu.so")
    kiln.build(g, target="cuda").export_library(path)
    lib = kiln.runtime.load_module(path)
    cuda_mod = next(m for m in lib.walk() if m.type_key == "cuda")
    (f,) = cuda_mod.functions.values()
    assert [x.name for x in f.extents] and f.launches[0].args[-1] == len(f.args) + len(f.temps)
    assert ".entry " + f.launches[0].kernel in cuda_mod.data.decode()
    seen = []

    @hook_type()
    def hook(name, gx, gy, gz, bx, by, bz, shared, params):
        n = ctypes.cast(params[2], ctypes.POINTER(ctypes.c_int32))[0]
        seen.append(n)
        view(params, 1, 128)[:n * 16] = np.maximum(view(params, 0, 128)[:n * 16], 0)

    mock_cuda.mock_set_launch_hook(hook)
    m = kiln.GraphModule(lib["default"](kiln.cuda()))
    for b in (8, 3, 1):
        xv = np.random.default_rng(b).standard_normal((b, 16)).astype(np.float32)
        m.run(x=xv)
        np.testing.assert_array_equal(m.get_output(0).numpy(), np.maximum(xv, 0))
    assert seen == [8, 3, 1]
    with pytest.raises(InputError, match=r"dim 0 \(batch\) is 9, outside its range 1\.\.8"):
        m.set_input("x", np.zeros((9, 16), "float32"))
