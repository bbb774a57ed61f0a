"""Per-operator dispatch overhead of the graph executor, next to ONNX Runtime's.

A chain of ``--nodes`` tiny kernels (add 1 to a 4-element float32 tensor) costs almost
nothing to compute, so time per op ~ dispatch overhead. The same chain is run by:

* Kiln: a C source module + hand-written graph JSON, ``GraphModule.run()`` (one native
  ``KilnRunSequence`` call per run);
* Kiln, for reference, as a Python loop of one foreign call per op (what the executor avoids);
* ONNX Runtime: the same chain as an ONNX model of Add nodes, single thread, with graph
  optimizations disabled (a fair chain of 500 kernels) and enabled.

Every number is a median over ``--rounds`` rounds; each round times many runs back to back.

Usage::

    python bench/bench_dispatch.py [--nodes 500] [--rounds 15] [--round-ms 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np

import kiln
from kiln.runtime import graph_executor

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t add_one(KilnValue* args, int32_t* type_codes, int32_t num_args,
                         KilnValue* ret, int32_t* ret_code, void* resource) {
  const DLTensor* a = (const DLTensor*)args[0].v_handle;
  const DLTensor* b = (const DLTensor*)args[1].v_handle;
  const float* x = (const float*)a->data;
  float* y = (float*)b->data;
  int64_t n = 1;
  for (int i = 0; i < a->ndim; ++i) n *= a->shape[i];
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] + 1.0f;
  return 0;
}
"""

SHAPE = [4]


def chain_graph_json(n: int) -> str:
    """x -> add_one -> add_one -> ... (n ops); intermediates ping-pong between two storages."""
    nodes = [{"op": "null", "name": "x", "inputs": []}]
    for i in range(n):
        nodes.append(
            {
                "op": "tvm_op",
                "name": f"add_{i}",
                "inputs": [[i, 0, 0]],
                "attrs": {"func_name": "add_one", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"},
            }
        )
    return json.dumps(
        {
            "nodes": nodes,
            "arg_nodes": [0],
            "heads": [[n, 0, 0]],
            "node_row_ptr": list(range(n + 2)),
            "attrs": {
                "dltype": ["list_str", ["float32"] * (n + 1)],
                "shape": ["list_shape", [SHAPE] * (n + 1)],
                "storage_id": ["list_int", [0] + [1 + (i % 2) for i in range(n)]],
            },
        }
    )


def chain_onnx(n: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    one = helper.make_tensor("one", TensorProto.FLOAT, SHAPE, [1.0] * SHAPE[0])
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"t{i}"
        nodes.append(helper.make_node("Add", [prev, "one"], [out], name=f"add_{i}"))
        prev = out
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        initializer=[one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def median_time_per_call(fn: Callable[[], object], rounds: int, round_ms: float) -> float:
    """Median over ``rounds`` of (round time / calls), calls calibrated to last ``round_ms``."""
    for _ in range(3):
        fn()
    number, t = 1, 0.0
    while True:  # calibrate
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        t = time.perf_counter() - t0
        if t * 1e3 >= round_ms / 4:
            break
        number *= 2
    number = max(1, int(number * round_ms / 1e3 / max(t, 1e-9)))
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        per.append((time.perf_counter() - t0) / number)
    return statistics.median(per)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--round-ms", type=float, default=200.0)
    args = ap.parse_args(argv)
    n = args.nodes
    x = np.arange(SHAPE[0], dtype="float32")
    want = x + n
    results: dict[str, float] = {}

    # ---- Kiln ---------------------------------------------------------------------------------
    lib = kiln.runtime.csource_module(KERNEL, ["add_one"])
    m = graph_executor.create(chain_graph_json(n), lib, kiln.cpu())
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), want)
    assert len(m.module.segments) == 1, "the chain should run as one native call"
    results["Kiln GraphModule.run()"] = median_time_per_call(m.run, args.rounds, args.round_ms)

    def kiln_e2e() -> None:
        m.set_input("x", x)
        m.run()
        m.get_output(0)

    results["Kiln set_input+run+get_output"] = median_time_per_call(kiln_e2e, args.rounds, args.round_ms)

    # Reference: the same bound kernels called one foreign call per op from Python.
    f = lib.get_function("add_one")
    arrs = [m.module.arrays[e] for e in range(n + 1)]

    def py_loop() -> None:
        for i in range(n):
            f(arrs[i], arrs[i + 1])

    results["Kiln, Python loop of foreign calls (reference)"] = median_time_per_call(
        py_loop, max(3, args.rounds // 3), args.round_ms
    )

    # ---- ONNX Runtime ---------------------------------------------------------------------------
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
        print("onnxruntime is not installed; skipping ORT", file=sys.stderr)
    if ort is not None:
        model = chain_onnx(n)
        for label, level in (
            ("ORT, graph optimizations DISABLED", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
            ("ORT, graph optimizations ENABLED", ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
        ):
            so = ort.SessionOptions()
            so.graph_optimization_level = level
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            feed = {"x": x}
            np.testing.assert_allclose(sess.run(None, feed)[0], want)
            results[label] = median_time_per_call(lambda s=sess, f=feed: s.run(None, f), args.rounds, args.round_ms)

    # ---- report ------------------------------------------------------------------------------------
    print(f"dispatch benchmark: chain of {n} x add-one on float32[{SHAPE[0]}], single thread")
    print(
        f"python {platform.python_version()}, numpy {np.__version__}"
        + (f", onnxruntime {ort.__version__}" if ort is not None else "")
        + f", {platform.machine()}, {os.cpu_count()} cpus; median of {args.rounds} rounds"
    )
    width = max(len(k) for k in results)
    print(f"{'engine':<{width}}  {'us/run':>10}  {'us/op':>8}")
    for k, v in results.items():
        print(f"{k:<{width}}  {v * 1e6:>10.2f}  {v * 1e6 / n:>8.4f}")
    kiln_op = results["Kiln GraphModule.run()"] * 1e6 / n
    if "ORT, graph optimizations DISABLED" in results:
        ort_op = results["ORT, graph optimizations DISABLED"] * 1e6 / n
        print(f"Kiln / ORT (optimizations disabled) per-op time: {kiln_op / ort_op:.3f}")
    print(f"Kiln per-op time {kiln_op:.4f} us: {'OK' if kiln_op < 1.0 else 'ABOVE'} the 1 us/op target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
