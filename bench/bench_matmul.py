"""Kiln matmul kernels vs NumPy's BLAS (``a @ b``), same process, same inputs.

Each shape is built the end-to-end way: a one-op ONNX ``MatMul`` model goes through
``kiln.frontend.from_onnx`` -> ``kiln.build`` -> ``export_library`` -> ``load_module``, then
``GraphModule.run()`` is timed (inputs set once; the timed call is the kernel plus the
executor's one native dispatch). Two variants per shape:

* ``B input``  — both operands are graph inputs (a general matmul kernel);
* ``B const``  — B is an initializer, as a linear layer's weight (the compiler may pre-pack it).

NumPy computes ``a @ b`` on the same arrays (its BLAS: OpenBLAS for the NumPy wheels).
Kiln and NumPy are interleaved over ``--rounds`` rounds; medians are reported.

Thread counts: each count runs in a fresh subprocess with ``KILN_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to it, so that both
libraries' pools start with the intended size (if ``threadpoolctl`` is installed, the BLAS
pool size in effect is also checked and reported).

Usage::

    python bench/bench_matmul.py [--shapes 1024x1024x1024,128x384x1536] [--threads 1,2]
        [--rounds 5] [--target "llvm -mcpu=native"] [--write-results]

A shape is ``MxKxN``: (M, K) @ (K, N).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEFAULT_SHAPES = "1024x1024x1024,128x384x1536"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def matmul_onnx(m: int, k: int, n: int, b_const: np.ndarray | None) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])]
    inits = []
    if b_const is None:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n]))
    else:
        inits.append(numpy_helper.from_array(b_const, "B"))
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])
    g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "matmul", inputs, [y], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(f"{i.get('internal_api')} {i.get('num_threads')}" for i in threadpool_info()
                         if i.get("user_api") == "blas") or "?"
    except ImportError:
        return f"env {os.environ.get('OPENBLAS_NUM_THREADS', '?')} (threadpoolctl not installed)"


def worker(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    import kiln

    out_dir = Path(args.out) / "matmul"
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"threads": threads, "blas_threads": blas_threads(), "rows": []}
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        m, k, n = (int(x) for x in shape.lower().split("x"))
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        flop = 2.0 * m * k * n
        ref = a.astype(np.float64) @ b.astype(np.float64)
        for variant in args.variants.split(","):
            row: dict[str, Any] = {"shape": f"{m}x{k}x{n}", "variant": variant, "threads": threads}
            res["rows"].append(row)
            const = variant == "const"
            tag = f"{m}x{k}x{n}-{variant}"
            try:
                onnx_path = out_dir / f"{tag}.onnx"
                onnx_path.write_bytes(matmul_onnx(m, k, n, b if const else None))
                t0 = time.perf_counter()
                mod, params = kiln.frontend.from_onnx(str(onnx_path))
                factory = kiln.build(mod, target=args.target, params=params)
                so = out_dir / f"{tag}.so"
                factory.export_library(str(so))
                row["build_s"] = time.perf_counter() - t0
                loaded = kiln.runtime.load_module(str(so))
                row["kiln_threads"] = common.kiln_set_threads(loaded, threads)
                gm = kiln.GraphModule(loaded["default"](kiln.cpu()))
                gm.set_input("A", a)
                if not const:
                    gm.set_input("B", b)
                gm.run()
                y = gm.get_output(0).numpy()
                err = float(np.abs(y - ref).max() / np.abs(ref).max())
                row["rel_err"] = err
                row["correct"] = bool(err < 1e-4)
                kiln_fn = gm.run
            except Exception as e:  # noqa: BLE001 - reported; NumPy is still timed
                row["error"] = f"{type(e).__name__}: {e}"
                log(f"[matmul {tag} {threads}T] kiln FAILED: {row['error']}")
                kiln_fn = None
            engines = [common.Engine("numpy", lambda a=a, b=b: a @ b)]
            if kiln_fn is not None:
                engines.append(common.Engine("kiln", kiln_fn))
            info: dict[str, Any] = {}
            t = common.interleaved(engines, rounds=args.rounds, warmup=2, target_ms=args.round_ms,
                                   min_runs=3, max_runs=200, info=info)
            row["foreign_cores"] = max(info.get("foreign_cores") or [0.0])
            for e, tm in t.items():
                row[f"{e}_ms"] = tm.median * 1e3
                row[f"{e}_gflops"] = flop / tm.median / 1e9
            if "kiln_ms" in row:
                row["kiln_over_numpy_pct"] = 100.0 * row["kiln_gflops"] / row["numpy_gflops"]
            log(f"[matmul {tag} {threads}T] numpy {row['numpy_gflops']:.1f} GFLOP/s"
                + (f", kiln {row['kiln_gflops']:.1f} GFLOP/s ({row['kiln_over_numpy_pct']:.0f}% of NumPy), "
                   f"rel err {row['rel_err']:.2g}" if "kiln_gflops" in row else "")
                + f"; other load {row['foreign_cores']:.2f} cores")
    return res


def report(all_rows: list[dict[str, Any]]) -> str:
    head = ["M×K×N", "B", "threads", "Kiln GFLOP/s", "NumPy GFLOP/s", "Kiln/NumPy", "Kiln ms", "NumPy ms",
            "Kiln correct", "other load"]
    rows = []
    for r in all_rows:
        rows.append([
            r["shape"], "input" if r["variant"] == "input" else "const (weight)", r["threads"],
            f"{r['kiln_gflops']:.1f}" if "kiln_gflops" in r else "—",
            f"{r['numpy_gflops']:.1f}" if "numpy_gflops" in r else "—",
            f"{r['kiln_over_numpy_pct']:.0f}%" if "kiln_over_numpy_pct" in r else "—",
            common.fmt_ms(r.get("kiln_ms", float("nan")) / 1e3), common.fmt_ms(r.get("numpy_ms", float("nan")) / 1e3),
            ("ok" if r["correct"] else f"FAIL (rel err {r['rel_err']:.2g})") if "correct" in r
            else r.get("error", "—").replace("|", "/")[:100],
            f"{r.get('foreign_cores', 0):.2f}",
        ])
    return common.md_table(head, rows, align="llrrrrrrlr")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated MxKxN")
    p.add_argument("--variants", default="input,const", help="input: B is a graph input; const: B is a weight")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--round-ms", type=float, default=200.0)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--out", default=str(common.DEFAULT_OUT))
    p.add_argument("--wait-quiet", type=float, default=60.0, help="wait up to this long for a quiet machine")
    p.add_argument("--write-results", action="store_true")
    p.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-json", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_threads:
        Path(args.worker_json).write_text(json.dumps(worker(args, args.worker_threads), default=float))
        return 0
    info = common.machine_info()
    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    blas = {}
    for n in (int(t) for t in args.threads.split(",")):
        if args.wait_quiet > 0:
            common.wait_quiet(0.25, args.wait_quiet, log)
        env = dict(os.environ)
        for var in ("KILN_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(n)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            jpath = f.name
        cmd = [sys.executable, str(Path(__file__).resolve())] + (argv if argv is not None else sys.argv[1:])
        cmd += ["--worker-threads", str(n), "--worker-json", jpath]
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0:
            log(f"worker for {n} thread(s) failed with exit code {proc.returncode}")
            os.unlink(jpath)
            continue
        res = json.loads(Path(jpath).read_text())
        os.unlink(jpath)
        blas[n] = res["blas_threads"]
        rows += res["rows"]
    shapes = args.shapes.split(",")
    variants = args.variants.split(",")
    rows.sort(key=lambda r: (shapes.index(r["shape"]) if r["shape"] in shapes else 99,
                             variants.index(r["variant"]) if r["variant"] in variants else 99, r["threads"]))
    text = report(rows)
    text += ("\n\nGFLOP/s = 2·M·K·N / median time of one call. Kiln: `GraphModule.run()` of a one-op ONNX "
             "MatMul model built with `kiln.build`; NumPy: `a @ b` (" + common.versions().get("numpy_blas", "BLAS")
             + "; BLAS threads: " + "; ".join(f"{k}T: {v}" for k, v in blas.items()) + "). "
             "Relative error = max |Kiln - float64 reference| / max |reference|.")
    print(text)
    if args.write_results:
        cmd = "python bench/bench_matmul.py " + " ".join(sys.argv[1:])
        body = "\n".join([
            f"- Command: `{cmd}`",
            f"- Date: {common.today()}; wall time {(time.perf_counter() - t_start) / 60:.1f} min",
            f"- Machine: {common.machine_line(info)}",
            f"- Versions: {common.versions_line(info['versions'])}",
            f"- Target: `{args.target}`; rounds {args.rounds}; one subprocess per thread count",
            "", text])
        common.replace_section(common.BENCH_DIR / "RESULTS.md", "bench_matmul", body,
                               "Matmul kernels (`bench_matmul.py`)")
        log("updated bench/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
