"""GatherND, ScatterElements, ScatterND and OneHot from ONNX: values vs ONNX Runtime, and
out-of-range indices as errors (ORT raises too; OneHot's are all-off rows by the spec)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime.errors import KernelError

ort = pytest.importorskip("onnxruntime")

TARGETS = ["llvm", "c"]
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(node: onnx.NodeProto, inputs: list, outputs: list, inits: list | None = None,
           opset: int = 18) -> onnx.ModelProto:
    g = helper.make_graph([node], "g", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _kiln(model: onnx.ModelProto, target: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target=target, params=params)["default"](kiln.cpu()))
    m.run(**feeds)
    return [m.get_output(i).numpy() for i in range(m.get_num_outputs())]


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _vi(name: str, t: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


RNG = np.random.default_rng(11)
X = RNG.standard_normal((4, 5, 3)).astype(np.float32)

CASES = {
    "gather_nd": (
        helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd"),
        [_vi("x", F, [4, 5, 3]), _vi("i", I64, [2, 2])], [_vi("y", F, [2, 3])],
        {"x": X, "i": np.array([[0, 1], [-1, 4]], np.int64)}),
    "gather_nd_batch": (
        helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd", batch_dims=1),
        [_vi("x", F, [4, 5, 3]), _vi("i", I64, [4, 1])], [_vi("y", F, [4, 3])],
        {"x": X, "i": np.array([[0], [4], [2], [-1]], np.int64)}),
    "scatter_elements": (
        helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="se", axis=1),
        [_vi("x", F, [4, 5, 3]), _vi("i", I64, [4, 2, 3]), _vi("u", F, [4, 2, 3])], [_vi("y", F, [4, 5, 3])],
        {"x": X, "i": np.stack([np.stack([RNG.permutation(5)[:2] for _ in range(3)], 1) for _ in range(4)]),
         "u": RNG.standard_normal((4, 2, 3)).astype(np.float32)}),
    "scatter_nd": (
        helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="snd"),
        [_vi("x", F, [4, 5, 3]), _vi("i", I64, [2, 2]), _vi("u", F, [2, 3])], [_vi("y", F, [4, 5, 3])],
        {"x": X, "i": np.array([[1, 2], [-1, 0]], np.int64), "u": RNG.standard_normal((2, 3)).astype(np.float32)}),
    "one_hot": (
        helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="oh", axis=1),
        [_vi("i", I64, [2, 3]), _vi("v", F, [2])], [_vi("y", F, [2, 4, 3])],
        {"i": np.array([[0, 3, -1], [7, 2, -5]], np.int64), "v": np.array([-1.0, 2.0], np.float32)}),
}
DEPTH = helper.make_tensor("d", I64, [], [4])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_onnxruntime(case: str, target: str) -> None:
    node, ins, outs, feeds = CASES[case]
    model = _model(node, ins, outs, [DEPTH] if case == "one_hot" else None)
    got, = _kiln(model, target, feeds)
    want, = _ort(model, feeds)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case,bad", [
    ("gather_nd", {"i": np.array([[0, 1], [4, 0]], np.int64)}),
    ("scatter_elements", None),
    ("scatter_nd", {"i": np.array([[1, 5], [0, 0]], np.int64)}),
])
def test_out_of_range_index_is_a_kernel_error(case: str, bad: dict | None) -> None:
    node, ins, outs, feeds = CASES[case]
    feeds = dict(feeds)
    if bad is None:
        idx = feeds["i"].copy()
        idx[3, 1, 2] = 5
        bad = {"i": idx}
    feeds.update(bad)
    model = _model(node, ins, outs)
    with pytest.raises(Exception):  # noqa: B017 - ORT's own error type; only that it refuses matters
        _ort(model, feeds)
    with pytest.raises(KernelError, match="out of range"):
        _kiln(model, "llvm", feeds)


def test_unsupported_scatter_reduction_names_the_node() -> None:
    # add/mul/max/min are supported (scatter_nd_reduce); anything else is refused, naming the node
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="snd_xor", reduction="xor")
    model = _model(node, [_vi("x", F, [4, 5, 3]), _vi("i", I64, [2, 2]), _vi("u", F, [2, 3])],
                   [_vi("y", F, [4, 5, 3])])
    with pytest.raises(kiln.runtime.errors.InputError, match="node .snd_xor.*reduction must be one of .* got .xor."):
        kiln.frontend.from_onnx(model)
