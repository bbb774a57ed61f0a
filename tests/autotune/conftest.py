"""A tiny conv + dense ONNX model shared by the autotune tests."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")


def make_model(path: str) -> str:
    """Conv(8->16, 3x3, pad 1) + ReLU on 1x8x12x12, flatten, Gemm(2304 -> 32) with 4 rows."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype("float32") * 0.2, "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "b")
    fw = numpy_helper.from_array(rng.standard_normal((16 * 12 * 12, 32)).astype("float32") * 0.05, "fw")
    shape = numpy_helper.from_array(np.array([4, -1], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fw"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
                              initializer=[w, b, fw, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> str:
    return make_model(str(tmp_path_factory.mktemp("autotune") / "tiny.onnx"))


@pytest.fixture(scope="session")
def tiny_graph(tiny_onnx):
    from kiln.frontend import from_onnx

    return from_onnx(tiny_onnx)
