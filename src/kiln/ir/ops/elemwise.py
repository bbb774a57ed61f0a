"""Elementwise and broadcasting ops."""

from __future__ import annotations

import math

import numpy as np

from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import LOW_PRECISION_DTYPES, TensorType, np_dtype
from ._util import Attrs, broadcast_shapes, norm_axis, require_float, same_dtype
from .lowp_ref import cast_low_precision

def _erf(x: np.ndarray) -> np.ndarray:
    # scipy is optional (math.erf is exact but slower) and imported on first use: importing
    # scipy.special costs ~0.25 s, which every process paid at `import kiln` for a reference
    # most builds never evaluate
    try:
        from scipy.special import erf as impl
    except ImportError:  # pragma: no cover
        impl = np.vectorize(math.erf, otypes=[np.float64])
    return impl(x.astype(np.float64))


# ----------------------------------------------------------------------------- type relations
def _unary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    return [ts[0]]


def _float_unary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ts[0])
    return [ts[0]]


def _celu_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ts[0])
    if attrs["alpha"] == 0.0:
        # exp(x / alpha) is undefined: refuse rather than fill the output with NaN.
        raise InputError("celu alpha must be non-zero, got 0.0")
    return [ts[0]]


def _numeric_unary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    if ts[0].dtype == "bool":
        raise InputError("input must be numeric, got bool")
    return [ts[0]]


def _bool_unary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    if ts[0].dtype != "bool":
        raise InputError(f"input must be bool, got {ts[0].dtype}")
    return [ts[0]]


def _float_pred_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ts[0])
    return [TensorType(ts[0].shape, "bool")]


def _binary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = same_dtype(ts)
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), dt)]


def _compare_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    same_dtype(ts)
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), "bool")]


def _logical_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    for t in ts:
        if t.dtype != "bool":
            raise InputError(f"inputs must be bool, got {t.dtype}")
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), "bool")]


def _power_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    # ONNX Pow allows a different exponent dtype; the result has the base's dtype.
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), ts[0].dtype)]


def _prelu_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    same_dtype(ts)
    # Unidirectional: the slope broadcasts to the data shape.
    if broadcast_shapes(ts[0].shape, ts[1].shape) != ts[0].shape:
        raise InputError(f"slope shape {ts[1].shape} does not broadcast to data shape "
                         f"{ts[0].shape}")
    return [ts[0]]


def _bias_add_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    same_dtype(ts)
    data, bias = ts
    axis = norm_axis(attrs["axis"], data.ndim)
    if bias.shape != (data.shape[axis],):
        raise InputError(f"bias shape {bias.shape} does not match data dim {axis} "
                         f"({data.shape[axis]}) of shape {data.shape}")
    return [data]


def _where_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    if ts[0].dtype != "bool":
        raise InputError(f"condition must be bool, got {ts[0].dtype}")
    dt = same_dtype(ts[1:], "x and y")
    return [TensorType(broadcast_shapes(*(t.shape for t in ts)), dt)]


def _cast_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    return [TensorType(ts[0].shape, attrs["dtype"])]


# ----------------------------------------------------------------------------- references
def _r1(fn):
    """Single-output reference from a unary array function."""
    return lambda xs, attrs: [fn(xs[0], attrs)]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x64))


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
    return 0.5 * x64 * (1.0 + _erf(x64 / math.sqrt(2.0)))


def _cast_back(fn):
    def run(x: np.ndarray, attrs: Attrs) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(x, attrs)).astype(x.dtype)
    return run


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        # C semantics: truncate toward zero (ONNX Div on integers).
        with np.errstate(all="ignore"):
            safe_b = np.where(b == 0, 1, b).astype(a.dtype)
            q = np.floor_divide(a, safe_b)
            if a.dtype.kind == "i":
                r = a - q * safe_b
                q = q + ((r != 0) & ((a < 0) != (safe_b < 0))).astype(a.dtype)
            return np.where(b == 0, 0, q).astype(a.dtype)
    with np.errstate(all="ignore"):
        return np.divide(a, b).astype(a.dtype)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if a.dtype.kind in "iu":
            return np.power(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype)
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def _mod(a: np.ndarray, b: np.ndarray, fmod: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        if fmod:
            return np.fmod(a, b).astype(a.dtype)
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            # ONNX (onnx >= 1.20 reference): fmod=0 on floats also takes the divisor's sign.
            return np.mod(a, b).astype(a.dtype)
        return np.mod(a, np.where(b == 0, 1, b)).astype(a.dtype)


def _shrink(x: np.ndarray, lambd: float, bias: float) -> np.ndarray:
    # Compared in float64 (like the kernels' float32 compute type) so that a half input does
    # not round the thresholds first.
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0.0))


