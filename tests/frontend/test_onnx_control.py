"""ONNX Loop with a compile-time trip count (unrolled at import) and If with a condition known at
import (the chosen branch inlined), vs ONNX Runtime; decided at run time they become IR ``loop`` /
``if`` nodes (built and run end to end in ``tests/executor/test_control_flow.py``)."""

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


@pytest.mark.parametrize("m", [4, 1])
def test_loop_runtime_trip_count_with_scan_outputs(m):
    """The scan outputs' length is the data-dependent iteration count (built and run end to end
    in ``tests/executor/test_loop_scan.py``)."""
    model, feeds = _loop_model()
    feeds["m"] = np.array(m, np.int64)
    got, mod = run_kiln(model, feeds, freeze={"cond": np.array(True)})
    (loop,) = [n for n in mod.nodes if n.op == "loop"]
    assert loop.attrs["num_scan"] == 2 and mod.dim_ranges[loop.attrs["out_dim"]][0] == 0
    for k, (g, w) in enumerate(zip(got, run_ort(model, feeds))):
        assert_close(g, w, what=f"Loop output {k}")


@pytest.mark.parametrize("m,stop_at", [(4, None), (0, None), (6, 2)])
def test_loop_decided_at_run_time_becomes_a_loop_node(m, stop_at):
    model, feeds = _loop_model(scan=False, stop_at=stop_at)
    feeds["m"] = np.array(m, np.int64)
    got, mod = run_kiln(model, feeds)
    assert [n.op for n in mod.nodes if n.op != "constant"] == ["loop"]
    assert_close(got[0], run_ort(model, feeds)[0], what="Loop output")


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


def _if_model():
    """y = x * 3 if x.shape[1] > 2 else x - 1: the condition comes from a shape, as exporters emit."""
    def branch(name, op, const):
        return helper.make_graph(
            [helper.make_node(op, ["x", name + "_c"], [name + "_y"])], name, [],
            [helper.make_tensor_value_info(name + "_y", TensorProto.FLOAT, None)],
            initializer=[helper.make_tensor(name + "_c", TensorProto.FLOAT, [], [const])])
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "one"], ["d1"], axis=0),
        helper.make_node("Greater", ["d1", "two"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Mul", 3.0),
                         else_branch=branch("else", "Sub", 1.0)),
    ]
    inits = {"one": np.array(1, np.int64), "two": np.array(2, np.int64)}
    return nodes, inits


@pytest.mark.parametrize("cols", [3, 2])
def test_if_with_a_condition_known_at_import_inlines_the_branch(cols):
    nodes, inits = _if_model()
    feeds = {"x": rand(4, cols)}
    model = make_model(nodes, feeds, ["y"], initializers=inits)
    want = run_ort(model, feeds)
    got, mod = run_kiln(model, feeds)
    assert_close(got[0], want[0], what="If output")
    ops = {n.op for n in mod.nodes}
    assert ("multiply" in ops) == (cols > 2) and ("subtract" in ops) == (cols <= 2)  # only one branch


@pytest.mark.parametrize("c", [True, False])
def test_if_with_a_runtime_condition_becomes_an_if_node(c):
    def branch(name, op):
        return helper.make_graph([helper.make_node(op, ["x"], [name + "_y"])], name, [],
                                 [helper.make_tensor_value_info(name + "_y", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "Identity"), else_branch=branch("e", "Neg"))]
    feeds = {"c": np.array(c), "x": rand(3)}
    model = make_model(nodes, feeds, ["y"])
    got, mod = run_kiln(model, feeds)
    (node,) = mod.nodes
    assert node.op == "if" and [v.name for v in node.inputs] == ["c", "x"]  # x captured
    assert_close(got[0], run_ort(model, feeds)[0], what="If output")


def _scan_body():
    """state' = state + x_t; outputs (state', state' * x_t)."""
    return helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])], "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [3])])


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (1, 1, 1, 0), (0, 0, 1, 1)])
def test_scan_unrolled_matches_ort(in_axis, in_dir, out_axis, out_dir):
    xs = rand(5, 3) if in_axis == 0 else rand(3, 5)
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=_scan_body(), num_scan_inputs=1,
                            scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                            scan_output_axes=[out_axis], scan_output_directions=[out_dir])
    feeds = {"s0": rand(3, seed=2), "xs": xs}
    model = make_model([node], feeds, ["s", "ys"], opset=17)
    want = run_ort(model, feeds)
    got, mod = run_kiln(model, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"Scan output {i}")
    assert sum(n.op == "multiply" for n in mod.nodes) == 5  # one body copy per step, on runtime inputs


def test_scan_opset8_batched_matches_ort():
    node = helper.make_node("Scan", ["", "s0", "xs"], ["s", "ys"], body=_scan_body(), num_scan_inputs=1)
    feeds = {"s0": rand(2, 3, seed=3), "xs": rand(2, 4, 3, seed=4)}
    model = make_model([node], feeds, ["s", "ys"], opset=8)
    want = run_ort(model, feeds)
    got, _ = run_kiln(model, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, what=f"Scan output {i}")
