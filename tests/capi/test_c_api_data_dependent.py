"""The model C API with data-dependent dims: NonZero, Unique, Compress, NonMaxSuppression, TopK, Range.

ONNX models whose output extents depend on input *values* are imported, built, exported and
driven from C by ``capi_dynamic.c`` (one instance, several inputs in a row, counts of 0
included); every output and its shape is compared with ONNX Runtime. A kernel reporting an
extent outside its symbol's range is a ``KILN_ERR_SHAPE`` naming the node, the function, the
symbol and the range, after which the same instance runs on. A dim mixing an input symbol and a
data-dependent one is not checked at a run's start, while the count is the last run's; tables
that break what the C side relies on are a ``KILN_ERR_FORMAT`` at creation.
"""

from __future__ import annotations

import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.runtime import model_api
from kiln.runtime.graph_json import load_graph_json
from tests.capi.test_c_api import _cc, _run
from tests.capi.test_c_api import pytestmark as _needs_cc
from tests.capi.test_c_api_dynamic import DRIVER, Session, _lines, _read, _status
from tests.frontend.onnx_check import run_ort
from tests.frontend.test_onnx_data_dependent import detection_graph

pytestmark = _needs_cc
RNG = np.random.default_rng(23)
ERR_SHAPE = 2  # KILN_ERR_SHAPE


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> str:
    return _cc(str(tmp_path_factory.mktemp("driver") / "capi_dynamic"), DRIVER, "-ldl")


