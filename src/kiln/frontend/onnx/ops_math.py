"""Converters for elementwise math, comparisons, reductions, arg-reductions and TopK."""

from __future__ import annotations

import numpy as np

from ...ir import Value
from .converter import Context, onnx_op

_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
    "Sqrt": "sqrt", "Neg": "negative", "Abs": "abs", "Reciprocal": "reciprocal", "Erf": "erf",
    "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "Sin": "sin",
    "Cos": "cos", "Softplus": "softplus", "Softsign": "softsign", "HardSwish": "hard_swish",
    "Not": "logical_not", "IsNaN": "isnan", "Tan": "tan", "Asin": "asin", "Acos": "acos",
    "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh",
    "Atanh": "atanh", "Mish": "mish",
}

_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
    "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
    "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor",
}


@onnx_op(*_UNARY)
def _unary(ctx: Context, node, ins, attrs):
    return ctx.emit1(_UNARY[node.op_type], ins[0])


@onnx_op(*_BINARY)
def _binary(ctx: Context, node, ins, attrs):
    a, b = ins
    if ctx.opset < 7 and attrs.get("broadcast") and "axis" in attrs:
        # Legacy broadcasting: b's dims align with a's starting at `axis`.
        axis = attrs["axis"] + (a.type.ndim if attrs["axis"] < 0 else 0)
        b = ctx.reshape(b, b.shape + (1,) * (a.type.ndim - axis - b.type.ndim))
    return ctx.emit1(_BINARY[node.op_type], a, b)


@onnx_op("Pow")
def _pow(ctx: Context, node, ins, attrs):
    a, b = ins
    e = ctx.try_static(b)
    if (e is not None and e.size == 1 and a.dtype in ("float16", "bfloat16", "float32", "float64")
            and float(np.asarray(e).reshape(())) in (2.0, 3.0) and not a.is_constant):
        # x**2 (decomposed layer norms) and x**3 (tanh-GELU, as in GPT-2): multiplies, not a
        # power per element (GPT-2 small from torch.export vs ONNX: 320 vs 369 ms at 1 thread
        # before this, the torch frontend already doing it). The result is broadcast as Pow's.
        sq = ctx.emit1("multiply", a, a)
        y = sq if float(np.asarray(e).reshape(())) == 2.0 else ctx.emit1("multiply", sq, a)
        out_shape = np.broadcast_shapes(a.shape, tuple(b.shape))
        return y if y.shape == out_shape else ctx.emit1("broadcast_to", y, shape=out_shape)
    # Kernels see one dtype: bring the exponent to the base's dtype (folded if constant).
    return ctx.emit1("power", a, ctx.cast(b, a.dtype))


@onnx_op("Mod")
def _mod(ctx: Context, node, ins, attrs):
    fmod = bool(attrs.get("fmod", 0))
    if not fmod and ctx.opset < 28 and ins[0].dtype in ("float16", "bfloat16", "float32", "float64"):
        # Floored float remainder only exists from opset 28; before, the model is invalid.
        raise ctx.bad(f"fmod=0 needs integer inputs before opset 28, got {ins[0].dtype} "
                      f"(set fmod=1 for C fmod, opset {ctx.opset})")
    return ctx.emit1("mod", ins[0], ins[1], fmod=fmod)


@onnx_op("IsInf")
def _isinf(ctx: Context, node, ins, attrs):
    return ctx.emit1("isinf", ins[0], detect_positive=bool(attrs.get("detect_positive", 1)),
                     detect_negative=bool(attrs.get("detect_negative", 1)))


@onnx_op("Max", "Min", "Sum", "Mean")
def _variadic(ctx: Context, node, ins, attrs):
    op = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[node.op_type]
    vals = [v for v in ins if v is not None]
    acc = vals[0]
    for v in vals[1:]:
        acc = ctx.emit1(op, acc, v)
    if node.op_type == "Mean" and len(vals) > 1:
        acc = ctx.emit1("divide", acc, ctx.const(np.array(len(vals)), acc.dtype))
    if acc is vals[0] and len(vals) == 1:
        acc = ctx.emit1("identity", acc)
    return acc


@onnx_op("LeakyRelu")
def _leaky(ctx: Context, node, ins, attrs):
    return ctx.emit1("leaky_relu", ins[0], alpha=attrs.get("alpha", 0.01))


