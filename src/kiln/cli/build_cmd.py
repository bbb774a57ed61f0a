"""``kiln build MODEL.onnx -o OUT.so|OUT.a|OUT.tar``: compile an ONNX model into one library.

Shows the stages on stderr while it works (import, optimize, lower, codegen+compile, export)
and prints a summary on stdout: kernels and unique functions, fused groups, planned memory
vs. no reuse, file size, total time.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..runtime.errors import InputError
from .args import (DEFAULT_CLI_TARGET, add_input_shape_option, add_target_option, check_target,
                   parse_dim_ranges, parse_input_shapes, require_file)
from .build_steps import build_model, build_progress
from .fmt import fmt_bytes, fmt_seconds
from .graph_stats import graph_json_stats, memory_text

__all__ = ["register", "run", "summarize", "write_c_headers"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``build`` subcommand."""
    p = subparsers.add_parser(
        "build",
        help="compile an ONNX model (or a torch.export .pt2) into one .so (or .tar) library",
        description="Compile an ONNX model into one shared library holding the kernels, the "
        "execution graph and the weights. Load it with kiln.runtime.load_module or `kiln run`.",
        epilog="example: kiln build resnet18.onnx -o resnet18.so --input-shape data:1,3,224,224",
    )
    p.add_argument("model", help="the ONNX model (.onnx) or torch.export archive (.pt2, from "
                   "torch.export.save; its input shapes are fixed by the export)")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="library to write: OUT.so (shared), OUT.a (static, for linking into a C/C++ application) "
                   "or OUT.tar (uncompiled)")
    add_target_option(p, f"compilation target (default '{DEFAULT_CLI_TARGET}': tuned for this machine's CPU; "
                      "plain 'llvm' for the portable baseline of the triple (x86-64: SSE2), "
                      "'c' for C compiled with -march=native (this machine), "
                      "'llvm -mcpu=skylake-avx512', ...)")
    add_input_shape_option(p, "fix an input's shape, e.g. data:1,3,224,224 (repeatable; needed for dynamic "
                           "dims; ONNX only)")
    p.add_argument("--opt-level", type=int, default=3, choices=range(0, 4), metavar="N",
                   help="0 no fusion/folding, 1 fusion, 2-3 everything (default 3)")
    p.add_argument("--link-params", action="store_true",
                   help="compile the weights into the kernel code instead of the params blob")
    p.add_argument("--tuning-log", default=None, metavar="LOG",
                   help="apply the best configs of a `kiln tune` log (JSON lines) recorded for this target")
    p.add_argument("--params-file", default=None, metavar="FILE",
                   help="write the weights to FILE and leave them out of the library (load them with "
                   "KilnModelCreate(FILE, ...) in C or GraphModule.load_params in Python)")
    p.add_argument("--isa-levels", default=None, metavar="LEVELS",
                   help="build once per x86-64 level (e.g. v2,v3,v4 or CPU names) into one portable library "
                   "that runs the best level the loading CPU supports (the --target kind is used, its -mcpu "
                   "replaced); see docs/isa.md")
    p.add_argument("--c-header", default=None, metavar="DIR",
                   help="also write the C API headers (DIR/kiln/kiln_model.h, DIR/kiln/c_runtime_api.h) "
                   "for compiling an application against the library; see docs/c_api.md")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build ``args.model`` into ``args.output`` and print the summary; returns the exit code."""
    out = args.output
    if not out.endswith((".so", ".a", ".tar")):
        raise InputError(f"-o {out}: the output must end in .so, .a or .tar")
    shapes = parse_input_shapes(args.input_shape)
    dim_ranges = parse_dim_ranges(args.dim)
    require_file(args.model, "model")
    check_target(args.target)
    if args.tuning_log:
        require_file(args.tuning_log, "tuning log")
    prog = build_progress(enabled=not args.quiet)
    res = build_model(args.model, target=args.target, shapes=shapes, dim_ranges=dim_ranges, opt_level=args.opt_level,
                      link_params=args.link_params, output=out, progress=prog, tuning_log=args.tuning_log,
                      params_file=args.params_file,
                      isa_levels=args.isa_levels.split(",") if args.isa_levels else None)
    if args.c_header:
        write_c_headers(args.c_header)
    info = summarize(res, args)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_summary(info))
    return 0


def write_c_headers(directory: str) -> list[str]:
    """Copy the headers an application needs for the C API into ``directory/kiln/``."""
    import os
    import shutil

    from ..runtime import include_path

    dst = os.path.join(directory, "kiln")
    os.makedirs(dst, exist_ok=True)
    out = []
    for name in ("kiln_model.h", "c_runtime_api.h"):
        out.append(shutil.copy(os.path.join(include_path(), "kiln", name), os.path.join(dst, name)))
    return out


def summarize(res: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Summary numbers of a finished build (JSON-able)."""
    factory = res.factory
    gstats = graph_json_stats(factory.get_graph_json(), list(factory.get_graph_params()))
    bstats = getattr(factory, "build_stats", None)
    params = factory.get_graph_params()
    param_bytes = sum(int(v.nbytes) for v in params.values())
    info: dict[str, Any] = {
        "model": args.model,
        "output": res.path,
        "target": str(check_target(args.target)),
        "opt_level": args.opt_level,
        "ir_ops_imported": sum(1 for n in res.graph.nodes if n.op != "constant"),
        "ir_ops_optimized": getattr(bstats, "num_ops", None),
        "fused_groups": getattr(bstats, "num_groups", gstats.kernel_calls + gstats.nop_calls),
        "kernel_calls": gstats.kernel_calls,
        "unique_functions": getattr(bstats, "num_functions", gstats.unique_functions),
        "nop_aliases": gstats.nop_calls,
        "memory": gstats.memory(),
        "params": {"count": len(params), "bytes": param_bytes,
                   "linked": bool(getattr(bstats, "linked_params", False)),
                   "file": getattr(args, "params_file", None)},
        "file_bytes": res.file_bytes,
        "tuning_log": getattr(args, "tuning_log", None),
        "isa_variants": [v.mod_name for v in getattr(res.module, "variants", ())] or None,
        "tuned_kernels": getattr(bstats, "tuned_kernels", 0),
        "timings": {k: round(v, 6) for k, v in res.progress.timings.items()},
        "total_seconds": round(res.progress.total, 6),
    }
    plan = getattr(factory, "memory_plan", None)
    if plan is not None:  # the driver's own numbers, when it attached them
        info["memory"].update(planned_bytes=plan.planned_bytes, no_reuse_bytes=plan.no_reuse_bytes,
                              fixed_bytes=plan.fixed_bytes, num_storages=plan.num_storages)
    return info


