"""ONNX string ops through the whole pipeline: import, build, run, export, fresh-process load."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.frontend import from_onnx
from kiln.frontend.onnx_backend import KilnBackend
from kiln.runtime import model_api
from kiln.runtime.errors import InputError, UnsupportedOpError
from kiln.runtime.graph_json import load_graph_json
from tests.runtime.import_blocker import COMPILER_SIDE, blocker_prelude

S, I64, F32, B = TensorProto.STRING, TensorProto.INT64, TensorProto.FLOAT, TensorProto.BOOL


def _model(nodes, inputs, outputs, ml: bool = False, initializers=()) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "strings",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers),
    )
    opsets = [helper.make_opsetid("", 20)] + ([helper.make_opsetid("ai.onnx.ml", 4)] if ml else [])
    return helper.make_model(g, opset_imports=opsets)


def _mixed_model() -> onnx.ModelProto:
    """concat(x, suffix) -> regex match, equal(x, y), and a string constant as an output."""
    suffix = helper.make_tensor("suffix", S, [1], [b"!"])
    nodes = [
        helper.make_node("StringConcat", ["x", "suffix"], ["c"]),
        helper.make_node("RegexFullMatch", ["c"], ["m"], pattern=r"[a-z]+\d?!"),
        helper.make_node("Equal", ["x", "y"], ["e"]),
        helper.make_node("StringNormalizer", ["c"], ["u"], case_change_action="UPPER"),
    ]
    return _model(
        nodes,
        [("x", S, [3]), ("y", S, [3])],
        [("c", S, [3]), ("m", B, [3]), ("e", B, [3]), ("u", S, [3])],
        initializers=[suffix],
    )


X = np.array(["abc", "ab1", "Héllo"], dtype=object)
Y = np.array(["abc", "zz", "Héllo"], dtype=object)


def _build(model):
    graph, params = from_onnx(model)
    return kiln.build(graph, target="llvm", params=params)


def _check_mixed(outs):
    c, m, e, u = outs
    assert c.dtype == object and c.tolist() == ["abc!", "ab1!", "Héllo!"]
    assert m.tolist() == [True, True, False]
    assert e.tolist() == [True, False, True]
    assert u.tolist() == ["ABC!", "AB1!", "HÉLLO!"]


def test_string_graph_builds_and_runs():
    factory = _build(_mixed_model())
    graph = json.loads(factory.get_graph_json())
    funcs = [n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] == "tvm_op"]
    assert funcs.count("__host") == 4
    assert "string" in graph["attrs"]["dltype"][1]
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input("x", X)
    m.set_input("y", Y)
    m.run()
    _check_mixed([m.get_output(i).numpy() for i in range(4)])


def test_exported_library_runs_in_a_fresh_process_without_the_compiler(tmp_path):
    path = str(tmp_path / "strings.so")
    _build(_mixed_model()).export_library(path)
    script = blocker_prelude(COMPILER_SIDE) + textwrap.dedent(
        """
        import json
        import numpy as np
        import kiln.runtime as rt
        from kiln.runtime.graph_executor import GraphModule
        m = GraphModule(rt.load_module(sys.argv[1])["default"](rt.cpu()))
        m.set_input("x", np.array(["abc", "ab1", "Héllo"], dtype=object))
        m.set_input("y", np.array(["abc", "zz", "Héllo"], dtype=object))
        m.run()
        print(json.dumps([m.get_output(i).numpy().tolist() for i in range(4)]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_mixed([np.array(o, dtype=object) for o in json.loads(proc.stdout.splitlines()[-1])])


def test_c_api_refuses_string_graphs_with_the_reason():
    factory = _build(_mixed_model())
    src = model_api.model_api_source(load_graph_json(factory.get_graph_json()), [], "default", set())
    assert "is a string tensor; the C API has no string type" in src


def test_label_encoder_string_keys_and_numeric_keys():
    nodes = [
        helper.make_node(
            "LabelEncoder",
            ["x"],
            ["y"],
            domain="ai.onnx.ml",
            keys_strings=["a", "b", "a"],
            values_int64s=[1, 2, 3],
            default_int64=-7,
        )
    ]
    factory = _build(_model(nodes, [("x", S, [4])], [("y", I64, [4])], ml=True))
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.run(x=np.array(["a", "b", "c", "a"], dtype=object))
    assert m.get_output(0).numpy().tolist() == [1, 2, -7, 1]  # the first of repeated keys wins

    nodes = [
        helper.make_node(
            "LabelEncoder",
            ["x"],
            ["y"],
            domain="ai.onnx.ml",
            keys_floats=[1.5, float("nan")],
            values_int64s=[10, 20],
            default_int64=0,
        )
    ]
    factory = _build(_model(nodes, [("x", F32, [4])], [("y", I64, [4])], ml=True))
    funcs = [n["attrs"]["func_name"] for n in json.loads(factory.get_graph_json())["nodes"] if n["op"] == "tvm_op"]
    assert "__host" not in funcs  # numbers to numbers: generated kernels
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.run(x=np.array([1.5, np.nan, 2.0, 1.5], dtype=np.float32))
    assert m.get_output(0).numpy().tolist() == [10, 20, 0, 10]


def test_string_to_string_label_encoder():
    nodes = [
        helper.make_node(
            "LabelEncoder",
            ["x"],
            ["y"],
            domain="ai.onnx.ml",
            keys_int64s=[1, 2],
            values_strings=["one", "two"],
            default_string="?",
        )
    ]
    factory = _build(_model(nodes, [("x", I64, [3])], [("y", S, [3])], ml=True))
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.run(x=np.array([2, 5, 1], dtype=np.int64))
    assert m.get_output(0).numpy().tolist() == ["two", "?", "one"]


def test_split_needs_its_input_at_compile_time_and_folds_with_it():
    nodes = [helper.make_node("StringSplit", ["x"], ["y", "z"], delimiter="-")]
    model = _model(nodes, [("x", S, [2])], [("y", S, [2, "w"]), ("z", I64, [2])])
    with pytest.raises(UnsupportedOpError, match="must be a constant"):
        from_onnx(model)
    rep = KilnBackend.prepare(model)
    y, z = rep.run([np.array(["a-b-c", "d"], dtype=object)])
    assert y.tolist() == [["a", "b", "c"], ["d", "", ""]] and z.tolist() == [3, 1]
    # the frozen value is part of the compile cache key: other text compiles anew
    y, z = rep.run([np.array(["e", "f-g"], dtype=object)])
    assert y.tolist() == [["e", ""], ["f", "g"]] and rep.compile_count == 2


def test_backend_runs_string_inputs():
    rep = KilnBackend.prepare(_mixed_model())
    _check_mixed(list(rep.run([X, Y])))


def test_regex_with_re2_only_or_python_only_syntax_is_refused_at_import():
    nodes = [helper.make_node("RegexFullMatch", ["x"], ["m"], pattern=r"(?<=a)b")]
    with pytest.raises(InputError, match="RE2"):
        from_onnx(_model(nodes, [("x", S, [1])], [("m", B, [1])]))


def test_turkish_locale_is_refused():
    nodes = [helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="LOWER", locale="tr_TR")]
    with pytest.raises(UnsupportedOpError, match="tr_TR"):
        from_onnx(_model(nodes, [("x", S, [1])], [("y", S, [1])]))


def test_inspect_shows_string_dtypes(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(_mixed_model(), path)
    proc = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "inspect", path], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "string [3]" in proc.stdout and "object" not in proc.stdout
    lib = str(tmp_path / "m.so")
    _build(_mixed_model()).export_library(lib)
    proc = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "inspect", lib], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "input  x: string [3]" in proc.stdout and "output 3: string [3]" in proc.stdout


