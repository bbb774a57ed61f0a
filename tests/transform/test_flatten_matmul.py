"""FlattenMatmul: shared-weight products over leading dims become one 2-D dense."""

import numpy as np
import pytest

import kiln
from kiln import ir, transform
from kiln.ir import Graph
from kiln.transform.flatten_matmul import flatten_matmul

RNG = np.random.default_rng(0)


def r(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype("float32")


def _product_ops(g: Graph) -> dict[str, int]:
    ops = g.op_counts()
    return {k: ops.get(k, 0) for k in ("dense", "matmul")}


def _assert_one_2d_dense(g: Graph) -> None:
    assert _product_ops(g) == {"dense": 1, "matmul": 0}
    (d,) = [n for n in g.nodes if n.op == "dense"]
    assert d.inputs[0].type.ndim <= 2, "the dense still has leading (batch) dims"


def _numpy_check(g: Graph, h: Graph, feeds: dict, want: np.ndarray) -> None:
    (got,) = ir.evaluate(h, feeds)
    (orig,) = ir.evaluate(g, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, orig, rtol=1e-5, atol=1e-5)


SHAPES = [((197, 1, 768), (768, 64)), ((1, 7, 7, 32), (32, 16)), ((2, 3, 4, 5), (5, 6))]


@pytest.mark.parametrize("ashape,bshape", SHAPES)
@pytest.mark.parametrize("form", ["dense", "matmul"])
def test_flattens_to_one_dense(ashape, bshape, form):
    # "dense" is what the ONNX frontend emits for a constant B; "matmul" is a hand-built graph
    a, b = r(*ashape), r(*bshape)
    g = Graph()
    x = g.add_input("a", ashape)
    if form == "dense":
        y = g.add("dense", x, g.add_constant(np.ascontiguousarray(b.T)))
    else:
        y = g.add("matmul", x, g.add_constant(b))
    g.outputs = [y]
    h = flatten_matmul(g)
    _assert_one_2d_dense(h)
    assert h.outputs[0].shape == ashape[:-1] + bshape[-1:]
    _numpy_check(g, h, {"a": a}, a @ b)


@pytest.mark.parametrize("bshape", [(1, 5, 6), (1, 1, 5, 6), (3, 5, 6), (2, 3, 5, 6)])
def test_batched_b_with_shared_weights(bshape):
    """A 3-D/4-D B that is one matrix for every batch (broadcast dims or equal slices)."""
    a = r(2, 3, 4, 5)
    mat = r(5, 6)
    b = np.ascontiguousarray(np.broadcast_to(mat, bshape))
    g = Graph()
    g.outputs = [g.add("matmul", g.add_input("a", a.shape), g.add_constant(b))]
    h = flatten_matmul(g)
    _assert_one_2d_dense(h)
    _numpy_check(g, h, {"a": a}, np.matmul(a, b))


def test_broadcast_b_input_becomes_2d_matmul():
    # B is not a constant: the product stays a matmul, but a 2-D one (no batch loop)
    a, b = r(2, 3, 4, 5), r(1, 5, 6)
    g = Graph()
    g.outputs = [g.add("matmul", g.add_input("a", a.shape), g.add_input("b", b.shape))]
    h = flatten_matmul(g)
    (mm,) = [n for n in h.nodes if n.op == "matmul"]
    assert [v.type.ndim for v in mm.inputs] == [2, 2]
    _numpy_check(g, h, {"a": a, "b": b}, np.matmul(a, b))


@pytest.mark.parametrize("bshape", [(3, 5, 6), (2, 3, 5, 6)])
def test_truly_batched_matmul_is_kept(bshape):
    a, b = r(2, 3, 4, 5), r(*bshape)
    g = Graph()
    g.outputs = [g.add("matmul", g.add_input("a", a.shape), g.add_constant(b))]
    h = flatten_matmul(g)
    assert _product_ops(h) == {"dense": 0, "matmul": 1}
    _numpy_check(g, h, {"a": a}, np.matmul(a, b))


def test_equal_slices_that_would_broadcast_a_are_kept():
    # A has batch 1 and B batch 3 (equal slices): the output repeats A's rows 3 times, which
    # one dense does not express, so the matmul stays
    a = r(1, 4, 5)
    b = np.ascontiguousarray(np.broadcast_to(r(5, 6), (3, 5, 6)))
    g = Graph()
    g.outputs = [g.add("matmul", g.add_input("a", a.shape), g.add_constant(b))]
    h = flatten_matmul(g)
    assert _product_ops(h) == {"dense": 0, "matmul": 1}
    _numpy_check(g, h, {"a": a}, np.matmul(a, b))


def test_2d_is_unchanged():
    g = Graph()
    g.outputs = [g.add("dense", g.add_input("a", (4, 5)), g.add_constant(r(6, 5)))]
    h = flatten_matmul(g)
    assert h.op_counts() == g.op_counts()


def test_1d_data_dense_is_unchanged():
    a, w = r(5), r(6, 5)
    g = Graph()
    g.outputs = [g.add("dense", g.add_input("a", (5,)), g.add_constant(w))]
    h = flatten_matmul(g)
    assert h.op_counts() == g.op_counts()
    _numpy_check(g, h, {"a": a}, w @ a)


@pytest.mark.parametrize("ashape,bshape", [((5,), (5, 6)), ((2, 3, 5), (5,)), ((5,), (5,)),
                                           ((3, 5), (5, 6)), ((197, 1, 8), (8, 4))])
def test_onnx_matmul_edge_ranks(ashape, bshape):
    """ONNX MatMul with 1-D / 2-D operands through the frontend and the default pipeline."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    a, b = r(*ashape), r(*bshape)
    want = np.matmul(a, b)
    node = helper.make_node("MatMul", ["A", "B"], ["Y"])
    graph = helper.make_graph([node], "mm", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ashape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, want.shape)],
                              [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = kiln.frontend.from_onnx(model, shape={"A": ashape})
    h = transform.default_pipeline(params, opt_level=3)(mod)
    assert h.op_counts().get("matmul", 0) == 0
    assert all(n.inputs[0].type.ndim <= 2 for n in h.nodes if n.op == "dense")
    (got,) = ir.evaluate(h, {"A": a})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _gelu_epilogue_graph(ashape, n, residual=True):
    g = Graph()
    x = g.add_input("x", ashape)
    w = g.add_constant(r(n, ashape[-1]))
    y = g.add("dense", x, w)
    y = g.add("add", y, g.add_constant(r(n)))
    half = g.add("multiply", y, g.add_constant(np.array(0.5, "float32")))
    e = g.add("erf", g.add("divide", y, g.add_constant(np.array(1.4142135, "float32"))))
    y = g.add("multiply", half, g.add("add", e, g.add_constant(np.array(1.0, "float32"))))
    if residual:
        y = g.add("add", y, g.add_input("res", ashape[:-1] + (n,)))
    g.outputs = [y]
    return g


def test_epilogue_is_rewritten_on_the_rows():
    """Bias, GELU (with fan-out) and a residual run on the 2-D rows; one reshape back."""
    g = _gelu_epilogue_graph((1, 7, 7, 32), 16)
    h = flatten_matmul(g)
    _assert_one_2d_dense(h)
    for node in h.nodes:
        if node.op not in ("constant", "reshape"):
            assert node.outputs[0].shape == (49, 16), node
    reshapes = [n for n in h.nodes if n.op == "reshape"]
    assert all(n.attrs["alias"] for n in reshapes)
    assert sum(n.outputs[0].shape == (1, 7, 7, 16) for n in reshapes) == 1
    feeds = {"x": r(1, 7, 7, 32), "res": r(1, 7, 7, 16)}
    for a, b in zip(ir.evaluate(g, feeds), ir.evaluate(h, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_epilogue_stops_at_a_non_row_broadcast():
    # a per-row scale (3, 4, 1) has the output's leading dims: it flattens to (12, 1); a
    # (4, 1) operand against (3, 4, 4) repeats along the leading dims, which would need a
    # copy in the flat form, so the sinking stops there
    g = Graph()
    x = g.add_input("x", (3, 4, 8))
    y = g.add("dense", x, g.add_constant(r(4, 8)))
    y = g.add("multiply", y, g.add_constant(r(3, 4, 1)))
    g.outputs = [g.add("add", y, g.add_constant(r(4, 1)))]
    h = flatten_matmul(g)
    (last,) = [n for n in h.nodes if n.op == "add"]
    assert last.outputs[0].shape == (3, 4, 4)
    (mul,) = [n for n in h.nodes if n.op == "multiply"]
    assert mul.outputs[0].shape == (12, 4)
    feeds = {"x": r(3, 4, 8)}
    for a, b in zip(ir.evaluate(g, feeds), ir.evaluate(h, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_pass_is_in_the_default_pipeline():
    assert "FlattenMatmul" in [p.name for p in transform.default_pipeline(opt_level=3).passes]


@pytest.mark.parametrize("ashape,n", [((197, 1, 96), 64), ((1, 7, 7, 32), 16)])
def test_compiled_matches_numpy(ashape, n):
    """End to end on the llvm target: the fused dense + GELU + residual kernel."""
    g = _gelu_epilogue_graph(ashape, n)
    feeds = {"x": r(*ashape), "res": r(*ashape[:-1], n)}
    (want,) = ir.evaluate(g, feeds)
    lib = kiln.build(g, target="llvm")
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.run(**feeds)
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)


def test_mlp_chain_stays_flat():
    """dense -> gelu -> dense (ConvNeXt's channels-last MLP): one reshape in, one back."""
    g = Graph()
    x = g.add_input("x", (1, 7, 7, 32))
    y = g.add("gelu", g.add("dense", x, g.add_constant(r(64, 32))))
    g.outputs = [g.add("dense", y, g.add_constant(r(32, 64)))]
    h = flatten_matmul(g)
    assert h.op_counts()["reshape"] == 2
    assert all(n.inputs[0].type.ndim == 2 for n in h.nodes if n.op == "dense")
    feeds = {"x": r(1, 7, 7, 32)}
    for a, b in zip(ir.evaluate(g, feeds), ir.evaluate(h, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
