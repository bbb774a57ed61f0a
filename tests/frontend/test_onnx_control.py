"""ONNX Loop with a compile-time trip count (unrolled at import) vs ONNX Runtime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime.errors import UnsupportedOpError
from tests.frontend.onnx_check import assert_close, make_model, rand, run_kiln, run_ort


def _body(scan: bool = True, stop_at: int | None = None):
    """Body: y = y * 2 + s (s from the outer scope); scans y and the iteration number.

    With ``stop_at``, the condition turns false after iteration ``stop_at``.
    """
    nodes = [
        helper.make_node("Mul", ["y_in", "two"], ["y2"]),
        helper.make_node("Add", ["y2", "s"], ["y_out"]),
        helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
    ]
    if stop_at is None:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes.append(helper.make_node("Less", ["i", "stop"], ["c_out"]))
    outs = [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_out", TensorProto.FLOAT, None)]
    if scan:
        outs += [helper.make_tensor_value_info("y_out", TensorProto.FLOAT, None),
                 helper.make_tensor_value_info("i_f", TensorProto.FLOAT, [])]
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    if stop_at is not None:
        inits.append(helper.make_tensor("stop", TensorProto.INT64, [], [stop_at]))
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", TensorProto.FLOAT, None)],
        outs, initializer=inits)


def _loop_model(scan: bool = True, stop_at: int | None = None):
    outs = ["y_final"] + (["y_scan", "i_scan"] if scan else [])
    node = helper.make_node("Loop", ["m", "cond", "y0"], outs, body=_body(scan, stop_at))
    feeds = {"m": np.array(4, np.int64), "cond": np.array(True), "y0": rand(2, 3),
             "s": rand(2, 3, seed=5)}
    return make_model([node], feeds, outs, opset=17), feeds


@pytest.mark.parametrize("scan,stop_at", [(True, None), (False, None), (True, 1)])
def test_loop_unrolled_matches_ort(scan, stop_at):
    model, feeds = _loop_model(scan, stop_at)
    want = run_ort(model, feeds)
    got, mod = run_kiln(model, feeds, freeze={"m": feeds["m"], "cond": feeds["cond"]})
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"Loop output {i}")
    # y0 and s stay runtime inputs: the unrolled body is real computation, not a constant.
    assert mod.input_names == ["y0", "s"]
    assert sum(n.op == "multiply" for n in mod.nodes) == (2 if stop_at == 1 else 4)


def test_loop_through_the_backend_compiles():
    from kiln.frontend.onnx_backend import KilnBackend

    model, feeds = _loop_model()
    del model.graph.output[:]
    model.graph.output.extend([
        helper.make_tensor_value_info("y_final", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("y_scan", TensorProto.FLOAT, [4, 2, 3]),
        helper.make_tensor_value_info("i_scan", TensorProto.FLOAT, [4])])
    rep = KilnBackend.prepare(model, "CPU")
    got = rep.run([feeds[k] for k in ("m", "cond", "y0", "s")])
    for g, w in zip(got, run_ort(model, feeds)):
        assert_close(g, w)


def test_loop_runtime_trip_count_is_unsupported():
    model, _ = _loop_model()
    with pytest.raises(UnsupportedOpError, match="trip count M must be a constant"):
        kiln.frontend.from_onnx(model, freeze={"cond": np.array(True)})


def test_loop_body_ops_are_checked_up_front():
    body = helper.make_graph(
        [helper.make_node("NoSuchOp", ["y_in"], ["y_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, None)])
    node = helper.make_node("Loop", ["m", "", "y0"], ["y"], body=body)
    model = make_model([node], {"m": np.array(2, np.int64), "y0": rand(3)}, ["y"])
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):
        kiln.frontend.from_onnx(model, freeze={"m": np.array(2, np.int64)})
