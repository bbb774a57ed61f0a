"""Graph passes keep symbolic dims and dim ranges: the default pipeline on a small CNN with a
symbolic batch and on a transformer block with symbolic batch and sequence."""

import numpy as np
import pytest

from kiln.ir import Graph, evaluate, parse, structural_equal
from kiln.transform import default_pipeline, flatten_matmul, infer_type, simplify

RNG = np.random.default_rng(0)


def _const(g: Graph, *shape: int):
    return g.add_constant(RNG.standard_normal(shape).astype("float32"))


def _cnn() -> Graph:
    g = Graph("cnn")
    g.declare_dim("batch", 1, 8)
    x = g.add_input("x", ("batch", 3, 16, 16))
    y = g.add("conv2d", x, _const(g, 16, 3, 3, 3), padding=(1, 1, 1, 1))
    y = g.add("relu", g.add("bias_add", y, _const(g, 16)))
    y = g.add("max_pool2d", y, pool_size=(2, 2), strides=(2, 2))
    y = g.add("relu", g.add("conv2d", y, _const(g, 16, 16, 3, 3), padding=(1, 1, 1, 1)))
    y = g.add("reshape", y, newshape=(8, 16 * 8 * 8))
    g.outputs = [g.add("dense", y, _const(g, 10, 1024))]
    return g


def _transformer(seq: str | int = "seq") -> Graph:
    g = Graph("block")
    g.declare_dim("batch", 1, 2)
    if isinstance(seq, str):
        g.declare_dim(seq, 1, 8)
    x = g.add_input("x", ("batch", seq, 48))

    def proj(v):
        return g.add("add", g.add("matmul", v, _const(g, 48, 48)), _const(g, 48))

    def heads(v):
        return g.add("transpose", g.add("reshape", v, newshape=(2, 8, 4, 12)), axes=(0, 2, 1, 3))

    q, k, v = heads(proj(x)), heads(proj(x)), heads(proj(x))
    s = g.add("matmul", q, g.add("transpose", k, axes=(0, 1, 3, 2)))
    p = g.add("softmax", g.add("multiply", s, g.add_constant(np.float32(0.25))))
    o = g.add("transpose", g.add("matmul", p, v), axes=(0, 2, 1, 3))
    o = g.add("add", proj(g.add("reshape", o, newshape=(2, 8, 48))), x)
    o = g.add("layer_norm", o, _const(g, 48), _const(g, 48))
    h = g.add("gelu", proj(o))
    g.outputs = [g.add("layer_norm", g.add("add", proj(h), o), _const(g, 48), _const(g, 48))]
    return g


def _check_kept(g: Graph, h: Graph, feed: dict[str, np.ndarray]) -> None:
    assert h.dim_ranges == g.dim_ranges
    assert [v.type for v in h.outputs] == [v.type for v in g.outputs]
    # Every value that still has the batch rows carries a symbol.
    for node in h.nodes:
        for v in node.outputs:
            if node.op != "constant" and v.shape and v.shape[0] in (8, 16) and node.op != "reshape":
                assert v.type.is_dynamic, (node.op, v.type)
    back = parse(str(h), h.constants())
    assert structural_equal(back, h)
    # Numerics at the upper bounds are unchanged.
    for a, b in zip(evaluate(g, feed), evaluate(h, feed)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("level", [2, 3])
def test_cnn_pipeline_keeps_batch(level):
    g = _cnn()
    h = default_pipeline(opt_level=level)(g)
    assert h.outputs[0].type.dims == ("batch", 10)
    if level == 3:  # the blocked conv, or its Winograd form (a symbolic batch keeps it)
        assert {"conv2d_nchwc", "winograd_output_transform"} & set(h.op_counts())
    _check_kept(g, h, {"x": RNG.standard_normal((8, 3, 16, 16)).astype("float32")})


@pytest.mark.parametrize("level", [2, 3])
def test_transformer_pipeline_keeps_batch_and_seq(level):
    g = _transformer()
    h = default_pipeline(opt_level=level)(g)
    assert h.outputs[0].type.dims == ("batch", "seq", 48)
    dims = {v.type.dims for n in h.nodes for v in n.outputs}
    assert ("batch", 4, "seq", "seq") in dims
    # rows b*seq + s are not where (b, s) lives in the padded layout: the products keep
    # their leading dims instead of being flattened to batch*seq rows
    assert ("batch*seq", 48) not in dims
    # (their constant weights make them N-D denses, which the kernel bounds dim by dim)
    assert all(n.inputs[0].type.dims == ("batch", "seq", 48) for n in h.nodes if n.op == "dense")
    _check_kept(g, h, {"x": RNG.standard_normal((2, 8, 48)).astype("float32")})


@pytest.mark.parametrize("level", [2, 3])
def test_transformer_with_dynamic_batch_only_flattens_rows(level):
    g = _transformer(seq=8)
    h = default_pipeline(opt_level=level)(g)
    assert h.outputs[0].type.dims == ("batch", 8, 48)
    assert "dense" in h.op_counts()  # FlattenMatmul ran on 8*batch rows: a compact prefix
    assert ("8*batch", 48) in {v.type.dims for n in h.nodes for v in n.outputs}
    _check_kept(g, h, {"x": RNG.standard_normal((2, 8, 48)).astype("float32")})


def test_flatten_matmul_reshapes_carry_sym_shape():
    h = flatten_matmul(infer_type(_transformer(seq=8)))
    backs = [n for n in h.nodes if n.op == "reshape" and n.outputs[0].type.dims == ("batch", 8, 48)
             and n.inputs[0].type.dims == ("8*batch", 48)]
    assert backs and all(n.attrs["sym_shape"] == ("batch", 8, 48) for n in backs)


def test_simplify_merged_reshape_keeps_split():
    g = Graph()
    g.declare_dim("b", 1, 4)
    g.declare_dim("s", 1, 8)
    x = g.add_input("x", ("b", "s", 6))
    flat = g.add("reshape", x, newshape=(32, 6))
    y = g.add("exp", flat)  # keeps the first reshape alive through simplify's rewrite
    back = g.add("reshape", g.add("reshape", y, newshape=(4, 8, 6), sym_shape=("b", "s", 6)),
                 newshape=(4, 8, 2, 3))
    g.outputs = [back]
    h = simplify(g)
    assert h.outputs[0].type.dims == ("b", "s", 2, 3)
    assert h.op_counts()["reshape"] == 2


def test_fold_constant_keeps_symbolic_broadcast():
    from kiln.transform import fold_constant

    g = Graph()
    g.declare_dim("s", 1, 8)
    x = g.add_input("x", ("s", 4))
    pos = g.add("broadcast_to", g.add_constant(np.ones((1, 4), "float32")), shape=(8, 4), sym_shape=("s", 4))
    g.outputs = [g.add("add", x, pos)]
    h = fold_constant(g)
    assert h.op_counts().get("broadcast_to") == 1
    assert h.outputs[0].type.dims == ("s", 4)
