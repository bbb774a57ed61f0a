"""torchvision detection models (random weights) exported to ONNX, compiled by Kiln on the CPU,
compared with ONNX Runtime.

The post-processing of these models is the data-dependent part of Kiln's dynamic-shape support
(``docs/dynamic_shapes.md``): per class, ``scores > score_thresh`` (NonZero), the best
``min(topk_candidates, n)`` of those (a TopK whose K is computed at run time along the NonZero
count), the concatenation over the classes, and ``batched_nms`` (NonMaxSuppression behind an
``If`` that returns an empty result when there is no candidate), then ``keep[:detections_per_img]``.

Weights are random (``weights=None, weights_backbone=None``: nothing is downloaded); the
BatchNorm statistics are randomized too (:func:`make_model`: with fresh ones every SSDlite score is
exactly ``1 / num_classes``). ``--score-thresh`` picks how many candidates survive the threshold
(SSDlite: ``0.001`` keeps all of them, 300 per class and 27000 into NMS, the largest
post-processing; ``0.0168`` a few dozen). Each model is exported with the TorchScript exporter
(``dynamo=False``, opset 17) and, if that fails, with the dynamo exporter.

The comparison with ONNX Runtime (same ONNX file, same input). Many scores of these random
models are tied to the last bits (saturated activations give many anchors the same logits), and
a 1-ulp difference in the backbone or the softmax (Kiln's ``exp`` is not ORT's) decides which of
two equally scored, overlapping boxes NMS keeps, or which of equal scores comes first. A fair
comparison separates the network from the selection:

* **head outputs** (SSD models): the class scores (the Softmax) and the decoded boxes are extra
  outputs of the same model (:func:`with_head_outputs`), compared within
  ``atol + rtol * |ref|`` (``bench.common.compare``);
* **detections**: ``exact`` (same count, boxes and scores within tolerance, labels equal, same
  order), and the tolerant :func:`match`: every ORT detection with a Kiln detection of the same
  label and a score within ``--score-tol`` -- and, counted apart, the same box too;
* **post-processing alone** (SSD models, :func:`export_postprocess`): the selection exported as a
  model of its own, fed identical inputs -- the model's head outputs (ties), random logits (no
  ties: must be exact, same detections in the same order) and random logits with 12 outstanding
  scores (a few detections).

RetinaNet's random-weight scores saturate (the sigmoid of large logits: every score is 1.0 to
the last bit at ``--score-thresh 0.001``), so for it only the number of detections and their
labels and scores compare; Faster R-CNN's compare box by box.

The installed torchvision may be a build for another torch (its C++ ops fail to load: "operator
torchvision::nms does not exist"). Then :func:`import_torchvision` defines ``torchvision::nms``
(greedy NMS) and ``torchvision::roi_align`` (torchvision's own Python fallback) with
``torch.library`` before importing it, which is all the export needs: the exporter maps those
ops to ONNX NonMaxSuppression / RoiAlign.

Usage::

    KILN_NUM_THREADS=1 python bench/detection_onnx.py [--models ssdlite320_mobilenet_v3_large]
        [--score-thresh 0.001,0.0168] [--threads 1] [--rounds 5] [--out bench/out]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench.common from anywhere

from bench.common import DEFAULT_OUT, compare, ort_session  # noqa: E402

MODELS = ("ssdlite320_mobilenet_v3_large", "retinanet_resnet50_fpn", "fasterrcnn_mobilenet_v3_large_320_fpn")
HW = {"ssdlite320_mobilenet_v3_large": 320, "retinanet_resnet50_fpn": 320,
      "fasterrcnn_mobilenet_v3_large_320_fpn": 320}
_SHIM: Any = None  # keeps the torch.library of the Python NMS alive


def _nms_python(boxes: Any, scores: Any, iou_threshold: float) -> Any:
    """torchvision's ``nms`` (greedy, best score first, ties by index) in torch ops."""
    import torch

    order = torch.argsort(scores, descending=True, stable=True)
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(order.numel(), dtype=torch.bool)
    keep: list[int] = []
    for a in range(order.numel()):
        if bool(suppressed[a]):
            continue
        i = order[a]
        keep.append(int(i))
        rest = order[a + 1:]
        w = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest])).clamp(min=0)
        h = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest])).clamp(min=0)
        inter = w * h
        suppressed[a + 1:] |= inter / (area[i] + area[rest] - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.int64)


