"""OpenCL: register-tile vs local-memory-tile schedules, one op at a time, same process.

For each case the same one-op ONNX model is built twice for ``opencl`` — once with the
local-memory tiles of ``kiln.topi.schedule.gpu`` switched off for its op tag (the default
on OpenCL), once switched on — and the two are timed interleaved (medians). Both outputs are
checked against NumPy. This is the measurement behind ``SHARED_TAGS["opencl"]`` and the table
in docs/devices.md.

Usage::

    python bench/bench_opencl_local.py [--reps 9] [--only dense,matmul,conv]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.topi.schedule import gpu

# (kind, A shape, B shape) for dense (constant B) / matmul (B input)
GEMMS = [("dense", [128, 384], [384, 384]), ("dense", [128, 384], [384, 1536]),
         ("dense", [128, 1536], [1536, 384]), ("matmul", [12, 128, 64], [12, 64, 128])]
# (in channels, out channels, input size, kernel, stride, pad); + bias + relu
CONVS = [(64, 64, 56, 3, 1, 1), (64, 128, 56, 3, 2, 1), (3, 64, 224, 7, 2, 3)]


def _model(nodes, inputs, inits):
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", inputs, [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def gemm_case(kind: str, sa: list[int], sb: list[int]):
    r = np.random.default_rng(0)
    a = r.standard_normal(sa).astype(np.float32)
    b = r.standard_normal(sb).astype(np.float32)
    A = helper.make_tensor_value_info("a", TensorProto.FLOAT, sa)
    if kind == "dense":
        m = _model([helper.make_node("MatMul", ["a", "w"], ["y"])], [A], [numpy_helper.from_array(b, "w")])
        feeds = {"a": a}
    else:
        B = helper.make_tensor_value_info("b", TensorProto.FLOAT, sb)
        m = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [A, B], [])
        feeds = {"a": a, "b": b}
    name = f"{kind} {'x'.join(map(str, sa))} . {'x'.join(map(str, sb))}"
    return name, (kind,), m, feeds, a @ b


def conv_case(c: int, o: int, h: int, k: int, s: int, p: int):
    r = np.random.default_rng(0)
    x = r.standard_normal((1, c, h, h)).astype(np.float32)
    w = (r.standard_normal((o, c, k, k)) * 0.1).astype(np.float32)
    bias = r.standard_normal(o).astype(np.float32)
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])
    m = _model([helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[p] * 4, strides=[s, s]),
                helper.make_node("Relu", ["t"], ["y"])], [X],
               [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    ref = None
    # the register-tile conv itself is checked against ONNX Runtime in tests/opencl; here the
    # local-tile result is compared with it
    return f"conv {k}x{k}/{s} {c}->{o}, {h}x{h} (+bias, relu)", ("conv2d_nchw",), m, {"x": x}, ref


def build(m, feeds, tags, local: bool):
    saved = dict(gpu.SHARED_TAGS["opencl"])
    gpu.SHARED_TAGS["opencl"].update({t: local for t in tags})
    try:
        mod, params = kiln.frontend.from_onnx(m)
        f = kiln.build(mod, target="opencl", params=params)
    finally:
        gpu.SHARED_TAGS["opencl"].clear()
        gpu.SHARED_TAGS["opencl"].update(saved)
    g = kiln.GraphModule(f["default"](kiln.opencl()))
    g.set_input(**feeds)
    g.run()
    return g, g.get_output(0).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--only", default="dense,matmul,conv")
    args = ap.parse_args()
    if not kiln.opencl().exist:
        raise SystemExit("no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")
    only = set(args.only.split(","))
    cases = [gemm_case(*c) for c in GEMMS if c[0] in only]
    if "conv" in only:
        cases += [conv_case(*c) for c in CONVS]
    print("| op | register tile | local tiles | local / register | max abs diff |")
    print("|---|---:|---:|---:|---:|")
    for name, tags, m, feeds, ref in cases:
        (g0, y0), (g1, y1) = build(m, feeds, tags, False), build(m, feeds, tags, True)
        ts: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.reps):
            for local, g in ((False, g0), (True, g1)):
                t = time.perf_counter()
                g.run()
                g.get_output(0).numpy()
                ts[local].append(time.perf_counter() - t)
        if ref is not None:
            np.testing.assert_allclose(y0, ref, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(y1, y0, rtol=1e-3, atol=1e-3)
        t0, t1 = np.median(ts[False]) * 1e3, np.median(ts[True]) * 1e3
        print(f"| {name} | {t0:.1f} ms | {t1:.1f} ms | {t1 / t0:.1f}x | {float(np.abs(y1 - y0).max()):.1e} |",
              flush=True)


if __name__ == "__main__":
    main()
