"""Schedule knobs, the tuning log and ``kiln.build(tuning_log=...)``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kiln
import kiln.driver
from kiln.autotune import apply_history_best, best_configs, extract_tasks, load_records, target_key, tune
from kiln.autotune.log import TuningRecord, append_records
from kiln.autotune.space import KNOB_SPACES, DispatchContext, current_config, workload_key
from kiln.topi.knobs import knob_space
from kiln.transform.alter_layout import choose_out_block
from kiln.autotune.tuner import _close
from kiln.target import Target, isa_of
from kiln.topi.nn.dense import dense_panel_width
from kiln.topi.schedule.x86 import gemm_register_tile
from kiln.runtime.errors import InputError

TARGET = "llvm"


def _run(factory, x):
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input("x", x)
    m.run()
    return m.get_output(0).numpy()


def _tir(factory) -> str:
    return "\n".join(str(f) for f in factory.lowered.funcs)


def _x():
    return np.random.default_rng(3).standard_normal((4, 8, 12, 12)).astype("float32")


def _reference(tiny_onnx, x):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(tiny_onnx, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _fake_log(tasks, path, target=TARGET, best=None):
    """Records where a non-default config is the fastest (deterministic, no timing)."""
    recs = []
    for t in tasks:
        alt = best[t.kind] if best else None
        recs.append(TuningRecord(t.workload, target_key(target), dict(t.defaults), median_s=2e-3, is_default=True))
        recs.append(TuningRecord(t.workload, target_key(target), dict(alt), median_s=1e-3))
        # faster but failed: must never be picked
        recs.append(TuningRecord(t.workload, target_key(target), dict(t.defaults), median_s=None, error="boom"))
    append_records(path, recs)
    return recs


ALT = {"dense": {"mt": 2, "nt": 8}, "conv2d_nchwc": {"xt": 3, "order": "block_outer"}}


def test_current_config_defaults_without_context():
    wl = workload_key("dense", (4, 16), (8, 16), "float32")
    assert current_config("dense", wl, {"mt": 6, "nt": 16}) == {"mt": 6, "nt": 16}
    with DispatchContext({wl: {"mt": 3, "junk": 1}}) as ctx:
        assert current_config("dense", wl, {"mt": 6, "nt": 16}) == {"mt": 3, "nt": 16}
        other = workload_key("dense", (4, 16), (9, 16), "float32")
        assert current_config("dense", other, {"mt": 6, "nt": 16}) == {"mt": 6, "nt": 16}
    assert ctx.applied == {wl} and ctx.hits == 1
    assert current_config("dense", wl, {"mt": 6}) == {"mt": 6}
    # KNOB_SPACES is the no-target (x86-64-v3, 16 ymm) space: nt one to four 8-lane vectors,
    # mt up to 12 (12 accumulators + one B vector + one broadcast fill 16 registers)
    assert KNOB_SPACES["dense"] == knob_space("dense", "llvm -mcpu=x86-64-v3")
    assert dict(KNOB_SPACES["dense"].knobs) == {"mt": tuple(range(1, 13)), "nt": (8, 16, 24, 32)}


def test_default_path_unchanged_with_empty_log(tiny_graph, tmp_path):
    g, params = tiny_graph
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    base = kiln.build(g, TARGET, params)
    for log in (str(empty), []):
        f = kiln.build(g, TARGET, params, tuning_log=log)
        assert _tir(f) == _tir(base)
        assert f.lib.get_source() == base.lib.get_source()
        assert f.get_stats()["tuned_kernels"] == 0


def test_tasks_and_tune_writes_valid_records(tiny_graph, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # tasks of the direct conv kernel (its 3x3 would be Winograd)
    g, params = tiny_graph
    tasks = extract_tasks(g, params, TARGET)
    assert sorted(t.kind for t in tasks) == ["conv2d_nchwc", "dense"]
    dense = next(t for t in tasks if t.kind == "dense")
    assert dense.workload == ("dense", (4, 2304), (32, 2304), "float32")
    # the packed panel is as wide as the target's register tile; the rows are what fits beside it
    isa = isa_of(Target(TARGET))
    mt, nt = gemm_register_tile(isa, nt=dense_panel_width(isa, n=32))
    assert dense.defaults == {"nt": nt, "mt": mt}
    log = tmp_path / "t.jsonl"
    results = tune(g, params, TARGET, log_file=str(log), trials=3, number=2, repeat=2, min_repeat_ms=1, confirm=1)
    lines = [json.loads(s) for s in log.read_text().splitlines()]
    # 3 trials per task, plus default + best once more where a candidate beat the default
    assert len(lines) == 6 + sum(len(r.confirmed) for r in results)
    assert sum(1 for d in lines if "confirm" in d) == sum(len(r.confirmed) for r in results)
    assert all(len(r.confirmed) in (0, 2) for r in results)
    recs = load_records(str(log))
    for res in results:
        assert len(res.records) == 3 and res.records[0].is_default
        assert res.records[0].config == res.task.defaults
        assert res.records[0].valid and res.best is not None and res.speedup >= 1.0
        for r in res.records:
            assert r.target == "llvm" and r.kiln_version == kiln.__version__
            assert r.valid or r.error
            if r.valid:
                assert r.median_s > 0 and r.gflops > 0
    assert {r.workload for r in recs} == {t.workload for t in tasks}


def test_build_applies_best_records(tiny_graph, tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # tasks of the direct conv kernel (its 3x3 would be Winograd)
    g, params = tiny_graph
    tasks = extract_tasks(g, params, TARGET)
    log = tmp_path / "best.jsonl"
    _fake_log(tasks, log, best=ALT)
    chosen = best_configs(load_records(str(log)), TARGET)
    assert {wl: r.config for wl, r in chosen.items()} == {t.workload: ALT[t.kind] for t in tasks}
    base = kiln.build(g, TARGET, params)
    tuned = kiln.build(g, TARGET, params, tuning_log=str(log))
    assert tuned.get_stats()["tuned_kernels"] == 2
    assert _tir(tuned) != _tir(base)
    # the knob values the schedules saw
    with apply_history_best(str(log), TARGET, record_queries=True) as ctx:
        kiln.driver.lower(g, TARGET, params)
    seen = {}
    ctx.record = False
    for q in list(ctx.queries):
        if q.tuned:
            seen.setdefault(q.workload, {}).update(ctx.lookup(q.kind, q.workload, q.defaults))
    assert seen == {t.workload: ALT[t.kind] for t in tasks}
    x = _x()
    ref = _reference(tiny_onnx, x)
    y0, y1 = _run(base, x), _run(tuned, x)
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y1, ref, rtol=1e-4, atol=1e-4)


def test_records_for_other_targets_are_ignored(tiny_graph, tmp_path):
    g, params = tiny_graph
    tasks = extract_tasks(g, params, TARGET)
    log = tmp_path / "other.jsonl"
    _fake_log(tasks, log, target="llvm -mcpu=skylake", best=ALT)
    _fake_log(tasks, log, target="c", best=ALT)
    base = kiln.build(g, TARGET, params)
    f = kiln.build(g, TARGET, params, tuning_log=str(log))
    assert f.get_stats()["tuned_kernels"] == 0
    assert _tir(f) == _tir(base)
    assert best_configs(load_records(str(log)), "llvm -mcpu=skylake")


def test_layout_block_knob(tiny_graph, monkeypatch):
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # tasks of the direct conv kernel (its 3x3 would be Winograd)
    g, params = tiny_graph
    base = kiln.driver.lower(g, TARGET, params)
    wl = workload_key("conv2d_layout", (4, 8, 12, 12), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32")
    # the default block is the layout rule's for the target's ISA (plain llvm: SSE2, 2 x 4 lanes)
    default = choose_out_block(16, 12, isa_of(TARGET))
    with DispatchContext({wl: {"ob": 4 if default != 4 else 8}}) as ctx:
        low = kiln.driver.lower(g, TARGET, params)
    assert ctx.applied == {wl}
    obs = {t.workload[3][-1] for t in extract_tasks(g, params, TARGET, kinds=["conv2d_nchwc"])}
    assert obs == {default}  # default block without the context
    text = "\n".join(str(f) for f in low.funcs)
    assert text != "\n".join(str(f) for f in base.funcs)
    assert "conv2d_nchwc" in text


@pytest.mark.parametrize("line, why", [
    ("{not json", "not JSON"),
    ('["a"]', "expected a JSON object"),
    ('{"workload": ["winograd"], "target": "llvm", "config": {}, "median_s": 1}', "unknown kernel kind"),
    ('{"workload": ["dense"], "target": "llvm", "config": {"tile": 3}, "median_s": 1}', "'config'"),
    ('{"workload": ["dense"], "target": "llvm", "config": {"mt": 3}, "median_s": -1, "error": null}', "median_s"),
    ('{"workload": ["dense"], "config": {"mt": 3}, "median_s": 1}', "'target'"),
])
def test_malformed_log_names_file_and_line(tiny_graph, tmp_path, line, why):
    g, params = tiny_graph
    good = TuningRecord(("dense", (4, 2304), (32, 2304), "float32"), "llvm", {"mt": 2}, median_s=1e-3).to_json()
    log = tmp_path / "bad.jsonl"
    log.write_text(good + "\n\n" + line + "\n")
    with pytest.raises(InputError, match=rf"bad\.jsonl, line 3: .*{why}"):
        kiln.build(g, TARGET, params, tuning_log=str(log))


def test_missing_log_and_bad_trials(tiny_graph, tmp_path):
    g, params = tiny_graph
    with pytest.raises(kiln.runtime.errors.KilnFileNotFoundError, match="nope.jsonl"):
        kiln.build(g, TARGET, params, tuning_log=str(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="trials"):
        tune(g, params, TARGET, trials=0)
    with pytest.raises(InputError, match="task kind"):
        extract_tasks(g, params, TARGET, kinds=["winograd"])


def test_wrong_outputs_are_rejected():
    ref = [np.linspace(-1, 1, 64, dtype="float32")]
    assert _close([ref[0] * (1 + 1e-7)], ref) is None
    bad = ref[0].copy()
    bad[5] += 0.01
    assert "differs" in _close([bad], ref)


def test_best_config_ranks_by_median_of_all_records():
    wl = ("dense", (4, 2304), (32, 2304), "float32")
    mk = lambda cfg, t, tgt="llvm": TuningRecord(wl, tgt, cfg, median_s=t)  # noqa: E731
    a, b = {"mt": 6, "nt": 16}, {"mt": 2, "nt": 8}
    # b had one lucky run, but its median over three is worse than a's
    recs = [mk(a, 2.0), mk(b, 1.0), mk(a, 2.1), mk(b, 3.0), mk(b, 3.2), mk(a, 1.9),
            mk(b, 0.1, "llvm -mcpu=skylake")]
    assert best_configs(recs, "llvm")[wl].config == a
    assert best_configs(recs, "llvm -mcpu=skylake")[wl].config == b
    assert best_configs(recs, "c") == {}
