"""Winograd F(2x2, 3x3): the transform ops' NumPy references against a direct convolution, the
compiled path (``c`` and ``llvm``) against ``kiln.ir.evaluate`` of the original conv at odd and
even sizes with fused epilogues, the planes spaced where they would alias in L1, and where
:mod:`kiln.transform.alter_layout` picks it.  (Per-layer timings: ``bench/bench_winograd_layers.py``.)"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.driver.build import optimize
from kiln.ir import Graph, evaluate, get_op
from kiln.ir.ops.layout import layout_to_primal, primal_to_layout
from kiln.ir.ops.winograd import _lines_per_set, winograd_panels, winograd_plane_rows, winograd_weight
from kiln.runtime.errors import InputError
from kiln.transform.alter_layout import WINOGRAD_ENV, _winograd_default
from kiln.target import isa_of
from tests.topi.harness import Case, case_params, module_builder, run_and_check

F32 = "float32"

#: The three kernels through the op harness (every registered compute is run by one:
#: ``tests/topi/test_registry.py``): 7x9 output (border tiles), blocks of 8, K of 24 in panels
#: of 16 (a padded panel).
CASES: list[Case] = [
    Case("winograd_input_transform", [((1, 2, 7, 9, 8), F32)], {"padding": (1, 1, 1, 1)}),
    Case("winograd_input_transform", [((2, 1, 6, 5, 4), F32)], {"padding": (0, 1, 2, 0)}),
    # planes spaced by 3 rows past the 20 tiles (copies of the last tile), and the GEMMs of
    # the first 20 rows of such planes
    Case("winograd_input_transform", [((1, 2, 7, 9, 8), F32)], {"padding": (1, 1, 1, 1), "plane_rows": 23}),
    Case("winograd_matmul", [((16, 20, 16), F32), ((16, 2, 16, 16), F32)], {"units": 24}),
    Case("winograd_matmul", [((16, 23, 16), F32), ((16, 2, 16, 16), F32)], {"units": 24, "tiles": 20}),
    Case("winograd_output_transform", [((16, 20, 16), F32)], {"out_height": 7, "out_width": 9, "block": 8}),
    # the form for symbolic H / W (the data's shape gives the size), here at static shapes
    Case("winograd_output_transform", [((16, 9, 16), F32), ((1, 2, 6, 5, 8), F32)],
         {"out_height": 5, "out_width": 6, "block": 8, "padding": (0, 1, 1, 2)}),
]

get_module = module_builder(CASES, "winograd")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_winograd_kernels(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


def _direct(x: np.ndarray, w: np.ndarray, pad: tuple[int, int, int, int]) -> np.ndarray:
    """Direct 3x3 stride-1 convolution in float64, NCHW / OIHW."""
    pt, pl, pb, pr = pad
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pt, pb), (pl, pr)])
    oh, ow = xp.shape[2] - 2, xp.shape[3] - 2
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for r in range(3):
        for s in range(3):
            out += np.einsum("nchw,kc->nkhw", xp[:, :, r:r + oh, s:s + ow], w[:, :, r, s].astype(np.float64))
    return out


@pytest.mark.parametrize("n,c,k,h,w,ib,ob,pad,spacing", [
    (1, 16, 16, 7, 7, 8, 8, (1, 1, 1, 1), 0),     # odd: the last tile row / column is cut
    (2, 8, 24, 14, 14, 8, 8, (1, 1, 1, 1), 0),    # even, batch 2
    (2, 8, 24, 14, 14, 8, 8, (1, 1, 1, 1), 3),    # the same with planes of 3 more rows
    (1, 12, 20, 9, 13, 4, 4, (1, 1, 1, 1), 0),    # odd and even sides, small blocks
    (1, 4, 8, 3, 3, 4, 8, (0, 0, 0, 0), 0),       # one 1x1 output: one tile, three quarters dropped
    (1, 8, 8, 6, 5, 8, 8, (0, 1, 2, 0), 0),       # asymmetric padding
])
def test_references_match_direct_conv(n: int, c: int, k: int, h: int, w: int, ib: int, ob: int,
                                      pad: tuple[int, int, int, int], spacing: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype(F32)
    wt = rng.standard_normal((k, c, 3, 3)).astype(F32)
    want = _direct(x, wt, pad)
    oh, ow = want.shape[2:]
    tiles = n * ((oh + 1) // 2) * ((ow + 1) // 2)
    attrs = {"padding": pad, "plane_rows": tiles + spacing if spacing else 0}
    vp = get_op("winograd_input_transform").ref([primal_to_layout(x, "NCHW", f"NCHW{ib}c")], attrs)[0]
    assert vp.shape == (16, tiles + spacing, c)
    v = vp[:, :tiles]
    u = winograd_weight(wt)
    m = np.matmul(v.astype(np.float64), u.astype(np.float64)).astype(F32)
    # the GEMM op on build-time panels (8 wide: K = 20 and 24 leave a partial last panel), of
    # the first `tiles` rows of spaced planes
    mp = get_op("winograd_matmul").ref([vp, winograd_panels(u, 8)], {"units": k, "tiles": tiles if spacing else 0})[0]
    np.testing.assert_allclose(mp, m, rtol=1e-5, atol=1e-5)
    y = get_op("winograd_output_transform").ref([m], {"out_height": oh, "out_width": ow, "block": ob})[0]
    np.testing.assert_allclose(layout_to_primal(y, f"NCHW{ob}c"), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tiles,channels,want", [
    (784, 64, 785),    # ResNet's 64 channels at 56x56: 196 KiB planes, all 16 stores in 4 sets
    (16, 512, 17),     # 512 channels at 7x7: 32 KiB planes
    (256, 128, 257),
    (729, 64, 729),    # 54x54: the stores spread already
    (196, 128, 196),   # 2 KiB apart: 8 lines per set, left as it is
    (49, 256, 49),
    (16, 1024, 16),    # a 4 KiB row fills every set whatever the spacing
])
def test_plane_rows(tiles: int, channels: int, want: int) -> None:
    """Planes are spaced exactly where one tile's 16 stores would crowd an L1 set."""
    rows = winograd_plane_rows(tiles, channels)
    assert rows == want
    if rows > tiles:
        assert _lines_per_set(tiles, channels, 4) == 16 and _lines_per_set(rows, channels, 4) < 16


