"""``kiln build`` as a subprocess: summary, progress, outputs, and one-line user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def kiln(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def tiny_model(path: str, batch: int | str = 1) -> str:
    """conv(+bias) -> relu -> global avg pool -> flatten -> gemm -> softmax, 3x8x8 -> 5."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype("float32") * 0.1, "b")
    fw = numpy_helper.from_array(rng.standard_normal((5, 4)).astype("float32"), "fw")
    fb = numpy_helper.from_array(rng.standard_normal(5).astype("float32") * 0.1, "fb")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], transB=1),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
                              initializer=[w, b, fw, fb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def bad_op_model(path: str) -> str:
    nodes = [helper.make_node("FrobnicateX", ["x"], ["t"], name="frob"), helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


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


@pytest.mark.parametrize("spec", ["x:1,3,a,8", "x", ":1,3", "x:1,0,8,8"])
def test_bad_input_shape(model, tmp_path, spec):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--input-shape", spec), "--input-shape")


def test_unknown_input_name(model, tmp_path):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--input-shape", "data:1,3,8,8"), "data")


def test_unknown_target(model, tmp_path):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.so"), "--target", "tpu9000"), "tpu9000")


def test_bad_output_extension(model, tmp_path):
    assert_user_error(kiln("build", model, "-o", str(tmp_path / "x.zip")), ".so or .tar")


def test_verbose_shows_traceback(tmp_path):
    proc = kiln("build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x.so"), "--verbose")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "kiln: error:" in proc.stderr
