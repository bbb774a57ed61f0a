"""Runtime control flow: ONNX ``If`` / ``Loop`` decided at run time, run by the executor.

Each model is imported, built for ``llvm``, exported, loaded back and run with the condition /
trip count changing between runs; every result is compared with onnxruntime.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import kiln
from kiln.runtime.errors import FormatError, KernelError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
h = onnx.helper
TP = onnx.TensorProto
F = TP.FLOAT


def _vi(name: str, shape: list[int], dt: int = F) -> object:
    return h.make_tensor_value_info(name, dt, shape)


def _model(nodes: list, inputs: list, outputs: list) -> object:
    return h.make_model(h.make_graph(nodes, "g", inputs, outputs), opset_imports=[h.make_opsetid("", 17)])


def _branches(prefix: str, w: np.ndarray) -> tuple[object, object]:
    """then: relu(a * w) (a captured, w a branch constant); else: exp(a - x) (a and x captured)."""
    then_g = h.make_graph([h.make_node("Mul", ["a", f"{prefix}w"], [f"{prefix}t1"]),
                           h.make_node("Relu", [f"{prefix}t1"], [f"{prefix}t"])],
                          f"{prefix}then", [], [_vi(f"{prefix}t", [2, 3])],
                          [h.make_tensor(f"{prefix}w", F, [2, 3], w.ravel())])
    else_g = h.make_graph([h.make_node("Sub", ["a", "x"], [f"{prefix}e1"]),
                           h.make_node("Exp", [f"{prefix}e1"], [f"{prefix}e"])],
                          f"{prefix}else", [], [_vi(f"{prefix}e", [2, 3])])
    return then_g, else_g


def _if_model() -> object:
    """ops before (Add) and after (Tanh) a runtime If whose condition is a graph input."""
    then_g, else_g = _branches("", np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    nodes = [h.make_node("Add", ["x", "x"], ["a"]),
             h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g, name="myif"),
             h.make_node("Tanh", ["r"], ["y"])]
    return _model(nodes, [_vi("x", [2, 3]), _vi("c", [], TP.BOOL)], [_vi("y", [2, 3])])


def _nested_if_model() -> object:
    """The then branch holds another If on a second condition, computed from x at run time."""
    inner_then, inner_else = _branches("i", np.full((2, 3), 0.5, np.float32))
    inner = h.make_node("If", ["c2"], ["it"], then_branch=inner_then, else_branch=inner_else, name="inner")
    outer_then = h.make_graph([inner, h.make_node("Neg", ["it"], ["ot"])], "othen", [], [_vi("ot", [2, 3])])
    outer_else = h.make_graph([h.make_node("Sigmoid", ["a"], ["oe"])], "oelse", [], [_vi("oe", [2, 3])])
    nodes = [h.make_node("Add", ["x", "x"], ["a"]),
             h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["c2"]),
             h.make_node("If", ["c"], ["y"], then_branch=outer_then, else_branch=outer_else, name="outer")]
    g = h.make_graph(nodes, "g", [_vi("x", [2, 3]), _vi("c", [], TP.BOOL)], [_vi("y", [2, 3])],
                     [h.make_tensor("zero", F, [], [0.0])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _loop_model() -> object:
    """y <- y * 0.5 + b while i < M and sum(y) > limit; M, y0 and limit are graph inputs."""
    body = h.make_graph(
        [h.make_node("Mul", ["y_in", "half"], ["m"]),
         h.make_node("Add", ["m", "b"], ["y_out"]),
         h.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
         h.make_node("Greater", ["s", "limit"], ["cond_out"])],
        "body", [_vi("i", [], TP.INT64), _vi("cond_in", [], TP.BOOL), _vi("y_in", [4])],
        [_vi("cond_out", [], TP.BOOL), _vi("y_out", [4])],
        [h.make_tensor("half", F, [], [0.5])])
    nodes = [h.make_node("Loop", ["M", "", "y0"], ["y"], body=body, name="myloop")]
    return _model(nodes, [_vi("M", [], TP.INT64), _vi("y0", [4]), _vi("b", [4]), _vi("limit", [], F)],
                  [_vi("y", [4])])


def _compile(model: object, tmp_path) -> object:
    mod = kiln.frontend.from_onnx(model)
    mod = mod[0] if isinstance(mod, tuple) else mod
    factory = kiln.build(mod, target="llvm")
    path = os.path.join(str(tmp_path), "model.so")
    factory.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _check(model: object, gm: object, feeds: dict) -> None:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    gm.run(**feeds)
    for k, r in enumerate(ref):
        np.testing.assert_allclose(gm.get_output(k).numpy(), r, rtol=1e-5, atol=1e-6)


def test_runtime_if_alternating(tmp_path) -> None:
    model = _if_model()
    gm = _compile(model, tmp_path)
    rng = np.random.default_rng(0)
    for c in (True, False, True, False, False, True):
        _check(model, gm, {"x": rng.standard_normal((2, 3)).astype(np.float32), "c": np.array(c)})


def test_runtime_if_graph_json(tmp_path) -> None:
    mod = kiln.frontend.from_onnx(_if_model())
    mod = mod[0] if isinstance(mod, tuple) else mod
    factory = kiln.build(mod, target="llvm")
    g = json.loads(factory.graph_json if hasattr(factory, "graph_json") else factory._graph)
    (node,) = [n for n in g["nodes"] if n.get("attrs", {}).get("func_name") == "__if"]
    assert node["name"] == "myif"
    assert {"then_branch", "else_branch", "then_branch_params", "else_branch_params"} <= set(node["attrs"])
    # the then branch's weight is a param of the parent, fed to the branch as an extra input
    assert len(node["attrs"]["then_branch_params"]) == 1
    # a nested graph that does not fit its node is refused, naming the node
    from kiln.runtime.graph_json import load_graph_json

    bad = json.loads(json.dumps(g))
    for n in bad["nodes"]:
        if n["name"] == "myif":
            n["attrs"]["then_branch"]["attrs"]["dltype"][1][0] = "int32"
    with pytest.raises(FormatError, match="myif"):
        load_graph_json(bad)


def test_nested_if(tmp_path) -> None:
    model = _nested_if_model()
    gm = _compile(model, tmp_path)
    for c, sign in ((True, 1), (True, -1), (False, 1), (True, 1), (False, -1)):
        x = (np.abs(np.random.default_rng(1).standard_normal((2, 3))) * sign).astype(np.float32)
        _check(model, gm, {"x": x, "c": np.array(c)})


def test_runtime_loop(tmp_path) -> None:
    model = _loop_model()
    gm = _compile(model, tmp_path)
    b = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    for m, limit in ((0, -1.0), (1, -1.0), (5, -1.0), (100, 2.0), (100, 1.5), (3, 100.0)):
        _check(model, gm, {"M": np.array(m, np.int64), "y0": np.full(4, 8.0, np.float32), "b": b,
                           "limit": np.array(limit, np.float32)})


def test_branch_error_names_the_node(tmp_path, monkeypatch) -> None:
    gm = _compile(_if_model(), tmp_path)
    (op,) = [o for o in gm.module.ops if o.kind == "control"]
    sub = op.func.branches[1].ex

    def boom() -> None:
        raise KernelError("injected failure")

    monkeypatch.setattr(sub, "segments", [boom])
    x = np.ones((2, 3), np.float32)
    gm.run(x=x, c=np.array(True))  # the then branch is unaffected
    with pytest.raises(KernelError, match=r"'myif'.*else_branch.*injected failure"):
        gm.run(x=x, c=np.array(False))


def test_long_constant_loop_runs_at_run_time(tmp_path) -> None:
    """A trip count known at import but beyond the unroll limit becomes a runtime loop too."""
    from kiln.frontend.onnx.ops_control import MAX_UNROLL

    body = h.make_graph(
        [h.make_node("Add", ["y_in", "one"], ["y_out"]), h.make_node("Identity", ["c_in"], ["c_out"])],
        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("y_in", [2])],
        [_vi("c_out", [], TP.BOOL), _vi("y_out", [2])], [h.make_tensor("one", F, [], [1.0])])
    g = h.make_graph([h.make_node("Loop", ["M", "", "y0"], ["y"], body=body)], "g", [_vi("y0", [2])],
                     [_vi("y", [2])], [h.make_tensor("M", TP.INT64, [], [MAX_UNROLL + 7])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    mod = kiln.frontend.from_onnx(model)[0]
    assert [n.op for n in mod.nodes if n.op != "constant"] == ["loop"]  # the partial unroll is pruned
    gm = _compile(model, tmp_path)
    _check(model, gm, {"y0": np.array([0.5, -3.0], np.float32)})


def test_reader_bounds_nesting() -> None:
    from kiln.runtime.graph_json import MAX_NESTING, load_graph_json

    leaf = {"nodes": [{"op": "null", "name": "x0", "inputs": []}], "arg_nodes": [0], "heads": [[0, 0, 0]],
            "node_row_ptr": [0, 1],
            "attrs": {"dltype": ["list_str", ["float32"]], "shape": ["list_shape", [[2]]],
                      "storage_id": ["list_int", [0]]}}
    g = leaf
    for _ in range(MAX_NESTING + 1):
        g = {"nodes": [{"op": "null", "name": "c", "inputs": []}, {"op": "null", "name": "x", "inputs": []},
                       {"op": "tvm_op", "name": "if", "inputs": [[0, 0, 0], [1, 0, 0]],
                        "attrs": {"func_name": "__if", "num_inputs": "2", "num_outputs": "1",
                                  "then_branch": g, "else_branch": g}}],
             "arg_nodes": [0, 1], "heads": [[2, 0, 0]], "node_row_ptr": [0, 1, 2, 3],
             "attrs": {"dltype": ["list_str", ["bool", "float32", "float32"]],
                       "shape": ["list_shape", [[], [2], [2]]], "storage_id": ["list_int", [0, 1, 2]]}}
    with pytest.raises(FormatError, match="nested"):
        load_graph_json(g)
