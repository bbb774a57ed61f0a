"""Elementwise and broadcasting ops: every kernel against the IR op's NumPy reference."""

from __future__ import annotations

import pytest

from tests.topi.harness import Case, case_params, ints, module_builder, normal, positive, run_and_check, uniform

S = (3, 7, 19)  # odd shape: exercises vector tails and fused outer loops
F32 = "float32"

CASES: list[Case] = []

# ---- float unary math and activations
for op in ("sigmoid", "tanh", "exp", "erf", "floor", "ceil", "sin", "cos", "softplus", "softsign",
           "hard_swish", "relu", "negative", "abs", "sign", "identity", "dropout", "gelu", "elu", "selu",
           "hard_sigmoid", "leaky_relu"):
    CASES.append(Case(op, [(S, F32, uniform(-4, 4))]))
for op in ("log", "sqrt", "rsqrt", "reciprocal"):
    CASES.append(Case(op, [(S, F32, positive)]))
CASES += [
    Case("round", [((5, 33), F32, lambda r, s, d: (r.integers(-20, 20, s) / 4.0).astype(d))], label="ties"),
    Case("softplus", [((41,), F32, uniform(-60, 60))], label="wide"),
    Case("gelu", [(S, F32, uniform(-4, 4))], {"approximate": "tanh"}, label="tanh"),
    Case("leaky_relu", [(S, F32, uniform(-4, 4))], {"alpha": 0.3}, label="a03"),
    Case("elu", [(S, F32, uniform(-4, 4))], {"alpha": 0.5}, label="a05"),
    Case("hard_sigmoid", [(S, F32, uniform(-6, 6))], {"alpha": 0.25, "beta": 0.4}, label="ab"),
    Case("exp", [((2, 3, 5), "float16", uniform(-3, 3))]),
    # ---- trigonometric / hyperbolic (inverse functions inside their domains)
    Case("tan", [(S, F32, uniform(-1.4, 1.4))]),
    Case("asin", [(S, F32, uniform(-0.99, 0.99))]),
    Case("acos", [(S, F32, uniform(-0.99, 0.99))]),
    Case("atan", [(S, F32, uniform(-8, 8))]),
    Case("sinh", [(S, F32, uniform(-4, 4))]),
    Case("cosh", [(S, F32, uniform(-4, 4))]),
    Case("asinh", [(S, F32, uniform(-8, 8))]),
    Case("acosh", [(S, F32, uniform(1.0, 8))]),
    Case("atanh", [(S, F32, uniform(-0.99, 0.99))]),
    Case("acos", [((2, 3, 5), "float16", uniform(-0.9, 0.9))], label="half"),
    Case("mish", [(S, F32, uniform(-6, 6))]),
    Case("mish", [((41,), F32, uniform(-60, 60))], label="wide"),
    Case("celu", [(S, F32, uniform(-4, 4))]),
    Case("celu", [(S, F32, uniform(-4, 4))], {"alpha": 2.5}, label="a25"),
    Case("swish", [(S, F32, uniform(-6, 6))]),
    Case("swish", [(S, F32, uniform(-6, 6))], {"alpha": 0.7}, label="a07"),
    Case("shrink", [(S, F32, uniform(-2, 2))]),
    Case("shrink", [(S, F32, uniform(-2, 2))], {"lambd": 1.0, "bias": 0.25}, label="soft"),
    Case("shrink", [((2, 3, 5), "bfloat16", uniform(-2, 2))], {"lambd": 0.3, "bias": 0.1}, label="bf16"),
    Case("shrink", [((4, 33), "int32", ints(-9, 9))], {"lambd": 1.5, "bias": 1.5}, label="int"),
    Case("shrink", [((4, 33), "int8", ints(-9, 9))], {"lambd": 2.0, "bias": 0.5}, label="int8"),
    Case("thresholded_relu", [(S, F32, uniform(-3, 3))]),
    Case("thresholded_relu", [(S, F32, uniform(-3, 3))], {"alpha": -0.5}, label="neg"),
    Case("sigmoid", [((2, 3, 5), "bfloat16", uniform(-3, 3))]),
    Case("tanh", [((2, 3, 5), "float64", uniform(-3, 3))]),
    Case("relu", [((4, 33), "int32")]),
    Case("relu", [((4, 33), "bfloat16")]),
    Case("negative", [((4, 33), "int8")]),
    Case("abs", [((4, 33), "int64")]),
    Case("sign", [((4, 33), "int32")]),
    Case("sign", [((4, 33), "uint8")]),
    Case("exp", [((), F32)], label="scalar"),
    Case("logical_not", [((5, 17), "bool")]),
    Case("isnan", [((5, 17), F32, lambda r, s, d: r.choice([0.0, 1.5, float("nan"), float("inf")], s).astype(d))]),
    Case("isinf", [((5, 17), F32, lambda r, s, d: r.choice([0.0, -float("inf"), float("nan"), float("inf")],
                                                          s).astype(d))]),
    Case("isinf", [((5, 17), F32, lambda r, s, d: r.choice([0.0, -float("inf"), float("inf")], s).astype(d))],
         {"detect_negative": False}, label="pos"),
    Case("isinf", [((5, 17), F32, lambda r, s, d: r.choice([0.0, -float("inf"), float("inf")], s).astype(d))],
         {"detect_positive": False}, label="neg"),
    Case("clip", [(S, F32)], {"a_min": -0.5, "a_max": 0.7}),
    Case("clip", [(S, F32)], {"a_min": -0.5}, label="lo"),
    Case("clip", [(S, F32)], {"a_max": 0.25}, label="hi"),
    Case("clip", [((4, 33), "int32")], {"a_min": -2.5, "a_max": 7.5}, label="int"),
    Case("clip", [((4, 33), "uint8")], {"a_min": -3.0, "a_max": 20.0}, label="uint"),
    Case("clip", [((4, 33), "float16")], {"a_min": -0.3, "a_max": 0.3}, label="half"),
    # ---- casts
    Case("cast", [(S, F32, uniform(-100, 100))], {"dtype": "int32"}, label="f2i"),
    Case("cast", [(S, F32, uniform(0, 250))], {"dtype": "uint8"}, label="f2u8"),
    Case("cast", [(S, F32, lambda r, s, d: r.choice([0.0, 1.5, -2.0], s).astype(d))], {"dtype": "bool"},
         label="f2b"),
    Case("cast", [(S, "int32")], {"dtype": F32}, label="i2f"),
    Case("cast", [(S, "int64")], {"dtype": "int8"}, label="i64i8"),
    Case("cast", [(S, F32)], {"dtype": "float16"}, label="f2h"),
    Case("cast", [(S, F32)], {"dtype": "bfloat16"}, label="f2bf"),
    Case("cast", [(S, "bfloat16", uniform(-50, 50))], {"dtype": "int32"}, label="bf2i"),
    Case("cast", [(S, "int32")], {"dtype": "bfloat16"}, label="i2bf"),
    Case("cast", [(S, "bool")], {"dtype": F32}, label="b2f"),
    Case("cast", [(S, "float16")], {"dtype": "float64"}, label="h2d"),
]