def _model(nodes, inputs, outputs, inits=None) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
           for k, (dt, shape) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    m = helper.make_model(helper.make_graph(nodes, "dd", vis, outs, initializer=init),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _export(model: onnx.ModelProto, tmp_path, name: str) -> str:
    graph, params = kiln.frontend.from_onnx(model)
    return kiln.build(graph, target="llvm", params=params).export_library(str(tmp_path / name))


def _run_c(driver: str, lib: str, tmp_path, feeds_list: list[dict[str, np.ndarray]], names: list[str],
           n_out: int, extra: tuple[str, ...] = (), runner=_run) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """Set every input, run and read every output once per feeds (on one instance)."""
    ses = Session(driver, lib, tmp_path, runner)
    ses.cmd(*extra)  # commands before the first input is set
    paths = []
    for feeds in feeds_list:
        for i, n in enumerate(names):
            ses.set(i, feeds[n])
        ses.cmd("run")
        paths.append([ses.get(o) for o in range(n_out)])
    out = ses.go()
    gets = iter(_lines(out, "get")[extra.count("get"):])
    return out, [[(p, next(gets)) for p in row] for row in paths]


def _compare(model, out, got, feeds_list) -> None:
    assert all(_status(line) == 0 for line in out if line.split()[0] in ("create", "set", "run", "get")), out
    for feeds, row in zip(feeds_list, got):
        want = run_ort(model, feeds)
        assert len(row) == len(want)
        for k, ((path, line), w) in enumerate(zip(row, want)):
            arr = _read(path, line, w.dtype)
            assert arr.shape == w.shape, (k, line, w.shape)
            np.testing.assert_allclose(arr, w, rtol=1e-5, atol=1e-6, err_msg=f"output {k}")


# ----------------------------------------------------------------------------- NonZero
def _nonzero_model() -> onnx.ModelProto:
    """x > 0.5 -> NonZero -> Transpose (nz, 2) indices; GatherND picks the values (nz,); their
    sum is a static scalar computed over the data-dependent extent."""
    nodes = [helper.make_node("Greater", ["x", "thr"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]), helper.make_node("GatherND", ["x", "idx"], ["vals"]),
             helper.make_node("ReduceSum", ["vals"], ["total"], keepdims=0)]
    return _model(nodes, {"x": (np.float32, (3, 4))}, ["idx", "vals", "total"],
                  {"thr": np.array(0.5, np.float32)})


def test_nonzero_counts_from_c_match_onnxruntime(driver, tmp_path):
    model = _nonzero_model()
    lib = _export(model, tmp_path, "nz.so")
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    feeds = [{"x": x}, {"x": np.zeros((3, 4), np.float32)},           # 0 selected
             {"x": np.ones((3, 4), np.float32)},                      # all 12: the upper bound
             {"x": -x}, {"x": x}, {"x": np.zeros((3, 4), np.float32)}]
    counts = [int((f["x"] > 0.5).sum()) for f in feeds]
    assert 0 in counts and 12 in counts and len(set(counts)) >= 4, counts
    out, got = _run_c(driver, lib, tmp_path, feeds, ["x"], 3, ("info", "get", "0", str(tmp_path / "before.bin")))
    _compare(model, out, got, feeds)
    # the symbol and the dims it makes; before any run an output has its upper-bound shape
    assert "symbol 0 'nonzero_0' 0..12" in out, out
    assert "output 0 'output0': (nonzero_0, 2) upper (12, 2) 192 bytes" in out, out
    assert _lines(out, "get")[0].startswith("get 0 (12, 2) 192 bytes"), out
    for k, row in zip(counts, got):
        assert f"({k}, 2) {16 * k} bytes" in row[0][1]


def test_tables_of_a_data_dependent_model_and_unchanged_static_ones():
    """The reporting kernel's op is named in the symbol row and the tables are version 3; a model
    without data-dependent dims keeps version 2."""
    graph, params = kiln.frontend.from_onnx(_nonzero_model())
    g = load_graph_json(kiln.build(graph, target="llvm", params=params).get_graph_json())
    src = model_api.model_api_source(g, list(params))
    ops = re.findall(r'\{(\w+), "[^"]*", "\w+", KILN_OP_CALL', src)
    row = re.search(r'\{"nonzero_0", 0LL, 12LL, -1, (\d+)\},', src)
    assert row and ops[int(row.group(1))].endswith("nonzero"), (row, ops)
    assert f"static const KilnModelDesc kiln_model_desc = {{\n  {model_api.DATA_DEPENDENT_TABLES_VERSION}, " in src
    static = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": (np.float32, (2, 3))}, ["y"])
    graph, params = kiln.frontend.from_onnx(static)
    s = model_api.model_api_source(load_graph_json(kiln.build(graph, target="llvm").get_graph_json()), [])
    assert "static const KilnModelDesc kiln_model_desc = {\n  2, " in s and "-1, " not in s


def test_unique_and_compress_from_c_match_onnxruntime(driver, tmp_path):
    """Unique (four outputs, three of the data-dependent count, one static) and Compress with a
    run-time condition, then a Mul on Compress's result: two reporting kernels in one run."""
    nodes = [helper.make_node("Unique", ["u"], ["y", "idx", "inv", "cnt"], sorted=1),
             helper.make_node("Compress", ["x", "c"], ["sel"], axis=1),
             helper.make_node("Mul", ["sel", "sel"], ["sq"])]
    model = _model(nodes, {"u": (np.int64, (10,)), "x": (np.float32, (2, 5)), "c": (np.bool_, (5,))},
                   ["y", "idx", "inv", "cnt", "sq"])
    lib = _export(model, tmp_path, "uc.so")
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    feeds = [{"u": RNG.integers(0, 4, 10), "x": x, "c": RNG.random(5) < 0.5},
             {"u": np.full(10, 7, np.int64), "x": x, "c": np.zeros(5, bool)},          # 1 unique, 0 kept
             {"u": np.arange(10, dtype=np.int64)[::-1].copy(), "x": x, "c": np.ones(5, bool)},  # all of both
             {"u": RNG.integers(0, 4, 10), "x": -x, "c": RNG.random(5) < 0.5}]
    out, got = _run_c(driver, lib, tmp_path, feeds, ["u", "x", "c"], 5)
    _compare(model, out, got, feeds)


# ----------------------------------------------------------------------------- detection
def _boxes(n: int) -> np.ndarray:
    xy = RNG.random((1, n, 2)).astype(np.float32) * 10
    wh = RNG.random((1, n, 2)).astype(np.float32) * 4 + 0.5
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


def test_detection_post_processing_from_c_matches_onnxruntime(driver, tmp_path):
    """boxes, scores -> NonMaxSuppression -> Gather of the chosen boxes and scores -> arithmetic
    -> Concat -> ReduceSum, all on the data-dependent number of detections (as in
    tests/frontend/test_onnx_data_dependent.py, here from C)."""
    n = 60
    nodes, inits = detection_graph(n, 20)
    model = _model(nodes, {"boxes": (np.float32, (1, n, 4)), "scores": (np.float32, (1, 1, n))},
                   ["sel", "det", "total"], inits)
    lib = _export(model, tmp_path, "nms.so")
    feeds = [{"boxes": _boxes(n), "scores": RNG.random((1, 1, n)).astype(np.float32)} for _ in range(2)]
    feeds.append({"boxes": _boxes(n), "scores": np.zeros((1, 1, n), np.float32)})  # no detection
    feeds.append({"boxes": _boxes(n), "scores": RNG.random((1, 1, n)).astype(np.float32) * 0.25})  # a few
    feeds.append(feeds[0])  # back to the first count after an empty one
    counts = [len(run_ort(model, f)[0]) for f in feeds]
    assert counts[2] == 0 and len(set(counts)) >= 3, counts
    out, got = _run_c(driver, lib, tmp_path, feeds, ["boxes", "scores"], 3)
    _compare(model, out, got, feeds)


# ----------------------------------------------------------------------------- TopK, Range
@pytest.fixture(scope="module")
def topk_range(tmp_path_factory):
    """TopK with a run-time K and Range with run-time bounds in one graph (two data-dependent
    symbols, reported by two kernels), Range's storage bound lowered to 16 so it can be passed."""
    from kiln.frontend.onnx import ops_dynamic

    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("Range", ["s", "l", "d"], ["r"]),
             helper.make_node("Mul", ["r", "r"], ["r2"])]
    model = _model(nodes, {"x": (np.float32, (4, 6)), "k": (np.int64, (1,)), "s": (np.int64, ()),
                           "l": (np.int64, ()), "d": (np.int64, ())}, ["v", "i", "r2"])
    mp = pytest.MonkeyPatch()
    mp.setattr(ops_dynamic, "RANGE_MAX_LENGTH", 16)
    try:
        lib = _export(model, tmp_path_factory.mktemp("topk"), "topk_range.so")
    finally:
        mp.undo()
    return model, lib


