"""OpenCL kernels with runtime extents: graphs with dynamic dims built for ``opencl``.

One library per graph, run at several shapes in range through the graph executor and compared
with NumPy; out-of-range shapes are :class:`InputError` s. Kernels guard their work-items by
the runtime extents the launcher passes (``docs/dynamic_shapes.md``); the grids that follow the
extents are tested in ``test_opencl_dynamic_grid.py``. Launching needs an OpenCL device (PoCL on the CPU); the
codegen, metadata and payload checks need none.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kiln
from kiln import ir, te, tir
from kiln.runtime.errors import InputError
from tests.executor.dynamic_support import masked_attention_graph

HAS_CL = kiln.opencl().exist
needs_cl = pytest.mark.skipif(not HAS_CL, reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")

RNG = np.random.default_rng(7)


def _const(g: ir.Graph, *shape: int) -> ir.Value:
    return g.add_constant((RNG.standard_normal(shape) * 0.3).astype("float32"))


def _opencl_module(g: ir.Graph, tmp_path=None) -> kiln.GraphModule:
    lib = kiln.build(g, target="opencl")
    if tmp_path is not None:  # through the library file: the payload with runtime extents round-trips
        path = str(tmp_path / "dyn.so")
        lib.export_library(path)
        lib = kiln.runtime.load_module(path)
    return kiln.GraphModule(lib["default"](kiln.opencl()))


def _dyn_kernel():
    """``C[i] = A[i] * 2`` over a dynamic ``n <= 100``, bound to 4 work-groups of 32."""
    n = tir.Var("n", "int32")
    A = te.placeholder((100,), name="A", dyn=(n,))
    C = te.compute((100,), lambda i: A[i] * 2.0, name="C")
    s = te.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return tir.lower(s, [A, C], "twice")


# ---------------------------------------------------------------------------------- codegen


def test_kernels_take_the_extents_they_read_and_launch_at_the_upper_bound():
    from kiln.codegen.opencl import generate_opencl

    src, meta = generate_opencl([_dyn_kernel()])
    sig = src.split("__kernel void twice_kernel0(")[1].split(")")[0]
    assert sig.endswith("const int n")
    assert "< n)" in src  # the work-items past the runtime extent do nothing
    (f,) = meta
    assert f["extents"] == [{"name": "n", "dtype": "int32", "dims": [[0, 0], [1, 0]]}]
    k = f["kernels"][0]
    assert k["args"] == [["param", 0], ["param", 1], ["extent", 0]]
    assert (k["grid"], k["block"]) == ([4, 1, 1], [32, 1, 1])


def static_inc_kernel():
    """``C = A + 1`` over 64 static elements, 32 work-items per group: no runtime extent."""
    A = te.placeholder((64,), name="A")
    C = te.compute((64,), lambda i: A[i] + 1.0, name="C")
    s = te.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return tir.lower(s, [A, C], "inc")


def test_static_kernels_are_unchanged_and_keep_payload_version_2():
    from kiln.codegen.opencl import build_opencl
    from kiln.runtime.opencl_driver import OpenCLModule

    mod = build_opencl([static_inc_kernel()])
    raw = mod.save_to_binary()
    assert int.from_bytes(raw[8:12], "little") == 2
    assert "extents" not in mod.functions["inc"].to_dict()
    assert OpenCLModule.describe_payload(raw)["functions"][0] == {"name": "inc", "num_args": 2, "launches": 1,
                                                                  "temp_bytes": 0}


def test_payload_version_4_carries_the_extents_and_grids():
    from kiln.codegen.opencl import build_opencl
    from kiln.runtime.errors import FormatError
    from kiln.runtime.gpu_module import GPUExtent, GPUPayload
    from kiln.runtime.opencl_driver import OpenCLModule

    mod = build_opencl([_dyn_kernel()])
    raw = mod.save_to_binary()
    assert int.from_bytes(raw[8:12], "little") == 4  # the launch has a run-time grid
    back = OpenCLModule.load_binary(raw)
    f = back.functions["twice"]
    assert f.extents == (GPUExtent("n", "int32", ((0, 0), (1, 0))),)
    assert f.launches[0].args == (0, 1, 2)  # index len(args) + len(temps) + 0: extent 0
    assert f == mod.functions["twice"]
    assert OpenCLModule.describe_payload(raw)["functions"][0]["extents"] == ["n"]
    # an extent naming a dim no tensor argument has is a format error, not a wild read
    bad = dataclasses.replace(f, extents=(GPUExtent("n", "int32", ((0, 0), (1, 5))),))
    raw = OpenCLModule.encode_payload(GPUPayload("cl", b"", back.source, "", [bad]))
    with pytest.raises(FormatError, match="runtime extent 'n' of 'twice' is dim 5 of argument 1"):
        OpenCLModule.load_binary(raw)


# ---------------------------------------------------------------------------------- launcher


@needs_cl
def test_launcher_checks_and_passes_the_actual_extents():
    from kiln.codegen.opencl import build_opencl

    mod = build_opencl([_dyn_kernel()])
    dev = kiln.opencl()
    x = RNG.standard_normal(100).astype("float32")
    a = kiln.nd.array(x, device=dev)
    c = kiln.nd.array(np.full(100, -1, "float32"), device=dev)
    f = mod["twice"]
    f(a, c)  # no shapes: the whole storage is valid
    np.testing.assert_array_equal(c.numpy(), x * 2)
    c.copyfrom(np.full(100, -1, "float32"))
    mod.get_function("twice")._pyfunc(a, c, shapes=[(37,), (37,)])
    got = c.numpy()
    np.testing.assert_array_equal(got[:37], x[:37] * 2)
    assert (got[37:] == -1).all()  # nothing past the extent is written
    launch = mod.get_function("twice")._pyfunc
    with pytest.raises(InputError, match=r"argument 0 \(A\) dim 0 \(the dynamic extent n\) is 101, expected 0\.\.100"):
        launch(a, c, shapes=[(101,), (101,)])
    with pytest.raises(InputError, match="argument 1 .* is 5 but argument 0 dim 0 is 4; both are the dynamic extent n"):
        launch(a, c, shapes=[(4,), (5,)])


# ---------------------------------------------------------------------------------- graphs


@needs_cl
def test_elementwise_with_broadcast_at_every_shape():
    g = ir.Graph("ew")
    g.declare_dim("batch", 1, 4)
    g.declare_dim("seq", 1, 32)
    x = g.add_input("x", ("batch", "seq", 8))
    y = g.add_input("y", ("batch", "seq", 8))
    w = _const(g, 8)
    g.outputs = [g.add("relu", g.add("add", g.add("multiply", g.add("exp", x), w), y)), g.add("tanh", x)]
    m = _opencl_module(g)
    wv = w.const_value
    for b, s in [(1, 1), (2, 5), (4, 32), (3, 17)]:
        xv = RNG.standard_normal((b, s, 8)).astype("float32")
        yv = RNG.standard_normal((b, s, 8)).astype("float32")
        m.run(x=xv, y=yv)
        o0, o1 = m.get_output(0).numpy(), m.get_output(1).numpy()
        assert o0.shape == o1.shape == (b, s, 8)
        np.testing.assert_allclose(o0, np.maximum(np.exp(xv) * wv + yv, 0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(o1, np.tanh(xv), rtol=1e-5, atol=1e-6)


@needs_cl
def test_reductions_over_a_dynamic_axis():
    """Sums, maxima, means and a softmax over ``seq`` stop at its runtime extent: the padding
    (stale data of a longer earlier run) never reaches a result."""
    g = ir.Graph("red")
    g.declare_dim("batch", 1, 4)
    g.declare_dim("seq", 1, 50)
    x = g.add_input("x", ("batch", "seq", 6))
    g.outputs = [g.add("reduce_sum", x, axes=(1,), keepdims=False),
                 g.add("reduce_max", x, axes=(1,), keepdims=False),
                 g.add("reduce_mean", x, axes=(1,), keepdims=True),
                 g.add("softmax", g.add("transpose", x, axes=(0, 2, 1)), axis=-1)]
    m = _opencl_module(g)
    for b, s in [(4, 50), (1, 1), (2, 9), (3, 33)]:  # longest first: later runs leave padding behind
        xv = (RNG.standard_normal((b, s, 6)) - (1.0 if s < 50 else -5.0)).astype("float32")
        m.run(x=xv)
        xt = xv.transpose(0, 2, 1)
        e = np.exp(xt - xt.max(-1, keepdims=True))
        want = [xv.sum(1), xv.max(1), xv.mean(1, keepdims=True), e / e.sum(-1, keepdims=True)]
        for i, w in enumerate(want):
            got = m.get_output(i).numpy()
            assert got.shape == w.shape, (i, got.shape, w.shape)
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5, err_msg=f"output {i} at {(b, s)}")


@needs_cl
def test_dense_and_matmul_with_dynamic_batch(tmp_path):
    g = ir.Graph("mm")
    g.declare_dim("batch", 1, 16)
    x = g.add_input("x", ("batch", 64))
    z = g.add_input("z", ("batch", 3, 24))
    w, bias, v = _const(g, 32, 64), _const(g, 32), _const(g, 24, 12)
    g.outputs = [g.add("add", g.add("dense", x, w), bias), g.add("matmul", z, v)]
    m = _opencl_module(g, tmp_path)  # exported and loaded again
    wv, bv, vv = w.const_value, bias.const_value, v.const_value
    for b in (1, 5, 16, 7):
        xv = RNG.standard_normal((b, 64)).astype("float32")
        zv = RNG.standard_normal((b, 3, 24)).astype("float32")
        m.run(x=xv, z=zv)
        np.testing.assert_allclose(m.get_output(0).numpy(), xv @ wv.T + bv, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(m.get_output(1).numpy(), zv @ vv, rtol=1e-4, atol=1e-4)


@needs_cl
def test_take_along_a_dynamic_axis_wraps_negative_indices_at_the_runtime_extent():
    g = ir.Graph("tk")
    g.declare_dim("seq", 1, 20)
    x = g.add_input("x", ("seq", 4))
    idx = g.add_constant(np.array([0, -1, 1, -2], "int64"))
    g.outputs = [g.add("take", x, idx, axis=0)]
    m = _opencl_module(g)
    for s in (20, 2, 7):
        xv = RNG.standard_normal((s, 4)).astype("float32")
        m.run(x=xv)
        np.testing.assert_array_equal(m.get_output(0).numpy(), xv[[0, -1, 1, -2]])


@needs_cl
def test_masked_attention_over_dynamic_batch_and_sequence():
    g, wvals = masked_attention_graph(24, _const)
    wq, wk, wv = (w.const_value for w in wvals)
    m = _opencl_module(g)
    for b, s in [(4, 24), (1, 1), (2, 7), (3, 13)]:
        x = RNG.standard_normal((b, s, 16)).astype("float32")
        mask = np.ones((b, s), "float32")
        mask[:, s // 2 + 1:] = 0
        m.run(x=x, mask=mask)
        q, k, v = x @ wq, x @ wk, x @ wv
        sc = q @ k.transpose(0, 2, 1) * 0.25 + ((1 - mask) * -1e4)[:, None, :]
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = p @ v
        np.testing.assert_allclose(m.get_output(0).numpy(), o.mean(1), rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(m.get_output(1).numpy(), o, rtol=2e-5, atol=2e-5)


def _onnx_block(d: int = 32, heads: int = 2, hidden: int = 64):
    """A pre-norm transformer block over x[batch, seq, d] with ONNX dim_params ``batch`` and
    ``seq``: LayerNorm, 2-head self-attention, residual, LayerNorm, GELU MLP, residual."""
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(11)
    hd = d // heads
    w = {n: (r.standard_normal(s) * 0.2).astype("float32") for n, s in [
        ("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, hidden)), ("w2", (hidden, d)),
        ("b1", (hidden,)), ("b2", (d,)), ("g1", (d,)), ("be1", (d,)), ("g2", (d,)), ("be2", (d,))]}
    consts = {"heads_shape": np.array([0, 0, heads, hd], "int64"), "merge_shape": np.array([0, 0, d], "int64"),
              "scale": np.array(1 / np.sqrt(hd), "float32"), "half": np.array(0.5, "float32"),
              "one": np.array(1.0, "float32"), "rsqrt2": np.array(1 / np.sqrt(2), "float32")}
    N = helper.make_node
    nodes = [
        N("LayerNormalization", ["x", "g1", "be1"], ["h"], axis=-1, epsilon=1e-5),
        N("MatMul", ["h", "wq"], ["q0"]), N("MatMul", ["h", "wk"], ["k0"]), N("MatMul", ["h", "wv"], ["v0"]),
        N("Reshape", ["q0", "heads_shape"], ["q1"]), N("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        N("Reshape", ["k0", "heads_shape"], ["k1"]), N("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        N("Reshape", ["v0", "heads_shape"], ["v1"]), N("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        N("MatMul", ["q", "kt"], ["s0"]), N("Mul", ["s0", "scale"], ["s"]), N("Softmax", ["s"], ["p"], axis=-1),
        N("MatMul", ["p", "v"], ["o0"]), N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        N("Reshape", ["o1", "merge_shape"], ["o2"]), N("MatMul", ["o2", "wo"], ["o"]), N("Add", ["x", "o"], ["r1"]),
        N("LayerNormalization", ["r1", "g2", "be2"], ["h2"], axis=-1, epsilon=1e-5),
        N("MatMul", ["h2", "w1"], ["f0"]), N("Add", ["f0", "b1"], ["f1"]),
        N("Mul", ["f1", "rsqrt2"], ["f2"]), N("Erf", ["f2"], ["f3"]), N("Add", ["f3", "one"], ["f4"]),
        N("Mul", ["f1", "f4"], ["f5"]), N("Mul", ["f5", "half"], ["f6"]),
        N("MatMul", ["f6", "w2"], ["f7"]), N("Add", ["f7", "b2"], ["f8"]), N("Add", ["r1", "f8"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", d])],
        [numpy_helper.from_array(v, n) for n, v in {**w, **consts}.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, w, heads


def _block_ref(x, w, heads):
    from math import erf

    def ln(t, g, b):
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + 1e-5) * g + b

    bsz, s, d = x.shape
    hd = d // heads
    h = ln(x, w["g1"], w["be1"])
    q, k, v = ((h @ w[n]).reshape(bsz, s, heads, hd).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(bsz, s, d) @ w["wo"]
    r1 = x + o
    f1 = ln(r1, w["g2"], w["be2"]) @ w["w1"] + w["b1"]
    gelu = 0.5 * f1 * (1 + np.vectorize(erf)(f1 / np.sqrt(2)))
    return r1 + gelu @ w["w2"] + w["b2"]


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    pytest.importorskip("onnx")
    model, w, heads = _onnx_block()
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"batch": (1, 3), "seq": (1, 40)})
    path = str(tmp_path_factory.mktemp("block") / "block.so")
    kiln.build(graph, target="opencl", params=params).export_library(path)
    m = kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.opencl()))
    return m, w, heads


@needs_cl
@pytest.mark.parametrize("b, s", [(3, 40), (1, 1), (2, 17), (1, 33), (3, 5)])
def test_onnx_transformer_block_over_dynamic_batch_and_sequence(block, b, s):
    m, w, heads = block
    x = RNG.standard_normal((b, s, 32)).astype("float32")
    m.run(x=x)
    got = m.get_output(0).numpy()
    assert got.shape == (b, s, 32)
    np.testing.assert_allclose(got, _block_ref(x.astype("float64"), w, heads), rtol=1e-4, atol=1e-4)


@needs_cl
@pytest.mark.parametrize("shape, match", [
    ((4, 10, 32), r"input 'x': dim 0 \(batch\) is 4, outside its range 1\.\.3"),
    ((2, 41, 32), r"input 'x': dim 1 \(seq\) is 41, outside its range 1\.\.40"),
    ((2, 0, 32), r"dim 1 \(seq\) is 0, outside its range 1\.\.40"),
    ((2, 10, 16), r"input 'x': dim 2 is 16, expected 32"),
])
def test_out_of_range_shapes_are_input_errors(block, shape, match):
    m, w, heads = block
    with pytest.raises(InputError, match=match):
        m.set_input("x", np.zeros(shape, "float32"))
    x = RNG.standard_normal((2, 3, 32)).astype("float32")
    m.run(x=x)  # the module still runs at a valid shape afterwards
    np.testing.assert_allclose(m.get_output(0).numpy(), _block_ref(x.astype("float64"), w, heads),
                               rtol=1e-4, atol=1e-4)
