"""ONNX Cast / CastLike / QuantizeLinear / DequantizeLinear / BitCast and data movement over the
low-precision types (float8, float4, int4, uint4, int2, uint2), against ONNX's reference
evaluator, bit for bit, beyond what the backend node suite covers: saturate=0 quantization,
axis and blocked scales with 4- and 2-bit types, -0 and NaN through the float8 zero point,
constants of these types in data movement (Pad), and graph-level folding (constant inputs)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from kiln.frontend.onnx_backend import KilnBackend

ONNX = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
        "float8_e5m2": TensorProto.FLOAT8E5M2, "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
        "float4_e2m1fn": TensorProto.FLOAT4E2M1, "int4": TensorProto.INT4, "uint4": TensorProto.UINT4,
        "int2": TensorProto.INT2, "uint2": TensorProto.UINT2, "float32": TensorProto.FLOAT,
        "float16": TensorProto.FLOAT16}


def _model(nodes, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray] | None = None,
           opset: int = 25) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, ONNX[v.dtype.name], list(v.shape)) for k, v in inputs.items()]
    g = helper.make_graph(nodes, "g", vis, [helper.make_empty_tensor_value_info("y")],
                          initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(m)
    out = {v.name: v for v in inferred.graph.value_info}["y"]
    del m.graph.output[:]
    m.graph.output.append(out)
    return m


def _check(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    want = ReferenceEvaluator(model).run(None, inputs)[0]
    got = KilnBackend.prepare(model).run(list(inputs.values()))[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.view(np.uint8).tolist() == want.view(np.uint8).tolist(), (got, want)
    return got


def _x(n: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 300).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, 1e9, -1e9]
    return x


@pytest.mark.parametrize("dst", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_quantize_to_float8(dst, saturate):
    x = _x()
    m = _model([helper.make_node("QuantizeLinear", ["x", "s"], ["y"], saturate=saturate, output_dtype=ONNX[dst])],
               {"x": x, "s": np.array(0.75, np.float32)})
    _check(m, {"x": x, "s": np.array(0.75, np.float32)})


def test_quantize_to_float8_keeps_negative_zero_with_a_zero_point():
    # ONNX's reference leaves a float8 zero point out, so -0 / s stays -0
    x = np.array([-0.0, 0.0, -1.0, 3.0], np.float32)
    m = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"])],
               {"x": x, "s": np.array(2.0, np.float32), "zp": np.array(0, ml_dtypes.float8_e4m3fn)})
    got = _check(m, {"x": x, "s": np.array(2.0, np.float32), "zp": np.array(0, ml_dtypes.float8_e4m3fn)})
    assert got.view(np.uint8)[0] == 0x80


@pytest.mark.parametrize("dt", ["int4", "uint4", "int2", "uint2"])
def test_blocked_quantize_dequantize_small_ints(dt):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 8)) * 10).astype(np.float32)
    s = (rng.random((3, 4)) + 0.5).astype(np.float32)
    info = ml_dtypes.iinfo(np.dtype(getattr(ml_dtypes, dt)))
    zp = rng.integers(info.min, info.max + 1, (3, 4)).astype(getattr(ml_dtypes, dt))
    q = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], axis=1, block_size=2)],
               {"x": x, "s": s, "zp": zp})
    y = _check(q, {"x": x, "s": s, "zp": zp})
    dq = _model([helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], axis=1, block_size=2)],
                {"x": y, "s": s, "zp": zp})
    _check(dq, {"x": y, "s": s, "zp": zp})


@pytest.mark.parametrize("src", ["float8_e4m3fn", "float8_e5m2fnuz", "float4_e2m1fn"])
def test_dequantize_every_code_per_axis(src):
    n = 256 if src.startswith("float8") else 16
    codes = np.arange(n, dtype=np.uint8).reshape(-1, 4 if n == 256 else 2)
    x = codes.view(getattr(ml_dtypes, src)).reshape(codes.shape)
    s = np.linspace(0.5, 2.0, x.shape[1]).astype(np.float16)
    m = _model([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1)], {"x": x, "s": s})
    _check(m, {"x": x, "s": s})


def test_cast_chain_through_low_precision_types():
    x = _x(64, 2)
    nodes = [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT8E5M2, saturate=0),
             helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["b"], ["c"], to=TensorProto.INT4),
             helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT16)]
    _check(_model(nodes, {"x": x}), {"x": x})


def test_constant_initializers_fold_like_the_kernels():
    # every input a constant: the whole graph folds at import through the cast op's NumPy reference
    x = _x(32, 3)
    nodes = [helper.make_node("QuantizeLinear", ["c", "s"], ["q"], output_dtype=TensorProto.FLOAT8E4M3FNUZ),
             helper.make_node("DequantizeLinear", ["q", "s"], ["d"]),
             helper.make_node("Add", ["d", "x"], ["y"])]
    m = _model(nodes, {"x": x}, {"c": _x(32, 4), "s": np.array(3.0, np.float32)})
    _check(m, {"x": x})


@pytest.mark.parametrize("dt", ["float8_e4m3fn", "int4", "float4_e2m1fn", "uint2"])
def test_pad_with_a_low_precision_constant(dt):
    x = (np.arange(12) % 4).astype(np.uint8).view(getattr(ml_dtypes, dt)).reshape(3, 4)
    m = _model([helper.make_node("Pad", ["x", "p", "v"], ["y"])], {"x": x},
               {"p": np.array([1, 0, 0, 2], np.int64), "v": np.array(1, getattr(ml_dtypes, dt))})
    _check(m, {"x": x})
