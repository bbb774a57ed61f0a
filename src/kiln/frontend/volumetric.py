"""3-D convolution, transposed convolution and pooling built from 2-D IR ops: one place for
both frontends.

Kiln's IR has 2-D windowed ops only. The ONNX and the torch.export frontends both lower 5-D
(NCDHW) windows through the functions here, which take already-converted Values and
normalized window parameters (pads in ONNX order: D, H, W begins, then D, H, W ends) and
emit IR through the frontend's converter context. Argument parsing (auto_pad, torch's
symmetric padding lists, attribute defaults) stays in each frontend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Value

if TYPE_CHECKING:  # the torch Context derives from this one
    from .onnx.converter import Context

__all__ = ["conv3d", "conv_transpose3d", "pool3d"]


def conv3d(ctx: Context, x: Value, w: Value, strides: tuple[int, ...], dilations: tuple[int, ...],
           pads: tuple[int, ...], groups: int) -> Value:
    """3-D convolution (NCDHW data, OIDHW weight) as one ``conv2d`` over depth-stacked taps.

    Parameters
    ----------
    ctx : Context
        The converter context.
    x, w : Value
        Data (N, C, D, H, W) and weight (O, C / groups, kD, kH, kW).
    strides, dilations : tuple of int
        Per spatial dim (D, H, W).
    pads : tuple of int
        ONNX order: D, H, W begins, then D, H, W ends.
    groups : int
        Channel groups.

    Returns
    -------
    Value
        (N, O, OD, OH, OW), without bias.

    Raises
    ------
    InputError
        Data or weight not 5-D, a weight that does not match the input and ``groups``, or an
        empty output depth.

    Notes
    -----
    Every output depth slice ``od`` is a 2-D convolution of the ``kD`` input slices
    ``od * sD + k * dD`` (k = 0 .. kD - 1) stacked as channels. The input slices for all
    ``od`` are gathered into a (N * OD, groups * kD * C / groups, H, W) batch (one injective
    copy, kD times the input), the weight is permuted to (O, kD * C / groups, kH, kW) to match
    that channel order, and a single ``conv2d`` with the tuned 2-D kernels does the rest.
    """
    if x.type.ndim != 5 or w.type.ndim != 5:
        raise ctx.bad(f"3-D Conv needs 5-D data and weight, got {x.shape} and {w.shape}")
    n, c, d, h, wd = x.shape
    o, cg, kd, kh, kw = w.shape
    if groups < 1 or c % groups or o % groups or cg * groups != c:
        raise ctx.bad(f"weight {w.shape} does not match input {x.shape} with group={groups} "
                      f"(expected (O, C / group, kD, kH, kW), O and C divisible by group)")
    (sd, sh, sw), (dd, dh, dw) = strides, dilations
    pd0, ph0, pw0, pd1, ph1, pw1 = pads
    od = (d + pd0 + pd1 - (kd - 1) * dd - 1) // sd + 1
    if od <= 0:
        raise ctx.bad(f"output depth would be empty: input depth {d}, pads ({pd0}, {pd1}), "
                      f"kernel depth {kd}, dilation {dd}")
    xt = ctx.emit1("transpose", x, axes=(0, 2, 1, 3, 4))  # (N, D, C, H, W)
    if pd0 or pd1:
        xt = ctx.emit1("pad", xt, pad_width=((0, 0), (pd0, pd1), (0, 0), (0, 0), (0, 0)))
    taps = []
    for k in range(kd):
        s = ctx.emit1("strided_slice", xt, begin=(k * dd,), end=(k * dd + (od - 1) * sd + 1,),
                      strides=(sd,), axes=(1,))
        # groups > 1: the taps go inside each group's channel block; with one group they are
        # concatenated as they are (no reshape in between, so slices and concat fuse).
        taps.append(s if groups == 1 else ctx.reshape(s, (n, od, groups, 1, cg, h, wd)))
    stacked = taps[0] if kd == 1 else ctx.emit1("concatenate", *taps, axis=2 if groups == 1 else 3)
    xs = ctx.reshape(stacked, (n * od, groups * kd * cg, h, wd))
    w2 = ctx.reshape(ctx.emit1("transpose", w, axes=(0, 2, 1, 3, 4)), (o, kd * cg, kh, kw))
    y = ctx.emit1("conv2d", xs, w2, strides=(sh, sw), dilation=(dh, dw), padding=(ph0, pw0, ph1, pw1),
                  groups=groups)
    oh, ow = y.shape[2:]
    return ctx.emit1("transpose", ctx.reshape(y, (n, od, o, oh, ow)), axes=(0, 2, 1, 3, 4))


def conv_transpose3d(ctx: Context, x: Value, w: Value, strides: tuple[int, ...],
                     dil: tuple[int, ...], pads: tuple[int, ...], outpad: tuple[int, ...],
                     groups: int) -> Value:
    """3-D transposed convolution from one 2-D transposed convolution plus depth scatter.

    Parameters
    ----------
    ctx : Context
        The converter context.
    x, w : Value
        Data (N, C, D, H, W) and weight (C, O / groups, kD, kH, kW).
    strides, dil : tuple of int
        Per spatial dim (D, H, W).
    pads : tuple of int
        ONNX order: D, H, W begins, then D, H, W ends (cropped from the full output).
    outpad : tuple of int
        Output padding per spatial dim (D, H, W).
    groups : int
        Channel groups.

    Returns
    -------
    Value
        (N, O, OD, OH, OW), without bias.

    Raises
    ------
    InputError
        A weight that does not match the input, or an empty output depth.

    Notes
    -----
    Depth slices become batch items and the depth taps become extra output channels, so one
    ``conv2d_transpose`` computes every (input slice, depth tap) contribution over (H, W). The
    contribution of input slice ``d`` and tap ``k`` lands on output depth ``d * sd + k * dd``:
    per tap, a zero-interleave (pad + reshape) spreads the slices ``sd`` apart and a pad shifts
    them by ``k * dd``; the taps are summed, then the depth padding is cropped.
    """
    if x.type.ndim != 5:
        raise ctx.bad(f"3-D ConvTranspose needs 5-D data, got {x.shape}")
    n, c, d, h, wd = x.shape
    if w.type.ndim != 5 or w.shape[0] != c:
        raise ctx.bad(f"weight shape {w.shape} does not match a 3-D ConvTranspose of input "
                      f"{x.shape} (expected ({c}, C_out / group, kD, kH, kW))")
    _, og, kd, kh, kw = w.shape
    (sd, sh, sw), (dd, dh, dw) = strides, dil
    pd0, ph0, pw0, pd1, ph1, pw1 = pads
    opd, oph, opw = outpad
    xs = ctx.reshape(ctx.emit1("transpose", x, axes=(0, 2, 1, 3, 4)), (n * d, c, h, wd))
    w2 = ctx.reshape(w, (c, og * kd, kh, kw))  # channel o * kd + k: (out channel, depth tap)
    y2 = ctx.emit1("conv2d_transpose", xs, w2, strides=(sh, sw), dilation=(dh, dw),
                   padding=(ph0, pw0, ph1, pw1), output_padding=(oph, opw), groups=groups)
    oh, ow = y2.shape[2:]
    m = groups * og * oh * ow
    y2 = ctx.reshape(y2, (n, d, groups * og, kd, oh * ow))
    full = sd * (d - 1) + (kd - 1) * dd + 1 + opd
    spread = (d - 1) * sd + 1
    acc = None
    for k in range(kd):
        t = ctx.emit1("strided_slice", y2, begin=(k,), end=(k + 1,), strides=(1,), axes=(3,))
        t = ctx.reshape(t, (n, d, 1, m))
        if sd > 1:
            t = ctx.emit1("pad", t, pad_width=((0, 0), (0, 0), (0, sd - 1), (0, 0)))
            t = ctx.reshape(t, (n, d * sd, m))
            t = ctx.emit1("strided_slice", t, begin=(0,), end=(spread,), strides=(1,),
                          axes=(1,))
        else:
            t = ctx.reshape(t, (n, d, m))
        t = ctx.emit1("pad", t, pad_width=((0, 0), (k * dd, full - k * dd - spread), (0, 0)))
        acc = t if acc is None else ctx.emit1("add", acc, t)
    assert acc is not None  # kd >= 1
    od = full - pd0 - pd1
    if od <= 0:
        raise ctx.bad(f"transposed conv output depth would be empty ({od})")
    if pd0 or pd1:
        acc = ctx.emit1("strided_slice", acc, begin=(pd0,), end=(full - pd1,), strides=(1,),
                        axes=(1,))
    y = ctx.reshape(acc, (n, od, groups * og, oh, ow))
    return ctx.emit1("transpose", y, axes=(0, 2, 1, 3, 4))


def pool3d(ctx: Context, kind: str, x: Value, kernel: tuple[int, ...], strides: tuple[int, ...],
           dil: tuple[int, ...], pads: tuple[int, ...], ceil: bool,
           count_include_pad: bool = False) -> Value:
    """3-D pooling as two 2-D pools: over (H, W) with D folded into the channels, then over D.

    Parameters
    ----------
    ctx : Context
        The converter context.
    kind : {"max", "avg"}
        The reduction.
    x : Value
        Data (N, C, D, H, W).
    kernel, strides, dil : tuple of int
        Per spatial dim (D, H, W).
    pads : tuple of int
        ONNX order: D, H, W begins, then D, H, W ends.
    ceil : bool
        ceil_mode: keep a last, partial window.
    count_include_pad : bool
        Average only: divide by the window size including padding.

    Returns
    -------
    Value
        (N, C, OD, OH, OW).

    Raises
    ------
    InputError
        ``x`` is not 5-D.

    Notes
    -----
    A box window is separable. For max that is plain associativity; for average, every D slice
    of one output's window has the same (H, W) cell count (per-dim counts depend only on the
    output index along that dim), so the mean of the per-slice means is the mean over the box,
    with the same in-bounds / count_include_pad divisor. ceil_mode is decided per dim too.
    """
    if kind not in ("max", "avg"):
        raise ValueError(f"pool3d kind must be 'max' or 'avg', got {kind!r}")
    if x.type.ndim != 5:
        raise ctx.bad(f"3-D pooling needs 5-D (N, C, D, H, W) data, got {x.shape}")
    n, c, d, h, w = x.shape
    (kd, kh, kw), (sd, sh, sw), (dd, dh, dw) = kernel, strides, dil
    pd0, ph0, pw0, pd1, ph1, pw1 = pads
    op = "max_pool2d" if kind == "max" else "avg_pool2d"
    extra = {} if kind == "max" else {"count_include_pad": count_include_pad}
    hw = ctx.emit1(op, ctx.reshape(x, (n, c * d, h, w)), pool_size=(kh, kw), strides=(sh, sw),
                   dilation=(dh, dw), padding=(ph0, pw0, ph1, pw1), ceil_mode=ceil, **extra)
    oh, ow = hw.shape[2:]
    y = ctx.emit1(op, ctx.reshape(hw, (n, c, d, oh * ow)), pool_size=(kd, 1), strides=(sd, 1),
                  dilation=(dd, 1), padding=(pd0, 0, pd1, 0), ceil_mode=ceil, **extra)
    return ctx.reshape(y, (n, c, y.shape[2], oh, ow))
