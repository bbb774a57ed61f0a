"""``resize2d`` (NCHW): nearest (four rounding modes) and bilinear, ONNX coordinate modes.

Source coordinates are computed in float64, exactly like the reference, so that rounding
decisions at exact half-pixel ties agree; the interpolation itself runs in float32 (float64
for float64 data).
"""

from __future__ import annotations

from typing import Any

from .. import te
from .registry import register_compute
from .util import TAG_INJECTIVE, compute_dtype

__all__ = ["resize2d", "source_coord"]


def source_coord(x: Any, in_len: int, out_len: int, scale: float, mode: str) -> Any:
    """Output index (int expr) → fractional input coordinate (float64 expr)."""
    f = te.cast(x, "float64")
    c = lambda v: te.const(v, "float64")  # noqa: E731
    if mode == "half_pixel":
        return (f + c(0.5)) / c(scale) - c(0.5)
    if mode == "half_pixel_symmetric":
        adj = out_len / (scale * in_len)
        center = in_len / 2.0
        return c(center * (1.0 - adj)) + (f + c(0.5)) / c(scale) - c(0.5)
    if mode == "pytorch_half_pixel":
        return (f + c(0.5)) / c(scale) - c(0.5) if out_len > 1 else c(0.0)
    if mode == "align_corners":
        # same operation order as the reference: x * (in - 1) / (out - 1)
        return f * c(float(in_len - 1)) / c(float(out_len - 1)) if out_len > 1 else c(0.0)
    if mode == "asymmetric":
        return f / c(scale)
    if mode == "tf_half_pixel_for_nn":
        return (f + c(0.5)) / c(scale)
    raise ValueError(f"unsupported coordinate_transformation_mode {mode!r}")


def _nearest(xo: Any, in_len: int, mode: str) -> Any:
    c = lambda v: te.const(v, "float64")  # noqa: E731
    if mode == "round_prefer_floor":
        idx = te.ceil(xo - c(0.5))
    elif mode == "round_prefer_ceil":
        idx = te.floor(xo + c(0.5))
    elif mode == "floor":
        idx = te.floor(xo)
    else:
        idx = te.ceil(xo)
    idx = te.minimum(te.maximum(idx, c(0.0)), c(float(in_len - 1)))
    return te.cast(idx, "int32")


def resize2d(data: te.Tensor, size: tuple[int, int], scales: tuple[float, float], method: str = "nearest",
             coord_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor") -> te.Tensor:
    """Resize the two trailing dims of NCHW ``data`` to ``size``."""
    n, ch, h, w = data.shape
    oh, ow = size
    sy, sx = scales
    if method == "nearest":
        def body(b: Any, c: Any, y: Any, x: Any) -> Any:
            iy = _nearest(source_coord(y, h, oh, sy, coord_mode), h, nearest_mode)
            ix = _nearest(source_coord(x, w, ow, sx, coord_mode), w, nearest_mode)
            return data[b, c, iy, ix]

        return te.compute((n, ch, oh, ow), body, name="resize2d", tag=TAG_INJECTIVE)
    cd = compute_dtype(data.dtype)

    def taps(coord: Any, length: int) -> tuple[Any, Any, Any]:
        cc = te.minimum(te.maximum(coord, te.const(0.0, "float64")), te.const(float(length - 1), "float64"))
        f0 = te.floor(cc)
        i0 = te.cast(f0, "int32")
        i1 = te.minimum(i0 + 1, te.const(length - 1))
        return i0, i1, te.cast(cc - f0, cd)

    def lbody(b: Any, c: Any, y: Any, x: Any) -> Any:
        y0, y1, fy = taps(source_coord(y, h, oh, sy, coord_mode), h)
        x0, x1, fx = taps(source_coord(x, w, ow, sx, coord_mode), w)
        one = te.const(1.0, cd)
        ld = lambda yy, xx: te.cast(data[b, c, yy, xx], cd)  # noqa: E731
        top = ld(y0, x0) * (one - fy) + ld(y1, x0) * fy
        bot = ld(y0, x1) * (one - fy) + ld(y1, x1) * fy
        return te.cast(top * (one - fx) + bot * fx, data.dtype)

    return te.compute((n, ch, oh, ow), lbody, name="resize2d", tag=TAG_INJECTIVE)


@register_compute("resize2d")
def _resize2d(attrs: dict, inputs: list, out_types: list) -> list:
    return [resize2d(inputs[0], tuple(attrs["size"]), tuple(attrs["scales"]), attrs.get("method", "nearest"),
                     attrs.get("coordinate_transformation_mode", "half_pixel"),
                     attrs.get("nearest_mode", "round_prefer_floor"))]
