"""Symbolic shape rules (kiln.ir.sym_rules): the symbolic dims every op category infers and the
cases it rejects, naming the op and the dims."""

import numpy as np
import pytest

from kiln.ir import Graph, get_op, list_ops
from kiln.ir.sym_rules import broadcast_dims, get_sym_rule
from kiln.runtime.errors import InputError


def _g() -> Graph:
    g = Graph()
    g.declare_dim("b", 1, 4)
    g.declare_dim("s", 1, 16)
    g.declare_dim("t", 1, 16)
    return g


def _c(g, *shape, dtype="float32"):
    return g.add_constant(np.ones(shape, dtype))


def test_every_op_has_a_rule_but_constant():
    # a rule in the table, or the op's own sym_rel (the data-dependent ops register theirs)
    assert {n for n in list_ops() if get_sym_rule(get_op(n)) is None} == {"constant"}


def test_broadcast_dims():
    assert broadcast_dims(("b", 1, 3), ("s", 3)) == ("b", "s", 3)
    assert broadcast_dims(("b", "s"), ("s",)) == ("b", "s")
    with pytest.raises(InputError, match="'s' against 't'"):
        broadcast_dims(("s",), ("t",))
    with pytest.raises(InputError, match="'s' against 16"):
        broadcast_dims(("s",), (16,))


def test_elementwise_and_broadcast():
    g = _g()
    x = g.add_input("x", ("b", "s", 8))
    assert g.add("relu", x).type.dims == ("b", "s", 8)
    assert g.add("cast", x, dtype="int32").type.dims == ("b", "s", 8)
    assert g.add("isnan", x).type.dims == ("b", "s", 8)
    assert g.add("gelu", x).type.dims == ("b", "s", 8)
    assert g.add("add", x, _c(g, 8)).type.dims == ("b", "s", 8)
    m = g.add_input("m", ("b", 1, "s"))
    assert g.add("multiply", m, g.add_input("n", (1, 8, 1))).type.dims == ("b", 8, "s")
    cond = g.add_input("c", (1, "s", 1), "bool")
    assert g.add("where", cond, x, _c(g, 1)).type.dims == ("b", "s", 8)
    y = g.add_input("y", ("b", "t", 8))
    with pytest.raises(InputError, match=r"add node 'bad'.*dimension 's' against 't'"):
        g.add("add", x, y, name="bad")
    z = g.add_input("z", (4, 16, 8))  # the upper bounds agree, the runtime extents may not
    with pytest.raises(InputError, match="dimension 'b' against 4"):
        g.add("subtract", x, z)


def test_bias_add_prelu():
    g = _g()
    x = g.add_input("x", ("b", 8, 5))
    assert g.add("bias_add", x, _c(g, 8), axis=1).type.dims == ("b", 8, 5)
    assert g.add("prelu", x, _c(g, 8, 1)).type.dims == ("b", 8, 5)
    y = g.add_input("y", (2, "s"))
    with pytest.raises(InputError, match="bias_add"):
        g.add("bias_add", y, _c(g, 16), axis=1)


def test_transpose_concat_split_slice():
    g = _g()
    x = g.add_input("x", ("b", "s", 8))
    assert g.add("transpose", x, axes=(2, 0, 1)).type.dims == (8, "b", "s")
    assert g.add("concatenate", x, x, axis=1).type.dims == ("b", "2*s", 8)
    y = g.add_input("y", ("b", "t", 8))
    assert g.add("concatenate", x, y, axis=-2).type.dims == ("b", "s+t", 8)
    assert g.add("concatenate", x, x, axis=2).type.dims == ("b", "s", 16)
    with pytest.raises(InputError, match="concatenate: axis 1"):
        g.add("concatenate", x, y, axis=2)
    outs = g.add_node("split", [x], {"sections": (3, 5), "axis": 2})
    assert [o.type.dims for o in outs] == [("b", "s", 3), ("b", "s", 5)]
    with pytest.raises(InputError, match="split.*symbolic dimension 's'"):
        g.add_node("split", [x], {"sections": (8, 8), "axis": 1})
    big = 2 ** 62
    sl = g.add("strided_slice", x, begin=(2,), end=(big,), strides=(1,), axes=(2,))
    assert sl.type.dims == ("b", "s", 6)
    assert g.add("strided_slice", x, begin=(0,), end=(big,), strides=(1,), axes=(1,)).type.dims \
        == ("b", "s", 8)
    assert g.add("strided_slice", x, begin=(0,), end=(1,), strides=(1,), axes=(1,)).type.dims \
        == ("b", 1, 8)
    with pytest.raises(InputError, match=r"strided_slice.*'s' \(axis 1\)"):
        g.add("strided_slice", x, begin=(-1,), end=(big,), strides=(1,), axes=(1,))
    with pytest.raises(InputError, match="strided_slice"):
        g.add("strided_slice", x, begin=(0,), end=(4,), strides=(1,), axes=(1,))


