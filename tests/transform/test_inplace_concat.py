"""Concatenations written in place: the placement, the memory plan that follows it, the graph
JSON reader's checks of ``__concat``, and built models (Python executor and C API) that compute
what the reference evaluator does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import kiln
from kiln.ir import Graph, evaluate
from kiln.runtime.errors import FormatError
from kiln.runtime.graph_json import load_graph_json
from kiln.transform.memory_plan import PlanOp, place_concats, plan_memory

F32 = "float32"


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(F32)


# ----------------------------------------------------------------------------- placement


def test_chain_sharing_pieces_is_placed_back_to_back() -> None:
    """DenseNet's c_k = concat(c_{k-1}, y_k): every concat in place, one memory for all."""
    size = {"x": 64, "y1": 32, "y2": 32, "y3": 32, "c1": 96, "c2": 128, "c3": 160}
    chain = [("c1", ["x", "y1"]), ("c2", ["c1", "y2"]), ("c3", ["c2", "y3"])]
    ok, loc = place_concats(chain, size.__getitem__, lambda v: True)
    assert ok == [True, True, True]
    assert loc == {"c3": ("c3", 0), "c2": ("c3", 0), "c1": ("c3", 0), "x": ("c3", 0),
                   "y1": ("c3", 64), "y2": ("c3", 96), "y3": ("c3", 128)}


def test_conflicting_orders_keep_one_copy() -> None:
    size = {"a": 8, "b": 8, "c1": 16, "c2": 16}
    ok, loc = place_concats([("c1", ["a", "b"]), ("c2", ["b", "a"])], size.__getitem__, lambda v: True)
    assert ok == [False, True]  # the later one wins; the earlier one stays a kernel
    assert loc["b"] == ("c2", 0) and loc["a"] == ("c2", 8)


@pytest.mark.parametrize("pinned", ["a", "c"])
def test_pinned_entries_are_not_moved(pinned: str) -> None:
    size = {"a": 8, "b": 8, "c": 16}
    ok, loc = place_concats([("c", ["a", "b"])], size.__getitem__, lambda v: v != pinned)
    assert ok == [False] and loc == {}


def test_repeated_input_or_size_mismatch_is_refused() -> None:
    size = {"a": 8, "c": 16, "d": 12}
    assert place_concats([("c", ["a", "a"])], size.__getitem__, lambda v: True)[0] == [False]
    assert place_concats([("d", ["a"])], size.__getitem__, lambda v: True)[0] == [False]


