"""Grouped convolutions: Kiln's NCHW kernel vs the blocked (NCHW[x]c) one vs ONNX Runtime.

Each case is a one-conv ONNX model (conv + bias + ReLU, batch 1) built twice in this process —
once with grouped convs kept in NCHW (the layout pass's rule before grouped convs were blocked),
once with the current rule — and timed interleaved with ORT (``intra_op_num_threads`` = Kiln's
``KILN_NUM_THREADS``, default 1), medians over ``--rounds`` rounds of 5 runs. Shapes are ResNeXt-50
(32 groups) and RegNetY-style (8-wide groups) layers.

Usage: ``KILN_NUM_THREADS=1 python bench/bench_grouped_conv.py [--rounds 15]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# (C, O, groups, kernel, stride, H=W)
CASES = [(128, 128, 32, 3, 1, 56), (256, 256, 32, 3, 1, 28), (512, 512, 32, 3, 1, 14), (1024, 1024, 32, 3, 1, 7),
         (64, 64, 8, 3, 1, 56), (208, 208, 26, 3, 1, 14), (96, 96, 12, 3, 1, 28)]


def _model(c: int, o: int, g: int, k: int, s: int, hw: int, rng: np.random.Generator):
    from onnx import TensorProto, helper, numpy_helper

    w = (rng.standard_normal((o, c // g, k, k)) * 0.1).astype("float32")
    b = rng.standard_normal(o).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[k // 2] * 4, strides=[s, s], group=g),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--target", default="llvm -mcpu=native")
    args = p.parse_args()
    import onnxruntime as ort

    import kiln
    import kiln.transform.alter_layout as al

    threads = int(os.environ.get("KILN_NUM_THREADS", "1"))
    os.environ["KILN_NUM_THREADS"] = str(threads)
    print(f"machine: {common.machine_line(common.machine_info())}; threads {threads}; target {args.target!r}")
    current = al._conv_plan

    def nchw_grouped(node, data_block, isa, *args, **kwargs):  # the rule before: groups 1 and depthwise
        g, c = node.attrs["groups"], node.inputs[0].shape[1]
        if g > 1 and not (g == c and node.inputs[1].shape[1] == 1):
            return None
        return current(node, data_block, isa, *args, **kwargs)

    rng = np.random.default_rng(0)
    print("| C→O / groups, k, stride, H=W | Kiln before (NCHW) ms | Kiln now ms | ORT ms | now GFLOP/s | before/now "
          "| now/ORT |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c, o, g, k, s, hw in CASES:
        model = _model(c, o, g, k, s, hw, rng)
        x = rng.standard_normal((1, c, hw, hw)).astype("float32")
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        mods = []
        for plan in (nchw_grouped, current):
            al._conv_plan = plan
            try:
                graph, params = kiln.frontend.from_onnx(model)
                m = kiln.GraphModule(kiln.build(graph, params=params, target=args.target)["default"](kiln.cpu()))
            finally:
                al._conv_plan = current
            m.set_input("x", x)
            mods.append(m)
        ref = sess.run(None, {"x": x})[0]
        for m in mods:
            m.run()
            np.testing.assert_allclose(m.get_output(0).numpy(), ref, rtol=1e-3, atol=1e-4)
        runs: list[list[float]] = [[], [], []]
        fns = [mods[0].run, mods[1].run, lambda sess=sess, x=x: sess.run(None, {"x": x})]
        for r in range(args.rounds):
            for i in [(r + j) % 3 for j in range(3)]:
                t = time.perf_counter()
                for _ in range(5):
                    fns[i]()
                runs[i].append((time.perf_counter() - t) / 5)
        med = [float(np.median(v)) * 1e3 for v in runs]
        macs = o * (c // g) * k * k * (hw // s) ** 2
        print(f"| {c}→{o} / {g}, {k}, {s}, {hw} | {med[0]:.3f} | {med[1]:.3f} | {med[2]:.3f} | "
              f"{2 * macs / med[1] / 1e6:.1f} | {med[0] / med[1]:.2f} | {med[1] / med[2]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
