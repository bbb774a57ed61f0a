"""IR ops: Recurrent and volumetric ops (RNN, GRU, LSTM, 3-D convolution and pooling, RoiAlign).

RNN / GRU / LSTM and 3-D convolution need no op of their own: the ONNX frontend unrolls the
recurrences over time and stacks 3-D taps into 2-D convolutions. What is left is ``roi_align``.
"""

from __future__ import annotations

import math

import numpy as np

from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType
from ._util import Attrs, require_float, require_ndim


# ----------------------------------------------------------------------------- roi_align
def _roi_align_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, rois, idx = ts
    require_ndim(data, 4, "data")
    require_float(data, "data")
    require_ndim(rois, 2, "rois")
    require_ndim(idx, 1, "batch_indices")
    if rois.dtype != data.dtype:
        raise InputError(f"rois must have the data dtype {data.dtype}, got {rois.dtype}")
    if rois.shape[1] != 4 or idx.shape[0] != rois.shape[0]:
        raise InputError(f"rois {rois.shape} must be (num_rois, 4) and batch_indices {idx.shape} "
                         f"(num_rois,)")
    if idx.dtype not in ("int32", "int64"):
        raise InputError(f"batch_indices must be int32 or int64, got {idx.dtype}")
    oh, ow = attrs["output_height"], attrs["output_width"]
    if oh < 1 or ow < 1:
        raise InputError(f"output_height / output_width must be positive, got {oh}, {ow}")
    sr, grid = attrs["sampling_ratio"], attrs["max_grid"]
    if sr < 0:
        raise InputError(f"sampling_ratio must be >= 0, got {sr}")
    if sr == 0 and (len(grid) != 2 or min(grid) < 1):
        raise InputError(f"sampling_ratio=0 (adaptive) needs max_grid (h, w) >= 1, got {grid}")
    if attrs["mode"] not in ("avg", "max"):
        raise InputError(f"mode must be 'avg' or 'max', got {attrs['mode']!r}")
    return [TensorType((rois.shape[0], data.shape[1], oh, ow), data.dtype)]


def roi_align_grid_bound(size: int) -> int:
    """Samples of one adaptive-grid bin along an axis of ``size`` cells that can be in the image.

    Adaptive samples are ``bin / ceil(bin)`` apart: one per bin when the bin is under a cell,
    else at least half a cell apart, so at most ``2 * (size + 1) + 1`` of them fall within
    ``[-1, size]``; 4 more cover the early start of the reduction and rounding.
    """
    return 2 * size + 7


def roi_grid(start: float, size: float, out: int, ratio: int) -> tuple[np.ndarray, int]:
    """Sample coordinates along one axis of one RoI: ``(out, grid)`` values and the grid size.

    ``grid`` samples per output bin (``ratio``, or ``ceil(size / out)`` when ``ratio`` is 0),
    each in the middle of its sub-bin, as ONNX Runtime places them.
    """
    grid = ratio if ratio > 0 else int(math.ceil(size / out))
    grid = max(grid, 0)
    b = size / out
    p = np.arange(out, dtype=np.float64)[:, None]
    i = np.arange(grid, dtype=np.float64)[None, :]
    return start + p * b + (i + 0.5) * b / max(grid, 1), grid


def _bilinear_taps(c: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Low / high index, their weights and the in-range mask of sample coordinates ``c``."""
    valid = (c >= -1.0) & (c <= n)
    c = np.maximum(c, 0.0)
    lo = np.minimum(np.floor(c), n - 1).astype(np.int64)
    edge = lo >= n - 1
    hi = np.where(edge, n - 1, lo + 1)
    frac = np.where(edge, 0.0, c - lo)
    return lo, hi, 1.0 - frac, frac, valid


def _roi_align_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    data, rois, idx = xs
    n, ch, h, w = data.shape
    oh, ow = attrs["output_height"], attrs["output_width"]
    scale, sr = attrs["spatial_scale"], attrs["sampling_ratio"]
    off = 0.5 if attrs["half_pixel"] else 0.0
    x64 = data.astype(np.float64)
    out = np.zeros((rois.shape[0], ch, oh, ow))
    for r in range(rois.shape[0]):
        b = int(idx[r])
        if not -n <= b < n:
            raise InputError(f"roi_align: batch index {b} of RoI {r} is out of range for {n} images")
        b += n if b < 0 else 0
        x1, y1, x2, y2 = (float(v) * scale - off for v in rois[r].astype(np.float64))
        rw, rh = x2 - x1, y2 - y1
        if not attrs["half_pixel"]:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        ys, gh = roi_grid(y1, rh, oh, sr)
        xs_, gw = roi_grid(x1, rw, ow, sr)
        if gh * gw == 0:
            continue
        y0, y1i, wy0, wy1, vy = _bilinear_taps(ys, h)  # (oh, gh)
        x0, x1i, wx0, wx1, vx = _bilinear_taps(xs_, w)  # (ow, gw)
        img = x64[b]
        # (C, oh, gh, ow, gw) per corner: weight * value, zero for samples outside the image
        terms = []
        for yi, wy in ((y0, wy0), (y1i, wy1)):
            for xi, wx in ((x0, wx0), (x1i, wx1)):
                v = img[:, yi[:, :, None, None], xi[None, None, :, :]]
                wt = (wy * vy)[:, :, None, None] * (wx * vx)[None, None, :, :]
                terms.append(v * wt)
        if attrs["mode"] == "avg":
            out[r] = sum(terms).sum(axis=(2, 4)) / (gh * gw)
        else:
            out[r] = np.maximum.reduce(terms).max(axis=(2, 4))
    return [out.astype(data.dtype)]


register_op(
    "roi_align",
    attrs={"output_height": ("int", 1), "output_width": ("int", 1), "sampling_ratio": ("int", REQUIRED),
           "max_grid": ("ints", (0, 0)), "spatial_scale": ("float", 1.0), "mode": ("str", "avg"),
           "half_pixel": ("bool", True)},
    type_rel=_roi_align_rel, pattern=OpPattern.OPAQUE, ref=_roi_align_ref, num_inputs=3,
    inputs=("data", "rois", "batch_indices"),
    doc="ONNX RoiAlign on NCHW data: rois (R, 4) as (x1, y1, x2, y2), batch_indices (R,) -> "
        "(R, C, output_height, output_width); bilinear samples averaged (mode avg) or maxed "
        "(mode max, of the weighted corners, as ONNX Runtime); sampling_ratio 0 = adaptive "
        "ceil(roi_size / output_size) samples per bin, of which the kernel visits at most "
        "max_grid (h, w) from the first one in the image (2 * size + 7 covers any box)")
