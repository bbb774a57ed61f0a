"""Graph data model, op registry, type relations, printer/parser, interpreter."""

import os

import numpy as np
import pytest

import kiln
from kiln import ir
from kiln.ir import Graph, OpPattern, TensorType
from kiln.ir.op import unregister_op
from kiln.runtime.errors import FormatError, InputError, KilnError

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "ir.md")


def _sample_graph() -> Graph:
    g = Graph("sample")
    x = g.add_input("data", (1, 3, 8, 8))
    w = g.add_input("conv.w", (4, 3, 3, 3))
    b = g.add_constant(np.arange(4, dtype="float32"))
    y = g.add("conv2d", x, w, padding=(1, 1, 1, 1), name="conv")
    y = g.add("bias_add", y, b)
    a, c = g.add_node("split", [y], {"sections": (1, 3), "axis": 1})
    big = g.add_constant(np.linspace(-1, 1, 192, dtype="float32").reshape(3, 8, 8), name="big")
    z = g.add("multiply", c, big)
    z = g.add("clip", z, a_min=-0.5, a_max=float("inf"))
    m = g.add("reduce_mean", z, axes=(2, 3), keepdims=True)
    idx = g.add_constant(np.array([[0, -1]], dtype="int64"))
    t = g.add("take", g.add("reshape", m, newshape=(3,)), idx)
    flag = g.add("greater", t, g.add_constant(np.float32(0.0)))
    g.outputs = [g.add("cast", flag, dtype="int32"), a, z]
    return g


def test_tensor_type():
    t = TensorType([1, 2, 3], np.float32)
    assert t.shape == (1, 2, 3) and t.dtype == "float32" and t.size == 6 and t.nbytes == 24
    assert str(t) == "Tensor[(1, 2, 3), float32]"
    assert str(TensorType((5,), "bfloat16")) == "Tensor[(5,), bfloat16]"
    assert TensorType((), "bool").ndim == 0
    with pytest.raises(InputError):
        TensorType((1,), "complex64")
    with pytest.raises(InputError):
        TensorType((-1,), "float32")


def test_registry():
    assert len(ir.list_ops()) > 60
    assert ir.get_op("conv2d").pattern == OpPattern.OUT_ELEMWISE_FUSABLE
    assert ir.get_op("add").pattern == OpPattern.BROADCAST
    assert ir.get_op("relu").pattern == OpPattern.ELEMWISE
    assert ir.get_op("reduce_sum").pattern == OpPattern.COMM_REDUCE
    assert ir.get_op("reshape").pattern == OpPattern.INJECTIVE
    assert [int(p) for p in OpPattern] == [0, 1, 2, 3, 4, 7, 8]
    with pytest.raises(KilnError, match="conv2d"):
        ir.get_op("conv2")
    with pytest.raises(KilnError):
        ir.register_op("relu", type_rel=lambda t, a: t, pattern=0, ref=lambda x, a: x)


def test_register_custom_op():
    ir.register_op("test_double", type_rel=lambda ts, a: [ts[0]], pattern=OpPattern.ELEMWISE,
                   ref=lambda xs, a: [xs[0] * a["k"]], attrs={"k": ("float", 2.0)},
                   override=True)
    try:
        g = Graph()
        x = g.add_input("x", (3,))
        g.outputs = [g.add("test_double", x)]
        assert g.nodes[0].attrs == {"k": 2.0}
        np.testing.assert_array_equal(ir.evaluate(g, {"x": np.ones(3, "float32")})[0], [2, 2, 2])
    finally:
        # Registered ops are global: a leftover test op would make later registry-wide
        # checks (every op has a compute) fail in the same session.
        unregister_op("test_double")
    assert not ir.has_op("test_double")


def test_unregister_unknown_op_names_it():
    with pytest.raises(KilnError, match="no_such_test_op"):
        unregister_op("no_such_test_op")


