"""Compile-time breakdown of ``kiln.build`` per model and target.

Usage::

    python bench/build_time.py MODEL.onnx [MODEL.onnx ...] [--target llvm] [--target c]
                               [--opt-level 3] [--export]

For every model and target it prints the time of each build stage (graph passes, fusion,
lowering, codegen + compile, graph codegen), the number of fused groups, kernel calls and
distinct kernels, and the memory plan (planned vs no-reuse activation bytes). ``--export``
also times ``export_library`` (for the ``c`` target this is where the C compiler runs).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="ONNX files")
    ap.add_argument("--target", action="append", help="target(s) (default: llvm)")
    ap.add_argument("--opt-level", type=int, default=3)
    ap.add_argument("--export", action="store_true", help="also time export_library")
    args = ap.parse_args(argv)

    import kiln

    targets = args.target or ["llvm"]
    stages = ["passes", "fuse", "lower", "codegen+compile", "graph_codegen", "factory", "total"]
    head = ["model", "target", *stages] + (["export"] if args.export else []) + \
        ["groups", "calls", "kernels", "act. planned/no-reuse KiB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for path in args.models:
        t0 = time.perf_counter()
        mod, params = kiln.frontend.from_onnx(path)
        t_import = time.perf_counter() - t0
        for tgt in targets:
            factory = kiln.build(mod, target=tgt, params=params, opt_level=args.opt_level)
            st = factory.get_stats()
            row = [os.path.basename(path), tgt] + [f"{st['timings'].get(s, 0.0) * 1e3:.0f} ms" for s in stages]
            if args.export:
                with tempfile.TemporaryDirectory() as d:
                    t1 = time.perf_counter()
                    factory.export_library(os.path.join(d, "m.so"))
                    row.append(f"{(time.perf_counter() - t1) * 1e3:.0f} ms")
            mem = st["memory"]
            row += [str(st["num_groups"]), str(st["num_kernel_calls"]), str(st["num_functions"]),
                    f"{mem['planned_bytes'] / 1024:.0f}/{mem['no_reuse_bytes'] / 1024:.0f}"]
            print("| " + " | ".join(row) + " |")
        print(f"<!-- {os.path.basename(path)}: ONNX import {t_import * 1e3:.0f} ms -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
