"""Integer, bit-level and quantized ONNX ops through from_onnx + the reference interpreter vs ORT."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime.errors import InputError
from kiln.ir import evaluate
from tests.frontend.onnx_check import check_node, make_model, rand


def _convert(op: str, inputs: dict[str, np.ndarray], attrs: dict | None = None, opset: int = 17) -> None:
    """Kiln's import of one ``op`` node (for inputs ONNX Runtime would reject too)."""
    node = helper.make_node(op, list(inputs), ["out"], name=f"{op.lower()}_node", **(attrs or {}))
    kiln.frontend.from_onnx(make_model([node], inputs, ["out"], opset))


def _full(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


# ----------------------------------------------------------------------------- bitwise / shift
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint64"])
def test_bitwise_binary(op, dtype):
    check_node(op, {"a": _full((2, 3, 4), dtype, 1), "b": _full((3, 1), dtype, 2)}, opset=18)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64"])
def test_bitwise_not(dtype):
    check_node("BitwiseNot", {"x": _full((3, 5), dtype, 3)}, opset=18)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["uint8", "uint32", "uint64"])
def test_bit_shift(direction, dtype):
    nbits = np.dtype(dtype).itemsize * 8
    amount = np.random.default_rng(4).integers(0, nbits, size=(2, 5)).astype(dtype)
    check_node("BitShift", {"x": _full((3, 2, 5), dtype, 5), "y": amount}, {"direction": direction}, opset=11)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "uint16"])
def test_bit_shift_out_of_range_amounts(direction, dtype):
    # BitShift-28: signed types, and amounts that are negative or at least the width.
    nbits = np.dtype(dtype).itemsize * 8
    lo = -nbits - 2 if np.dtype(dtype).kind == "i" else 0
    amount = np.random.default_rng(6).integers(lo, nbits + 3, size=(4, 6)).astype(dtype)
    check_node("BitShift", {"x": _full((4, 6), dtype, 7), "y": amount}, {"direction": direction}, opset=28)


def test_bit_shift_bad_direction():
    x = np.array([1, 2], np.uint8)
    with pytest.raises(InputError, match="direction"):
        _convert("BitShift", {"x": x, "y": x}, {"direction": "UP"}, opset=11)


@pytest.mark.parametrize("src,to", [("float32", TensorProto.INT32), ("int32", TensorProto.FLOAT),
                                    ("float64", TensorProto.UINT64), ("uint16", TensorProto.INT16),
                                    ("float16", TensorProto.UINT16)])
def test_bitcast(src, to):
    x = rand(3, 4, lo=-100, hi=100).astype(src) if "float" in src else _full((3, 4), src, 6)
    check_node("BitCast", {"x": x}, {"to": to}, opset=26)


def test_bitcast_needs_equal_widths():
    with pytest.raises(InputError, match="one width"):
        _convert("BitCast", {"x": rand(3)}, {"to": TensorProto.INT64}, opset=26)


# ----------------------------------------------------------------------------- (de)quantization
def test_quantize_linear_per_tensor():
    x = rand(2, 3, 8, lo=-3, hi=3)
    x[0, 0, :4] = [0.5, 1.5, -0.5, -2.5]  # ties round to even
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.5, np.float32), "zp": np.array(128, np.uint8)},
               opset=13)
    check_node("QuantizeLinear", {"x": x * 100, "s": np.array(0.5, np.float32), "zp": np.array(-3, np.int8)},
               opset=13)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.02, np.float32)}, opset=13)  # uint8, zero point 0


def test_quantize_linear_per_axis_and_16_bit():
    x = rand(2, 3, 4, lo=-300, hi=300)
    scale = np.array([0.01, 0.5, 2.0], np.float32)
    check_node("QuantizeLinear", {"x": x, "s": scale, "zp": np.array([0, 10, -20], np.int16)}, {"axis": 1},
               opset=21)
    check_node("QuantizeLinear", {"x": x, "s": scale[:2], "zp": np.array([7, 60000], np.uint16)}, {"axis": 0},
               opset=21)


def test_quantize_linear_blocked():
    x = rand(3, 10, lo=-4, hi=4)
    scale = rand(3, 4, seed=3, lo=0.01, hi=0.1)  # ceil(10 / 3) blocks: the last one is short
    zp = _full((3, 4), "int8", 7) // 4
    check_node("QuantizeLinear", {"x": x, "s": scale, "zp": zp}, {"axis": 1, "block_size": 3}, opset=21)


def test_quantize_linear_float16():
    x = rand(4, 6, lo=-2, hi=2).astype(np.float16)
    check_node("QuantizeLinear", {"x": x, "s": np.array(0.01, np.float16), "zp": np.array(3, np.int8)}, opset=19)