def _has_ops() -> bool:  # a def, not a lambda: TorchScript compiles it when tracing batched_nms
    return True


def _has_native_nms() -> bool:
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018 - resolving the op is the check
    except (AttributeError, RuntimeError):
        return False
    return True


def import_torchvision() -> Any:
    """``torchvision``, with ``torchvision::nms`` defined in Python when its C++ ops do not load."""
    global _SHIM
    import torch

    try:
        tv = importlib.import_module("torchvision")
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        tv = None
    if tv is not None and (_SHIM is not None or _has_native_nms()):
        # (imported before, e.g. by another test in this process: a failed first import leaves
        # a module without its ops in sys.modules, so check the op, not the import)
        return tv
    for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[k]
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
               "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")
    lib.impl("nms", _nms_python, "CPU")
    _SHIM = lib
    tv = importlib.import_module("torchvision")
    # torchvision's Python wrappers (ops.nms, ops.roi_align) check this before calling
    # torch.ops.torchvision.*; roi_align.py imported it by name
    for mod in ("torchvision.extension", "torchvision.ops.roi_align"):
        m: Any = importlib.import_module(mod)
        m._has_ops = _has_ops
    # RoIAlign's CPU kernel: torchvision's own Python fallback, without its torch.compile wrapper
    # (the TorchScript exporter cannot trace a compiled function)
    ra: Any = importlib.import_module("torchvision.ops.roi_align")
    lib.impl("roi_align", getattr(ra._roi_align, "__wrapped__", ra._roi_align), "CPU")
    return tv


class _Detections:
    """``model([image])[0]`` as a tuple ``(boxes, scores, labels)`` for a ``(1, 3, H, W)`` input."""

    @staticmethod
    def wrap(model: Any) -> Any:
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = model

            def forward(self, x: Any) -> Any:
                d = self.m([x[0]])[0]
                return d["boxes"], d["scores"], d["labels"]

        return Wrapper().eval()


def make_model(name: str, score_thresh: float, seed: int = 0) -> Any:
    """The torchvision detection model ``name`` with random weights, in eval mode."""
    import torch

    tv = import_torchvision()
    torch.manual_seed(seed)
    m = getattr(tv.models.detection, name)(weights=None, weights_backbone=None)
    m.eval()
    # fresh BatchNorms (mean 0, var 1, weight 1, bias 0) leave SSDlite's untrained backbone with
    # features of exactly 0, and every class score comes out exactly 1 / num_classes (all ties);
    # random statistics spread the scores like a trained model's
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                assert mod.running_mean is not None and mod.running_var is not None
                mod.running_mean.uniform_(-0.3, 0.3, generator=g)
                mod.running_var.uniform_(0.5, 1.5, generator=g)
                if mod.affine:
                    mod.weight.uniform_(0.5, 1.5, generator=g)
                    mod.bias.uniform_(-0.2, 0.2, generator=g)
    if hasattr(m, "score_thresh"):
        m.score_thresh = score_thresh
    elif hasattr(m, "roi_heads"):
        m.roi_heads.score_thresh = score_thresh
    return m


def export(name: str, score_thresh: float, path: Path, hw: int) -> str:
    """Export to ``path``; returns which exporter succeeded."""
    import torch

    w = _Detections.wrap(make_model(name, score_thresh))
    x = torch.rand(1, 3, hw, hw)
    try:
        torch.onnx.export(w, (x,), str(path), dynamo=False, opset_version=17, input_names=["image"],
                          output_names=["boxes", "scores", "labels"])
        return "torchscript"
    except Exception as exc:  # noqa: BLE001 - fall back to the other exporter, report both
        print(f"  TorchScript export failed ({type(exc).__name__}: {str(exc)[:200]}); trying dynamo", flush=True)
    torch.onnx.export(w, (x,), str(path), dynamo=True, opset_version=17, input_names=["image"],
                      output_names=["boxes", "scores", "labels"])
    return "dynamo"


