"""ONNX converters: integer and bit-level ops (bitwise, BitShift, BitCast) and the quantized ops.

The quantized ops are decomposed into existing IR ops, each of which has a kernel:

- ``DequantizeLinear``: ``(int32(x) - int32(zero_point)) * scale`` in float32, cast to the
  output type; a float8 / float4 ``x`` is decoded to float32 instead of int32;
- ``QuantizeLinear``: ``clip(round(x / scale) + zero_point, qmin, qmax)`` in float32 (round
  half to even), cast to the quantized type (int4 / uint4 / int2 / uint2 included); to a float8
  / float4 type it is ``cast(x / scale + zero_point)`` with the node's ``saturate``, rounding
  to the nearest even float8 value (the casts to and from the low-precision types are the
  ``cast`` op's kernels, :mod:`kiln.topi.lowp_cast`);
- ``MatMulInteger`` / ``ConvInteger``: the zero points are subtracted in int32 and the product
  is an int32 ``matmul`` / ``dense`` / ``conv2d`` (subtracting before padding is the same as
  padding with the zero point);
- ``QLinearMatMul`` / ``QLinearConv``: the int32 product requantized with the multiplier
  ``a_scale * b_scale / y_scale``, as ONNX Runtime computes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Value
from .converter import Context, onnx_dtype, onnx_op
from .ops_nn import _conv as _onnx_conv
from .ops_nn import _matmul as _onnx_matmul

#: Integer types a QuantizeLinear result may have, with their saturation bounds (exact in float32).
_QRANGE: dict[str, tuple[int, int]] = {
    "int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
    "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3),
}
#: Float types a QuantizeLinear result may have (no rounding to integers; saturate applies to float8).
_QFLOATS = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")
_FLOATS = ("float32", "float16", "bfloat16", "float64")


def _one(res: Value | list[Value]) -> Value:
    """The single output of a converter (they may return a list)."""
    return res if isinstance(res, Value) else res[0]


def _f32(ctx: Context, v: Value) -> Value:
    return ctx.cast(v, "float32")


def _require(ctx: Context, v: Value, what: str, dtypes: tuple[str, ...]) -> None:
    if v.dtype not in dtypes:
        raise ctx.bad(f"{what} must have one of the types {', '.join(dtypes)}, got {v.dtype}")


# ----------------------------------------------------------------------------- bitwise / shift
_BITWISE = {"BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor"}


@onnx_op(*_BITWISE)
def _bitwise(ctx: Context, node, ins, attrs):
    return ctx.emit1(_BITWISE[node.op_type], ins[0], ins[1])


@onnx_op("BitwiseNot")
def _bitwise_not(ctx: Context, node, ins, attrs):
    return ctx.emit1("bitwise_not", ins[0])


@onnx_op("BitShift")
def _bit_shift(ctx: Context, node, ins, attrs):
    direction = str(attrs["direction"]).lower()
    if direction not in ("left", "right"):
        raise ctx.bad(f"direction must be 'LEFT' or 'RIGHT', got {attrs['direction']!r}")
    return ctx.emit1("bit_shift", ins[0], ins[1], direction=direction)


@onnx_op("BitCast")
def _bitcast(ctx: Context, node, ins, attrs):
    x, dst = ins[0], onnx_dtype(attrs["to"])
    if dst == x.dtype:
        return ctx.emit1("identity", x)
    return ctx.emit1("bitcast", x, dtype=dst)


# ----------------------------------------------------------------------------- (de)quantization
def _qparam(ctx: Context, p: Value, x: Value, axis: int, block_size: int, what: str) -> Value:
    """Scale or zero point ``p`` shaped to broadcast against ``x``.

    Per-tensor (one element) becomes a scalar, per-axis (1-D of ``x.shape[axis]``) gets size-1
    dims around ``axis``, and a blocked one (``block_size`` > 0: ``x``'s rank, ``axis`` holding
    ``ceil(n / block_size)`` blocks) is repeated block-wise along ``axis``.
    """
    if p.type.size == 1 and block_size <= 0:
        return ctx.reshape(p, ())
    nd = x.type.ndim
    ax = ctx.axis(axis, nd) if nd else 0
    if block_size > 0:
        if not nd:
            raise ctx.bad(f"blocked quantization (block_size {block_size}) needs an input of rank >= 1")
        n = x.shape[ax]
        blocks = -(-n // block_size)
        want = x.shape[:ax] + (blocks,) + x.shape[ax + 1:]
        if p.shape != want:
            raise ctx.bad(f"{what} of shape {p.shape} does not fit blocked quantization of a {x.shape} input "
                          f"(axis {ax}, block_size {block_size}: expected {want})")
        if blocks == n:
            return p
        idx = ctx.const(np.arange(n, dtype=np.int64) // block_size)
        return ctx.emit1("take", p, idx, axis=ax)
    if p.type.ndim != 1 or not nd or p.shape[0] != x.shape[ax]:
        raise ctx.bad(f"{what} of shape {p.shape} must be a scalar or 1-D of size {x.shape[ax] if nd else 1} "
                      f"(axis {axis} of the {x.shape} input)")
    return ctx.reshape(p, tuple(x.shape[ax] if i == ax else 1 for i in range(nd)))


def _quantize(ctx: Context, x: Value, scale: Value, zp: Value | None, out_dtype: str,
              saturate: bool = True) -> Value:
    """``saturate(round(x / scale) + zp)`` as ``out_dtype`` (shapes already broadcastable)."""
    if out_dtype in _QFLOATS:
        y = ctx.emit1("divide", _f32(ctx, x), _f32(ctx, scale))
        if zp is not None:
            zf = _f32(ctx, zp)
            if out_dtype != "float4_e2m1fn":
                # A float8 zero point is 0 (ONNX); adding -0.0 in its place keeps the sign of a
                # -0 quotient, as ONNX's reference (which leaves the float8 zero point out) does.
                zero = ctx.const(np.array(0.0, np.float32))
                zf = ctx.emit1("where", ctx.emit1("equal", zf, zero), ctx.const(np.array(-0.0, np.float32)), zf)
            y = ctx.emit1("add", y, zf)
        if saturate:
            return ctx.cast(y, out_dtype)
        return ctx.emit1("cast", y, dtype=out_dtype, saturate=False)
    if out_dtype not in _QRANGE:
        raise ctx.unsupported(f"quantizing to {out_dtype} (supported: {', '.join((*_QRANGE, *_QFLOATS))})")
    lo, hi = _QRANGE[out_dtype]
    y = ctx.emit1("round", ctx.emit1("divide", _f32(ctx, x), _f32(ctx, scale)))
    if zp is not None:
        y = ctx.emit1("add", y, _f32(ctx, zp))
    y = ctx.emit1("clip", y, a_min=float(lo), a_max=float(hi))
    return ctx.cast(y, out_dtype)


@onnx_op("QuantizeLinear")
def _quantize_linear(ctx: Context, node, ins, attrs):
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    _require(ctx, x, "input x", _FLOATS + ("int32",))
    _require(ctx, scale, "y_scale", _FLOATS)
    if zp is not None:
        out_dtype = zp.dtype
    elif attrs.get("output_dtype", 0):
        out_dtype = onnx_dtype(attrs["output_dtype"])
    else:
        out_dtype = "uint8"
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    scale = _qparam(ctx, scale, x, axis, block, "y_scale")
    if zp is not None:
        zp = _qparam(ctx, zp, x, axis, block, "y_zero_point")
    return _quantize(ctx, x, scale, zp, out_dtype, saturate=bool(int(attrs.get("saturate", 1))))


@onnx_op("DequantizeLinear")
def _dequantize_linear(ctx: Context, node, ins, attrs):
    x, scale = ins[0], ins[1]
    zp = ins[2] if len(ins) > 2 else None
    _require(ctx, x, "input x", (*_QRANGE, "int32", *_QFLOATS))
    _require(ctx, scale, "x_scale", _FLOATS)
    if zp is not None and zp.dtype != x.dtype:
        raise ctx.bad(f"x_zero_point has type {zp.dtype} but x has {x.dtype}; they must match")
    out_dtype = onnx_dtype(attrs["output_dtype"]) if attrs.get("output_dtype", 0) else scale.dtype
    axis, block = int(attrs.get("axis", 1)), int(attrs.get("block_size", 0))
    scale = _qparam(ctx, scale, x, axis, block, "x_scale")
    # float8 / float4 values decode exactly to float32; integers (up to 16 bits) go through int32
    wide = "float32" if x.dtype in _QFLOATS else "int32"
    q = ctx.cast(x, wide)
    if zp is not None:
        # Exact in int32 for every 8/16-bit input; int32 inputs have no zero point. A float8
        # zero point is 0 (ONNX), and x - 0 is x exactly (-0 included).
        q = ctx.emit1("subtract", q, ctx.cast(_qparam(ctx, zp, x, axis, block, "x_zero_point"), wide))
    y = ctx.emit1("multiply", _f32(ctx, q), _f32(ctx, scale))
    return ctx.cast(y, out_dtype)


@onnx_op("DynamicQuantizeLinear")
def _dynamic_quantize_linear(ctx: Context, node, ins, attrs):
    x = ins[0]
    _require(ctx, x, "input x", ("float32",))
    axes = tuple(range(x.type.ndim))
    zero = ctx.const(np.array(0.0, np.float32))
    # The range always includes 0 so that 0 is exactly representable.
    hi = ctx.emit1("maximum", ctx.emit1("reduce_max", x, axes=axes, keepdims=False), zero)
    lo = ctx.emit1("minimum", ctx.emit1("reduce_min", x, axes=axes, keepdims=False), zero)
    scale = ctx.emit1("divide", ctx.emit1("subtract", hi, lo), ctx.const(np.array(255.0, np.float32)))
    zp_f = ctx.emit1("round", ctx.emit1("clip", ctx.emit1("subtract", zero, ctx.emit1("divide", lo, scale)),
                                        a_min=0.0, a_max=255.0))
    zp = ctx.cast(zp_f, "uint8")
    return [_quantize(ctx, x, scale, zp, "uint8"), scale, zp]


# ----------------------------------------------------------------------------- integer matmul / conv
def _centered(ctx: Context, v: Value, zp: Value | None, what: str) -> Value:
    """``int32(v) - int32(zp)``; ``zp`` already shaped to broadcast against ``v``."""
    _require(ctx, v, what, ("int8", "uint8"))
    q = ctx.cast(v, "int32")
    if zp is None:
        return q
    if zp.dtype != v.dtype:
        raise ctx.bad(f"the zero point of {what} has type {zp.dtype} but {what} has {v.dtype}; they must match")
    return ctx.emit1("subtract", q, ctx.cast(zp, "int32"))


def _row_param(ctx: Context, p: Value, a: Value, what: str) -> Value:
    """A matmul left-operand parameter: scalar, or 1-D per row of ``a`` (shaped ``(M, 1)``)."""
    if p.type.size == 1:
        return ctx.reshape(p, ())
    rows = a.shape[-2] if a.type.ndim >= 2 else 1
    if p.type.ndim != 1 or p.shape[0] != rows:
        raise ctx.bad(f"{what} of shape {p.shape} must be a scalar or 1-D with one value per row of the "
                      f"{a.shape} input ({rows})")
    return ctx.reshape(p, (rows, 1))


def _col_param(ctx: Context, p: Value, b: Value, what: str) -> Value:
    """A matmul right-operand parameter: scalar, or 1-D per column of ``b``."""
    if p.type.size == 1:
        return ctx.reshape(p, ())
    cols = b.shape[-1]
    if p.type.ndim != 1 or p.shape[0] != cols:
        raise ctx.bad(f"{what} of shape {p.shape} must be a scalar or 1-D with one value per column of the "
                      f"{b.shape} input ({cols})")
    return p


def _int_matmul(ctx: Context, node: Any, a: Value, b: Value, a_zp: Value | None, b_zp: Value | None) -> Value:
    a_c = _centered(ctx, a, None if a_zp is None else _row_param(ctx, a_zp, a, "a_zero_point"), "A")
    b_c = _centered(ctx, b, None if b_zp is None else _col_param(ctx, b_zp, b, "b_zero_point"), "B")
    return _one(_onnx_matmul(ctx, node, [a_c, b_c], {}))


def _requantize(ctx: Context, acc: Value, multiplier: Value, y_zp: Value | None, out_dtype: str) -> Value:
    """``saturate(round(float(acc) * multiplier) + y_zp)``: ONNX Runtime's requantization."""
    lo, hi = _QRANGE[out_dtype]
    y = ctx.emit1("round", ctx.emit1("multiply", _f32(ctx, acc), multiplier))
    if y_zp is not None:
        y = ctx.emit1("add", y, _f32(ctx, y_zp))
    return ctx.cast(ctx.emit1("clip", y, a_min=float(lo), a_max=float(hi)), out_dtype)


