"""Winograd F(2x2, 3x3) transform ops: ``winograd_input_transform``, ``winograd_output_transform``.

A 3x3 stride-1 convolution of blocked data (``NCHW[ib]c``) runs as three ops, emitted by
:mod:`kiln.transform.alter_layout` when it measured faster than ``conv2d_nchwc``:

1. ``winograd_input_transform``: every 4x4 input patch ``d`` of a 2x2 output tile (tiles at a
   stride of 2, zero padding around the image) becomes ``V = B^T d B``, stored as
   ``(16, R, C)``: ``T = N * ceil(OH / 2) * ceil(OW / 2)`` tiles (row-major over
   ``(n, ty, tx)``) and the channels contiguous, in planes of ``R = T`` rows, or of
   ``plane_rows`` rows (:func:`winograd_plane_rows`) where ``T * C`` floats would put the 16
   stores of one tile in the same L1 sets;
2. ``winograd_matmul`` of ``V``'s first ``T`` rows (``tiles``) and the weight transformed at
   build time, ``U = G g G^T`` (:func:`winograd_weight`, ``(16, C, K)``) stored as the column
   panels the CPU GEMM kernel reads (:func:`winograd_panels`): 16 independent GEMMs
   ``M[p] = V[p, :T] @ U[p]``.  (The
   ``matmul`` op would repack its constant operand on every call: 16 MiB per call for
   512 channels, where a 7x7 map has only 16 tiles of rows to spread it over);
3. ``winograd_output_transform``: ``Y = A^T M A`` per tile into the blocked output
   ``(N, K/ob, OH, OW, ob)``; tiles past an odd border drop their extra row / column.  It is
   ``OUT_ELEMWISE_FUSABLE``, so the conv's epilogue (bias, activation, residual add) still
   runs inside its kernel.

Symbolic batch, H or W (``docs/dynamic_shapes.md``): ``T`` stays a flat, compact row count,
``N * TH * TW`` at the runtime sizes, and the shapes are the upper bounds (the planes are not
padded: ``plane_rows`` and ``tiles`` need a static tile count).  M alone does not say
how its rows split into images, rows and columns of tiles, so the output transform then takes
the conv's data as a second input, read for its runtime shape only, with the conv's
``padding``; static graphs keep the one-input form.

The matrices are Lavin & Gray's (arXiv:1509.09308).  This module owns them (the NumPy
references and the computes in :mod:`kiln.topi.nn.winograd` both read them from here); it
must not import topi, transforms or code generators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...runtime.errors import InputError
from ..op import OpPattern, REQUIRED, register_op
from ..types import TensorType
from ._util import Attrs, require_ndim
from .layout import layout_to_primal, primal_to_layout

__all__ = ["WINOGRAD_BT", "WINOGRAD_G", "WINOGRAD_AT", "WinogradGrid", "winograd_tiles", "winograd_grid",
           "winograd_plane_rows", "winograd_weight", "winograd_panels"]

#: Input transform ``B^T`` (4x4): ``V = B^T d B``.
WINOGRAD_BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
#: Weight transform ``G`` (4x3): ``U = G g G^T``.
WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
#: Output transform ``A^T`` (2x4): ``Y = A^T M A``.
WINOGRAD_AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)


def winograd_tiles(out_h: int, out_w: int) -> tuple[int, int]:
    """Tiles ``(ceil(OH / 2), ceil(OW / 2))`` of an ``OH x OW`` output."""
    return -(-out_h // 2), -(-out_w // 2)


@dataclass(frozen=True)
class WinogradGrid:
    """The tiling of the 3x3 stride-1 convolution of an ``H x W`` image.

    Attributes
    ----------
    out_h, out_w : int
        Output size ``OH, OW``.
    tiles_h, tiles_w : int
        Tiles ``TH, TW = ceil(OH / 2), ceil(OW / 2)``.
    pad : ((int, int), (int, int))
        ``((top, below), (left, right))``: the zero padding that puts every tile's 4x4 patch
        inside the image, ``2 * TH + 2`` rows by ``2 * TW + 2`` columns (the conv's padding,
        one more row / column after an odd output).
    """

    out_h: int
    out_w: int
    tiles_h: int
    tiles_w: int
    pad: tuple[tuple[int, int], tuple[int, int]]


def winograd_grid(height: int, width: int, padding: Sequence[int]) -> WinogradGrid:
    """The :class:`WinogradGrid` of an ``height x width`` image and the conv's ``padding``
    ``(top, left, bottom, right)`` (the op's reference and :mod:`kiln.topi.nn.winograd` both
    tile by it)."""
    pt, pl, pb, pr = _check_padding(tuple(padding))
    oh, ow = height + pt + pb - 2, width + pl + pr - 2
    if oh < 1 or ow < 1:
        raise InputError(f"3x3 window does not fit a {height}x{width} image with padding {tuple(padding)}")
    th, tw = winograd_tiles(oh, ow)
    return WinogradGrid(oh, ow, th, tw, ((pt, 2 * th + 2 - height - pt), (pl, 2 * tw + 2 - width - pl)))


#: L1 geometry the plane stride is chosen for: 64-byte lines, 4 KiB per way (64 sets; every
#: x86 L1D since Sandy Bridge / Zen, 8- to 12-way).
_L1_LINE, _L1_WAY = 64, 4096
#: Most lines of one tile's 16 plane stores one set may take before the planes are padded
#: (Zen 5, 1 thread, input transform time per tile and channel: 16 lines per set ~2.3 ns,
#: 8 ~1.4 ns, 1-4 ~1.2-1.3 ns; ``bench/bench_winograd_layers.py``).
_MAX_LINES_PER_SET = 8


def _lines_per_set(rows: int, channels: int, itemsize: int) -> int:
    """Most cache lines one tile's 16 stores (a ``channels`` row in each plane of ``rows``
    rows) map to one L1 set; the first tile's, the row at offset 0 (a later tile shifts every
    store by the same amount, so its count differs only by where lines split)."""
    row, stride = channels * itemsize, rows * channels * itemsize
    count: dict[int, int] = {}
    for p in range(16):
        first, last = p * stride // _L1_LINE, (p * stride + row - 1) // _L1_LINE
        for line in range(first, last + 1):
            s = line % (_L1_WAY // _L1_LINE)
            count[s] = count.get(s, 0) + 1
    return max(count.values())


def winograd_plane_rows(tiles: int, channels: int, itemsize: int = 4) -> int:
    """Rows per plane of the input transform's ``V``: ``tiles``, or a few more where planes of
    ``tiles`` rows would alias in L1.

    The transform stores one tile's ``channels`` values to each of the 16 planes in turn.
    With a plane stride that is a multiple of 4 KiB (64 channels at 56x56: 784 tiles of
    256 bytes) those 16 stores fall in the same L1 sets, more lines than the sets have ways,
    and the transform ran 2x its time per value at other sizes.  A few more rows per plane
    (``r``, the fewest of at most 16 that spread the stores best; one row for every
    power-of-two channel count below 1024) move plane ``p`` by ``p * r * channels`` values.
    Measured (Zen 5, 1 thread, ``bench/bench_winograd_layers.py --planes --rounds 40``): 64
    channels at 56x56 124 -> 66 us (54x54: 61 / 62 us), 512 at 7x7 19 -> 12 us, 128 at 32x32
    75 -> 40 us; the GEMMs reading the spaced planes within noise.  In ResNet-18's runs the
    four 56x56 and three 7x7 transforms took ~200 us less (of ~11 ms).

    Parameters
    ----------
    tiles : int
        ``T``: the rows the GEMMs read (static).
    channels : int
        ``C``, blocked (padding lanes included).
    itemsize : int
        Bytes per value.

    Returns
    -------
    int
        ``tiles`` when at most :data:`_MAX_LINES_PER_SET` lines of one tile's stores share
        an L1 set (or no padding spreads them better), else ``tiles + r``.
    """
    worst = _lines_per_set(tiles, channels, itemsize)
    if worst <= _MAX_LINES_PER_SET:
        return tiles
    best = min(range(1, 17), key=lambda r: (_lines_per_set(tiles + r, channels, itemsize), r))
    return tiles + best if _lines_per_set(tiles + best, channels, itemsize) < worst else tiles


def winograd_weight(weight: np.ndarray) -> np.ndarray:
    """NumPy: a ``(K, C, 3, 3)`` conv weight as the ``(16, C, K)`` GEMM operands ``G g G^T``.

    Parameters
    ----------
    weight : numpy.ndarray
        OIHW weight with 3x3 taps.

    Returns
    -------
    numpy.ndarray
        ``U[a * 4 + b, c, k] = (G g[k, c] G^T)[a, b]`` in the weight's dtype (computed in float64).
    """
    w = np.asarray(weight)
    if w.ndim != 4 or w.shape[2:] != (3, 3):
        raise InputError(f"winograd_weight needs a (K, C, 3, 3) weight, got {w.shape}")
    u = np.einsum("ar,kcrs,bs->abck", WINOGRAD_G, w.astype(np.float64), WINOGRAD_G)
    return np.ascontiguousarray(u.reshape(16, w.shape[1], w.shape[0]).astype(w.dtype))


def winograd_panels(u: np.ndarray, bn: int) -> np.ndarray:
    """NumPy: ``(16, C, K)`` GEMM operands as ``(16, ceil(K / bn), C, bn)`` column panels,
    zero-padded in ``K`` (the layout the packed matmul kernels read, built once at build time)."""
    p, c, k = u.shape
    u = np.pad(u, [(0, 0), (0, 0), (0, -k % bn)])
    return np.ascontiguousarray(u.reshape(p, c, -1, bn).transpose(0, 2, 1, 3))


def _check_padding(pad: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(pad) != 4 or not all(isinstance(p, int) for p in pad) or min(pad) < 0:
        raise InputError(f"padding must be 4 non-negative values (top, left, bottom, right), got {pad}")
    pt, pl, pb, pr = (int(p) for p in pad)
    return pt, pl, pb, pr


def _in_out_size(shape: tuple[int, ...], pad: tuple[int, ...]) -> tuple[int, int]:
    """Output size ``(OH, OW)`` of the 3x3 stride-1 convolution of ``NCHW[b]c`` data."""
    grid = winograd_grid(shape[2], shape[3], pad)
    return grid.out_h, grid.out_w


# ----------------------------------------------------------------------------- input transform
def _in_rows(x: TensorType, attrs: Attrs) -> tuple[int, int]:
    """``(T, R)``: the tiles of data ``x`` and the rows of each plane of ``V``."""
    require_ndim(x, 5, "data (NCHW[x]c)")
    grid = winograd_grid(x.shape[2], x.shape[3], attrs["padding"])
    tiles = x.shape[0] * grid.tiles_h * grid.tiles_w
    rows = attrs["plane_rows"] or tiles
    if rows < tiles:
        raise InputError(f"winograd_input_transform: plane_rows={rows} is fewer than the {tiles} tiles")
    return tiles, rows


def _in_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    (x,) = ts
    _, rows = _in_rows(x, attrs)
    return [TensorType((16, rows, x.shape[1] * x.shape[4]), x.dtype)]


def _in_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x = xs[0]
    grid = winograd_grid(x.shape[2], x.shape[3], attrs["padding"])
    th, tw = grid.tiles_h, grid.tiles_w
    tiles = x.shape[0] * th * tw
    rows = max(attrs["plane_rows"], tiles)
    d = layout_to_primal(x, f"NCHW{x.shape[4]}c").astype(np.float64)
    n, c = d.shape[:2]
    # pad so that every tile's 4x4 patch is inside (the last tile of an odd size reads zeros)
    d = np.pad(d, [(0, 0), (0, 0), grid.pad[0], grid.pad[1]])
    patches = np.empty((n, th, tw, 4, 4, c))
    for r in range(4):
        for s in range(4):
            patches[:, :, :, r, s, :] = d[:, :, r:r + 2 * th:2, s:s + 2 * tw:2].transpose(0, 2, 3, 1)
    v = np.einsum("ar,ntxrsc,bs->abntxc", WINOGRAD_BT, patches, WINOGRAD_BT).reshape(16, tiles, c)
    # the rows past T repeat the last tile (what the kernel computes: no branch per tile)
    v = np.concatenate([v, np.repeat(v[:, -1:], rows - tiles, axis=1)], axis=1)
    return [np.ascontiguousarray(v.astype(x.dtype))]


register_op(
    "winograd_input_transform", attrs={"padding": ("ints", (0, 0, 0, 0)), "plane_rows": ("int", 0)},
    # OPAQUE: its own schedule, and an elementwise producer (the previous conv's ReLU) must
    # stay in that conv's kernel instead of being recomputed here for every tile
    type_rel=_in_rel, pattern=OpPattern.OPAQUE, ref=_in_ref, num_inputs=1, inputs=("data",),
    doc="Winograd F(2x2,3x3) input transform: NCHW[b]c data (3x3 stride-1 window, padding) -> "
        "V = B^T d B per 2x2 output tile, (16, plane_rows, C): the tiles, then (plane_rows > tiles, "
        "static tiles only) copies of the last tile that space the planes apart in L1; 0 = the tiles")


# ----------------------------------------------------------------------------- output transform
def _out_size(ts: list[TensorType], attrs: Attrs) -> tuple[int, int]:
    """``(OH, OW)``: ``out_height``, ``out_width``; with the ``data`` input (symbolic H or W),
    checked against the window of the data's upper-bound shape and ``padding``."""
    oh, ow = attrs["out_height"], attrs["out_width"]
    if len(ts) == 2:
        require_ndim(ts[1], 5, "data (NCHW[x]c)")
        if attrs["padding"] is None:
            raise InputError("winograd_output_transform: padding is required with the data input")
        if (oh, ow) != _in_out_size(ts[1].shape, attrs["padding"]):
            raise InputError(f"winograd_output_transform: a {oh}x{ow} output does not match data "
                             f"{ts[1].shape} with padding {attrs['padding']}")
    return oh, ow