def with_head_outputs(model: Any) -> Any:
    """The exported SSD model with two more outputs, the head's results before the data-dependent
    post-processing: ``class_scores`` (the Softmax, ``(1, anchors, classes)``) and
    ``decoded_boxes`` (``(anchors, 4)``, the value every class's box GatherND reads)."""
    import collections

    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    soft = [n.output[0] for n in g.node if n.op_type == "Softmax"]
    gathered = collections.Counter(n.input[0] for n in g.node if n.op_type == "GatherND")
    if len(soft) != 1 or not gathered:
        raise ValueError("not an SSD export: expected one Softmax and the GatherNDs of the per-class selection")
    boxes = gathered.most_common(1)[0][0]
    for name, src in (("class_scores", soft[0]), ("decoded_boxes", boxes)):
        g.node.append(onnx.helper.make_node("Identity", [src], [name]))
        g.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return m


def export_postprocess(name: str, score_thresh: float, path: Path, hw: int) -> tuple[np.ndarray, ...]:
    """Export the post-processing of an SSD model alone (``postprocess_detections``: softmax,
    box decoding, per-class thresholding and top-k, ``batched_nms``), with inputs
    ``bbox_regression (1, A, 4)``, ``cls_logits (1, A, C)`` and ``anchors (A, 4)``; returns the
    model's own head outputs and anchors on a random image (inputs a test can feed both engines)."""
    import torch

    m = make_model(name, score_thresh)
    if not hasattr(m, "box_coder") or not hasattr(m.head, "classification_head") or not hasattr(m, "anchor_generator"):
        raise ValueError(f"{name}: the post-processing-only export is written for SSD models")

    class Post(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, bbox_regression: Any, cls_logits: Any, anchors: Any) -> Any:
            head = {"bbox_regression": bbox_regression, "cls_logits": cls_logits}
            d = self.m.postprocess_detections(head, [anchors], [(hw, hw)])[0]
            return d["boxes"], d["scores"], d["labels"]

    x = torch.from_numpy(np.random.default_rng(0).random((1, 3, hw, hw), dtype=np.float32))
    with torch.no_grad():
        images, _ = m.transform([x[0]])
        feats = list(m.backbone(images.tensors).values())
        head = m.head(feats)
        anchors = m.anchor_generator(images, feats)[0]
    ins = (head["bbox_regression"], head["cls_logits"], anchors)
    torch.onnx.export(Post().eval(), ins, str(path), dynamo=False, opset_version=17,
                      input_names=["bbox_regression", "cls_logits", "anchors"],
                      output_names=["boxes", "scores", "labels"])
    return tuple(t.numpy() for t in ins)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each box of ``a`` (n, 4) with each of ``b`` (m, 4), x1 y1 x2 y2."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area = lambda z: np.prod(z[:, 2:] - z[:, :2], axis=1)  # noqa: E731
    return inter / np.maximum(area(a)[:, None] + area(b)[None, :] - inter, 1e-12)


