"""Per-layer Winograd F(2x2, 3x3) against the direct ``conv2d_nchwc`` kernel, with each
Winograd kernel's share.

Each case is a one-conv graph, a 3x3 pad-1 ``conv2d`` + bias + ReLU on ``(1, C, HW, HW)``,
built twice in this process: ``KILN_WINOGRAD=0`` (direct, A) and ``=1`` (Winograd, B).  Times
are the debug executor's per-node profile summed over the kernels between the edge
``layout_transform`` s, medians of ``--rounds`` interleaved rounds; the Winograd columns split
B into its input transform, GEMMs and output transform (with the fused epilogue).  The last
column is B's largest error relative to ``kiln.ir.evaluate`` of the conv.  ``--planes``: A is
Winograd with compact planes instead of the direct kernel, B with the planes the layout pass
picks (``kiln.ir.ops.winograd.winograd_plane_rows``), both split into stages.

The figures quoted in ``kiln.transform.alter_layout._winograd_default`` and ``docs/topi.md``
were taken on an AMD EPYC Zen 5 (family 26 model 2, AVX-512), ``KILN_NUM_THREADS=1``.  To
compare two source trees, run this script once with each on ``PYTHONPATH``.

Usage: ``KILN_NUM_THREADS=1 python bench/bench_winograd_layers.py [--target T] [--rounds 7]
[C,K,HW ...]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

#: ResNet-18 / ResNet-50's 3x3 stride-1 layers and a few other sizes.
DEFAULT_SHAPES = [(64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7), (64, 128, 56), (128, 64, 28),
                  (128, 256, 28), (256, 128, 14), (256, 512, 14), (512, 256, 7), (256, 256, 12), (256, 256, 10),
                  (128, 128, 8)]

#: Kernel name fragments of the three Winograd stages (the GEMM kernel is a fused ``matmul``).
_STAGES = (("input", "winograd_input_transform"), ("gemm", "matmul"), ("output", "winograd_output_transform"))


def _build(c: int, k: int, hw: int, wino: str, target: str, compact: bool = False) -> tuple[Any, np.ndarray,
                                                                                              np.ndarray]:
    """The debug module of the case with ``KILN_WINOGRAD=wino`` (``compact``: the transformed
    planes never spaced), its output and the reference."""
    import kiln
    import kiln.transform.alter_layout as al
    from kiln.ir import Graph, evaluate
    from kiln.runtime.debug_executor import GraphModuleDebug
    from kiln.transform.alter_layout import WINOGRAD_ENV

    rng = np.random.default_rng(0)
    g = Graph()
    x = g.add_input("x", (1, c, hw, hw))
    y = g.add("conv2d", x, g.add_constant((rng.standard_normal((k, c, 3, 3)) * 0.05).astype("float32")),
              padding=(1, 1, 1, 1))
    g.outputs = [g.add("relu", g.add("bias_add", y, g.add_constant(rng.standard_normal(k).astype("float32"))))]
    os.environ[WINOGRAD_ENV] = wino
    rule = al.winograd_plane_rows
    if compact:
        al.winograd_plane_rows = lambda tiles, channels, itemsize=4: tiles
    try:
        mod = GraphModuleDebug(kiln.build(g, target=target)["default"](kiln.cpu()))
    finally:
        al.winograd_plane_rows = rule
    xv = rng.standard_normal((1, c, hw, hw)).astype("float32")
    mod.set_input(x=xv)
    mod.run()
    return mod, mod.get_output(0).numpy(), evaluate(g, {"x": xv})[0]


def _kernel_times(mod: Any, number: int) -> dict[str, float]:
    """Per-stage microseconds of one profile (``total``: every kernel but the layout transforms)."""
    out = {"total": 0.0}
    for row in mod.profile(number=number, repeat=1).rows:
        if "layout_transform" in row.func_name:
            continue
        out["total"] += row.time_us
        for stage, frag in _STAGES:
            if frag in row.func_name:
                out[stage] = out.get(stage, 0.0) + row.time_us
                break
    return out


def bench(shapes: list[tuple[int, int, int]], target: str, rounds: int, number: int, planes: bool = False) -> None:
    """Print one line per ``(C, K, HW)``: medians of A (direct, or with ``planes`` Winograd
    with compact planes) and B (Winograd) and of their stages."""
    for c, k, hw in shapes:
        ma, _, _ = _build(c, k, hw, "1" if planes else "0", target, compact=planes)
        mb, got, want = _build(c, k, hw, "1", target)
        times: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
        for r in range(rounds):
            # interleaved, the order alternating, so that drift hits both
            for which in ((0, 1) if r % 2 == 0 else (1, 0)):
                times[which].append(_kernel_times((ma, mb)[which], number))

        def med(which: int, key: str, times: tuple[list[dict[str, float]], ...] = times) -> float:
            return statistics.median(t.get(key, 0.0) for t in times[which])

        a, b = med(0, "total"), med(1, "total")
        err = np.abs(got - want).max() / np.abs(want).max()
        if planes:
            stages = [" ".join(f"{st} {med(w, st):6.1f}" for st in ("input", "gemm", "output")) for w in (0, 1)]
            print(f"C={c:4d} K={k:4d} {hw:3d}x{hw:<3d} compact {a:8.1f} us ({stages[0]})  spaced {b:8.1f} us "
                  f"({stages[1]})  B/A {b / a:5.3f}  max rel. error {err:.1e}", flush=True)
            continue
        gflops = 2 * 9 * c * k * hw * hw / a / 1e3
        print(f"C={c:4d} K={k:4d} {hw:3d}x{hw:<3d} direct {a:8.1f} us ({gflops:4.0f} GFLOP/s)  winograd {b:8.1f} us "
              f"(in {med(1, 'input'):6.1f} gemm {med(1, 'gemm'):7.1f} out {med(1, 'output'):6.1f})  B/A {b / a:5.2f}  "
              f"max rel. error {err:.1e}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shapes", nargs="*", help="C,K,HW triples (default: ResNet's 3x3 layers and a few more)")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them)")
    p.add_argument("--number", type=int, default=20, help="calls per kernel per profile")
    p.add_argument("--planes", action="store_true",
                   help="A/B of the transformed planes: compact (A) against as the layout pass spaces them (B)")
    args = p.parse_args()
    shapes = [(int(a), int(b), int(h)) for a, b, h in (s.split(",") for s in args.shapes)] or DEFAULT_SHAPES
    print(f"machine: {common.machine_line(common.machine_info())}; threads "
          f"{os.environ.get('KILN_NUM_THREADS', 'default')}; target {args.target!r}; medians of {args.rounds} rounds")
    bench(shapes, args.target, args.rounds, args.number, args.planes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
