"""Executor creation time for a ResNet-50-sized memory plan, with and without zeroed storage.

The executor zero-fills every storage buffer it allocates (a freed executor's data must never
show through ``get_input`` or an output). This measures what that costs where it is largest:
creating an executor for a ResNet-50 plan (1x3x224x224 float32, 25.6 M float32 params, the
activations planned by Kiln's own memory planner) and loading its params, as
``factory["default"](dev)`` does. Kernels are no-ops: only creation is timed.

Usage: ``python bench/bench_executor_create.py [--repeat 15]``. Prints the median and minimum
CPU milliseconds of creation with zeroed storage (what Kiln does) and with uninitialized storage
(``ndarray.empty``, the old behaviour), and the factory's way: creation with the params'
storage left unzeroed (``prefilled``) followed by ``load_params``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import numpy as np

import kiln
from kiln.runtime import ndarray
from kiln.runtime.graph_executor import LINKED_PARAM_LOOKUP, GraphExecutor, GraphModule
from kiln.runtime.module import Module
from kiln.transform.memory_plan import PlanOp, plan_memory


class NoOpKernels(Module):
    type_key = "bench_noop"

    def _get_local_function(self, name):
        return None if name == LINKED_PARAM_LOOKUP else (lambda *args: None)


def resnet50_graph() -> tuple[str, dict[str, np.ndarray]]:
    """Graph JSON of ResNet-50's fused conv sequence (conv+bias+relu[+residual]) and its params."""
    nodes, shapes, args = [], [], []
    ops: list[PlanOp] = []
    params: dict[str, np.ndarray] = {}

    def value(name: str, shape: tuple[int, ...], is_arg: bool) -> int:
        nodes.append({"op": "null", "name": name, "inputs": []})
        shapes.append(list(shape))
        if is_arg:
            args.append(len(nodes) - 1)
        return len(nodes) - 1

    def conv(x: int, cout: int, k: int, stride: int, residual: int | None = None) -> int:
        n, cin, h, w = shapes[x]
        wt = value(f"w{len(nodes)}", (cout, cin, k, k), True)
        b = value(f"b{len(nodes)}", (cout,), True)
        params[nodes[wt]["name"]] = np.zeros(shapes[wt], "float32")
        params[nodes[b]["name"]] = np.zeros(shapes[b], "float32")
        ins = [x, wt, b] + ([residual] if residual is not None else [])
        nodes.append({"op": "tvm_op", "name": f"conv{len(nodes)}", "inputs": [[i, 0, 0] for i in ins],
                      "attrs": {"func_name": "fused_conv", "num_inputs": str(len(ins)), "num_outputs": "1",
                                "flatten_data": "0"}})
        shapes.append([n, cout, h // stride, w // stride])
        ops.append(PlanOp(tuple(ins), (len(nodes) - 1,)))
        return len(nodes) - 1

    x = value("data", (1, 3, 224, 224), True)
    y = conv(conv(x, 64, 7, 2), 64, 1, 2)  # stem + (pool as a strided 1x1: same sizes)
    cin = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            short = conv(y, planes * 4, 1, s) if i == 0 else y
            t = conv(conv(y, planes, 1, 1), planes, 3, s)
            y = conv(t, planes * 4, 1, 1, residual=short)
        cin = planes * 4
    y = conv(conv(y, cin, 1, 7), 1000, 1, 1)  # global pool + fc, as 1x1 convs
    n = len(nodes)
    entry_bytes = [int(np.prod(s)) * 4 for s in shapes]
    plan = plan_memory(entry_bytes, ops, fixed=args, outputs=[y])
    graph = {
        "nodes": nodes, "arg_nodes": args, "heads": [[y, 0, 0]], "node_row_ptr": list(range(n + 1)),
        "attrs": {"dltype": ["list_str", ["float32"] * n], "shape": ["list_shape", shapes],
                  "storage_id": ["list_int", plan.storage_ids]},
    }
    print(plan.summary())
    return json.dumps(graph), params


def _seconds(fn, repeat: int) -> tuple[float, float]:
    """(median, min) CPU seconds (user + system) of ``fn()`` in this process.

    CPU time, not wall time: on a shared machine other processes inflate wall time, while
    page faults and zero-filling are charged to this process either way.
    """
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        keep = fn()
        times.append(time.process_time() - t0)
        del keep
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    graph_json, params = resnet50_graph()
    graph = kiln.runtime.graph_json.load_graph_json(graph_json)
    lib = NoOpKernels()
    dev = kiln.cpu()

    def create():
        return GraphExecutor(graph, lib, [dev])

    def create_and_load():  # what factory["default"](dev) does
        m = GraphModule(GraphExecutor(graph, lib, [dev], prefilled=params))
        m.load_params(params)
        return m

    zeroed = ndarray.zeros
    results = {}
    for label, alloc in (("zeroed", zeroed), ("uninitialized", ndarray.empty)):
        ndarray.zeros = alloc
        try:
            create()  # warm-up
            results[label] = (_seconds(create, args.repeat), _seconds(create_and_load, args.repeat))
        finally:
            ndarray.zeros = zeroed
    print("storage        create (median / min)    create + load_params (median / min)")
    for label, (c, cl) in results.items():
        print(f"{label:<14} {c[0] * 1e3:7.2f} / {c[1] * 1e3:6.2f} ms        {cl[0] * 1e3:7.2f} / {cl[1] * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
