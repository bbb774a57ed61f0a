"""The model C API with dynamic dimensions: one library, run from C at many input shapes.

Graphs with symbolic dims (built in the IR, or ONNX with dim_params) are exported and driven by
``capi_dynamic.c`` (beside this file) in a child process: set inputs of several shapes on one
instance, run, read outputs at their actual shapes; each result is compared with the Python
executor (or NumPy) at the same shape. Errors (a dim out of range, a wrong static dim or rank,
inputs that disagree on a symbol) and the models the C API refuses (a symbol only inside a
composite input dim, runtime control flow) are checked by status and message. Data-dependent
dims (NonZero ...) run too: ``test_c_api_data_dependent.py``.
"""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln import ir
from kiln.runtime import include_path, model_api, sym
from kiln.runtime.cc import get_cc
from kiln.runtime.graph_json import load_graph_json
from kiln.runtime.library_module import CRT_FUNCTIONS
from tests.capi.test_c_api import _cc, _run
from tests.executor.dynamic_support import masked_attention_graph
from tests.capi.test_c_api import pytestmark as _needs_cc

pytestmark = _needs_cc
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capi_dynamic.c")
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> str:
    return _cc(str(tmp_path_factory.mktemp("driver") / "capi_dynamic"), DRIVER, "-ldl")


class Session:
    """One ``capi_dynamic`` process: commands in, one parsed line per command out."""

    def __init__(self, driver: str, lib: str, tmp, runner=_run) -> None:
        self.driver, self.lib, self.tmp, self.runner = driver, lib, tmp, runner
        self.args: list[str] = []
        self.n = 0

    def _file(self, arr: np.ndarray) -> str:
        self.n += 1
        path = str(self.tmp / f"in{self.n}.bin")
        np.ascontiguousarray(arr).tofile(path)
        return path

    def set(self, i: int, arr: np.ndarray, shape: tuple[int, ...] | None = None, how: str = "set") -> None:
        shape = arr.shape if shape is None else shape
        self.args += [how, str(i), "x".join(map(str, shape)) or "-", self._file(arr)]

    def setfull(self, i: int, arr: np.ndarray) -> None:
        self.args += ["setfull", str(i), self._file(arr)]

    def get(self, i: int, cmd: str = "get") -> str:
        self.n += 1
        path = str(self.tmp / f"out{self.n}.bin")
        self.args += [cmd, str(i), path]
        return path

    def cmd(self, *args: str) -> None:
        self.args += list(args)

    def go(self) -> list[str]:
        proc = self.runner([self.driver, self.lib, *self.args])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        self.args = []
        return proc.stdout.splitlines()


def _lines(out: list[str], cmd: str) -> list[str]:
    return [line for line in out if line.split()[0] == cmd]


def _status(line: str) -> int:
    return int(line.split()[1])


def _read(path: str, line: str, dtype) -> np.ndarray:
    """A compact output written by `get`, shaped as its line says."""
    m = re.match(r"get \d+ \(([\d, ]*)\) (\d+) bytes", line)
    assert m, line
    shape = tuple(int(x) for x in m.group(1).split(",") if x.strip())
    arr = np.fromfile(path, dtype=dtype)
    assert arr.nbytes == int(m.group(2))
    return arr.reshape(shape)


def _export(factory, tmp, name: str) -> str:
    return factory.export_library(str(tmp / name))


def _python(lib: str) -> kiln.GraphModule:
    return kiln.GraphModule(kiln.runtime.load_module(lib)["default"](kiln.cpu()))


def _const(g: ir.Graph, *shape: int) -> ir.Value:
    return g.add_constant((RNG.standard_normal(shape) * 0.3).astype("float32"))


# ----------------------------------------------------------------------------- models
def _attention_graph() -> ir.Graph:
    """Masked attention, batch 1..4 x seq 1..12 (tests/executor/dynamic_support.py)."""
    return masked_attention_graph(12, _const)[0]


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attn")
    return _export(kiln.build(_attention_graph(), target="llvm"), tmp, "attn.so")


