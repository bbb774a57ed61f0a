"""``kiln.build(..., progress=cb)``: the stage / per-kernel callback that drives `kiln build`."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import Graph


def _chain() -> Graph:
    g = Graph("chain")
    a = g.add_input("a", (2, 7))
    b = g.add_input("b", (2, 7))
    x = g.add("add", a, b)
    y = g.add("exp", x)
    z = g.add("reshape", y, newshape=(14,))
    g.outputs = [g.add("reduce_sum", z, axes=(0,), keepdims=False), y]
    return g


def test_progress_reports_every_stage_in_order_and_each_group() -> None:
    events: list[tuple[str, str, dict]] = []
    factory = kiln.build(_chain(), target="c", progress=lambda s, e, i: events.append((s, e, dict(i))))

    starts = [s for s, e, _ in events if e == "start"]
    ends = [s for s, e, _ in events if e == "end"]
    assert starts == ["passes", "fuse", "lower", "codegen+compile", "graph_codegen", "factory"]
    assert ends == starts
    for _stage, e, info in events:
        if e == "end":
            assert info["seconds"] >= 0.0
    # every start is closed before the next stage starts
    open_stage = None
    for s, e, _ in events:
        if e == "start":
            assert open_stage is None
            open_stage = s
        elif e == "end":
            assert open_stage == s
            open_stage = None

    kernels = [i for s, e, i in events if e == "kernel"]
    assert kernels, "lowering reported no groups"
    assert all(s == "lower" for s, e, _ in events if e == "kernel")
    total = kernels[0]["total"]
    assert total == factory.build_stats.num_groups
    idx = [k["index"] for k in kernels]
    assert idx == sorted(idx) and idx[-1] <= total
    names = {k["name"] for k in kernels}
    assert names == {c.func_name for c in factory.lowered.calls if c.func_name != "__nop"}

    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    a = np.arange(14, dtype=np.float32).reshape(2, 7) / 10
    b = np.ones((2, 7), np.float32)
    m.run(a=a, b=b)
    np.testing.assert_allclose(m.get_output(1).numpy(), np.exp(a + b), rtol=1e-6)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.exp(a + b).sum(), rtol=1e-5)


def test_progress_callback_error_propagates() -> None:
    def boom(stage: str, event: str, info: dict) -> None:
        if stage == "lower" and event == "start":
            raise KeyboardInterrupt  # a user pressing ^C mid-build must stop it

    with pytest.raises(KeyboardInterrupt):
        kiln.build(_chain(), target="c", progress=boom)
