"""A/B of two Kiln source trees on the same ONNX models: build time and latency, one process.

Each tree builds every model in its own subprocess (``PYTHONPATH=<tree>/src``, a fresh empty
kernel cache each, so build times are uncached and comparable) and exports a library. This
process then loads both libraries (the runtime reads either) and times them **interleaved**
(rounds alternate A/B order; medians over all timed runs), after checking that their outputs
agree. Ratios are B/A: below 1 means B is faster.

Usage::

    git worktree add /tmp/kiln_base <commit>
    python bench/bench_ab.py --a /tmp/kiln_base --b . bench/out/densenet121.onnx [more.onnx] \\
        [--threads 1] [--rounds 15] [--target "llvm -mcpu=native"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_BUILD = r"""
import json, sys, time
t0 = time.perf_counter()
import kiln, kiln.frontend
mod, params = kiln.frontend.from_onnx(sys.argv[1])
f = kiln.build(mod, target=sys.argv[3], params=params)
f.export_library(sys.argv[2])
g = json.loads(f.get_graph_json())
kernels = sum(1 for n in g["nodes"] if n["op"] == "tvm_op" and not n["attrs"]["func_name"].startswith("__"))
print(json.dumps({"build_s": time.perf_counter() - t0, "kernel_calls": kernels,
                  "functions": len({n["attrs"]["func_name"] for n in g["nodes"] if n["op"] == "tvm_op"})}))
"""


def build(tree: Path, onnx_path: str, so: str, target: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), KILN_CACHE_DIR=tempfile.mkdtemp(prefix="kiln_ab_"))
    out = subprocess.run([sys.executable, "-c", _BUILD, onnx_path, so, target], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--a", required=True, help="source tree A (the baseline)")
    ap.add_argument("--b", default=".", help="source tree B (default: this one)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per engine per round")
    ap.add_argument("--target", default="llvm -mcpu=native")
    args = ap.parse_args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    import numpy as np

    import kiln

    tmp = Path(tempfile.mkdtemp(prefix="kiln_ab_libs_"))
    print(f"A = {args.a}, B = {args.b}; {args.threads} thread(s), {args.rounds} rounds x {args.runs} runs; "
          f"target {args.target!r}")
    print(f"{'model':24s} {'build A s':>9s} {'build B s':>9s} {'kernels A/B':>12s} {'A ms':>8s} {'B ms':>8s} "
          f"{'B/A':>6s}")
    for path in args.models:
        name = Path(path).stem
        info = {}
        for tag, tree in (("A", Path(args.a)), ("B", Path(args.b))):
            info[tag] = build(tree.resolve(), path, str(tmp / f"{name}_{tag}.so"), args.target)
        mods = {}
        for tag in "AB":
            m = kiln.GraphModule(kiln.runtime.load_module(str(tmp / f"{name}_{tag}.so"))["default"](kiln.cpu()))
            mods[tag] = m
        rng = np.random.default_rng(0)
        shapes, dtypes = mods["A"].get_input_info()
        feeds = {nm: rng.standard_normal(shape).astype(dtypes[nm]) for nm, shape in shapes.items()}
        outs = {}
        for tag, m in mods.items():
            m.set_input(**feeds)
            m.run()
            outs[tag] = m.get_output(0).numpy()
        err = float(np.abs(outs["A"] - outs["B"]).max())
        times: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(args.rounds):
            order = "AB" if r % 2 == 0 else "BA"
            for tag in order:
                m = mods[tag]
                m.run()
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    m.run()
                    times[tag].append(time.perf_counter() - t0)
        a, b = (statistics.median(times[t]) * 1e3 for t in "AB")
        print(f"{name:24s} {info['A']['build_s']:9.2f} {info['B']['build_s']:9.2f} "
              f"{info['A']['kernel_calls']:>5d}/{info['B']['kernel_calls']:<6d} {a:8.2f} {b:8.2f} {b / a:6.3f}"
              f"   (outputs differ by {err:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
