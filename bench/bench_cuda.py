"""Kiln on CUDA next to PyTorch CUDA: ResNet-18, ResNet-50, MiniLM (batch 1, FP32).

For each model, in one process: export ONNX (``bench/models.py``, cached), build it with
``kiln.build(target="cuda ...")``, export ONE ``.so``, load it, check its output against ONNX
Runtime (CPU, ``rtol=1e-3, atol=1e-4``), then time Kiln's ``GraphModule.run`` and the same
PyTorch module on the GPU, interleaved over rounds (``common.interleaved``), each run ended
by a device synchronization. Reported: medians and the Kiln/PyTorch ratio. Inputs and
outputs stay on the device during timing (like PyTorch's); ``--end-to-end`` adds Kiln's host
copies (``set_input`` + ``get_output``) and PyTorch's ``.cuda()``/``.cpu()``.

Needs an NVIDIA GPU with its driver, NVRTC (``pip install nvidia-cuda-nvrtc-cu12``), and
torch with CUDA for the PyTorch column (without it only Kiln is timed). Without a GPU the
script says so and exits 2.

Usage::

    python bench/bench_cuda.py [--models resnet18,resnet50,minilm] [--arch sm_90] [--binary cubin] [--rounds 5]
                               [--out bench/out/cuda.json] [--end-to-end]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

MODELS = ("resnet18", "resnet50", "minilm")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def kiln_engine(name: str, onnx_path: Path, inputs: dict[str, np.ndarray], target: str, workdir: Path,
                end_to_end: bool) -> tuple[Any, dict[str, Any]]:
    import kiln

    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    mod, params = kiln.frontend.from_onnx(str(onnx_path), shape={k: v.shape for k, v in inputs.items()})
    factory = kiln.build(mod, target=target, params=params)
    info["build_s"] = time.perf_counter() - t0
    so = workdir / f"{name}_cuda.so"
    factory.export_library(str(so))
    lib = kiln.runtime.load_module(str(so))
    dev = kiln.cuda()
    g = kiln.GraphModule(lib["default"](dev))
    g.set_input(**inputs)
    g.run()
    info["outputs"] = [g.get_output(i).numpy() for i in range(g.get_num_outputs())]
    info["library_bytes"] = so.stat().st_size

    if end_to_end:
        def run() -> None:
            g.set_input(**inputs)
            g.run()
            for i in range(g.get_num_outputs()):
                g.get_output(i).numpy()
    else:
        def run() -> None:
            g.run()
            dev.sync()

    return C.Engine("kiln-cuda", run), info


def torch_engine(name: str, inputs: dict[str, np.ndarray], end_to_end: bool) -> C.Engine | None:
    try:
        import torch
    except ImportError:
        log("  torch not installed: PyTorch column skipped")
        return None
    if not torch.cuda.is_available():
        log("  torch has no CUDA: PyTorch column skipped")
        return None
    import models  # bench/models.py

    model = models.model_specs()[name]["build"]().cuda().eval()
    host = [torch.from_numpy(v) for v in inputs.values()]
    dev_args = [t.cuda() for t in host]

    if end_to_end:
        def run() -> None:
            with torch.inference_mode():
                out = model(*[t.cuda() for t in host])
                (out[0] if isinstance(out, (tuple, list)) else out).cpu()
    else:
        def run() -> None:
            with torch.inference_mode():
                model(*dev_args)
            torch.cuda.synchronize()

    return C.Engine("torch-cuda", run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--arch", default="", help="CUDA arch for the target (default: the device's, e.g. sm_90)")
    ap.add_argument("--binary", choices=("ptx", "cubin"), default="ptx",
                    help="device code in the library: PTX (driver JIT) or a cubin for --arch")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target-ms", type=float, default=300.0, help="length of one timed block per engine")
    ap.add_argument("--end-to-end", action="store_true", help="include host<->device copies in the timing")
    ap.add_argument("--model-dir", default=str(C.DEFAULT_OUT), help="where the ONNX exports are cached")
    ap.add_argument("--out", default=str(C.DEFAULT_OUT / "cuda.json"), help="JSON results")
    args = ap.parse_args(argv)

    import kiln

    dev = kiln.cuda()
    if not dev.exist:
        log("no CUDA GPU here (libcuda.so.1 missing or no device): nothing to benchmark")
        return 2
    arch = args.arch or "sm_" + str(dev.get_attr("compute_version")).replace(".", "")
    target = f"cuda -arch={arch} -binary={args.binary}"
    log(f"device: {dev.device_name} (compute {dev.get_attr('compute_version')}), target '{target}'")
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    paths = C.ensure_models(names, args.model_dir)
    import models  # noqa: E402  (on sys.path via ensure_models)

    workdir = Path(args.out).resolve().parent
    workdir.mkdir(parents=True, exist_ok=True)
    rows, results = [], {}
    for name in names:
        log(f"== {name}")
        inputs = models.model_specs()[name]["inputs"]
        ref = C.ort_session(paths[name], os.cpu_count() or 1).run(None, inputs)
        k_engine, info = kiln_engine(name, paths[name], inputs, target, workdir, args.end_to_end)
        check = C.compare(info["outputs"], ref)
        log(f"  built in {info['build_s']:.1f} s; vs ONNX Runtime: {check.verdict()} "
            f"(max abs {check.max_abs:.3g}, max rel {check.max_rel:.3g})")
        engines = [k_engine]
        t_engine = torch_engine(name, inputs, args.end_to_end)
        if t_engine is not None:
            engines.append(t_engine)
        timing = C.interleaved(engines, rounds=args.rounds, target_ms=args.target_ms, log=log)
        km = timing["kiln-cuda"].median
        tm = timing["torch-cuda"].median if "torch-cuda" in timing else None
        ratio = km / tm if tm else None
        rows.append([name, check.verdict(), C.fmt_ms(km), C.fmt_ms(tm) if tm else "-", C.fmt_ratio(ratio)])
        results[name] = {"kiln_ms": km * 1e3, "torch_ms": tm * 1e3 if tm else None, "ratio": ratio,
                         "check": check.verdict(), "max_abs": check.max_abs, "build_s": info["build_s"],
                         "library_bytes": info["library_bytes"]}
    print(f"device: {dev.device_name}, target '{target}', end_to_end={args.end_to_end}")
    print(C.md_table(["model", "vs ORT", "Kiln CUDA ms", "PyTorch CUDA ms", "Kiln/PyTorch"], rows))
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump({"device": dev.device_name, "target": target, "end_to_end": args.end_to_end,
                   "models": results}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