def _topk_feeds(k: int, start: int, limit: int, delta: int, x: np.ndarray | None = None) -> dict[str, np.ndarray]:
    x = RNG.standard_normal((4, 6)).astype(np.float32) if x is None else x
    return {"x": x, "k": np.array([k], np.int64), "s": np.array(start, np.int64), "l": np.array(limit, np.int64),
            "d": np.array(delta, np.int64)}


NAMES = ["x", "k", "s", "l", "d"]


def test_topk_runtime_k_and_range_runtime_bounds_from_c(topk_range, driver, tmp_path):
    model, lib = topk_range
    feeds = [_topk_feeds(2, 2, 11, 3), _topk_feeds(0, 5, 1, 1), _topk_feeds(6, 10, -3, -4),
             _topk_feeds(1, 0, 16, 1), _topk_feeds(3, 0, 0, 1)]
    out, got = _run_c(driver, lib, tmp_path, feeds, NAMES, 3)
    _compare(model, out, got, feeds)


@pytest.mark.parametrize("bad, symbol, value, rng", [
    (dict(k=7), "topk_0", 7, "0..6"),          # K past the axis length
    (dict(k=-1), "topk_0", -1, "0..6"),        # a negative K
    (dict(l=100), "range_0", 17, "0..16"),     # longer than the bound it was built for
    (dict(d=0), "range_0", 17, "0..16"),       # a zero delta
])
def test_extent_outside_its_range_is_a_shape_error_and_the_instance_runs_on(topk_range, driver, tmp_path, bad,
                                                                             symbol, value, rng):
    model, lib = topk_range
    good = _topk_feeds(3, 1, 9, 2)
    x = good["x"]
    args = dict(k=3, s=1, l=9, d=2) | bad
    feeds = [good, _topk_feeds(args["k"], args["s"], args["l"], args["d"], x), _topk_feeds(2, 0, 5, 1)]
    ses = Session(driver, lib, tmp_path)
    paths = []
    for f in feeds:
        for i, n in enumerate(NAMES):
            ses.set(i, f[n])
        ses.cmd("run")
        paths.append([ses.get(o) for o in range(3)])
    out = ses.go()
    runs, gets = _lines(out, "run"), _lines(out, "get")
    assert _status(runs[0]) == 0 and _status(runs[2]) == 0, out
    assert _status(runs[1]) == ERR_SHAPE, runs[1]
    msg = re.search(r"KilnModelRun: graph node '([^']+)', function '(\w+)': data-dependent dimension '(\w+)' came "
                    r"out as (-?\d+), outside its range (\d+\.\.\d+) \(graph entry \d+, dim \d\)", runs[1])
    assert msg, runs[1]
    kind = "topk" if symbol.startswith("topk") else "range"
    assert kind in msg.group(2) and msg.groups()[2:] == (symbol, str(value), rng), runs[1]
    # a defined state: the symbol keeps its previous value, so every shape is the last run's
    assert [line.split(" (")[1] for line in gets[3:6]] == [line.split(" (")[1] for line in gets[0:3]], out
    # and the next run is right
    want = run_ort(model, feeds[2])
    for (path, line), w in zip(zip(paths[2], gets[6:9]), want):
        np.testing.assert_allclose(_read(path, line, w.dtype), w, rtol=1e-6)


