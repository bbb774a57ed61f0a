"""A runtime ONNX ``Loop`` carrying a ``(batch, seq, d)`` state with symbolic dims: Kiln vs ORT.

Usage::

    python bench/bench_control_flow_dynamic.py [--shapes 1x16,8x512] [--d 768] [--trip 20] [--rounds 30]

The body is ``x * 0.5 + 1`` (a small kernel, so the time is the loop's own work: binding
the body, running it, copying the carried value back each iteration). One library, built with
``batch`` in 1..8 and ``seq`` in 1..512, runs at every shape; ONNX Runtime runs the same
model in the same process. Prints medians and the Kiln / ORT ratio.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln


def loop_model(d: int) -> onnx.ModelProto:
    """``Loop(M, true, x)`` with body ``x * 0.5 + 1``; ``x`` of dims ``(batch, seq, d)``."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Mul", ["x_in", "half"], ["xh"]),
         helper.make_node("Add", ["xh", "one"], ["x_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", f, ["batch", "seq", d])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", f, ["batch", "seq", d])],
        initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                     numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x", f, ["batch", "seq", d])],
        [helper.make_tensor_value_info("y", f, ["batch", "seq", d])],
        initializer=[numpy_helper.from_array(np.array(True), "cond")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _median_ms(fn, rounds: int) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x16,8x512")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--trip", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    import onnxruntime as ort

    threads = int(os.environ.get("KILN_NUM_THREADS", "1"))
    model = loop_model(args.d)
    mod, params = kiln.frontend.from_onnx(model, dim_ranges={"batch": (1, 8), "seq": (1, 512)})
    m = kiln.GraphModule(kiln.build(mod, target="llvm -mcpu=native", params=params)["default"](kiln.cpu()))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    print(f"# {platform.processor() or platform.machine()}, {threads} thread(s), kiln from {kiln.__file__}")
    trip = np.array(args.trip, np.int64)
    for shape in args.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        x = np.random.default_rng(0).standard_normal((b, s, args.d)).astype(np.float32)
        m.run(M=trip, x=x)
        want = sess.run(None, {"M": trip, "x": x})[0]
        np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-5, atol=1e-5)
        feeds = {"M": trip, "x": x}
        tk = _median_ms(functools.partial(m.run, **feeds), args.rounds)
        to = _median_ms(functools.partial(sess.run, None, feeds), args.rounds)
        print(f"batch {b} seq {s:3d}: kiln {tk:.3f} ms, ort {to:.3f} ms, kiln/ort {tk / to:.2f}")


if __name__ == "__main__":
    main()
