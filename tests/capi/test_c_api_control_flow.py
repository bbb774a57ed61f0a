"""The model C API with runtime control flow: ONNX If and Loop run from C.

ONNX models with an If on a data condition, a Loop with a run-time trip count and condition,
carried values and scan outputs (whose iteration count is a data-dependent dim the loop reports),
a body that swaps two carried values, and an If nested in a Loop body are imported, built,
exported and driven from C by ``capi_dynamic.c`` (one instance, several inputs in a row); every
output and its shape is compared with ONNX Runtime. A loop running past the bound its scan
outputs were planned for is a ``KILN_ERR_SHAPE`` naming the node, after which the same instance
runs on. The tables of such models are version 4 (each nested graph a table set of its own);
damaged ones are a ``KILN_ERR_FORMAT`` at creation, freeing what was created (ASan). Dynamic
graphs run too: nested graphs take the model's symbols, and only valid sub-boxes are copied. A
nested graph deciding data-dependent dims of its own (which the importer never writes) is
refused with the reason.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import kiln
from kiln.runtime import model_api
from kiln.runtime.graph_json import load_graph_json
from tests.capi.test_c_api import _cc, _run
from tests.capi.test_c_api import pytestmark as _needs_cc
from tests.capi.test_c_api_data_dependent import _run_c
from tests.capi.test_c_api_dynamic import DRIVER, Session, _lines, _read, _status
from tests.frontend.onnx_check import run_ort

pytestmark = _needs_cc
RNG = np.random.default_rng(31)
ERR_SHAPE, ERR_FORMAT, ERR_UNSUPPORTED = 2, 4, 8


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> str:
    return _cc(str(tmp_path_factory.mktemp("driver") / "capi_dynamic"), DRIVER, "-ldl")


# ----------------------------------------------------------------------------- models
def _vi(name: str, t: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "cf", inputs, outputs, initializer=list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def if_model() -> onnx.ModelProto:
    """y = x * 2 if sum(x) > 0 else x - w (w a weight the else branch captures); z = relu(y)."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [_vi("t", TP.FLOAT, [2, 3])])
    other = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e"])], "else", [], [_vi("e", TP.FLOAT, [2, 3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Relu", ["y"], ["z"])]
    return _model(nodes, [_vi("x", TP.FLOAT, [2, 3])], [_vi("y", TP.FLOAT, [2, 3]), _vi("z", TP.FLOAT, [2, 3])],
                  [_const("two", np.float32(2)), _const("zero", np.float32(0)),
                   _const("w", np.arange(6, dtype=np.float32).reshape(2, 3))])


