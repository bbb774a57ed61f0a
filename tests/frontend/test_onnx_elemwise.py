"""Elementwise / broadcasting ops through from_onnx + the reference interpreter vs ORT."""

import numpy as np
import pytest

from kiln.runtime.errors import InputError
from onnx import helper

from tests.frontend.onnx_check import check_node, make_model, rand, run_kiln

UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Erf", "Floor", "Ceil", "Round",
         "Sign", "Sin", "Cos", "Softplus", "Softsign", "HardSwish", "Identity"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    check_node(op, {"x": rand(2, 3, 4, lo=-3, hi=3)})


@pytest.mark.parametrize("op", ["Sqrt", "Log", "Reciprocal"])
def test_unary_positive(op):
    check_node(op, {"x": rand(3, 5, lo=0.1, hi=4)})


@pytest.mark.parametrize("op,attrs", [
    ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.3}), ("Elu", {}), ("Elu", {"alpha": 0.5}),
    ("Selu", {}), ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
])
def test_unary_attrs(op, attrs):
    check_node(op, {"x": rand(2, 3, 4, lo=-4, hi=4)}, attrs)


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    check_node("Gelu", {"x": rand(2, 16, lo=-4, hi=4)}, {"approximate": approx}, opset=20)


def test_prelu():
    check_node("PRelu", {"x": rand(2, 3, 4, 4), "slope": rand(3, 1, 1, seed=1)})
    check_node("PRelu", {"x": rand(2, 3), "slope": rand(3, seed=2)})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)),
                                    ((2, 1, 4), (3, 1)), ((), (2, 2))])
def test_binary_broadcast(op, shapes):
    a = rand(*shapes[0], lo=-2, hi=2)
    b = rand(*shapes[1], seed=5, lo=0.5, hi=2)
    check_node(op, {"a": a, "b": b})


def test_int_div_truncates():
    a = np.array([7, -7, 7, -7, 0, 9], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, 4], dtype=np.int64)
    check_node("Div", {"a": a, "b": b})
    check_node("Div", {"a": a.astype(np.int32), "b": b.astype(np.int32)})


def test_int_arith():
    a = rand(3, 4, dtype="int64", lo=-10, hi=10)
    b = rand(3, 4, dtype="int64", seed=3, lo=1, hi=5)
    for op in ("Add", "Sub", "Mul"):
        check_node(op, {"a": a, "b": b})


def test_pow():
    check_node("Pow", {"a": rand(3, 4, lo=0.1, hi=3), "b": rand(3, 4, seed=1, lo=-2, hi=2)})
    check_node("Pow", {"a": rand(3, 4, lo=-3, hi=3), "b": np.array(2.0, np.float32)})
    check_node("Pow", {"a": rand(3, 4, lo=-3, hi=3), "b": np.array(3, np.int64)}, opset=15)


def test_mod():
    a = np.array([5, -5, 5, -5, 7], dtype=np.int64)
    b = np.array([3, 3, -3, -3, 2], dtype=np.int64)
    check_node("Mod", {"a": a, "b": b})
    check_node("Mod", {"a": a, "b": b}, {"fmod": 1})
    check_node("Mod", {"a": rand(4, lo=-5, hi=5), "b": rand(4, seed=2, lo=1, hi=2)}, {"fmod": 1})


def test_mod_float_floored():
    # Opset 28: fmod=0 on floats takes the divisor's sign (NumPy / Python %).
    a = rand(3, 8, lo=-9, hi=9)
    b = rand(3, 8, seed=4, lo=-3, hi=3)
    check_node("Mod", {"a": a, "b": b}, opset=28)
    check_node("Mod", {"a": a.astype(np.float64), "b": b[0].astype(np.float64)}, opset=28)
    check_node("Mod", {"a": a, "b": b}, {"fmod": 1}, opset=28)


def test_mod_float_floored_needs_opset_28():
    feeds = {"a": rand(4), "b": rand(4, seed=2, lo=1, hi=2)}
    model = make_model([helper.make_node("Mod", ["a", "b"], ["out"], fmod=0)], feeds, ["out"], 17)
    with pytest.raises(InputError, match="fmod=0 needs integer inputs before opset 28"):
        run_kiln(model, feeds)


@pytest.mark.parametrize("op,lo,hi", [("Tan", -1.4, 1.4), ("Asin", -0.99, 0.99), ("Acos", -0.99, 0.99),
                                      ("Atan", -8, 8), ("Sinh", -4, 4), ("Cosh", -4, 4), ("Asinh", -8, 8),
                                      ("Acosh", 1, 8), ("Atanh", -0.99, 0.99), ("Mish", -8, 8)])
