"""Dynamic-shape graphs shared by the executor and C API tests."""

from __future__ import annotations

from typing import Callable

import numpy as np

from kiln import ir


def masked_attention_graph(max_seq: int, const: Callable[..., ir.Value]) -> tuple[ir.Graph, list[ir.Value]]:
    """Masked single-head attention over x (batch, seq, 16), batch 1..4, seq 1..``max_seq``;
    the mask (batch, seq) must agree with x on both symbols, and seq is an inner dim, so the
    data is a true sub-box of the padded storage. Outputs: the mean over seq, and the
    attention output. ``const(g, *shape)`` makes the weights; returns the graph and them."""
    g = ir.Graph("attn")
    g.declare_dim("batch", 1, 4)
    g.declare_dim("seq", 1, max_seq)
    x = g.add_input("x", ("batch", "seq", 16))
    mask = g.add_input("mask", ("batch", "seq"))
    ws = [const(g, 16, 16) for _ in range(3)]
    q, k, v = (g.add("matmul", x, w) for w in ws)
    s = g.add("matmul", q, g.add("transpose", k, axes=(0, 2, 1)))
    bias = g.add("multiply", g.add("subtract", g.add_constant(np.float32(1)), mask),
                 g.add_constant(np.float32(-1e4)))
    bias = g.add("reshape", bias, newshape=(4, 1, max_seq), sym_shape=("batch", 1, "seq"))
    p = g.add("softmax", g.add("add", g.add("multiply", s, g.add_constant(np.float32(0.25))), bias), axis=-1)
    o = g.add("matmul", p, v)
    g.outputs = [g.add("reduce_mean", o, axes=(1,), keepdims=False), o]
    return g, ws
