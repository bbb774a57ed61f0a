"""ONNX sequences whose length is decided at run time (a runtime ``Loop`` appending to them).

Each model takes its trip count ``M`` as a graph input; the sequence the loop builds becomes a
stacked ``[T, *elem]`` tensor (a scan output of the IR ``loop`` node). The models are built for
``llvm``, exported, loaded back and run at several ``M`` (0 included); every output is compared
with onnxruntime. Refused patterns must say why.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.runtime.errors import InputError, KernelError, UnsupportedOpError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
h = onnx.helper
TP = onnx.TensorProto
F = TP.FLOAT


def _vi(name: str, shape: list | None, dt: int = F) -> Any:
    return h.make_tensor_value_info(name, dt, shape)


def _seq_vi(name: str, dt: int = F) -> Any:
    return h.make_value_info(name, h.make_sequence_type_proto(h.make_tensor_type_proto(dt, None)))


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> Any:
    g = h.make_graph(nodes, "g", inputs, outputs, inits or [])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _body(insert: str = "end", extra: list | None = None, extra_outputs: list | None = None) -> Any:
    """s <- s with x * (i + 1) appended (x, shape (2, 3), from the outer scope); y <- y + x.

    ``insert``: "end" (no position), "length" (at SequenceLength(s)), "front" (at position 0).
    """
    nodes = [
        h.make_node("Cast", ["i"], ["fi"], to=F),
        h.make_node("Add", ["fi", "one"], ["fi1"]),
        h.make_node("Mul", ["x", "fi1"], ["elem"]),
        h.make_node("Add", ["y_in", "x"], ["y_out"]),
        h.make_node("Identity", ["c_in"], ["c_out"]),
    ] + (extra or [])
    if insert == "end":
        nodes.append(h.make_node("SequenceInsert", ["s_in", "elem"], ["s_out"]))
    elif insert == "length":
        nodes += [h.make_node("SequenceLength", ["s_in"], ["n"]),
                  h.make_node("SequenceInsert", ["s_in", "elem", "n"], ["s_out"])]
    elif insert == "front":
        nodes += [h.make_node("SequenceInsert", ["s_in", "elem", "zero"], ["s_out"])]
    inits = [h.make_tensor("one", F, [], [1.0]), h.make_tensor("zero", TP.INT64, [], [0])]
    return h.make_graph(nodes, "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("y_in", [2, 3]),
                                        _seq_vi("s_in")],
                        [_vi("c_out", [], TP.BOOL), _vi("y_out", [2, 3]), _seq_vi("s_out")] + (extra_outputs or []),
                        inits)


def _seq_model(consumers: list, outputs: list, prefix: int = 0, body: Any = None, cond: str = "") -> Any:
    """``Loop(M)`` building sequence ``s`` (after ``prefix`` constant elements), then ``consumers``."""
    nodes = [h.make_node("SequenceEmpty", [], ["s0"], dtype=F)]
    s = "s0"
    for k in range(prefix):
        nodes += [h.make_node("Constant", [], [f"p{k}"],
                              value=h.make_tensor(f"p{k}v", F, [2, 3], list(np.arange(6) - 10.0 * (k + 1)))),
                  h.make_node("SequenceInsert", [s, f"p{k}"], [f"s0_{k}"])]
        s = f"s0_{k}"
    nodes.append(h.make_node("Loop", ["M", cond, "y0", s], ["y", "s"], body=body or _body(), name="seqloop"))
    inputs = [_vi("M", [], TP.INT64), _vi("y0", [2, 3]), _vi("x", [2, 3])]
    if cond:
        inputs.append(_vi(cond, [], TP.BOOL))
    return _model(nodes + consumers, inputs, [_vi("y", [2, 3])] + outputs)


def _compile(model: Any, tmp_path, **kw: Any) -> Any:
    graph, params = kiln.frontend.from_onnx(model, **kw)
    factory = kiln.build(graph, target="llvm", params=params)
    path = os.path.join(str(tmp_path), "model.so")
    factory.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _np(v: Any) -> Any:
    if isinstance(v, list):
        return [_np(x) for x in v]
    return v.numpy() if hasattr(v, "numpy") else np.asarray(v)


def _same(got: Any, want: Any, what: str) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (what, len(got) if isinstance(got, list) else got)
        for k, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{what}[{k}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=what)


def _check(model: Any, gm: Any, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)
    gm.run(**feeds)
    assert gm.get_num_outputs() == len(ref)
    for k, r in enumerate(ref):
        _same(_np(gm.get_output(k)), r, f"output {k}")
    return ref


def _feeds(m: int) -> dict:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4 - 0.5
    return {"M": np.array(m, np.int64), "y0": np.ones((2, 3), np.float32), "x": x}


# ----------------------------------------------------------------------------- supported patterns
@pytest.mark.parametrize("insert", ["end", "length"])
def test_sequence_output_and_consumers(tmp_path, insert) -> None:
    consumers = [h.make_node("SequenceLength", ["s"], ["n"]),
                 h.make_node("ConcatFromSequence", ["s"], ["cat0"], axis=0),
                 h.make_node("ConcatFromSequence", ["s"], ["cat1"], axis=1),
                 h.make_node("ConcatFromSequence", ["s"], ["stk0"], axis=0, new_axis=1),
                 h.make_node("ConcatFromSequence", ["s"], ["stk2"], axis=-1, new_axis=1)]
    model = _seq_model(consumers, [_seq_vi("s"), _vi("n", [], TP.INT64), _vi("cat0", None), _vi("cat1", None),
                                   _vi("stk0", None), _vi("stk2", None)], body=_body(insert))
    gm = _compile(model, tmp_path)
    for m in (3, 1, 5, 2):
        ref = _check(model, gm, _feeds(m))
        assert len(ref[1]) == m and ref[2] == m


def test_zero_iterations(tmp_path) -> None:
    """M = 0: an empty sequence, length 0 (ONNX Runtime refuses ConcatFromSequence of an empty
    sequence, so that consumer is checked at M >= 1 above)."""
    consumers = [h.make_node("SequenceLength", ["s"], ["n"])]
    model = _seq_model(consumers, [_seq_vi("s"), _vi("n", [], TP.INT64)])
    gm = _compile(model, tmp_path)
    for m in (0, 4, 0, 1):
        _check(model, gm, _feeds(m))
    gm.run(**_feeds(0))
    assert gm.get_output(1) == [] and int(gm.get_output(2).numpy()) == 0


def test_static_prefix(tmp_path) -> None:
    """The loop starts from two constant elements: they come first."""
    consumers = [h.make_node("SequenceLength", ["s"], ["n"]),
                 h.make_node("ConcatFromSequence", ["s"], ["cat0"], axis=0)]
    model = _seq_model(consumers, [_seq_vi("s"), _vi("n", [], TP.INT64), _vi("cat0", None)], prefix=2,
                       body=_body("length"))
    gm = _compile(model, tmp_path)
    for m in (0, 3, 1):
        ref = _check(model, gm, _feeds(m))
        assert ref[2] == m + 2


def test_sequence_at(tmp_path) -> None:
    """SequenceAt with constant (positive, negative) and runtime positions; an index past the
    runtime length is a run-time error."""
    consumers = [h.make_node("Constant", [], ["c1"], value=h.make_tensor("c1v", TP.INT64, [], [1])),
                 h.make_node("Constant", [], ["cm1"], value=h.make_tensor("cm1v", TP.INT64, [], [-1])),
                 h.make_node("SequenceAt", ["s", "c1"], ["a1"]),
                 h.make_node("SequenceAt", ["s", "cm1"], ["am1"]),
                 h.make_node("SequenceAt", ["s", "pos"], ["ap"])]
    model = _seq_model(consumers, [_vi("a1", [2, 3]), _vi("am1", [2, 3]), _vi("ap", [2, 3])])
    model.graph.input.append(_vi("pos", [], TP.INT32))
    gm = _compile(model, tmp_path)
    for m, pos in ((3, 0), (2, -2), (5, 4), (4, -1)):
        _check(model, gm, dict(_feeds(m), pos=np.array(pos, np.int32)))
    with pytest.raises(KernelError, match="take"):
        gm.run(**_feeds(3), pos=np.array(3, np.int32))
    with pytest.raises(KernelError, match="take"):
        gm.run(**_feeds(1), pos=np.array(0, np.int32))  # SequenceAt(s, 1) is out of range
    _check(model, gm, dict(_feeds(2), pos=np.array(1, np.int32)))  # still usable


def test_runtime_condition_and_later_append(tmp_path) -> None:
    """A runtime condition (M known at import bounds the length), then one more element appended
    after the loop."""
    consumers = [h.make_node("SequenceInsert", ["s", "x"], ["s2"]),
                 h.make_node("SequenceLength", ["s2"], ["n"])]
    model = _seq_model(consumers, [_seq_vi("s2"), _vi("n", [], TP.INT64)], cond="go")
    model.graph.input.pop(0)
    model.graph.initializer.append(h.make_tensor("M", TP.INT64, [], [6]))
    graph, _ = kiln.frontend.from_onnx(model)
    (loop,) = [n for n in graph.nodes if n.op == "loop"]
    assert loop.attrs["max_iterations"] == 6
    gm = _compile(model, tmp_path)
    for go in (True, False):
        feeds = _feeds(0)
        del feeds["M"]
        _check(model, gm, dict(feeds, go=np.array(go)))


def test_sequence_and_scan_outputs_together(tmp_path) -> None:
    """The loop also has an ONNX scan output (stacked like the sequence)."""
    extra = [h.make_node("Identity", ["fi"], ["fi_scan"])]
    body = _body(extra=extra, extra_outputs=[_vi("fi_scan", [])])
    nodes = [h.make_node("SequenceEmpty", [], ["s0"], dtype=F),
             h.make_node("Loop", ["M", "", "y0", "s0"], ["y", "s", "fis"], body=body),
             h.make_node("ConcatFromSequence", ["s"], ["cat"], axis=0, new_axis=1)]
    model = _model(nodes, [_vi("M", [], TP.INT64), _vi("y0", [2, 3]), _vi("x", [2, 3])],
                   [_vi("y", [2, 3]), _seq_vi("s"), _vi("fis", None), _vi("cat", None)])
    gm = _compile(model, tmp_path)
    for m in (2, 0, 3):
        if m == 0:
            gm.run(**_feeds(0))
            assert gm.get_output(1) == [] and gm.get_output(2).numpy().shape == (0,)
            continue
        _check(model, gm, _feeds(m))


def test_inspect_and_layout(tmp_path) -> None:
    model = _seq_model([], [_seq_vi("s")])
    graph, _ = kiln.frontend.from_onnx(model)
    lay = graph.value_layouts["outputs"][1]
    assert lay["kind"] == "sequence" and "items" not in lay and lay["stacked"]["kind"] == "tensor"
    gm = _compile(model, tmp_path)
    from kiln.runtime.sequences import describe_values

    desc = describe_values(gm.module.graph)
    assert desc is not None and desc["outputs"][1]["type"] == "sequence<float32>[?]"


# ----------------------------------------------------------------------------- refused patterns
def _refused(body: Any, match: str, prefix: int = 0) -> None:
    with pytest.raises(UnsupportedOpError, match=match):
        kiln.frontend.from_onnx(_seq_model([], [_seq_vi("s")], prefix=prefix, body=body))


def test_refused_insert_at_front() -> None:
    _refused(_body("front"), r"seqloop.*decided at run time.*at a position that is not its length")


def test_refused_reading_the_sequence_in_the_body() -> None:
    extra = [h.make_node("SequenceAt", ["s_in", "zero"], ["first"])]
    _refused(_body(extra=extra, extra_outputs=[_vi("first", [2, 3])]),
             r"seqloop.*reads the loop-carried sequence 's_in' in another way")


def test_refused_ragged_elements() -> None:
    """Elements whose shape differs from the initial ones (here a (3,) element after (2, 3) ones)."""
    body = _body(extra=[h.make_node("ReduceSum", ["x", "ax0"], ["row"], keepdims=0)])
    body.initializer.append(h.make_tensor("ax0", TP.INT64, [1], [0]))
    (insert,) = [n for n in body.node if n.op_type == "SequenceInsert"]
    insert.input[1] = "row"
    _refused(body, r"seqloop.*appends elements of dims \(3,\).*initial elements are \(2, 3\)", prefix=1)


def test_refused_growing_a_runtime_length_sequence_in_another_runtime_loop() -> None:
    body2 = _body()
    consumers = [h.make_node("Loop", ["M", "", "y", "s"], ["y2", "s2"], body=body2, name="second")]
    with pytest.raises(UnsupportedOpError, match=r"'second'.*starts as a sequence<float32> of runtime length"):
        kiln.frontend.from_onnx(_seq_model(consumers, [_seq_vi("s2")]))


def test_refused_reading_the_sequence_in_a_nested_runtime_subgraph() -> None:
    """The body passes the sequence into a runtime If: subgraphs run at run time take tensors."""
    then_g = h.make_graph([h.make_node("SequenceLength", ["s_in"], ["n1"])], "then", [], [_vi("n1", [], TP.INT64)])
    else_g = h.make_graph([h.make_node("Identity", ["zero"], ["n2"])], "else", [], [_vi("n2", [], TP.INT64)])
    extra = [h.make_node("If", ["c_in"], ["n"], then_branch=then_g, else_branch=else_g)]
    _refused(_body(extra=extra, extra_outputs=[_vi("n", [], TP.INT64)]),
             r"reads the sequence / optional 's_in' of the outer graph")


def test_refused_ops_on_a_runtime_length_sequence() -> None:
    consumers = [h.make_node("SequenceErase", ["s"], ["s2"])]
    with pytest.raises(UnsupportedOpError, match=r"SequenceErase.*runtime length loop_0.*Kiln supports SequenceLength"):
        kiln.frontend.from_onnx(_seq_model(consumers, [_seq_vi("s2")]))
    consumers = [h.make_node("SequenceInsert", ["s", "x", "pos"], ["s2"])]
    model = _seq_model(consumers, [_seq_vi("s2")])
    model.graph.input.append(_vi("pos", [], TP.INT64))
    with pytest.raises(UnsupportedOpError, match=r"SequenceInsert.*inserting at a position"):
        kiln.frontend.from_onnx(model)


def test_malformed_stacked_layouts_are_format_errors() -> None:
    from kiln.runtime.errors import FormatError
    from kiln.runtime.sequences import ValueLayouts

    obj = {"inputs": {}, "outputs": [{"kind": "sequence", "elem_dtype": "float32",
                                      "stacked": {"kind": "sequence", "elem_dtype": "float32", "items": []}}]}
    with pytest.raises(FormatError, match="stacked must be a tensor"):
        ValueLayouts(obj, [], 0)
    obj = {"inputs": {}, "outputs": [{"kind": "sequence", "elem_dtype": "float32"}]}
    with pytest.raises(FormatError, match="needs 'items'.*or 'stacked'"):
        ValueLayouts(obj, [], 0)


# ----------------------------------------------------------------------------- runtime-length inputs
def _input_model() -> Any:
    nodes = [h.make_node("SequenceLength", ["xs"], ["n"]),
             h.make_node("ConcatFromSequence", ["xs"], ["cat"], axis=0),
             h.make_node("ConcatFromSequence", ["xs"], ["stk"], axis=1, new_axis=1),
             h.make_node("Constant", [], ["cm1"], value=h.make_tensor("cm1v", TP.INT64, [], [-1])),
             h.make_node("SequenceAt", ["xs", "cm1"], ["last"]),
             h.make_node("Identity", ["xs"], ["ys"])]
    return _model(nodes, [_seq_vi("xs")], [_vi("n", [], TP.INT64), _vi("cat", None), _vi("stk", None),
                                          _vi("last", None), _seq_vi("ys")])


def test_runtime_length_input(tmp_path) -> None:
    """shape={"xs": ("n", 3)}: a sequence of n elements of shape (3,), n in dim_ranges."""
    model = _input_model()
    gm = _compile(model, tmp_path, shape={"xs": ("n", 3)}, dim_ranges={"n": (1, 8)})
    rng = np.random.default_rng(0)
    for n in (3, 1, 8, 2):
        xs = [rng.standard_normal(3).astype(np.float32) for _ in range(n)]
        _check(model, gm, {"xs": xs})
    with pytest.raises(InputError, match=r"'xs'.*element 1 has shape \(4,\)"):
        gm.set_input("xs", [np.zeros(3, np.float32), np.zeros(4, np.float32)])
    with pytest.raises(InputError, match="xs"):
        gm.set_input("xs", [np.zeros(3, np.float32)] * 9)  # past the range of n
    from kiln.runtime.sequences import describe_values

    desc = describe_values(gm.module.graph)
    assert desc is not None and desc["inputs"] == {"xs": "sequence<float32>[?]"}


def test_runtime_length_input_needs_a_range() -> None:
    with pytest.raises(InputError, match=r"dim_ranges=\{'n'"):
        kiln.frontend.from_onnx(_input_model(), shape={"xs": ("n", 3)})
    with pytest.raises(InputError, match="element dims after it must be non-negative ints"):
        kiln.frontend.from_onnx(_input_model(), shape={"xs": ("n", "m")}, dim_ranges={"n": (1, 4)})


def test_scalar_elements_appended_from_a_body_input(tmp_path) -> None:
    """The body appends its iteration number (a body input, 0-d int64); no other loop output."""
    body = h.make_graph([h.make_node("Identity", ["c_in"], ["c_out"]),
                         h.make_node("SequenceInsert", ["s_in", "i"], ["s_out"])],
                        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _seq_vi("s_in", TP.INT64)],
                        [_vi("c_out", [], TP.BOOL), _seq_vi("s_out", TP.INT64)])
    nodes = [h.make_node("SequenceEmpty", [], ["s0"], dtype=TP.INT64),
             h.make_node("Loop", ["M", "", "s0"], ["s"], body=body),
             h.make_node("ConcatFromSequence", ["s"], ["stk"], axis=0, new_axis=1),
             h.make_node("SequenceLength", ["s"], ["n"])]
    model = _model(nodes, [_vi("M", [], TP.INT64)],
                   [_seq_vi("s", TP.INT64), _vi("stk", None, TP.INT64), _vi("n", [], TP.INT64)])
    gm = _compile(model, tmp_path)
    for m in (4, 1, 6):
        _check(model, gm, {"M": np.array(m, np.int64)})
    gm.run(M=np.array(0, np.int64))
    assert gm.get_output(0) == [] and gm.get_output(1).numpy().shape == (0,)
