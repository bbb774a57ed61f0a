"""Runtime ONNX ``Loop`` with scan outputs: the iteration count is a data-dependent dim.

Each model is imported with the trip count (or the condition) a graph input, built for
``llvm``, exported, loaded back and run at several trip counts; every result, and the shape
``get_output`` reports, is compared with onnxruntime.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.runtime.errors import FormatError, KernelError, UnsupportedOpError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
h = onnx.helper
TP = onnx.TensorProto
F = TP.FLOAT


def _vi(name: str, shape: list, dt: int = F) -> Any:
    return h.make_tensor_value_info(name, dt, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> Any:
    g = h.make_graph(nodes, "g", inputs, outputs, inits or [])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _scan_body(stop_above: bool = False) -> Any:
    """y <- y + x; scans the running sum y and i * x. With ``stop_above`` the condition turns
    false once sum(y) > limit (limit read from the outer scope)."""
    nodes = [h.make_node("Add", ["y_in", "x"], ["y_out"]),
             h.make_node("Cast", ["i"], ["fi"], to=F),
             h.make_node("Mul", ["x", "fi"], ["ix"]),
             h.make_node("Identity", ["y_out"], ["y_row"])]
    if stop_above:
        nodes += [h.make_node("ReduceSum", ["y_out"], ["s"], keepdims=0),
                  h.make_node("LessOrEqual", ["s", "limit"], ["c_out"])]
    else:
        nodes.append(h.make_node("Identity", ["c_in"], ["c_out"]))
    return h.make_graph(nodes, "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("y_in", [3])],
                        [_vi("c_out", [], TP.BOOL), _vi("y_out", [3]), _vi("y_row", [3]), _vi("ix", [3])])


def _cumsum_model() -> Any:
    """Trip count M a graph input; two scan outputs, one consumed by compiled kernels after the loop."""
    nodes = [h.make_node("Loop", ["M", "", "y0"], ["y", "ys", "ixs"], body=_scan_body(), name="scanloop"),
             h.make_node("ReduceSum", ["ys"], ["total"], keepdims=0),
             h.make_node("Add", ["ixs", "ixs"], ["ixs2"])]
    return _model(nodes, [_vi("M", [], TP.INT64), _vi("y0", [3]), _vi("x", [3])],
                  [_vi("y", [3]), _vi("ys", ["T", 3]), _vi("ixs", ["T", 3]), _vi("total", []),
                   _vi("ixs2", ["T", 3])])


def _early_stop_model(static_m: int | None) -> Any:
    """Stops when sum(y) > limit (a graph input); M a graph input, or a constant ``static_m``."""
    nodes = [h.make_node("Loop", ["M", "", "y0"], ["y", "ys", "ixs"], body=_scan_body(True), name="stoploop")]
    inputs = [_vi("y0", [3]), _vi("x", [3]), _vi("limit", [])]
    inits = []
    if static_m is None:
        inputs.insert(0, _vi("M", [], TP.INT64))
    else:
        inits.append(h.make_tensor("M", TP.INT64, [], [static_m]))
    return _model(nodes, inputs, [_vi("y", [3]), _vi("ys", ["T", 3]), _vi("ixs", ["T", 3])], inits)


def _compile(model: Any, tmp_path) -> Any:
    graph, params = kiln.frontend.from_onnx(model)
    factory = kiln.build(graph, target="llvm", params=params)
    path = os.path.join(str(tmp_path), "model.so")
    factory.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _check(model: Any, gm: Any, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    gm.run(**feeds)
    for k, r in enumerate(ref):
        got = gm.get_output(k).numpy()
        assert got.shape == r.shape, (k, got.shape, r.shape)
        np.testing.assert_allclose(got, r, rtol=1e-5, atol=1e-6)
    return ref


def test_scan_outputs_at_several_trip_counts(tmp_path) -> None:
    model = _cumsum_model()
    gm = _compile(model, tmp_path)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    for m in (3, 0, 1, 7, 0, 2, 40):
        ref = _check(model, gm, {"M": np.array(m, np.int64), "y0": np.ones(3, np.float32), "x": x})
        assert ref[1].shape == (m, 3)
    # the symbolic view: the scan outputs' leading dim is the loop's data-dependent count
    dims = gm.get_output_dims()
    assert dims[1] == dims[2] == dims[4] == (dims[1][0], 3) and isinstance(dims[1][0], str)


@pytest.mark.parametrize("static_m", [None, 9])
def test_condition_stops_early(tmp_path, static_m) -> None:
    model = _early_stop_model(static_m)
    gm = _compile(model, tmp_path)
    x = np.array([1.0, 2.0, 0.5], np.float32)
    m = 9 if static_m is None else static_m
    for limit in (10.0, -1.0, 3.0, 100.0, 20.0):
        feeds = {"y0": np.zeros(3, np.float32), "x": x, "limit": np.array(limit, np.float32)}
        if static_m is None:
            feeds["M"] = np.array(m, np.int64)
        _check(model, gm, feeds)


@pytest.mark.parametrize("m,bound", [(9, 9), (np.iinfo(np.int64).max, None)])
def test_static_trip_count_bounds_the_storage(tmp_path, m, bound) -> None:
    """With M known at import the scan length is bounded by M, not by the default bound; an
    exporter's INT64_MAX (the condition stops the loop) gets the default bound."""
    from kiln.frontend.onnx.ops_control import RUNTIME_LOOP_MAX_ITERATIONS

    model = _early_stop_model(m)
    graph, _ = kiln.frontend.from_onnx(model)
    (loop,) = [n for n in graph.nodes if n.op == "loop"]
    bound = RUNTIME_LOOP_MAX_ITERATIONS if bound is None else bound
    assert loop.attrs["max_iterations"] == bound
    assert graph.dim_ranges[loop.attrs["out_dim"]] == (0, bound)
    gm = _compile(model, tmp_path)
    for limit in (5.0, -1.0, 40.0):
        _check(model, gm, {"y0": np.zeros(3, np.float32), "x": np.array([1.0, 2.0, 0.5], np.float32),
                           "limit": np.array(limit, np.float32)})