def loop_model(nested_if: bool = False, swap: bool = False, rows: int | str = 1) -> onnx.ModelProto:
    """Loop(M, c0, a, b) with ``limit`` captured: a' = a + b * i, b' = b / 2, the next condition
    sum(a') < limit, the scan output a' per iteration (with ``nested_if``: 2 * a' on even
    iterations, -a' on odd ones, an If in the body). ``swap``: the body returns (b, a), the
    carried values swapped, and scans a' and its carried input a as it came in. ``rows``: the
    carried values are (rows, 4), "n" for a dynamic graph whose body takes the symbol."""
    body_in = [_vi("i", TP.INT64, []), _vi("cin", TP.BOOL, []), _vi("a_in", TP.FLOAT, [rows, 4]),
               _vi("b_in", TP.FLOAT, [rows, 4])]
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
             helper.make_node("Mul", ["b_in", "fi"], ["bi"]),
             helper.make_node("Add", ["a_in", "bi"], ["a_new"]),
             helper.make_node("ReduceSum", ["a_new"], ["sa"], keepdims=0),
             helper.make_node("Less", ["sa", "limit"], ["cout"])]
    if swap:
        carried_out = ["b_in", "a_in"]
    else:
        nodes.append(helper.make_node("Mul", ["b_in", "half"], ["b_new"]))
        carried_out = ["a_new", "b_new"]
    scans = ["sc"]
    if nested_if:
        then = helper.make_graph([helper.make_node("Mul", ["a_new", "two"], ["tt"])], "then", [],
                                 [_vi("tt", TP.FLOAT, [rows, 4])])
        other = helper.make_graph([helper.make_node("Neg", ["a_new"], ["ee"])], "else", [],
                                  [_vi("ee", TP.FLOAT, [rows, 4])])
        nodes += [helper.make_node("Mod", ["i", "two_i"], ["im"]),
                  helper.make_node("Equal", ["im", "zero_i"], ["even"]),
                  helper.make_node("If", ["even"], ["sc"], then_branch=then, else_branch=other)]
    else:
        nodes.append(helper.make_node("Identity", ["a_new"], ["sc"]))
    if swap:
        nodes.append(helper.make_node("Identity", ["a_in"], ["sc_in"]))
        scans.append("sc_in")
    body = helper.make_graph(nodes, "body", body_in,
                             [_vi("cout", TP.BOOL, []), _vi(carried_out[0], TP.FLOAT, [rows, 4]),
                              _vi(carried_out[1], TP.FLOAT, [rows, 4])] + [_vi(s, TP.FLOAT, [rows, 4]) for s in scans])
    scan_outs = ["scans", "scans_in"][:len(scans)]
    main = [helper.make_node("Loop", ["M", "c0", "a", "b"], ["af", "bf", *scan_outs], body=body),
            helper.make_node("Add", ["af", "bf"], ["ab"]),
            helper.make_node("ReduceSum", ["scans"], ["total"], keepdims=0)]
    inputs = [_vi("M", TP.INT64, []), _vi("c0", TP.BOOL, []), _vi("a", TP.FLOAT, [rows, 4]),
              _vi("b", TP.FLOAT, [rows, 4]), _vi("limit", TP.FLOAT, [])]
    outputs = [_vi("af", TP.FLOAT, [rows, 4]), _vi("bf", TP.FLOAT, [rows, 4])]
    outputs += [_vi(s, TP.FLOAT, ["T", rows, 4]) for s in scan_outs]
    outputs += [_vi("ab", TP.FLOAT, [rows, 4]), _vi("total", TP.FLOAT, [])]
    inits = [_const("half", np.full((1, 4), 0.5, np.float32))] * (not swap)
    if nested_if:
        inits += [_const("two", np.float32(2)), _const("two_i", np.int64(2)), _const("zero_i", np.int64(0))]
    return _model(main, inputs, outputs, inits)


LOOP_INPUTS = ["M", "c0", "a", "b", "limit"]


def _loop_feeds(m: int, c0: bool = True, limit: float = 1e9, a=None, b=None, rows: int = 1) -> dict[str, np.ndarray]:
    a = RNG.standard_normal((rows, 4)) if a is None else np.full((rows, 4), a)
    b = RNG.standard_normal((rows, 4)) if b is None else np.full((rows, 4), b)
    return {"M": np.array(m, np.int64), "c0": np.array(c0), "a": a.astype(np.float32), "b": b.astype(np.float32),
            "limit": np.array(limit, np.float32)}


#: a = 0, b = 1: sum(a') is 0, 2, 4, ... after iterations 0, 1, 2: a limit of 3 ends the loop after 3
EARLY_STOP = dict(limit=3.0, a=0.0, b=1.0)


# ----------------------------------------------------------------------------- helpers
def _build(model: onnx.ModelProto, target: str = "llvm"):
    graph, params = kiln.frontend.from_onnx(model)
    return kiln.build(graph, target=target, params=params), params


def _export(model: onnx.ModelProto, tmp_path, name: str) -> str:
    built, _ = _build(model)
    return built.export_library(str(tmp_path / name))


def _session(driver, lib, tmp_path, feeds_list, names, n_out, runner=_run):
    """Set every input, run and read every output once per feeds, on one instance."""
    return _run_c(driver, lib, tmp_path, feeds_list, names, n_out, runner=runner)


