"""Every bad input gets its own clear error."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import kiln
from kiln.runtime import graph_executor
from kiln.runtime.errors import FormatError, FunctionNotFoundError, InputError
from kiln.runtime.graph_json import load_graph_json

from tests.executor.executor_helpers import SHAPE, GraphBuilder, param_graph, two_kernel_graph


@pytest.fixture
def m(clib):
    return graph_executor.create(two_kernel_graph(), clib, kiln.cpu())


def test_unknown_input_name_lists_valid_names(m):
    with pytest.raises(InputError, match=r"unknown input 'data'.*valid inputs: 'x'"):
        m.set_input("data", np.ones(SHAPE, "float32"))
    with pytest.raises(InputError, match="unknown input 'data'"):
        m.set_input(data=np.ones(SHAPE, "float32"))
    with pytest.raises(InputError, match="unknown input 'data'"):
        m.run(data=np.ones(SHAPE, "float32"))


def test_kwargs_typo_sets_nothing(clib):
    m = graph_executor.create(param_graph(), clib, kiln.cpu())
    m.set_input("x", np.zeros(SHAPE, "float32"))
    with pytest.raises(InputError):
        m.set_input(x=np.ones(SHAPE, "float32"), typo=np.ones(SHAPE, "float32"))
    np.testing.assert_array_equal(m.get_input("x").numpy(), np.zeros(SHAPE, "float32"))


def test_wrong_shape(m):
    with pytest.raises(InputError, match=r"shape \(3, 2\) does not match the graph's \(2, 3\)"):
        m.set_input("x", np.ones((3, 2), "float32"))


def test_wrong_dtype(m):
    with pytest.raises(InputError, match="dtype float64 does not match the graph's float32"):
        m.set_input("x", np.ones(SHAPE, "float64"))
    with pytest.raises(InputError, match="dtype int32"):
        m.set_input("x", kiln.nd.array(np.ones(SHAPE, "int32")))


def test_index_out_of_range(m):
    with pytest.raises(InputError, match="input index 1 is out of range: the graph has 1 input"):
        m.set_input(1, np.ones(SHAPE, "float32"))
    with pytest.raises(InputError, match="out of range"):
        m.get_input(-1)
    with pytest.raises(InputError, match="output index 3 is out of range"):
        m.get_output(3)


def test_missing_value(m):
    with pytest.raises(InputError, match="no value"):
        m.set_input("x")


def test_get_output_wrong_out(m):
    m.run(x=np.ones(SHAPE, "float32"))
    with pytest.raises(InputError, match="out has shape"):
        m.get_output(0, out=np.zeros((6,), "float32"))


def _graph() -> dict:
    return json.loads(two_kernel_graph())


@pytest.mark.parametrize("key", ["nodes", "arg_nodes", "heads", "node_row_ptr", "attrs"])
def test_missing_top_level_key(key):
    g = _graph()
    del g[key]
    with pytest.raises(FormatError, match=f"required key '{key}' is missing"):
        load_graph_json(json.dumps(g))


@pytest.mark.parametrize("key", ["dltype", "shape", "storage_id"])
def test_missing_attr(key):
    g = _graph()
    del g["attrs"][key]
    with pytest.raises(FormatError, match=f"attrs.{key} is missing"):
        load_graph_json(g)


def test_missing_func_name_names_node():
    g = _graph()
    del g["nodes"][2]["attrs"]["func_name"]
    with pytest.raises(FormatError, match=r"node 2 \('y'\): attrs.func_name is missing"):
        load_graph_json(g)


def test_bad_num_inputs_names_node():
    g = _graph()
    g["nodes"][1]["attrs"]["num_inputs"] = "two"
    with pytest.raises(FormatError, match=r"node 1 \('t'\): attrs.num_inputs must be an integer"):
        load_graph_json(g)
    g["nodes"][1]["attrs"]["num_inputs"] = "2"
    with pytest.raises(FormatError, match=r"num_inputs = 2 but 'inputs' lists 1"):
        load_graph_json(g)


def test_bad_op_kind():
    g = _graph()
    g["nodes"][1]["op"] = "conv"
    with pytest.raises(FormatError, match=r"node 1 \('t'\): field 'op' must be 'null' or 'tvm_op'"):
        load_graph_json(g)


@pytest.mark.parametrize("sid", [-1, "0", 1.5])
def test_bad_storage_id(sid):
    g = _graph()
    g["attrs"]["storage_id"][1][1] = sid
    with pytest.raises(FormatError, match=r"storage_id\[1\].*non-negative integers"):
        load_graph_json(g)


def test_size_mismatch():
    g = _graph()
    g["attrs"]["dltype"][1].append("float32")
    with pytest.raises(FormatError, match=r"attrs.dltype has 4 items but .* 3 entries"):
        load_graph_json(g)
    g = _graph()
    g["node_row_ptr"] = [0, 1, 2]
    with pytest.raises(FormatError, match="node_row_ptr"):
        load_graph_json(g)


def test_input_reference_out_of_range():
    g = _graph()
    g["nodes"][2]["inputs"] = [[7, 0, 0]]
    with pytest.raises(FormatError, match=r"node 2 \('y'\): inputs\[0\] refers to node 7"):
        load_graph_json(g)
    g = _graph()
    g["nodes"][2]["inputs"] = [[1, 3, 0]]
    with pytest.raises(FormatError, match=r"output 3 of node 1, which has 1 output"):
        load_graph_json(g)
    g = _graph()
    g["heads"] = [[9, 0, 0]]
    with pytest.raises(FormatError, match=r"heads\[0\] refers to node 9"):
        load_graph_json(g)


def test_bad_typed_list_and_dtype():
    g = _graph()
    g["attrs"]["shape"] = ["list_int", [[2, 3]] * 3]
    with pytest.raises(FormatError, match=r"attrs.shape must be \['list_shape'"):
        load_graph_json(g)
    g = _graph()
    g["attrs"]["dltype"][1][0] = "float7"
    with pytest.raises(FormatError, match=r"dltype\[0\] = 'float7' is not a known data type"):
        load_graph_json(g)


def test_not_json():
    with pytest.raises(FormatError, match="not valid JSON"):
        load_graph_json("{nodes: ")


def test_unknown_function_name(clib):
    g = _graph()
    g["nodes"][2]["attrs"]["func_name"] = "no_such_kernel"
    with pytest.raises(FunctionNotFoundError, match=r"node 2 \('y'\): function 'no_such_kernel' is not defined"):
        graph_executor.create(json.dumps(g), clib, kiln.cpu())


def test_missing_device(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE, dev=2)
    y = b.op("add_one", [x], dev=2)
    with pytest.raises(kiln.runtime.DeviceError, match="device type 2"):
        graph_executor.create(b.json([y], device_index=True), clib, kiln.cpu())


def test_load_params_unknown_name(clib):
    m = graph_executor.create(param_graph(), clib, kiln.cpu())
    with pytest.raises(InputError, match=r"\['bias'\] are not inputs or params.*'x', 'w'"):
        m.load_params(kiln.runtime.save_param_dict({"bias": np.ones(SHAPE, "float32")}))
    with pytest.raises(InputError, match="shape"):
        m.load_params({"w": np.ones((1,), "float32")})


def test_zero_copy_errors(clib):
    m = graph_executor.create(two_kernel_graph(), clib, kiln.cpu())
    with pytest.raises(InputError, match="shape"):
        m.set_input_zero_copy("x", kiln.nd.empty((6,), "float32"))
    with pytest.raises(InputError, match="dtype"):
        m.set_input_zero_copy("x", kiln.nd.empty(SHAPE, "int32"))
    raw = np.zeros(64 + 7, "float32")
    off = (-raw.ctypes.data % 64) // 4 + 1  # deliberately 4 bytes past a 64-byte boundary
    with pytest.raises(InputError, match="not 64-byte aligned"):
        m.set_input_zero_copy("x", raw[off : off + 6].reshape(SHAPE))
    with pytest.raises(InputError, match="needs an NDArray or a DLPack tensor"):
        m.set_input_zero_copy("x", [[1, 2, 3], [4, 5, 6]])
    with pytest.raises(InputError, match="unknown input"):
        m.set_input_zero_copy("nope", kiln.nd.empty(SHAPE, "float32"))
    with pytest.raises(InputError, match="output index 1 is out of range"):
        m.set_output_zero_copy(1, kiln.nd.empty(SHAPE, "float32"))


def test_zero_copy_output_that_is_an_input(clib):
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    r = b.op("__nop", [x], shapes=[[6]])
    m = graph_executor.create(b.json([r]), clib, kiln.cpu())
    with pytest.raises(InputError, match="alias of\\) a graph input"):
        m.set_output_zero_copy(0, kiln.nd.empty((6,), "float32"))


def test_factory_bad_params(clib):
    with pytest.raises(InputError, match=r"params \['nope'\] are not argument nodes"):
        kiln.runtime.ExecutorFactoryModule(param_graph(), clib, {"nope": np.ones(SHAPE, "float32")})


def test_truncated_factory_payload(clib):
    from kiln.runtime.executor_factory import loadbinary_GraphExecutorFactory

    f = kiln.runtime.ExecutorFactoryModule(two_kernel_graph(), clib, {})
    data = f.save_to_binary()
    with pytest.raises(FormatError, match="GraphExecutorFactory payload"):
        loadbinary_GraphExecutorFactory(data[:-3])
    with pytest.raises(FormatError, match="truncated"):
        loadbinary_GraphExecutorFactory(data[:4])


def test_graph_module_needs_executor():
    with pytest.raises(InputError, match="GraphModule expects"):
        kiln.GraphModule(object())


def test_graph_dict_input_is_not_mutated(clib):
    g = _graph()
    before = copy.deepcopy(g)
    graph_executor.create(g, clib, kiln.cpu())
    assert g == before
