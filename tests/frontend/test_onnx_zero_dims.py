"""MatMul / Gemm with a zero dimension build and run, giving what ONNX Runtime gives.

An empty M or N used to stop the build with "split ... factor/nparts must be >= 1" (the GEMM
schedule clamped its register tile to the empty extent); an empty K is a sum over nothing,
i.e. zeros (plus Gemm's C). Each case is compiled for the C and LLVM targets and compared with
ORT, including the result's shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.frontend import from_onnx
from tests.frontend.onnx_check import assert_close, make_model, run_ort


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# (op, attrs, runtime inputs' shapes, initializer shapes): covers the plain and packed
# (N >= 16) kernels, the few-row GEMV path (M <= 3, K >= 16), and batched matmul.
CASES = {
    "matmul-M0": ("MatMul", {}, {"a": (0, 4), "b": (4, 3)}, {}),
    "matmul-N0": ("MatMul", {}, {"a": (5, 4), "b": (4, 0)}, {}),
    "matmul-K0": ("MatMul", {}, {"a": (5, 0), "b": (0, 3)}, {}),
    "matmul-batch0": ("MatMul", {}, {"a": (0, 5, 4), "b": (4, 20)}, {}),
    "matmul-M0-packed": ("MatMul", {}, {"a": (2, 0, 8), "b": (2, 8, 32)}, {}),
    "dense-M0": ("Gemm", {"transB": 1}, {"a": (0, 4)}, {"b": (20, 4)}),
    "dense-M0-gemv": ("Gemm", {"transB": 1}, {"a": (0, 32)}, {"b": (5, 32)}),
    "dense-N0": ("Gemm", {"transB": 1}, {"a": (7, 4), "b": (0, 4)}, {}),
    "gemm-K0-bias": ("Gemm", {"beta": 2.0}, {"a": (7, 0), "b": (0, 20), "c": (20,)}, {}),
}


def _case_model(name):
    op, attrs, runtime, inits = CASES[name]
    feeds = {k: _rand(s, i) for i, (k, s) in enumerate(runtime.items())}
    weights = {k: _rand(s, 9) for k, s in inits.items()}
    names = list(runtime) + list(inits)
    order = sorted(names)  # a, b, c: the ONNX input order of both ops
    node = helper.make_node(op, order, ["y"], name=f"{op.lower()}_zero", **attrs)
    return make_model([node], feeds, ["y"], opset=13, initializers=weights), feeds


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("name", list(CASES))
def test_zero_dim_matmul_builds_and_matches_ort(name, target):
    model, feeds = _case_model(name)
    want = run_ort(model, feeds)[0]
    graph, params = from_onnx(model)
    lib = kiln.build(graph, target=target, params=params)
    m = kiln.GraphModule(lib["default"](kiln.cpu()))
    m.run(**feeds)
    got = m.get_output(0).numpy()
    assert_close(got, want, what=f"{name} on {target}")
