"""``resize2d`` (NCHW): nearest (four rounding modes) and bilinear, ONNX coordinate modes.

Source coordinates are computed in float64, exactly like the reference, so that rounding
decisions at exact half-pixel ties agree; the interpolation itself runs in float32 (float64
for float64 data).

On CPU targets the per-column and per-row source indices and weights are computed once into
small tables (stages tagged :data:`TAG_TABLE`, which schedules keep materialised) instead of
once per output element: the float64 coordinate math per element made DeepLabV3's 21-channel
upsample to 224x224 cost 4.2 ns per output element (4.4 ms) on Zen 3; 1.40 ms against 0.87 ms
with tables on Zen 5 (``bench/bench_resize.py --cases deeplab --variants untabled,fused``).

A static bilinear upsample in H is separable (:func:`_separable_linear`): each input row is
interpolated to the output width once, then output rows are lerps of two such rows, read
contiguously; the fused form's four gathered reads per output cost DeepLabV3's upsample
[1, 21, 14, 14] -> 224 x 224 861-938 us on Zen 5 (AVX-512, 1 thread), the two passes 45-49 us
(``python bench/bench_resize.py --threads 1``; three runs on a shared machine).

A dynamic H or W (``docs/dynamic_shapes.md``) resizes by its rational scale: the output's
runtime extent is ``(p * n) // q``, source indices clamp to the input's runtime extent (never
into the padding), and the coordinate modes that read the lengths compute them at run time.
A resize to runtime sizes (the ``sym_size`` attribute: ONNX ``sizes`` computed from shapes,
DeepLabV3's upsamples back to the feature map and the image) reads its output's runtime
extents from the output's DLTensor and computes each scale ``out / in`` at run time; it keeps
the fused form (per-column tables, four gathered reads per output).
"""

from __future__ import annotations

from typing import Any, cast

from .. import te
from ..ir.sym_rules import scale_fraction
from ..runtime.errors import CompileError, TargetError
from ..target import isa_of
from .knobs import current_kernel_target, output_dyn
from .registry import register_compute
from .nn.conv2d import spatial_dyn_attrs, spatial_extents
from .util import TAG_INJECTIVE, compute_dtype

__all__ = ["resize2d", "source_coord", "TAG_TABLE", "TAG_ROWS", "PHASE_ATTR"]

#: Tag of a per-axis lookup table (not injective: kept as its own small stage, never inlined).
TAG_TABLE = "resize_table"
#: Tag of the horizontal pass of a separable bilinear resize (:func:`resize2d`): the input rows
#: interpolated to the output width, kept as a stage of its own (never inlined) that a CPU
#: schedule computes per channel.
TAG_ROWS = "resize_rows"
#: Attribute of a :data:`TAG_ROWS` stage whose width grows by a whole factor: that factor
#: (output columns ``xo * s .. xo * s + s - 1`` read source columns ``xo - 1 .. xo + 1`` only).
PHASE_ATTR = "resize_phase"


def _use_tables() -> bool:
    """Tables on CPU targets (and with no target); GPU kernels compute per thread."""
    target = current_kernel_target()
    if target is None:
        return True
    try:
        isa_of(target)
    except TargetError:
        return False
    return True


def _per_axis(length: int, fn: Any, name: str, tables: bool) -> Any:
    """``fn(i)`` for an output index: a lookup into a table of ``length`` entries, or inline."""
    if not tables:
        return fn
    t = te.compute((length,), fn, name=name, tag=TAG_TABLE)
    return lambda i: t[i]


def _dyn_source_coord(f: Any, in_len: Any, out_len: Any, scale: float | None, mode: str) -> Any:
    """:func:`source_coord` for runtime lengths (int expressions of a runtime extent), and for a
    runtime scale (``scale`` None: ``out_len / in_len``, a resize to runtime sizes)."""
    c = lambda v: te.const(v, "float64")  # noqa: E731
    fin, fout = te.cast(in_len, "float64"), te.cast(out_len, "float64")
    # the static path's scale is n / in computed in float64 too: the same value at equal sizes
    sc = fout / fin if scale is None else c(scale)
    if mode == "half_pixel":
        return (f + c(0.5)) / sc - c(0.5)
    if mode == "half_pixel_symmetric":
        adj = fout / (sc * fin)
        return fin / c(2.0) * (c(1.0) - adj) + (f + c(0.5)) / sc - c(0.5)
    if mode == "pytorch_half_pixel":
        return te.if_then_else(out_len > 1, (f + c(0.5)) / sc - c(0.5), c(0.0))
    if mode == "align_corners":
        return te.if_then_else(out_len > 1, f * (fin - c(1.0)) / (fout - c(1.0)), c(0.0))
    if mode == "asymmetric":
        return f / sc
    if mode == "tf_half_pixel_for_nn":
        return (f + c(0.5)) / sc
    raise ValueError(f"unsupported coordinate_transformation_mode {mode!r}")


