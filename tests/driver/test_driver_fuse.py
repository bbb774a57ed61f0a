"""FuseOps rules, and fused kernels checked numerically against the IR interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Graph, OpPattern, evaluate
from kiln.transform.fuse import fuse_ops


def _groups(g: Graph, opt_level: int = 3, **kw) -> list[list[str]]:
    return [grp.ops for grp in fuse_ops(g, opt_level=opt_level, **kw).groups]


def _check_numerics(g: Graph, feeds: dict[str, np.ndarray], target: str = "c", **kw) -> None:
    factory = kiln.build(g, target=target, **kw)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input(**feeds)
    m.run()
    ref = evaluate(g, feeds)
    for i, r in enumerate(ref):
        np.testing.assert_allclose(m.get_output(i).numpy(), r, rtol=1e-5, atol=1e-6)


def _conv_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    r = np.random.default_rng(0)
    g = Graph()
    x = g.add_input("x", (1, 4, 6, 6))
    res = g.add_input("res", (1, 4, 6, 6))
    w = g.add_constant(r.standard_normal((4, 4, 3, 3)).astype(np.float32))
    b = g.add_constant(r.standard_normal(6).astype(np.float32)[:4].copy())
    y = g.add("conv2d", x, w, padding=(1, 1, 1, 1))
    y = g.add("bias_add", y, b)
    y = g.add("relu", y)
    g.outputs = [g.add("add", y, res)]
    feeds = {"x": r.standard_normal((1, 4, 6, 6)).astype(np.float32),
             "res": r.standard_normal((1, 4, 6, 6)).astype(np.float32)}
    return g, feeds


def test_anchor_absorbs_epilogue() -> None:
    g, feeds = _conv_graph()
    fg = fuse_ops(g)
    assert [grp.ops for grp in fg.groups] == [["conv2d", "bias_add", "relu", "add"]]
    grp = fg.groups[0]
    assert grp.anchor.op == "conv2d" and grp.pattern == OpPattern.OUT_ELEMWISE_FUSABLE
    assert [v.name for v in grp.inputs if v.is_input] == ["x", "res"]
    assert "conv2d -> bias_add -> relu -> add" in fg.dump()
    _check_numerics(g, feeds)


def test_opt_level0_one_op_per_group() -> None:
    g, feeds = _conv_graph()
    assert _groups(g, opt_level=0) == [["conv2d"], ["bias_add"], ["relu"], ["add"]]
    _check_numerics(g, feeds, opt_level=0)


def test_no_fusion_across_shared_value() -> None:
    g = Graph()
    x = g.add_input("x", (4, 4))
    e = g.add("exp", x)
    a = g.add("relu", e)
    b = g.add("sigmoid", e)
    g.outputs = [a, b]
    # exp is used by two groups: it must stay its own kernel
    assert _groups(g) == [["exp"], ["relu"], ["sigmoid"]]


def test_diamond_fuses_when_all_consumers_inside() -> None:
    g = Graph()
    x = g.add_input("x", (4, 4))
    e = g.add("exp", x)
    g.outputs = [g.add("add", g.add("relu", e), g.add("sigmoid", e))]
    assert _groups(g) == [["exp", "relu", "sigmoid", "add"]]
    _check_numerics(g, {"x": np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)})


def test_graph_output_is_not_fused_through() -> None:
    g = Graph()
    x = g.add_input("x", (4,))
    e = g.add("exp", x)
    g.outputs = [e, g.add("relu", e)]
    assert _groups(g) == [["exp"], ["relu"]]


def test_opaque_stands_alone_and_conv_takes_no_producer() -> None:
    g = Graph()
    x = g.add_input("x", (1, 2, 4, 4))
    w = g.add_input("w", (2, 2, 1, 1))
    y = g.add("relu", x)
    y = g.add("conv2d", y, w)
    y = g.add("softmax", y, axis=1)
    g.outputs = [g.add("exp", y)]
    assert _groups(g) == [["relu"], ["conv2d"], ["softmax"], ["exp"]]


def test_reduction_rules() -> None:
    g = Graph()
    x = g.add_input("x", (4, 8))
    y = g.add("multiply", x, x)
    y = g.add("transpose", y, axes=(1, 0))
    s = g.add("reduce_sum", y, axes=(0,))
    g.outputs = [g.add("sqrt", s)]
    fg = fuse_ops(g)
    # injective producers and the elementwise epilogue join the reduction
    assert [grp.ops for grp in fg.groups] == [["multiply", "transpose", "reduce_sum", "sqrt"]]
    assert fg.groups[0].anchor.op == "reduce_sum"
    _check_numerics(g, {"x": np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)})


def test_reduction_does_not_steal_conv_epilogue() -> None:
    g = Graph()
    x = g.add_input("x", (1, 2, 4, 4))
    w = g.add_input("w", (2, 2, 3, 3))
    y = g.add("relu", g.add("conv2d", x, w, padding=(1, 1, 1, 1)))
    g.outputs = [g.add("reduce_mean", y, axes=(2, 3), keepdims=True)]
    assert _groups(g) == [["conv2d", "relu"], ["reduce_mean"]]


def test_epilogue_must_keep_anchor_shape() -> None:
    g = Graph()
    x = g.add_input("x", (2, 3))
    w = g.add_input("w", (4, 3))
    big = g.add_input("big", (5, 2, 4))
    y = g.add("dense", x, w)
    g.outputs = [g.add("add", y, big)]  # broadcasts (2, 4) up to (5, 2, 4)
    assert _groups(g) == [["dense"], ["add"]]


def test_group_size_cap() -> None:
    g = Graph()
    y = g.add_input("x", (8,))
    for _ in range(10):
        y = g.add("relu", y)
    g.outputs = [y]
    assert [len(o) for o in _groups(g, max_group_size=4)] == [2, 4, 4]


def test_multi_output_split_group() -> None:
    g = Graph()
    x = g.add_input("x", (4, 6))
    a, b = g.add_node("split", [x], {"sections": (2, 4), "axis": 1})
    g.outputs = [g.add("concatenate", g.add("relu", b), g.add("exp", a), axis=1)]
    assert _groups(g) == [["split", "exp", "relu", "concatenate"]] or \
        _groups(g) == [["split", "relu", "exp", "concatenate"]]
    _check_numerics(g, {"x": np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)})


def test_multi_output_root() -> None:
    g = Graph()
    x = g.add_input("x", (4, 6))
    a, b = g.add_node("split", [g.add("exp", x)], {"sections": (3, 3), "axis": 1})
    g.outputs = [g.add("relu", a), b]
    _check_numerics(g, {"x": np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)})


def test_identical_groups_share_kernel_different_constants_do_not() -> None:
    g = Graph()
    y = g.add_input("x", (4,))
    for c in (1.0, 1.0, 2.0):  # softmax (opaque) keeps the adds in separate groups
        y = g.add("softmax", g.add("add", y, g.add_constant(np.float32(c))))
    g.outputs = [y]
    low = kiln.driver.lower(g, "c")
    names = [c.func_name for c in low.calls]
    assert names[0] == names[2] == "kilngen_default_fused_add"  # same op, types and constant
    assert names[4] == "kilngen_default_fused_add_1"  # the inlined constant differs
    assert names.count("kilngen_default_fused_softmax") == 3
    assert len(low.funcs) == 3
    _check_numerics(g, {"x": np.arange(4, dtype=np.float32)})


def test_long_names_are_truncated_and_unique() -> None:
    g = Graph()
    y = g.add_input("x", (8,))
    for _ in range(20):
        y = g.add("sigmoid", y)
    g.outputs = [y]
    low = kiln.driver.lower(g, "c")
    (name,) = [f.name for f in low.funcs]
    assert name.startswith("kilngen_default_fused_sigmoid_sigmoid") and len(name) < 110


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_layer_patterns_numerics(target: str) -> None:
    r = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", (2, 3, 8))
    gamma = g.add_constant(r.standard_normal(8).astype(np.float32))
    beta = g.add_constant(r.standard_normal(8).astype(np.float32))
    y = g.add("layer_norm", x, gamma, beta)
    y = g.add("gelu", y)
    m = g.add("reduce_mean", y, axes=(2,), keepdims=True)
    y = g.add("subtract", y, m)
    g.outputs = [g.add("softmax", g.add("transpose", y, axes=(0, 2, 1)), axis=-1)]
    _check_numerics(g, {"x": r.standard_normal((2, 3, 8)).astype(np.float32)}, target=target)


def test_epilogue_stays_with_its_anchor_before_concat_and_broadcast() -> None:
    """conv -> bias -> relu feeding a concatenation, and a squeeze-and-excitation scale
    (conv -> bias -> sigmoid, [1, C, 1, 1]) broadcast over a feature map: the elementwise chain
    is the conv's epilogue, not part of the consumer (where the concatenation could no longer
    be written in place, and the sigmoid would run once per pixel)."""
    r = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", (1, 4, 5, 5))
    w = g.add_constant(r.standard_normal((4, 4, 1, 1)).astype(np.float32))
    b = g.add_constant(r.standard_normal(4).astype(np.float32))
    y = g.add("relu", g.add("bias_add", g.add("conv2d", x, w), b))
    cat = g.add("concatenate", x, y, axis=1)
    pooled = g.add("reduce_mean", x, axes=(2, 3), keepdims=True)
    ws = g.add_constant(r.standard_normal((4, 4, 1, 1)).astype(np.float32))
    scale = g.add("sigmoid", g.add("bias_add", g.add("conv2d", pooled, ws), b))
    g.outputs = [cat, g.add("multiply", x, scale)]
    groups = _groups(g)
    assert ["conv2d", "bias_add", "relu"] in groups, groups
    assert ["conv2d", "bias_add", "sigmoid"] in groups, groups
    assert ["concatenate"] in groups and ["multiply"] in groups, groups
    _check_numerics(g, {"x": r.standard_normal((1, 4, 5, 5)).astype(np.float32)})


def test_elementwise_chain_without_anchor_still_fuses_into_concat() -> None:
    g = Graph()
    x = g.add_input("x", (1, 4, 5, 5))
    g.outputs = [g.add("concatenate", x, g.add("relu", g.add("negative", x)), axis=1)]
    assert _groups(g) == [["negative", "relu", "concatenate"]]
