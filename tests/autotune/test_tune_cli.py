"""``kiln tune`` and ``kiln build --tuning-log`` as subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kiln.target import Target, isa_of
from kiln.topi.nn.dense import dense_panel_width
from kiln.topi.schedule.x86 import gemm_register_tile


def kiln(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, KILN_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def tuned_log(tiny_onnx, tmp_path_factory):
    log = str(tmp_path_factory.mktemp("tunecli") / "tiny.jsonl")
    p = kiln("tune", tiny_onnx, "-o", log, "--trials", "2", "--target", "llvm", "--tasks", "dense")
    return p, log


def test_tune_cli_writes_log_and_table(tuned_log):
    p, log = tuned_log
    assert p.returncode == 0, p.stderr
    assert "1 tasks for llvm" in p.stderr
    isa = isa_of(Target("llvm"))  # the register tile of plain llvm beside its packed panel (N = 32)
    mt, nt = gemm_register_tile(isa, nt=dense_panel_width(isa, n=32))
    assert f"[task 1/1 dense] trial 1/2 nt={nt},mt={mt} (default):" in p.stderr
    head = p.stdout.splitlines()[0].split()
    assert head[:6] == ["#", "kind", "calls", "default", "ms", "best"]
    row = p.stdout.splitlines()[1].split()
    assert row[1] == "dense" and row[2] == "1" and row[5].endswith("x")
    recs = [json.loads(s) for s in open(log)]
    assert f"({len(recs)} records appended)" in p.stdout
    # two trials; when the candidate measured faster than the default (timing noise on a
    # 0.2 ms kernel can do that), confirmation rounds re-measure both and append pairs
    trials = [r for r in recs if "confirm" not in r]
    confirms = [r for r in recs if "confirm" in r]
    assert len(trials) == 2 and len(confirms) % 2 == 0, recs
    assert recs[0]["is_default"] and recs[0]["kind"] == "dense"
    assert recs[0]["median_s"] > 0 and recs[0]["target"] == "llvm"


def test_build_cli_applies_log(tuned_log, tiny_onnx, tmp_path):
    _, log = tuned_log
    out = str(tmp_path / "tiny.so")
    p = kiln("build", tiny_onnx, "-o", out, "--target", "llvm", "--tuning-log", log, "-q", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["tuned_kernels"] == 1 and info["tuning_log"] == log
    assert os.path.getsize(out) > 0
    # another target: nothing applies
    p = kiln("build", tiny_onnx, "-o", out, "--target", "c", "--tuning-log", log, "-q")
    assert p.returncode == 0, p.stderr
    assert "0 kernels use tuned configs" in p.stdout


def test_cli_errors(tiny_onnx, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"workload": ["dense"], "target": "llvm", "config": {"mt": 2}}\n')
    p = kiln("build", tiny_onnx, "-o", str(tmp_path / "x.so"), "--target", "llvm", "--tuning-log", str(bad), "-q")
    assert p.returncode == 1
    assert "line 1" in p.stderr and "bad.jsonl" in p.stderr and "median_s" in p.stderr
    p = kiln("build", tiny_onnx, "-o", str(tmp_path / "x.so"), "--tuning-log", str(tmp_path / "none.jsonl"), "-q")
    assert p.returncode == 1 and "none.jsonl" in p.stderr
    p = kiln("tune", tiny_onnx, "-o", str(tmp_path / "t.jsonl"), "--tasks", "winograd")
    assert p.returncode == 1 and "winograd" in p.stderr
    p = kiln("tune", tiny_onnx, "-o", str(tmp_path / "t.jsonl"), "--trials", "0")
    assert p.returncode == 1 and "--trials" in p.stderr
