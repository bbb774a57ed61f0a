"""Patterns of torchvision's detection post-processing, end to end against ONNX Runtime.

Exported detection models (``bench/detection_onnx.py``: SSDlite, RetinaNet, Faster R-CNN)
threshold their scores with ``NonZero``, keep the best ``min(k, n)`` with a ``TopK`` whose K
is computed at run time over that data-dependent count, concatenate the per-class candidates
and run ``NonMaxSuppression`` on them behind an ``If`` that returns an empty result when there
is no candidate, then keep ``keep[:detections_per_img]``; Faster R-CNN's RoI pooling scatters
each FPN level's rows back with ScatterElements. Each test here is one of those patterns as a
small graph, built once and run on several inputs (no candidate, a few, all of them), so the
same library serves every count.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln
from tests.frontend.onnx_check import assert_close, run_ort

RNG = np.random.default_rng(13)


def _model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
           for k, (dt, shape) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(nodes, "det", vis, outs, initializer=init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _check(model, tmp_path, feeds_list, target: str = "llvm") -> None:
    graph, params = kiln.frontend.from_onnx(model)
    lib = kiln.build(graph, target=target, params=params)
    path = str(tmp_path / "m.so")
    lib.export_library(path)
    m = kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))
    for feeds in feeds_list:
        want = run_ort(model, feeds)
        m.run(**feeds)
        for i, w in enumerate(want):
            assert_close(m.get_output(i).numpy(), w, what=f"output {i}")


def _threshold_topk(prefix: str, scores: str, boxes: str, k: int) -> list:
    """torchvision's per-class candidate selection: ``s = scores[scores > t]``, ``b = boxes[...]``,
    then ``s.topk(min(k, s.size(0)))`` and the boxes of those indices."""
    p = prefix
    return [
        helper.make_node("Greater", [scores, "thr"], [f"{p}mask"]),
        helper.make_node("NonZero", [f"{p}mask"], [f"{p}nz"]),
        helper.make_node("Transpose", [f"{p}nz"], [f"{p}nzt"], perm=[1, 0]),
        helper.make_node("GatherND", [scores, f"{p}nzt"], [f"{p}s"]),
        helper.make_node("GatherND", [boxes, f"{p}nzt"], [f"{p}b"]),
        helper.make_node("Shape", [f"{p}s"], [f"{p}shape"]),
        helper.make_node("Gather", [f"{p}shape", "zero"], [f"{p}n"], axis=0),
        helper.make_node("Unsqueeze", [f"{p}n", "axes0"], [f"{p}n1"]),
        helper.make_node("Concat", [f"k{k}", f"{p}n1"], [f"{p}kn"], axis=0),
        helper.make_node("ReduceMin", [f"{p}kn"], [f"{p}kmin"], keepdims=0),
        helper.make_node("Reshape", [f"{p}kmin", "shape1"], [f"{p}k"]),
        helper.make_node("TopK", [f"{p}s", f"{p}k"], [f"{p}top", f"{p}idx"]),
        helper.make_node("Gather", [f"{p}b", f"{p}idx"], [f"{p}topb"], axis=0),
    ]


_COMMON = {"thr": np.array(0.5, np.float32), "zero": np.array(0, np.int64), "axes0": np.array([0], np.int64),
           "shape1": np.array([1], np.int64)}


def test_topk_min_k_of_nonzero_count(tmp_path):
    """TopK with K = min(k, NonZero count) along the data-dependent axis: fewer candidates than
    k (K is the count), more (K is k), none (an empty result)."""
    n, k = 40, 6
    nodes = _threshold_topk("", "scores", "boxes", k)
    model = _model(nodes, {"scores": (np.float32, (n,)), "boxes": (np.float32, (n, 4))}, ["top", "idx", "topb"],
                   {**_COMMON, f"k{k}": np.array([k], np.int64)})
    boxes = RNG.random((n, 4)).astype(np.float32)
    feeds = [{"scores": RNG.random(n).astype(np.float32), "boxes": boxes},  # ~20 candidates: K = k
             {"scores": (RNG.random(n) * 0.53).astype(np.float32), "boxes": boxes},  # a few: K = count
             {"scores": np.zeros(n, np.float32), "boxes": boxes},  # none
             {"scores": np.ones(n, np.float32), "boxes": boxes}]  # all tie: lower indices first
    _check(model, tmp_path, feeds)


def _two_classes(k: int) -> list:
    """Per class c in (1, 2): the thresholded top-k of ``scores<c>`` (``c<c>top``, its boxes
    ``c<c>topb``) and ``full_like(c<c>top, c)`` (``c<c>lab``, Shape -> ConstantOfShape)."""
    nodes = []
    for c in (1, 2):
        nodes += _threshold_topk(f"c{c}", f"scores{c}", "boxes", k)
        nodes += [helper.make_node("Shape", [f"c{c}top"], [f"c{c}sh"]),
                  helper.make_node("ConstantOfShape", [f"c{c}sh"], [f"c{c}lab"],
                                   value=helper.make_tensor("v", TensorProto.INT64, [1], [c]))]
    return nodes


def test_labels_of_concatenated_classes(tmp_path):
    """Per class ``full_like(top_scores, class)`` (Shape -> ConstantOfShape over the TopK
    count), concatenated over the classes with their scores: the fill of a data-dependent
    length fused into the Concat must still know its own length."""
    n, k = 30, 5
    nodes = _two_classes(k)
    nodes += [helper.make_node("Concat", ["c1lab", "c2lab"], ["labels"], axis=0),
              helper.make_node("Concat", ["c1top", "c2top"], ["scores"], axis=0),
              helper.make_node("Concat", ["c1topb", "c2topb"], ["boxes_out"], axis=0)]
    model = _model(nodes, {"scores1": (np.float32, (n,)), "scores2": (np.float32, (n,)),
                           "boxes": (np.float32, (n, 4))}, ["labels", "scores", "boxes_out"],
                   {**_COMMON, f"k{k}": np.array([k], np.int64)})
    boxes = RNG.random((n, 4)).astype(np.float32)
    feeds = [{"scores1": RNG.random(n).astype(np.float32), "scores2": (RNG.random(n) * 0.55).astype(np.float32),
              "boxes": boxes},
             {"scores1": np.zeros(n, np.float32), "scores2": RNG.random(n).astype(np.float32), "boxes": boxes},
             {"scores1": np.zeros(n, np.float32), "scores2": np.zeros(n, np.float32), "boxes": boxes}]
    _check(model, tmp_path, feeds)


def _batched_nms_model(n: int, k: int, keep: int) -> onnx.ModelProto:
    """torchvision's ``batched_nms`` over the concatenated per-class candidates of two classes:
    ``if boxes.numel() == 0: keep = empty else: keep = nms(boxes + label * (max + 1), scores)``,
    then ``keep[:detections_per_img]`` and the gathers of the kept boxes, scores and labels."""
    nodes = _two_classes(k)
    nodes += [helper.make_node("Concat", ["c1topb", "c2topb"], ["cand_b"], axis=0),
              helper.make_node("Concat", ["c1top", "c2top"], ["cand_s"], axis=0),
              helper.make_node("Concat", ["c1lab", "c2lab"], ["cand_l"], axis=0),
              helper.make_node("Shape", ["cand_b"], ["cand_shape"]),
              helper.make_node("ReduceProd", ["cand_shape"], ["numel"], keepdims=0),
              helper.make_node("Equal", ["numel", "zero"], ["empty"])]
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["none"], value=numpy_helper.from_array(np.zeros(0, np.int64)))],
        "then", [], [helper.make_empty_tensor_value_info("none")])
    else_g = helper.make_graph([
        helper.make_node("ReduceMax", ["cand_b"], ["mx"], keepdims=0),
        helper.make_node("Cast", ["cand_l"], ["lf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["mx", "onef"], ["mx1"]),
        helper.make_node("Mul", ["lf", "mx1"], ["offs"]),
        helper.make_node("Unsqueeze", ["offs", "axes1"], ["offs2"]),
        helper.make_node("Add", ["cand_b", "offs2"], ["nms_b"]),
        helper.make_node("Unsqueeze", ["nms_b", "axes0"], ["nms_b3"]),
        helper.make_node("Unsqueeze", ["cand_s", "axes01"], ["nms_s3"]),
        helper.make_node("NonMaxSuppression", ["nms_b3", "nms_s3", "max_out", "iou"], ["sel"]),
        helper.make_node("Gather", ["sel", "two"], ["col"], axis=1),
        helper.make_node("Squeeze", ["col", "axes1"], ["kept"]),
    ], "else", [], [helper.make_empty_tensor_value_info("kept")])
    nodes += [helper.make_node("If", ["empty"], ["keep_all"], then_branch=then_g, else_branch=else_g),
              helper.make_node("Slice", ["keep_all", "s0", "s_end", "s0"], ["keep"]),
              helper.make_node("Gather", ["cand_b", "keep"], ["det_boxes"], axis=0),
              helper.make_node("Gather", ["cand_s", "keep"], ["det_scores"], axis=0),
              helper.make_node("Gather", ["cand_l", "keep"], ["det_labels"], axis=0)]
    inits = {**_COMMON, f"k{k}": np.array([k], np.int64), "onef": np.array(1.0, np.float32),
             "axes1": np.array([1], np.int64), "axes01": np.array([0, 1], np.int64),
             "max_out": np.array([np.iinfo(np.int64).max], np.int64), "iou": np.array([0.5], np.float32),
             "two": np.array([2], np.int64), "s0": np.array([0], np.int64), "s_end": np.array([keep], np.int64)}
    return _model(nodes, {"scores1": (np.float32, (n,)), "scores2": (np.float32, (n,)),
                          "boxes": (np.float32, (n, 4))}, ["det_boxes", "det_scores", "det_labels"], inits)


def _det_boxes(n: int) -> np.ndarray:
    xy = RNG.random((n, 2)).astype(np.float32) * 8
    return np.concatenate([xy, xy + RNG.random((n, 2)).astype(np.float32) * 3 + 0.5], axis=1)


def test_batched_nms_behind_an_emptiness_guard(tmp_path):
    """The runtime If reads data-dependent values (the candidates) and its else branch decides
    a data-dependent dim of its own (NonMaxSuppression's count over those symbolic-length
    boxes); its then branch is a constant. Then ``keep[:keep]`` slices that count with a static
    end that may be past it. Runs with no candidate at all (the guard's branch), with fewer kept
    detections than the slice end and with more."""
    n, k = 24, 8
    model = _batched_nms_model(n, k, keep=6)
    boxes = _det_boxes(n)
    feeds = [{"scores1": RNG.random(n).astype(np.float32), "scores2": RNG.random(n).astype(np.float32),
              "boxes": boxes},  # 16 candidates, more than 6 kept
             {"scores1": np.zeros(n, np.float32), "scores2": np.zeros(n, np.float32), "boxes": boxes},  # none
             {"scores1": np.where(np.arange(n) % 8 == 3, 0.9, 0.1).astype(np.float32),
              "scores2": np.zeros(n, np.float32), "boxes": boxes},  # 3 candidates: fewer than 6
             {"scores1": RNG.random(n).astype(np.float32), "scores2": RNG.random(n).astype(np.float32),
              "boxes": _det_boxes(n)},
             # scores of a few levels: ties everywhere, in TopK and in NonMaxSuppression (the
             # lower index first in both)
             {"scores1": (RNG.integers(1, 5, n) / 4).astype(np.float32),
              "scores2": (RNG.integers(1, 5, n) / 4).astype(np.float32), "boxes": _det_boxes(n)}]
    _check(model, tmp_path, feeds)


def test_slice_with_static_bounds_of_a_data_dependent_axis(tmp_path):
    """``x[b:e:s]`` along a NonZero count: whether ``e`` (or ``b``) is past the end is decided
    at run time, so the length is ``len(range(b, min(e, n), s))``."""
    n = 20
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Slice", ["nz", "b", "e", "axes", "st"], ["y"]),
             helper.make_node("Slice", ["nz", "zero1", "e2", "axes"], ["y2"])]
    inits = {"b": np.array([2], np.int64), "e": np.array([11], np.int64), "axes": np.array([1], np.int64),
             "st": np.array([3], np.int64), "zero1": np.array([0], np.int64), "e2": np.array([7], np.int64)}
    model = _model(nodes, {"x": (np.float32, (n,))}, ["y", "y2"], inits)
    feeds = [{"x": np.where(RNG.random(n) < p, 1.0, 0.0).astype(np.float32)} for p in (1.0, 0.5, 0.15)]
    feeds.append({"x": np.zeros(n, np.float32)})
    _check(model, tmp_path, feeds)


def test_guard_in_the_else_branch_with_two_outputs(tmp_path):
    """The same conversion with the constant branch second and two outputs: a scalar of the same
    dims in both branches (a select) and rows of a data-dependent count against a constant with
    a different number of rows."""
    n = 16
    then_g = helper.make_graph([
        helper.make_node("ReduceSum", ["vals", "zero1"], ["total"], keepdims=0),
        helper.make_node("Mul", ["vals", "two_f"], ["twice"]),
    ], "then", [], [helper.make_empty_tensor_value_info("total"), helper.make_empty_tensor_value_info("twice")])
    else_g = helper.make_graph([
        helper.make_node("Constant", [], ["t0"], value=numpy_helper.from_array(np.array(-1.0, np.float32))),
        helper.make_node("Constant", [], ["r0"], value=numpy_helper.from_array(np.full(3, 7.0, np.float32))),
    ], "else", [], [helper.make_empty_tensor_value_info("t0"), helper.make_empty_tensor_value_info("r0")])
    nodes = [helper.make_node("Greater", ["x", "thr"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["nzt"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "nzt"], ["vals"]),
             helper.make_node("Shape", ["vals"], ["sh"]),
             helper.make_node("ReduceProd", ["sh"], ["count"], keepdims=0),
             helper.make_node("Greater", ["count", "zero"], ["some"]),
             helper.make_node("If", ["some"], ["total_or", "rows_or"], then_branch=then_g, else_branch=else_g)]
    inits = {"thr": np.array(0.5, np.float32), "zero": np.array(0, np.int64), "zero1": np.array([0], np.int64),
             "two_f": np.array(2.0, np.float32)}
    model = _model(nodes, {"x": (np.float32, (n,))}, ["total_or", "rows_or"], inits)
    feeds = [{"x": RNG.random(n).astype(np.float32)}, {"x": np.zeros(n, np.float32)},
             {"x": np.ones(n, np.float32)}]
    _check(model, tmp_path, feeds)


def test_scatter_rows_of_each_level_back(tmp_path):
    """torchvision's ``_onnx_merge_levels`` (Faster R-CNN's RoI pooling over FPN levels): per
    level the rows ``where(levels == l)`` (a NonZero count) are computed apart and scattered back
    into a zero tensor with ScatterElements along that data-dependent axis."""
    n, c = 12, 3
    nodes = [helper.make_node("ConstantOfShape", ["res_shape"], ["res0"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))]
    for lv in (0, 1):
        p = f"l{lv}_"
        nodes += [helper.make_node("Equal", ["levels", f"lv{lv}"], [f"{p}eq"]),
                  helper.make_node("NonZero", [f"{p}eq"], [f"{p}nz"]),
                  helper.make_node("Reshape", [f"{p}nz", "col"], [f"{p}idx"]),
                  helper.make_node("Squeeze", [f"{p}idx", "axes1"], [f"{p}rows"]),
                  helper.make_node("Gather", ["feats", f"{p}rows"], [f"{p}sel"], axis=0),
                  helper.make_node("Mul", [f"{p}sel", f"scale{lv}"], [f"{p}upd"]),
                  helper.make_node("Shape", [f"{p}upd"], [f"{p}ush"]),
                  helper.make_node("Expand", [f"{p}idx", f"{p}ush"], [f"{p}index"]),
                  helper.make_node("ScatterElements", [f"res{lv}", f"{p}index", f"{p}upd"], [f"res{lv + 1}"],
                                   axis=0)]
    inits = {"res_shape": np.array([n, c], np.int64), "lv0": np.array(0, np.int64), "lv1": np.array(1, np.int64),
             "col": np.array([-1, 1], np.int64), "axes1": np.array([1], np.int64),
             "scale0": np.array(2.0, np.float32), "scale1": np.array(-3.0, np.float32)}
    model = _model(nodes, {"levels": (np.int64, (n,)), "feats": (np.float32, (n, c))}, ["res2"], inits)
    feats = RNG.standard_normal((n, c)).astype(np.float32)
    feeds = [{"levels": RNG.integers(0, 3, n), "feats": feats}, {"levels": np.zeros(n, np.int64), "feats": feats},
             {"levels": np.full(n, 2, np.int64), "feats": feats}]
    _check(model, tmp_path, feeds)
