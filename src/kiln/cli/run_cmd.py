"""``kiln run LIB.so``: run a compiled model once on given or random inputs.

Prints every output's shape and min / max / mean; ``--output out.npz`` saves them;
``--compare MODEL.onnx`` runs ONNX Runtime on the same inputs and prints the max absolute and
relative error per output. Needs only the runtime (NumPy) unless ``--compare`` is given.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from ..runtime.errors import InputError, KilnError
from .args import parse_input_files, require_file
from .compare import compare_outputs, require_onnxruntime, run_onnxruntime
from .fmt import array_summary, fmt_seconds
from .library import create_graph_module, input_shapes, load_factory, random_inputs, set_threads

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``run`` subcommand."""
    p = subparsers.add_parser(
        "run",
        help="run a compiled model once on given or random inputs",
        description="Load a library written by `kiln build` (or export_library), run it once and "
        "summarize the outputs. Inputs not given with --input are random (seeded), shaped from "
        "the library's input info.",
        epilog="example: kiln run model.so --input data=x.npy --output y.npz --compare model.onnx",
    )
    p.add_argument("library", help="compiled model: .so or .tar")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); FILE.npz alone sets inputs by array name")
    p.add_argument("--output", "-o", metavar="OUT.npz", help="save the outputs (output_0, output_1, ...)")
    p.add_argument("--compare", metavar="MODEL.onnx",
                   help="also run ONNX Runtime on the same inputs and print the error per output")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--threads", type=int, metavar="N", help="kernel threads (default: all cores)")
    p.add_argument("--rtol", type=float, default=1e-3,
                   help="with --compare: fail (exit 1) if a max relative error exceeds this (default 1e-3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``args.library`` once and print its outputs (and the comparison); returns the exit code."""
    from ..runtime.dtype import np_dtype

    require_file(args.library, "library")
    if args.compare:
        require_onnxruntime("--compare")
        require_file(args.compare, "ONNX model")
    if args.output and not args.output.endswith(".npz"):
        raise InputError(f"--output {args.output}: must end in .npz")
    given = parse_input_files(args.input)
    if args.threads is not None:
        set_threads(args.threads)
    t0 = time.perf_counter()
    factory = load_factory(args.library)
    m = create_graph_module(factory)
    t_load = time.perf_counter() - t0
    threads = set_threads(args.threads, factory)
    _, dtypes = m.get_input_info()
    shapes = input_shapes(m, {k: v.shape for k, v in given.items()})
    unknown = sorted(set(given) - set(shapes))
    if unknown:
        raise InputError(f"--input names unknown input(s) {unknown}; the library's inputs: {list(shapes)}")
    inputs = random_inputs({k: v for k, v in shapes.items() if k not in given}, dtypes, seed=args.seed)
    for name, arr in given.items():
        want = np_dtype(dtypes[name])
        # a dynamic library checks the shape against its dims' ranges in set_input
        if not m.dim_ranges and tuple(arr.shape) != tuple(shapes[name]):
            raise InputError(f"input {name!r}: {_input_file(args, name)} has shape {tuple(arr.shape)}, "
                             f"the library expects {tuple(shapes[name])}")
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, casting="same_kind"):
                raise InputError(f"input {name!r} has dtype {arr.dtype}, the library expects {dtypes[name]}")
            arr = arr.astype(want)
        inputs[name] = arr
    ordered = {k: inputs[k] for k in shapes}

    print(f"library: {args.library}  (loaded in {fmt_seconds(t_load)}"
          + (f", {threads} threads" if threads else "") + ")")
    print("inputs:")
    for name, arr in ordered.items():
        src = "file" if name in given else f"random, seed {args.seed}"
        print(f"  {name}: {array_summary(arr)}  ({src})")
    m.set_input(**ordered)
    t0 = time.perf_counter()
    m.run()
    t_run = time.perf_counter() - t0
    outs = [np.asarray(m.get_output(i).numpy()) for i in range(m.get_num_outputs())]
    print(f"outputs ({len(outs)}), first run {fmt_seconds(t_run)}:")
    for i, o in enumerate(outs):
        print(f"  output {i}: {array_summary(o)}")
    if args.output:
        out_dir = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(out_dir):
            raise InputError(f"--output: directory does not exist: {out_dir}")
        named: dict[str, Any] = {f"output_{i}": o for i, o in enumerate(outs)}
        np.savez(args.output, **named)
        print(f"saved outputs to {args.output}")
    if args.compare:
        names, ref = run_onnxruntime(args.compare, ordered, args.threads)
        if len(ref) != len(outs):
            raise KilnError(f"--compare: the ONNX model has {len(ref)} outputs, the library {len(outs)}")
        print(f"compare with onnxruntime ({args.compare}):")
        worst = 0.0
        for i, ((abs_e, rel_e), name) in enumerate(zip(compare_outputs(outs, ref), names)):
            shape_note = "" if outs[i].shape == ref[i].shape else \
                f"  SHAPE MISMATCH {outs[i].shape} vs {ref[i].shape}"
            print(f"  output {i} ({name}): max abs error {abs_e:.3g}, max rel error {rel_e:.3g}{shape_note}")
            worst = max(worst, rel_e)
        if worst > args.rtol:
            raise KilnError(f"outputs differ from onnxruntime: max rel error {worst:.3g} > --rtol {args.rtol:g}")
        print(f"match: max rel error {worst:.3g} <= {args.rtol:g}")
    return 0


def _input_file(args: argparse.Namespace, name: str) -> str:
    """The file ``--input NAME=FILE`` gave for ``name`` (for error messages)."""
    for spec in args.input:
        n, _, path = spec.partition("=")
        if n == name:
            return path
    return "the input file"
