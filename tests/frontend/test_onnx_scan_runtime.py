"""ONNX ``Scan`` run as a runtime loop: longer than ``MAX_UNROLL`` steps, or over a symbolic axis.

Such a Scan becomes an IR ``loop`` node whose body takes row ``i`` of each scan input; its scan
outputs are stacked by the executor and turned back into a value of the scan length. Models are
built for ``llvm``, exported, loaded back and compared with onnxruntime (at several lengths for a
symbolic axis). Short static Scans stay unrolled. Refused patterns must say why.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.runtime.errors import InputError, UnsupportedOpError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
h = onnx.helper
TP = onnx.TensorProto
F = TP.FLOAT


def _vi(name: str, shape: list | None, dt: int = F) -> Any:
    return h.make_tensor_value_info(name, dt, shape)


def _cumsum_body(d: int = 3, scan_out: str = "s_out") -> Any:
    """s <- s + x_t; the scan output is ``scan_out`` (the new state, or the previous one "s_in")."""
    return h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                         h.make_node("Mul", [scan_out, "two"], ["y_t"])], "body",
                        [_vi("s_in", [d]), _vi("x_t", [d])], [_vi("s_out", [d]), _vi("y_t", [d])],
                        [h.make_tensor("two", F, [], [2.0])])


def _model(nodes: list, inputs: list, outputs: list, opset: int = 16) -> Any:
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs), opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _cumsum_model(length: int | str, in_dir: int = 0, out_dir: int = 0, in_axis: int = 0, out_axis: int = 0,
                  scan_out: str = "s_out", extra: list | None = None, extra_out: list | None = None) -> Any:
    """Scan(s0, x) -> (s, y): a running sum of the rows of x (3 columns), y its rows times 2."""
    xs = [length, 3] if in_axis == 0 else [3, length]
    ys = [length, 3] if out_axis == 0 else [3, length]
    node = h.make_node("Scan", ["s0", "x"], ["s", "y"], body=_cumsum_body(scan_out=scan_out), num_scan_inputs=1,
                       name="scan", scan_input_directions=[in_dir], scan_output_directions=[out_dir],
                       scan_input_axes=[in_axis], scan_output_axes=[out_axis])
    return _model([node] + (extra or []), [_vi("s0", [3]), _vi("x", xs)],
                  [_vi("s", [3]), _vi("y", ys)] + (extra_out or []))


def _compile(model: Any, tmp_path, **kw: Any) -> Any:
    graph, params = kiln.frontend.from_onnx(model, **kw)
    factory = kiln.build(graph, target="llvm", params=params)
    path = os.path.join(str(tmp_path), "model.so")
    factory.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _check(model: Any, gm: Any, feeds: dict) -> None:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    gm.run(**feeds)
    assert gm.get_num_outputs() == len(ref)
    for k, want in enumerate(ref):
        got = gm.get_output(k).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype, (k, got.shape, got.dtype, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"output {k}")


def _ops(model: Any, **kw: Any) -> list[str]:
    graph, _ = kiln.frontend.from_onnx(model, **kw)
    return [n.op for n in graph.nodes]


def _x(rng: Any, length: int, in_axis: int) -> np.ndarray:
    return rng.standard_normal((length, 3) if in_axis == 0 else (3, length)).astype(np.float32)


# ----------------------------------------------------------------------------- long static Scans
@pytest.mark.parametrize("in_dir,out_dir,in_axis,out_axis", [(0, 0, 0, 0), (1, 1, 1, 1)])
def test_long_static_scan(tmp_path, in_dir, out_dir, in_axis, out_axis) -> None:
    """1500 steps (more than MAX_UNROLL): a runtime loop, not 1500 copies of the body."""
    model = _cumsum_model(1500, in_dir, out_dir, in_axis, out_axis)
    assert "loop" in _ops(model)
    gm = _compile(model, tmp_path)
    rng = np.random.default_rng(0)
    _check(model, gm, {"s0": np.ones(3, np.float32), "x": _x(rng, 1500, in_axis)})


def test_short_static_scan_stays_unrolled() -> None:
    assert "loop" not in _ops(_cumsum_model(8))


def test_long_state_only_scan_with_two_inputs(tmp_path) -> None:
    """No scan outputs; two scan inputs on different axes, one reversed: s <- s * 0.5 + a_t * b_t."""
    body = h.make_graph([h.make_node("Mul", ["a_t", "b_t"], ["p"]), h.make_node("Mul", ["s_in", "half"], ["q"]),
                         h.make_node("Add", ["p", "q"], ["s_out"])], "body",
                        [_vi("s_in", [2]), _vi("a_t", [2]), _vi("b_t", [2])], [_vi("s_out", [2])],
                        [h.make_tensor("half", F, [], [0.5])])
    node = h.make_node("Scan", ["s0", "a", "b"], ["s"], body=body, num_scan_inputs=2,
                       scan_input_axes=[0, 1], scan_input_directions=[0, 1])
    model = _model([node], [_vi("s0", [2]), _vi("a", [1100, 2]), _vi("b", [2, 1100])], [_vi("s", [2])])
    gm = _compile(model, tmp_path)
    rng = np.random.default_rng(1)
    _check(model, gm, {"s0": np.zeros(2, np.float32), "a": rng.standard_normal((1100, 2)).astype(np.float32),
                       "b": rng.standard_normal((2, 1100)).astype(np.float32)})


# ----------------------------------------------------------------------------- symbolic scan axis
@pytest.mark.parametrize("in_dir,out_dir,in_axis,out_axis,scan_out", [
    (0, 0, 0, 0, "s_out"), (1, 0, 0, 1, "s_out"), (0, 1, 1, 1, "s_in"), (1, 1, 1, 0, "s_out")])
def test_symbolic_scan_axis(tmp_path, in_dir, out_dir, in_axis, out_axis, scan_out) -> None:
    """The Scan runs over seq in 1..32; its scan output's dim is seq (an Add with x type-checks)."""
    extra = [h.make_node("Add", ["y", "x"], ["z"])] if in_axis == out_axis else []
    extra_out = [_vi("z", [3, "seq"] if in_axis else ["seq", 3])] if extra else []
    model = _cumsum_model("seq", in_dir, out_dir, in_axis, out_axis, scan_out, extra, extra_out)
    graph, _ = kiln.frontend.from_onnx(model, dim_ranges={"seq": (1, 32)})
    assert "seq" in graph.outputs[1].type.dims
    gm = _compile(model, tmp_path, dim_ranges={"seq": (1, 32)})
    rng = np.random.default_rng(2)
    for length in (5, 1, 32, 17):
        _check(model, gm, {"s0": rng.standard_normal(3).astype(np.float32), "x": _x(rng, length, in_axis)})