def match(got: Sequence[np.ndarray], want: Sequence[np.ndarray], score_tol: float) -> tuple[int, int, int]:
    """Tolerant detection matching: ``(ORT detections with a Kiln detection of the same label
    and a score within score_tol, those of them whose box matches too (IoU above 0.99), ORT
    detections)``; each of Kiln's detections is used once.

    Near-tied scores (within the last bits) make the engines pick different boxes of the same
    score, or keep a different one of two overlapping boxes; the first count forgives that, the
    second does not."""
    gb, gs, gl = (np.asarray(v) for v in got)
    wb, ws, wl = (np.asarray(v) for v in want)
    iou = _iou(wb.astype(np.float64), gb.astype(np.float64)) if len(gb) and len(wb) else np.zeros((len(wb), 0))
    counts = []
    for need_box in (False, True):
        used = np.zeros(len(gs), dtype=bool)
        hit = 0
        for i in range(len(ws)):
            ok = (~used) & (gl == wl[i]) & (np.abs(gs - ws[i]) <= score_tol)
            if need_box:
                ok &= iou[i] > 0.99
            j = np.flatnonzero(ok)
            if j.size:
                used[j[np.argmin(np.abs(gs[j] - ws[i]))]] = True
                hit += 1
        counts.append(hit)
    return counts[0], counts[1], len(ws)


