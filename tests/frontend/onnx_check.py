"""Helpers: build 1-node ONNX models, run them in ONNX Runtime and through Kiln, compare."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import kiln
from kiln.ir import evaluate

RTOL, ATOL = 1e-4, 1e-5


def np_to_onnx_type(dt: np.dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))


def make_model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray],
               outputs: Sequence[str], opset: int = 17,
               initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model whose runtime inputs are ``inputs`` (typed by the arrays)."""
    vis = [helper.make_tensor_value_info(k, np_to_onnx_type(v.dtype), v.shape)
           for k, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    g = helper.make_graph(list(nodes), "test", vis, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_kiln(model: onnx.ModelProto, feeds: dict[str, np.ndarray], freeze: Any = None,
             passes: bool = False) -> tuple[list[np.ndarray], Any]:
    mod, params = kiln.frontend.from_onnx(model, freeze=freeze)
    if passes:
        mod = kiln.transform.default_pipeline(params, opt_level=3)(mod)
        params = {}
    frozen = set(freeze) if isinstance(freeze, dict) else set()
    runtime = {k: v for k, v in feeds.items() if k not in frozen}
    return evaluate(mod, runtime, params), mod


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = RTOL, atol: float = ATOL,
                 what: str = "") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_node(op_type: str, inputs: dict[str, np.ndarray | None], attrs: dict | None = None,
               n_out: int = 1, opset: int = 17, const_inputs: Sequence[str] = (),
               rtol: float = RTOL, atol: float = ATOL, passes: bool = False,
               domain: str = "") -> Any:
    """One ``op_type`` node; ``inputs`` in order (``None`` = omitted optional input).

    Inputs named in ``const_inputs`` are fed as runtime inputs to ORT and frozen for Kiln
    (the ONNX node test-suite convention). Returns the Kiln graph.
    """
    names = [k if v is not None else "" for k, v in inputs.items()]
    while names and names[-1] == "":
        names.pop()
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}_node", domain=domain,
                            **(attrs or {}))
    feeds = {k: v for k, v in inputs.items() if v is not None}
    model = make_model([node], feeds, outs, opset)
    want = run_ort(model, feeds)
    freeze = {k: feeds[k] for k in const_inputs} or None
    got, mod = run_kiln(model, feeds, freeze=freeze, passes=passes)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol, atol, f"{op_type} opset {opset} output {i}")
    return mod


def rand(*shape: int, dtype: str = "float32", seed: int = 0, lo: float = -1.0,
         hi: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed + sum(shape) * 7 + len(shape))
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    return rng.uniform(lo, hi, size=shape).astype(dtype)
