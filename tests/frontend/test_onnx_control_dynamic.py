"""Runtime ``If`` / ``Loop`` over values with symbolic dims, vs ONNX Runtime.

Each model is imported with ``dim_ranges`` (``x`` of dims ``(batch, seq, 16)``), built once for
``llvm`` and run at many actual shapes in one executor, bigger after smaller, so data left in the
padded storage by an earlier run would show. The nested graphs carry the parent's symbols; the
executor hands them their values at run time (``docs/dynamic_shapes.md``, "Control flow").
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.runtime.errors import FormatError, UnsupportedOpError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
h = onnx.helper
TP = onnx.TensorProto
F = TP.FLOAT
RANGES = {"batch": (1, 4), "seq": (1, 24)}
RNG = np.random.default_rng(7)
W = (RNG.standard_normal((16, 16)) * 0.3).astype(np.float32)


def _vi(name: str, shape: list | None, dt: int = F) -> object:
    return h.make_tensor_value_info(name, dt, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> object:
    g = h.make_graph(nodes, "g", inputs, outputs, (inits or []) + [onnx.numpy_helper.from_array(W, "W")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _build(model: object) -> kiln.GraphModule:
    mod, params = kiln.frontend.from_onnx(model, dim_ranges=RANGES)
    return kiln.GraphModule(kiln.build(mod, params=params, target="llvm")["default"](kiln.cpu()))


def _check(model: object, gm: kiln.GraphModule, feeds: dict) -> list[np.ndarray]:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    gm.run(**feeds)
    got = [gm.get_output(k).numpy() for k in range(len(want))]
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"output {k} at {[v.shape for v in feeds.values()]}"
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {k}")
    return got


def _x(b: int, s: int, sign: float = 0.0) -> np.ndarray:
    return (RNG.standard_normal((b, s, 16)) + sign).astype(np.float32)


def _sum_if_model() -> object:
    """if sum(x) > 0: softmax(x @ W) * x else tanh(x * x) - mean over seq of x; then y = r + x.

    Reductions over ``seq`` (the else branch's mean, the then branch's softmax over axis 1) read
    the actual extent: a branch run at stale symbol values or on stale padding would differ.
    """
    then_g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["t1"]),
                           h.make_node("Softmax", ["t1"], ["t2"], axis=-1),
                           h.make_node("Softmax", ["x"], ["t3"], axis=1),
                           h.make_node("Mul", ["t2", "t3"], ["t"])], "then", [], [_vi("t", None)])
    else_g = h.make_graph([h.make_node("Mul", ["x", "x"], ["e1"]), h.make_node("Tanh", ["e1"], ["e2"]),
                           h.make_node("ReduceMean", ["x"], ["e3"], axes=[1], keepdims=1),
                           h.make_node("Sub", ["e2", "e3"], ["e"])], "else", [], [_vi("e", None)])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="sum_if"),
             h.make_node("Add", ["r", "x"], ["y"])]
    return _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("y", ["batch", "seq", 16])],
                  [h.make_tensor("zero", F, [], [0.0])])


@pytest.fixture(scope="module")
def sum_if():
    model = _sum_if_model()
    return model, _build(model)


def test_if_branches_with_symbolic_dims_match_ort(sum_if) -> None:
    model, gm = sum_if
    mod, _ = kiln.frontend.from_onnx(model, dim_ranges=RANGES)
    (node,) = [n for n in mod.nodes if n.op == "if"]
    assert str(node.outputs[0].type) == "Tensor[(batch, seq, 16), float32]"
    branches = set()
    for b, s, sign in [(2, 7, 1.0), (4, 24, -1.0), (1, 1, 1.0), (3, 17, -1.0), (4, 24, 1.0), (1, 5, -1.0),
                       (2, 11, 1.0)]:
        x = _x(b, s, sign)
        branches.add(bool(x.sum() > 0))
        _check(model, gm, {"x": x})
    assert branches == {True, False}


def test_if_bigger_shape_after_smaller_reads_no_stale_data(sum_if) -> None:
    """The same executor at the top of the ranges, then tiny, then the top again with new data:
    padding rows written by neither run must never reach the result."""
    model, gm = sum_if
    for b, s, sign in [(4, 24, 1.0), (1, 2, 1.0), (4, 24, 1.0), (1, 2, -1.0), (4, 23, -1.0), (3, 24, 1.0)]:
        _check(model, gm, {"x": _x(b, s, sign)})


def test_if_with_expression_dims_and_a_branch_returning_its_input() -> None:
    """Outputs of dims ``(batch, 2*seq, 16)`` (a Concat over seq in both branches, reduced over that
    axis afterwards), and an If whose then branch is its captured input unchanged."""
    then_g = h.make_graph([h.make_node("Concat", ["x", "x"], ["t"], axis=1)], "then", [], [_vi("t", None)])
    else_g = h.make_graph([h.make_node("Add", ["x", "x"], ["e1"]), h.make_node("Concat", ["e1", "x"], ["e"], axis=1)],
                          "else", [], [_vi("e", None)])
    then2 = h.make_graph([h.make_node("Identity", ["x"], ["t2"])], "then2", [], [_vi("t2", None)])
    else2 = h.make_graph([h.make_node("Neg", ["x"], ["e2"])], "else2", [], [_vi("e2", None)])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="cat_if"),
             h.make_node("If", ["c"], ["r2"], then_branch=then2, else_branch=else2, name="id_if"),
             h.make_node("ReduceSum", ["r", "one"], ["y"], keepdims=1)]
    model = _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("y", None), _vi("r2", None)],
                   [h.make_tensor("zero", F, [], [0.0]), h.make_tensor("one", TP.INT64, [1], [1])])
    mod, _ = kiln.frontend.from_onnx(model, dim_ranges=RANGES)
    assert [str(n.outputs[0].type) for n in mod.nodes if n.op == "if"] == [
        "Tensor[(batch, 2*seq, 16), float32]", "Tensor[(batch, seq, 16), float32]"]
    gm = _build(model)
    for b, s, sign in [(2, 5, 1.0), (4, 24, -1.0), (1, 1, 1.0), (4, 24, 1.0), (3, 2, -1.0), (4, 23, -1.0)]:
        _check(model, gm, {"x": _x(b, s, sign)})


def test_if_beside_a_data_dependent_dim_of_the_parent() -> None:
    """The parent decides ``nonzero_0`` (NonZero) and runs an If that never reads it: the nested
    graphs declare only the symbols they use, so no nested kernel is expected to decide it."""
    then_g = h.make_graph([h.make_node("Softmax", ["x"], ["t"], axis=1)], "then", [], [_vi("t", None)])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", None)])
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("ReduceSum", ["nz"], ["cnt"], keepdims=0),
             h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="side_if")]
    model = _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("r", None), _vi("cnt", None, TP.INT64)],
                   [h.make_tensor("zero", F, [], [0.0])])
    gm = _build(model)
    for b, s, sign in [(2, 6, 1.0), (4, 24, -1.0), (1, 3, -1.0), (3, 24, 1.0)]:
        x = _x(b, s, sign)
        x[x < -1.0] = 0.0  # some zeros, so the NonZero count varies
        _check(model, gm, {"x": x})


def _seq_if_model() -> object:
    """if Shape(x)[1] > 8: softmax over seq of 2x else relu(x) + x: the condition is the dim itself."""
    then_g = h.make_graph([h.make_node("Add", ["x", "x"], ["t1"]), h.make_node("Softmax", ["t1"], ["t"], axis=1)],
                          "then", [], [_vi("t", None)])
    else_g = h.make_graph([h.make_node("Relu", ["x"], ["e1"]), h.make_node("Add", ["e1", "x"], ["e"])],
                          "else", [], [_vi("e", None)])
    nodes = [h.make_node("Shape", ["x"], ["shp"]),
             h.make_node("Gather", ["shp", "one"], ["seq"], axis=0),
             h.make_node("Greater", ["seq", "eight"], ["c"]),
             h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="seq_if")]
    return _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("y", ["batch", "seq", 16])],
                  [h.make_tensor("one", TP.INT64, [], [1]), h.make_tensor("eight", TP.INT64, [], [8])])


def test_if_on_the_symbolic_dim_itself() -> None:
    model = _seq_if_model()
    gm = _build(model)
    for b, s in [(2, 9), (2, 8), (3, 24), (1, 1), (4, 12), (4, 7)]:
        _check(model, gm, {"x": _x(b, s)})


def test_if_nested_in_a_branch_gets_the_symbols_too() -> None:
    """The outer If's then branch holds the seq If (Shape inside a branch): symbols pass two levels."""
    inner = _seq_if_model().graph.node
    then_g = h.make_graph(list(inner), "then", [], [_vi("y", None)],
                          [h.make_tensor("one", TP.INT64, [], [1]), h.make_tensor("eight", TP.INT64, [], [8])])
    else_g = h.make_graph([h.make_node("ReduceMean", ["x"], ["e1"], axes=[1], keepdims=1),
                          h.make_node("Sub", ["x", "e1"], ["e"])], "else", [], [_vi("e", None)])
    nodes = [h.make_node("ReduceSum", ["x"], ["total"], keepdims=0), h.make_node("Greater", ["total", "zero"], ["pos"]),
             h.make_node("If", ["pos"], ["r"], then_branch=then_g, else_branch=else_g, name="outer_if")]
    model = _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("r", ["batch", "seq", 16])],
                   [h.make_tensor("zero", F, [], [0.0])])
    gm = _build(model)
    for b, s, sign in [(2, 12, 1.0), (2, 12, -1.0), (3, 4, 1.0), (4, 24, 1.0), (1, 8, 1.0), (4, 20, -1.0)]:
        _check(model, gm, {"x": _x(b, s, sign)})