def source_coord(x: Any, in_len: Any, out_len: Any, scale: float | None, mode: str) -> Any:
    """Output index (int expr) → fractional input coordinate (float64 expr).

    ``in_len`` and ``out_len`` are ints, or int expressions of a dynamic axis's runtime
    extent (the modes that read them then compute in float64 at run time). ``scale`` None:
    the scale is ``out_len / in_len``, computed at run time (a resize to runtime sizes)."""
    f = te.cast(x, "float64")
    c = lambda v: te.const(v, "float64")  # noqa: E731
    if scale is None or not (isinstance(in_len, int) and isinstance(out_len, int)) and mode in (
            "half_pixel_symmetric", "pytorch_half_pixel", "align_corners"):
        return _dyn_source_coord(f, in_len, out_len, scale, mode)
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


def _last(length: Any) -> Any:
    """``length - 1`` as a float64 expression (``length`` an int or a runtime extent)."""
    if isinstance(length, int):
        return te.const(float(length - 1), "float64")
    return te.cast(length - 1, "float64")


def _nearest(xo: Any, in_len: Any, mode: str) -> Any:
    c = lambda v: te.const(v, "float64")  # noqa: E731
    if mode == "round_prefer_floor":
        idx = te.ceil(xo - c(0.5))
    elif mode == "round_prefer_ceil":
        idx = te.floor(xo + c(0.5))
    elif mode == "floor":
        idx = te.floor(xo)
    else:
        idx = te.ceil(xo)
    idx = te.minimum(te.maximum(idx, c(0.0)), _last(in_len))
    return te.cast(idx, "int32")


def resize2d(data: te.Tensor, size: tuple[int, int], scales: tuple[float, float], method: str = "nearest",
             coord_mode: str = "half_pixel", nearest_mode: str = "round_prefer_floor",
             out_extents: tuple[Any, Any] | None = None) -> te.Tensor:
    """Resize the two trailing dims of NCHW ``data`` to ``size``.

    ``out_extents``: a resize to runtime sizes (ONNX Resize given ``sizes`` computed from
    shapes): the output's runtime (H, W), each a Var or an int, with ``size`` their upper
    bounds; each axis's scale is then ``out / in`` at run time and ``scales`` is not read.
    """
    n, ch, h, w = data.shape
    oh, ow = size
    tables = _use_tables()
    # A dynamic H / W: coordinates clamp to the runtime extent (never into the padding), and
    # the output's runtime extent is floor(n * scale) = (p * n) // q, the symbolic rule's.
    hr, wr = spatial_extents(data)
    sy: float | None
    sx: float | None
    if out_extents is None:
        sy, sx = scales
        ohr, owr = _out_extent(hr, oh, sy), _out_extent(wr, ow, sx)
    else:
        (ohr, owr), sy, sx = out_extents, None, None
    attrs = spatial_dyn_attrs(data)
    if method == "nearest":
        iy = _per_axis(oh, lambda y: _nearest(source_coord(y, hr, ohr, sy, coord_mode), hr, nearest_mode),
                       "resize_iy", tables)
        ix = _per_axis(ow, lambda x: _nearest(source_coord(x, wr, owr, sx, coord_mode), wr, nearest_mode),
                       "resize_ix", tables)
        return te.compute((n, ch, oh, ow), lambda b, c, y, x: data[b, c, iy(y), ix(x)], name="resize2d",
                          tag=TAG_INJECTIVE, attrs=attrs)
    cd = compute_dtype(data.dtype)

    def clamped(coord: Any, length: Any) -> Any:
        return te.minimum(te.maximum(coord, te.const(0.0, "float64")), _last(length))

    def tap0(coord: Any, length: Any) -> Any:
        return te.cast(te.floor(clamped(coord, length)), "int32")

    def tap1(coord: Any, length: Any) -> Any:
        return te.minimum(tap0(coord, length) + 1, te.const(length - 1) if isinstance(length, int) else length - 1)

    def frac(coord: Any, length: Any) -> Any:
        cc = clamped(coord, length)
        return te.cast(cc - te.floor(cc), cd)

    def axis(length: Any, out_len: int, out_rt: Any, scale: float | None, tag: str) -> tuple[Any, Any, Any]:
        coord = lambda i: source_coord(i, length, out_rt, scale, coord_mode)  # noqa: E731
        return (_per_axis(out_len, lambda i: tap0(coord(i), length), f"resize_{tag}0", tables),
                _per_axis(out_len, lambda i: tap1(coord(i), length), f"resize_{tag}1", tables),
                _per_axis(out_len, lambda i: frac(coord(i), length), f"resize_{tag}w", tables))

    ty0, ty1, tfy = axis(hr, oh, ohr, sy, "y")
    tx0, tx1, tfx = axis(wr, ow, owr, sx, "x")
    one = te.const(1.0, cd)
    if tables and _separable(data, oh):
        if sx is None or any(d is not None for d in (data.dyn or ())):
            # runtime extents: no whole-factor phases (the factor may change with the size),
            # and the table indices clamp to the runtime extents, so the reads are in bounds
            return _separable_linear(data, (oh, ow), (ty0, ty1, tfy), (tx0, tx1, tfx), cd, None,
                                     {"dyn_reads_in_bounds": True})
        return _separable_linear(data, (oh, ow), (ty0, ty1, tfy), (tx0, tx1, tfx), cd,
                                 _phase_weights(w, ow, sx, coord_mode, cd))

    def lbody(b: Any, c: Any, y: Any, x: Any) -> Any:
        y0, y1, fy = ty0(y), ty1(y), tfy(y)
        x0, x1, fx = tx0(x), tx1(x), tfx(x)
        ld = lambda yy, xx: te.cast(data[b, c, yy, xx], cd)  # noqa: E731
        top = ld(y0, x0) * (one - fy) + ld(y1, x0) * fy
        bot = ld(y0, x1) * (one - fy) + ld(y1, x1) * fy
        return te.cast(top * (one - fx) + bot * fx, data.dtype)

    return te.compute((n, ch, oh, ow), lbody, name="resize2d", tag=TAG_INJECTIVE, attrs=attrs)