def _simulate(entry_bytes: list[int], ops: list[PlanOp], fixed: list[int], outputs: list[int]) -> None:
    """Run ``ops`` on the planned memory, one cell per byte: every read must see what its
    writer (or, for an in-place concat, its pieces) put there."""
    plan = plan_memory(entry_bytes, ops, fixed, outputs)
    mem = [np.full(s, -1, np.int64) for s in plan.storage_sizes]
    want: dict[int, np.ndarray] = {}

    def cells(e: int) -> np.ndarray:
        off = plan.storage_offsets[e]
        return mem[plan.storage_ids[e]][off:off + entry_bytes[e]]

    for e in fixed:
        want[e] = np.full(entry_bytes[e], e)
        cells(e)[:] = want[e]
    for k, op in enumerate(ops):
        if op.is_view:  # checked where it is read: an unread concatenation may be gone already
            want[op.outputs[0]] = np.concatenate([want[i] for i in op.inputs])
            continue
        for i in op.inputs:
            assert np.array_equal(cells(i), want[i]), f"op {k} reads entry {i} after it was overwritten"
        for o in op.outputs:
            want[o] = np.full(entry_bytes[o], o)
            cells(o)[:] = want[o]
        for o in op.outputs:
            assert np.array_equal(cells(o), want[o]), f"op {k}: its outputs overlap"
    for e in outputs:
        assert np.array_equal(cells(e), want[e]), f"output {e} was overwritten"


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_never_read_overwritten_memory(seed: int) -> None:
    """Random kernel sequences with concatenations (placed in place where the placement
    accepts them, as the driver does) never see a value overwritten before its last read."""
    rng = np.random.default_rng(seed)
    entry_bytes = [int(rng.integers(1, 6)) * 4 for _ in range(2)]
    fixed = [0, 1]
    ops: list[PlanOp] = []
    written: list[int] = []
    for _ in range(int(rng.integers(6, 30))):
        pool = fixed + written
        if len(written) >= 2 and rng.random() < 0.35:
            k = int(rng.integers(2, min(4, len(written)) + 1))
            ins = [written[int(j)] for j in rng.choice(len(written), k, replace=False)]
            out = len(entry_bytes)
            entry_bytes.append(sum(entry_bytes[i] for i in ins))
            trial = [(op.outputs[0], op.inputs) for op in ops if op.is_view] + [(out, tuple(ins))]
            ok, _ = place_concats(trial, entry_bytes.__getitem__, lambda e: e not in fixed)
            ops.append(PlanOp(tuple(ins), (out,), is_view=all(ok)))
            written.append(out)
            if not all(ok):  # a plain concat kernel instead
                continue
        else:
            ins = [pool[int(j)] for j in rng.choice(len(pool), min(len(pool), int(rng.integers(1, 3))), replace=False)]
            outs = []
            for _ in range(int(rng.integers(1, 3))):
                outs.append(len(entry_bytes))
                entry_bytes.append(int(rng.integers(1, 6)) * 4)
            ops.append(PlanOp(tuple(ins), tuple(outs)))
            written.extend(outs)
    views = [op.outputs[0] for op in ops if op.is_view]
    outputs = [e for e in written[-2:] if e not in views and not any(e in op.inputs for op in ops if op.is_view)]
    _simulate(entry_bytes, ops, fixed, outputs)


def test_plan_refuses_a_placement_it_cannot_make() -> None:
    ops = [PlanOp((0,), (1,)), PlanOp((0, 1), (2,), is_view=True)]
    with pytest.raises(ValueError, match="cannot be written in place"):
        plan_memory([8, 8, 16], ops, fixed=[0], outputs=[2])


# ----------------------------------------------------------------------------- built models


def _dense_block(rng: np.random.Generator, batch: int, layers: int, c0: int = 16, growth: int = 8,
                 hw: int = 6) -> Graph:
    """A DenseNet block: each layer reads the concatenation of all features so far."""
    g = Graph("dense_block")
    x = g.add_input("x", (batch, 8, hw, hw))
    feat = g.add("relu", g.add("conv2d", x, g.add_constant(_rand(rng, c0, 8, 3, 3)), padding=(1, 1, 1, 1)))
    c = c0
    for _ in range(layers):
        h = g.add("multiply", feat, g.add_constant(_rand(rng, 1, c, 1, 1, scale=1.0)))
        h = g.add("relu", g.add("add", h, g.add_constant(_rand(rng, 1, c, 1, 1))))
        y = g.add("conv2d", h, g.add_constant(_rand(rng, growth, c, 3, 3)), padding=(1, 1, 1, 1))
        feat = g.add("concatenate", feat, y, axis=1)
        c += growth
    g.outputs = [g.add("conv2d", g.add("relu", feat), g.add_constant(_rand(rng, 8, c, 1, 1)))]
    return g


def _built(g: Graph, target: str = "llvm") -> tuple[object, dict]:
    factory = kiln.build(g, target=target)
    return factory, json.loads(factory.get_graph_json())


def _in_place(gj: dict) -> int:
    return sum(1 for n in gj["nodes"] if n.get("attrs", {}).get("func_name") == "__concat")


def _kernels(gj: dict) -> list[str]:
    return [n["attrs"]["func_name"] for n in gj["nodes"] if n["op"] == "tvm_op"]


