"""Per-kernel times of a dynamic-shape library next to a static build at the same shape.

Where a dynamic library loses time against a static build, kernel by kernel: both are built
from the same model (the dynamic one with the dim ranges of ``bench_dynamic.py`` /
``bench_dynamic_spatial.py``, the static one at exactly ``--shape``), run on the same input
with the debug executor (``GraphModuleDebug.profile``: each kernel timed alone, the best of
``--repeat`` means), and the kernels are matched by name (the two builds fuse the same groups).
Prints the matched sums and their ratio, then the kernels that lose the most.

Models and shapes:

* ``resnet50`` (batch 1..16): ``--shape 4`` (the batch);
* ``minilm`` (batch 1..8 x seq 1..256): ``--shape 1x128``;
* ``resnet18``, ``mobilenetv2`` (H, W in 32..224): ``--shape 96x96``;
* the models of ``bench_dynamic_broad.py`` with its ranges: ``--shape 1x224x224`` (batch x H x W),
  ``64x1`` (seq x batch, ``transformer_encoder``), ``1x128`` (``gpt2_6l``), ``1`` (``vit_b16``).

Usage::

    KILN_NUM_THREADS=1 python bench/profile_dynamic.py --model minilm --shape 1x128 [--top 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _debug_module(model: Any, shape: Any, ranges: Any, path: Path, target: str) -> Any:
    import kiln
    from kiln.runtime.debug_executor import GraphModuleDebug

    graph, params = kiln.frontend.from_onnx(model, shape=shape, dim_ranges=ranges)
    kiln.build(graph, target=target, params=params).export_library(str(path))
    return GraphModuleDebug(kiln.runtime.load_module(str(path))["default"](kiln.cpu()))


def _case(name: str, shape: str) -> tuple[Any, dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """The ONNX model, its dim ranges, the inputs at ``shape`` and the static shapes."""
    import onnx

    if name in ("resnet50", "minilm"):
        import bench_dynamic

        path, ranges = bench_dynamic.export_dynamic(name, common.DEFAULT_OUT)
        dims = tuple(int(v) for v in shape.split("x"))
        feeds = bench_dynamic.inputs_at(name, dims)
        return onnx.load(str(path)), ranges, feeds, {k: v.shape for k, v in feeds.items()}
    import bench_dynamic_broad

    if name in bench_dynamic_broad.CASES:
        path = bench_dynamic_broad.export_dynamic(name, common.DEFAULT_OUT)
        feeds = bench_dynamic_broad.inputs_at(name, tuple(int(v) for v in shape.split("x")))
        ranges = dict(bench_dynamic_broad.CASES[name][1])
        return onnx.load(str(path)), ranges, feeds, {k: v.shape for k, v in feeds.items()}
    import bench_dynamic_spatial

    model = bench_dynamic_spatial.onnx_model(name)
    h, w = (int(v) for v in shape.split("x"))
    iname = model.graph.input[0].name
    x = np.random.default_rng(0).standard_normal((1, 3, h, w)).astype(np.float32)
    ranges = {"h": (32, 224), "w": (32, 224)}
    return model, {"__shape__": {iname: (1, 3, "h", "w")}, **ranges}, {iname: x}, {iname: x.shape}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    import bench_dynamic_broad

    ap.add_argument("--model", required=True,
                    choices=["resnet50", "minilm", "resnet18", "mobilenetv2", *bench_dynamic_broad.CASES])
    ap.add_argument("--shape", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--target", default="llvm -mcpu=native")
    args = ap.parse_args()
    import kiln

    print(common.machine_line(common.machine_info()), f"threads: {os.environ.get('KILN_NUM_THREADS', 'all')}")
    model, ranges, feeds, static_shapes = _case(args.model, args.shape)
    dyn_shape = ranges.pop("__shape__", None)
    tmp = Path(tempfile.mkdtemp(prefix="kiln_profdyn_"))
    dyn = _debug_module(model, dyn_shape, ranges, tmp / "dynamic.so", args.target)
    static = _debug_module(model, static_shapes, None, tmp / "static.so", args.target)
    profiles = []
    for m in (dyn, static):
        for k, v in feeds.items():
            m.set_input(k, v)
        kiln.GraphModule.run(m)  # a plain run: the debug run() would dump every node's outputs
        report = m.profile(number=10, repeat=args.repeat)
        profiles.append({r.name: (min(r.times_us), r.input_shapes) for r in report})
    pd, ps = profiles
    rows = sorted(((pd[n][0], ps[n][0], n, ps[n][1]) for n in pd if n in ps), key=lambda r: r[1] - r[0])
    td, ts = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(f"{args.model} at {args.shape}: {len(rows)} kernels matched by name (dynamic only: "
          f"{len(pd) - len(rows)}, static only: {len(ps) - len(rows)}); sums dynamic {td:.0f} us, "
          f"static {ts:.0f} us, dynamic / static {td / ts:.3f}")
    print(f"{'dynamic us':>10} {'static us':>10} {'ratio':>6} {'extra us':>9}  kernel (static input shapes)")
    for d, s, name, shapes in rows[:args.top]:
        print(f"{d:10.1f} {s:10.1f} {d / s:6.2f} {d - s:+9.1f}  {name} {shapes}")
    for label, own, other in (("dynamic", pd, ps), ("static", ps, pd)):
        alone = sorted(((t, n, shp) for n, (t, shp) in own.items() if n not in other), reverse=True)
        if alone:
            print(f"{label} build only: {len(alone)} kernels, {sum(t for t, _, _ in alone):.0f} us; the slowest:")
            for t, name, shapes in alone[:args.top]:
                print(f"{t:10.1f}  {name} {shapes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
