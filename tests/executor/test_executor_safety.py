"""Executor memory safety and the graph JSON trust boundary (fuzz/fault campaign findings).

* executor storage starts zeroed: a new executor never shows a freed one's data;
* ``run()`` refuses to compute on inputs nobody set;
* the graph reader rejects memory plans whose shared storage is live twice at once, and
  documents that are nested too deep, not UTF-8, or declare absurd sizes — always with a
  :class:`FormatError`, before anything is allocated.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

import kiln
from kiln.runtime import debug_executor, graph_executor, graph_json
from kiln.runtime.errors import DeviceError, FormatError, InputError
from kiln.runtime.graph_json import load_graph_json

from tests.executor.executor_helpers import SHAPE, GraphBuilder, param_graph, two_kernel_graph

# ------------------------------------------------------------------------------------------
# zeroed storage


def test_new_executor_never_shows_a_freed_executors_data(clib):
    # Small buffers are recycled by the allocator at once: before storage was zeroed, the
    # input of executor k+1 held executor k's input in almost every trial.
    graph = two_kernel_graph()
    secret = np.full(SHAPE, 1234.5, "float32")
    for trial in range(50):
        m = graph_executor.create(graph, clib, kiln.cpu())
        np.testing.assert_array_equal(m.get_input("x").numpy(), 0, err_msg=f"trial {trial}: stale input")
        np.testing.assert_array_equal(m.get_output(0).numpy(), 0, err_msg=f"trial {trial}: stale output")
        m.set_input("x", secret)
        m.run()
        del m


def test_ndarray_zeros():
    a = kiln.runtime.ndarray.zeros((3, 5), "int32")
    assert a.shape == (3, 5) and a.dtype == "int32" and a.is_aligned
    np.testing.assert_array_equal(a.numpy(), np.zeros((3, 5), "int32"))
    assert kiln.runtime.ndarray.zeros(0, "float32").numpy().shape == (0,)


def test_default_zeroed_allocation_of_a_device_api():
    # Device APIs without their own zeroed allocation inherit "allocate, then upload zeros".
    from kiln.runtime.device import DeviceAPI, get_device_api

    api, dev = get_device_api(1), kiln.cpu()
    dirty = api.alloc_data_space(dev, 4096, 64)
    ctypes.memset(dirty, 0xAB, 4096)
    api.free_data_space(dev, dirty)
    ptr = DeviceAPI.alloc_zeroed_data_space(api, dev, 4096, 64)
    try:
        assert ctypes.string_at(ptr, 4096) == bytes(4096)
    finally:
        api.free_data_space(dev, ptr)


def test_factory_executor_inputs_start_zeroed(clib):
    # The factory leaves its params' storage unzeroed (it copies them in at once); the
    # inputs' storage must still be zeroed.
    factory = kiln.runtime.ExecutorFactoryModule(param_graph(), clib, {"w": np.full(SHAPE, 3, "float32")})
    for _ in range(20):
        m = kiln.GraphModule(factory["default"](kiln.cpu()))
        np.testing.assert_array_equal(m.get_input("x").numpy(), 0)
        np.testing.assert_array_equal(m.get_input("w").numpy(), 3)
        m.set_input("x", np.full(SHAPE, 1234.5, "float32"))
        m.run()
        del m


def test_storage_allocation_failure_is_a_device_error(clib, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(kiln.runtime.ndarray, "zeros", no_memory)
    with pytest.raises(DeviceError, match=r"storage_id 0: cannot allocate 24 bytes"):
        graph_executor.create(two_kernel_graph(), clib, kiln.cpu())


# ------------------------------------------------------------------------------------------
# run() needs every input


def test_run_without_inputs_names_the_missing_ones(clib):
    m = graph_executor.create(param_graph(), clib, kiln.cpu())
    with pytest.raises(InputError, match=r"input\(s\) 'x', 'w' not set"):
        m.run()
    m.set_input("w", np.ones(SHAPE, "float32"))
    with pytest.raises(InputError, match=r"input\(s\) 'x' not set") as err:
        m.run()
    assert "'w'" not in str(err.value)
    x = np.arange(6, dtype="float32").reshape(SHAPE)
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), x + 2)
    # inputs set once stay set: a later run needs no new set_input
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), x + 2)


def test_run_kwargs_and_params_count_as_set(clib):
    x = np.arange(6, dtype="float32").reshape(SHAPE)
    m = graph_executor.create(param_graph(), clib, kiln.cpu())
    m.load_params({"w": np.full(SHAPE, 3, "float32")})
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), x + 4)

    factory = kiln.runtime.ExecutorFactoryModule(param_graph(), clib, {"w": np.full(SHAPE, 3, "float32")})
    f = kiln.GraphModule(factory["default"](kiln.cpu()))
    with pytest.raises(InputError, match=r"'x' not set"):
        f.run()
    f.set_input("x", x)
    f.run()
    np.testing.assert_allclose(f.get_output(0).numpy(), x + 4)

    shared = graph_executor.create(param_graph(), clib, kiln.cpu())
    shared.share_params(f, ["w"])
    shared.run(x=x)
    np.testing.assert_allclose(shared.get_output(0).numpy(), x + 4)


def test_zero_copy_input_counts_as_set(clib):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    x = kiln.nd.array(np.arange(6, dtype="float32").reshape(SHAPE))
    m.set_input_zero_copy("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), (x.numpy() + 1) * 2)


def test_every_run_path_refuses_unset_inputs(clib, tmp_path):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    with pytest.raises(InputError, match="'x' not set"):
        m.module.run()  # the engine itself, not only the wrapper
    with pytest.raises(InputError, match="'x' not set"):
        m.benchmark(repeat=1, number=1)
    with pytest.raises(InputError, match="'x' not set"):
        m["run"]()
    dbg = debug_executor.create(two_kernel_graph(), clib, str(tmp_path), kiln.cpu())
    for call in (dbg.run, lambda: dbg.run_individual(number=1), lambda: dbg.debug_get_output("t")):
        with pytest.raises(InputError, match="'x' not set"):
            call()


# ------------------------------------------------------------------------------------------
# storage liveness


def _input_reused_by_intermediate() -> str:
    # x(sid0) -> t(sid1) -> u(sid0!) -> y(sid2): u overwrites x, so a second run without
    # set_input computes from u's values instead of x's.
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    u = b.op("mul_two", [t], name="u", sids=[0])
    y = b.op("add_one", [u], name="y", sids=[2])
    return b.json([y])


def test_storage_shared_with_an_input_is_rejected(clib):
    with pytest.raises(FormatError, match=r"entry 0 \(node 0 'x' output 0, live the whole run\) and entry 2 "
                       r"\(node 2 'u' output 0, live node 2 to node 3\) share storage_id 0"):
        graph_executor.create(_input_reused_by_intermediate(), clib, kiln.cpu())


def test_storage_shared_with_a_graph_output_is_rejected():
    # y1 is a graph output (live to the end of the run); y2 must not write over it.
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    y1 = b.op("add_one", [x], name="y1", sids=[1])
    y2 = b.op("mul_two", [x], name="y2", sids=[1])
    with pytest.raises(FormatError, match=r"'y1'.*'y2'.*share storage_id 1"):
        load_graph_json(b.json([y1, y2]))


def test_storage_shared_by_one_kernels_input_and_output_is_rejected():
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    u = b.op("mul_two", [t], name="u", sids=[1])  # reads t while writing t's memory
    with pytest.raises(FormatError, match=r"'t'.*'u'.*share storage_id 1"):
        load_graph_json(b.json([u]))


def test_storage_shared_by_two_outputs_of_one_kernel_is_rejected():
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    y = b.op("two_out", [x], shapes=[SHAPE, SHAPE], sids=[1, 1], name="two")
    with pytest.raises(FormatError, match=r"entry 1 .* and entry 2 .* share storage_id 1"):
        load_graph_json(b.json([y[0], y[1]]))


def test_alias_extends_the_lifetime_of_its_storage():
    # r is a __nop view of t; t's storage stays live until r's last reader (node 4), so
    # v (node 3) may not take it, while w (node 5) may.
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    r = b.op("__nop", [t], shapes=[[6]], name="r", sids=[1])
    v = b.op("add_one", [x], name="v", sids=[1])
    y = b.op("add", [r, v], shapes=[[6]], name="y", sids=[2])
    with pytest.raises(FormatError, match=r"'t'.*'v'.*share storage_id 1"):
        load_graph_json(b.json([y]))

    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    r = b.op("__nop", [t], shapes=[[6]], name="r", sids=[1])
    v = b.op("add_one", [x], name="v", sids=[2])
    y = b.op("add", [r, v], shapes=[[6]], name="y", sids=[3])
    w = b.op("mul_two", [y], name="w", sids=[1])
    g = load_graph_json(b.json([w]))
    assert g.alias_root[g.entry_id(r[0])] == g.entry_id(t[0])


def test_valid_reuse_runs_right_twice(clib):
    # t (sid1) is dead after u reads it, so y may reuse sid1; the input keeps its own storage.
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    u = b.op("mul_two", [t], name="u", sids=[2])
    y = b.op("add_one", [u], name="y", sids=[1])
    m = graph_executor.create(b.json([y]), clib, kiln.cpu())
    x_np = np.arange(6, dtype="float32").reshape(SHAPE)
    m.set_input("x", x_np)
    for _ in range(2):
        m.run()
        np.testing.assert_allclose(m.get_output(0).numpy(), (x_np + 1) * 2 + 1)


def test_copy_between_different_shapes_is_rejected():
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    y = b.op("__copy", [x], shapes=[[6]], name="c", sids=[1])
    with pytest.raises(FormatError, match=r"node 1 \('c'\): '__copy' output \(entry 1: \[6\] float32\) must have"):
        load_graph_json(b.json([y]))


def test_storage_on_two_devices_is_rejected():
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t", sids=[1])
    u = b.op("mul_two", [t], name="u", sids=[2])
    y = b.op("add_one", [u], name="y", sids=[1], dev=4)
    with pytest.raises(FormatError, match=r"share storage_id 1 but are on different devices"):
        load_graph_json(b.json([y], device_index=True))


# ------------------------------------------------------------------------------------------
# malformed documents: FormatError, never another exception


def _valid() -> dict:
    return json.loads(two_kernel_graph())


@pytest.mark.parametrize("depth", [40, 5000, 200_000])
def test_deep_nesting_is_a_format_error(depth):
    text = two_kernel_graph()
    deep = "[" * depth + "]" * depth
    bad = text.replace('"inputs": []', f'"inputs": [], "extra": {deep}', 1)
    with pytest.raises(FormatError, match="nested more than 32 levels"):
        load_graph_json(bad)
    with pytest.raises(FormatError, match="nested more than 32 levels"):
        load_graph_json(deep)


def test_cyclic_dict_is_a_format_error():
    g = _valid()
    g["nodes"][0]["attrs"] = {}
    g["nodes"][0]["attrs"]["self"] = g["nodes"][0]["attrs"]
    with pytest.raises(FormatError, match="nested more than"):
        load_graph_json(g)


def test_not_utf8_is_a_format_error():
    data = two_kernel_graph().encode().replace(b'"x"', b'"\xff\xfe"', 1)
    with pytest.raises(FormatError, match=r"not UTF-8 text \(byte \d+"):
        load_graph_json(data)
    assert load_graph_json(two_kernel_graph().encode()).nodes[0].name == "x"


def test_not_serializable_dict_is_a_format_error():
    g = _valid()
    g["nodes"][0]["attrs"] = {"weird": object()}
    with pytest.raises(FormatError, match="not JSON-serializable"):
        load_graph_json(g)


def _with_shape(eid: int, shape) -> dict:
    g = _valid()
    g["attrs"]["shape"][1][eid] = shape
    return g


def test_petabyte_shape_is_a_format_error_before_allocation(clib):
    g = _with_shape(0, [1 << 20, 1 << 20, 1 << 20])  # 4 EiB of float32
    with pytest.raises(FormatError, match=r"attrs.shape\[0\] = .* declares 4611686018427387904 bytes"):
        graph_executor.create(json.dumps(g), clib, kiln.cpu())


@pytest.mark.parametrize(
    "shape, match",
    [
        ([2, -3], "non-negative integers"),
        ([2, 3.0], "non-negative integers"),
        ([2, "3"], "non-negative integers"),
        ([True, 3], "non-negative integers"),
        ("23", "non-negative integers"),
        ([0, 10**30], "declares"),  # a zero dim does not make 10**30 a valid extent
        ([1] * 33, "33 dimensions"),
    ],
)
def test_bad_dims_are_format_errors(shape, match):
    with pytest.raises(FormatError, match=match):
        load_graph_json(_with_shape(0, shape))


def test_size_limit_is_configurable(monkeypatch):
    text = two_kernel_graph()  # three 24-byte entries in three storages: 72 bytes in all
    assert load_graph_json(text, max_bytes=72).num_entries == 3
    with pytest.raises(FormatError, match="memory plan needs 72 bytes in 3 storages"):
        load_graph_json(text, max_bytes=71)
    with pytest.raises(FormatError, match=r"attrs.shape\[0\].*declares 24 bytes"):
        load_graph_json(text, max_bytes=23)
    monkeypatch.setenv(graph_json.MAX_BYTES_ENV, "50")
    with pytest.raises(FormatError, match="limit of 50 bytes"):
        load_graph_json(text)
    monkeypatch.setenv(graph_json.MAX_BYTES_ENV, "lots")
    with pytest.raises(InputError, match="KILN_GRAPH_MAX_BYTES='lots'"):
        load_graph_json(text)


def test_huge_numbers_are_format_errors():
    text = two_kernel_graph()
    with pytest.raises(FormatError, match="not valid JSON"):
        load_graph_json(text.replace('"arg_nodes": [0]', '"arg_nodes": [' + "9" * 5000 + "]"))
    g = _valid()
    g["nodes"][1]["attrs"]["num_inputs"] = "9" * 5000
    with pytest.raises(FormatError, match="num_inputs must be an integer"):
        load_graph_json(g)
    g = _valid()
    g["heads"] = [[10**30, 0, 0]]
    with pytest.raises(FormatError, match="out of range"):
        load_graph_json(g)


def test_messages_quote_bounded_values():
    g = _valid()
    g["nodes"][1]["name"] = "n" * 1_000_000
    g["nodes"][1]["attrs"]["num_inputs"] = "z" * 1_000_000
    with pytest.raises(FormatError) as err:
        load_graph_json(g)
    assert len(str(err.value)) < 400
