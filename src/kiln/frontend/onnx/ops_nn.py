"""Converters for convolution, GEMM/MatMul, normalization, softmax, pooling, LRN, Resize."""

from __future__ import annotations

import math

import numpy as np

from ...ir import Value
from ...ir.sym_rules import format_dims
from ...runtime import sym
from ...runtime.sym import Dim
from ..volumetric import conv3d, conv_transpose3d, pool3d
from .converter import Context, onnx_op


# ----------------------------------------------------------------------------- helpers
def _lift_1d(ctx: Context, x: Value) -> Value:
    """(N, C, L) -> (N, C, 1, L): 1-D windows run as 2-D ones with H = 1."""
    return ctx.reshape(x, x.shape[:2] + (1,) + x.shape[2:])


def _window_attrs(ctx: Context, attrs: dict, in_spatial: tuple[int, ...],
                  kernel: tuple[int, ...], op_name: str, ceil: bool = False,
                  in_dims: tuple | None = None) -> tuple[tuple, tuple, tuple]:
    """(strides, dilations, pads in ONNX begin..end order) with auto_pad resolved.

    ``in_dims`` are the spatial dims with their symbols (default: all static)."""
    nd = len(kernel)
    strides = tuple(attrs.get("strides", (1,) * nd))
    dil = tuple(attrs.get("dilations", (1,) * nd))
    pads = tuple(attrs.get("pads", (0,) * (2 * nd)))
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for a, (n, k, s, d) in enumerate(zip(in_spatial, kernel, strides, dil)):
            if in_dims is not None and isinstance(in_dims[a], str) and s > 1:
                # the padding would depend on the runtime size modulo the stride
                raise ctx.unsupported(f"auto_pad={auto} with stride {s} over symbolic dimension "
                                      f"{in_dims[a]!r}; give explicit pads")
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


def _spatial_rank(ctx: Context, x: Value, what: str, ranks: tuple[int, ...] = (1, 2)) -> int:
    nd = x.type.ndim - 2
    if nd not in ranks:
        names = " and ".join(f"{r}-D" for r in ranks)
        raise ctx.unsupported(f"{what} on {nd}-D spatial data (only {names} are supported)")
    return nd


