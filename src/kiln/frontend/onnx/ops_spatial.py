"""ONNX converters: spatial and sampling ops.

GridSample, DeformConv, AffineGrid, LpPool, SpaceToDepth, DepthToSpace, CenterCropPad, Col2Im,
MaxUnpool. (Resize, Upsample and Pad live in ops_nn / ops_tensor.)

Most of these are static rearrangements or linear maps whose structure depends only on static
shapes, so they are decomposed into existing IR ops (reshape/transpose, pad/slice, convolutions
with constant 0/1 weights, matmul, scatter). GridSample reads data at run-time coordinates and
has its own IR op (``grid_sample``), which DeformConv reuses for its bilinear taps.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import Value, np_dtype
from ...ir.ops._util import conv_out_size
from .converter import Context, onnx_op
from .ops_nn import _window_attrs


def _require_rank(ctx: Context, x: Value, ranks: tuple[int, ...], what: str) -> int:
    """``x.ndim`` if it is one of ``ranks``, else an InputError naming the node."""
    if x.type.ndim not in ranks:
        want = " or ".join(f"{r}-D" for r in ranks)
        raise ctx.bad(f"{what} must be {want}, got shape {x.shape}")
    return x.type.ndim


# ----------------------------------------------------------------------------- depth <-> space
@onnx_op("SpaceToDepth")
def _space_to_depth(ctx: Context, node, ins, attrs):
    x = ins[0]
    _require_rank(ctx, x, (4,), "input")
    b = int(attrs["blocksize"])
    n, c, h, w = x.shape
    if b < 1 or h % b or w % b:
        raise ctx.bad(f"blocksize {b} must be positive and divide H and W of {x.shape}")
    mode = attrs.get("mode", "DCR")
    if mode == "DCR":  # output channel = (by, bx, c)
        perm = (0, 3, 5, 1, 2, 4)
    elif mode == "CRD":  # output channel = (c, by, bx)
        perm = (0, 1, 3, 5, 2, 4)
    else:
        raise ctx.unsupported(f"mode={mode!r} (DCR and CRD are supported)")
    y = ctx.reshape(x, (n, c, h // b, b, w // b, b))
    y = ctx.emit1("transpose", y, axes=perm)
    return ctx.reshape(y, (n, c * b * b, h // b, w // b))


@onnx_op("DepthToSpace")
def _depth_to_space(ctx: Context, node, ins, attrs):
    x = ins[0]
    _require_rank(ctx, x, (4,), "input")
    b = int(attrs["blocksize"])
    mode = attrs.get("mode", "DCR")
    n, c, h, w = x.shape
    if b < 1 or c % (b * b):
        raise ctx.bad(f"blocksize {b} must be positive and b * b must divide C of {x.shape}")
    oc = c // (b * b)
    if mode == "DCR":  # channel = (by, bx, c)
        y = ctx.reshape(x, (n, b, b, oc, h, w))
        y = ctx.emit1("transpose", y, axes=(0, 3, 4, 1, 5, 2))
    elif mode == "CRD":  # channel = (c, by, bx)
        y = ctx.reshape(x, (n, oc, b, b, h, w))
        y = ctx.emit1("transpose", y, axes=(0, 1, 4, 2, 5, 3))
    else:
        raise ctx.unsupported(f"mode={mode!r} (DCR and CRD are supported)")
    return ctx.reshape(y, (n, oc, h * b, w * b))


# ----------------------------------------------------------------------------- CenterCropPad
@onnx_op("CenterCropPad")
def _center_crop_pad(ctx: Context, node, ins, attrs):
    x = ins[0]
    nd = x.type.ndim
    shape = ctx.static_ints(ins[1], "shape")
    axes = tuple(ctx.axis(a, nd, "axes entry") for a in attrs.get("axes", range(nd)))
    if len(set(axes)) != len(axes):
        raise ctx.bad(f"axes {axes} must be distinct")
    if len(shape) != len(axes):
        raise ctx.bad(f"shape {shape} must have one entry per axis of {axes}")
    if any(s < 0 for s in shape):
        raise ctx.bad(f"shape {shape} must be non-negative")
    ctx.check_size([shape[axes.index(i)] if i in axes else d for i, d in enumerate(x.shape)], "the output")
    pads = [(0, 0)] * nd
    cut: list[tuple[int, int, int]] = []
    for a, want in zip(axes, shape):
        have = x.shape[a]
        if want > have:  # pad: the extra goes to the end when odd (ONNX reference)
            lo = (want - have) // 2
            pads[a] = (lo, want - have - lo)
        elif want < have:  # crop: the extra comes off the end when odd
            lo = (have - want) // 2
            cut.append((a, lo, lo + want))
    y = x
    if cut:
        y = ctx.emit1("strided_slice", y, begin=tuple(c[1] for c in cut), end=tuple(c[2] for c in cut),
                      strides=(1,) * len(cut), axes=tuple(c[0] for c in cut))
    if any(p != (0, 0) for p in pads):
        y = ctx.emit1("pad", y, pad_width=tuple(pads), mode="constant", value=0.0)
    if y is x:
        y = ctx.emit1("identity", x)
    return y


# ----------------------------------------------------------------------------- AffineGrid
def _base_grid(size: tuple[int, ...], align_corners: bool) -> np.ndarray:
    """Homogeneous normalised coordinates ``(prod(size), k + 1)``, fastest axis first (x, y[, z], 1)."""
    axes = []
    for n in size:
        if align_corners and n > 1:  # a single position sits at 0 (ONNX Runtime, PyTorch)
            axes.append(np.linspace(-1.0, 1.0, n))
        else:
            axes.append((2.0 * np.arange(n) + 1.0) / n - 1.0)
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.reshape(-1) for m in reversed(mesh)]
    cols.append(np.ones(math.prod(size)))
    return np.stack(cols, axis=1)


@onnx_op("AffineGrid")
def _affine_grid(ctx: Context, node, ins, attrs):
    theta = ins[0]
    _require_rank(ctx, theta, (3,), "theta")
    size = ctx.static_ints(ins[1], "size")
    k = len(size) - 2
    if k not in (2, 3):
        raise ctx.unsupported(f"size {size}: only 2-D (N, C, H, W) and 3-D (N, C, D, H, W) grids exist")
    n = size[0]
    if theta.shape != (n, k, k + 1):
        raise ctx.bad(f"theta must have shape {(n, k, k + 1)} for size {size}, got {theta.shape}")
    if not theta.dtype.startswith(("float", "bfloat")):
        raise ctx.bad(f"theta must be floating point, got {theta.dtype}")
    if any(s < 1 for s in size[2:]):
        raise ctx.bad(f"size {size} must have positive spatial dims")
    ctx.check_size((n,) + tuple(size[2:]) + (k,), "the output grid")
    base = _base_grid(tuple(size[2:]), bool(attrs.get("align_corners", 0)))
    # grid[n, p, :] = theta[n] @ base[p]: one batched matmul (1, P, k+1) x (N, k+1, k).
    cdt = theta.dtype if theta.dtype in ("float32", "float64") else "float32"
    tt = ctx.emit1("transpose", ctx.cast(theta, cdt), axes=(0, 2, 1))
    g = ctx.emit1("matmul", ctx.const(base[None].astype(cdt)), tt)
    return ctx.cast(ctx.reshape(g, (n,) + tuple(size[2:]) + (k,)), theta.dtype)


# ----------------------------------------------------------------------------- LpPool
def _box_sum(ctx: Context, x: Value, axis: int, k: int, s: int, d: int, p0: int, p1: int) -> Value:
    """Sliding-window sum along one axis (zero padding), as a conv2d over a (pre, 1, L, post) view."""
    shp = x.shape
    pre, post = math.prod(shp[:axis]), math.prod(shp[axis + 1:])
    v = ctx.reshape(x, (pre, 1, shp[axis], post))
    w = ctx.const(np.ones((1, 1, k, 1), dtype=np_dtype(x.dtype)))
    y = ctx.emit1("conv2d", v, w, strides=(s, 1), dilation=(d, 1), padding=(p0, 0, p1, 0), groups=1)
    return ctx.reshape(y, shp[:axis] + (y.shape[2],) + shp[axis + 1:])


@onnx_op("LpPool")
def _lp_pool(ctx: Context, node, ins, attrs):
    x = ins[0]
    if x.type.ndim < 3:
        raise ctx.bad(f"input must be (N, C, spatial...), got shape {x.shape}")
    if not x.dtype.startswith(("float", "bfloat")):
        raise ctx.bad(f"input must be floating point, got {x.dtype}")
    nd = x.type.ndim - 2
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    if len(kernel) != nd or any(k < 1 for k in kernel):
        raise ctx.bad(f"kernel_shape {kernel} must hold {nd} positive sizes")
    if any(isinstance(d, str) for d in x.type.dims[2:]):
        # the separable box sums below fold the other axes into rows, which a symbolic
        # spatial dim cannot take part in (it would move data in the padded layout)
        raise ctx.unsupported(f"LpPool over symbolic spatial dims {x.type.dims[2:]}")
    strides, dil, pads = _window_attrs(ctx, attrs, x.shape[2:], kernel, "LpPool")
    if any(s < 1 for s in strides) or any(d < 1 for d in dil) or any(q < 0 for q in pads):
        raise ctx.bad(f"strides {strides} and dilations {dil} must be positive and pads {pads} non-negative")
    p = float(attrs.get("p", 2))
    if not p > 0:
        raise ctx.bad(f"p must be positive, got {p}")
    ceil = bool(attrs.get("ceil_mode", 0))
    cdt = x.dtype if x.dtype in ("float32", "float64") else "float32"
    y = ctx.cast(x, cdt)
    y = ctx.emit1("multiply", y, y) if p == 2 else \
        ctx.emit1("power", ctx.emit1("abs", y), ctx.const(np.array(p, dtype=np_dtype(cdt))))
    # The box sum of a product window is separable: one 1-D sum per spatial axis.
    for i in range(nd):
        n_in, k, s, d, b, e = x.shape[2 + i], kernel[i], strides[i], dil[i], pads[i], pads[i + nd]
        out = conv_out_size(n_in, k, s, b, e, d, ceil)
        # ceil_mode windows that run past the end padding see zeros, which add nothing.
        e += max(0, (out - 1) * s + (k - 1) * d + 1 - (n_in + b + e))
        y = _box_sum(ctx, y, 2 + i, k, s, d, b, e)
    y = ctx.emit1("sqrt", y) if p == 2 else \
        ctx.emit1("power", y, ctx.const(np.array(1.0 / p, dtype=np_dtype(cdt))))
    return ctx.cast(y, x.dtype)


# ----------------------------------------------------------------------------- MaxUnpool
@onnx_op("MaxUnpool")
def _max_unpool(ctx: Context, node, ins, attrs):
    x, idx = ins[0], ins[1]
    if x.type.ndim < 3:
        raise ctx.bad(f"X must be (N, C, spatial...), got shape {x.shape}")
    if idx.shape != x.shape or not idx.dtype.startswith(("int", "uint")):
        raise ctx.bad(f"I must be an integer tensor of X's shape {x.shape}, got {idx.dtype}{idx.shape}")
    nd = x.type.ndim - 2
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = tuple(int(s) for s in attrs.get("strides", (1,) * nd))
    pads = tuple(int(q) for q in attrs.get("pads", (0,) * (2 * nd)))
    if len(kernel) != nd or len(strides) != nd or len(pads) != 2 * nd:
        raise ctx.bad(f"kernel_shape {kernel}, strides {strides} and pads {pads} do not match {nd}-D data")
    if len(ins) > 2 and ins[2] is not None:
        out = ctx.static_ints(ins[2], "output_shape")
        if len(out) != x.type.ndim or tuple(out[:2]) != x.shape[:2]:
            raise ctx.bad(f"output_shape {out} must be (N, C, spatial...) with N, C of {x.shape}")
    else:
        out = x.shape[:2] + tuple((x.shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + nd]
                                  for i in range(nd))
    if any(d < 1 for d in out):
        raise ctx.bad(f"output shape {out} must be positive")
    ctx.check_size(out, "the output")
    # Indices address the flattened output (MaxPool's Indices), but each (n, c) plane only
    # receives its own values: scatter per plane along the flattened spatial axis, so the
    # search is over one plane's windows instead of the whole tensor.
    planes, n_in, n_out = out[0] * out[1], math.prod(x.shape[2:]), math.prod(out[2:])
    base = ctx.const((np.arange(planes, dtype=np.int64) * n_out).reshape(planes, 1))
    local = ctx.emit1("subtract", ctx.reshape(ctx.cast(idx, "int64"), (planes, n_in)), base)
    zeros = ctx.const(np.zeros((planes, n_out), dtype=np_dtype(x.dtype)))
    y = ctx.emit1("scatter_elements", zeros, local, ctx.reshape(x, (planes, n_in)), axis=1)
    return ctx.reshape(y, tuple(out))


# ----------------------------------------------------------------------------- GridSample
_GRID_MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}


@onnx_op("GridSample")
def _grid_sample(ctx: Context, node, ins, attrs):
    x, grid = ins[0], ins[1]
    mode = attrs.get("mode", "linear" if ctx.opset >= 20 else "bilinear")
    if mode not in _GRID_MODES:
        raise ctx.unsupported(f"mode={mode!r} (expected one of {sorted(_GRID_MODES)})")
    pad = attrs.get("padding_mode", "zeros")
    if pad not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"padding_mode={pad!r} (expected zeros, border or reflection)")
    if x.type.ndim not in (3, 4, 5):
        raise ctx.unsupported(f"X of shape {x.shape} (1-D, 2-D and 3-D spatial data are supported)")
    if _GRID_MODES[mode] == "cubic" and x.type.ndim == 5:
        raise ctx.unsupported("mode='cubic' on volumetric (5-D) data (2-D only, like ONNX Runtime)")
    if not grid.dtype.startswith(("float", "bfloat")):
        raise ctx.bad(f"grid must be floating point, got {grid.dtype}")
    return ctx.emit1("grid_sample", x, grid, mode=_GRID_MODES[mode], padding_mode=pad,
                     align_corners=bool(attrs.get("align_corners", 0)))


# ----------------------------------------------------------------------------- Col2Im
@onnx_op("Col2Im")
def _col2im(ctx: Context, node, ins, attrs):
    x = ins[0]
    image = ctx.static_ints(ins[1], "image_shape")
    block = ctx.static_ints(ins[2], "block_shape")
    m = len(image)
    if m < 1 or len(block) != m:
        raise ctx.bad(f"image_shape {image} and block_shape {block} must have the same, positive length")
    dil = tuple(int(d) for d in attrs.get("dilations", (1,) * m))
    strides = tuple(int(s) for s in attrs.get("strides", (1,) * m))
    pads = tuple(int(p) for p in attrs.get("pads", (0,) * (2 * m)))
    if len(dil) != m or len(strides) != m or len(pads) != 2 * m:
        raise ctx.bad(f"dilations {dil}, strides {strides} and pads {pads} do not match {m}-D images")
    if min(image + block + dil + strides) < 1 or min(pads) < 0:
        raise ctx.bad("image_shape, block_shape, dilations and strides must be positive and pads non-negative")
    _require_rank(ctx, x, (3,), "input")
    if not x.dtype.startswith(("float", "bfloat")):
        raise ctx.unsupported(f"input of type {x.dtype} (floating point is supported)")
    n, ck, length = x.shape
    kprod = math.prod(block)
    if ck % kprod:
        raise ctx.bad(f"input dim 1 ({ck}) must be a multiple of prod(block_shape) = {kprod}")
    c = ck // kprod
    nblocks = []
    for i in range(m):
        span = image[i] + pads[i] + pads[i + m] - dil[i] * (block[i] - 1) - 1
        if span < 0:
            raise ctx.bad(f"block {block} (dilations {dil}) does not fit image {image} with pads {pads}")
        nblocks.append(span // strides[i] + 1)
    if math.prod(nblocks) != length:
        raise ctx.bad(f"input has {length} blocks, image {image} with these blocks, strides, dilations and "
                      f"pads has {math.prod(nblocks)} ({nblocks})")
    ctx.check_size((n, c) + image, "the output")
    # Every (kernel tap t, block b) pair lands at b * stride + t * dilation - pad, independently per
    # axis, so the sum separates into one 1-D col2im per axis. A 1-D col2im is a transposed
    # convolution of the (tap, block) plane with an identity (tap -> tap) weight.
    labels = ["n", "c"] + [f"t{i}" for i in range(m)] + [f"b{i}" for i in range(m)]
    sizes = dict(zip(labels, (n, c) + block + tuple(nblocks)))
    y = ctx.reshape(x, tuple(sizes[lb] for lb in labels))
    for i in reversed(range(m)):
        rest = [lb for lb in labels if lb not in (f"t{i}", f"b{i}")]
        perm = [labels.index(lb) for lb in rest + [f"t{i}", f"b{i}"]]
        if perm != list(range(len(labels))):
            y = ctx.emit1("transpose", y, axes=tuple(perm))
        p = math.prod(sizes[lb] for lb in rest)
        k, b = block[i], nblocks[i]
        y = ctx.reshape(y, (p, k, 1, b))
        full = strides[i] * (b - 1) + dil[i] * (k - 1) + 1 - pads[i] - pads[i + m]
        w = ctx.const(np.eye(k, dtype=np_dtype(x.dtype)).reshape(k, 1, 1, k))
        y = ctx.emit1("conv2d_transpose", y, w, strides=(1, strides[i]), dilation=(1, dil[i]),
                      padding=(0, pads[i], 0, pads[i + m]), output_padding=(0, image[i] - full), groups=1)
        labels = rest + [f"z{i}"]
        sizes[f"z{i}"] = image[i]
        y = ctx.reshape(y, tuple(sizes[lb] for lb in labels))
    want = ["n", "c"] + [f"z{i}" for i in range(m)]
    perm = [labels.index(lb) for lb in want]
    if perm != list(range(len(labels))):
        y = ctx.emit1("transpose", y, axes=tuple(perm))
    return y


# ----------------------------------------------------------------------------- DeformConv
@onnx_op("DeformConv")
def _deform_conv(ctx: Context, node, ins, attrs):
    x, w, off = ins[0], ins[1], ins[2]
    bias = ins[3] if len(ins) > 3 else None
    mask = ins[4] if len(ins) > 4 else None
    if x.type.ndim != 4:
        raise ctx.unsupported(f"X of shape {x.shape} (only 2-D spatial data, (N, C, H, W), is supported)")
    _require_rank(ctx, w, (4,), "W")
    if not x.dtype.startswith(("float", "bfloat")):
        raise ctx.bad(f"X must be floating point, got {x.dtype}")
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    kernel = tuple(attrs.get("kernel_shape", (kh, kw)))
    if kernel != (kh, kw):
        raise ctx.bad(f"kernel_shape {kernel} does not match W {w.shape}")
    group, og = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
    if group < 1 or og < 1 or c != cg * group or oc % group or c % og:
        raise ctx.bad(f"group {group} / offset_group {og} do not fit X {x.shape} and W {w.shape}")
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _window_attrs(ctx, attrs, (h, wd), kernel, "DeformConv")
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    k = kh * kw
    if oh < 1 or ow < 1 or off.shape != (n, og * k * 2, oh, ow):
        raise ctx.bad(f"offset must have shape {(n, og * k * 2, oh, ow)}, got {off.shape}")
    if mask is not None and mask.shape != (n, og * k, oh, ow):
        raise ctx.bad(f"mask must have shape {(n, og * k, oh, ow)}, got {mask.shape}")
    ctx.check_size((n, c, k, oh, ow), "the sampled columns")
    cdt = x.dtype if x.dtype in ("float32", "float64") else "float32"
    npdt = np_dtype(cdt)
    # Sampling position of tap (i, j) at output (y, x): the regular conv position plus its offset.
    base = np.zeros((1, 1, k, 2, oh, ow))
    ky, kx = np.meshgrid(np.arange(kh) * dh, np.arange(kw) * dw, indexing="ij")
    base[0, 0, :, 0] = ky.reshape(k, 1, 1) + (np.arange(oh) * sh - pt).reshape(1, oh, 1)
    base[0, 0, :, 1] = kx.reshape(k, 1, 1) + (np.arange(ow) * sw - pl).reshape(1, 1, ow)
    pos = ctx.emit1("add", ctx.reshape(ctx.cast(off, cdt), (n, og, k, 2, oh, ow)), ctx.const(base.astype(npdt)))
    # Pixel position p -> grid_sample's normalised coordinate with align_corners=False,
    # (2p + 1) / size - 1, which grid_sample maps back to p (bilinear, zeros outside: DeformConv).
    scale = np.array([2.0 / h, 2.0 / wd]).reshape(1, 1, 1, 2, 1, 1)
    shift = np.array([1.0 / h - 1.0, 1.0 / wd - 1.0]).reshape(1, 1, 1, 2, 1, 1)
    g = ctx.emit1("add", ctx.emit1("multiply", pos, ctx.const(scale.astype(npdt))), ctx.const(shift.astype(npdt)))
    g = ctx.emit1("take", g, ctx.const(np.array([1, 0], dtype=np.int64)), axis=3)  # grid holds (x, y)
    g = ctx.reshape(ctx.emit1("transpose", g, axes=(0, 1, 2, 4, 5, 3)), (n * og, k * oh, ow, 2))
    data = ctx.reshape(ctx.cast(x, cdt), (n * og, c // og, h, wd))
    cols = ctx.emit1("grid_sample", data, g, mode="linear", padding_mode="zeros", align_corners=False)
    cols = ctx.reshape(cols, (n, og, c // og, k, oh * ow))
    if mask is not None:
        cols = ctx.emit1("multiply", cols, ctx.reshape(ctx.cast(mask, cdt), (n, og, 1, k, oh * ow)))
    # out[n, o, p] = sum over (c, tap) of W[o, c, tap] * cols[n, c, tap, p], per conv group.
    cols = ctx.reshape(cols, (n, group, cg * k, oh * ow))
    wm = ctx.reshape(ctx.cast(w, cdt), (group, oc // group, cg * k))
    y = ctx.reshape(ctx.emit1("matmul", wm, cols), (n, oc, oh, ow))
    if bias is not None:
        if bias.shape != (oc,):
            raise ctx.bad(f"B must have shape {(oc,)}, got {bias.shape}")
        y = ctx.emit1("bias_add", y, ctx.cast(bias, cdt), axis=1)
    return ctx.cast(y, x.dtype)
