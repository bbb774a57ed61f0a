"""AlterConvLayout: conv chains move to NCHW[x]c with layout transforms only at the chain's
edges, weights re-stored at build time, and the built model computes what the NCHW graph does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.driver.build import optimize
from kiln.ir import Graph, evaluate
from kiln.transform import Sequential, alter_conv_layout
from kiln.transform.alter_layout import AlterConvLayout, choose_in_block, choose_out_block

F32 = "float32"


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(F32)


def _block_net(rng: np.random.Generator) -> tuple[Graph, dict[str, np.ndarray]]:
    """Residual block + pool + 1x1 + depthwise stride 2 + scalar / per-channel ops + global mean.

    Channel counts (12, 24, 40) and widths (13, 7, 4) are deliberately not multiples of 8/16.
    """
    g = Graph()
    x = g.add_input("x", (1, 12, 13, 13))
    p = {"w1": _rand(rng, 24, 12, 3, 3), "b1": _rand(rng, 24), "w2": _rand(rng, 24, 24, 3, 3),
         "b2": _rand(rng, 24), "w3": _rand(rng, 40, 24, 1, 1), "w4": _rand(rng, 40, 1, 3, 3),
         "s": _rand(rng, 1, 40, 1, 1)}
    ins = {k: g.add_input(k, v.shape) for k, v in p.items()}
    y1 = g.add("relu", g.add("bias_add", g.add("conv2d", x, ins["w1"], padding=(1, 1, 1, 1)), ins["b1"]))
    y2 = g.add("bias_add", g.add("conv2d", y1, ins["w2"], padding=(1, 1, 1, 1)), ins["b2"])
    y = g.add("relu", g.add("add", y2, y1))
    y = g.add("max_pool2d", y, pool_size=(2, 2), strides=(2, 2))
    y = g.add("conv2d", y, ins["w3"])
    y = g.add("conv2d", y, ins["w4"], groups=40, strides=(2, 2), padding=(1, 1, 1, 1))
    y = g.add("clip", y, a_min=0.0, a_max=6.0)
    y = g.add("multiply", y, g.add_constant(np.array(0.5, F32)))
    y = g.add("add", y, ins["s"])
    g.outputs = [g.add("reduce_mean", y, axes=(2, 3), keepdims=True), y]
    return g, p


def _run(g: Graph, params: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    lib = kiln.build(g, target="llvm", params=params)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(**inputs)
    gm.run()
    return [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]


def test_block_net_layout_and_values(monkeypatch: Any) -> None:
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # the direct kernels' blocking (tests/topi/test_winograd.py: the other)
    rng = np.random.default_rng(0)
    g, params = _block_net(rng)
    opt = optimize(g, params)
    ops = opt.op_counts()
    assert ops.get("conv2d", 0) == 0 and ops["conv2d_nchwc"] == 4
    # edges only: into the first conv and out of the two graph outputs (max_pool and the global
    # mean stay blocked: the mean's transform moves 40 values, not the whole feature map)
    lts = [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in opt.nodes if n.op == "layout_transform"]
    assert lts == [("NCHW", "NCHW12c"), ("NCHW8c", "NCHW"), ("NCHW8c", "NCHW")], lts
    means = [n for n in opt.nodes if n.op == "reduce_mean"]
    assert len(means) == 1 and means[0].inputs[0].shape == (1, 5, 3, 3, 8)
    assert ops["max_pool2d_nchwc"] == 1
    # weights were re-stored at build time: every conv2d_nchwc weight is a constant node
    for n in opt.nodes:
        if n.op == "conv2d_nchwc":
            assert n.inputs[1].is_constant and len(n.inputs[1].shape) == 6
    x = _rand(rng, 1, 12, 13, 13, scale=1.0)
    want = evaluate(g, {"x": x}, params)
    got = _run(g, params, {"x": x})
    monkeypatch.setenv("KILN_DISABLE_PASSES", "AlterConvLayout")
    plain = _run(g, params, {"x": x})
    for a, b, c in zip(got, want, plain):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-4)


def test_disable_by_env_and_by_name(monkeypatch: Any) -> None:
    g, params = _block_net(np.random.default_rng(1))
    monkeypatch.setenv("KILN_DISABLE_PASSES", "AlterConvLayout")
    assert "conv2d_nchwc" not in optimize(g, params).op_counts()
    monkeypatch.delenv("KILN_DISABLE_PASSES")
    assert "conv2d_nchwc" not in optimize(g, params, opt_level=2).op_counts()
    seq = Sequential([AlterConvLayout()], opt_level=3, disabled=["AlterConvLayout"])
    assert seq(g) is g


def test_ineligible_convs_stay_nchw() -> None:
    """Grouped convs with fewer than 8 channels per group and 3 output channels keep the NCHW kernel."""
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.add_input("x", (1, 8, 6, 7))
    y = g.add("conv2d", x, g.add_constant(_rand(rng, 8, 4, 3, 3)), groups=2)
    y = g.add("conv2d", y, g.add_constant(_rand(rng, 3, 8, 1, 1)))
    g.outputs = [y]
    assert alter_conv_layout(g).op_counts().get("conv2d_nchwc", 0) == 0


def test_grouped_convs_blocked_within_groups() -> None:
    """ResNeXt / RegNet-style grouped convs run blocked (within each group): a producer block that
    does not divide a group is re-blocked; odd widths, stride, padding, a runtime weight; values
    match the reference interpreter and the NCHW build."""
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.add_input("x", (1, 16, 11, 11))
    y = g.add("relu", g.add("conv2d", x, g.add_constant(_rand(rng, 64, 16, 1, 1))))             # block 16
    y = g.add("conv2d", y, g.add_constant(_rand(rng, 64, 8, 3, 3)), groups=8, padding=(1, 1, 1, 1))  # 8 per group
    y = g.add("conv2d", y, g.add_constant(_rand(rng, 96, 16, 3, 3)), groups=4, strides=(2, 2),
              padding=(1, 0, 1, 0))                                                          # 16 in, 24 out per group
    w = g.add_input("w", (96, 48, 1, 1))
    y = g.add("conv2d", y, w, groups=2)                                                      # runtime weight
    g.outputs = [g.add("relu", y)]
    new = alter_conv_layout(g)
    convs = [n for n in new.nodes if n.op == "conv2d_nchwc"]
    assert len(convs) == 4 and new.op_counts().get("conv2d", 0) == 0
    assert [n.attrs["groups"] for n in convs] == [1, 8, 4, 2]
    inputs = {"x": _rand(rng, 1, 16, 11, 11, scale=1.0), "w": _rand(rng, 96, 48, 1, 1)}
    want = evaluate(g, inputs)[0]
    np.testing.assert_allclose(evaluate(new, inputs)[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(g, {}, inputs)[0], want, rtol=1e-4, atol=1e-4)


def test_grouped_nchwc_weight_is_checked() -> None:
    g = Graph()
    x = g.add_input("x", (1, 4, 5, 5, 8))   # 32 channels, block 8
    w = g.add_input("w", (4, 2, 3, 3, 8, 8))  # (O/8, C/groups/8 = 2 -> groups 2, ...)
    assert g.add("conv2d_nchwc", x, w, groups=2).shape == (1, 4, 3, 3, 8)
    with pytest.raises(kiln.runtime.errors.InputError, match="grouped conv2d_nchwc"):
        g.add("conv2d_nchwc", x, w, groups=4)  # 4 groups need C/groups/8 = 1 input block per group


def test_runtime_weight_and_mixed_blocks() -> None:
    """A weight that is a graph input is packed by a layout_transform node; a residual add of
    two different blocks re-blocks one operand; values match the reference interpreter."""
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", (1, 16, 8, 8))
    w = g.add_input("w", (16, 16, 1, 1))
    a = g.add("conv2d", x, w)                                  # ow 8 -> block 16
    a = g.add("conv2d", a, g.add_constant(_rand(rng, 16, 1, 2, 2)), groups=16)  # depthwise keeps 16
    b = g.add("conv2d", g.add_input("x2", (1, 16, 7, 7)), g.add_constant(_rand(rng, 16, 16, 1, 1)))  # block 8
    g.outputs = [g.add("add", a, b)]
    new = alter_conv_layout(g)
    kinds = [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in new.nodes if n.op == "layout_transform"]
    assert ("OIHW", "OIHW16i16o") in kinds and ("NCHW8c", "NCHW16c") in kinds
    assert ("NCHW16c", "NCHW") in kinds and len(kinds) == 5, kinds
    inputs = {"x": _rand(rng, 1, 16, 8, 8, scale=1.0), "w": _rand(rng, 16, 16, 1, 1),
              "x2": _rand(rng, 1, 16, 7, 7, scale=1.0)}
    np.testing.assert_allclose(evaluate(new, inputs)[0], evaluate(g, inputs)[0], rtol=1e-5, atol=1e-5)
    lib = kiln.build(g, target="llvm")
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(**inputs)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), evaluate(g, inputs)[0], rtol=1e-4, atol=1e-4)


def test_graph_without_conv_is_returned_unchanged() -> None:
    g = Graph()
    x = g.add_input("x", (2, 3))
    g.outputs = [g.add("relu", x)]
    assert alter_conv_layout(g) is g


@pytest.mark.parametrize("o,ow,want", [(64, 56, 16), (256, 14, 8), (512, 7, 8), (96, 28, 16), (24, 56, 8),
                                       (20, 13, 10), (3, 5, 3)])
def test_choose_out_block(o: int, ow: int, want: int) -> None:
    assert choose_out_block(o, ow) == want


def test_choose_in_block() -> None:
    assert [choose_in_block(c) for c in (3, 16, 24, 12, 17)] == [3, 16, 8, 12, 1]


def test_squeeze_excitation_stays_blocked(monkeypatch: Any) -> None:
    """EfficientNet's SE block: the global mean, its two 1x1 convs and the per-channel rescale
    of the feature map all run blocked; only the network's edges transform layouts."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", (1, 16, 9, 9))
    p = {"w1": _rand(rng, 32, 16, 3, 3), "w2": _rand(rng, 8, 32, 1, 1), "w3": _rand(rng, 32, 8, 1, 1),
         "w4": _rand(rng, 16, 32, 1, 1)}
    ins = {k: g.add_input(k, v.shape) for k, v in p.items()}
    f = g.add("relu", g.add("conv2d", x, ins["w1"], padding=(1, 1, 1, 1)))
    s = g.add("reduce_mean", f, axes=(-2, -1), keepdims=True)
    s = g.add("relu", g.add("conv2d", s, ins["w2"]))
    s = g.add("sigmoid", g.add("conv2d", s, ins["w3"]))
    g.outputs = [g.add("conv2d", g.add("multiply", f, s), ins["w4"])]
    opt = optimize(g, params=p)
    # a feature map changes layout only at the edges; in between at most the [1, C, 1, 1]
    # scale is re-blocked (32 values) when the SE convs chose another block
    maps = [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in opt.nodes
            if n.op == "layout_transform" and n.inputs[0].shape[2:4] != (1, 1)]
    assert len(maps) == 2 and maps[0][0] == "NCHW" and maps[1][1] == "NCHW", maps
    (mean,) = [n for n in opt.nodes if n.op == "reduce_mean"]
    assert len(mean.inputs[0].shape) == 5 and mean.attrs["axes"] == (2, 3)
    (mul,) = [n for n in opt.nodes if n.op == "multiply"]
    assert all(len(v.shape) == 5 for v in mul.inputs)
    xv = _rand(rng, 1, 16, 9, 9, scale=1.0)
    want = evaluate(g, {"x": xv}, p)
    got = _run(g, p, {"x": xv})
    monkeypatch.setenv("KILN_DISABLE_PASSES", "AlterConvLayout")
    plain = _run(g, p, {"x": xv})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0], plain[0], rtol=1e-4, atol=1e-4)


