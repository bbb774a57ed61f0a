"""Graph executor: setters, outputs, storage sharing, aliases, multi-output, segments."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import kiln
from kiln.runtime import graph_executor
from kiln.runtime.errors import KernelError
from kiln.runtime.module import Module

from tests.executor.executor_helpers import SHAPE, GraphBuilder, two_kernel_graph


class DLPackOnly:
    """An object that is only a DLPack producer (not a NumPy array, not an NDArray)."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, stream=None, **kw):
        return self._arr.__dlpack__()

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def _value(kind: str, x: np.ndarray):
    if kind == "numpy":
        return x
    if kind == "ndarray":
        return kiln.nd.array(x)
    return DLPackOnly(x)


@pytest.mark.parametrize("kind", ["numpy", "ndarray", "dlpack"])
@pytest.mark.parametrize("how", ["name", "index", "kwargs", "run_kwargs"])
def test_two_kernel_graph_every_setter(clib, rng, how, kind):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    x = rng.standard_normal(SHAPE).astype("float32")
    v = _value(kind, x)
    if how == "name":
        m.set_input("x", v)
        m.run()
    elif how == "index":
        m.set_input(0, v)
        m.run()
    elif how == "kwargs":
        m.set_input(x=v)
        m.run()
    else:
        m.run(x=v)
    np.testing.assert_allclose(m.get_output(0).numpy(), (x + 1) * 2, rtol=1e-6)


def test_info_and_inputs(clib):
    m = graph_executor.create(two_kernel_graph(), clib)  # default device: cpu
    assert m.get_num_inputs() == 1
    assert m.get_num_outputs() == 1
    assert m.get_input_index("x") == 0
    assert m.get_input_index("nope") == -1
    shapes, dtypes = m.get_input_info()
    assert shapes == {"x": SHAPE} and dtypes == {"x": "float32"}
    assert m.get_input_entry_ids() == {"x": 0}
    x = np.arange(6, dtype="float32").reshape(SHAPE)
    m.set_input("x", x)
    np.testing.assert_array_equal(m.get_input("x").numpy(), x)
    np.testing.assert_array_equal(m.get_input(0).numpy(), x)
    # GraphModule of a GraphModule shares the same executor state
    m2 = kiln.GraphModule(m)
    np.testing.assert_array_equal(m2.get_input("x").numpy(), x)


def test_get_output_into_out(clib):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    x = np.ones(SHAPE, "float32")
    m.run(x=x)
    out = kiln.nd.empty(SHAPE, "float32")
    assert m.get_output(0, out) is out
    np.testing.assert_array_equal(out.numpy(), np.full(SHAPE, 4, "float32"))
    out_np = np.zeros(SHAPE, "float32")
    m.get_output(0, out=out_np)
    np.testing.assert_array_equal(out_np, np.full(SHAPE, 4, "float32"))
    # get_output is a copy: a later run does not change it
    y = m.get_output(0)
    m.run(x=np.zeros(SHAPE, "float32"))
    np.testing.assert_array_equal(y.numpy(), np.full(SHAPE, 4, "float32"))


def test_storage_reuse(clib, rng):
    # x(sid0) -> t1(sid1) -> t2(sid2) -> t3(sid1, reuses t1) -> y(sid2, reuses t2) -> __nop flat (alias of y)
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t1 = b.op("add_one", [x], sids=[1])
    t2 = b.op("mul_two", [t1], sids=[2])
    t3 = b.op("add_one", [t2], sids=[1])
    y = b.op("mul_two", [t3], sids=[2])
    r = b.op("__nop", [y], shapes=[[6]], sids=[3], name="reshape")
    m = graph_executor.create(b.json([y, r]), clib, kiln.cpu())
    ex = m.module
    assert sorted(ex.storage) == [0, 1, 2]  # the nop's own sid 3 is never allocated
    x_np = rng.standard_normal(SHAPE).astype("float32")
    m.run(x=x_np)
    want = ((x_np + 1) * 2 + 1) * 2
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(1).numpy(), want.reshape(6), rtol=1e-6)
    # t1/t3 and t2/y really share memory; the nop output aliases y
    assert ex.arrays[t1[0] + 0].data_ptr == ex.arrays[b.row_ptr[t3[0]]].data_ptr
    assert ex.arrays[b.row_ptr[r[0]]].data_ptr == ex.arrays[b.row_ptr[y[0]]].data_ptr
    assert ex.storage[1].nbytes == 6 * 4


