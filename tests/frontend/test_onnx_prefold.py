"""Unsupported ONNX nodes fed only by constants and shapes are evaluated at import.

Each model holds, in a constant or shape-only subgraph, an op with a data-dependent output shape
(``Unique``, ``NonZero``: on static inputs they are evaluated at import rather than compiled with
a data-dependent dim) or an op whose converter is removed for the test (``ScatterND`` /
``Expand``, as in the Swin-T export that motivated this), and is compared against ONNX Runtime.
An op without a converter on a runtime input must still be refused with an UnsupportedOpError
naming it.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.frontend.onnx import converter, fold
from kiln.runtime.errors import UnsupportedOpError
from tests.frontend.onnx_check import assert_close, make_model, rand, run_kiln, run_ort

N = helper.make_node


@pytest.fixture
def without(monkeypatch):
    """Remove converters for the test: ``without("ScatterND")``."""
    converter.supported_ops()  # registers the real converters first, so the removal sticks

    def drop(*ops: str) -> None:
        for op in ops:
            monkeypatch.delitem(converter._CONVERTERS, op, raising=False)

    return drop


def _compare(model, feeds):
    want = run_ort(model, feeds)
    got, mod = run_kiln(model, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"output {i}")
    return mod


def _ops(mod) -> set[str]:
    """The ops the graph computes at run time."""
    return {n.op for n in mod.nodes} - {"constant"}


def test_unique_of_initializer_folds():
    nodes = [N("Unique", ["c"], ["u"], name="uniq", sorted=1), N("Add", ["x", "u"], ["y"])]
    feeds = {"x": rand(3)}
    model = make_model(nodes, feeds, ["y"], 13, {"c": np.array([3.0, 1.0, 3.0, 2.0], np.float32)})
    mod = _compare(model, feeds)
    assert _ops(mod) == {"add"}


def test_nonzero_of_shape_folds():
    # Shape -> Equal -> NonZero: the positions of the size-1 dims, used as Squeeze axes.
    nodes = [N("Shape", ["x"], ["s"]), N("Equal", ["s", "one"], ["e"]),
             N("NonZero", ["e"], ["nz"], name="nz"), N("Reshape", ["nz", "flat"], ["axes"]),
             N("Squeeze", ["x", "axes"], ["y"])]
    feeds = {"x": rand(2, 1, 3, 1)}
    model = make_model(nodes, feeds, ["y"], 13, {"one": np.array(1, np.int64),
                                                "flat": np.array([-1], np.int64)})
    mod = _compare(model, feeds)
    assert mod.outputs[0].shape == (2, 3)


def test_scatternd_mask_from_shapes_builds(without, tmp_path):
    """Swin-T's pattern: a zero mask shaped like an activation, filled by ScatterND."""
    without("ScatterND")
    nodes = [N("Shape", ["x"], ["s"]),
             N("ConstantOfShape", ["s"], ["z"], value=helper.make_tensor("v", TensorProto.FLOAT,
                                                                        [1], [0.0])),
             N("ScatterND", ["z", "idx", "upd"], ["mask"], name="fill"),
             N("Add", ["x", "mask"], ["y"])]
    feeds = {"x": rand(2, 3, 4)}
    model = make_model(nodes, feeds, ["y"], 16, {
        "idx": np.array([[0, 1], [1, 2]], np.int64),
        "upd": rand(2, 4, seed=3)})
    want = run_ort(model, feeds)[0]
    mod = _compare(model, feeds)
    assert "ScatterND" not in str(mod)
    # and the folded mask compiles into a library like any constant
    mod, params = kiln.frontend.from_onnx(model)
    lib = kiln.build(mod, target="c", params=params)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.run(x=feeds["x"])
    assert_close(gm.get_output(0).numpy(), want, what="built library")


