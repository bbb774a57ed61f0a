"""Converters for shape / data-movement ops and constants."""

from __future__ import annotations

import functools
import math

import numpy as np

from ...runtime import sym
from .converter import Context, onnx_op
from .symvalues import Unresolved, broadcast_dims, infer_reshape_dim


# ----------------------------------------------------------------------------- constants
@onnx_op("Constant")
def _constant(ctx: Context, node, ins, attrs):
    if "value" in attrs:
        return ctx.const(attrs["value"])
    if "value_float" in attrs:
        return ctx.const(np.array(attrs["value_float"], dtype=np.float32))
    if "value_floats" in attrs:
        return ctx.const(np.array(attrs["value_floats"], dtype=np.float32))
    if "value_int" in attrs:
        return ctx.const(np.array(attrs["value_int"], dtype=np.int64))
    if "value_ints" in attrs:
        return ctx.const(np.array(attrs["value_ints"], dtype=np.int64))
    raise ctx.unsupported(f"constant kind {sorted(attrs)} (strings / sparse tensors)")


@onnx_op("ConstantOfShape")
def _constant_of_shape(ctx: Context, node, ins, attrs):
    dims = ctx.sym_ints(ins[0], "input")
    value = np.asarray(attrs.get("value", np.zeros(1, dtype=np.float32))).reshape(-1)[:1]
    if not value.size:
        raise ctx.bad("attribute 'value' must hold one element, it is empty")
    if any(isinstance(d, str) for d in dims):
        # A scalar broadcast to the symbolic shape: its upper bound is stored, the runtime
        # extent is the dims.
        one = ctx.const(np.full((1,) * len(dims), value[0], dtype=value.dtype))
        return _broadcast_sym(ctx, one, dims)
    ctx.check_size(dims, "the shape input")
    return ctx.const(np.full(dims, value[0], dtype=value.dtype))


def _broadcast_sym(ctx: Context, x, dims):
    """``broadcast_to`` a target with symbolic dims."""
    dims = tuple(sym.canonical(d) for d in dims)
    ctx.check_size(ctx.upper(dims), "the output")
    return ctx.emit1("broadcast_to", x, shape=ctx.upper(dims), sym_shape=dims)


@onnx_op("Shape")
def _shape(ctx: Context, node, ins, attrs):
    start, end = attrs.get("start", 0), attrs.get("end", None)
    # Never the upper bounds of a symbolic dim: its extent is known at run time only.
    return ctx.shape_value(ctx.dims(ins[0])[slice(start, end)], "int64")


@onnx_op("Size")
def _size(ctx: Context, node, ins, attrs):
    return ctx.shape_value(np.array(functools.reduce(sym.mul, ctx.dims(ins[0]), 1), dtype=object),
                           "int64")


def _range_sym(ctx: Context, ins):
    """Range whose limit (or start) is a symbolic dim: ``start + delta * i`` for ``i`` in
    ``0 .. n-1`` with ``n`` symbolic, as an exclusive running sum of ones broadcast to ``(n,)``."""
    start, limit, delta = (ctx.sym_ints(v, n) for v, n in zip(ins, ("start", "limit", "delta")))
    for v, n in zip((start, limit, delta), ("start", "limit", "delta")):
        if len(v) != 1:
            raise ctx.bad(f"input {n!r} must be a scalar, got {len(v)} values")
    (s,), (lim,), (d,) = start, limit, delta
    if not isinstance(d, int) or d <= 0:
        raise ctx.unsupported(f"a symbolic range ({s} .. {lim}) needs a positive static delta, "
                              f"got {d}")
    n = sym.floordiv(sym.add(sym.sub(lim, s), d - 1), d)
    lo, hi = sym.bounds(n, ctx.graph.dim_ranges)
    if lo < 0:
        raise ctx.unsupported(f"the symbolic range {s} .. {lim} may be empty or negative "
                              f"(length {n} spans {lo}..{hi}); Kiln needs a length >= 0")
    dt = ins[0].dtype
    ones = _broadcast_sym(ctx, ctx.const(np.ones((1,), dtype=np.dtype(dt))), (n,))
    idx = ctx.emit1("cumsum", ones, axis=0, exclusive=True)
    if d != 1:
        idx = ctx.emit1("multiply", idx, ctx.const(np.array(d, dtype=np.dtype(dt))))
    if s != 0:
        sv = ins[0] if not isinstance(s, int) else ctx.const(np.array(s, dtype=np.dtype(dt)))
        if sv in ctx.sym_values:
            raise ctx.unsupported(f"a range starting at the symbolic dim {s}")
        idx = ctx.emit1("add", idx, ctx.reshape(sv, ()))
    return idx