def _compare(model, out, got, feeds_list, skip_runs=()) -> None:
    runs = _lines(out, "run")
    assert all(_status(line) == 0 for k, line in enumerate(runs) if k not in skip_runs), out
    assert all(_status(line) == 0 for line in out if line.split()[0] in ("create", "set", "get")), out
    for k, (feeds, row) in enumerate(zip(feeds_list, got)):
        if k in skip_runs:
            continue
        want = run_ort(model, feeds)
        assert len(row) == len(want)
        for j, ((path, line), w) in enumerate(zip(row, want)):
            arr = _read(path, line, w.dtype)
            if w.size == 0 and arr.size == 0 and w.shape[0] == arr.shape[0] == 0:
                continue  # 0 iterations: ONNX Runtime leaves a dynamic row's dims 0 (Kiln: the row's shape)
            assert arr.shape == w.shape, (k, j, line, w.shape)
            np.testing.assert_allclose(arr, w, rtol=1e-5, atol=1e-5, err_msg=f"run {k} output {j}")


# ----------------------------------------------------------------------------- If
def test_if_on_a_data_condition_from_c_matches_onnxruntime(driver, tmp_path):
    model = if_model()
    lib = _export(model, tmp_path, "if.so")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    feeds = [{"x": np.abs(x)}, {"x": -np.abs(x)}, {"x": np.abs(x) + 1}, {"x": np.zeros((2, 3), np.float32)}]
    out, got = _session(driver, lib, tmp_path, feeds, ["x"], 2)
    _compare(model, out, got, feeds)


