"""Symbolic dims in the IR core: TensorType.sym, Graph.dim_ranges / declare_dim / add_input,
the symbolic hook of add_node, equality, printing and parsing."""

import numpy as np
import pytest

from kiln.ir import Graph, TensorType, parse, register_op, structural_equal
from kiln.ir.graph import dead_code_elimination, rewrite
from kiln.ir.op import OpPattern, unregister_op
from kiln.runtime.errors import FormatError, InputError


# ---------------------------------------------------------------------- TensorType
def test_static_type_unchanged():
    a = TensorType((1, 2), "float32")
    b = TensorType((1, 2), "f4", (None, None))
    assert a.sym is None and b.sym is None
    assert a == b and hash(a) == hash(b)
    assert a.dims == (1, 2) and not a.is_dynamic
    assert str(a) == "Tensor[(1, 2), float32]"


def test_dynamic_type():
    t = TensorType((8, 3, 224, 224), "float32", ("batch", None, None, None))
    assert t.is_dynamic and t.shape == (8, 3, 224, 224)
    assert t.dims == ("batch", 3, 224, 224)
    assert str(t) == "Tensor[(batch, 3, 224, 224), float32]"
    assert t != TensorType((8, 3, 224, 224), "float32")
    assert t == TensorType((8, 3, 224, 224), "float32", ("batch", "3", None, None))
    assert str(TensorType((4,), "int64", ("seq",))) == "Tensor[(seq,), int64]"


def test_sym_canonical():
    t = TensorType((64, 4), "float32", ("seq * batch", None))
    assert t.sym == ("batch*seq", None)
    assert TensorType((3,), "float32", ("1+2",)).sym is None  # a constant expression is static
    with pytest.raises(InputError, match="constant 3"):
        TensorType((4,), "float32", ("3",))
    with pytest.raises(InputError, match="rank"):
        TensorType((4, 2), "float32", ("a",))
    with pytest.raises(InputError, match="bad symbolic"):
        TensorType((4,), "float32", ("a $ b",))


# ---------------------------------------------------------------------- Graph
def test_declare_dim_and_add_input():
    g = Graph()
    assert g.dim_ranges == {}
    g.declare_dim("seq", 1, 512)
    g.declare_dim("seq", 1, 512)  # the same range again is fine
    with pytest.raises(InputError, match="already declared"):
        g.declare_dim("seq", 1, 256)
    with pytest.raises(InputError, match="invalid dimension name"):
        g.declare_dim("2x", 1, 4)
    with pytest.raises(InputError, match="1 <= lo <= hi"):
        g.declare_dim("b", 0, 4)
    x = g.add_input("input_ids", (1, "seq", 384), "float32")
    assert x.type.shape == (1, 512, 384) and x.type.dims == (1, "seq", 384)
    y = g.add_input("pair", ("2*seq",), "int64")
    assert y.type.shape == (1024,) and y.type.sym == ("2*seq",)
    z = g.add_input("static", (2, 3))
    assert z.type.sym is None


def test_add_input_undeclared_dim():
    g = Graph()
    with pytest.raises(InputError, match=r"input 'x'.*'batch'.*no declared range"):
        g.add_input("x", ("batch", 3))
    g.dim_ranges["batch"] = (1, 4)  # setting the dict directly works too
    assert g.add_input("x", ("batch", 3)).shape == (4, 3)


def test_add_node_without_rule_raises():
    register_op("_sym_test_op", type_rel=lambda ts, a: [ts[0]], pattern=OpPattern.OPAQUE,
                ref=lambda xs, a: [xs[0]])
    try:
        g = Graph()
        g.declare_dim("batch", 1, 4)
        x = g.add_input("x", ("batch", 3, 224, 224))
        with pytest.raises(InputError, match=r"_sym_test_op node 'n'.*does not support symbolic "
                                             r"dimensions yet \(input 0 has dims \(batch, 3, 224, 224\)\)"):
            g.add("_sym_test_op", x, name="n")
        # static inputs never consult the rules
        s = g.add_input("s", (2,))
        assert g.add("_sym_test_op", s).type == TensorType((2,), "float32")
    finally:
        unregister_op("_sym_test_op")


def test_register_op_sym_rel():
    register_op("_sym_test_op2", type_rel=lambda ts, a: [TensorType(ts[0].shape, ts[0].dtype)],
                pattern=OpPattern.OPAQUE, ref=lambda xs, a: [xs[0]],
                sym_rel=lambda ts, a, outs: [ts[0].sym])
    try:
        g = Graph()
        g.declare_dim("n", 1, 4)
        y = g.add("_sym_test_op2", g.add_input("x", ("n",)))
        assert y.type.dims == ("n",)
    finally:
        unregister_op("_sym_test_op2")


