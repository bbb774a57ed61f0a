"""CUDA tests that need a real NVIDIA GPU; each skips with a reason when there is none.

Run them on a GPU machine with ``python -m pytest -q tests/cuda -m gpu`` (they are also in
the normal run, where they skip). Models are compared with ONNX Runtime (CPU) at
``rtol=1e-3, atol=1e-4``, the tolerance of the OpenCL model tests.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from tests.cuda.resnet_onnx import resnet18, resnet50
from tests.repo_scripts import load_repo_script

pytestmark = pytest.mark.gpu
RTOL, ATOL = 1e-3, 1e-4


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _run_cuda(model, feeds, tmp_path, target="cuda"):
    shapes = {k: v.shape for k, v in feeds.items()}
    mod, params = kiln.frontend.from_onnx(model, shape=shapes)
    path = str(tmp_path / "model_cuda.so")
    kiln.build(mod, target=target, params=params).export_library(path)
    lib = kiln.runtime.load_module(path)
    g = kiln.GraphModule(lib["default"](kiln.cuda()))
    g.run(**feeds)
    return [g.get_output(i).numpy() for i in range(g.get_num_outputs())], g


def test_device_api_roundtrip(needs_gpu) -> None:
    dev = kiln.cuda()
    assert dev.exist and dev.warp_size == 32 and dev.get_attr("total_global_memory") > 0
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    a = kiln.nd.array(x, device=dev)
    b = kiln.nd.empty(x.shape, "float32", device=dev)
    b.copyfrom(a)
    np.testing.assert_array_equal(b.numpy(), x)


def test_kernel_runs(needs_gpu, needs_nvrtc) -> None:
    from kiln import te
    from kiln.codegen.cuda import build_cuda
    from kiln.te.schedule import thread_axis
    from kiln.te.lower_schedule import lower

    n = 100_003
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: te.exp(A[i]) * B[i] + te.tanh(A[i]), name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=256)
    s[C].bind(xo, thread_axis("blockIdx.x"))
    s[C].bind(xi, thread_axis("threadIdx.x"))
    mod = build_cuda([lower(s, [A, B, C], name="k")], "cuda")
    r = np.random.default_rng(1)
    x, y = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
    dev = kiln.cuda()
    out = kiln.nd.empty((n,), "float32", device=dev)
    mod["k"](kiln.nd.array(x, device=dev), kiln.nd.array(y, device=dev), out)
    np.testing.assert_allclose(out.numpy(), np.exp(x) * y + np.tanh(x), rtol=1e-5, atol=1e-6)


def test_resnet18_matches_onnxruntime(needs_gpu, needs_nvrtc, tmp_path) -> None:
    model, feeds = resnet18(hw=224)
    out, _ = _run_cuda(model, feeds, tmp_path)
    np.testing.assert_allclose(out[0], _ort(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_resnet50_matches_onnxruntime(needs_gpu, needs_nvrtc, tmp_path) -> None:
    model, feeds = resnet50(hw=224)
    out, _ = _run_cuda(model, feeds, tmp_path)
    np.testing.assert_allclose(out[0], _ort(model, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_minilm_matches_onnxruntime(needs_gpu, needs_nvrtc, tmp_path) -> None:
    """all-MiniLM-L6-v2 from ``bench/models.py`` (needs torch and the weights package)."""
    pytest.importorskip("torch")
    try:
        import onnx

        bench_models = load_repo_script("bench/models.py")
        path = bench_models.export("minilm", str(tmp_path / "onnx"))
    except Exception as err:  # noqa: BLE001 - bench/ or the weights package may be absent
        pytest.skip(f"MiniLM export unavailable: {err}")
    model = onnx.load(str(path))
    feeds = bench_models.model_specs()["minilm"]["inputs"]
    out, _ = _run_cuda(model, feeds, tmp_path)
    np.testing.assert_allclose(out[0], _ort(model, feeds)[0], rtol=RTOL, atol=ATOL)
