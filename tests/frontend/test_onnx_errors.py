"""Malformed ONNX models fail at import with a Kiln error naming the node / tensor / value.

One test per defect class the fuzz campaign found (raw ``DecodeError`` / ``KeyError`` /
``IndexError`` / ``AttributeError`` / ``ValueError`` escaping ``from_onnx``, absurd declared
sizes, and models accepted but wrong: an out-of-range Softmax axis before opset 13, empty
bytes, duplicate graph outputs). ``tests/fuzz/test_fuzz_onnx.py`` covers the same ground
broadly; these pin the messages.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.frontend import from_onnx
from kiln.frontend.onnx import converter
from kiln.runtime.errors import FormatError, InputError, KilnError

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs=("y",), inits=(), opset=13, out_shape=None):
    graph = helper.make_graph(
        list(nodes), "g",
        [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(o, F, out_shape) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _raises(cls, model, *fragments):
    """Import ``model``; it must raise ``cls`` whose message holds every fragment."""
    with pytest.raises(cls) as info:
        from_onnx(model)
    for frag in fragments:
        assert frag in str(info.value), (frag, str(info.value))
    return info.value


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize("data, fragment", [
    (b"", "empty (0 bytes)"),
    (b"\x01\x02garbage\xff", "cannot parse 10 bytes"),
    (b"\x08\x07", "without a graph"),  # ir_version = 7 and nothing else: decodes, is no model
])
def test_bad_bytes_are_a_format_error(data, fragment):
    _raises(FormatError, data, fragment)


# ----------------------------------------------------------------------------- node structure
@pytest.mark.parametrize("node, inputs, opset, fragments", [
    # required attribute missing (was KeyError)
    (helper.make_node("Slice", ["x"], ["y"], name="s", starts=[0]), {"x": [2, 3]}, 9,
     ["Slice node 's'", "'ends'"]),
    (helper.make_node("Einsum", ["x", "x"], ["y"], name="e"), {"x": [2, 2]}, 13,
     ["Einsum node 'e'", "'equation'"]),
    (helper.make_node("MaxPool", ["x"], ["y"], name="p"), {"x": [1, 1, 4, 4]}, 13,
     ["MaxPool node 'p'", "'kernel_shape'"]),
    (helper.make_node("Reshape", ["x"], ["y"], name="r"), {"x": [2, 3]}, 1,
     ["Reshape node 'r'", "'shape'"]),
    # required input left empty (was AttributeError on None)
    (helper.make_node("Gemm", ["x", ""], ["y"], name="g"), {"x": [2, 3]}, 13,
     ["Gemm node 'g'", "input 1 ('B')"]),
    # too few inputs (was IndexError)
    (helper.make_node("Expand", ["x"], ["y"], name="ex"), {"x": [2, 3]}, 13,
     ["Expand node 'ex'", "1 input(s)"]),
    # attribute of the wrong type (was TypeError)
    (helper.make_node("Transpose", ["x"], ["y"], name="t", perm=1), {"x": [2, 3]}, 13,
     ["Transpose node 't'", "'perm'", "INTS", "got INT"]),
    # inconsistent lengths / ranks (were IndexError)
    (helper.make_node("Slice", ["x"], ["y"], name="s2", starts=[0, 0], ends=[1]),
     {"x": [2, 3]}, 9, ["Slice node 's2'", "same length"]),
    (helper.make_node("Gemm", ["x", "x"], ["y"], name="g3"), {"x": [2, 3, 4]}, 13,
     ["Gemm node 'g3'", "2-D"]),
    (helper.make_node("Pad", ["x"], ["y"], name="pd", pads=[0, -5, 0, 0]), {"x": [2, 3]}, 9,
     ["Pad node 'pd'", "negative size"]),
], ids=["slice9-no-ends", "einsum-no-equation", "maxpool-no-kernel", "reshape1-no-shape",
        "gemm-empty-B", "expand-one-input", "transpose-int-perm", "slice9-lengths",
        "gemm-3d", "pad9-negative-size"])
def test_malformed_node_names_node_and_expectation(node, inputs, opset, fragments):
    err = _raises(InputError, _model([node], inputs, opset=opset), *fragments)
    assert err.__cause__ is None or isinstance(err.__cause__, KilnError)


def test_unexpected_converter_failure_is_wrapped(monkeypatch):
    """Whatever a converter still raises becomes an InputError naming the node, chained."""

    def broken(ctx, node, ins, attrs):
        return {}["no such key"]

    converter.supported_ops()  # registers the real converters first, so the patch sticks
    monkeypatch.setitem(converter._CONVERTERS, "Relu", broken)
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="act")], {"x": [2]})
    err = _raises(InputError, model, "Relu node 'act'", "KeyError")
    assert isinstance(err.__cause__, KeyError)


# ----------------------------------------------------------------------------- tensors
def test_initializer_data_not_matching_dims_is_a_format_error():
    t = numpy_helper.from_array(np.zeros(3, np.float32), "w")
    t.dims[:] = [4]  # 12 bytes of data for 4 floats
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": [4]}, inits=[t])
    _raises(FormatError, model, "initializer 'w'", "(4,)")


@pytest.mark.parametrize("where", ["input", "initializer", "ConstantOfShape"])
def test_absurd_declared_size_is_refused(where):
    big = [1 << 20, 1 << 20]  # 2**40 elements, far above MAX_TENSOR_ELEMENTS
    if where == "input":
        model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": big})
        frag = "graph input 'x'"
    elif where == "initializer":
        t = TensorProto(name="w", data_type=F, dims=big)  # no data: it is never read
        model = _model([helper.make_node("Relu", ["w"], ["y"])], {}, inits=[t])
        frag = "initializer 'w'"
    else:
        shape = numpy_helper.from_array(np.array(big, np.int64), "shape")
        model = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="cos")], {},
                       inits=[shape])
        frag = "ConstantOfShape node 'cos'"
    _raises(InputError, model, frag, str(converter.MAX_TENSOR_ELEMENTS))


# ----------------------------------------------------------------------------- silently wrong
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [2, 5, -3])
def test_softmax_axis_out_of_range(opset, axis):
    # Opset 11 used to flatten to (N, 1) and return all ones.
    model = _model([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=axis)],
                   {"x": [2, 3]}, opset=opset)
    _raises(InputError, model, "Softmax node 'sm'", f"axis {axis} is out of range")


def test_duplicate_graph_output_is_refused():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, outputs=("y", "y"))
    _raises(InputError, model, "output 'y' twice")


def test_graph_without_outputs_is_refused():
    _raises(InputError, _model([], {"x": [2]}, outputs=()), "no outputs")


def test_valid_model_still_imports():
    """The schema checks do not reject what the spec allows (optional inputs left empty)."""
    model = _model([helper.make_node("Clip", ["x", "", "hi"], ["y"])], {"x": [3]}, out_shape=[3],
                   inits=[numpy_helper.from_array(np.array(1.0, np.float32), "hi")])
    graph, _ = from_onnx(model.SerializeToString())
    assert [v.shape for v in graph.outputs] == [(3,)]
    assert onnx.checker.check_model(model) is None
