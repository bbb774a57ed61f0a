"""Kiln built from ``torch.export`` vs PyTorch eager, ``torch.compile`` and AOTInductor.

Every model is run, in one process, by up to six engines, all single-threaded and timed
**interleaved** (:func:`common.interleaved`: per round each engine runs a block of warm-up plus
timed runs, the engine order rotated by one each round; medians over all timed runs):

==============  ==============================================================================
``kiln``        ``kiln.frontend.from_torch(model, inputs)`` -> ``kiln.build`` ->
                ``export_library`` -> ``load_module`` (the deployment path, as in
                ``run_models.py``); ``set_num_threads(1)`` on the loaded library
``kiln_onnx``   the same model exported with ``torch.onnx.export(dynamo=True)`` and built by
                ``kiln.frontend.from_onnx``: the issue asks that both Kiln paths run within 5%
                of each other, so their ratio is a column of its own
``eager``       ``model(*inputs)`` under ``torch.inference_mode()``
``compile``     ``torch.compile(model)`` (inductor, default mode)
``aoti``        ``torch._inductor.aoti_compile_and_package`` of the exported program, run
                through ``torch._inductor.aoti_load_package``
==============  ==============================================================================

Each timed call is a full inference from the fixed, seeded inputs to NumPy outputs. Every
engine's outputs are compared with eager's (max |a - b| / max |eager| over the first output).

Models (batch 1, FP32, random weights fixed by a seed; nothing is downloaded):

* ``resnet18`` / ``mobilenetv2`` at 224x224: ``torchvision.models`` with ``weights=None`` when
  torchvision imports, else the layer-for-layer identical definitions of ``bench/models.py``
  (the installed torchvision may not match the installed torch);
* ``bert``: a BERT-base-sized encoder (hidden 768, 12 layers, 12 heads, FFN 3072) built from a
  ``transformers.BertConfig`` at sequence length 128, output ``last_hidden_state``;
* ``gpt2``: GPT-2 small (768 wide, 12 layers, 12 heads, vocabulary 50257) from a
  ``GPT2Config``, sequence length 128, output ``last_hidden_state``.

Usage::

    python bench/bench_torch.py [--models resnet18,mobilenetv2,bert,gpt2]
        [--engines kiln,kiln_onnx,eager,compile,aoti] [--rounds 5] [--profile] [--write-results]

``--write-results`` replaces the ``bench_torch`` section of ``bench/RESULTS.md``; ``--profile``
adds a node-by-node profile of both Kiln libraries (the debug executor). The ONNX exports are
cached as ``OUT/<model>.dynamo.onnx``: delete them after changing a model definition.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

# Kiln's thread pool reads this when a library is loaded; set before kiln is imported so every
# library starts single-threaded (set_num_threads(1) is applied on top, see KilnEngine).
os.environ.setdefault("KILN_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ALL_MODELS = ["resnet18", "mobilenetv2", "bert", "gpt2"]
ALL_ENGINES = ["kiln", "kiln_onnx", "eager", "compile", "aoti"]
SEQ_LEN = 128


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- models


def import_transformers() -> Any:
    """``transformers``, importable even when the installed torchvision is broken.

    transformers imports torchvision whenever the package is installed; a torchvision built
    for another torch fails at import (``operator torchvision::nms does not exist``) and takes
    every transformers model with it. Marking torchvision absent makes transformers skip it
    (the text models used here do not need it).
    """
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules["torchvision"] = None  # type: ignore[assignment]
    import transformers

    return transformers


class LastHidden:
    """Wrap a ``transformers`` model so that it returns ``last_hidden_state`` only (one tensor,
    the same output for every engine and for the ONNX export)."""

    @staticmethod
    def wrap(model: Any) -> Any:
        import torch

        class _Wrap(torch.nn.Module):
            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
                return self.inner(input_ids).last_hidden_state

        return _Wrap(model).eval()


def _vision(name: str) -> Any:
    import torch

    torch.manual_seed(0)
    try:
        import torchvision

        return getattr(torchvision.models, {"resnet18": "resnet18",
                                            "mobilenetv2": "mobilenet_v2"}[name])(weights=None).eval()
    except Exception:  # noqa: BLE001 - fall back to bench/models.py (same architecture)
        import models

        return models.model_specs()[name]["build"]()


def _bert() -> Any:
    import torch

    tf = import_transformers()
    torch.manual_seed(0)
    cfg = tf.BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512)
    return LastHidden.wrap(tf.BertModel(cfg, add_pooling_layer=False).eval())


def _gpt2() -> Any:
    import torch

    tf = import_transformers()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024, use_cache=False)
    return LastHidden.wrap(tf.GPT2Model(cfg).eval())


def model_spec(name: str) -> tuple[Callable[[], Any], dict[str, np.ndarray]]:
    """(factory, inputs by name) of one benchmark model; inputs are fixed and seeded."""
    rng = np.random.default_rng(0)
    if name in ("resnet18", "mobilenetv2"):
        img = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
        return (lambda: _vision(name)), {"data": img}
    ids = rng.integers(1000, 30000, size=(1, SEQ_LEN)).astype(np.int64)
    if name == "bert":
        return _bert, {"input_ids": ids}
    if name == "gpt2":
        return _gpt2, {"input_ids": ids}
    raise SystemExit(f"unknown model {name!r}; expected one of {ALL_MODELS}")


# ----------------------------------------------------------------------------- engines


class KilnEngine:
    """A loaded Kiln library: NumPy inputs in, NumPy outputs out."""

    def __init__(self, graph: Any, params: dict, target: str, so: Path) -> None:
        import kiln

        t0 = time.perf_counter()
        factory = kiln.build(graph, target=target, params=params)
        so.parent.mkdir(parents=True, exist_ok=True)
        factory.export_library(str(so))
        self.build_s = time.perf_counter() - t0
        self.loaded = kiln.runtime.load_module(str(so))
        common.kiln_set_threads(self.loaded, 1)
        self.gm = kiln.GraphModule(self.loaded["default"](kiln.cpu()))
        self.names = list(self.gm.get_input_info()[0])
        self.n_out = self.gm.get_num_outputs()
        self.inputs: dict[str, np.ndarray] = {}

    def bind(self, inputs: dict[str, np.ndarray]) -> None:
        """Map our input arrays onto the library's inputs (by name, else by position)."""
        _, dtypes = self.gm.get_input_info()
        arrays = list(inputs.values())
        for i, n in enumerate(self.names):
            arr = inputs.get(n, arrays[i] if i < len(arrays) else None)
            if arr is None:
                raise RuntimeError(f"no input for Kiln graph input {n!r}")
            self.inputs[n] = np.ascontiguousarray(arr.astype(dtypes[n], copy=False))

    def __call__(self) -> list[np.ndarray]:
        self.gm.set_input(**self.inputs)
        self.gm.run()
        return [self.gm.get_output(i).numpy() for i in range(self.n_out)]