def test_symbolic_state_only_scan(tmp_path) -> None:
    """No scan outputs: the final running sum only, over a symbolic number of rows."""
    body = h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_out"])], "body",
                        [_vi("s_in", [3]), _vi("x_t", [3])], [_vi("s_out", [3])])
    node = h.make_node("Scan", ["s0", "x"], ["s"], body=body, num_scan_inputs=1, scan_input_directions=[1])
    model = _model([node], [_vi("s0", [3]), _vi("x", ["n", 3])], [_vi("s", [3])])
    gm = _compile(model, tmp_path, dim_ranges={"n": (1, 64)})
    rng = np.random.default_rng(3)
    for length in (64, 3, 1):
        _check(model, gm, {"s0": np.zeros(3, np.float32), "x": _x(rng, length, 0)})


def test_symbolic_scan_reads_a_static_outer_value(tmp_path) -> None:
    """The body reads w (static, from the outer graph): it becomes a captured input of the loop."""
    body = h.make_graph([h.make_node("Mul", ["x_t", "w"], ["p"]), h.make_node("Add", ["s_in", "p"], ["s_out"]),
                         h.make_node("Identity", ["p"], ["y_t"])], "body",
                        [_vi("s_in", [3]), _vi("x_t", [3])], [_vi("s_out", [3]), _vi("y_t", [3])])
    node = h.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1)
    model = _model([node], [_vi("s0", [3]), _vi("x", ["n", 3]), _vi("w", [3])], [_vi("s", [3]), _vi("y", ["n", 3])])
    gm = _compile(model, tmp_path, dim_ranges={"n": (1, 16)})
    rng = np.random.default_rng(4)
    for length in (16, 2):
        _check(model, gm, {"s0": np.zeros(3, np.float32), "x": _x(rng, length, 0),
                           "w": rng.standard_normal(3).astype(np.float32)})


