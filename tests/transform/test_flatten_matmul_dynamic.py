"""FlattenMatmul on dynamic graphs whose rows cannot be flattened: a MatMul by a shared constant
weight becomes an N-D dense (then packed) instead of staying a matmul.

PyTorch exports layers that share one weight as ``Identity(W)`` of the first layer's
initializer; the ONNX frontend only makes a dense of a MatMul whose weight is already constant,
so those products arrive as ``matmul`` and the constant appears only after folding. With a
symbolic dim inside the leading dims (``[S, batch, K]``, sequence first) merging them into
rows would move data, so the pass keeps them and emits ``dense(A, W.T)`` on the N-D input.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import transform
from kiln.ir import Graph

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)
K, N = 32, 64
RANGES = {"batch": (1, 8), "seq": (1, 16)}


def r(*shape: int) -> np.ndarray:
    return RNG.uniform(-1.0, 1.0, size=shape).astype("float32")


def _model(a_dims: list, w: np.ndarray, *, weight_input: bool = False) -> onnx.ModelProto:
    """``Y = A x Identity(W) + bias``; W an initializer, or a graph input (``weight_input``)."""
    nodes = [helper.make_node("Identity", ["W"], ["Wi"]),
             helper.make_node("MatMul", ["A", "Wi"], ["P"]),
             helper.make_node("Add", ["P", "bias"], ["Y"])]
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_dims)]
    inits = [numpy_helper.from_array(r(w.shape[-1]), "bias")]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, w.shape))
    else:
        inits.append(numpy_helper.from_array(w, "W"))
    graph = helper.make_graph(nodes, "shared_weight", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _import(model: onnx.ModelProto) -> tuple[Graph, dict]:
    ranges = {k: v for k, v in RANGES.items()
              if any(d.dim_param == k for i in model.graph.input for d in i.type.tensor_type.shape.dim)}
    return kiln.frontend.from_onnx(model, dim_ranges=ranges)


def _products(g: Graph) -> list:
    return [n for n in g.nodes if n.op in ("dense", "matmul")]


def _check_against_ort(model: onnx.ModelProto, feeds_list: list[dict[str, np.ndarray]]) -> None:
    graph, params = _import(model)
    gm = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        (want,) = sess.run(None, feeds)
        gm.run(**feeds)
        got = gm.get_output(0).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# a symbolic dim inside the leading dims: the rows b*... are not where the data lives
DYN_ROWS = [pytest.param([16, "batch", K], id="seq_first"),
            pytest.param(["batch", "seq", K], id="batch_seq"),
            pytest.param([2, "batch", 3, K], id="4d")]


def _feed_shape(dims: list, batch: int) -> tuple[int, ...]:
    return tuple({"batch": batch, "seq": 5}.get(d, d) for d in dims)


@pytest.mark.parametrize("dims", DYN_ROWS)
def test_identity_weight_becomes_packed_nd_dense(dims):
    graph, params = _import(_model(dims, r(K, N)))
    assert [n.op for n in _products(graph)] == ["matmul"]  # what the frontend makes of Identity(W)
    h = transform.default_pipeline(params, opt_level=3)(graph)
    (d,) = _products(h)
    assert d.op == "dense"
    # the leading dims are kept (not flattened into rows), and the weight is stored as panels
    assert d.inputs[0].type.dims == tuple(dims)
    assert d.attrs["units"] == N and d.inputs[1].const_value is not None
    assert h.outputs[0].type.dims == tuple(dims[:-1]) + (N,)


@pytest.mark.parametrize("dims", DYN_ROWS)
def test_nd_dense_matches_onnxruntime(dims):
    w = r(K, N)
    _check_against_ort(_model(dims, w), [{"A": r(*_feed_shape(dims, b))} for b in (1, 3, 8)])


def test_static_rows_still_flatten_to_2d():
    """A static graph keeps the 2-D dense of the flattened rows (the rewrite above is for
    dynamic rows only)."""
    graph, params = kiln.frontend.from_onnx(_model([16, 2, K], r(K, N)))
    h = transform.default_pipeline(params, opt_level=3)(graph)
    (d,) = _products(h)
    assert d.op == "dense" and d.inputs[0].type.dims == (32, K)


# --------------------------------------------------------------------- where it must not apply
def test_weight_graph_input_stays_matmul():
    model = _model([16, "batch", K], r(K, N), weight_input=True)
    graph, params = _import(model)
    h = transform.default_pipeline(params, opt_level=3)(graph)
    assert [n.op for n in _products(h)] == ["matmul"]
    w = r(K, N)
    _check_against_ort(model, [{"A": r(16, b, K), "W": w} for b in (1, 3, 8)])


def test_per_head_weights_stay_matmul():
    # a different matrix per head: a real batched product, no single weight to pack
    dims = ["batch", 4, "seq", K]
    model = _model(dims, r(4, K, N))
    graph, params = _import(model)
    h = transform.default_pipeline(params, opt_level=3)(graph)
    assert [n.op for n in _products(h)] == ["matmul"]
    _check_against_ort(model, [{"A": r(*_feed_shape(dims, b))} for b in (1, 3, 8)])


def test_weight_of_higher_rank_stays_matmul():
    # B (1, 1, K, N) is one shared matrix but prepends a unit dim to the output
    # ((1, 16, batch, N)), which a dense on A (16, batch, K) does not produce
    dims = [16, "batch", K]
    model = _model(dims, r(1, 1, K, N))
    graph, params = _import(model)
    h = transform.default_pipeline(params, opt_level=3)(graph)
    assert [n.op for n in _products(h)] == ["matmul"]
    assert h.outputs[0].type.dims == (1, 16, "batch", N)
    _check_against_ort(model, [{"A": r(16, b, K)} for b in (1, 3, 8)])
