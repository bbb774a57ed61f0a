"""Kiln softmax / log_softmax kernels vs ONNX Runtime, same process, same inputs.

Each case is a small ONNX model built here and run end to end: ``kiln.frontend.from_onnx`` ->
``kiln.build`` -> ``export_library`` -> ``load_module``, then ``GraphModule.run()`` is timed
(inputs set once; the timed call is the kernel(s) plus the executor's native dispatch). ONNX
Runtime runs the same model through an IOBinding with the input and a preallocated output
bound once, so neither side pays for allocating or copying the output in the timed call.

Cases (``--cases``, comma-separated ``kind:shape[:axis]``):

* ``softmax`` / ``logsoftmax`` — one ``Softmax`` / ``LogSoftmax`` node (opset 13) on a random
  normal input scaled by 3 (``axis`` default -1);
* ``masked`` — ``Softmax(x * 0.125 + mask)`` as in attention, ``mask`` a graph input of the same
  shape with a quarter of the entries ``-inf`` (and one whole row masked, whose softmax is NaN
  in both engines: 0 / 0).

``--baseline-src DIR`` adds a third engine, ``before``: the same models built by the Kiln
source tree ``DIR`` (a copy of ``src/`` from another commit) in a subprocess, exported, and
loaded here by this tree's runtime, so old and new kernels are timed interleaved in one
process.

Engines are interleaved over ``--rounds`` rounds (order rotated each round, medians of all
runs; :func:`common.interleaved`), all at ``--threads`` threads (Kiln via
``set_num_threads``, ORT via ``intra_op_num_threads``, and ``KILN_NUM_THREADS`` /
``OMP_NUM_THREADS`` set before anything is imported).

Usage::

    python bench/bench_softmax.py [--cases softmax:1x8x128x128,...] [--threads 1] [--rounds 7]
        [--target "llvm -mcpu=native"] [--baseline-src /tmp/old/src]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEFAULT_CASES = ("softmax:1x8x128x128,softmax:1x12x197x197,softmax:8x1000,softmax:1x4x16x16,"
                 "softmax:1x8x128x128:1,logsoftmax:1x8x128x128,masked:1x12x197x197")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_case(spec: str) -> tuple[str, tuple[int, ...], int]:
    parts = spec.split(":")
    kind, shape = parts[0], tuple(int(d) for d in parts[1].lower().split("x"))
    axis = int(parts[2]) if len(parts) > 2 else -1
    if kind not in ("softmax", "logsoftmax", "masked"):
        raise SystemExit(f"unknown case kind {kind!r} in {spec!r}")
    return kind, shape, axis


def case_tag(kind: str, shape: tuple[int, ...], axis: int) -> str:
    return f"{kind}-{'x'.join(map(str, shape))}-a{axis}"


def case_model(kind: str, shape: tuple[int, ...], axis: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    inputs, inits = [x], []
    if kind == "masked":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(shape)))
        inits.append(numpy_helper.from_array(np.array(0.125, np.float32), "scale"))
        nodes = [helper.make_node("Mul", ["x", "scale"], ["xs"]),
                 helper.make_node("Add", ["xs", "mask"], ["z"]),
                 helper.make_node("Softmax", ["z"], ["y"], axis=axis)]
    else:
        op = "Softmax" if kind == "softmax" else "LogSoftmax"
        nodes = [helper.make_node(op, ["x"], ["y"], axis=axis)]
    g = helper.make_graph(nodes, kind, inputs, [y], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def case_inputs(kind: str, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"x": (3.0 * rng.standard_normal(shape)).astype(np.float32)}
    if kind == "masked":
        mask = np.where(rng.random(shape) < 0.25, -np.inf, 0.0).astype(np.float32)
        mask.reshape(-1, shape[-1])[0] = -np.inf  # one fully masked row: NaN in both engines
        feeds["mask"] = mask
    return feeds


def build_libs(cases: list[tuple[str, tuple[int, ...], int]], target: str, out_dir: Path) -> dict[str, Any]:
    """Build and export every case with the ``kiln`` importable here; ``tag -> .so path / error``."""
    import kiln

    res: dict[str, Any] = {}
    for kind, shape, axis in cases:
        tag = case_tag(kind, shape, axis)
        onnx_path = out_dir / f"{tag}.onnx"
        onnx_path.write_bytes(case_model(kind, shape, axis))
        try:
            t0 = time.perf_counter()
            mod, params = kiln.frontend.from_onnx(str(onnx_path))
            factory = kiln.build(mod, target=target, params=params)
            so = out_dir / f"{tag}.so"
            factory.export_library(str(so))
            res[tag] = {"so": str(so), "build_s": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - reported per case; the others still run
            res[tag] = {"error": f"{type(e).__name__}: {e}"}
    return res


def kiln_engine(so: str, feeds: dict[str, np.ndarray], threads: int) -> tuple[Any, np.ndarray]:
    import kiln

    loaded = kiln.runtime.load_module(so)
    common.kiln_set_threads(loaded, threads)
    gm = kiln.GraphModule(loaded["default"](kiln.cpu()))
    for k, v in feeds.items():
        gm.set_input(k, v)
    gm.run()
    return gm.run, gm.get_output(0).numpy()


def ort_engine(onnx_path: Path, feeds: dict[str, np.ndarray], threads: int) -> tuple[Any, np.ndarray]:
    sess = common.ort_session(onnx_path, threads)
    b = sess.io_binding()
    for k, v in feeds.items():
        b.bind_cpu_input(k, v)
    out = np.empty_like(feeds["x"])
    b.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    sess.run_with_iobinding(b)
    # the closure keeps ``out`` alive: ORT writes into its memory on every run
    return (lambda out=out: sess.run_with_iobinding(b)), out.copy()


def same(a: np.ndarray, b: np.ndarray) -> str:
    """``ok`` / a failure note: NaN exactly where the other has NaN, else close."""
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        return f"FAIL (NaN at {int(na.sum())} vs {int(nb.sum())} places)"
    ok = np.allclose(a[~na], b[~nb], rtol=1e-4, atol=1e-5)
    err = float(np.max(np.abs(a[~na] - b[~nb]), initial=0.0))
    return "ok" if ok else f"FAIL (max abs err {err:.2g})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated kind:shape[:axis]")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--round-ms", type=float, default=150.0)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--baseline-src", help="a Kiln src/ tree to build the 'before' kernels with")
    p.add_argument("--out", default=str(common.DEFAULT_OUT / "softmax"))
    p.add_argument("--wait-quiet", type=float, default=20.0, help="wait up to this long for a quiet machine")
    p.add_argument("--build-only", help=argparse.SUPPRESS)  # worker mode: write build results here
    args = p.parse_args(argv)
    cases = [parse_case(c) for c in args.cases.split(",")]
    out_dir = Path(args.out)
    if args.build_only:
        out_dir.mkdir(parents=True, exist_ok=True)
        Path(args.build_only).write_text(json.dumps(build_libs(cases, args.target, out_dir)))
        return 0
    if os.environ.get("KILN_NUM_THREADS") != str(args.threads):
        # pools size themselves at first use: restart with the thread variables set
        env = dict(os.environ, KILN_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads))
        return subprocess.run([sys.executable, str(Path(__file__).resolve())] + (argv or sys.argv[1:]),
                              env=env).returncode

    info = common.machine_info()
    print(f"# {common.machine_line(info)}")
    print(f"# {common.versions_line(info['versions'])}")
    print(f"# threads {args.threads}, target {args.target!r}, rounds {args.rounds}, {common.today()}")
    (out_dir / "new").mkdir(parents=True, exist_ok=True)
    new = build_libs(cases, args.target, out_dir / "new")
    old: dict[str, Any] = {}
    if args.baseline_src:
        (out_dir / "before").mkdir(parents=True, exist_ok=True)
        jpath = out_dir / "before" / "build.json"
        env = dict(os.environ, PYTHONPATH=str(Path(args.baseline_src).resolve()))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cases", args.cases, "--target", args.target,
               "--out", str(out_dir / "before"), "--build-only", str(jpath)]
        if subprocess.run(cmd, env=env).returncode == 0:
            old = json.loads(jpath.read_text())
        else:
            log("baseline build failed")

    rows = []
    for kind, shape, axis in cases:
        tag = case_tag(kind, shape, axis)
        feeds = case_inputs(kind, shape)
        if args.wait_quiet > 0:
            common.wait_quiet(0.25, args.wait_quiet, log)
        ort_run, ref = ort_engine(out_dir / "new" / f"{tag}.onnx", feeds, args.threads)
        engines = [common.Engine("ort", ort_run)]
        verdict = {}
        for name, built in (("kiln", new.get(tag, {})), ("before", old.get(tag, {}))):
            if "so" in built:
                run, y = kiln_engine(built["so"], feeds, args.threads)
                verdict[name] = same(y, ref)
                engines.append(common.Engine(name, run))
            elif "error" in built:
                verdict[name] = built["error"][:80]
        stats: dict[str, Any] = {}
        t = common.interleaved(engines, rounds=args.rounds, warmup=3, target_ms=args.round_ms, min_runs=5,
                               max_runs=2000, info=stats)
        ms = {e: tm.median * 1e3 for e, tm in t.items()}
        load = max(stats.get("foreign_cores") or [0.0])
        row = [f"{kind} {'x'.join(map(str, shape))} axis {axis}"]
        if args.baseline_src:
            row += [f"{ms['before']:.4f}" if "before" in ms else "—"]
        row += [f"{ms['kiln']:.4f}" if "kiln" in ms else "—", f"{ms['ort']:.4f}"]
        if args.baseline_src:
            row += [f"{ms['before'] / ms['ort']:.2f}x" if "before" in ms else "—"]
        row += [f"{ms['kiln'] / ms['ort']:.2f}x" if "kiln" in ms else "—"]
        if args.baseline_src and "before" in ms and "kiln" in ms:
            row += [f"{ms['before'] / ms['kiln']:.2f}x"]
        row += [verdict.get("kiln", "—"), f"{load:.2f}"]
        rows.append(row)
        log(" | ".join(row))
    head = ["case"] + (["before ms"] if args.baseline_src else []) + ["Kiln ms", "ORT ms"]
    head += (["before/ORT"] if args.baseline_src else []) + ["Kiln/ORT"]
    head += (["speed-up"] if args.baseline_src else []) + ["Kiln vs ORT output", "other load (cores)"]
    print(common.md_table(head, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