def test_opset8_batched_scan_over_a_symbolic_sequence(tmp_path) -> None:
    """Opset 8: [batch, seq, ...] inputs, no sequence_lens; one runtime loop per batch entry."""
    node = h.make_node("Scan", ["", "s0", "x"], ["s", "y"], body=_cumsum_body(), num_scan_inputs=1, directions=[1])
    model = _model([node], [_vi("s0", [2, 3]), _vi("x", [2, "seq", 3])], [_vi("s", [2, 3]), _vi("y", [2, "seq", 3])],
                   opset=8)
    gm = _compile(model, tmp_path, dim_ranges={"seq": (1, 10)})
    rng = np.random.default_rng(5)
    for length in (4, 1, 10):
        _check(model, gm, {"s0": np.ones((2, 3), np.float32),
                           "x": rng.standard_normal((2, length, 3)).astype(np.float32)})


def _nested_model(with_scan_output: bool) -> Any:
    """A runtime Loop (trip count M, an input) whose body runs a 1500-step Scan over the outer xs."""
    body = _cumsum_body() if with_scan_output else h.make_graph(
        [h.make_node("Add", ["s_in", "x_t"], ["s_out"])], "body", [_vi("s_in", [3]), _vi("x_t", [3])],
        [_vi("s_out", [3])])
    outs = ["c1", "ys"] if with_scan_output else ["c1"]
    scan = h.make_node("Scan", ["c0", "xs"], outs, body=body, num_scan_inputs=1, name="inner")
    loop_body = h.make_graph([scan, h.make_node("Identity", ["cond"], ["cond_out"])], "loop_body",
                             [_vi("i", [], TP.INT64), _vi("cond", [], TP.BOOL), _vi("c0", [3])],
                             [_vi("cond_out", [], TP.BOOL), _vi("c1", [3])])
    loop = h.make_node("Loop", ["M", "", "a0"], ["a"], body=loop_body, name="outer")
    return _model([loop], [_vi("M", [], TP.INT64), _vi("a0", [3]), _vi("xs", [1500, 3])], [_vi("a", [3])])


def test_long_state_only_scan_inside_a_runtime_loop(tmp_path) -> None:
    model = _nested_model(with_scan_output=False)
    gm = _compile(model, tmp_path)
    rng = np.random.default_rng(6)
    xs = rng.standard_normal((1500, 3)).astype(np.float32)
    for m in (0, 2):
        _check(model, gm, {"M": np.array(m, np.int64), "a0": np.zeros(3, np.float32), "xs": xs})


def test_body_reading_a_dynamic_outer_value(tmp_path) -> None:
    """The body reads the whole of ``x`` (dims ``(n, 3)``): the loop body gets ``n`` at run time."""
    body = h.make_graph([h.make_node("ReduceSum", ["x"], ["tot"], keepdims=0),
                         h.make_node("Add", ["s_in", "x_t"], ["a"]), h.make_node("Add", ["a", "tot"], ["s_out"])],
                        "body", [_vi("s_in", [3]), _vi("x_t", [3])], [_vi("s_out", [3])])
    node = h.make_node("Scan", ["s0", "x"], ["s"], body=body, num_scan_inputs=1, name="scan")
    model = _model([node], [_vi("s0", [3]), _vi("x", ["n", 3])], [_vi("s", [3])], opset=11)
    gm = _compile(model, tmp_path, dim_ranges={"n": (1, 16)})
    rng = np.random.default_rng(3)
    for n in (16, 2, 9, 1, 16):
        _check(model, gm, {"s0": np.ones(3, np.float32), "x": rng.standard_normal((n, 3)).astype(np.float32)})


# ----------------------------------------------------------------------------- refused patterns


def test_refused_dynamic_state() -> None:
    body = h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_out"])], "body",
                        [_vi("s_in", ["n"]), _vi("x_t", [])], [_vi("s_out", ["n"])])
    node = h.make_node("Scan", ["s0", "x"], ["s"], body=body, num_scan_inputs=1, name="scan")
    model = _model([node], [_vi("s0", ["n"]), _vi("x", ["n"])], [_vi("s", ["n"])])
    with pytest.raises(UnsupportedOpError, match=r"'scan'.*state 0 has dims \('n',\).*length n is only known "
                                                 r"at run time.*statically shaped states"):
        kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 16)})


def test_refused_symbolic_dim_off_the_scan_axis() -> None:
    node = h.make_node("Scan", ["s0", "x"], ["s", "y"], body=_cumsum_body(), num_scan_inputs=1, name="scan")
    model = _model([node], [_vi("s0", [3]), _vi("x", ["n", "b"])], [_vi("s", [3]), _vi("y", ["n", 3])])
    with pytest.raises(UnsupportedOpError, match=r"'scan'.*scan input 0 has dims \('n', 'b'\).*symbolic dim on "
                                                 r"the scan axis 0 only"):
        kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 16), "b": (3, 3)})


