"""Tiles and layouts sized from the instruction-set model (:func:`kiln.target.isa_of`).

Every place that used to assume AVX2 now asks the ISA of the target: the packed dense panel
and GEMV lanes (:mod:`kiln.topi.nn.dense`), the conv channel blocks of the layout pass
(:mod:`kiln.transform.alter_layout`), the tuning ranges (:func:`kiln.topi.knobs.knob_space`)
and the injective vector split (:func:`kiln.topi.schedule.generic.vector_elements`).  CPUs are
pinned with ``-mcpu`` (and ``-mtriple`` for AArch64) so the checks mean the same on any host;
AVX-512 code is only compiled and inspected unless the host has ``avx512f``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln import codegen, te, tir, topi
from kiln.driver.build import optimize
from kiln.ir import Graph, OpPattern, TensorType, Value
from kiln.target import host_isa, isa_of
from kiln.topi.knobs import KNOB_SPACES, current_kernel_target, kernel_target, knob_space
from kiln.topi.nn.dense import (DENSE_PACK_BN, TAG_DENSE, TAG_DENSE_GEMV, TAG_DENSE_PACK, dense, dense_panel_width,
                                gemv_lanes, matmul)
from kiln.topi.schedule.generic import VEC, vector_elements
from kiln.topi.nn.conv2d_nchwc import conv2d_nchwc
from kiln.topi.schedule.x86 import gemm_register_tile, schedule_isa
from kiln.topi.schedule.x86_conv import schedule_conv2d_nchwc
from kiln.transform.alter_layout import AlterConvLayout, alter_conv_layout, choose_in_block, choose_out_block
from tests.codegen.asm_support import hot_loop

SSE2 = "llvm"
HASWELL = "llvm -mcpu=haswell"
ZEN3 = "llvm -mcpu=znver3"
SKX = "llvm -mcpu=skylake-avx512"
A72 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
F32 = "float32"


def _stage(t: te.Tensor, tag: str) -> te.ComputeOp:
    """The compute op tagged ``tag`` among ``t``'s producers."""
    todo, seen = [t.op], set()
    while todo:
        op = todo.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if isinstance(op, te.ComputeOp) and op.tag == tag:
            return op
        todo.extend(x.op for x in op.input_tensors)
    raise AssertionError(f"no {tag} stage")


# ----------------------------------------------------------------------------- dense panels
@pytest.mark.parametrize("target,bn,gemv", [(SSE2, 8, 16), (HASWELL, 16, 16), (ZEN3, 16, 16), (SKX, 64, 32),
                                            (A72, 16, 16)])