def test_if_on_static_tensors_in_a_dynamic_graph(driver, tmp_path):
    """x is (n, 4), n in 1..8: the If's condition and captured value are computed from it, its
    branches are static; the graph goes on with the dynamic x after it."""
    then = helper.make_graph([helper.make_node("Mul", ["s", "two"], ["t"])], "then", [], [_vi("t", TP.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Sub", ["s", "w"], ["e"])], "else", [], [_vi("e", TP.FLOAT, [4])])
    nodes = [helper.make_node("ReduceSum", ["x", "axis0"], ["s"], keepdims=0),
             helper.make_node("ReduceSum", ["s"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["x", "y"], ["z"])]
    model = _model(nodes, [_vi("x", TP.FLOAT, ["n", 4])], [_vi("y", TP.FLOAT, [4]), _vi("z", TP.FLOAT, ["n", 4])],
                   [_const("two", np.float32(2)), _const("zero", np.float32(0)), _const("axis0", np.array([0])),
                    _const("w", np.arange(4, dtype=np.float32))])
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 8)})
    built = kiln.build(graph, target="llvm", params=params)
    g = load_graph_json(built.get_graph_json())
    assert g.sym_shape is not None and all(sub.sym_shape is None for n in g.nodes for sub in n.subgraphs.values())
    lib = built.export_library(str(tmp_path / "dyn_parent.so"))
    feeds = [{"x": np.abs(RNG.standard_normal((n, 4))).astype(np.float32) * sign} for n, sign in
             [(3, 1), (8, -1), (1, 1), (5, -1)]]
    out, got = _session(driver, lib, tmp_path, feeds, ["x"], 2)
    _compare(model, out, got, feeds)


# ----------------------------------------------------------------------------- Loop
def test_loop_with_runtime_trip_count_carried_values_and_scan_outputs(driver, tmp_path):
    """Trip counts 5, 0 and 1, a condition false from the start, a condition that ends the loop
    early: the scan outputs' count (a data-dependent dim) follows each run, 0 included."""
    model = loop_model()
    lib = _export(model, tmp_path, "loop.so")
    feeds = [_loop_feeds(5), _loop_feeds(0), _loop_feeds(7, c0=False), _loop_feeds(1),
             _loop_feeds(1000, **EARLY_STOP), _loop_feeds(3)]
    out, got = _session(driver, lib, tmp_path, feeds, LOOP_INPUTS, 5)
    _compare(model, out, got, feeds)
    counts = [int(re.match(r"get 0 \((\d+)", row[2][1]).group(1)) for row in got]
    assert counts == [5, 0, 0, 1, 3, 3], counts


def test_body_swapping_two_carried_values(driver, tmp_path):
    """The body returns its carried arguments swapped (both bound to the loop's outputs): each is
    read before either is written back. A scan of a carried argument stacks the value it came in
    with."""
    model = loop_model(swap=True)
    lib = _export(model, tmp_path, "swap.so")
    feeds = [_loop_feeds(1), _loop_feeds(2), _loop_feeds(5), _loop_feeds(0)]
    out, got = _session(driver, lib, tmp_path, feeds, LOOP_INPUTS, 6)
    _compare(model, out, got, feeds)


def test_if_nested_in_a_loop_body(driver, tmp_path):
    model = loop_model(nested_if=True)
    lib = _export(model, tmp_path, "loopif.so")
    feeds = [_loop_feeds(6), _loop_feeds(1), _loop_feeds(0), _loop_feeds(9, **EARLY_STOP)]
    out, got = _session(driver, lib, tmp_path, feeds, LOOP_INPUTS, 5)
    _compare(model, out, got, feeds)


@pytest.mark.parametrize("which", ["cumsum", "early_stop", "early_stop_static_m"])
def test_executor_loop_models_from_c(driver, tmp_path, which):
    """The loop models of tests/executor/test_loop_scan.py: two scan outputs, one consumed by
    kernels after the loop (which run on the reported count), no condition input, M an input or
    a constant (then the scan outputs are planned for exactly M rows)."""
    from tests.executor.test_loop_scan import _cumsum_model, _early_stop_model

    model = {"cumsum": _cumsum_model, "early_stop": lambda: _early_stop_model(None),
             "early_stop_static_m": lambda: _early_stop_model(5)}[which]()
    names = [i.name for i in model.graph.input]
    lib = _export(model, tmp_path, f"{which}.so")
    feeds = []
    for m, limit in [(5, 1e9), (0, 1e9), (3, 4.0), (5, 10.0), (1, 1e9), (5, -1.0)]:
        f = {"M": np.array(m, np.int64), "y0": RNG.standard_normal(3).astype(np.float32),
             "x": RNG.standard_normal(3).astype(np.float32), "limit": np.array(limit, np.float32)}
        feeds.append({k: v for k, v in f.items() if k in names})
    out, got = _session(driver, lib, tmp_path, feeds, names, len(model.graph.output))
    _compare(model, out, got, feeds)


@pytest.mark.parametrize("nested_if, swap", [(False, False), (True, False), (False, True)])
def test_dynamic_loop_whose_body_takes_the_enclosing_symbol(driver, tmp_path, nested_if, swap):
    """Carried values and scan rows of (n, 4), n in 1..6 changing between runs (the If in the body
    takes n from the body, which takes it from the model): only the valid sub-box is copied, and
    the scan output is (count, n, 4)."""
    model = loop_model(nested_if=nested_if, swap=swap, rows="n")
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 6)})
    built = kiln.build(graph, target="llvm", params=params)
    lib = built.export_library(str(tmp_path / "dyn_loop.so"))
    feeds = [_loop_feeds(3, rows=2), _loop_feeds(5, rows=6), _loop_feeds(0, rows=1), _loop_feeds(4, rows=1),
             _loop_feeds(1000, rows=3, **EARLY_STOP), _loop_feeds(2, rows=5)]
    out, got = _session(driver, lib, tmp_path, feeds, LOOP_INPUTS, 6 if swap else 5)
    _compare(model, out, got, feeds)
    shapes = [row[2][1].split(" (")[1].split(")")[0] for row in got]
    assert shapes[:4] == ["3, 2, 4", "5, 6, 4", "0, 1, 4", "4, 1, 4"], shapes