def _loop_model(scan: bool) -> object:
    """state <- tanh(state @ W + x - max over seq of state) for M iterations (M a graph input);
    optionally scans -state."""
    outs = [_vi("c_out", [], TP.BOOL), _vi("st_out", None)] + ([_vi("st_scan", None)] if scan else [])
    body = h.make_graph(
        [h.make_node("MatMul", ["st_in", "W"], ["m"]), h.make_node("Add", ["m", "x"], ["a0"]),
         h.make_node("ReduceMax", ["st_in"], ["mx"], axes=[1], keepdims=1), h.make_node("Sub", ["a0", "mx"], ["a"]),
         h.make_node("Tanh", ["a"], ["st_out"]), h.make_node("Identity", ["c_in"], ["c_out"])]
        + ([h.make_node("Neg", ["st_out"], ["st_scan"])] if scan else []),
        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("st_in", None)], outs)
    loop_outs = ["state"] + (["states"] if scan else [])
    nodes = [h.make_node("Loop", ["M", "", "s0"], loop_outs, body=body, name="state_loop")]
    return _model(nodes, [_vi("M", [], TP.INT64), _vi("s0", ["batch", "seq", 16]), _vi("x", ["batch", "seq", 16])],
                  [_vi("state", ["batch", "seq", 16])] + ([_vi("states", None)] if scan else []))