def _attn_feeds(b: int, s: int) -> dict[str, np.ndarray]:
    x = RNG.standard_normal((b, s, 16)).astype("float32")
    mask = np.ones((b, s), "float32")
    mask[:, s // 2 + 1:] = 0
    return {"x": x, "mask": mask}


def test_attention_at_many_shapes_matches_python(attention, driver, tmp_path):
    py = _python(attention)
    ses = Session(driver, attention, tmp_path)
    shapes = [(2, 7), (4, 12), (1, 1), (3, 5), (3, 5), (4, 1), (1, 12)]
    outs, wants = [], []
    for k, (b, s) in enumerate(shapes):
        feeds = _attn_feeds(b, s)
        # every way of setting an input: shaped, as a DLTensor, and at the upper bounds
        how = ("set", "tensor")[k % 2]
        ses.set(0, feeds["x"], how=how)
        if (b, s) == (4, 12):
            ses.setfull(1, feeds["mask"])
        else:
            ses.set(1, feeds["mask"], how=how)
        ses.cmd("run")
        outs.append((ses.get(0), ses.get(1)))
        py.run(**feeds)
        wants.append([py.get_output(i).numpy() for i in range(2)])
    out = ses.go()
    assert all(_status(line) == 0 for line in out), out
    gets = _lines(out, "get")
    assert len(gets) == 2 * len(shapes)
    for k, ((p0, p1), want) in enumerate(zip(outs, wants)):
        for path, line, w in zip((p0, p1), gets[2 * k:2 * k + 2], want):
            got = _read(path, line, np.float32)
            assert got.shape == w.shape, (shapes[k], line)
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=f"shape {shapes[k]}")


def test_info_reports_symbols_dims_and_upper_bounds(attention, driver, tmp_path):
    out = Session(driver, attention, tmp_path)
    out.cmd("info")
    lines = out.go()
    assert "symbols 2" in lines
    assert "symbol 0 'batch' 1..4" in lines and "symbol 1 'seq' 1..12" in lines
    assert "input 0 'x': (batch, seq, 16) upper (4, 12, 16) 3072 bytes" in lines
    assert "input 1 'mask': (batch, seq) upper (4, 12) 192 bytes" in lines
    assert "output 1 'output1': (batch, seq, 16) upper (4, 12, 16) 3072 bytes" in lines


def test_inputs_that_disagree_on_a_symbol_are_a_shape_error_at_run(attention, driver, tmp_path):
    ses = Session(driver, attention, tmp_path)
    ses.cmd("run")  # before any input: the state error, as for static models
    f = _attn_feeds(2, 6)
    ses.set(0, f["x"][:, :5])
    ses.set(1, f["mask"])
    ses.cmd("run")
    ses.set(0, f["x"])  # consistent again
    ses.cmd("run")
    path = ses.get(1)
    out = ses.go()
    runs = _lines(out, "run")
    assert _status(runs[0]) == 9 and "input 'x' was never set" in runs[0]
    assert _status(runs[1]) == 2
    assert ("KilnModelRun: inconsistent input shapes: input 'x' has shape (2, 5, 16), but seq = 6 (from input "
            "'mask') makes it (2, 6, 16)") in runs[1]
    assert _status(runs[2]) == 0
    py = _python(attention)
    py.run(**f)
    got = _read(path, _lines(out, "get")[0], np.float32)
    np.testing.assert_allclose(got, py.get_output(1).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, status, message", [
    ((5, 3, 16), 2, "KilnModelSetInputShaped: input 'x': dim 0 (batch) is 5, outside its range 1..4"),
    ((2, 0, 16), 2, "input 'x': dim 1 (seq) is 0, outside its range 1..12"),
    ((2, 13, 16), 2, "input 'x': dim 1 (seq) is 13, outside its range 1..12"),
    ((2, 3, 15), 2, "input 'x': dim 2 is 15, expected 16 (shape (batch, seq, 16))"),
    ((2, 3), 2, "input 'x': shape (2, 3) has 2 dims, expected 3 (batch, seq, 16)"),
])
def test_bad_shapes_are_shape_errors_naming_input_dim_symbol_range(attention, driver, tmp_path, shape, status,
                                                                    message):
    ses = Session(driver, attention, tmp_path)
    ses.set(0, np.zeros(shape, "float32"))
    ses.set(0, np.zeros(shape, "float32"), how="tensor")
    # the instance is still usable: a good shape after the bad one runs
    f = _attn_feeds(2, 3)
    ses.set(0, f["x"])
    ses.set(1, f["mask"])
    ses.cmd("run")
    out = ses.go()
    bad = _lines(out, "set")[0], _lines(out, "tensor")[0]
    assert _status(bad[0]) == status and message in bad[0], bad[0]
    assert _status(bad[1]) == status and message.replace("SetInputShaped", "SetInputTensor") in bad[1], bad[1]
    assert _status(_lines(out, "run")[0]) == 0