@pytest.fixture(scope="module")
def bounded_loop(tmp_path_factory):
    """The loop model with its scan outputs planned for 4 iterations."""
    from kiln.frontend.onnx import ops_control

    model = loop_model(nested_if=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(ops_control, "RUNTIME_LOOP_MAX_ITERATIONS", 4)
    try:
        lib = _export(model, tmp_path_factory.mktemp("bounded"), "bounded.so")
    finally:
        mp.undo()
    return model, lib


def test_loop_past_its_scan_bound_is_an_error_naming_the_node_and_the_instance_runs_on(bounded_loop, driver,
                                                                                       tmp_path):
    model, lib = bounded_loop
    feeds = [_loop_feeds(4), _loop_feeds(5), _loop_feeds(2), _loop_feeds(100, limit=1e9), _loop_feeds(3)]
    out, got = _session(driver, lib, tmp_path, feeds, LOOP_INPUTS, 5)
    runs = _lines(out, "run")
    assert [_status(line) for line in runs] == [0, ERR_SHAPE, 0, ERR_SHAPE, 0], runs
    for k in (1, 3):
        assert re.search(r"KilnModelRun: graph node '[^']+', function '__loop': the loop runs more than 4 "
                         r"iterations, the bound its scan outputs were planned for", runs[k]), runs[k]
    _compare(model, out, got, feeds, skip_runs=(1, 3))


# ----------------------------------------------------------------------------- tables
def _graph(model: onnx.ModelProto):
    built, params = _build(model)
    return load_graph_json(built.get_graph_json()), list(params)


def test_tables_of_control_flow_are_version_4_with_a_table_set_per_nested_graph():
    g, params = _graph(loop_model(nested_if=True))
    src = model_api.model_api_source(g, params)
    v = model_api.CONTROL_FLOW_TABLES_VERSION
    assert v == 4
    top = re.search(r"static const KilnModelDesc kiln_model_desc = \{\n  (\d+), ", src)
    assert top and int(top.group(1)) == v, src[-2000:]
    # the body (itself with an If: version 4) and the If's two branches (no control flow: version 2)
    descs = dict(re.findall(r"static const KilnModelDesc (\w+) = \{\n  (\d+), ", src))
    body = [n for n in descs if re.fullmatch(r"kiln_c\d+b_model_desc", n)]
    branches = [n for n in descs if re.fullmatch(r"kiln_c\d+b_c\d+[te]_model_desc", n)]
    assert len(body) == 1 and len(branches) == 2, descs
    assert descs[body[0]] == str(v) and all(descs[b] == "2" for b in branches), descs
    assert "KILN_OP_LOOP" in src and "KILN_OP_IF" in src
    # the loop reports the scan outputs' count: a data-dependent symbol row naming its op
    table = re.search(r"static const KilnOpDesc kiln_ops\[\] = \{\n(.*?)\n\};", src, re.S)
    ops = re.findall(r'\{(\w+), "[^"]*", "(\w+)", (KILN_OP_\w+)', table.group(1))
    row = re.search(r'\{"(\w+)", 0LL, 4096LL, -1, (\d+)\},', src)
    assert row and ops[int(row.group(2))][2] == "KILN_OP_LOOP", (row, ops)


def test_models_without_control_flow_keep_their_tables():
    """No control flow: version 2 tables, no controls fields (the byte-identity tests in
    test_c_api*.py cover the rest)."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", TP.FLOAT, [2, 3])], [_vi("y", TP.FLOAT, [2, 3])])
    g, params = _graph(model)
    src = model_api.model_api_source(g, params)
    assert "static const KilnModelDesc kiln_model_desc = {\n  2, " in src
    assert "controls" not in src and "KilnControlDesc" not in src


def dynamic_if_model() -> onnx.ModelProto:
    """x is (n,): y = x * 2 if sum(x) > 0 else -x, then z = y + x; the branches read x, so they
    declare n (nested graphs with the enclosing graph's symbols)."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [_vi("t", TP.FLOAT, ["n"])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", TP.FLOAT, ["n"])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["y", "x"], ["z"])]
    return _model(nodes, [_vi("x", TP.FLOAT, ["n"])], [_vi("y", TP.FLOAT, ["n"]), _vi("z", TP.FLOAT, ["n"])],
                  [_const("two", np.float32(2)), _const("zero", np.float32(0))])


def test_dynamic_if_whose_branches_take_the_enclosing_symbols(driver, tmp_path):
    model = dynamic_if_model()
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 8)})
    built = kiln.build(graph, target="llvm", params=params)
    g = load_graph_json(built.get_graph_json())
    assert any(sub.dim_ranges == {"n": (1, 8)} for node in g.nodes for sub in node.subgraphs.values())
    src = model_api.model_api_source(g, list(params))
    # a branch's symbol row: given by the enclosing graph (input -2, its symbol 0); version 4
    row = r"static const KilnSymbolDesc kiln_c\d+t_symbols\[\] = \{\n  \{\"n\", 1LL, 8LL, -2, 0\},"
    assert re.search(row, src), src
    assert re.search(r"static const KilnModelDesc kiln_c\d+t_model_desc = \{\n  4, ", src)
    lib = built.export_library(str(tmp_path / "dyn_if.so"))
    feeds = [{"x": (RNG.standard_normal(n) + sign * 2).astype(np.float32)} for n, sign in
             [(3, 1), (8, -1), (1, 1), (5, -1), (8, 1), (2, -1)]]
    out, got = _session(driver, lib, tmp_path, feeds, ["x"], 2)
    _compare(model, out, got, feeds)