def test_padded_block_choice() -> None:
    from kiln.target import isa_of
    from kiln.transform.alter_layout import _padded_block

    avx2 = isa_of("llvm -mcpu=haswell")
    # ShuffleNetV2's 58 / 116 channels pad to 64 / 120 (blocks of 8: 120 is no multiple of 16;
    # 64 is, and a 16-wide tile of 4 pixels divides a 28-wide output); padding more than one
    # channel in eight (20 -> 24: blocks of 10 are 8 + 2 lanes, 4 vector ops against 3 once
    # padded, too little gain), a block that divides (24) or too few channels (3) do not pad
    assert [_padded_block(c, avx2, 28) for c in (58, 116, 20, 24, 3, 15)] == [16, 8, None, None, None, None]
    # without an output width (an input block) the wide block whenever it pads to the same count
    assert [_padded_block(c, avx2) for c in (58, 116)] == [16, 8]
    # 7 pixels wide: 16 channels need 6-pixel tiles, so 64 keeps blocks of 8
    assert _padded_block(58, avx2, 7) == 8
    # up to one channel in four when it saves a third of the vector operations: 21 = 3 blocks
    # of 7 (4 + 2 + 1 lanes: 9 ops) -> 24 (3 ops); 42 = 3 x 14 (8 + 4 + 2: 9 ops) -> 48 (6 ops);
    # 18 would pad by a third
    assert [_padded_block(c, avx2, 28) for c in (21, 42, 18)] == [8, 16, None]
    # AVX-512 (narrow 16, wide 32): 116's divisor block 29 is 16 + 8 + 4 + 1 lanes; padded to
    # 128 it takes the wide block where the tile fits (ow 28: 2 x 14 pixels); 232 -> 240 is no
    # multiple of 32 (narrow); RegNetY's 104 (26 = 16 + 8 + 2) -> 112; 48 divides (None)
    avx512 = isa_of("llvm -mcpu=skylake-avx512")
    assert [_padded_block(c, avx512, 28) for c in (58, 116, 232, 104, 48, 20)] == [32, 32, 16, 16, None, None]
    assert _padded_block(116, avx512) == 32  # an input block: no tile to fit