def _run(factory: object, x: np.ndarray) -> np.ndarray:
    m = kiln.GraphModule(factory["default"](kiln.cpu()))  # type: ignore[index]
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_dense_block_concats_run_in_place(target: str) -> None:
    rng = np.random.default_rng(0)
    g = _dense_block(rng, batch=1, layers=4)
    factory, gj = _built(g, target)
    # the last concat is fused with the ReLU after it (one reader); the others are in place
    assert _in_place(gj) == 3, _kernels(gj)
    assert not [k for k in _kernels(gj) if k.endswith("fused_concatenate") or "_concatenate_" in k
                and "relu" not in k]
    offs = gj["attrs"]["storage_offset"][1]
    assert len(offs) == len(gj["attrs"]["shape"][1]) and any(offs)
    x = _rand(rng, 1, 8, 6, 6, scale=1.0)
    np.testing.assert_allclose(_run(factory, x), evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_batch_two_concat_is_a_kernel() -> None:
    """With batch 2 the pieces are not contiguous in the output: no in-place concat."""
    rng = np.random.default_rng(1)
    g = _dense_block(rng, batch=2, layers=2)
    factory, gj = _built(g)
    assert _in_place(gj) == 0 and "storage_offset" not in gj["attrs"]
    x = _rand(rng, 2, 8, 6, 6, scale=1.0)
    np.testing.assert_allclose(_run(factory, x), evaluate(g, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _two_convs(rng: np.random.Generator) -> tuple[Graph, object, object]:
    g = Graph("two_convs")
    x = g.add_input("x", (1, 8, 5, 5))
    p = g.add("conv2d", x, g.add_constant(_rand(rng, 8, 8, 3, 3)), padding=(1, 1, 1, 1))
    q = g.add("conv2d", x, g.add_constant(_rand(rng, 16, 8, 1, 1)))
    return g, p, q


def _head(g: Graph, rng: np.random.Generator, v: object, cin: int) -> object:
    return g.add("conv2d", v, g.add_constant(_rand(rng, 4, cin, 1, 1)))


@pytest.mark.parametrize("case", ["graph_input", "graph_output", "repeated", "conflict"])
def test_concats_that_cannot_move_stay_correct(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # NCHW throughout, so the graph's own input and output are the concat's (the blocked layout
    # would put a kernel between them)
    monkeypatch.setenv("KILN_DISABLE_PASSES", "AlterConvLayout")
    rng = np.random.default_rng(2)
    g, p, q = _two_convs(rng)
    x = g.inputs[0]
    if case == "graph_input":  # the input's memory is the user's to bind
        c = g.add("concatenate", x, p, axis=1)
        g.outputs = [_head(g, rng, c, 16)]
        expect = 0
    elif case == "graph_output":  # an output may be bound to the user's buffer
        g.outputs = [g.add("concatenate", p, q, axis=1)]
        expect = 0
    elif case == "repeated":
        g.outputs = [_head(g, rng, g.add("concatenate", p, p, axis=1), 16)]
        expect = 0
    else:  # p, q and q, p: one piece cannot be in two places
        c1 = g.add("concatenate", p, q, axis=1)
        c2 = g.add("concatenate", q, p, axis=1)
        g.outputs = [_head(g, rng, c1, 24), _head(g, rng, c2, 24)]
        expect = 1
    factory, gj = _built(g)
    assert _in_place(gj) == expect, _kernels(gj)
    xv = _rand(rng, 1, 8, 5, 5, scale=1.0)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))  # type: ignore[index]
    m.set_input("x", xv)
    m.run()
    for i, want in enumerate(evaluate(g, {"x": xv})):
        np.testing.assert_allclose(m.get_output(i).numpy(), want, rtol=1e-4, atol=1e-4)


def test_exported_library_and_debug_executor(tmp_path) -> None:
    rng = np.random.default_rng(3)
    g = _dense_block(rng, batch=1, layers=3)
    factory, gj = _built(g)
    assert _in_place(gj) == 2
    path = factory.export_library(str(tmp_path / "dense.so"))  # type: ignore[attr-defined]
    lib = kiln.runtime.load_module(path)
    x = _rand(rng, 1, 8, 6, 6, scale=1.0)
    want = evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(_run(lib, x), want, rtol=1e-4, atol=1e-4)
    dbg = factory.debug_create("default", kiln.cpu(), dump_root=str(tmp_path / "dbg"))  # type: ignore[attr-defined]
    dbg.set_input("x", x)
    dbg.run()
    np.testing.assert_allclose(dbg.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)


def test_c_api_runs_concats_in_place(tmp_path) -> None:
    from tests.capi.test_c_api import EXAMPLE, _cc, _write_inputs
    from tests.capi.test_c_api import _run as run_proc

    rng = np.random.default_rng(4)
    g = _dense_block(rng, batch=1, layers=3)
    factory, gj = _built(g)
    assert _in_place(gj) == 2
    so = factory.export_library(str(tmp_path / "dense.so"))  # type: ignore[attr-defined]
    x = _rand(rng, 1, 8, 6, 6, scale=1.0)
    exe = _cc(os.path.join(tmp_path, "run_model"), EXAMPLE, "-ldl")
    proc = run_proc([exe, so, *_write_inputs(str(tmp_path), {"x": x}), "--out", os.path.join(tmp_path, "out")])
    assert proc.returncode == 0, proc.stderr
    want = evaluate(g, {"x": x})[0]
    got = np.fromfile(os.path.join(tmp_path, "out0.bin"), dtype=np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- graph JSON checks


@pytest.fixture(scope="module")
def dense_json() -> dict:
    _, gj = _built(_dense_block(np.random.default_rng(5), batch=1, layers=3))
    assert _in_place(gj) == 2
    load_graph_json(gj)  # the compiler's own output is accepted
    return gj


def _concat_node(gj: dict) -> tuple[int, dict]:
    return next((i, n) for i, n in enumerate(gj["nodes"]) if n.get("attrs", {}).get("func_name") == "__concat")


def _entry(gj: dict, ref: list[int]) -> int:
    return gj["node_row_ptr"][ref[0]] + ref[1]


def _mutated(gj: dict, how: str) -> dict:
    g = json.loads(json.dumps(gj))
    nid, node = _concat_node(g)
    offs = g["attrs"]["storage_offset"][1]
    piece = _entry(g, node["inputs"][1])
    if how == "offset":
        offs[piece] += 4
    elif how == "storage":
        g["attrs"]["storage_id"][1][piece] += 1000
    elif how == "arg_input":
        node["inputs"][0] = [0, 0, 0]  # the graph input
    elif how == "head":
        g["heads"] = [[nid, 0, 0]]
    elif how == "missing_piece":
        node["inputs"] = node["inputs"][:1]
        node["attrs"]["num_inputs"] = "1"
    elif how == "negative":
        offs[piece] = -8
    return g


@pytest.mark.parametrize("how, match", [
    ("offset", "must lie at byte"),
    ("storage", "must lie at byte"),
    ("arg_input", "written by an input or param"),
    ("head", "graph output"),
    ("missing_piece", "inputs hold"),
    ("negative", "non-negative"),
])
def test_reader_refuses_inconsistent_concat(dense_json: dict, how: str, match: str) -> None:
    with pytest.raises(FormatError, match=match):
        load_graph_json(_mutated(dense_json, how))


def test_reader_refuses_overlapping_pieces(dense_json: dict) -> None:
    """Two kernel outputs overlapping inside one placement: caught even with the ``__concat``
    node itself gone (its output entry then no longer joins them)."""
    g = json.loads(json.dumps(dense_json))
    nid, node = _concat_node(g)
    a, b = (_entry(g, r) for r in node["inputs"][:2])
    offs = g["attrs"]["storage_offset"][1]
    offs[b] = offs[a]
    with pytest.raises(FormatError):
        load_graph_json(g)