def test_nested_graph_deciding_its_own_data_dependent_dims_is_refused():
    from dataclasses import replace

    graph, params = kiln.frontend.from_onnx(dynamic_if_model(), dim_ranges={"n": (1, 8)})
    g = load_graph_json(kiln.build(graph, target="llvm", params=params).get_graph_json())
    nid = next(i for i, n in enumerate(g.nodes) if n.func_name == "__if")
    node = g.nodes[nid]
    subs = dict(node.subgraphs, else_branch=replace(node.subgraphs["else_branch"], data_dims=frozenset({"n"})))
    nodes = list(g.nodes)
    nodes[nid] = replace(node, subgraphs=subs)
    why = model_api._unsupported_reason(replace(g, nodes=tuple(nodes)), None, set(params))
    assert why == (f"graph node {node.name!r} is runtime control flow (__if) whose nested graph 'else_branch' decides "
                   "data-dependent dimension(s) ['n'] of its own; the C API runs nested graphs whose symbols are the "
                   "enclosing graph's (Kiln's importer writes no other)"), why


def _damaged(model, tmp_path, name, damage, target="llvm", options=None) -> str:
    orig = model_api._control_tables
    mp = pytest.MonkeyPatch()
    mp.setattr(model_api, "_control_tables", lambda *a, **k: damage(*orig(*a, **k)))
    try:
        built, _ = _build(model, target)
        return built.export_library(str(tmp_path / name), **({"options": options} if options else {}))
    finally:
        mp.undo()


def _bind_out_of_range(decls, lines):
    # the first binds row's nested entry: out of range (checked after the nested instance exists)
    at = next(i for i, x in enumerate(lines) if re.match(r"static const int32_t \w+_binds\[\]", x))
    lines[at + 1] = re.sub(r"^  \d+,", "  9999,", lines[at + 1])
    return decls, lines


@pytest.mark.parametrize("damage, message", [
    (_bind_out_of_range, r"control-flow op \d+ \(graph node '[^']+'\): a bind names an entry out of range"),
])
def test_damaged_control_tables_are_a_format_error(driver, tmp_path, damage, message):
    lib = _damaged(loop_model(), tmp_path, "damaged.so", damage)
    out = Session(driver, lib, tmp_path).go()
    assert len(out) == 1 and re.fullmatch(rf"create {ERR_FORMAT} KilnModelCreate: {message}", out[0]), out