def test_input_kept_at_run_time_is_recomputed():
    """Kiln leaves a large Expand as a runtime op; the folded node recomputes it from ONNX."""
    nodes = [N("Expand", ["one", "big"], ["e"]), N("ReduceSum", ["e", "ax"], ["col"], keepdims=0),
             N("NonZero", ["col"], ["nz"], name="nz"), N("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
             N("Reshape", ["f", "flat"], ["r"]), N("Add", ["x", "r"], ["y"])]
    feeds = {"x": rand(3)}
    # 3 x 30000 > converter.FOLD_LIMIT elements: the converter does not fold the Expand.
    model = make_model(nodes, feeds, ["y"], 13, {
        "one": np.array([[0.0], [2.0], [0.0]], np.float32), "big": np.array([3, 30000], np.int64),
        "ax": np.array([1], np.int64), "flat": np.array([-1], np.int64)})
    assert 3 * 30000 > converter.FOLD_LIMIT
    mod = _compare(model, feeds)
    assert _ops(mod) == {"add"}


def test_runtime_input_still_unsupported(without):
    without("Unique")  # (Unique has a run-time kernel now; this is about ops that have none)
    nodes = [N("Relu", ["x"], ["a"]), N("Unique", ["a"], ["y"], name="uq")]
    model = make_model(nodes, {"x": rand(4)}, ["y"], 13)
    with pytest.raises(UnsupportedOpError, match=r"Unique \(nodes: uq\)"):
        kiln.frontend.from_onnx(model)


def test_custom_domain_op_on_constants_names_it():
    nodes = [N("Frob", ["c"], ["f"], name="frob", domain="com.example"), N("Add", ["x", "f"], ["y"])]
    model = make_model(nodes, {"x": rand(2)}, ["y"], 13, {"c": np.ones(2, np.float32)})
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError, match="Frob node 'frob'.*could not evaluate it"):
        kiln.frontend.from_onnx(model)


def test_large_intermediate_is_not_materialised(monkeypatch):
    monkeypatch.setattr(fold, "PREFOLD_LIMIT", 1000)
    nodes = [N("Expand", ["one", "big"], ["e"]), N("NonZero", ["e"], ["nz"], name="nz"),
             N("Cast", ["nz"], ["f"], to=TensorProto.FLOAT), N("ReduceSum", ["f"], ["s"], keepdims=0),
             N("Add", ["x", "s"], ["y"])]
    model = make_model(nodes, {"x": rand(2)}, ["y"], 13, {
        "one": np.array(1.0, np.float32), "big": np.array([300, 300], np.int64)})
    with pytest.raises(UnsupportedOpError, match="NonZero node 'nz'.*'e'.*PREFOLD_LIMIT"):
        kiln.frontend.from_onnx(model)


def test_large_result_refused_before_evaluating(without, monkeypatch):
    without("Expand")
    monkeypatch.setattr(fold, "PREFOLD_LIMIT", 1000)

    def no_eval(*args, **kwargs):
        raise AssertionError("evaluated a result already known to be too large")

    monkeypatch.setattr(fold, "_evaluate", no_eval)
    nodes = [N("Expand", ["one", "big"], ["e"], name="ex"), N("Add", ["x", "e"], ["y"])]
    model = make_model(nodes, {"x": rand(300)}, ["y"], 13, {
        "one": np.array(1.0, np.float32), "big": np.array([300, 300], np.int64)})
    with pytest.raises(UnsupportedOpError, match="Expand node 'ex'.*90000 elements.*PREFOLD_LIMIT"):
        kiln.frontend.from_onnx(model)


def test_random_op_is_never_folded(without):
    without("RandomUniform")
    nodes = [N("RandomUniform", [], ["r"], name="rnd", shape=[2]), N("Add", ["x", "r"], ["y"])]
    model = make_model(nodes, {"x": rand(2)}, ["y"], 13)
    with pytest.raises(UnsupportedOpError, match=r"RandomUniform \(nodes: rnd\)"):
        kiln.frontend.from_onnx(model)


def test_conversion_errors_lists_every_failed_node(without):
    without("Unique")
    # Unique on a runtime value (no converter), a Reshape whose shape is a runtime input (a
    # variant Kiln cannot compile), a node downstream of each, and a node that converts.
    nodes = [N("Relu", ["x"], ["a"], name="r"), N("Unique", ["a"], ["u"], name="uq"),
             N("Relu", ["u"], ["u2"], name="after_uq"),
             N("Reshape", ["x", "s"], ["c"], name="dyn_reshape"), N("Relu", ["c"], ["c2"]),
             N("Relu", ["a"], ["y"], name="ok")]
    model = make_model(nodes, {"x": rand(4), "s": np.array([2, 2], np.int64)}, ["y", "u2", "c2"], 13)
    errors, skipped = converter.conversion_errors(model)
    assert [(e["node"], e["op_type"]) for e in errors] == [("uq", "Unique"), ("dyn_reshape", "Reshape")]
    assert "must be a constant" in errors[1]["error"] and skipped == 2
    with pytest.raises(UnsupportedOpError, match="Unique"):  # from_onnx still stops at the first
        kiln.frontend.from_onnx(model)
