"""Computes and schedules: Attention-family ops that have their own kernels (the rest decompose
in ``kiln/frontend/onnx/ops_attention.py``).

``rms_norm`` is a statistics stage (sum of squares, tag ``"norm_stat"``, accumulated in float32
for half inputs) and one output stage, scheduled by the generic norm schedule like
``layer_norm``.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

from .. import te
from .nn.norm import TAG_NORM_OUT, TAG_NORM_STAT
from .registry import register_compute
from .util import compute_dtype, norm_axis, prod

__all__ = ["rms_norm"]


@register_compute("rms_norm")
def rms_norm(attrs: dict, inputs: list, out_types: list) -> list:
    """``x / sqrt(mean(x^2 over axis..end) + eps) * gamma``; gamma broadcasts to ``x.shape[axis:]``."""
    x, gamma = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", -1)), nd)
    eps = float(attrs.get("epsilon", 1e-5))
    cd = compute_dtype(x.dtype)
    cnt = float(prod(x.shape[a] for a in range(axis, nd)))
    rv = [te.reduce_axis((0, x.shape[a]), name=f"r{a}") for a in range(axis, nd)]
    stat_shape = tuple(x.shape[:axis]) + (1,) * (nd - axis)

    def sq_body(*i: Any) -> Any:
        v = te.cast(x[tuple(i[:axis]) + tuple(rv)], cd)
        return te.sum(v * v, axis=rv)

    # one fcompute output: te.compute returns a single Tensor
    sqsum = cast(te.Tensor, te.compute(stat_shape, sq_body, name="rms_norm_sqsum", tag=TAG_NORM_STAT))

    def gidx(i: Sequence[Any]) -> tuple[Any, ...]:
        # gamma aligns with the trailing dims of x.shape[axis:]; its size-1 dims broadcast
        tail = list(i[axis:])
        off = len(tail) - len(gamma.shape)
        return tuple(0 if d == 1 else tail[off + q] for q, d in enumerate(gamma.shape))

    def body(*i: Any) -> Any:
        si = tuple(i[:axis]) + (0,) * (nd - axis)
        inv = te.const(1.0, cd) / te.sqrt(sqsum[si] / te.const(cnt, cd) + te.const(eps, cd))
        g = gamma[gidx(i)] if len(gamma.shape) else gamma()
        return te.cast(te.cast(x[i], cd) * inv * te.cast(g, cd), x.dtype)

    return [te.compute(x.shape, body, name="rms_norm", tag=TAG_NORM_OUT)]
