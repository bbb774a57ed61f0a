"""Converters for convolution, GEMM/MatMul, normalization, softmax, pooling, LRN, Resize."""

from __future__ import annotations

import math

import numpy as np

from ...ir import Value
from .converter import Context, onnx_op


# ----------------------------------------------------------------------------- helpers
def _lift_1d(ctx: Context, x: Value) -> Value:
    """(N, C, L) -> (N, C, 1, L): 1-D windows run as 2-D ones with H = 1."""
    return ctx.reshape(x, x.shape[:2] + (1,) + x.shape[2:])


def _window_attrs(ctx: Context, attrs: dict, in_spatial: tuple[int, ...],
                  kernel: tuple[int, ...], op_name: str, ceil: bool = False
                  ) -> tuple[tuple, tuple, tuple]:
    """(strides, dilations, pads in ONNX begin..end order) with auto_pad resolved."""
    nd = len(kernel)
    strides = tuple(attrs.get("strides", (1,) * nd))
    dil = tuple(attrs.get("dilations", (1,) * nd))
    pads = tuple(attrs.get("pads", (0,) * (2 * nd)))
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(in_spatial, kernel, strides, dil):
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        pads = tuple(begin + end)
    elif auto == "VALID":
        pads = (0,) * (2 * nd)
    elif auto != "NOTSET":
        raise ctx.unsupported(f"auto_pad={auto!r}")
    if len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise ctx.bad(f"strides/dilations/pads do not match a {nd}-D kernel")
    return strides, dil, pads


def _to2d(vals: tuple, nd: int, fill: int) -> tuple:
    return vals if nd == 2 else (fill,) + vals


def _pads2d(pads: tuple, nd: int) -> tuple:
    if nd == 2:
        return pads
    return (0, pads[0], 0, pads[1])


def _spatial_rank(ctx: Context, x: Value, what: str) -> int:
    nd = x.type.ndim - 2
    if nd not in (1, 2):
        raise ctx.unsupported(f"{what} on {nd}-D spatial data (only 1-D and 2-D are supported)")
    return nd