def test_alter_layout_spaces_aliasing_planes(monkeypatch: Any) -> None:
    """The pass spaces the planes of a 64-channel 56x56 conv (and its GEMMs read the tiles),
    not at 54x54, and not with a symbolic batch (the tile count is a runtime value)."""
    monkeypatch.setenv(WINOGRAD_ENV, "1")

    def attrs(g: Graph) -> list[tuple[int, int]]:
        opt = optimize(g, {}, target=_SKX)
        rows = [n.attrs["plane_rows"] for n in opt.nodes if n.op == "winograd_input_transform"]
        tiles = [n.attrs["tiles"] for n in opt.nodes if n.op == "winograd_matmul"]
        return list(zip(rows, tiles))

    assert attrs(_conv_graph(64, 64, 56, padding=(1, 1, 1, 1))) == [(785, 784)]
    assert attrs(_conv_graph(64, 64, 54, padding=(1, 1, 1, 1))) == [(0, 0)]
    g = Graph()
    g.declare_dim("n", 1, 4)
    x = g.add_input("x", ("n", 64, 56, 56))
    w = g.add_constant(np.zeros((64, 64, 3, 3), F32))
    g.outputs = [g.add("conv2d", x, w, padding=(1, 1, 1, 1))]
    assert attrs(g) == [(0, 0)]


def test_type_errors() -> None:
    g = Graph()
    m = g.add_input("m", (16, 10, 16))
    with pytest.raises(InputError):  # 10 tiles are no whole number of 3x3-tile images
        g.add("winograd_output_transform", m, out_height=5, out_width=5, block=8)
    with pytest.raises(InputError):  # the 3x3 window does not fit
        g.add("winograd_input_transform", g.add_input("x", (1, 1, 1, 2, 8)))
    x = g.add_input("x2", (1, 2, 6, 5, 8))
    m2 = g.add_input("m2", (16, 9, 16))
    with pytest.raises(InputError):  # the data input needs the conv's padding
        g.add("winograd_output_transform", m2, x, out_height=5, out_width=6, block=8)
    with pytest.raises(InputError):  # a 6x5 window with this padding is 5x6, not 6x6
        g.add("winograd_output_transform", m2, x, out_height=6, out_width=6, block=8, padding=(0, 1, 1, 2))
    with pytest.raises(InputError):  # planes of fewer rows than the 9 tiles
        g.add("winograd_input_transform", x, padding=(0, 1, 1, 2), plane_rows=8)
    with pytest.raises(InputError):  # more tiles than V has rows
        g.add("winograd_matmul", m2, g.add_input("u", (16, 1, 16, 16)), units=16, tiles=10)
    g.declare_dim("h", 4, 9)
    xs = g.add_input("xs", (1, 2, "h", 5, 8))
    ms = g.add_input("ms", (16, 15, 16))  # static tiles against a symbolic height
    with pytest.raises(InputError):
        g.add("winograd_output_transform", ms, xs, out_height=9, out_width=5, block=8, padding=(1, 1, 1, 1))
    v = g.add("winograd_input_transform", xs, padding=(1, 1, 1, 1))
    assert v.type.dims == (16, "3*((h+1)//2)", 16)
    with pytest.raises(InputError):  # spacing rows after a runtime tile count
        g.add("winograd_input_transform", xs, padding=(1, 1, 1, 1), plane_rows=30)