def _scalar_param(ctx: Context, p: Value, what: str) -> Value:
    if p.type.size != 1:
        raise ctx.bad(f"{what} must be a scalar (per-tensor), got shape {p.shape}")
    return ctx.reshape(p, ())


@onnx_op("MatMulInteger")
def _matmul_integer(ctx: Context, node, ins, attrs):
    a, b = ins[0], ins[1]
    a_zp = ins[2] if len(ins) > 2 else None
    b_zp = ins[3] if len(ins) > 3 else None
    return _int_matmul(ctx, node, a, b, a_zp, b_zp)


@onnx_op("QLinearMatMul")
def _qlinear_matmul(ctx: Context, node, ins, attrs):
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale = ins[:7]
    y_zp = ins[7] if len(ins) > 7 else None
    for v, what in ((a_scale, "a_scale"), (b_scale, "b_scale"), (y_scale, "y_scale")):
        _require(ctx, v, what, _FLOATS)
    out_dtype = y_zp.dtype if y_zp is not None else "uint8"
    if out_dtype not in ("int8", "uint8"):
        raise ctx.bad(f"y_zero_point must be int8 or uint8, got {out_dtype}")
    acc = _int_matmul(ctx, node, a, b, a_zp, b_zp)
    a_s = _row_param(ctx, a_scale, a, "a_scale")
    b_s = _col_param(ctx, b_scale, b, "b_scale")
    mult = ctx.emit1("divide", ctx.emit1("multiply", _f32(ctx, a_s), _f32(ctx, b_s)),
                     _f32(ctx, _scalar_param(ctx, y_scale, "y_scale")))
    y_zp = None if y_zp is None else _scalar_param(ctx, y_zp, "y_zero_point")
    return _requantize(ctx, acc, mult, y_zp, out_dtype)


