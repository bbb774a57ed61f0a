"""``kiln bench LIB.so|MODEL.onnx``: latency distribution, optionally next to ONNX Runtime.

Times ``GraphModule.run`` (``--repeat`` samples of ``--number`` runs each) and prints median,
mean, min, max, std and p90. ``--vs onnxruntime`` times an ONNX Runtime session on the same
inputs with the same thread count and prints the Kiln/ORT ratio of medians. ``--profile``
runs the debug executor: a per-op table and a Chrome trace (``--trace out.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

from ..runtime.errors import InputError
from .args import (DEFAULT_CLI_TARGET, add_input_shape_option, add_target_option, check_target, model_kind,
                   parse_dim_ranges, parse_input_shapes, require_file)
from .build_steps import build_model, build_progress
from .compare import ort_feed, ort_session, require_onnxruntime
from .fmt import fmt_seconds
from .latency import format_latency_table, latency_stats
from .library import create_graph_module, input_shapes, load_factory, random_inputs, set_threads

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand."""
    p = subparsers.add_parser(
        "bench",
        help="measure latency (optionally vs onnxruntime, with a per-op profile)",
        description="Measure the latency of a compiled model (or of an ONNX model, compiled "
        "first). Inputs are random (seeded), shaped from the library's input info.",
        epilog="examples: kiln bench model.so --threads 1 --repeat 200\n"
        "          kiln bench model.onnx --vs onnxruntime --profile --trace trace.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="LIB.so|MODEL.onnx", help="compiled library, or an ONNX model to compile first")
    p.add_argument("--threads", type=int, metavar="N",
                   help="kernel threads (sets KILN_NUM_THREADS; also ORT's intra-op threads)")
    p.add_argument("--repeat", type=int, default=50, metavar="N", help="number of timed samples (default 50)")
    p.add_argument("--number", type=int, default=1, metavar="N",
                   help="runs per sample; each sample is their mean (default 1)")
    p.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs first (default 3)")
    p.add_argument("--vs", choices=["onnxruntime"], help="also time this engine on the same model and inputs")
    p.add_argument("--model", metavar="MODEL.onnx", help="the ONNX model of LIB.so (for --vs onnxruntime)")
    p.add_argument("--profile", action="store_true", help="per-op timing table (debug executor) + Chrome trace")
    p.add_argument("--trace", metavar="OUT.json",
                   help="write a Chrome trace (chrome://tracing, Perfetto) of one run (default with "
                   "--profile: <name>.trace.json)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    build = p.add_argument_group("when given an ONNX model")
    add_target_option(build, f"compilation target (default '{DEFAULT_CLI_TARGET}': this machine's CPU)")
    add_input_shape_option(build, "fix an input's shape, e.g. data:1,3,224,224")
    build.add_argument("--opt-level", type=int, default=3, choices=range(0, 4), metavar="N")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Time ``args.path`` (compiling it first if it is ONNX) and print the report; returns the exit code."""
    for flag in ("repeat", "number"):
        if getattr(args, flag) < 1:
            raise InputError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        raise InputError(f"--warmup must be >= 0, got {args.warmup}")
    if args.threads is not None:
        set_threads(args.threads)  # before any library is loaded
    is_onnx = model_kind(args.path) == "onnx"
    require_file(args.path, "ONNX model" if is_onnx else "library")
    onnx_path = args.path if is_onnx else args.model
    if args.vs:
        require_onnxruntime("--vs onnxruntime")
        if onnx_path is None:
            raise InputError("--vs onnxruntime needs the ONNX model: pass --model MODEL.onnx (or bench the .onnx)")
        require_file(onnx_path, "ONNX model")
    if args.trace:
        tdir = os.path.dirname(os.path.abspath(args.trace))
        if not os.path.isdir(tdir):
            raise InputError(f"--trace: directory does not exist: {tdir}")
    result: dict[str, Any] = {"path": args.path}
    tmpdir = None
    try:
        if is_onnx:
            shapes = parse_input_shapes(args.input_shape)
            dim_ranges = parse_dim_ranges(args.dim)
            check_target(args.target)
            tmpdir = tempfile.TemporaryDirectory(prefix="kiln_bench_")
            lib_path = os.path.join(tmpdir.name, "model.so")
            prog = build_progress(enabled=not args.json)
            res = build_model(args.path, target=args.target, shapes=shapes, dim_ranges=dim_ranges,
                              opt_level=args.opt_level,
                              output=lib_path, progress=prog)
            result["build_seconds"] = res.progress.total
        else:
            lib_path = args.path
        factory = load_factory(lib_path)
        m = create_graph_module(factory)
        threads = set_threads(args.threads, factory)
        _, dtypes_in = m.get_input_info()
        # a dynamic library runs at the --input-shape sizes given (else its upper bounds)
        given = {k: v for k, v in parse_input_shapes(args.input_shape).items()
                 if all(isinstance(d, int) for d in v)}
        shapes_in = input_shapes(m, given)
        inputs = random_inputs(shapes_in, dtypes_in, seed=args.seed)
        m.set_input(**inputs)
        for _ in range(args.warmup):
            m.run()
        br = m.benchmark(repeat=args.repeat, number=args.number)
        rows = {"kiln": latency_stats(br.results)}
        result.update(threads=threads, repeat=args.repeat, number=args.number, latency_ms=rows)
        if args.vs == "onnxruntime":
            from ..runtime.benchmark import measure

            sess = ort_session(onnx_path, args.threads, flag="--vs onnxruntime")
            feed = ort_feed(sess, inputs)
            ort = measure(lambda: sess.run(None, feed), number=args.number, repeat=args.repeat,
                          warmup=max(1, args.warmup))
            rows["onnxruntime"] = latency_stats(ort.results)
            result["kiln_over_ort"] = rows["kiln"]["median"] / rows["onnxruntime"]["median"]
        profile_text = None
        if args.profile or args.trace:
            dm = create_graph_module(factory, debug=True)
            dm.set_input(**inputs)
            if args.profile:
                report = dm.profile(number=max(args.number, 10), repeat=3)
                profile_text = report.table(sort=True)
                result["profile"] = [
                    {"node": r.name, "func": r.func_name, "time_us": r.time_us, "percent": r.percent}
                    for r in report.rows
                ]
            trace = args.trace or _default_trace(args.path)
            result["trace"] = dm.dump_chrome_trace(trace)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    what = args.path + (f" (compiled in {fmt_seconds(result['build_seconds'])}, target {args.target})"
                        if is_onnx else "")
    print(f"benchmark: {what}")
    print(f"threads: {threads if threads is not None else 'default'}   samples: {args.repeat} x "
          f"{args.number} run{'s' if args.number > 1 else ''}   inputs: random (seed {args.seed})")
    print(format_latency_table(rows))
    if "kiln_over_ort" in result:
        r = result["kiln_over_ort"]
        verdict = "Kiln faster" if r < 1 else "Kiln slower" if r > 1 else "even"
        print(f"kiln/onnxruntime (median): {r:.2f}x  ({verdict})")
    if profile_text is not None:
        print()
        print("per-op profile (debug executor, slowest first):")
        print(profile_text)
    if "trace" in result:
        print(f"chrome trace: {result['trace']}  (open in chrome://tracing or ui.perfetto.dev)")
    return 0


def _default_trace(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0] or "kiln"
    return f"{stem}.trace.json"