#: (C, K, H, W, padding, epilogue): the compiled cases, all in one graph per target (compiling
#: dominates the test time).  C / K 12, 20, 40 are not multiples of the blocks (padded lanes).
_CASES: list[tuple[int, int, int, int, tuple[int, int, int, int], str]] = [
    (16, 16, 7, 7, (1, 1, 1, 1), "bias_relu"),
    (32, 32, 14, 14, (1, 1, 1, 1), "residual"),
    (12, 20, 9, 13, (1, 1, 1, 1), "bias_relu"),
    (16, 40, 2, 2, (1, 1, 1, 1), "residual"),    # one tile
    (24, 16, 3, 3, (0, 0, 0, 0), "none"),        # one tile of which one pixel is kept
    (64, 16, 8, 8, (1, 1, 1, 1), "bias_relu"),   # 16 tiles of 64 channels: 4 KiB planes, spaced
]


def _case_graph(rng: np.random.Generator) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph()
    outs = []
    feeds = {}
    for i, (c, k, h, w, pad, epi) in enumerate(_CASES):
        x = g.add_input(f"x{i}", (1, c, h, w))
        feeds[f"x{i}"] = rng.standard_normal((1, c, h, w)).astype(F32)
        wt = g.add_constant((rng.standard_normal((k, c, 3, 3)) * 0.2).astype(F32))
        y = g.add("conv2d", x, wt, padding=pad)
        if epi == "bias_relu":
            y = g.add("relu", g.add("bias_add", y, g.add_constant(rng.standard_normal(k).astype(F32))))
        elif epi == "residual":
            # conv -> conv + residual add (the second conv's input arrives blocked)
            y1 = g.add("relu", y)
            w2 = g.add_constant((rng.standard_normal((k, k, 3, 3)) * 0.2).astype(F32))
            y = g.add("relu", g.add("add", g.add("conv2d", y1, w2, padding=(1, 1, 1, 1)), y1))
        outs.append(y)
    g.outputs = outs
    return g, feeds


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_compiled_against_evaluate(target: str, monkeypatch: Any) -> None:
    monkeypatch.setenv(WINOGRAD_ENV, "1")
    rng = np.random.default_rng(1)
    g, feeds = _case_graph(rng)
    ops = optimize(g, {}).op_counts()
    n_convs = len(_CASES) + sum(1 for case in _CASES if case[5] == "residual")
    assert ops.get("winograd_input_transform") == n_convs and ops.get("winograd_output_transform") == n_convs
    assert "conv2d_nchwc" not in ops and "conv2d" not in ops
    # the 8x8 case's planes alias (16 tiles x 64 channels x 4 bytes = 4 KiB) and are spaced
    spaced = [n.attrs["plane_rows"] for n in optimize(g, {}).nodes if n.op == "winograd_input_transform"
              and n.attrs["plane_rows"]]
    assert spaced == [17], spaced
    want = evaluate(g, feeds)
    lib = kiln.build(g, target=target)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(**feeds)
    gm.run()
    for i, ref in enumerate(want):
        np.testing.assert_allclose(gm.get_output(i).numpy(), ref, rtol=1e-4, atol=1e-4, err_msg=str(_CASES[i]))


def _conv_graph(c: int, k: int, hw: int, **attrs: Any) -> Graph:
    g = Graph()
    x = g.add_input("x", (1, c, hw, hw))
    kh = 1 if attrs.pop("k1", False) else 3
    cg = c // attrs.get("groups", 1)
    w = g.add_constant((np.random.default_rng(2).standard_normal((k, cg, kh, kh)) * 0.1).astype(F32))
    g.outputs = [g.add("relu", g.add("conv2d", x, w, **attrs))]
    return g


#: A target whose ISA (AVX-512) the measured rule covers, whatever the host.
_SKX = "llvm -mcpu=skylake-avx512"


