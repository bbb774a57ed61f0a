"""Explicit SIMD codegen, vectorized math and the packed GEMM schedules, on both CPU codegens.

Every kernel of a target is compiled into one module per test (compilation dominates the
time); results are checked against NumPy / float64 references at shapes that are not
multiples of the vector width or the register tile.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kiln
from kiln import codegen, te, tir
from kiln.codegen.c import target_vector_bytes
from kiln.target import Target
from kiln.tir.unswitch import unswitch_loops
from tests.codegen.asm_support import hot_loop
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import For
from kiln.tir.vectorize import chunk_lanes, plan_vector_loop
from kiln.topi.nn.dense import TAG_DENSE, TAG_MATMUL, dense, matmul
from kiln.topi.schedule import x86

TARGETS = ["c", "llvm -mcpu=native"]
RNG = np.random.default_rng(7)


def _run(mod, name: str, *arrays: np.ndarray) -> list[np.ndarray]:
    nds = [kiln.nd.array(a) for a in arrays]
    mod[name](*nds)
    return [x.numpy() for x in nds]


# ----------------------------------------------------------------------------- vector math
_X = np.concatenate([
    np.linspace(-110.0, 100.0, 20011), np.geomspace(1e-30, 30.0, 4001), -np.geomspace(1e-30, 30.0, 4001),
    [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, -87.3, -103.9, -104.5, 0.625, 1.0, 4.0, 9.0],
]).astype(np.float32)

_REF = {
    "exp": np.exp,
    "tanh": np.tanh,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}


@pytest.mark.parametrize("target", TARGETS)
def test_vector_math_accuracy(target: str) -> None:
    """exp / erf / tanh / sigmoid, vectorized and scalar loops: rel. error ≤ 3e-7, inf/nan exact."""
    n = _X.size
    A = te.placeholder((n,), name="A")
    outs = []
    for vec in (True, False):
        for fn in _REF:
            op = getattr(te, fn)
            outs.append(te.compute((n,), lambda i, f=op: f(A[i]), name=f"{fn}_{'v' if vec else 's'}"))
    s = te.create_schedule(outs)
    for o in outs[: len(_REF)]:
        _, xi = s[o].split(o.op.axis[0], factor=16)
        s[o].vectorize(xi)
    mod = codegen.build_module([tir.lower(s, [A, *outs], "vmath")], target)
    res = _run(mod, "vmath", _X, *[np.zeros(n, np.float32) for _ in outs])[1:]
    x64 = _X.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for k, (name, ref_fn) in enumerate(list(_REF.items()) * 2):
            y = res[k].astype(np.float64)
            ref = ref_fn(x64)
            ref32 = ref.astype(np.float32).astype(np.float64)
            assert np.array_equal(np.isnan(y), np.isnan(ref)), name
            inf = np.isinf(y)
            assert np.array_equal(inf, np.isinf(ref32)) and np.array_equal(y[inf], ref32[inf]), name
            normal = np.isfinite(ref32) & (np.abs(ref) > 1e-37)
            rel = np.abs(y[normal] - ref[normal]) / np.abs(ref[normal])
            assert rel.max() <= 3e-7, f"{name}: max rel error {rel.max():.3g} at x={_X[normal][rel.argmax()]!r}"
            tiny = np.isfinite(ref32) & ~normal
            assert np.all(np.abs(y[tiny] - ref[tiny]) <= 3e-39), name  # subnormal range: absolute


# ----------------------------------------------------------------------------- explicit SIMD
def _simd_kernels():
    n = 45  # 5 full 8-lane vectors + a 4 + 1 remainder; split by 16 leaves a tail of 13
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    Idx = te.placeholder((n,), name="I", dtype="int32")
    D = te.placeholder((n,), name="D", dtype="float64")
    outs = [
        # contiguous loads, broadcast scalar, loop variable in the value (ramp), NaN-propagating max
        te.compute((n,), lambda i: te.maximum(A[i] * 2.0 + B[i], te.cast(i, "float32") * 0.25), name="arith"),
        # gather (reversed index), select without loads, int -> float cast
        te.compute((n,), lambda i: te.if_then_else(A[n - 1 - i] > 0.0, te.cast(Idx[i], "float32"), B[i]),
                   name="gather_sel"),
        # guarded load (select with a load: must not be evaluated out of range)
        te.compute((n,), lambda i: te.if_then_else(i + 3 < n, A[te.minimum(i + 3, n - 1)], -1.0), name="guarded"),
        # float64 (4 lanes on AVX2) and int32 arithmetic
        te.compute((n,), lambda i: D[i] * D[i] - 1.5, name="f64"),
        te.compute((n,), lambda i: te.maximum(Idx[i] * 3 - i, te.const(-7, "int32")), name="i32"),
    ]
    s = te.create_schedule(outs)
    for o in outs[:3]:
        _, xi = s[o].split(o.op.axis[0], factor=16)
        s[o].vectorize(xi)
    for o in outs[3:]:
        s[o].vectorize(o.op.axis[0])
    f = tir.lower(s, [A, B, Idx, D, *outs], "simd")
    return f, n


@pytest.mark.parametrize("target", TARGETS)
def test_explicit_simd_paths(target: str) -> None:
    f, n = _simd_kernels()
    mod = codegen.build_module([f], target)
    a = RNG.uniform(-1, 1, n).astype(np.float32)
    a[5] = np.nan
    b = RNG.uniform(-1, 1, n).astype(np.float32)
    iv = RNG.integers(-20, 20, n).astype(np.int32)
    d = RNG.uniform(-3, 3, n)
    outs = _run(mod, "simd", a, b, iv, d, np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                np.zeros(n, np.float64), np.zeros(n, np.int32))[4:]
    i = np.arange(n)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(outs[0], np.maximum(a * 2 + b, i.astype(np.float32) * 0.25), rtol=1e-6)
    assert np.isnan(outs[0][5])
    np.testing.assert_array_equal(outs[1], np.where(a[::-1] > 0, iv.astype(np.float32), b))
    np.testing.assert_array_equal(outs[2], np.where(i + 3 < n, a[np.minimum(i + 3, n - 1)], -1.0).astype(np.float32))
    np.testing.assert_allclose(outs[3], d * d - 1.5, rtol=1e-15)
    np.testing.assert_array_equal(outs[4], np.maximum(iv * 3 - i, -7))
    src = mod.get_source() if target == "c" else mod.get_source("ll")
    if target == "c":
        assert re.search(r"kiln_f32x(16|8|4)_u\*\)&", src), "expected GCC vector loads/stores"
        assert "kiln_f64x" in src and "kiln_i32x" in src
    else:
        assert re.search(r"load <(16|8|4) x float>", src), "expected <N x float> loads"
        assert "x double>" in src


def test_chunking_and_vector_width() -> None:
    assert chunk_lanes(45, 8) == [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4), (44, 1)]
    assert chunk_lanes(3, 8) == [(0, 2), (2, 1)]
    assert target_vector_bytes(Target("llvm -mcpu=haswell")) == 32
    assert target_vector_bytes(Target("llvm -mattr=+avx512f")) == 64
    assert target_vector_bytes(Target("llvm")) == 16


# ----------------------------------------------------------------------------- GEMM
def _gelu(x):
    return x * 0.5 * (1.0 + te.erf(x * (1.0 / math.sqrt(2.0))))


def _gemm_case(kind: str, shape: tuple, epilogue: bool, name: str):
    if kind == "matmul":
        ab, m, k, n, bb = shape
        A = te.placeholder(ab + (m, k), name="A")
        B = te.placeholder(bb + (k, n), name="B")
        C = matmul(A, B)
        tags = (TAG_MATMUL,)
    else:
        m, k, n = shape
        A = te.placeholder((m, k), name="A")
        B = te.placeholder((n, k), name="B")
        C = dense(A, B)
        tags = (TAG_DENSE,)
    out = te.compute(C.shape, lambda *i: _gelu(C[i]), name="gelu") if epilogue else C
    s = x86._make_gemm_schedule(tags, x86._x86_gemm_tiles)([out], None)
    return tir.lower(s, [A, B, out], name), A, B, out


_GEMMS = [
    ("dense", (1, 37, 33), False),      # M = 1, K not a multiple of 8: plain loop
    ("dense", (1, 64, 21), True),       # GEMV path, 16 partial sums, fused GELU
    ("dense", (3, 40, 19), False),      # GEMV path with 3 rows, 8 partial sums
    ("dense", (13, 1, 17), False),      # K = 1
    ("dense", (37, 29, 51), True),      # odd everything, fused GELU (vector erf)
    ("dense", (6, 16, 16), False),      # exactly one register tile
    ("dense", (7, 40, 15), False),      # N below one panel: unpacked path
    ("dense", (130, 70, 100), True),    # several row/column blocks with tails
    ("matmul", ((), 19, 23, 35, ()), True),
    ("matmul", ((3,), 5, 7, 19, ()), False),   # batched A, shared B (broadcast)
    ("matmul", ((2,), 1, 9, 40, (2,)), False),  # batched, M = 1 (unpacked, wide row tile)
    ("matmul", ((2,), 8, 9, 40, (2,)), True),   # batched A and B: per-(batch, panel) packing
]


@pytest.mark.parametrize("target", TARGETS)
def test_gemm_odd_shapes(target: str) -> None:
    funcs, cases = [], []
    for q, (kind, shape, epi) in enumerate(_GEMMS):
        f, A, B, out = _gemm_case(kind, shape, epi, f"gemm{q}")
        funcs.append(f)
        cases.append((kind, epi, A, B, out))
    mod = codegen.build_module(funcs, target)
    for q, (kind, epi, A, B, out) in enumerate(cases):
        a = RNG.standard_normal(A.shape).astype(np.float32)
        b = RNG.standard_normal(B.shape).astype(np.float32)
        got = _run(mod, f"gemm{q}", a, b, np.full(out.shape, np.nan, np.float32))[2]
        ref = a.astype(np.float64) @ (b.astype(np.float64) if kind == "matmul" else b.astype(np.float64).T)
        if epi:
            ref = ref * 0.5 * (1.0 + np.vectorize(math.erf)(ref / math.sqrt(2.0)))
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(ref).max()),
                                   err_msg=f"{kind} {_GEMMS[q]}")


def test_gemm_tile_guards_are_unswitched() -> None:
    """A row tail puts guards inside the k loop; the codegens see a guard-free copy of it."""
    f, *_ = _gemm_case("dense", (13, 40, 32), False, "g")
    body = str(unswitch_loops(f.body, f.params))
    # the fast version: a k loop with no `if` between it and its vector loops
    fast = re.search(r"for k in range\(40\):\n((?:\s+for i1 in range\(16\):.*\n\s+dense\[.*\n)+)", body)
    assert fast is not None, body


def test_gemm_inner_loop_is_fma_on_ymm() -> None:
    """LLVM: the 6x16 micro-kernel is 12 ymm FMAs per k step with no stack traffic in the loop.

    The CPU is pinned (AVX2 + FMA, 16 ymm registers): the assembly is only inspected, never
    run, so the test means the same on an AVX2 host, an AVX-512 host (where ``native`` would
    give zmm) or any other x86-64 machine.
    """
    f, *_ = _gemm_case("dense", (60, 64, 64), False, "gk")
    mod = codegen.build_module([f], "llvm -mcpu=haswell")
    asm = mod.get_source("asm")
    fma_lines = [ln for ln in asm.splitlines() if "vfmadd231ps" in ln and "%ymm" in ln]
    assert len(fma_lines) >= 12, asm
    # the loop holding the FMAs (label .. backward jump to it) must not touch the stack:
    # accumulators stay in registers
    hot = hot_loop(asm, "vfmadd231ps")
    assert hot.count("vfmadd231ps") >= 12, hot
    assert "(%rsp)" not in hot and "(%rbp)" not in hot, hot


def test_loops_around_an_unrolled_tile_are_not_unrolled_again() -> None:
    """The schedule's register tile is unrolled by tir.unswitch; the loops around it carry
    ``llvm.loop.unroll.disable`` (LLVM would only copy the micro-kernel again), and loops
    without a tile keep LLVM's unroller."""
    f, *_ = _gemm_case("dense", (60, 64, 64), False, "gk")
    around_tile = {x.loop_var.name for x in _loops(f.body) if x.kind == "serial" and _has_unrolled(x.body)}
    hinted_tir = {x.loop_var.name for x in _loops(unswitch_loops(f.body, f.params))
                  if x.annotations.get("unroll") is False}
    assert "k" in around_tile and hinted_tir == around_tile
    ir = codegen.build_module([f], "llvm -mcpu=haswell").get_source("ll-raw")
    hinted = re.findall(r'br label %"for_(\w+)", !llvm.loop (!\d+)', ir)
    assert "k" in {name for name, _ in hinted}, ir
    ids = [md for _, md in hinted]
    assert len(set(ids)) == len(ids)  # one loop ID per loop
    for md in ids:  # each ID is self-referential and names the hint
        assert re.search(rf'^{md} = !{{ {md}, (!\d+) }}', ir, re.M), md
    assert '!"llvm.loop.unroll.disable"' in ir
    A = te.placeholder((64, 300), name="A")
    B = te.compute(A.shape, lambda i, j: A[i, j] * 2.0, name="B")
    plain = codegen.build_module([tir.lower(te.create_schedule(B.op), [A, B], "scale")], "llvm -mcpu=haswell")
    assert "llvm.loop" not in plain.get_source("ll-raw")


