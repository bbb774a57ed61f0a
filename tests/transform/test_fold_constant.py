"""FoldConstant, BindParams, InferType and the pass pipeline."""

import numpy as np
import pytest

from kiln import ir, transform
from kiln.ir import Graph
from kiln.runtime.errors import InputError


def test_fold_constant_chain():
    g = Graph()
    x = g.add_input("x", (2, 3))
    c = g.add_constant(np.arange(6, dtype="float32").reshape(2, 3))
    s = g.add("exp", g.add("multiply", c, g.add_constant(np.float32(0.5))))
    idx = g.add_constant(np.array([1, 0], dtype="int64"))
    t = g.add("take", s, idx, axis=0)
    g.outputs = [g.add("add", x, t)]
    h = transform.fold_constant(g)
    assert h.op_counts() == {"constant": 1, "add": 1}
    feeds = {"x": np.ones((2, 3), "float32")}
    np.testing.assert_allclose(ir.evaluate(h, feeds)[0], ir.evaluate(g, feeds)[0], rtol=1e-6)


def test_fold_respects_size_limit():
    g = Graph()
    x = g.add_input("x", (1024, 1024))
    big = g.add("broadcast_to", g.add_constant(np.float32(1.0)), shape=(1024, 1024))
    g.outputs = [g.add("add", x, big)]
    h = transform.fold_constant(g, max_bytes=1 << 16)
    assert "broadcast_to" in h.op_counts()
    h2 = transform.fold_constant(g, max_bytes=1 << 23)
    assert "broadcast_to" not in h2.op_counts()


def test_fold_multi_output_and_dtype():
    g = Graph()
    x = g.add_input("x", (2,), "int64")
    a, b = g.add_node("split", [g.add_constant(np.arange(4, dtype="int64"))], {"sections": (2, 2)})
    g.outputs = [g.add("add", x, b), g.add("cast", a, dtype="float16")]
    h = transform.fold_constant(g)
    assert h.op_counts() == {"constant": 2, "add": 1}
    assert h.outputs[1].dtype == "float16"


def test_bind_params():
    g = Graph()
    x = g.add_input("x", (3,))
    w = g.add_input("w", (3,))
    g.outputs = [g.add("multiply", x, g.add("exp", w))]
    h = transform.bind_params(g, {"w": np.zeros(3, "float32")})
    assert h.input_names == ["x"]
    h = transform.fold_constant(h)
    assert h.op_counts() == {"constant": 1, "multiply": 1}
    with pytest.raises(InputError, match="not graph inputs"):
        transform.bind_params(g, {"nope": np.zeros(3)})
    with pytest.raises(InputError, match="expects"):
        transform.bind_params(g, {"w": np.zeros(4, "float32")})
    with pytest.raises(InputError, match="expects"):
        transform.bind_params(g, {"w": np.zeros(3, "float64")})


def test_infer_type_revalidates():
    g = Graph()
    x = g.add_input("x", (2, 6))
    g.outputs = [g.add("reshape", x, newshape=(3, 4))]
    g.nodes[0].attrs["newshape"] = (4, 3)
    h = transform.infer_type(g)
    assert h.outputs[0].shape == (4, 3)
    g.nodes[0].attrs["newshape"] = (5, 3)
    with pytest.raises(InputError, match="reshape"):
        transform.infer_type(g)


def test_sequential_opt_level_and_disabled():
    calls = []

    def mk(name, level, required=False):
        return transform.Pass(lambda g: (calls.append(name), g)[1], name, level, required)

    passes = [mk("a", 0), mk("b", 1), mk("c", 3), mk("d", 3, required=True)]
    g = Graph()
    g.outputs = [g.add_input("x", (1,))]
    transform.Sequential(passes, opt_level=1)(g)
    assert calls == ["a", "b", "d"]
    calls.clear()
    transform.Sequential(passes, opt_level=3, disabled=["a", "d"])(g)
    assert calls == ["b", "c", "d"]
    seen = []
    transform.Sequential([transform.InferType(), transform.FoldConstant()], opt_level=2,
                         trace=lambda n, g, t: seen.append(n))(g)
    assert seen == ["InferType", "FoldConstant"]


def test_passes_do_not_mutate_input():
    g = Graph()
    x = g.add_input("x", (2,))
    c = g.add_constant(np.ones(2, "float32"))
    g.outputs = [g.add("add", x, g.add("identity", g.add("exp", c)))]
    before = str(g)
    transform.default_pipeline(opt_level=3)(g)
    assert str(g) == before
