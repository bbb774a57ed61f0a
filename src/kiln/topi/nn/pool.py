"""2-D max / average pooling (NCHW) with padding, dilation and ceil_mode.

Padded and ceil_mode-overhang cells are skipped through bounds conditions rather than a
padded copy, so max pooling never lets padding win and averages divide by a count computed
in closed form (no second reduction). With a dynamic H or W the conditions and the count
use the input's runtime extent, so the stale storage past a smaller image never counts.
"""

from __future__ import annotations

from typing import Any

from ... import te
from ...tir.dtype import is_float, is_int
from ..registry import register_compute
from ..util import TAG_ELEMWISE, acc_dtype
from .conv2d import spatial_extents

__all__ = ["pool2d", "pool_out_size", "TAG_POOL"]

TAG_POOL = "pool2d"


def pool_out_size(n: int, k: int, s: int, p0: int, p1: int, d: int, ceil: bool) -> int:
    """Output length along one dim (ONNX/PyTorch ceil_mode rule: no window starts in the end padding)."""
    eff = (k - 1) * d + 1
    span = n + p0 + p1 - eff
    if not ceil:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + p0:
        out -= 1
    return out


def _count(o: Any, s: int, p0: int, k: int, d: int, lo: int, hi: Any) -> Any:
    """Number of taps ``t`` in ``[0, k)`` with ``lo <= o*s - p0 + t*d < hi`` (closed form;
    ``hi`` may be an expression of a runtime extent)."""
    start = o * s - p0
    # first tap >= lo: ceil((lo - start) / d), at least 0
    first = te.maximum(te.const(0) - te.floordiv(start - lo, d), te.const(0))
    # last tap < hi: floor((hi - 1 - start) / d), at most k - 1
    top = te.const(hi - 1) if isinstance(hi, int) else hi - 1
    last = te.minimum(te.floordiv(top - start, d), te.const(k - 1))
    return te.maximum(last - first + 1, te.const(0))


def pool2d(data: te.Tensor, kind: str, pool_size: tuple[int, int], strides: tuple[int, int],
           padding: tuple[int, int, int, int], dilation: tuple[int, int], ceil_mode: bool,
           count_include_pad: bool = False) -> te.Tensor:
    """Max (``kind="max"``) or average (``"avg"``) pooling."""
    n, c, h, w = data.shape
    kh, kw = pool_size
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    oh = pool_out_size(h, kh, sh, pt, pb, dh, ceil_mode)
    ow = pool_out_size(w, kw, sw, pl, pr, dw, ceil_mode)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    dt = data.dtype
    # dynamic H / W: the padding (and the ceil_mode overhang) starts at the runtime extent
    hr, wr = spatial_extents(data)

    def window(b: Any, ch: Any, y: Any, x: Any) -> tuple[Any, Any]:
        iy = y * sh - pt + ry * dh
        ix = x * sw - pl + rx * dw
        return data[b, ch, iy, ix], te.all(iy >= 0, iy < hr, ix >= 0, ix < wr)

    if kind == "max":
        def body(b: Any, ch: Any, y: Any, x: Any) -> Any:
            v, ok = window(b, ch, y, x)
            return te.reduce_max(v, axis=[ry, rx], where=ok)

        return te.compute((n, c, oh, ow), body, name="max_pool2d", tag=TAG_POOL, attrs={"kind": "max"})

    acc = acc_dtype(dt) if is_float(dt) else ("int64" if is_int(dt) else "uint64")

    def sbody(b: Any, ch: Any, y: Any, x: Any) -> Any:
        v, ok = window(b, ch, y, x)
        return te.sum(te.cast(v, acc), axis=[ry, rx], where=ok)

    total = te.compute((n, c, oh, ow), sbody, name="avg_pool2d_sum", tag=TAG_POOL, attrs={"kind": "avg"})
    lo_h, hi_h = (-pt, hr + pb) if count_include_pad else (0, hr)
    lo_w, hi_w = (-pl, wr + pr) if count_include_pad else (0, wr)
    fdt = acc if is_float(acc) else "float64"

    def fin(b: Any, ch: Any, y: Any, x: Any) -> Any:
        cnt = _count(y, sh, pt, kh, dh, lo_h, hi_h) * _count(x, sw, pl, kw, dw, lo_w, hi_w)
        cnt = te.maximum(cnt, te.const(1))
        return te.cast(te.cast(total[b, ch, y, x], fdt) / te.cast(cnt, fdt), dt)

    return te.compute((n, c, oh, ow), fin, name="avg_pool2d", tag=TAG_ELEMWISE)


@register_compute("max_pool2d")
def _max_pool2d(attrs: dict, inputs: list, out_types: list) -> list:
    return [pool2d(inputs[0], "max", tuple(attrs["pool_size"]), tuple(attrs["strides"]), tuple(attrs["padding"]),
                   tuple(attrs["dilation"]), bool(attrs["ceil_mode"]))]


@register_compute("avg_pool2d")
def _avg_pool2d(attrs: dict, inputs: list, out_types: list) -> list:
    return [pool2d(inputs[0], "avg", tuple(attrs["pool_size"]), tuple(attrs["strides"]), tuple(attrs["padding"]),
                   tuple(attrs["dilation"]), bool(attrs["ceil_mode"]), bool(attrs["count_include_pad"]))]

