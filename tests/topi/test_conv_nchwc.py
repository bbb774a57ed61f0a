"""Blocked convolution ``conv2d_nchwc`` and ``layout_transform``: kernels (c and llvm) against the
NumPy references at odd shapes, fused epilogues, the schedule's register tile, layout helpers
and type errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.topi.harness import (TARGETS, Case, Fused, case_params, fused_reference, lower_fused, make_inputs,
                                 module_builder, run_and_check, target_available)
from kiln import codegen, te, topi
from kiln.ir import Graph, OpPattern, get_op
from kiln.ir.ops.layout import convert_layout, layout_shape, layout_to_primal, parse_layout, primal_to_layout
from kiln.runtime import ndarray as nd
from kiln.runtime.errors import InputError
from kiln.topi.schedule.x86_conv import pick_x_tile

F32 = "float32"
FUSABLE = OpPattern.OUT_ELEMWISE_FUSABLE


def _conv(c: int, o: int, h: int, w: int, k: tuple[int, int], ib: int, ob: int, label: str, **attrs) -> Case:
    return Case("conv2d_nchwc", [((1, c // ib, h, w, ib), F32), ((o // ob, c // ib, k[0], k[1], ib, ob), F32)],
                attrs, rtol=1e-4, atol=1e-4, label=label)


def _dw(c: int, h: int, w: int, k: int, b: int, label: str, **attrs) -> Case:
    return Case("conv2d_nchwc", [((1, c // b, h, w, b), F32), ((c // b, 1, k, k, 1, b), F32)],
                {"groups": c, **attrs}, rtol=1e-4, atol=1e-4, label=label)


CASES: list[Case] = [
    # ow 13 (prime: no divisor tile, guarded tail), channels 3 -> block 3, pad
    _conv(3, 16, 11, 13, (3, 3), 3, 16, "c3_ow13", padding=(1, 1, 1, 1)),
    # ob 8 with ow 14 (tile 14), ib 16 != ob
    _conv(32, 24, 14, 14, (3, 3), 16, 8, "ob8_ow14", padding=(1, 1, 1, 1)),
    # stride 2 with asymmetric padding, odd output width 7
    _conv(16, 32, 13, 14, (3, 3), 8, 16, "s2_asym", strides=(2, 2), padding=(1, 0, 1, 1)),
    # dilation 2, rectangular kernel, ow 9 (tile 9 <= max)... with ob 4
    _conv(8, 12, 12, 15, (3, 2), 4, 4, "dil2", dilation=(2, 2), padding=(2, 1, 2, 1)),
    # 1x1 (GEMM-like), ow 37 (prime), blocks 12 / 10 (channels not multiples of 8)
    _conv(12, 20, 5, 37, (1, 1), 12, 10, "1x1_b12_b10"),
    # 1x1 stride 2, batch 2
    Case("conv2d_nchwc", [((2, 2, 9, 9, 8), F32), ((2, 2, 1, 1, 8, 8), F32)], {"strides": (2, 2)},
         rtol=1e-4, atol=1e-4, label="1x1_s2_n2"),
    # depthwise: block 8, ow 19 (prime, tail), stride 1 pad 1; stride 2; 5x5 dilation
    _dw(16, 10, 19, 3, 8, "dw_ow19", padding=(1, 1, 1, 1)),
    _dw(24, 13, 13, 3, 8, "dw_s2", strides=(2, 2), padding=(1, 1, 1, 1)),
    _dw(32, 9, 11, 5, 16, "dw_5x5_dil", dilation=(2, 1), padding=(4, 2, 4, 2)),
    # blocked max pooling: ResNet's 3x3 stride 2 pad 1, and ceil_mode with dilation on odd sizes
    Case("max_pool2d_nchwc", [((1, 2, 12, 12, 16), F32)], {"pool_size": (3, 3), "strides": (2, 2),
                                                            "padding": (1, 1, 1, 1)}, label="resnet"),
    Case("max_pool2d_nchwc", [((2, 3, 9, 11, 8), F32)], {"pool_size": (2, 3), "strides": (2, 2), "dilation": (1, 2),
                                                          "padding": (0, 1, 1, 1), "ceil_mode": True}, label="ceil"),
    # layout transforms both ways, between blocks, and of weights
    Case("layout_transform", [((2, 24, 5, 7), F32)], {"src_layout": "NCHW", "dst_layout": "NCHW8c"}, label="to8"),
    Case("layout_transform", [((1, 3, 5, 7, 8), F32)], {"src_layout": "NCHW8c", "dst_layout": "NCHW"}, label="from8"),
    Case("layout_transform", [((1, 4, 3, 5, 4), F32)], {"src_layout": "NCHW4c", "dst_layout": "NCHW16c"},
         label="4to16"),
    Case("layout_transform", [((16, 12, 3, 3), F32)], {"src_layout": "OIHW", "dst_layout": "OIHW4i8o"}, label="w"),
]

get_module = module_builder(CASES, "nchwc")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_nchwc_kernels(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


GROUPS: list[Fused] = [
    # conv + bias + residual add + relu, ow 14 with ob 8 (tile 14) and ib 4
    Fused("conv_bias_add_relu", [((1, 2, 14, 14, 4), F32), ((2, 2, 3, 3, 4, 8), F32), ((1, 2, 1, 1, 8), F32),
                                 ((1, 2, 14, 14, 8), F32)],
          [("conv2d_nchwc", {"padding": (1, 1, 1, 1)}, ["i0", "i1"]), ("add", {}, ["n0", "i2"]),
           ("add", {}, ["n1", "i3"]), ("relu", {}, ["n2"])], "conv2d_nchwc", FUSABLE, atol=1e-4),
    # depthwise stride 2 + bias + clip (MobileNetV2's block)
    Fused("dw_bias_clip", [((1, 3, 15, 15, 8), F32), ((3, 1, 3, 3, 1, 8), F32), ((1, 3, 1, 1, 8), F32)],
          [("conv2d_nchwc", {"padding": (1, 1, 1, 1), "strides": (2, 2), "groups": 24}, ["i0", "i1"]),
           ("add", {}, ["n0", "i2"]), ("clip", {"a_min": 0.0, "a_max": 6.0}, ["n1"])], "conv2d_nchwc", FUSABLE),
    # blocked max pool with an elementwise epilogue
    Fused("pool_add_relu", [((1, 2, 9, 10, 8), F32), ((1, 2, 1, 1, 8), F32)],
          [("max_pool2d_nchwc", {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}, ["i0"]),
           ("add", {}, ["n0", "i1"]), ("relu", {}, ["n1"])], "max_pool2d_nchwc", FUSABLE),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fc", GROUPS, ids=[g.label for g in GROUPS])
def test_nchwc_fused_epilogue(target: str, fc: Fused) -> None:
    reason = target_available(target)
    if reason:
        pytest.skip(reason)
    f, s = lower_fused(fc, "nchwc_" + fc.label, target)
    # the reduction lives inside the output's tile loop: the epilogue is fused, not a second pass
    anchors = [st for st in s.stages if isinstance(st.op, te.ComputeOp) and st.op.reduce_axis]
    assert len(anchors) == 1 and anchors[0].attach_type == "scope"
    mod = codegen.build_module([f], target)
    xs = make_inputs(Case(fc.anchor, fc.inputs), 3)
    ref = fused_reference(fc, xs)
    out = nd.empty(ref.shape, F32)
    mod[f.name](*[nd.array(x) for x in xs], out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=fc.rtol, atol=fc.atol)


def test_nchwc_matches_nchw_conv2d() -> None:
    """The blocked op's reference equals the plain conv2d reference after re-layout."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 12, 9, 10)).astype(F32)
    w = rng.standard_normal((20, 12, 3, 3)).astype(F32)
    attrs = {"strides": (2, 1), "padding": (1, 2, 0, 1), "dilation": (1, 2), "groups": 1}
    ref = get_op("conv2d").ref([x, w], get_op("conv2d").normalize_attrs(attrs))[0]
    got = get_op("conv2d_nchwc").ref([convert_layout(x, "NCHW", "NCHW4c"), convert_layout(w, "OIHW", "OIHW4i10o")],
                                     get_op("conv2d_nchwc").normalize_attrs(attrs))[0]
    np.testing.assert_allclose(convert_layout(got, "NCHW10c", "NCHW"), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ow,max_tile,want", [(56, 6, 4), (14, 14, 14), (28, 14, 14), (7, 6, 6), (13, 6, 6),
                                              (112, 7, 7), (5, 6, 5)])