def run_one(name: str, score_thresh: float, out_dir: Path, threads: int, rounds: int,
            score_tol: float, post: bool = False, target: str = "llvm -mcpu=native") -> dict[str, Any]:
    """Export, build, run and compare one model at one score threshold."""
    import kiln

    hw = HW[name]
    tag = f"{name}_t{score_thresh:g}"
    onnx_path = out_dir / f"{tag}.onnx"
    t0 = time.perf_counter()
    exporter = export(name, score_thresh, onnx_path, hw)
    res: dict[str, Any] = {"model": name, "score_thresh": score_thresh, "exporter": exporter,
                           "export_s": time.perf_counter() - t0}
    if name.startswith("ssd"):  # the head's outputs too, to compare the network apart from the selection
        import onnx

        onnx_path = out_dir / f"{tag}_heads.onnx"
        onnx.save(with_head_outputs(onnx.load(str(out_dir / f"{tag}.onnx"))), str(onnx_path))
    rng = np.random.default_rng(0)
    x = rng.random((1, 3, hw, hw), dtype=np.float32)
    sess = ort_session(onnx_path, threads)
    want = sess.run(None, {"image": x})
    t0 = time.perf_counter()
    graph, params = kiln.frontend.from_onnx(str(onnx_path), shape={"image": (1, 3, hw, hw)}, dtype="float32")
    res["import_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lib = kiln.build(graph, target=target, params=params)
    res["build_s"] = time.perf_counter() - t0
    so = out_dir / f"{tag}.so"
    lib.export_library(str(so))
    m = kiln.GraphModule(kiln.runtime.load_module(str(so))["default"](kiln.cpu()))
    m.run(image=x)
    got = [m.get_output(i).numpy() for i in range(len(want))]
    res["detections"] = (len(got[1]), len(want[1]))
    chk = compare(got[:3], want[:3])
    res["exact"] = chk.ok
    res["max_abs"] = chk.max_abs
    res["matched"] = match(got[:3], want[:3], score_tol)
    if len(want) > 3:
        res["heads"] = compare(got[3:], want[3:])
    kt, ot = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        m.run(image=x)
        kt.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sess.run(None, {"image": x})
        ot.append(time.perf_counter() - t0)
    res["kiln_ms"] = 1e3 * float(np.median(kt))
    res["ort_ms"] = 1e3 * float(np.median(ot))
    if post:
        res["post"] = run_postprocess(name, score_thresh, out_dir, threads, hw, target)
    return res


def postprocess_feeds(reg: np.ndarray, logits: np.ndarray, anchors: np.ndarray) -> list[tuple[str, dict]]:
    """Inputs of the post-processing-only model: the model's own head outputs (many near-tied
    scores), random logits (no ties: the comparison must be exact), and random logits of which
    12 (anchor, class) pairs stand out (a score near 0.38 against 1 / classes for the others:
    a few detections at a threshold between the two)."""
    rng = np.random.default_rng(1)
    reg_r = rng.normal(0, 1, reg.shape).astype(np.float32)
    few = rng.normal(0, 0.02, logits.shape).astype(np.float32)
    few[0, rng.choice(logits.shape[1], 12, replace=False), rng.integers(1, logits.shape[2], 12)] = 4.0
    return [("head outputs", {"bbox_regression": reg, "cls_logits": logits, "anchors": anchors}),
            ("random logits", {"bbox_regression": reg_r,
                               "cls_logits": rng.normal(0, 2, logits.shape).astype(np.float32), "anchors": anchors}),
            ("random logits, 12 standing out", {"bbox_regression": reg_r, "cls_logits": few, "anchors": anchors})]


def run_postprocess(name: str, score_thresh: float, out_dir: Path, threads: int, hw: int,
                    target: str = "llvm -mcpu=native") -> list[tuple]:
    """The post-processing alone, on identical inputs for both engines: the model's own head
    outputs, and logits drawn at random (scores without ties). Returns, per input,
    ``(what, kiln detections, ort detections, exact)``."""
    import kiln

    path = out_dir / f"{name}_t{score_thresh:g}_post.onnx"
    reg, logits, anchors = export_postprocess(name, score_thresh, path, hw)
    graph, params = kiln.frontend.from_onnx(str(path))
    so = out_dir / f"{name}_t{score_thresh:g}_post.so"
    kiln.build(graph, target=target, params=params).export_library(str(so))
    m = kiln.GraphModule(kiln.runtime.load_module(str(so))["default"](kiln.cpu()))
    sess = ort_session(path, threads)
    out = []
    for what, feeds in postprocess_feeds(reg, logits, anchors):
        want = sess.run(None, feeds)
        m.run(**feeds)
        got = [m.get_output(i).numpy() for i in range(len(want))]
        exact = all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want)) and \
            compare(got, want).ok and all(np.array_equal(g, w) for g, w in zip(got[2:], want[2:]))
        out.append((what, len(got[1]), len(want[1]), exact))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=MODELS[0], help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--score-thresh", default="0.001,0.0168",
                    help="comma-separated score thresholds (SSDlite: 0.001 keeps every candidate, 0.0168 a few "
                         "dozen)")
    ap.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (set KILN_NUM_THREADS too)")
    ap.add_argument("--rounds", type=int, default=5, help="timed runs of each engine (medians)")
    ap.add_argument("--score-tol", type=float, default=1e-4, help="score tolerance of the tolerant matching")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--target", default="llvm -mcpu=native",
                    help="Kiln's target (ONNX Runtime picks its kernels for this CPU too)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KILN_NUM_THREADS", str(args.threads))
    for name in args.models.split(","):
        for t in (float(v) for v in args.score_thresh.split(",")):
            print(f"{name} score_thresh={t:g}", flush=True)
            try:
                r = run_one(name, t, args.out, args.threads, args.rounds, args.score_tol,
                            post=name.startswith("ssd"), target=args.target)
            except Exception as exc:  # noqa: BLE001 - report and go on with the next model
                print(f"  FAILED: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
                continue
            scored, boxed, total = r["matched"]
            print(f"  exporter {r['exporter']} ({r['export_s']:.1f} s), import {r['import_s']:.1f} s, "
                  f"build {r['build_s']:.1f} s", flush=True)
            print(f"  detections kiln/ort {r['detections'][0]}/{r['detections'][1]}; exact: {r['exact']} "
                  f"(max abs diff {r['max_abs']:.3g}); ORT detections with a Kiln one of the same label and "
                  f"score: {scored}/{total}, and box too: {boxed}/{total}", flush=True)
            print(f"  latency (median of {args.rounds}): kiln {r['kiln_ms']:.1f} ms, ort {r['ort_ms']:.1f} ms",
                  flush=True)
            if "heads" in r:
                h = r["heads"]
                print(f"  head outputs (class scores, decoded boxes): max abs diff {h.max_abs:.3g}, "
                      f"max rel diff {h.max_rel:.3g}, within tolerance: {h.ok}", flush=True)
            for what, nk, no, exact in r.get("post", []):
                print(f"  post-processing alone on {what}: detections kiln/ort {nk}/{no}, exact: {exact}", flush=True)


if __name__ == "__main__":
    main()