def _separable(data: te.Tensor, oh: int) -> bool:
    """Whether a bilinear resize of ``data`` to ``oh`` rows takes :func:`_separable_linear`.

    Not for a downscale in H: the horizontal pass runs once per *input* row, which only saves
    work when there are at most as many input rows as output rows (for dynamic extents: at
    the upper bounds). Dynamic H, W or batch run it too, without the whole-factor phases:
    DeepLabV3's upsample of its 21-channel logits from 14 x 14 to 224 x 224 with runtime
    sizes took 1095 us fused (four gathered reads per output), 92 us separable; a static
    build, with the phases, 41 us (``bench/profile_dynamic.py --model deeplabv3``, Zen 5,
    1 thread).
    """
    return isinstance(oh, int) and data.shape[2] <= oh


def _phase_weights(w: Any, ow: int, scale: float, mode: str, cd: str) -> tuple[int, Any, Any, Any] | None:
    """``(s, wa, wb, wc)`` when the width grows by a whole factor ``s``, else None.

    Then (half_pixel and its symmetric and PyTorch forms, asymmetric) output column
    ``x = xo * s + p`` has source coordinate ``xo + g(p)`` with ``-1 <= g(p) < 1``: it
    interpolates columns ``xo - 1, xo, xo + 1`` with weights ``wa[p], wb[p], wc[p]`` (one of
    them zero) that depend on the phase ``p`` only, so a run of ``s`` outputs reads three
    source pixels, each broadcast, instead of gathering two per output. At the borders the
    column indices clamp, which gives the clamped coordinate's value (a lerp of equal pixels).
    DeepLabV3's x16 upsample: 71-75 -> 45-49 us with it; a x2 of [1, 64, 56, 56]: 205-212 ->
    109-113 us (``llvm -mcpu=native``, Zen 5, 1 thread; with the C target and its 2-lane vectors
    that x2 is 7-9% slower, 223-228 -> 239-249 us, still 3.3x faster than the fused form);
    ``python bench/bench_resize.py --threads 1 [--target c]``, columns gathered / separable.
    """
    if not isinstance(w, int) or ow != w * int(scale) or float(int(scale)) != scale or int(scale) < 2 \
            or ow < 2 or mode not in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "asymmetric"):
        return None
    s = int(scale)
    zero, one = te.const(0.0, cd), te.const(1.0, cd)

    def g(p: Any) -> Any:
        return source_coord(p, w, ow, scale, mode)  # unclamped: column xo = 0

    def left(p: Any) -> Any:  # g(p) < 0: the lerp is between columns xo - 1 and xo
        return g(p) < te.const(0.0, "float64")

    def frac(p: Any) -> Any:
        return te.cast(g(p) - te.floor(g(p)), cd)

    wa = _per_axis(s, lambda p: te.if_then_else(left(p), one - frac(p), zero), "resize_wa", True)
    wb = _per_axis(s, lambda p: te.if_then_else(left(p), frac(p), one - frac(p)), "resize_wb", True)
    wc = _per_axis(s, lambda p: te.if_then_else(left(p), zero, frac(p)), "resize_wc", True)
    return s, wa, wb, wc


