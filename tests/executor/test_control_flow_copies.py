"""What a runtime ``Loop`` / ``If`` copies (``kiln.runtime.control_flow``), vs ONNX Runtime.

The runners move only the valid sub-box of a value with symbolic dims, through NumPy views
taken once per loop; a body result that is one of the body's own arguments (a swap of two
carried values) is read whole before anything is written back. The padding of the parent's
storage is filled with NaN between runs, so a copy that read or wrote outside the box shows.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
h = onnx.helper
TP = onnx.TensorProto
F = TP.FLOAT
RNG = np.random.default_rng(3)


def _vi(name, shape, dt=F):
    return h.make_tensor_value_info(name, dt, shape)


def _swap_loop_model() -> onnx.ModelProto:
    """Carried (a, b) with dims (batch, seq, 8) -> (b, a) per iteration (both results are the
    body's own arguments), and a scan of b + 1."""
    body = h.make_graph(
        [h.make_node("Identity", ["c_in"], ["c_out"]), h.make_node("Add", ["b_in", "one"], ["scan"])],
        "body", [_vi("i", [], TP.INT64), _vi("c_in", [], TP.BOOL), _vi("a_in", None), _vi("b_in", None)],
        [_vi("c_out", [], TP.BOOL), _vi("b_in", None), _vi("a_in", None), _vi("scan", None)],
        initializer=[onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    g = h.make_graph(
        [h.make_node("Loop", ["M", "", "a0", "b0"], ["a", "b", "bs"], body=body)], "g",
        [_vi("M", [], TP.INT64), _vi("a0", ["batch", "seq", 8]), _vi("b0", ["batch", "seq", 8])],
        [_vi("a", ["batch", "seq", 8]), _vi("b", ["batch", "seq", 8]), _vi("bs", None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _poison_padding(gm: kiln.GraphModule) -> None:
    """NaN into all of every float entry but the params (valid data included: a run rewrites
    the valid box of what it reads first)."""
    ex = gm.module
    params = {ex.arg_eid[n] for n in ex.params}
    for e in range(ex.graph.num_entries):
        if e not in params and ex.graph.dltype[e] == "float32":
            ex.arrays[e].numpy(copy=False)[...] = np.nan


def test_loop_swapping_symbolic_carried_values_matches_ort() -> None:
    model = _swap_loop_model()
    mod, params = kiln.frontend.from_onnx(model, dim_ranges={"batch": (1, 3), "seq": (1, 20)})
    gm = kiln.GraphModule(kiln.build(mod, params=params, target="llvm")["default"](kiln.cpu()))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for m, b, s in [(3, 3, 20), (4, 1, 2), (5, 2, 9), (1, 3, 20)]:
        feeds = {"M": np.array(m, np.int64), "a0": RNG.standard_normal((b, s, 8)).astype(np.float32),
                 "b0": RNG.standard_normal((b, s, 8)).astype(np.float32)}
        _poison_padding(gm)
        gm.run(**feeds)
        for k, want in enumerate(sess.run(None, feeds)):
            got = gm.get_output(k).numpy()
            assert got.shape == want.shape, (k, got.shape, want.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"output {k} at M={m} {(b, s)}")