def _loops(s) -> list[For]:
    out: list[For] = []
    post_order_visit(s, lambda n: out.append(n) if isinstance(n, For) else None)
    return out


def _has_unrolled(s) -> bool:
    return any(x.kind == "unrolled" for x in _loops(s))


def test_pack_panel_is_built_per_column_block() -> None:
    """compute_at of the B pack at the column-block loop although the accumulation stage
    (attached one loop further in) is its reader: one (1, K, 16) panel per block."""
    f, *_ = _gemm_case("dense", (13, 40, 37), False, "gp")
    text = str(f)
    assert re.search(r"for \w+ in range\(3\):  # parallel\n\s+dense_wpack = allocate\(\[1, 40, 16\]", text), text


@pytest.mark.parametrize("target", TARGETS)
def test_lane_invariant_guard_keeps_vector_loads(target: str) -> None:
    """A padded depthwise conv's tap: ``row >= 1 ? A[row - 1, i] : 0`` with the guard the same for
    every lane of ``i``. The loop stays explicit SIMD (a branch on the guard, so row -1 is never
    read), where a guard that varies per lane keeps the scalar loop."""
    rows, n = 5, 37
    A = te.placeholder((rows, n), name="A")
    out = te.compute((rows, n), lambda r, i: te.if_then_else(r >= 1, A[r - 1, i] * 2.0, -1.0), name="shifted")
    per_lane = te.compute((rows, n), lambda r, i: te.if_then_else(i >= 1, A[r, i - 1], -1.0), name="per_lane")
    s = te.create_schedule([out.op, per_lane.op])
    for o in (out, per_lane):
        s[o].vectorize(o.op.axis[1])
    f = tir.lower(s, [A, out, per_lane], "guarded2d")
    loops = []
    post_order_visit(f.body, lambda x: loops.append(x) if isinstance(x, For) and x.kind == "vectorized" else None)
    plans = [plan_vector_loop(lp, 32) for lp in loops]
    assert [p is not None for p in plans] == [True, False]
    mod = codegen.build_module([f], target)
    a = RNG.uniform(-1, 1, (rows, n)).astype(np.float32)
    got, lane = _run(mod, "guarded2d", a, np.zeros((rows, n), np.float32), np.zeros((rows, n), np.float32))[1:]
    want = np.full((rows, n), -1.0, np.float32)
    want[1:] = a[:-1] * 2.0
    np.testing.assert_array_equal(got, want)
    want_lane = np.full((rows, n), -1.0, np.float32)
    want_lane[:, 1:] = a[:, :-1]
    np.testing.assert_array_equal(lane, want_lane)


