"""The ``kiln_values`` layouts of a graph JSON (sequence / optional inputs and outputs) and the
GraphModule list / None API, on hand-written graphs (no compiler involved)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import kiln
from kiln.runtime import graph_executor
from kiln.runtime.csource import csource_module
from kiln.runtime.errors import FormatError, InputError
from kiln.runtime.graph_json import load_graph_json
from kiln.runtime.sequences import ValueLayouts, describe_values, layouts_of


def _graph(values=None):
    """Three float32 arguments passed straight through to three heads (no kernels)."""
    names = ["xs.0", "xs.1", "t"]
    shapes = [[2], [3], [1]]
    g = {
        "nodes": [{"op": "null", "name": n, "inputs": []} for n in names],
        "arg_nodes": [0, 1, 2],
        "heads": [[0, 0, 0], [1, 0, 0], [2, 0, 0]],
        "node_row_ptr": [0, 1, 2, 3],
        "attrs": {
            "dltype": ["list_str", ["float32"] * 3],
            "shape": ["list_shape", shapes],
            "storage_id": ["list_int", [0, 1, 2]],
        },
    }
    if values is not None:
        g["kiln_values"] = values
    return g


VALUES = {
    "inputs": {
        "xs": {
            "kind": "sequence",
            "elem_dtype": "float32",
            "items": [{"kind": "tensor", "arg": "xs.0"}, {"kind": "tensor", "arg": "xs.1"}],
        },
        "o": {"kind": "optional", "value": None},
    },
    "outputs": [
        {
            "kind": "sequence",
            "elem_dtype": "float32",
            "name": "ys",
            "items": [{"kind": "tensor", "head": 0}, {"kind": "tensor", "head": 1}],
        },
        {"kind": "optional", "name": "maybe", "value": {"kind": "tensor", "head": 2}},
        {"kind": "optional", "name": "nothing", "value": None},
    ],
}


def _module(values=VALUES):
    lib = csource_module("#include <kiln/c_runtime_api.h>\n", [])
    return graph_executor.create(json.dumps(_graph(values)), lib, kiln.cpu())


def test_lists_in_lists_and_none_out():
    m = _module()
    xs = [np.arange(2, dtype=np.float32), np.arange(3, dtype=np.float32) + 5]
    m.set_input("xs", xs)
    m.set_input("o", None)
    m.run(t=np.array([7], np.float32))
    assert m.get_num_outputs() == 3
    ys = m.get_output(0)
    assert isinstance(ys, list) and [y.numpy().tolist() for y in ys] == [x.tolist() for x in xs]
    assert m.get_output(1).numpy().tolist() == [7.0]
    assert m.get_output(2) is None
    # the outputs are copies: a later input does not change them
    m.run(xs=[xs[0] * 0, xs[1] * 0])
    assert ys[1].numpy().tolist() == xs[1].tolist()


def test_wrong_values_raise_input_errors_naming_the_input():
    m = _module()
    with pytest.raises(InputError, match=r"input 'xs' \(sequence<float32>\[2\]\): expected a list of 2"):
        m.set_input("xs", np.zeros(2, np.float32))
    with pytest.raises(InputError, match="'xs'.*got 1"):
        m.set_input("xs", [np.zeros(2, np.float32)])
    with pytest.raises(InputError, match=r"'xs'.*element 0 has shape \(3,\)"):
        m.set_input("xs", [np.zeros(3, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(InputError, match="element 1 is None"):
        m.set_input("xs", [np.zeros(2, np.float32), None])
    with pytest.raises(InputError, match=r"input 'o' \(optional<none>\).*pass None"):
        m.set_input("o", np.zeros(1, np.float32))
    # nothing was half copied by the failed calls: run still asks for xs
    with pytest.raises(InputError, match="xs.0"):
        m.run(t=np.zeros(1, np.float32))


def test_tensor_only_graph_is_unchanged():
    m = _module(None)
    assert m.get_num_outputs() == 3
    assert layouts_of(load_graph_json(_graph())) is None
    assert describe_values(load_graph_json(_graph())) is None


def test_describe_values():
    d = describe_values(load_graph_json(_graph(VALUES)))
    assert d == {
        "inputs": {"xs": "sequence<float32>[2]", "o": "optional<none>"},
        "outputs": [
            {"name": "ys", "type": "sequence<float32>[2]", "heads": [0, 1]},
            {"name": "maybe", "type": "optional<tensor>", "heads": [2]},
            {"name": "nothing", "type": "optional<none>", "heads": []},
        ],
    }


def _bad(path, value):
    v = copy.deepcopy(VALUES)
    obj = v
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return v


@pytest.mark.parametrize(
    "values,match",
    [
        ([], "must be an object"),
        (_bad(["outputs"], {}), "must be an object"),
        (_bad(["inputs", "xs", "kind"], "map"), "'kind' one of"),
        (_bad(["inputs", "xs", "items"], "x"), "needs 'items'"),
        (_bad(["inputs", "xs", "items", 0, "arg"], 3), "needs 'arg'"),
        (
            _bad(["inputs", "xs", "items", 0], {"kind": "sequence", "elem_dtype": "float32", "items": []}),
            "sequence elements must be tensors",
        ),
        (_bad(["inputs", "o"], {"kind": "optional"}), "needs 'value'"),
        (_bad(["inputs", "o", "value"], {"kind": "optional", "value": None}), "may not hold an optional"),
        (_bad(["inputs", "t"], {"kind": "optional", "value": None}), "also a tensor argument"),
        (_bad(["inputs", "xs", "items", 1, "arg"], "nope"), "unknown argument 'nope'"),
        (_bad(["outputs", 2, "value"], {"kind": "tensor", "head": 0}), "cover heads 0..2 once"),
        (_bad(["outputs", 1, "value", "head"], True), "needs 'head'"),
    ],
)
def test_malformed_layouts_are_format_errors(values, match):
    with pytest.raises(FormatError, match=match):
        layouts_of(load_graph_json(_graph(values)))
    with pytest.raises(FormatError):
        _module(values)


def test_layouts_direct():
    lays = ValueLayouts(VALUES, ["xs.0", "xs.1", "t"], 3)
    assert lays.inputs["xs"].slots() == ["xs.0", "xs.1"]
    assert [o.describe() for o in lays.outputs] == ["sequence<float32>[2]", "optional<tensor>", "optional<none>"]
