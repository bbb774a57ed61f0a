"""ResNet-18 and a MiniLM-L6-sized BERT encoder run from C (no Python in the process) and match
ONNX Runtime."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import kiln
from tests.capi.test_c_api import EXAMPLE, _cc, _run, _write_inputs
from tests.models import real_models

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["resnet18", "minilm"])
def test_real_model_from_c_matches_onnxruntime(tmp_path, name):
    ort = pytest.importorskip("onnxruntime")
    path, feeds = getattr(real_models, name)()
    tmp = str(tmp_path)
    t0 = time.perf_counter()
    graph, params = kiln.frontend.from_onnx(path)
    lib = kiln.build(graph, params=params, target="llvm").export_library(os.path.join(tmp, f"{name}.so"))
    build_s = time.perf_counter() - t0
    exe = _cc(os.path.join(tmp, "run_model"), EXAMPLE, "-ldl")
    proc = _run([exe, lib, *_write_inputs(tmp, feeds), "--out", os.path.join(tmp, "out")])
    assert proc.returncode == 0, proc.stderr
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = np.fromfile(os.path.join(tmp, "out0.bin"), dtype=want.dtype).reshape(want.shape)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-4, f"{name}: relative error {err:.2e} (build + export {build_s:.1f} s)"
