"""Time one ``layout_transform`` kernel per (source, destination, shape): medians in us.

    KILN_NUM_THREADS=1 python bench/bench_layout_transform.py \
        NCHW32c:NCHW:1,4,56,56,32 NCHW16c:NCHW8c:1,3,112,112,16 NCHW:NCHW32c:1,128,56,56

Each case is a one-node graph built for ``--target`` (default ``llvm -mcpu=native``), checked
against :func:`kiln.ir.ops.layout.convert_layout`, then run ``--runs`` times; compare two
source trees by running the script with ``PYTHONPATH=<tree>/src`` for each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import kiln
from kiln.ir import Graph
from kiln.ir.ops.layout import convert_layout


def time_case(src: str, dst: str, shape: tuple[int, ...], target: str, runs: int) -> float:
    """Median microseconds of one run of the ``src -> dst`` transform of ``shape``."""
    g = Graph()
    x = g.add_input("x", shape)
    g.outputs = [g.add("layout_transform", x, src_layout=src, dst_layout=dst)]
    gm = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
    xv = np.random.default_rng(0).standard_normal(shape).astype("float32")
    gm.set_input(x=xv)
    gm.run()
    if not np.array_equal(gm.get_output(0).numpy(), convert_layout(xv, src, dst)):
        raise SystemExit(f"{src} -> {dst} {shape}: wrong result")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        gm.run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="SRC:DST:D0,D1,... e.g. NCHW32c:NCHW:1,4,56,56,32")
    ap.add_argument("--target", default="llvm -mcpu=native")
    ap.add_argument("--runs", type=int, default=500)
    args = ap.parse_args()
    for case in args.cases:
        src, dst, dims = case.split(":")
        shape = tuple(int(d) for d in dims.split(","))
        print(f"{src:>8} -> {dst:<8} {str(shape):<22} {time_case(src, dst, shape, args.target, args.runs):9.1f} us")


if __name__ == "__main__":
    main()