def test_scan_only_loop_and_scalar_rows(tmp_path) -> None:
    """No carried value; the scan rows are scalars (the iteration number squared)."""
    body = h.make_graph([h.make_node("Mul", ["i", "i"], ["sq"]), h.make_node("Identity", ["c_in"], ["c_out"])],
                        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL)],
                        [_vi("c_out", [], TP.BOOL), _vi("sq", [], TP.INT64)])
    nodes = [h.make_node("Loop", ["M", "c"], ["sqs"], body=body, name="sqloop")]
    model = _model(nodes, [_vi("M", [], TP.INT64), _vi("c", [], TP.BOOL)], [_vi("sqs", ["T"], TP.INT64)])
    gm = _compile(model, tmp_path)
    for m, c in ((4, True), (0, True), (5, False), (1, True)):
        _check(model, gm, {"M": np.array(m, np.int64), "c": np.array(c)})


def test_past_the_bound_fails_naming_the_node(tmp_path, monkeypatch) -> None:
    from kiln.frontend.onnx import ops_control

    monkeypatch.setattr(ops_control, "RUNTIME_LOOP_MAX_ITERATIONS", 5)
    model = _cumsum_model()
    gm = _compile(model, tmp_path)
    feeds = {"y0": np.ones(3, np.float32), "x": np.ones(3, np.float32)}
    _check(model, gm, dict(feeds, M=np.array(5, np.int64)))
    with pytest.raises(KernelError, match=r"'scanloop'.*more than 5 iterations"):
        gm.run(**feeds, M=np.array(6, np.int64))
    _check(model, gm, dict(feeds, M=np.array(2, np.int64)))  # the executor is still usable


def test_graph_json_and_reader_checks(tmp_path) -> None:
    from kiln.runtime.graph_json import load_graph_json

    graph, params = kiln.frontend.from_onnx(_cumsum_model())
    factory = kiln.build(graph, target="llvm", params=params)
    g = json.loads(factory.graph_json if hasattr(factory, "graph_json") else factory._graph)
    (node,) = [n for n in g["nodes"] if n.get("attrs", {}).get("func_name") == "__loop"]
    assert node["attrs"]["num_carried"] == "1" and node["attrs"]["num_scan"] == "2"
    load_graph_json(g)
    bad = json.loads(json.dumps(g))
    for n in bad["nodes"]:
        if n["name"] == "scanloop":
            n["attrs"]["num_scan"] = "1"
    with pytest.raises(FormatError, match="scanloop.*num_scan"):
        load_graph_json(bad)
    bad = json.loads(json.dumps(g))
    row_ptr = bad["node_row_ptr"]
    nid = next(i for i, n in enumerate(bad["nodes"]) if n["name"] == "scanloop")
    bad["attrs"]["sym_shape"][1][row_ptr[nid] + 1][0] = bad["attrs"]["shape"][1][row_ptr[nid] + 1][0]
    with pytest.raises(FormatError, match="scanloop.*data-dependent"):
        load_graph_json(bad)