def test_refused_lengths_that_differ() -> None:
    body = h.make_graph([h.make_node("Add", ["a_t", "b_t"], ["p"]), h.make_node("Add", ["s_in", "p"], ["s_out"])],
                        "body", [_vi("s_in", [3]), _vi("a_t", [3]), _vi("b_t", [3])], [_vi("s_out", [3])])
    node = h.make_node("Scan", ["s0", "a", "b"], ["s"], body=body, num_scan_inputs=2, name="scan")
    model = _model([node], [_vi("s0", [3]), _vi("a", ["n", 3]), _vi("b", [4, 3])], [_vi("s", [3])])
    with pytest.raises(InputError, match=r"'scan'.*different lengths along their scan axes: \['4', 'n'\]"):
        kiln.frontend.from_onnx(model, dim_ranges={"n": (1, 16)})


def test_refused_long_scan_with_scan_outputs_inside_a_runtime_loop() -> None:
    """A runtime Loop's body must have static shapes: a Scan stacking rows at run time there is refused."""
    with pytest.raises(UnsupportedOpError, match=r"'inner'.*it runs 1500 iterations, more than the 1024 Kiln "
                                                 r"unrolls.*1 scan output\(s\) inside a runtime If / Loop subgraph"):
        kiln.frontend.from_onnx(_nested_model(with_scan_output=True))


def test_refused_scan_over_a_length_that_may_be_zero() -> None:
    """A data-dependent length (here NonZero's count, 0..20) may be 0."""
    body = h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_out"])], "body",
                        [_vi("s_in", [], TP.INT64), _vi("x_t", [], TP.INT64)], [_vi("s_out", [], TP.INT64)])
    nodes = [h.make_node("NonZero", ["v"], ["nz"]), h.make_node("Reshape", ["nz", "flat"], ["idx"]),
             h.make_node("Scan", ["s0", "idx"], ["s"], body=body, num_scan_inputs=1, name="scan")]
    g = h.make_graph(nodes, "g", [_vi("v", [20]), _vi("s0", [], TP.INT64)], [_vi("s", [], TP.INT64)],
                     [h.make_tensor("flat", TP.INT64, [1], [-1])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 16)])
    with pytest.raises(UnsupportedOpError, match=r"'scan'.*runs over nonzero_0, which may be 0 \(range 0\.\.20\).*"
                                                 r"at least 1"):
        kiln.frontend.from_onnx(model)


def test_refused_scan_outputs_larger_than_the_planning_limit() -> None:
    """5000 rows of 256 KiB: more than RUNTIME_LOOP_MAX_SCAN_BYTES, so the loop could not plan them all."""
    d = 65536
    body = h.make_graph([h.make_node("Add", ["s_in", "x_t"], ["s_out"]), h.make_node("Identity", ["s_out"], ["y_t"])],
                        "body", [_vi("s_in", [d]), _vi("x_t", [d])], [_vi("s_out", [d]), _vi("y_t", [d])])
    node = h.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1, name="scan")
    model = _model([node], [_vi("s0", [d]), _vi("x", [5000, d])], [_vi("s", [d]), _vi("y", [5000, d])])
    with pytest.raises(UnsupportedOpError, match=r"'scan'.*would need 5000 rows of 262144 bytes, more than "
                                                 r"RUNTIME_LOOP_MAX_SCAN_BYTES"):
        kiln.frontend.from_onnx(model)


@pytest.mark.parametrize("x_dims,seq_lens,match", [
    (["b", "seq", 3], False, r"symbolic batch axis b.*batch must be static"),
    ([2, "seq", 3], True, r"sequence_lens with a symbolic sequence axis \['seq'\].*omit it")])
def test_refused_opset8_forms(x_dims, seq_lens, match) -> None:
    node = h.make_node("Scan", ["lens" if seq_lens else "", "s0", "x"], ["s", "y"], body=_cumsum_body(),
                       num_scan_inputs=1, name="scan")
    inputs = [_vi("s0", [x_dims[0], 3]), _vi("x", x_dims)] + ([_vi("lens", [2], TP.INT64)] if seq_lens else [])
    model = _model([node], inputs, [_vi("s", [x_dims[0], 3]), _vi("y", x_dims)], opset=8)
    with pytest.raises(UnsupportedOpError, match=r"'scan'.*" + match):
        kiln.frontend.from_onnx(model, dim_ranges={d: (1, 8) for d in x_dims if isinstance(d, str)})
