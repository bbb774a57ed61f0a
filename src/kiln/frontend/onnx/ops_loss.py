"""ONNX converters: losses and normalizations.

SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss, Hardmax, LpNormalization,
MeanVarianceNormalization and GroupNormalization.

Every op here decomposes into existing IR ops (arg-reductions, reductions, gathers and
elementwise math), so each one runs as ordinary fused kernels. Indices read from a target
tensor go through ``gather_elements`` / ``take``, which check them at run time: a class index
outside ``[-C, C)`` that is not the ``ignore_index`` fails instead of reading garbage.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import Value
from .converter import Context, onnx_op

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _require_float(ctx: Context, v: Value, what: str) -> None:
    if v.dtype not in _FLOAT_DTYPES:
        raise ctx.bad(f"input {what!r} must be a floating-point tensor, got {v.dtype}")


def _one_hot_argmax(ctx: Context, x: Value, axis: int) -> Value:
    """1 at the first maximum along ``axis``, 0 elsewhere, in ``x``'s dtype."""
    idx = ctx.emit1("argmax", x, axis=axis, keepdims=True, select_last_index=False)
    shape = [1] * x.type.ndim
    shape[axis] = x.shape[axis]
    # Compile-time constant positions along the axis; compared against the run-time argmax.
    iota = ctx.const(np.arange(x.shape[axis], dtype=np.int64).reshape(shape), idx.dtype)
    return ctx.emit1("cast", ctx.emit1("equal", idx, iota), dtype=x.dtype)


@onnx_op("Hardmax")
def _hardmax(ctx: Context, node, ins, attrs):
    x = ins[0]
    _require_float(ctx, x, "input")
    nd = x.type.ndim
    axis = ctx.axis(attrs.get("axis", -1 if ctx.opset >= 13 else 1), nd)
    if x.shape[axis] == 0:
        raise ctx.bad(f"axis {axis} of input shape {x.shape} is empty")
    if ctx.opset >= 13 or axis == nd - 1:
        return _one_hot_argmax(ctx, x, axis)
    # Opset < 13: the input is coerced to 2-D at `axis` and the max taken over the flat tail.
    flat = ctx.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return ctx.reshape(_one_hot_argmax(ctx, flat, 1), x.shape)


@onnx_op("LpNormalization")
def _lp_normalization(ctx: Context, node, ins, attrs):
    x = ins[0]
    _require_float(ctx, x, "input")
    axis = ctx.axis(attrs.get("axis", -1), x.type.ndim)
    p = attrs.get("p", 2)
    if p not in (1, 2):
        raise ctx.bad(f"p must be 1 or 2, got {p}")
    if p == 1:
        norm = ctx.emit1("reduce_sum", ctx.emit1("abs", x), axes=(axis,), keepdims=True)
    else:
        norm = ctx.emit1("sqrt", ctx.emit1("reduce_sum", ctx.emit1("multiply", x, x), axes=(axis,),
                                           keepdims=True))
    # An all-zero slice has norm 0: divide by 1 instead so it stays 0 (ONNX Runtime's result)
    # rather than becoming NaN.
    zero, one = ctx.const(np.array(0.0), x.dtype), ctx.const(np.array(1.0), x.dtype)
    safe = ctx.emit1("where", ctx.emit1("equal", norm, zero), one, norm)
    return ctx.emit1("divide", x, safe)


@onnx_op("MeanVarianceNormalization")
def _mean_variance_normalization(ctx: Context, node, ins, attrs):
    x = ins[0]
    _require_float(ctx, x, "input")
    raw = attrs.get("axes", (0, 2, 3))
    axes = tuple(sorted({ctx.axis(a, x.type.ndim, "axes entry") for a in raw}))
    if len(axes) != len(tuple(raw)):
        raise ctx.bad(f"axes {tuple(raw)} repeat an axis")
    mean = ctx.emit1("reduce_mean", x, axes=axes, keepdims=True)
    centered = ctx.emit1("subtract", x, mean)
    # Variance of the centered values (not E[x^2] - E[x]^2): same value, no cancellation.
    var = ctx.emit1("reduce_mean", ctx.emit1("multiply", centered, centered), axes=axes, keepdims=True)
    std = ctx.emit1("add", ctx.emit1("sqrt", var), ctx.const(np.array(1e-9), x.dtype))
    return ctx.emit1("divide", centered, std)