def test_wrong_byte_counts_and_small_buffers(attention, driver, tmp_path):
    ses = Session(driver, attention, tmp_path)
    f = _attn_feeds(2, 3)
    ses.set(0, f["x"][:, :2], shape=(2, 3, 16))  # data of another shape
    ses.setfull(0, f["x"])  # KilnModelSetInput takes the upper-bound size only
    ses.set(0, f["x"])
    ses.set(1, f["mask"])
    ses.cmd("run", "getsmall", "0")
    out = ses.go()
    sets = _lines(out, "set")
    assert _status(sets[0]) == 2 and "input 'x' of shape (2, 3, 16) is float32 = 384 bytes, got 256 bytes" in sets[0]
    full = _lines(out, "setfull")[0]
    assert _status(full) == 2 and "upper bounds (4, 12, 16) = 3072 bytes, got 384 bytes" in full
    assert "KilnModelSetInputShaped" in full
    small = _lines(out, "getsmall")[0]
    assert _status(small) == 1 and "output 0 of shape (2, 16) needs 128 bytes, the buffer has 127" in small


def test_output_data_is_the_padded_buffer(attention, driver, tmp_path):
    ses = Session(driver, attention, tmp_path)
    f = _attn_feeds(2, 5)
    ses.set(0, f["x"])
    ses.set(1, f["mask"])
    ses.cmd("run")
    padded = ses.get(1, "padded")
    assert all(_status(line) == 0 for line in ses.go())
    py = _python(attention)
    py.run(**f)
    box = np.fromfile(padded, np.float32).reshape(4, 12, 16)[:2, :5]  # the sub-box of the upper bounds
    np.testing.assert_allclose(box, py.get_output(1).numpy(), rtol=1e-5, atol=1e-6)


def test_one_input_giving_one_symbol_two_values(driver, tmp_path):
    g = ir.Graph("sq")
    g.declare_dim("n", 1, 6)
    x = g.add_input("x", ("n", "n"))
    g.outputs = [g.add("relu", x)]
    lib = _export(kiln.build(g, target="llvm"), tmp_path, "sq.so")
    ses = Session(driver, lib, tmp_path)
    ses.set(0, np.zeros((3, 4), "float32"))
    x = RNG.standard_normal((5, 5)).astype("float32")
    ses.set(0, x)
    ses.cmd("run")
    path = ses.get(0)
    out = ses.go()
    bad = _lines(out, "set")[0]
    assert _status(bad) == 2 and "input 'x': dimension 'n' is both 3 and 4 in shape (3, 4)" in bad
    np.testing.assert_array_equal(_read(path, _lines(out, "get")[0], np.float32), np.maximum(x, 0))


def _run_each(ses: "Session", xs: list[np.ndarray]) -> list[np.ndarray]:
    """Run the session's model once per input ``x`` (input 0); output 0 of each run, read back
    at the shape the C API reported."""
    paths = []
    for x in xs:
        ses.set(0, x)
        ses.cmd("run")
        paths.append(ses.get(0))
    out = ses.go()
    assert all(_status(line) == 0 for line in out), out
    return [_read(path, line, np.float32) for path, line in zip(paths, _lines(out, "get"))]