# ----------------------------------------------------------------------------- conv
@onnx_op("Conv")
def _conv(ctx: Context, node, ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = _spatial_rank(ctx, x, "Conv")
    kernel = tuple(attrs.get("kernel_shape", w.shape[2:]))
    strides, dil, pads = _window_attrs(ctx, attrs, x.shape[2:], kernel, "Conv")
    if nd == 1:
        x, w = _lift_1d(ctx, x), ctx.reshape(w, w.shape[:2] + (1,) + w.shape[2:])
    y = ctx.emit1("conv2d", x, w, strides=_to2d(strides, nd, 1), dilation=_to2d(dil, nd, 1),
                  padding=_pads2d(pads, nd), groups=attrs.get("group", 1))
    if b is not None:
        y = ctx.emit1("bias_add", y, b, axis=1)
    if nd == 1:
        y = ctx.reshape(y, y.shape[:2] + y.shape[3:])
    return y


@onnx_op("ConvTranspose")
def _conv_transpose(ctx: Context, node, ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = _spatial_rank(ctx, x, "ConvTranspose")
    kernel = tuple(attrs.get("kernel_shape", w.shape[2:]))
    strides = tuple(attrs.get("strides", (1,) * nd))
    dil = tuple(attrs.get("dilations", (1,) * nd))
    outpad = tuple(attrs.get("output_padding", (0,) * nd))
    pads = tuple(attrs.get("pads", (0,) * (2 * nd)))
    auto = attrs.get("auto_pad", "NOTSET")
    out_shape = attrs.get("output_shape")
    in_sp = x.shape[2:]
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        targets = tuple(out_shape)[-nd:] if out_shape is not None else \
            tuple(n * s for n, s in zip(in_sp, strides))
        begin, end = [], []
        for n, k, s, d, op_, t in zip(in_sp, kernel, strides, dil, outpad, targets):
            total = max(0, s * (n - 1) + op_ + (k - 1) * d + 1 - t)
            # As ONNX Runtime does: SAME_UPPER puts the odd pixel at the end, SAME_LOWER and
            # NOTSET (explicit output_shape) at the start.
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        pads = tuple(begin + end)
    elif auto == "VALID":
        pads = (0,) * (2 * nd)
    if nd == 1:
        x, w = _lift_1d(ctx, x), ctx.reshape(w, w.shape[:2] + (1,) + w.shape[2:])
    y = ctx.emit1("conv2d_transpose", x, w, strides=_to2d(strides, nd, 1),
                  dilation=_to2d(dil, nd, 1), padding=_pads2d(pads, nd),
                  output_padding=_to2d(outpad, nd, 0), groups=attrs.get("group", 1))
    if b is not None:
        y = ctx.emit1("bias_add", y, b, axis=1)
    if nd == 1:
        y = ctx.reshape(y, y.shape[:2] + y.shape[3:])
    return y


# ----------------------------------------------------------------------------- gemm / matmul
@onnx_op("Gemm")
def _gemm(ctx: Context, node, ins, attrs):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if attrs.get("transA", 0):
        a = ctx.emit1("transpose", a, axes=(1, 0))
    w = b if attrs.get("transB", 0) else ctx.emit1("transpose", b, axes=(1, 0))
    y = ctx.emit1("dense", a, w)
    if alpha != 1.0:
        y = ctx.emit1("multiply", y, ctx.const(np.array(alpha), y.dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.emit1("multiply", c, ctx.const(np.array(beta), c.dtype))
        if c.type.ndim == 1 and c.shape[0] == y.shape[1] and c.shape[0] != 1:
            y = ctx.emit1("bias_add", y, c, axis=1)
        else:
            y = ctx.emit1("add", y, c)
    return y


@onnx_op("MatMul")
def _matmul(ctx: Context, node, ins, attrs):
    a, b = ins
    squeeze = []
    if a.type.ndim == 1:
        a = ctx.reshape(a, (1,) + a.shape)
        squeeze.append(-2)
    if b.type.ndim == 1:
        b = ctx.reshape(b, b.shape + (1,))
        squeeze.append(-1)
    if b.type.ndim == 2 and ctx.is_static(b) and not a.is_constant:
        # Weight matrix: dense with an (N, K) weight — the layout the dense kernels want.
        y = ctx.emit1("dense", a, ctx.emit1("transpose", b, axes=(1, 0)))
    else:
        y = ctx.emit1("matmul", a, b)
    if squeeze:
        nd = y.type.ndim
        drop = {s + nd for s in squeeze}
        y = ctx.reshape(y, tuple(d for i, d in enumerate(y.shape) if i not in drop))
    return y


# ----------------------------------------------------------------------------- normalization
@onnx_op("BatchNormalization")
def _batch_norm(ctx: Context, node, ins, attrs):
    if attrs.get("training_mode", 0):
        raise ctx.unsupported("training_mode=1")
    x, gamma, beta, mean, var = ins[:5]
    y = ctx.emit1("batch_norm", x, gamma, beta, mean, var, epsilon=attrs.get("epsilon", 1e-5),
                  axis=1)
    return [y]


@onnx_op("InstanceNormalization")
def _instance_norm(ctx: Context, node, ins, attrs):
    return ctx.emit1("instance_norm", *ins[:3], epsilon=attrs.get("epsilon", 1e-5))


@onnx_op("LayerNormalization")
def _layer_norm(ctx: Context, node, ins, attrs):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 and ins[2] is not None else \
        ctx.const(np.zeros(scale.shape), scale.dtype)
    axis = attrs.get("axis", -1)
    if axis < 0:
        axis += x.type.ndim
    return [ctx.emit1("layer_norm", x, scale, bias, axis=axis,
                      epsilon=attrs.get("epsilon", 1e-5))]


@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx: Context, node, ins, attrs):
    x = ins[0]
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    nd = x.type.ndim
    axis = attrs.get("axis", -1 if ctx.opset >= 13 else 1)
    if axis < 0:
        axis += nd
    if ctx.opset >= 13 or axis == nd - 1:
        return ctx.emit1(op, x, axis=axis)
    # Opset < 13: softmax over the flattened trailing dims [axis:].
    flat = ctx.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return ctx.reshape(ctx.emit1(op, flat, axis=1), x.shape)


@onnx_op("LRN")
def _lrn(ctx: Context, node, ins, attrs):
    return ctx.emit1("lrn", ins[0], size=attrs["size"], alpha=attrs.get("alpha", 1e-4),
                     beta=attrs.get("beta", 0.75), bias=attrs.get("bias", 1.0), axis=1)


# ----------------------------------------------------------------------------- pooling
@onnx_op("MaxPool", "AveragePool")
def _pool(ctx: Context, node, ins, attrs):
    x = ins[0]
    nd = _spatial_rank(ctx, x, node.op_type)
    kernel = tuple(attrs["kernel_shape"])
    if node.op_type == "MaxPool" and attrs.get("storage_order", 0) and len(node.output) > 1:
        raise ctx.unsupported("storage_order=1 indices")
    strides, dil, pads = _window_attrs(ctx, attrs, x.shape[2:], kernel, node.op_type)
    ceil = bool(attrs.get("ceil_mode", 0))
    if nd == 1:
        x = _lift_1d(ctx, x)
    common = dict(pool_size=_to2d(kernel, nd, 1), strides=_to2d(strides, nd, 1),
                  dilation=_to2d(dil, nd, 1), padding=_pads2d(pads, nd), ceil_mode=ceil)
    if node.op_type == "MaxPool":
        y = ctx.emit1("max_pool2d", x, **common)
    else:
        y = ctx.emit1("avg_pool2d", x, count_include_pad=bool(attrs.get("count_include_pad", 0)),
                      **common)
    if nd == 1:
        y = ctx.reshape(y, y.shape[:2] + y.shape[3:])
    return [y]


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: Context, node, ins, attrs):
    x = ins[0]
    op = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return ctx.emit1(op, x, axes=tuple(range(2, x.type.ndim)), keepdims=True)


# ----------------------------------------------------------------------------- resize
@onnx_op("Resize", "Upsample")
def _resize(ctx: Context, node, ins, attrs):
    x = ins[0]
    nd = x.type.ndim
    mode = attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise ctx.unsupported(f"mode={mode!r} (nearest and linear are supported)")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if node.op_type == "Upsample" or ctx.opset < 11:
        coord = "asymmetric"
        scales_v = ins[1] if len(ins) > 1 else None
        sizes_v = None
        if scales_v is None:
            scales_arr = np.asarray(attrs["scales"], dtype=np.float64)
        else:
            scales_arr = np.asarray(ctx.static(scales_v, "scales"), dtype=np.float64)
        nearest_mode = "floor"
        # Opset < 11 nearest used floor of x / scale.
    else:
        scales_v = ins[2] if len(ins) > 2 else None
        sizes_v = ins[3] if len(ins) > 3 else None
        scales_arr = None
        if scales_v is not None:
            s = np.asarray(ctx.static(scales_v, "scales"), dtype=np.float64).reshape(-1)
            scales_arr = s if s.size else None
        nearest_mode = attrs.get("nearest_mode", "round_prefer_floor")
    if coord == "tf_crop_and_resize":
        raise ctx.unsupported("coordinate_transformation_mode='tf_crop_and_resize'")
    axes = tuple(attrs.get("axes", range(nd)))
    axes = tuple(a + nd if a < 0 else a for a in axes)
    in_shape = x.shape
    scales = [1.0] * nd
    out = list(in_shape)
    if scales_arr is not None:
        if len(scales_arr) != len(axes):
            raise ctx.bad(f"scales {scales_arr.tolist()} do not match axes {axes}")
        for a, s in zip(axes, scales_arr):
            scales[a] = float(s)
            out[a] = int(math.floor(in_shape[a] * float(s) + 1e-9))
    else:
        sizes = ctx.static_ints(sizes_v, "sizes")
        if len(sizes) != len(axes):
            raise ctx.bad(f"sizes {sizes} do not match axes {axes}")
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            for a, n in zip(axes, sizes):
                scales[a] = n / in_shape[a]
                out[a] = n
        else:
            ratios = [n / in_shape[a] for a, n in zip(axes, sizes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                scales[a] = r
                out[a] = int(math.floor(r * in_shape[a] + 0.5))
    if attrs.get("antialias", 0) and mode != "nearest" and any(s < 1 for s in scales):
        raise ctx.unsupported("antialias=1 downscaling")
    if scales[0] != 1.0 or scales[1] != 1.0 or out[0] != in_shape[0] or out[1] != in_shape[1]:
        raise ctx.unsupported("resizing the batch or channel dims (only H, W of NCHW data)")
    if nd == 3:
        x = ctx.reshape(x, in_shape[:2] + (1,) + in_shape[2:])
        size, sc = (1, out[2]), (1.0, scales[2])
    elif nd == 4:
        size, sc = (out[2], out[3]), (scales[2], scales[3])
    else:
        raise ctx.unsupported(f"Resize of a {nd}-D tensor (3-D and 4-D are supported)")
    if tuple(out) == in_shape and all(s == 1.0 for s in scales):
        return ctx.emit1("identity", ins[0])
    y = ctx.emit1("resize2d", x, size=size, scales=sc,
                  method="nearest" if mode == "nearest" else "linear",
                  coordinate_transformation_mode=coord, nearest_mode=nearest_mode)
    if nd == 3:
        y = ctx.reshape(y, tuple(out))
    return y


# ----------------------------------------------------------------------------- einsum
@onnx_op("Einsum")
def _einsum(ctx: Context, node, ins, attrs):
    from .einsum import lower_einsum

    return lower_einsum(ctx, attrs["equation"], list(ins))
