"""A model on OpenCL (PoCL on the CPU) vs ONNX Runtime, same process, medians.

Usage::

    python tests/opencl/bench_resnet18_opencl.py [model.onnx] [repeats] [--variants base,tree,shared,all]

Without a model path it builds ResNet-18 with ``tests/cuda/resnet_onnx.py`` (torchvision
layout, random weights). Any ONNX model works: inputs get random values of their declared
type and shape (float: standard normal; integer: ones for names containing ``mask``, else
token ids in [1000, 30000); symbolic dimensions: 1). Prints build time, median run time,
the ratio to ONNX Runtime and the max error.

``--variants`` builds several Kiln variants of the GPU schedules and times them interleaved
in one loop (so machine load affects all alike): ``base`` (no work-group memory: register
tiles, one work-item per reduction output), ``tree`` (work-group tree reductions for
reductions with fewer than 256 outputs, the CUDA rule), ``shared`` (local-memory tiled dense / matmul / conv2d), ``all``
(both), ``default`` (what ``kiln.build`` selects).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import kiln
from kiln.topi.schedule import gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NP = {1: np.float32, 6: np.int32, 7: np.int64, 11: np.float64}


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for the graph inputs that are not initializers."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim)
        dt = _NP.get(tt.elem_type, np.float32)
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        elif "mask" in vi.name:
            feeds[vi.name] = np.ones(shape, dt)
        else:
            feeds[vi.name] = rng.integers(1000, 30000, size=shape).astype(dt)
    return feeds


def _variant(name: str) -> dict[str, Any]:
    few = gpu.MIN_WORK_ITEMS - 1
    return {"base": {"shared": False, "tree_max": 0}, "tree": {"shared": False, "tree_max": few},
            "shared": {"shared": True, "tree_max": 0}, "all": {"shared": True, "tree_max": few},
            "default": {}}[name]


def build(model: onnx.ModelProto, variant: str) -> tuple[kiln.GraphModule, float]:
    """Build ``model`` for OpenCL with the GPU-schedule knobs of ``variant``."""
    sel = gpu.SHARED_TAGS["opencl"]
    saved = dict(sel), gpu.TREE_MAX_OUTPUTS["opencl"]
    v = _variant(variant)
    try:
        if "shared" in v:
            for k in sel:
                sel[k] = v["shared"]
        if "tree_max" in v:
            gpu.TREE_MAX_OUTPUTS["opencl"] = v["tree_max"]
        mod, params = kiln.frontend.from_onnx(model)
        t0 = time.perf_counter()
        f = kiln.build(mod, target="opencl", params=params)
        dt = time.perf_counter() - t0
    finally:
        sel.update(saved[0])
        gpu.TREE_MAX_OUTPUTS["opencl"] = saved[1]
    return kiln.GraphModule(f["default"](kiln.opencl())), dt


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    variants = ["default"]
    for a in sys.argv[1:]:
        if a.startswith("--variants"):
            variants = a.split("=", 1)[1].split(",") if "=" in a else sys.argv[sys.argv.index(a) + 1].split(",")
            if "=" not in a:
                args = [x for x in args if x != sys.argv[sys.argv.index(a) + 1]]
    repeats = int(args[1]) if len(args) > 1 else 5
    if args and args[0].endswith(".onnx"):
        model = onnx.load(args[0])
        feeds = random_feeds(model)
    else:
        spec = importlib.util.spec_from_file_location("rn", os.path.join(ROOT, "tests", "cuda", "resnet_onnx.py"))
        rn = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rn)
        model, feeds = rn.resnet18()
    mods = {}
    for v in variants:
        m, dt = build(model, v)
        print(f"kiln build (opencl, {v}): {dt:.2f} s", flush=True)
        m.set_input(**feeds)
        m.run()  # first run builds the OpenCL program
        mods[v] = m
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feeds)[0]
    tk: dict[str, list[float]] = {v: [] for v in variants}
    to: list[float] = []
    out = {}
    for _ in range(repeats):
        for v, m in mods.items():
            t = time.perf_counter()
            m.run()
            out[v] = m.get_output(0).numpy()
            tk[v].append(time.perf_counter() - t)
        t = time.perf_counter()
        sess.run(None, feeds)
        to.append(time.perf_counter() - t)
    mo = float(np.median(to))
    print(f"device: {kiln.opencl().device_name}")
    print(f"onnxruntime median {mo * 1e3:.1f} ms")
    for v in variants:
        mk = float(np.median(tk[v]))
        print(f"kiln opencl [{v}] median {mk * 1e3:.1f} ms, ratio {mk / mo:.1f}x, "
              f"max abs error vs onnxruntime: {np.abs(out[v] - ref).max():.3g}")


if __name__ == "__main__":
    main()
