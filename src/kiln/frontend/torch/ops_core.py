"""ATen converters: elementwise math, comparisons, activations, shape ops, matmuls, reductions.

Owns the op families listed in ``docs/frontend_torch.md`` under "core"; vision ops (convolution,
pooling, batch norm, resize, pad) are in :mod:`.ops_vision`, transformer ops (softmax, norms,
attention, masks, indexing) in ``ops_transformer``. Imports only ``kiln.ir`` / ``kiln.runtime``
and :mod:`.converter`, never ``torch``: every argument arrives already bound by schema name.

Symbolic dims (``torch.export.Dim``): shape targets come from the dims torch recorded
(:meth:`Context.out_dims`), given to the IR as ``sym_shape``; a size argument that is a symbolic
dim arrives as its Kiln expression (a ``str``) and becomes a size value (:meth:`Context.size_value`)
where it meets tensor math.

Type promotion is torch's: the walk casts each result to the dtype torch recorded for the node,
and the arithmetic converters cast their operands to it first, so ``int_tensor / 2`` divides in
float as torch does.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ...ir import Value
from ...ir.types import np_dtype
from ...runtime import sym
from .converter import Args, Context, aten_op

__all__: list[str] = []


# ------------------------------------------------------------------ helpers
def _operand(ctx: Context, x: Any, dtype: str) -> Value:
    """A tensor operand of dtype ``dtype``: Values are cast, Python numbers become constants."""
    if isinstance(x, Value):
        return ctx.cast(x, dtype)
    if isinstance(x, str):  # a symbolic size (``x / seq``)
        return ctx.size_value(x, dtype)
    return ctx.const(np.asarray(x, dtype=np_dtype(dtype)))


def _compare_dtype(a: Any, b: Any) -> str:
    """The dtype two comparison operands are compared in (torch's promotion, simplified)."""
    vals = [v for v in (a, b) if isinstance(v, Value)]
    dts = {v.dtype for v in vals}
    if len(dts) == 1:
        dt = dts.pop()
        scalar = a if not isinstance(a, Value) else b
        if isinstance(scalar, float) and np.dtype(np_dtype(dt)).kind in "iub":
            return "float32"
        return dt
    # torch keeps the floating-point operand's dtype (int64 vs float32 compares in float32,
    # where NumPy would pick float64); within one category the wider type wins
    floats = [v.dtype for v in vals if np.dtype(np_dtype(v.dtype)).kind == "f"]
    if len(floats) == 1:
        return floats[0]
    return str(np.promote_types(*[np_dtype(v.dtype) for v in vals]))


def _axes(dim: Any, ndim: int, ctx: Context) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted({ctx.axis(int(d), max(ndim, 1), "dim") for d in dims}))


def _dim(ctx: Context, dim: int, ndim: int) -> int:
    return ctx.axis(int(dim), max(ndim, 1), "dim")


# ------------------------------------------------------------------ elementwise unary
_UNARY = {
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "abs": "abs", "neg": "negative",
    "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
    "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "erf": "erf",
    "floor": "floor", "ceil": "ceil", "round": "round", "reciprocal": "reciprocal",
    "sign": "sign", "logical_not": "logical_not", "isnan": "isnan",
    "bitwise_not": "bitwise_not", "hardswish": "hard_swish", "silu": "swish", "mish": "mish",
}


def _unary(ir_op: str) -> Any:
    def conv(ctx: Context, node: Any, a: Args) -> Value:
        x = a["self"]
        if ir_op not in ("logical_not", "isnan", "bitwise_not", "abs", "negative", "sign"):
            x = ctx.cast(x, ctx.out_dtype())  # exp(int) is float in torch
        if ir_op == "bitwise_not" and x.dtype == "bool":
            return ctx.emit1("logical_not", x)  # `~mask`
        return ctx.emit1(ir_op, x)

    conv.__qualname__ = f"unary_{ir_op}"
    return conv


for _name, _op in _UNARY.items():
    aten_op(f"aten.{_name}.default")(_unary(_op))


