"""Libraries with dynamic dimensions: one library, every shape in range, clear errors outside.

Graphs are built in the IR with symbolic dims, compiled, exported and loaded like any model;
results are compared with NumPy at each actual shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from kiln import ir
from kiln.runtime.errors import FormatError, InputError
from tests.executor.dynamic_support import masked_attention_graph
from kiln.runtime.graph_json import load_graph_json
from tests.runtime.import_blocker import COMPILER_SIDE, blocker_prelude

RNG = np.random.default_rng(0)


def _const(g: ir.Graph, *shape: int) -> ir.Value:
    return g.add_constant((RNG.standard_normal(shape) * 0.3).astype("float32"))


def _load(lib, path) -> kiln.GraphModule:
    lib.export_library(str(path))
    return kiln.GraphModule(kiln.runtime.load_module(str(path))["default"](kiln.cpu()))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """x (batch, 16) -> dense 32 -> relu -> dense 8 -> softmax, batch in 1..8."""
    g = ir.Graph("mlp")
    g.declare_dim("batch", 1, 8)
    x = g.add_input("x", ("batch", 16))
    w1, b1, w2 = _const(g, 32, 16), _const(g, 32), _const(g, 8, 32)
    h = g.add("relu", g.add("add", g.add("dense", x, w1), b1))
    g.outputs = [g.add("softmax", g.add("dense", h, w2), axis=-1)]
    ws = [v.const_value for v in (w1, b1, w2)]
    path = tmp_path_factory.mktemp("mlp") / "mlp.so"
    m = _load(kiln.build(g, target="llvm"), path)
    m.path = path
    return m, ws


def _mlp_ref(x, ws):
    w1, b1, w2 = ws
    z = np.maximum(x @ w1.T + b1, 0) @ w2.T
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_every_batch_in_range_matches_numpy(mlp):
    m, ws = mlp
    for b in (1, 5, 8, 2, 2, 7):
        x = RNG.standard_normal((b, 16)).astype("float32")
        m.run(x=x)
        out = m.get_output(0).numpy()
        assert out.shape == (b, 8)
        np.testing.assert_allclose(out, _mlp_ref(x, ws), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(m.get_input("x").numpy(), x)


def test_symbolic_view_of_inputs_and_outputs(mlp):
    m, _ = mlp
    assert m.get_input_dims() == {"x": ("batch", 16)}
    assert m.get_output_dims() == [("batch", 8)]
    assert m.dim_ranges == {"batch": (1, 8)}
    shapes, _ = m.get_input_info()
    assert shapes == {"x": (8, 16)}  # the upper bounds storage is planned for


@pytest.mark.parametrize("shape, match", [
    ((9, 16), r"dim 0 \(batch\) is 9, outside its range 1..8"),
    ((0, 16), r"outside its range 1..8"),
    ((4, 15), r"dim 1 is 15, expected 16"),
    ((4, 16, 1), r"3 dims, expected 2"),
])
def test_bad_shapes_are_input_errors(mlp, shape, match):
    m, ws = mlp
    with pytest.raises(InputError, match=match):
        m.set_input("x", np.zeros(shape, "float32"))
    # the executor is still usable afterwards
    x = RNG.standard_normal((3, 16)).astype("float32")
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), _mlp_ref(x, ws), rtol=1e-5, atol=1e-6)


def test_wrong_dtype_and_zero_copy_are_refused(mlp):
    m, _ = mlp
    with pytest.raises(InputError, match="dtype float64"):
        m.set_input("x", np.zeros((2, 16)))
    with pytest.raises(InputError, match="dynamic dimensions"):
        m.set_input_zero_copy("x", kiln.nd.array(np.zeros((2, 16), "float32")))
    with pytest.raises(InputError, match="dynamic dimensions"):
        m.set_output_zero_copy(0, kiln.nd.empty((2, 8), "float32"))


@pytest.fixture(scope="module")
def attention(tmp_path_factory):
    """Masked single-head attention over (batch, seq, 16), batch 1..4, seq 1..24; plus a
    second input (the mask) that must agree with the first on both symbols."""
    g, wvals = masked_attention_graph(24, _const)
    ws = [w.const_value for w in wvals]
    m = _load(kiln.build(g, target="llvm"), tmp_path_factory.mktemp("attn") / "attn.so")
    return m, ws


def _attn_ref(x, mask, ws):
    wq, wk, wv = ws
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.transpose(0, 2, 1) * 0.25 + ((1 - mask) * -1e4)[:, None, :]
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    return o.mean(1), o


@pytest.mark.parametrize("b, s", [(1, 1), (2, 7), (4, 24), (3, 13), (1, 24), (4, 1)])
def test_attention_over_dynamic_batch_and_sequence(attention, b, s):
    m, ws = attention
    x = RNG.standard_normal((b, s, 16)).astype("float32")
    mask = np.ones((b, s), "float32")
    mask[:, s // 2 + 1:] = 0  # padded tail: reductions over seq must see exactly s entries
    m.run(x=x, mask=mask)
    want = _attn_ref(x, mask, ws)
    for i, w in enumerate(want):
        got = m.get_output(i).numpy()
        assert got.shape == w.shape
        np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-5)


def test_inputs_that_disagree_on_a_dim_are_refused_at_run(attention):
    m, ws = attention
    m.set_input("x", np.zeros((2, 5, 16), "float32"))
    m.set_input("mask", np.ones((2, 6), "float32"))
    with pytest.raises(InputError, match=r"inconsistent input shapes: input 'x' has shape \(2, 5, 16\).*seq = 6"):
        m.run()
    m.set_input("x", np.zeros((2, 6, 16), "float32"))
    m.run()  # consistent again
    assert m.get_output(1).numpy().shape == (2, 6, 16)


def test_one_input_giving_one_symbol_two_values_is_refused():
    g = ir.Graph("sq")
    g.declare_dim("n", 1, 8)
    x = g.add_input("x", ("n", "n"))
    g.outputs = [g.add("relu", x)]
    m = kiln.GraphModule(kiln.build(g, target="llvm")["default"](kiln.cpu()))
    with pytest.raises(InputError, match="dimension 'n' is both 3 and 4"):
        m.set_input("x", np.zeros((3, 4), "float32"))
    x = RNG.standard_normal((5, 5)).astype("float32")
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.maximum(x, 0))


def test_graph_json_carries_symbolic_shapes_and_static_graphs_do_not(mlp, tmp_path):
    m, _ = mlp
    gj = json.loads(m.module.graph.json_text)
    assert gj["attrs"]["dim_ranges"] == ["list_dim_range", [["batch", 1, 8]]]
    assert ["batch", 16] in gj["attrs"]["sym_shape"][1]
    g = ir.Graph("static")
    x = g.add_input("x", (2, 16))
    g.outputs = [g.add("relu", x)]
    static = json.loads(kiln.build(g, target="llvm").get_graph_json())
    assert "sym_shape" not in static["attrs"] and "dim_ranges" not in static["attrs"]


def _mutated(text: str, edit) -> str:
    gj = json.loads(text)
    edit(gj["attrs"])
    return json.dumps(gj)


@pytest.mark.parametrize("edit, match", [
    (lambda a: a["sym_shape"][1].__setitem__(0, ["batch", "q"]), r"'q'.*no attrs.dim_ranges entry|symbolic"),
    (lambda a: a["sym_shape"][1].__setitem__(0, ["batch+", 16]), "bad symbolic dimension"),
    (lambda a: a["sym_shape"][1].__setitem__(0, ["2*batch", 16]), "reaches 16, more than the 8 planned"),
    (lambda a: a["sym_shape"][1].__setitem__(0, ["batch", 15]), "differs from attrs.shape"),
    (lambda a: a["dim_ranges"][1].__setitem__(0, ["batch", 0, 8]), "1 <= lo <= hi"),
    (lambda a: a.pop("sym_shape"), "dim_ranges is given without attrs.sym_shape"),
    (lambda a: a["sym_shape"][1].pop(), "attrs.sym_shape has"),
    (lambda a: a["sym_shape"][1][0].pop(), r"attrs.sym_shape\[0\] must be a list of 2 dims"),
])
def test_malformed_symbolic_graph_json_is_a_format_error(mlp, edit, match):
    m, _ = mlp
    with pytest.raises(FormatError, match=match):
        load_graph_json(_mutated(m.module.graph.json_text, edit))


RUNTIME_ONLY = blocker_prelude(COMPILER_SIDE) + textwrap.dedent(
    """
    import numpy as np
    import kiln
    m = kiln.GraphModule(kiln.runtime.load_module(sys.argv[1])["default"](kiln.cpu()))
    for b in (1, 8, 3):
        m.run(x=np.ones((b, 16), "float32"))
        out = m.get_output(0).numpy()
        assert out.shape == (b, 8) and np.allclose(out.sum(-1), 1.0, atol=1e-5), out
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    print("DYNAMIC OK")
    """
)


def test_dynamic_library_runs_without_the_compiler(mlp, tmp_path):
    m, _ = mlp
    proc = subprocess.run([sys.executable, "-c", RUNTIME_ONLY, str(m.path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "DYNAMIC OK" in proc.stdout, proc.stdout + proc.stderr


def test_debug_executor_runs_and_profiles_at_the_actual_shape(mlp):
    m, ws = mlp
    dm = kiln.runtime.load_module(str(m.path)).debug_create(kiln.cpu())
    x = RNG.standard_normal((3, 16)).astype("float32")
    dm.set_input("x", x)
    rep = dm.profile(number=2, repeat=1)
    assert all(row.input_shapes[0][0] == 3 for row in rep), [r.input_shapes for r in rep]
    dm.run()
    np.testing.assert_allclose(dm.get_output(0).numpy(), _mlp_ref(x, ws), rtol=1e-5, atol=1e-6)