def test_pick_x_tile(ow: int, max_tile: int, want: int) -> None:
    assert pick_x_tile(ow, max_tile) == want


@pytest.mark.parametrize("ob,ow,tile", [(16, 56, 4), (8, 14, 14), (8, 7, 7), (16, 13, 6)])
def test_register_tile_of_schedule(ob: int, ow: int, tile: int) -> None:
    """The schedule's innermost output loops: ``tile`` unrolled pixels × the vectorised block."""
    d = te.placeholder((1, 2, ow, ow, 8), F32, name="d")
    w = te.placeholder((2, 2, 3, 3, 8, ob), F32, name="w")
    out = topi.get_compute("conv2d_nchwc")(get_op("conv2d_nchwc").normalize_attrs({"padding": (1, 1, 1, 1)}),
                                           [d, w], [])[0]
    # pinned: the tiles come from the ISA model (16 ymm registers, Zen 3's 512 KiB L2)
    s = topi.schedule_group("conv2d_nchwc", FUSABLE, [out], "llvm -mcpu=znver3")
    st = s[out]
    leaves = st.leaf_iter_vars
    assert leaves[-1] is out.op.axis[-1] and leaves[-1].dom_extent == ob
    assert st.iter_var_attrs.get(leaves[-1]) == "vectorized"
    assert st.iter_var_attrs.get(leaves[-2]) == "unrolled"
    (split,) = [r for r in st.relations if isinstance(r, te.schedule.Split)]
    assert split.parent is out.op.axis[3] and split.factor == tile and split.inner is leaves[-2]