def test_storage_sized_for_largest_entry(clib, rng):
    # sid 1 holds a (2,3) entry first and a (4,3) entry later: it must be sized for 12 floats.
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    big = b.input("big", (4, 3), sid=3)
    t = b.op("add_one", [x], sids=[1])
    u = b.op("mul_two", [t], sids=[2])
    v = b.op("add_one", [big], sids=[1])  # reuses sid 1 at a larger size
    m = graph_executor.create(b.json([u, v]), clib, kiln.cpu())
    assert sorted(m.module.storage) == [0, 1, 2, 3]
    assert m.module.storage[1].nbytes == 12 * 4
    x_np = rng.standard_normal(SHAPE).astype("float32")
    big_np = rng.standard_normal((4, 3)).astype("float32")
    m.run(x=x_np, big=big_np)
    np.testing.assert_allclose(m.get_output(0).numpy(), (x_np + 1) * 2, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(1).numpy(), big_np + 1, rtol=1e-6)


def test_multi_output_node(clib, rng):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    a, c = b.op("two_out", [x], shapes=[SHAPE, SHAPE], name="split")
    y = b.op("add", [a, c], name="sum")
    m = graph_executor.create(b.json([y, c, a]), clib, kiln.cpu())
    x_np = rng.standard_normal(SHAPE).astype("float32")
    m.run(x=x_np)
    np.testing.assert_allclose(m.get_output(0).numpy(), (x_np + 1) + 2 * x_np, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(1).numpy(), 2 * x_np, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(2).numpy(), x_np + 1, rtol=1e-6)


def test_flatten_data(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    y = b.op("neg_flat", [x], flatten=True)
    m = graph_executor.create(b.json([y]), clib, kiln.cpu())
    x_np = np.arange(6, dtype="float32").reshape(SHAPE)
    m.run(x=x_np)
    out = m.get_output(0)
    assert out.shape == SHAPE  # the entry keeps its shape; only the kernel sees 1-D
    np.testing.assert_array_equal(out.numpy(), -x_np)


def test_whole_graph_is_one_native_call(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = x
    for _ in range(10):
        t = b.op("add_one", [t])
    t = b.op("__nop", [t], shapes=[[6]])
    m = graph_executor.create(b.json([t]), clib, kiln.cpu())
    assert len(m.module.segments) == 1
    assert len(m.module.native_segments) == 1 and len(m.module.native_segments[0][1]) == 10
    m.run(x=np.zeros(SHAPE, "float32"))
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full(6, 10, "float32"))


class PyKernels(Module):
    """A Python-implemented module: its functions are not native, so they split segments."""

    type_key = "test_py"

    def _get_local_function(self, name):
        if name == "py_triple":

            def py_triple(x, y):
                y.copyfrom(x.numpy() * 3)

            return py_triple
        return None


def test_python_function_splits_segments(clib):
    root = PyKernels()
    root.import_module(clib)
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x])
    u = b.op("py_triple", [t])
    v = b.op("mul_two", [u])
    w = b.op("add_one", [v])
    m = graph_executor.create(b.json([w]), root, kiln.cpu())
    kinds = [op.kind for op in m.module.ops]
    assert kinds == ["native", "py", "native", "native"]
    assert len(m.module.segments) == 3  # native | python | native (2 ops in one call)
    m.run(x=np.ones(SHAPE, "float32"))
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full(SHAPE, (2 * 3) * 2 + 1, "float32"))


def test_copy_node_with_device_index(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x])
    c = b.op("__copy", [t], name="copy")
    y = b.op("mul_two", [c])
    m = graph_executor.create(b.json([y], device_index=True), clib, kiln.cpu())
    assert [op.kind for op in m.module.ops] == ["native", "copy", "native"]
    m.run(x=np.ones(SHAPE, "float32"))
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full(SHAPE, 4, "float32"))


def test_kernel_failure_names_node_function_and_message(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x])
    y = b.op("always_fail", [t], name="bad_node")
    m = graph_executor.create(b.json([y]), clib, kiln.cpu())
    with pytest.raises(KernelError) as ei:
        m.run(x=np.ones(SHAPE, "float32"))
    msg = str(ei.value)
    assert "bad_node" in msg and "always_fail" in msg and "boom: intentional failure" in msg


