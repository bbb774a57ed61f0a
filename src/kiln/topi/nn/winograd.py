"""Computes of the Winograd F(2x2, 3x3) transforms (ops in :mod:`kiln.ir.ops.winograd`).

``winograd_input_transform``: ``V[p, t, c]`` with ``p = 4a + b`` the transform coefficient,
``t`` the tile and ``c`` the channel (``cb * ib + lane`` of the blocked data, so a vector of
``c`` is a contiguous block of the input).  The data is first copied into a zero-padded buffer
that covers every tile's 4x4 patch (the last row / column of tiles of an odd output reads
past the image), so the transform itself has no bounds checks.

``winograd_output_transform``: output pixel ``(y, x)`` of block ``kb`` is entry
``(y % 2, x % 2)`` of ``A^T M A`` of tile ``(y // 2, x // 2)``.

With a dynamic H or W the tile grid is the runtime one (``TH, TW`` from the data's runtime
extents): tile ``t`` is ``(t // (TH * TW), t % (TH * TW) // TW, t % TW)``, a few integer
divisions per tile (amortised over its channels), and the padded copy stops at the runtime
extent plus the padding (:func:`kiln.topi.transform.pad_compute`).

Both write the 16 (or 4) expressions of one tile as a chain of selects on the coefficient
index; the schedules (:mod:`kiln.topi.schedule.x86_winograd`) unroll that index, so every
select folds to one expression of a few adds.  The matrices have entries 0 and +-1 only
(``B^T``, ``A^T``), so each expression is written with additions and subtractions.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ... import te
from ...ir.ops.winograd import WINOGRAD_AT, WINOGRAD_BT, winograd_grid, winograd_tiles
from ...runtime.errors import CompileError
from ..registry import register_compute
from ..transform import pad_compute
from ..util import acc_dtype, output_stage
from .dense import TAG_MATMUL

__all__ = ["winograd_input_transform", "winograd_output_transform", "winograd_matmul", "TAG_WINOGRAD_IN",
           "TAG_WINOGRAD_OUT", "TAG_WINOGRAD_PAD"]

TAG_WINOGRAD_IN = "winograd_input_transform"
TAG_WINOGRAD_OUT = "winograd_output_transform"
TAG_WINOGRAD_PAD = "winograd_pad"


def _combine(coefs: np.ndarray, terms: list[Any]) -> Any:
    """``sum(coefs[i] * terms[i])`` for coefficients in {-1, 0, 1}, as adds and subtractions."""
    out: Any = None
    for c, t in zip(coefs, terms):
        if c == 0:
            continue
        if out is None:
            out = t if c > 0 else -t
        else:
            out = out + t if c > 0 else out - t
    return out


def _select(index: Any, exprs: list[Any]) -> Any:
    """``exprs[index]`` as nested selects (folded once ``index`` is an unrolled constant)."""
    out = exprs[-1]
    for i in range(len(exprs) - 2, -1, -1):
        out = te.if_then_else(te.equal(index, i), exprs[i], out)
    return out


def _sandwich(left: np.ndarray, right: np.ndarray, at: Callable[[int, int], Any]) -> list[list[Any]]:
    """Entries of ``left @ X @ right.T`` where ``X[r][s] = at(r, s)``, the row pass shared."""
    rows = [[_combine(left[a], [at(r, s) for r in range(left.shape[1])]) for s in range(right.shape[1])]
            for a in range(left.shape[0])]
    return [[_combine(right[b], rows[a]) for b in range(right.shape[0])] for a in range(left.shape[0])]


def _runtime_tiles(data: te.Tensor, padding: tuple[int, int, int, int]) -> tuple[Any, Any] | None:
    """``(TH, TW)`` at the runtime H, W of ``data`` (int where static); None when both are static."""
    dyn = data.dyn or (None,) * 5
    if dyn[2] is None and dyn[3] is None:
        return None
    pt, pl, pb, pr = padding
    grid = winograd_grid(int(data.shape[2]), int(data.shape[3]), padding)
    # ceil(OH / 2) with OH = H + pt + pb - 2 at the runtime H (likewise W)
    th = te.floordiv(dyn[2] + (pt + pb - 1), 2) if dyn[2] is not None else grid.tiles_h
    tw = te.floordiv(dyn[3] + (pl + pr - 1), 2) if dyn[3] is not None else grid.tiles_w
    return th, tw


def winograd_input_transform(data: te.Tensor, padding: tuple[int, int, int, int], plane_rows: int = 0) -> te.Tensor:
    """``V = B^T d B`` of every 2x2 output tile of a 3x3 stride-1 convolution.

    Parameters
    ----------
    data : te.Tensor
        ``(N, C/ib, H, W, ib)``; N, H and W may be dynamic (``data.dyn``).
    padding : (top, left, bottom, right)
        The convolution's zero padding.
    plane_rows : int
        Rows per plane (:func:`kiln.ir.ops.winograd.winograd_plane_rows`; static shapes only):
        the rows past the ``T`` tiles repeat the last tile.  0: ``T``.

    Returns
    -------
    te.Tensor
        ``(16, R, C)`` with ``R = max(plane_rows, T)``, ``T = N * TH * TW`` and
        ``TH, TW = ceil(OH / 2), ceil(OW / 2)`` (upper bounds; with a dynamic H or W the valid
        rows are the tiles at the runtime sizes, in the same order).
    """
    n, cb, h, w, ib = (int(v) for v in data.shape)
    pt, pl, pb, pr = padding
    grid = winograd_grid(h, w, padding)
    th, tw = grid.tiles_h, grid.tiles_w
    tiles = n * th * tw
    rows = max(plane_rows, tiles)
    rt = _runtime_tiles(data, padding)
    dyn = data.dyn or (None,) * 5
    if rows > tiles and any(d is not None for d in dyn):
        raise CompileError(f"winograd_input_transform: plane_rows={plane_rows} needs static data, got dyn {dyn}")
    # every patch inside: rows up to 2 * TH + 2 (>= H + pt + pb).  A dynamic axis is padded
    # after its runtime extent, and at an odd runtime size the last tile reads row
    # H + pt + pb: one more than the padding (it still fits the upper-bound buffer, whose
    # 2 * TH + 2 <= H + pt + pb + 1)
    below = pb + 1 if dyn[2] is not None else grid.pad[0][1]
    right = pr + 1 if dyn[3] is not None else grid.pad[1][1]
    dp = pad_compute(data, [(0, 0), (0, 0), (pt, below), (pl, right), (0, 0)], "constant", 0.0,
                     name="winograd_pad", tag=TAG_WINOGRAD_PAD, read_to_padded_extent=rt is not None)
    rth, rtw = rt if rt is not None else (th, tw)
    per_image = rth * rtw

    def body(p: Any, t: Any, c: Any) -> Any:
        if rows > tiles:
            # the spacing rows recompute the last tile: in bounds without a branch per tile
            t = te.minimum(t, tiles - 1)
        b = te.floordiv(t, per_image)
        rem = te.floormod(t, per_image)
        y0 = te.floordiv(rem, rtw) * 2
        x0 = te.floormod(rem, rtw) * 2
        cblk, lane = te.floordiv(c, ib), te.floormod(c, ib)
        v = _sandwich(WINOGRAD_BT, WINOGRAD_BT, lambda r, s: dp[b, cblk, y0 + r, x0 + s, lane])
        return _select(p, [v[a][bb] for a in range(4) for bb in range(4)])

    # a symbolic batch / H / W: tile t inside the output's valid rows (N * TH * TW at the
    # runtime sizes) reads image t // (TH * TW) and rows, columns inside the padded copy's
    # runtime extents, which the dynamic-extent analysis cannot see through the divisions
    attrs = {"dyn_reads_in_bounds": True} if any(d is not None for d in dyn) else {}
    out = te.compute((16, rows, cb * ib), body, name="winograd_input_transform", tag=TAG_WINOGRAD_IN,
                     attrs=attrs)
    assert isinstance(out, te.Tensor)  # one output
    return out


def winograd_output_transform(m: te.Tensor, out_height: int, out_width: int, block: int,
                              data: te.Tensor | None = None,
                              padding: tuple[int, int, int, int] | None = None) -> te.Tensor:
    """``Y = A^T M A`` per tile, into the blocked output.

    Parameters
    ----------
    m : te.Tensor
        ``(16, N * TH * TW, K)``: the 16 GEMM products.
    out_height, out_width : int
        ``OH, OW`` of the convolution (a last tile of an odd size drops its extra row / column);
        upper bounds when ``data`` is given.
    block : int
        Output channel block ``ob`` (divides ``K``).
    data, padding : te.Tensor and (top, left, bottom, right), optional
        The convolution's data and padding, for a dynamic H or W: the tiles per row and per
        image at run time come from the data's runtime H and W (its values are not read).

    Returns
    -------
    te.Tensor
        ``(N, K / ob, OH, OW, ob)``.
    """
    _, t, k = (int(v) for v in m.shape)
    th, tw = winograd_tiles(out_height, out_width)
    n = t // (th * tw)
    rt = _runtime_tiles(data, padding) if data is not None and padding is not None else None
    rth, rtw = rt if rt is not None else (th, tw)

    def body(b: Any, kb: Any, y: Any, x: Any, kc: Any) -> Any:
        tile = (b * rth + te.floordiv(y, 2)) * rtw + te.floordiv(x, 2)
        ch = kb * block + kc
        yv = _sandwich(WINOGRAD_AT, WINOGRAD_AT, lambda a, bb: m[a * 4 + bb, tile, ch])
        i, j = te.floormod(y, 2), te.floormod(x, 2)
        return te.if_then_else(te.equal(i, 0), _select(j, yv[0]), _select(j, yv[1]))

    # a symbolic tile count: output pixel (b, y, x) inside the runtime size reads a tile
    # inside M's valid rows (N * TH * TW at the runtime sizes)
    attrs = {"dyn_reads_in_bounds": True} if m.dyn is not None and m.dyn[1] is not None else {}
    out = te.compute((n, k // block, out_height, out_width, block), body, name="winograd_output_transform",
                     tag=TAG_WINOGRAD_OUT, attrs=attrs)
    assert isinstance(out, te.Tensor)  # one output
    return out


def winograd_matmul(v: te.Tensor, panels: te.Tensor, units: int, tiles: int = 0) -> te.Tensor:
    """``M[p] = V[p, :T] @ U[p]`` with ``U`` packed at build time as column panels.

    The product is the packed ``matmul`` of :mod:`kiln.topi.nn.dense` (same tag and attributes,
    so the x86 GEMM schedule tiles it: a column tile is one panel) with the panels read
    directly instead of through a per-call pack stage.

    Parameters
    ----------
    v : te.Tensor
        ``(16, R, C)``: ``R >= T`` rows per plane.
    panels : te.Tensor
        ``(16, ceil(K / bn), C, bn)`` (:func:`kiln.ir.ops.winograd.winograd_panels`).
    units : int
        ``K``.
    tiles : int
        ``T``, the rows of ``V`` multiplied (0: all ``R``).

    Returns
    -------
    te.Tensor
        ``(16, T, K)``.
    """
    p, rows, c = (int(d) for d in v.shape)
    t = tiles or rows
    bn = int(panels.shape[3])
    acc = acc_dtype(v.dtype)
    r = te.reduce_axis((0, c), name="k")
    out = te.compute((p, t, units),
                     lambda q, i, j: te.sum(te.cast(v[q, i, r], acc)
                                            * te.cast(panels[q, te.floordiv(j, bn), r, te.floormod(j, bn)], acc),
                                            axis=r),
                     name="matmul", tag=TAG_MATMUL,
                     # no "workload": the tuner has no task kind for these GEMMs (it would
                     # extract them as plain matmuls, which it cannot build); default tiles
                     attrs={"packed": True, "bn": bn})
    assert isinstance(out, te.Tensor)
    return output_stage(out, v.dtype, "matmul_out")


@register_compute("winograd_matmul")
def _winograd_matmul(attrs: dict, inputs: list, out_types: list) -> list:
    return [winograd_matmul(inputs[0], inputs[1], int(attrs["units"]), int(attrs.get("tiles") or 0))]


@register_compute("winograd_input_transform")
def _winograd_input_transform(attrs: dict, inputs: list, out_types: list) -> list:
    pt, pl, pb, pr = (int(v) for v in attrs["padding"])
    return [winograd_input_transform(inputs[0], (pt, pl, pb, pr), int(attrs.get("plane_rows") or 0))]


@register_compute("winograd_output_transform")
def _winograd_output_transform(attrs: dict, inputs: list, out_types: list) -> list:
    pad = attrs.get("padding")
    data = inputs[1] if len(inputs) == 2 else None
    return [winograd_output_transform(inputs[0], int(attrs["out_height"]), int(attrs["out_width"]),
                                      int(attrs["block"]), data,
                                      None if pad is None else (int(pad[0]), int(pad[1]), int(pad[2]), int(pad[3])))]
