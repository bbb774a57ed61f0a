"""2-D convolution (NCHW / OIHW), depthwise convolution and transposed convolution.

The compute is the textbook one: a (lazily bounds-checked) padded input stage, which
schedules inline, and one reduction stage over ``(rc, ry, rx)``.  Half-precision inputs
accumulate in float32 and are rounded back by a trailing elementwise stage.

A dynamic H or W pads at the input's runtime extent (:func:`spatial_extents`), not at
its upper bound, so the padding reads zeros rather than a larger earlier image.
"""

from __future__ import annotations

from typing import Any

from ... import te
from ..registry import register_compute
from ..transform import pad_compute
from ..util import acc_dtype, output_stage

__all__ = ["conv2d_nchw", "conv2d_transpose_nchw", "spatial_dyn_attrs", "spatial_extents", "TAG_CONV2D",
           "TAG_DEPTHWISE", "TAG_CONV2D_T", "TAG_CONV_PAD"]

TAG_CONV2D = "conv2d_nchw"
TAG_DEPTHWISE = "depthwise_conv2d_nchw"
TAG_CONV2D_T = "conv2d_transpose_nchw"
#: The zero-padded input copy: kept materialised (not inlined) so the inner loops need no bounds checks.
TAG_CONV_PAD = "conv_pad"


def spatial_dyn_attrs(data: te.Tensor) -> dict:
    """Compute attrs of a window over ``data`` (N, C, H, W, ...) with dynamic H or W.

    The window reads row ``y * stride + tap * dilation`` of the (padded) input for output
    rows ``y`` below the runtime output extent, which the symbolic shape rule
    (:func:`kiln.ir.sym_rules.window_dim`) sizes so that the last window ends inside the
    runtime input extent plus its padding; padding itself is zero at the runtime extent
    (:func:`kiln.topi.transform.pad_compute`). A resize clamps its source indices to the
    runtime extent. So the reads are in bounds by construction, which
    :mod:`kiln.te.dynamic` cannot prove from the index alone.

    Parameters
    ----------
    data : te.Tensor
        The window's input.

    Returns
    -------
    dict
        ``{"dyn_reads_in_bounds": True}`` when H or W of ``data`` is dynamic, else empty.
    """
    dyn = data.dyn
    if dyn is not None and any(v is not None for v in dyn[2:4]):
        return {"dyn_reads_in_bounds": True}
    return {}


def spatial_extents(data: te.Tensor) -> tuple[Any, Any]:
    """Runtime extents of H and W of ``data`` (N, C, H, W, ...).

    Parameters
    ----------
    data : te.Tensor

    Returns
    -------
    (Var or int, Var or int)
        Each is the runtime extent's Var where the axis is dynamic, else the static extent.
    """
    dyn = data.dyn or (None,) * data.ndim
    h, w = data.shape[2:4]
    return (h if dyn[2] is None else dyn[2]), (w if dyn[3] is None else dyn[3])


