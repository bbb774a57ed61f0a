"""Layout-transform kernels: blocked <-> blocked re-blocking and NCHW <-> blocked transposes,
against the NumPy reference, and the loop structure that makes them fast."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.driver.build import lower
from kiln.ir import Graph
from kiln.ir.ops.layout import convert_layout
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import For

TRANSFORMS = [
    ("NCHW16c", "NCHW8c", (1, 3, 9, 7, 16)),
    ("NCHW32c", "NCHW8c", (2, 2, 5, 6, 32)),
    ("NCHW8c", "NCHW16c", (1, 4, 9, 7, 8)),
    ("NCHW4c", "NCHW32c", (1, 16, 3, 5, 4)),
    ("NCHW16c", "NCHW", (1, 3, 9, 13, 16)),
    ("NCHW", "NCHW16c", (1, 48, 9, 13)),
    ("NCHW", "NCHW8c", (2, 16, 7, 14)),
    ("NCHW", "NCHW32c", (1, 64, 5, 70)),
    ("NCHW8c", "NCHW", (1, 2, 3, 70, 8)),
]


def _build(src: str, dst: str, shape: tuple, channels: int = 0) -> Graph:
    g = Graph()
    x = g.add_input("x", shape)
    g.outputs = [g.add("layout_transform", x, src_layout=src, dst_layout=dst, channels=channels)]
    return g


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("src,dst,shape", TRANSFORMS)
def test_layout_transform_matches_reference(src: str, dst: str, shape: tuple, target: str) -> None:
    xv = np.random.default_rng(len(shape) + shape[1]).standard_normal(shape).astype("float32")
    g = _build(src, dst, shape)
    gm = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
    gm.set_input(x=xv)
    gm.run()
    np.testing.assert_array_equal(gm.get_output(0).numpy(), convert_layout(xv, src, dst))


def test_padded_blocked_to_nchw_skips_padding_lanes() -> None:
    # 58 channels in two blocks of 32 (6 padding lanes) back to NCHW
    xv = np.random.default_rng(1).standard_normal((1, 2, 5, 6, 32)).astype("float32")
    g = _build("NCHW32c", "NCHW", xv.shape, channels=58)
    gm = kiln.GraphModule(kiln.build(g, target="llvm")["default"](kiln.cpu()))
    gm.set_input(x=xv)
    gm.run()
    want = xv.transpose(0, 1, 4, 2, 3).reshape(1, 64, 5, 6)[:, :58]
    np.testing.assert_array_equal(gm.get_output(0).numpy(), want)


def _loops(src: str, dst: str, shape: tuple) -> list[For]:
    (func,) = lower(_build(src, dst, shape), "llvm").funcs
    found: list[For] = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, For) else None)
    return found


def test_reblocking_vectorizes_whole_source_blocks() -> None:
    # 16c -> 8c: the source lane is affine in the destination lane (no `% 16` of it), and
    # 8c -> 16c copies one 8-lane source block per vector
    for src, dst, shape, lanes in (("NCHW16c", "NCHW8c", (1, 3, 28, 28, 16), 8),
                                   ("NCHW8c", "NCHW16c", (1, 4, 28, 28, 8), 8)):
        vec = [f for f in _loops(src, dst, shape) if f.kind == "vectorized"]
        assert [int(f.extent.value) for f in vec] == [lanes], (src, dst)


def test_nchw_blocked_transposes_are_unrolled_tiles() -> None:
    kinds = {f.kind for f in _loops("NCHW32c", "NCHW", (1, 4, 56, 56, 32))}
    assert "unrolled" in kinds and "parallel" in kinds and "vectorized" not in kinds
    kinds = {f.kind for f in _loops("NCHW", "NCHW32c", (1, 128, 56, 56))}
    assert "unrolled" in kinds and "parallel" in kinds and "vectorized" not in kinds