@aten_op("aten.log1p.default")
def _log1p(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    return ctx.emit1("log", ctx.emit1("add", x, ctx.scalar(1.0, x)))


@aten_op("aten.expm1.default")
def _expm1(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    return ctx.emit1("subtract", ctx.emit1("exp", x), ctx.scalar(1.0, x))


@aten_op("aten.hardtanh.default")
def _hardtanh(ctx: Context, node: Any, a: Args) -> Value:
    return ctx.emit1("clip", a["self"], a_min=float(a["min_val"]), a_max=float(a["max_val"]))


@aten_op("aten.relu6.default")
def _relu6(ctx: Context, node: Any, a: Args) -> Value:
    return ctx.emit1("clip", a["self"], a_min=0.0, a_max=6.0)


@aten_op("aten.clamp.default")
def _clamp(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    lo, hi = a["min"], a["max"]
    if lo is None and hi is None:
        raise ctx.bad("clamp needs min or max")
    return ctx.emit1("clip", x, a_min=None if lo is None else float(lo),
                     a_max=None if hi is None else float(hi))


@aten_op("aten.clamp_min.default", "aten.clamp_max.default")
def _clamp_one_side(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    if "min" in a:
        return ctx.emit1("clip", x, a_min=float(a["min"]), a_max=None)
    return ctx.emit1("clip", x, a_min=None, a_max=float(a["max"]))


@aten_op("aten.clamp.Tensor")
def _clamp_tensor(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    x = ctx.cast(a["self"], dt)
    if a["min"] is not None:
        x = ctx.emit1("maximum", x, _operand(ctx, a["min"], dt))
    if a["max"] is not None:
        x = ctx.emit1("minimum", x, _operand(ctx, a["max"], dt))
    return x


@aten_op("aten.hardsigmoid.default")
def _hardsigmoid(ctx: Context, node: Any, a: Args) -> Value:
    return ctx.emit1("hard_sigmoid", a["self"], alpha=1.0 / 6.0, beta=0.5)


@aten_op("aten.gelu.default")
def _gelu(ctx: Context, node: Any, a: Args) -> Value:
    approx = a["approximate"] or "none"
    if approx not in ("none", "tanh"):
        raise ctx.unsupported(f"gelu approximate={approx!r}")
    return ctx.emit1("gelu", a["self"], approximate=approx)


@aten_op("aten.leaky_relu.default")
def _leaky_relu(ctx: Context, node: Any, a: Args) -> Value:
    return ctx.emit1("leaky_relu", a["self"], alpha=float(a["negative_slope"]))


@aten_op("aten.elu.default")
def _elu(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    alpha, scale, in_scale = float(a["alpha"]), float(a["scale"]), float(a["input_scale"])
    if in_scale != 1.0:
        # elu(x) = scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1))
        neg = ctx.emit1("multiply", ctx.emit1("subtract", ctx.emit1(
            "exp", ctx.emit1("multiply", x, ctx.scalar(in_scale, x))), ctx.scalar(1.0, x)),
            ctx.scalar(alpha, x))
        y = ctx.emit1("where", ctx.emit1("greater", x, ctx.scalar(0.0, x)), x, neg)
    else:
        y = ctx.emit1("elu", x, alpha=alpha)
    return y if scale == 1.0 else ctx.emit1("multiply", y, ctx.scalar(scale, x))


@aten_op("aten.softplus.default")
def _softplus(ctx: Context, node: Any, a: Args) -> Value:
    x, beta, thr = a["self"], float(a["beta"]), float(a["threshold"])
    bx = x if beta == 1.0 else ctx.emit1("multiply", x, ctx.scalar(beta, x))
    sp = ctx.emit1("softplus", bx)
    if beta != 1.0:
        sp = ctx.emit1("divide", sp, ctx.scalar(beta, x))
    # torch returns x itself where beta * x > threshold (numerical stability)
    return ctx.emit1("where", ctx.emit1("greater", bx, ctx.scalar(thr, x)), x, sp)


# ------------------------------------------------------------------ elementwise binary
def _binary(ir_op: str, other: str = "other") -> Any:
    def conv(ctx: Context, node: Any, a: Args) -> Value:
        dt = ctx.out_dtype()
        x, y = a["self"], a[other]
        alpha = a.get("alpha", 1)
        if alpha is not None and alpha != 1:
            y = y * alpha if not isinstance(y, Value) else \
                ctx.emit1("multiply", ctx.cast(y, dt), _operand(ctx, alpha, dt))
        op = ir_op
        if op in ("add", "subtract") and isinstance(x, Value) and x.dtype == dt and \
                not isinstance(y, (Value, str)) and y == 0:
            return x  # ``arange(seq) + 0`` (transformers' position ids): keeps the iota
        if dt == "bool" and op.startswith("bitwise_"):
            op = "logical_" + op[len("bitwise_"):]  # `mask & mask`: the IR's bitwise ops take integers
        return ctx.emit1(op, _operand(ctx, x, dt), _operand(ctx, y, dt))

    conv.__qualname__ = f"binary_{ir_op}"
    return conv


for _name, _op in {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide",
                   "maximum": "maximum", "minimum": "minimum", "remainder": "mod",
                   "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
                   "bitwise_xor": "bitwise_xor", "logical_and": "logical_and",
                   "logical_or": "logical_or", "logical_xor": "logical_xor"}.items():
    _fn = _binary(_op)
    if _name in ("maximum", "minimum", "logical_and", "logical_or", "logical_xor"):
        aten_op(f"aten.{_name}.default")(_fn)
    else:
        aten_op(f"aten.{_name}.Tensor")(_fn)
    if _name in ("add", "sub", "mul", "div", "remainder", "bitwise_and", "bitwise_or",
                 "bitwise_xor"):
        aten_op(f"aten.{_name}.Scalar")(_fn)


@aten_op("aten.fmod.Tensor", "aten.fmod.Scalar")
def _fmod(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    return ctx.emit1("mod", _operand(ctx, a["self"], dt), _operand(ctx, a["other"], dt),
                     fmod=True)


@aten_op("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx: Context, node: Any, a: Args) -> Value:
    # rsub(self, other, alpha) = other - alpha * self
    dt = ctx.out_dtype()
    x = _operand(ctx, a["self"], dt)
    if a["alpha"] != 1:
        x = ctx.emit1("multiply", x, _operand(ctx, a["alpha"], dt))
    return ctx.emit1("subtract", _operand(ctx, a["other"], dt), x)


@aten_op("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    mode = a["rounding_mode"]
    x, y = _operand(ctx, a["self"], dt), _operand(ctx, a["other"], dt)
    if mode is None:
        return ctx.emit1("divide", x, y)
    if np.dtype(np_dtype(dt)).kind in "iu":
        q = ctx.emit1("divide", x, y)  # integer divide truncates toward zero
        if mode == "trunc":
            return q
        # floor: one less where the remainder is non-zero and the signs differ
        r = ctx.emit1("subtract", x, ctx.emit1("multiply", q, y))
        fix = ctx.emit1("logical_and", ctx.emit1("not_equal", r, ctx.scalar(0, r)),
                        ctx.emit1("not_equal", ctx.emit1("less", r, ctx.scalar(0, r)),
                                  ctx.emit1("less", y, ctx.scalar(0, y))))
        return ctx.emit1("subtract", q, ctx.cast(fix, dt))
    q = ctx.emit1("divide", x, y)
    if mode == "floor":
        return ctx.emit1("floor", q)
    if mode == "trunc":
        return ctx.emit1("multiply", ctx.emit1("sign", q), ctx.emit1("floor", ctx.emit1("abs", q)))
    raise ctx.unsupported(f"rounding_mode={mode!r}")


@aten_op("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    x, e = a["self"], a["exponent"]
    if not isinstance(e, Value):
        if e == 2:
            x = _operand(ctx, x, dt)
            return ctx.emit1("multiply", x, x)
        if e == 3:  # tanh-GELU's x**3 (GPT-2): two multiplies instead of a power per element
            x = _operand(ctx, x, dt)
            return ctx.emit1("multiply", ctx.emit1("multiply", x, x), x)
        if e == 0.5:
            return ctx.emit1("sqrt", _operand(ctx, x, dt))
        if e == 1:
            return _operand(ctx, x, dt)
    return ctx.emit1("power", _operand(ctx, x, dt), _operand(ctx, e, dt))


def _compare(ir_op: str) -> Any:
    def conv(ctx: Context, node: Any, a: Args) -> Value:
        x, y = a["self"], a["other"]
        dt = _compare_dtype(x, y)
        return ctx.emit1(ir_op, _operand(ctx, x, dt), _operand(ctx, y, dt))

    conv.__qualname__ = f"compare_{ir_op}"
    return conv


for _name, _op in {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal",
                   "gt": "greater", "ge": "greater_equal"}.items():
    aten_op(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare(_op))


# ------------------------------------------------------------------ no-ops and casts
@aten_op("aten.clone.default", "aten.alias.default", "aten.detach.default",
         "aten.lift_fresh_copy.default", "aten.contiguous.default", "aten.dropout.default",
         "aten.feature_dropout.default", "aten.alpha_dropout.default")
def _passthrough(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"] if "self" in a else a["input"]
    if a.get("train"):
        raise ctx.unsupported("dropout in training mode (call module.eval() before export)")
    return x


@aten_op("aten.native_dropout.default")
def _native_dropout(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    if a["train"]:
        raise ctx.unsupported("dropout in training mode (call module.eval() before export)")
    return [a["input"], None]


@aten_op("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
         "aten.type_as.default")
def _to_copy(ctx: Context, node: Any, a: Args) -> Value:
    return ctx.cast(a["self"], ctx.out_dtype())


@aten_op("aten._assert_tensor_metadata.default")
def _assert_metadata(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    return []  # a trace-time check of a tensor torch already typed; nothing to compute


# ------------------------------------------------------------------ shape ops
def reshape_out(ctx: Context, x: Value) -> Value:
    """``x`` reshaped to the dims torch recorded for the node (symbolic ones included), keeping
    an iota (:attr:`Context.iotas`) when only unit dims change."""
    y = ctx.reshape_dims(x, ctx.out_dims())
    if x in ctx.iotas and sum(d != 1 for d in y.type.dims) <= 1:
        ctx.iotas[y] = ctx.iotas[x]
    return y


@aten_op("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
         "aten.view_copy.default")
def _view(ctx: Context, node: Any, a: Args) -> Value:
    return reshape_out(ctx, a["self"])


@aten_op("aten.flatten.using_ints", "aten.squeeze.default", "aten.squeeze.dim",
         "aten.squeeze.dims", "aten.unsqueeze.default", "aten.unflatten.int")
def _reshape_like(ctx: Context, node: Any, a: Args) -> Value:
    # Each of these only renames the dims; torch recorded the result shape.
    return reshape_out(ctx, a["self"])


@aten_op("aten.permute.default")
def _permute(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    axes = tuple(_dim(ctx, d, x.type.ndim) for d in a["dims"])
    if axes == tuple(range(x.type.ndim)):
        return x
    return ctx.emit1("transpose", x, axes=axes)


@aten_op("aten.transpose.int")
def _transpose(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    if x.type.ndim < 2:
        return x
    d0, d1 = _dim(ctx, a["dim0"], x.type.ndim), _dim(ctx, a["dim1"], x.type.ndim)
    axes = list(range(x.type.ndim))
    axes[d0], axes[d1] = axes[d1], axes[d0]
    return x if d0 == d1 else ctx.emit1("transpose", x, axes=tuple(axes))


@aten_op("aten.t.default", "aten.numpy_T.default")
def _t(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    if x.type.ndim < 2:
        return x
    return ctx.emit1("transpose", x, axes=tuple(range(x.type.ndim))[::-1])


@aten_op("aten.expand.default", "aten.expand_as.default", "aten.broadcast_to.default")
def _expand(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    dims = ctx.out_dims()
    if x.type.ndim < len(dims):
        x = ctx.reshape_dims(x, (1,) * (len(dims) - x.type.ndim) + tuple(x.type.dims))
    return ctx.broadcast_dims(x, dims)


@aten_op("aten.repeat.default")
def _repeat(ctx: Context, node: Any, a: Args) -> Value:
    if any(isinstance(r, str) for r in a["repeats"]):
        raise ctx.unsupported(f"repeat by the symbolic counts {tuple(a['repeats'])}")
    x, reps = a["self"], tuple(int(r) for r in a["repeats"])
    if len(reps) > x.type.ndim:
        x = ctx.reshape(x, (1,) * (len(reps) - x.type.ndim) + x.shape)
    return ctx.emit1("tile", x, reps=reps)


@aten_op("aten.cat.default", "aten.concat.default", "aten.concatenate.default")
def _cat(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    shape = ctx.out_shape()
    # torch accepts 1-D empty tensors in a cat of any rank (legacy); they add nothing.
    parts = [ctx.cast(t, dt) for t in a["tensors"] if t.type.size > 0]
    if not parts:
        return ctx.const(np.zeros(shape, dtype=np_dtype(dt)))
    if len(parts) == 1:
        return parts[0]
    return ctx.emit1("concatenate", *parts, axis=_dim(ctx, a["dim"], len(shape)))


@aten_op("aten.stack.default")
def _stack(ctx: Context, node: Any, a: Args) -> Value:
    dt, shape = ctx.out_dtype(), ctx.out_shape()
    axis = _dim(ctx, a["dim"], len(shape))
    parts = [ctx.reshape_dims(ctx.cast(t, dt), t.type.dims[:axis] + (1,) + t.type.dims[axis:])
             for t in a["tensors"]]
    return parts[0] if len(parts) == 1 else ctx.emit1("concatenate", *parts, axis=axis)


@aten_op("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    axis = _dim(ctx, a["dim"], x.type.ndim)
    n = x.shape[axis]
    d = x.type.dims[axis]
    out = ctx.out_dims()[axis]
    start, end, step = a["start"], a["end"], a["step"] or 1
    if isinstance(d, str) or isinstance(out, str) or isinstance(start, str) or \
            isinstance(end, str):
        return _slice_symbolic(ctx, x, axis, start, end, step, out)
    start = 0 if start is None else int(start)
    end = n if end is None else int(end)
    step = int(step)
    # clamp like Python slicing: torch uses sys.maxsize for "to the end"
    start, end, _ = slice(start, end, step).indices(n)
    if (start, end, step) == (0, n, 1):
        return x
    return ctx.emit1("strided_slice", x, begin=(start,), end=(end,), strides=(step,),
                     axes=(axis,))


def _slice_symbolic(ctx: Context, x: Value, axis: int, start: Any, end: Any, step: Any,
                    out: Any) -> Value:
    """A slice involving a symbolic dim: of a symbolic axis from its start, or of a static axis
    to a symbolic length (``position_ids[:, :seq]``, a ``take`` of an iota)."""
    d = x.type.dims[axis]
    begin = 0 if start is None else start
    if isinstance(begin, str) or isinstance(step, str) or int(step) != 1:
        raise ctx.unsupported(f"slicing dim {d} of {x.type} from {start} to {end} step {step} "
                              f"(symbolic slices must start at a static index, step 1)")
    begin = int(begin)
    if isinstance(d, str):
        if begin == 0 and sym.canonical(out) == d:
            return x  # the whole symbolic axis, e.g. x[:, :seq] or x[:, :INT_MAX]
        if isinstance(end, int) and 0 <= begin < end and end <= 1:
            return ctx.emit1("strided_slice", x, begin=(begin,), end=(end,), strides=(1,),
                             axes=(axis,))
        raise ctx.unsupported(f"slicing the symbolic dim {d} (axis {axis} of {x.type}) from "
                              f"{start} to {end}: only the whole axis or its first element "
                              f"(the padded layout keeps the data at the start of each dim)")
    if isinstance(out, int):  # torch decided the length from the ranges
        if begin < 0:
            begin += d
        return ctx.emit1("strided_slice", x, begin=(begin,), end=(begin + out,), strides=(1,),
                         axes=(axis,))
    # static axis, symbolic length: take(x, begin + arange(out))
    if begin < 0:
        begin += d
    idx = iota(ctx, out, "int64", begin)
    return ctx.emit1("take", x, idx, axis=axis)


def iota(ctx: Context, n: Any, dtype: str, start: int = 0) -> Value:
    """``start + arange(n)`` of ``dtype`` for a symbolic length ``n``: an exclusive running sum
    of ones broadcast to ``(n,)`` (as the ONNX frontend computes ``Range``)."""
    n = sym.canonical(n)
    lo, _ = sym.bounds(n, ctx.graph.dim_ranges)
    if lo < 0:
        raise ctx.unsupported(f"a range of symbolic length {n} that may be negative")
    ones = ctx.broadcast_dims(ctx.const(np.ones((1,), dtype=np_dtype(dtype))), (n,))
    idx = ctx.emit1("cumsum", ones, axis=0, exclusive=True)
    if start:
        idx = ctx.emit1("add", idx, ctx.const(np.array(start, dtype=np_dtype(dtype))))
    ctx.iotas[idx] = (n, start)
    return idx


def _axis_and_index(ctx: Context, x: Value, a: Args) -> tuple[int, int]:
    """``select``'s ``(dim, index)``, normalised; an InputError naming the node when out of range."""
    axis = _dim(ctx, a["dim"], x.type.ndim)
    n = x.shape[axis]
    if isinstance(a["index"], str) or (isinstance(x.type.dims[axis], str) and a["index"] != 0):
        raise ctx.unsupported(f"selecting index {a['index']} of dim {x.type.dims[axis]} of "
                              f"{x.type} (a symbolic dim can only be selected at index 0)")
    idx = int(a["index"])
    if not -n <= idx < n:
        raise ctx.bad(f"index {idx} is out of range for dim {axis} of size {n}")
    return axis, idx % n


@aten_op("aten.select.int", "aten.select_copy.int")
def _select(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    axis, idx = _axis_and_index(ctx, x, a)
    y = ctx.emit1("strided_slice", x, begin=(idx,), end=(idx + 1,), strides=(1,), axes=(axis,))
    return ctx.reshape_dims(y, x.type.dims[:axis] + x.type.dims[axis + 1:])


def _scatter_along(ctx: Context, x: Value, src: Value, axis: int, positions: range) -> Value:
    """``x`` with ``src`` written at ``positions`` along ``axis`` (functionalized slice writes).

    One ``take`` from ``concat(x, src)`` with a constant index: position i reads x[i], or
    src[k] where i is the k-th written position. Writes into constant tensors (swin's attention
    mask) fold to constants at import.
    """
    n = x.shape[axis]
    if len(positions) == 0:
        return x
    if isinstance(x.type.dims[axis], str):
        raise ctx.unsupported(f"writing into the symbolic dim {x.type.dims[axis]} of {x.type}")
    if positions == range(0, n):
        return ctx.broadcast_dims(src, x.type.dims)
    idx = np.arange(n, dtype=np.int64)
    idx[list(positions)] = n + np.arange(len(positions), dtype=np.int64)
    if positions.step == 1:
        parts = []
        if positions.start > 0:
            parts.append(ctx.emit1("strided_slice", x, begin=(0,), end=(positions.start,),
                                   strides=(1,), axes=(axis,)))
        parts.append(src)
        if positions.stop < n:
            parts.append(ctx.emit1("strided_slice", x, begin=(positions.stop,), end=(n,),
                                   strides=(1,), axes=(axis,)))
        return parts[0] if len(parts) == 1 else ctx.emit1("concatenate", *parts, axis=axis)
    both = ctx.emit1("concatenate", x, src, axis=axis)
    return ctx.emit1("take", both, ctx.const(idx), axis=axis)


@aten_op("aten.slice_scatter.default")
def _slice_scatter(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    src = ctx.cast(a["src"], x.dtype)
    axis = _dim(ctx, a["dim"], x.type.ndim)
    n = x.shape[axis]
    if isinstance(x.type.dims[axis], str) and a["start"] in (None, 0) and \
            tuple(src.type.dims) == tuple(x.type.dims) and a["step"] in (None, 1):
        return src  # the whole symbolic axis overwritten
    if any(isinstance(a[k], str) for k in ("start", "end", "step")):
        raise ctx.unsupported(f"slice_scatter with symbolic bounds into {x.type}")
    start = 0 if a["start"] is None else int(a["start"])
    end = n if a["end"] is None else int(a["end"])
    positions = range(*slice(start, end, int(a["step"] or 1)).indices(n))
    return _scatter_along(ctx, x, src, axis, positions)


@aten_op("aten.select_scatter.default")
def _select_scatter(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    axis, idx = _axis_and_index(ctx, x, a)
    src = ctx.reshape_dims(ctx.cast(a["src"], x.dtype),
                           x.type.dims[:axis] + (1,) + x.type.dims[axis + 1:])
    return _scatter_along(ctx, x, src, axis, range(idx, idx + 1))


@aten_op("aten.copy.default")
def _copy(ctx: Context, node: Any, a: Args) -> Value:
    # functional copy_: the result is src, broadcast to self's shape in self's dtype
    x, src = a["self"], a["src"]
    src = ctx.cast(src, x.dtype)
    if src.type.ndim < x.type.ndim:
        src = ctx.reshape_dims(src, (1,) * (x.type.ndim - src.type.ndim) + tuple(src.type.dims))
    return ctx.broadcast_dims(src, x.type.dims)


def _split(ctx: Context, x: Value, sizes: Sequence[int], axis: int) -> list[Value | None]:
    sizes = [int(s) for s in sizes]
    if len(sizes) == 1:
        return [x]
    return list(ctx.emit("split", [x], {"sections": tuple(sizes), "axis": axis}))


@aten_op("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
         "aten.unsafe_split.Tensor", "aten.split_with_sizes_copy.default",
         "aten.unbind.int", "aten.tensor_split.sections")
def _split_like(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    x = a["self"]
    axis = _dim(ctx, a["dim"], x.type.ndim)
    val = node.meta["val"]
    sizes = [ctx.dim(v.shape[axis]) if len(v.shape) == x.type.ndim else 1 for v in val]
    if any(isinstance(s, str) for s in sizes) or (isinstance(x.type.dims[axis], str)
                                                  and len(sizes) > 1):
        raise ctx.unsupported(f"splitting the symbolic dim {x.type.dims[axis]} of {x.type} "
                              f"into {sizes}")
    outs = _split(ctx, x, [int(k) for k in sizes], axis)
    if str(node.target) == "aten.unbind.int":
        return [ctx.reshape_dims(o, x.type.dims[:axis] + x.type.dims[axis + 1:])
                if o is not None else None for o in outs]
    return outs


# ------------------------------------------------------------------ matmuls
def _transposed_source(v: Value) -> Value | None:
    """``w`` if ``v`` is ``transpose(w, (1, 0))`` of a 2-D ``w``, else None.

    Decomposed ``linear`` is ``addmm(b, x, permute(w))``: reading through the permute gives
    one ``dense`` on the original weight instead of a transpose plus a matmul.
    """
    n = v.node
    if n is not None and n.op == "transpose" and n.attrs["axes"] == (1, 0):
        return n.inputs[0]
    return None


def _matmul2(ctx: Context, x: Value, w: Value) -> Value:
    src = _transposed_source(w) if w.type.ndim == 2 else None
    if src is not None:
        return ctx.emit1("dense", x, src)
    if w.type.ndim == 2 and ctx.is_static(w) and not x.is_constant:
        # A weight stored (in, out), as GPT-2's Conv1D does: dense wants (out, in), and the
        # transpose of a weight is folded at build time (one 768->3072 layer: matmul 11.4 ms,
        # dense 8.7 ms on Zen 3, 1 thread) -- the same choice the ONNX frontend makes.
        return ctx.emit1("dense", x, ctx.emit1("transpose", w, axes=(1, 0)))
    return ctx.emit1("matmul", x, w)


@aten_op("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _mm(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    w_in: Value = a["mat2"] if "mat2" in a else a["other"]
    x, w = ctx.cast(a["self"], dt), ctx.cast(w_in, dt)
    if x.type.ndim == 1 or w.type.ndim == 1:
        # torch.matmul with a vector: promote to a matrix, then drop the added dim
        x2 = ctx.reshape_dims(x, (1,) + x.type.dims) if x.type.ndim == 1 else x
        w2 = ctx.reshape_dims(w, w.type.dims + (1,)) if w.type.ndim == 1 else w
        return ctx.reshape_dims(ctx.emit1("matmul", x2, w2), ctx.out_dims())
    return _matmul2(ctx, x, w)


@aten_op("aten.addmm.default")
def _addmm(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    bias, x, w = (ctx.cast(a[k], dt) for k in ("self", "mat1", "mat2"))
    y = _matmul2(ctx, x, w)
    if a["alpha"] != 1:
        y = ctx.emit1("multiply", y, ctx.scalar(a["alpha"], y))
    if a["beta"] == 0:
        return y
    if a["beta"] != 1:
        bias = ctx.emit1("multiply", bias, ctx.scalar(a["beta"], bias))
    return ctx.emit1("add", y, bias)


@aten_op("aten.linear.default")
def _linear(ctx: Context, node: Any, a: Args) -> Value:
    x, w, b = a["input"], a["weight"], a["bias"]
    if w.type.ndim != 2:
        raise ctx.bad(f"linear weight must be 2-D, got shape {w.shape}")
    y = ctx.emit1("dense", x, w) if x.type.ndim >= 1 else None
    if y is None:
        raise ctx.bad("linear of a 0-d input")
    return y if b is None else ctx.emit1("add", y, b)


# ------------------------------------------------------------------ reductions
def _reduce(ir_op: str) -> Any:
    def conv(ctx: Context, node: Any, a: Args) -> Value:
        x = a["self"]
        dt = ctx.out_dtype()
        if ir_op in ("reduce_mean", "reduce_sum", "reduce_prod"):
            x = ctx.cast(x, dt)
        dim = a.get("dim")
        axes = _axes(dim, x.type.ndim, ctx) if x.type.ndim else ()
        keep = bool(a.get("keepdim", False))
        if not axes:
            return x
        return ctx.emit1(ir_op, x, axes=axes, keepdims=keep)

    conv.__qualname__ = f"reduce_{ir_op}"
    return conv


aten_op("aten.mean.dim", "aten.mean.default")(_reduce("reduce_mean"))
aten_op("aten.sum.dim_IntList", "aten.sum.default")(_reduce("reduce_sum"))
aten_op("aten.amax.default")(_reduce("reduce_max"))
aten_op("aten.amin.default")(_reduce("reduce_min"))
aten_op("aten.prod.dim_int", "aten.prod.default")(_reduce("reduce_prod"))


@aten_op("aten.max.default", "aten.min.default")
def _max_all(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    op = "reduce_max" if "max" in str(node.target) else "reduce_min"
    return ctx.emit1(op, x, axes=tuple(range(x.type.ndim)), keepdims=False)


@aten_op("aten.argmax.default", "aten.argmin.default")
def _argmax(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    op = "argmax" if "argmax" in str(node.target) else "argmin"
    if a["dim"] is None:
        x = ctx.reshape(x, (max(x.type.size, 1),) if x.type.ndim else (1,))
        y = ctx.emit1(op, x, axis=0, keepdims=False)
        return ctx.reshape_dims(y, ctx.out_dims())
    return ctx.emit1(op, x, axis=_dim(ctx, a["dim"], x.type.ndim), keepdims=bool(a["keepdim"]))


@aten_op("aten.var.correction", "aten.var.dim")
def _var(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    axes = _axes(a["dim"], x.type.ndim, ctx)
    corr = a.get("correction")
    if corr is None:
        corr = 1 if a.get("unbiased", True) else 0
    mean = ctx.emit1("reduce_mean", x, axes=axes, keepdims=True)
    d = ctx.emit1("subtract", x, mean)
    s = ctx.emit1("reduce_sum", ctx.emit1("multiply", d, d), axes=axes,
                  keepdims=bool(a["keepdim"]))
    dims = [x.type.dims[i] for i in axes]
    if any(isinstance(k, str) for k in dims) and float(corr).is_integer():
        # the count of a symbolic axis is known at run time only (never its upper bound)
        count = sym.sub(_prod(dims), int(corr))
        return ctx.emit1("divide", s, ctx.size_value(count, s.dtype))
    n = math.prod(x.shape[i] for i in axes)
    return ctx.emit1("divide", s, ctx.scalar(max(n - float(corr), 0.0), s))


def _prod(dims: Sequence[Any]) -> Any:
    out: Any = 1
    for d in dims:
        out = sym.mul(out, d)
    return out