def _channel_param(ctx: Context, p: Value, w: Value, what: str) -> Value:
    """A conv weight parameter: scalar, or 1-D per output channel (shaped ``(M, 1, ..., 1)``)."""
    if p.type.size == 1:
        return ctx.reshape(p, ())
    m = w.shape[0]
    if p.type.ndim != 1 or p.shape[0] != m:
        raise ctx.bad(f"{what} of shape {p.shape} must be a scalar or 1-D with one value per output channel ({m})")
    return ctx.reshape(p, (m,) + (1,) * (w.type.ndim - 1))


def _int_conv(ctx: Context, node: Any, x: Value, w: Value, x_zp: Value | None, w_zp: Value | None,
              attrs: Any) -> Value:
    x_c = _centered(ctx, x, None if x_zp is None else _scalar_param(ctx, x_zp, "x_zero_point"), "x")
    w_c = _centered(ctx, w, None if w_zp is None else _channel_param(ctx, w_zp, w, "w_zero_point"), "w")
    return _one(_onnx_conv(ctx, node, [x_c, w_c], attrs))


@onnx_op("ConvInteger")
def _conv_integer(ctx: Context, node, ins, attrs):
    x, w = ins[0], ins[1]
    x_zp = ins[2] if len(ins) > 2 else None
    w_zp = ins[3] if len(ins) > 3 else None
    return _int_conv(ctx, node, x, w, x_zp, w_zp, attrs)


