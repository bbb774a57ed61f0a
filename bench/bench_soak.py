"""Soak test: run one real model many times on the crt thread pool; report runs/s.

A short benchmark cannot see what goes wrong after tens of thousands of runs: a thread
pool that hangs once in ~40,000 runs (the race fixed with the epoch-packed claim word in
``kiln_crt.c``), a wrong answer from a task run twice, threads, memory or mapped libraries
that pile up. This script compiles a model (default: ``kiln/data/demo_cnn.onnx``, the small
residual CNN that ships with Kiln; any ONNX file with static shapes works), exports it,
loads it back and runs it ``--runs`` times with ``--threads`` threads, comparing the output
bit for bit with the first run's every ``--check-every`` runs. A watchdog ends the process
with exit status 3 and every thread's stack if no run finishes for ``--hang-s`` seconds.

``--tar-loads N`` first loads the model exported as ``.tar`` N times (each load compiles),
runs each once and drops it, then reports how many deleted library files stay mapped.

Usage::

    python bench/bench_soak.py                            # demo CNN, 100,000 runs, 2 threads
    python bench/bench_soak.py --runs 1000000 --model bench/out/resnet18.onnx
    python bench/bench_soak.py --runs 1000 --tar-loads 100
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import resource
import sys
import tempfile
import threading
import time

import numpy as np

import kiln
import kiln.runtime as rt
from kiln.cli.demo_cmd import demo_model_path


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _deleted_libraries() -> int:
    with open("/proc/self/maps") as f:
        return len({line.split(None, 5)[5] for line in f if line.rstrip().endswith(".so (deleted)")})


def _inputs(m: rt.GraphModule) -> dict[str, np.ndarray]:
    shapes, dtypes = m.get_input_info()
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shapes[name]).astype(dtypes[name]) for name in shapes}


def _outputs(m: rt.GraphModule) -> list[np.ndarray]:
    return [m.get_output(i).numpy().copy() for i in range(m.get_num_outputs())]


class Watchdog:
    """Ends the process if :meth:`tick` is not called for ``limit_s`` seconds."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.runs = 0
        self._last = time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def tick(self, runs: int) -> None:
        self.runs = runs
        self._last = time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.limit_s / 4))
            if time.monotonic() - self._last > self.limit_s:
                print(f"HUNG: no run finished for {self.limit_s:.0f} s after {self.runs} runs", flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)


def soak(m: rt.GraphModule, runs: int, check_every: int, hang_s: float) -> float:
    """Run ``m`` ``runs`` times; returns the seconds taken. Raises on a changed output."""
    m.run()
    want = _outputs(m)
    dog = Watchdog(hang_s)
    report_every = max(runs // 10, 1)
    t0 = time.perf_counter()
    for i in range(1, runs + 1):
        m.run()
        dog.tick(i)
        if i % check_every == 0:
            got = _outputs(m)
            if not all(np.array_equal(a, b) for a, b in zip(got, want)):
                raise SystemExit(f"run {i}: the output differs from the first run's")
        if i % report_every == 0:
            dt = time.perf_counter() - t0
            print(f"  {i:>9,} runs  {dt:8.1f} s  {i / dt:10,.0f} runs/s  threads {_threads()}", flush=True)
    return time.perf_counter() - t0


def tar_loads(path: str, count: int, inputs: dict[str, np.ndarray]) -> None:
    """Load ``path`` (a .tar) ``count`` times, run each once, drop it; report what stays."""
    before = _deleted_libraries()
    t0 = time.perf_counter()
    for _ in range(count):
        m = rt.GraphModule(rt.load_module(path)["default"](rt.cpu()))
        m.run(**inputs)
        del m
        gc.collect()
    dt = time.perf_counter() - t0
    print(
        f"{count} .tar loads in {dt:.1f} s: {_deleted_libraries() - before} deleted library files still "
        f"mapped, {_threads()} threads"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=demo_model_path(), help="ONNX file (default: the demo CNN)")
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--check-every", type=int, default=1000, metavar="N", help="compare outputs every N runs")
    ap.add_argument("--hang-s", type=float, default=60.0, help="watchdog limit per run (s)")
    ap.add_argument("--tar-loads", type=int, default=0, metavar="N", help="also load the .tar export N times")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="kiln_soak_") as tmp:
        t0 = time.perf_counter()
        mod, params = kiln.frontend.from_onnx(args.model)
        factory = kiln.build(mod, target=args.target, params=params)
        so = factory.export_library(os.path.join(tmp, "model.so"))
        print(
            f"model {os.path.basename(args.model)}: built for {args.target!r} and exported in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        loaded = rt.load_module(so)
        lib = loaded.get_lib()  # the kernel library; its thread pool is the process's
        lib.set_num_threads(args.threads)
        m = rt.GraphModule(loaded["default"](rt.cpu()))
        inputs = _inputs(m)
        m.set_input(**inputs)
        print(f"{args.runs:,} runs with {lib.get_num_threads()} threads (process: {_threads()} threads)")
        dt = soak(m, args.runs, args.check_every, args.hang_s)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"done: {args.runs:,} runs in {dt:.1f} s, {args.runs / dt:,.0f} runs/s, "
            f"{_threads()} threads, peak RSS {rss:.0f} MiB"
        )
        if args.tar_loads:
            tar = factory.export_library(os.path.join(tmp, "model.tar"))
            tar_loads(tar, args.tar_loads, inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
