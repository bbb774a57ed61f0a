"""Data-dependent dims in graphs built for OpenCL, and the copies of dynamic entries.

A kernel that reports an extent (NonMaxSuppression, NonZero, ...) cannot run on a device, so an
unplaced one goes to the CPU and the ops after it run on the device at the reported size
(``kiln.driver.placement``). Dynamic entries cross between the host and the device as their
valid box only (``kiln.runtime.ndarray.copy_box``). Compared with ONNX Runtime / NumPy;
launching needs an OpenCL device (PoCL on the CPU), the placement and ``box_runs`` checks none.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime import ndarray as nd
from kiln.runtime.errors import CompileError
from tests.frontend.onnx_check import assert_close, run_ort
from tests.frontend.test_onnx_data_dependent import _boxes, _model, detection_graph

HAS_CL = kiln.opencl().exist
needs_cl = pytest.mark.skipif(not HAS_CL, reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")

RNG = np.random.default_rng(11)


def _detection_model(n: int, max_out: int):
    nodes, inits = detection_graph(n, max_out)
    return _model(nodes, {"boxes": (np.float32, (1, n, 4)), "scores": (np.float32, (1, 1, n))},
                  ["sel", "det", "total"], inits)


def _device_of_funcs(lib) -> dict[str, int]:
    """Kernel name -> DLPack device type, from the graph JSON's ``device_index``."""
    g = json.loads(lib.get_graph_json())
    dev = g["attrs"]["device_index"][1]
    out = {}
    for nid, node in enumerate(g["nodes"]):
        if node["op"] == "tvm_op":
            eid = g["node_row_ptr"][nid]
            out[node["attrs"]["func_name"]] = dev[eid]
    return out


def test_unplaced_reporting_kernels_go_to_the_cpu():
    model = _detection_model(40, 30)
    graph, params = kiln.frontend.from_onnx(model)
    lib = kiln.build(graph, target="opencl", params=params)
    devs = _device_of_funcs(lib)
    nms = [f for f in devs if "non_max_suppression" in f]
    assert nms and all(devs[f] == 1 for f in nms), devs
    assert any(d == kiln.opencl().device_type for d in devs.values()), devs  # the rest stays on the device


def test_a_reporting_kernel_placed_on_the_device_is_refused_with_the_way_out():
    model = _detection_model(40, 30)
    graph, params = kiln.frontend.from_onnx(model)
    with pytest.raises(CompileError, match=r"data-dependent output extent.*place that op on the CPU"):
        kiln.build(graph, target="opencl", params=params, placement={"non_max_suppression": "opencl"})


@needs_cl
def test_detection_post_processing_on_opencl_matches_ort(tmp_path):
    n = 120
    model = _detection_model(n, 100)  # 100 > what NMS keeps of 120 boxes: the count cuts the box
    graph, params = kiln.frontend.from_onnx(model)
    path = str(tmp_path / "det.so")
    kiln.build(graph, target="opencl", params=params).export_library(path)
    m = kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.opencl()))  # the CPU is implicit
    feeds = [{"boxes": _boxes(n), "scores": RNG.random((1, 1, n)).astype(np.float32)} for _ in range(2)]
    feeds.append({"boxes": _boxes(n), "scores": np.zeros((1, 1, n), np.float32)})  # nothing selected
    feeds.append(feeds[0])
    counts = []
    for f in feeds:
        want = run_ort(model, f)
        m.run(**f)
        for i, w in enumerate(want):
            assert_close(m.get_output(i).numpy(), w, what=f"output {i}")
        counts.append(want[0].shape[0])
    assert 0 < counts[0] < 100 and counts[2] == 0, counts


@needs_cl
def test_nonzero_indices_flow_into_device_ops():
    # (rank, nz): the data-dependent dim is the inner one, so the copy to the device is one run per row
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "x_scale"], ["y"])]
    model = _model(nodes, {"x": (np.float32, (6, 7))}, ["y"], {"x_scale": np.array(0.5, np.float32)})
    graph, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(graph, target="opencl", params=params)["default"](kiln.opencl()))
    for p in (0.3, 0.0, 1.0, 0.6):
        x = (RNG.random((6, 7)) < p).astype(np.float32) * RNG.standard_normal((6, 7)).astype(np.float32)
        m.run(x=x)
        got = m.get_output(0).numpy()
        assert_close(got, run_ort(model, {"x": x})[0], what=f"nonzero of density {p}")


# ---------------------------------------------------------------------------------- copy_box


@pytest.mark.parametrize("shape,box", [((8, 5), (3, 5)), ((8, 5), (8, 2)), ((4, 6, 3), (2, 4, 3)),
                                       ((4, 6, 3), (4, 6, 1)), ((3, 4), (0, 4)), ((3, 4), (3, 0)),
                                       ((5,), (5,)), ((2, 3, 4, 5), (2, 1, 4, 5))])