@pytest.mark.parametrize("scan", [False, True])
def test_loop_carrying_a_symbolic_state_matches_ort(scan) -> None:
    model = _loop_model(scan)
    gm = _build(model)
    if scan:
        assert gm.get_output_dims()[1][1:] == ("batch", "seq", 16)
    for m, b, s in [(3, 2, 5), (0, 1, 3), (5, 4, 24), (1, 1, 1), (4, 3, 10), (2, 4, 24)]:
        feeds = {"M": np.array(m, np.int64), "s0": _x(b, s), "x": _x(b, s)}
        if scan and m == 0:
            # ONNX Runtime gives a zero-iteration scan output the shape (0,); Kiln keeps its rank
            gm.run(**feeds)
            np.testing.assert_array_equal(gm.get_output(0).numpy(), feeds["s0"])
            assert gm.get_output(1).numpy().shape == (0, b, s, 16)
            continue
        got = _check(model, gm, feeds)
        assert got[0].shape == (b, s, 16)


def test_if_inside_a_loop_body() -> None:
    """state <- tanh(a) or softmax over seq of a (a = state @ W + x), chosen per iteration."""
    then_g = h.make_graph([h.make_node("Tanh", ["a"], ["t"])], "then", [], [_vi("t", None)])
    else_g = h.make_graph([h.make_node("Softmax", ["a"], ["e"], axis=1)], "else", [], [_vi("e", None)])
    body = h.make_graph(
        [h.make_node("MatMul", ["st_in", "W"], ["m"]), h.make_node("Add", ["m", "x"], ["a"]),
         h.make_node("ReduceSum", ["a"], ["tot"], keepdims=0), h.make_node("Greater", ["tot", "zero"], ["pos"]),
         h.make_node("If", ["pos"], ["st_out"], then_branch=then_g, else_branch=else_g, name="inner_if"),
         h.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("st_in", None)],
        [_vi("c_out", [], TP.BOOL), _vi("st_out", None)])
    nodes = [h.make_node("Loop", ["M", "", "s0"], ["state"], body=body, name="if_loop")]
    model = _model(nodes, [_vi("M", [], TP.INT64), _vi("s0", ["batch", "seq", 16]), _vi("x", ["batch", "seq", 16])],
                   [_vi("state", ["batch", "seq", 16])], [h.make_tensor("zero", F, [], [0.0])])
    gm = _build(model)
    for m, b, s in [(3, 2, 5), (0, 1, 3), (5, 4, 24), (1, 1, 1), (4, 3, 10)]:
        _check(model, gm, {"M": np.array(m, np.int64), "s0": _x(b, s), "x": _x(b, s, 0.1)})