def _dyn_graph() -> Graph:
    g = Graph("dyn")
    g.declare_dim("batch", 1, 4)
    g.declare_dim("seq", 1, 16)
    x = g.add_input("x", ("batch", "seq", 8))
    w = g.add_constant(np.ones((8, 8), "float32"), name="w")
    y = g.add("matmul", x, w)
    y = g.add("reshape", y, newshape=(64, 8))
    z = g.add("relu", y)
    z = g.add("reshape", z, newshape=(4, 16, 2, 4), sym_shape=("batch", "seq", 2, 4))
    g.outputs = [z, g.add("concatenate", x, x, axis=1)]
    return g


def test_graph_helpers_keep_ranges():
    g = _dyn_graph()
    assert g.outputs[0].type.dims == ("batch", "seq", 2, 4)
    assert g.outputs[1].type.dims == ("batch", "2*seq", 8)
    for h in (g.copy(), rewrite(g, lambda *a: None), dead_code_elimination(g)):
        assert h.dim_ranges == g.dim_ranges and h.dim_ranges is not g.dim_ranges
        assert structural_equal(g, h)
        assert [v.type for v in h.outputs] == [v.type for v in g.outputs]


def test_structural_equal_compares_sym_and_ranges():
    g, h = _dyn_graph(), _dyn_graph()
    assert structural_equal(g, h)
    h.dim_ranges["seq"] = (1, 32)
    assert not structural_equal(g, h)
    a, b = Graph(), Graph()
    a.declare_dim("n", 4, 4)
    b.dim_ranges = dict(a.dim_ranges)
    a.outputs = [a.add("relu", a.add_input("x", ("n",)))]
    b.outputs = [b.add("relu", b.add_input("x", (4,)))]
    assert not structural_equal(a, b)  # same upper bounds, different sym


def test_print_parse_roundtrip():
    g = _dyn_graph()
    text = str(g)
    assert text.splitlines()[0] == "dim_ranges(batch=(1, 4), seq=(1, 16))"
    assert "%x: Tensor[(batch, seq, 8), float32]" in text
    assert "Tensor[(batch*seq, 8), float32]" in text
    assert 'sym_shape=("batch", "seq", 2, 4)' in text
    h = parse(text, g.constants())
    assert h.dim_ranges == g.dim_ranges
    assert structural_equal(g, h)
    assert str(h) == text


def test_print_parse_expressions():
    g = Graph()
    g.declare_dim("s", 1, 9)
    x = g.add_input("x", ("(s+1)//2", "s-1+2", 3))
    g.outputs = [g.add("exp", x)]
    text = str(g)
    assert "Tensor[((s+1)//2, s+1, 3), float32]" in text
    h = parse(text)
    assert structural_equal(g, h) and h.inputs[0].type.shape == (5, 10, 3)


def test_static_print_unchanged():
    g = Graph()
    x = g.add_input("x", (2, 3))
    g.outputs = [g.add("reshape", x, newshape=(6,))]
    text = str(g)
    assert "dim_ranges" not in text and "sym_shape" not in text
    assert structural_equal(parse(text), g)


def test_parse_errors():
    with pytest.raises(FormatError, match="no declared range"):
        parse("def @main(%x: Tensor[(n, 3), float32]) {\n  return %x\n}")
    with pytest.raises(FormatError, match="1 <= lo <= hi"):
        parse("dim_ranges(n=(0, 3))\ndef @main(%x: Tensor[(n, 3), float32]) {\n  return %x\n}")
    text = ("dim_ranges(n=(1, 4))\ndef @main(%x: Tensor[(n, 3), float32]) {\n"
            "  %0 = relu(%x) : Tensor[(4, 3), float32]\n  return %0\n}")
    with pytest.raises(FormatError, match="infers"):
        parse(text)


def test_evaluate_dynamic_graph_at_a_smaller_shape_uses_the_actual_targets():
    """reshape / broadcast_to carry their upper-bound target next to the symbolic one; the
    reference interpreter evaluates the symbolic one at the input's actual extents."""
    from kiln.ir import evaluate

    g = Graph("dyn_reshape")
    g.declare_dim("n", 1, 8)
    x = g.add_input("x", (1, "n", 4))
    y = g.add("reshape", x, newshape=(8, 4), sym_shape=("n", 4))
    z = g.add("broadcast_to", y, shape=(2, 8, 4), sym_shape=(2, "n", 4))
    g.outputs = [y, z]
    a = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
    ry, rz = evaluate(g, {"x": a})
    np.testing.assert_array_equal(ry, a.reshape(3, 4))
    np.testing.assert_array_equal(rz, np.broadcast_to(a.reshape(3, 4), (2, 3, 4)))
    # at the upper bound nothing changes
    b = np.arange(32, dtype=np.float32).reshape(1, 8, 4)
    np.testing.assert_array_equal(evaluate(g, {"x": b})[0], b.reshape(8, 4))