def test_attr_validation():
    g = Graph()
    x = g.add_input("x", (1, 3, 8, 8))
    w = g.add_input("w", (4, 3, 3, 3))
    with pytest.raises(InputError, match="no attribute"):
        g.add("conv2d", x, w, stride=(1, 1))
    with pytest.raises(InputError, match="requires attribute 'newshape'"):
        g.add("reshape", x)
    with pytest.raises(InputError, match="takes 2 inputs"):
        g.add("conv2d", x)
    y = g.add("conv2d", x, w, strides=[2, 2])
    assert g.nodes[-1].attrs["strides"] == (2, 2) and y.shape == (1, 4, 3, 3)


@pytest.mark.parametrize("op,types,attrs,match", [
    ("conv2d", [((1, 3, 8, 8), "float32"), ((4, 2, 3, 3), "float32")], {}, "channel mismatch"),
    ("conv2d", [((1, 4, 8, 8), "float32"), ((4, 2, 3, 3), "float32")], {"groups": 3}, "groups"),
    ("add", [((2, 3), "float32"), ((4,), "float32")], {}, "not broadcastable"),
    ("add", [((2, 3), "float32"), ((3,), "int64")], {}, "dtype"),
    ("dense", [((2, 3), "float32"), ((5, 4), "float32")], {}, "reduction dim"),
    ("matmul", [((2, 3, 4), "float32"), ((3, 5, 6), "float32")], {}, "mismatch"),
    ("reshape", [((2, 3), "float32")], {"newshape": (4,)}, "cannot reshape"),
    ("transpose", [((2, 3), "float32")], {"axes": (0, 0)}, "permutation"),
    ("concatenate", [((2, 3), "float32"), ((3, 3), "float32")], {"axis": 1}, "concatenate"),
    ("take", [((2, 3), "float32"), ((2,), "float32")], {}, "indices"),
    ("softmax", [((2, 3), "int64")], {}, "floating-point"),
    ("where", [((2,), "float32"), ((2,), "float32"), ((2,), "float32")], {}, "bool"),
    ("max_pool2d", [((1, 1, 4, 4), "float32")], {"pool_size": (2, 2), "padding": (2, 0, 0, 0)},
     "padding"),
    ("split", [((4, 2), "float32")], {"sections": (1, 2)}, "sum to 4"),
    ("bias_add", [((2, 3), "float32"), ((2,), "float32")], {}, "bias shape"),
])
def test_type_errors(op, types, attrs, match):
    g = Graph()
    ins = [g.add_input(f"i{k}", s, d) for k, (s, d) in enumerate(types)]
    with pytest.raises(InputError, match=match):
        g.add_node(op, ins, attrs, name="n1")


def test_type_error_message_names_node():
    g = Graph()
    a, b = g.add_input("a", (2, 3)), g.add_input("b", (4,))
    with pytest.raises(InputError, match="add node 'my_add'"):
        g.add("add", a, b, name="my_add")


def test_graph_queries_and_copy():
    g = _sample_graph()
    g.verify()
    cons = g.consumers()
    x = g.inputs[0]
    assert [n.op for n, _ in cons[x]] == ["conv2d"]
    uses = g.use_counts()
    split = next(n for n in g.nodes if n.op == "split")
    assert uses[split.outputs[0]] == 1  # graph output only
    h = g.copy()
    assert h is not g and h.nodes[0] is not g.nodes[0]
    assert ir.structural_equal(g, h)
    assert g.op_counts()["constant"] == 4
    assert set(g.constants()) >= {"big"}


def test_structural_equal_detects_differences():
    g = _sample_graph()
    h = _sample_graph()
    assert ir.structural_equal(g, h)
    h.nodes[1].attrs["padding"] = (0, 0, 0, 0)
    assert not ir.structural_equal(g, h)
    h = _sample_graph()
    h.outputs = h.outputs[:2]
    assert not ir.structural_equal(g, h)
    h = _sample_graph()
    h.inputs[0].name = "other"
    assert not ir.structural_equal(g, h)
    assert ir.structural_equal(g, h, map_free_vars=True)