def _body_output_out_of_range(decls, lines):
    # the body's first head (its next condition), read as a scalar at create: out of range
    at = next(i for i, x in enumerate(lines) if re.match(r"static const KilnNamedEntry \w+b_outputs\[\] = \{", x))
    lines[at] = re.sub(r"\{(\"[^\"]+\"), \d+\}", r"{\1, 100000000}", lines[at], count=1)
    return decls, lines


def test_a_head_out_of_range_is_a_format_error_before_anything_reads_it(driver, tmp_path):
    lib = _damaged(loop_model(), tmp_path, "damaged_head.so", _body_output_out_of_range)
    out = Session(driver, lib, tmp_path).go()
    want = (rf"create {ERR_FORMAT} KilnModelCreate: control-flow op \d+ "
            r"\(graph node '[^']+'\): a nested graph's output is out of range")
    assert len(out) == 1 and re.fullmatch(want, out[0]), out


def _for_loop_model(carried_condition: bool) -> onnx.ModelProto:
    """A ``for`` loop as exporters write it: the next condition a Constant true, or a carried
    bool the body returns as the condition. Either way it is bound memory of the body."""
    if carried_condition:
        nodes = [helper.make_node("Add", ["a_in", "x"], ["a_new"]), helper.make_node("Identity", ["f_in"], ["f_out"]),
                 helper.make_node("Identity", ["a_new"], ["sc"])]
        ins = [_vi("i", TP.INT64, []), _vi("cin", TP.BOOL, []), _vi("a_in", TP.FLOAT, [3]), _vi("f_in", TP.BOOL, [])]
        outs = [_vi("f_in", TP.BOOL, []), _vi("a_new", TP.FLOAT, [3]), _vi("f_out", TP.BOOL, []),
                _vi("sc", TP.FLOAT, [3])]
        loop = helper.make_node("Loop", ["M", "", "a", "f"], ["af", "ff", "scans"], body=helper.make_graph(
            nodes, "body", ins, outs))
        return _model([loop], [_vi("M", TP.INT64, []), _vi("a", TP.FLOAT, [3]), _vi("x", TP.FLOAT, [3]),
                               _vi("f", TP.BOOL, [])],
                      [_vi("af", TP.FLOAT, [3]), _vi("ff", TP.BOOL, []), _vi("scans", TP.FLOAT, ["T", 3])])
    nodes = [helper.make_node("Constant", [], ["cout"], value=helper.make_tensor("t", TP.BOOL, [], [True])),
             helper.make_node("Add", ["a_in", "x"], ["a_new"]), helper.make_node("Identity", ["a_new"], ["sc"])]
    ins = [_vi("i", TP.INT64, []), _vi("cin", TP.BOOL, []), _vi("a_in", TP.FLOAT, [3])]
    body = helper.make_graph(nodes, "body", ins,
                             [_vi("cout", TP.BOOL, []), _vi("a_new", TP.FLOAT, [3]), _vi("sc", TP.FLOAT, [3])])
    return _model([helper.make_node("Loop", ["M", "", "a"], ["af", "scans"], body=body)],
                  [_vi("M", TP.INT64, []), _vi("a", TP.FLOAT, [3]), _vi("x", TP.FLOAT, [3])],
                  [_vi("af", TP.FLOAT, [3]), _vi("scans", TP.FLOAT, ["T", 3])])


@pytest.mark.parametrize("carried_condition", [False, True])
def test_a_bound_next_condition_is_read_after_each_run(driver, tmp_path, carried_condition):
    """The first run of an instance too: the condition's memory is bound inside the body's run."""
    model = _for_loop_model(carried_condition)
    names = [i.name for i in model.graph.input]
    lib = _export(model, tmp_path, f"for_{carried_condition}.so")
    feeds = []
    for m in (4, 3, 0, 2):
        f = {"M": np.array(m, np.int64), "a": np.zeros(3, np.float32), "x": np.array([1, 2, 3], np.float32)}
        if carried_condition:
            f["f"] = np.array(True)
        feeds.append(f)
    out, got = _session(driver, lib, tmp_path, feeds, names, len(model.graph.output))
    _compare(model, out, got, feeds)


