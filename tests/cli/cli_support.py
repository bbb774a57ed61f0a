"""Helpers shared by the CLI tests: run ``kiln`` in a subprocess, check one-line user errors, tiny models.

ONNX is imported inside the model builders so that a test module needing only :func:`kiln` and
:func:`assert_user_error` can be collected without it.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np


def kiln(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m kiln.cli *args`` and capture its text output."""
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """``proc`` failed with exactly one ``kiln: error: ...`` line, no traceback, naming every needle."""
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def tiny_model(path: str, batch: int | str = 1) -> str:
    """conv(+bias) -> relu -> global avg pool -> flatten -> gemm -> softmax, 3x8x8 -> 5."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

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
    """A model with an op no frontend knows (``FrobnicateX``, node ``frob``)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("FrobnicateX", ["x"], ["t"], name="frob"), helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
