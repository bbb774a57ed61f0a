"""A real detection model end to end: torchvision's SSDlite (random weights) exported to ONNX,
compiled by Kiln for the CPU and compared with ONNX Runtime on the same file and input.

Its post-processing is the data-dependent part of dynamic shapes: per class NonZero of the
scores above a threshold, TopK of ``min(300, count)``, the concatenation over 90 classes, and
NonMaxSuppression behind an ``If`` on "no candidate". What a fair comparison is
(``bench/detection_onnx.py``): with random weights many class scores are tied to the last bits,
and a 1-ulp difference in the backbone or the softmax decides which of two equally scored,
overlapping boxes NMS keeps. So the network is compared through its head outputs (close), the
full model's detections by label and score (every ORT detection has a Kiln one of the same label
and score), and the post-processing alone on identical untied inputs (exact: same detections,
same order).

Heavy: one SSDlite build takes a few minutes on two cores.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import kiln
from bench.detection_onnx import (
    export,
    export_postprocess,
    import_torchvision,
    match,
    postprocess_feeds,
    with_head_outputs,
)
from tests.frontend.onnx_check import assert_close

pytestmark = pytest.mark.heavy

NAME = "ssdlite320_mobilenet_v3_large"
HW = 320


@pytest.fixture(scope="module")
def torchvision():
    pytest.importorskip("torch")
    try:
        return import_torchvision()
    except Exception as exc:  # noqa: BLE001 - any failure to import means no torchvision here
        pytest.skip(f"torchvision unusable: {type(exc).__name__}: {exc}")


def _library(path, tmp_path, shape=None):
    graph, params = kiln.frontend.from_onnx(str(path), shape=shape)
    so = str(tmp_path / (path.stem + ".so"))
    kiln.build(graph, target="llvm", params=params).export_library(so)
    return kiln.GraphModule(kiln.runtime.load_module(so)["default"](kiln.cpu()))


def _ort(path_or_model):
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    src = path_or_model.SerializeToString() if hasattr(path_or_model, "SerializeToString") else str(path_or_model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("score_thresh", [0.001, 0.0168])
def test_ssdlite_end_to_end(torchvision, tmp_path, score_thresh):
    """0.001: every anchor is a candidate (300 per class, 27000 into NMS, 300 kept);
    0.0168: a few dozen candidates."""
    path = tmp_path / f"ssd_{score_thresh:g}.onnx"
    export(NAME, score_thresh, path, HW)
    model = with_head_outputs(onnx.load(str(path)))
    onnx.save(model, str(path))
    m = _library(path, tmp_path, shape={"image": (1, 3, HW, HW)})
    x = np.random.default_rng(0).random((1, 3, HW, HW), dtype=np.float32)
    want = _ort(path).run(None, {"image": x})
    m.run(image=x)
    got = [m.get_output(i).numpy() for i in range(len(want))]
    # the network: class scores and decoded boxes before the selection
    assert_close(got[3], want[3], rtol=1e-4, atol=1e-6, what="class scores")
    assert_close(got[4], want[4], rtol=1e-4, atol=1e-3, what="decoded boxes")
    # the selection: as many detections, each of ORT's with a Kiln one of its label and score
    assert got[1].shape == want[1].shape and len(want[1]) > 0
    assert got[0].dtype == want[0].dtype and got[2].dtype == want[2].dtype
    scored, _, total = match(got[:3], want[:3], score_tol=1e-5)
    assert scored == total, f"{total - scored} of {total} ORT detections have no Kiln one of the same label and score"


def test_ssdlite_postprocessing_alone(torchvision, tmp_path):
    """The post-processing on identical inputs for both engines: with untied scores (random
    logits) the detections are the same, in the same order; the model's own head outputs give
    as many detections, matched by label and score."""
    path = tmp_path / "ssd_post.onnx"
    reg, logits, anchors = export_postprocess(NAME, 0.0168, path, HW)
    m = _library(path, tmp_path)
    sess = _ort(path)
    counts = []
    for what, feeds in postprocess_feeds(reg, logits, anchors):
        want = sess.run(None, feeds)
        m.run(**feeds)
        got = [m.get_output(i).numpy() for i in range(len(want))]
        counts.append(len(want[1]))
        if what == "head outputs":
            assert got[1].shape == want[1].shape
            scored, _, total = match(got, want, score_tol=1e-6)
            assert scored == total, what
            continue
        for i, name in enumerate(("boxes", "scores", "labels")):
            assert_close(got[i], want[i], rtol=1e-5, atol=1e-5, what=f"{what}: {name}")
    assert counts[1] == 300 and 0 < counts[2] <= 12  # the cap, and a few