def test_dequantize_linear():
    x = _full((2, 3, 4), "uint8", 8)
    check_node("DequantizeLinear", {"x": x, "s": np.array(0.1, np.float32), "zp": np.array(120, np.uint8)},
               opset=13)
    x8 = _full((2, 3, 4), "int8", 9)
    check_node("DequantizeLinear", {"x": x8, "s": np.array([0.1, 2.0, 0.5], np.float32),
                                    "zp": np.array([0, -5, 100], np.int8)}, {"axis": 1}, opset=13)
    check_node("DequantizeLinear", {"x": _full((5, 4), "int32", 10), "s": np.array(1e-3, np.float32)}, opset=13)
    check_node("DequantizeLinear", {"x": _full((5, 4), "int16", 11), "s": np.array(0.25, np.float16),
                                    "zp": np.array(-7, np.int16)}, opset=21)


def test_dequantize_linear_blocked():
    x = _full((4, 6), "uint16", 12)
    scale = rand(2, 6, seed=4, lo=0.01, hi=0.1)
    zp = _full((2, 6), "uint16", 13)
    check_node("DequantizeLinear", {"x": x, "s": scale, "zp": zp}, {"axis": 0, "block_size": 2}, opset=21)


def test_quantize_linear_bad_scale_shape():
    with pytest.raises(InputError, match="y_scale"):
        _convert("QuantizeLinear", {"x": rand(2, 3), "s": rand(4, lo=0.1), "zp": np.zeros(4, np.uint8)},
                 {"axis": 1}, opset=13)


@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 3), (1,)])
def test_dynamic_quantize_linear(shape):
    check_node("DynamicQuantizeLinear", {"x": rand(*shape, lo=-2, hi=5)}, n_out=3, opset=11)


# ----------------------------------------------------------------------------- integer matmul / conv
# ONNX Runtime's u8 x s8 kernels on x86 add pairs of products in saturating 16-bit arithmetic,
# so signed weights stay small here (|w| < 64) to keep its results exact.
def _small_int8(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return (_full(shape, "int8", seed) // 4).astype(np.int8)


def test_matmul_integer():
    a, b = _full((4, 6), "uint8", 14), _small_int8((6, 5), 15)
    check_node("MatMulInteger", {"a": a, "b": b}, opset=10)
    check_node("MatMulInteger", {"a": a, "b": b, "azp": np.array(200, np.uint8),
                                 "bzp": np.array([0, -1, 5, 9, -12], np.int8)}, opset=10)
    check_node("MatMulInteger", {"a": _full((2, 3, 6), "int8", 16), "b": b, "azp": np.array(-3, np.int8),
                                 "bzp": np.array(4, np.int8)}, opset=10)


def test_matmul_integer_per_row_zero_point():
    # ONNX Runtime only takes a scalar a_zero_point; the spec also allows one per row of A.
    a, b = _full((4, 6), "uint8", 24), _full((6, 5), "uint8", 25)
    azp, bzp = np.array([1, 2, 3, 200], np.uint8), np.array([0, 1, 50, 9, 255], np.uint8)
    node = helper.make_node("MatMulInteger", ["a", "b", "azp", "bzp"], ["out"])
    feeds = {"a": a, "b": b, "azp": azp, "bzp": bzp}
    mod, params = kiln.frontend.from_onnx(make_model([node], feeds, ["out"], 10))
    got = evaluate(mod, feeds, params)[0]
    want = (a.astype(np.int64) - azp[:, None]) @ (b.astype(np.int64) - bzp)
    np.testing.assert_array_equal(got, want.astype(np.int32))


def test_matmul_integer_rejects_floats():
    with pytest.raises(InputError, match="A must have"):
        _convert("MatMulInteger", {"a": rand(2, 3), "b": rand(3, 2)}, opset=10)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_matmul(dtype):
    a, b = _full((3, 2, 7), dtype, 17), _full((7, 4), dtype, 18)
    zp = np.array(5 if dtype == "uint8" else -5, dtype)
    check_node("QLinearMatMul", {"a": a, "as": np.array(0.02, np.float32), "azp": zp, "b": b,
                                 "bs": np.array(0.03, np.float32), "bzp": zp, "ys": np.array(0.5, np.float32),
                                 "yzp": zp}, opset=10)


def test_conv_integer():
    x, w = _full((1, 3, 6, 7), "uint8", 19), _full((4, 3, 3, 3), "uint8", 20)
    check_node("ConvInteger", {"x": x, "w": w, "xzp": np.array(100, np.uint8)},
               {"pads": [1, 0, 1, 2], "strides": [2, 1]}, opset=10)
    check_node("ConvInteger", {"x": x, "w": w, "xzp": np.array(7, np.uint8), "wzp": np.array(200, np.uint8)},
               {"group": 1, "auto_pad": "SAME_UPPER"}, opset=10)


def test_qlinear_conv():
    x, w = _full((2, 4, 5, 5), "uint8", 21), _small_int8((6, 2, 3, 3), 22)
    inputs = {"x": x, "xs": np.array(0.05, np.float32), "xzp": np.array(128, np.uint8), "w": w,
              "ws": rand(6, seed=5, lo=0.001, hi=0.01), "wzp": np.zeros(6, np.int8),
              "ys": np.array(0.4, np.float32), "yzp": np.array(100, np.uint8),
              "b": np.random.default_rng(23).integers(-500, 500, 6).astype(np.int32)}
    check_node("QLinearConv", inputs, {"pads": [1, 1, 1, 1], "group": 2}, opset=10)
