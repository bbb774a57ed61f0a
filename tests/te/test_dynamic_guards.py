"""Reads of a dynamic axis proven by a guard, and outer-loop guards from fused splits."""

from __future__ import annotations

import pytest

from kiln import te, tir, topi
from kiln.topi.nn.dense import matmul
from kiln.runtime.errors import CompileError


def _panels(guarded: bool):
    """Pack the columns of A (dynamic extent n, at most 64) into panels of 16: ``p[q, j]`` is
    column ``16*q + j``, zero past the runtime extent when ``guarded``."""
    n = te.var("n")
    a = te.placeholder((64,), "float32", name="A", dyn=(n,))

    def body(q, j):
        v = a[q * 16 + j]
        return te.if_then_else(q * 16 + j < n, v, te.const(0.0, "float32")) if guarded else v

    p = te.compute((4, 16), body, name="panels")
    return a, p


def test_a_read_guarded_by_its_runtime_extent_is_accepted():
    a, p = _panels(guarded=True)
    f = tir.lower(te.create_schedule(p.op), [a, p], "pack")
    assert "n" in str(f)


def test_the_same_read_unguarded_is_refused():
    a, p = _panels(guarded=False)
    with pytest.raises(CompileError, match="cannot be bounded"):
        tir.lower(te.create_schedule(p.op), [a, p], "pack")


def test_a_guard_on_the_wrong_extent_does_not_count():
    n, m = te.var("n"), te.var("m")
    a = te.placeholder((64,), "float32", name="A", dyn=(n,))
    b = te.placeholder((64,), "float32", name="B", dyn=(m,))
    p = te.compute((4, 16), lambda q, j: te.if_then_else(q * 16 + j < m, a[q * 16 + j], te.const(0.0, "float32")),
                   name="panels")
    with pytest.raises(CompileError, match="cannot be bounded"):
        tir.lower(te.create_schedule(p.op), [a, b, p], "pack")


def test_a_split_axis_fused_into_a_parallel_loop_skips_whole_tiles():
    """Batched matmul whose column axis is dynamic: the column-panel index, fused into the
    parallel loop as a remainder, gets a guard skipping panels past the runtime extent."""
    b_, s = te.var("b"), te.var("s")
    q = te.placeholder((2, 64, 8), "float32", name="Q", dyn=(b_, s, None))
    k = te.placeholder((2, 8, 64), "float32", name="K", dyn=(b_, None, s))
    out = matmul(q, k, target="llvm")
    te.set_dyn(out, (b_, s, s))
    sch = topi.schedule_group("matmul", 4, [out], "llvm")
    text = str(tir.lower(sch, [q, k, out], "scores"))
    # the packed panels read below the runtime extent only, and a whole panel past it is skipped
    assert "if_then_else(" in text and "< s" in text
    assert any(ln.strip().startswith("if ") and "% " in ln and "< s" in ln for ln in text.splitlines())
