"""Work-group (local) memory on OpenCL: ``cache_read``, barriers, tree reductions, tiled GEMMs.

Kernels run on PoCL (the CPU OpenCL driver); tests that launch skip without an OpenCL
device. Shapes are deliberately not multiples of the tiles / group sizes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln import codegen, te, tir
from kiln.codegen.opencl import generate_opencl
from kiln.runtime.errors import CompileError
from kiln.te.schedule import thread_axis
from kiln.topi.schedule import gpu
from tests.opencl.local_kernels import shared_matmul, tree_reduce

HAS_CL = kiln.opencl().exist
needs_cl = pytest.mark.skipif(not HAS_CL, reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")


def test_cache_read_lowers_to_local_buffers_and_barriers():
    src, meta = generate_opencl([shared_matmul(37, 45, 29)])
    assert "__local float A_shared[256];" in src  # 32 rows x 8 (one K-step) of A
    assert "__local float B_shared[256];" in src  # 8 x 32 columns of B
    assert src.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2
    (k,) = meta[0]["kernels"]
    assert k["block"] == [256, 1, 1] and k["grid"] == [2, 2, 1] and k["shared_bytes"] == 2048


def test_cache_read_local_scope_is_per_work_item():
    src, _ = generate_opencl([shared_matmul(37, 45, 29, a_scope="local")])
    assert "__local float B_shared[256];" in src and "__local float A_local" not in src
    assert "float A_local[16];" in src  # 2 rows x 8 K-values of this work-item, private


def test_cache_read_errors():
    A = te.placeholder((8, 8), name="A")
    C = te.compute((8, 8), lambda i, j: A[i, j] + 1, name="C")
    s = te.create_schedule(C)
    with pytest.raises(CompileError, match="scope must be 'shared' or 'local'"):
        s.cache_read(A, "global", [s[C]])
    with pytest.raises(CompileError, match="no readers"):
        s.cache_read(A, "shared", [])


def test_reduce_axis_binding_rules():
    A = te.placeholder((100,), name="A")
    kv = te.reduce_axis((0, 100), name="k")
    C = te.compute((1,), lambda i: te.sum(A[kv], axis=kv), name="C")
    s = te.create_schedule(C)
    with pytest.raises(CompileError, match="threadIdx"):
        s[C].bind(kv, thread_axis("blockIdx.x"))
    _, ki = s[C].split(kv, factor=48)
    s[C].bind(ki, thread_axis("threadIdx.x"))  # not the outermost reduction loop
    with pytest.raises(CompileError, match="outermost reduction loop"):
        tir.lower(s, [A, C], name="bad")


def test_barrier_under_a_partial_thread_loop_is_refused():
    # one stage binds 100 work-items, the tree reduction's group is 64: the 64-wide
    # tree would sit under "if (tid < 64)" in a 100-wide launch (deadlock)
    A = te.placeholder((2, 100), name="A")
    B = te.compute((2, 100), lambda i, j: A[i, j] * 2, name="B")
    kv = te.reduce_axis((0, 100), name="k")
    C = te.compute((2,), lambda i: te.sum(B[i, kv], axis=kv), name="C")
    s = te.create_schedule(C)
    s[B].compute_at(s[C], C.op.axis[0])
    s[B].bind(s[B].op.axis[1], thread_axis("threadIdx.x"))
    gpu.schedule_tree_reduce(s[C], 64)
    f = tir.lower(s, [A, C], name="div")
    with pytest.raises(CompileError, match="barrier"):
        generate_opencl([f])


@needs_cl
@pytest.mark.parametrize("m,n,k,a_scope", [(37, 45, 29, "shared"), (32, 32, 16, "shared"), (33, 70, 9, "shared"),
                                           (37, 45, 29, "local")])
def test_shared_matmul_on_opencl(m, n, k, a_scope):
    m_ = codegen.build_module([shared_matmul(m, n, k, a_scope=a_scope)], "opencl")
    r = np.random.default_rng(m + n + k)
    a = r.standard_normal((m, k)).astype(np.float32)
    b = r.standard_normal((k, n)).astype(np.float32)
    dev = kiln.opencl()
    c = kiln.nd.empty((m, n), "float32", dev)
    m_["mm"](kiln.nd.array(a, device=dev), kiln.nd.array(b, device=dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-5, atol=1e-5)


@needs_cl
@pytest.mark.parametrize("rows,k,kind,threads", [
    (None, 1001, "sum", 64), (None, 77, "max", 64), (3, 1001, "max", 64), (5, 130, "sum", 32), (2, 13, "sum", 64),
])
def test_tree_reduction_on_opencl(rows, k, kind, threads):
    f = tree_reduce(rows, k, kind, threads)
    src, meta = generate_opencl([f])
    nt = meta[0]["kernels"][0]["block"][0]
    assert nt == min(threads, k)  # 13 terms: 13 work-items, a tree over a non-power of two
    assert "__local float C_red[" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
    m = codegen.build_module([f], "opencl")
    r = np.random.default_rng(k)
    shape = (k,) if rows is None else (rows, k)
    a = r.standard_normal(shape).astype(np.float32)
    dev = kiln.opencl()
    out = kiln.nd.empty((1,) if rows is None else (rows,), "float32", dev)
    m["red"](kiln.nd.array(a, device=dev), out)
    want = (a.sum(-1) if kind == "sum" else a.max(-1)).reshape(out.shape)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-4)


def _onnx(nodes, inputs, inits=()):
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", inputs, [y], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run_opencl(model: onnx.ModelProto, feeds: dict) -> tuple[np.ndarray, str]:
    mod, params = kiln.frontend.from_onnx(model)
    f = kiln.build(mod, target="opencl", params=params)
    src = "\n".join(im.get_source() for im in f.get_lib().imported_modules)
    g = kiln.GraphModule(f["default"](kiln.opencl()))
    g.set_input(**feeds)
    g.run()
    return g.get_output(0).numpy(), src


@needs_cl
@pytest.mark.parametrize("op,axes,few", [("ReduceSum", [0, 1], False), ("ReduceMax", [1], True),
                                         ("ReduceMean", [1], True)])
def test_reductions_with_few_outputs_use_trees_on_opencl(op, axes, few, monkeypatch):
    import onnxruntime as ort

    if few:  # the CUDA rule (OpenCL trees only single outputs by default: see TREE_MAX_OUTPUTS)
        monkeypatch.setitem(gpu.TREE_MAX_OUTPUTS, "opencl", gpu.MIN_WORK_ITEMS - 1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 999])
    ax = numpy_helper.from_array(np.array(axes, np.int64), "axes")
    model = _onnx([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], [x], [ax])
    model.opset_import[0].version = 18
    xv = np.random.default_rng(3).standard_normal((5, 999)).astype(np.float32)
    y, src = _run_opencl(model, {"x": xv})
    assert "barrier(CLK_LOCAL_MEM_FENCE);" in src
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


@needs_cl
@pytest.mark.parametrize("case", ["dense", "batch_matmul", "conv", "conv_stride2"])
def test_local_tiles_at_odd_shapes(case, monkeypatch):
    import onnxruntime as ort

    for tag in ("dense", "matmul", "conv2d_nchw"):
        monkeypatch.setitem(gpu.SHARED_TAGS["opencl"], tag, True)
    r = np.random.default_rng(7)
    if case == "dense":  # M, N, K not multiples of the 64 x 64 x 8 tile; bias + relu epilogue
        a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [70, 45])
        w = numpy_helper.from_array(r.standard_normal((45, 67)).astype(np.float32), "w")
        bias = numpy_helper.from_array(r.standard_normal(67).astype(np.float32), "bias")
        model = _onnx([helper.make_node("MatMul", ["a", "w"], ["t"]), helper.make_node("Add", ["t", "bias"], ["u"]),
                       helper.make_node("Relu", ["u"], ["y"])], [a], [w, bias])
        feeds = {"a": r.standard_normal((70, 45)).astype(np.float32)}
    elif case.startswith("conv"):  # input channels not a multiple of the 8-channel step
        cin, hw, stride = (13, 12, 1) if case == "conv" else (5, 15, 2)
        a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, cin, hw, hw])
        w = numpy_helper.from_array((r.standard_normal((64, cin, 3, 3)) * 0.2).astype(np.float32), "w")
        bias = numpy_helper.from_array(r.standard_normal(64).astype(np.float32), "bias")
        model = _onnx([helper.make_node("Conv", ["a", "w", "bias"], ["u"], pads=[1, 1, 1, 1], strides=[stride] * 2),
                       helper.make_node("Relu", ["u"], ["y"])], [a], [w, bias])
        feeds = {"a": r.standard_normal((2, cin, hw, hw)).astype(np.float32)}
    else:
        a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 65, 19])
        b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 19, 66])
        model = _onnx([helper.make_node("MatMul", ["a", "b"], ["y"])], [a, b])
        feeds = {"a": r.standard_normal((3, 65, 19)).astype(np.float32),
                 "b": r.standard_normal((3, 19, 66)).astype(np.float32)}
    y, src = _run_opencl(model, feeds)
    assert "__local float" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