def _separable_linear(data: te.Tensor, size: tuple[int, int], ytaps: tuple[Any, Any, Any],
                      xtaps: tuple[Any, Any, Any], cd: str,
                      phase: tuple[int, Any, Any, Any] | None = None, dyn_attrs: dict | None = None) -> te.Tensor:
    """Bilinear resize as two passes: input rows to the output width, then rows lerped.

    The fused form reads four source pixels per output element through table indices, which
    the CPU vectorisers can only turn into gathers: 4 per output vector, 0.8 ns per output
    element. Here a horizontal pass (the stage tagged :data:`TAG_ROWS`, ``H * OW`` elements
    per channel) is followed by a vertical pass whose two reads per output are whole rows of
    that stage, so the ``OH * OW`` loop is contiguous vector loads and FMAs. ``phase``
    (:func:`_phase_weights`) makes the horizontal pass gather-free too.
    """
    n, ch, h, w = data.shape
    oh, ow = size
    ty0, ty1, tfy = ytaps
    tx0, tx1, tfx = xtaps
    one = te.const(1.0, cd)

    def ld(b: Any, c: Any, iy: Any, ix: Any) -> Any:
        return te.cast(data[b, c, iy, ix], cd)

    def gathered(b: Any, c: Any, iy: Any, x: Any) -> Any:
        fx = tfx(x)
        return ld(b, c, iy, tx0(x)) * (one - fx) + ld(b, c, iy, tx1(x)) * fx

    attrs: dict[str, Any] = dict(dyn_attrs or {})
    hbody = gathered
    if phase is not None:
        step, wa, wb, wc = phase
        attrs[PHASE_ATTR] = step

        def phased(b: Any, c: Any, iy: Any, x: Any) -> Any:
            xo, p = te.floordiv(x, step), te.floormod(x, step)
            return (ld(b, c, iy, te.maximum(xo - 1, 0)) * wa(p) + ld(b, c, iy, xo) * wb(p)) \
                + ld(b, c, iy, te.minimum(xo + 1, w - 1)) * wc(p)

        hbody = phased

    rows = cast(te.Tensor, te.compute((n, ch, h, ow), hbody, name="resize2d_rows", tag=TAG_ROWS, attrs=attrs))

    def vbody(b: Any, c: Any, y: Any, x: Any) -> Any:
        fy = tfy(y)
        return te.cast(rows[b, c, ty0(y), x] * (one - fy) + rows[b, c, ty1(y), x] * fy, data.dtype)

    return cast(te.Tensor, te.compute((n, ch, oh, ow), vbody, name="resize2d", tag=TAG_INJECTIVE,
                                      attrs=dict(dyn_attrs or {})))


def _out_extent(n: Any, size: int, scale: float) -> Any:
    """The output length of a resize of a length-``n`` axis: ``size`` when ``n`` is static."""
    if isinstance(n, int):
        return size
    pq = scale_fraction(scale)
    if pq is None:
        # (the symbolic shape rule refuses such a resize before any kernel is built)
        raise CompileError(f"resize2d of a dynamic axis needs a rational scale p/q (q <= 64), got {scale}")
    p, q = pq
    return te.floordiv(n * p, q) if q > 1 else n * p


@register_compute("resize2d")
def _resize2d(attrs: dict, inputs: list, out_types: list) -> list:
    out_extents = None
    if attrs.get("sym_size") is not None:
        dyn = output_dyn(out_types[0]) or (None,) * 4
        out_extents = tuple(s if v is None else v for v, s in zip(dyn[2:4], attrs["size"]))
    return [resize2d(inputs[0], tuple(attrs["size"]), tuple(attrs["scales"]), attrs.get("method", "nearest"),
                     attrs.get("coordinate_transformation_mode", "half_pixel"),
                     attrs.get("nearest_mode", "round_prefer_floor"), out_extents)]