# ----------------------------------------------------------------------------- conv
@onnx_op("Conv")
def _conv(ctx: Context, node, ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    nd = _spatial_rank(ctx, x, "Conv", (1, 2, 3))
    kernel = tuple(attrs.get("kernel_shape", w.shape[2:]))
    strides, dil, pads = _window_attrs(ctx, attrs, x.shape[2:], kernel, "Conv", in_dims=x.type.dims[2:])
    if nd == 3:
        y = conv3d(ctx, x, w, strides, dil, pads, attrs.get("group", 1))
        return y if b is None else ctx.emit1("bias_add", y, b, axis=1)
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
    nd = _spatial_rank(ctx, x, "ConvTranspose", (1, 2, 3))
    kernel = tuple(attrs.get("kernel_shape", w.shape[2:]))
    strides = tuple(attrs.get("strides", (1,) * nd))
    dil = tuple(attrs.get("dilations", (1,) * nd))
    outpad = tuple(attrs.get("output_padding", (0,) * nd))
    pads = tuple(attrs.get("pads", (0,) * (2 * nd)))
    auto = attrs.get("auto_pad", "NOTSET")
    out_shape = attrs.get("output_shape")
    in_sp = x.shape[2:]
    if (out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER")) and x.type.sym is not None \
            and any(isinstance(d, str) for d in x.type.dims[2:]):
        raise ctx.unsupported("output_shape / auto_pad=SAME over symbolic spatial dims "
                              f"{x.type.dims[2:]}; give explicit pads")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        targets = tuple(out_shape)[-nd:] if out_shape is not None else \
            tuple(n * s for n, s in zip(in_sp, strides))
        if len(targets) != nd:
            raise ctx.bad(f"output_shape {tuple(out_shape)} does not give {nd} spatial dims")
        begin, end, extra = [], [], []
        for n, k, s, d, op_, t in zip(in_sp, kernel, strides, dil, outpad, targets):
            total = s * (n - 1) + op_ + (k - 1) * d + 1 - t
            # A target larger than the full output: the extra rows/cols at the end receive no
            # input pixel (zeros), as extra output_padding would give.
            extra.append(max(0, -total))
            total = max(0, total)
            # As ONNX Runtime does: SAME_UPPER puts the odd pixel at the end, SAME_LOWER and
            # NOTSET (explicit output_shape) at the start.
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        pads = tuple(begin + end)
        outpad = tuple(o + e for o, e in zip(outpad, extra))
    elif auto == "VALID":
        pads = (0,) * (2 * nd)
    if not len(kernel) == len(strides) == len(dil) == len(outpad) == nd or len(pads) != 2 * nd:
        raise ctx.bad(f"kernel_shape {kernel}, strides {strides}, dilations {dil}, "
                      f"output_padding {outpad} and pads {pads} do not match a {nd}-D kernel")
    if nd == 3:
        y = conv_transpose3d(ctx, x, w, strides, dil, pads, outpad, attrs.get("group", 1))
        return y if b is None else ctx.emit1("bias_add", y, b, axis=1)
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
    if a.type.ndim != 2 or b.type.ndim != 2:
        raise ctx.bad(f"A {a.shape} and B {b.shape} must both be 2-D matrices")
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
    x, gamma, beta, mean, var = ins[:5]
    if attrs.get("training_mode", 0):
        return _batch_norm_training(ctx, x, gamma, beta, mean, var, attrs)
    y = ctx.emit1("batch_norm", x, gamma, beta, mean, var, epsilon=attrs.get("epsilon", 1e-5),
                  axis=1)
    return [y]


def _batch_norm_training(ctx: Context, x: Value, gamma: Value, beta: Value, mean: Value,
                         var: Value, attrs: dict) -> list[Value]:
    """training_mode=1: normalise with the batch statistics, and output the updated running ones.

    ``running = input * momentum + batch * (1 - momentum)``, with the biased (population)
    batch variance, as the ONNX reference does.
    """
    nd = x.type.ndim
    if nd < 2:
        raise ctx.bad(f"input must be at least 2-D (N, C, ...), got shape {x.shape}")
    eps = attrs.get("epsilon", 1e-5)
    momentum = attrs.get("momentum", 0.9)
    axes = (0,) + tuple(range(2, nd))
    chan = (1, x.shape[1]) + (1,) * (nd - 2)
    bmean = ctx.emit1("reduce_mean", x, axes=axes, keepdims=True)
    dev = ctx.emit1("subtract", x, bmean)
    bvar = ctx.emit1("reduce_mean", ctx.emit1("multiply", dev, dev), axes=axes, keepdims=True)
    inv = ctx.emit1("rsqrt", ctx.emit1("add", bvar, ctx.const(np.array(eps), x.dtype)))
    y = ctx.emit1("multiply", ctx.emit1("multiply", dev, inv), ctx.reshape(gamma, chan))
    y = ctx.emit1("add", y, ctx.reshape(beta, chan))
    bmean1 = ctx.reshape(bmean, (x.shape[1],))
    bvar1 = ctx.reshape(bvar, (x.shape[1],))
    keep = ctx.const(np.array(momentum), x.dtype)
    take = ctx.const(np.array(1.0 - momentum), x.dtype)

    def running(old: Value, cur: Value) -> Value:
        return ctx.emit1("add", ctx.emit1("multiply", old, keep),
                         ctx.emit1("multiply", cur, take))

    return [y, running(mean, bmean1), running(var, bvar1)]


@onnx_op("InstanceNormalization")
def _instance_norm(ctx: Context, node, ins, attrs):
    return ctx.emit1("instance_norm", *ins[:3], epsilon=attrs.get("epsilon", 1e-5))


@onnx_op("LayerNormalization")
def _layer_norm(ctx: Context, node, ins, attrs):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 and ins[2] is not None else \
        ctx.const(np.zeros(scale.shape), scale.dtype)
    axis = attrs.get("axis", -1)
    nd = x.type.ndim
    if axis < 0:
        axis += nd
    if not 0 <= axis < nd:
        raise ctx.bad(f"axis {attrs.get('axis', -1)} is out of range for a {nd}-D input")
    eps = attrs.get("epsilon", 1e-5)
    y = ctx.emit1("layer_norm", x, scale, bias, axis=axis, epsilon=eps)
    if not any(node.output[1:3]):
        return [y]
    # The optional Mean / InvStdDev outputs (training graphs keep them for the backward pass):
    # computed separately in the stash type, while Y keeps the fused layer_norm kernel.
    from .converter import onnx_dtype

    sdt = onnx_dtype(attrs.get("stash_type", 1))
    xs = ctx.cast(x, sdt)
    axes = tuple(range(axis, nd))
    mean = ctx.emit1("reduce_mean", xs, axes=axes, keepdims=True)
    dev = ctx.emit1("subtract", xs, mean)
    var = ctx.emit1("reduce_mean", ctx.emit1("multiply", dev, dev), axes=axes, keepdims=True)
    inv_std = ctx.emit1("rsqrt", ctx.emit1("add", var, ctx.const(np.array(eps), sdt)))
    return [y, mean, inv_std]


@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx: Context, node, ins, attrs):
    x = ins[0]
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    # Range-checked at every opset: before 13 an axis past the rank used to flatten the input
    # into (N, 1) and return all ones (or zeros) instead of failing.
    axis = ctx.axis(attrs.get("axis", -1 if ctx.opset >= 13 else 1), x.type.ndim)
    nd = x.type.ndim
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
    nd = _spatial_rank(ctx, x, node.op_type, (1, 2, 3))
    kernel = tuple(attrs["kernel_shape"])
    want_indices = node.op_type == "MaxPool" and len(node.output) > 1 and bool(node.output[1])
    strides, dil, pads = _window_attrs(ctx, attrs, x.shape[2:], kernel, node.op_type,
                                       in_dims=x.type.dims[2:])
    ceil = bool(attrs.get("ceil_mode", 0))
    if want_indices and nd == 3:
        raise ctx.unsupported("the Indices output of a 3-D MaxPool (1-D and 2-D are supported)")
    if want_indices and any(isinstance(d, str) for d in x.type.dims[2:]):
        raise ctx.unsupported(f"the Indices output of a MaxPool over symbolic spatial dims {x.type.dims[2:]}")
    if nd == 3:
        kind = "max" if node.op_type == "MaxPool" else "avg"
        return [pool3d(ctx, kind, x, kernel, strides, dil, pads, ceil,
                       bool(attrs.get("count_include_pad", 0)))]
    if nd == 1:
        x = _lift_1d(ctx, x)
    common = dict(pool_size=_to2d(kernel, nd, 1), strides=_to2d(strides, nd, 1),
                  dilation=_to2d(dil, nd, 1), padding=_pads2d(pads, nd), ceil_mode=ceil)
    if node.op_type == "MaxPool":
        y = ctx.emit1("max_pool2d", x, **common)
    else:
        y = ctx.emit1("avg_pool2d", x, count_include_pad=bool(attrs.get("count_include_pad", 0)),
                      **common)
    idx = None
    if want_indices:
        idx = _max_pool_indices(ctx, x, y.shape[2:], common,
                                bool(attrs.get("storage_order", 0)))
    if nd == 1:
        y = ctx.reshape(y, y.shape[:2] + y.shape[3:])
        idx = None if idx is None else ctx.reshape(idx, y.shape)
    return [y, idx]


def _max_pool_indices(ctx: Context, x: Value, out_hw: tuple[int, int], win: dict,
                      column_major: bool) -> Value:
    """MaxPool's Indices output: the flat NCHW index of each window's (first) maximum.

    One gather with a constant index array collects every window of the padded input as
    (N, C, oh, ow, taps) (im2col), argmax picks the winning tap (the first on ties, in
    row-major tap order as ONNX Runtime scans the window), and a constant (oh, ow, taps) table
    maps the tap to the input's flat index ``h * W + w`` (``w * H + h`` for storage_order=1),
    plus ``(n * C + c) * H * W``. Padding holds the dtype's lowest value, so it never wins over
    a real cell.
    """
    n, c, h, w = x.shape
    oh, ow = out_hw
    (kh, kw), (sh, sw), (dh, dw) = win["pool_size"], win["strides"], win["dilation"]
    pt, pl, pb, pr = win["padding"]
    # ceil_mode windows may run past the end padding: pad far enough for every tap.
    eh = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + pt + pb))
    ew = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + pl + pr))
    np_dt = np.dtype(x.dtype) if x.dtype != "bfloat16" else np.dtype(np.float32)
    low = float(np.iinfo(np_dt).min) if np_dt.kind in "iu" else -math.inf
    hp, wp = h + pt + pb + eh, w + pl + pr + ew
    xp = ctx.emit1("pad", x, pad_width=((0, 0), (0, 0), (pt, pb + eh), (pl, pr + ew)),
                   value=low)
    ys = np.arange(oh)[:, None, None] * sh + (np.arange(kh * kw) // kw)[None, None, :] * dh
    xs = np.arange(ow)[None, :, None] * sw + (np.arange(kh * kw) % kw)[None, None, :] * dw
    windows = ctx.emit1("take", ctx.reshape(xp, (n, c, hp * wp)),
                        ctx.const((ys * wp + xs).astype(np.int64)), axis=2)
    tap = ctx.emit1("argmax", windows, axis=4, keepdims=True)
    ys, xs = ys - pt, xs - pl  # padded -> input coordinates
    table = (xs * h + ys) if column_major else (ys * w + xs)
    table = ctx.emit1("broadcast_to", ctx.const(table[None, None].astype(np.int64)),
                      shape=(n, c, oh, ow, kh * kw))
    flat = ctx.reshape(ctx.emit1("gather_elements", table, tap, axis=4), (n, c, oh, ow))
    base = (np.arange(n * c, dtype=np.int64) * (h * w)).reshape(n, c, 1, 1)
    return ctx.emit1("add", flat, ctx.const(base))


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
    if mode not in ("nearest", "linear", "bilinear", "cubic"):
        raise ctx.unsupported(f"mode={mode!r} (nearest, linear and cubic are supported)")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if node.op_type == "Upsample" or ctx.opset < 11:
        coord = "asymmetric"
        scales_v = ins[1] if len(ins) > 1 else None
        sizes_v = None
        if scales_v is None:
            scales_arr = np.asarray(attrs["scales"], dtype=np.float64).reshape(-1)
        else:
            scales_arr = np.asarray(ctx.static(scales_v, "scales"), dtype=np.float64).reshape(-1)
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
    axes = attrs.get("axes", range(nd))
    if not isinstance(axes, (list, tuple, range)) or not all(isinstance(a, int) for a in axes):
        raise ctx.bad(f"attribute 'axes' must be a list of ints, got {axes!r}")
    axes = tuple(a + nd if a < 0 else a for a in axes)
    if len(set(axes)) != len(axes) or any(not 0 <= a < nd for a in axes):
        raise ctx.bad(f"axes {tuple(attrs['axes'])} are not distinct axes of a {nd}-D input")
    in_shape = x.shape
    scales = [1.0] * nd
    out = list(in_shape)
    dyn_axes = [a for a in axes if isinstance(x.type.dims[a], str)]
    if scales_arr is None and sizes_v is not None and (dyn_axes or sizes_v in ctx.sym_values):
        return _resize_to_runtime_sizes(ctx, x, axes, ctx.sym_ints(sizes_v, "sizes"), mode, coord,
                                        nearest_mode, attrs)
    if scales_arr is not None:
        if len(scales_arr) != len(axes):
            raise ctx.bad(f"scales {scales_arr.tolist()} do not match axes {axes}")
        if not all(math.isfinite(s) and s > 0 for s in scales_arr):
            raise ctx.bad(f"scales {scales_arr.tolist()} must be finite and positive")
        for a, s in zip(axes, scales_arr):
            scales[a] = float(s)
            out[a] = int(math.floor(in_shape[a] * float(s) + 1e-9))
    else:
        sizes = ctx.static_ints(sizes_v, "sizes")
        if len(sizes) != len(axes):
            raise ctx.bad(f"sizes {sizes} do not match axes {axes}")
        if any(n < 0 or (n and not in_shape[a]) for a, n in zip(axes, sizes)):
            raise ctx.bad(f"sizes {sizes} must be non-negative, and 0 where input {in_shape} "
                          f"is empty")
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            for a, n in zip(axes, sizes):
                scales[a] = n / in_shape[a] if in_shape[a] else 1.0
                out[a] = n
        else:
            ratios = [n / in_shape[a] if in_shape[a] else 1.0 for a, n in zip(axes, sizes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                scales[a] = r
                out[a] = int(math.floor(r * in_shape[a] + 0.5))
    # Checked before the interpolation tables (out * taps arrays) are built for it.
    ctx.check_size(out, "the output")
    antialias = bool(attrs.get("antialias", 0)) and mode != "nearest" and \
        any(s < 1 for s in scales)
    batch_or_channel = scales[0] != 1.0 or scales[1] != 1.0 or out[0] != in_shape[0] or \
        out[1] != in_shape[1]
    if mode == "cubic" or antialias or coord == "tf_crop_and_resize" or batch_or_channel \
            or nd not in (3, 4):
        roi = None
        if coord == "tf_crop_and_resize":
            roi_v = ins[1] if len(ins) > 1 else None
            if roi_v is None:
                raise ctx.bad("coordinate_transformation_mode='tf_crop_and_resize' needs roi")
            roi = np.asarray(ctx.static(roi_v, "roi"), dtype=np.float64).reshape(-1)
            if roi.size != 2 * len(axes):
                raise ctx.bad(f"roi {roi.tolist()} must hold {2 * len(axes)} values (starts "
                              f"then ends of axes {axes})")
            roi = {a: (roi[k], roi[k + len(axes)]) for k, a in enumerate(axes)}
        if dyn_axes:
            raise ctx.unsupported(f"Resize (mode={mode!r}, coordinate_transformation_mode={coord!r}) of "
                                  f"symbolic dims {[x.type.dims[a] for a in dyn_axes]}: only nearest and "
                                  "(bi)linear resizes of H and W are supported")
        return _resize_separable(ctx, x, tuple(out), scales, mode, coord, nearest_mode, roi,
                                 antialias, attrs)
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


def _resize_to_runtime_sizes(ctx: Context, x: Value, axes: tuple[int, ...], sizes: tuple[Dim, ...],
                             mode: str, coord: str, nearest_mode: str, attrs: dict) -> Value:
    """Resize H and W to sizes known at run time: symbolic (computed from ``Shape``, as
    DeepLabV3's upsamples back to the feature map and to the image are), or fixed sizes of a
    symbolic input. Each axis's scale is ``size / input extent`` at run time, as ONNX defines
    it for ``sizes``; the ``resize2d`` kernel computes it from the runtime extents."""
    dims = list(x.type.dims)
    if len(sizes) != len(axes):
        raise ctx.bad(f"sizes {format_dims(sizes)} do not match axes {axes}")
    out = list(dims)
    for a, n in zip(axes, sizes):
        out[a] = sym.canonical(n)
    what = f"Resize of {format_dims(dims)} to runtime sizes {format_dims(out)}"
    if x.type.ndim != 4 or out[:2] != dims[:2]:
        raise ctx.unsupported(f"{what}: only H and W of a 4-D input can take sizes known at run time")
    # (tf_half_pixel_for_nn is not the identity at scale 1, where ONNX Runtime copies the
    # input; the kernel would only know that at run time)
    if mode not in ("nearest", "linear", "bilinear") or coord in ("tf_crop_and_resize", "tf_half_pixel_for_nn"):
        raise ctx.unsupported(f"{what}: mode={mode!r}, coordinate_transformation_mode={coord!r} "
                              "(nearest and (bi)linear resizes, without a crop and other than "
                              "tf_half_pixel_for_nn, are supported)")
    if attrs.get("antialias", 0) and mode != "nearest":
        raise ctx.unsupported(f"{what}: antialias (whether it applies depends on the runtime scale)")
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ctx.unsupported(f"{what}: keep_aspect_ratio_policy="
                              f"{attrs['keep_aspect_ratio_policy']!r} (stretch is supported)")
    for a in (2, 3):
        d = out[a]
        lo = d if isinstance(d, int) else sym.bounds(d, ctx.graph.dim_ranges)[0]
        if lo < 1:
            raise ctx.unsupported(f"{what}: output dim {out[a]} may be {lo}; a runtime size must be "
                                  "at least 1")
    size = ctx.upper(out[2:])
    ctx.check_size(ctx.upper(out), "the output")
    in_hi = x.shape[2:]
    return ctx.emit1("resize2d", x, size=size, scales=tuple(o / i for o, i in zip(size, in_hi)),
                     method="nearest" if mode == "nearest" else "linear",
                     coordinate_transformation_mode=coord, nearest_mode=nearest_mode,
                     sym_size=tuple(out[2:]))


#: Widest per-axis filter resized by gathers; wider (strong antialiased downscales) use a matmul.
MAX_GATHER_TAPS = 16


def _resize_taps(in_len: int, out_len: int, scale: float, mode: str, coord: str,
                 roi: tuple[float, float] | None, antialias: bool, cubic_a: float,
                 exclude_outside: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 1-D Resize along one axis: (out_len, taps) source indices and weights, in-range mask.

    Follows the ONNX reference: source coordinate from the coordinate transform, the taps
    around it (edge-clamped), the linear (triangle) or cubic (Keys, ``a = cubic_coeff_a``)
    kernel, widened by 1/scale when antialiasing a downscale, taps outside the input dropped
    and the weights renormalised for ``exclude_outside``. For tf_crop_and_resize, rows whose
    source lies outside the input are marked False in the mask (they get extrapolation_value).
    """
    from ...ir.ops.nn import resize_source_coord

    xo = np.arange(out_len, dtype=np.float64)
    if coord == "tf_crop_and_resize":
        lo, hi = roi
        if out_len > 1:
            src = lo * (in_len - 1) + xo * ((hi - lo) * (in_len - 1) / (out_len - 1))
        else:
            src = np.full(out_len, 0.5 * (lo + hi) * (in_len - 1))
        valid = (src >= 0) & (src <= in_len - 1)
    else:
        src = resize_source_coord(xo, in_len, out_len, scale, coord)
        valid = np.ones(out_len, dtype=bool)
    s = min(scale, 1.0) if antialias else 1.0
    support = 1.0 if mode == "linear" else 2.0
    start = int(math.floor(-support / s)) + 1
    taps = np.arange(start, 1 - start + 1)
    base = np.floor(src)
    dist = np.abs((taps[None, :] - (src - base)[:, None]) * s)
    if mode == "linear":
        w = np.clip(1.0 - dist, 0.0, 1.0)
    else:
        a = cubic_a
        w = np.where(dist <= 1, ((a + 2) * dist - (a + 3)) * dist * dist + 1,
                     np.where(dist < 2, ((a * dist - 5 * a) * dist + 8 * a) * dist - 4 * a, 0.0))
    idx = base[:, None].astype(np.int64) + taps[None, :]
    if exclude_outside:
        w = np.where((idx >= 0) & (idx < in_len), w, 0.0)
    if antialias or exclude_outside:
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    idx = np.clip(idx, 0, in_len - 1)
    w[~valid] = 0.0
    return idx, w, valid


def _nearest_src(in_len: int, out_len: int, scale: float, coord: str,
                 roi: tuple[float, float] | None, nearest_mode: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Source index of every output index (nearest mode) and the in-range mask."""
    from ...ir.ops.nn import _nearest_index, resize_source_coord

    xo = np.arange(out_len, dtype=np.float64)
    if coord == "tf_crop_and_resize":
        lo, hi = roi
        if out_len > 1:
            src = lo * (in_len - 1) + xo * ((hi - lo) * (in_len - 1) / (out_len - 1))
        else:
            src = np.full(out_len, 0.5 * (lo + hi) * (in_len - 1))
        valid = (src >= 0) & (src <= in_len - 1)
    else:
        src = resize_source_coord(xo, in_len, out_len, scale, coord)
        valid = np.ones(out_len, dtype=bool)
    return _nearest_index(src, in_len, nearest_mode, scale), valid


def _resize_separable(ctx: Context, x: Value, out: tuple[int, ...], scales: list[float],
                      mode: str, coord: str, nearest_mode: str,
                      roi: dict[int, tuple[float, float]] | None, antialias: bool,
                      attrs: dict) -> Value:
    """Resize one axis at a time, for the variants the ``resize2d`` kernel does not cover.

    Cubic, antialiased and tf_crop_and_resize resizes (and any axis of any rank) are separable
    linear maps whose taps and weights depend only on static shapes and scales, so they are
    computed at compile time from the ONNX formulas. Each resized axis is then a weighted sum
    of ``taps`` gathers (``take`` * constant weights, one fused injective kernel, out * taps
    multiply-adds per line), or, when a strong antialiased downscale makes the filter wider
    than :data:`MAX_GATHER_TAPS`, one matmul with the dense (out, in) interpolation matrix.
    Nearest gathers source indices (exact for every dtype).
    """
    nd = x.type.ndim
    in_shape = x.shape
    nearest = mode == "nearest"
    if not nearest and not x.dtype.startswith(("float", "bfloat")):
        raise ctx.unsupported(f"mode={mode!r} on {x.dtype} data (floating point is supported)")
    cdt = x.dtype if x.dtype in ("float32", "float64") else "float32"
    y = x if nearest else ctx.cast(x, cdt)
    mask: np.ndarray | None = None
    for a in range(nd):
        n_in, n_out = in_shape[a], out[a]
        axis_roi = roi.get(a) if roi is not None else None
        if n_in == n_out and scales[a] == 1.0 and axis_roi is None:
            continue  # the transform of an unchanged axis is the identity in every mode
        if nearest:
            idx, valid = _nearest_src(n_in, n_out, scales[a], coord, axis_roi, nearest_mode)
            y = ctx.emit1("take", y, ctx.const(idx.astype(np.int64)), axis=a)
        else:
            idx, w, valid = _resize_taps(n_in, n_out, scales[a], "cubic" if mode == "cubic"
                                         else "linear", coord, axis_roi, antialias,
                                         float(attrs.get("cubic_coeff_a", -0.75)),
                                         bool(attrs.get("exclude_outside", 0)))
            if idx.shape[1] <= MAX_GATHER_TAPS:
                wshape = [1] * nd
                wshape[a] = n_out
                acc = None
                for t in range(idx.shape[1]):
                    if not w[:, t].any():
                        continue  # e.g. the far taps of an integer source coordinate
                    g = ctx.emit1("take", y, ctx.const(idx[:, t]), axis=a)
                    g = ctx.emit1("multiply", g, ctx.const(w[:, t].reshape(wshape).astype(cdt)))
                    acc = g if acc is None else ctx.emit1("add", acc, g)
                if acc is None:  # every row extrapolated: any value, the mask replaces it
                    acc = ctx.emit1("take", y, ctx.const(idx[:, 0]), axis=a)
                y = acc
            else:
                mat = np.zeros((n_out, n_in))
                np.add.at(mat, (np.repeat(np.arange(n_out), idx.shape[1]), idx.reshape(-1)),
                          w.reshape(-1))
                pre, post = math.prod(y.shape[:a]), math.prod(y.shape[a + 1:])
                flat = ctx.reshape(y, (pre, n_in, post))
                prod = ctx.emit1("matmul", ctx.const(mat[None].astype(cdt)), flat)
                y = ctx.reshape(prod, y.shape[:a] + (n_out,) + y.shape[a + 1:])
        if not valid.all():
            shp = [1] * nd
            shp[a] = n_out
            m = valid.reshape(shp)
            mask = m if mask is None else (mask & m)
    if mask is not None:
        fill = ctx.const(np.array(attrs.get("extrapolation_value", 0.0)), y.dtype)
        y = ctx.emit1("where", ctx.const(mask), y, fill)
    y = ctx.cast(y, x.dtype)
    if y is x:
        y = ctx.emit1("identity", x)
    return y


# ----------------------------------------------------------------------------- einsum
@onnx_op("Einsum")
def _einsum(ctx: Context, node, ins, attrs):
    from .einsum import lower_einsum

    return lower_einsum(ctx, attrs["equation"], list(ins))