@onnx_op("Elu")
def _elu(ctx: Context, node, ins, attrs):
    return ctx.emit1("elu", ins[0], alpha=attrs.get("alpha", 1.0))


@onnx_op("Selu")
def _selu(ctx: Context, node, ins, attrs):
    kw = {k: attrs[k] for k in ("alpha", "gamma") if k in attrs}
    return ctx.emit1("selu", ins[0], **kw)


@onnx_op("HardSigmoid")
def _hard_sigmoid(ctx: Context, node, ins, attrs):
    return ctx.emit1("hard_sigmoid", ins[0], alpha=attrs.get("alpha", 0.2),
                     beta=attrs.get("beta", 0.5))


@onnx_op("Celu")
def _celu(ctx: Context, node, ins, attrs):
    return ctx.emit1("celu", ins[0], alpha=attrs.get("alpha", 1.0))


@onnx_op("Swish")
def _swish(ctx: Context, node, ins, attrs):
    return ctx.emit1("swish", ins[0], alpha=attrs.get("alpha", 1.0))


@onnx_op("Shrink")
def _shrink(ctx: Context, node, ins, attrs):
    return ctx.emit1("shrink", ins[0], lambd=attrs.get("lambd", 0.5), bias=attrs.get("bias", 0.0))


@onnx_op("ThresholdedRelu")
def _thresholded_relu(ctx: Context, node, ins, attrs):
    return ctx.emit1("thresholded_relu", ins[0], alpha=attrs.get("alpha", 1.0))


@onnx_op("PRelu")
def _prelu(ctx: Context, node, ins, attrs):
    x, slope = ins
    if ctx.opset < 7 and slope.type.ndim == 1 and x.type.ndim > 2 and slope.shape[0] > 1:
        # Opset < 7 slopes are per channel (axis 1).
        slope = ctx.reshape(slope, slope.shape + (1,) * (x.type.ndim - 2))
    return ctx.emit1("prelu", x, slope)


@onnx_op("Gelu")
def _gelu(ctx: Context, node, ins, attrs):
    return ctx.emit1("gelu", ins[0], approximate=attrs.get("approximate", "none"))


@onnx_op("Clip")
def _clip(ctx: Context, node, ins, attrs):
    x = ins[0]
    if ctx.opset < 11:
        return ctx.emit1("clip", x, a_min=attrs.get("min"), a_max=attrs.get("max"))
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    slo, shi = ctx.try_static(lo), ctx.try_static(hi)
    for v, what in ((slo, "min"), (shi, "max")):
        if v is not None and np.asarray(v).size != 1:
            raise ctx.bad(f"input {what!r} must be a scalar, got shape {np.asarray(v).shape}")
    if (lo is None or slo is not None) and (hi is None or shi is not None):
        return ctx.emit1("clip", x, a_min=None if slo is None else float(np.ravel(slo)[0]),
                         a_max=None if shi is None else float(np.ravel(shi)[0]))
    # Bounds computed at run time: max/min with broadcasting.
    if lo is not None:
        x = ctx.emit1("maximum", x, lo)
    if hi is not None:
        x = ctx.emit1("minimum", x, hi)
    return x


