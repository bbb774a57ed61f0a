"""Debug executor: per-node table, intermediate outputs, Chrome trace, dumps."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import kiln
from kiln.runtime import debug_executor
from kiln.runtime.errors import InputError

from tests.executor.executor_helpers import SHAPE, GraphBuilder


def _graph() -> str:
    # x -> t(add_one) -> u(mul_two) -> r(__nop reshape) -> y(add_one, reuses t's sid once t is dead)
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    u = b.op("mul_two", [t], name="u", sids=[2])
    r = b.op("__nop", [u], shapes=[[6]], name="r", sids=[2])
    y = b.op("add_one", [r], name="y", sids=[1])
    return b.json([y])


@pytest.fixture
def dbg(clib, tmp_path):
    m = debug_executor.create(_graph(), clib, str(tmp_path), kiln.cpu())
    m.set_input("x", np.arange(6, dtype="float32").reshape(SHAPE))
    return m


X = np.arange(6, dtype="float32").reshape(SHAPE)


def test_run_individual_table(dbg):
    rep = dbg.run_individual(number=5, repeat=2)
    assert [r.name for r in rep] == ["t", "u", "r", "y"]  # one row per kernel node, graph order
    assert [r.func_name for r in rep] == ["add_one", "mul_two", "__nop", "add_one"]
    assert all(r.time_us >= 0 and len(r.times_us) == 2 for r in rep)
    assert abs(sum(r.percent for r in rep) - 100) < 1e-6
    assert rep[2].input_shapes == (SHAPE,) and rep[2].output_shapes == ((6,),)
    text = str(rep)
    for name in ("Node", "Time (us)", "mul_two", "[2, 3]", "Total"):
        assert name in text
    assert len(dbg.profile(number=2, repeat=1)) == 4
    assert dbg.run_individual(number=1, repeat=1, min_repeat_ms=1).number == 1


def test_debug_get_output_intermediates(dbg):
    dbg.run()
    t = X + 1
    u = t * 2
    np.testing.assert_allclose(dbg.debug_get_output("t").numpy(), t)
    # t's storage was overwritten later by y (sid reuse) but the debug run captured it
    np.testing.assert_allclose(dbg.debug_get_output("u").numpy(), u)
    np.testing.assert_allclose(dbg.debug_get_output(3).numpy(), u.reshape(6))
    np.testing.assert_allclose(dbg.debug_get_output("y").numpy(), u.reshape(6) + 1)
    np.testing.assert_allclose(dbg.debug_get_output("x").numpy(), X)
    np.testing.assert_allclose(dbg.get_output(0).numpy(), u.reshape(6) + 1)
    out = kiln.nd.empty(SHAPE, "float32")
    dbg.debug_get_output("t", out=out)
    np.testing.assert_allclose(out.numpy(), t)
    with pytest.raises(InputError, match="no node named"):
        dbg.debug_get_output("nope")


def test_debug_get_output_without_prior_run(clib, tmp_path):
    m = debug_executor.create(_graph(), clib, str(tmp_path), kiln.cpu())
    m.set_input("x", X)
    np.testing.assert_allclose(m.debug_get_output("u").numpy(), (X + 1) * 2)


def test_chrome_trace(dbg, tmp_path):
    path = dbg.dump_chrome_trace(tmp_path / "trace" / "t.json")
    with open(path) as f:
        trace = json.load(f)
    ev = trace["traceEvents"]
    assert len(ev) == 4
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0 for e in ev)
    assert [e["name"] for e in ev] == ["t", "u", "r", "y"]
    assert ev[1]["args"]["func_name"] == "mul_two"
    assert all(a["ts"] <= b["ts"] for a, b in zip(ev, ev[1:]))


def test_run_writes_dumps(dbg, tmp_path):
    dbg.run()
    d = dbg.dump_dir
    assert d.startswith(str(tmp_path))
    files = set(os.listdir(d))
    assert {"graph.json", "trace.json", "output_tensors.params"} <= files
    np.testing.assert_allclose(np.load(os.path.join(d, "0002_u_out0.npy")), (X + 1) * 2)
    tensors = kiln.runtime.load_param_dict_from_file(os.path.join(d, "output_tensors.params"))
    assert set(tensors) == {"t:0", "u:0", "r:0", "y:0"}
    with open(os.path.join(d, "trace.json")) as f:
        assert len(json.load(f)["traceEvents"]) == 4
    with open(os.path.join(d, "graph.json")) as f:
        assert json.load(f)["nodes"][1]["name"] == "t"
