"""Neural-network ops: convolution, dense/matmul, normalization, softmax, pooling, resize.

Layouts: activations NCHW, conv weights OIHW (``conv2d``) and IOHW (``conv2d_transpose``, the
ONNX layout), dense weights (units, in_features). Padding of 2-D windows is
``(top, left, bottom, right)``. 1-D convolutions/pools are expressed by the frontend as 2-D ones
with H = 1.
"""

from __future__ import annotations

import math

import numpy as np

from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType
from ._util import (Attrs, broadcast_shapes, conv_out_size, norm_axis, require_float,
                    require_ndim, same_dtype, wide)

FUSABLE, OPAQUE = OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.OPAQUE

_WIN2D = {
    "strides": ("ints", (1, 1)),
    "padding": ("ints", (0, 0, 0, 0)),
    "dilation": ("ints", (1, 1)),
}


def _check_len(attrs: Attrs, key: str, n: int) -> None:
    if len(attrs[key]) != n:
        raise InputError(f"{key} must have {n} values, got {attrs[key]}")
    if key != "padding" and key != "output_padding" and any(v < 1 for v in attrs[key]):
        raise InputError(f"{key} must be positive, got {attrs[key]}")
    if key in ("padding", "output_padding") and any(v < 0 for v in attrs[key]):
        raise InputError(f"{key} must be non-negative, got {attrs[key]}")


# ----------------------------------------------------------------------------- conv2d
def _conv2d_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, weight = ts
    require_ndim(data, 4, "data")
    require_ndim(weight, 4, "weight")
    dt = same_dtype(ts, "data and weight")
    for k in ("strides", "dilation"):
        _check_len(attrs, k, 2)
    _check_len(attrs, "padding", 4)
    g = attrs["groups"]
    n, c, h, w = data.shape
    o, ci, kh, kw = weight.shape
    if g < 1 or c % g or o % g:
        raise InputError(f"groups={g} must divide input channels {c} and output channels {o}")
    if ci * g != c:
        raise InputError(f"channel mismatch: data has {c} channels but weight {weight.shape} "
                         f"expects {ci * g} (groups={g})")
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    oh = conv_out_size(h, kh, sh, pt, pb, dh)
    ow = conv_out_size(w, kw, sw, pl, pr, dw)
    return [TensorType((n, o, oh, ow), dt)]


def _windows(xp: np.ndarray, kh: int, kw: int, s: tuple[int, int], d: tuple[int, int],
             oh: int, ow: int):
    """Yield ``(i, j, view)``: the input seen by kernel tap (i, j) for every output pixel."""
    sh, sw = s
    dh, dw = d
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                           j * dw: j * dw + (ow - 1) * sw + 1: sw]


