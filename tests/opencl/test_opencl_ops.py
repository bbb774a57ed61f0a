"""Every kind of GPU schedule on OpenCL (PoCL) against ONNX Runtime: one small model per op kind."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

pytestmark = pytest.mark.skipif(not kiln.opencl().exist,
                                reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")


def _w(r: np.random.Generator, *shape: int) -> np.ndarray:
    return (r.standard_normal(shape) * 0.5).astype(np.float32)


def _case(name: str):
    """(model, feeds) of case ``name``; weights are initializers (params), inputs random."""
    r = np.random.default_rng(zlib.crc32(name.encode()))  # stable across runs, unlike hash() (PYTHONHASHSEED)
    inits: dict[str, np.ndarray] = {}
    x_shape = (1, 8, 9, 11)
    if name == "conv_stride_pad_bias_relu":
        inits = {"w": _w(r, 12, 8, 3, 3), "b": _w(r, 12)}
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["y"])]
    elif name == "conv_no_epilogue":
        inits = {"w": _w(r, 5, 8, 1, 1)}
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"])]
    elif name == "depthwise_conv":
        inits = {"w": _w(r, 8, 1, 3, 3), "b": _w(r, 8)}
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], group=8, pads=[1, 1, 1, 1])]
    elif name == "maxpool":
        nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    elif name == "avgpool":
        nodes = [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    elif name == "global_avgpool":
        nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    elif name == "softmax":
        x_shape = (3, 37)
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    elif name == "gemm_bias":
        x_shape = (3, 20)
        inits = {"w": _w(r, 13, 20), "b": _w(r, 13)}
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    elif name == "batched_matmul":
        x_shape = (2, 5, 7)
        inits = {"w": _w(r, 2, 7, 6)}
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    elif name == "reduce_mean_keepdims":
        nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1, 3], keepdims=1)]
    elif name == "reduce_max_all":
        nodes = [helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0)]
    elif name == "transpose_concat":
        nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                 helper.make_node("Exp", ["t"], ["e"]),
                 helper.make_node("Concat", ["t", "e"], ["y"], axis=3)]
    elif name == "layernorm_gelu":
        x_shape = (2, 6, 16)
        inits = {"g": _w(r, 16), "b": _w(r, 16)}
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
                 helper.make_node("Erf", ["n"], ["e"]),
                 helper.make_node("Mul", ["n", "e"], ["y"])]
    else:  # pragma: no cover
        raise KeyError(name)
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {"x": r.standard_normal(x_shape).astype(np.float32)}


CASES = ["conv_stride_pad_bias_relu", "conv_no_epilogue", "depthwise_conv", "maxpool", "avgpool", "global_avgpool",
         "softmax", "gemm_bias", "batched_matmul", "reduce_mean_keepdims", "reduce_max_all", "transpose_concat",
         "layernorm_gelu"]


@pytest.mark.parametrize("name", CASES)
def test_op_kind_on_opencl_matches_onnxruntime(name):
    import onnxruntime as ort

    model, feeds = _case(name)
    mod, params = kiln.frontend.from_onnx(model)
    f = kiln.build(mod, target="opencl", params=params)
    lib = f.get_lib()
    assert [m.type_key for m in lib.imported_modules] == ["opencl"]
    src = lib.imported_modules[0].get_source()
    if name != "reduce_max_all":  # a reduction to a scalar runs on one work-item
        assert "get_local_id(0)" in src  # the GPU schedules bound the loops to work-items
    m = kiln.GraphModule(f["default"](kiln.opencl()))
    m.set_input(**feeds)
    m.run()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(m.get_output(0).numpy(), ref, rtol=1e-4, atol=1e-5)