def _binary(fn):
    def run(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        a, b = xs
        with np.errstate(all="ignore"):
            out = fn(a, b)
        return [np.asarray(out).astype(a.dtype, copy=False)]
    return run


def _compare(fn):
    return lambda xs, attrs: [np.asarray(fn(xs[0], xs[1]))]


def _prelu(xs, attrs):
    x, s = xs
    return [np.where(x < 0, x * s, x).astype(x.dtype)]


def _bias_add(xs, attrs):
    x, b = xs
    axis = norm_axis(attrs["axis"], x.ndim)
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    return [(x + b.reshape(shape)).astype(x.dtype)]


def _clip(x, attrs):
    lo, hi = attrs["a_min"], attrs["a_max"]
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        lo = max(lo, info.min) if lo is not None else info.min
        hi = min(hi, info.max) if hi is not None else info.max
        # Compare in float64 so that bounds like 2.5 behave the way ORT's cast bounds do.
        return np.clip(x, int(math.ceil(lo)) if lo > -math.inf else info.min,
                       int(math.floor(hi)) if hi < math.inf else info.max).astype(x.dtype)
    return np.minimum(np.maximum(x, lo if lo is not None else -np.inf),
                      hi if hi is not None else np.inf).astype(x.dtype)


# ----------------------------------------------------------------------------- registration
E, B = OpPattern.ELEMWISE, OpPattern.BROADCAST

_FLOAT_UNARY = {
    "sigmoid": (lambda x, a: _sigmoid(x), "1 / (1 + exp(-x))"),
    "tanh": (lambda x, a: np.tanh(x.astype(np.float64)), "tanh(x)"),
    "exp": (lambda x, a: np.exp(x.astype(np.float64)), "exp(x)"),
    "log": (lambda x, a: np.log(x.astype(np.float64)), "natural log"),
    "sqrt": (lambda x, a: np.sqrt(x.astype(np.float64)), "square root"),
    "rsqrt": (lambda x, a: 1.0 / np.sqrt(x.astype(np.float64)), "1 / sqrt(x)"),
    "erf": (lambda x, a: _erf(x), "Gauss error function"),
    "reciprocal": (lambda x, a: 1.0 / x.astype(np.float64), "1 / x"),
    "floor": (lambda x, a: np.floor(x), "floor"),
    "ceil": (lambda x, a: np.ceil(x), "ceil"),
    "round": (lambda x, a: np.round(x), "round half to even"),
    "sin": (lambda x, a: np.sin(x.astype(np.float64)), "sine"),
    "cos": (lambda x, a: np.cos(x.astype(np.float64)), "cosine"),
    "softplus": (lambda x, a: np.logaddexp(0.0, x.astype(np.float64)), "log(1 + exp(x))"),
    "softsign": (lambda x, a: x.astype(np.float64) / (1.0 + np.abs(x.astype(np.float64))),
                 "x / (1 + |x|)"),
    "hard_swish": (lambda x, a: x.astype(np.float64)
                   * np.clip(x.astype(np.float64) / 6.0 + 0.5, 0.0, 1.0),
                   "x * max(0, min(1, x / 6 + 1/2))"),
    "tan": (lambda x, a: np.tan(x.astype(np.float64)), "tangent"),
    "asin": (lambda x, a: np.arcsin(x.astype(np.float64)), "arcsine"),
    "acos": (lambda x, a: np.arccos(x.astype(np.float64)), "arccosine"),
    "atan": (lambda x, a: np.arctan(x.astype(np.float64)), "arctangent"),
    "sinh": (lambda x, a: np.sinh(x.astype(np.float64)), "hyperbolic sine"),
    "cosh": (lambda x, a: np.cosh(x.astype(np.float64)), "hyperbolic cosine"),
    "asinh": (lambda x, a: np.arcsinh(x.astype(np.float64)), "inverse hyperbolic sine"),
    "acosh": (lambda x, a: np.arccosh(x.astype(np.float64)), "inverse hyperbolic cosine"),
    "atanh": (lambda x, a: np.arctanh(x.astype(np.float64)), "inverse hyperbolic tangent"),
    "mish": (lambda x, a: x.astype(np.float64) * np.tanh(np.logaddexp(0.0, x.astype(np.float64))),
             "x * tanh(log(1 + exp(x)))"),
}

for _name, (_fn, _doc) in _FLOAT_UNARY.items():
    register_op(_name, type_rel=_float_unary_rel, pattern=E, ref=_r1(_cast_back(_fn)), doc=_doc,
                inputs=("data",))

_NUMERIC_UNARY = {
    "relu": (lambda x, a: np.maximum(x, np.zeros((), x.dtype)), "max(x, 0)"),
    "negative": (lambda x, a: np.negative(x), "-x"),
    "abs": (lambda x, a: np.abs(x), "|x|"),
    "sign": (lambda x, a: np.sign(x), "sign(x) in {-1, 0, 1}"),
}
for _name, (_fn, _doc) in _NUMERIC_UNARY.items():
    register_op(_name, type_rel=_numeric_unary_rel, pattern=E, ref=_r1(_cast_back(_fn)),
                doc=_doc, inputs=("data",))

register_op("identity", type_rel=_unary_rel, pattern=E, ref=_r1(lambda x, a: x.copy()),
            doc="copy of the input (removed by Simplify)", inputs=("data",))
register_op("dropout", attrs={"rate": ("float", 0.5)}, type_rel=_unary_rel, pattern=E,
            ref=_r1(lambda x, a: x.copy()),
            doc="inference-mode dropout = identity (removed by Simplify)", inputs=("data",))
register_op("logical_not", type_rel=_bool_unary_rel, pattern=E,
            ref=_r1(lambda x, a: np.logical_not(x)), doc="not x", inputs=("data",))
register_op("isnan", type_rel=_float_pred_rel, pattern=E,
            ref=_r1(lambda x, a: np.isnan(x.astype(np.float32))), doc="x != x",
            inputs=("data",))
register_op("isinf", attrs={"detect_positive": ("bool", True), "detect_negative": ("bool", True)},
            type_rel=_float_pred_rel, pattern=E,
            ref=_r1(lambda x, a: np.isinf(x.astype(np.float32))
                    & (((x > 0) & a["detect_positive"]) | ((x < 0) & a["detect_negative"]))),
            doc="x is +-inf (each sign selectable)", inputs=("data",))

register_op("leaky_relu", attrs={"alpha": ("float", 0.01)}, type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: np.where(x >= 0, x, x.astype(np.float64) * a["alpha"]))),
            doc="x if x >= 0 else alpha * x", inputs=("data",))