def test_layout_helpers() -> None:
    assert parse_layout("NCHW16c") == [("N", 0), ("C", 0), ("H", 0), ("W", 0), ("c", 16)]
    assert layout_shape((2, 32, 5, 7), "NCHW16c", "NCHW") == (2, 2, 5, 7, 16)
    assert layout_shape((32, 24, 3, 3), "OIHW8i16o", "OIHW") == (2, 3, 3, 3, 8, 16)
    x = np.arange(2 * 24 * 3 * 5, dtype=F32).reshape(2, 24, 3, 5)
    b = primal_to_layout(x, "NCHW", "NCHW8c")
    assert b[1, 2, 1, 3, 5] == x[1, 21, 1, 3]
    np.testing.assert_array_equal(layout_to_primal(b, "NCHW8c"), x)
    for bad in ("NCHW16", "NCHWc", "NCHW16C", "NCHWW", "NCHW8d", ""):
        with pytest.raises(InputError):
            parse_layout(bad)
    with pytest.raises(InputError, match="does not divide"):
        layout_shape((1, 12, 2, 2), "NCHW8c", "NCHW")


def test_type_errors_name_the_problem() -> None:
    g = Graph()
    x = g.add_input("x", (1, 2, 5, 5, 8))
    with pytest.raises(InputError, match="does not match data"):
        g.add("conv2d_nchwc", x, g.add_input("w", (2, 3, 3, 3, 8, 8)))
    with pytest.raises(InputError, match="depthwise"):
        g.add("conv2d_nchwc", x, g.add_input("w2", (2, 1, 3, 3, 1, 8)), groups=4)
    with pytest.raises(InputError, match="does not divide"):
        g.add("layout_transform", g.add_input("y", (1, 12, 2, 2)), src_layout="NCHW", dst_layout="NCHW8c")
    with pytest.raises(InputError, match="different axes"):
        g.add("layout_transform", g.add_input("z", (1, 16, 2, 2)), src_layout="NCHW", dst_layout="NCDW8c")
