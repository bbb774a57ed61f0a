"""``kiln inspect MODEL.onnx`` reports unsupported op variants, not only unsupported op types.

It converts the model (as ``kiln build`` would) and lists every node that fails, so a model
whose op types are all in the converter table can still be reported as not convertible.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cli.cli_support import kiln

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

N = helper.make_node


def _save(path, nodes, inputs, outputs, inits=None, opset=13):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, t, s) for k, t, s in inputs],
                          [helper.make_empty_tensor_value_info(o) for o in outputs],
                          initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture(scope="module")
def variant_model(tmp_path_factory):
    """Supported op types only, but two Reshapes take their shape from a runtime input."""
    nodes = [N("Reshape", ["x", "s"], ["a"], name="reshape_a"), N("Relu", ["a"], ["b"], name="relu_b"),
             N("Reshape", ["x", "s"], ["c"], name="reshape_c"), N("Relu", ["x"], ["y"], name="fine")]
    return _save(tmp_path_factory.mktemp("v") / "v.onnx", nodes,
                 [("x", TensorProto.FLOAT, ["n", 4]), ("s", TensorProto.INT64, [2])], ["y", "b", "c"])


def test_variants_listed_per_node(variant_model):
    proc = kiln("inspect", variant_model, "--input-shape", "x:1,4")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "all 2 op types are supported" not in out
    assert "kiln support: 2 node(s) cannot be converted; 1 more depend on them:" in out
    for name in ("'reshape_a'", "'reshape_c'"):
        assert any(name in line and "must be a constant" in line for line in out.splitlines()), out


def test_variants_json_and_dynamic_shapes(variant_model):
    # Without --input-shape the dynamic 'n' stops the conversion: said, not hidden.
    proc = kiln("inspect", variant_model, "--json")
    assert proc.returncode == 0, proc.stderr
    conv = json.loads(proc.stdout)["conversion"]
    assert conv["checked"] is False and "'x'" in conv["reason"] and "dynamic" in conv["reason"]
    proc = kiln("inspect", variant_model, "--json", "--input-shape", "x:1,4")
    info = json.loads(proc.stdout)
    assert info["unsupported_ops"] == []
    assert [(e["node"], e["op_type"]) for e in info["conversion"]["errors"]] == [
        ("reshape_a", "Reshape"), ("reshape_c", "Reshape")]
    assert info["conversion"]["skipped_nodes"] == 1


def test_types_and_variants_together_and_folded_ops(tmp_path):
    # DFT (no converter) on a runtime value cannot run; on an initializer it is evaluated at import.
    nodes = [N("DFT", ["x"], ["u"], name="uq_runtime"), N("DFT", ["k"], ["kk"], name="uq_const"),
             N("Add", ["x", "kk"], ["y"]), N("Reshape", ["x", "s"], ["r"], name="dyn")]
    path = _save(tmp_path / "m.onnx", nodes, [("x", TensorProto.FLOAT, [1, 3, 1]), ("s", TensorProto.INT64, [1])],
                 ["u", "y", "r"], {"k": np.array([[[2.0], [1.0], [3.0]]], np.float32)}, opset=17)
    proc = kiln("inspect", path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "kiln support: UNSUPPORTED op types: DFT" in lines
    assert "kiln support: 2 node(s) cannot be converted:" in lines
    assert any("'uq_runtime'" in ln for ln in lines) and any("'dyn'" in ln for ln in lines)
    assert not any("'uq_const'" in ln for ln in lines)