def test_reshape_inference():
    g = _g()
    x = g.add_input("x", ("b", "s", 384))
    assert g.add("reshape", x, newshape=(4, 16, 12, 32)).type.dims == ("b", "s", 12, 32)
    assert g.add("reshape", x, newshape=(64, 384)).type.dims == ("b*s", 384)
    assert g.add("reshape", x, newshape=(4, 16 * 384)).type.dims == ("b", "384*s")
    assert g.add("reshape", x, newshape=(1, 4, 16, 384)).type.dims == (1, "b", "s", 384)
    assert g.add("reshape", x, newshape=(4, 16, 384, 1)).type.dims == ("b", "s", 384, 1)
    y = g.add_input("y", ("b", 1, 8))
    assert g.add("reshape", y, newshape=(4, 8)).type.dims == ("b", 8)
    flat = g.add("reshape", x, newshape=(64, 384))
    with pytest.raises(InputError, match=r"reshape node 'r'.*ambiguous.*sym_shape"):
        g.add("reshape", flat, newshape=(4, 16, 384), name="r")
    back = g.add("reshape", flat, newshape=(4, 16, 384), sym_shape=("b", "s", 384))
    assert back.type.dims == ("b", "s", 384)
    assert back.node.attrs["sym_shape"] == ("b", "s", 384)
    with pytest.raises(InputError, match="elements"):
        g.add("reshape", flat, newshape=(4, 16, 384), sym_shape=("s", "s", 384))
    with pytest.raises(InputError, match="does not match newshape"):
        g.add("reshape", flat, newshape=(4, 16, 384), sym_shape=("b", "s", 385))
    z = g.add_input("z", ("s", 6))
    with pytest.raises(InputError, match="ambiguous"):
        g.add("reshape", z, newshape=(6, 16))


def test_broadcast_to_tile_pad():
    g = _g()
    x = g.add_input("x", ("b", 1, 8))
    assert g.add("broadcast_to", x, shape=(4, 3, 8)).type.dims == ("b", 3, 8)
    one = g.add_input("one", (1, 8))
    assert g.add("broadcast_to", one, shape=(16, 8), sym_shape=("s", 8)).type.dims == ("s", 8)
    with pytest.raises(InputError, match="'u' which has no declared range"):
        g.add("broadcast_to", one, shape=(16, 8), sym_shape=("u", 8))
    assert g.add("tile", x, reps=(1, 2, 1)).type.dims == ("b", 2, 8)
    assert g.add("tile", x, reps=(2, 1, 1)).type.dims == ("2*b", 1, 8)
    assert g.add("pad", x, pad_width=((0, 0), (1, 1), (0, 0))).type.dims == ("b", 3, 8)
    with pytest.raises(InputError, match="pad.*'b'"):
        g.add("pad", x, pad_width=((0, 1), (0, 0), (0, 0)))


