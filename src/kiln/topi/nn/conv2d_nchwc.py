"""Convolution in the blocked NCHW[x]c layout, and the ``layout_transform`` compute.

Data ``(N, C/ib, H, W, ib)``, weight ``(O/ob, C/ib, KH, KW, ib, ob)`` (pre-packed at build
time by :mod:`kiln.transform.alter_layout`), output ``(N, O/ob, OH, OW, ob)``.  The innermost
axis of both the weight and the output is the output-channel block, so a register tile of
``xt`` output pixels × ``ob`` channels is ``xt * ob / lanes`` vector accumulators updated by
one broadcast input value and ``ob / lanes`` contiguous weight vectors per reduction step —
the output width no longer has to be a multiple of the vector width.

Padding: the plain convolution reads a materialised zero-padded copy (each input element is
reused ``O·KH·KW`` times, the copy is cheap); depthwise convolution (``groups == C``,
multiplier 1; channel block innermost in data, weight ``(C/b, 1, KH, KW, 1, b)`` and output,
vectorised over it) bounds-checks its loads instead.  ``max_pool2d_nchwc`` is max pooling of
the same layout, so ResNet's stem pool does not leave the blocked layout.
"""

from __future__ import annotations

from typing import Any

from ... import te
from ...ir.ops.layout import parse_layout
from ..registry import register_compute
from ..transform import pad_compute
from ..util import TAG_ELEMWISE, TAG_INJECTIVE, acc_dtype
from .conv2d import TAG_CONV_PAD, spatial_dyn_attrs, spatial_extents

__all__ = ["conv2d_nchwc", "layout_transform", "max_pool2d_nchwc", "TAG_CONV2D_NCHWC", "TAG_DEPTHWISE_NCHWC",
           "TAG_POOL_NCHWC"]

TAG_CONV2D_NCHWC = "conv2d_nchwc"
TAG_DEPTHWISE_NCHWC = "depthwise_conv2d_nchwc"
TAG_POOL_NCHWC = "max_pool2d_nchwc"


def _inside(i: Any, n: Any) -> list:
    """The conditions of ``0 <= i < n``: one unsigned comparison when ``n`` is a runtime extent.

    A static ``n`` keeps the two signed comparisons, which the compiler folds per unrolled
    tap; a runtime one cannot be folded, and halving the tests per tap measured 116 -> 97 us
    for a 384-channel 14x14 depthwise conv (1 thread, AVX2; static build 70 us).  The tile
    partition of :mod:`kiln.tir.unswitch` recognises this form and runs the tiles whose whole
    window is inside the image without the tests
    (``tests/executor/test_dynamic_spatial_speed.py`` checks that it still does).
    """
    if isinstance(n, int):
        return [i >= 0, i < n]
    return [te.cast(i, "uint32") < te.cast(n, "uint32")]


#: An atrous conv over a runtime height skips the kernel rows that read only padding when, at
#: the upper bound, at most this fraction of the (output row, kernel row) pairs read data:
#: DeepLabV3's dilation-12 ASPP branch on a map of at most 16 rows, 24 of 48.
SKIP_ROWS_LIVE_RATIO = 0.5


def _skips_padding_rows(h: int, kh: int, sh: int, dh: int, pt: int, oh: int) -> bool:
    """Whether a conv with these row geometries (upper bounds) skips dead kernel rows."""
    if dh == 1 or kh == 1:
        return False
    live = sum(1 for y in range(oh) for r in range(kh) if 0 <= y * sh + r * dh - pt < h)
    return live <= SKIP_ROWS_LIVE_RATIO * oh * kh


