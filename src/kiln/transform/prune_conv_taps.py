"""PruneConvTaps: drop the kernel taps of a conv2d that only ever read padding.

Owns the graph rewrite of a ``conv2d`` with a constant weight into a conv with a smaller
kernel (a slice of the weight) and adjusted padding, or into output bands that each use
only the taps they read. Imports only ``kiln.ir`` and this
package's pipeline; it must never import topi, codegen or the driver.

Why
---
An atrous (dilated) convolution whose dilation is as large as the feature map -- DeepLabV3's
ASPP runs dilation 24 and 36 with ``padding = dilation`` on a 14 x 14 map -- places every
kernel row and column but the centre entirely in the zero padding, for every output pixel.
The kernels still compute those taps: 9x the work of the 1x1 convolution the layer really
is. Which taps can touch data is known at compile time from the shapes alone, so the
rewrite is exact (zero padding contributes exactly zero) and needs no kernel change.

The rule, per spatial axis (rows shown; columns are the same with the width attributes)
------------------------------------------------------------------------------------------
Output row ``o`` (``0 <= o < OH``) reads input row ``o * s + i * d - p_top`` through tap
``i``. Tap ``i`` is *live* when some ``o`` makes that a real row in ``[0, H)``; both bounds
are monotone in ``i``, so the live taps are one contiguous range ``[i0, i1]``. The pruned
conv uses taps ``i0..i1`` (same dilation; 1 when one tap is left, so the kernel is a plain
1x1 conv), top padding ``p_top - i0 * d`` and the bottom padding that keeps ``OH``.

Band split (atrous axes only)
----------------------------
When the map is a little larger than the dilation (ASPP's dilation 12 on 14 x 14), no tap is
dead for *every* output, but each output reads few: output rows 0-1 read taps 1-2, rows 2-11
tap 1 only, rows 12-13 taps 0-1. The live taps of one output are again a contiguous range,
so the outputs fall into bands of equal live range; the conv is then computed as a grid of
pieces (row band x column band), each an unpadded conv of a slice of the input with only its
band's taps, concatenated back. This is done only on axes with dilation > 1 (elsewhere the
border bands are a pixel or two) and only when it leaves at most :data:`BAND_WORK_RATIO` of
the multiply-adds in at most :data:`BAND_MAX_PIECES` pieces (ASPP dilation 12 on 14 x 14:
324 of 1764 tap-pixels, 9 pieces).

A symbolic H or W (a dynamic-shape graph) prunes the taps dead at the dim's upper bound, which
are dead at every runtime extent (a smaller map reads a subset of the rows), when the pruned
axis gives the same output extent at every size; DeepLabV3's dilation 24 and 36 branches over
a feature map of at most 16 x 16 become 1x1 convs for every image size in range. The bands
depend on the runtime size and are not used there.

Not rewritten (left unchanged): a weight that is not a constant; a conv whose every tap is
live for every output; a pruned geometry that would need *negative* padding (the remaining
taps skip rows at the border, which a slice of the input, not of the weight, would express);
and a band split where some output reads only padding. Strides and groups need no special
case: the taps' row positions do not depend on the group, and the stride enters the live
range and the padding through the formula above. Transposed convolutions are not considered
(their taps scatter rather than gather).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, Value, dead_code_elimination, rewrite
from ..ir.ops._util import conv_out_size
from .pipeline import Pass

__all__ = ["prune_conv_taps", "PruneConvTaps", "live_taps"]


def live_taps(n: int, k: int, s: int, d: int, p0: int, out: int) -> tuple[int, int]:
    """The inclusive range ``(first, last)`` of kernel taps along one axis that read data.

    Parameters
    ----------
    n : int
        Input extent (without padding).
    k, s, d : int
        Kernel size, stride and dilation along the axis.
    p0 : int
        Padding before the data.
    out : int
        Output extent.

    Returns
    -------
    tuple of int
        ``first > last`` when no tap reads data (the whole output is padding times weights,
        i.e. zero).
    """
    span = (out - 1) * s  # the distance the first and last output position read apart
    live = [i for i in range(k) if i * d - p0 <= n - 1 and i * d - p0 + span >= 0]
    if not live:
        return 1, 0
    return live[0], live[-1]


def _pruned_axis(n: int, k: int, s: int, d: int, p0: int, p1: int
                 ) -> tuple[int, int, int, int, int] | None:
    """``(first, last, dilation, pad_before, pad_after)`` of the pruned kernel on one axis.

    ``None`` when nothing can be dropped or the new padding would be negative.
    """
    out = conv_out_size(n, k, s, p0, p1, d)
    first, last = live_taps(n, k, s, d, p0, out)
    if first > last or (first == 0 and last == k - 1):
        return None
    kn = last - first + 1
    q0 = p0 - first * d
    # the exact end padding for OH outputs; a floor division would also accept up to s - 1
    # more, so a small negative excess is absorbed by padding 0 when the size still matches
    q1 = (out - 1) * s + (kn - 1) * d - q0 - (n - 1)
    if q0 < 0:
        return None
    q1 = max(q1, 0)
    dn = d if kn > 1 else 1
    if conv_out_size(n, kn, s, q0, q1, dn) != out:
        return None
    return first, last, dn, q0, q1


#: Split an atrous conv into output bands only when that leaves at most this fraction of the
#: multiply-adds: each piece is a separate, smaller kernel plus a share of a concatenation,
#: so a small saving would be eaten by the extra launches and copies.
BAND_WORK_RATIO = 0.5
#: At most this many pieces (row bands x column bands) per convolution.
BAND_MAX_PIECES = 9


def _bands(n: int, k: int, s: int, d: int, p0: int, out: int
           ) -> list[tuple[int, int, int, int]] | None:
    """Maximal runs of output positions that read the same taps, ``(start, stop, first, last)``.

    For one output position the live taps are a contiguous range (both bounds of
    ``0 <= o * s + i * d - p0 < n`` are monotone in ``i``). ``None`` when some position reads
    only padding (its output would be a constant, which the bands do not express).
    """
    runs: list[tuple[int, int, int, int]] = []
    for o in range(out):
        base = o * s - p0
        lo = max(0, -(base // d))  # first i with base + i * d >= 0 (a ceiling division)
        hi = min(k - 1, (n - 1 - base) // d)  # last i with base + i * d <= n - 1
        if lo > hi:
            return None
        if runs and runs[-1][2:] == (lo, hi):
            runs[-1] = (runs[-1][0], o + 1, lo, hi)
        else:
            runs.append((o, o + 1, lo, hi))
    return runs


def _band_work(bands: list[tuple[int, int, int, int]]) -> int:
    return sum((stop - start) * (last - first + 1) for start, stop, first, last in bands)


def _band_split(g: Graph, node: Node, data: Value, w: np.ndarray, attrs: dict
                ) -> Value | None:
    """The conv as a grid of pieces, one per (row band, column band), each with only the taps
    its outputs read; ``None`` when that does not pay (see :data:`BAND_WORK_RATIO`).

    Within a band every read is a real pixel (the band's first and last taps are live for
    its first and last outputs), so every piece is an unpadded conv of a slice of the input,
    and the pieces are concatenated back, columns first.
    """
    _, _, h, wd = data.shape
    _, _, kh, kw = w.shape
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh = conv_out_size(h, kh, sh, pt, pb, dh)
    ow = conv_out_size(wd, kw, sw, pl, pr, dw)
    # only atrous axes are split: a dilation-1 conv's border bands are one or two pixels,
    # whose pieces would cost more than the taps they save
    rb = _bands(h, kh, sh, dh, pt, oh) if dh > 1 else [(0, oh, 0, kh - 1)]
    cb = _bands(wd, kw, sw, dw, pl, ow) if dw > 1 else [(0, ow, 0, kw - 1)]
    if rb is None or cb is None or len(rb) * len(cb) < 2 or len(rb) * len(cb) > BAND_MAX_PIECES:
        return None
    if _band_work(rb) * _band_work(cb) > BAND_WORK_RATIO * oh * kh * ow * kw:
        return None
    # an unsplit (dilation 1) axis keeps its padding and reads the whole input extent
    pads = (0 if dh > 1 else pt, 0 if dw > 1 else pl, 0 if dh > 1 else pb, 0 if dw > 1 else pr)

    def window(band: tuple[int, int, int, int], s: int, d: int, p0: int) -> tuple[int, int]:
        start, stop, first, last = band
        return start * s + first * d - p0, (stop - 1) * s + last * d - p0 + 1

    rows = []
    for rband in rb:
        cols = []
        for cband in cb:
            r_lo, r_hi = window(rband, sh, dh, pt) if dh > 1 else (0, h)
            c_lo, c_hi = window(cband, sw, dw, pl) if dw > 1 else (0, wd)
            x = data
            if (r_lo, r_hi, c_lo, c_hi) != (0, h, 0, wd):
                x = g.add("strided_slice", data, begin=(r_lo, c_lo), end=(r_hi, c_hi),
                          strides=(1, 1), axes=(2, 3))
            _, _, f0, f1 = rband
            _, _, e0, e1 = cband
            wp = g.add_constant(np.ascontiguousarray(w[:, :, f0:f1 + 1, e0:e1 + 1]))
            piece = g.add("conv2d", x, wp, name=node.name,
                          **{**attrs, "padding": pads,
                             "dilation": (dh if f1 > f0 else 1, dw if e1 > e0 else 1)})
            if piece.shape[2:] != (rband[1] - rband[0], cband[1] - cband[0]):
                return None  # cannot happen by construction; never emit a wrong shape
            cols.append(piece)
        rows.append(cols[0] if len(cols) == 1 else g.add("concatenate", *cols, axis=3))
    return rows[0] if len(rows) == 1 else g.add("concatenate", *rows, axis=2)


def _prune(g: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
    if node.op != "conv2d":
        return None
    data, weight = ins
    w = weight.const_value
    if w is None:
        return None
    # A symbolic H / W: the taps are pruned at the upper bound, which is exact for every
    # runtime size (a smaller map reads a subset of the rows, so a tap dead at the bound is
    # dead at every size), when the pruned axis keeps the output-size formula's numerator
    # (then the output extent agrees at every size, not only at the bound). The bands
    # depend on the size, so they are for static maps only.
    dynamic = data.type.sym is not None and any(isinstance(d, str) for d in data.type.dims[2:])
    a = node.attrs
    _, _, h, wd = data.shape
    _, _, kh, kw = weight.shape
    (sh, sw), (dh, dw) = a["strides"], a["dilation"]
    pt, pl, pb, pr = a["padding"]
    rows = _pruned_axis(h, kh, sh, dh, pt, pb)
    cols = _pruned_axis(wd, kw, sw, dw, pl, pr)
    if dynamic:
        rows = rows if rows is not None and _same_extent(rows, kh, dh, pt, pb) else None
        cols = cols if cols is not None and _same_extent(cols, kw, dw, pl, pr) else None
    # an axis with nothing to drop keeps its full range and attributes
    r0, r1, dh2, pt2, pb2 = rows if rows is not None else (0, kh - 1, dh, pt, pb)
    c0, c1, dw2, pl2, pr2 = cols if cols is not None else (0, kw - 1, dw, pl, pr)
    wsl = np.ascontiguousarray(w[:, :, r0:r1 + 1, c0:c1 + 1])
    attrs = {**a, "dilation": (dh2, dw2), "padding": (pt2, pl2, pb2, pr2)}
    y = None if dynamic else _band_split(g, node, data, wsl, attrs)
    if y is None:
        if rows is None and cols is None:
            return None
        y = g.add("conv2d", data, g.add_constant(wsl), name=node.name, **attrs)
    # each step keeps the extents (symbolic ones too); a cheap guard
    if y.shape != node.outputs[0].shape or y.type.dims != node.outputs[0].type.dims:
        return None
    return [y]


def _same_extent(pruned: tuple[int, int, int, int, int], k: int, d: int, p0: int, p1: int) -> bool:
    """Whether a pruned axis (:func:`_pruned_axis`) gives the original output extent at every
    input extent: the same ``pad_before + pad_after - dilation * (kernel - 1)``."""
    first, last, dn, q0, q1 = pruned
    return q0 + q1 - dn * (last - first) == p0 + p1 - d * (k - 1)


def prune_conv_taps(graph: Graph) -> Graph:
    """Slice away conv2d kernel taps that read only padding (see the module docstring).

    Parameters
    ----------
    graph : Graph
        Typed graph; not modified.

    Returns
    -------
    Graph
        A graph computing the same values; convs with a constant weight have their dead taps
        removed (possibly per output band).
    """
    return dead_code_elimination(rewrite(graph, _prune))


def PruneConvTaps() -> Pass:  # noqa: N802 - pass constructors are named like classes
    """:func:`prune_conv_taps` as a pass (opt level 1)."""
    return Pass(prune_conv_taps, "PruneConvTaps", 1)