def test_pass_picks_winograd_where_enabled(monkeypatch: Any) -> None:
    monkeypatch.delenv(WINOGRAD_ENV, raising=False)
    wino = "winograd_input_transform"
    # unset: the measured rule
    ops = optimize(_conv_graph(64, 64, 56, padding=(1, 1, 1, 1)), {}, target=_SKX).op_counts()
    assert wino in ops
    # the measured rule: ResNet's 3x3 layers on AVX-512, AVX2 and SSE2
    monkeypatch.setenv(WINOGRAD_ENV, "auto")
    for target in (_SKX, "llvm -mcpu=haswell", "llvm"):
        assert _winograd_default(isa_of(target))
        for c, k, hw in ((64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7)):
            ops = optimize(_conv_graph(c, k, hw, padding=(1, 1, 1, 1)), {}, target=target).op_counts()
            assert wino in ops and "conv2d_nchwc" not in ops, (target, c, k, hw, ops)
    # NEON was not measured: the rule keeps conv2d_nchwc there
    assert not _winograd_default(isa_of("llvm -mtriple=aarch64-linux-gnu -mattr=+neon"))
    # forced on: still never for stride 2, a 1x1, a grouped or a dilated conv
    monkeypatch.setenv(WINOGRAD_ENV, "1")
    for attrs in ({"strides": (2, 2), "padding": (1, 1, 1, 1)}, {"k1": True}, {"groups": 4, "padding": (1, 1, 1, 1)},
                  {"dilation": (2, 2), "padding": (2, 2, 2, 2)}):
        ops = optimize(_conv_graph(32, 32, 14, **attrs), {}).op_counts()
        assert wino not in ops and "conv2d_nchwc" in ops, (attrs, ops)
    assert wino in optimize(_conv_graph(32, 32, 14, padding=(1, 1, 1, 1)), {}).op_counts()
    # forced off
    monkeypatch.setenv(WINOGRAD_ENV, "0")
    assert wino not in optimize(_conv_graph(64, 64, 56, padding=(1, 1, 1, 1)), {}, target=_SKX).op_counts()


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_symbolic_batch(target: str, monkeypatch: Any) -> None:
    """A symbolic batch keeps Winograd (the tiles are a batch-major row count): one library
    run at several batches, an odd output (cut tiles) and a residual epilogue, against
    ``evaluate``."""
    monkeypatch.setenv(WINOGRAD_ENV, "1")
    rng = np.random.default_rng(3)
    g = Graph()
    g.declare_dim("n", 1, 5)
    x = g.add_input("x", ("n", 8, 7, 9))
    w1 = g.add_constant((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(F32))
    w2 = g.add_constant((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(F32))
    y1 = g.add("relu", g.add("conv2d", x, w1, padding=(1, 1, 1, 1)))
    g.outputs = [g.add("relu", g.add("add", g.add("conv2d", y1, w2, padding=(1, 1, 1, 1)), y1))]
    ops = optimize(g, {}).op_counts()
    assert ops.get("winograd_output_transform") == 2 and "conv2d_nchwc" not in ops, ops
    gm = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
    for n in (3, 1, 5, 2):  # smaller after larger: nothing of the earlier run may leak
        xv = rng.standard_normal((n, 8, 7, 9)).astype(F32)
        gm.set_input(x=xv)
        gm.run()
        got = gm.get_output(0).numpy()
        assert got.shape == (n, 16, 7, 9)
        np.testing.assert_allclose(got, evaluate(g, {"x": xv})[0], rtol=1e-4, atol=1e-4, err_msg=f"batch {n}")


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_symbolic_spatial(target: str, monkeypatch: Any) -> None:
    """Symbolic H, W and batch keep Winograd: the tiles are a flat row count at the runtime
    sizes.  One library run at odd and even sizes, smaller after larger (stale padding and
    stale tiles must not leak), through two chained convs with a residual add and a conv with
    asymmetric padding (its output one row smaller), against ``evaluate``."""
    monkeypatch.setenv(WINOGRAD_ENV, "1")
    rng = np.random.default_rng(5)
    g = Graph()
    g.declare_dim("n", 1, 3)
    g.declare_dim("h", 4, 13)
    g.declare_dim("w", 5, 12)
    x = g.add_input("x", ("n", 8, "h", "w"))
    w1 = g.add_constant((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(F32))
    w2 = g.add_constant((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(F32))
    y1 = g.add("relu", g.add("conv2d", x, w1, padding=(1, 1, 1, 1)))
    g.outputs = [g.add("relu", g.add("add", g.add("conv2d", y1, w2, padding=(1, 1, 1, 1)), y1)),
                 g.add("conv2d", y1, w2, padding=(0, 2, 1, 0))]
    opt = optimize(g, {})
    ops = opt.op_counts()
    assert ops.get("winograd_output_transform") == 3 and "conv2d_nchwc" not in ops, ops
    outs = [n for n in opt.nodes if n.op == "winograd_output_transform"]
    assert all(len(n.inputs) == 2 for n in outs)  # the form that reads the runtime H, W
    assert [outs[0].outputs[0].type.dims[i] for i in (0, 2, 3)] == ["n", "h", "w"]
    gm = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
    for n, h, w in [(2, 13, 12), (1, 7, 9), (3, 4, 5), (1, 10, 6), (2, 13, 12)]:
        xv = rng.standard_normal((n, 8, h, w)).astype(F32)
        gm.set_input(x=xv)
        gm.run()
        for i, ref in enumerate(evaluate(g, {"x": xv})):
            got = gm.get_output(i).numpy()
            assert got.shape == ref.shape == ((n, 16, h, w), (n, 16, h - 1, w))[i]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"output {i} at {n}x{h}x{w}")
