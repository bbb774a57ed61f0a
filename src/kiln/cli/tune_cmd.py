"""``kiln tune MODEL.onnx -o LOG.jsonl``: measure schedule configs, write a tuning log.

Progress (one line per measured candidate) goes to stderr; stdout gets a table per task:
default time, best time, speedup and the best config. ``kiln build --tuning-log LOG.jsonl``
then applies the best records. See ``docs/tuning.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ..runtime.errors import InputError
from .args import (DEFAULT_CLI_TARGET, add_input_shape_option, add_target_option, check_target,
                   parse_input_shapes, require_file)
from .model_io import import_onnx

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``tune`` subcommand."""
    p = subparsers.add_parser(
        "tune",
        help="measure schedule configs of a model's kernels and write a tuning log",
        description="Extract the tunable kernels (dense, matmul, blocked conv) of an ONNX model, time the "
        "default schedule config and sampled alternatives of each, and append the results to a JSON-lines "
        "log that `kiln build --tuning-log` applies.",
        epilog="example: kiln tune resnet18.onnx -o resnet18.tune.jsonl --trials 8",
    )
    p.add_argument("model", help="the ONNX model (.onnx)")
    p.add_argument("-o", "--output", required=True, metavar="LOG", help="JSON-lines log to append to")
    p.add_argument("--trials", type=int, default=8, metavar="N",
                   help="candidates per task, the default config included (default 8)")
    add_target_option(p, f"CPU target to tune for (default '{DEFAULT_CLI_TARGET}')")
    add_input_shape_option(p, "fix an input's shape, e.g. data:1,3,224,224 (repeatable)")
    p.add_argument("--tasks", default="", metavar="KINDS",
                   help="comma-separated task kinds to tune: conv, dense, matmul (default all)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="record a candidate as an error when one run takes longer than S seconds (default 10)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="kernel threads while measuring (default $KILN_NUM_THREADS or all cores)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-candidate progress on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Tune ``args.model``'s kernels into ``args.output`` and print the table; returns the exit code."""
    from ..autotune.tuner import tune

    if args.trials < 1:
        raise InputError(f"--trials {args.trials}: expected a positive integer")
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout}: expected a positive number of seconds")
    shapes = parse_input_shapes(args.input_shape)
    require_file(args.model, "ONNX model")
    check_target(args.target)
    kinds = [k.strip() for k in args.tasks.split(",") if k.strip()] or None
    graph, params = import_onnx(args.model, shapes)

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    results = tune(graph, params, target=args.target, log_file=args.output, trials=args.trials, kinds=kinds,
                   timeout=args.timeout, num_threads=args.threads, seed=args.seed, progress=say)
    rows = [_row(r) for r in results]
    if args.json:
        print(json.dumps({"model": args.model, "log": args.output, "tasks": rows}, indent=2))
    else:
        print(format_table(rows, args.output))
    return 0


def _row(res: Any) -> dict[str, Any]:
    d, b = res.default, res.best
    # medians over the trial and any confirmation runs: the numbers build's choice rests on
    return {"kind": res.task.kind, "workload": list(res.task.workload[1:]), "calls": res.task.calls,
            "trials": len(res.records), "records": len(res.records) + len(res.confirmed),
            "errors": sum(1 for r in res.records if not r.valid),
            "default_ms": res.config_median(0) * 1e3 if d is not None and d.valid else None,
            "best_ms": res.config_median(res.records.index(b)) * 1e3 if b is not None else None,
            "speedup": None if math.isnan(res.speedup) else round(res.speedup, 4),
            "best_config": dict(b.config) if b is not None else None,
            "best_gflops": b.gflops if b is not None else None}


def _shape_text(row: dict[str, Any]) -> str:
    wl = row["workload"]
    if row["kind"] == "conv2d_nchwc":  # tag, data, weight, out, ...
        return f"{'dw ' if str(wl[0]).startswith('depthwise') else ''}{wl[1]}*{wl[2]}->{wl[3]}"
    return f"{wl[0]}x{wl[1]}"


def format_table(rows: list[dict[str, Any]], log: str) -> str:
    """The per-task summary: default vs best time (medians of all their runs) and the speedup."""
    lines = [f"{'#':>3} {'kind':<13} {'calls':>5} {'default ms':>11} {'best ms':>10} {'speedup':>8}"
             "  best config / shape"]
    for i, r in enumerate(rows, 1):
        dm = f"{r['default_ms']:.4f}" if r["default_ms"] is not None else "error"
        bm = f"{r['best_ms']:.4f}" if r["best_ms"] is not None else "error"
        sp = f"{r['speedup']:.3f}x" if r["speedup"] is not None else "-"
        cfg = ",".join(f"{k}={v}" for k, v in (r["best_config"] or {}).items())
        lines.append(f"{i:>3} {r['kind']:<13} {r['calls']:>5} {dm:>11} {bm:>10} {sp:>8}  {cfg}  {_shape_text(r)}")
    tot_d = sum(r["default_ms"] * r["calls"] for r in rows if r["default_ms"] is not None and r["best_ms"] is not None)
    tot_b = sum(r["best_ms"] * r["calls"] for r in rows if r["default_ms"] is not None and r["best_ms"] is not None)
    if tot_b > 0:
        lines.append(f"tuned kernels, weighted by calls: {tot_d:.3f} ms default -> {tot_b:.3f} ms best "
                     f"({tot_d / tot_b:.3f}x)")
    lines.append(f"log: {log} ({sum(r['records'] for r in rows)} records appended)")
    return "\n".join(lines)