def test_box_runs_cover_exactly_the_box(shape, box):
    starts, run = nd.box_runs(shape, box)
    flat = np.zeros(int(np.prod(shape)), bool)
    for s in starts:
        assert not flat[s:s + run].any()  # runs do not overlap
        flat[s:s + run] = True
    want = np.zeros(shape, bool)
    want[tuple(slice(0, b) for b in box)] = True
    np.testing.assert_array_equal(flat.reshape(shape), want)
    assert starts == sorted(starts)  # the compact copy is the runs in this order


def test_box_runs_give_up_past_the_cap():
    assert nd.box_runs((100, 3), (100, 2)) is None  # 100 runs of 2
    assert nd.box_runs((100, 3), (50, 3)) is not None  # one prefix


class _Counting:
    """Wraps a device API, recording the bytes of every copy."""

    def __init__(self, api):
        self.api, self.sizes = api, []

    def copy_data_from_to(self, *args, **kw):
        self.sizes.append(args[4])
        return self.api.copy_data_from_to(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.api, name)


@needs_cl
@pytest.mark.parametrize("box", [(3, 5, 4), (6, 2, 4), (6, 5, 4), (2, 3, 1), (0, 5, 4)])
def test_copy_box_moves_only_the_valid_data(monkeypatch, box):
    shape = (6, 5, 4)
    dev = kiln.opencl()
    padded = nd.array(np.full(shape, -7.0, np.float32), device=dev)
    data = RNG.standard_normal(box).astype(np.float32)
    counting = _Counting(nd.get_device_api(dev.device_type))
    monkeypatch.setattr(nd, "get_device_api", lambda t: counting)
    nd.copy_box(data, padded, box)
    assert sum(counting.sizes) == data.nbytes  # not the padded storage's
    monkeypatch.undo()
    want = np.full(shape, -7.0, np.float32)  # the padding keeps what it had
    want[tuple(slice(0, b) for b in box)] = data
    np.testing.assert_array_equal(padded.numpy(), want)
    back = np.empty(box, np.float32)
    nd.copy_box(padded, back, box)
    np.testing.assert_array_equal(back, data)
    other = nd.array(np.zeros(shape, np.float32), device=kiln.cpu())
    nd.copy_box(padded, other, box)  # device -> host NDArray, both padded
    np.testing.assert_array_equal(other.numpy()[tuple(slice(0, b) for b in box)], data)


@needs_cl
def test_copy_box_past_the_cap_moves_the_whole_storage():
    shape, box = (100, 3), (90, 2)
    padded = nd.array(np.zeros(shape, np.float32), device=kiln.opencl())
    data = RNG.standard_normal(box).astype(np.float32)
    nd.copy_box(data, padded, box)
    want = np.zeros(shape, np.float32)
    want[:90, :2] = data
    np.testing.assert_array_equal(padded.numpy(), want)
    back = np.empty(box, np.float32)
    nd.copy_box(padded, back, box)
    np.testing.assert_array_equal(back, data)


@needs_cl
def test_stale_padding_of_a_device_input_never_reaches_an_output():
    """The valid box alone is copied in, so the padding keeps an earlier run's data: NaN here."""
    from tests.executor.dynamic_support import masked_attention_graph

    def const(g, *shape):
        return g.add_constant((RNG.standard_normal(shape) * 0.3).astype("float32"))

    g, wvals = masked_attention_graph(24, const)
    x_ref = g.inputs[0]
    g.outputs = list(g.outputs) + [g.add("reduce_sum", x_ref, axes=(1,), keepdims=False),
                                   g.add("softmax", g.add("transpose", x_ref, axes=(0, 2, 1)), axis=-1)]
    m = kiln.GraphModule(kiln.build(g, target="opencl")["default"](kiln.opencl()))
    wq, wk, wv = (w.const_value for w in wvals)
    m.run(x=np.full((4, 24, 16), np.nan, np.float32), mask=np.full((4, 24), np.nan, np.float32))
    for b, s in [(1, 1), (2, 7), (3, 13)]:
        x = RNG.standard_normal((b, s, 16)).astype("float32")
        mask = np.ones((b, s), "float32")
        m.run(x=x, mask=mask)
        q, k, v = x @ wq, x @ wk, x @ wv
        sc = q @ k.transpose(0, 2, 1) * 0.25
        p = np.exp(sc - sc.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True)) @ v
        xt = x.transpose(0, 2, 1)
        e = np.exp(xt - xt.max(-1, keepdims=True))
        for i, want in enumerate([o.mean(1), o, x.sum(1), e / e.sum(-1, keepdims=True)]):
            np.testing.assert_allclose(m.get_output(i).numpy(), want, rtol=2e-5, atol=2e-5, err_msg=f"{i} {(b, s)}")
