"""Converters for shape / data-movement ops and constants."""

from __future__ import annotations

import math

import numpy as np

from .converter import Context, onnx_op


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
    shape = ctx.static_ints(ins[0], "input")
    ctx.check_size(shape, "the shape input")
    value = np.asarray(attrs.get("value", np.zeros(1, dtype=np.float32))).reshape(-1)[:1]
    if not value.size:
        raise ctx.bad("attribute 'value' must hold one element, it is empty")
    return ctx.const(np.full(shape, value[0], dtype=value.dtype))


@onnx_op("Shape")
def _shape(ctx: Context, node, ins, attrs):
    shape = ins[0].shape
    start, end = attrs.get("start", 0), attrs.get("end", None)
    return ctx.const(np.array(shape[slice(start, end)], dtype=np.int64))


@onnx_op("Size")
def _size(ctx: Context, node, ins, attrs):
    return ctx.const(np.array(ins[0].type.size, dtype=np.int64))


@onnx_op("Range")
def _range(ctx: Context, node, ins, attrs):
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
    mask = ctx.const(np.ones(x.shape, dtype=bool))
    return [y, mask]


# ----------------------------------------------------------------------------- reshapes
@onnx_op("Reshape")
def _reshape(ctx: Context, node, ins, attrs):
    x = ins[0]
    if ctx.opset < 5:
        spec = tuple(attrs["shape"])
    else:
        spec = ctx.static_ints(ins[1], "shape")
    allowzero = attrs.get("allowzero", 0)
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
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    axes = {ctx.axis(a, nd) for a in axes}
    for a in axes:
        if x.shape[a] != 1:
            raise ctx.bad(f"cannot squeeze axis {a} of size {x.shape[a]}")
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
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
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
        starts = ctx.static_ints(ins[1], "starts")
        ends = ctx.static_ints(ins[2], "ends")
        axes = ctx.static_ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None \
            else tuple(range(len(starts)))
        steps = ctx.static_ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None \
            else (1,) * len(starts)
    nd = x.type.ndim
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.bad(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} must have "
                      f"the same length")
    axes = tuple(ctx.axis(a, nd) for a in axes)
    if len(set(axes)) != len(axes):
        raise ctx.bad(f"axes {axes} repeat an axis")
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
    shape = ctx.static_ints(ins[1], "shape")
    out = broadcast_shapes(x.shape, shape)
    if out == x.shape:
        return ctx.emit1("identity", x)
    return ctx.emit1("broadcast_to", x, shape=out)


@onnx_op("Tile")
def _tile(ctx: Context, node, ins, attrs):
    return ctx.emit1("tile", ins[0], reps=ctx.static_ints(ins[1], "repeats"))


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

