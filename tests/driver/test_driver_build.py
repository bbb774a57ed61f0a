"""kiln.build end to end on hand-built graphs: graph JSON layout, fusion, sharing, memory reuse."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
from kiln.ir import Graph

TARGETS = ["c", "llvm"]


def _classic() -> Graph:
    g = Graph("classic")
    a = g.add_input("a", (1, 10))
    b = g.add_input("b", (1, 10))
    c = g.add_input("c", (1, 10))
    g.outputs = [g.add("add", g.add("add", a, b), c)]
    return g


def _run(factory, **inputs) -> list[np.ndarray]:
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input(**inputs)
    m.run()
    return [m.get_output(i).numpy() for i in range(m.get_num_outputs())]


def _feeds(*names: str, shape=(1, 10), seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    return {n: r.standard_normal(shape).astype(np.float32) for n in names}


@pytest.mark.parametrize("target", TARGETS)
def test_classic_add_opt0_layout(target: str) -> None:
    graph_json, lib, params = kiln.build(_classic(), target=target, opt_level=0)
    g = json.loads(graph_json)
    assert len(g["nodes"]) == 5
    assert [n["op"] for n in g["nodes"]] == ["null", "null", "null", "tvm_op", "tvm_op"]
    assert [n["name"] for n in g["nodes"][:3]] == ["a", "b", "c"]
    assert g["arg_nodes"] == [0, 1, 2]
    assert g["heads"] == [[4, 0, 0]]
    assert g["node_row_ptr"] == [0, 1, 2, 3, 4, 5]
    assert g["attrs"]["dltype"] == ["list_str", ["float32"] * 5]
    assert g["attrs"]["shape"] == ["list_shape", [[1, 10]] * 5]
    assert g["attrs"]["storage_id"][0] == "list_int"
    k1, k2 = g["nodes"][3], g["nodes"][4]
    assert k1["inputs"] == [[0, 0, 0], [1, 0, 0]]
    assert k2["inputs"] == [[3, 0, 0], [2, 0, 0]]
    for k in (k1, k2):
        assert set(k["attrs"]) == {"func_name", "num_inputs", "num_outputs", "flatten_data"}
        assert k["attrs"]["num_inputs"] == "2" and k["attrs"]["num_outputs"] == "1"
        assert k["attrs"]["flatten_data"] == "0"
    # Both adds have the same types: one kernel, called twice.
    assert k1["attrs"]["func_name"] == k2["attrs"]["func_name"] == "kilngen_default_fused_add"
    assert params == {}


@pytest.mark.parametrize("target", TARGETS)
def test_classic_add_fused(target: str) -> None:
    factory = kiln.build(_classic(), target=target, opt_level=3)
    g = json.loads(factory.get_graph_json())
    assert [n["op"] for n in g["nodes"]] == ["null", "null", "null", "tvm_op"]
    assert g["arg_nodes"] == [0, 1, 2]
    assert g["heads"] == [[3, 0, 0]]
    assert g["node_row_ptr"] == [0, 1, 2, 3, 4]
    k = g["nodes"][3]
    assert k["attrs"]["func_name"] == "kilngen_default_fused_add_add"
    assert k["attrs"]["num_inputs"] == "3"
    assert k["inputs"] == [[0, 0, 0], [1, 0, 0], [2, 0, 0]]
    x = _feeds("a", "b", "c")
    (y,) = _run(factory, **x)
    np.testing.assert_allclose(y, x["a"] + x["b"] + x["c"], rtol=1e-6)
    assert factory.get_stats()["num_functions"] == 1


@pytest.mark.parametrize("target", TARGETS)
def test_classic_add_runs_opt0(target: str) -> None:
    factory = kiln.build(_classic(), target=target, opt_level=0)
    x = _feeds("a", "b", "c", seed=1)
    (y,) = _run(factory, **x)
    np.testing.assert_allclose(y, x["a"] + x["b"] + x["c"], rtol=1e-6)


def test_storage_reuse_opt0() -> None:
    g = Graph()
    a = g.add_input("a", (1, 10))
    b = g.add_input("b", (1, 10))
    g.outputs = [g.add("add", g.add("add", g.add("add", a, b), a), b)]
    factory = kiln.build(g, target="c", opt_level=0)
    gj = json.loads(factory.get_graph_json())
    sid = gj["attrs"]["storage_id"][1]
    assert len(sid) == 5
    assert len({sid[0], sid[1], sid[2], sid[3]}) == 4  # inputs keep their own storage
    assert sid[4] == sid[2]  # the final output reuses the first add's storage
    plan = factory.memory_plan
    assert plan.storage_ids == sid
    assert plan.planned_bytes == 80 and plan.no_reuse_bytes == 120
    x = _feeds("a", "b", seed=2)
    (y,) = _run(factory, **x)
    np.testing.assert_allclose(y, 2 * (x["a"] + x["b"]), rtol=1e-6)


@pytest.mark.parametrize("target", [
    "c", {"kind": "c"}, pytest.param("target_obj", id="Target")])
def test_target_forms(target) -> None:
    if target == "target_obj":
        target = kiln.target.Target("c")
    factory = kiln.build(_classic(), target=target)
    x = _feeds("a", "b", "c", seed=3)
    np.testing.assert_allclose(_run(factory, **x)[0], x["a"] + x["b"] + x["c"], rtol=1e-6)


def test_mod_name_and_names() -> None:
    factory = kiln.build(_classic(), target="c", mod_name="my-net")
    g = json.loads(factory.get_graph_json())
    assert g["nodes"][3]["attrs"]["func_name"] == "kilngen_my_net_fused_add_add"
    m = kiln.GraphModule(factory["my-net"](kiln.cpu()))
    assert m.get_num_inputs() == 3


def test_constants_inlined_and_params_named() -> None:
    g = Graph()
    x = g.add_input("x", (2, 8))
    w = g.add_input("w", (2, 8))
    half = g.add_constant(np.float32(0.5))
    small = g.add_constant(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], np.float32))
    three = g.add_constant(np.array([1.0, 2.0], np.float32))
    y = g.add("multiply", g.add("add", x, w), half)
    y = g.add("add", y, small)
    y = g.add("add", y, g.add("reshape", three, newshape=(2, 1)))
    g.outputs = [y]
    wv = np.arange(16, dtype=np.float32).reshape(2, 8)
    factory = kiln.build(g, target="c", params={"w": wv})  # folding turns the reshape into a constant
    params = factory.get_params()
    # w is an unmodified initializer: keeps its name; the 8-element constant is a compiler
    # param (p0); scalars / <= 4-element constants are inlined (no params).
    assert sorted(params) == ["p0", "w"]
    np.testing.assert_array_equal(params["w"].numpy(), wv)
    xv = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    (out,) = _run(factory, x=xv)
    ref = (xv + wv) * 0.5 + np.arange(1, 9, dtype=np.float32) + np.array([[1.0], [2.0]], np.float32)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_folded_param_renamed() -> None:
    g = Graph()
    x = g.add_input("x", (4, 8))
    w = g.add_input("w", (8, 4))
    g.outputs = [g.add("add", x, g.add("transpose", w, axes=(1, 0)))]
    wv = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    factory = kiln.build(g, target="c", params={"w": wv})
    assert list(factory.get_params()) == ["p0"]  # folded transpose: not the model's tensor
    xv = np.ones((4, 8), np.float32)
    np.testing.assert_allclose(_run(factory, x=xv)[0], xv + wv.T, rtol=1e-6)


def test_alias_reshape_is_nop() -> None:
    g = Graph()
    x = g.add_input("x", (2, 6))
    y = g.add("relu", x)
    y = g.add("reshape", y, newshape=(3, 4))
    g.outputs = [g.add("sigmoid", y)]
    factory = kiln.build(g, target="c")
    gj = json.loads(factory.get_graph_json())
    funcs = [n["attrs"]["func_name"] for n in gj["nodes"] if n["op"] == "tvm_op"]
    assert funcs == ["kilngen_default_fused_relu", "__nop", "kilngen_default_fused_sigmoid"]
    sid = gj["attrs"]["storage_id"][1]
    assert sid[2] == sid[1]  # the alias shares its input's storage
    assert sid[3] != sid[2]  # and keeps it alive while sigmoid reads it
    xv = np.random.default_rng(3).standard_normal((2, 6)).astype(np.float32)
    ref = 1 / (1 + np.exp(-np.maximum(xv, 0).reshape(3, 4)))
    np.testing.assert_allclose(_run(factory, x=xv)[0], ref, rtol=1e-5)


def test_outputs_that_are_inputs_or_multiple() -> None:
    g = Graph()
    x = g.add_input("x", (3,))
    y = g.add("exp", x)
    g.outputs = [y, x, g.add("negative", y)]
    factory = kiln.build(g, target="c")
    xv = np.array([0.0, 1.0, -1.0], np.float32)
    y0, y1, y2 = _run(factory, x=xv)
    np.testing.assert_allclose(y0, np.exp(xv), rtol=1e-6)
    np.testing.assert_array_equal(y1, xv)
    np.testing.assert_allclose(y2, -np.exp(xv), rtol=1e-6)


def test_debug_timings(capfd, monkeypatch) -> None:
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    kiln.build(_classic(), target="c")
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("KILN_DEBUG", "1")
    kiln.build(_classic(), target="c")
    err = capfd.readouterr().err
    for stage in ("passes", "lower", "codegen+compile", "total"):
        assert f"[kiln.build] {stage}" in err


def test_lower_dump() -> None:
    low = kiln.driver.lower(_classic(), "c")
    text = low.dump()
    assert "add -> add" in text and "kilngen_default_fused_add_add" in text
    assert len(low.funcs) == 1


def test_bad_module_type() -> None:
    with pytest.raises(kiln.KilnError, match="kiln.ir.Graph"):
        kiln.build("not a graph", target="c")
