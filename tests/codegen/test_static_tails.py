"""``peel_static_tails``: the tail tiles of a non-exact static split get constant extents."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.driver.build import lower
from kiln.ir import Graph, evaluate
from kiln.tir.expr import IntImm
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import For
from kiln.tir.unswitch import peel_static_tails

AVX512 = "llvm -mcpu=skylake-avx512"


def _dense(n: int, m: int = 20, k: int = 24) -> tuple[Graph, dict]:
    w = np.random.default_rng(n).standard_normal((n, k)).astype("float32")
    g = Graph()
    x = g.add_input("x", (m, k))
    g.outputs = [g.add("relu", g.add("dense", x, g.add_input("w", w.shape)))]
    return g, {"w": w}


def _vector_extents(body) -> list:
    found: list = []
    post_order_visit(body, lambda n: found.append(n.extent) if isinstance(n, For) and n.kind == "vectorized" else None)
    return found


def test_dense_tail_panel_gets_constant_vector_loops() -> None:
    # N = 80 in 64-wide AVX-512 panels: every vectorized loop of a tile had extent
    # min(64, 80 - no * 64); peeled, the full panel loops are 64 and the tail's 16
    g, p = _dense(80)
    (func,) = lower(g, AVX512, params=p).funcs
    before = _vector_extents(func.body)
    assert any(not isinstance(e, IntImm) for e in before)
    after = _vector_extents(peel_static_tails(func.body))
    assert all(isinstance(e, IntImm) for e in after), after
    assert {e.value for e in after} >= {64, 16}


def test_exact_splits_are_left_alone() -> None:
    g, p = _dense(64)
    (func,) = lower(g, AVX512, params=p).funcs
    assert str(peel_static_tails(func.body)) == str(func.body)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("n", [80, 35, 130])
def test_peeled_dense_matches_reference(target: str, n: int) -> None:
    g, p = _dense(n)
    xv = np.random.default_rng(1).standard_normal((20, 24)).astype("float32")
    gm = kiln.GraphModule(kiln.build(g, target=target, params=p)["default"](kiln.cpu()))
    gm.set_input(x=xv)
    gm.run()
    (want,) = evaluate(g, {"x": xv, **p})
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)


def test_batched_matmul_with_a_fused_batch_and_tile_axis() -> None:
    # the parallel loop fuses (batch, column block): the tail comes back every third iteration
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 9, 12)).astype("float32")
    b = rng.standard_normal((12, 35)).astype("float32")
    g = Graph()
    x = g.add_input("a", a.shape)
    g.outputs = [g.add("matmul", x, g.add_input("b", b.shape))]
    for target in ("llvm", "c"):
        gm = kiln.GraphModule(kiln.build(g, target=target, params={"b": b})["default"](kiln.cpu()))
        gm.set_input(a=a)
        gm.run()
        np.testing.assert_allclose(gm.get_output(0).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def _dynamic_rows() -> tuple[Graph, dict]:
    # M in 1..256 rows, tiled by 6 (AVX-512): 256 % 6 != 0, so each row of a tile is guarded
    # against the static 256 as well as the runtime M
    w = np.random.default_rng(7).standard_normal((64, 32)).astype("float32")
    g = Graph()
    g.declare_dim("m", 1, 256)
    x = g.add_input("x", ("m", 32))
    g.outputs = [g.add("relu", g.add("dense", x, g.add_input("w", w.shape)))]
    return g, {"w": w}


def _static_row_guards(body) -> int:
    from kiln.tir.expr import BinaryOp
    from kiln.tir.stmt import IfThenElse

    found: list = []
    post_order_visit(body, lambda n: found.append(n) if isinstance(n, IfThenElse) and isinstance(n.cond, BinaryOp)
                     and n.cond.op == "lt" and isinstance(n.cond.b, IntImm) and n.cond.b.value == 256 else None)
    return len(found)


def test_runtime_tail_drops_the_static_guard_it_implies() -> None:
    """The runtime row count is at most the upper bound (the argument check enforces it), so
    once the tile loop is partitioned by it the guards ``row < 256`` are dead: dropped with the
    runtime guards, given the kernel's parameters; kept without them."""
    from kiln.tir.unswitch import extent_bounds, partition_tail_tiles, unswitch_loops

    g, p = _dynamic_rows()
    (func,) = lower(g, AVX512, params=p).funcs
    assert _static_row_guards(func.body) > 0
    bounds = extent_bounds(func.params)
    assert list(bounds.values()) == [256]  # one runtime row count, x's and the output's
    assert _static_row_guards(partition_tail_tiles(func.body, bounds)) == 0
    assert _static_row_guards(unswitch_loops(func.body, func.params)) == 0
    assert _static_row_guards(partition_tail_tiles(func.body)) > 0
    # a smaller bound implies the guard too; a larger one does not: kept
    assert _static_row_guards(partition_tail_tiles(func.body, {v: 255 for v in bounds})) == 0
    assert _static_row_guards(partition_tail_tiles(func.body, {v: 257 for v in bounds})) > 0


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_runtime_tail_rows_match_reference(target: str) -> None:
    g, p = _dynamic_rows()
    gm = kiln.GraphModule(kiln.build(g, target=target, params=p)["default"](kiln.cpu()))
    for m in (256, 1, 5, 6, 7, 250, 253, 12):
        xv = np.random.default_rng(m).standard_normal((m, 32)).astype("float32")
        gm.set_input(x=xv)
        gm.run()
        (want,) = evaluate(g, {"x": xv, **p})
        np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"m={m}")
