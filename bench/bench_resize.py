"""Bilinear ``resize2d`` kernels: the separable form against the fused one, interleaved.

Each case is a one-node graph built once per variant of :func:`kiln.topi.resize.resize2d`:

* ``untabled`` (not run by default) — the fused form computing the float64 source
  coordinates per output element instead of reading them from per-axis tables (what GPU
  targets run; on CPUs the form before the tables);
* ``fused`` — one pass, four gathered source pixels per output (what downscales in H and
  dynamic H / W run);
* ``gathered`` — separable, the horizontal pass gathers two source pixels per output (what
  ``align_corners`` and non-integer width factors run);
* ``separable`` — what a build picks today: separable, and with a whole width factor the
  phased horizontal pass (three broadcast source pixels per run of ``s`` outputs).

``--dynamic`` declares H and W symbolic (``1..`` the case's size) and runs the kernel at the
case's size: a dynamic resize has no whole-factor phases, so ``gathered`` is what it runs.

Variants are forced by patching the module's ``_separable`` / ``_phase_weights`` around the
build; every variant's output is checked against the float64 reference
(:func:`kiln.ir.evaluate`), then the variants are timed interleaved
(:func:`common.interleaved`) and the medians printed in us.  These are the figures of
``docs/topi.md`` (``resize2d``) and of the comments in ``kiln/topi/resize.py``.

Usage::

    python bench/bench_resize.py [--threads 1] [--rounds 5] [--target "llvm -mcpu=native"] \\
        [--cases deeplab,x2,x2_align,deeplab_33] [--variants fused,gathered,separable] [--dynamic]
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

#: name -> (input shape, output size, coordinate_transformation_mode)
CASES: dict[str, tuple[tuple[int, int, int, int], tuple[int, int], str]] = {
    "deeplab": ((1, 21, 14, 14), (224, 224), "half_pixel"),  # DeepLabV3's x16 upsample
    "x2": ((1, 64, 56, 56), (112, 112), "half_pixel"),
    "x2_align": ((1, 64, 56, 56), (112, 112), "align_corners"),  # no phases: the row pass gathers
    "deeplab_33": ((1, 21, 14, 14), (33, 33), "half_pixel"),  # a non-integer factor
}
VARIANTS = ("fused", "gathered", "separable")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def variant(name: str) -> Iterator[None]:
    """Build ``resize2d`` in the form ``name`` (see the module docstring) inside the block."""
    from kiln.topi import resize

    saved = resize._separable, resize._phase_weights, resize._use_tables
    if name == "untabled":
        resize._use_tables = lambda: False
    elif name == "fused":
        resize._separable = lambda *a, **k: False
    elif name == "gathered":
        resize._phase_weights = lambda *a, **k: None
    elif name != "separable":
        raise SystemExit(f"unknown variant {name!r} (one of untabled, {', '.join(VARIANTS)})")
    try:
        yield
    finally:
        resize._separable, resize._phase_weights, resize._use_tables = saved


def build(case: str, var: str, target: str, threads: int, dynamic: bool = False
          ) -> tuple[Any, np.ndarray, np.ndarray]:
    """The module of ``case`` in form ``var``, its input and the float64 reference output
    (``dynamic``: H and W symbolic, ``1..`` the case's extents)."""
    import kiln
    from kiln.ir import Graph, evaluate

    shape, size, mode = CASES[case]
    g = Graph()
    if dynamic:
        g.declare_dim("h", 1, shape[2])
        g.declare_dim("w", 1, shape[3])
    x = g.add_input("x", shape[:2] + (("h", "w") if dynamic else shape[2:]))
    g.outputs = [g.add("resize2d", x, size=size, scales=(size[0] / shape[2], size[1] / shape[3]),
                       method="linear", coordinate_transformation_mode=mode)]
    with variant(var):
        lib = kiln.build(g, target=target)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    common.kiln_set_threads(gm.module.lib, threads)
    xv = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (want,) = evaluate(g, {"x": xv})
    return gm, xv, want


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dynamic", action="store_true", help="symbolic H and W, run at the case's size")
    common.add_run_args(ap)
    args = ap.parse_args()
    common.run_header(args, "bench_resize.py")
    variants = args.variants.split(",")
    rows = []
    for case in args.cases.split(","):
        engines = []
        for var in variants:
            gm, xv, want = build(case, var, args.target, args.threads, args.dynamic)
            gm.set_input(x=xv)
            gm.run()
            np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{case} {var}")
            engines.append(common.Engine(var, gm.run))
        if args.wait_quiet > 0:
            common.wait_quiet(args.max_foreign, args.wait_quiet, log)
        load: dict = {}
        t = common.interleaved(engines, rounds=args.rounds, log=log, info=load)
        shape, size, mode = CASES[case]
        label = f"{list(shape)} -> {size[0]}x{size[1]} {mode}"
        rows.append([label] + [f"{t[v].median * 1e6:.1f}" for v in variants]
                    + [f"{t[variants[0]].median / t[variants[-1]].median:.1f}x", common.median_load(load)])
        log(f"  {label}: " + ", ".join(f"{v} {t[v].median * 1e6:.1f} us" for v in variants))
    print(common.md_table(["case (us, median)"] + variants + [f"{variants[0]} / {variants[-1]}", "other load"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