@onnx_op("Range")
def _range(ctx: Context, node, ins, attrs):
    if any(v in ctx.sym_values for v in ins):
        return _range_sym(ctx, ins)
    start, limit, delta = (ctx.static(v, n) for v, n in zip(ins, ("start", "limit", "delta")))
    dt = np.asarray(start).dtype
    for v, n in zip((start, limit, delta), ("start", "limit", "delta")):
        if np.asarray(v).size != 1:
            raise ctx.bad(f"input {n!r} must be a scalar, got shape {np.asarray(v).shape}")
    s, lim, d = (np.asarray(x).item() for x in (start, limit, delta))
    if d == 0 or not all(math.isfinite(v) for v in (s, lim, d)):
        raise ctx.bad(f"start={s}, limit={lim}, delta={d}: delta must be non-zero and all finite")
    n = max(int(math.ceil((lim - s) / d)), 0)
    ctx.check_size((n,), "the output")
    return ctx.const((s + np.arange(n) * d).astype(dt))


@onnx_op("Identity")
def _identity(ctx: Context, node, ins, attrs):
    return ctx.emit1("identity", ins[0])


@onnx_op("Dropout")
def _dropout(ctx: Context, node, ins, attrs):
    x = ins[0]
    ratio = attrs.get("ratio", 0.5)
    if ctx.opset >= 12:
        if len(ins) > 1 and ins[1] is not None:
            ratio = float(np.asarray(ctx.static(ins[1], "ratio")))
        if len(ins) > 2 and ins[2] is not None:
            training = bool(np.asarray(ctx.static(ins[2], "training_mode")))
            # Training with ratio 0 drops nothing, so it is deterministic: y = x, mask all
            # true. Any other ratio needs random masks, which Kiln does not generate.
            if training and ratio != 0.0:
                raise ctx.unsupported(f"training_mode=True with ratio={ratio} (random dropout "
                                      f"masks are not supported; Kiln compiles inference graphs)")
    y = ctx.emit1("dropout", x, rate=ratio)
    if ctx.is_dynamic(x):
        return [y, _broadcast_sym(ctx, ctx.const(np.ones((1,) * x.type.ndim, dtype=bool)),
                                  ctx.dims(x))]
    mask = ctx.const(np.ones(x.shape, dtype=bool))
    return [y, mask]


# ----------------------------------------------------------------------------- reshapes
@onnx_op("Reshape")
def _reshape(ctx: Context, node, ins, attrs):
    x = ins[0]
    if ctx.opset < 5:
        spec = tuple(attrs["shape"])
    else:
        spec = ctx.sym_ints(ins[1], "shape")
    allowzero = attrs.get("allowzero", 0)
    if ctx.is_dynamic(x) or any(isinstance(d, str) for d in spec):
        return ctx.reshape_dims(x, _reshape_target(ctx, x, spec, allowzero))
    shape = []
    infer = None
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= x.type.ndim:
                raise ctx.bad(f"shape {spec}: 0 at {i} copies a dim the input {x.shape} lacks")
            shape.append(x.shape[i])
        elif d == -1:
            if infer is not None:
                raise ctx.bad(f"shape {spec} has more than one -1")
            infer = i
            shape.append(1)
        else:
            shape.append(d)
    if infer is not None:
        rest = math.prod(shape)
        if rest == 0 or x.type.size % rest:
            raise ctx.bad(f"cannot reshape {x.shape} to {spec}")
        shape[infer] = x.type.size // rest
    return ctx.emit1("reshape", x, newshape=tuple(shape))


def _reshape_target(ctx: Context, x, spec, allowzero) -> tuple:
    """The dims of a Reshape's output when the input or the target is symbolic."""
    src = ctx.dims(x)
    out: list = []
    infer = None
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise ctx.bad(f"shape {spec}: 0 at {i} copies a dim the input {x.type} lacks")
            out.append(src[i])
        elif d == -1:
            if infer is not None:
                raise ctx.bad(f"shape {spec} has more than one -1")
            infer = i
            out.append(1)
        elif isinstance(d, int) and d < 0:
            raise ctx.bad(f"shape {spec} has the negative dim {d}")
        else:
            out.append(d)
    if infer is not None:
        try:
            out[infer] = infer_reshape_dim(src, out[:infer] + out[infer + 1:])
        except Unresolved as exc:
            raise ctx.unsupported(f"cannot infer the -1 of shape {list(spec)} for input "
                                  f"{x.type}: {exc}") from None
    total_in = functools.reduce(sym.mul, src, 1)
    total_out = functools.reduce(sym.mul, out, 1)
    if total_in != total_out:
        raise ctx.bad(f"cannot reshape {x.type} ({total_in} elements) to {list(spec)} "
                      f"({total_out} elements)")
    return tuple(out)


