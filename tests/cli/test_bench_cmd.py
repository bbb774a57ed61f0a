"""``kiln bench`` as a subprocess: latency table, --vs onnxruntime, --profile / --trace, errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("onnx")
from tests.cli.cli_support import assert_user_error, kiln, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    model = tiny_model(str(d / "tiny.onnx"))
    lib = str(d / "tiny.so")
    proc = kiln("build", model, "-o", lib, "-q")
    assert proc.returncode == 0, proc.stderr
    return model, lib


def test_bench_library_distribution(built):
    _, lib = built
    proc = kiln("bench", lib, "--repeat", "10", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    head = next(line for line in out.splitlines() if line.startswith("latency (ms)"))
    for col in ("median", "mean", "min", "max", "std", "p90"):
        assert col in head
    assert any(line.startswith("kiln ") for line in out.splitlines())
    assert "threads: 1" in out


def test_bench_vs_onnxruntime_profile_trace(built, tmp_path):
    pytest.importorskip("onnxruntime")
    model, lib = built
    trace = tmp_path / "t.json"
    proc = kiln("bench", lib, "--model", model, "--vs", "onnxruntime", "--repeat", "5", "--profile",
                "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert any(line.startswith("onnxruntime ") for line in out.splitlines())
    assert "kiln/onnxruntime (median):" in out
    assert "per-op profile" in out and "Time (us)" in out and "Total" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert events and all(e["ph"] == "X" for e in events)


def test_bench_onnx_model_json(built):
    model, _ = built
    proc = kiln("bench", model, "--repeat", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["build_seconds"] > 0
    st = res["latency_ms"]["kiln"]
    assert st["min"] <= st["median"] <= st["max"] and st["min"] <= st["p90"] <= st["max"]


def test_bench_errors(built, tmp_path):
    model, lib = built
    assert_user_error(kiln("bench", str(tmp_path / "nope.so")), "not found")
    assert_user_error(kiln("bench", lib, "--vs", "onnxruntime"), "--model")
    assert_user_error(kiln("bench", lib, "--repeat", "0"), "--repeat")
    assert_user_error(kiln("bench", model, "--target", "nosuchtarget"), "nosuchtarget")
