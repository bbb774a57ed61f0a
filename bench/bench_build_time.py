"""Kiln build time of a model (default ResNet-50): uncached and cached.

Two fresh processes share one new, empty ``KILN_CACHE_DIR`` (a temp dir):

1. **uncached** — every kernel is generated and compiled;
2. **cached**  — same model, same target: the on-disk codegen cache holds every object.

Each process times: ``import kiln`` + frontend, ``from_onnx``, ``kiln.build`` (with
``KILN_DEBUG=1``: the driver's per-stage and per-pass times), ``export_library`` and
``load_module``, and reports the codegen-cache hits / misses. ``--profile-export`` runs the
timed ``export_library`` under cProfile and prints where export time goes.

Usage::

    python bench/bench_build_time.py [--model resnet50] [--target "llvm -mcpu=native"]
        [--profile-export] [--write-results]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _hits(stats: dict[str, Any]) -> str:
    return f"{stats.get('hits')} / {stats.get('misses')}"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    import kiln
    import kiln.frontend  # noqa: F401
    from kiln.codegen import cache

    r: dict[str, Any] = {"import_kiln_s": time.perf_counter() - t0}
    onnx_path = Path(args.onnx)
    so = Path(args.so)
    cache.reset_stats()
    t0 = time.perf_counter()
    mod, params = kiln.frontend.from_onnx(str(onnx_path))
    r["from_onnx_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    factory = kiln.build(mod, target=args.target, params=params)
    r["build_s"] = time.perf_counter() - t0
    r["build_cache"] = dict(cache.stats)
    pr = None
    if args.profile_export:
        import cProfile

        pr = cProfile.Profile()  # few, coarse Python calls: negligible overhead
        pr.enable()
    t0 = time.perf_counter()
    factory.export_library(str(so))
    r["export_s"] = time.perf_counter() - t0
    if pr is not None:
        import io
        import pstats

        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(20)
        r["export_profile"] = s.getvalue()
    r["total_cache"] = dict(cache.stats)
    t0 = time.perf_counter()
    kiln.runtime.load_module(str(so))
    r["load_s"] = time.perf_counter() - t0
    r["so_mb"] = so.stat().st_size / 2**20
    st = factory.get_stats() if callable(getattr(factory, "get_stats", None)) else {}
    r["stages"] = st.get("timings", {})
    r["kernels"] = {k: st.get(k) for k in ("num_kernel_calls", "num_functions")}
    return r


def run_child(args: argparse.Namespace, cache_dir: str, so: Path, onnx_path: Path) -> tuple[dict[str, Any], list[str]]:
    env = dict(os.environ, KILN_CACHE_DIR=cache_dir, KILN_DEBUG="1")
    env.pop("KILN_CACHE", None)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        jpath = f.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-json", jpath, "--onnx", str(onnx_path),
           "--so", str(so), "--target", args.target] + (["--profile-export"] if args.profile_export else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    debug = [ln for ln in proc.stderr.splitlines() if ln.startswith("[kiln.build]")]
    if proc.returncode != 0:
        os.unlink(jpath)
        raise SystemExit(f"child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    r = json.loads(Path(jpath).read_text())
    os.unlink(jpath)
    r["process_wall_s"] = wall
    return r, debug


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--out", default=str(common.DEFAULT_OUT))
    p.add_argument("--profile-export", action="store_true")
    p.add_argument("--keep-cache", action="store_true", help="do not delete the temp cache dir")
    p.add_argument("--write-results", action="store_true")
    p.add_argument("--child-json", help=argparse.SUPPRESS)
    p.add_argument("--onnx", help=argparse.SUPPRESS)
    p.add_argument("--so", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_json:
        Path(args.child_json).write_text(json.dumps(child(args), default=float))
        return 0

    info = common.machine_info()
    onnx_path = common.ensure_models([args.model], args.out)[args.model]
    cache_dir = tempfile.mkdtemp(prefix="kiln_bench_cache_")
    so = Path(args.out) / "build_time" / f"{args.model}.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    runs = {}
    try:
        for label in ("uncached", "cached"):
            mon = common.LoadMonitor()
            log(f"[{args.model}] {label} build (KILN_CACHE_DIR={cache_dir}) ...")
            r, debug = run_child(args, cache_dir, so, onnx_path)
            r["foreign_cores"] = mon.foreign_cores()
            r["debug"] = debug
            runs[label] = r
            log(f"[{args.model}] {label}: from_onnx {r['from_onnx_s']:.2f} s, build {r['build_s']:.2f} s, "
                f"export {r['export_s']:.2f} s, load {r['load_s']:.2f} s; cache {r['total_cache']}")
    finally:
        if not args.keep_cache:
            shutil.rmtree(cache_dir, ignore_errors=True)

    stage_names: list[str] = []
    for r in runs.values():
        for k in r["stages"]:
            if k not in stage_names and k != "total":
                stage_names.append(k)
    head = ["step"] + list(runs)
    rows = [["`import kiln` (+ frontend)"] + [f"{r['import_kiln_s']:.2f}" for r in runs.values()],
            ["from_onnx"] + [f"{r['from_onnx_s']:.2f}" for r in runs.values()],
            ["**kiln.build**"] + [f"**{r['build_s']:.2f}**" for r in runs.values()]]
    rows += [[f"  build: {k}"] + [f"{r['stages'].get(k, float('nan')):.2f}" for r in runs.values()]
             for k in stage_names]
    rows += [["**export_library**"] + [f"**{r['export_s']:.2f}**" for r in runs.values()],
             ["**build + export**"] + [f"**{r['build_s'] + r['export_s']:.2f}**" for r in runs.values()],
             ["load_module"] + [f"{r['load_s']:.2f}" for r in runs.values()],
             ["whole process (wall)"] + [f"{r['process_wall_s']:.2f}" for r in runs.values()],
             ["codegen cache hits / misses (build)"] + [_hits(r["build_cache"]) for r in runs.values()],
             ["codegen cache hits / misses (build+export)"] + [_hits(r["total_cache"]) for r in runs.values()],
             ["other processes' load (cores)"] + [f"{r['foreign_cores']:.2f}" if r.get("foreign_cores") is not None
                                                  else "?" for r in runs.values()]]
    k = runs["uncached"]["kernels"]
    text = common.md_table(head, rows, align="lrr")
    text += (f"\n\nSeconds. {args.model}: {k.get('num_kernel_calls')} kernel calls, {k.get('num_functions')} distinct "
             f"kernels, library {runs['uncached']['so_mb']:.1f} MiB. Each column is a fresh process; both share one "
             "new, empty `KILN_CACHE_DIR`.")
    passes = [ln for ln in runs["uncached"]["debug"] if "pass " in ln]
    if passes:
        text += "\n\nGraph passes (uncached, `KILN_DEBUG=1`): " + "; ".join(
            re.sub(r"^\[kiln\.build\]\s+pass\s+", "", ln) for ln in passes) + "."
    print(text)
    if args.profile_export:
        for label, r in runs.items():
            print(f"\nexport_library profile ({label}):\n" + r.get("export_profile", ""))
    if args.write_results:
        cmd = "python bench/bench_build_time.py " + " ".join(sys.argv[1:])
        body = "\n".join([f"- Command: `{cmd}`", f"- Date: {common.today()}",
                          f"- Machine: {common.machine_line(info)}",
                          f"- Versions: {common.versions_line(info['versions'])}",
                          f"- Target: `{args.target}`", "", text])
        common.replace_section(common.BENCH_DIR / "RESULTS.md", "bench_build_time", body,
                               "Build time (`bench_build_time.py`)")
        log("updated bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
