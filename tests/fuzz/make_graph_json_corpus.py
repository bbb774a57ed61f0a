"""Regenerate the graph JSON seed files of ``tests/fuzz/corpus/graph_json/``.

The seeds are real ``kiln.build`` outputs (plus a hand-written graph, on one and on two
devices, for what a small CPU build does not emit: ``device_index``, ``__copy``, multi-output
kernels, ``flatten_data``),
so the mutation fuzzer starts from documents that pass every check and reaches deep into
the reader. Run from the repository root (needs a C compiler)::

    python -m tests.fuzz.make_graph_json_corpus

The output is deterministic for a given Kiln version; commit the changed files together with
any change to the graph JSON layout or the memory planner.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parent / "corpus" / "graph_json"


def _built() -> dict[str, str]:
    import kiln
    from kiln.ir import Graph

    seeds = {}
    g = Graph("chain")
    a, b, c = (g.add_input(n, (1, 10)) for n in "abc")
    g.outputs = [g.add("add", g.add("add", a, b), c)]
    seeds["add_chain_opt0.json"] = kiln.build(g, target="c", opt_level=0).get_graph_json()

    rng = np.random.default_rng(0)
    g = Graph("conv")
    x = g.add_input("x", (1, 4, 6, 6))
    res = g.add_input("res", (1, 4, 6, 6))
    w = g.add_constant(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), name="w")
    bias = g.add_constant(rng.standard_normal(4).astype(np.float32), name="bias")
    y = g.add("relu", g.add("bias_add", g.add("conv2d", x, w, padding=(1, 1, 1, 1)), bias))
    z = g.add("reshape", g.add("add", y, res), newshape=(4, 36))  # a __nop alias
    g.outputs = [g.add("sigmoid", z), y]
    seeds["conv_reshape_two_outputs_opt0.json"] = kiln.build(g, target="c", opt_level=0).get_graph_json()
    return seeds


def _hand_written(devices: list[int]) -> str:
    """A ``__copy`` pair, a two-output kernel, a ``__nop`` read flattened, on ``devices``."""
    f = {"num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}
    nodes = [
        {"op": "null", "name": "x", "inputs": []},
        {"op": "tvm_op", "name": "up", "inputs": [[0, 0, 0]], "attrs": dict(f, func_name="__copy")},
        {"op": "tvm_op", "name": "two", "inputs": [[1, 0, 0]],
         "attrs": dict(f, func_name="two_out", num_outputs="2")},
        {"op": "tvm_op", "name": "flat", "inputs": [[2, 1, 0]],
         "attrs": dict(f, func_name="__nop")},
        {"op": "tvm_op", "name": "neg", "inputs": [[3, 0, 0]],
         "attrs": dict(f, func_name="neg_flat", flatten_data="1")},
        {"op": "tvm_op", "name": "down", "inputs": [[4, 0, 0]], "attrs": dict(f, func_name="__copy")},
        {"op": "tvm_op", "name": "y", "inputs": [[2, 0, 0]], "attrs": dict(f, func_name="__copy")},
    ]
    shapes = [[2, 3], [2, 3], [2, 3], [2, 3], [6], [6], [6], [2, 3]]
    graph = {
        "nodes": nodes,
        "arg_nodes": [0],
        "heads": [[5, 0, 0], [6, 0, 0]],
        "node_row_ptr": [0, 1, 2, 4, 5, 6, 7, 8],
        "attrs": {
            "dltype": ["list_str", ["float32"] * 8],
            "shape": ["list_shape", shapes],
            "storage_id": ["list_int", [0, 1, 2, 3, 3, 1, 4, 5]],
            "device_index": ["list_int", devices],
        },
    }
    return json.dumps(graph, indent=1)


def main() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    seeds = _built()
    seeds["two_devices_copy_multi_output.json"] = _hand_written([1, 4, 4, 4, 4, 4, 1, 1])
    seeds["cpu_copy_multi_output.json"] = _hand_written([1] * 8)  # runs with the CPU alone
    from kiln.runtime.graph_json import load_graph_json

    for name, text in seeds.items():
        load_graph_json(text)  # a seed must be valid, or the fuzzer starts from noise
        (CORPUS / name).write_text(text, encoding="utf-8")
        print(f"wrote {CORPUS / name} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