def test_panel_width_and_gemv_lanes_per_isa(target: str, bn: int, gemv: int) -> None:
    isa = isa_of(target)
    # the panel is the register tile's width: a packed column tile is exactly one panel
    assert dense_panel_width(isa) == bn == gemm_register_tile(isa)[1]
    # GEMV: two vectors, at least 16 partial sums
    assert gemv_lanes(isa, F32, 4096) == gemv == max(16, 2 * isa.lanes(F32))
    # half when K is no multiple of that; none when not even of half
    assert gemv_lanes(isa, F32, gemv // 2 * 3) == gemv // 2
    assert gemv_lanes(isa, F32, gemv // 2 + 1) == 0


def test_no_target_panel_is_the_old_constant() -> None:
    assert dense_panel_width(schedule_isa(None)) == DENSE_PACK_BN == 16


def test_panel_narrows_for_narrow_outputs_down_to_two_vectors() -> None:
    isa = isa_of(SKX)
    assert [dense_panel_width(isa, n=n) for n in (1000, 64, 63, 40, 32, 20)] == [64, 64, 32, 32, 32, 32]
    # AVX2 and SSE2 panels are two vectors already: never narrowed
    assert dense_panel_width(isa_of(HASWELL), n=10) == 16
    assert dense_panel_width(isa_of(SSE2), n=5) == 8


def test_panel_divides_n_when_a_narrower_whole_vector_width_does() -> None:
    isa = isa_of(SKX)
    # ConvNeXt-T's 96 and 144 columns: three zmm (48) instead of 64 + a half-empty panel;
    # 192 = 3 x 64 keeps 64; 80 has no such width (48, 32 do not divide): 64 as before
    assert [dense_panel_width(isa, n=n) for n in (96, 144, 192, 80)] == [48, 48, 64, 64]
    mt, nt = gemm_register_tile(isa, nt=48)
    assert (mt, nt) == (9, 48)  # 27 accumulators + 3 B vectors + 1 broadcast of 32 zmm


@pytest.mark.skipif(not host_isa().avx512f, reason="host lacks avx512f: AVX-512 code is only compiled here")
def test_avx512_dense_with_48_wide_panels_runs() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((50, 40)).astype("float32")
    w = rng.standard_normal((96, 40)).astype("float32")
    g = Graph()
    x = g.add_input("x", a.shape)
    wv = g.add_input("w", w.shape)
    g.outputs = [g.add("dense", x, wv)]
    lib = kiln.build(g, target=SKX, params={"w": w})
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(x=a)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), a @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target,bn", [(SSE2, 8), (HASWELL, 16), (SKX, 64), (A72, 16)])
def test_dense_packs_for_the_target_and_schedule_agrees(target: str, bn: int) -> None:
    """The pack stage, the anchor's ``bn`` and the schedule's column tile are one number."""
    A = te.placeholder((50, 40), F32, name="A")
    B = te.placeholder((130, 40), F32, name="B")
    C = dense(A, B, target=target)
    anchor, pack = _stage(C, TAG_DENSE), _stage(C, TAG_DENSE_PACK)
    assert anchor.attrs["bn"] == bn and anchor.attrs["packed"]
    assert tuple(int(d) for d in pack.output(0).shape) == (-(-130 // bn), 40, bn)
    s = topi.schedule_group("dense", OpPattern.OUT_ELEMWISE_FUSABLE, [C], target)
    text = str(tir.lower(s, [A, B, C], "gemm"))
    # one panel built per column block, and the column loop is that wide
    assert re.search(rf"dense_wpack = allocate\(\[1, 40, {bn}\]", text), text
    assert re.search(rf"for \w+ in range\((min\()?{bn}[,)].*  # vectorized", text), text


def test_matmul_panel_follows_the_target() -> None:
    A = te.placeholder((20, 30), F32, name="A")
    B = te.placeholder((30, 100), F32, name="B")
    assert _stage(matmul(A, B, target=SKX), "matmul").attrs["bn"] == 64
    assert _stage(matmul(A, B, target=SSE2), "matmul").attrs["bn"] == 8
    assert _stage(matmul(A, B), "matmul").attrs["bn"] == DENSE_PACK_BN


def test_registered_compute_reads_kernel_target() -> None:
    """Graph lowering calls computes without a target: ``kernel_target`` supplies it."""
    x, w = te.placeholder((8, 64), F32, name="x"), te.placeholder((128, 64), F32, name="w")
    fn = topi.get_compute("dense")
    out_t = [TensorType((8, 128), F32)]
    assert current_kernel_target() is None
    assert _stage(fn({}, [x, w], out_t)[0], TAG_DENSE).attrs["bn"] == DENSE_PACK_BN
    with kernel_target(SKX):
        assert current_kernel_target() == SKX
        assert _stage(fn({}, [x, w], out_t)[0], TAG_DENSE).attrs["bn"] == 64
        with kernel_target(SSE2):
            assert _stage(fn({}, [x, w], out_t)[0], TAG_DENSE).attrs["bn"] == 8
        assert current_kernel_target() == SKX
    assert current_kernel_target() is None
    # an explicit argument wins over the scope
    with kernel_target(SKX):
        assert _stage(dense(x, w, target=HASWELL), TAG_DENSE).attrs["bn"] == 16
    # a GPU target has no CPU ISA: the no-target layout
    with kernel_target("opencl"):
        assert _stage(fn({}, [x, w], out_t)[0], TAG_DENSE).attrs["bn"] == DENSE_PACK_BN


@pytest.mark.parametrize("target,lanes", [(SSE2, 16), (HASWELL, 16), (SKX, 32)])
def test_gemv_partial_sums_follow_the_target(target: str, lanes: int) -> None:
    C = dense(te.placeholder((1, 256), F32, name="x"), te.placeholder((100, 256), F32, name="w"), target=target)
    assert _stage(C, TAG_DENSE).attrs["lanes"] == lanes
    assert int(_stage(C, TAG_DENSE_GEMV).output(0).shape[-1]) == lanes


def _dense_module(m: int, k: int, n: int, target: str):
    A = te.placeholder((m, k), F32, name="A")
    B = te.placeholder((n, k), F32, name="B")
    C = dense(A, B, target=target)
    s = topi.schedule_group("dense", OpPattern.OUT_ELEMWISE_FUSABLE, [C], target)
    return codegen.build_module([tir.lower(s, [A, B, C], "gemm")], target)


def test_avx512_panel_is_a_6x64_zmm_tile_without_spills() -> None:
    """Compiled, never run here: the 64-wide panel gives 6 rows x 4 zmm = 24 FMAs per k step."""
    asm = _dense_module(60, 64, 256, SKX).get_source("asm")
    hot = hot_loop(asm, "vfmadd")
    assert len([ln for ln in hot.splitlines() if "vfmadd" in ln and "%zmm" in ln]) >= 24, hot
    assert "(%rsp)" not in hot and "(%rbp)" not in hot, hot


def test_sse2_panel_is_an_xmm_tile_without_spills() -> None:
    asm = _dense_module(60, 64, 256, SSE2).get_source("asm")
    assert "%ymm" not in asm and "%zmm" not in asm
    hot = hot_loop(asm, "mulps")
    assert hot.count("mulps") >= 12, hot  # 6 rows x 2 xmm of the 8-wide panel
    assert "(%rsp)" not in hot, hot


def _runnable() -> list[str]:
    out = [SSE2]
    if host_isa().avx2 and host_isa().fma:
        out.append(HASWELL)
    if host_isa().avx512f:
        out.append(SKX)
    return out


@pytest.mark.parametrize("target", _runnable())
@pytest.mark.parametrize("m,k,n", [(37, 70, 100), (2, 48, 33), (9, 13, 7)])
def test_dense_results_for_each_runnable_isa(target: str, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * n)
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((n, k)).astype(F32)
    out = kiln.nd.empty((m, n), F32)
    _dense_module(m, k, n, target)["gemm"](kiln.nd.array(a), kiln.nd.array(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=2e-5, atol=2e-4)


@pytest.mark.skipif(not host_isa().avx512f, reason="host lacks avx512f: AVX-512 code is only compiled here")
def test_avx512_dense_runs() -> None:
    test_dense_results_for_each_runnable_isa(SKX, 37, 70, 130)


# ----------------------------------------------------------------------------- conv blocks
@pytest.mark.parametrize("target,wide,narrow,at14,at7", [
    (SSE2, 16, 8, 16, 8),      # 4 xmm per pixel: 2-pixel tiles, so any even width
    (HASWELL, 16, 8, 8, 8),    # 2 ymm: 4..6 pixels; 7 and 14 have no such divisor
    (ZEN3, 16, 8, 8, 8),
    (SKX, 32, 16, 32, 32),     # 2 zmm of 32 registers: up to 14 pixels
    (A72, 16, 8, 16, 8),       # 4 NEON registers per pixel: 2..6 pixels of 32 registers
])
def test_conv_blocks_per_isa(target: str, wide: int, narrow: int, at14: int, at7: int) -> None:
    isa = isa_of(target)
    assert choose_in_block(256, isa) == wide and choose_in_block(wide * 3 // 2, isa) == narrow
    assert choose_out_block(256, 56, isa) == wide
    assert choose_out_block(256, 28, isa) == wide
    assert choose_out_block(512, 14, isa) == at14
    assert choose_out_block(512, 7, isa) == at7
    # a row that fits one tile whole takes the wide block
    assert choose_out_block(256, 1, isa) == wide
    # channel counts that are no multiple of a vector: largest divisor up to the wide block
    assert choose_out_block(3, 5, isa) == 3


def test_no_target_conv_blocks_are_avx2() -> None:
    assert [choose_out_block(c, w) for c, w in [(64, 56), (128, 28), (256, 14), (512, 7), (24, 56)]] == \
        [16, 16, 8, 8, 8]
    assert choose_in_block(64) == 16 and choose_in_block(24) == 8


def _conv_graph() -> Graph:
    g = Graph("c")
    x = Value(TensorType((1, 32, 14, 14), F32), None, 0, "x")
    g.inputs.append(x)
    rng = np.random.default_rng(0)
    w1 = g.add_constant(rng.standard_normal((64, 32, 3, 3)).astype(F32))
    w2 = g.add_constant(rng.standard_normal((64, 64, 1, 1)).astype(F32))
    y = g.add("conv2d", x, w1, padding=(1, 1, 1, 1))
    g.outputs = [g.add("conv2d", g.add("relu", y), w2)]
    return kiln.transform.infer_type(g)


def _blocks(g: Graph) -> list[str]:
    return sorted({n.attrs["dst_layout"] for n in g.nodes if n.op == "layout_transform"}
                  | {n.attrs["src_layout"] for n in g.nodes if n.op == "layout_transform"})


# 64 channels at 14x14: AVX2 blocks them by 16 with a 2 x 2 register tile (row_x_tile; a
# 16-channel row of 14 has no one-row tile), SSE2 by 16 with 2-pixel rows, AVX-512 by 32
@pytest.mark.parametrize("target,layouts", [(None, ["NCHW", "NCHW16c"]),
                                            (SSE2, ["NCHW", "NCHW16c"]),
                                            (HASWELL, ["NCHW", "NCHW16c"]),
                                            (SKX, ["NCHW", "NCHW32c"])])
def test_layout_pass_blocks_for_its_target(target: str | None, layouts: list[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # the direct conv's blocks; its 3x3 would be Winograd
    g = _conv_graph()
    new = alter_conv_layout(g, target)
    assert new.op_counts().get("conv2d_nchwc") == 2
    assert _blocks(new) == layouts
    assert _blocks(AlterConvLayout(target)(g)) == layouts


def test_build_passes_its_target_to_the_layout_pass() -> None:
    g = _conv_graph()
    for target, layouts in ((SSE2, ["NCHW", "NCHW16c"]), (SKX, ["NCHW", "NCHW32c"])):
        assert _blocks(optimize(g, target=kiln.target.Target(target))) == layouts, target
    # no target: the schedules' no-target ISA (AVX2), as before
    assert _blocks(optimize(g)) == ["NCHW", "NCHW16c"]


def test_conv_rows_stay_parallel_when_tiled_for_l2() -> None:
    """An input larger than half the L2 puts rows outside the channel-block loop (row_tile);
    the fused (batch, row tile, block) loop is still the parallel one."""
    from kiln.topi.schedule.x86_conv import row_tile

    data = te.placeholder((1, 16, 56, 56, 16), name="data")  # 3.2 MB
    weight = te.placeholder((8, 16, 1, 1, 16, 16), name="weight")  # 128 KiB: re-read per row tile
    out = conv2d_nchwc(data, weight)
    s = schedule_conv2d_nchwc([out], HASWELL)
    anchor = next(st for st in s.stages if st.op.name == "conv2d_nchwc" and len(st.op.input_tensors) == 2)
    assert row_tile(anchor) > 0
    body = str(tir.lower(s, [data, weight, out], "c").body)
    assert body.splitlines()[0].endswith("# parallel"), body[:400]


def test_row_tiles_for_rows_without_a_one_row_tile() -> None:
    """14-wide rows of 16 channels (two ymm per pixel): no divisor of 14 fits 16 registers, so
    the tile is 2 rows x 2 pixels (8 accumulators, no tail); a 7x7 output has none (7 is
    prime) and keeps 8-channel blocks; one-row tiles stay where they exist."""
    from kiln.topi.schedule.x86_conv import row_x_tile

    assert row_x_tile(14, 14, 16, 8) == (2, 2)
    assert row_x_tile(7, 7, 16, 8) is None and row_x_tile(28, 28, 16, 8) is None
    assert row_x_tile(14, 14, 8, 8) is None  # one row of 14 is 14 accumulators
    assert row_x_tile(10, 2, 16, 8) == (5, 1)  # DeepLabV3's pruned ASPP taps: 10 accumulators
    isa = isa_of(HASWELL)
    assert choose_out_block(256, 14, isa, out_height=14) == 16
    assert choose_out_block(256, 14, isa) == 8 and choose_out_block(512, 7, isa, out_height=7) == 8
    # the schedule: a conv of 14x14 outputs in 16-channel blocks accumulates a 2 x 2 x 16 tile
    data = te.placeholder((1, 2, 16, 16, 16), name="data")
    weight = te.placeholder((2, 2, 3, 3, 16, 16), name="weight")
    out = conv2d_nchwc(data, weight)
    s = schedule_conv2d_nchwc([out], HASWELL)
    body = str(tir.lower(s, [data, weight, out], "c").body)
    assert "allocate([1, 1, 2, 2, 16]" in body, body
    assert "# parallel" in body  # the split rows still leave (batch, block, row pairs) parallel
    # and it computes the same: the 14x14 graph, 2 x 2 tiles in 16-channel blocks, against the
    # reference interpreter
    g = _conv_graph()
    xv = np.random.default_rng(1).standard_normal((1, 32, 14, 14)).astype(np.float32)
    (want,) = kiln.ir.evaluate(g, {"x": xv})
    gm = kiln.GraphModule(kiln.build(g, target=HASWELL if host_isa().has("avx2") else "llvm")["default"](kiln.cpu()))
    gm.run(x=xv)
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-3)


# ----------------------------------------------------------------------------- tuning ranges
@pytest.mark.parametrize("target", [SSE2, HASWELL, ZEN3, SKX, A72, None])
def test_knob_ranges_hold_the_isa_defaults(target: str | None) -> None:
    isa = schedule_isa(target)
    lanes = isa.lanes(F32)
    for kind in ("dense", "matmul"):
        space = knob_space(kind, target)
        mt, nt = gemm_register_tile(isa)
        assert mt in space.knobs["mt"] and nt in space.knobs["nt"]
        bn = dense_panel_width(isa)
        assert bn in space.knobs["nt"] and gemm_register_tile(isa, nt=bn)[0] in space.knobs["mt"]
        # one to four vectors; rows up to what fits beside a single vector (12 at most)
        assert space.knobs["nt"] == tuple(lanes * v for v in (1, 2, 3, 4))
        assert max(space.knobs["mt"]) == 12 and space.knobs["mt"] == tuple(range(1, 13))
    ob = knob_space("conv2d_layout", target).knobs["ob"]
    assert ob[0] == 0 and choose_out_block(256, 56, isa) in ob and choose_out_block(256, 7, isa) in ob


def test_avx512_ranges_reach_64_columns_and_12_rows() -> None:
    space = knob_space("dense", SKX)
    assert space.knobs["nt"] == (16, 32, 48, 64) and 12 in space.knobs["mt"]
    assert knob_space("conv2d_layout", SKX).knobs["ob"] == (0, 8, 16, 32, 64)


def test_no_target_spaces() -> None:
    assert set(KNOB_SPACES) == {"dense", "matmul", "conv2d_nchwc", "conv2d_layout"}
    assert "dense" in KNOB_SPACES and "nope" not in KNOB_SPACES
    assert KNOB_SPACES["dense"] == knob_space("dense", "llvm -mcpu=x86-64-v3")
    assert KNOB_SPACES["conv2d_layout"].knobs["ob"] == (0, 4, 8, 16, 32)
    with pytest.raises(KeyError):
        knob_space("conv3d")


# ----------------------------------------------------------------------------- injective split
@pytest.mark.parametrize("target,vec", [(None, VEC), (SSE2, 8), (HASWELL, 16), (SKX, 32), (A72, 8),
                                        ("cuda", VEC)])
def test_injective_split_per_isa(target: str | None, vec: int) -> None:
    assert vector_elements(target) == vec
    if target is None or target == "cuda":
        return
    x = te.placeholder((3, 100), F32, name="x")
    y = te.compute(x.shape, lambda i, j: x[i, j] * 2.0, name="y", tag="elemwise")
    s = topi.schedule_group("multiply", OpPattern.ELEMWISE, [y], target)
    text = str(tir.lower(s, [x, y], "scale"))
    # elementwise rows of 100 (not a multiple of vec) run as one flat loop of 300: one tail
    assert re.search(rf"for \w+ in range\(min\({vec}, 300 - \w+ \* {vec}\)\):  # vectorized", text), text
