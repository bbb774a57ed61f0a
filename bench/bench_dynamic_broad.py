"""Dynamic shapes over the broad model set: one library per model for every shape in range.

Every model of ``broad_models.py`` (torchvision classifiers and DeepLabV3, a PyTorch
TransformerEncoder, a 6-layer GPT-2) is exported by the TorchScript exporter with dynamic axes
(batch, and H / W or the sequence where the model allows them), imported with dim ranges and
built once. The library then runs at several shapes in range against ONNX Runtime on the same
dynamic ONNX model, and at the first shape it is timed against a static build at exactly that
shape and against ONNX Runtime (interleaved medians, :func:`common.interleaved`).

The point is coverage of models nobody tuned the dynamic paths for: a model that fails to
export, import, build or match is reported as such, with the reason, and the run goes on.

Usage::

    python bench/bench_dynamic_broad.py [--models all] [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

#: model -> (input axes named dynamic, dim ranges, shapes checked against ORT; the first is timed).
#: ViT keeps 224x224 (its position embeddings fix the patch count); the rest take any H / W
#: in range. GPT-2's positions stop at 256.
_IMG = {"data": {0: "batch", 2: "h", 3: "w"}}
_IMG_RANGES = {"batch": (1, 8), "h": (64, 256), "w": (64, 256)}
_IMG_SHAPES = [(1, 224, 224), (3, 160, 128), (2, 96, 256)]
CASES: dict[str, tuple[dict, dict, list[tuple[int, ...]]]] = {
    **{m: (_IMG, _IMG_RANGES, _IMG_SHAPES) for m in (
        "mobilenetv3", "efficientnet_b0", "shufflenetv2", "resnext50", "regnety_400mf", "convnext_t", "deeplabv3")},
    "vit_b16": ({"data": {0: "batch"}}, {"batch": (1, 8)}, [(1,), (3,), (8,)]),
    # the TorchScript export bakes the sequence length (64) into the attention's reshapes
    "transformer_encoder": ({"src": {1: "batch"}}, {"batch": (1, 8)}, [(64, 1), (64, 3), (64, 8)]),
    "gpt2_6l": ({"input_ids": {0: "batch", 1: "seq"}}, {"batch": (1, 4), "seq": (1, 256)},
                [(1, 128), (2, 37), (4, 256)]),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def export_dynamic(name: str, out_dir: Path) -> Path:
    """``name`` exported with its dynamic axes (cached in ``out_dir``)."""
    import torch

    import broad_models

    out = out_dir / f"{name}_dyn.onnx"
    if out.exists():
        return out
    spec = broad_models.broad_specs()[name]
    axes = dict(CASES[name][0])  # the output's dims follow from the inputs'
    args = tuple(torch.from_numpy(v) for v in spec["inputs"].values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(spec["build"](), args, str(out), input_names=list(spec["inputs"]), output_names=["output"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)
    return out


def inputs_at(name: str, shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "gpt2_6l":
        return {"input_ids": rng.integers(0, 50257, size=shape).astype(np.int64)}
    if name == "transformer_encoder":
        return {"src": rng.standard_normal((shape[0], shape[1], 256)).astype(np.float32)}
    if name == "vit_b16":
        return {"data": rng.standard_normal((shape[0], 3, 224, 224)).astype(np.float32)}
    b, h, w = shape
    return {"data": rng.standard_normal((b, 3, h, w)).astype(np.float32)}


def build(path: Path, target: str, ranges: dict | None, shape: dict | None, out: Path) -> tuple[Any, float]:
    import onnx

    import kiln

    graph, params = kiln.frontend.from_onnx(onnx.load(str(path)), dim_ranges=ranges, shape=shape)
    t0 = time.perf_counter()
    lib = kiln.build(graph, target=target, params=params)
    lib.export_library(str(out))
    secs = time.perf_counter() - t0
    return kiln.GraphModule(kiln.runtime.load_module(str(out))["default"](kiln.cpu())), secs


def _kiln_run(m: Any, feed: dict[str, np.ndarray]) -> Any:
    def run() -> None:
        m.set_input(**feed)
        m.run()
    return run


def run_model(name: str, args: argparse.Namespace, out_dir: Path, tmp: Path) -> dict[str, Any]:
    _, ranges, shapes = CASES[name]
    row: dict[str, Any] = {"model": name, "ranges": ranges}
    try:
        path = export_dynamic(name, out_dir)
    except Exception as err:  # noqa: BLE001 - reported in the table
        row["status"] = f"export failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
        return row
    try:
        dyn, row["build_s"] = build(path, args.target, ranges, None, tmp / f"{name}_dyn.so")
    except Exception as err:  # noqa: BLE001 - reported in the table
        log(traceback.format_exc())
        row["status"] = f"Kiln refused: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
        return row
    common.kiln_set_threads(dyn.module.lib, args.threads)
    sess = common.ort_session(path, args.threads)
    worst = 0.0
    for k, shp in enumerate(shapes):
        feed = inputs_at(name, shp, seed=k)
        dyn.run(**feed)
        got = [dyn.get_output(i).numpy() for i in range(dyn.get_num_outputs())]
        chk = common.compare(got, sess.run(None, feed))
        worst = max(worst, chk.max_abs)
        if not chk.ok:
            row["status"] = f"MISMATCH at {shp}: {chk.verdict()} (max abs {chk.max_abs:.3g})"
            return row
    row["max_abs"] = worst
    feed = inputs_at(name, shapes[0])
    static_shape = {k: v.shape for k, v in feed.items()}
    stat, row["static_build_s"] = build(path, args.target, None, static_shape, tmp / f"{name}_static.so")
    common.kiln_set_threads(stat.module.lib, args.threads)
    timing = common.interleaved([common.Engine("dynamic", _kiln_run(dyn, feed)),
                                 common.Engine("static", _kiln_run(stat, feed)),
                                 common.Engine("ort", lambda: sess.run(None, feed))], rounds=args.rounds)
    row.update({k: v.median * 1e3 for k, v in timing.items()})
    row["status"] = "ok"
    row["timed_shape"] = shapes[0]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="all")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", default="llvm -mcpu=native")
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    names = list(CASES) if args.models == "all" else args.models.split(",")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="kiln_dynb_"))
    print(common.machine_line(common.machine_info()), f"threads {args.threads}")
    print("| model | dim ranges | shapes vs ORT | timed at | dynamic (ms) | static (ms) | ORT (ms) "
          "| dynamic / static | dynamic / ORT | build dyn / static (s) |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        log(f"== {name}")
        r = run_model(name, args, out_dir, tmp)
        rng = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in r["ranges"].items())
        shapes = " ".join("x".join(map(str, s)) for s in CASES[name][2])
        if r["status"] != "ok":
            print(f"| {name} | {rng} | {r['status']} | | | | | | | |", flush=True)
            continue
        print(f"| {name} | {rng} | {shapes}: match (max abs {r['max_abs']:.2g}) | "
              f"{'x'.join(map(str, r['timed_shape']))} | {r['dynamic']:.2f} | {r['static']:.2f} | {r['ort']:.2f} | "
              f"{r['dynamic'] / r['static']:.2f}x | {r['dynamic'] / r['ort']:.2f}x | "
              f"{r['build_s']:.1f} / {r['static_build_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