def _out_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    m = ts[0]
    require_ndim(m, 3, "M (16, tiles, K)")
    oh, ow = _out_size(ts, attrs)
    ob = attrs["block"]
    if oh < 1 or ow < 1 or ob < 1:
        raise InputError(f"out_height, out_width and block must be positive, got {oh}, {ow}, {ob}")
    th, tw = winograd_tiles(oh, ow)
    p, t, k = m.shape
    if p != 16 or t % (th * tw) or k % ob:
        raise InputError(f"M {m.shape} does not match a {oh}x{ow} output in blocks of {ob}: expected "
                         f"(16, N * {th * tw}, a multiple of {ob})")
    return [TensorType((t // (th * tw), k // ob, oh, ow, ob), m.dtype)]


def _out_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    m = xs[0]
    # with the data input the attributes hold the upper bounds: the size is the data's window
    oh, ow = _in_out_size(xs[1].shape, attrs["padding"]) if len(xs) == 2 else (attrs["out_height"],
                                                                                attrs["out_width"])
    ob = attrs["block"]
    th, tw = winograd_tiles(oh, ow)
    k = m.shape[2]
    mm = m.astype(np.float64).reshape(4, 4, -1, th, tw, k)
    y = np.einsum("ia,abntxk,jb->nktixj", WINOGRAD_AT, mm, WINOGRAD_AT)
    y = y.reshape(y.shape[0], k, 2 * th, 2 * tw)[:, :, :oh, :ow]
    return [primal_to_layout(np.ascontiguousarray(y.astype(m.dtype)), "NCHW", f"NCHW{ob}c")]


register_op(
    "winograd_output_transform",
    # padding is of kind "dims" so that, unset, it stays out of a printed static graph
    attrs={"out_height": ("int", REQUIRED), "out_width": ("int", REQUIRED), "block": ("int", REQUIRED),
           "padding": ("dims", None)},
    type_rel=_out_rel, pattern=OpPattern.OUT_ELEMWISE_FUSABLE, ref=_out_ref, num_inputs=(1, 2),
    inputs=("m", "data"),
    doc="Winograd F(2x2,3x3) output transform: M (16, tiles, K) -> Y = A^T M A per tile, blocked "
        "output (N, K/block, out_height, out_width, block); with symbolic H / W the conv's data "
        "(only its shape is read) and padding give the runtime size, out_height / out_width the "
        "upper bounds")


# ----------------------------------------------------------------------------- GEMMs
def _mm_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    v, u = ts
    require_ndim(v, 3, "V (16, rows, C)")
    require_ndim(u, 4, "U panels (16, K/bn, C, bn)")
    units = attrs["units"]
    if v.shape[0] != 16 or u.shape[0] != 16 or u.shape[2] != v.shape[2] or not 0 < units <= u.shape[1] * u.shape[3] \
            or units <= (u.shape[1] - 1) * u.shape[3]:
        raise InputError(f"winograd_matmul: V {v.shape} and panels {u.shape} do not match units={units}")
    if v.dtype != u.dtype:
        raise InputError(f"winograd_matmul: dtypes differ ({v.dtype}, {u.dtype})")
    tiles = attrs["tiles"] or v.shape[1]
    if tiles > v.shape[1]:
        raise InputError(f"winograd_matmul: tiles={tiles} is more than V's {v.shape[1]} rows")
    return [TensorType((16, tiles, units), v.dtype)]


def _mm_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    v, u = xs
    p, npan, c, bn = u.shape
    full = u.transpose(0, 2, 1, 3).reshape(p, c, npan * bn)[:, :, :attrs["units"]]
    v = v[:, :attrs["tiles"] or v.shape[1]]
    return [np.matmul(v.astype(np.float64), full.astype(np.float64)).astype(v.dtype)]


register_op(
    "winograd_matmul", attrs={"units": ("int", REQUIRED), "tiles": ("int", 0)},
    type_rel=_mm_rel, pattern=OpPattern.OUT_ELEMWISE_FUSABLE, ref=_mm_ref, num_inputs=2, inputs=("v", "panels"),
    doc="the 16 GEMMs of Winograd F(2x2,3x3): the first tiles rows of V (16, rows, C; tiles 0 = all) x U "
        "stored as column panels (16, ceil(units/bn), C, bn) -> M (16, tiles, units)")