def _emit_cast(ctx: Context, x, dtype: str, attrs):
    """ONNX Cast / CastLike: ``saturate`` (opset 19+, float8 destinations) and ``round_mode``
    (opset 24+, float8e8m0 destinations) only matter for the low-precision types."""
    saturate = bool(int(attrs.get("saturate", 1)))
    round_mode = str(attrs.get("round_mode", "up"))
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.bad(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    if not (saturate and round_mode == "up"):
        return ctx.emit1("cast", x, dtype=dtype, saturate=saturate, round_mode=round_mode)
    return ctx.emit1("cast", x, dtype=dtype)


@onnx_op("Cast")
def _cast(ctx: Context, node, ins, attrs):
    from .converter import onnx_dtype

    return _emit_cast(ctx, ins[0], onnx_dtype(attrs["to"]), attrs)


@onnx_op("CastLike")
def _cast_like(ctx: Context, node, ins, attrs):
    return _emit_cast(ctx, ins[0], ins[1].dtype, attrs)


@onnx_op("Where")
def _where(ctx: Context, node, ins, attrs):
    return ctx.emit1("where", *ins)


# ----------------------------------------------------------------------------- reductions
def _reduce_axes(ctx: Context, node, ins, attrs, input_since: int) -> tuple[int, ...] | None:
    """Normalized axes, or None for the no-op case (empty axes + noop_with_empty_axes)."""
    x = ins[0]
    if ctx.opset >= input_since:
        axes = ctx.static_ints(ins[1], "axes") if len(ins) > 1 and ins[1] is not None else ()
    else:
        axes = tuple(attrs.get("axes", ()))
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return None
        return tuple(range(x.type.ndim))
    return tuple(sorted(ctx.axis(a, x.type.ndim) for a in axes))


def _reduce(ctx: Context, node, ins, attrs, op: str, input_since: int, pre=None, post=None
            ) -> Value:
    axes = _reduce_axes(ctx, node, ins, attrs, input_since)
    x = ins[0]
    if pre is not None:
        x = pre(x)
    if axes is None:
        return x if pre is not None else ctx.emit1("identity", x)
    y = ctx.emit1(op, x, axes=axes, keepdims=bool(attrs.get("keepdims", 1)))
    return post(y) if post is not None else y


@onnx_op("ReduceSum")
def _reduce_sum(ctx, node, ins, attrs):
    return _reduce(ctx, node, ins, attrs, "reduce_sum", 13)


@onnx_op("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")
def _reduce_simple(ctx, node, ins, attrs):
    op = "reduce_" + node.op_type[6:].lower()
    return _reduce(ctx, node, ins, attrs, op, 18)


@onnx_op("ReduceSumSquare")
def _reduce_sum_square(ctx, node, ins, attrs):
    return _reduce(ctx, node, ins, attrs, "reduce_sum", 18,
                   pre=lambda x: ctx.emit1("multiply", x, x))


@onnx_op("ReduceL1")
def _reduce_l1(ctx, node, ins, attrs):
    return _reduce(ctx, node, ins, attrs, "reduce_sum", 18, pre=lambda x: ctx.emit1("abs", x))


@onnx_op("ReduceL2")
def _reduce_l2(ctx, node, ins, attrs):
    return _reduce(ctx, node, ins, attrs, "reduce_sum", 18,
                   pre=lambda x: ctx.emit1("multiply", x, x),
                   post=lambda y: ctx.emit1("sqrt", y))


@onnx_op("ReduceLogSum")
def _reduce_log_sum(ctx, node, ins, attrs):
    return _reduce(ctx, node, ins, attrs, "reduce_sum", 18, post=lambda y: ctx.emit1("log", y))


@onnx_op("ReduceLogSumExp")
def _reduce_lse(ctx, node, ins, attrs):
    axes = _reduce_axes(ctx, node, ins, attrs, 18)
    x = ins[0]
    if axes is None:
        return ctx.emit1("identity", x)
    keep = bool(attrs.get("keepdims", 1))
    # Stable: max + log(sum(exp(x - max))).
    m = ctx.emit1("reduce_max", x, axes=axes, keepdims=True)
    s = ctx.emit1("reduce_sum", ctx.emit1("exp", ctx.emit1("subtract", x, m)), axes=axes,
                  keepdims=keep)
    m2 = m if keep else ctx.reshape(m, s.shape)
    return ctx.emit1("add", ctx.emit1("log", s), m2)


@onnx_op("ArgMax", "ArgMin")
def _arg(ctx, node, ins, attrs):
    axis = ctx.axis(attrs.get("axis", 0), ins[0].type.ndim)
    return ctx.emit1(node.op_type.lower(), ins[0], axis=axis,
                     keepdims=bool(attrs.get("keepdims", 1)),
                     select_last_index=bool(attrs.get("select_last_index", 0)))


@onnx_op("TopK")
def _topk(ctx, node, ins, attrs):
    x = ins[0]
    if ctx.opset < 10:
        k = attrs["k"]
    else:
        ks = ctx.static_ints(ins[1], "K")
        if len(ks) != 1:
            raise ctx.bad(f"input 'K' must hold one value, got {ks}")
        (k,) = ks
    axis = ctx.axis(attrs.get("axis", -1), x.type.ndim)
    if not 0 <= k <= x.shape[axis]:
        raise ctx.bad(f"k={k} is out of range for axis {axis} of size {x.shape[axis]}")
    return ctx.emit("topk", [x], {"k": k, "axis": axis, "largest": bool(attrs.get("largest", 1)),
                                  "sorted": bool(attrs.get("sorted", 1))})
