"""Blocked-layout operators: ``layout_transform`` and ``conv2d_nchwc``.

A layout string names one axis per letter: an upper-case letter is a *primal* axis, a
lower-case one preceded by a factor (``16c``) is the inner part of the primal axis of the same
letter split by that factor.  ``NCHW16c`` is ``(N, C // 16, H, W, 16)`` with logical channel
``c = C_outer * 16 + c_inner``; conv weights use ``OIHW8i16o``, ``(O // 16, I // 8, KH, KW, 8, 16)``.
Splits must divide the axis, except the channel axis ``C`` of ``layout_transform`` with a
``channels`` attribute: ``NCHW -> NCHW8c`` of 116 channels stores 15 blocks whose last 4 lanes
are zero, and ``NCHW8c -> NCHW`` with ``channels=116`` drops them (see
:mod:`kiln.transform.alter_layout`, which pads a channel count whose divisors are all below one
vector).

``conv2d_nchwc`` is the convolution of the blocked layout (NCHW[x]c data, OIHW[i]i[o]o
weight, NCHW[o]c output).  Two forms exist: ``groups == 1``, and depthwise
(``groups == C == O``), whose weight is ``(C // b, 1, KH, KW, 1, b)`` and whose data and
output share the block ``b``.
"""

from __future__ import annotations

import re

import numpy as np

from ...runtime.errors import InputError
from ..op import OpPattern, REQUIRED, register_op
from ..types import TensorType
from ._util import Attrs, conv_out_size, require_ndim, same_dtype

__all__ = ["parse_layout", "layout_shape", "layout_to_primal", "primal_to_layout", "convert_layout"]

_AXIS = re.compile(r"(\d*)([A-Za-z])")


def parse_layout(layout: str) -> list[tuple[str, int]]:
    """Split a layout string into ``[(letter, factor)]``; factor 0 marks a primal axis.

    Raises
    ------
    InputError
        Malformed strings, repeated axes, a sub-axis without factor or without its primal axis.
    """
    if not isinstance(layout, str) or not layout:
        raise InputError(f"layout must be a non-empty string like 'NCHW16c', got {layout!r}")
    pos, res = 0, []
    for m in _AXIS.finditer(layout):
        if m.start() != pos:
            break
        pos = m.end()
        fac, letter = m.group(1), m.group(2)
        if letter.isupper():
            if fac:
                raise InputError(f"layout {layout!r}: primal axis {letter!r} may not carry a factor")
            res.append((letter, 0))
        else:
            if not fac or int(fac) < 1:
                raise InputError(f"layout {layout!r}: sub-axis {letter!r} needs a positive factor")
            res.append((letter, int(fac)))
    if pos != len(layout):
        raise InputError(f"layout {layout!r} is malformed (expected e.g. 'NCHW' or 'NCHW16c')")
    letters = [a for a, _ in res]
    if len(set(letters)) != len(letters):
        raise InputError(f"layout {layout!r} repeats an axis")
    for a, f in res:
        if f and a.upper() not in letters:
            raise InputError(f"layout {layout!r}: sub-axis {a!r} has no primal axis {a.upper()!r}")
    return res


def _primal_order(layout: list[tuple[str, int]]) -> list[str]:
    return [a for a, f in layout if not f]


def _factors(layout: list[tuple[str, int]]) -> dict[str, int]:
    return {a.upper(): f for a, f in layout if f}


