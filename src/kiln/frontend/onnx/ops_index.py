"""ONNX converters: index, scatter and scan-like ops (ScatterElements, ScatterND, GatherND, TensorScatter,
Trilu, CumSum, CumProd, OneHot, EyeLike, ReverseSequence, Det, window functions).

GatherND, GatherElements, OneHot and the scatters are converted in :mod:`.ops_tensor` (the
ones with a reduction emit the ops of :mod:`kiln.ir.ops.index`). Ops whose output depends only
on static values here become constants at import, like ``Range`` and ``ConstantOfShape``:
EyeLike (the input's shape) and the window functions (the constant window size). Compress
needs a constant condition (it decides the output shape) and becomes a ``take``;
MelWeightMatrix is built from elementwise ops, so its edge frequencies may be run-time inputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...ir.ops.index import DET_MAX_N
from ...ir.types import FLOAT_DTYPES, np_dtype
from ...runtime.errors import UnsupportedOpError
from .converter import Context, onnx_dtype, onnx_op


def _scalar_int(ctx: Context, v: Any, what: str) -> int:
    """A static one-element integer input as an int."""
    arr = np.asarray(ctx.static(v, what))
    if arr.size != 1:
        raise ctx.bad(f"input {what!r} must be a scalar, got shape {arr.shape}")
    return ctx.static_ints(v, what)[0]


def _out_dtype(ctx: Context, attrs: dict, key: str, default: str) -> str:
    """The IR dtype named by an element-type attribute (numeric types only), naming the node if not."""
    if key not in attrs:
        return default
    try:
        dtype = onnx_dtype(attrs[key])
    except UnsupportedOpError as exc:
        raise ctx.unsupported(f"attribute {key!r}: {exc}") from None
    if dtype not in FLOAT_DTYPES and not dtype.startswith(("int", "uint")) and dtype != "bool":
        raise ctx.unsupported(f"attribute {key!r} must name a numeric type, got {dtype}")
    return dtype


@onnx_op("Trilu")
def _trilu(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x = ins[0]
    if x.type.ndim < 2:
        raise ctx.bad(f"input must have rank >= 2, got shape {x.shape}")
    k = _scalar_int(ctx, ins[1], "k") if len(ins) > 1 and ins[1] is not None else 0
    upper = attrs.get("upper", 1)
    if upper not in (0, 1):
        raise ctx.bad(f"attribute 'upper' must be 0 or 1, got {upper}")
    # a diagonal beyond the matrix keeps all or nothing: clamp so the attribute stays small
    rows, cols = x.shape[-2], x.shape[-1]
    k = min(max(k, -rows - 1), cols + 1)
    return ctx.emit1("trilu", x, upper=bool(upper), k=k)


def _scan(op: str) -> Any:
    def convert(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
        x = ins[0]
        if x.type.ndim == 0:
            raise ctx.bad("input must have rank >= 1, got a scalar")
        axis = ctx.axis(_scalar_int(ctx, ins[1], "axis"), x.type.ndim)
        flags = {}
        for a in ("exclusive", "reverse"):
            v = attrs.get(a, 0)
            if v not in (0, 1):
                raise ctx.bad(f"attribute {a!r} must be 0 or 1, got {v}")
            flags[a] = bool(v)
        return ctx.emit1(op, x, axis=axis, **flags)

    return convert


onnx_op("CumSum")(_scan("cumsum"))
onnx_op("CumProd")(_scan("cumprod"))


@onnx_op("ReverseSequence")
def _reverse_sequence(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x, lens = ins
    nd = x.type.ndim
    if nd < 2:
        raise ctx.bad(f"input must have rank >= 2, got shape {x.shape}")
    b = ctx.axis(attrs.get("batch_axis", 1), nd, "batch_axis")
    t = ctx.axis(attrs.get("time_axis", 0), nd, "time_axis")
    if {b, t} != {0, 1}:
        raise ctx.bad(f"batch_axis ({b}) and time_axis ({t}) must be 0 and 1 in some order")
    if lens.dtype not in ("int32", "int64"):
        lens = ctx.cast(lens, "int64")
    return ctx.emit1("reverse_sequence", x, lens, batch_axis=b, time_axis=t)


@onnx_op("TensorScatter")
def _tensor_scatter(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    cache, upd = ins[0], ins[1]
    args = [cache, upd]
    if len(ins) > 2 and ins[2] is not None:
        args.append(ins[2])
    mode = attrs.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.bad(f"attribute 'mode' must be 'linear' or 'circular', got {mode!r}")
    axis = ctx.axis(attrs.get("axis", -2), cache.type.ndim)
    return ctx.emit1("tensor_scatter", *args, axis=axis, mode=mode)


@onnx_op("Det")
def _det(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x = ins[0]
    if x.type.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ctx.bad(f"input must be square matrices [*, M, M], got shape {x.shape}")
    if x.shape[-1] > DET_MAX_N:
        raise ctx.unsupported(f"determinants of {x.shape[-1]}x{x.shape[-1]} matrices (at most "
                              f"{DET_MAX_N}x{DET_MAX_N} are supported)")
    return ctx.emit1("det", x)


@onnx_op("EyeLike")
def _eye_like(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x = ins[0]
    if x.type.ndim != 2:
        raise ctx.bad(f"input must be 2-D, got shape {x.shape}")
    dtype = _out_dtype(ctx, attrs, "dtype", x.dtype)
    # the output depends only on the input's (static) shape
    return ctx.const(np.eye(x.shape[0], x.shape[1], k=int(attrs.get("k", 0)), dtype=np_dtype(dtype)))


def _window(name: str) -> Any:
    def convert(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
        size = _scalar_int(ctx, ins[0], "size")
        if size < 0:
            raise ctx.bad(f"input 'size' must be non-negative, got {size}")
        ctx.check_size((size,), "the window")
        periodic = attrs.get("periodic", 1)
        if periodic not in (0, 1):
            raise ctx.bad(f"attribute 'periodic' must be 0 or 1, got {periodic}")
        dtype = _out_dtype(ctx, attrs, "output_datatype", "float32")
        # the ONNX reference divides by N (periodic) or N - 1 (symmetric), as float64
        denom = size if periodic else size - 1
        phase = np.arange(size, dtype=np.float64) * math.pi / denom if denom else np.zeros(size)
        if name == "hann":
            w = np.sin(phase) ** 2
        elif name == "hamming":
            alpha = 25.0 / 46.0
            w = alpha - (1.0 - alpha) * np.cos(2.0 * phase)
        else:
            w = 0.42 - 0.5 * np.cos(2.0 * phase) + 0.08 * np.cos(4.0 * phase)
        return ctx.const(w.astype(np_dtype(dtype)))

    return convert


onnx_op("HannWindow")(_window("hann"))
onnx_op("HammingWindow")(_window("hamming"))
onnx_op("BlackmanWindow")(_window("blackman"))


@onnx_op("Compress")
def _compress(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    x, cond = ins
    # the condition decides the output shape: it has to be known at import
    c = np.asarray(ctx.static(cond, "condition"))
    if c.ndim != 1:
        raise ctx.bad(f"input 'condition' must be 1-D, got shape {c.shape}")
    if "axis" in attrs:
        axis = ctx.axis(attrs["axis"], x.type.ndim)
        data, n = x, x.shape[axis]
    else:
        axis = 0
        n = x.type.size
        data = ctx.reshape(x, (n,))
    c = c.astype(bool)
    if c.size > n and c[n:].any():
        raise ctx.bad(f"condition selects position {int(np.flatnonzero(c)[-1])} of an axis of size {n}")
    keep = np.flatnonzero(c[:n]).astype(np.int64)
    return ctx.emit1("take", data, ctx.const(keep), axis=axis)


@onnx_op("MelWeightMatrix")
def _mel_weight_matrix(ctx: Context, node: Any, ins: list, attrs: dict) -> Any:
    # The three integer inputs decide the output shape (static); the edge frequencies may be run-time
    # values, so the triangles are built from elementwise ops in float64 (the ONNX reference's
    # precision: a bin edge is a floor, which float32 could move by one).
    n_mel = _scalar_int(ctx, ins[0], "num_mel_bins")
    dft = _scalar_int(ctx, ins[1], "dft_length")
    rate = _scalar_int(ctx, ins[2], "sample_rate")
    if n_mel <= 0 or dft <= 0 or rate <= 0:
        raise ctx.bad(f"num_mel_bins ({n_mel}), dft_length ({dft}) and sample_rate ({rate}) must be positive")
    n_spec = dft // 2 + 1
    ctx.check_size((n_spec, n_mel), "the output")
    dtype = _out_dtype(ctx, attrs, "output_datatype", "float32")
    f64 = np.float64

    def c(v: Any) -> Any:
        return ctx.const(np.asarray(v, f64))

    def e(op: str, *args: Any) -> Any:
        return ctx.emit1(op, *args)

    edges = []
    for v, what in ((ins[3], "lower_edge_hertz"), (ins[4], "upper_edge_hertz")):
        if v.type.size != 1 or v.dtype not in FLOAT_DTYPES:
            raise ctx.bad(f"input {what!r} must be a floating-point scalar, got {v.dtype}{list(v.shape)}")
        hz = ctx.cast(ctx.reshape(v, ()), "float64")
        # mel(f) = 2595 log10(1 + f / 700)
        edges.append(e("multiply", e("log", e("add", e("divide", hz, c(700.0)), c(1.0))), c(2595.0 / math.log(10))))
    low, high = edges
    step = e("divide", e("subtract", high, low), c(n_mel + 2))
    mel = e("add", e("multiply", c(np.arange(n_mel + 2)), step), low)
    hz = e("multiply", c(700.0), e("subtract", e("exp", e("multiply", mel, c(math.log(10) / 2595.0))), c(1.0)))
    bins = e("floor", e("divide", e("multiply", hz, c(dft + 1)), c(rate)))

    def edge(start: int) -> Any:
        s = ctx.emit1("strided_slice", bins, begin=(start,), end=(start + n_mel,), strides=(1,), axes=(0,))
        return ctx.reshape(s, (1, n_mel))

    left, center, right = edge(0), edge(1), edge(2)
    j = c(np.arange(n_spec).reshape(n_spec, 1))
    one, zero = c(1.0), c(0.0)
    # rising edge left <= j <= center (a single 1 when they coincide), falling edge center < j < right
    rise = e("divide", e("subtract", j, left), e("maximum", e("subtract", center, left), one))
    rise = e("where", e("equal", center, left), one, rise)
    fall = e("divide", e("subtract", right, j), e("maximum", e("subtract", right, center), one))
    on_rise = e("logical_and", e("less_equal", left, j), e("less_equal", j, center))
    on_fall = e("logical_and", e("less", center, j), e("less", j, right))
    out = e("where", on_rise, rise, e("where", on_fall, fall, zero))
    return ctx.cast(out, dtype)
