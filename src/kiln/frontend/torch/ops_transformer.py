"""ATen converters: the transformer ops (softmax, norms, embedding, attention, masks, indexing).

Owns softmax / log-softmax, layer norm and RMS norm, ``embedding``,
``scaled_dot_product_attention`` and its backend-specific variants, the tensor factories and
mask ops (``full`` / ``arange`` / ``ones_like`` ..., ``triu`` / ``tril``, ``where``,
``masked_fill``, ``any`` / ``all``), the gathers (``index.Tensor``, ``index_select``,
``gather``), ``cumsum`` and ``baddbmm``. Elementwise math, shape ops and matmuls are
:mod:`.ops_core`'s. Imports only ``kiln.ir`` / ``kiln.runtime`` and :mod:`.converter`, never
``torch``: arguments arrive bound by schema name.

Two choices shape this file:

* **Keep the fused ops whole.** Registering ``layer_norm``, ``scaled_dot_product_attention``,
  ``softmax`` ... here also keeps them out of ``run_decompositions`` (the converter removes every
  registered op from the decomposition table), so a transformer block becomes ``layer_norm`` /
  ``rms_norm`` / ``softmax`` IR ops with one kernel each instead of a dozen elementwise ops and
  reductions, and attention becomes two batched ``matmul`` s around one ``softmax``.
* **Masks are constants.** Kiln compiles static shapes, so a mask built from ``arange``,
  ``full``, ``triu`` and comparisons of them (causal masks, position ids, T5's relative
  buckets) has all-constant inputs and is folded at import by :meth:`Context.emit`; attention
  then adds one constant bias. Only masks that depend on a runtime input cost runtime ops.
  With symbolic dims (``torch.export.Dim``) a mask over the sequence is computed at run time:
  ``arange(seq)`` is a runtime iota, and indexing a tensor with iotas over its own symbolic dims
  (transformers' ``mask[batch_idx, kv_idx]``) is a reshape.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ...ir import Value
from ...ir.types import np_dtype
from ...runtime import sym
from .converter import Args, Context, aten_op
from .ops_core import iota

__all__: list[str] = []

#: Factories larger than this (elements) are emitted as a runtime ``broadcast_to`` of a scalar
#: instead of a materialised constant, so a ``full_like(scores, 0)`` does not put a
#: batch x heads x seq x seq array into the library (the same bound Context.emit folds under).
_CONST_LIMIT = 1 << 16


# ------------------------------------------------------------------ helpers
def _dim(ctx: Context, dim: int, ndim: int) -> int:
    return ctx.axis(int(dim), max(ndim, 1), "dim")


def _tensor(ctx: Context, x: Any, dtype: str) -> Value:
    """``x`` as a Value of ``dtype``: Values are cast, Python numbers become 0-d constants."""
    if isinstance(x, Value):
        return ctx.cast(x, dtype)
    return ctx.const(np.asarray(x, dtype=np_dtype(dtype)))


def _filled(ctx: Context, value: Any, shape: Sequence[Any], dtype: str) -> Value:
    """A tensor of ``shape`` holding ``value``: a constant when small, else a broadcast (always
    a broadcast with ``sym_shape`` when a dim is symbolic)."""
    if isinstance(value, str):
        raise ctx.unsupported(f"a tensor filled with the symbolic size {value}")
    if any(isinstance(d, str) for d in shape):
        return ctx.broadcast_dims(ctx.const(np.asarray(value, dtype=np_dtype(dtype))), shape)
    shape = tuple(int(d) for d in shape)
    ctx.check_size(shape, "filled tensor")
    scalar = np.asarray(value, dtype=np_dtype(dtype))
    if math.prod(shape) <= _CONST_LIMIT:
        return ctx.const(np.broadcast_to(scalar, shape).copy())
    return ctx.emit1("broadcast_to", ctx.const(scalar), shape=shape)


def _norm_axis(ctx: Context, x: Value, normalized_shape: Sequence[int]) -> int:
    """The first normalised dim of a layer/RMS norm over ``x.shape[-len(normalized_shape):]``."""
    ns = tuple(int(d) for d in normalized_shape)
    if not ns or x.shape[x.type.ndim - len(ns):] != ns:
        raise ctx.bad(f"normalized_shape {ns} does not match the trailing dims of input shape "
                      f"{x.shape}")
    return x.type.ndim - len(ns)


def _affine(ctx: Context, w: Value | None, fill: float, shape: Sequence[int], dtype: str
            ) -> Value:
    """A norm's weight / bias, or the constant ``fill`` in its place when it is None."""
    if w is None:
        return ctx.const(np.full(tuple(shape), fill, dtype=np_dtype(dtype)))
    return ctx.cast(w, dtype)