def test_cast_numbers_to_strings_and_back():
    nodes = [
        helper.make_node("Cast", ["x"], ["s"], to=S),
        helper.make_node("Cast", ["s"], ["back"], to=TensorProto.DOUBLE),
        helper.make_node("CastLike", ["t", "x"], ["parsed"]),
    ]
    model = _model(
        nodes,
        [("x", F32, [4]), ("t", S, [3])],
        [("s", S, [4]), ("back", TensorProto.DOUBLE, [4]), ("parsed", F32, [3])],
    )
    factory = _build(model)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    x = np.array([0.1, -3.0, np.inf, np.nan], dtype=np.float32)
    m.run(x=x, t=np.array(["1e3", " -INF", "NaN"], dtype=object))
    assert m.get_output(0).numpy().tolist() == ["0.1", "-3.0", "inf", "nan"]
    np.testing.assert_array_equal(m.get_output(1).numpy(), [0.1, -3.0, np.inf, np.nan])  # the text, parsed
    np.testing.assert_array_equal(m.get_output(2).numpy(), np.array([1e3, -np.inf, np.nan], np.float32))
    m.set_input("t", np.array(["1", "two", "3"], dtype=object))
    with pytest.raises(kiln.runtime.errors.KernelError, match="not a float32 number"):
        m.run()


def test_link_params_keeps_string_params_in_the_blob(tmp_path):
    graph, params = from_onnx(_mixed_model())
    factory = kiln.build(graph, target="llvm", params=params, link_params=True)
    assert any(v.dtype == "string" for v in factory.get_graph_params().values())
    path = str(tmp_path / "linked.so")
    factory.export_library(path)
    m = kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))
    m.run(x=X, y=Y)
    _check_mixed([m.get_output(i).numpy() for i in range(4)])


def test_a_kernel_on_strings_is_refused_at_build():
    nodes = [helper.make_node("Concat", ["x", "y"], ["z"], axis=0)]
    graph, params = from_onnx(_model(nodes, [("x", S, [2]), ("y", S, [1])], [("z", S, [3])]))
    with pytest.raises(UnsupportedOpError, match="on string tensors"):
        kiln.build(graph, target="llvm", params=params)


def test_reshape_of_strings_is_an_alias():
    shape = helper.make_tensor("shape", I64, [2], [2, 2])
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("StringConcat", ["r", "r"], ["z"])]
    factory = _build(_model(nodes, [("x", S, [4])], [("z", S, [2, 2])], initializers=[shape]))
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.run(x=np.array(list("abcd"), dtype=object))
    assert m.get_output(0).numpy().tolist() == [["aa", "bb"], ["cc", "dd"]]