def conv2d_nchwc(data: te.Tensor, weight: te.Tensor, strides: tuple[int, int] = (1, 1),
                 padding: tuple[int, int, int, int] = (0, 0, 0, 0), dilation: tuple[int, int] = (1, 1),
                 groups: int = 1) -> te.Tensor:
    """Blocked 2-D convolution (``groups`` 1, depthwise, or grouped with whole blocks per group).

    Parameters
    ----------
    data : te.Tensor
        ``(N, C/ib, H, W, ib)``.
    weight : te.Tensor
        ``(O/ob, C/ib, KH, KW, ib, ob)``; depthwise: ``(C/b, 1, KH, KW, 1, b)``; grouped:
        ``(O/ob, C/groups/ib, KH, KW, ib, ob)``.
    strides, dilation : (int, int)
    padding : (top, left, bottom, right)
    groups : int
        1, the channel count for a depthwise convolution, or the group count of a grouped one
        (``ib`` divides ``C/groups`` and ``ob`` divides ``O/groups``).

    Returns
    -------
    te.Tensor
        ``(N, O/ob, OH, OW, ob)`` in ``data.dtype``.
    """
    n, cb, h, w, ib = data.shape
    obk, icb, kh, kw, _, ob = weight.shape
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (w + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    acc = acc_dtype(data.dtype)
    depthwise = groups != 1 and groups == cb * ib and icb == 1 and weight.shape[4] == 1
    if any(padding) and not depthwise:
        dp = pad_compute(data, [(0, 0), (0, 0), (pt, pb), (pl, pr), (0, 0)], "constant", 0.0,
                         name="conv_pad", tag=TAG_CONV_PAD, read_to_padded_extent=True)
    else:
        dp = data
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    attrs = {"strides": tuple(strides), "dilation": tuple(dilation), "kernel": (kh, kw)}
    hr, wr = spatial_extents(data)
    extra = spatial_dyn_attrs(data)
    if depthwise:
        # Depthwise reads each input element KH*KW times at most, so a materialised padded
        # copy costs as much memory traffic as the convolution itself; bounds checks on the
        # (scalar) pixel coordinates are cheaper (Zen 3, 96 ch 112x112 stride 2:
        # 0.67 ms with the copy, 0.24 ms without).
        inline = any(padding)

        def dw_body(b: Any, k: Any, y: Any, x: Any, kc: Any) -> Any:
            if inline:
                iy = y * sh + ry * dh - pt
                ix = x * sw + rx * dw - pl
                v = te.if_then_else(te.all(*_inside(iy, hr), *_inside(ix, wr)), data[b, k, iy, ix, kc],
                                    te.cast(te.const(0.0, "float64"), data.dtype))
                return te.sum(te.cast(v, acc) * te.cast(weight[k, 0, ry, rx, 0, kc], acc), axis=[ry, rx])
            return te.sum(te.cast(dp[b, k, y * sh + ry * dh, x * sw + rx * dw, kc], acc)
                          * te.cast(weight[k, 0, ry, rx, 0, kc], acc), axis=[ry, rx])

        # (the inline checks compare in unsigned arithmetic, which kiln.te.dynamic does not
        # read as a guard: the attrs say the reads are in bounds)
        out = te.compute((n, obk, oh, ow, ob), dw_body, name="depthwise_conv2d_nchwc",
                         tag=TAG_DEPTHWISE_NCHWC, attrs={**attrs, **extra})
    else:
        # grouped: output block k belongs to group k // (blocks per group) and reads only that
        # group's icb input blocks (groups == 1: all cb of them)
        rco = te.reduce_axis((0, icb), name="rco")
        rci = te.reduce_axis((0, ib), name="rci")
        out_blocks_per_group = obk // groups

        skip_rows = _skips_padding_rows(h, kh, sh, dh, pt, oh) and not isinstance(hr, int)

        def body(b: Any, k: Any, y: Any, x: Any, kc: Any) -> Any:
            cblk = rco if groups == 1 else k // out_blocks_per_group * icb + rco
            # an atrous conv over a runtime height: the kernel rows that read only padding at
            # this size are skipped (the lowering tests the condition once per row and tap)
            live = te.all(*_inside(y * sh + ry * dh - pt, hr)) if skip_rows else None
            return te.sum(te.cast(dp[b, cblk, y * sh + ry * dh, x * sw + rx * dw, rci], acc)
                          * te.cast(weight[k, rco, ry, rx, rci, kc], acc), axis=[rco, ry, rx, rci], where=live)

        out = te.compute((n, obk, oh, ow, ob), body, name="conv2d_nchwc", tag=TAG_CONV2D_NCHWC,
                         attrs={**attrs, **extra})
    # A separate elementwise output stage, as for conv2d_nchw: the reduction accumulates into
    # a register tile attached to it, and a fused epilogue simply replaces it.
    return te.compute(out.shape, lambda *i: te.cast(out[i], data.dtype), name="conv2d_nchwc_out",
                      tag=TAG_ELEMWISE)


@register_compute("conv2d_nchwc")
def _conv2d_nchwc(attrs: dict, inputs: list, out_types: list) -> list:
    d, w = inputs
    return [conv2d_nchwc(d, w, tuple(attrs["strides"]), tuple(attrs["padding"]), tuple(attrs["dilation"]),
                         int(attrs["groups"]))]


def layout_transform(data: te.Tensor, src_layout: str, dst_layout: str, channels: int = 0) -> te.Tensor:
    """Re-store ``data`` from ``src_layout`` to ``dst_layout`` (e.g. ``NCHW`` -> ``NCHW16c``).

    Every output element reads one input element: logical (primal) coordinates are rebuilt
    from the destination index (``outer * factor + inner``) and split again by the source
    layout's factors. ``channels`` (0: none) is the logical channel count when a channel
    block pads it: a padded destination's extra lanes are zero, a padded source's are skipped.
    """
    src, dst = parse_layout(src_layout), parse_layout(dst_layout)
    sfac = {a.upper(): f for a, f in src if f}
    dfac = {a.upper(): f for a, f in dst if f}
    spos = {a: i for i, (a, _) in enumerate(src)}
    ext = {a: data.shape[spos[a]] * (data.shape[spos[a.lower()]] if a.lower() in spos else 1)
           for a, f in src if not f}
    if channels:
        ext["C"] = channels
    shape = tuple(f if f else -(-ext[a] // dfac.get(a, 1)) for a, f in dst)
    dpos = {a: i for i, (a, _) in enumerate(dst)}
    pads = bool(channels) and channels % dfac.get("C", 1) != 0

    def body(*i: Any) -> Any:
        logical = {}
        for a, f in dst:
            if f:
                continue
            v = i[dpos[a]]
            if a in dfac:
                v = v * dfac[a] + i[dpos[a.lower()]]
            logical[a] = v
        idx = []
        for a, f in src:
            both = a.upper() in dfac and not pads
            if both and f and f % dfac[a.upper()] == 0:
                # a wider source block (NCHW16c -> NCHW8c): the lane offset is a whole number of
                # destination blocks, so the lane index stays affine in the destination lane and
                # the codegens' own vector plan takes the loop (with `(8k + i) % 16` it leaves
                # it to LLVM's loop vectorizer, which measured as fast: [1,3,112,112,16] 58 us
                # before, 62 us after, `bench/bench_layout_transform.py`)
                r = f // dfac[a.upper()]
                blk = i[dpos[a.upper()]]
                idx.append((te.floormod(blk, r) if r > 1 else 0) * dfac[a.upper()] + i[dpos[a]])
            elif both and not f and a in sfac and sfac[a] % dfac[a] == 0:
                r = sfac[a] // dfac[a]
                idx.append(te.floordiv(i[dpos[a]], r) if r > 1 else i[dpos[a]])
            elif f:
                idx.append(te.floormod(logical[a.upper()], f) if f > 1 else 0)
            elif a in sfac:
                idx.append(te.floordiv(logical[a], sfac[a]) if sfac[a] > 1 else logical[a])
            else:
                idx.append(logical[a])
        if pads:
            # a padding lane reads nothing (the clamped index keeps the load in bounds)
            c = logical["C"]
            idx = [te.minimum(i, te.const(-(-ext["C"] // sfac.get("C", 1)) - 1))
                   if a.upper() == "C" and not f else i for (a, f), i in zip(src, idx)]
            return te.if_then_else(c < channels, data[tuple(idx)], te.const(0, data.dtype))
        return data[tuple(idx)]

    return te.compute(shape, body, name="layout_transform", tag=TAG_INJECTIVE)


@register_compute("layout_transform")
def _layout_transform(attrs: dict, inputs: list, out_types: list) -> list:
    return [layout_transform(inputs[0], attrs["src_layout"], attrs["dst_layout"], int(attrs.get("channels", 0)))]


def max_pool2d_nchwc(data: te.Tensor, pool_size: tuple[int, int], strides: tuple[int, int],
                     padding: tuple[int, int, int, int], dilation: tuple[int, int], ceil_mode: bool) -> te.Tensor:
    """Max pooling of ``(N, C/b, H, W, b)`` data; padded cells never win (as ``max_pool2d``)."""
    from .pool import pool_out_size

    n, cb, h, w, b = data.shape
    kh, kw = pool_size
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = pool_out_size(h, kh, sh, pt, pb, dh, ceil_mode)
    ow = pool_out_size(w, kw, sw, pl, pr, dw, ceil_mode)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    hr, wr = spatial_extents(data)

    def body(bn: Any, c: Any, y: Any, x: Any, kc: Any) -> Any:
        iy = y * sh - pt + ry * dh
        ix = x * sw - pl + rx * dw
        return te.reduce_max(data[bn, c, iy, ix, kc], axis=[ry, rx],
                             where=te.all(iy >= 0, iy < hr, ix >= 0, ix < wr))

    return te.compute((n, cb, oh, ow, b), body, name="max_pool2d_nchwc", tag=TAG_POOL_NCHWC)


@register_compute("max_pool2d_nchwc")
def _max_pool2d_nchwc(attrs: dict, inputs: list, out_types: list) -> list:
    return [max_pool2d_nchwc(inputs[0], tuple(attrs["pool_size"]), tuple(attrs["strides"]), tuple(attrs["padding"]),
                             tuple(attrs["dilation"]), bool(attrs["ceil_mode"]))]