# ------------------------------------------------------------------ softmax
@aten_op("aten._softmax.default", "aten.softmax.int")
def _softmax(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    return ctx.emit1("softmax", x, axis=_dim(ctx, a["dim"], x.type.ndim))


@aten_op("aten._log_softmax.default", "aten.log_softmax.int")
def _log_softmax(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    return ctx.emit1("log_softmax", x, axis=_dim(ctx, a["dim"], x.type.ndim))


@aten_op("aten._safe_softmax.default")
def _safe_softmax(ctx: Context, node: Any, a: Args) -> Value:
    """Softmax whose rows of only ``-inf`` are zeros instead of NaN (torch's attention uses it)."""
    x = ctx.cast(a["self"], ctx.out_dtype())
    axis = _dim(ctx, a["dim"], x.type.ndim)
    y = ctx.emit1("softmax", x, axis=axis)
    top = ctx.emit1("reduce_max", x, axes=(axis,), keepdims=True)
    dead = ctx.emit1("equal", top, ctx.scalar(-np.inf, x))
    return ctx.emit1("where", dead, ctx.scalar(0.0, x), y)


# ------------------------------------------------------------------ norms
@aten_op("aten.layer_norm.default", "aten.native_layer_norm.default")
def _layer_norm(ctx: Context, node: Any, a: Args) -> Value | list[Value | None]:
    x = ctx.cast(a["input"], ctx.out_dtype())
    axis = _norm_axis(ctx, x, a["normalized_shape"])
    ns = x.shape[axis:]
    w = _affine(ctx, a["weight"], 1.0, ns, x.dtype)
    b = _affine(ctx, a["bias"], 0.0, ns, x.dtype)
    y = ctx.emit1("layer_norm", x, w, b, axis=axis, epsilon=float(a["eps"]))
    if str(node.target) == "aten.layer_norm.default":
        return y
    # native_layer_norm also returns the statistics; nothing in inference reads them, so they
    # are only computed when a later node does (dead-code elimination drops them otherwise).
    axes = tuple(range(axis, x.type.ndim))
    mean = ctx.emit1("reduce_mean", x, axes=axes, keepdims=True)
    centred = ctx.emit1("subtract", x, mean)
    var = ctx.emit1("reduce_mean", ctx.emit1("multiply", centred, centred), axes=axes,
                    keepdims=True)
    rstd = ctx.emit1("rsqrt", ctx.emit1("add", var, ctx.scalar(float(a["eps"]), var)))
    return [y, mean, rstd]


@aten_op("aten.rms_norm.default", "aten._fused_rms_norm.default")
def _rms_norm(ctx: Context, node: Any, a: Args) -> Value | list[Value | None]:
    x = ctx.cast(a["input"], ctx.out_dtype())
    axis = _norm_axis(ctx, x, a["normalized_shape"])
    # torch's default epsilon is the machine epsilon of the input's dtype
    eps = a["eps"] if a["eps"] is not None else float(np.finfo(np_dtype(x.dtype)).eps)
    w = _affine(ctx, a["weight"], 1.0, x.shape[axis:], x.dtype)
    y = ctx.emit1("rms_norm", x, w, axis=axis, epsilon=float(eps))
    if str(node.target) == "aten.rms_norm.default":
        return y
    axes = tuple(range(axis, x.type.ndim))
    ms = ctx.emit1("reduce_mean", ctx.emit1("multiply", x, x), axes=axes, keepdims=True)
    return [y, ctx.emit1("rsqrt", ctx.emit1("add", ms, ctx.scalar(float(eps), ms)))]


# ------------------------------------------------------------------ embedding and gathers
@aten_op("aten.embedding.default")
def _embedding(ctx: Context, node: Any, a: Args) -> Value:
    # padding_idx only changes the gradient: the forward pass is a plain row gather
    return ctx.emit1("take", a["weight"], ctx.cast(a["indices"], "int64"), axis=0)


@aten_op("aten.index_select.default")
def _index_select(ctx: Context, node: Any, a: Args) -> Value:
    x = a["self"]
    idx = ctx.cast(a["index"], "int64")
    axis = _dim(ctx, a["dim"], x.type.ndim)
    if x.type.ndim == 0:
        return ctx.reshape(ctx.emit1("take", ctx.reshape(x, (1,)), idx, axis=0), ())
    return ctx.emit1("take", x, ctx.reshape(idx, (idx.type.size,)), axis=axis)


@aten_op("aten.gather.default")
def _gather(ctx: Context, node: Any, a: Args) -> Value:
    x, idx = a["self"], ctx.cast(a["index"], "int64")
    axis = _dim(ctx, a["dim"], x.type.ndim)
    if x.type.ndim != idx.type.ndim:
        raise ctx.bad(f"gather index rank {idx.type.ndim} differs from input rank {x.type.ndim}")
    # torch lets the index be smaller than the input in the non-gathered dims: read the
    # matching corner of the input (GatherElements wants equal sizes there)
    if any(i != axis and idx.shape[i] != x.shape[i] for i in range(x.type.ndim)):
        ends = [x.shape[i] if i == axis else idx.shape[i] for i in range(x.type.ndim)]
        x = ctx.emit1("strided_slice", x, begin=[0] * x.type.ndim, end=ends,
                      strides=[1] * x.type.ndim, axes=list(range(x.type.ndim)))
    return ctx.emit1("gather_elements", x, idx, axis=axis)


@aten_op("aten.index.Tensor", "aten._unsafe_index.Tensor")
def _index(ctx: Context, node: Any, a: Args) -> Value:
    """Advanced indexing ``x[..., i0, i1, ...]`` with tensor indices on some dims.

    Indices on consecutive dims become one ``take`` on those dims merged into one (their
    linear index computed from the broadcast index tensors); indices on dims apart are first
    moved to the front by a transpose; static inputs are evaluated here.
    """
    x = a["self"]
    indices: list[Value | None] = list(a["indices"])
    nd = x.type.ndim
    if len(indices) > nd:
        raise ctx.bad(f"{len(indices)} indices for a {nd}-D tensor")
    indices += [None] * (nd - len(indices))
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        return x
    if any(x.type.sym is not None and isinstance(x.type.dims[d], str) for d in dims) or \
            any(i is not None and i.type.sym is not None for i in indices):
        return _index_symbolic(ctx, x, indices, dims)
    data = ctx.try_static(x)
    keys = [ctx.try_static(indices[d]) for d in dims]
    if data is not None and all(k is not None for k in keys):
        key = tuple(keys[dims.index(d)] if d in dims else slice(None) for d in range(nd))
        return ctx.const(np.ascontiguousarray(data[key]))
    for d in dims:
        if indices[d].dtype == "bool":  # type: ignore[union-attr]
            raise ctx.unsupported("boolean-mask indexing of a runtime tensor (its output shape "
                                  "depends on the data)")
    if dims != list(range(dims[0], dims[-1] + 1)):
        # indices on non-adjacent dims: torch (like NumPy) puts the indexed result dims first,
        # which is what adjacent indices on the leading dims give after moving them there
        rest = [d for d in range(nd) if d not in dims]
        x = ctx.emit1("transpose", x, axes=tuple(dims + rest))
        indices = [indices[d] for d in dims] + [None] * len(rest)
        dims = list(range(len(dims)))
    first, last = dims[0], dims[-1]
    sizes = x.shape[first:last + 1]
    bshape = np.broadcast_shapes(*(indices[d].shape for d in dims))  # type: ignore[union-attr]
    linear: Value | None = None
    for k, d in enumerate(dims):
        i = ctx.cast(indices[d], "int64")  # type: ignore[arg-type]
        n = ctx.const(np.array(sizes[k], dtype=np.int64))
        # torch counts negative indices from the end of their own dim
        i = ctx.emit1("where", ctx.emit1("less", i, ctx.const(np.array(0, np.int64))),
                      ctx.emit1("add", i, n), i)
        stride = math.prod(sizes[k + 1:])
        if stride != 1:
            i = ctx.emit1("multiply", i, ctx.const(np.array(stride, dtype=np.int64)))
        linear = i if linear is None else ctx.emit1("add", linear, i)
    assert linear is not None
    if tuple(linear.shape) != tuple(bshape):
        linear = ctx.emit1("broadcast_to", linear, shape=tuple(bshape))
    merged = ctx.reshape(x, x.shape[:first] + (math.prod(sizes),) + x.shape[last + 1:])
    return ctx.emit1("take", merged, linear, axis=first)


def _index_symbolic(ctx: Context, x: Value, indices: list[Value | None], dims: list[int]
                    ) -> Value:
    """Advanced indexing over symbolic dims: only with iotas (``arange`` of each indexed dim's
    own extent) laid out in order, which select every element and so are a reshape to the
    recorded shape (transformers' ``mask[batch_arange[:, None, None, None], kv_arange]``)."""
    out = ctx.out_dims()
    positions = []
    for d in dims:
        i = indices[d]
        it = ctx.iotas.get(i) if i is not None else None
        if i is None or it is None or it[1] != 0 or sym.canonical(it[0]) != x.type.dims[d] or \
                sum(k != 1 for k in i.type.dims) > 1:
            raise ctx.unsupported(f"advanced indexing of {x.type} with a symbolic dim (only "
                                  f"indices that are arange of each indexed dim are supported)")
        positions.append(next((p for p, k in enumerate(i.type.dims) if k != 1), -1))
    if positions != sorted(positions) or dims != list(range(len(dims))) or \
            len(indices) - indices.count(None) != len(dims):
        raise ctx.unsupported(f"advanced indexing of {x.type} with reordering arange indices")
    return ctx.reshape_dims(x, out)


@aten_op("aten.cumsum.default")
def _cumsum(ctx: Context, node: Any, a: Args) -> Value:
    x = ctx.cast(a["self"], ctx.out_dtype())
    if x.type.ndim == 0:
        return x
    return ctx.emit1("cumsum", x, axis=_dim(ctx, a["dim"], x.type.ndim))


@aten_op("aten.baddbmm.default")
def _baddbmm(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    bias, b1, b2 = (ctx.cast(a[k], dt) for k in ("self", "batch1", "batch2"))
    y = ctx.emit1("matmul", b1, b2)
    if a["alpha"] != 1:
        y = ctx.emit1("multiply", y, ctx.scalar(a["alpha"], y))
    if a["beta"] == 0:
        return y  # torch ignores self (even NaN) when beta is 0
    if a["beta"] != 1:
        bias = ctx.emit1("multiply", bias, ctx.scalar(a["beta"], bias))
    return ctx.emit1("add", y, bias)


# ------------------------------------------------------------------ attention
def _additive_mask(ctx: Context, mask: Value | None, causal: bool, lq: Any, lk: Any,
                   dtype: str) -> tuple[Value | None, Value | None]:
    """(bias to add to the scores, or None; 0/1 multiplier of rows that may attend to nothing).

    torch returns zeros for a query row that may attend to no key (a fully masked boolean row);
    a plain softmax over ``-inf`` would give NaN. Such rows get a finite bias instead (their
    softmax is harmless) and are zeroed afterwards by the returned row multiplier. With a
    constant mask the multiplier is a constant (and None when no row is fully masked).
    """
    allowed: np.ndarray | None = None
    if causal and (isinstance(lq, str) or isinstance(lk, str)):
        raise ctx.unsupported(f"is_causal attention over the symbolic lengths {lq} x {lk} (pass "
                              f"an explicit mask)")
    if causal:  # torch's is_causal: top-left aligned lower triangle
        allowed = np.tril(np.ones((lq, lk), dtype=bool))
    if mask is None:
        return (None if allowed is None else
                ctx.const(np.where(allowed, 0.0, -np.inf).astype(np_dtype(dtype)))), None
    static = ctx.try_static(mask)
    if mask.dtype == "bool" and static is not None:
        allowed = static if allowed is None else np.logical_and(static, allowed)
    elif mask.dtype == "bool":
        if allowed is not None:
            mask = ctx.emit1("logical_and", mask, ctx.const(allowed))
        lowest = float(np.finfo(np_dtype(dtype)).min)
        bias = ctx.emit1("where", mask, ctx.const(np.array(0.0, np_dtype(dtype))),
                         ctx.const(np.array(lowest, np_dtype(dtype))))
        rows = ctx.emit1("reduce_max", ctx.cast(mask, "int32"), axes=(mask.type.ndim - 1,),
                         keepdims=True)
        return bias, ctx.cast(rows, dtype)
    else:  # a float mask is added as it is (torch does the same)
        bias = ctx.cast(mask, dtype)
        if allowed is not None:
            bias = ctx.emit1("add", bias, ctx.const(
                np.where(allowed, 0.0, -np.inf).astype(np_dtype(dtype))))
        return bias, None
    assert allowed is not None
    if allowed.all():
        return None, None
    live = allowed.any(axis=-1, keepdims=True)
    bias = ctx.const(np.where(allowed | ~live, 0.0, -np.inf).astype(np_dtype(dtype)))
    return bias, (None if live.all() else ctx.const(live.astype(np_dtype(dtype))))


def _repeat_heads(ctx: Context, x: Value, heads: int) -> Value:
    """(..., h, S, E) -> (..., heads, S, E), each of the h heads repeated heads/h times."""
    *batch, h, s, e = x.shape
    if heads == h:
        return x
    if h == 0 or heads % h:
        raise ctx.bad(f"enable_gqa: {heads} query heads are not a multiple of {h} key heads")
    rep = heads // h
    x = ctx.reshape(x, (*batch, h, 1, s, e))
    x = ctx.emit1("broadcast_to", x, shape=(*batch, h, rep, s, e))
    return ctx.reshape(x, (*batch, heads, s, e))


def attention(ctx: Context, q: Value, k: Value, v: Value, mask: Value | None, causal: bool,
              scale: float | None, gqa: bool, lse: bool = False) -> tuple[Value, Value | None]:
    """softmax(q k^T * scale + mask) v as Kiln IR ops; returns (output, log-sum-exp or None).

    The scale multiplies ``q`` (``L x E`` elements) rather than the scores (``L x S``); the
    products are batched ``matmul`` s, which run on the tuned matmul kernels.

    Parameters
    ----------
    ctx : Context
        The conversion context (errors name its current FX node).
    q, k, v : Value
        ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)``; with ``gqa`` the key/value head dim
        (``-3``) may divide the query's.
    mask : Value or None
        Boolean (True: may attend) or additive float mask broadcasting to ``(..., L, S)``.
    causal : bool
        Also apply torch's top-left aligned causal mask.
    scale : float or None
        Score scale; None is ``1 / sqrt(E)``.
    gqa : bool
        Repeat each key/value head for its group of query heads (``enable_gqa``).
    lse : bool
        Also compute the log-sum-exp of the scaled scores, ``(..., L)`` (the
        ``_scaled_dot_product_*`` variants return it).

    Returns
    -------
    out : Value
        ``(..., L, Ev)``.
    lse : Value or None
        The log-sum-exp when ``lse`` is set.
    """
    dt = q.dtype
    k, v = ctx.cast(k, dt), ctx.cast(v, dt)
    if q.type.ndim < 2:
        raise ctx.bad(f"attention query must be at least 2-D, got shape {q.shape}")
    lq, e = q.type.dims[-2:]
    lk = k.type.dims[-2]
    if isinstance(e, str):
        raise ctx.unsupported(f"attention with the symbolic head dim {e}")
    if gqa and q.type.ndim >= 3:
        k = _repeat_heads(ctx, k, q.shape[-3])
        v = _repeat_heads(ctx, v, q.shape[-3])
    s = float(scale) if scale is not None else 1.0 / math.sqrt(e)
    if s != 1.0:
        q = ctx.emit1("multiply", q, ctx.scalar(s, q))
    perm = tuple(range(k.type.ndim - 2)) + (k.type.ndim - 1, k.type.ndim - 2)
    scores = ctx.emit1("matmul", q, ctx.emit1("transpose", k, axes=perm))
    # every layer of a model passes the same mask: convert it once per graph (the memo lives on
    # the context, which lives for one conversion)
    memo: dict[tuple[Any, ...], tuple[Value | None, Value | None]] = \
        ctx.__dict__.setdefault("_attention_masks", {})
    key = (mask, causal, lq, lk, dt)
    if key not in memo:
        memo[key] = _additive_mask(ctx, mask, causal, lq, lk, dt)
    bias, rows = memo[key]
    if bias is not None:
        scores = ctx.emit1("add", scores, bias)
    out = ctx.emit1("matmul", ctx.emit1("softmax", scores, axis=-1), v)
    if rows is not None:
        out = ctx.emit1("multiply", out, rows)
    if not lse:
        return out, None
    top = ctx.emit1("reduce_max", scores, axes=(scores.type.ndim - 1,), keepdims=True)
    total = ctx.emit1("add", ctx.emit1("log", ctx.emit1(
        "reduce_sum", ctx.emit1("exp", ctx.emit1("subtract", scores, top)),
        axes=(scores.type.ndim - 1,), keepdims=True)), top)
    return out, ctx.reshape(total, total.shape[:-1])


def _check_dropout(ctx: Context, p: Any) -> None:
    if p:
        raise ctx.unsupported(f"attention dropout_p={p}: inference graphs have no dropout "
                              f"(export the model in eval() mode)")


@aten_op("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: Context, node: Any, a: Args) -> Value:
    _check_dropout(ctx, a["dropout_p"])
    return attention(ctx, a["query"], a["key"], a["value"], a["attn_mask"], bool(a["is_causal"]),
                     a["scale"], bool(a["enable_gqa"]))[0]


@aten_op("aten._scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_flash_cpu(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    _check_dropout(ctx, a["dropout_p"])
    out, lse = attention(ctx, a["query"], a["key"], a["value"], a["attn_mask"],
                         bool(a["is_causal"]), a["scale"], False, lse=True)
    return [out, lse]


@aten_op("aten._scaled_dot_product_attention_math.default")
def _sdpa_math(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    _check_dropout(ctx, a["dropout_p"])
    q = a["query"]
    out, _ = attention(ctx, q, a["key"], a["value"], a["attn_mask"], bool(a["is_causal"]),
                       a["scale"], bool(a["enable_gqa"]))
    return [out, None]  # the attention weights: not computed (nothing in inference reads them)


@aten_op("aten._scaled_dot_product_efficient_attention.default")
def _sdpa_efficient(ctx: Context, node: Any, a: Args) -> list[Value | None]:
    _check_dropout(ctx, a["dropout_p"])
    out, lse = attention(ctx, a["query"], a["key"], a["value"], a["attn_bias"],
                         bool(a["is_causal"]), a["scale"], False,
                         lse=bool(a["compute_log_sumexp"]))
    return [out, lse, None, None]


# ------------------------------------------------------------------ factories
@aten_op("aten.full.default", "aten.new_full.default")
def _full(ctx: Context, node: Any, a: Args) -> Value:
    return _filled(ctx, a["fill_value"], ctx.out_dims(), ctx.out_dtype())


@aten_op("aten.full_like.default")
def _full_like(ctx: Context, node: Any, a: Args) -> Value:
    return _filled(ctx, a["fill_value"], ctx.out_dims(), ctx.out_dtype())


@aten_op("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default",
         "aten.empty.memory_format", "aten.empty_like.default", "aten.new_empty.default")
def _zeros(ctx: Context, node: Any, a: Args) -> Value:
    # empty*: any contents are valid; zeros make the result deterministic
    return _filled(ctx, 0, ctx.out_dims(), ctx.out_dtype())


@aten_op("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def _ones(ctx: Context, node: Any, a: Args) -> Value:
    return _filled(ctx, 1, ctx.out_dims(), ctx.out_dtype())


@aten_op("aten.fill.Scalar")
def _fill(ctx: Context, node: Any, a: Args) -> Value:
    return _filled(ctx, a["value"], ctx.out_dims(), ctx.out_dtype())


@aten_op("aten.scalar_tensor.default")
def _scalar_tensor(ctx: Context, node: Any, a: Args) -> Value:
    return ctx.const(np.asarray(a["s"], dtype=np_dtype(ctx.out_dtype())))


@aten_op("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx: Context, node: Any, a: Args) -> Value:
    start = a.get("start", 0)
    step = a.get("step", 1)
    n = ctx.out_dims()[0]
    if isinstance(n, str):
        return _arange_symbolic(ctx, start, step, n)
    if isinstance(start, str) or isinstance(step, str):
        raise ctx.unsupported(f"arange starting at {start} with step {step} (symbolic)")
    # start + i * step (torch's definition), computed in float64 and then cast: the recorded
    # length is authoritative, so no float-rounding of (end - start) / step can change it
    vals = start + np.arange(n, dtype=np.float64) * step
    dt = np_dtype(ctx.out_dtype())
    if np.dtype(dt).kind in "iu":
        vals = np.round(vals)
    return ctx.const(vals.astype(dt))


def _arange_symbolic(ctx: Context, start: Any, step: Any, n: str) -> Value:
    """``arange`` of the symbolic length ``n``: a runtime iota, scaled and shifted."""
    if isinstance(start, str) or isinstance(step, str):
        raise ctx.unsupported(f"arange of length {n} starting at {start} with step {step} "
                              f"(a symbolic start or step)")
    dt = ctx.out_dtype()
    integral = np.dtype(np_dtype(dt)).kind in "iu"
    if integral and float(start).is_integer() and float(step).is_integer():
        idx = iota(ctx, n, dt, int(start)) if step == 1 else iota(ctx, n, dt)
        if step != 1:
            idx = ctx.emit1("multiply", idx, ctx.const(np.array(int(step), np_dtype(dt))))
            if start:
                idx = ctx.emit1("add", idx, ctx.const(np.array(int(start), np_dtype(dt))))
        return idx
    idx = ctx.cast(iota(ctx, n, "int64"), dt)
    if step != 1:
        idx = ctx.emit1("multiply", idx, ctx.scalar(step, idx))
    if start:
        idx = ctx.emit1("add", idx, ctx.scalar(start, idx))
    return idx


# ------------------------------------------------------------------ masks
@aten_op("aten.triu.default", "aten.tril.default")
def _trilu(ctx: Context, node: Any, a: Args) -> Value:
    upper = str(node.target) == "aten.triu.default"
    return ctx.emit1("trilu", a["self"], upper=upper, k=int(a["diagonal"]))


@aten_op("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    cond = ctx.cast(a["condition"], "bool")
    return ctx.emit1("where", cond, _tensor(ctx, a["self"], dt), _tensor(ctx, a["other"], dt))


@aten_op("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx: Context, node: Any, a: Args) -> Value:
    dt = ctx.out_dtype()
    mask = ctx.cast(a["mask"], "bool")
    x = _tensor(ctx, a["self"], dt)
    y = ctx.emit1("where", mask, _tensor(ctx, a["value"], dt), x)
    if y.shape != x.shape:  # the mask broadcasts to self, never the other way round
        raise ctx.bad(f"masked_fill mask of shape {mask.shape} does not broadcast to {x.shape}")
    return y


def _any_all(ctx: Context, x: Value, dims: Sequence[int] | None, keep: bool, any_: bool) -> Value:
    nd = x.type.ndim
    axes = tuple(range(nd)) if not dims else tuple(sorted({_dim(ctx, d, nd) for d in dims}))
    if nd == 0:
        return ctx.cast(x, "bool")
    # bool has no reduction kernels: reduce 0/1 as int32 and compare back
    ints = ctx.cast(ctx.emit1("not_equal", x, ctx.scalar(0, x)) if x.dtype != "bool" else x,
                    "int32")
    red = ctx.emit1("reduce_max" if any_ else "reduce_min", ints, axes=axes, keepdims=keep)
    return ctx.emit1("not_equal", red, ctx.const(np.array(0, np.int32)))


@aten_op("aten.any.dim", "aten.any.dims", "aten.any.default")
def _any(ctx: Context, node: Any, a: Args) -> Value:
    dim = a.get("dim")
    return _any_all(ctx, a["self"], [dim] if isinstance(dim, int) else dim,
                    bool(a.get("keepdim", False)), True)


@aten_op("aten.all.dim", "aten.all.default")
def _all(ctx: Context, node: Any, a: Args) -> Value:
    dim = a.get("dim")
    return _any_all(ctx, a["self"], [dim] if isinstance(dim, int) else dim,
                    bool(a.get("keepdim", False)), False)


@aten_op("aten.__and__.Tensor", "aten.__or__.Tensor")
def _and_or(ctx: Context, node: Any, a: Args) -> Value:
    """``mask_a & mask_b`` / ``|``, as masks combine (transformers' causal and padding masks).

    Kept whole (not decomposed to ``bitwise_and``) so that bool operands become one
    ``logical_and`` / ``logical_or``; integer operands stay bitwise.
    """
    dt = ctx.out_dtype()
    x, y = _tensor(ctx, a["self"], dt), _tensor(ctx, a["other"], dt)
    is_and = str(node.target) == "aten.__and__.Tensor"
    if dt == "bool":
        return ctx.emit1("logical_and" if is_and else "logical_or", x, y)
    return ctx.emit1("bitwise_and" if is_and else "bitwise_or", x, y)
