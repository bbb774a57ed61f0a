"""Shared helpers of the benchmark scripts in ``bench/``.

* :func:`count_flops` — FLOPs of an ONNX model (Conv / ConvTranspose / Gemm / MatMul MACs x 2)
  from the graph with shapes from ``onnx.shape_inference``.
* :func:`machine_info` — CPU model, cores, SIMD flags, library versions (for RESULTS.md).
* :func:`interleaved` — the timing loop: engines interleaved over rounds, order rotated each
  round, every run timed on its own, medians reported.
* :func:`compare` — correctness verdict of an output against a reference.
* small helpers: ORT sessions, markdown tables, thread control of Kiln libraries.

Only the standard library, NumPy and (lazily) onnx / onnxruntime / torch / kiln are imported.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_OUT = BENCH_DIR / "out"

# Correctness tolerance against ONNX Runtime (per element: |a - b| <= atol + rtol * |b|).
RTOL = 1e-3
ATOL = 1e-4


# ----------------------------------------------------------------------------- FLOP counting


def _dims(vi: Any) -> list[int] | None:
    """Static dims of a ValueInfo / TensorProto type, or None if any dim is unknown."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    out = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            return None
        out.append(int(d.dim_value))
    return out


def _attr(node: Any, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


@dataclasses.dataclass
class FlopCount:
    """FLOPs of a model: ``total`` (float), ``by_op`` (op type -> FLOPs), ``nodes`` counted,
    ``unknown`` (names of compute nodes whose shapes could not be inferred: not counted)."""

    total: float
    by_op: dict[str, float]
    nodes: int
    unknown: list[str]

    @property
    def gflop(self) -> float:
        return self.total / 1e9


def count_flops(model: Any, input_shapes: Mapping[str, Sequence[int]] | None = None) -> FlopCount:
    """FLOPs of one inference: 2 x multiply-accumulates of Conv, ConvTranspose, Gemm and MatMul.

    Elementwise ops, pooling, normalisation and softmax are not counted (the usual convention:
    "ResNet-50 = 4.1 GFLOPs" counts conv + fc MACs x 2). Shapes come from
    ``onnx.shape_inference.infer_shapes(..., data_prop=True)`` on the graph (weights are not
    loaded); ``input_shapes`` overrides graph input dims (e.g. a dynamic batch).

    Parameters
    ----------
    model : str, Path or onnx.ModelProto
    input_shapes : dict of str to shape, optional

    Returns
    -------
    FlopCount
    """
    import onnx

    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    model = onnx.ModelProto.FromString(model.SerializeToString())  # we edit it
    if input_shapes:
        for inp in model.graph.input:
            if inp.name in input_shapes:
                dims = inp.type.tensor_type.shape.dim
                for d, v in zip(dims, input_shapes[inp.name]):
                    d.Clear()
                    d.dim_value = int(v)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    g = inferred.graph
    shapes: dict[str, list[int] | None] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        shapes[vi.name] = _dims(vi)
    for init in g.initializer:
        shapes[init.name] = [int(d) for d in init.dims]

    by_op: dict[str, float] = {}
    unknown: list[str] = []
    counted = 0
    for node in g.node:
        op = node.op_type
        if op not in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            continue
        ins = [shapes.get(i) if i else None for i in node.input]
        outs = [shapes.get(o) for o in node.output]
        macs: float | None = None
        try:
            if op == "Conv":
                w, y = ins[1], outs[0]
                if w is not None and y is not None:
                    # every output element: Cin/group * prod(kernel) MACs; w = (Cout, Cin/g, k...)
                    macs = math.prod(y) * math.prod(w[1:])
            elif op == "ConvTranspose":
                x, w = ins[0], ins[1]
                if x is not None and w is not None:
                    # every input element scatters into Cout/g * prod(kernel) outputs; w = (Cin, Cout/g, k...)
                    macs = math.prod(x) * math.prod(w[1:])
            elif op == "Gemm":
                a, b = ins[0], ins[1]
                if a is not None and b is not None:
                    m_, k_ = (a[1], a[0]) if _attr(node, "transA", 0) else (a[0], a[1])
                    n_ = b[0] if _attr(node, "transB", 0) else b[1]
                    macs = m_ * n_ * k_
            elif op == "MatMul":
                a, b, y = ins[0], ins[1], outs[0]
                if a is not None and b is not None and y is not None:
                    k_ = a[-1] if len(a) >= 1 else 1
                    macs = math.prod(y) * k_  # y already has the broadcast batch dims
        except (IndexError, TypeError):
            macs = None
        if macs is None:
            unknown.append(node.name or op)
            continue
        counted += 1
        by_op[op] = by_op.get(op, 0.0) + 2.0 * macs
    return FlopCount(sum(by_op.values()), by_op, counted, unknown)


# ----------------------------------------------------------------------------- machine / versions


def _cmd(args: Sequence[str]) -> str:
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict[str, Any]:
    """CPU model, core counts, SIMD flags, library versions: what a result depends on."""
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform()}
    lscpu = _cmd(["lscpu"])
    for key, label in (("Model name", "cpu"), ("CPU(s)", "logical_cpus"),
                       ("Core(s) per socket", "cores_per_socket"), ("Socket(s)", "sockets"),
                       ("Thread(s) per core", "threads_per_core"), ("L2 cache", "l2"),
                       ("L3 cache", "l3"), ("Hypervisor vendor", "hypervisor"),
                       ("CPU family", "family"), ("Model", "model")):
        m = re.search(rf"^{re.escape(key)}:\s*(.+)$", lscpu, re.M)
        if m:
            info[label] = m.group(1).strip()
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^flags\s*:\s*(.+)$", f.read(), re.M)
            flags = m.group(1) if m else ""
    except OSError:
        pass
    fl = set(flags.split())
    info["simd"] = " ".join(x for x in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw",
                                         "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")
                            if x in fl)
    info["os.cpu_count"] = os.cpu_count()
    try:
        info["affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    info["versions"] = versions()
    return info


def versions() -> dict[str, str]:
    """Versions of Python and of every library the benchmarks touch (those importable)."""
    v = {"python": platform.python_version()}
    for mod in ("numpy", "onnx", "onnxruntime", "torch", "llvmlite", "kiln"):
        try:
            m = __import__(mod)
            v[mod] = str(getattr(m, "__version__", "?"))
        except Exception:  # noqa: BLE001 - a missing optional library is simply not listed
            pass
    gcc = _cmd(["gcc", "--version"]).splitlines()
    if gcc:
        v["gcc"] = gcc[0].split()[-1]  # "gcc (Debian 12.2.0-14) 12.2.0" -> "12.2.0"
    try:
        import llvmlite.binding as llvm

        v["llvm"] = ".".join(map(str, llvm.llvm_version_info))
    except Exception:  # noqa: BLE001
        pass
    try:
        import numpy as _np

        cfg = _np.show_config(mode="dicts")  # numpy >= 1.25
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        v["numpy_blas"] = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001
        pass
    return v


def machine_line(info: Mapping[str, Any]) -> str:
    """One-line machine description for tables and RESULTS.md."""
    cores = info.get("cores_per_socket")
    sockets = info.get("sockets", "1")
    try:
        n = int(cores) * int(sockets)
    except (TypeError, ValueError):
        n = info.get("os.cpu_count")
    # "AMD EPYC" names neither the generation nor the ISA: family / model do (25/1 Zen 3, 26/2 Zen 5)
    fam = f" (family {info['family']} model {info['model']})" if info.get("family") and info.get("model") else ""
    return (f"{info.get('cpu', '?')}{fam}, {n} cores ({info.get('logical_cpus', '?')} logical"
            f"{', ' + info['hypervisor'] + ' VM' if info.get('hypervisor') else ''}), "
            f"SIMD: {info.get('simd', '?')}")


def versions_line(v: Mapping[str, str]) -> str:
    keys = ("python", "numpy", "numpy_blas", "onnx", "onnxruntime", "torch", "kiln", "llvmlite", "llvm", "gcc")
    return ", ".join(f"{k} {v[k]}" for k in keys if k in v)


def today() -> str:
    return datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


# ----------------------------------------------------------------------------- machine load


def _proc_stat_busy() -> tuple[float, float] | None:
    """(busy seconds, total seconds) of all CPUs since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    vals = [int(x) for x in parts[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already inside user
    return (total - idle) / hz, total / hz


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMonitor:
    """CPU used by *other* processes while a measurement runs (in cores, e.g. 0.9 = most of
    one core busy elsewhere). This machine may be shared; a benchmark next to a busy
    compiler or test run is not a benchmark, and multi-threaded engines suffer most (a
    spin barrier waits for a descheduled thread)."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self._t = time.perf_counter()
        self._s = _proc_stat_busy()
        self._own = _own_cpu()

    def foreign_cores(self) -> float | None:
        s = _proc_stat_busy()
        if s is None or self._s is None:
            return None
        wall = time.perf_counter() - self._t
        if wall <= 0:
            return None
        busy = s[0] - self._s[0]
        own = _own_cpu() - self._own
        return max(0.0, (busy - own) / wall)


def foreign_load(seconds: float = 1.0) -> float | None:
    """Cores busy with other processes over the next ``seconds`` (this process sleeps)."""
    m = LoadMonitor()
    time.sleep(seconds)
    return m.foreign_cores()


def wait_quiet(max_foreign: float, timeout_s: float, log: Callable[[str], None] | None = None) -> float | None:
    """Wait (up to ``timeout_s``) until other processes use less than ``max_foreign`` cores
    over a 1 s window; returns the last measured load."""
    t_end = time.monotonic() + timeout_s
    load = foreign_load(1.0)
    while load is not None and load > max_foreign and time.monotonic() < t_end:
        if log:
            log(f"  machine busy ({load:.2f} cores used by other processes); waiting ...")
        time.sleep(4.0)
        load = foreign_load(1.0)
    return load


# ----------------------------------------------------------------------------- timing


@dataclasses.dataclass
class Engine:
    """One thing to time: ``run()`` does one full inference (inputs in, outputs out)."""

    name: str
    run: Callable[[], Any]
    before: Callable[[], None] | None = None  # called before each block (e.g. set thread count)


@dataclasses.dataclass
class Timing:
    """Per-run latencies of one engine, in seconds (all rounds)."""

    samples: list[float]
    per_round: list[list[float]]

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def min(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def round_medians(self) -> list[float]:
        return [statistics.median(r) for r in self.per_round if r]

    @property
    def spread(self) -> float:
        """(max - min) / median of the per-round medians: how stable the number is."""
        rm = self.round_medians
        if len(rm) < 2:
            return 0.0
        return (max(rm) - min(rm)) / statistics.median(rm)


def runs_for(estimate_s: float, target_ms: float, min_runs: int, max_runs: int) -> int:
    """Timed runs per round so that one engine's block lasts about ``target_ms``."""
    if estimate_s <= 0 or not math.isfinite(estimate_s):
        return max_runs
    return int(min(max_runs, max(min_runs, round(target_ms / 1e3 / estimate_s))))


def interleaved(engines: Sequence[Engine], rounds: int = 5, warmup: int = 2, target_ms: float = 300.0,
                min_runs: int = 2, max_runs: int = 50, gap_s: float = 0.05,
                log: Callable[[str], None] | None = None, info: dict | None = None) -> dict[str, Timing]:
    """Time ``engines`` interleaved.

    Each round runs every engine once as a block — ``warmup`` untimed runs, then ``k`` timed
    runs, each timed on its own with ``perf_counter`` — with the engine order rotated by one
    each round, so that slow drifts of the machine (frequency, noisy neighbours, caches)
    hit every engine alike. ``k`` is chosen per engine from a first untimed call so that a
    block lasts about ``target_ms`` (between ``min_runs`` and ``max_runs``). Between blocks
    the process sleeps ``gap_s`` so that the previous engine's spinning worker threads
    (ORT, OpenMP and Kiln pools all spin a few ms after a parallel region) go idle.

    ``info`` (a dict), if given, receives ``foreign_cores``: per round, the CPU (in cores)
    that other processes used meanwhile (:class:`LoadMonitor`), and ``runs``: k per engine.

    Returns
    -------
    dict
        engine name -> :class:`Timing`.
    """
    clock = time.perf_counter
    k: dict[str, int] = {}
    for e in engines:  # one untimed call each: first-call costs + an estimate of the latency
        if e.before:
            e.before()
        t0 = clock()
        e.run()
        est = clock() - t0
        t0 = clock()
        e.run()
        est = min(est, clock() - t0)
        k[e.name] = runs_for(est, target_ms, min_runs, max_runs)
        time.sleep(gap_s)
    res = {e.name: Timing([], []) for e in engines}
    n = len(engines)
    loads: list[float] = []
    mon = LoadMonitor()
    for r in range(rounds):
        mon.start()
        order = [engines[(r + i) % n] for i in range(n)]
        for e in order:
            if e.before:
                e.before()
            for _ in range(warmup):
                e.run()
            block = []
            for _ in range(k[e.name]):
                t0 = clock()
                e.run()
                block.append(clock() - t0)
            res[e.name].samples.extend(block)
            res[e.name].per_round.append(block)
            time.sleep(gap_s)
        fc = mon.foreign_cores()
        if fc is not None:
            loads.append(fc)
        if log:
            log(f"    round {r + 1}/{rounds}: " + ", ".join(
                f"{e.name} {statistics.median(res[e.name].per_round[-1]) * 1e3:.2f} ms" for e in engines)
                + (f"  (other processes: {fc:.2f} cores)" if fc is not None else ""))
    if info is not None:
        info["foreign_cores"] = loads
        info["runs"] = dict(k)
    return res


# ----------------------------------------------------------------------------- correctness


@dataclasses.dataclass
class Check:
    ok: bool
    max_abs: float
    max_rel: float
    worst_excess: float  # max over elements of |a-b| / (atol + rtol*|b|); <= 1 passes
    note: str = ""

    def verdict(self) -> str:
        if self.note:
            return self.note
        return "ok" if self.ok else f"FAIL (x{self.worst_excess:.3g} over tol)"


def compare(out: Sequence[np.ndarray], ref: Sequence[np.ndarray], rtol: float = RTOL, atol: float = ATOL) -> Check:
    """Compare every output with its reference (|a-b| <= atol + rtol*|b| element-wise)."""
    if len(out) != len(ref):
        return Check(False, math.inf, math.inf, math.inf, f"FAIL ({len(out)} outputs vs {len(ref)})")
    max_abs = max_rel = excess = 0.0
    for a, b in zip(out, ref):
        a = np.asarray(a)
        b = np.asarray(b)
        if a.shape != b.shape:
            return Check(False, math.inf, math.inf, math.inf, f"FAIL (shape {a.shape} vs {b.shape})")
        a64 = a.astype(np.float64)
        b64 = b.astype(np.float64)
        if not np.all(np.isfinite(a64) == np.isfinite(b64)):
            return Check(False, math.inf, math.inf, math.inf, "FAIL (non-finite values)")
        d = np.abs(a64 - b64)
        d = np.where(np.isfinite(d), d, 0.0)
        if d.size:
            max_abs = max(max_abs, float(d.max()))
            max_rel = max(max_rel, float((d / np.maximum(np.abs(b64), 1e-12)).max()))
            excess = max(excess, float((d / (atol + rtol * np.abs(b64))).max()))
    return Check(excess <= 1.0, max_abs, max_rel, excess)


# ----------------------------------------------------------------------------- engines


def ort_session(path: str | os.PathLike, threads: int) -> Any:
    """ONNX Runtime CPU session: all graph optimizations, ``threads`` intra-op, 1 inter-op,
    sequential execution."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(os.fspath(path), so, providers=["CPUExecutionProvider"])


def walk_modules(root: Any) -> Iterable[Any]:
    """A runtime module and all its imports, depth first."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        stack.extend(reversed(list(getattr(m, "imported_modules", []) or [])))


def kiln_set_threads(root: Any, n: int) -> int | None:
    """``set_num_threads(n)`` on every loaded library under ``root`` (each .so carries its own
    thread pool); returns the count the first library then reports, or None if none can."""
    eff = None
    for m in walk_modules(root):
        setter = getattr(m, "set_num_threads", None)
        if setter is None:
            continue
        try:
            setter(int(n))
            if eff is None:
                eff = int(m.get_num_threads())
        except Exception:  # noqa: BLE001 - a library without the crt service
            continue
    return eff


# ----------------------------------------------------------------------------- output


def md_table(head: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one char per column (l/r), default numbers right."""
    cells = [[str(c) for c in r] for r in rows]
    if align is None:
        align = "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def fmt_ms(s: float) -> str:
    if s is None or not math.isfinite(s):
        return "—"
    ms = s * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def fmt_ratio(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.2f}x"


def replace_section(path: Path, marker: str, body: str, title: str) -> None:
    """Replace (or append) the text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->``."""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Kiln benchmark results\n"
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        text = pre + block + post
    else:
        text = text.rstrip() + f"\n\n## {title}\n\n{block}\n"
    path.write_text(text)


def ensure_models(names: Sequence[str], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Export the benchmark models (cached) and return name -> ONNX path."""
    sys.path.insert(0, str(BENCH_DIR))
    import models  # noqa: E402  (bench/models.py)

    return {n: models.export(n, out_dir) for n in names}


def which(prog: str) -> str | None:
    return shutil.which(prog)


def add_run_args(ap: Any, rounds: int = 5) -> None:
    """``--target --threads --rounds --wait-quiet --max-foreign``: the options of a benchmark
    that times interleaved engines on one machine (see :func:`run_header`)."""
    ap.add_argument("--target", default="llvm -mcpu=native")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                    help="before each case wait up to S s for other processes to use < --max-foreign cores")
    ap.add_argument("--max-foreign", type=float, default=0.25, help="see --wait-quiet")


def run_header(args: Any, script: str) -> dict[str, Any]:
    """Set the thread count before any library loads, print the machine and the command, and
    return :func:`machine_info`."""
    os.environ["KILN_NUM_THREADS"] = str(args.threads)
    info = machine_info()
    print(machine_line(info))
    print(f"target: {args.target}; threads: {args.threads}; rounds: {args.rounds}; "
          f"command: python bench/{script} " + " ".join(sys.argv[1:]))
    return info


def median_load(info: Mapping[str, Any]) -> str:
    """Median cores other processes used per round (:func:`interleaved`'s ``info``), for a table."""
    loads = info.get("foreign_cores") or []
    return f"{statistics.median(loads):.2f} cores" if loads else "?"
