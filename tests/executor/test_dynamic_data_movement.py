"""Data movement over symbolic dims: free reshapes and injective loops in the padded layout.

A channel shuffle (reshape ``(b, 2c, h, w) -> (b, 2, c, h, w)``, transpose, reshape back) with
symbolic ``b``, ``h``, ``w``: the reshapes only re-factor the static channel dim, so in the
padded layout they move nothing and are aliases (``kiln.ir.sym_rules.padded_layout_key``); the
transpose's loops stop at the runtime ``h`` instead of running its upper bound with a guard
per row (``kiln.topi.schedule.generic.schedule_injective_stage``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln import ir
from kiln.ir.sym_rules import same_padded_layout
from kiln.ir.types import TensorType

RNG = np.random.default_rng(5)
C = 40  # 2*C >= 64 rows of the transpose keep the threads busy (fuse_outer)


def _shuffle_graph() -> ir.Graph:
    g = ir.Graph("shuffle")
    g.declare_dim("b", 1, 3)
    g.declare_dim("h", 2, 20)
    g.declare_dim("w", 2, 20)
    x = g.add_input("x", ("b", 2 * C, "h", "w"))
    y = g.add("reshape", g.add("relu", x), newshape=(3, 2, C, 20, 20), sym_shape=("b", 2, C, "h", "w"))
    t = g.add("transpose", y, axes=(0, 2, 1, 3, 4))
    g.outputs = [g.add("add", g.add("reshape", t, newshape=(3, 2 * C, 20, 20), sym_shape=("b", 2 * C, "h", "w")),
                       g.add_constant(np.float32(1.0)))]
    return g


def _shuffle_ref(x: np.ndarray) -> np.ndarray:
    b, c, h, w = x.shape
    y = np.maximum(x, 0).reshape(b, 2, c // 2, h, w).transpose(0, 2, 1, 3, 4).reshape(b, c, h, w)
    return y + 1


def test_layout_keys_of_static_refactorings():
    def t(*dims):
        shape = tuple(d if isinstance(d, int) else 16 for d in dims)
        return TensorType(shape, "float32", dims)

    assert same_padded_layout(t("b", 24, "h", "w"), t("b", 2, 12, "h", "w"))
    assert same_padded_layout(t(6, 4, "h", "w"), t(24, "h", "w"))
    assert same_padded_layout(t("b", 24, "h", "w"), t("b", 24, 1, "h", "w"))
    assert not same_padded_layout(t("b", 24, "h", "w"), t("b", 24, "h*w"))  # h's stride is W's bound
    assert not same_padded_layout(t("b", 24, "h", "w"), t("b", "h", 24, "w"))  # a symbolic dim moves
    assert not same_padded_layout(t("b", 24, "h", 4), t("b", 24, "h", 2, 2, 3))  # a different size
    # attention heads split off a sequence-first (seq, batch, 768): j = b*12 + head
    assert same_padded_layout(t(197, "b", 768), t(197, "12*b", 64))
    assert same_padded_layout(t(197, "b", 768), t(197, "b", 12, 64))
    assert not same_padded_layout(t(197, "b", 768), t("197*b", 768))  # rows i*b + j: stride b_rt
    assert not same_padded_layout(t(197, 12, "b", 64), t(197, "12*b", 64))  # j = head*b + b_idx


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_channel_shuffle_at_every_size(target):
    lib = kiln.build(_shuffle_graph(), target=target)
    funcs = [n["attrs"]["func_name"] for n in json.loads(lib.get_graph_json())["nodes"] if n["op"] == "tvm_op"]
    assert not [f for f in funcs if "reshape" in f and not f.startswith("__nop")], funcs
    m = kiln.GraphModule(lib["default"](kiln.cpu()))
    for b, h, w in [(3, 20, 20), (1, 2, 2), (2, 7, 13), (3, 19, 5), (1, 16, 17)]:
        x = RNG.standard_normal((b, 2 * C, h, w)).astype(np.float32)
        m.run(x=x)
        np.testing.assert_array_equal(m.get_output(0).numpy(), _shuffle_ref(x), err_msg=f"{(b, h, w)}")


def test_injective_loops_stop_at_the_runtime_extent_of_an_inner_dim():
    text = kiln.driver.lower(_shuffle_graph(), target="llvm").dump()
    kernel = text[text.index("def kilngen_default_fused_transpose"):]
    assert "range(h_rt)" in kernel, kernel
    assert "< h_rt" not in kernel, kernel  # no per-row guard over the upper bound of h


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_heads_split_off_a_sequence_first_batch(target):
    """(seq, batch, 24) -> (seq, 4*batch, 6) -> heads first -> back: the head reshapes alias."""
    g = ir.Graph("heads")
    g.declare_dim("b", 1, 4)
    x = g.add_input("x", (7, "b", 24))
    heads = g.add("reshape", x, newshape=(7, 16, 6), sym_shape=(7, "4*b", 6))
    t = g.add("transpose", g.add("tanh", g.add("transpose", heads, axes=(1, 0, 2))), axes=(1, 0, 2))
    g.outputs = [g.add("multiply", g.add("reshape", t, newshape=(7, 4, 24), sym_shape=(7, "b", 24)),
                       g.add_constant(np.float32(2.0)))]
    lib = kiln.build(g, target=target)
    funcs = [n["attrs"]["func_name"] for n in json.loads(lib.get_graph_json())["nodes"] if n["op"] == "tvm_op"]
    assert not [f for f in funcs if "reshape" in f and not f.startswith("__nop")], funcs
    m = kiln.GraphModule(lib["default"](kiln.cpu()))
    for b in (4, 1, 3, 2):
        xv = RNG.standard_normal((7, b, 24)).astype(np.float32)
        m.run(x=xv)
        want = np.tanh(xv.reshape(7, 4 * b, 6)).reshape(7, b, 24) * 2
        np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-6, atol=1e-6, err_msg=f"batch {b}")


def _seq_first_dense(op: str = "dense") -> tuple[ir.Graph, np.ndarray]:
    g = ir.Graph("seqfirst")
    g.declare_dim("b", 1, 8)
    x = g.add_input("x", (37, "b", 48))
    w = (RNG.standard_normal((40, 48)) * 0.2).astype(np.float32)
    # a matmul by a constant would become a dense (FlattenMatmul): its weight is an input
    rhs = g.add_constant(w) if op == "dense" else g.add_input("w", (48, 40))
    g.outputs = [g.add(op, x, rhs)]
    return g, w


@pytest.mark.parametrize("op", ["dense", "matmul"])
def test_sequence_first_dense_tiles_the_static_rows(op):
    """(seq, batch, K) x W with a dynamic batch: the register tile runs along seq (static), so a
    batch of 1 still fills whole tiles and reuses each weight panel across them."""
    g, _ = _seq_first_dense(op)
    text = kiln.driver.lower(g, target="llvm -mcpu=skylake-avx512").dump()
    kernel = text[text.index(f"def kilngen_default_fused_{op}"):]
    assert "range(b_rt" in kernel, kernel  # the batch is an outer loop at its runtime extent
    assert "< 37" in kernel or "range(37" in kernel or "37 //" in kernel, kernel  # tiles of seq


@pytest.mark.parametrize("target, op", [("llvm", "dense"), ("c", "dense"), ("llvm", "matmul")])
def test_sequence_first_dense_at_every_batch(target, op):
    g, w = _seq_first_dense(op)
    m = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
    for b in (8, 1, 5, 2):
        xv = RNG.standard_normal((37, b, 48)).astype(np.float32)
        m.run(x=xv, **({"w": np.ascontiguousarray(w.T)} if op == "matmul" else {}))
        np.testing.assert_allclose(m.get_output(0).numpy(), xv @ w.T, rtol=1e-5, atol=1e-5, err_msg=f"batch {b}")


def test_batched_matmul_keeps_its_rows_on_the_dynamic_dim():
    """(heads, s, d) x (heads, d, s): every head has its own right-hand matrix, so tiling the
    static heads axis would reuse nothing; the tile stays on the rows (s) at their runtime extent."""
    g = ir.Graph("bmm")
    g.declare_dim("s", 1, 40)
    q = g.add_input("q", (16, "s", 8))
    k = g.add_input("k", (16, 8, "s"))
    g.outputs = [g.add("matmul", q, k)]
    text = kiln.driver.lower(g, target="llvm -mcpu=skylake-avx512").dump()
    kernel = text[text.index("def kilngen_default_fused_matmul"):]
    assert "(s_rt + " in kernel, kernel  # the row tiles: ceil(s / tile)
    m = kiln.GraphModule(kiln.build(g, target="llvm")["default"](kiln.cpu()))
    for s in (40, 3, 17):
        qv = RNG.standard_normal((16, s, 8)).astype(np.float32)
        kv = RNG.standard_normal((16, 8, s)).astype(np.float32)
        m.run(q=qv, k=kv)
        np.testing.assert_allclose(m.get_output(0).numpy(), qv @ kv, rtol=1e-5, atol=1e-5, err_msg=f"s = {s}")