def test_unary_math(op, lo, hi):
    check_node(op, {"x": rand(2, 3, 5, lo=lo, hi=hi)}, opset=22 if op == "Mish" else 17)


@pytest.mark.parametrize("op,attrs,opset", [
    ("Celu", {}, 17), ("Celu", {"alpha": 2.0}, 17), ("Shrink", {}, 17),
    ("Shrink", {"lambd": 1.5, "bias": 0.5}, 17), ("ThresholdedRelu", {}, 17),
    ("ThresholdedRelu", {"alpha": 0.3}, 17), ("Swish", {}, 24), ("Swish", {"alpha": 0.5}, 24),
])
def test_activation_attrs(op, attrs, opset):
    check_node(op, {"x": rand(2, 3, 4, lo=-4, hi=4)}, attrs, opset=opset)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "float64"])
def test_shrink_dtypes(dtype):
    lo = 0 if dtype == "uint8" else -9
    check_node("Shrink", {"x": rand(3, 7, dtype=dtype, lo=lo, hi=9)}, {"lambd": 1.5, "bias": 1.5})


def test_celu_alpha_zero_rejected():
    feeds = {"x": rand(2, 3)}
    model = make_model([helper.make_node("Celu", ["x"], ["out"], alpha=0.0)], feeds, ["out"])
    with pytest.raises(InputError, match="celu alpha must be non-zero"):
        run_kiln(model, feeds)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic(op):
    check_node(op, {"a": rand(2, 3), "b": rand(3, seed=1), "c": rand(1, 3, seed=2)})
    check_node(op, {"a": rand(2, 3)})


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    a = rand(3, 4, dtype="int64", lo=0, hi=3)
    b = rand(4, dtype="int64", seed=1, lo=0, hi=3)
    check_node(op, {"a": a, "b": b})
    check_node(op, {"a": a.astype(np.float32), "b": b.astype(np.float32)})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    check_node(op, {"a": rand(3, 4, dtype="bool"), "b": rand(4, dtype="bool", seed=9)})


def test_not_isnan_isinf():
    check_node("Not", {"a": rand(3, 4, dtype="bool")})
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], dtype=np.float32)
    check_node("IsNaN", {"x": x})
    check_node("IsInf", {"x": x})
    check_node("IsInf", {"x": x}, {"detect_negative": 0})


def test_where():
    check_node("Where", {"c": rand(3, 1, dtype="bool"), "x": rand(3, 4), "y": rand(4, seed=1)})
    check_node("Where", {"c": rand(2, 3, dtype="bool"), "x": rand(2, 3, dtype="int64", hi=9),
                         "y": rand(2, 3, dtype="int64", seed=4, hi=9)})


@pytest.mark.parametrize("opset", [6, 11, 13])
def test_clip(opset):
    x = rand(3, 5, lo=-3, hi=3)
    if opset < 11:
        check_node("Clip", {"x": x}, {"min": -1.0, "max": 0.5}, opset=opset)
        check_node("Clip", {"x": x}, {"max": 0.5}, opset=opset)
    else:
        lo, hi = np.array(-1.0, np.float32), np.array(0.5, np.float32)
        check_node("Clip", {"x": x, "lo": lo, "hi": hi}, opset=opset, const_inputs=["lo", "hi"])
        check_node("Clip", {"x": x, "lo": None, "hi": hi}, opset=opset, const_inputs=["hi"])
        check_node("Clip", {"x": x, "lo": lo}, opset=opset, const_inputs=["lo"])
        check_node("Clip", {"x": x}, opset=opset)
        # run-time bounds become maximum/minimum
        mod = check_node("Clip", {"x": x, "lo": lo, "hi": hi}, opset=opset)
        assert "maximum" in mod.op_counts()


def test_clip_int():
    x = rand(10, dtype="int32", lo=-10, hi=10)
    check_node("Clip", {"x": x, "lo": np.array(-3, np.int32), "hi": np.array(4, np.int32)},
               opset=13, const_inputs=["lo", "hi"])


@pytest.mark.parametrize("src,dst", [("float32", 7), ("float32", 6), ("int64", 1), ("float32", 9),
                                     ("bool", 1), ("float32", 10),
                                     ("int32", 11)])
def test_cast(src, dst):
    x = rand(3, 4, dtype=src, lo=-5, hi=5) if src != "bool" else rand(3, 4, dtype="bool")
    if src == "float32":
        x[0, 0] = 2.5
        x[0, 1] = -2.7
    check_node("Cast", {"x": x}, {"to": dst}, opset=13)


def test_castlike():
    check_node("CastLike", {"x": rand(3, lo=-4, hi=4), "y": np.zeros(1, np.int32)}, opset=15)
