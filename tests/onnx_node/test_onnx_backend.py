"""Kiln's ONNX backend (``kiln.frontend.onnx_backend``): API, lazy compilation, frozen inputs."""

from __future__ import annotations

import unittest

import numpy as np
import pytest
from onnx import TensorProto, checker, helper

from kiln.frontend.onnx_backend import KilnBackend, STAGE_NOTE, shape_inputs
from tests.onnx_node import node_cases


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _relu_model(shape=(2, 3)):
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [_vi("x", TensorProto.FLOAT, list(shape))],
                  [_vi("y", TensorProto.FLOAT, list(shape))])


def _reshape_model():
    return _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                  [_vi("x", TensorProto.FLOAT, [2, 3, 4]), _vi("shape", TensorProto.INT64, [2])],
                  [_vi("y", TensorProto.FLOAT, ["a", "b"])])


# -- no compiler needed -------------------------------------------------------------------
def test_supports_device():
    assert KilnBackend.supports_device("CPU")
    assert KilnBackend.supports_device("CPU:0")
    assert not KilnBackend.supports_device("CUDA")
    with pytest.raises(RuntimeError, match="CPU only"):
        KilnBackend.prepare(_relu_model(), "CUDA")


def test_shape_inputs_direct_and_through_nodes():
    assert shape_inputs(_reshape_model()) == ["shape"]
    # k reaches TopK through a Cast: frozen; x only reaches Reshape's shape through Shape: not
    m = _model([helper.make_node("Cast", ["k32"], ["k"], to=TensorProto.INT64),
                helper.make_node("TopK", ["x", "k"], ["v", "i"]),
                helper.make_node("Shape", ["x"], ["s"]),
                helper.make_node("Reshape", ["v", "s"], ["y"])],
               [_vi("x", TensorProto.FLOAT, [3, 4]), _vi("k32", TensorProto.INT32, [1])],
               [_vi("y", TensorProto.FLOAT, None), _vi("i", TensorProto.INT64, None)])
    assert shape_inputs(m) == ["k32"]
    assert shape_inputs(_relu_model()) == []


def test_prepare_is_lazy_and_checks_the_model():
    rep = KilnBackend.prepare(_relu_model())
    assert rep.compile_count == 0
    assert rep.input_names == ["x"] and rep.output_names == ["y"]
    assert rep.freeze_names == []
    bad = _relu_model()
    bad.graph.node[0].input[0] = "nope"
    with pytest.raises(checker.ValidationError, match="nope"):
        KilnBackend.prepare(bad)


def test_input_errors():
    rep = KilnBackend.prepare(_relu_model())
    with pytest.raises(ValueError, match="takes 1 input"):
        rep.run([np.zeros((2, 3), "float32")] * 2)
    with pytest.raises(ValueError, match="unknown input"):
        rep.run({"zz": np.zeros((2, 3), "float32")})


# -- compiles -----------------------------------------------------------------------------
def test_run_list_dict_array_and_cache():
    rep = KilnBackend.prepare(_relu_model())
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    (y,) = rep.run([x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    np.testing.assert_array_equal(rep.run({"x": -x})["y"], np.maximum(-x, 0))
    np.testing.assert_array_equal(rep.run(x).y, np.maximum(x, 0))
    assert rep.compile_count == 1  # same signature: compiled once


def test_new_shape_recompiles():
    m = _relu_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    rep = KilnBackend.prepare(m)
    for n in (1, 4):
        x = np.arange(3 * n, dtype="float32").reshape(n, 3) - 3
        np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
    assert rep.compile_count == 2


def test_shape_input_is_frozen_per_value():
    rep = KilnBackend.prepare(_reshape_model())
    assert rep.freeze_names == ["shape"]
    x = np.arange(24, dtype="float32").reshape(2, 3, 4)
    for shp in ([4, 6], [6, 4], [4, 6]):
        (y,) = rep.run([x, np.array(shp, dtype="int64")])
        np.testing.assert_array_equal(y, x.reshape(shp))
    assert rep.compile_count == 2  # one per distinct shape value


def test_run_model_and_run_node():
    x = np.array([[-1.0, 2.0, -3.0]], dtype="float32")
    (y,) = KilnBackend.run_model(_relu_model((1, 3)), [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    node = helper.make_node("Add", ["a", "b"], ["c"])
    (c,) = KilnBackend.run_node(node, [x, x])
    np.testing.assert_array_equal(c, x + x)


def test_errors_name_the_stage():
    m = _model([helper.make_node("Foo", ["x"], ["y"], domain="com.example")],
               [_vi("x", TensorProto.FLOAT, [2])], [_vi("y", TensorProto.FLOAT, [2])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    rep = KilnBackend.prepare(m)
    with pytest.raises(Exception) as info:
        rep.run([np.zeros(2, "float32")])
    assert STAGE_NOTE + "import" in getattr(info.value, "__notes__", [])


def test_official_backend_test_runner(request):
    """The same backend under onnx's own ``BackendTest`` runner (it generates every node case
    on construction, ~12 s; left out of quick runs)."""
    if not node_cases.run_slow(request.config):
        pytest.skip("slow: left out by KILN_NODE_SUITE_FAST=1 / -m \"not slow\"")
    import warnings

    import onnx.backend.test

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        bt = onnx.backend.test.BackendTest(KilnBackend, __name__)
    for name in ("test_relu", "test_reshape_reordered_all_dims", "test_add_bcast"):
        bt.include(f"^{name}_cpu$")
    suite = unittest.TestSuite()
    for case in bt.test_cases.values():
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
    result = unittest.TextTestRunner(verbosity=0).run(suite)
    assert result.testsRun >= 3
    assert result.wasSuccessful(), result.failures + result.errors
