"""Symbolic image size (H, W) vs static builds: the cost of one library for every size.

ResNet-18 (``resnet_onnx.resnet18``, written with ``onnx.helper``) and, when torch is
installed, MobileNetV2 (``models.py``) are built once with ``H, W`` symbolic in
``--range`` and, at each size of ``--sizes``, once static at exactly that size. Both run
the same input, interleaved (:func:`common.interleaved`); the table gives the medians and
the ratio dynamic/static. Every dynamic result is checked against the static one first.
The log also gives each dynamic library's build time (with ``KILN_CACHE=0`` it includes the
code generation of every kernel).

Usage::

    python bench/bench_dynamic_spatial.py [--models resnet18,mobilenetv2] [--sizes 224x224,160x128]
        [--range 32..224] [--threads 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
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


def onnx_model(name: str) -> Any:
    """The model with its input's H and W turned into the dim_params ``h`` and ``w``."""
    import onnx

    if name == "resnet18":
        from resnet_onnx import resnet18

        model = resnet18(224)
    else:
        import models

        model = onnx.load(str(models.export(name, common.DEFAULT_OUT)))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_value = 1
    for d, p in zip(dims[2:], ("h", "w")):
        d.dim_param = p
    return model


def build(model: Any, target: str, shape: Any, ranges: Any, out: Path, threads: int) -> Any:
    import kiln

    name = model.graph.input[0].name
    graph, params = kiln.frontend.from_onnx(model, shape={name: shape}, dim_ranges=ranges)
    lib = kiln.build(graph, target=target, params=params)
    lib.export_library(str(out))
    mod = kiln.GraphModule(kiln.runtime.load_module(str(out))["default"](kiln.cpu()))
    common.kiln_set_threads(mod.module.lib, threads)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--sizes", default="224x224,160x128")
    ap.add_argument("--range", default="32..224")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", default="llvm -mcpu=native")
    args = ap.parse_args()
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    lo, hi = (int(x) for x in args.range.split(".."))
    tmp = Path(tempfile.mkdtemp(prefix="kiln_dynsp_"))
    log(common.machine_line(common.machine_info()))
    rows = []
    for name in args.models.split(","):
        model = onnx_model(name)
        iname = model.graph.input[0].name
        t0 = time.perf_counter()
        dyn = build(model, args.target, (1, 3, "h", "w"), {"h": (lo, hi), "w": (lo, hi)},
                    tmp / f"{name}_dyn.so", args.threads)
        log(f"  {name}: dynamic library built in {time.perf_counter() - t0:.1f} s")
        for size in args.sizes.split(","):
            h, w = (int(x) for x in size.split("x"))
            static = build(model, args.target, (1, 3, h, w), None, tmp / f"{name}_{size}.so", args.threads)
            x = np.random.default_rng(0).standard_normal((1, 3, h, w)).astype(np.float32)
            dyn.set_input(iname, x)
            static.set_input(iname, x)
            dyn.run()
            static.run()
            chk = common.compare([dyn.get_output(0).numpy()], [static.get_output(0).numpy()])
            if not chk.ok:
                log(f"  MISMATCH {name} at {size}: {chk}")
                return 1
            t = common.interleaved([common.Engine("dynamic", dyn.run), common.Engine("static", static.run)],
                                   rounds=args.rounds, log=log)
            d, s = t["dynamic"].median, t["static"].median
            rows.append([name, size, common.fmt_ms(d), common.fmt_ms(s), common.fmt_ratio(d / s)])
            log(f"  {name} {size}: dynamic {d * 1e3:.2f} ms, static {s * 1e3:.2f} ms")
    print(common.md_table(["model", "H x W", "dynamic (ms)", "static (ms)", "dynamic / static"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