def _torch_runner(fn: Callable[..., Any], args: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
    import torch

    def run() -> list[np.ndarray]:
        with torch.inference_mode():
            y = fn(*args)
        ys = y if isinstance(y, (tuple, list)) else (y,)
        return [t.detach().numpy() for t in ys]

    return run


def rel_err(out: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """max |a - b| / max |ref| of the first output (inf on a shape mismatch)."""
    if not out or np.shape(out[0]) != np.shape(ref[0]):
        return math.inf
    a, b = np.asarray(out[0], np.float64), np.asarray(ref[0], np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    factory, inputs = model_spec(name)
    model = factory()
    targs = tuple(torch.from_numpy(v) for v in inputs.values())
    out_dir = Path(args.out)
    res: dict[str, Any] = {"model": name, "errors": {}, "setup_s": {}, "rel_err": {}}
    runners: dict[str, Callable[[], list[np.ndarray]]] = {}
    runners["eager"] = _torch_runner(model, targs)
    ref = runners["eager"]()

    def setup(engine: str, make: Callable[[], Callable[[], list[np.ndarray]]]) -> None:
        if engine not in args.engines:
            return
        log(f"[{name}] {engine}: setting up ...")
        t0 = time.perf_counter()
        try:
            run = make()
            run()  # first call: lazy compilation, allocation
            res["setup_s"][engine] = time.perf_counter() - t0
            res["rel_err"][engine] = rel_err(run(), ref)
            runners[engine] = run
            log(f"[{name}] {engine}: {res['setup_s'][engine]:.1f} s, "
                f"rel err vs eager {res['rel_err'][engine]:.2e}")
        except Exception as err:  # noqa: BLE001 - reported; the other engines still run
            res["errors"][engine] = f"{type(err).__name__}: {err}"
            log(f"[{name}] {engine} FAILED: {res['errors'][engine][:300]}")
            if args.verbose:
                traceback.print_exc()

    def make_kiln() -> Callable[[], list[np.ndarray]]:
        import kiln

        t0 = time.perf_counter()
        graph, params = kiln.frontend.from_torch(model, targs)
        res["import_s_kiln"] = time.perf_counter() - t0
        eng = KilnEngine(graph, params, args.target, out_dir / "kiln" / f"{name}.torch.so")
        eng.bind(inputs)
        return eng

    def make_kiln_onnx() -> Callable[[], list[np.ndarray]]:
        import kiln

        path = out_dir / f"{name}.dynamo.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.onnx.export(model, targs, str(path), input_names=list(inputs),
                              output_names=["output"], dynamo=True, optimize=True)
        graph, params = kiln.frontend.from_onnx(str(path))
        eng = KilnEngine(graph, params, args.target, out_dir / "kiln" / f"{name}.onnx.so")
        eng.bind(inputs)
        return eng

    def make_compile() -> Callable[[], list[np.ndarray]]:
        return _torch_runner(torch.compile(model), targs)

    def make_aoti() -> Callable[[], list[np.ndarray]]:
        ep = torch.export.export(model, targs)
        (out_dir / "aoti").mkdir(parents=True, exist_ok=True)
        pkg = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(out_dir / "aoti" / f"{name}.pt2"))
        return _torch_runner(torch._inductor.aoti_load_package(pkg), targs)

    setup("kiln", make_kiln)
    setup("kiln_onnx", make_kiln_onnx)
    setup("compile", make_compile)
    setup("aoti", make_aoti)
    torch.set_num_threads(1)

    engines = [common.Engine(e, runners[e], before=lambda: torch.set_num_threads(1))
               for e in ALL_ENGINES if e in runners and e in args.engines]
    info: dict[str, Any] = {}
    tm = common.interleaved(engines, rounds=args.rounds, warmup=args.warmup, target_ms=args.round_ms,
                            min_runs=args.min_runs, max_runs=args.max_runs, log=log, info=info)
    res["median_ms"] = {e: t.median * 1e3 for e, t in tm.items()}
    res["spread"] = {e: t.spread for e, t in tm.items()}
    res["foreign_cores"] = info.get("foreign_cores", [])
    log(f"[{name}] medians: " + ", ".join(f"{e} {v:.2f} ms" for e, v in res["median_ms"].items()))
    if args.profile:
        import run_models  # bench/run_models.py: the per-node profile of a loaded library

        res["profile"] = {}
        for e in ("kiln", "kiln_onnx"):
            eng = runners.get(e)
            if isinstance(eng, KilnEngine):
                prof = run_models.kiln_top_ops(eng.loaded, eng.inputs, 0, res["median_ms"][e] / 1e3)
                res["profile"][e] = {k: prof[k] for k in ("total_us", "nodes", "kinds")}
                log(f"[{name}] {e} profile: sum of {prof['nodes']} nodes {prof['total_us'] / 1e3:.2f} ms")
    return res


# ----------------------------------------------------------------------------- report


def report(results: list[dict[str, Any]]) -> str:
    head = ["model", "Kiln (torch) ms", "Kiln (ONNX) ms", "eager ms", "torch.compile ms", "AOTI ms",
            "Kiln torch/ONNX", "Kiln/eager", "Kiln/compile", "Kiln/AOTI", "other load",
            "rel err vs eager (kiln, kiln_onnx, compile, aoti)"]
    rows = []
    for r in results:
        med = r.get("median_ms", {})
        k = med.get("kiln", math.nan)

        def ratio(e: str, k: float = k, med: dict[str, float] = med) -> str:
            return common.fmt_ratio(k / med[e]) if e in med and math.isfinite(k) else "—"

        errs = ", ".join(f"{r['rel_err'][e]:.1e}" if e in r["rel_err"] else "—"
                         for e in ("kiln", "kiln_onnx", "compile", "aoti"))
        fc = r.get("foreign_cores") or []
        rows.append([r["model"]] + [common.fmt_ms(med.get(e, math.nan) / 1e3) for e in ALL_ENGINES]
                    + [ratio("kiln_onnx"), ratio("eager"), ratio("compile"), ratio("aoti"),
                       f"{max(fc):.2f}" if fc else "—", errs])
    lines = [common.md_table(head, rows, align="l" + "r" * 11 + "l"), ""]
    lines.append("Medians in ms (batch 1, FP32, 1 thread for every engine). Ratios < 1: Kiln "
                 "(built from torch.export) faster. 'other load': the most CPU (in cores) other "
                 "processes used during any one round.")
    spreads = [f"{r['model']} {e} {100 * s:.0f}%" for r in results for e, s in r.get("spread", {}).items()
               if s > 0.10]
    lines.append("Round-to-round spread of medians > 10%: " + (", ".join(spreads) or "none") + ".")
    setup = [f"{r['model']}: " + ", ".join(f"{e} {s:.1f}" for e, s in r["setup_s"].items())
             for r in results if r.get("setup_s")]
    if setup:
        lines.append("Setup seconds (import/export + build + first call): " + "; ".join(setup) + ".")
    prof_rows = []
    for r in results:
        p = r.get("profile", {})
        if "kiln" in p and "kiln_onnx" in p:
            kinds = sorted(set(p["kiln"]["kinds"]) | set(p["kiln_onnx"]["kinds"]) - {"nop"})
            cell = {e: {k: p[e]["kinds"].get(k, {}).get("us", 0.0) / 1e3 for k in kinds} for e in p}
            prof_rows.append([
                r["model"], f"{p['kiln']['total_us'] / 1e3:.2f}", f"{p['kiln_onnx']['total_us'] / 1e3:.2f}",
                common.fmt_ratio(p["kiln"]["total_us"] / p["kiln_onnx"]["total_us"]),
                f"{p['kiln']['nodes']} / {p['kiln_onnx']['nodes']}",
                ", ".join(f"{k} {cell['kiln'][k]:.1f} / {cell['kiln_onnx'][k]:.1f}" for k in kinds)])
    if prof_rows:
        lines += ["", "Kiln from torch vs Kiln from ONNX, kernel by kernel (`--profile`: the debug "
                  "executor times every node on its own; sum of node medians, ms):", ""]
        lines.append(common.md_table(["model", "from torch", "from ONNX", "torch/ONNX", "nodes",
                                      "ms by kind (torch / ONNX)"], prof_rows, align="lrrrrl"))
    for r in results:
        for e, msg in r.get("errors", {}).items():
            lines.append(f"\nError ({r['model']}, {e}): `{msg[:400].replace('|', '/')}`")
    return "\n".join(lines)


def load_line(results: list[dict[str, Any]]) -> str:
    """How busy the rest of the machine was while the engines were timed."""
    loads = [c for r in results for c in r.get("foreign_cores", [])]
    if not loads:
        return "not measured"
    busy = max(loads) > 0.2
    return (f"other processes used {min(loads):.2f}-{max(loads):.2f} cores during the rounds "
            f"(median {sorted(loads)[len(loads) // 2]:.2f})"
            + ("; the host was **loaded** (shared with other jobs), so absolute times are noisy: "
               "compare the ratios of engines timed in the same rounds" if busy else "; quiet"))


def write_results(text: str, info: dict[str, Any], wall_s: float, args: argparse.Namespace,
                  results: list[dict[str, Any]]) -> None:
    import torch

    body = "\n".join([
        f"- Command: `python bench/bench_torch.py {' '.join(sys.argv[1:])}`",
        f"- Date: {common.today()}; wall time {wall_s / 60:.1f} min",
        f"- Machine: {common.machine_line(info)}; AVX-512: "
        f"{'yes' if 'avx512f' in info.get('simd', '') else 'no'}; `lscpu` model name "
        f"{info.get('cpu', '?')!r}",
        f"- Versions: {common.versions_line(info['versions'])}",
        f"- Threads: 1 (`torch.set_num_threads(1)`, torch reports {torch.get_num_threads()}; "
        f"`KILN_NUM_THREADS=1` + `set_num_threads(1)` on each Kiln library); target `{args.target}`; "
        f"rounds {args.rounds}, warm-up {args.warmup} per block",
        f"- Host load: {load_line(results)}",
        "",
        text,
    ])
    common.replace_section(common.BENCH_DIR / "RESULTS.md", "bench_torch", body,
                           "Kiln from torch.export vs PyTorch (`bench_torch.py`)")
    log(f"updated {common.BENCH_DIR / 'RESULTS.md'}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(ALL_MODELS))
    p.add_argument("--engines", default=",".join(ALL_ENGINES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per engine per round")
    p.add_argument("--round-ms", type=float, default=300.0, help="timed time per engine per round")
    p.add_argument("--min-runs", type=int, default=2)
    p.add_argument("--max-runs", type=int, default=30)
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--out", default=str(common.DEFAULT_OUT))
    p.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    p.add_argument("--profile", action="store_true",
                   help="also profile both Kiln libraries node by node (debug executor)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failed engines")
    a = p.parse_args(argv)
    a.engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    info = common.machine_info()
    log(f"machine: {common.machine_line(info)}")
    t0 = time.perf_counter()
    results = []
    for name in args.models:
        try:
            results.append(bench_model(name, args))
        except Exception as err:  # noqa: BLE001 - one model's failure does not lose the others
            traceback.print_exc()
            results.append({"model": name, "errors": {"all": f"{type(err).__name__}: {err}"},
                            "rel_err": {}, "setup_s": {}})
    text = report(results)
    print(f"Machine: {common.machine_line(info)}")
    print(f"Versions: {common.versions_line(info['versions'])}")
    print(text)
    print(f"Host load: {load_line(results)}")
    if args.write_results:
        write_results(text, info, time.perf_counter() - t0, args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