register_op("elu", attrs={"alpha": ("float", 1.0)}, type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: np.where(
                x > 0, x, a["alpha"] * np.expm1(np.minimum(x.astype(np.float64), 0.0))))),
            doc="x if x > 0 else alpha * (exp(x) - 1)", inputs=("data",))
register_op("selu", attrs={"alpha": ("float", 1.67326319217681884765625),
                           "gamma": ("float", 1.05070102214813232421875)},
            type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: a["gamma"] * np.where(
                x > 0, x, a["alpha"] * np.expm1(np.minimum(x.astype(np.float64), 0.0))))),
            doc="gamma * (x if x > 0 else alpha * (exp(x) - 1))", inputs=("data",))
register_op("hard_sigmoid", attrs={"alpha": ("float", 0.2), "beta": ("float", 0.5)},
            type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: np.clip(
                a["alpha"] * x.astype(np.float64) + a["beta"], 0.0, 1.0))),
            doc="max(0, min(1, alpha * x + beta))", inputs=("data",))
register_op("celu", attrs={"alpha": ("float", 1.0)}, type_rel=_celu_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: np.where(
                x > 0, x, a["alpha"] * np.expm1(np.minimum(x.astype(np.float64), 0.0) / a["alpha"])))),
            doc="x if x > 0 else alpha * (exp(x / alpha) - 1)", inputs=("data",))
register_op("swish", attrs={"alpha": ("float", 1.0)}, type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: x.astype(np.float64) * _sigmoid(a["alpha"] * x.astype(np.float64)))),
            doc="x * sigmoid(alpha * x)", inputs=("data",))
register_op("shrink", attrs={"lambd": ("float", 0.5), "bias": ("float", 0.0)}, type_rel=_numeric_unary_rel,
            pattern=E, ref=_r1(_cast_back(lambda x, a: _shrink(x.astype(np.float64), a["lambd"], a["bias"]))),
            doc="x + bias if x < -lambd, x - bias if x > lambd, else 0 (integers: computed in float64, "
                "truncated back)", inputs=("data",))
register_op("thresholded_relu", attrs={"alpha": ("float", 1.0)}, type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: np.where(x.astype(np.float64) > a["alpha"], x, np.zeros((), x.dtype)))),
            doc="x if x > alpha else 0", inputs=("data",))
register_op("gelu", attrs={"approximate": ("str", "none")}, type_rel=_float_unary_rel, pattern=E,
            ref=_r1(_cast_back(lambda x, a: _gelu(x, a["approximate"]))),
            doc='0.5 x (1 + erf(x / sqrt 2)); approximate="tanh" uses the tanh formula',
            inputs=("data",))