# ---- broadcasting binary ops
BCAST = [((3, 7, 19), (7, 1)), ((5, 1, 6), (1, 4, 1)), ((37,), ())]
for op in ("add", "subtract", "multiply", "maximum", "minimum", "divide"):
    for a, b in BCAST[:2]:
        CASES.append(Case(op, [(a, F32), (b, F32)]))
CASES += [
    Case("add", [((37,), F32), ((), F32)], label="scalar"),
    Case("add", [((6, 9), "float16"), ((9,), "float16")]),
    Case("multiply", [((6, 9), "bfloat16"), ((6, 1), "bfloat16")]),
    Case("add", [((6, 9), "int8"), ((9,), "int8")]),
    Case("subtract", [((6, 9), "uint8"), ((6, 9), "uint8")]),
    Case("multiply", [((6, 9), "int64"), ((1, 9), "int64")]),
    Case("divide", [((6, 19), "int32"), ((6, 19), "int32", ints(-4, 5))], label="int"),
    Case("divide", [((6, 19), "uint16"), ((1, 19), "uint16", ints(0, 5))], label="uint"),
    Case("divide", [((6, 19), "float16"), ((19,), "float16", positive)], label="half"),
    Case("mod", [((6, 19), "int32"), ((6, 19), "int32", ints(-4, 5))], label="int"),
    Case("mod", [((6, 19), "int32"), ((6, 19), "int32", ints(-4, 5))], {"fmod": True}, label="int_fmod"),
    Case("mod", [((6, 19), F32), ((19,), F32, uniform(0.5, 2))], {"fmod": True}, label="float"),
    Case("mod", [((6, 19), F32, uniform(-9, 9)), ((6, 19), F32, uniform(-3, 3))], label="float_floored"),
    Case("mod", [((6, 19), "float16", uniform(-9, 9)), ((19,), "float16", uniform(-3, 3))], label="half_floored"),
    Case("mod", [((6, 19), "float64", uniform(-9, 9)), ((6, 19), "float64", uniform(-3, 3))],
         {"fmod": True}, label="f64_fmod"),
    Case("power", [((6, 19), F32, positive), ((6, 19), F32)], label="float"),
    Case("power", [((6, 19), F32, positive), ((19,), "int32", ints(-2, 3))], label="f_i"),
    Case("power", [((6, 19), "int32", ints(-3, 4)), ((6, 19), "int32", ints(0, 5))], label="int"),
    Case("maximum", [((6, 19), "int16"), ((19,), "int16")], label="int"),
]
for op in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    CASES.append(Case(op, [((5, 1, 7), "int32", ints(-2, 3)), ((3, 7), "int32", ints(-2, 3))]))
CASES.append(Case("less", [((5, 9), F32), ((9,), F32)], label="float"))
for op in ("logical_and", "logical_or", "logical_xor"):
    CASES.append(Case(op, [((5, 1, 7), "bool"), ((3, 7), "bool")]))
CASES += [
    Case("prelu", [((2, 5, 7, 9), F32), ((5, 1, 1), F32)]),
    Case("prelu", [((3, 17), F32), ((17,), F32)], label="lastdim"),
    Case("bias_add", [((2, 5, 7, 9), F32), ((5,), F32)]),
    Case("bias_add", [((3, 17), F32), ((17,), F32)], {"axis": -1}, label="last"),
    Case("where", [((5, 1, 7), "bool"), ((3, 7), F32), ((5, 3, 1), F32)]),
    Case("where", [((11,), "bool"), ((11,), "int64"), ((), "int64")], label="int"),
]

get_module = module_builder(CASES, "ew")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_elemwise(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


_ = normal