@onnx_op("Flatten")
def _flatten(ctx: Context, node, ins, attrs):
    x = ins[0]
    nd = x.type.ndim
    axis = attrs.get("axis", 1)
    if not -nd <= axis <= nd:  # Flatten's axis may equal the rank (everything in dim 0)
        raise ctx.bad(f"axis {axis} is out of range for a {nd}-D input (expected {-nd} <= "
                      f"axis <= {nd})")
    if axis < 0:
        axis += nd
    if ctx.is_dynamic(x):
        d = ctx.dims(x)
        return ctx.reshape_dims(x, (functools.reduce(sym.mul, d[:axis], 1),
                                    functools.reduce(sym.mul, d[axis:], 1)))
    return ctx.emit1("reshape", x, newshape=(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


def _axes_arg(ctx: Context, ins, attrs, since: int) -> tuple[int, ...] | None:
    if ctx.opset >= since:
        if len(ins) > 1 and ins[1] is not None:
            return ctx.static_ints(ins[1], "axes")
        return None
    return tuple(attrs["axes"]) if "axes" in attrs else None


@onnx_op("Squeeze")
def _squeeze(ctx: Context, node, ins, attrs):
    x = ins[0]
    axes = _axes_arg(ctx, ins, attrs, 13)
    nd = x.type.ndim
    dims = ctx.dims(x)
    if axes is None:
        axes = tuple(i for i, d in enumerate(dims) if d == 1)
    axes = {ctx.axis(a, nd) for a in axes}
    for a in axes:
        if dims[a] != 1:
            raise ctx.bad(f"cannot squeeze axis {a} of size {dims[a]}")
    if ctx.is_dynamic(x):
        return ctx.reshape_dims(x, tuple(d for i, d in enumerate(dims) if i not in axes))
    return ctx.emit1("reshape", x, newshape=tuple(d for i, d in enumerate(x.shape)
                                                   if i not in axes))


@onnx_op("Unsqueeze")
def _unsqueeze(ctx: Context, node, ins, attrs):
    x = ins[0]
    axes = _axes_arg(ctx, ins, attrs, 13)
    if axes is None:
        raise ctx.bad("Unsqueeze needs axes")
    out_nd = x.type.ndim + len(axes)
    axes = sorted(ctx.axis(a, out_nd) for a in axes)
    shape = list(ctx.dims(x))
    for a in axes:
        shape.insert(a, 1)
    if ctx.is_dynamic(x):
        return ctx.reshape_dims(x, tuple(shape))
    return ctx.emit1("reshape", x, newshape=tuple(shape))


@onnx_op("Transpose")
def _transpose(ctx: Context, node, ins, attrs):
    x = ins[0]
    perm = attrs.get("perm")
    if perm is None:
        perm = tuple(reversed(range(x.type.ndim)))
    return ctx.emit1("transpose", x, axes=tuple(perm))


@onnx_op("Concat")
def _concat(ctx: Context, node, ins, attrs):
    vals = [v for v in ins if v is not None]
    axis = ctx.axis(attrs.get("axis", 0), vals[0].type.ndim)
    return ctx.emit1("concatenate", *vals, axis=axis)


@onnx_op("Split")
def _split(ctx: Context, node, ins, attrs):
    x = ins[0]
    axis = ctx.axis(attrs.get("axis", 0), x.type.ndim)
    dim = x.shape[axis]
    if isinstance(ctx.dims(x)[axis], str):
        raise ctx.unsupported(f"splitting the symbolic dim {ctx.dims(x)[axis]} (axis {axis} of "
                              f"{x.type}) is not supported")
    n_out = len(node.output)
    if ctx.opset >= 13:
        sizes = ctx.static_ints(ins[1], "split") if len(ins) > 1 and ins[1] is not None else None
    else:
        sizes = tuple(attrs["split"]) if "split" in attrs else None
    if sizes is None:
        n = attrs.get("num_outputs", n_out)
        if ctx.opset >= 18 and "num_outputs" in attrs:
            chunk = -(-dim // n)
            sizes = tuple(min(chunk, dim - i * chunk) for i in range(n))
        else:
            if dim % n:
                raise ctx.bad(f"cannot split dim {dim} into {n} equal parts")
            sizes = (dim // n,) * n
    return ctx.emit("split", [x], {"sections": sizes, "axis": axis})


@onnx_op("Slice")
def _slice(ctx: Context, node, ins, attrs):
    x = ins[0]
    if ctx.opset < 10:
        starts, ends = tuple(attrs["starts"]), tuple(attrs["ends"])
        axes = tuple(attrs.get("axes", range(len(starts))))
        steps = (1,) * len(starts)
    else:
        starts = ctx.sym_ints(ins[1], "starts")
        ends = ctx.sym_ints(ins[2], "ends")
        axes = ctx.static_ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None \
            else tuple(range(len(starts)))
        steps = ctx.static_ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None \
            else (1,) * len(starts)
        if ctx.is_dynamic(x) or any(isinstance(d, str) for d in starts + ends):
            return _slice_sym(ctx, x, starts, ends, axes, steps)
    axes = _slice_axes(ctx, x, starts, ends, axes, steps)
    if 0 in steps:
        raise ctx.bad(f"steps {steps} contain 0")
    # Canonicalize: clamp to the int64-free range of this shape so attrs stay small.
    from ...ir.ops import normalize_slice

    dims = normalize_slice(x.shape, {"begin": starts, "end": ends, "strides": steps,
                                     "axes": axes})
    begin = tuple(dims[a][0] for a in axes)
    # normalize_slice returns end = -1 for "through index 0" with negative steps; as an
    # attribute -1 would mean "last element", so spell it -(dim + 1) (clamps back to -1).
    end = tuple(dims[a][1] if dims[a][1] >= 0 else -(x.shape[a] + 1) for a in axes)
    return ctx.emit1("strided_slice", x, begin=begin, end=end, strides=steps, axes=axes)


def _slice_axes(ctx: Context, x, starts, ends, axes, steps) -> tuple[int, ...]:
    """Slice's axes, normalised, after checking that the four lists agree in length and that
    no axis repeats."""
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.bad(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have "
                      f"the same length")
    axes = tuple(ctx.axis(a, x.type.ndim) for a in axes)
    if len(set(axes)) != len(axes):
        raise ctx.bad(f"axes {axes} repeat an axis")
    return axes


def _slice_sym(ctx: Context, x, starts, ends, axes, steps):
    """Slice when the data or the bounds have symbolic dims.

    Per axis, ONNX's clamping is decided with the dim ranges (an end of ``INT_MAX`` or at
    least the axis' upper bound is the whole axis, a negative one counts from the runtime
    end). A whole symbolic axis or its first element is a ``strided_slice`` (the padded
    layout keeps data at the start); any other range along a symbolic extent is a ``take`` of
    the index range ``begin, begin + step, ...``, whose length may be symbolic.
    """
    axes = _slice_axes(ctx, x, starts, ends, axes, steps)
    dims = ctx.dims(x)
    ranges = ctx.graph.dim_ranges
    y = x
    for b, e, s, a in zip(starts, ends, steps, axes):
        n = dims[a]
        if s == 0:
            raise ctx.bad(f"steps {steps} contain 0")
        if not any(isinstance(v, str) for v in (b, e, n)):
            from ...ir.ops import normalize_slice

            (bb, ee, _), = [normalize_slice((n,), {"begin": (b,), "end": (e,), "strides": (s,),
                                                   "axes": (0,)})[0]]
            ee = ee if ee >= 0 else -(n + 1)
            if (bb, ee, s) != (0, n, 1):
                y = ctx.emit1("strided_slice", y, begin=(bb,), end=(ee,), strides=(s,), axes=(a,))
            continue
        if s < 0:
            raise ctx.unsupported(f"a negative step along the symbolic range {b}..{e} of axis {a} "
                                  f"(dims {tuple(dims)}) is not supported")
        try:
            begin = _clamp(_from_end(b, n, ranges), n, ranges)
            end = _clamp(_from_end(e, n, ranges), n, ranges)
        except Unresolved as exc:
            if isinstance(b, int) and isinstance(e, int) and 0 <= b and 0 <= e:
                y = _slice_compress(ctx, y, a, b, e, s)
                continue
            raise ctx.unsupported(f"Slice of axis {a} (extent {n}) from {b} to {e}: {exc}") from None
        length = sym.floordiv(sym.add(sym.sub(end, begin), s - 1), s)
        if sym.bounds(length, ranges)[0] < 0:
            raise ctx.unsupported(f"Slice of axis {a} (extent {n}) from {b} to {e} may be "
                                  f"empty or reversed at run time")
        if begin == 0 and s == 1 and sym.canonical(end) == sym.canonical(n):
            continue  # the whole axis
        if begin == 0 and s == 1 and end == 1:
            y = ctx.emit1("strided_slice", y, begin=(0,), end=(1,), strides=(1,), axes=(a,))
            continue
        if isinstance(begin, str):
            raise ctx.unsupported(f"Slice of axis {a} (extent {n}) starting at the symbolic "
                                  f"index {begin} is not supported")
        idx = _index_range(ctx, begin, length, s)
        y = ctx.emit1("take", y, idx, axis=a)
    return y if y is not x else ctx.emit1("identity", x)


def _slice_compress(ctx: Context, x, axis: int, begin: int, end: int, step: int):
    """``x[begin:end:step]`` along a symbolic ``axis`` whose runtime extent may be shorter than
    ``end`` (torchvision's ``keep[:detections_per_img]`` of NonMaxSuppression's count): the
    length ``min(end, n)`` is not a dim expression, so it is a ``compress`` by the static mask
    of the indices ``begin, begin + step, ... < end`` (a mask shorter than the axis drops its
    tail; the kernel stops at the runtime extent), with a fresh data-dependent dim."""
    from .ops_dynamic import _fresh_dim  # ops_dynamic imports this module

    n = min(end, x.shape[axis])
    mask = np.zeros(n, dtype=bool)
    mask[begin:n:step] = True
    d = _fresh_dim(ctx, "slice", int(mask.sum()))
    return ctx.emit("compress", [x, ctx.const(mask)], {"axis": axis, "out_dim": d})[0]


def _from_end(i, n, ranges):
    """A Slice bound counted from the end (negative) as an index from the start."""
    if isinstance(i, int) and i < 0:
        return sym.add(n, i)
    return i


def _clamp(i, n, ranges):
    """``min(max(i, 0), n)`` when the dim ranges decide it."""
    if isinstance(i, int) and isinstance(n, int):
        return min(max(i, 0), n)
    if isinstance(i, int) and i >= (n if isinstance(n, int) else sym.bounds(n, ranges)[1]):
        return n  # INT_MAX and the like: to the end
    lo, hi = sym.bounds(sym.sub(n, i), ranges)
    if sym.bounds(i, ranges)[0] < 0:
        raise Unresolved(f"the index {i} may be negative")
    if lo >= 0:
        return i
    if hi <= 0:
        return n
    raise Unresolved(f"whether {i} is past the end {n} depends on the runtime dims")


def _index_range(ctx: Context, begin, length, step):
    """int64 indices ``begin + step * k`` for ``k < length`` (``length`` may be symbolic)."""
    if isinstance(length, int):
        return ctx.const(begin + step * np.arange(length, dtype=np.int64))
    ones = _broadcast_sym(ctx, ctx.const(np.ones((1,), dtype=np.int64)), (length,))
    idx = ctx.emit1("cumsum", ones, axis=0, exclusive=True)
    if step != 1:
        idx = ctx.emit1("multiply", idx, ctx.const(np.array(step, dtype=np.int64)))
    if begin != 0:
        idx = ctx.emit1("add", idx, ctx.const(np.array(begin, dtype=np.int64)))
    return idx


@onnx_op("Gather")
def _gather(ctx: Context, node, ins, attrs):
    x, idx = ins
    axis = ctx.axis(attrs.get("axis", 0), x.type.ndim)
    if idx.dtype not in ("int32", "int64"):
        idx = ctx.cast(idx, "int64")
    return ctx.emit1("take", x, idx, axis=axis)


@onnx_op("GatherElements")
def _gather_elements(ctx: Context, node, ins, attrs):
    x, idx = ins
    return ctx.emit1("gather_elements", x, idx,
                     axis=ctx.axis(attrs.get("axis", 0), x.type.ndim))


@onnx_op("GatherND")
def _gather_nd(ctx: Context, node, ins, attrs):
    x, idx = ins
    return ctx.emit1("gather_nd", x, idx, batch_dims=int(attrs.get("batch_dims", 0)))


@onnx_op("ScatterElements", "Scatter")
def _scatter_elements(ctx: Context, node, ins, attrs):
    x, idx, upd = ins
    red = attrs.get("reduction", "none")
    # a reduction is a different kernel (every update accumulates): kiln.ir.ops.index
    op = "scatter_elements" if red == "none" else "scatter_elements_reduce"
    return ctx.emit1(op, x, idx, upd, axis=ctx.axis(attrs.get("axis", 0), x.type.ndim), reduction=red)


@onnx_op("ScatterND")
def _scatter_nd(ctx: Context, node, ins, attrs):
    x, idx, upd = ins
    red = attrs.get("reduction", "none")
    return ctx.emit1("scatter_nd" if red == "none" else "scatter_nd_reduce", x, idx, upd, reduction=red)


@onnx_op("OneHot")
def _one_hot(ctx: Context, node, ins, attrs):
    idx, depth, values = ins
    d = ctx.static(depth, "depth")
    if d.size != 1:
        raise ctx.bad(f"input 'depth' must be a scalar or a one-element tensor, got shape {d.shape}")
    # ONNX: a non-integer depth is rounded toward zero
    return ctx.emit1("one_hot", idx, values, depth=int(d.reshape(-1)[0]),
                     axis=ctx.axis(attrs.get("axis", -1), idx.type.ndim + 1))


@onnx_op("Expand")
def _expand(ctx: Context, node, ins, attrs):
    from ...ir.ops._util import broadcast_shapes

    x = ins[0]
    shape = ctx.sym_ints(ins[1], "shape")
    if ctx.is_dynamic(x) or any(isinstance(d, str) for d in shape):
        try:
            dims = broadcast_dims(ctx.dims(x), shape)
        except Unresolved as exc:
            raise ctx.unsupported(f"Expand of {x.type} to {list(shape)}: {exc}") from None
        if dims == ctx.dims(x):
            return ctx.emit1("identity", x)
        return _broadcast_sym(ctx, x, dims)
    out = broadcast_shapes(x.shape, shape)
    if out == x.shape:
        return ctx.emit1("identity", x)
    return ctx.emit1("broadcast_to", x, shape=out)


@onnx_op("Tile")
def _tile(ctx: Context, node, ins, attrs):
    reps = ctx.sym_ints(ins[1], "repeats")
    if any(isinstance(r, str) for r in reps):
        raise ctx.unsupported(f"repeats {list(reps)} hold symbolic dims; Kiln tiles a static "
                              f"number of times")
    return ctx.emit1("tile", ins[0], reps=reps)


@onnx_op("Pad")
def _pad(ctx: Context, node, ins, attrs):
    x = ins[0]
    nd = x.type.ndim
    mode = attrs.get("mode", "constant")
    if ctx.opset < 11:
        pads = tuple(attrs["pads"])
        value = attrs.get("value", 0.0)
        axes = tuple(range(nd))
    else:
        pads = ctx.static_ints(ins[1], "pads")
        value = 0.0
        if len(ins) > 2 and ins[2] is not None:
            cv = np.asarray(ctx.static(ins[2], "constant_value")).reshape(-1)
            value = cv[0].item() if cv.size else 0.0
        if len(ins) > 3 and ins[3] is not None:
            axes = tuple(ctx.axis(a, nd) for a in ctx.static_ints(ins[3], "axes"))
        else:
            axes = tuple(range(nd))
    if len(pads) != 2 * len(axes):
        raise ctx.bad(f"pads {pads} must have 2 * {len(axes)} entries")
    width = [[0, 0] for _ in range(nd)]
    for i, a in enumerate(axes):
        width[a] = [pads[i], pads[i + len(axes)]]
    out = tuple(d + b + e for d, (b, e) in zip(x.shape, width))
    if any(d < 0 for d in out):
        raise ctx.bad(f"pads {pads} crop input {x.shape} to a negative size {out}")
    ctx.check_size(out, f"the output of pads {pads}")
    pos = tuple((max(b, 0), max(e, 0)) for b, e in width)
    y = x
    if any(p != (0, 0) for p in pos):
        y = ctx.emit1("pad", x, pad_width=pos, mode=mode, value=float(value))
    if any(b < 0 or e < 0 for b, e in width):
        # Negative pads crop.
        cut = [(i, -min(b, 0), y.shape[i] + min(e, 0)) for i, (b, e) in enumerate(width)
               if b < 0 or e < 0]
        y = ctx.emit1("strided_slice", y, begin=tuple(c[1] for c in cut),
                      end=tuple(c[2] for c in cut), strides=(1,) * len(cut),
                      axes=tuple(c[0] for c in cut))
    if y is x:
        y = ctx.emit1("identity", x)
    return y

