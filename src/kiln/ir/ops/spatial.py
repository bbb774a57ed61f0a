"""IR ops: spatial sampling (``grid_sample``).

The other ONNX spatial ops (AffineGrid, LpPool, SpaceToDepth, DepthToSpace, CenterCropPad,
Col2Im, MaxUnpool) are decomposed by the frontend into existing IR ops, because their structure
depends only on static shapes; DeformConv is ``grid_sample`` taps followed by a matmul.
GridSample reads its input at coordinates that are only known at run time, so it is an op of
its own.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ...runtime.errors import InputError
from ..op import OpPattern, register_op
from ..types import TensorType
from ._util import Attrs, require_float

__all__ = ["GRID_SAMPLE_MODES", "GRID_SAMPLE_PADDING", "grid_sample_ref"]

GRID_SAMPLE_MODES = ("linear", "nearest", "cubic")
GRID_SAMPLE_PADDING = ("zeros", "border", "reflection")


def _grid_sample_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, grid = ts
    k = data.ndim - 2
    if k not in (1, 2, 3):
        raise InputError(f"grid_sample: data must be (N, C, D1[, D2[, D3]]), got shape {data.shape}")
    if grid.ndim != k + 2 or grid.shape[0] != data.shape[0] or grid.shape[-1] != k:
        raise InputError(f"grid_sample: grid must be (N, out..., {k}) with {k} output dims for data "
                         f"{data.shape}, got {grid.shape}")
    require_float(grid, "grid_sample grid")
    if attrs["mode"] not in GRID_SAMPLE_MODES:
        raise InputError(f"grid_sample: mode must be one of {GRID_SAMPLE_MODES}, got {attrs['mode']!r}")
    if attrs["padding_mode"] not in GRID_SAMPLE_PADDING:
        raise InputError(f"grid_sample: padding_mode must be one of {GRID_SAMPLE_PADDING}, "
                         f"got {attrs['padding_mode']!r}")
    if attrs["mode"] != "nearest":
        require_float(data, f"grid_sample ({attrs['mode']}) data")
    if attrs["mode"] == "cubic" and k == 3:
        raise InputError("grid_sample: cubic mode supports 1-D and 2-D data only, got 3-D (volumetric) data")
    if any(d == 0 for d in data.shape[2:]) and grid.size:
        raise InputError(f"grid_sample: cannot sample from empty spatial dims {data.shape[2:]}")
    return [TensorType(data.shape[:2] + grid.shape[1:-1], data.dtype)]


def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect ``v`` at the borders until it lies in ``[lo, hi]`` (PyTorch / ONNX rule)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dx = np.where(below, lo - v, np.where(above, v - hi, 0.0))
    n = np.floor(dx / rng)
    r = dx - n * rng
    even = np.mod(n, 2) == 0
    low_side = np.where(even, lo + r, hi - r)
    high_side = np.where(even, hi - r, lo + r)
    return np.where(below, low_side, np.where(above, high_side, v)).astype(v.dtype)


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    """Keys cubic weights of the taps at offsets -1, 0, 1, 2 from ``floor(x)``; ``t = x - floor(x)``."""
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def grid_sample_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    """NumPy reference of ``grid_sample`` (vectorised form of the ONNX reference)."""
    x, grid = xs
    k = x.ndim - 2
    dims = x.shape[2:]
    cdt = np.float64 if x.dtype == np.float64 or grid.dtype == np.float64 else np.float32
    mode, pad, align = attrs["mode"], attrs["padding_mode"], attrs["align_corners"]
    g = grid.astype(cdt)
    out_sp = grid.shape[1:-1]
    n_idx = np.arange(x.shape[0]).reshape((-1,) + (1,) * len(out_sp))
    axes_taps = []  # per data axis: [(index, weight or None, in-range mask)]
    for i, n in enumerate(dims):
        # grid[..., 0] is the innermost (x) coordinate
        v: Any = g[..., k - 1 - i]
        one, two = cdt(1), cdt(2)
        pos = (v + one) / two * cdt(n - 1) if align else ((v + one) * cdt(n) - one) / two
        pos = pos.astype(cdt)
        if mode == "nearest":
            pos = np.rint(pos)
        lo, hi = (0.0, n - 1.0) if align else (-0.5, n - 0.5)
        # Cubic only clamps its taps, not the coordinate (PyTorch and ONNX Runtime; the ONNX
        # reference clamps both, which moves the taps of a coordinate just outside the border).
        if pad == "border" and mode != "cubic":
            pos = np.where((pos < lo) | (pos > hi), np.clip(pos, 0, n - 1), pos).astype(cdt)
        elif pad == "reflection":
            pos = _reflect(pos, lo, hi)
        weights: list[Any]
        if mode == "nearest":
            offsets, weights = [0], [None]
            base = pos
        else:
            base = np.floor(pos)
            t = (pos - base).astype(cdt)
            if mode == "linear":
                offsets, weights = [0, 1], [1 - t, t]
            else:
                offsets, weights = [-1, 0, 1, 2], _cubic_weights(t)
        taps = []
        for off, wt in zip(offsets, weights):
            idx = base.astype(np.int64) + off
            if pad == "zeros":
                ok = (idx >= 0) & (idx < n)
            elif pad == "border":
                ok, idx = None, np.clip(idx, 0, n - 1)
            else:
                ok, idx = None, np.clip(np.trunc(_reflect(idx.astype(np.float64), lo, hi)), 0, n - 1)
            taps.append((np.clip(idx, 0, n - 1).astype(np.int64), wt, ok))
        axes_taps.append(taps)
    acc = None
    for combo in itertools.product(*axes_taps):
        vals = np.moveaxis(x[(n_idx, slice(None)) + tuple(c[0] for c in combo)], -1, 1)  # (N, C, *out)
        oks = [c[2] for c in combo if c[2] is not None]
        ok = np.logical_and.reduce(oks)[:, None] if oks else None
        if mode == "nearest":  # a pure gather: exact for every dtype
            vals = vals if ok is None else np.where(ok, vals, np.zeros((), x.dtype))
        else:
            w: Any = combo[0][1]
            for c in combo[1:]:
                w = w * c[1]
            vals = vals.astype(cdt) * w[:, None]
            vals = vals if ok is None else np.where(ok, vals, cdt(0))
        acc = vals if acc is None else acc + vals
    return [np.asarray(acc).astype(x.dtype)]


register_op("grid_sample",
            attrs={"mode": ("str", "linear"), "padding_mode": ("str", "zeros"), "align_corners": ("bool", False)},
            type_rel=_grid_sample_rel, pattern=OpPattern.INJECTIVE, ref=grid_sample_ref, num_inputs=2,
            inputs=("data", "grid"),
            doc="ONNX GridSample: out[n, c, p...] samples data[n, c] at grid[n, p..., :] (normalised "
                "[-1, 1], x first); mode linear|nearest|cubic, padding_mode zeros|border|reflection")
