"""A ``[1, seq, K] x [K, N]`` MatMul built once for a range of ``seq`` against static builds.

The dynamic library (ONNX ``MatMul`` with a symbolic ``seq`` in ``--seq-range``, a constant
weight) runs its row tiles over the runtime row count with the partitioned tail of
:func:`kiln.tir.unswitch.partition_tail_tiles`; at each ``--seqs`` value the same model is also
built static at exactly that ``seq``.  Both are checked against NumPy, then timed interleaved
(:func:`common.interleaved`); the table gives medians and dynamic / static.  The figure of
``docs/dynamic_shapes.md`` ("Tiles at the runtime width").

Usage::

    python bench/bench_dynamic_matmul.py [--threads 1] [--rounds 5] [--seqs 5,77,128,255] \\
        [--seq-range 1,256] [--k 384] [--n 1536] [--target "llvm -mcpu=native"]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def onnx_model(k: int, n: int, weight: np.ndarray) -> Any:
    """``y = x @ W``, ``x`` of shape ``[1, "seq", k]``, ``W`` a ``[k, n]`` initializer."""
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "matmul",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", n])],
                          [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def build(model: Any, target: str, threads: int, shape: dict | None = None, ranges: dict | None = None) -> Any:
    import kiln

    graph, params = kiln.frontend.from_onnx(model, shape=shape, dim_ranges=ranges)
    gm = kiln.GraphModule(kiln.build(graph, target=target, params=params)["default"](kiln.cpu()))
    common.kiln_set_threads(gm.module.lib, threads)
    return gm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="5,77,128,255")
    ap.add_argument("--seq-range", default="1,256", help="lo,hi of the dynamic build's seq")
    ap.add_argument("--k", type=int, default=384)
    ap.add_argument("--n", type=int, default=1536)
    common.add_run_args(ap)
    args = ap.parse_args()
    common.run_header(args, "bench_dynamic_matmul.py")
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((args.k, args.n)) / np.sqrt(args.k)).astype(np.float32)
    model = onnx_model(args.k, args.n, weight)
    lo, hi = (int(v) for v in args.seq_range.split(","))
    dyn = build(model, args.target, args.threads, ranges={"seq": (lo, hi)})
    rows = []
    for seq in (int(s) for s in args.seqs.split(",")):
        static = build(model, args.target, args.threads, shape={"x": (1, seq, args.k)})
        x = rng.standard_normal((1, seq, args.k)).astype(np.float32)
        want = x.astype(np.float64) @ weight.astype(np.float64)
        for name, gm in (("dynamic", dyn), ("static", static)):
            gm.set_input(x=x)
            gm.run()
            np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"{name} {seq}")
        if args.wait_quiet > 0:
            common.wait_quiet(args.max_foreign, args.wait_quiet, log)
        load: dict = {}
        t = common.interleaved([common.Engine("dynamic", dyn.run), common.Engine("static", static.run)],
                               rounds=args.rounds, log=log, info=load)
        d, s = t["dynamic"].median, t["static"].median
        rows.append([str(seq), f"{d * 1e6:.1f}", f"{s * 1e6:.1f}", f"{d / s:.3f}",
                     f"{t['dynamic'].spread:.1%} / {t['static'].spread:.1%}", common.median_load(load)])
        log(f"  seq {seq}: dynamic {d * 1e6:.1f} us, static {s * 1e6:.1f} us, {d / s:.3f}")
    print(common.md_table(["seq", "dynamic us", "static us", "dynamic / static", "round spread (d / s)",
                           "other load"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
