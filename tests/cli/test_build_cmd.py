"""``kiln build`` as a subprocess: summary, progress, outputs, and one-line user errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("onnx")

from tests.cli.cli_support import assert_user_error, bad_op_model, kiln, tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("build") / "tiny.onnx"))


def test_build_so_summary_and_progress(model, tmp_path):
    out = str(tmp_path / "tiny.so")
    proc = kiln("build", model, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert os.path.getsize(out) > 0
    o = proc.stdout
    assert f"-> {out}" in o
    for key in ("fused groups", "kernels", "unique functions", "planned vs", "without reuse", "file", "total"):
        assert key in o, o
    # progress: one line per stage on a non-terminal stderr
    for stage in ("import", "optimize", "lower", "codegen+compile", "export"):
        assert stage in proc.stderr, proc.stderr
    # the library runs
    import kiln as K

    m = K.GraphModule(K.runtime.load_module(out)["default"](K.cpu()))
    m.set_input("x", np.ones((1, 3, 8, 8), "float32"))
    m.run()
    y = m.get_output(0).numpy()
    assert y.shape == (1, 5) and abs(float(y.sum()) - 1.0) < 1e-5


def test_build_tar_json_dynamic_batch(tmp_path):
    model = tiny_model(str(tmp_path / "dyn.onnx"), batch="N")
    out = str(tmp_path / "dyn.tar")
    proc = kiln("build", model, "-o", out, "--input-shape", "x:2,3,8,8", "--target", "c", "--opt-level", "1",
                "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    info = json.loads(proc.stdout)
    assert info["output"] == out and info["file_bytes"] == os.path.getsize(out)
    assert info["kernel_calls"] >= 1 and info["fused_groups"] >= info["kernel_calls"]
    assert info["memory"]["no_reuse_bytes"] >= info["memory"]["planned_bytes"] > 0
    assert info["target"] == "c"


def test_dynamic_shape_without_input_shape_is_a_user_error(tmp_path):
    model = tiny_model(str(tmp_path / "dyn.onnx"), batch="N")
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so")), "dynamic")


def test_missing_file(tmp_path):
    assert_user_error(kiln("build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x.so")), "not found")


def test_unsupported_op_lists_them(tmp_path):
    bad = bad_op_model(str(tmp_path / "bad.onnx"))
    proc = kiln("build", bad, "-o", str(tmp_path / "x.so"))
    assert_user_error(proc, "FrobnicateX", "unsupported")
    assert not os.path.exists(tmp_path / "x.so")


@pytest.mark.parametrize("spec", ["x:1,3,a-b,8", "x:1,3,2.5,8", "x", ":1,3", "x:1,0,8,8"])
def test_bad_input_shape(model, tmp_path, spec):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--input-shape", spec), "--input-shape")


def test_unknown_input_name(model, tmp_path):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--input-shape", "data:1,3,8,8"), "data")


def test_unknown_target(model, tmp_path):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--target", "tpu9000"), "tpu9000")


def test_bad_output_extension(model, tmp_path):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.zip")), ".so, .a or .tar")


def test_verbose_shows_traceback(tmp_path):
    proc = kiln("build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x.so"), "--verbose")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "kiln: error:" in proc.stderr
