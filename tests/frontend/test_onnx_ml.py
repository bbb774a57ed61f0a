"""``ai.onnx.ml`` converters (registered as ``domain.OpType``) vs ONNX Runtime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime.errors import UnsupportedOpError
from tests.frontend.onnx_check import assert_close, rand, run_kiln, run_ort

_TYPES = {np.dtype("float32"): TensorProto.FLOAT, np.dtype("float64"): TensorProto.DOUBLE,
          np.dtype("int64"): TensorProto.INT64, np.dtype("int32"): TensorProto.INT32}


def _ml_model(node: onnx.NodeProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph([node], "ml",
                          [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in feeds.items()],
                          [helper.make_empty_tensor_value_info(o) for o in node.output])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])


@pytest.mark.parametrize("dtype,threshold", [("float32", 0.25), ("float64", -0.5), ("int64", 1.0), ("int32", 0.0)])
def test_binarizer(dtype, threshold):
    x = (rand(3, 4, 5, lo=-3, hi=3) * (1 if dtype.startswith("float") else 2)).astype(dtype)
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=threshold)
    model = _ml_model(node, {"x": x})
    got, _ = run_kiln(model, {"x": x})
    if dtype == "float32":
        want = run_ort(model, {"x": x})
    else:  # ONNX Runtime implements Binarizer for float32 only: the ONNX reference for the rest
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, {"x": x})
    assert got[0].dtype == want[0].dtype
    assert_close(got[0], want[0], what="Binarizer")


@pytest.mark.parametrize("shape,cols", [((3, 4), [0, 3, 1]), ((2, 3, 5), [4]), ((6,), [5, 0])])
def test_array_feature_extractor(shape, cols):
    feeds = {"x": rand(*shape), "i": np.array(cols, np.int64)}
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    model = _ml_model(node, feeds)
    got, _ = run_kiln(model, feeds)
    want = run_ort(model, feeds)
    assert got[0].shape == want[0].shape
    assert_close(got[0], want[0], what="ArrayFeatureExtractor")


def test_other_domain_op_is_named_with_its_domain():
    node = helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", scale=[2.0])
    with pytest.raises(UnsupportedOpError, match=r"ai\.onnx\.ml\.Scaler"):
        kiln.frontend.from_onnx(_ml_model(node, {"x": rand(2, 3)}))