def test_reductions():
    g = _g()
    x = g.add_input("x", ("b", "s", 8))
    assert g.add("reduce_sum", x, axes=(1,)).type.dims == ("b", 8)
    assert g.add("reduce_mean", x, axes=(1, 2), keepdims=True).type.dims == ("b", 1, 1)
    assert g.add("reduce_max", x, axes=(0,)).type.dims == ("s", 8)
    assert g.add("reduce_max", x, axes=(0, 1)).type.sym is None
    assert g.add("argmax", x, axis=-1, keepdims=False).type.dims == ("b", "s")
    assert g.add("softmax", x, axis=1).type.dims == ("b", "s", 8)
    assert g.add("log_softmax", x).type.dims == ("b", "s", 8)
    assert g.add("cumsum", x, axis=1).type.dims == ("b", "s", 8)
    v, i = g.add_node("topk", [x], {"k": 2, "axis": -1})
    assert v.type.dims == i.type.dims == ("b", "s", 2)
    with pytest.raises(InputError, match="topk.*'s'"):
        g.add_node("topk", [x], {"k": 2, "axis": 1})


def test_norms():
    g = _g()
    x = g.add_input("x", ("b", "s", 8))
    assert g.add("layer_norm", x, _c(g, 8), _c(g, 8)).type.dims == ("b", "s", 8)
    assert g.add("rms_norm", x, _c(g, 8)).type.dims == ("b", "s", 8)
    with pytest.raises(InputError, match="'s' against 16|16 against 's'"):
        g.add("layer_norm", x, _c(g, 16, 8), _c(g, 8), axis=1)
    img = g.add_input("img", ("b", 4, 5, 5))
    p = [_c(g, 4) for _ in range(4)]
    assert g.add("batch_norm", img, *p).type.dims == ("b", 4, 5, 5)
    assert g.add("instance_norm", img, p[0], p[1]).type.dims == ("b", 4, 5, 5)
    assert g.add("lrn", img, size=3).type.dims == ("b", 4, 5, 5)
    bad = g.add_input("bad", (2, "s"))
    with pytest.raises(InputError, match="batch_norm"):
        g.add("batch_norm", bad, *[_c(g, 16) for _ in range(4)])


def test_contractions():
    g = _g()
    x = g.add_input("x", ("b", "s", 8))
    assert g.add("dense", x, _c(g, 5, 8)).type.dims == ("b", "s", 5)
    assert g.add("matmul", x, _c(g, 8, 5)).type.dims == ("b", "s", 5)
    q = g.add_input("q", ("b", 2, "s", 8))
    k = g.add("transpose", q, axes=(0, 1, 3, 2))
    sc = g.add("matmul", q, k)
    assert sc.type.dims == ("b", 2, "s", "s")
    assert g.add("matmul", sc, q).type.dims == ("b", 2, "s", 8)
    kt = g.add_input("kt", ("b", 2, 8, "t"))
    st = g.add("matmul", q, kt)
    assert st.type.dims == ("b", 2, "s", "t")
    with pytest.raises(InputError, match=r"matmul node 'mm'.*reduction dim.*'t'.*'s'"):
        g.add("matmul", st, q, name="mm")
    w = g.add_input("w", ("s", 5))
    with pytest.raises(InputError, match="dense"):
        g.add("dense", g.add_input("d", (3, 5)), g.add("transpose", w, axes=(1, 0)))