@onnx_op("QLinearConv")
def _qlinear_conv(ctx: Context, node, ins, attrs):
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale = ins[:7]
    y_zp = ins[7] if len(ins) > 7 else None
    bias = ins[8] if len(ins) > 8 else None
    for v, what in ((x_scale, "x_scale"), (w_scale, "w_scale"), (y_scale, "y_scale")):
        _require(ctx, v, what, _FLOATS)
    out_dtype = y_zp.dtype if y_zp is not None else "uint8"
    if out_dtype not in ("int8", "uint8"):
        raise ctx.bad(f"y_zero_point must be int8 or uint8, got {out_dtype}")
    acc = _int_conv(ctx, node, x, w, x_zp, w_zp, attrs)
    if bias is not None:
        _require(ctx, bias, "bias B", ("int32",))
        acc = ctx.emit1("bias_add", acc, bias, axis=1)
    # Per output channel: the multiplier broadcasts over (N, M, spatial...).
    w_s = _channel_param(ctx, w_scale, w, "w_scale")
    if w_s.type.ndim:
        w_s = ctx.reshape(w_s, (1, w.shape[0]) + (1,) * (acc.type.ndim - 2))
    mult = ctx.emit1("divide",
                     ctx.emit1("multiply", _f32(ctx, _scalar_param(ctx, x_scale, "x_scale")), _f32(ctx, w_s)),
                     _f32(ctx, _scalar_param(ctx, y_scale, "y_scale")))
    y_zp = None if y_zp is None else _scalar_param(ctx, y_zp, "y_zero_point")
    return _requantize(ctx, acc, mult, y_zp, out_dtype)