def test_print_parse_round_trip():
    g = _sample_graph()
    text = str(g)
    assert "%0 = constant(value=[0.0, 1.0, 2.0, 3.0]) : Tensor[(4,), float32]" in text
    assert 'meta["big"]' in text
    assert "split(" in text and "%3.1" in text
    assert text.startswith('def @sample(%data: Tensor[(1, 3, 8, 8), float32], %"conv.w"')
    g2 = ir.parse(text, g.constants())
    assert ir.structural_equal(g, g2)
    assert str(g2) == text
    # everything inline
    g3 = ir.parse(ir.astext(g, inline_limit=1000))
    assert ir.structural_equal(g, g3)


def test_round_trip_dtypes_and_special_floats():
    g = Graph()
    x = g.add_input("x", (3,), "float16")
    c = g.add_constant(np.array([np.inf, -np.inf, 1e-8], dtype="float16"))
    y = g.add("add", x, c)
    b = g.add_constant(np.array([True, False]))
    i = g.add_constant(np.array([-3, 2**40], dtype="int64"))
    bf = g.add_constant(np.array([1.5, -2.25], dtype=ir.np_dtype("bfloat16")))
    n = g.add_constant(np.array([np.nan], dtype="float32"))
    g.outputs = [y, b, i, bf, n, x]
    g.outputs.append(g.add("clip", y, a_min=None, a_max=1.0))
    text = str(g)
    assert "return (" in text
    g2 = ir.parse(text)
    assert ir.structural_equal(g, g2)


def test_parse_errors():
    g = _sample_graph()
    text = str(g)
    with pytest.raises(FormatError, match="big"):
        ir.parse(text)
    with pytest.raises(FormatError):
        ir.parse(text.replace("conv2d(", "conv3x(", 1), g.constants())
    with pytest.raises(FormatError, match="infers"):
        ir.parse(text.replace("Tensor[(1, 4, 8, 8), float32]", "Tensor[(1, 4, 8, 9), float32]",
                              1), g.constants())
    with pytest.raises(FormatError):
        ir.parse("def @m() { return %zz }")


def test_interpreter():
    g = _sample_graph()
    x = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)
    w = np.random.default_rng(1).random((4, 3, 3, 3), dtype=np.float32)
    outs = ir.evaluate(g, {"data": x}, {"conv.w": w})
    assert [o.shape for o in outs] == [(1, 2), (1, 1, 8, 8), (1, 3, 8, 8)]
    assert outs[0].dtype == np.int32
    outs2 = ir.evaluate(g, [x, w])
    for a, b in zip(outs, outs2):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(InputError, match="missing"):
        ir.evaluate(g, {"data": x})
    with pytest.raises(InputError, match="unknown"):
        ir.evaluate(g, {"data": x, "conv.w": w, "zzz": x})
    with pytest.raises(InputError, match="shape"):
        ir.evaluate(g, {"data": x[:, :2], "conv.w": w})
    with pytest.raises(InputError, match="dtype"):
        ir.evaluate(g, {"data": x.astype("float64"), "conv.w": w})


def test_constants_are_read_only():
    g = Graph()
    arr = np.ones(3, dtype="float32")
    v = g.add_constant(arr)
    with pytest.raises(ValueError):
        v.const_value[0] = 2


def test_docs_op_table_is_current(tmp_path):
    from kiln.ir.op import op_table_markdown

    text = open(DOCS, encoding="utf-8").read()
    table = "\n".join(line for line in op_table_markdown().splitlines()
                      if not line.startswith("| `test_"))
    assert table in text, "run kiln.ir.op.update_docs('docs/ir.md')"
    for name in ir.list_ops():
        if not name.startswith("test_"):
            assert f"| `{name}` |" in text


def test_lazy_import():
    assert kiln.ir is ir