register_op("clip", attrs={"a_min": ("float", None), "a_max": ("float", None)},
            type_rel=_numeric_unary_rel, pattern=E, ref=_r1(_clip),
            doc="min(max(x, a_min), a_max); None = unbounded", inputs=("data",))
register_op("cast", attrs={"dtype": ("dtype", REQUIRED), "saturate": ("bool", True), "round_mode": ("str", "up")},
            type_rel=_cast_rel, pattern=E,
            ref=_r1(lambda x, a: _cast(x, a["dtype"], a["saturate"], a["round_mode"])),
            doc="convert to dtype (float->int truncates toward zero, ->bool is x != 0); to or from a "
                "low-precision type (float8, float4, int4, ...) with ONNX Cast's rules: saturate (float8) "
                "and round_mode (float8_e8m0fnu) as ONNX Cast's attributes",
            inputs=("data",))


def _cast(x: np.ndarray, dtype: str, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    if dtype in LOW_PRECISION_DTYPES or x.dtype.name in LOW_PRECISION_DTYPES:
        if x.dtype.name == dtype:
            return x.copy()
        return cast_low_precision(x, dtype, saturate, round_mode)
    dt = np_dtype(dtype)
    with np.errstate(all="ignore"):
        if dtype == "bool":
            return x != 0
        if x.dtype.name == "bfloat16" and dtype != "float32":
            x = x.astype(np.float32)
        if dtype == "bfloat16" and x.dtype.kind in "iub":
            x = x.astype(np.float32)
        return x.astype(dt)


_BINARY = {
    "add": (np.add, "a + b"),
    "subtract": (np.subtract, "a - b"),
    "multiply": (np.multiply, "a * b"),
    "maximum": (np.maximum, "max(a, b)"),
    "minimum": (np.minimum, "min(a, b)"),
}
for _name, (_fn, _doc) in _BINARY.items():
    register_op(_name, type_rel=_binary_rel, pattern=B, ref=_binary(_fn), num_inputs=2,
                doc=_doc, inputs=("lhs", "rhs"))
register_op("divide", type_rel=_binary_rel, pattern=B,
            ref=lambda xs, a: [_div(xs[0], xs[1])], num_inputs=2,
            doc="a / b (integers: truncate toward zero, x / 0 = 0)", inputs=("lhs", "rhs"))
register_op("power", type_rel=_power_rel, pattern=B,
            ref=lambda xs, a: [_pow(xs[0], xs[1])], num_inputs=2,
            doc="a ** b (b may have another dtype; result has a's dtype)", inputs=("lhs", "rhs"))
register_op("mod", attrs={"fmod": ("bool", False)}, type_rel=_binary_rel, pattern=B,
            ref=lambda xs, a: [_mod(xs[0], xs[1], a["fmod"])], num_inputs=2,
            doc="remainder; fmod=False: sign of divisor (Python %; int x % 0 = 0), fmod=True: C fmod",
            inputs=("lhs", "rhs"))

_COMPARE = {
    "equal": (np.equal, "a == b"),
    "not_equal": (np.not_equal, "a != b"),
    "less": (np.less, "a < b"),
    "less_equal": (np.less_equal, "a <= b"),
    "greater": (np.greater, "a > b"),
    "greater_equal": (np.greater_equal, "a >= b"),
}
for _name, (_fn, _doc) in _COMPARE.items():
    register_op(_name, type_rel=_compare_rel, pattern=B, ref=_compare(_fn), num_inputs=2,
                doc=_doc + " -> bool", inputs=("lhs", "rhs"))
for _name, _fn in (("logical_and", np.logical_and), ("logical_or", np.logical_or),
                   ("logical_xor", np.logical_xor)):
    register_op(_name, type_rel=_logical_rel, pattern=B, ref=_compare(_fn), num_inputs=2,
                doc=f"{_name.split('_')[1]} of two bool tensors", inputs=("lhs", "rhs"))

register_op("prelu", type_rel=_prelu_rel, pattern=B, ref=_prelu, num_inputs=2,
            doc="x if x >= 0 else slope * x (slope broadcasts to x)", inputs=("data", "slope"))
register_op("bias_add", attrs={"axis": ("int", 1)}, type_rel=_bias_add_rel, pattern=B,
            ref=_bias_add, num_inputs=2,
            doc="data + bias along axis (bias is 1-D of size data.shape[axis])",
            inputs=("data", "bias"))
register_op("where", type_rel=_where_rel, pattern=B,
            ref=lambda xs, a: [np.where(xs[0], xs[1], xs[2]).astype(xs[1].dtype)], num_inputs=3,
            doc="cond ? x : y with broadcasting", inputs=("cond", "x", "y"))

del _name, _fn, _doc