def _cnn_onnx():
    w = RNG.standard_normal((6, 3, 3, 3)).astype("float32")
    b = RNG.standard_normal(6).astype("float32")
    d = RNG.standard_normal((6 * 5 * 5, 10)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "D"], ["y"]),
             helper.make_node("Softmax", ["y"], ["prob"], axis=-1)]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"), numpy_helper.from_array(d, "D")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 10, 10])]
    outs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 10])]
    graph = helper.make_graph(nodes, "cnn", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cnn_with_dynamic_batch_from_onnx(driver, tmp_path):
    graph, params = kiln.frontend.from_onnx(_cnn_onnx(), dim_ranges={"batch": (1, 6)})
    lib = _export(kiln.build(graph, params=params, target="llvm"), tmp_path, "cnn.so")
    py = _python(lib)
    ses = Session(driver, lib, tmp_path)
    xs = [RNG.standard_normal((b, 3, 10, 10)).astype("float32") for b in (1, 4, 6, 2)]
    for x, got in zip(xs, _run_each(ses, xs)):
        py.run(x=x)
        want = py.get_output(0).numpy()
        assert got.shape == (x.shape[0], 10)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_cnn_with_dynamic_image_size_from_onnx(driver, tmp_path):
    """Symbolic H and W: the output dims are window expressions ((h-2)//2+1) the C side
    evaluates with the same floor division as the Python executor."""
    w = RNG.standard_normal((6, 3, 3, 3)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"h": (4, 32), "w": (4, 32)})
    lib = _export(kiln.build(graph, params=params, target="llvm"), tmp_path, "cnn_hw.so")
    py = _python(lib)
    ses = Session(driver, lib, tmp_path)
    xs = [RNG.standard_normal((1, 3, h, w)).astype("float32") for h, w in ((32, 32), (9, 17), (4, 31))]
    for x, got in zip(xs, _run_each(ses, xs)):
        py.run(x=x)
        want = py.get_output(0).numpy()
        assert got.shape == (1, 6, x.shape[2] // 2, x.shape[3] // 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tc_name", ["aarch64", "rv64gc"])
def test_cross_built_dynamic_model_runs_under_qemu(tc_name, tmp_path):
    """The same tables and C code built by a cross compiler (export's path for -mtriple targets)."""
    from tests.cross.qemu import AARCH64, RV64GC, build_program, require, run_qemu

    tc = {"aarch64": AARCH64, "rv64gc": RV64GC}[tc_name]
    require(tc)
    g = _attention_graph()
    lib = _export(kiln.build(g, target=tc.target), tmp_path, f"attn_{tc.name}.so")
    py = kiln.GraphModule(kiln.build(g, target="llvm")["default"](kiln.cpu()))
    ses = Session(build_program(tc, DRIVER, str(tmp_path)), os.path.abspath(lib), tmp_path,
                  runner=lambda argv: run_qemu(tc, argv, 600)[0])
    shapes, paths, wants = [(3, 5), (1, 12), (4, 2)], [], []
    for b, s in shapes:
        feeds = _attn_feeds(b, s)
        ses.set(0, feeds["x"])
        ses.set(1, feeds["mask"])
        ses.cmd("run")
        paths.append(ses.get(1))
        py.run(**feeds)
        wants.append(py.get_output(1).numpy())
    out = ses.go()
    assert all(_status(line) == 0 for line in out), out
    for path, line, want in zip(paths, _lines(out, "get"), wants):
        np.testing.assert_allclose(_read(path, line, np.float32), want, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- refused models
def test_symbol_only_inside_a_composite_input_dim_is_refused(driver, tmp_path):
    g = ir.Graph("composite")
    g.declare_dim("n", 1, 8)
    x = g.add_input("x", ("2*n", 3))
    g.outputs = [g.add("relu", x)]
    factory = kiln.build(g, target="llvm")
    why = model_api._unsupported_reason(load_graph_json(factory.get_graph_json()), None)
    assert why is not None and "['n'] are not a plain dimension of any input (only inside '2*n' of input 'x')" in why
    lib = _export(factory, tmp_path, "composite.so")
    out = Session(driver, lib, tmp_path).go()
    assert _status(out[0]) == 8 and "KilnModelCreate: dynamic dimension(s) ['n']" in out[0], out


def test_composite_input_dim_with_its_symbol_given_elsewhere_runs(driver, tmp_path):
    """y's dim is 2*n; n comes from x. y's shape is checked against it at the run."""
    g = ir.Graph("pair")
    g.declare_dim("n", 1, 5)
    x = g.add_input("x", ("n",))
    y = g.add_input("y", ("2*n",))
    g.outputs = [g.add("relu", x), g.add("negative", y)]
    lib = _export(kiln.build(g, target="llvm"), tmp_path, "pair.so")
    ses = Session(driver, lib, tmp_path)
    xv, yv = RNG.standard_normal(3).astype("float32"), RNG.standard_normal(6).astype("float32")
    ses.set(1, yv)
    ses.set(0, xv)
    ses.cmd("run")
    path = ses.get(1)
    ses.set(1, yv[:5])
    ses.cmd("run")
    ses.set(1, np.zeros(11, "float32"))
    out = ses.go()
    runs, sets = _lines(out, "run"), _lines(out, "set")
    assert _status(runs[0]) == 0
    np.testing.assert_array_equal(_read(path, _lines(out, "get")[0], np.float32), -yv)
    assert _status(runs[1]) == 2 and "input 'y' has shape (5,), but 2*n = 6 (from input 'x') makes it (6,)" in runs[1]
    assert _status(sets[3]) == 2 and "input 'y': dim 0 (2*n) is 11, outside 0..10" in sets[3]


def test_data_dependent_dims_run(driver, tmp_path):
    """Refused before tables version 3; now the count NonZero reports is the output's extent
    (more in test_c_api_data_dependent.py)."""
    g = ir.Graph("dd")
    g.declare_dim("nz", 0, 12, data_dependent=True)
    x = g.add_input("x", (3, 4))
    g.outputs = [g.add_node("nonzero", [x], {"out_dim": "nz"})[0]]
    lib = _export(kiln.build(g, target="llvm"), tmp_path, "dd.so")
    ses = Session(driver, lib, tmp_path)
    xs = [RNG.standard_normal((3, 4)).astype("float32") * (RNG.random((3, 4)) < p) for p in (0.5, 0.0, 1.0)]
    paths = []
    for xv in xs:
        ses.set(0, xv)
        ses.cmd("run")
        paths.append(ses.get(0))
    out = ses.go()
    assert all(_status(line) == 0 for line in out), out
    for xv, path, line in zip(xs, paths, _lines(out, "get")):
        np.testing.assert_array_equal(_read(path, line, np.int64), np.array(np.nonzero(xv)))


def test_runtime_control_flow_is_refused():
    from dataclasses import replace

    g = {
        "nodes": [{"op": "null", "name": "x", "inputs": []},
                  {"op": "tvm_op", "name": "k", "inputs": [[0, 0, 0]],
                   "attrs": {"func_name": "kern", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
        "attrs": {"dltype": ["list_str", ["float32", "float32"]], "shape": ["list_shape", [[4], [4]]],
                  "storage_id": ["list_int", [0, 1]], "sym_shape": ["list_sym_shape", [["n"], ["n"]]],
                  "dim_ranges": ["list_dim_range", [["n", 1, 4]]]},
    }
    graph = load_graph_json(g)
    src = model_api.model_api_source(graph, [], "default", {"kern"})
    assert "kiln_eval_dims" in src and "kern(" in src and "NULL, NULL, NULL" not in src  # it runs now
    # a runtime If / Loop node (executor-level __if / __loop) is refused, naming the node
    nodes = list(graph.nodes)
    nodes[1] = replace(nodes[1], func_name="__if")
    why = model_api._unsupported_reason(replace(graph, nodes=tuple(nodes)), None)
    assert why is not None and "'k' is runtime control flow (__if)" in why


# ----------------------------------------------------------------------------- generated code
def test_dim_expressions_floor_like_sym(tmp_path):
    """The C rendering of symbolic dims (eval_dims) equals kiln.runtime.sym at every value in range,
    including floor division of negative numerators."""
    exprs = ["(n-3)//2", "n*m-2*m+1", "3*((n*m+5)//4)", "((n+1)//2+m)//3", "(2*n-m*m+9)//5", "n*n*m"]
    ranges = {"n": (1, 6), "m": (1, 4)}
    dims = [["n", "m"], *[[sym.canonical(e)] for e in exprs]]
    tops = [[6, 4], *[[max(1, sym.bounds(e, ranges)[1])] for e in exprs]]
    g = load_graph_json({
        "nodes": [{"op": "null", "name": "x", "inputs": []}] + [
            {"op": "tvm_op", "name": f"k{i}", "inputs": [[0, 0, 0]],
             "attrs": {"func_name": "kern", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}
            for i in range(len(exprs))],
        "arg_nodes": [0], "heads": [[i + 1, 0, 0] for i in range(len(exprs))],
        "node_row_ptr": list(range(len(exprs) + 2)),
        "attrs": {"dltype": ["list_str", ["float32"] * len(dims)], "shape": ["list_shape", tops],
                  "storage_id": ["list_int", list(range(len(dims)))], "sym_shape": ["list_sym_shape", dims],
                  "dim_ranges": ["list_dim_range", [[k, lo, hi] for k, (lo, hi) in ranges.items()]]},
    })
    offsets = [sum(len(d) for d in dims[:e]) for e in range(len(dims))]
    lines, fields = model_api._dynamic_tables(g, [("x", 0)], offsets, "t_")
    values = [(n, m) for n in range(1, 7) for m in range(1, 5)]
    main = ["#include <stdio.h>", "int main(void) {", "  int64_t v[64];"]
    for n, m in values:
        main += [f"  {{ const int64_t s[2] = {{{n}, {m}}}; t_eval_dims(s, v);",
                 "    for (int i = 0; i < t_dim_exprs_n; ++i) { printf(\"%lld \", (long long)v[i]); }",
                 "    printf(\"\\n\"); }"]
    main += ["  (void)t_symbols; (void)t_dim_expr; return 0;", "}"]
    src = "\n".join(["#include <kiln/kiln_model_desc.h>", *lines,
                     "static const int t_dim_exprs_n = sizeof t_dim_exprs / sizeof t_dim_exprs[0];", *main])
    c = tmp_path / "eval.c"
    c.write_text(src)
    exe = _cc(str(tmp_path / "eval"), str(c))
    out = _run([exe]).stdout.splitlines()
    texts = re.findall(r'\{"([^"]+)", \d+\},', "\n".join(lines))
    assert texts[:2] == ["n", "m"] and len(texts) == 2 + len(exprs)
    for (n, m), row in zip(values, out):
        want = [sym.evaluate(t, {"n": n, "m": m}) for t in texts]
        assert [int(v) for v in row.split()] == want, (n, m, texts)
    assert fields[0] == "  2, t_symbols,"


# ----------------------------------------------------------------------------- static models
def test_static_model_tables_and_new_functions(driver, tmp_path):
    g = ir.Graph("static")
    x = g.add_input("x", (2, 3))
    g.outputs = [g.add("relu", x)]
    factory = kiln.build(g, target="llvm")
    src = model_api.model_api_source(load_graph_json(factory.get_graph_json()), [])
    assert "  0, NULL,\n  0, NULL, NULL, NULL,\n};" in src and "eval_dims" not in src
    lib = _export(factory, tmp_path, "static.so")
    ses = Session(driver, lib, tmp_path)
    xv = RNG.standard_normal((2, 3)).astype("float32")
    ses.cmd("info")
    ses.set(0, xv, shape=(2, 4))
    ses.set(0, xv)
    ses.cmd("run")
    path = ses.get(0)
    out = ses.go()
    assert "symbols 0" in out and "input 0 'x': (2, 3) upper (2, 3) 24 bytes" in out
    bad = _lines(out, "set")[0]
    assert _status(bad) == 2 and "input 'x': dim 1 is 4, expected 3 (shape (2, 3))" in bad
    np.testing.assert_array_equal(_read(path, _lines(out, "get")[0], np.float32), np.maximum(xv, 0))


def test_every_header_function_is_a_crt_service_not_a_kernel():
    header = open(os.path.join(include_path(), "kiln", "kiln_model.h")).read()
    declared = set(re.findall(r"KILN_DLL\s+[\w\s\*]+?\b(Kiln\w+)\s*\(", header))
    assert declared == model_api.API_FUNCTIONS
    assert declared <= CRT_FUNCTIONS
    assert f"#define KILN_MODEL_API_VERSION {model_api.API_VERSION}" in header


def test_generated_tables_compile_as_c99(attention, tmp_path):
    """kiln_model.c of a dynamic model is plain C99 (export also compiles it for cross targets)."""
    graph = _python(attention).module.graph
    weights = [graph.nodes[n].name for n in graph.arg_nodes if graph.nodes[n].name not in ("x", "mask")]
    src = model_api.model_api_source(graph, weights, "default", None)
    assert "NULL, NULL, NULL" not in src and "KilnFloorDiv" not in src
    path = tmp_path / "kiln_model.c"
    path.write_text(src)
    subprocess.run([*get_cc().split(), "-std=c99", "-pedantic", "-Wall", "-Werror", "-I", include_path(), "-c",
                    str(path), "-o", str(tmp_path / "kiln_model.o")], check=True, capture_output=True, text=True)


# ----------------------------------------------------------------------------- a real model
@pytest.mark.slow
def test_minilm_dynamic_batch_and_sequence_from_c(driver, tmp_path):
    """A MiniLM-sized BERT (transformers, random weights) built once for batch 1..4 x seq 1..64,
    run from C at several shapes on one instance, against ONNX Runtime."""
    import onnx

    ort = pytest.importorskip("onnxruntime")
    from tests.models import real_models

    path = real_models.minilm_dynamic()
    graph, params = kiln.frontend.from_onnx(onnx.load(path), dim_ranges={"batch": (1, 4), "seq": (1, 64)})
    lib = _export(kiln.build(graph, params=params, target="llvm"), tmp_path, "minilm.so")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ses = Session(driver, lib, tmp_path)
    names = [i.name for i in sess.get_inputs()]
    shapes, outs, wants = [(1, 1), (4, 64), (3, 17), (2, 40)], [], []
    for k, (b, s) in enumerate(shapes):
        feeds = real_models.minilm_feeds(b, s, seed=k)
        for i, n in enumerate(names):
            ses.set(i, feeds[n])
        ses.cmd("run")
        outs.append(ses.get(0))
        wants.append(sess.run(None, feeds)[0])
    out = ses.go()
    assert all(_status(line) == 0 for line in out), out
    for p, line, want, shape in zip(outs, _lines(out, "get"), wants, shapes):
        got = _read(p, line, np.float32)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"shape {shape}")


def test_resize_to_runtime_sizes_matches_python(driver, tmp_path):
    """Resizes whose output dims are runtime sizes (``resize2d``'s ``sym_size``, read by the
    kernel from its output's DLTensor): the C API sizes those outputs from the shapes alone,
    as the executor does, and gets the same values at every size."""
    from tests.executor.test_dynamic_spatial import _sizes_model

    graph, params = kiln.frontend.from_onnx(_sizes_model("half_pixel", "linear"),
                                            dim_ranges={"b": (1, 3), "h": (8, 48), "w": (8, 48)})
    lib = _export(kiln.build(graph, target="llvm", params=params), tmp_path, "resize.so")
    py, ses = _python(lib), Session(driver, lib, tmp_path)
    xs = [RNG.standard_normal(s).astype("float32") for s in [(2, 8, 17, 9), (1, 8, 48, 48), (3, 8, 8, 31)]]
    paths = []
    for x in xs:
        ses.set(0, x)
        ses.cmd("run")
        paths.append([ses.get(i) for i in range(4)])
    gets = _lines(ses.go(), "get")
    assert len(gets) == 12
    for k, (x, ps) in enumerate(zip(xs, paths)):
        py.run(x=x)
        for i, path in enumerate(ps):
            np.testing.assert_array_equal(_read(path, gets[4 * k + i], np.float32), py.get_output(i).numpy(),
                                          err_msg=f"output {i} at {x.shape}")