def conv2d_nchw(data: te.Tensor, weight: te.Tensor, strides: tuple[int, int] = (1, 1),
                padding: tuple[int, int, int, int] = (0, 0, 0, 0), dilation: tuple[int, int] = (1, 1),
                groups: int = 1) -> te.Tensor:
    """Grouped 2-D convolution.

    Parameters
    ----------
    data : te.Tensor
        ``(N, C, H, W)``.
    weight : te.Tensor
        ``(O, C // groups, KH, KW)``.
    strides, dilation : (int, int)
    padding : (top, left, bottom, right)
    groups : int
        ``groups == C`` with ``C // groups == 1`` is a depthwise convolution (own tag).

    Returns
    -------
    te.Tensor
        ``(N, O, OH, OW)`` in ``data.dtype``.
    """
    n, c, h, w = data.shape
    o, cg, kh, kw = weight.shape
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (w + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    acc = acc_dtype(data.dtype)
    if any(padding):
        dp = pad_compute(data, [(0, 0), (0, 0), (pt, pb), (pl, pr)], "constant", 0.0, name="conv_pad",
                         tag=TAG_CONV_PAD, read_to_padded_extent=True)
    else:
        dp = data
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    og = o // groups
    extra = spatial_dyn_attrs(data)
    if cg == 1 and groups > 1:
        # depthwise (channel multiplier og): no channel reduction
        def dw_body(b: Any, k: Any, y: Any, x: Any) -> Any:
            ch = te.floordiv(k, og) if og > 1 else k
            return te.sum(te.cast(dp[b, ch, y * sh + ry * dh, x * sw + rx * dw], acc)
                          * te.cast(weight[k, 0, ry, rx], acc), axis=[ry, rx])

        out = te.compute((n, o, oh, ow), dw_body, name="depthwise_conv2d", tag=TAG_DEPTHWISE,
                         attrs={"strides": strides, "dilation": dilation, **extra})
        return output_stage(out, data.dtype, "conv2d_out")
    rc = te.reduce_axis((0, cg), name="rc")

    def body(b: Any, k: Any, y: Any, x: Any) -> Any:
        ch = rc if groups == 1 else te.floordiv(k, og) * cg + rc
        return te.sum(te.cast(dp[b, ch, y * sh + ry * dh, x * sw + rx * dw], acc)
                      * te.cast(weight[k, rc, ry, rx], acc), axis=[rc, ry, rx])

    out = te.compute((n, o, oh, ow), body, name="conv2d", tag=TAG_CONV2D,
                     attrs={"strides": strides, "dilation": dilation, "groups": groups, **extra})
    return output_stage(out, data.dtype, "conv2d_out")


@register_compute("conv2d")
def _conv2d(attrs: dict, inputs: list, out_types: list) -> list:
    d, w = inputs
    return [conv2d_nchw(d, w, tuple(attrs["strides"]), tuple(attrs["padding"]), tuple(attrs["dilation"]),
                        int(attrs["groups"]))]


def conv2d_transpose_nchw(data: te.Tensor, weight: te.Tensor, strides: tuple[int, int] = (1, 1),
                          padding: tuple[int, int, int, int] = (0, 0, 0, 0), dilation: tuple[int, int] = (1, 1),
                          output_padding: tuple[int, int] = (0, 0), groups: int = 1) -> te.Tensor:
    """Transposed convolution (gradient of conv2d), IOHW weight ``(C, O // groups, KH, KW)``.

    Written as a gather: output pixel ``y`` receives input row ``iy`` through tap ``ky`` when
    ``y + pad_top = iy * stride + ky * dilation``; the reduction's ``where`` condition skips the
    other taps (and keeps the loads in bounds).
    """
    n, c, h, w = data.shape
    _, og, kh, kw = weight.shape
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oph, opw = output_padding
    oh = sh * (h - 1) + oph + (kh - 1) * dh + 1 - pt - pb
    ow = sw * (w - 1) + opw + (kw - 1) * dw + 1 - pl - pr
    cg = c // groups
    acc = acc_dtype(data.dtype)
    hr, wr = spatial_extents(data)  # taps past the runtime extent read nothing
    rc = te.reduce_axis((0, cg), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def body(b: Any, k: Any, y: Any, x: Any) -> Any:
        ty = y + pt - ry * dh
        tx = x + pl - rx * dw
        iy = te.floordiv(ty, sh) if sh > 1 else ty
        ix = te.floordiv(tx, sw) if sw > 1 else tx
        conds = [ty >= 0, tx >= 0, iy < hr, ix < wr]
        if sh > 1:
            conds.append(te.equal(te.floormod(ty, sh), 0))
        if sw > 1:
            conds.append(te.equal(te.floormod(tx, sw), 0))
        g = te.floordiv(k, og) if groups > 1 else 0
        ch = g * cg + rc if groups > 1 else rc
        ko = te.floormod(k, og) if groups > 1 else k
        return te.sum(te.cast(data[b, ch, iy, ix], acc) * te.cast(weight[ch, ko, ry, rx], acc),
                      axis=[rc, ry, rx], where=te.all(*conds))

    out = te.compute((n, og * groups, oh, ow), body, name="conv2d_transpose", tag=TAG_CONV2D_T)
    return output_stage(out, data.dtype, "conv2d_transpose_out")


@register_compute("conv2d_transpose")
def _conv2d_transpose(attrs: dict, inputs: list, out_types: list) -> list:
    d, w = inputs
    return [conv2d_transpose_nchw(d, w, tuple(attrs["strides"]), tuple(attrs["padding"]),
                                  tuple(attrs["dilation"]), tuple(attrs["output_padding"]), int(attrs["groups"]))]
