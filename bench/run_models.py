"""End-to-end model benchmark: Kiln vs ONNX Runtime vs PyTorch eager, same inputs, same run.

For every model (batch 1, FP32; ``bench/models.py`` defines and exports them):

1. export to ONNX (cached in ``--out``);
2. Kiln: ``from_onnx`` -> ``kiln.build`` -> ``export_library`` -> ``load_module``, each timed;
3. correctness: Kiln's and PyTorch's outputs against ONNX Runtime's (|a-b| <= atol + rtol|b|,
   rtol 1e-3, atol 1e-4), checked at every thread count;
4. speed, at every thread count N: the three engines **interleaved** over ``--rounds`` rounds
   (each round: per engine a few warm-up runs + k timed runs, engine order rotated by one
   each round), medians over all timed runs;
   - Kiln: ``set_num_threads(N)`` on the loaded library (its thread pool honours a new
     count at the next parallel launch, so thread counts are switched in-process);
   - ONNX Runtime: ``ORT_ENABLE_ALL``, ``intra_op_num_threads=N``, ``inter_op_num_threads=1``,
     ``ORT_SEQUENTIAL``, one session per N;
   - PyTorch: eager, ``torch.set_num_threads(N)``, ``torch.inference_mode()``;
   every engine's timed call is a full inference from NumPy inputs to NumPy outputs;
5. ``--top-ops K``: the K slowest Kiln kernel nodes (debug executor, each node timed on its
   own) with their share of the time and their GFLOP/s where the op has MACs.

Each model runs in its own subprocess (a crash or a hang of one model does not lose the
others; ``--model-timeout``); ``--in-process`` turns that off.

Usage::

    python bench/run_models.py [--models resnet18,resnet50,mobilenetv2,minilm|broad|all] [--threads 1,2]
        [--rounds 5] [--target "llvm -mcpu=native"] [--top-ops 10] [--write-results]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ALL_MODELS = ["resnet18", "resnet50", "mobilenetv2", "minilm"]
ENGINES = ["kiln", "ort", "torch"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- Kiln side


def kiln_build(name: str, onnx_path: Path, inputs: dict[str, np.ndarray], target: str, so_path: Path,
               reuse: bool, tuning_log: str | None = None) -> dict[str, Any]:
    """Import, build, export, load; returns timings, stats and the loaded factory module."""
    import kiln

    res: dict[str, Any] = {"target": target, "so": str(so_path)}
    if reuse and so_path.exists():
        res["reused"] = True
    else:
        t0 = time.perf_counter()
        mod, params = kiln.frontend.from_onnx(str(onnx_path), shape={k: v.shape for k, v in inputs.items()})
        t1 = time.perf_counter()
        factory = kiln.build(mod, target=target, params=params,
                             **({"tuning_log": tuning_log} if tuning_log else {}))
        t2 = time.perf_counter()
        so_path.parent.mkdir(parents=True, exist_ok=True)
        factory.export_library(str(so_path))
        t3 = time.perf_counter()
        res.update(import_s=t1 - t0, build_s=t2 - t1, export_s=t3 - t2)
        get_stats = getattr(factory, "get_stats", None)
        if callable(get_stats):
            st = get_stats()
            res["stats"] = {k: st[k] for k in ("num_ops", "num_groups", "num_kernel_calls", "num_functions",
                                               "tuned_kernels")
                            if k in st}
            res["stages"] = st.get("timings", {})
        del factory, mod, params
    t3 = time.perf_counter()
    res["loaded"] = kiln.runtime.load_module(str(so_path))
    res["load_s"] = time.perf_counter() - t3
    res["so_mb"] = so_path.stat().st_size / 2**20
    return res


class KilnRunner:
    def __init__(self, loaded: Any, inputs: dict[str, np.ndarray]) -> None:
        import kiln

        self.loaded = loaded
        self.gm = kiln.GraphModule(loaded["default"](kiln.cpu()))
        shapes, dtypes = self.gm.get_input_info()
        self.inputs = {}
        for k, v in inputs.items():
            if k not in shapes:
                continue  # an input the compiler dropped (unused)
            self.inputs[k] = np.ascontiguousarray(v.astype(dtypes[k], copy=False))
        self.n_out = self.gm.get_num_outputs()

    def __call__(self) -> list[np.ndarray]:
        gm = self.gm
        gm.set_input(**self.inputs)
        gm.run()
        return [gm.get_output(i).numpy() for i in range(self.n_out)]

    def set_threads(self, n: int) -> int | None:
        return common.kiln_set_threads(self.loaded, n)


def _op_macs(func: str, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> float | None:
    """MACs of one Kiln kernel node from its shapes, for conv / dense / matmul kernels."""
    if not outs or not ins:
        return None
    f = func.lower()
    y = outs[0]
    try:
        if "conv2d" in f and len(ins) >= 2:
            w = ins[1]
            if len(y) == 4 and len(w) == 4 and w[0] == y[1]:      # NCHW / OIHW
                return math.prod(y) * math.prod(w) / w[0]
            if len(y) == 4 and len(w) == 4 and w[-1] == y[-1]:    # NHWC / HWIO
                return math.prod(y) * math.prod(w) / w[-1]
            if len(y) == 5 and len(w) in (6, 7):                  # NCHWc / OIHWio
                return math.prod(y) * math.prod(w) / (y[1] * y[4])
            return None
        if any(t in f for t in ("dense", "matmul", "batch_matmul", "gemm")) and len(ins) >= 2:
            return math.prod(y) * ins[0][-1]
    except (IndexError, TypeError, ZeroDivisionError):
        return None
    return None


def kiln_top_ops(loaded: Any, inputs: dict[str, np.ndarray], k: int, est_s: float) -> dict[str, Any]:
    """Profile every kernel node on its own (debug executor); the ``k`` slowest + op-kind totals."""
    import kiln

    dm = loaded.debug_create("default", kiln.cpu())
    shapes, dtypes = dm.get_input_info()
    dm.set_input(**{n: v.astype(dtypes[n], copy=False) for n, v in inputs.items() if n in shapes})
    number = common.runs_for(est_s, 400.0, 1, 10)
    rep = dm.profile(number=number, repeat=2)
    rows = []
    for r in rep.rows:
        macs = _op_macs(r.func_name, list(r.input_shapes), list(r.output_shapes))
        gflops = 2 * macs / (r.time_us * 1e-6) / 1e9 if macs and r.time_us > 0 else None
        rows.append({"name": r.name, "func": r.func_name, "us": r.time_us, "pct": r.percent,
                     "in": [list(s) for s in r.input_shapes], "out": [list(s) for s in r.output_shapes],
                     "gflops": gflops, "macs": macs})
    kinds: dict[str, dict[str, float]] = {}
    for r in rows:
        f = r["func"].lower()
        kind = ("conv2d(depthwise)" if "conv2d" in f and r["in"] and len(r["in"]) > 1 and len(r["in"][1]) == 4
                and r["in"][1][1] == 1 else
                "conv2d" if "conv2d" in f else
                "batch_matmul" if "batch_matmul" in f else
                "dense/matmul" if ("dense" in f or "matmul" in f) else
                "softmax" if "softmax" in f else
                "layer_norm" if ("layer_norm" in f or "layernorm" in f) else
                "pool" if "pool" in f else
                "nop" if f == "__nop" else "other")
        d = kinds.setdefault(kind, {"us": 0.0, "n": 0, "macs": 0.0})
        d["us"] += r["us"]
        d["n"] += 1
        d["macs"] += r["macs"] or 0.0
    total = rep.total_us or 1.0
    for d in kinds.values():
        d["pct"] = 100.0 * d["us"] / total
        d["gflops"] = 2 * d["macs"] / (d["us"] * 1e-6) / 1e9 if d["macs"] and d["us"] > 0 else None
    top = sorted(rows, key=lambda r: -r["us"])[:k]
    return {"total_us": rep.total_us, "number": number, "repeat": 2, "nodes": len(rows), "top": top,
            "kinds": kinds}


# ----------------------------------------------------------------------------- one model


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import models  # bench/models.py

    import torch

    out_dir = Path(args.out)
    onnx_path = models.export(name, out_dir)
    spec = models.spec(name)
    inputs: dict[str, np.ndarray] = spec["inputs"]
    threads = [int(t) for t in args.threads.split(",")]
    res: dict[str, Any] = {"model": name, "threads": {}, "errors": {}}
    fl = common.count_flops(onnx_path, {k: v.shape for k, v in inputs.items()})
    res["gflop"] = fl.gflop
    res["flops_by_op"] = fl.by_op
    log(f"[{name}] {fl.gflop:.3f} GFLOP per inference ({', '.join(f'{k} {v / 1e9:.3f}' for k, v in fl.by_op.items())})")

    # ---- reference: ONNX Runtime, 1 thread
    ref = common.ort_session(onnx_path, 1).run(None, inputs)

    # ---- PyTorch eager
    tmodel = None
    if "torch" in args.engines:
        tmodel = spec["build"]().eval()
        targs = tuple(torch.from_numpy(v) for v in inputs.values())

        def torch_run() -> list[np.ndarray]:
            with torch.inference_mode():
                y = tmodel(*targs)
            ys = y if isinstance(y, (tuple, list)) else (y,)
            return [t.numpy() for t in ys]

    # ---- Kiln
    kr = None
    if "kiln" in args.engines:
        so = out_dir / "kiln" / f"{name}.so"
        try:
            log(f"[{name}] kiln: import + build + export ({args.target}) ...")
            b = kiln_build(name, onnx_path, inputs, args.target, so, args.reuse_build)
            kr = KilnRunner(b.pop("loaded"), inputs)
            res["build"] = b
            if not b.get("reused"):
                log(f"[{name}] kiln: import {b['import_s']:.2f} s, build {b['build_s']:.2f} s, "
                    f"export {b['export_s']:.2f} s, load {b['load_s']:.2f} s, {b['so_mb']:.1f} MiB")
        except Exception as err:  # noqa: BLE001 - reported, the other engines still run
            res["errors"]["kiln"] = f"{type(err).__name__}: {err}"
            res["errors"]["kiln_tb"] = traceback.format_exc()
            log(f"[{name}] kiln FAILED: {type(err).__name__}: {err}")
    # --tuning-log: a second Kiln engine built with the log, timed interleaved with the others
    ktr = None
    if kr is not None and getattr(args, "tuning_log", None):
        bt = kiln_build(name, onnx_path, inputs, args.target, out_dir / "kiln" / f"{name}.tuned.so", False,
                        tuning_log=args.tuning_log)
        ktr = KilnRunner(bt.pop("loaded"), inputs)
        res["build_tuned"] = bt
        tuned = bt.get("stats", {}).get("tuned_kernels")
        log(f"[{name}] kiln_tuned: built with {args.tuning_log} ({tuned} tuned kernels)")

    for n in threads:
        log(f"[{name}] threads={n}")
        tr: dict[str, Any] = {"check": {}}
        engines: list[common.Engine] = []
        sess = None
        if "ort" in args.engines:
            sess = common.ort_session(onnx_path, n)
            engines.append(common.Engine("ort", lambda s=sess: s.run(None, inputs)))
        if tmodel is not None:
            torch.set_num_threads(n)
            tr["check"]["torch"] = _check(torch_run(), ref)
            engines.append(common.Engine("torch", torch_run, before=lambda n=n: torch.set_num_threads(n)))
        if kr is not None:
            try:
                tr["kiln_threads_reported"] = kr.set_threads(n)
                tr["check"]["kiln"] = _check(kr(), ref)
                engines.append(common.Engine("kiln", kr, before=lambda n=n: kr.set_threads(n)))
                if ktr is not None:
                    ktr.set_threads(n)
                    tr["check"]["kiln_tuned"] = _check(ktr(), ref)
                    engines.append(common.Engine("kiln_tuned", ktr, before=lambda n=n: ktr.set_threads(n)))
            except Exception as err:  # noqa: BLE001
                res["errors"]["kiln"] = f"{type(err).__name__}: {err}"
                log(f"[{name}] kiln run FAILED: {type(err).__name__}: {err}")
        for eng, c in tr["check"].items():
            log(f"[{name}]   {eng} vs ort: max abs err {c['max_abs']:.3g}, {c['verdict']}")
        if args.wait_quiet > 0:
            tr["foreign_before"] = common.wait_quiet(args.max_foreign, args.wait_quiet, log)
        tinfo: dict[str, Any] = {}
        timings = common.interleaved(engines, rounds=args.rounds, warmup=args.warmup, target_ms=args.round_ms,
                                     min_runs=args.min_runs, max_runs=args.max_runs, log=log, info=tinfo)
        tr["foreign_cores"] = tinfo.get("foreign_cores", [])
        tr["runs_per_round"] = tinfo.get("runs", {})
        tr["median_ms"] = {e: t.median * 1e3 for e, t in timings.items()}
        tr["min_ms"] = {e: t.min * 1e3 for e, t in timings.items()}
        tr["spread"] = {e: t.spread for e, t in timings.items()}
        tr["samples"] = {e: len(t.samples) for e, t in timings.items()}
        med = tr["median_ms"]
        if "kiln" in med:
            tr["kiln_gflops"] = res["gflop"] / (med["kiln"] / 1e3)
            if "ort" in med:
                tr["kiln_over_ort"] = med["kiln"] / med["ort"]
            if "torch" in med:
                tr["kiln_over_torch"] = med["kiln"] / med["torch"]
            if "kiln_tuned" in med:
                tr["kiln_tuned_over_kiln"] = med["kiln_tuned"] / med["kiln"]
                if "ort" in med:
                    tr["kiln_tuned_over_ort"] = med["kiln_tuned"] / med["ort"]
        for e in med:
            tr[f"{e}_gflops"] = res["gflop"] / (med[e] / 1e3)
        log(f"[{name}]   medians: " + ", ".join(f"{e} {v:.2f} ms" for e, v in med.items())
            + (f"; kiln/ort {tr['kiln_over_ort']:.2f}x" if "kiln_over_ort" in tr else ""))
        if args.top_ops and kr is not None and "kiln" in med:
            try:
                kr.set_threads(n)
                tr["top_ops"] = kiln_top_ops(kr.loaded, inputs, args.top_ops, med["kiln"] / 1e3)
                t = tr["top_ops"]
                log(f"[{name}]   profile: sum of nodes {t['total_us'] / 1e3:.2f} ms "
                    f"(whole graph median {med['kiln']:.2f} ms)")
            except Exception as err:  # noqa: BLE001
                tr["top_ops_error"] = f"{type(err).__name__}: {err}"
                log(f"[{name}]   top-ops FAILED: {type(err).__name__}: {err}")
        res["threads"][str(n)] = tr
        del sess
    return res


def _check(out: list[np.ndarray], ref: list[np.ndarray]) -> dict[str, Any]:
    c = common.compare(out, ref)
    return {"ok": c.ok, "max_abs": c.max_abs, "max_rel": c.max_rel, "excess": c.worst_excess, "verdict": c.verdict()}


# ----------------------------------------------------------------------------- report


def report(results: list[dict[str, Any]], args: argparse.Namespace, info: dict[str, Any], wall_s: float) -> str:
    lines: list[str] = []
    head = ["model", "threads", "Kiln ms", "ORT ms", "PyTorch ms", "Kiln/ORT", "Kiln/PyTorch",
            "Kiln GFLOP/s", "ORT GFLOP/s", "other load", "Kiln correct (max abs err vs ORT)"]
    rows = []
    for r in results:
        if "fatal" in r:
            rows.append([r["model"], "—", "—", "—", "—", "—", "—", "—", "—", "—", f"worker failed: {r['fatal']}"])
            continue
        for n, tr in r["threads"].items():
            med = tr.get("median_ms", {})
            ck = tr.get("check", {}).get("kiln")
            corr = (f"{ck['verdict']} ({ck['max_abs']:.2g})" if ck else
                    f"no Kiln: {r['errors'].get('kiln', 'not run')}".replace("|", "/")[:120])
            rows.append([
                r["model"], n,
                common.fmt_ms(med.get("kiln", math.nan) / 1e3), common.fmt_ms(med.get("ort", math.nan) / 1e3),
                common.fmt_ms(med.get("torch", math.nan) / 1e3),
                common.fmt_ratio(tr.get("kiln_over_ort")), common.fmt_ratio(tr.get("kiln_over_torch")),
                f"{tr['kiln_gflops']:.1f}" if "kiln_gflops" in tr else "—",
                f"{tr['ort_gflops']:.1f}" if "ort_gflops" in tr else "—",
                f"{max(tr['foreign_cores']):.2f}" if tr.get("foreign_cores") else "—",
                corr,
            ])
    lines.append(common.md_table(head, rows, align="lr" + "r" * 8 + "l"))
    lines.append("")
    lines.append("Medians in ms over all timed runs (batch 1, FP32). Ratios > 1: Kiln slower. "
                 "'other load': the most CPU (in cores) that other processes used during any one round "
                 "of that row (this machine is shared; > ~0.2 means the row is contaminated, 2-thread "
                 "rows most).")
    for r in results:  # --tuning-log: the kiln_tuned engine, timed interleaved with the others
        for n, tr in r.get("threads", {}).items():
            if "kiln_tuned_over_kiln" in tr:
                lines.append(f"{r['model']} {n} thread(s), built with --tuning-log "
                             f"({r.get('build_tuned', {}).get('stats', {}).get('tuned_kernels')} tuned kernels): "
                             f"{tr['median_ms']['kiln_tuned']:.2f} ms, {tr['kiln_tuned_over_kiln']:.3f}x Kiln"
                             + (f", {tr['kiln_tuned_over_ort']:.2f}x ORT" if "kiln_tuned_over_ort" in tr else "")
                             + f"; check {tr['check'].get('kiln_tuned', {}).get('verdict', '?')}.")
    lines.append("Model FLOPs (Conv/Gemm/MatMul MACs x 2, batch 1): " + ", ".join(
        f"{r['model']} {r['gflop']:.3f} GFLOP" for r in results if "gflop" in r) + ".")
    tchecks = []
    for r in results:
        for n, tr in r.get("threads", {}).items():
            c = tr.get("check", {}).get("torch")
            if c:
                tchecks.append(f"{r['model']}@{n}T {c['verdict']} ({c['max_abs']:.2g})")
    if tchecks:
        lines.append("PyTorch vs ORT (sanity of the reference): " + ", ".join(tchecks) + ".")
    spreads = []
    for r in results:
        for n, tr in r.get("threads", {}).items():
            for e, s in tr.get("spread", {}).items():
                if s > 0.10:
                    spreads.append(f"{r['model']}@{n}T {e} {100 * s:.0f}%")
    lines.append("Round-to-round spread of medians > 10%: " + (", ".join(spreads) if spreads else "none") + ".")

    # build times
    brow = []
    for r in results:
        b = r.get("build")
        if not b or b.get("reused"):
            continue
        st = b.get("stages", {})
        stats = b.get("stats", {})
        brow.append([r["model"], f"{b['import_s']:.2f}", f"{b['build_s']:.2f}", f"{b['export_s']:.2f}",
                     f"{b['load_s']:.2f}", f"{b['so_mb']:.1f}",
                     ", ".join(f"{k} {v:.2f}" for k, v in st.items() if k != "total"),
                     f"{stats.get('num_kernel_calls', '?')}/{stats.get('num_functions', '?')}"])
    if brow:
        lines += ["", "Kiln build (seconds; codegen cache as found in $KILN_CACHE_DIR):", ""]
        lines.append(common.md_table(["model", "import", "build", "export", "load", ".so MiB",
                                      "build stages", "kernel calls / functions"], brow, align="lrrrrrll"))

    # top ops
    for r in results:
        for n, tr in r.get("threads", {}).items():
            t = tr.get("top_ops")
            if not t:
                continue
            med = tr["median_ms"].get("kiln", math.nan)
            lines += ["", f"Kiln per-op profile, {r['model']}, {n} thread(s): sum of {t['nodes']} nodes "
                      f"{t['total_us'] / 1e3:.2f} ms (whole-graph median {med:.2f} ms). By op kind:", ""]
            krow = [[k, d["n"], f"{d['us'] / 1e3:.2f}", f"{d['pct']:.1f}",
                     f"{d['gflops']:.1f}" if d.get("gflops") else "—"]
                    for k, d in sorted(t["kinds"].items(), key=lambda kv: -kv[1]["us"])]
            lines.append(common.md_table(["op kind", "nodes", "ms", "%", "GFLOP/s"], krow))
            lines += ["", f"{len(t['top'])} slowest nodes:", ""]
            orow = [[o["func"].replace("kilngen_default_fused_", ""), f"{o['us'] / 1e3:.3f}", f"{o['pct']:.1f}",
                     f"{o['gflops']:.1f}" if o.get("gflops") else "—",
                     " ".join("x".join(map(str, s)) for s in o["in"]) + " -> " +
                     " ".join("x".join(map(str, s)) for s in o["out"])]
                    for o in t["top"]]
            lines.append(common.md_table(["kernel", "ms", "%", "GFLOP/s", "shapes (in -> out)"], orow,
                                         align="lrrrl"))
    errs = [(r["model"], r["errors"]) for r in results if r.get("errors")]
    for m, e in errs:
        for k, v in e.items():
            if not k.endswith("_tb"):
                lines.append(f"\nError ({m}, {k}): `{v[:400]}`")
    return "\n".join(lines)


def write_results(text: str, args: argparse.Namespace, info: dict[str, Any], wall_s: float) -> None:
    cmd = "python bench/run_models.py " + " ".join(sys.argv[1:])
    body = "\n".join([
        f"- Command: `{cmd}`",
        f"- Date: {common.today()}; wall time {wall_s / 60:.1f} min",
        f"- Machine: {common.machine_line(info)}",
        f"- Versions: {common.versions_line(info['versions'])}",
        f"- Target: `{args.target}`; rounds {args.rounds}, warm-up {args.warmup} per block, "
        f"~{args.round_ms:.0f} ms of timed runs per engine per round ({args.min_runs}..{args.max_runs} runs); "
        f"thread counts switched in-process; one subprocess per model",
        "",
        text,
    ])
    common.replace_section(common.BENCH_DIR / "RESULTS.md", "run_models", body, "End-to-end models (`run_models.py`)")
    log(f"updated {common.BENCH_DIR / 'RESULTS.md'}")


# ----------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(ALL_MODELS))
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per engine per round")
    p.add_argument("--round-ms", type=float, default=300.0, help="timed time per engine per round (sets k)")
    p.add_argument("--min-runs", type=int, default=2, help="timed runs per engine per round, at least")
    p.add_argument("--max-runs", type=int, default=30, help="timed runs per engine per round, at most")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--engines", default="kiln,ort,torch")
    p.add_argument("--top-ops", type=int, default=0, help="print the N slowest Kiln kernels per model")
    p.add_argument("--out", default=str(common.DEFAULT_OUT))
    p.add_argument("--reuse-build", action="store_true", help="reuse out/kiln/<model>.so if present")
    p.add_argument("--tuning-log", default=None,
                   help="also time a Kiln build that applies this `kiln tune` log (engine kiln_tuned)")
    p.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    p.add_argument("--json", help="also write all results as JSON here")
    p.add_argument("--in-process", action="store_true", help="no subprocess per model")
    p.add_argument("--model-timeout", type=float, default=900.0, help="seconds per model subprocess")
    p.add_argument("--wait-quiet", type=float, default=60.0,
                   help="before timing each thread count, wait up to this many seconds for the machine "
                        "to be quiet (other processes < --max-foreign cores); 0: don't wait")
    p.add_argument("--max-foreign", type=float, default=0.25, help="see --wait-quiet")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-json", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        res = bench_model(args.worker, args)
        res["errors"].pop("kiln_tb", None) if not os.environ.get("KILN_BENCH_TB") else None
        Path(args.worker_json).write_text(json.dumps(res, default=float))
        return 0
    t_start = time.perf_counter()
    info = common.machine_info()
    log(f"machine: {common.machine_line(info)}")
    log(f"versions: {common.versions_line(info['versions'])}")
    sys.path.insert(0, str(common.BENCH_DIR))
    import broad_models
    import models

    names = []
    for m in (m.strip() for m in args.models.split(",") if m.strip()):
        # "broad": the families of broad_models.py; "all": those and the tuned four
        names += broad_models.names() if m == "broad" else models.all_names() if m == "all" else [m]
    known = models.all_names()
    unknown = [m for m in names if m not in known]
    if unknown:
        log(f"unknown model(s) {unknown}; known: {known} (or 'broad', 'all')")
        return 2
    common.ensure_models(names, args.out)
    results = []
    for name in names:
        if args.in_process:
            results.append(bench_model(name, args))
            continue
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            jpath = f.name
        cmd = [sys.executable, str(Path(__file__).resolve())] + (argv if argv is not None else sys.argv[1:])
        cmd += ["--worker", name, "--worker-json", jpath]
        try:
            proc = subprocess.run(cmd, timeout=args.model_timeout)
            if proc.returncode == 0:
                results.append(json.loads(Path(jpath).read_text()))
            else:
                results.append({"model": name, "fatal": f"exit code {proc.returncode}", "errors": {}})
        except subprocess.TimeoutExpired:
            results.append({"model": name, "fatal": f"timeout after {args.model_timeout:.0f} s", "errors": {}})
        finally:
            os.unlink(jpath)
    wall = time.perf_counter() - t_start
    text = report(results, args, info, wall)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=1, default=float))
    if args.write_results:
        write_results(text, args, info, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