@pytest.mark.parametrize("damage, message", [
    (lambda lines, fields: ([x.replace('{"nonzero_0", 0},', '{"nonzero_1", 0},') for x in lines], fields),
     "KilnModelCreate: dim expression 0 is 'nonzero_1', not symbol 0 'nonzero_0' itself"),
    (lambda lines, fields: (lines, [f for f in fields if "dim_expr_after" not in f]),
     "KilnModelCreate: version-3 tables without dim_expr_after"),
])
def test_tables_breaking_what_the_c_side_relies_on_are_a_format_error(driver, tmp_path, damage, message):
    """Expression j < num_symbols is symbol j (restore_reported relies on it) and version-3 tables
    carry dim_expr_after: KilnModelCreate checks both (KILN_ERR_FORMAT) instead of trusting them."""
    orig = model_api._dynamic_tables
    mp = pytest.MonkeyPatch()
    mp.setattr(model_api, "_dynamic_tables", lambda *a, **k: damage(*orig(*a, **k)))
    try:
        lib = _export(_nonzero_model(), tmp_path, "damaged.so")
    finally:
        mp.undo()
    out = Session(driver, lib, tmp_path).go()
    assert out == [f"create 4 {message}"], out


# ----------------------------------------------------------------------------- still refused
def test_a_loop_node_without_its_nested_graph_is_refused_by_name():
    """A kernel reporting a data-dependent dim runs from C; a ``__loop`` node needs its nested
    body (the C API runs runtime control flow, tests/capi/test_c_api_control_flow.py), and a
    hand-made one without it is refused, naming the node."""
    from dataclasses import replace

    g = load_graph_json({
        "nodes": [{"op": "null", "name": "x", "inputs": []},
                  {"op": "tvm_op", "name": "loop", "inputs": [[0, 0, 0]],
                   "attrs": {"func_name": "kern", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
        "attrs": {"dltype": ["list_str", ["float32", "float32"]], "shape": ["list_shape", [[4], [8]]],
                  "storage_id": ["list_int", [0, 1]], "sym_shape": ["list_sym_shape", [[4], ["t"]]],
                  "dim_ranges": ["list_dim_range", [["t", 0, 8, "data"]]]},
    })
    assert model_api._unsupported_reason(g, {"kern"}) is None  # a kernel reporting t: runs
    nodes = list(g.nodes)
    nodes[1] = replace(nodes[1], func_name="__loop")
    why = model_api._unsupported_reason(replace(g, nodes=tuple(nodes)), None)
    assert why == ("graph node 'loop' is runtime control flow (__loop) without its nested graph(s) body "
                   "(the graph JSON reader requires them)")


# ----------------------------------------------------------------------------- sanitizers
def test_data_dependent_runs_clean_under_asan_ubsan(driver, tmp_path):
    """The same paths with everything instrumented (tests/sanitizers): kernels built for the ``c``
    target with the sanitizer flags, the C API and crt exported with them, the driver too. Counts
    of 0 and of the upper bound, an extent out of range and the run after it: no report, no leak."""
    from tests.sanitizers.kernel_cases import sanitizer_target
    from tests.sanitizers.test_sanitizers import LIBASAN, REPORT_MARKERS, WHY_NOT

    if LIBASAN is None:
        pytest.skip(f"ASan/UBSan job skipped: {WHY_NOT}")
    from kiln.frontend.onnx import ops_dynamic
    from kiln.runtime.cc import get_cc
    from kiln.runtime import include_path

    flags = ["-fsanitize=address", "-fsanitize=undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
    san_driver = str(tmp_path / "capi_dynamic_san")
    subprocess.run([*get_cc().split(), "-O1", *flags, "-I", include_path(), DRIVER, "-o", san_driver, "-ldl"],
                   check=True, capture_output=True, text=True)

    def export(model, name):
        graph, params = kiln.frontend.from_onnx(model)
        lib = kiln.build(graph, target=sanitizer_target(), params=params).export_library(str(tmp_path / name),
                                                                                          options=flags)
        data = open(lib, "rb").read()
        assert b"__asan_report" in data and b"__ubsan_handle" in data, f"{lib} is not instrumented"
        return lib

    def run(argv):
        env = {"PATH": "/usr/bin:/bin", "ASAN_OPTIONS": "halt_on_error=1:exitcode=86",
               "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        reports = [m for m in REPORT_MARKERS if m in proc.stdout + proc.stderr]
        assert not reports, proc.stderr[-4000:]
        return proc

    nz = _nonzero_model()
    feeds = [{"x": np.ones((3, 4), np.float32)}, {"x": np.zeros((3, 4), np.float32)},
             {"x": RNG.standard_normal((3, 4)).astype(np.float32)}]
    out, got = _run_c(san_driver, export(nz, "nz_san.so"), tmp_path, feeds, ["x"], 3, runner=run)
    _compare(nz, out, got, feeds)

    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("Range", ["s", "l", "d"], ["r"])]
    tr = _model(nodes, {"x": (np.float32, (4, 6)), "k": (np.int64, (1,)), "s": (np.int64, ()),
                        "l": (np.int64, ()), "d": (np.int64, ())}, ["v", "i", "r"])
    mp = pytest.MonkeyPatch()
    mp.setattr(ops_dynamic, "RANGE_MAX_LENGTH", 16)
    try:
        lib = export(tr, "tr_san.so")
    finally:
        mp.undo()
    feeds = [_topk_feeds(6, 0, 16, 1), _topk_feeds(9, 0, 3, 1), _topk_feeds(2, 0, 99, 1), _topk_feeds(0, 3, 3, 1)]
    out, got = _run_c(san_driver, lib, tmp_path, feeds, NAMES, 3, runner=run)
    runs = _lines(out, "run")
    assert [_status(line) for line in runs] == [0, ERR_SHAPE, ERR_SHAPE, 0], runs
    _compare(tr, [line for line in out if line not in runs[1:3]], [got[0], got[3]], [feeds[0], feeds[3]])


# ----------------------------------------------------------------------------- mixed dims
def test_dim_mixing_an_input_symbol_and_a_data_dependent_one_from_c(driver, tmp_path):
    """ConstantOfShape(Shape(x) - Shape(NonZero(x > 0.5))[1:]) has the dim ``n-nonzero_0``, whose
    lower bound over the ranges is negative. At a run's start the count is still the last run's:
    with a smaller ``n`` the stale value makes the dim negative, which must not refuse the run (as
    the Python executor, which re-shapes after the NonZero kernel reports the new count)."""
    nodes = [helper.make_node("Greater", ["x", "thr"], ["m"]), helper.make_node("NonZero", ["m"], ["nz"]),
             helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["nz"], ["snz"], start=1),
             helper.make_node("Sub", ["sx", "snz"], ["rest"]),
             helper.make_node("ConstantOfShape", ["rest"], ["pad"],
                              value=numpy_helper.from_array(np.array([2.0], np.float32))),
             helper.make_node("Squeeze", ["nz", "zero"], ["nz0"]),
             helper.make_node("Gather", ["x", "nz0"], ["vals"], axis=0),
             helper.make_node("Concat", ["vals", "pad"], ["out"], axis=0)]
    model = _model(nodes, {"x": (np.float32, ("n",))}, ["out", "pad", "vals"],
                   {"thr": np.array(0.5, np.float32), "zero": np.array([0], np.int64)})
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 16)})
    built = kiln.build(graph, target="llvm", params=params)
    g = load_graph_json(built.get_graph_json())
    assert ("n-nonzero_0",) in g.sym_shape and g.dim_ranges["nonzero_0"] == (0, 16), g.sym_shape
    src = model_api.model_api_source(g, list(params))  # known after NonZero's op: n is, the others not
    assert re.search(r"kiln_dim_expr_after\[\] = \{\n  -1, (\d+), \1,\n\};", src), src
    lib = built.export_library(str(tmp_path / "mixed.so"))
    big = np.linspace(1, 2, 12).astype(np.float32)
    big[[2, 7]] = 0
    feeds = [{"x": big},                                              # n 12, count 10: n-k 2
             {"x": np.append(big, 0).astype(np.float32)},             # n 13, the same count: n-k 3
             {"x": np.array([0, 1, 0], np.float32)},                  # n 3, count 1: 3-10 < 0 at the start
             {"x": np.ones(16, np.float32)},                          # the upper bounds, n-k 0
             {"x": np.zeros(1, np.float32)},                          # n 1, count 0
             {"x": big}]
    out, got = _run_c(driver, lib, tmp_path, feeds, ["x"], 3)
    _compare(model, out, got, feeds)
