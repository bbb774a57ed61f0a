"""Real models with dynamic dimensions: ONE library, checked against ONNX Runtime at many shapes
in a fresh process (the acceptance check of dynamic shapes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kiln
from tests.models import real_models

ort = pytest.importorskip("onnxruntime")

CHECK = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxruntime as ort
    import kiln
    from tests.models.real_models import minilm_feeds

    lib, onnx_path, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    m = kiln.GraphModule(kiln.runtime.load_module(lib)["default"](kiln.cpu()))
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    worst = 0.0
    for k, (b, s) in enumerate(shapes):
        feeds = minilm_feeds(b, s, seed=k)
        m.run(**feeds)
        got = m.get_output(0).numpy()
        ref = sess.run(None, feeds)[0]
        assert got.shape == ref.shape == (b, s, 384), (got.shape, ref.shape)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"shape {(b, s)}")
        worst = max(worst, float(np.abs(got - ref).max()))
    print("SHAPES OK", len(shapes), worst)
    """
)


@pytest.fixture(scope="module")
def minilm_lib(tmp_path_factory):
    """A MiniLM-sized BERT (``transformers``, random weights) built ONCE for batch 1..8 x seq 1..256."""
    import onnx

    path = real_models.minilm_dynamic()
    graph, params = kiln.frontend.from_onnx(onnx.load(path), dim_ranges={"batch": (1, 8), "seq": (1, 256)})
    assert graph.inputs[0].type.dims == ("batch", "seq")
    lib = str(tmp_path_factory.mktemp("minilm_dyn") / "minilm_dyn.so")
    kiln.build(graph, target="llvm", params=params).export_library(lib)
    return lib, path


def _check_in_fresh_process(lib: str, path: str, shapes: list[tuple[int, int]]) -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK, lib, path, json.dumps(shapes)], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0 and f"SHAPES OK {len(shapes)}" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-4000:]


def test_minilm_dynamic_batch_and_sequence(minilm_lib):
    # the corners and a few sizes between; the 20-shape check is the heavy test below
    _check_in_fresh_process(*minilm_lib, [(1, 1), (8, 256), (1, 128), (3, 77), (2, 5), (5, 200)])


@pytest.mark.heavy
def test_minilm_twenty_random_shapes_one_library(minilm_lib):
    rng = np.random.default_rng(7)
    shapes = [(int(rng.integers(1, 9)), int(rng.integers(1, 257))) for _ in range(20)]
    _check_in_fresh_process(*minilm_lib, shapes)


def test_resnet18_dynamic_batch(tmp_path):
    import onnx

    path = real_models.resnet18_dynamic()
    graph, params = kiln.frontend.from_onnx(onnx.load(path), dim_ranges={"batch": (1, 16)})
    lib = kiln.build(graph, target="llvm", params=params)
    lib.export_library(str(tmp_path / "r18.so"))
    m = kiln.GraphModule(kiln.runtime.load_module(str(tmp_path / "r18.so"))["default"](kiln.cpu()))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 3, 224, 224)).astype("float32")
        m.run(data=x)
        got = m.get_output(0).numpy()
        ref = sess.run(None, {"data": x})[0]
        assert got.shape == (b, 1000)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