def format_summary(info: dict[str, Any]) -> str:
    """The text form of :func:`summarize`'s numbers."""
    ops = f"{info['ir_ops_imported']} imported"
    if info["ir_ops_optimized"] is not None:
        ops += f", {info['ir_ops_optimized']} after optimization"
    prm = info["params"]
    where = "compiled into the code (--link-params)" if prm["linked"] else "in the library's params blob"
    if not prm["count"]:
        where = "none left as params" if not prm["linked"] else "compiled into the code (--link-params)"
    elif prm.get("file"):
        where = f"in {prm['file']} (--params-file; not in the library)"
    timings = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in info["timings"].items())
    lines = [
        f"built {info['model']} -> {info['output']}  (target {info['target']}, opt-level {info['opt_level']})",
        f"  ops           {ops}",
        f"  fused groups  {info['fused_groups']}"
        + (f" ({info['nop_aliases']} of them no-work __nop / __concat nodes)" if info["nop_aliases"] else ""),
        f"  kernels       {info['kernel_calls']} calls, {info['unique_functions']} unique functions",
        f"  memory        {memory_text(info['memory'])}",
        f"  params        {prm['count']} tensors, {fmt_bytes(prm['bytes'])}, {where}",
    ]
    if info.get("isa_variants"):
        lines.append(f"  cpu levels    {', '.join(info['isa_variants'])} (one library; the best the CPU runs is "
                     "picked at load; figures below are the first level's)")
    if info.get("tuning_log"):
        lines.append(f"  tuning        {info['tuned_kernels']} kernels use tuned configs from {info['tuning_log']}")
    lines += [
        f"  file          {info['output']}, {fmt_bytes(info['file_bytes'] or 0)}",
        f"  time          {fmt_seconds(info['total_seconds'])} total ({timings})",
    ]
    return "\n".join(lines)