def layout_shape(primal_shape: tuple[int, ...], layout: str, primal: str) -> tuple[int, ...]:
    """Shape of a tensor of logical layout ``primal`` (e.g. ``NCHW``) stored as ``layout``.

    Raises
    ------
    InputError
        Axis sets differ or a factor does not divide its axis.
    """
    lay, prim = parse_layout(layout), parse_layout(primal)
    if any(f for _, f in prim):
        raise InputError(f"layout {primal!r} must be primal (no sub-axes)")
    names = [a for a, _ in prim]
    if sorted(_primal_order(lay)) != sorted(names):
        raise InputError(f"layouts {layout!r} and {primal!r} have different axes")
    if len(primal_shape) != len(names):
        raise InputError(f"layout {primal!r} needs a {len(names)}-D tensor, got shape {tuple(primal_shape)}")
    ext = dict(zip(names, primal_shape))
    facs = _factors(lay)
    for a, f in facs.items():
        if ext[a] % f:
            raise InputError(f"layout {layout!r}: factor {f} does not divide axis {a} of extent {ext[a]}")
    out = []
    for a, f in lay:
        out.append(f if f else ext[a] // facs.get(a, 1))
    return tuple(out)


def _primal_of(layout: str) -> str:
    return "".join(_primal_order(parse_layout(layout)))


def layout_to_primal(x: np.ndarray, layout: str) -> np.ndarray:
    """NumPy: a tensor stored as ``layout`` back to its primal layout (same axis order)."""
    lay = parse_layout(layout)
    prim = _primal_order(lay)
    if x.ndim != len(lay):
        raise InputError(f"layout {layout!r} needs a {len(lay)}-D tensor, got shape {x.shape}")
    # Move every sub-axis right behind its primal axis, then merge the pairs.
    order: list[int] = []
    shape: list[int] = []
    pos = {a: i for i, (a, _) in enumerate(lay)}
    for a in prim:
        order.append(pos[a])
        sub = pos.get(a.lower())
        if sub is not None:
            order.append(sub)
            shape.append(x.shape[pos[a]] * x.shape[sub])
        else:
            shape.append(x.shape[pos[a]])
    return np.ascontiguousarray(x.transpose(order).reshape(shape))


def primal_to_layout(x: np.ndarray, primal: str, layout: str) -> np.ndarray:
    """NumPy: a tensor of primal layout ``primal`` stored as ``layout``."""
    lay = parse_layout(layout)
    names = [a for a, _ in parse_layout(primal)]
    layout_shape(x.shape, layout, primal)  # validates
    facs = _factors(lay)
    # Split each blocked primal axis into (outer, inner), then permute into ``layout`` order.
    split_shape: list[int] = []
    slot: dict[str, int] = {}
    for a, n in zip(names, x.shape):
        if a in facs:
            slot[a] = len(split_shape)
            slot[a.lower()] = len(split_shape) + 1
            split_shape += [n // facs[a], facs[a]]
        else:
            slot[a] = len(split_shape)
            split_shape.append(n)
    y = x.reshape(split_shape)
    return np.ascontiguousarray(y.transpose([slot[a] for a, _ in lay]))


def convert_layout(x: np.ndarray, src: str, dst: str, channels: int = 0) -> np.ndarray:
    """NumPy: re-store a tensor from layout ``src`` to layout ``dst`` (same primal axes).

    ``channels`` (0: none) is the logical channel count where a block pads ``C``: a padded
    source's extra lanes are dropped, a padded destination's are zero.
    """
    prim = _primal_of(src)
    if sorted(prim) != sorted(_primal_of(dst)):
        raise InputError(f"layouts {src!r} and {dst!r} have different axes")
    p = layout_to_primal(x, src)
    if channels:
        p = np.take(p, np.arange(channels), axis=prim.index("C"))
    dprim = _primal_of(dst)
    if dprim != prim:
        p = np.ascontiguousarray(p.transpose([prim.index(a) for a in dprim]))
    if channels:
        widths = [(0, 0)] * p.ndim
        widths[dprim.index("C")] = (0, -channels % _factors(parse_layout(dst)).get("C", 1))
        p = np.pad(p, widths)
    return primal_to_layout(p, dprim, dst)


# ----------------------------------------------------------------------------- layout_transform
def _lt_extents(shape: tuple[int, ...], src: str, dst: str, channels: int) -> tuple[dict[str, int], list[str]]:
    """Logical extent of every primal axis of a ``layout_transform`` input, and ``dst``'s order.

    ``channels`` (0: none) is the logical channel count where a block pads ``C``: the source's
    ``C`` extent is then ``channels``, which its blocks must hold with less than one block spare.
    """
    sl = parse_layout(src)
    if len(shape) != len(sl):
        raise InputError(f"layout {src!r} needs a {len(sl)}-D tensor, got shape {tuple(shape)}")
    prim = _primal_order(sl)
    dprim = _primal_of(dst)
    if sorted(prim) != sorted(dprim):
        raise InputError(f"layouts {src!r} and {dst!r} have different axes")
    pos = {a: i for i, (a, _) in enumerate(sl)}
    ext = {a: shape[pos[a]] * (shape[pos[a.lower()]] if a.lower() in pos else 1) for a in prim}
    if channels:
        if "C" not in ext:
            raise InputError(f"channels={channels} needs a channel axis C in {src!r}")
        f = _factors(sl).get("C", 1)
        if not ext["C"] - f < channels <= ext["C"]:
            raise InputError(f"channels={channels} does not fit {src!r} blocks of shape {tuple(shape)}")
        ext["C"] = channels
    return ext, list(dprim)


def _padded_shape(ext: dict[str, int], dst: str) -> tuple[int, ...]:
    """``layout_shape`` whose ``C`` blocks may pad (ceil) rather than divide."""
    lay = parse_layout(dst)
    facs = _factors(lay)
    for a, f in facs.items():
        if a != "C" and ext[a] % f:
            raise InputError(f"layout {dst!r}: factor {f} does not divide axis {a} of extent {ext[a]}")
    return tuple(f if f else -(-ext[a] // facs.get(a, 1)) for a, f in lay)


def _lt_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = ts
    src, dst, channels = attrs["src_layout"], attrs["dst_layout"], attrs["channels"]
    ext, dprim = _lt_extents(x.shape, src, dst, channels)
    if channels:
        return [TensorType(_padded_shape(ext, dst), x.dtype)]
    return [TensorType(layout_shape(tuple(ext[a] for a in dprim), dst, "".join(dprim)), x.dtype)]


register_op(
    "layout_transform", attrs={"src_layout": ("str", REQUIRED), "dst_layout": ("str", REQUIRED),
                               "channels": ("int", 0)},
    # OPAQUE, not INJECTIVE: a transform at a chain's edge must not pull the conv's
    # elementwise epilogue out of the conv kernel (an INJECTIVE group absorbs elementwise
    # producers, and the anchor can then only join an elementwise group).
    type_rel=_lt_rel, pattern=OpPattern.OPAQUE,
    ref=lambda xs, a: [convert_layout(xs[0], a["src_layout"], a["dst_layout"], a["channels"])],
    num_inputs=1, inputs=("data",),
    doc="re-store a tensor in another (blocked) layout, e.g. NCHW -> NCHW16c; channels (0: the blocks "
        "divide C) is the logical channel count when a channel block pads it")


# ----------------------------------------------------------------------------- conv2d_nchwc
def _nchwc_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, weight = ts
    require_ndim(data, 5, "data (NCHW[x]c)")
    require_ndim(weight, 6, "weight (OIHW[i]i[o]o)")
    dt = same_dtype(ts, "data and weight")
    for k, n in (("strides", 2), ("dilation", 2), ("padding", 4)):
        if len(attrs[k]) != n:
            raise InputError(f"{k} must have {n} values, got {attrs[k]}")
    n, cb, h, w, ib = data.shape
    obk, icb, kh, kw, wib, ob = weight.shape
    g = attrs["groups"]
    c = cb * ib
    if g == 1:
        if icb != cb or wib != ib:
            raise InputError(f"weight {weight.shape} does not match data {data.shape}: expected "
                             f"(O/o, {cb}, KH, KW, {ib}, o)")
    elif _is_depthwise(data.shape, weight.shape, g):
        if ob != ib or obk != cb:
            raise InputError(f"depthwise conv2d_nchwc: weight {weight.shape} does not match data {data.shape}: "
                             f"expected ({cb}, 1, KH, KW, 1, {ib})")
    else:
        # grouped: every group's input and output channels are whole blocks
        if g < 1 or c % g or (obk * ob) % g or wib != ib or icb * ib * g != c or ((obk * ob) // g) % ob:
            raise InputError(f"grouped conv2d_nchwc (groups={g}): weight {weight.shape} does not match data "
                             f"{data.shape}: expected (O/o, C/groups/{ib}, KH, KW, {ib}, o) with C/groups and "
                             f"O/groups multiples of the blocks, or a depthwise weight ({cb}, 1, KH, KW, 1, {ib}) "
                             f"with groups = channels = {c}")
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    if min(sh, sw, dh, dw) < 1 or min(pt, pl, pb, pr) < 0:
        raise InputError(f"bad strides {attrs['strides']} / dilation {attrs['dilation']} / padding {attrs['padding']}")
    oh = conv_out_size(h, kh, sh, pt, pb, dh)
    ow = conv_out_size(w, kw, sw, pl, pr, dw)
    return [TensorType((n, obk, oh, ow, ob), dt)]


def _is_depthwise(data_shape: tuple[int, ...], weight_shape: tuple[int, ...], groups: int) -> bool:
    """Depthwise (multiplier 1) weight ``(C/b, 1, KH, KW, 1, b)``, as opposed to a grouped one
    ``(O/o, C/groups/i, KH, KW, i, o)`` (whose ``i`` is a block of at least 4 channels)."""
    return groups != 1 and groups == data_shape[1] * data_shape[4] and weight_shape[1] == 1 and weight_shape[4] == 1


def _nchwc_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    from .nn import _conv2d_ref

    x, w = xs
    ib, ob = x.shape[4], w.shape[5]
    xd = layout_to_primal(x, f"NCHW{ib}c")
    if not _is_depthwise(x.shape, w.shape, attrs["groups"]):
        wd = layout_to_primal(w, f"OIHW{w.shape[4]}i{ob}o")
    else:
        wd = layout_to_primal(w, f"OIHW1i{ob}o")
    y = _conv2d_ref([xd, wd], {k: attrs[k] for k in ("strides", "padding", "dilation", "groups")})[0]
    return [primal_to_layout(y, "NCHW", f"NCHW{ob}c")]


register_op(
    "conv2d_nchwc",
    attrs={"strides": ("ints", (1, 1)), "padding": ("ints", (0, 0, 0, 0)), "dilation": ("ints", (1, 1)),
           "groups": ("int", 1)},
    type_rel=_nchwc_rel, pattern=OpPattern.OUT_ELEMWISE_FUSABLE, ref=_nchwc_ref, num_inputs=2,
    inputs=("data", "weight"),
    doc="2-D convolution in the blocked layout: NCHW[x]c data, OIHW[i]i[o]o weight, NCHW[o]c output")


# ----------------------------------------------------------------------------- max_pool2d_nchwc
def _pool_nchwc_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    from .nn import _pool_rel

    (data,) = ts
    require_ndim(data, 5, "data (NCHW[x]c)")
    n, cb, h, w, b = data.shape
    out = _pool_rel([TensorType((n, cb, h, w), data.dtype)], attrs)[0]
    return [TensorType(out.shape + (b,), data.dtype)]


def _pool_nchwc_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    from .nn import _pool_ref

    x = xs[0]
    b = x.shape[4]
    y = _pool_ref([layout_to_primal(x, f"NCHW{b}c")], attrs, "max")[0]
    return [primal_to_layout(y, "NCHW", f"NCHW{b}c")]


register_op(
    "max_pool2d_nchwc",
    attrs={"pool_size": ("ints", REQUIRED), "strides": ("ints", (1, 1)), "padding": ("ints", (0, 0, 0, 0)),
           "dilation": ("ints", (1, 1)), "ceil_mode": ("bool", False)},
    type_rel=_pool_nchwc_rel, pattern=OpPattern.OUT_ELEMWISE_FUSABLE, ref=_pool_nchwc_ref, num_inputs=1,
    inputs=("data",), doc="2-D max pooling in the blocked NCHW[x]c layout (attributes as max_pool2d)")
