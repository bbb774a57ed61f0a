"""Executor factory: params, serialization, export + load in a fresh process, share_params, threads."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import kiln
from kiln.runtime import graph_executor
from kiln.runtime.executor_factory import ExecutorFactoryModule, loadbinary_GraphExecutorFactory
from kiln.runtime.registry import BUILTIN_LOADER_MODULES, get_loader

from tests.executor.executor_helpers import SHAPE, param_graph, two_kernel_graph

W = np.arange(6, dtype="float32").reshape(SHAPE) / 10


@pytest.fixture
def factory(clib):
    return ExecutorFactoryModule(param_graph(), clib, {"w": W})


def test_factory_creates_executor_with_params(factory, clib):
    assert factory.type_key == "GraphExecutorFactory"
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    assert m.get_num_inputs() == 1  # w is a param, not an input
    assert m.get_input_index("w") == -1 and m.get_input_index("x") == 0
    assert m.get_input_info() == ({"x": SHAPE}, {"x": "float32"})
    x = np.ones(SHAPE, "float32")
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), x + 1 + W, rtol=1e-6)
    m2 = kiln.GraphModule(factory.get_function("default")(kiln.cpu()))
    m2.run(x=x)
    np.testing.assert_allclose(m2.get_output(0).numpy(), x + 1 + W, rtol=1e-6)


def test_factory_accessors_and_unpacking(factory, clib):
    assert factory.get_graph_json() == param_graph()
    assert factory.get_lib() is clib and factory.imported_modules == [clib]
    np.testing.assert_array_equal(factory.get_params()["w"].numpy(), W)
    np.testing.assert_array_equal(factory.get_graph_params()["w"].numpy(), W)
    graph, lib, params = factory
    assert graph == param_graph() and lib is clib and set(params) == {"w"}


def test_remove_params_and_load_params(factory):
    bare = factory.remove_params()
    assert bare.get_params() == {} and bare.get_lib() is factory.get_lib()
    m = kiln.GraphModule(bare["default"](kiln.cpu()))
    assert m.get_num_inputs() == 2  # without params, w is an ordinary input
    m.load_params(kiln.runtime.save_param_dict(factory.get_params()))
    assert m.get_num_inputs() == 1
    m.run(x=np.zeros(SHAPE, "float32"))
    np.testing.assert_allclose(m.get_output(0).numpy(), 1 + W, rtol=1e-6)


def test_binary_roundtrip(factory, clib):
    data = factory.save_to_binary()
    f2 = loadbinary_GraphExecutorFactory(data)
    assert f2.mod_name == "default" and f2.get_graph_json() == factory.get_graph_json()
    np.testing.assert_array_equal(f2.get_params()["w"].numpy(), W)
    f2.import_module(clib)
    m = kiln.GraphModule(f2["default"](kiln.cpu()))
    m.run(x=np.zeros(SHAPE, "float32"))
    np.testing.assert_allclose(m.get_output(0).numpy(), 1 + W, rtol=1e-6)


def test_loader_is_registered():
    assert BUILTIN_LOADER_MODULES["GraphExecutorFactory"] == "kiln.runtime.executor_factory"
    assert get_loader("GraphExecutorFactory") is loadbinary_GraphExecutorFactory


def test_custom_mod_name(clib):
    f = ExecutorFactoryModule(two_kernel_graph(), clib, None, mod_name="net")
    m = kiln.GraphModule(f["net"](kiln.cpu()))
    m.run(x=np.zeros(SHAPE, "float32"))
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full(SHAPE, 2, "float32"))
    with pytest.raises(kiln.runtime.FunctionNotFoundError):
        f["default"]


FRESH = textwrap.dedent(
    """
    import sys, numpy as np, kiln
    m = kiln.GraphModule(kiln.runtime.load_module(sys.argv[1])["default"](kiln.cpu()))
    assert m.get_num_inputs() == 1, m.get_num_inputs()
    m.set_input("x", np.ones((2, 3), "float32"))
    m.run()
    print(repr(m.get_output(0).numpy().ravel().tolist()))
    """
)


@pytest.mark.parametrize("ext", ["so", "tar"])
def test_export_and_load_in_fresh_process(factory, tmp_path, ext):
    path = str(tmp_path / f"model.{ext}")
    factory.export_library(path)
    assert os.path.exists(path)
    res = subprocess.run([sys.executable, "-c", FRESH, path], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    got = np.array(eval(res.stdout.strip()), "float32")
    np.testing.assert_allclose(got, (2 + W).ravel(), rtol=1e-6)


def test_share_params_survives_donor(factory, clib):
    donor = kiln.GraphModule(factory["default"](kiln.cpu()))
    donor_ptr = donor.get_input("w").data_ptr
    params_bytes = kiln.runtime.save_param_dict(factory.get_params())
    ms = []
    for _ in range(10):
        m = graph_executor.create(param_graph(), clib, kiln.cpu())
        m.share_params(donor, params_bytes)
        ms.append(m)
    del donor
    gc.collect()
    x = np.full(SHAPE, 3, "float32")
    for m in ms:
        assert m.get_num_inputs() == 1
        # the very same memory, not a copy; and this executor's own w buffer was freed
        assert m.get_input("w").data_ptr == donor_ptr
        w_sid = m.module.graph.storage_id[m.module.arg_eid["w"]]
        assert w_sid not in m.module.storage
        m.run(x=x)
        np.testing.assert_allclose(m.get_output(0).numpy(), x + 1 + W, rtol=1e-6)


def _run_many(m, seed: int, n: int, errors: list) -> None:
    try:
        rng = np.random.default_rng(seed)
        for _ in range(n):
            x = rng.standard_normal(SHAPE).astype("float32")
            m.run(x=x)
            got = m.get_output(0).numpy()
            if not np.allclose(got, x + 1 + W, rtol=1e-6):
                errors.append((seed, x, got))
    except Exception as err:  # noqa: BLE001 - reported by the test
        errors.append(err)


def test_two_executors_on_two_threads(factory):
    a = kiln.GraphModule(factory["default"](kiln.cpu()))
    b = kiln.GraphModule(factory["default"](kiln.cpu()))
    errors: list = []
    threads = [threading.Thread(target=_run_many, args=(m, s, 50, errors)) for m, s in ((a, 1), (b, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_debug_create_from_factory(factory, tmp_path):
    from kiln.runtime.debug_executor import GraphModuleDebug

    d = factory.debug_create("default", kiln.cpu(), dump_root=str(tmp_path))
    assert isinstance(d, GraphModuleDebug)
    d.run(x=np.zeros(SHAPE, "float32"))
    np.testing.assert_allclose(d.get_output(0).numpy(), 1 + W, rtol=1e-6)
    np.testing.assert_allclose(d.debug_get_output("t").numpy(), np.ones(SHAPE), rtol=1e-6)


def test_debug_dumps_in_a_default_directory_go_with_the_module(factory, tmp_path):
    """run() writes every node's outputs; the temporary directory made for them is removed when
    the module is freed, one given by the caller is kept."""
    d = factory.debug_create("default", kiln.cpu())
    d.run(x=np.zeros(SHAPE, "float32"))
    dump = d.dump_dir
    assert os.listdir(dump)
    kept = factory.debug_create("default", kiln.cpu(), dump_root=str(tmp_path))
    kept.run(x=np.zeros(SHAPE, "float32"))
    del d, kept
    gc.collect()
    assert not os.path.exists(dump)
    assert os.listdir(tmp_path / "_kiln_debug")
