"""ONNX ops with data-dependent output shapes, end to end against ONNX Runtime.

NonZero, Compress (run-time condition), NonMaxSuppression, Unique, TopK with a run-time K and
Range with run-time bounds: each model is imported, built (``llvm`` and ``c``), exported,
loaded and run on several inputs — empty results included — so the same library serves every
data-dependent extent, and ops downstream of the data-dependent dim see it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from tests.frontend.onnx_check import assert_close, run_ort

RNG = np.random.default_rng(7)
TARGETS = ["llvm", "c"]


def _model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
           for k, (dt, shape) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(nodes, "dd", vis, outs, initializer=init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _build(model, target, tmp_path) -> kiln.GraphModule:
    graph, params = kiln.frontend.from_onnx(model)
    lib = kiln.build(graph, target=target, params=params)
    path = str(tmp_path / f"m_{target}.so")
    lib.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _check(model, target, tmp_path, feeds_list) -> None:
    m = _build(model, target, tmp_path)
    for feeds in feeds_list:
        want = run_ort(model, feeds)
        m.run(**feeds)
        for i, w in enumerate(want):
            assert_close(m.get_output(i).numpy(), w, what=f"output {i} with {sorted(feeds)}")


@pytest.mark.parametrize("target", TARGETS)
def test_nonzero(target, tmp_path):
    model = _model([helper.make_node("NonZero", ["x"], ["y"])], {"x": (np.float32, (4, 5))}, ["y"])
    x = RNG.standard_normal((4, 5)).astype(np.float32) * (RNG.random((4, 5)) < 0.4)
    _check(model, target, tmp_path, [{"x": x}, {"x": np.zeros((4, 5), np.float32)},
                                     {"x": np.ones((4, 5), np.float32)}, {"x": x.T.copy().reshape(4, 5)}])


def test_nonzero_bool_3d_feeds_downstream(tmp_path):
    # NonZero -> Transpose -> Cast: the (3, nz) indices flow into ops of the data-dependent dim
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT)]
    model = _model(nodes, {"x": (np.bool_, (3, 2, 4))}, ["y"])
    feeds = [{"x": RNG.random((3, 2, 4)) < p} for p in (0.3, 0.0, 1.0, 0.7)]
    _check(model, "llvm", tmp_path, feeds)


@pytest.mark.parametrize("target", TARGETS)
def test_compress_runtime_condition(target, tmp_path):
    nodes = [helper.make_node("Compress", ["x", "c"], ["a"], axis=1),
             helper.make_node("Compress", ["x", "c2"], ["b"])]
    model = _model(nodes, {"x": (np.float32, (3, 6)), "c": (np.bool_, (6,)), "c2": (np.bool_, (10,))}, ["a", "b"])
    x = RNG.standard_normal((3, 6)).astype(np.float32)
    feeds = [{"x": x, "c": RNG.random(6) < 0.5, "c2": RNG.random(10) < 0.5},
             {"x": x, "c": np.zeros(6, bool), "c2": np.zeros(10, bool)},
             {"x": x, "c": np.ones(6, bool), "c2": np.ones(10, bool)}]
    _check(model, target, tmp_path, feeds)


def _boxes(n: int, batch: int = 1) -> np.ndarray:
    xy = RNG.random((batch, n, 2)).astype(np.float32) * 10
    wh = RNG.random((batch, n, 2)).astype(np.float32) * 4 + 0.5
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression(target, center, tmp_path):
    b, c, n = 2, 3, 40
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"], ["sel"],
                            center_point_box=center)
    inits = {"max_out": np.array([5], np.int64), "iou": np.array([0.4], np.float32),
             "thr": np.array([0.3], np.float32)}
    model = _model([node], {"boxes": (np.float32, (b, n, 4)), "scores": (np.float32, (b, c, n))}, ["sel"], inits)
    feeds = [{"boxes": _boxes(n, b), "scores": RNG.random((b, c, n)).astype(np.float32)} for _ in range(3)]
    feeds.append({"boxes": _boxes(n, b), "scores": np.full((b, c, n), 0.1, np.float32)})  # nothing selected
    same = _boxes(1, 1)
    feeds.append({"boxes": np.broadcast_to(same, (b, n, 4)).copy(),  # identical boxes: ties, one kept
                  "scores": np.full((b, c, n), 0.9, np.float32)})
    _check(model, target, tmp_path, feeds)


@pytest.mark.parametrize("target", TARGETS)
def test_unique_sorted_and_unsorted(target, tmp_path):
    nodes = [helper.make_node("Unique", ["x"], ["y", "i", "inv", "cnt"], sorted=1),
             helper.make_node("Unique", ["x2"], ["y2", "i2", "inv2", "cnt2"], sorted=0)]
    model = _model(nodes, {"x": (np.int64, (12,)), "x2": (np.float32, (3, 4))},
                   ["y", "i", "inv", "cnt", "y2", "i2", "inv2", "cnt2"])
    feeds = [{"x": RNG.integers(0, 5, 12), "x2": RNG.integers(0, 4, (3, 4)).astype(np.float32)},
             {"x": np.full(12, 3, np.int64), "x2": np.arange(12, dtype=np.float32).reshape(3, 4)[::-1].copy()},
             {"x": np.arange(12, dtype=np.int64)[::-1].copy(), "x2": np.zeros((3, 4), np.float32)}]
    _check(model, target, tmp_path, feeds)


@pytest.mark.parametrize("target", TARGETS)
def test_topk_runtime_k(target, tmp_path):
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("TopK", ["x", "k"], ["v2", "i2"], axis=0, largest=0)]
    model = _model(nodes, {"x": (np.float32, (4, 6)), "k": (np.int64, (1,))}, ["v", "i", "v2", "i2"])
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    x[1, 2] = x[1, 4]  # a tie: the lower index first
    feeds = [{"x": x, "k": np.array([k], np.int64)} for k in (2, 0, 4, 1)]
    _check(model, target, tmp_path, feeds)


def test_topk_runtime_k_out_of_range_fails_clearly(tmp_path):
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"])],
                   {"x": (np.float32, (2, 5)), "k": (np.int64, (1,))}, ["v", "i"])
    m = _build(model, "llvm", tmp_path)
    with pytest.raises(kiln.runtime.errors.KernelError, match="outside its range 0..5"):
        m.run(x=np.zeros((2, 5), np.float32), k=np.array([6], np.int64))


@pytest.mark.parametrize("target", TARGETS)
def test_range_runtime_bounds(target, tmp_path):
    nodes = [helper.make_node("Range", ["s", "l", "d"], ["r"]), helper.make_node("Range", ["fs", "fl", "fd"], ["f"])]
    scal = {k: (np.int64, ()) for k in "sld"} | {k: (np.float32, ()) for k in ("fs", "fl", "fd")}
    model = _model(nodes, scal, ["r", "f"])
    i64, f32 = np.int64, np.float32
    feeds = [dict(s=i64(2), l=i64(11), d=i64(3), fs=f32(0.5), fl=f32(3.0), fd=f32(0.25)),
             dict(s=i64(5), l=i64(1), d=i64(1), fs=f32(1.0), fl=f32(-2.0), fd=f32(-0.5)),
             dict(s=i64(10), l=i64(-3), d=i64(-4), fs=f32(0.0), fl=f32(0.0), fd=f32(1.0))]
    _check(model, target, tmp_path, [{k: np.asarray(v) for k, v in f.items()} for f in feeds])


def detection_graph(n: int, max_out: int) -> tuple[list, dict[str, np.ndarray]]:
    """Nodes and initializers of a detection post-processing graph over ``n`` boxes:
    NonMaxSuppression -> Gather(selected[:, 2]) -> box and score gathers -> arithmetic ->
    Concat -> ReduceSum, all on the data-dependent number of detections (inputs ``boxes``
    ``(1, n, 4)`` and ``scores`` ``(1, 1, n)``; outputs ``sel``, ``det``, ``total``)."""
    nodes = [
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "thr"], ["sel"]),
        helper.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["b0"]),
        helper.make_node("Gather", ["b0", "box_idx"], ["chosen"], axis=0),
        helper.make_node("Reshape", ["scores", "flat"], ["s0"]),
        helper.make_node("Gather", ["s0", "box_idx"], ["chosen_s"], axis=0),
        helper.make_node("Unsqueeze", ["chosen_s", "one"], ["s_col"]),
        helper.make_node("Mul", ["chosen", "scale"], ["scaled"]),
        helper.make_node("Concat", ["scaled", "s_col"], ["det"], axis=1),
        helper.make_node("ReduceSum", ["det", "zero"], ["total"], keepdims=0),
    ]
    inits = {"max_out": np.array([max_out], np.int64), "iou": np.array([0.5], np.float32),
             "thr": np.array([0.2], np.float32), "two": np.array(2, np.int64), "zero": np.array([0], np.int64),
             "one": np.array([1], np.int64), "flat": np.array([n], np.int64),
             "scale": np.array([2.0, 2.0, 3.0, 3.0], np.float32)}
    return nodes, inits


@pytest.mark.parametrize("target", TARGETS)
def test_detection_post_processing(target, tmp_path):
    """Acceptance: boxes -> NonMaxSuppression -> Gather(selected[:, 2]) -> box and score
    gathers -> arithmetic -> Concat, all on the data-dependent number of detections."""
    n = 200
    nodes, inits = detection_graph(n, 50)
    model = _model(nodes, {"boxes": (np.float32, (1, n, 4)), "scores": (np.float32, (1, 1, n))},
                   ["sel", "det", "total"], inits)
    feeds = [{"boxes": _boxes(n), "scores": RNG.random((1, 1, n)).astype(np.float32)} for _ in range(3)]
    feeds.append({"boxes": _boxes(n), "scores": np.zeros((1, 1, n), np.float32)})  # no detection
    feeds.append(feeds[0])  # back to a non-empty result after an empty one
    _check(model, target, tmp_path, feeds)


def test_constant_inputs_fold_at_import():
    x = np.array([[0, 1], [2, 0]], np.float32)
    model = _model([helper.make_node("NonZero", ["x"], ["y"]), helper.make_node("Unique", ["x"], ["u", "a", "b", "c"])],
                   {}, ["y", "u"], {"x": x})
    graph, params = kiln.frontend.from_onnx(model)
    assert not graph.data_dims
    assert "nonzero" not in graph.op_counts() and "unique" not in graph.op_counts()
