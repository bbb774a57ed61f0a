"""``kiln demo``: the whole Kiln flow on a small model that ships with the package.

Imports ``kiln/data/demo_cnn.onnx`` (a tiny residual CNN classifier with fixed weights),
compiles it, exports one ``.so``, loads that file back, runs it on a fixed input, checks the
answer against the NumPy reference interpreter (``kiln.ir.evaluate``) and times it.
Exit code 0 means "verified".
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from ..runtime.errors import KilnError
from .args import DEFAULT_CLI_TARGET, add_target_option, check_target, require_file
from .build_steps import build_model, build_progress
from .compare import compare_outputs
from .fmt import array_summary, fmt_bytes, fmt_seconds
from .latency import latency_stats
from .library import create_graph_module, load_factory, random_inputs, set_threads

__all__ = ["register", "run", "demo_model_path"]

#: Largest accepted max |kiln - reference| / max |reference| for float32 kernels.
TOLERANCE = 1e-4


def demo_model_path() -> str:
    """Path of the ONNX model ``kiln demo`` compiles."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "demo_cnn.onnx")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` subcommand."""
    p = subparsers.add_parser(
        "demo",
        help="compile, export, reload, run and verify a small built-in model",
        description="Compile the small CNN that ships with Kiln into a shared library, load it back, "
        "run it, check the result against Kiln's NumPy reference interpreter and time it.",
    )
    add_target_option(p, f"compilation target (default '{DEFAULT_CLI_TARGET}'; try c)")
    p.add_argument("--keep", metavar="OUT.so", help="keep the compiled library at this path")
    p.add_argument("--repeat", type=int, default=50, metavar="N", help="timed runs (default 50)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compile, export, reload, run, check and time the demo model; returns the exit code."""
    if args.repeat < 1:
        raise KilnError(f"--repeat must be >= 1, got {args.repeat}")
    model_path = demo_model_path()
    require_file(model_path, "demo model (package data)")
    check_target(args.target)
    if args.keep and not args.keep.endswith((".so", ".tar")):
        raise KilnError(f"--keep {args.keep}: must end in .so or .tar")
    t_start = time.perf_counter()
    print(f"kiln demo: {os.path.basename(model_path)} -- a small residual CNN "
          "(conv/bn/relu/pool/residual add/gemm/softmax), 1x3x32x32 image -> 10 class probabilities")

    with tempfile.TemporaryDirectory(prefix="kiln_demo_") as tmp:
        lib_path = args.keep or os.path.join(tmp, "demo_cnn.so")
        prog = build_progress()
        res = build_model(model_path, target=args.target, output=lib_path, progress=prog)
        graph, params = res.graph, res.params
        t_build = prog.total
        bstats = getattr(res.factory, "build_stats", None)
        n_kernels = getattr(bstats, "num_kernel_calls", None)
        print(f"1. imported    {sum(1 for n in graph.nodes if n.op != 'constant')} ops, "
              f"{len(params)} weight tensors ({fmt_bytes(sum(a.nbytes for a in params.values()))})")
        print(f"2. compiled    target {args.target}: "
              + (f"{n_kernels} fused kernels, " if n_kernels is not None else "")
              + f"built and exported in {fmt_seconds(t_build)}")
        print(f"3. exported    {lib_path if args.keep else os.path.basename(lib_path)} "
              f"({fmt_bytes(res.file_bytes or 0)}: kernels + graph + weights in one file)")

        t0 = time.perf_counter()
        factory = load_factory(lib_path)
        m = create_graph_module(factory)
        t_load = time.perf_counter() - t0
        print(f"4. reloaded    kiln.runtime.load_module(...) in {fmt_seconds(t_load)}")

        shapes, dtypes = m.get_input_info()
        x = random_inputs(shapes, dtypes, seed=0)
        m.set_input(**x)
        m.run()
        y = [np.asarray(m.get_output(i).numpy()) for i in range(m.get_num_outputs())]
        from ..ir import evaluate

        ref = evaluate(graph, x, params)
        errs = compare_outputs(y, ref)
        abs_err = max(e[0] for e in errs)
        rel_err = max(e[1] for e in errs)
        top = int(np.argmax(y[0].reshape(-1)))
        print(f"5. ran         input {array_summary(next(iter(x.values())))}")
        print(f"               output {array_summary(y[0])}; top class {top} "
              f"(p={float(y[0].reshape(-1)[top]):.3f})")

        br = m.benchmark(repeat=args.repeat, number=1)
        lat = latency_stats(br.results)
        threads = set_threads(None, factory)
        print(f"6. timed       median {lat['median']:.3f} ms, p90 {lat['p90']:.3f} ms, min {lat['min']:.3f} ms "
              f"over {args.repeat} runs" + (f" ({threads} threads)" if threads else ""))
        ok = rel_err <= TOLERANCE
        print(f"7. checked     vs NumPy reference (kiln.ir.evaluate): max abs error {abs_err:.2e}, "
              f"max rel error {rel_err:.2e} (tolerance {TOLERANCE:.0e})")
        total = time.perf_counter() - t_start
        if not ok:
            raise KilnError(f"demo output does not match the reference: max rel error {rel_err:.2e} > {TOLERANCE:.0e}")
        print(f"verified: build {fmt_seconds(t_build)}, latency median {lat['median']:.3f} ms, "
              f"max error {abs_err:.1e}, total {fmt_seconds(total)}")
        if args.keep:
            print(f"library kept at {args.keep}; try: kiln run {args.keep} / kiln bench {args.keep} / "
                  f"kiln inspect {args.keep} --graph demo.svg")
    return 0