def test_ir_reference_runs_the_subgraphs_at_actual_shapes() -> None:
    """``kiln.ir.evaluate`` (no build) of the imported If and Loop agrees with ONNX Runtime."""
    for model, feeds in [(_sum_if_model(), {"x": _x(2, 5, 1.0)}), (_sum_if_model(), {"x": _x(3, 7, -1.0)}),
                         (_loop_model(True), {"M": np.array(3, np.int64), "s0": _x(2, 5), "x": _x(2, 5)})]:
        mod, params = kiln.frontend.from_onnx(model, dim_ranges=RANGES)
        got = kiln.ir.evaluate(mod, feeds, params)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


def test_different_symbolic_shapes_in_the_branches_are_refused() -> None:
    then_g = h.make_graph([h.make_node("Relu", ["x"], ["t"])], "then", [], [_vi("t", None)])
    else_g = h.make_graph([h.make_node("ReduceSum", ["x", "ax"], ["e"], keepdims=1)], "else", [], [_vi("e", None)],
                          [h.make_tensor("ax", TP.INT64, [1], [1])])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="bad_if")]
    model = _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("r", None)], [h.make_tensor("zero", F, [], [0.0])])
    with pytest.raises(UnsupportedOpError) as err:
        kiln.frontend.from_onnx(model, dim_ranges=RANGES)
    msg = str(err.value)
    assert "bad_if" in msg and "output 0 ('r')" in msg
    assert "(batch, seq, 16)" in msg and "(batch, 1, 16)" in msg


def test_loop_state_that_changes_shape_is_refused() -> None:
    body = h.make_graph([h.make_node("Concat", ["st_in", "x"], ["st_out"], axis=1),
                         h.make_node("Identity", ["c_in"], ["c_out"])],
                        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("st_in", None)],
                        [_vi("c_out", [], TP.BOOL), _vi("st_out", None)])
    nodes = [h.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="grow_loop")]
    model = _model(nodes, [_vi("M", [], TP.INT64), _vi("x", ["batch", "seq", 16])], [_vi("y", None)])
    with pytest.raises(UnsupportedOpError, match=r"'grow_loop'.*loop-carried value 0 changes type across "
                                                 r"iterations \(Tensor\[\(batch, seq, 16\), float32\] -> "
                                                 r"Tensor\[\(batch, 2\*seq, 16\), float32\]\)"):
        kiln.frontend.from_onnx(model, dim_ranges=RANGES)


