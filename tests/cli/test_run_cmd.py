"""``kiln run`` as a subprocess: random / file inputs, --output, --compare, user errors."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

pytest.importorskip("onnx")
from tests.cli.cli_support import assert_user_error, kiln, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    model = tiny_model(str(d / "tiny.onnx"))
    lib = str(d / "tiny.so")
    proc = kiln("build", model, "-o", lib, "-q")
    assert proc.returncode == 0, proc.stderr
    return model, lib


def test_run_random_inputs(built):
    _, lib = built
    proc = kiln("run", lib)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "x: shape (1, 3, 8, 8) float32" in out and "random, seed 0" in out
    assert "output 0: shape (1, 5) float32" in out
    assert "min" in out and "max" in out and "mean" in out


def test_run_file_input_output_npz(built, tmp_path):
    _, lib = built
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "y.npz"
    proc = kiln("run", lib, "--input", f"x={tmp_path / 'x.npy'}", "--output", str(out), "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "(file)" in proc.stdout
    y = np.load(out)["output_0"]
    import onnxruntime as ort  # test extra

    sess = ort.InferenceSession(built[0], providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-6)


def test_run_compare_with_onnxruntime(built):
    pytest.importorskip("onnxruntime")
    model, lib = built
    proc = kiln("run", lib, "--compare", model)
    assert proc.returncode == 0, proc.stderr
    assert "output 0 (y): max abs error" in proc.stdout
    assert "max rel error" in proc.stdout and "match:" in proc.stdout


def test_compare_without_onnxruntime_is_a_clear_error(built, tmp_path):
    model, lib = built
    # a sitecustomize-free way to hide onnxruntime: a shadowing package that fails to import
    shadow = tmp_path / "shadow" / "onnxruntime"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    import os
    import sys

    env = dict(os.environ, PYTHONPATH=str(tmp_path / "shadow") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "run", lib, "--compare", model],
                          capture_output=True, text=True, timeout=60, env=env)
    assert_user_error(proc, "onnxruntime", "pip install")


def test_run_errors(built, tmp_path):
    model, lib = built
    assert_user_error(kiln("run", str(tmp_path / "missing.so")), "not found")
    assert_user_error(kiln("run", model), "ONNX model", "kiln build")
    np.save(tmp_path / "bad.npy", np.zeros((2, 2), "float32"))
    assert_user_error(kiln("run", lib, "--input", f"x={tmp_path / 'bad.npy'}"), "shape")
    assert_user_error(kiln("run", lib, "--input", f"nope={tmp_path / 'bad.npy'}"), "nope")
    assert_user_error(kiln("run", lib, "--input", f"x={tmp_path / 'absent.npy'}"), "not found")
    assert_user_error(kiln("run", lib, "--input", "garbage"), "--input")
