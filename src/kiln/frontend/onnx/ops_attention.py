"""ONNX converters: Attention-family ops (Attention, RMSNormalization, RotaryEmbedding,
LinearAttention, CausalConvWithState, SwiGLU).

Attention decomposes into existing IR ops (``matmul``, ``softmax``, ``add``, ``where``, ...) so
its two products run on the tuned matmul kernels. Everything Kiln knows at import (the causal
and sliding-window frontiers, which follow from the static shapes) becomes one constant
additive bias; only masks that arrive at run time (``attn_mask``, ``nonpad_kv_seqlen``) add
runtime ops.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import Value
from ...ir.types import FLOAT_DTYPES
from .converter import Context, onnx_dtype, onnx_op

# ----------------------------------------------------------------------------- Attention
#: qk_matmul_output_mode values: QK^T, after the softcap, + bias, after softmax.
_QK_RAW, _QK_SOFTCAP, _QK_BIAS, _QK_SOFTMAX = 0, 1, 2, 3


def _heads_4d(ctx: Context, x: Value, heads: int, what: str) -> Value:
    """(B, S, heads * D) -> (B, heads, S, D)."""
    b, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise ctx.bad(f"{what} hidden size {hidden} is not divisible by {heads} heads")
    x = ctx.reshape(x, (b, s, heads, hidden // heads))
    return ctx.emit1("transpose", x, axes=(0, 2, 1, 3))


def _additive(ctx: Context, allowed: Value, dtype: str) -> Value:
    """A bool "may attend" tensor as an additive bias: 0 where allowed, -inf elsewhere."""
    return ctx.emit1("where", allowed, ctx.const(np.array(0.0), dtype),
                     ctx.const(np.array(-np.inf), dtype))


def _static_frontier(sq: int, skv: int, offset: int, causal: bool, left: int,
                     right: int) -> np.ndarray | None:
    """(sq, skv) bool: the causal/window constraints with a scalar offset, or None if none.

    A query at block row ``i`` sits at absolute position ``i + offset`` (``offset`` keys of
    the cache precede it); it may attend key ``j`` if ``j <= i + offset`` (causal) and
    ``left``/``right`` (-1: unbounded) keys either side of its position (window).
    """
    if not causal and left < 0 and right < 0:
        return None
    diff = np.arange(sq)[:, None] + offset - np.arange(skv)[None, :]
    allowed = np.ones((sq, skv), dtype=bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return allowed


def _nonpad_frontier(ctx: Context, nonpad: Value, sq: int, skv: int, causal: bool, left: int,
                     right: int) -> Value:
    """(B, 1, sq, skv) bool from a runtime ``nonpad_kv_seqlen`` (external cache).

    The valid keys are ``j < n[b]``; the query block ends at the last valid key, so row ``i``
    sits at position ``i + n[b] - sq`` and the frontier tests of :func:`_static_frontier`
    become comparisons of constant ``(sq, skv)`` grids against ``n[b]``.
    """
    bsz = nonpad.shape[0]
    n = ctx.reshape(ctx.cast(nonpad, "int64"), (bsz, 1, 1))
    i = np.arange(sq, dtype=np.int64)[:, None]
    j = np.arange(skv, dtype=np.int64)[None, :]
    grid = lambda a: ctx.const(np.broadcast_to(a, (sq, skv)).copy(), "int64")  # noqa: E731
    allowed = ctx.emit1("less", grid(j), n)  # padding: j < n
    if causal:  # j <= i + n - sq
        allowed = ctx.emit1("logical_and", allowed, ctx.emit1("less_equal", grid(j - i + sq), n))
    if left >= 0:  # i + n - sq - j <= left
        allowed = ctx.emit1("logical_and", allowed,
                            ctx.emit1("less_equal", n, grid(left + j - i + sq)))
    if right >= 0:  # j - (i + n - sq) <= right
        allowed = ctx.emit1("logical_and", allowed,
                            ctx.emit1("less_equal", grid(j - i + sq - right), n))
    return ctx.reshape(allowed, (bsz, 1, sq, skv))


@onnx_op("Attention")
def _attention(ctx: Context, node, ins, attrs):
    """Scaled dot-product attention (ONNX Attention-23/24/25), as matmul/softmax IR ops."""
    q, k, v = ins[:3]
    opt = list(ins[3:]) + [None] * (7 - len(ins))
    mask, past_k, past_v, nonpad = opt[0], opt[1], opt[2], opt[3]
    nd = q.type.ndim
    if nd not in (3, 4) or k.type.ndim != nd or v.type.ndim != nd:
        raise ctx.bad(f"Q {q.shape}, K {k.shape} and V {v.shape} must all be 3-D "
                      f"(batch, seq, hidden) or all 4-D (batch, heads, seq, head_size)")
    if q.dtype not in FLOAT_DTYPES:
        raise ctx.bad(f"Q must be a floating-point tensor, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ctx.bad(f"Q, K and V must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if (past_k is None) != (past_v is None):
        raise ctx.bad("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise ctx.bad("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    dt = q.dtype
    if nd == 3:
        if "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
            raise ctx.bad("3-D inputs need the q_num_heads and kv_num_heads attributes")
        q = _heads_4d(ctx, q, attrs["q_num_heads"], "Q")
        k = _heads_4d(ctx, k, attrs["kv_num_heads"], "K")
        v = _heads_4d(ctx, v, attrs["kv_num_heads"], "V")
    else:
        for name, x in (("q_num_heads", q), ("kv_num_heads", k)):
            if name in attrs and attrs[name] != x.shape[1]:
                raise ctx.bad(f"{name}={attrs[name]} does not match the 4-D input's "
                              f"{x.shape[1]} heads")
    bsz, hq, sq, dq = q.shape
    if k.shape[0] != bsz or v.shape[0] != bsz or k.shape[1] != v.shape[1] or k.shape[3] != dq \
            or k.shape[2] != v.shape[2]:
        raise ctx.bad(f"K {k.shape} and V {v.shape} (as (batch, heads, seq, head_size)) do not "
                      f"fit Q {q.shape}: batch, kv heads and kv length must agree and K's "
                      f"head size must be Q's")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ctx.bad(f"{hq} query heads are not a multiple of {hkv} key/value heads")

    scale = attrs.get("scale")
    scale = 1.0 / math.sqrt(dq) if scale is None else float(scale)
    if not scale > 0:  # as ONNX Runtime: the sqrt(scale) split below needs a positive scale
        raise ctx.bad(f"scale must be positive, got {scale}")
    past_len = 0
    present_k, present_v = k, v
    if past_k is not None:
        for name, p, x in (("past_key", past_k, k), ("past_value", past_v, v)):
            if p.type.ndim != 4 or p.shape[:2] != x.shape[:2] or p.shape[3] != x.shape[3] \
                    or p.dtype != dt:
                raise ctx.bad(f"{name} {p.shape} {p.dtype} must be (batch, kv_heads, past_len, "
                              f"head_size) = ({x.shape[0]}, {x.shape[1]}, *, {x.shape[3]}) {dt}")
        past_len = past_k.shape[2]
        present_k = ctx.emit1("concatenate", past_k, k, axis=2)
        present_v = ctx.emit1("concatenate", past_v, v, axis=2)
    # Q and K are each scaled by sqrt(scale) (in the input dtype) before the product, as the
    # ONNX function body does: it keeps half-precision logits in range.
    sqrt_scale = ctx.const(np.array(math.sqrt(scale)), dt)
    q = ctx.emit1("multiply", q, sqrt_scale)
    k = ctx.emit1("multiply", present_k, sqrt_scale)
    v = present_v
    skv = k.shape[2]

    # Grouped-query attention: query head h reads kv head h // rep. Folding the rep query heads
    # of one kv head into the row dim makes both products plain batched matmuls over kv heads,
    # with no copy of K or V.
    rep = hq // hkv
    scores = ctx.emit1("matmul", ctx.reshape(q, (bsz, hkv, rep * sq, dq)),
                       ctx.emit1("transpose", k, axes=(0, 1, 3, 2)))
    scores = ctx.reshape(scores, (bsz, hq, sq, skv))
    raw_scores = scores
    softcap = float(attrs.get("softcap", 0.0))
    if softcap > 0:
        cap = ctx.const(np.array(softcap), dt)
        scores = ctx.emit1("multiply", ctx.emit1("tanh", ctx.emit1("divide", scores, cap)), cap)

    bias, static_rows_masked = _attention_bias(ctx, attrs, mask, nonpad, dt, bsz, sq, skv,
                                               past_len)
    logits = scores if bias is None else ctx.emit1("add", scores, bias)

    mode = int(attrs.get("qk_matmul_output_mode", _QK_RAW))
    if mode not in (_QK_RAW, _QK_SOFTCAP, _QK_BIAS, _QK_SOFTMAX):
        raise ctx.unsupported(f"qk_matmul_output_mode={mode} (expected 0, 1, 2 or 3)")
    sm_in = logits
    if "softmax_precision" in attrs:
        sm_in = ctx.cast(logits, onnx_dtype(attrs["softmax_precision"]))
    probs = ctx.emit1("softmax", sm_in, axis=3)
    # A query row whose bias masks every key has no key to attend: its probabilities are 0 (the
    # softmax alone would give 0/0 = NaN). The test is on the bias, not the logits, so a NaN
    # or inf logit in a masked position cannot leak.
    if static_rows_masked is not None:
        if static_rows_masked.any():
            probs = ctx.emit1("where", ctx.const(static_rows_masked), ctx.const(np.array(0.0), probs.dtype),
                              probs)
    elif bias is not None:
        row_max = ctx.emit1("reduce_max", bias, axes=(-1,), keepdims=True)
        dead = ctx.emit1("equal", row_max, ctx.const(np.array(-np.inf), dt))
        probs = ctx.emit1("where", dead, ctx.const(np.array(0.0), probs.dtype), probs)
    probs = ctx.cast(probs, dt)

    dv = v.shape[3]
    y = ctx.emit1("matmul", ctx.reshape(probs, (bsz, hkv, rep * sq, skv)), v)
    y = ctx.reshape(y, (bsz, hq, sq, dv))
    if nd == 3:
        y = ctx.reshape(ctx.emit1("transpose", y, axes=(0, 2, 1, 3)), (bsz, sq, hq * dv))

    outs: list[Value | None] = [y, None, None, None]
    if len(node.output) > 1 and node.output[1]:
        outs[1] = present_k
    if len(node.output) > 2 and node.output[2]:
        outs[2] = present_v
    if len(node.output) > 3 and node.output[3]:
        # Mode 0 is QK^T before the softcap, as the spec and ONNX Runtime have it (the ONNX
        # reference implementation returns the softcapped scores for it too).
        qk = {_QK_RAW: raw_scores, _QK_SOFTCAP: scores, _QK_BIAS: logits, _QK_SOFTMAX: probs}[mode]
        if qk.shape != (bsz, hq, sq, skv):
            qk = ctx.emit1("broadcast_to", qk, shape=(bsz, hq, sq, skv))
        outs[3] = qk
    return outs


def _attention_bias(ctx: Context, attrs: dict, mask: Value | None, nonpad: Value | None,
                    dt: str, bsz: int, sq: int, skv: int, past_len: int
                    ) -> tuple[Value | None, np.ndarray | None]:
    """The additive attention bias and, when it is static, its fully-masked rows.

    Returns
    -------
    bias : Value or None
        Broadcastable to ``(B, H, sq, skv)``; None when nothing is masked.
    rows_masked : numpy.ndarray or None
        For a bias known at import, a bool array (broadcastable to the probabilities) marking
        the rows whose every key is masked; None when the bias depends on runtime inputs.
    """
    causal = bool(attrs.get("is_causal", 0))
    left = int(attrs.get("left_window_size", -1))
    right = int(attrs.get("right_window_size", -1))
    if left < -1 or right < -1:
        raise ctx.bad(f"left_window_size={left} / right_window_size={right}: each must be -1 "
                      f"(unbounded) or non-negative")
    terms: list[Value] = []
    if nonpad is not None:
        if nonpad.type.ndim != 1 or nonpad.shape[0] != bsz or nonpad.dtype not in ("int32", "int64"):
            raise ctx.bad(f"nonpad_kv_seqlen must be a ({bsz},) int64 tensor, got "
                          f"{nonpad.shape} {nonpad.dtype}")
        terms.append(_additive(ctx, _nonpad_frontier(ctx, nonpad, sq, skv, causal, left, right), dt))
    else:
        allowed = _static_frontier(sq, skv, past_len, causal, left, right)
        if allowed is not None:
            terms.append(ctx.const(np.where(allowed, 0.0, -np.inf), dt))
    if mask is not None:
        if not 1 <= mask.type.ndim <= 4 or mask.shape[-2:-1] not in ((), (1,), (sq,)) or mask.shape[-1] > skv:
            raise ctx.bad(f"attn_mask {mask.shape} does not broadcast to (batch, heads, {sq}, "
                          f"{skv}) (its last dim may be shorter than {skv}: the rest is masked)")
        is_bool = mask.dtype == "bool"
        if not is_bool and mask.dtype not in FLOAT_DTYPES:
            raise ctx.bad(f"attn_mask must be bool or floating-point, got {mask.dtype}")
        if mask.shape[-1] < skv:
            pad = [(0, 0)] * (mask.type.ndim - 1) + [(0, skv - mask.shape[-1])]
            mask = ctx.emit1("pad", mask, pad_width=pad, value=0.0 if is_bool else -np.inf)
        terms.append(_additive(ctx, mask, dt) if is_bool else ctx.cast(mask, dt))
    if not terms:
        return None, None
    bias = terms[0]
    for t in terms[1:]:
        bias = ctx.emit1("add", bias, t)
    if bias.is_constant:
        return bias, np.isneginf(np.asarray(bias.const_value, np.float32).max(axis=-1, keepdims=True))
    return bias, None


# ----------------------------------------------------------------------------- RMSNormalization
@onnx_op("RMSNormalization")
def _rms_normalization(ctx: Context, node, ins, attrs):
    """``X / sqrt(mean(X^2 over axis..end) + epsilon) * scale`` as the fused ``rms_norm`` op."""
    x, scale = ins[0], ins[1]
    axis = ctx.axis(attrs.get("axis", -1), x.type.ndim)
    stash = attrs.get("stash_type", 1)
    if stash != 1:
        raise ctx.unsupported(f"stash_type={stash} (only 1, float32 statistics, is supported)")
    if x.dtype not in FLOAT_DTYPES:
        raise ctx.bad(f"X must be a floating-point tensor, got {x.dtype}")
    return ctx.emit1("rms_norm", x, ctx.cast(scale, x.dtype), axis=axis,
                     epsilon=attrs.get("epsilon", 1e-5))


# ----------------------------------------------------------------------------- RotaryEmbedding
def _last(ctx: Context, x: Value, begin: int, end: int, stride: int = 1) -> Value:
    """``x[..., begin:end:stride]``."""
    return ctx.emit1("strided_slice", x, begin=(begin,), end=(end,), strides=(stride,),
                     axes=(x.type.ndim - 1,))


@onnx_op("RotaryEmbedding")
def _rotary_embedding(ctx: Context, node, ins, attrs):
    """Rotate pairs of head dims by position-dependent angles (cos/sin caches), as slices,
    multiplies and a concatenate over the head dim."""
    x, cos, sin = ins[:3]
    pos = ins[3] if len(ins) > 3 else None
    nd = x.type.ndim
    if nd not in (3, 4):
        raise ctx.bad(f"X must be 4-D (batch, heads, seq, head_size) or 3-D (batch, seq, hidden), "
                      f"got shape {x.shape}")
    if x.dtype not in FLOAT_DTYPES:
        raise ctx.bad(f"X must be a floating-point tensor, got {x.dtype}")
    if nd == 3:
        heads = int(attrs.get("num_heads", 0))
        b, s, hidden = x.shape
        if heads <= 0 or hidden % heads:
            raise ctx.bad(f"3-D X needs num_heads > 0 dividing its hidden size {hidden}, got "
                          f"num_heads={heads}")
        xh = ctx.reshape(x, (b, s, heads, hidden // heads))  # (B, S, H, D)
    else:
        b, _, s, _ = x.shape
        xh = x  # (B, H, S, D)
    head = xh.shape[3]
    rd = int(attrs.get("rotary_embedding_dim", 0)) or head
    if rd > head or rd % 2:
        raise ctx.bad(f"rotary_embedding_dim {rd} must be even and at most the head size {head}")
    half = rd // 2
    if pos is not None:
        if pos.shape != (b, s) or pos.dtype not in ("int32", "int64"):
            raise ctx.bad(f"position_ids must be a ({b}, {s}) integer tensor, got {pos.shape} "
                          f"{pos.dtype}")
        for name, c in (("cos_cache", cos), ("sin_cache", sin)):
            if c.type.ndim != 2 or c.shape[1] != half:
                raise ctx.bad(f"{name} {c.shape} must be (max_position, {half}) with position_ids")
        cos, sin = ctx.emit1("take", cos, pos, axis=0), ctx.emit1("take", sin, pos, axis=0)
    for name, c in (("cos_cache", cos), ("sin_cache", sin)):
        if c.shape != (b, s, half):
            raise ctx.bad(f"{name} {c.shape} must be ({b}, {s}, {half}) (rotary_embedding_dim / 2 "
                          f"= {half}) without position_ids")
    # The caches broadcast over the head dim: (B, S, 1, half) for (B, S, H, D) data,
    # (B, 1, S, half) for (B, H, S, D) data.
    cshape = (b, s, 1, half) if nd == 3 else (b, 1, s, half)
    cos = ctx.reshape(ctx.cast(cos, x.dtype), cshape)
    sin = ctx.reshape(ctx.cast(sin, x.dtype), cshape)
    if attrs.get("interleaved", 0):
        x1, x2 = _last(ctx, xh, 0, rd, 2), _last(ctx, xh, 1, rd, 2)
    else:
        x1, x2 = _last(ctx, xh, 0, half), _last(ctx, xh, half, rd)
    mul = lambda a, c: ctx.emit1("multiply", a, c)  # noqa: E731
    real = ctx.emit1("subtract", mul(x1, cos), mul(x2, sin))
    imag = ctx.emit1("add", mul(x1, sin), mul(x2, cos))
    if attrs.get("interleaved", 0):
        pair = xh.shape[:3] + (half, 1)
        rot = ctx.emit1("concatenate", ctx.reshape(real, pair), ctx.reshape(imag, pair), axis=4)
        rot = ctx.reshape(rot, xh.shape[:3] + (rd,))
    else:
        rot = ctx.emit1("concatenate", real, imag, axis=3)
    if rd < head:
        rot = ctx.emit1("concatenate", rot, _last(ctx, xh, rd, head), axis=3)
    return ctx.reshape(rot, x.shape)


# ----------------------------------------------------------------------------- LinearAttention
_LINEAR_RULES = ("linear", "gated", "delta", "gated_delta")


def _step(ctx: Context, x: Value, t: int) -> Value:
    """Time step ``t`` of a (B, T, H, X) tensor, as (B, H, X)."""
    s = ctx.emit1("strided_slice", x, begin=(t,), end=(t + 1,), strides=(1,), axes=(1,))
    return ctx.reshape(s, (x.shape[0],) + x.shape[2:])


@onnx_op("LinearAttention")
def _linear_attention(ctx: Context, node, ins, attrs):
    """Linear attention with a (B, H_kv, d_k, d_v) state, unrolled over the (static) sequence.

    Per step: ``S *= exp(decay_t)`` (gated rules), ``v_t = beta_t * (v_t - S^T k_t)`` (delta
    rules), ``S += k_t v_t^T``, ``o_t = scale * S^T q_t``. The recurrence runs in float32 as the
    ONNX reference does; each step is a few small batched products over the kv heads.
    """
    q, k, v = ins[:3]
    opt = list(ins[3:]) + [None] * (6 - len(ins))
    past, decay, beta = opt[0], opt[1], opt[2]
    rule = attrs.get("update_rule", "gated_delta")
    if rule not in _LINEAR_RULES:
        raise ctx.unsupported(f"update_rule={rule!r} (expected one of {_LINEAR_RULES})")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None):
        raise ctx.bad(f"update_rule {rule!r} {'requires' if gating else 'forbids'} the decay input")
    if delta != (beta is not None):
        raise ctx.bad(f"update_rule {rule!r} {'requires' if delta else 'forbids'} the beta input")
    hq, hkv = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.bad(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    for name, x, h in (("query", q, hq), ("key", k, hkv), ("value", v, hkv)):
        if x.type.ndim != 3 or x.shape[:2] != q.shape[:2] or x.shape[2] % h or x.dtype not in FLOAT_DTYPES:
            raise ctx.bad(f"{name} {x.shape} {x.dtype} must be a floating-point (batch, seq, heads * "
                          f"head_size) tensor with {h} heads and query's (batch, seq) {q.shape[:2]}")
    bsz, steps, _ = q.shape
    if steps == 0:
        raise ctx.unsupported("an empty sequence (seq length 0)")
    dk, dv, rep = q.shape[2] // hq, v.shape[2] // hkv, hq // hkv
    if k.shape[2] // hkv != dk:
        raise ctx.bad(f"key head size {k.shape[2] // hkv} differs from query head size {dk}")
    f32 = "float32"
    # (B, T, heads, X) layouts: a time step is one slice.
    q4 = ctx.reshape(ctx.cast(q, f32), (bsz, steps, hkv, rep * dk))
    k4 = ctx.reshape(ctx.cast(k, f32), (bsz, steps, hkv, dk))
    v4 = ctx.reshape(ctx.cast(v, f32), (bsz, steps, hkv, dv))
    gate = None
    if decay is not None:
        if decay.type.ndim != 3 or decay.shape[:2] != (bsz, steps) or decay.shape[2] not in (hkv, hkv * dk):
            raise ctx.bad(f"decay {decay.shape} must be ({bsz}, {steps}, {hkv}) or ({bsz}, {steps}, "
                          f"{hkv * dk})")
        gate = ctx.emit1("exp", ctx.reshape(ctx.cast(decay, f32), (bsz, steps, hkv, decay.shape[2] // hkv)))
    if beta is not None:
        if beta.type.ndim != 3 or beta.shape[:2] != (bsz, steps) or beta.shape[2] not in (hkv, 1):
            raise ctx.bad(f"beta {beta.shape} must be ({bsz}, {steps}, {hkv}) or ({bsz}, {steps}, 1)")
        beta = ctx.reshape(ctx.cast(beta, f32), (bsz, steps, beta.shape[2], 1))
    state_shape = (bsz, hkv, dk, dv)
    if past is not None:
        if past.shape != state_shape or past.dtype not in FLOAT_DTYPES:
            raise ctx.bad(f"past_state {past.shape} {past.dtype} must be a floating-point {state_shape} "
                          f"tensor")
        state = ctx.cast(past, f32)
    else:
        state = ctx.const(np.zeros(state_shape, np.float32))
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dk)

    outs = []
    for t in range(steps):
        kt, vt = _step(ctx, k4, t), _step(ctx, v4, t)
        if gate is not None:
            g = _step(ctx, gate, t)  # (B, H_kv, 1 or d_k)
            state = ctx.emit1("multiply", state, ctx.reshape(g, g.shape + (1,)))
        krow = ctx.reshape(kt, (bsz, hkv, 1, dk))
        if beta is not None:
            retrieved = ctx.reshape(ctx.emit1("matmul", krow, state), (bsz, hkv, dv))
            vt = ctx.emit1("multiply", _step(ctx, beta, t), ctx.emit1("subtract", vt, retrieved))
        outer = ctx.emit1("multiply", ctx.reshape(kt, (bsz, hkv, dk, 1)), ctx.reshape(vt, (bsz, hkv, 1, dv)))
        state = ctx.emit1("add", state, outer)
        # GQA: the rep query heads of one kv head read its state as rows of one product.
        qt = ctx.reshape(_step(ctx, q4, t), (bsz, hkv, rep, dk))
        outs.append(ctx.reshape(ctx.emit1("matmul", qt, state), (bsz, 1, hq * dv)))
    y = outs[0] if steps == 1 else ctx.emit1("concatenate", *outs, axis=1)
    y = ctx.cast(ctx.emit1("multiply", y, ctx.const(np.array(scale), f32)), q.dtype)
    return [y, ctx.cast(state, past.dtype if past is not None else q.dtype)]


# ----------------------------------------------------------------------------- CausalConvWithState
@onnx_op("CausalConvWithState")
def _causal_conv_with_state(ctx: Context, node, ins, attrs):
    """Depthwise causal 1-D convolution whose left context is the carried state.

    The state (or zeros) is concatenated in front of the input and one grouped ``conv2d``
    (H = 1, valid padding) runs over it; the new state is the last ``k - 1`` positions.
    """
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    past = ins[3] if len(ins) > 3 else None
    act = attrs.get("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation={act!r} (expected 'none', 'silu' or 'swish')")
    if x.type.ndim != 3 or x.dtype not in FLOAT_DTYPES:
        raise ctx.bad(f"input must be a floating-point (batch, channels, length) tensor, got "
                      f"{x.shape} {x.dtype}")
    bsz, ch, _ = x.shape
    if w.type.ndim != 3 or w.shape[:2] != (ch, 1) or w.shape[2] < 1:
        raise ctx.bad(f"weight {w.shape} must be ({ch}, 1, kernel_size) for {ch} channels")
    kk = w.shape[2]
    if bias is not None and bias.shape != (ch,):
        raise ctx.bad(f"bias {bias.shape} must be ({ch},)")
    if past is not None:
        if past.shape != (bsz, ch, kk - 1):
            raise ctx.bad(f"past_state {past.shape} must be ({bsz}, {ch}, {kk - 1}) (kernel_size - 1)")
        padded = ctx.emit1("concatenate", ctx.cast(past, x.dtype), x, axis=2)
    elif kk > 1:
        padded = ctx.emit1("pad", x, pad_width=((0, 0), (0, 0), (kk - 1, 0)))
    else:
        padded = x
    total = padded.shape[2]
    y = ctx.emit1("conv2d", ctx.reshape(padded, (bsz, ch, 1, total)),
                  ctx.reshape(ctx.cast(w, x.dtype), (ch, 1, 1, kk)), groups=ch)
    if bias is not None:
        y = ctx.emit1("bias_add", y, ctx.cast(bias, x.dtype), axis=1)
    y = ctx.reshape(y, (bsz, ch, total - kk + 1))
    if act != "none":
        y = ctx.emit1("multiply", y, ctx.emit1("sigmoid", y))
    state = ctx.emit1("strided_slice", padded, begin=(total - (kk - 1),), end=(total,), strides=(1,),
                      axes=(2,))
    return [y, state]


# ----------------------------------------------------------------------------- SwiGLU
@onnx_op("SwiGLU")
def _swiglu(ctx: Context, node, ins, attrs):
    """``Y = A * sigmoid(alpha * A) * B`` (elementwise ops that fuse into one kernel)."""
    a, b = ins
    if a.shape != b.shape or a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ctx.bad(f"A {a.shape} {a.dtype} and B {b.shape} {b.dtype} must be floating-point "
                      f"tensors of one shape and dtype (SwiGLU does not broadcast)")
    alpha = float(attrs.get("alpha", 1.0))
    gate = a if alpha == 1.0 else ctx.emit1("multiply", a, ctx.const(np.array(alpha), a.dtype))
    swish = ctx.emit1("multiply", a, ctx.emit1("sigmoid", gate))
    return ctx.emit1("multiply", swish, b)