def _conv2d_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w = xs
    out_t = _conv2d_rel([TensorType(x.shape, x.dtype.name), TensorType(w.shape, w.dtype.name)],
                        attrs)[0]
    n, o, oh, ow = out_t.shape
    g = attrs["groups"]
    pt, pl, pb, pr = attrs["padding"]
    xp = np.pad(wide(x), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    w64 = wide(w)
    c = x.shape[1]
    out = np.zeros((n, g, o // g, oh, ow), dtype=xp.dtype)
    for i, j, win in _windows(xp, w.shape[2], w.shape[3], attrs["strides"], attrs["dilation"],
                              oh, ow):
        win = win.reshape(n, g, c // g, oh, ow)
        wk = w64[:, :, i, j].reshape(g, o // g, c // g)
        out += np.einsum("ngchw,goc->ngohw", win, wk, optimize=True)
    return [out.reshape(n, o, oh, ow).astype(x.dtype)]


register_op(
    "conv2d", attrs={**_WIN2D, "groups": ("int", 1)}, type_rel=_conv2d_rel, pattern=FUSABLE,
    ref=_conv2d_ref, num_inputs=2, inputs=("data", "weight"),
    doc="2-D convolution, NCHW data, OIHW weight (I = C / groups)")


# ----------------------------------------------------------------------------- conv2d_transpose
def _deconv_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, weight = ts
    require_ndim(data, 4, "data")
    require_ndim(weight, 4, "weight")
    dt = same_dtype(ts, "data and weight")
    for k in ("strides", "dilation"):
        _check_len(attrs, k, 2)
    _check_len(attrs, "padding", 4)
    _check_len(attrs, "output_padding", 2)
    g = attrs["groups"]
    n, c, h, w = data.shape
    ci, og, kh, kw = weight.shape
    if g < 1 or c % g:
        raise InputError(f"groups={g} must divide input channels {c}")
    if ci != c:
        raise InputError(f"channel mismatch: data has {c} channels, weight {weight.shape} "
                         f"expects {ci}")
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oph, opw = attrs["output_padding"]
    oh = sh * (h - 1) + oph + (kh - 1) * dh + 1 - pt - pb
    ow = sw * (w - 1) + opw + (kw - 1) * dw + 1 - pl - pr
    if oh <= 0 or ow <= 0:
        raise InputError(f"transposed conv output would be empty ({oh}, {ow})")
    return [TensorType((n, og * g, oh, ow), dt)]


def _deconv_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, w = xs
    g = attrs["groups"]
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oph, opw = attrs["output_padding"]
    fh = sh * (h - 1) + (kh - 1) * dh + 1 + oph
    fw = sw * (wd - 1) + (kw - 1) * dw + 1 + opw
    x64 = wide(x).reshape(n, g, c // g, h, wd)
    w64 = wide(w).reshape(g, c // g, og, kh, kw)
    full = np.zeros((n, g, og, fh, fw), dtype=x64.dtype)
    for i in range(kh):
        for j in range(kw):
            contrib = np.einsum("ngchw,gco->ngohw", x64, w64[:, :, :, i, j], optimize=True)
            full[:, :, :, i * dh: i * dh + (h - 1) * sh + 1: sh,
                 j * dw: j * dw + (wd - 1) * sw + 1: sw] += contrib
    full = full.reshape(n, g * og, fh, fw)
    return [full[:, :, pt: fh - pb, pl: fw - pr].astype(x.dtype)]


register_op(
    "conv2d_transpose",
    attrs={**_WIN2D, "output_padding": ("ints", (0, 0)), "groups": ("int", 1)},
    type_rel=_deconv_rel, pattern=FUSABLE, ref=_deconv_ref, num_inputs=2,
    inputs=("data", "weight"),
    doc="2-D transposed convolution, NCHW data, IOHW weight (O = out channels / groups); "
        "out = stride*(in-1) + output_padding + (k-1)*dilation + 1 - pad_begin - pad_end")


# ----------------------------------------------------------------------------- dense / matmul
def _dense_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, weight = ts
    dt = same_dtype(ts, "data and weight")
    if data.ndim < 1:
        raise InputError("data must be at least 1-D")
    units = attrs["units"]
    if units:
        # a weight packed at build time: (ceil(N / bn), K, bn) panels (kiln.transform.PackDenseWeights)
        require_ndim(weight, 3, "packed weight")
        npan, _, bn = weight.shape
        if not (npan - 1) * bn < units <= npan * bn:
            raise InputError(f"units={units} does not fit weight panels {weight.shape} (ceil(N / bn), K, bn)")
    else:
        require_ndim(weight, 2, "weight")
    if data.shape[-1] != weight.shape[1]:
        raise InputError(f"reduction dim mismatch: data {data.shape} vs weight {weight.shape} "
                         f"(weight is (units, in_features))")
    return [TensorType(data.shape[:-1] + (units or weight.shape[0],), dt)]


def _dense_ref(xs, attrs):
    x, w = xs
    if attrs["units"]:
        npan, k, bn = w.shape
        w = w.transpose(0, 2, 1).reshape(npan * bn, k)[:attrs["units"]]
    return [np.matmul(wide(x), wide(w).T).astype(x.dtype)]


register_op("dense", attrs={"units": ("int", 0)}, type_rel=_dense_rel, pattern=FUSABLE, ref=_dense_ref,
            num_inputs=2, inputs=("data", "weight"),
            doc="data (..., K) x weight (N, K)^T -> (..., N); units=N: weight packed as (ceil(N/bn), K, bn) panels")


def _matmul_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    a, b = ts
    dt = same_dtype(ts)
    if a.ndim < 2 or b.ndim < 2:
        raise InputError(f"matmul operands must be at least 2-D, got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise InputError(f"matmul reduction dim mismatch: {a.shape} x {b.shape}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorType(batch + (a.shape[-2], b.shape[-1]), dt)]


register_op("matmul", type_rel=_matmul_rel, pattern=FUSABLE,
            ref=lambda xs, a: [np.matmul(wide(xs[0]), wide(xs[1])).astype(xs[0].dtype)],
            num_inputs=2, inputs=("a", "b"),
            doc="batched matrix product (..., M, K) x (..., K, N); batch dims broadcast")


# ----------------------------------------------------------------------------- normalization
def _channel_params_rel(ts, axis, what):
    data = ts[0]
    for i, t in enumerate(ts[1:]):
        if t.shape != (data.shape[axis],):
            raise InputError(f"{what}[{i + 1}] must have shape ({data.shape[axis]},), "
                             f"got {t.shape}")


def _bn_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    require_float(ts[0], "data")
    same_dtype(ts)
    axis = norm_axis(attrs["axis"], ts[0].ndim)
    _channel_params_rel(ts, axis, "batch_norm input")
    return [ts[0]]


def _bn_ref(xs, attrs):
    x, gamma, beta, mean, var = (wide(v) for v in xs)
    axis = norm_axis(attrs["axis"], x.ndim)
    shp = [1] * x.ndim
    shp[axis] = -1
    r = lambda v: v.reshape(shp)  # noqa: E731
    y = (x - r(mean)) / np.sqrt(r(var) + attrs["epsilon"]) * r(gamma) + r(beta)
    return [y.astype(xs[0].dtype)]


register_op("batch_norm", attrs={"epsilon": ("float", 1e-5), "axis": ("int", 1)},
            type_rel=_bn_rel, pattern=OpPattern.BROADCAST, ref=_bn_ref, num_inputs=5,
            inputs=("data", "gamma", "beta", "moving_mean", "moving_var"),
            doc="inference batch norm; folded away by SimplifyInference")


def _in_rel(ts, attrs):
    require_float(ts[0], "data")
    same_dtype(ts)
    if ts[0].ndim < 3:
        raise InputError(f"instance_norm data must be at least 3-D, got {ts[0].shape}")
    _channel_params_rel(ts, 1, "instance_norm input")
    return [ts[0]]


def _in_ref(xs, attrs):
    x, gamma, beta = (wide(v) for v in xs)
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    shp = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + attrs["epsilon"]) * gamma.reshape(shp) + beta.reshape(shp)
    return [y.astype(xs[0].dtype)]


register_op("instance_norm", attrs={"epsilon": ("float", 1e-5)}, type_rel=_in_rel,
            pattern=OPAQUE, ref=_in_ref, num_inputs=3, inputs=("data", "gamma", "beta"),
            doc="normalize every (n, c) over the spatial dims, then scale/shift per channel")


def _ln_rel(ts, attrs):
    data = ts[0]
    require_float(data, "data")
    same_dtype(ts)
    axis = norm_axis(attrs["axis"], data.ndim)
    norm_shape = data.shape[axis:]
    for i, t in enumerate(ts[1:]):
        if broadcast_shapes(t.shape, norm_shape) != norm_shape:
            raise InputError(f"layer_norm {'gamma' if i == 0 else 'beta'} shape {t.shape} does "
                             f"not broadcast to normalized shape {norm_shape}")
    return [data]


def _ln_ref(xs, attrs):
    x, gamma, beta = (wide(v) for v in xs)
    axis = norm_axis(attrs["axis"], x.ndim)
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + attrs["epsilon"]) * gamma + beta
    return [y.astype(xs[0].dtype)]


register_op("layer_norm", attrs={"axis": ("int", -1), "epsilon": ("float", 1e-5)},
            type_rel=_ln_rel, pattern=OPAQUE, ref=_ln_ref, num_inputs=3,
            inputs=("data", "gamma", "beta"),
            doc="normalize over dims axis..end, then * gamma + beta (both broadcast to "
                "data.shape[axis:])")


def _softmax_rel(ts, attrs):
    require_float(ts[0], "data")
    norm_axis(attrs["axis"], ts[0].ndim)
    return [ts[0]]


def _softmax_ref(xs, attrs, log=False):
    x = wide(xs[0])
    axis = norm_axis(attrs["axis"], x.ndim)
    m = x.max(axis=axis, keepdims=True)
    z = x - m
    lse = np.log(np.exp(z).sum(axis=axis, keepdims=True))
    y = z - lse if log else np.exp(z - lse)
    return [y.astype(xs[0].dtype)]


register_op("softmax", attrs={"axis": ("int", -1)}, type_rel=_softmax_rel, pattern=OPAQUE,
            ref=_softmax_ref, inputs=("data",), doc="softmax along one axis (ONNX >= 13)")
register_op("log_softmax", attrs={"axis": ("int", -1)}, type_rel=_softmax_rel, pattern=OPAQUE,
            ref=lambda xs, a: _softmax_ref(xs, a, log=True), inputs=("data",),
            doc="log of softmax along one axis")


def _lrn_rel(ts, attrs):
    require_float(ts[0], "data")
    norm_axis(attrs["axis"], ts[0].ndim)
    if attrs["size"] < 1:
        raise InputError(f"lrn size must be positive, got {attrs['size']}")
    return [ts[0]]


def _lrn_ref(xs, attrs):
    x = wide(xs[0])
    axis = norm_axis(attrs["axis"], x.ndim)
    size = attrs["size"]
    lo, hi = (size - 1) // 2, int(math.ceil((size - 1) / 2))
    sq = np.moveaxis(x * x, axis, 0)
    c = sq.shape[0]
    padded = np.concatenate([np.zeros((lo,) + sq.shape[1:]), sq, np.zeros((hi,) + sq.shape[1:])])
    csum = np.cumsum(np.concatenate([np.zeros((1,) + sq.shape[1:]), padded]), axis=0)
    win = csum[size: size + c] - csum[:c]
    win = np.moveaxis(win, 0, axis)
    y = x / (attrs["bias"] + attrs["alpha"] / size * win) ** attrs["beta"]
    return [y.astype(xs[0].dtype)]


register_op("lrn", attrs={"size": ("int", REQUIRED), "alpha": ("float", 1e-4),
                          "beta": ("float", 0.75), "bias": ("float", 1.0), "axis": ("int", 1)},
            type_rel=_lrn_rel, pattern=OPAQUE, ref=_lrn_ref, inputs=("data",),
            doc="x / (bias + alpha/size * sum of x^2 over channels "
                "[c - (size-1)//2, c + ceil((size-1)/2)])^beta")


# ----------------------------------------------------------------------------- pooling
def _pool_rel(ts, attrs):
    data = ts[0]
    require_ndim(data, 4, "data")
    _check_len(attrs, "pool_size", 2)
    for k in ("strides", "dilation"):
        _check_len(attrs, k, 2)
    _check_len(attrs, "padding", 4)
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    if pt >= (kh - 1) * dh + 1 or pb >= (kh - 1) * dh + 1 or pl >= (kw - 1) * dw + 1 \
            or pr >= (kw - 1) * dw + 1:
        raise InputError(f"padding {attrs['padding']} must be smaller than the pool window")
    n, c, h, w = data.shape
    ceil = attrs["ceil_mode"]
    oh = conv_out_size(h, kh, sh, pt, pb, dh, ceil)
    ow = conv_out_size(w, kw, sw, pl, pr, dw, ceil)
    return [TensorType((n, c, oh, ow), data.dtype)]


def _pool_ref(xs, attrs, kind):
    x = xs[0]
    n, c, h, w = x.shape
    out = _pool_rel([TensorType(x.shape, x.dtype.name)], attrs)[0]
    oh, ow = out.shape[2:]
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    # Extra end padding so that every ceil_mode window fits; it never counts for averages.
    eh = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + pt + pb))
    ew = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + pl + pr))
    pads = ((0, 0), (0, 0), (pt, pb + eh), (pl, pr + ew))
    if kind == "max":
        if x.dtype.kind in "iu":
            fill = np.iinfo(x.dtype).min
        else:
            fill = -np.inf
        xp = np.pad(wide(x), pads, constant_values=fill)
        res = None
        for _, _, win in _windows(xp, kh, kw, (sh, sw), (dh, dw), oh, ow):
            res = win.copy() if res is None else np.maximum(res, win)
        return [res.astype(x.dtype)]
    xp = np.pad(wide(x), pads)
    mask = np.zeros((1, 1) + xp.shape[2:])
    if attrs["count_include_pad"]:
        mask[:, :, : pt + h + pb, : pl + w + pr] = 1.0
    else:
        mask[:, :, pt: pt + h, pl: pl + w] = 1.0
    total = np.zeros((n, c, oh, ow))
    count = np.zeros((1, 1, oh, ow))
    for (_, _, win), (_, _, mwin) in zip(_windows(xp, kh, kw, (sh, sw), (dh, dw), oh, ow),
                                         _windows(mask, kh, kw, (sh, sw), (dh, dw), oh, ow)):
        total += win
        count += mwin
    return [(total / np.maximum(count, 1.0)).astype(x.dtype)]


_POOL = {"pool_size": ("ints", REQUIRED), **_WIN2D, "ceil_mode": ("bool", False)}
register_op("max_pool2d", attrs=_POOL, type_rel=_pool_rel, pattern=FUSABLE,
            ref=lambda xs, a: _pool_ref(xs, a, "max"), inputs=("data",),
            doc="2-D max pooling (NCHW); padded cells never win")
register_op("avg_pool2d", attrs={**_POOL, "count_include_pad": ("bool", False)},
            type_rel=_pool_rel, pattern=FUSABLE, ref=lambda xs, a: _pool_ref(xs, a, "avg"),
            inputs=("data",),
            doc="2-D average pooling (NCHW); divisor counts in-bounds cells, plus the explicit "
                "padding when count_include_pad (never the ceil_mode overhang)")


# ----------------------------------------------------------------------------- resize
_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _resize_rel(ts, attrs):
    data = ts[0]
    require_ndim(data, 4, "data")
    _check_len(attrs, "size", 2)
    if len(attrs["scales"]) != 2 or any(s <= 0 for s in attrs["scales"]):
        raise InputError(f"scales must be 2 positive values, got {attrs['scales']}")
    if attrs["method"] not in ("nearest", "linear"):
        raise InputError(f"resize method must be nearest or linear, got {attrs['method']!r}")
    if attrs["coordinate_transformation_mode"] not in _COORD_MODES:
        raise InputError(f"unsupported coordinate_transformation_mode "
                         f"{attrs['coordinate_transformation_mode']!r}; supported: {_COORD_MODES}")
    if attrs["nearest_mode"] not in _NEAREST_MODES:
        raise InputError(f"unsupported nearest_mode {attrs['nearest_mode']!r}")
    if attrs["method"] == "linear" and not data.dtype.startswith(("float", "bfloat")):
        raise InputError("linear resize needs a floating-point input")
    return [TensorType(data.shape[:2] + tuple(attrs["size"]), data.dtype)]


def resize_source_coord(out_idx: np.ndarray, in_len: int, out_len: int, scale: float,
                        mode: str) -> np.ndarray:
    """Map output coordinates to (fractional) input coordinates — ONNX Resize formulas."""
    x = out_idx.astype(np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adj = out_len / (scale * in_len)
        center = in_len / 2.0
        return center * (1.0 - adj) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return x * (in_len - 1) / (out_len - 1) if out_len > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise InputError(f"unsupported coordinate_transformation_mode {mode!r}")


def _nearest_index(xo: np.ndarray, in_len: int, mode: str, scale: float) -> np.ndarray:
    if mode == "round_prefer_floor":
        idx = np.ceil(xo - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(xo + 0.5)
    elif mode == "floor":
        idx = np.floor(xo)
    else:
        idx = np.ceil(xo)
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def resize_scales(attrs: dict, in_hw: tuple[int, int]) -> tuple[float, float]:
    """The coordinate-transform scales of a ``resize2d``: its ``scales``, or, for a resize to
    runtime sizes (``sym_size``), ``size / input extent`` per axis (ONNX Resize given sizes)."""
    if attrs.get("sym_size") is None:
        sy, sx = attrs["scales"]
    else:
        (sy, sx) = (o / i if i else 1.0 for o, i in zip(attrs["size"], in_hw))
    return float(sy), float(sx)


def _resize_ref(xs, attrs):
    x = xs[0]
    h, w = x.shape[2:]
    oh, ow = attrs["size"]
    sy, sx = resize_scales(attrs, (h, w))
    mode = attrs["coordinate_transformation_mode"]
    ys = resize_source_coord(np.arange(oh), h, oh, sy, mode)
    xcs = resize_source_coord(np.arange(ow), w, ow, sx, mode)
    if attrs["method"] == "nearest":
        iy = _nearest_index(ys, h, attrs["nearest_mode"], sy)
        ix = _nearest_index(xcs, w, attrs["nearest_mode"], sx)
        return [x[:, :, iy][:, :, :, ix]]

    def taps(c, n):
        c = np.clip(c, 0, n - 1)
        i0 = np.floor(c).astype(np.int64)
        i1 = np.minimum(i0 + 1, n - 1)
        return i0, i1, c - i0

    y0, y1, fy = taps(ys, h)
    x0, x1, fx = taps(xcs, w)
    xw = wide(x)
    top = xw[:, :, y0] * (1 - fy)[:, None] + xw[:, :, y1] * fy[:, None]
    out = top[:, :, :, x0] * (1 - fx) + top[:, :, :, x1] * fx
    return [out.astype(x.dtype)]


register_op(
    "resize2d",
    attrs={"size": ("ints", REQUIRED), "scales": ("floats", REQUIRED),
           "method": ("str", "nearest"), "coordinate_transformation_mode": ("str", "half_pixel"),
           "nearest_mode": ("str", "round_prefer_floor"), "sym_size": ("dims", None)},
    type_rel=_resize_rel, pattern=OpPattern.INJECTIVE, ref=_resize_ref, inputs=("data",),
    doc="resize H, W of NCHW data to size (out_h, out_w); scales (h, w) are the ones used in "
        "the coordinate transform; method nearest|linear (bilinear). sym_size (optional, "
        "dynamic graphs): the output (h, w) as dims, symbolic or static, with size their upper "
        "bounds; each axis's scale is then output / input extent at run time (ONNX Resize "
        "given sizes) and scales only records the ratio at the upper bounds")