@onnx_op("GroupNormalization")
def _group_normalization(ctx: Context, node, ins, attrs):
    x, scale, bias = ins[0], ins[1], ins[2]
    _require_float(ctx, x, "X")
    if x.type.ndim < 2:
        raise ctx.bad(f"input 'X' must be at least 2-D (N, C, ...), got shape {x.shape}")
    groups = attrs["num_groups"]
    n, c = x.shape[:2]
    if groups < 1 or c % groups:
        raise ctx.bad(f"num_groups={groups} must be positive and divide the {c} channels")
    # Opset 18 has one scale/bias per group; opset 21 made them per channel.
    per = c if ctx.opset >= 21 else groups
    for v, what in ((scale, "scale"), (bias, "bias")):
        if v.shape != (per,) or v.dtype != x.dtype:
            raise ctx.bad(f"input {what!r} must be a {x.dtype} tensor of shape ({per},) at opset "
                          f"{ctx.opset}, got {v.dtype} {v.shape}")
    eps = float(attrs.get("epsilon", 1e-5))
    spatial = math.prod(x.shape[2:])
    # Each (n, group) is one instance of instance_norm over the group's channels and pixels.
    grouped = ctx.reshape(x, (n, groups, c // groups * spatial))
    if per == groups:
        return ctx.reshape(ctx.emit1("instance_norm", grouped, scale, bias, epsilon=eps), x.shape)
    ones = ctx.const(np.ones(groups), x.dtype)
    zeros = ctx.const(np.zeros(groups), x.dtype)
    y = ctx.reshape(ctx.emit1("instance_norm", grouped, ones, zeros, epsilon=eps), x.shape)
    chan = (c,) + (1,) * (x.type.ndim - 2)
    return ctx.emit1("add", ctx.emit1("multiply", y, ctx.reshape(scale, chan)), ctx.reshape(bias, chan))


def _nll(ctx: Context, logp: Value, target: Value, weight: Value | None, attrs) -> Value:
    """Negative log-likelihood of ``target`` under log-probabilities ``logp`` (N, C, d...)."""
    reduction = attrs.get("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise ctx.bad(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    if logp.type.ndim < 2:
        raise ctx.bad(f"input scores must be at least 2-D (N, C, d1, ...), got shape {logp.shape}")
    n, c = logp.shape[:2]
    want = (n,) + logp.shape[2:]
    if target.shape != want or target.dtype not in ("int32", "int64"):
        raise ctx.bad(f"target must be an int32/int64 tensor of shape {want}, got {target.dtype} "
                      f"{target.shape}")
    if weight is not None and (weight.shape != (c,) or weight.dtype != logp.dtype):
        raise ctx.bad(f"weight must be a {logp.dtype} tensor of shape ({c},), got {weight.dtype} "
                      f"{weight.shape}")
    ignore = attrs.get("ignore_index")
    mask = None
    safe_t = target
    if ignore is not None:
        mask = ctx.emit1("not_equal", target, ctx.const(np.array(ignore), target.dtype))
        # Ignored entries may hold any value (even out of range): read class 0 for them instead
        # and zero their loss below.
        safe_t = ctx.emit1("where", mask, target, ctx.const(np.array(0), target.dtype))
    picked = ctx.emit1("gather_elements", logp, ctx.reshape(safe_t, (n, 1) + logp.shape[2:]), axis=1)
    loss = ctx.emit1("negative", ctx.reshape(picked, want))
    w = None
    zero = ctx.const(np.array(0.0), logp.dtype)
    if weight is not None:
        w = ctx.emit1("take", weight, safe_t, axis=0)
        if mask is not None:
            w = ctx.emit1("where", mask, w, zero)
    elif mask is not None:
        w = ctx.emit1("cast", mask, dtype=logp.dtype)
    if w is not None:
        loss = ctx.emit1("multiply", loss, w)
    if reduction == "none":
        return loss
    axes = tuple(range(len(want)))
    total = ctx.emit1("reduce_sum", loss, axes=axes, keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return ctx.emit1("reduce_mean", loss, axes=axes, keepdims=False)
    # Weighted mean: divided by the total weight of the entries that count.
    return ctx.emit1("divide", total, ctx.emit1("reduce_sum", w, axes=axes, keepdims=False))


@onnx_op("NegativeLogLikelihoodLoss")
def _negative_log_likelihood_loss(ctx: Context, node, ins, attrs):
    _require_float(ctx, ins[0], "input")
    return _nll(ctx, ins[0], ins[1], ins[2] if len(ins) > 2 else None, attrs)


@onnx_op("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy_loss(ctx: Context, node, ins, attrs):
    scores = ins[0]
    _require_float(ctx, scores, "scores")
    if scores.type.ndim < 2:
        raise ctx.bad(f"input 'scores' must be at least 2-D (N, C, d1, ...), got shape {scores.shape}")
    logp = ctx.emit1("log_softmax", scores, axis=1)
    loss = _nll(ctx, logp, ins[1], ins[2] if len(ins) > 2 else None, attrs)
    return [loss, logp]