# ----------------------------------------------------------------------------- sanitizers
def test_control_flow_runs_clean_under_asan_ubsan(tmp_path):
    """If in a Loop body and the swapping body with everything instrumented (tests/sanitizers):
    runs of 0 and of the bound, a loop past its bound and the run after it, a dynamic loop (sub-box
    copies at several n), and a damaged table refused after nested instances were created: no
    report, no leak."""
    from kiln.frontend.onnx import ops_control
    from kiln.runtime import include_path
    from kiln.runtime.cc import get_cc
    from tests.sanitizers.kernel_cases import sanitizer_target
    from tests.sanitizers.test_sanitizers import LIBASAN, REPORT_MARKERS, WHY_NOT

    if LIBASAN is None:
        pytest.skip(f"ASan/UBSan job skipped: {WHY_NOT}")
    flags = ["-fsanitize=address", "-fsanitize=undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    san_driver = str(tmp_path / "capi_dynamic_san")
    subprocess.run([*get_cc().split(), "-O1", *flags, "-I", include_path(), DRIVER, "-o", san_driver, "-ldl"],
                   check=True, capture_output=True, text=True)

    def check(lib: str) -> str:
        data = open(lib, "rb").read()
        assert b"__asan_report" in data and b"__ubsan_handle" in data, f"{lib} is not instrumented"
        return lib

    def export(model, name):
        built, _ = _build(model, sanitizer_target())
        return check(built.export_library(str(tmp_path / name), options=flags))

    def run(argv):
        env = {"PATH": "/usr/bin:/bin", "ASAN_OPTIONS": "halt_on_error=1:exitcode=86:detect_leaks=1",
               "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        reports = [m for m in REPORT_MARKERS if m in proc.stdout + proc.stderr]
        assert not reports, proc.stderr[-4000:]
        return proc

    nested = loop_model(nested_if=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(ops_control, "RUNTIME_LOOP_MAX_ITERATIONS", 4)
    try:
        lib = export(nested, "loopif_san.so")
    finally:
        mp.undo()
    feeds = [_loop_feeds(4), _loop_feeds(0), _loop_feeds(9), _loop_feeds(9, **EARLY_STOP), _loop_feeds(3)]
    out, got = _session(san_driver, lib, tmp_path, feeds, LOOP_INPUTS, 5, runner=run)
    assert [_status(line) for line in _lines(out, "run")] == [0, 0, ERR_SHAPE, 0, 0], out
    _compare(nested, out, got, feeds, skip_runs=(2,))

    swap = loop_model(swap=True)
    feeds = [_loop_feeds(3), _loop_feeds(0), _loop_feeds(2)]
    out, got = _session(san_driver, export(swap, "swap_san.so"), tmp_path, feeds, LOOP_INPUTS, 6, runner=run)
    _compare(swap, out, got, feeds)

    dyn = loop_model(nested_if=True, rows="n")
    graph, params = kiln.frontend.from_onnx(dyn, dim_ranges={"n": (1, 6)})
    lib = check(kiln.build(graph, target=sanitizer_target(), params=params).export_library(
        str(tmp_path / "dyn_loop_san.so"), options=flags))
    feeds = [_loop_feeds(3, rows=6), _loop_feeds(5, rows=2), _loop_feeds(0, rows=1), _loop_feeds(2, rows=4)]
    out, got = _session(san_driver, lib, tmp_path, feeds, LOOP_INPUTS, 5, runner=run)
    _compare(dyn, out, got, feeds)

    damaged = check(_damaged(if_model(), tmp_path, "if_damaged_san.so", _bind_out_of_range, sanitizer_target(),
                             flags))
    out = Session(san_driver, damaged, tmp_path, run).go()
    assert len(out) == 1 and out[0].startswith(f"create {ERR_FORMAT} "), out