def test_divisor_blocks_between_narrow_and_wide_pad() -> None:
    """A divisor block above the narrow one that is not a multiple of it (29 for 116 channels on
    AVX-512) is replaced by a padded block, in plain, depthwise and input blocks alike."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", (1, 116, 28, 28))
    p = {"w1": _rand(rng, 116, 116, 1, 1), "w2": _rand(rng, 116, 1, 3, 3)}
    ins = {k: g.add_input(k, v.shape) for k, v in p.items()}
    y = g.add("relu", g.add("conv2d", x, ins["w1"]))
    g.outputs = [g.add("conv2d", y, ins["w2"], groups=116, padding=(1, 1, 1, 1))]
    opt = optimize(g, params=p, target="llvm -mcpu=skylake-avx512")
    convs = [n for n in opt.nodes if n.op == "conv2d_nchwc"]
    assert [n.outputs[0].shape[1:] for n in convs] == [(4, 28, 28, 32), (4, 28, 28, 32)]
    assert [n.inputs[0].shape[-1] for n in convs] == [32, 32]


def test_21_class_head_pads_to_24_and_computes_the_same() -> None:
    """A segmentation head (32 -> 21 channels, then a bilinear upsample that must not see the
    padding lanes) runs blocked by 8 with 3 zero lanes."""
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", (1, 32, 7, 7))
    p = {"w": _rand(rng, 21, 32, 1, 1), "b": _rand(rng, 21)}
    ins = {k: g.add_input(k, v.shape) for k, v in p.items()}
    y = g.add("bias_add", g.add("conv2d", x, ins["w"]), ins["b"])
    g.outputs = [g.add("resize2d", y, size=(28, 28), scales=(4.0, 4.0), method="linear")]
    opt = optimize(g, params=p)
    (conv,) = [n for n in opt.nodes if n.op == "conv2d_nchwc"]
    assert conv.outputs[0].shape[1:] == (3, 7, 7, 8)
    xv = _rand(rng, 1, 32, 7, 7, scale=1.0)
    (want,) = evaluate(g, {"x": xv}, p)
    (got,) = _run(g, p, {"x": xv})
    assert got.shape == (1, 21, 28, 28)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_tile_counts_the_vectors_a_block_is_cut_into() -> None:
    from kiln.topi.schedule.x86_conv import max_x_tile

    # 16 ymm: a 7-wide block is 3 registers per pixel (4 + 2 + 1 lanes), not 1
    assert max_x_tile(7, 8, False, 16) == 4  # 4 * 3 accumulators + 3 weights + 1 broadcast
    assert max_x_tile(8, 8, False, 16) == 14 and max_x_tile(16, 8, False, 16) == 6


@pytest.mark.parametrize("target", ["llvm", "c", "llvm -mcpu=skylake-avx512"])
def test_padded_channel_blocks_compute_the_same(target: str, monkeypatch: Any) -> None:
    """116 channels run blocked by 8 with 4 zero lanes: 1x1 conv -> relu -> depthwise ->
    per-channel scale -> 1x1 conv -> global mean, then ops that must not see the padding (a
    log after the relu, a concat with a non-multiple of 8) read the value unpadded. On
    AVX-512 the same graph runs with blocks of 32 / 16 (built here, run where the host can)."""
    from kiln.target import host_isa

    if "avx512" in target and not host_isa().avx512f:
        pytest.skip("host lacks avx512f: the AVX-512 build cannot run here")
    rng = np.random.default_rng(7)
    g = Graph()
    x = g.add_input("x", (1, 116, 9, 9))
    p = {"w1": _rand(rng, 116, 116, 1, 1), "b1": _rand(rng, 116), "w2": _rand(rng, 116, 1, 3, 3),
         "w3": _rand(rng, 58, 116, 1, 1), "s": _rand(rng, 1, 116, 1, 1)}
    ins = {k: g.add_input(k, v.shape) for k, v in p.items()}
    y = g.add("relu", g.add("bias_add", g.add("conv2d", x, ins["w1"]), ins["b1"]))
    z = g.add("conv2d", y, ins["w2"], groups=116, padding=(1, 1, 1, 1))
    z = g.add("divide", g.add("multiply", z, ins["s"]), g.add_constant(np.array(2.0, F32)))
    w = g.add("conv2d", z, ins["w3"])
    g.outputs = [w, g.add("reduce_mean", z, axes=(2, 3), keepdims=True),
                 g.add("log", g.add("add", y, g.add_constant(np.array(1.0, F32)))),
                 g.add("concatenate", w, x, axis=1)]
    opt = optimize(g, params=p)
    convs = [n for n in opt.nodes if n.op == "conv2d_nchwc"]
    assert [n.outputs[0].shape[1:] for n in convs] == [(15, 9, 9, 8), (15, 9, 9, 8), (8, 9, 9, 8)]
    assert convs[1].attrs["groups"] == 120
    pads = [n for n in opt.nodes if n.op == "layout_transform" and n.attrs["channels"]]
    assert pads, "expected padded layout transforms"
    (log,) = [n for n in opt.nodes if n.op == "log"]
    assert len(log.inputs[0].shape) == 4  # unblocked: the padding lanes never reach the log
    xv = _rand(rng, 1, 116, 9, 9, scale=1.0)
    want = evaluate(g, {"x": xv}, p)
    lib = kiln.build(g, target=target, params=p)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(x=xv)
    gm.run()
    for i, ref in enumerate(want):
        got = gm.get_output(i).numpy()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_padded_layout_transform_reference_and_kernel() -> None:
    g = Graph()
    x = g.add_input("x", (1, 58, 3, 5))
    b = g.add("layout_transform", x, src_layout="NCHW", dst_layout="NCHW8c", channels=58)
    b4 = g.add("layout_transform", b, src_layout="NCHW8c", dst_layout="NCHW16c", channels=58)
    g.outputs = [b, b4, g.add("layout_transform", b4, src_layout="NCHW16c", dst_layout="NCHW", channels=58)]
    assert [v.shape for v in g.outputs] == [(1, 8, 3, 5, 8), (1, 4, 3, 5, 16), (1, 58, 3, 5)]
    xv = _rand(np.random.default_rng(2), 1, 58, 3, 5, scale=1.0)
    want = evaluate(g, {"x": xv})
    np.testing.assert_array_equal(want[2], xv)
    assert not want[0][:, 7, :, :, 2:].any() and not want[1][:, 3, :, :, 10:].any()  # zero padding lanes
    got = _run(g, {}, {"x": xv})
    for a, b_ in zip(got, want):
        np.testing.assert_array_equal(a, b_)
    with pytest.raises(Exception, match="channels"):
        g2 = Graph()
        y = g2.add_input("y", (1, 58, 3, 5))
        g2.add("layout_transform", y, src_layout="NCHW", dst_layout="NCHW8c", channels=40)