def test_an_outer_value_with_a_data_dependent_dim_is_refused() -> None:
    then_g = h.make_graph([h.make_node("ReduceSum", ["nz"], ["t"], keepdims=0)], "then", [], [_vi("t", None, TP.INT64)])
    else_g = h.make_graph([h.make_node("ReduceMax", ["nz"], ["e"], keepdims=0)], "else", [], [_vi("e", None, TP.INT64)])
    nodes = [h.make_node("NonZero", ["x"], ["nz"]), h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="dd_if")]
    model = _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("r", None, TP.INT64)],
                   [h.make_tensor("zero", F, [], [0.0])])
    with pytest.raises(UnsupportedOpError, match=r"'dd_if'.*reads 'nz' of dims \(3, 'nonzero_0'\).*"
                                                 r"\['nonzero_0'\] are data dependent"):
        kiln.frontend.from_onnx(model, dim_ranges=RANGES)


def test_a_symbol_declared_inside_a_branch_is_refused() -> None:
    """NonZero's count would be a dim of the branch alone: refused at import, naming it."""
    then_g = h.make_graph([h.make_node("NonZero", ["x"], ["nz"]), h.make_node("ReduceSum", ["nz"], ["t"], keepdims=0)],
                          "then", [], [_vi("t", None, TP.INT64)])
    else_g = h.make_graph([h.make_node("Constant", [], ["e"], value=h.make_tensor("v", TP.INT64, [], [0]))],
                          "else", [], [_vi("e", None, TP.INT64)])
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="nz_if")]
    model = _model(nodes, [_vi("x", ["batch", "seq", 16])], [_vi("r", None, TP.INT64)],
                   [h.make_tensor("zero", F, [], [0.0])])
    with pytest.raises(UnsupportedOpError, match=r"nz_if.*then.*dimension\(s\) \['nonzero_0'\] of its own"):
        kiln.frontend.from_onnx(model, dim_ranges=RANGES)


def test_library_round_trip(tmp_path) -> None:
    """Export, load back and run; the nested graph JSON carries the parent's symbols."""
    model = _sum_if_model()
    mod, params = kiln.frontend.from_onnx(model, dim_ranges=RANGES)
    factory = kiln.build(mod, params=params, target="llvm")
    path = str(tmp_path / "model.so")
    factory.export_library(path)
    loaded = kiln.runtime.load_module(path)
    gm = kiln.GraphModule(loaded["default"](kiln.cpu()))
    for b, s, sign in [(3, 9, 1.0), (1, 1, -1.0), (4, 24, -1.0), (2, 3, 1.0), (4, 24, 1.0)]:
        _check(model, gm, {"x": _x(b, s, sign)})

    g = json.loads(factory.graph_json if hasattr(factory, "graph_json") else factory._graph)
    (node,) = [n for n in g["nodes"] if n.get("attrs", {}).get("func_name") == "__if"]
    then_g = node["attrs"]["then_branch"]
    assert ["batch", 1, 4] in then_g["attrs"]["dim_ranges"][1] and ["seq", 1, 24] in then_g["attrs"]["dim_ranges"][1]
    assert ["batch", "seq", 16] in then_g["attrs"]["sym_shape"][1]
    # a nested graph planned for other ranges than its parent cannot share its padded storage
    from kiln.runtime.graph_json import load_graph_json

    bad = json.loads(json.dumps(g))
    for n in bad["nodes"]:
        if n["name"] == "sum_if":
            n["attrs"]["then_branch"]["attrs"]["dim_ranges"][1] = [["batch", 1, 4], ["seq", 2, 24]]
    with pytest.raises(FormatError, match=r"sum_if.*'seq' has range 2\.\.24, the enclosing graph's 1\.\.24"):
        load_graph_json(bad)
