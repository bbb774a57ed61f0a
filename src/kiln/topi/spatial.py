"""Computes: spatial sampling (``grid_sample``).

The kernel follows :func:`kiln.ir.ops.spatial.grid_sample_ref` operation by operation: the
denormalised source coordinate is computed in the float type of the reference (float32, float64
for float64 data or grid) so that nearest rounding and tap selection agree at exact ties. A
first, materialised stage holds every output position's per-axis tap indices (padding rule
applied) and weights; the output stage reads the 1 (nearest), 2**k (linear) or 4**k (cubic) taps
of every channel and sums them.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

from .. import te
from .registry import register_compute
from .util import TAG_INJECTIVE, load

__all__ = ["grid_sample"]


def _reflect(v: Any, lo: float, hi: float, dt: str) -> Any:
    """Reflect float expression ``v`` at ``lo``/``hi`` until it lies in ``[lo, hi]``."""
    c = lambda x: te.const(x, dt)  # noqa: E731
    rng = hi - lo
    if rng <= 0:
        return c(lo)

    def fold(dx: Any, near: float, far: float, sign: float) -> Any:
        # dx >= 0 past the ``near`` border; odd numbers of folds end at the far border
        n = te.floor(dx / c(rng))
        r = dx - n * c(rng)
        odd = (n - c(2.0) * te.floor(n * c(0.5))) > c(0.5)
        return te.if_then_else(odd, c(far) - c(sign) * r, c(near) + c(sign) * r)

    below = fold(c(lo) - v, lo, hi, 1.0)
    above = fold(v - c(hi), hi, lo, -1.0)
    return te.if_then_else(v < c(lo), below, te.if_then_else(v > c(hi), above, v))


def _cubic_weights(t: Any, dt: str, a: float = -0.75) -> list[Any]:
    c = lambda x: te.const(x, dt)  # noqa: E731

    def near(d: Any) -> Any:
        return (c(a + 2) * d - c(a + 3)) * d * d + c(1.0)

    def far(d: Any) -> Any:
        return ((c(a) * d - c(5 * a)) * d + c(8 * a)) * d - c(4 * a)

    one = c(1.0)
    return [far(t + one), near(t), near(one - t), far(c(2.0) - t)]


def grid_sample(data: te.Tensor, grid: te.Tensor, mode: str = "linear", padding_mode: str = "zeros",
                align_corners: bool = False) -> te.Tensor:
    """ONNX GridSample of ``data`` (N, C, D1..Dk) at ``grid`` (N, O1..Om, k).

    Parameters
    ----------
    data, grid : te.Tensor
        Input and sampling grid (normalised coordinates, innermost axis first).
    mode : str
        ``linear``, ``nearest`` or ``cubic`` (Keys, a = -0.75).
    padding_mode : str
        ``zeros``, ``border`` or ``reflection``.
    align_corners : bool
        Whether -1 and 1 address the centres (True) or the outer edges (False) of the corner pixels.

    Returns
    -------
    te.Tensor
        (N, C, O1..Om), data's dtype.
    """
    k = len(data.shape) - 2
    dims = [int(d) for d in data.shape[2:]]
    out_sp = tuple(int(d) for d in grid.shape[1:-1])
    cdt = "float64" if "float64" in (data.dtype, grid.dtype) else "float32"
    c = lambda x: te.const(x, cdt)  # noqa: E731
    nearest = mode == "nearest"

    ntaps = 1 if nearest else (2 if mode == "linear" else 4)

    def axis_taps(v: Any, i: int) -> list[tuple[Any, Any]]:
        """[(index in [0, n), weight)] of grid coordinate ``v`` along data axis ``i``."""
        n = dims[i]
        if align_corners:
            pos = (v + c(1.0)) / c(2.0) * c(float(n - 1))
        else:
            pos = ((v + c(1.0)) * c(float(n)) - c(1.0)) / c(2.0)
        if nearest:
            pos = te.round(pos)
        lo, hi = (0.0, n - 1.0) if align_corners else (-0.5, n - 0.5)
        if padding_mode == "border" and mode != "cubic":  # cubic clamps taps only (see the reference)
            # only coordinates outside [lo, hi] move (not the same as a clamp for cubic taps)
            clamped = te.minimum(te.maximum(pos, c(0.0)), c(float(n - 1)))
            pos = te.if_then_else(te.any(pos < c(lo), pos > c(hi)), clamped, pos)
        elif padding_mode == "reflection":
            pos = _reflect(pos, lo, hi, cdt)
        if nearest:
            base, offsets, weights = pos, [0], [c(1.0)]
        else:
            base = te.floor(pos)
            t = pos - base
            if mode == "linear":
                offsets, weights = [0, 1], [c(1.0) - t, t]
            else:
                offsets, weights = [-1, 0, 1, 2], _cubic_weights(t, cdt)
        # Clamped before the int cast so that far-away (or huge) coordinates cannot overflow;
        # every tap of a clamped coordinate is still out of range, as it was before.
        ib = te.cast(te.minimum(te.maximum(base, c(-4.0)), c(float(n + 3))), "int32")
        zero, last = te.const(0, "int32"), te.const(n - 1, "int32")
        taps = []
        for off, w in zip(offsets, weights):
            idx = ib + te.const(off, "int32") if off else ib
            if padding_mode == "zeros":  # an outside tap reads pixel 0 with weight 0
                w = te.if_then_else(te.all(idx >= zero, idx <= last), w, c(0.0))
            elif padding_mode == "reflection":
                idx = te.cast(_reflect(te.cast(idx, cdt), lo, hi, cdt), "int32")
            taps.append((te.minimum(te.maximum(idx, zero), last), w))
        return taps

    def taps_body(nb: Any, *rest: Any) -> Any:
        # rest = (*p, axis, tap, field): field 0 = source index (exact in float), 1 = weight
        p, ax, tap, field = rest[:-3], rest[-3], rest[-2], rest[-1]
        val = c(0.0)
        for i in reversed(range(k)):
            taps = axis_taps(te.cast(load(grid, [nb, *p, k - 1 - i]), cdt), i)
            sel = c(0.0)
            for t in reversed(range(ntaps)):
                idx, w = taps[t]
                cell = te.if_then_else(te.equal(field, 0), te.cast(idx, cdt), w)
                sel = cell if t == ntaps - 1 else te.if_then_else(te.equal(tap, t), cell, sel)
            val = sel if i == k - 1 else te.if_then_else(te.equal(ax, i), sel, val)
        return val

    n_b = int(data.shape[0])
    # The coordinates, taps and weights depend on (n, p) only: computed once for all channels
    # in their own (materialised) stage instead of once per channel and per tap combination.
    tw = cast(te.Tensor, te.compute((n_b,) + out_sp + (k, ntaps, 2), taps_body, name="grid_sample_taps",
                                    tag="grid_sample_taps"))

    def body(nb: Any, ch: Any, *p: Any) -> Any:
        acc = None
        for combo in itertools.product(range(ntaps), repeat=k):
            idxs = [te.cast(load(tw, [nb, *p, i, t, 0]), "int32") for i, t in enumerate(combo)]
            w = load(tw, [nb, *p, 0, combo[0], 1])
            for i in range(1, k):
                w = w * load(tw, [nb, *p, i, combo[i], 1])
            if nearest:  # a pure gather: exact for every dtype
                return te.if_then_else(w > c(0.0), load(data, [nb, ch, *idxs]), te.const(0, data.dtype))
            val = te.cast(load(data, [nb, ch, *idxs]), cdt) * w
            acc = val if acc is None else acc + val
        return te.cast(acc, data.dtype)

    shape = (n_b, int(data.shape[1])) + out_sp
    return cast(te.Tensor, te.compute(shape, body, name="grid_sample", tag=TAG_INJECTIVE))


@register_compute("grid_sample")
def _grid_sample(attrs: dict, inputs: list, out_types: list) -> list:
    return [grid_sample(inputs[0], inputs[1], attrs.get("mode", "linear"), attrs.get("padding_mode", "zeros"),
                        bool(attrs.get("align_corners", False)))]
