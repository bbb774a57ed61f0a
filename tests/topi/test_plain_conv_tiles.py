"""Register tiles of the plain-layout (NCHW) conv kernel: what grouped convs with fewer than 8
channels per group (ResNeXt) and convs the blocked layout does not take run on."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Graph, evaluate
from kiln.topi.schedule.x86_conv import _plain_x_tile


def test_x_tile_divides_the_width_when_it_can() -> None:
    # AVX-512 (16 lanes, 32 registers), 4 output channels per tile: the whole 56-wide row
    # (16 + 16 + 16 + 8: 4 vectors x 4 rows of accumulators + 4 inputs + 1 broadcast = 21)
    assert [_plain_x_tile(w, 4, 16, 32) for w in (56, 28, 14, 7, 64, 112)] == [56, 28, 14, 7, 64, 56]
    # AVX2 (8 lanes, 16 registers): 56 -> 14 (8 + 4 + 2: 3 x 4 + 3 + 1 = 16 registers); 32 -> 16
    # (four vectors would need 21)
    assert [_plain_x_tile(w, 4, 8, 16) for w in (56, 28, 32)] == [14, 14, 16]
    # no divisor of at least one vector: the old rule (two vectors, the tail guarded)
    assert _plain_x_tile(37, 4, 8, 16) == 16


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("width,stride", [(56, 1), (28, 1), (7, 1), (30, 2), (13, 1)])
def test_grouped_conv_with_four_channels_per_group_matches_reference(target: str, width: int, stride: int) -> None:
    rng = np.random.default_rng(width)
    c, groups = 32, 8
    w = rng.standard_normal((c, c // groups, 3, 3)).astype("float32")
    b = rng.standard_normal(c).astype("float32")
    g = Graph()
    x = g.add_input("x", (1, c, width, width))
    wv, bv = g.add_input("w", w.shape), g.add_input("b", b.shape)
    conv = g.add("conv2d", x, wv, groups=groups, padding=(1, 1, 1, 1), strides=(stride, stride))
    g.outputs = [g.add("relu", g.add("bias_add", conv, bv))]
    xv = rng.standard_normal((1, c, width, width)).astype("float32")
    lib = kiln.build(g, target=target, params={"w": w, "b": b})
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(x=xv)
    gm.run()
    (want,) = evaluate(g, {"x": xv, "w": w, "b": b})
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)
