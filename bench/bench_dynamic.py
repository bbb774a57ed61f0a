"""Dynamic-shape libraries vs static builds vs ONNX Runtime, same process, same inputs.

A model is exported once with dynamic axes and built once by Kiln with dim ranges (one
library for every shape in range). At each benchmark shape the same model is also built
*static* at exactly that shape, and ONNX Runtime runs the dynamic ONNX model. Engines are
interleaved (:func:`common.interleaved`); the table gives medians and the ratios
dynamic/static (the cost of being dynamic) and dynamic/ORT.

Models (``--models``):

* ``resnet50`` — batch dynamic, ``batch=1..16``; shapes ``1,4,16`` (``--batches``);
* ``minilm`` — all-MiniLM-L6-v2 with real weights, ``batch=1..8``, ``seq=1..256``; shapes
  ``1x128`` and more (``--minilm-shapes``). ``--check-shapes N`` also runs the dynamic
  library at N random in-range shapes against ORT before timing.

Usage::

    python bench/bench_dynamic.py [--models resnet50,minilm] [--threads 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def export_dynamic(name: str, out_dir: Path) -> tuple[Path, dict[str, tuple[int, int]]]:
    """Export ``name`` from ``models.py`` with dynamic axes; return the path and dim ranges."""
    import torch

    import models

    out = out_dir / f"{name}_dynamic.onnx"
    sp = models.model_specs()[name]
    if name == "minilm":
        axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                "output": {0: "batch"}}
        ranges = {"batch": (1, 8), "seq": (1, 256)}
    else:
        axes = {"data": {0: "batch"}, "output": {0: "batch"}}
        ranges = {"batch": (1, 16)}
    if not out.exists():
        model = sp["build"]()
        args = tuple(torch.from_numpy(v) for v in sp["inputs"].values())
        with torch.no_grad():
            torch.onnx.export(model, args, str(out), input_names=list(sp["inputs"]), output_names=["output"],
                              opset_version=17, dynamo=False, dynamic_axes=axes)
    return out, ranges


def inputs_at(name: str, shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "minilm":
        b, s = shape
        ids = rng.integers(1000, 30000, size=(b, s)).astype(np.int64)
        ids[:, 0], ids[:, -1] = 101, 102
        mask = np.ones((b, s), dtype=np.int64)
        for i in range(1, b):  # later rows padded: the mask matters
            mask[i, max(1, s - 3 * i):] = 0
        return {"input_ids": ids, "attention_mask": mask}
    return {"data": rng.standard_normal((shape[0], 3, 224, 224)).astype(np.float32)}


def build(onnx_path: Path, target: str, shape: dict | None, ranges: dict | None, out: Path) -> Any:
    import onnx

    import kiln

    graph, params = kiln.frontend.from_onnx(onnx.load(str(onnx_path)), shape=shape, dim_ranges=ranges)
    t0 = time.perf_counter()
    lib = kiln.build(graph, target=target, params=params)
    lib.export_library(str(out))
    log(f"  built {out.name} in {time.perf_counter() - t0:.1f} s")
    return kiln.GraphModule(kiln.runtime.load_module(str(out))["default"](kiln.cpu()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,minilm")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--minilm-shapes", default="1x128,1x32,4x64,8x256")
    ap.add_argument("--check-shapes", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", default="llvm -mcpu=native")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="kiln_dyn_"))
    info = common.machine_info()
    log(common.machine_line(info))
    rows, results = [], []
    for name in args.models.split(","):
        onnx_path, ranges = export_dynamic(name, out_dir)
        dims = {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "seq")} if name == "minilm" else None
        dyn = build(onnx_path, args.target, None, ranges, tmp / f"{name}_dyn.so")
        common.kiln_set_threads(dyn.module.lib, args.threads)
        sess = common.ort_session(onnx_path, args.threads)
        if args.check_shapes:
            rng = np.random.default_rng(1)
            worst = 0.0
            for k in range(args.check_shapes):
                shp = tuple(int(rng.integers(lo, hi + 1)) for lo, hi in ranges.values())
                feed = inputs_at(name, shp, seed=k)
                dyn.run(**feed)
                got = dyn.get_output(0).numpy()
                ref = sess.run(None, feed)[0]
                chk = common.compare([got], [ref])
                worst = max(worst, chk.max_abs)
                if not chk.ok:
                    log(f"  MISMATCH at {shp}: {chk}")
                    return 1
            log(f"  {name}: {args.check_shapes} random shapes match ORT (worst max abs error {worst:.2e})")
        shapes = ([(int(b),) for b in args.batches.split(",")] if name != "minilm" else
                  [tuple(int(x) for x in s.split("x")) for s in args.minilm_shapes.split(",")])
        for shp in shapes:
            feed = inputs_at(name, shp)
            pin = ({k: shp for k in dims} if dims else {"data": (shp[0], 3, 224, 224)})
            static = build(onnx_path, args.target, pin, None, tmp / f"{name}_{'x'.join(map(str, shp))}.so")
            common.kiln_set_threads(static.module.lib, args.threads)
            dyn.set_input(**feed)
            static.set_input(**feed)
            dyn.run()
            static.run()
            chk = common.compare([dyn.get_output(0).numpy()], [static.get_output(0).numpy()])
            if not chk.ok:
                log(f"  dynamic and static disagree at {shp}: {chk}")
                return 1
            binding = sess.io_binding()
            for k, v in feed.items():
                binding.bind_cpu_input(k, v)
            binding.bind_output(sess.get_outputs()[0].name)
            t = common.interleaved([
                common.Engine("dynamic", dyn.run),
                common.Engine("static", static.run),
                common.Engine("ort", lambda sess=sess, binding=binding: sess.run_with_iobinding(binding)),
            ], rounds=args.rounds, log=log)
            d, s, o = (t[k].median for k in ("dynamic", "static", "ort"))
            label = "x".join(map(str, shp))
            rows.append([name, label, common.fmt_ms(d), common.fmt_ms(s), common.fmt_ms(o),
                         common.fmt_ratio(d / s), common.fmt_ratio(d / o)])
            results.append({"model": name, "shape": shp, "dynamic_ms": d * 1e3, "static_ms": s * 1e3,
                            "ort_ms": o * 1e3})
            log(f"  {name} {label}: dynamic {d * 1e3:.2f} ms, static {s * 1e3:.2f} ms, ORT {o * 1e3:.2f} ms")
    print(common.machine_line(info))
    print(f"threads: {args.threads}; command: python bench/bench_dynamic.py " + " ".join(sys.argv[1:]))
    print(common.md_table(["model", "shape", "dynamic", "static", "ORT", "dynamic/static", "dynamic/ORT"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