def test_refused_inside_a_runtime_subgraph() -> None:
    """A scan loop inside a runtime If branch would give the branch a data-dependent shape."""
    body = h.make_graph([h.make_node("Identity", ["c_in"], ["c_out"]), h.make_node("Cast", ["i"], ["fi"], to=F)],
                        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL)],
                        [_vi("c_out", [], TP.BOOL), _vi("fi", [])])
    then_g = h.make_graph([h.make_node("Loop", ["M", ""], ["fis"], body=body)], "then", [], [_vi("fis", ["T"])])
    else_g = h.make_graph([h.make_node("Loop", ["M", ""], ["fis2"], body=body)], "else", [], [_vi("fis2", ["T"])])
    model = _model([h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g)],
                   [_vi("M", [], TP.INT64), _vi("c", [], TP.BOOL)], [_vi("r", ["T"])])
    with pytest.raises(UnsupportedOpError, match="scan output.*static shapes"):
        kiln.frontend.from_onnx(model)


def test_refused_when_the_bound_needs_too_much_memory(monkeypatch) -> None:
    from kiln.frontend.onnx import ops_control

    monkeypatch.setattr(ops_control, "RUNTIME_LOOP_MAX_SCAN_BYTES", 1000)
    with pytest.raises(UnsupportedOpError, match="RUNTIME_LOOP_MAX_ITERATIONS = 4096.*RUNTIME_LOOP_MAX_SCAN_BYTES"):
        kiln.frontend.from_onnx(_cumsum_model())


def test_ir_reference_matches() -> None:
    """``kiln.ir.evaluate`` of the imported graph gives the actual shapes too."""
    model = _cumsum_model()
    graph, params = kiln.frontend.from_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for m in (0, 4):
        feeds = {"M": np.array(m, np.int64), "y0": np.ones(3, np.float32), "x": np.arange(3, dtype=np.float32)}
        got = kiln.ir.evaluate(graph, feeds, params)
        for g_, r in zip(got[:2], sess.run(None, feeds)[:2]):
            np.testing.assert_allclose(np.asarray(g_), r, rtol=1e-6)


def test_refused_as_input_of_another_runtime_loop() -> None:
    """A runtime Loop reading a scan output would need a body of data-dependent shape."""
    body2 = h.make_graph([h.make_node("ReduceSum", ["ys"], ["s"], keepdims=0),
                          h.make_node("Add", ["a_in", "s"], ["a_out"]),
                          h.make_node("Identity", ["c_in"], ["c_out"])], "body2",
                         [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("a_in", [])],
                         [_vi("c_out", [], TP.BOOL), _vi("a_out", [])])
    nodes = [h.make_node("Loop", ["M", "", "y0"], ["y", "ys", "ixs"], body=_scan_body(), name="first"),
             h.make_node("Loop", ["M", "", "a0"], ["a"], body=body2, name="second")]
    model = _model(nodes, [_vi("M", [], TP.INT64), _vi("y0", [3]), _vi("x", [3]), _vi("a0", [])], [_vi("a", [])])
    with pytest.raises(UnsupportedOpError, match=r"'second'.*static shapes only.*'ys'"):
        kiln.frontend.from_onnx(model)


def test_debug_executor_reports_the_count(tmp_path) -> None:
    from kiln.runtime.debug_executor import GraphModuleDebug

    graph, params = kiln.frontend.from_onnx(_cumsum_model())
    path = os.path.join(str(tmp_path), "model.so")
    kiln.build(graph, target="llvm", params=params).export_library(path)
    dbg = GraphModuleDebug(kiln.runtime.load_module(path)["default"](kiln.cpu()), str(tmp_path))
    for m in (5, 0, 2):
        dbg.run(M=np.array(m, np.int64), y0=np.ones(3, np.float32), x=np.ones(3, np.float32))
        assert [dbg.get_output(k).shape for k in (1, 2, 4)] == [(m, 3)] * 3
        np.testing.assert_allclose(dbg.get_output(3).numpy(), sum(3.0 * (k + 2) for k in range(m)))


def test_c_api_runs_the_loop() -> None:
    """The C API runs runtime control flow, a loop with scan outputs included
    (tests/capi/test_c_api_control_flow.py runs this model from C)."""
    from kiln.runtime import model_api
    from kiln.runtime.graph_json import load_graph_json

    graph, params = kiln.frontend.from_onnx(_cumsum_model())
    factory = kiln.build(graph, target="llvm", params=params)
    g = load_graph_json(json.loads(factory.graph_json if hasattr(factory, "graph_json") else factory._graph))
    assert any(n.func_name == "__loop" for n in g.nodes)
    assert model_api._unsupported_reason(g, None) is None
