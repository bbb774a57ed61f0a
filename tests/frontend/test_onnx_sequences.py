"""ONNX sequences and optionals (structure fixed at compile time): converted, built, run and
compared with ONNX Runtime; the GraphModule list / None API; export and load in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime.errors import InputError, UnsupportedOpError
from tests.frontend.onnx_check import assert_close, run_ort

F = TensorProto.FLOAT
SEQ_F = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))


def _model(nodes, inputs, outputs, opset: int = 18) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "seq", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _seq_vi(name: str, elem=F) -> onnx.ValueInfoProto:
    return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, None)))


def _build(model, **kw):
    graph, params = kiln.frontend.from_onnx(model, **kw)
    return kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))


def _np(v):
    return [x.numpy() for x in v] if isinstance(v, list) else (None if v is None else v.numpy())


def _assert_same(got, want, what=""):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{what}: {got!r} vs {want!r}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, what=f"{what}[{k}]")
    else:
        assert_close(got, want, what=what)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- sequence ops
def _ops_model():
    """insert / erase / at / length / concat on a runtime sequence of ragged elements."""
    nodes = [
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [], [1])),
        helper.make_node("Constant", [], ["neg"], value=helper.make_tensor("neg", TensorProto.INT64, [], [-1])),
        helper.make_node("SequenceInsert", ["xs", "t", "one"], ["s1"]),
        helper.make_node("SequenceErase", ["s1", "neg"], ["s2"]),
        helper.make_node("SequenceAt", ["s2", "one"], ["at1"]),
        helper.make_node("SequenceLength", ["s2"], ["n"]),
        helper.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
        helper.make_node("Relu", ["at1"], ["r"]),
    ]
    ins = [_seq_vi("xs"), helper.make_tensor_value_info("t", F, [2, 3])]
    outs = [
        _seq_vi("s2"),
        helper.make_tensor_value_info("r", F, ["r0", "r1"]),
        helper.make_tensor_value_info("n", TensorProto.INT64, []),
        helper.make_tensor_value_info("cat", F, ["c0", 3]),
    ]
    return _model(nodes, ins, outs)


def test_sequence_ops_match_ort():
    model = _ops_model()
    xs = [_rand(1, 3, seed=1), _rand(4, 3, seed=2), _rand(2, 3, seed=3)]
    t = _rand(2, 3, seed=4)
    want = run_ort(model, {"xs": xs, "t": t})
    m = _build(model, shape={"xs": [x.shape for x in xs]})
    m.set_input("xs", xs)
    m.set_input("t", t)
    m.run()
    assert m.get_num_outputs() == 4
    got = [_np(m.get_output(i)) for i in range(4)]
    for i, (g, w) in enumerate(zip(got, want)):
        _assert_same(g, w, f"output {i}")
    # the same module, other element values: elements are runtime data, not constants
    xs2 = [x + 1 for x in xs]
    m.run(xs=xs2, t=t)
    _assert_same(_np(m.get_output(0)), run_ort(model, {"xs": xs2, "t": t})[0])


@pytest.mark.parametrize("split,keepdims", [(None, 1), (None, 0), (2, 1), ([1, 3], 1)])
def test_split_to_sequence_matches_ort(split, keepdims):
    x = _rand(4, 3)
    inits = []
    ins = ["x"]
    if split is not None:
        arr = np.array(split, np.int64)
        inits = [onnx.numpy_helper.from_array(arr, "split")]
        ins.append("split")
    node = helper.make_node("SplitToSequence", ins, ["seq"], axis=0, keepdims=keepdims)
    g = helper.make_graph(
        [node], "s", [helper.make_tensor_value_info("x", F, [4, 3])], [_seq_vi("seq")], initializer=inits
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    want = run_ort(model, {"x": x})[0]
    m = _build(model)
    m.run(x=x)
    _assert_same(_np(m.get_output(0)), want)


@pytest.mark.parametrize("n,axis,new_axis", [(1, 0, 0), (1, -1, 1), (3, 1, 1), (3, -1, 0)])
def test_construct_and_concat_from_sequence_match_ort(n, axis, new_axis):
    names = [f"a{k}" for k in range(n)]
    nodes = [
        helper.make_node("SequenceConstruct", names, ["s"]),
        helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis),
    ]
    feeds = {nm: _rand(2, 3, seed=k) for k, nm in enumerate(names)}
    ins = [helper.make_tensor_value_info(nm, F, [2, 3]) for nm in names]
    model = _model(nodes, ins, [helper.make_tensor_value_info("y", F, None)])
    m = _build(model)
    m.run(**feeds)
    assert_close(m.get_output(0).numpy(), run_ort(model, feeds)[0])


def test_sequence_map_over_ragged_elements():
    """The body is converted once per element: each copy sees its own element shape."""
    body = helper.make_graph(
        [helper.make_node("Add", ["e", "b"], ["o"]), helper.make_node("Shape", ["e"], ["shp"])],
        "body",
        [helper.make_tensor_value_info("e", F, None), helper.make_tensor_value_info("b", F, [3])],
        [helper.make_tensor_value_info("o", F, None), helper.make_tensor_value_info("shp", TensorProto.INT64, None)],
    )
    node = helper.make_node("SequenceMap", ["xs", "b"], ["ys", "shapes"], body=body)
    model = _model(
        [node],
        [_seq_vi("xs"), helper.make_tensor_value_info("b", F, [3])],
        [_seq_vi("ys"), _seq_vi("shapes", TensorProto.INT64)],
    )
    xs = [_rand(2, 3, seed=1), _rand(5, 3, seed=2)]
    b = _rand(3, seed=3)
    want = run_ort(model, {"xs": xs, "b": b})
    m = _build(model, shape={"xs": [(2, 3), (5, 3)]})
    m.run(xs=xs, b=b)
    for i in range(2):
        _assert_same(_np(m.get_output(i)), want[i], f"output {i}")


# ----------------------------------------------------------------------------- control flow
def _if_model(else_len: int = 1):
    def branch(name, vals):
        nodes = [helper.make_node("Mul", ["x", f"{name}_k"], [f"{name}_y"])]
        nodes.insert(
            0, helper.make_node("Constant", [], [f"{name}_k"], value=helper.make_tensor(f"{name}_k", F, [], [vals]))
        )
        nodes.append(
            helper.make_node(
                "SequenceConstruct", [f"{name}_y"] * else_len if name == "e" else [f"{name}_y"], [f"{name}_out"]
            )
        )
        return helper.make_graph(nodes, name, [], [_seq_vi(f"{name}_out")])

    node = helper.make_node("If", ["c"], ["res"], then_branch=branch("t", 2.0), else_branch=branch("e", -1.0))
    return _model(
        [node],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F, [3])],
        [_seq_vi("res")],
    )


def test_runtime_if_returning_a_sequence():
    model = _if_model()
    x = _rand(3)
    graph, params = kiln.frontend.from_onnx(model)
    assert [n.op for n in graph.nodes].count("if") == 1  # decided at run time, not frozen
    m = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    for c in (True, False):
        m.run(c=np.array(c), x=x)
        _assert_same(_np(m.get_output(0)), run_ort(model, {"c": np.array(c), "x": x})[0], f"cond={c}")


def test_runtime_if_with_branches_of_different_lengths_asks_for_a_constant():
    with pytest.raises(UnsupportedOpError, match="known at compile time"):
        kiln.frontend.from_onnx(_if_model(else_len=2))
    # frozen, the chosen branch is inlined
    m = _build(_if_model(else_len=2), freeze={"c": np.array(False)})
    x = _rand(3)
    m.run(x=x)
    _assert_same(_np(m.get_output(0)), [-x, -x])


def _loop_model():
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("SequenceInsert", ["s_in", "xi"], ["s_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            _seq_vi("s_in"),
        ],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _seq_vi("s_out")],
    )
    nodes = [
        helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
        helper.make_node("Loop", ["m", "", "s0"], ["res"], body=body),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("m", TensorProto.INT64, []), helper.make_tensor_value_info("x", F, [2])],
        [_seq_vi("res")],
    )


def test_loop_carrying_a_sequence_is_unrolled():
    x = _rand(2)
    m = _build(_loop_model(), freeze={"m": np.array(3, np.int64)})
    m.run(x=x)
    _assert_same(_np(m.get_output(0)), [x * 0, x * 1, x * 2])


def test_loop_carrying_a_sequence_with_a_runtime_trip_count():
    """Not unrolled: the appended elements are stacked at run time (more in
    test_onnx_sequence_runtime.py)."""
    x = _rand(2)
    m = _build(_loop_model())
    for n in (3, 0, 1):
        m.run(x=x, m=np.array(n, np.int64))
        _assert_same(_np(m.get_output(0)), [x * k for k in range(n)])


# ----------------------------------------------------------------------------- optionals
def _opt_model(elem_tp):
    opt = helper.make_optional_type_proto(elem_tp)
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]), helper.make_node("Identity", ["o"], ["o2"])]
    return _model(
        nodes,
        [helper.make_value_info("o", opt)],
        [helper.make_tensor_value_info("has", TensorProto.BOOL, []), helper.make_value_info("o2", opt)],
    )


def test_optional_inputs_and_outputs():
    tensor_tp = helper.make_tensor_type_proto(F, [2])
    x = _rand(2)
    m = _build(_opt_model(tensor_tp), shape={"o": (2,)})
    m.run(o=x)
    assert bool(m.get_output(0).numpy()) is True
    assert_close(m.get_output(1).numpy(), x)
    with pytest.raises(InputError, match="'o'.*present value"):
        m.set_input("o", None)
    absent = _build(_opt_model(tensor_tp), freeze={"o": None})
    absent.set_input("o", None)
    absent.run()
    assert bool(absent.get_output(0).numpy()) is False
    assert absent.get_output(1) is None
    with pytest.raises(InputError, match="absent optional"):
        absent.set_input("o", x)
    seq = _build(_opt_model(SEQ_F), shape={"o": [(1,), (3,)]})
    seq.run(o=[x[:1], _rand(3)])
    got = seq.get_output(1)
    assert isinstance(got, list) and [a.shape for a in got] == [(1,), (3,)]


# ----------------------------------------------------------------------------- user errors
def test_set_input_refuses_wrong_structures():
    m = _build(_ops_model(), shape={"xs": [(1, 3), (4, 3)]})
    good = [_rand(1, 3), _rand(4, 3)]
    with pytest.raises(InputError, match=r"input 'xs' \(sequence<float32>\[2\]\).*list of 2"):
        m.set_input("xs", _rand(1, 3))
    with pytest.raises(InputError, match="'xs'.*got 3"):
        m.set_input("xs", good + [good[0]])
    with pytest.raises(InputError, match=r"'xs'.*element 1 has shape \(3, 3\)"):
        m.set_input("xs", [good[0], _rand(3, 3)])
    with pytest.raises(InputError, match="element 0 .*dtype float64"):
        m.set_input("xs", [good[0].astype(np.float64), good[1]])
    m.run(xs=good, t=_rand(2, 3))
    with pytest.raises(InputError, match="out= is for tensor outputs"):
        m.get_output(0, out=np.zeros((1, 3), np.float32))
    with pytest.raises(InputError, match="out of range"):
        m.get_output(4)


def test_from_onnx_errors_name_the_input_and_node():
    with pytest.raises(InputError, match="'xs' is a sequence: pass shape="):
        kiln.frontend.from_onnx(_ops_model())
    bad = _ops_model()
    bad.graph.node[0].attribute[0].t.int64_data[:] = [7]
    with pytest.raises(InputError, match="position 7 is out of range"):
        kiln.frontend.from_onnx(bad, shape={"xs": [(1, 3)]})


def test_none_for_a_tensor_input_is_refused():
    from kiln.frontend.onnx_backend import KilnBackend

    with pytest.raises(InputError, match="'t', a tensor; only an optional input may be absent"):
        kiln.frontend.from_onnx(_ops_model(), shape={"xs": [(1, 3)]}, freeze={"t": None})
    with pytest.raises(InputError, match="'t', a tensor"):
        KilnBackend.prepare(_ops_model(), "CPU").run({"xs": [_rand(1, 3)], "t": None})


def test_backend_compiles_once_per_structure():
    from kiln.frontend.onnx_backend import KilnBackend

    rep = KilnBackend.prepare(_ops_model(), "CPU")
    t = _rand(2, 3)
    for xs in ([_rand(1, 3), _rand(2, 3)], [_rand(1, 3, seed=3), _rand(2, 3, seed=4)], [_rand(5, 3)] * 3):
        got = rep.run({"xs": xs, "t": t})
        for g, w in zip(got, run_ort(_ops_model(), {"xs": xs, "t": t})):
            _assert_same(g, w)
    assert rep.compile_count == 2


# ----------------------------------------------------------------------------- export, C API, inspect
def test_exported_library_runs_in_a_fresh_process(tmp_path):
    graph, params = kiln.frontend.from_onnx(_ops_model(), shape={"xs": [(1, 3), (4, 3)]})
    path = str(tmp_path / "seq.so")
    kiln.build(graph, target="llvm", params=params).export_library(path)
    xs = [_rand(1, 3, seed=7), _rand(4, 3, seed=8)]
    t = _rand(2, 3, seed=9)
    np.savez(tmp_path / "in.npz", x0=xs[0], x1=xs[1], t=t)
    script = (
        "import json, sys, numpy as np, kiln.runtime as rt\n"
        "from kiln.runtime.graph_executor import GraphModule\n"
        f"d = np.load({str(tmp_path / 'in.npz')!r})\n"
        f"m = GraphModule(rt.load_module({path!r})['default'](rt.cpu()))\n"
        "m.run(xs=[d['x0'], d['x1']], t=d['t'])\n"
        "out = [m.get_output(i) for i in range(m.get_num_outputs())]\n"
        "enc = lambda v: [a.numpy().tolist() for a in v] if isinstance(v, list) else v.numpy().tolist()\n"
        "print(json.dumps([enc(v) for v in out]))\n"
        "print('kiln.frontend' in sys.modules, 'onnx' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    got = json.loads(lines[0])
    assert lines[1] == "False False"  # the runtime alone ran it
    want = run_ort(_ops_model(), {"xs": xs, "t": t})
    _assert_same([np.asarray(a, np.float32) for a in got[0]], want[0])
    assert_close(np.asarray(got[1], np.float32), want[1])
    assert int(np.asarray(got[2])) == int(want[2])


def test_c_api_refuses_and_inspect_shows_the_types(tmp_path):
    from kiln.cli.inspect_cmd import _format_compiled_model, compiled_model_info
    from kiln.runtime.graph_json import load_graph_json
    from kiln.runtime.model_api import _unsupported_reason

    graph, params = kiln.frontend.from_onnx(_ops_model(), shape={"xs": [(1, 3), (4, 3)]})
    factory = kiln.build(graph, target="llvm", params=params)
    why = _unsupported_reason(load_graph_json(factory.get_graph_json()), None)
    assert why is not None and "sequence / optional" in why
    path = str(tmp_path / "seq.so")
    factory.export_library(path)
    info = compiled_model_info(path)
    assert info is not None
    assert info["values"]["inputs"] == {"xs": "sequence<float32>[2]"}
    assert info["values"]["outputs"][0] == {"name": "s2", "type": "sequence<float32>[2]", "heads": [0, 1]}
    text = _format_compiled_model(info)
    assert "input  xs: sequence<float32>[2]" in text