def test_window_ops_batch_and_spatial():
    g = _g()
    x = g.add_input("x", ("b", 3, 8, 8))
    y = g.add("conv2d", x, _c(g, 4, 3, 3, 3), padding=(1, 1, 1, 1))
    assert y.type.dims == ("b", 4, 8, 8)
    assert g.add("conv2d_transpose", x, _c(g, 3, 2, 2, 2), strides=(2, 2)).type.dims == ("b", 2, 16, 16)
    assert g.add("max_pool2d", y, pool_size=(2, 2), strides=(2, 2)).type.dims == ("b", 4, 4, 4)
    assert g.add("avg_pool2d", y, pool_size=(3, 3)).type.dims == ("b", 4, 6, 6)
    assert g.add("resize2d", y, size=(16, 16), scales=(2.0, 2.0)).type.dims == ("b", 4, 16, 16)
    blk = g.add("layout_transform", y, src_layout="NCHW", dst_layout="NCHW4c")
    assert blk.type.dims == ("b", 1, 8, 8, 4)
    assert g.add("layout_transform", blk, src_layout="NCHW4c", dst_layout="NHWC").type.dims == ("b", 8, 8, 4)
    w = _c(g, 1, 1, 3, 3, 4, 4)
    assert g.add("conv2d_nchwc", blk, w, padding=(1, 1, 1, 1)).type.dims == ("b", 1, 8, 8, 4)
    assert g.add("max_pool2d_nchwc", blk, pool_size=(2, 2)).type.dims == ("b", 1, 7, 7, 4)
    # symbolic spatial dims: the window formulas, checked >= 1 over the range
    hw = g.add_input("hw", (1, 3, "s", 8))
    assert g.add("conv2d", hw, _c(g, 4, 3, 3, 3), padding=(1, 1, 1, 1)).type.dims == (1, 4, "s", 8)
    assert g.add("max_pool2d", hw, pool_size=(1, 2), strides=(2, 2)).type.dims == (1, 3, "(s-1)//2+1", 4)
    with pytest.raises(InputError, match=r"conv2d node 'c'.*'s-2' is < 1.*s>=1"):
        g.add("conv2d", hw, _c(g, 4, 3, 3, 3), name="c")
    with pytest.raises(InputError, match="max_pool2d.*'s-1'"):
        g.add("max_pool2d", hw, pool_size=(2, 2))
    blk = g.add("layout_transform", hw, src_layout="NCHW", dst_layout="NCHW3c")
    assert blk.type.dims == (1, 1, "s", 8, 3)
    ch = g.add_input("ch", (1, "s", 4, 4))
    with pytest.raises(InputError, match="layout_transform.*'s'"):
        g.add("layout_transform", ch, src_layout="NCHW", dst_layout="NCHW4c")
    with pytest.raises(InputError, match=r"conv data channels.*'s' on axis 1"):
        g.add("conv2d", ch, _c(g, 4, 16, 1, 1))


def test_indexing():
    g = _g()
    table = _c(g, 100, 8)
    ids = g.add_input("ids", ("b", "s"), "int64")
    emb = g.add("take", table, ids, axis=0)
    assert emb.type.dims == ("b", "s", 8)
    x = g.add_input("x", ("b", "s", 8))
    cls = g.add("take", x, g.add_constant(np.array(0, "int64")), axis=1)
    assert cls.type.dims == ("b", 8)
    assert g.add("gather_elements", x, g.add_input("ge", ("b", "s", 2), "int64"), axis=2).type.dims \
        == ("b", "s", 2)
    gi = g.add_input("gi", ("b", 3, 1), "int64")
    assert g.add("gather_nd", x, gi, batch_dims=1).type.dims == ("b", 3, 8)
    oh = g.add("one_hot", ids, g.add_constant(np.array([0.0, 1.0], "float32")), depth=5)
    assert oh.type.dims == ("b", "s", 5)
    upd = g.add_input("upd", ("b", "s", 8))
    assert g.add("scatter_elements", x, g.add_input("si", ("b", "s", 8), "int64"), upd).type.dims \
        == ("b", "s", 8)


def test_where_and_attention_block_dims():
    g = _g()
    x = g.add_input("x", ("b", "s", 48))
    h = g.add("reshape", x, newshape=(4, 16, 4, 12))
    h = g.add("transpose", h, axes=(0, 2, 1, 3))
    s = g.add("softmax", g.add("matmul", h, g.add("transpose", h, axes=(0, 1, 3, 2))))
    mask = g.add_input("mask", ("b", 1, 1, "s"), "bool")
    s = g.add("where", mask, s, g.add_constant(np.float32(0)))
    o = g.add("matmul", s, h)
    o = g.add("reshape", g.add("transpose", o, axes=(0, 2, 1, 3)), newshape=(4, 16, 48))
    assert o.type.dims == ("b", "s", 48)
