"""String tensors in the runtime: StringNDArray, the params format, host ops in the executor."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.runtime import dtype as dt
from kiln.runtime import ndarray as nd
from kiln.runtime import params as prm
from kiln.runtime import strings
from kiln.runtime.errors import DeviceError, FormatError, InputError, KernelError
from kiln.runtime.graph_executor import GraphExecutor, GraphModule
from tests.executor.executor_helpers import GraphBuilder

WORDS = np.array([["a", "héllo"], ["", "日本"]], dtype=object)


# ----------------------------------------------------------------------------- dtype / NDArray
def test_dtype_table_names_string():
    assert dt.canonical("string") == "string"
    assert dt.canonical(np.dtype(object)) == "string"
    assert dt.canonical(np.array(["ab"]).dtype) == "string"
    assert dt.np_dtype("string") == np.dtype(object)
    with pytest.raises(InputError):  # DLPack has no string type: nothing imports as one
        dt.from_dl(dt.DLDataTypeCode.OPAQUE_HANDLE, 64)


def test_array_roundtrip_and_views():
    a = nd.array(WORDS)
    assert isinstance(a, strings.StringNDArray) and a.dtype == "string" and a.shape == (2, 2)
    out = a.numpy()
    assert out.dtype == object and out.tolist() == WORDS.tolist()
    out[0, 0] = "changed"  # numpy() copies
    assert a.numpy()[0, 0] == "a"
    v = a._create_view((4,))
    assert v.numpy(copy=False).tolist() == ["a", "héllo", "", "日本"]
    with pytest.raises(InputError, match="string"):
        a._create_view((4,), "float32")
    b = a.copyto(rt.cpu())
    b.copyfrom(np.array([["x", "y"], ["z", "w"]]))
    assert a.numpy()[0, 0] == "a" and b.numpy()[1, 1] == "w"
    assert nd.empty((3,), "string").numpy().tolist() == ["", "", ""]


def test_bad_string_data_is_refused():
    with pytest.raises(InputError, match="element 1 is a int"):
        nd.array(np.array(["a", 3], dtype=object))
    with pytest.raises(InputError, match="not UTF-8"):
        strings.to_string_array(np.array([b"\xff"], dtype=object))
    assert strings.to_string_array(np.array([b"ok"], dtype=object)).tolist() == ["ok"]


def test_no_dlpack_and_no_other_device():
    a = nd.array(WORDS)
    with pytest.raises(InputError, match="DLPack"):
        a.__dlpack__()
    with pytest.raises(DeviceError, match="host CPU only"):
        strings.empty_strings((2,), rt.Device(4, 0))


# ----------------------------------------------------------------------------- params format
def test_params_roundtrip_with_strings(tmp_path):
    p = {"w": np.arange(3, dtype="float32"), "s": WORDS, "e": np.empty((0, 2), dtype=object)}
    blob = prm.save_param_dict(p)
    assert struct.unpack_from("<Q", blob, 8)[0] == 1  # version 1: a string record follows
    back = prm.load_param_dict(blob)
    np.testing.assert_array_equal(back["w"].numpy(), p["w"])
    assert back["s"].dtype == "string" and back["s"].numpy().tolist() == WORDS.tolist()
    assert back["e"].shape == (0, 2)
    prm.save_param_dict_to_file(p, tmp_path / "p.params")
    assert prm.load_param_dict(str(tmp_path / "p.params"))["s"].numpy().tolist() == WORDS.tolist()


def test_params_without_strings_stay_version_0():
    blob = prm.save_param_dict({"w": np.ones(2, "float32")})
    assert struct.unpack_from("<Q", blob, 8)[0] == 0


def test_params_version_and_corruption_errors():
    blob = bytearray(prm.save_param_dict({"s": np.array(["ab", "c"], dtype=object)}))
    newer = bytes(blob[:8]) + struct.pack("<Q", 2) + bytes(blob[16:])
    with pytest.raises(FormatError, match="version 2 is newer"):
        prm.load_param_dict(newer)
    # a version-0 reader (what TVM and older Kiln see) cannot mistake the record for a tensor
    old = bytes(blob[:8]) + struct.pack("<Q", 0) + bytes(blob[16:])
    with pytest.raises(FormatError, match="bad tensor magic"):
        prm.load_param_dict(old)
    with pytest.raises(FormatError):
        prm.load_param_dict(bytes(blob[:-1]))  # truncated last string
    bad_utf8 = bytes(blob[:-1]) + b"\xff"
    with pytest.raises(FormatError, match="UTF-8"):
        prm.load_param_dict(bad_utf8)


def test_params_refuse_unencodable_text():
    with pytest.raises(InputError, match="UTF-8"):
        prm.save_param_dict({"s": np.array(["\ud800"], dtype=object)})


# ----------------------------------------------------------------------------- executor
def _host(b: GraphBuilder, op: str, inputs, shape, dtype, attrs):
    out = b.op("__host", inputs, shapes=[shape], dtype=dtype)
    b.nodes[-1]["attrs"].update({"host_op": op, "host_attrs": json.dumps(attrs)})
    return out


def _module(graph: dict) -> GraphModule:
    lib = rt.csource_module("#include <kiln/c_runtime_api.h>\n", [])
    return GraphModule(GraphExecutor(json.dumps(graph), lib, [rt.cpu()]))


def _concat_match_graph() -> dict:
    b = GraphBuilder()
    x = b.input("x", (2,), "string")
    y = b.input("y", (2,), "string")
    c = _host(b, "string_concat", [x, y], (2,), "string", {})
    m = _host(b, "regex_full_match", [c], (2,), "bool", {"pattern": r"[a-z]+\d"})
    return b.to_dict([c, m])


def test_executor_runs_host_ops():
    m = _module(_concat_match_graph())
    m.set_input("x", np.array(["ab", "Q"], dtype=object))
    m.set_input("y", np.array(["7", "1"]))  # a str_ array is converted
    m.run()
    assert m.get_output(0).numpy().tolist() == ["ab7", "Q1"]
    np.testing.assert_array_equal(m.get_output(1).numpy(), [True, False])
    assert m.get_input_info()[1] == {"x": "string", "y": "string"}
    # inputs are copied: changing the user's array afterwards changes nothing
    x = np.array(["cd", "e"], dtype=object)
    m.set_input("x", x)
    x[0] = "ZZ"
    m.run()
    assert m.get_output(0).numpy().tolist() == ["cd7", "e1"]


def test_string_input_errors_name_the_input():
    m = _module(_concat_match_graph())
    with pytest.raises(InputError, match="'x'.*float32"):
        m.set_input("x", np.zeros(2, "float32"))
    with pytest.raises(InputError, match="'x'.*shape"):
        m.set_input("x", np.array(["a"], dtype=object))
    with pytest.raises(InputError, match="'y'.*element 0"):
        m.set_input("y", np.array([1, "a"], dtype=object))
    with pytest.raises(InputError, match="zero-copy.*string"):
        m.set_input_zero_copy("x", nd.array(np.array(["a", "b"], dtype=object)))


def test_unknown_host_op_and_bad_attrs_fail_at_creation():
    g = _concat_match_graph()
    g["nodes"][2]["attrs"]["host_op"] = "no_such_op"
    with pytest.raises(FormatError, match="unknown host op 'no_such_op'"):
        _module(g)
    g = _concat_match_graph()
    g["nodes"][3]["attrs"]["host_attrs"] = "[1]"
    with pytest.raises(FormatError, match="JSON object"):
        _module(g)
    g = _concat_match_graph()
    g["nodes"][3]["attrs"]["host_attrs"] = json.dumps({"pattern": "(a)\\1"})
    with pytest.raises(InputError, match="RE2"):
        _module(g)


def test_host_op_failure_is_a_kernel_error():
    b = GraphBuilder()
    x = b.input("x", (2,), "string")
    # the graph claims a shape the op cannot give
    y = _host(b, "string_concat", [x, x], (3,), "string", {})
    m = _module(b.to_dict([y]))
    m.set_input("x", np.array(["a", "b"], dtype=object))
    with pytest.raises(KernelError, match="string_concat"):
        m.run()


@pytest.mark.parametrize(
    "pattern", [r"(?=a)a", r"(?<!b)a", r"(a)\1", r"a*+", r"\Qa\E", r"\pL", r"[[:alpha:]]", r"a{,3}", r"(?>a)", "(?i)é"]
)
def test_regex_dialect_mismatch_is_refused(pattern):
    with pytest.raises(InputError, match="RE2"):
        strings.check_regex(pattern)


def test_regex_common_syntax_is_accepted():
    rx = strings.check_regex(r"(?i)[\w.+-]+@(?P<d>example)\.com")
    assert rx.fullmatch("A.b@EXAMPLE.com") is not None


def test_regex_classes_are_ascii_only_as_in_re2():
    assert strings.check_regex(r"\d+").fullmatch("١٢") is None  # Arabic-Indic digits: not RE2's \d
    assert strings.check_regex(r"\w+").fullmatch("héllo") is None
    assert strings.check_regex(r"h.llo").fullmatch("héllo") is not None  # . is any character


def test_string_kernels():
    y, z = strings.split_strings(np.array(["a,b", "c", ""], dtype=object), ",", None)
    assert y.tolist() == [["a", "b"], ["c", ""], ["", ""]] and z.tolist() == [2, 1, 1]
    y, z = strings.split_strings(np.array([" a  b ", "c"], dtype=object), "", 1)
    assert y.tolist() == [["a", "b "], ["c", ""]] and z.tolist() == [2, 1]
    out = strings.normalize_strings(np.array(["Monday", "x"], dtype=object), "UPPER", False, ["monday"])
    assert out.tolist() == ["X"]
    assert strings.normalize_strings(np.array(["a"], dtype=object), "NONE", True, ["a"]).tolist() == [""]
    enc = strings.label_encode(np.array([1.0, np.nan, 3.0]), np.array([np.nan, 1.0]), np.array([7, 8]), -1)
    assert enc.tolist() == [8, 7, -1]