def test_set_input_after_zero_copy_restores_own_memory(clib):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    user = kiln.nd.array(np.ones(SHAPE, "float32"))
    m.set_input_zero_copy("x", user)
    m.set_input("x", np.zeros(SHAPE, "float32"))  # copies into the executor's memory ...
    np.testing.assert_array_equal(user.numpy(), np.ones(SHAPE, "float32"))  # ... not the user's
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full(SHAPE, 2, "float32"))


def test_zero_copy_input_and_output(clib, rng):
    # x(sid0) -> t1(sid1) -> t2(sid2) -> y(sid1: reuses t1's storage once t1 is dead).
    # (An intermediate may not reuse x's storage: the graph reader rejects that plan.)
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t1 = b.op("add_one", [x], sids=[1])
    t2 = b.op("mul_two", [t1], sids=[2])
    y = b.op("add_one", [t2], sids=[1])
    m = graph_executor.create(b.json([y]), clib, kiln.cpu())
    t1_eid = m.module.graph.entry_id(t1[0])
    x_np = rng.standard_normal(SHAPE).astype("float32")
    xin = kiln.nd.array(x_np)
    yout = kiln.nd.empty(SHAPE, "float32")
    m.set_input_zero_copy("x", xin)
    m.set_output_zero_copy(0, yout)
    m.run()
    want = (x_np + 1) * 2 + 1
    np.testing.assert_allclose(yout.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(xin.numpy(), x_np)
    # t1 shares y's storage id but was not redirected into the user's output buffer
    assert m.module.arrays[t1_eid].data_ptr != yout.data_ptr
    np.testing.assert_allclose(m.module.arrays[t1_eid].numpy(), x_np + 1, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-6)
    # the executor reads the user's buffer on every run (no copy)
    xin.copyfrom(np.zeros(SHAPE, "float32"))
    m.run()
    np.testing.assert_allclose(yout.numpy(), np.full(SHAPE, 3, "float32"))
    # DLPack object path (NumPy arrays are not necessarily 64-byte aligned; use an aligned slice)
    raw = np.zeros(64 + 6, "float32")
    off = (-raw.ctypes.data % 64) // 4
    aligned = raw[off : off + 6].reshape(SHAPE)
    aligned[...] = 5
    m.set_input_zero_copy(0, DLPackOnly(aligned))
    m.run()
    np.testing.assert_allclose(yout.numpy(), np.full(SHAPE, 13, "float32"))


def test_zero_copy_through_nop_alias(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    r = b.op("__nop", [x], shapes=[[6]])
    y = b.op("add_one", [r])
    t = b.op("__nop", [y], shapes=[list(SHAPE)])
    m = graph_executor.create(b.json([t]), clib, kiln.cpu())
    xin = kiln.nd.array(np.full(SHAPE, 2, "float32"))
    yout = kiln.nd.empty(SHAPE, "float32")
    m.set_input_zero_copy("x", xin)
    m.set_output_zero_copy(0, yout)
    m.run()
    np.testing.assert_array_equal(yout.numpy(), np.full(SHAPE, 3, "float32"))


def test_benchmark(clib):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    m.set_input("x", np.ones(SHAPE, "float32"))
    r = m.benchmark(kiln.cpu(), repeat=3, number=4)
    assert len(r.results) == 3 and r.min <= r.median <= r.max and r.mean > 0 and r.std >= 0
    r2 = m.benchmark(kiln.cpu(), repeat=2, number=2, end_to_end=True)
    assert len(r2.results) == 2 and r2.mean > 0
    r3 = m.benchmark(kiln.cpu(), repeat=1, number=1, min_repeat_ms=2)
    assert r3.results[0] * r3.number >= 2e-3 * 0.9


def test_entry_tensors_point_at_entries(clib):
    # the call records' DLTensors are the executor's own structs; their data match the arrays
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    ex = m.module
    for e, t in enumerate(ex.tensors):
        assert (t.dl.data or 0) + t.dl.byte_offset == ex.arrays[e].data_ptr
    op = ex.ops[0]
    assert op.call.num_args == 2
    assert op.call.args[0].v_handle == ctypes.addressof(ex.tensors[0].dl)
