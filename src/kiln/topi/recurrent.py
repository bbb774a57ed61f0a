"""Computes and schedules: Recurrent and volumetric ops (RNN, GRU, LSTM, 3-D convolution and pooling, RoiAlign).

RNN / GRU / LSTM and 3-D convolution and pooling are lowered by the ONNX frontend onto existing
kernels (dense, conv2d, pool2d, elementwise); the only compute of its own here is ``roi_align``.
"""

from __future__ import annotations

from typing import Any, cast

from .. import te
from .registry import register_compute
from .transform import data_index
from .util import TAG_ELEMWISE, compute_dtype

__all__ = ["roi_align"]

#: Tag of roi_align's per-box lookup tables (not injective: each is its own small stage, never
#: inlined into the per-channel loop).
TAG_ROI_TABLE = "roi_align_table"
#: Cap of an adaptive grid's size (per axis) in the kernel's integer arithmetic.
_MAX_GRID = float(1 << 24)


def roi_align(data: te.Tensor, rois: te.Tensor, batch_indices: te.Tensor, output_size: tuple[int, int],
              sampling_ratio: int, max_grid: tuple[int, int], spatial_scale: float, mode: str,
              half_pixel: bool) -> te.Tensor:
    """ONNX RoiAlign: bilinear samples of each RoI's bins, averaged or maxed.

    Parameters
    ----------
    data : te.Tensor
        (N, C, H, W) feature map.
    rois : te.Tensor
        (R, 4) boxes ``(x1, y1, x2, y2)`` in input coordinates (times ``spatial_scale``).
    batch_indices : te.Tensor
        (R,) image of each box; out of range is a run-time error of the kernel.
    output_size : tuple of int
        (output_height, output_width).
    sampling_ratio : int
        Samples per bin along each axis; 0: ``ceil(roi_size / output_size)`` per RoI.
    max_grid : tuple of int
        Adaptive grids: the reduction extent (h, w), at least the number of a bin's samples
        that can fall in the image (see :func:`kiln.ir.ops.recurrent.roi_align_grid_bound`; samples before the image
        are skipped, later ones masked). Unused when ``sampling_ratio > 0``.
    spatial_scale : float
        Scale of the box coordinates.
    mode : str
        ``"avg"`` or ``"max"`` (the maximum of the weighted corner values, as ONNX Runtime).
    half_pixel : bool
        Shift the box by -0.5 (``coordinate_transformation_mode="half_pixel"``); when False,
        boxes are at least 1 x 1.

    Returns
    -------
    te.Tensor
        (R, C, output_height, output_width) in the data dtype.

    Notes
    -----
    Sample coordinates are clamped before they become indices, so every load is in bounds
    whatever the box values (NaN and infinities included); samples outside ``[-1, size]``
    contribute 0, as in ONNX Runtime.
    """
    n, ch, h, w = (int(d) for d in data.shape)
    num = int(rois.shape[0])
    oh, ow = output_size
    cd = compute_dtype(data.dtype)
    adaptive = sampling_ratio <= 0
    gh_max, gw_max = max_grid if adaptive else (sampling_ratio, sampling_ratio)

    def c(v: float) -> Any:
        return te.const(float(v), cd)

    def geometry(r: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
        """(y1, x1, bin_h, bin_w, grid_h, grid_w) of RoI ``r``: floats, then int32 grid sizes."""
        off = c(0.5 if half_pixel else 0.0)
        x1, y1, x2, y2 = (te.cast(rois[r, k], cd) * c(spatial_scale) - off for k in range(4))
        rw, rh = x2 - x1, y2 - y1
        if not half_pixel:
            rw, rh = te.maximum(rw, c(1.0)), te.maximum(rh, c(1.0))
        bh, bw = rh / c(oh), rw / c(ow)
        if adaptive:
            # ceil(size / out), clamped in float (NaN and huge boxes never reach a cast)
            gh = te.if_then_else(bh > c(0.0), te.cast(te.ceil(te.minimum(bh, c(_MAX_GRID))), "int32"), te.const(0))
            gw = te.if_then_else(bw > c(0.0), te.cast(te.ceil(te.minimum(bw, c(_MAX_GRID))), "int32"), te.const(0))
        else:
            gh = gw = te.const(sampling_ratio)
        return y1, x1, bh, bw, gh, gw

    def taps(coord: Any, size: int) -> tuple[Any, Any, Any, Any, Any]:
        """Low / high index, their weights and the in-range flag of one sample coordinate."""
        valid = te.all(coord >= c(-1.0), coord <= c(size))
        cc = te.minimum(te.if_then_else(coord > c(0.0), coord, c(0.0)), c(size - 1))
        lo = te.cast(te.floor(cc), "int32")
        edge = lo >= size - 1
        hi = te.if_then_else(edge, lo, lo + 1)
        frac = te.if_then_else(edge, c(0.0), cc - te.cast(lo, cd))
        return lo, hi, c(1.0) - frac, frac, valid

    ry = te.reduce_axis((0, gh_max), name="ry")
    rx = te.reduce_axis((0, gw_max), name="rx")

    def first_sample(start: Any, step: Any) -> Any:
        """Adaptive grids: a sample index at or before the first one at ``>= -1`` (in the image).

        The samples before it lie outside the image and contribute 0, so the reduction starts
        there; it runs 2 early for rounding, and the samples after the image are masked.
        """
        if not adaptive:
            return te.const(0)
        v = (c(-1.0) - start) / step - c(0.5)
        v = te.if_then_else(v > c(0.0), te.minimum(v, c(_MAX_GRID)), c(0.0))
        return te.maximum(te.cast(te.floor(v), "int32") - 2, te.const(0))

    def bin_start(r: Any, py: Any, px: Any) -> tuple[Any, ...]:
        """The bin's corner (y, x), sample steps (y, x), first visited samples, grid sizes."""
        y1, x1, bh, bw, gh, gw = geometry(r)
        ghf = te.cast(te.maximum(gh, te.const(1)), cd)
        gwf = te.cast(te.maximum(gw, te.const(1)), cd)
        ys, xs = y1 + te.cast(py, cd) * bh, x1 + te.cast(px, cd) * bw
        return ys, xs, bh / ghf, bw / gwf, first_sample(ys, bh / ghf), first_sample(xs, bw / gwf), gh, gw

    # Everything but the four data reads depends on the box, the bin and the sample only, not
    # on the channel: the taps, weights and in-range flags of a bin's sample rows (and columns)
    # are computed once per box into small tables (ONNX Runtime's pre-calculation) instead of
    # once per channel. Faster R-CNN's box head, 150 boxes x 256 channels x 7 x 7 bins of a
    # 10 x 10 map, sampling ratio 2: 29.3 -> 17.0 ms (ONNX Runtime 13.1 ms; a one-node graph,
    # ``bench/bench_ab.py`` of the two trees, ``llvm -mcpu=native``, Zen 5, 1 thread).
    def axis_table(length: int, grid: int, axis: int, size: int) -> list[Any]:
        """Per (box, bin, sample) along rows (``axis`` 0) or columns: [lo, hi, w_lo, w_hi, valid]."""
        def coord(r: Any, p: Any, g: Any) -> Any:
            ys, xs, sy, sx, iy0, ix0, _, _ = bin_start(r, p, p)
            start, step, first = (ys, sy, iy0) if axis == 0 else (xs, sx, ix0)
            # ONNX Runtime's expression for the sample position, so the coordinates round alike
            return start + (te.cast(first + g, cd) + c(0.5)) * step

        tag = "yx"[axis]
        shape = (num, length, grid)
        parts = []
        for q, what in enumerate(("lo", "hi", "wlo", "whi", "ok")):
            def fn(r: Any, p: Any, g: Any, q: Any = q) -> Any:
                v = taps(coord(r, p, g), size)[q]
                return te.cast(v, "int32") if q == 4 else v
            parts.append(te.compute(shape, fn, name=f"roi_{tag}_{what}", tag=TAG_ROI_TABLE))
        return parts

    ty = axis_table(oh, gh_max, 0, h)
    tx = axis_table(ow, gw_max, 1, w)

    def per_bin(length: int, fn: Any, name: str) -> Any:
        return te.compute((num, length), fn, name=name, tag=TAG_ROI_TABLE)

    # adaptive grids: the first visited sample and the grid size per box and bin row / column
    first_y = per_bin(oh, lambda r, p: bin_start(r, p, p)[4], "roi_y_first")
    first_x = per_bin(ow, lambda r, p: bin_start(r, p, p)[5], "roi_x_first")
    grid_y = te.compute((num,), lambda r: geometry(r)[4], name="roi_grid_y", tag=TAG_ROI_TABLE)
    grid_x = te.compute((num,), lambda r: geometry(r)[5], name="roi_grid_x", tag=TAG_ROI_TABLE)

    def body(r: Any, k: Any, py: Any, px: Any) -> Any:
        b = data_index(batch_indices[r], data, 0, "roi_align")
        y0, y1i, wy0, wy1, vy = (t[r, py, ry] for t in ty)
        x0, x1i, wx0, wx1, vx = (t[r, px, rx] for t in tx)
        terms = [wy * wx * te.cast(data[b, k, yi, xi], cd)
                 for yi, wy in ((y0, wy0), (y1i, wy1)) for xi, wx in ((x0, wx0), (x1i, wx1))]
        ok = te.all(vy > 0, vx > 0)
        if mode == "avg":
            val = te.if_then_else(ok, terms[0] + terms[1] + terms[2] + terms[3], c(0.0))
        else:
            val = te.if_then_else(ok, te.maximum(te.maximum(terms[0], terms[1]), te.maximum(terms[2], terms[3])),
                                  c(0.0))
        # in the form ``ry < bound``, which the lowering turns into the loop's extent
        inside = te.all(ry < grid_y[r] - first_y[r, py], rx < grid_x[r] - first_x[r, px]) if adaptive else None
        if mode == "avg":
            return te.sum(val, axis=[ry, rx], where=inside)
        return te.reduce_max(val, axis=[ry, rx], where=inside)

    red = cast(te.Tensor, te.compute((num, ch, oh, ow), body, name=f"roi_align_{mode}"))

    def fin(r: Any, k: Any, py: Any, px: Any) -> Any:
        gh, gw = grid_y[r], grid_x[r]
        iy0, ix0 = first_y[r, py], first_x[r, px]
        cnt = te.cast(gh, cd) * te.cast(gw, cd)  # in float: a huge box's grid overflows int32
        v = red[r, k, py, px]
        if mode == "avg":
            v = v / te.maximum(cnt, c(1.0))
        else:
            if adaptive:
                # Samples the reduction skipped lie outside the image, and each counts as 0.
                skipped = te.any(iy0 > 0, ix0 > 0, gh - iy0 > gh_max, gw - ix0 > gw_max)
                v = te.if_then_else(skipped, te.maximum(v, c(0.0)), v)
            # no sample at all (an empty adaptive grid): 0 as ONNX Runtime, not the max identity
            v = te.if_then_else(cnt > c(0.0), v, c(0.0))
        return te.cast(v, data.dtype)

    return cast(te.Tensor, te.compute((num, ch, oh, ow), fin, name="roi_align", tag=TAG_ELEMWISE))


@register_compute("roi_align")
def _roi_align(attrs: dict, inputs: list, out_types: list) -> list:
    return [roi_align(inputs[0], inputs[1], inputs[2], (int(attrs["output_height"]), int(attrs["output_width"])),
                      int(attrs["sampling_ratio"]), (int(attrs["max_grid"][0]), int(attrs["max_grid"][1])),
                      float(attrs["spatial_scale"]),
                      attrs["mode"], bool(attrs["half_pixel"]))]
