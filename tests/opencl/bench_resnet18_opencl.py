"""ResNet-18 (224x224) on OpenCL (PoCL on the CPU) vs ONNX Runtime, same process, medians.

Usage: ``python tests/opencl/bench_resnet18_opencl.py [model.onnx] [repeats]``. Without a
model path it builds ResNet-18 with ``tests/cuda/resnet_onnx.py`` (torchvision layout,
random weights). Prints build time, median run time of each, the ratio and the max error.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if len(sys.argv) > 1 and sys.argv[1].endswith(".onnx"):
        model = onnx.load(sys.argv[1])
        name = model.graph.input[0].name
        feeds = {name: np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    else:
        spec = importlib.util.spec_from_file_location("rn", os.path.join(ROOT, "tests", "cuda", "resnet_onnx.py"))
        rn = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rn)
        model, feeds = rn.resnet18()
    mod, params = kiln.frontend.from_onnx(model)
    t0 = time.perf_counter()
    f = kiln.build(mod, target="opencl", params=params)
    print(f"kiln build (opencl): {time.perf_counter() - t0:.2f} s")
    m = kiln.GraphModule(f["default"](kiln.opencl()))
    m.set_input(**feeds)
    m.run()  # first run builds the OpenCL program
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)[0]
    tk, to = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        m.run()
        y = m.get_output(0).numpy()
        tk.append(time.perf_counter() - t)
        t = time.perf_counter()
        sess.run(None, feeds)
        to.append(time.perf_counter() - t)
    mk, mo = float(np.median(tk)), float(np.median(to))
    print(f"device: {kiln.opencl().device_name}")
    print(f"kiln opencl median {mk * 1e3:.1f} ms, onnxruntime median {mo * 1e3:.1f} ms, ratio {mk / mo:.1f}x")
    print(f"max abs error vs onnxruntime: {np.abs(y - ref).max():.3g}")


if __name__ == "__main__":
    main()
