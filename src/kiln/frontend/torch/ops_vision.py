"""ATen converters for vision models: convolution, pooling, batch norm, resize, pad.

Owns what torchvision's classification and segmentation models need beyond :mod:`.ops_core`.
Imports only ``kiln.ir`` / ``kiln.runtime`` and :mod:`.converter`, never ``torch``.

1-D convolutions and poolings are expressed as 2-D ones with H = 1 (the IR convention);
3-D ones (video models: torchvision's r3d_18, mc3_18, r2plus1d_18) go through the 2-D
decompositions shared with the ONNX frontend in :mod:`kiln.frontend.volumetric`.
``adaptive_avg_pool2d`` / ``3d`` become a ``reduce_mean`` (1x1 output), an average pooling
(sizes that divide) or ``matmul`` s with constant averaging matrices, one per pooled dim (any
other size: torch's bins overlap then, which no single pooling window expresses).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...ir import Value
from ...ir.types import np_dtype
from ..volumetric import conv3d, conv_transpose3d, pool3d
from .converter import Args, Context, aten_op

__all__: list[str] = []


def _pair(v: Any, n: int = 2, what: str = "value") -> tuple[int, ...]:
    vals = [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n:
        raise ValueError(f"{what} {vals} must have {n} values")
    return tuple(vals)


def _to_2d(ctx: Context, x: Value, spatial: int) -> Value:
    """(N, C, L) -> (N, C, 1, L) for the 1-D variants."""
    if spatial == 1:
        return ctx.reshape(x, x.shape[:2] + (1,) + x.shape[2:])
    return x


# ------------------------------------------------------------------ convolution
@aten_op("aten.convolution.default", "aten._convolution.default")
def _convolution(ctx: Context, node: Any, a: Args) -> Value:
    x, w, b = a["input"], a["weight"], a["bias"]
    spatial = w.type.ndim - 2
    if spatial not in (1, 2, 3):
        raise ctx.unsupported(f"{spatial}-D convolution (1-D, 2-D and 3-D are supported)")
    unbatched = x.type.ndim == spatial + 1
    if unbatched:
        x = ctx.reshape(x, (1,) + x.shape)
    stride = _pair(a["stride"], spatial, "stride")
    pad = _pair(a["padding"], spatial, "padding")
    dil = _pair(a["dilation"], spatial, "dilation")
    groups = int(a["groups"])
    transposed = bool(a["transposed"])
    if spatial == 3:
        if transposed:
            outp = _pair(a["output_padding"], 3, "output_padding")
            y = conv_transpose3d(ctx, x, w, stride, dil, pad + pad, outp, groups)
        else:
            y = conv3d(ctx, x, w, stride, dil, pad + pad, groups)
        if b is not None:
            y = ctx.emit1("bias_add", y, b, axis=1)
        return ctx.reshape(y, ctx.out_shape())
    if spatial == 1:
        x = _to_2d(ctx, x, 1)
        w = ctx.reshape(w, w.shape[:2] + (1,) + w.shape[2:])
        stride, pad, dil = (1,) + stride, (0,) + pad, (1,) + dil
    padding = (pad[0], pad[1], pad[0], pad[1])
    if transposed:
        outp = _pair(a["output_padding"], spatial, "output_padding")
        if spatial == 1:
            outp = (0,) + outp
        y = ctx.emit1("conv2d_transpose", x, w, strides=stride, padding=padding, dilation=dil,
                      output_padding=outp, groups=groups)
    else:
        y = ctx.emit1("conv2d", x, w, strides=stride, padding=padding, dilation=dil,
                      groups=groups)
    if b is not None:
        y = ctx.emit1("bias_add", y, b, axis=1)
    return ctx.reshape(y, ctx.out_shape())


# ------------------------------------------------------------------ batch norm
def _bn(ctx: Context, x: Value, w: Value | None, b: Value | None, mean: Value | None,
        var: Value | None, eps: float) -> Value:
    if mean is None or var is None:
        raise ctx.unsupported("batch norm without running statistics (training mode); call "
                              "module.eval() before export")
    c = x.shape[1] if x.type.ndim > 1 else 1
    dt = np_dtype(x.dtype)
    w = w if w is not None else ctx.const(np.ones((c,), dtype=dt))
    b = b if b is not None else ctx.const(np.zeros((c,), dtype=dt))
    return ctx.emit1("batch_norm", x, w, b, mean, var, epsilon=float(eps), axis=1)


@aten_op("aten._native_batch_norm_legit_no_training.default")
def _bn_no_training(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    y = _bn(ctx, a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"],
            a["eps"])
    return [y, None, None]


@aten_op("aten.native_batch_norm.default", "aten._native_batch_norm_legit.default")
def _native_bn(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    if a["training"]:
        raise ctx.unsupported("batch norm in training mode (call module.eval() before export)")
    y = _bn(ctx, a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"],
            a["eps"])
    return [y, None, None]


@aten_op("aten.batch_norm.default")
def _batch_norm(ctx: Context, node: Any, a: Args) -> Value:
    if a["training"]:
        raise ctx.unsupported("batch norm in training mode (call module.eval() before export)")
    return _bn(ctx, a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"],
               a["eps"])


# ------------------------------------------------------------------ pooling
def _pool_args(ctx: Context, a: Args, spatial: int) -> tuple[tuple[int, ...], ...]:
    k = _pair(a["kernel_size"], spatial, "kernel_size")
    stride = _pair(a["stride"], spatial, "stride") if a["stride"] else k
    pad = _pair(a["padding"], spatial, "padding")
    if spatial == 1:
        k, stride, pad = (1,) + k, (1,) + stride, (0,) + pad
    return k, stride, pad


def _max_pool(ctx: Context, a: Args, spatial: int) -> Value:
    x = a["self"]
    unbatched = x.type.ndim == spatial + 1
    if unbatched:
        x = ctx.reshape(x, (1,) + x.shape)
    x = _to_2d(ctx, x, spatial)
    k, stride, pad = _pool_args(ctx, a, spatial)
    dil = _pair(a["dilation"], spatial, "dilation")
    if spatial == 3:
        y = pool3d(ctx, "max", x, k, stride, dil, pad + pad, bool(a["ceil_mode"]))
        return ctx.reshape(y, ctx.out_shape())
    if spatial == 1:
        dil = (1,) + dil
    y = ctx.emit1("max_pool2d", x, pool_size=k, strides=stride,
                  padding=(pad[0], pad[1], pad[0], pad[1]), dilation=dil,
                  ceil_mode=bool(a["ceil_mode"]))
    return ctx.reshape(y, ctx.out_shape())


@aten_op("aten.max_pool2d_with_indices.default")
def _max_pool2d_indices(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    return [_max_pool(ctx, a, 2), None]


@aten_op("aten.max_pool2d.default")
def _max_pool2d(ctx: Context, node: Any, a: Args) -> Value:
    return _max_pool(ctx, a, 2)


@aten_op("aten.max_pool1d.default")
def _max_pool1d(ctx: Context, node: Any, a: Args) -> Value:
    return _max_pool(ctx, a, 1)


@aten_op("aten.max_pool3d_with_indices.default")
def _max_pool3d_indices(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    # The indices are not computed: a program that uses them (max_unpool3d, an output) fails
    # at that getitem with an UnsupportedOpError naming this node's output 1.
    return [_max_pool(ctx, a, 3), None]


@aten_op("aten.max_pool3d.default")
def _max_pool3d(ctx: Context, node: Any, a: Args) -> Value:
    return _max_pool(ctx, a, 3)


def _avg_pool(ctx: Context, a: Args, spatial: int) -> Value:
    x = a["self"]
    if x.type.ndim == spatial + 1:
        x = ctx.reshape(x, (1,) + x.shape)
    x = _to_2d(ctx, x, spatial)
    k, stride, pad = _pool_args(ctx, a, spatial)
    ceil, include_pad = bool(a["ceil_mode"]), bool(a["count_include_pad"])
    divisor = a.get("divisor_override")
    if divisor is not None:
        divisor = int(divisor)
        if divisor == 0:
            raise ctx.bad("avg_pool divisor_override must be non-zero, got 0")
        # sum / divisor = mean-with-padding * (window size / divisor), exact while every window
        # lies inside the padded input; a ceil_mode partial window has a smaller divisor.
        floor_out = tuple((n + 2 * p - kk) // s + 1
                          for n, p, kk, s in zip(x.shape[2:], pad, k, stride))
        if ceil and tuple(ctx.out_shape()[-spatial:]) != floor_out[-spatial:]:
            raise ctx.unsupported("avg_pool divisor_override with a partial ceil_mode window "
                                  "(use ceil_mode=False or a size the windows tile)")
        include_pad = True
    if spatial == 3:
        y = pool3d(ctx, "avg", x, k, stride, (1, 1, 1), pad + pad, ceil, include_pad)
    else:
        y = ctx.emit1("avg_pool2d", x, pool_size=k, strides=stride,
                      padding=(pad[0], pad[1], pad[0], pad[1]), ceil_mode=ceil,
                      count_include_pad=include_pad)
    if divisor is not None:
        scale = float(np.prod(k)) / divisor
        if scale != 1.0:
            y = ctx.emit1("multiply", y, ctx.scalar(scale, y))
    return ctx.reshape(y, ctx.out_shape())


@aten_op("aten.avg_pool2d.default")
def _avg_pool2d(ctx: Context, node: Any, a: Args) -> Value:
    return _avg_pool(ctx, a, 2)


@aten_op("aten.avg_pool1d.default")
def _avg_pool1d(ctx: Context, node: Any, a: Args) -> Value:
    return _avg_pool(ctx, a, 1)


@aten_op("aten.avg_pool3d.default")
def _avg_pool3d(ctx: Context, node: Any, a: Args) -> Value:
    return _avg_pool(ctx, a, 3)


def _adaptive_matrix(n_in: int, n_out: int, dtype: Any) -> np.ndarray:
    """(n_out, n_in) averaging matrix of torch's adaptive bins [floor(i*n/o), ceil((i+1)*n/o))."""
    m = np.zeros((n_out, n_in), dtype=np.float64)
    for i in range(n_out):
        lo = (i * n_in) // n_out
        hi = -((-(i + 1) * n_in) // n_out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m.astype(dtype)


@aten_op("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    oh, ow = _pair(a["output_size"], 2, "output_size")
    h, w = x.shape[-2:]
    if (oh, ow) == (h, w):
        return x
    if (oh, ow) == (1, 1):
        return ctx.emit1("reduce_mean", x, axes=(x.type.ndim - 2, x.type.ndim - 1), keepdims=True)
    if x.type.ndim == 4 and h % oh == 0 and w % ow == 0:
        k = (h // oh, w // ow)
        return ctx.emit1("avg_pool2d", x, pool_size=k, strides=k)
    dt = np_dtype(x.dtype)
    # Overlapping bins: y = Mh @ x @ Mw^T with constant averaging matrices.
    y = ctx.emit1("matmul", ctx.const(_adaptive_matrix(h, oh, dt)), x) if oh != h else x
    if ow != w:
        y = ctx.emit1("matmul", y, ctx.const(np.ascontiguousarray(_adaptive_matrix(w, ow, dt).T)))
    return y


@aten_op("aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool3d.default")
def _adaptive_avg_pool3d(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    if x.type.ndim not in (4, 5):
        raise ctx.bad(f"adaptive_avg_pool3d needs (C, D, H, W) or (N, C, D, H, W) input, got "
                      f"{x.shape}")
    out = _pair(a["output_size"], 3, "output_size")
    lead, (d, h, w) = x.shape[:-3], x.shape[-3:]
    od, oh, ow = out
    if out == (d, h, w):
        return x
    if out == (1, 1, 1):
        return ctx.emit1("reduce_mean", x, axes=tuple(range(x.type.ndim - 3, x.type.ndim)),
                         keepdims=True)
    if x.type.ndim == 5 and d % od == 0 and h % oh == 0 and w % ow == 0:
        k = (d // od, h // oh, w // ow)
        return pool3d(ctx, "avg", x, k, k, (1, 1, 1), (0,) * 6, False)
    # Overlapping bins: the box mean is separable, one constant averaging matrix per dim.
    dt = np_dtype(x.dtype)
    y = x
    if od != d:
        y = ctx.emit1("matmul", ctx.const(_adaptive_matrix(d, od, dt)),
                      ctx.reshape(y, lead + (d, h * w)))
        y = ctx.reshape(y, lead + (od, h, w))
    if oh != h:
        y = ctx.emit1("matmul", ctx.const(_adaptive_matrix(h, oh, dt)), y)
    if ow != w:
        y = ctx.emit1("matmul", y, ctx.const(np.ascontiguousarray(_adaptive_matrix(w, ow, dt).T)))
    return y


@aten_op("aten.adaptive_max_pool2d.default")
def _adaptive_max_pool2d(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    x = a["self"]
    oh, ow = _pair(a["output_size"], 2, "output_size")
    h, w = x.shape[-2:]
    if (oh, ow) == (1, 1):
        y = ctx.emit1("reduce_max", x, axes=(x.type.ndim - 2, x.type.ndim - 1), keepdims=True)
    elif x.type.ndim == 4 and h % oh == 0 and w % ow == 0:
        k = (h // oh, w // ow)
        y = ctx.emit1("max_pool2d", x, pool_size=k, strides=k)
    else:
        raise ctx.unsupported(f"adaptive_max_pool2d from {(h, w)} to {(oh, ow)} (the output "
                              f"size must divide the input size)")
    return [y, None]


# ------------------------------------------------------------------ resize
def _scales(ctx: Context, x: Value, out: Sequence[int], factors: Sequence[Any] | None
            ) -> tuple[float, float]:
    """Coordinate-transform scales as torch uses them: the given factors, else out / in."""
    h, w = x.shape[-2:]
    if factors is not None and all(f is not None for f in factors):
        return float(factors[0]), float(factors[1])
    return out[0] / h, out[1] / w


def _resize(ctx: Context, x: Value, method: str, coord: str, nearest_mode: str,
            factors: Sequence[Any] | None) -> Value:
    shape = ctx.out_shape()
    if x.type.ndim != 4:
        raise ctx.unsupported(f"resize of a {x.type.ndim}-D tensor (4-D NCHW is supported)")
    out = shape[-2:]
    if tuple(out) == x.shape[-2:] and (factors is None or all(f in (None, 1.0) for f in factors)):
        return x
    return ctx.emit1("resize2d", x, size=tuple(out), scales=_scales(ctx, x, out, factors),
                     method=method, coordinate_transformation_mode=coord,
                     nearest_mode=nearest_mode)


def _factors(a: Args) -> Sequence[Any] | None:
    if "scale_factors" in a:
        return a["scale_factors"]
    if a.get("scales_h") is not None or a.get("scales_w") is not None:
        return [a.get("scales_h"), a.get("scales_w")]
    return None


@aten_op("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
def _upsample_bilinear(ctx: Context, node: Any, a: Args) -> Value:
    x = a["input"] if "input" in a else a["self"]
    coord = "align_corners" if a["align_corners"] else "half_pixel"
    return _resize(ctx, x, "linear", coord, "floor", _factors(a))


@aten_op("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
def _upsample_nearest(ctx: Context, node: Any, a: Args) -> Value:
    # torch "nearest": src = floor(dst / scale), ONNX's asymmetric + floor
    x = a["input"] if "input" in a else a["self"]
    return _resize(ctx, x, "nearest", "asymmetric", "floor", _factors(a))


@aten_op("aten._upsample_nearest_exact2d.vec", "aten._upsample_nearest_exact2d.default")
def _upsample_nearest_exact(ctx: Context, node: Any, a: Args) -> Value:
    # torch "nearest-exact": src = floor((dst + 0.5) / scale)
    x = a["input"] if "input" in a else a["self"]
    return _resize(ctx, x, "nearest", "tf_half_pixel_for_nn", "floor", _factors(a))


# ------------------------------------------------------------------ pad
def _pad(ctx: Context, x: Value, pad: Sequence[int], mode: str, value: float = 0.0) -> Value:
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) // 2 > x.type.ndim:
        raise ctx.bad(f"pad {pad} must hold (before, after) pairs for at most {x.type.ndim} dims")
    # torch lists (before, after) pairs from the last dim backwards
    width = [(0, 0)] * x.type.ndim
    for i in range(len(pad) // 2):
        width[x.type.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if any(b < 0 or e < 0 for b, e in width):
        if mode != "constant":
            raise ctx.unsupported(f"negative padding with mode {mode!r}")
        # negative padding crops
        begin = [max(-b, 0) for b, _ in width]
        end = [x.shape[d] - max(-e, 0) for d, (_, e) in enumerate(width)]
        x = ctx.emit1("strided_slice", x, begin=tuple(begin), end=tuple(end),
                      strides=(1,) * x.type.ndim, axes=tuple(range(x.type.ndim)))
        width = [(max(b, 0), max(e, 0)) for b, e in width]
    if all(b == 0 and e == 0 for b, e in width):
        return x
    return ctx.emit1("pad", x, pad_width=tuple(width), mode=mode, value=float(value))


@aten_op("aten.constant_pad_nd.default")
def _constant_pad(ctx: Context, node: Any, a: Args) -> Value:
    return _pad(ctx, a["self"], a["pad"], "constant", float(a["value"] or 0.0))


@aten_op("aten.reflection_pad1d.default", "aten.reflection_pad2d.default")
def _reflection_pad(ctx: Context, node: Any, a: Args) -> Value:
    return _pad(ctx, a["self"], a["padding"], "reflect")


@aten_op("aten.replication_pad1d.default", "aten.replication_pad2d.default")
def _replication_pad(ctx: Context, node: Any, a: Args) -> Value:
    return _pad(ctx, a["self"], a["padding"], "edge")


@aten_op("aten.pad.default")
def _pad_op(ctx: Context, node: Any, a: Args) -> Value:
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
            "circular": "wrap"}.get(a["mode"])
    if mode is None:
        raise ctx.unsupported(f"pad mode {a['mode']!r}")
    return _pad(ctx, a["self"], a["pad"], mode, float(a["value"] or 0.0))
