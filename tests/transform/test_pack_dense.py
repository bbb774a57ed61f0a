"""PackDenseWeights: a dense's constant weight is stored as its kernel's panels at build time;
the kernel then has no pack stage, and computes what the unpacked graph does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.driver.build import lower, optimize
from kiln.ir import Graph, evaluate

F32 = "float32"
HASWELL = "llvm -mcpu=haswell"


def _graph(rng: np.random.Generator, rows: int = 37) -> tuple[Graph, dict[str, np.ndarray]]:
    """Two denses sharing one (70, 100) weight (N not a multiple of the panel), a third with a
    weight computed at run time, a GEMV (one row) on a constant weight."""
    g = Graph()
    x = g.add_input("x", (rows, 100))
    v = g.add_input("v", (1, 100))
    p = {"w": (rng.standard_normal((70, 100)) * 0.1).astype(F32), "b": rng.standard_normal(70).astype(F32)}
    w, b = g.add_input("w", (70, 100)), g.add_input("b", (70,))
    y = g.add("relu", g.add("bias_add", g.add("dense", x, w), b, axis=-1))
    z = g.add("dense", g.add("tanh", x), w)
    dyn = g.add("dense", x, g.add("multiply", w, g.add_constant(np.array(0.5, F32))))
    g.outputs = [y, z, g.add("dense", v, w), g.add("add", dyn, g.add_constant(np.array(0.0, F32)))]
    return g, p


def test_constant_weights_are_packed_once(monkeypatch: Any) -> None:
    g, p = _graph(np.random.default_rng(0))
    opt = optimize(g, params=p, target=kiln.target.Target(HASWELL))
    denses = [n for n in opt.nodes if n.op == "dense"]
    units = sorted(n.attrs["units"] for n in denses)
    # the multiply by a constant folds, so its weight is constant too; the GEMV stays unpacked
    assert units == [0, 70, 70, 70], units
    packed = {id(n.inputs[1]) for n in denses if n.attrs["units"]}
    shapes = {n.inputs[1].shape for n in denses if n.attrs["units"]}
    assert shapes == {(5, 100, 16)} and len(packed) == 2  # w shared by two denses; 0.5 * w its own
    lowered = lower(g, HASWELL, params=p)
    packs = [f.name for f in lowered.funcs if "dense_wpack" in str(f)]
    assert not packs, packs
    monkeypatch.setenv("KILN_DISABLE_PASSES", "PackDenseWeights")
    plain = optimize(g, params=p, target=kiln.target.Target(HASWELL))
    assert all(not n.attrs["units"] for n in plain.nodes if n.op == "dense")


def test_non_constant_weight_is_not_packed() -> None:
    g = Graph()
    x, w = g.add_input("x", (40, 64)), g.add_input("w", (48, 64))
    g.outputs = [g.add("dense", x, w)]
    opt = optimize(g, target=kiln.target.Target(HASWELL))
    assert [n.attrs["units"] for n in opt.nodes if n.op == "dense"] == [0]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_packed_denses_compute_the_same(target: str) -> None:
    rng = np.random.default_rng(1)
    g, p = _graph(rng)
    feeds = {"x": rng.standard_normal((37, 100)).astype(F32), "v": rng.standard_normal((1, 100)).astype(F32)}
    want = evaluate(g, feeds, p)
    gm = kiln.GraphModule(kiln.build(g, target=target, params=p)["default"](kiln.cpu()))
    gm.set_input(**feeds)
    gm.run()
    for i, ref in enumerate(want):
        np.testing.assert_allclose(gm.get_output(i).numpy(), ref, rtol=1e-5, atol=1e-5)


def test_packed_reference_and_type_checks() -> None:
    from kiln.runtime.errors import InputError
    from kiln.topi.nn.dense import pack_dense_weight

    rng = np.random.default_rng(2)
    w = rng.standard_normal((21, 9)).astype(F32)
    x = rng.standard_normal((4, 9)).astype(F32)
    g = Graph()
    xi = g.add_input("x", (4, 9))
    g.outputs = [g.add("dense", xi, g.add_constant(pack_dense_weight(w, 8)), units=21)]
    (got,) = evaluate(g, {"x": x})
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-6)
    g2 = Graph()
    with pytest.raises(InputError, match="units"):
        g2.add("dense", g2.add_input("x", (4, 9)), g2.add_constant(pack_dense_weight(w, 8)), units=30)
