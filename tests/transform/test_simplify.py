"""Simplify: BN folding, identity removal, CSE, DCE, reshape aliasing."""

import numpy as np
import pytest

from kiln import ir, transform
from kiln.ir import Graph

RNG = np.random.default_rng(0)


def r(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype("float32")


def _bn_params(g, c, const=True):
    arrs = [r(c), r(c), r(c), r(c, lo=0.5, hi=2.0)]
    if const:
        return [g.add_constant(a) for a in arrs], {}
    vals = [g.add_input(f"bn{i}", (c,)) for i in range(4)]
    return vals, {f"bn{i}": a for i, a in enumerate(arrs)}


def _check_same(g, h, feeds):
    for a, b in zip(ir.evaluate(g, feeds), ir.evaluate(h, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("producer", ["conv2d", "conv2d_bias", "conv2d_transpose", "dense",
                                      "depthwise", "deconv_groups"])
def test_bn_folds_into_producer(producer):
    g = Graph()
    if producer == "dense":
        x = g.add_input("x", (4, 6))
        y = g.add("dense", x, g.add_constant(r(5, 6)))
        c = 5
    elif producer in ("conv2d_transpose", "deconv_groups"):
        x = g.add_input("x", (1, 4, 5, 5))
        groups = 2 if producer == "deconv_groups" else 1
        y = g.add("conv2d_transpose", x, g.add_constant(r(4, 3, 3, 3)), strides=(2, 2),
                  groups=groups)
        c = 3 * groups
    elif producer == "depthwise":
        x = g.add_input("x", (1, 4, 6, 6))
        y = g.add("conv2d", x, g.add_constant(r(4, 1, 3, 3)), groups=4, padding=(1, 1, 1, 1))
        c = 4
    else:
        x = g.add_input("x", (1, 3, 6, 6))
        y = g.add("conv2d", x, g.add_constant(r(8, 3, 3, 3)))
        c = 8
        if producer == "conv2d_bias":
            y = g.add("bias_add", y, g.add_constant(r(8)))
    params, _ = _bn_params(g, c)
    g.outputs = [g.add("relu", g.add("batch_norm", y, *params, epsilon=1e-3))]
    h = transform.simplify_inference(g)
    ops = h.op_counts()
    assert "batch_norm" not in ops
    assert "multiply" not in ops  # folded into the weights, not an affine epilogue
    assert ops["bias_add"] == 1
    _check_same(g, h, {"x": r(*x.shape)})


def test_bn_without_foldable_producer_becomes_affine():
    g = Graph()
    x = g.add_input("x", (2, 3, 4, 4))
    params, _ = _bn_params(g, 3)
    g.outputs = [g.add("batch_norm", g.add("relu", x), *params)]
    h = transform.simplify_inference(g)
    assert "batch_norm" not in h.op_counts() and h.op_counts()["multiply"] == 1
    _check_same(g, h, {"x": r(2, 3, 4, 4)})


def test_bn_with_unbound_params_and_shared_conv():
    g = Graph()
    x = g.add_input("x", (1, 3, 5, 5))
    conv = g.add("conv2d", x, g.add_constant(r(3, 3, 1, 1)))
    params, feeds = _bn_params(g, 3, const=False)
    bn = g.add("batch_norm", conv, *params)
    g.outputs = [g.add("add", bn, conv)]  # conv has two users: cannot fold into weights
    h = transform.simplify_inference(g)
    assert "batch_norm" not in h.op_counts()
    assert h.op_counts()["conv2d"] == 1
    feeds["x"] = r(1, 3, 5, 5)
    _check_same(g, h, feeds)


def test_identity_dropout_removed():
    g = Graph()
    x = g.add_input("x", (2, 3))
    a = g.add("identity", g.add("relu", x))
    b = g.add("dropout", a, rate=0.1)
    c = g.add("reshape", b, newshape=(2, 3))  # no-op reshape
    d = g.add("transpose", c, axes=(0, 1))
    g.outputs = [g.add("sigmoid", d), g.add("identity", x), g.add("dropout", x)]
    h = transform.remove_identity(g)
    ops = h.op_counts()
    assert ops == {"relu": 1, "sigmoid": 1, "identity": 2}  # identities kept for input->output
    _check_same(g, h, {"x": r(2, 3)})


def test_cse_and_dce():
    g = Graph()
    x = g.add_input("x", (4,))
    c1 = g.add_constant(np.ones(4, "float32"))
    c2 = g.add_constant(np.ones(4, "float32"))
    a = g.add("add", x, c1)
    b = g.add("add", x, c2)
    g.add("exp", x)  # dead
    g.outputs = [g.add("multiply", g.add("tanh", a), g.add("tanh", b))]
    h = transform.eliminate_common_subexpr(g)
    assert h.op_counts() == {"constant": 1, "add": 1, "tanh": 1, "multiply": 1}
    _check_same(g, h, {"x": r(4)})
    d = transform.dead_code_elimination(g)
    assert "exp" not in d.op_counts() and len(d.nodes) == len(g.nodes) - 1
    assert d.input_names == ["x"]


def test_mark_alias():
    g = Graph()
    x = g.add_input("x", (2, 3))
    a = g.add("reshape", g.add("relu", x), newshape=(6,))
    b = g.add("reshape", x, newshape=(3, 2))  # graph output aliasing an input: not legal
    g.outputs = [g.add("exp", a), b]
    h = transform.mark_alias(g)
    flags = [n.attrs["alias"] for n in h.nodes if n.op == "reshape"]
    assert flags == [True, False]


def test_simplify_pipeline_end_to_end():
    g = Graph()
    x = g.add_input("x", (1, 3, 6, 6))
    w = g.add_input("w", (4, 3, 3, 3))
    y = g.add("conv2d", x, w, padding=(1, 1, 1, 1))
    params, pvals = _bn_params(g, 4, const=False)
    y = g.add("dropout", g.add("batch_norm", y, *params))
    y = g.add("reshape", g.add("reshape", g.add("relu", y), newshape=(1, 4, 36)),
              newshape=(4, 36))
    g.outputs = [y]
    pvals["w"] = r(4, 3, 3, 3)
    # the blocked-layout pass (tested in test_alter_layout.py) would rewrite the conv here
    seq = transform.default_pipeline(pvals, opt_level=3, disabled=("AlterConvLayout",))
    h = seq(g)
    ops = h.op_counts()
    assert ops == {"constant": 2, "conv2d": 1, "bias_add": 1, "relu": 1, "reshape": 1}
    assert next(n for n in h.nodes if n.op == "reshape").attrs["alias"] is True
    assert h.input_names == ["x"]
    feeds = {"x": r(1, 3, 6, 6)}
    np.testing.assert_allclose(ir.evaluate(h, feeds)[0], ir.evaluate(g, feeds, pvals)[0],
                               rtol=1e-4, atol=1e-5)
    # print/parse still round-trips after the passes
    assert ir.structural_equal(h, ir.parse(str(h), h.constants()))