@pytest.mark.parametrize("target", TARGETS)
def test_partial_last_tile_of_a_runtime_extent_runs_as_vector_chunks(target: str) -> None:
    """``for o: for i in range(min(32, n - o*32))`` (vectorized) over a runtime ``n``: whole tiles
    are one 32-lane body, the last partial one vector chunks of 16, 8, 4, 2 and one scalar
    position, each taken when that many are left (``tail_chunks``). Every ``n`` from 1 to 70
    against NumPy, the elements past ``n`` untouched."""
    n = tir.Var("n", "int32")
    A = te.placeholder((72,), name="A", dyn=(n,))
    C = te.compute((72,), lambda i: A[i] * 2.0 + 1.0, name="C")
    s = te.create_schedule(C.op)
    _, xi = s[C].split(C.op.axis[0], factor=32)
    s[C].vectorize(xi)
    f = tir.lower(s, [A, C], "tail_chunks")
    mod = codegen.build_module([f], target)
    if target == "c":
        src = mod.get_source()
        lanes = target_vector_bytes(Target(target)) // 4  # this machine's: 16 with AVX-512, 8 with AVX2
        want = {min(w, lanes) for w in (16, 8, 4, 2)}  # a chunk wider than a register is emitted as several
        assert all(f"kiln_f32x{w}_u*)&C" in src for w in want), f"the tail is not cut into vector chunks {want}"
    for k in range(1, 71):
        a = RNG.standard_normal(k).astype(np.float32)
        c = kiln.nd.array(np.full(72, -5.0, np.float32))
        mod["tail_chunks"](kiln.nd.array(a), c._create_view((k,)))
        got = c.numpy()
        np.testing.assert_array_equal(got[:k], a * 2 + 1, err_msg=f"n = {k}")
        assert (got[k:] == -5.0).all(), f"n = {k}: wrote past the runtime extent"
