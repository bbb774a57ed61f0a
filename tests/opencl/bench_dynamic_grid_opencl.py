"""Run-time grids vs upper-bound grids: one dynamic OpenCL library at a small shape, same process.

Usage::

    python tests/opencl/bench_dynamic_grid_opencl.py [seq] [repeats]

Builds ``relu(x + b) -> softmax -> dense(384x384)`` over ``x: (1, seq, 384)`` with ``seq`` in
1..512 for ``opencl`` (PoCL on the CPU) and loads it twice: as built (launches at the grid of
the actual ``seq``) and with every launch's run-time grid removed (the upper-bound grid of the
Kilns before, all work-groups enqueued, the idle ones failing their guard). Times one
``run()`` plus a device sync of each, interleaved so that machine load affects both alike,
and prints the medians and the grids launched.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

import kiln
from kiln import ir


def build() -> kiln.runtime.Module:
    """The library (batch 1, dynamic ``seq`` in 1..512)."""
    rng = np.random.default_rng(0)
    g = ir.Graph("bench")
    g.declare_dim("seq", 1, 512)
    x = g.add_input("x", (1, "seq", 384))
    w = g.add_constant((rng.standard_normal((384, 384)) * 0.05).astype("float32"))
    b = g.add_constant((rng.standard_normal(384) * 0.1).astype("float32"))
    g.outputs = [g.add("dense", g.add("softmax", g.add("relu", g.add("add", x, b)), axis=-1), w)]
    return kiln.build(g, target="opencl")


def without_run_time_grids(lib: kiln.runtime.Module) -> None:
    """Drop every launch's run-time grid in place (the behaviour before run-time grids)."""
    for m in lib.walk():
        if m.type_key == "opencl":
            for name, f in list(m.functions.items()):
                m.functions[name] = dataclasses.replace(
                    f, launches=tuple(dataclasses.replace(ln, dyn_grid=()) for ln in f.launches))
            m._launchers.clear()


def main() -> None:
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    dev = kiln.opencl()
    libs = {"run-time grid": build(), "upper-bound grid": build()}
    without_run_time_grids(libs["upper-bound grid"])
    x = np.random.default_rng(1).standard_normal((1, seq, 384)).astype("float32")
    mods = {}
    for k, lib in libs.items():
        m = kiln.GraphModule(lib["default"](dev))
        m.set_input("x", x)
        m.run()
        dev.sync()
        mods[k] = m
    np.testing.assert_allclose(*(m.get_output(0).numpy() for m in mods.values()), rtol=1e-6)
    times: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(repeats):
        for k, m in mods.items():
            t0 = time.perf_counter()
            m.run()
            dev.sync()
            times[k].append(time.perf_counter() - t0)
    for k, lib in libs.items():
        mod = next(m for m in lib.walk() if m.type_key == "opencl")
        grids = {n[len("kilngen_default_"):]: la.grids for n, la in mod._launchers.items()}
        print(f"{k:17s} seq={seq}: median {np.median(times[k]) * 1e3:.3f} ms, min {min(times[k]) * 1e3:.3f} ms;"
              f" grids {grids}")


if __name__ == "__main__":
    main()
