"""Helpers shared by the ``kiln`` subcommands.

Input-shape / input-file parsing, the build progress display, loading compiled models,
thread control, random inputs, statistics and the text summaries the commands print.

Everything here imports NumPy and the runtime only; the compiler side (ONNX, frontend,
driver) is imported inside the functions that need it, so ``kiln run`` / ``kiln bench
LIB.so`` keep working on a deploy-only machine.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..runtime.errors import InputError, KilnError, KilnFileNotFoundError

__all__ = [
    "parse_input_shapes", "parse_input_files", "check_target", "require_file", "model_kind",
    "load_onnx_model", "import_onnx", "Progress", "build_model", "graph_json_stats", "GraphStats",
    "load_factory", "set_threads", "random_inputs", "latency_stats", "format_latency_table",
    "array_summary", "compare_outputs", "run_onnxruntime", "require_onnxruntime",
    "fmt_bytes", "fmt_seconds", "run_build", "BUILD_STAGES",
]

#: The stages a build goes through, in order (what the progress display shows).
BUILD_STAGES = ("import", "optimize", "lower", "codegen+compile", "export")

_SHAPE_HELP = "expected NAME:D1,D2,... (e.g. data:1,3,224,224)"


# ------------------------------------------------------------------------------ parsing
def parse_input_shapes(specs: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``--input-shape`` values ``name:1,3,224,224`` into ``{name: (1, 3, 224, 224)}``.

    The shape is what follows the *last* colon (so TensorFlow-style names such as
    ``input:0:1,3,8,8`` work); dimensions are separated by commas (or ``x``); an empty shape
    (``name:``) is a scalar.

    Raises
    ------
    InputError
        On a malformed spec or a repeated name.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise InputError(f"bad --input-shape {spec!r}: {_SHAPE_HELP}")
        dims = dims.strip().replace("x", ",").replace("X", ",")
        if dims in ("", "()", "[]"):
            shape: tuple[int, ...] = ()
        else:
            parts = [p.strip() for p in dims.strip("()[]").split(",")]
            try:
                shape = tuple(int(p) for p in parts)
            except ValueError:
                raise InputError(f"bad --input-shape {spec!r}: dimensions must be integers; {_SHAPE_HELP}") from None
            if any(d <= 0 for d in shape):
                raise InputError(f"bad --input-shape {spec!r}: dimensions must be positive; {_SHAPE_HELP}")
        if name in shapes:
            raise InputError(f"bad --input-shape: input {name!r} given twice")
        shapes[name] = shape
    return shapes


def parse_input_files(specs: Sequence[str] | None) -> dict[str, np.ndarray]:
    """Parse ``--input`` values: ``name=file.npy`` (one array) or ``file.npz`` (arrays by name)."""
    arrays: dict[str, np.ndarray] = {}
    for spec in specs or ():
        name, sep, path = spec.partition("=")
        if not sep:
            if spec.endswith(".npz"):
                require_file(spec, "input file")
                with _load_np(spec) as npz:
                    for k in npz.files:
                        arrays[k] = np.asarray(npz[k])
                continue
            raise InputError(f"bad --input {spec!r}: expected NAME=FILE.npy or FILE.npz")
        if not name or not path:
            raise InputError(f"bad --input {spec!r}: expected NAME=FILE.npy or FILE.npz")
        require_file(path, "input file")
        data = _load_np(path)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                if name in data.files:
                    arrays[name] = np.asarray(data[name])
                elif len(data.files) == 1:
                    arrays[name] = np.asarray(data[data.files[0]])
                else:
                    raise InputError(f"--input {spec!r}: {path} holds {data.files}, none called {name!r}")
        else:
            arrays[name] = np.asarray(data)
    return arrays


def _load_np(path: str) -> Any:
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"cannot read {path} as a NumPy .npy/.npz file ({err})") from None


def require_file(path: str, what: str = "file") -> str:
    """Raise KilnFileNotFoundError unless ``path`` is an existing file."""
    if not os.path.exists(path):
        raise KilnFileNotFoundError(f"{what} not found: {path}")
    if not os.path.isfile(path):
        raise InputError(f"{what} is not a file: {path}")
    return path


def model_kind(path: str) -> str:
    """``"onnx"`` for an ONNX model, ``"lib"`` for a compiled library (.so / .tar / other)."""
    return "onnx" if path.lower().endswith(".onnx") else "lib"


def check_target(target: str) -> Any:
    """Parse a target string (``llvm``, ``c``, ``llvm -mcpu=native`` ...); TargetError if unknown."""
    from ..target import Target

    return Target(target)


# ------------------------------------------------------------------------------ ONNX
def load_onnx_model(path: str) -> Any:
    """``onnx.ModelProto`` of ``path`` with a one-line error for missing / unreadable files."""
    require_file(path, "ONNX model")
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - onnx is a core dependency
        raise KilnError(f"reading ONNX models needs the 'onnx' package ({err})") from None
    try:
        return onnx.load(path)
    except Exception as err:  # noqa: BLE001 - protobuf raises assorted types
        from ..runtime.errors import FormatError

        raise FormatError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from None


def import_onnx(path_or_model: Any, shapes: Mapping[str, Sequence[int]] | None = None) -> tuple[Any, dict[str, Any]]:
    """``kiln.frontend.from_onnx`` with ``--input-shape`` overrides; returns ``(graph, params)``."""
    from .. import frontend

    model = load_onnx_model(path_or_model) if isinstance(path_or_model, str) else path_or_model
    if shapes:
        inits = {t.name for t in model.graph.initializer}
        names = [vi.name for vi in model.graph.input if vi.name not in inits]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise InputError(f"--input-shape names unknown input(s) {unknown}; the model's inputs: {names}")
    return frontend.from_onnx(model, shape=dict(shapes) if shapes else None)


# ------------------------------------------------------------------------------ progress
def fmt_seconds(s: float) -> str:
    """``0.8 ms``, ``12.3 ms``, ``1.52 s``."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_bytes(n: float) -> str:
    """``512 B``, ``12.0 KiB``, ``3.4 MiB``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Stage-by-stage progress on stderr.

    On a terminal the current stage is redrawn in place with a running clock (so a long
    codegen or C compile visibly makes progress); otherwise (logs, pipes, tests) one line is
    printed per finished stage. ``enabled=False`` prints nothing but still records timings.

    Usage::

        prog = Progress(BUILD_STAGES)
        with prog.stage("import"):
            ...
        prog.timings  # {"import": 0.12, ...}

    The driver can also report stages itself through :meth:`hook`
    (``hook(stage, event, **info)`` with ``event`` in ``"start"``/``"end"``).
    """

    _SPIN = "|/-\\"

    def __init__(self, stages: Sequence[str] = BUILD_STAGES, enabled: bool = True,
                 stream: Any = None) -> None:
        self.stages = list(stages)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = enabled and _isatty(self.stream) and os.environ.get("TERM", "") != "dumb"
        self.timings: dict[str, float] = {}
        self.details: dict[str, str] = {}
        self._current: str | None = None
        self.counter = ""  # e.g. "group 37/80", drawn after the running clock
        self._t0 = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.perf_counter()

    # ---- stage control ------------------------------------------------------------------
    def _label(self, name: str) -> str:
        if name in self.stages:
            return f"[{self.stages.index(name) + 1}/{len(self.stages)}] {name:<15}"
        return f"[-/{len(self.stages)}] {name:<15}"

    def begin(self, name: str) -> None:
        """Start stage ``name`` (ends the current one first)."""
        if self._current is not None:
            self.end(self._current, self.details.get(self._current, ""))
        self._current = name
        self._t0 = time.perf_counter()
        if self.live:
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def end(self, name: str | None = None, detail: str = "") -> None:
        """Finish the current stage, recording its time (and an optional detail)."""
        if self._current is None or (name is not None and name != self._current):
            return
        name = self._current
        dt = time.perf_counter() - self._t0
        self.timings[name] = self.timings.get(name, 0.0) + dt
        if detail:
            self.details[name] = detail
        self._current = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.enabled:
            extra = f"  {detail}" if detail else ""
            self._write(f"{self._label(name)} {fmt_seconds(dt):>9}{extra}", final=True)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator["Progress"]:
        """Context manager form of :meth:`begin` / :meth:`end`."""
        self.begin(name)
        try:
            yield self
        except BaseException:
            self.abort()
            raise
        self.end(name, self.details.get(name, ""))

    def abort(self) -> None:
        """Stop the live display after an error (the error message follows)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.live and self._current is not None:
            self._write(f"{self._label(self._current)}    failed", final=True)
        self._current = None

    def hook(self, stage: str, event: str = "start", **info: Any) -> None:
        """Callback form for the build driver: ``hook("codegen", "start")`` ... ``"end"``."""
        if event in ("start", "begin"):
            self.begin(stage)
        elif event in ("end", "done", "finish"):
            detail = info.get("detail") or ""
            self.end(stage, str(detail))

    # ---- drawing --------------------------------------------------------------------------
    def _tick(self) -> None:
        i = 0
        while not self._stop.wait(0.1):
            name = self._current
            if name is None:
                break
            dt = time.perf_counter() - self._t0
            extra = f"  {self.counter}" if self.counter else ""
            self._write(f"{self._label(name)} {fmt_seconds(dt):>9} {self._SPIN[i % 4]}{extra}", final=False)
            i += 1

    def _write(self, text: str, final: bool) -> None:
        with self._lock:
            try:
                if self.live:
                    self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
                elif final:
                    self.stream.write(text + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    @property
    def total(self) -> float:
        """Seconds since the display was created."""
        return time.perf_counter() - self.started


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


#: driver stage (``kiln.build``'s ``progress`` callback) -> display stage
_DISPLAY_STAGE = {"passes": "optimize", "fuse": "optimize", "lower": "lower",
                  "codegen+compile": "codegen+compile", "graph_codegen": "codegen+compile",
                  "link_params": "codegen+compile", "factory": "codegen+compile"}


def run_build(graph: Any, params: Mapping[str, Any], prog: "Progress", **kwargs: Any) -> Any:
    """``kiln.build(graph, params=params, **kwargs)`` with live stages on ``prog``.

    Display stages: ``optimize`` (passes + fusion), ``lower`` (with a per-kernel counter),
    ``codegen+compile`` (kernel code generation, the C/LLVM compile, graph JSON and the
    factory). They follow the driver's ``progress`` callback; the driver's own per-stage
    times stay in ``factory.build_stats.timings``.
    """
    from .. import build as kiln_build

    lowered = {"n": 0, "total": 0}

    def on_progress(stage: str, event: str, info: dict) -> None:
        shown = _DISPLAY_STAGE.get(stage, stage)
        if event == "start" and prog._current != shown:
            prog.begin(shown)
        elif event == "kernel":
            lowered.update(n=info["index"], total=info["total"])
            prog.counter = f"group {info['index']}/{info['total']}"
        elif event == "end" and stage == "lower":
            prog.counter = ""
            prog.details["lower"] = f"{lowered['total']} fused groups"

    try:
        factory = kiln_build(graph, params=params, progress=on_progress, **kwargs)
    except BaseException:
        prog.abort()
        raise
    stats = getattr(factory, "build_stats", None)
    if stats is not None:
        prog.details["codegen+compile"] = f"{stats.num_functions} kernels"
    prog.end(None, prog.details.get(prog._current or "", ""))
    return factory


# ------------------------------------------------------------------------------ build
@dataclass
class BuildResult:
    """What :func:`build_model` produced."""

    factory: Any
    graph: Any
    params: dict[str, Any]
    progress: Progress
    path: str | None = None
    file_bytes: int | None = None
    ir_nodes: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def build_model(model_path: str, *, target: str = "llvm", shapes: Mapping[str, Sequence[int]] | None = None,
                opt_level: int = 3, link_params: bool = False, output: str | None = None,
                progress: Progress | None = None, tuning_log: str | None = None) -> BuildResult:
    """Import, compile and (optionally) export ``model_path``; drives the progress display.

    Stages ``import`` and ``export`` are timed here; the stages inside ``kiln.build`` come
    from :func:`run_build`.
    """
    prog = progress or Progress(enabled=False)
    check_target(target)
    with prog.stage("import"):
        graph, params = import_onnx(model_path, shapes)
        nops = sum(1 for n in graph.nodes if n.op != "constant")
        prog.details["import"] = f"{nops} ops, {len(params)} params"

    extra: dict[str, Any] = {"tuning_log": tuning_log} if tuning_log else {}
    factory = run_build(graph, params, prog, target=target, opt_level=opt_level, link_params=link_params, **extra)
    res = BuildResult(factory, graph, params, prog, ir_nodes=len(graph.nodes))
    if output:
        out_dir = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(out_dir):
            raise KilnFileNotFoundError(f"output directory does not exist: {out_dir}")
        with prog.stage("export"):
            factory.export_library(output)
            res.path = output
            res.file_bytes = os.path.getsize(output)
            prog.details["export"] = fmt_bytes(res.file_bytes)
    res.timings = dict(prog.timings)
    return res


# ------------------------------------------------------------------------------ graph JSON stats
@dataclass
class GraphStats:
    """Numbers read off a graph JSON (the executor's view of a compiled model)."""

    num_nodes: int
    num_inputs: int
    num_params: int
    kernel_calls: int
    unique_functions: int
    nop_calls: int
    copy_calls: int
    planned_bytes: int
    no_reuse_bytes: int
    fixed_bytes: int
    num_storages: int
    func_counts: dict[str, int]

    @property
    def saved_fraction(self) -> float:
        return 0.0 if not self.no_reuse_bytes else 1.0 - self.planned_bytes / self.no_reuse_bytes


def _entry_bytes(shape: Sequence[int], dtype: str) -> int:
    from ..runtime.dtype import np_dtype

    try:
        item = np_dtype(dtype).itemsize
    except Exception:  # noqa: BLE001
        item = 4
    return int(np.prod(shape, dtype=np.int64)) * item if len(shape) else item


def graph_json_stats(graph_json: Any, param_names: Sequence[str] = ()) -> GraphStats:
    """Kernel counts and the memory plan of a graph JSON (text, dict or parsed graph).

    ``planned_bytes`` sums the storages that only activations use (the plan's peak activation
    memory); ``no_reuse_bytes`` is what one buffer per kernel output would need (``__nop``
    aliases excluded); ``fixed_bytes`` are the input and param storages.
    """
    from ..runtime.graph_json import Graph, load_graph_json

    g = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
    arg_entries = {g.entry_id(n) for n in g.arg_nodes}
    arg_names = {g.nodes[n].name for n in g.arg_nodes}
    nparams = len(set(param_names) & arg_names)
    sizes: dict[int, int] = {}
    for e in range(g.num_entries):
        sid = g.storage_id[e]
        sizes[sid] = max(sizes.get(sid, 0), _entry_bytes(g.shape[e], g.dltype[e]))
    fixed_sids = {g.storage_id[e] for e in arg_entries}
    func_counts: dict[str, int] = {}
    no_reuse = nop = copy = 0
    for nid, node in enumerate(g.nodes):
        if not node.is_op:
            continue
        if node.func_name == "__nop":
            nop += 1
            continue
        if node.func_name == "__copy":
            copy += 1
        else:
            func_counts[node.func_name] = func_counts.get(node.func_name, 0) + 1
        for e in g.node_entries(nid):
            no_reuse += _entry_bytes(g.shape[e], g.dltype[e])
    return GraphStats(
        num_nodes=len(g.nodes),
        num_inputs=len(g.arg_nodes) - nparams,
        num_params=nparams,
        kernel_calls=sum(func_counts.values()),
        unique_functions=len(func_counts),
        nop_calls=nop,
        copy_calls=copy,
        planned_bytes=sum(s for sid, s in sizes.items() if sid not in fixed_sids),
        no_reuse_bytes=no_reuse,
        fixed_bytes=sum(sizes[s] for s in fixed_sids),
        num_storages=len(sizes),
        func_counts=func_counts,
    )


# ------------------------------------------------------------------------------ runtime side
def load_factory(path: str) -> Any:
    """Load a compiled model library and return its executor factory module."""
    from ..runtime import load_module

    require_file(path, "library")
    if path.lower().endswith(".onnx"):
        raise InputError(f"{path} is an ONNX model, not a compiled library; "
                         f"build it first: kiln build {path} -o model.so")
    root = load_module(path)
    for m in _walk(root):
        if m.type_key == "GraphExecutorFactory":
            return m
    raise InputError(f"{path} holds no compiled model (no GraphExecutorFactory module); "
                     f"it is a plain kernel library")


def _walk(root: Any) -> Iterator[Any]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        stack.extend(reversed(m.imported_modules))


def set_threads(n: int | None, *modules: Any) -> int | None:
    """Set the kernel thread count: ``KILN_NUM_THREADS`` for libraries loaded later, and
    ``set_num_threads`` on every loaded library module under ``modules``. Returns the count in
    effect (from the first library that reports one), or ``None``."""
    if n is not None:
        if n < 1:
            raise InputError(f"--threads must be >= 1, got {n}")
        os.environ["KILN_NUM_THREADS"] = str(n)
    effective = None
    for root in modules:
        if root is None:
            continue
        for m in _walk(root):
            setter = getattr(m, "set_num_threads", None)
            if setter is None:
                continue
            try:
                if n is not None:
                    setter(n)
                if effective is None:
                    effective = int(m.get_num_threads())
            except KilnError:
                continue
    return effective


def random_inputs(shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, str], seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Deterministic random inputs: normal floats, small non-negative ints, random bools."""
    from ..runtime.dtype import np_dtype

    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        dt = dtypes.get(name, "float32")
        npdt = np_dtype(dt)
        shape = tuple(int(d) for d in shape)
        arr: np.ndarray
        if dt == "bool":
            arr = rng.random(shape) < 0.5
        elif np.issubdtype(npdt, np.integer):
            arr = rng.integers(0, 10, size=shape)
        else:
            arr = rng.standard_normal(shape)
        out[name] = np.asarray(arr).astype(npdt)
    return out


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """median, mean, min, max, std and p90 of per-run times, in milliseconds."""
    a = np.asarray(seconds, dtype=np.float64) * 1e3
    if a.size == 0:
        return {k: float("nan") for k in ("median", "mean", "min", "max", "std", "p90")}
    return {
        "median": float(np.median(a)),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "std": float(a.std()),
        "p90": float(np.percentile(a, 90)),
    }


def format_latency_table(rows: Mapping[str, Mapping[str, float]]) -> str:
    """A small table of latency statistics (ms), one row per engine."""
    cols = ("median", "mean", "min", "max", "std", "p90")
    name_w = max(8, *(len(k) for k in rows))
    lines = [f"{'latency (ms)':<{name_w}}  " + "  ".join(f"{c:>9}" for c in cols)]
    for name, st in rows.items():
        lines.append(f"{name:<{name_w}}  " + "  ".join(f"{st[c]:>9.4f}" for c in cols))
    return "\n".join(lines)


def array_summary(arr: np.ndarray) -> str:
    """``shape (1, 10) float32  min .. max .. mean ..``."""
    a = np.asarray(arr)
    head = f"shape {tuple(a.shape)} {a.dtype}"
    if a.size == 0:
        return head + "  (empty)"
    if a.dtype == np.bool_:
        return head + f"  true {int(a.sum())}/{a.size}"
    f = a.astype(np.float64)
    return head + f"  min {f.min():.6g}  max {f.max():.6g}  mean {f.mean():.6g}"


def compare_outputs(ours: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> list[tuple[float, float]]:
    """``(max abs error, max rel error)`` per output; rel = max|a-b| / max|b| (0-safe)."""
    res = []
    for a, b in zip(ours, ref):
        a = np.asarray(a).astype(np.float64)
        b = np.asarray(b).astype(np.float64)
        if a.shape != b.shape:
            res.append((float("inf"), float("inf")))
            continue
        if a.size == 0:
            res.append((0.0, 0.0))
            continue
        err = float(np.max(np.abs(a - b)))
        scale = float(np.max(np.abs(b)))
        res.append((err, err / scale if scale > 0 else err))
    return res


def require_onnxruntime(flag: str) -> Any:
    """Import onnxruntime or fail with a one-line hint."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise KilnError(f"{flag} needs onnxruntime, which is not installed: pip install onnxruntime") from None
    return onnxruntime


def ort_session(model_path: str, threads: int | None = None, flag: str = "--compare") -> Any:
    """An ONNX Runtime CPU session for ``model_path``."""
    ort = require_onnxruntime(flag)
    require_file(model_path, "ONNX model")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001
        raise KilnError(f"onnxruntime cannot load {model_path}: {' '.join(str(err).split())}") from None


def ort_feed(sess: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The subset of ``inputs`` the ORT session takes, checked for completeness."""
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"the ONNX model takes inputs {missing} that the library does not have")
    return {n: inputs[n] for n in names}


def run_onnxruntime(model_path: str, inputs: Mapping[str, np.ndarray], threads: int | None = None
                    ) -> tuple[list[str], list[np.ndarray]]:
    """Run the model once with ONNX Runtime; returns output names and arrays."""
    sess = ort_session(model_path, threads)
    outs = sess.run(None, ort_feed(sess, inputs))
    return [o.name for o in sess.get_outputs()], [np.asarray(o) for o in outs]


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)``."""
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


# ------------------------------------------------------------------------------ graph drawing
def _dot_str(s: Any) -> str:
    """A double-quoted DOT string."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lbl(*lines: Any) -> str:
    """A multi-line DOT label."""
    return _dot_str("\n".join(str(x) for x in lines))


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


_DOT_HEAD = [
    "  rankdir=TB;",
    '  graph [fontname="Helvetica", fontsize=10, compound=true, newrank=true];',
    '  node [fontname="Helvetica", fontsize=10, shape=box, style="rounded,filled", fillcolor="#ffffff"];',
    '  edge [fontname="Helvetica", fontsize=8, color="#555555"];',
]

_PATTERN_COLOR = {
    "ELEMWISE": "#e8f4ea", "BROADCAST": "#e8f4ea", "INJECTIVE": "#eef0fb", "COMM_REDUCE": "#fdf3e1",
    "OUT_ELEMWISE_FUSABLE": "#fbe9e7", "OPAQUE": "#eeeeee", "TUPLE": "#eeeeee",
}


def dot_from_fused(fused: Any, param_names: Sequence[str] = (), title: str = "") -> str:
    """DOT text for a :class:`~kiln.transform.fuse.FusedGraph`: one cluster per fused group.

    Graph inputs are ellipses, parameters are omitted (their count is in the label of the
    group that reads them), ``__nop`` aliases are dashed, outputs are double octagons.
    """
    g = fused.graph
    params = set(param_names)
    node_id: dict[Any, str] = {}
    lines = ["digraph kiln {", *_DOT_HEAD]
    label = title or g.name
    lines.append(f"  label={_dot_str(f'{label}: {len(fused.groups)} fused groups')}; labelloc=t;")
    src_of: dict[Any, str] = {}
    for i, v in enumerate(g.inputs):
        if v.name in params:
            continue
        nid = f"in{i}"
        src_of[v] = nid
        lines.append(f"  {nid} [shape=ellipse, fillcolor=\"#e3f2fd\", "
                     "label=" + _lbl(v.name, f'{_shape_str(v.shape)} {v.dtype}') + "];")
    for gi, grp in enumerate(fused.groups):
        kind = "__nop" if grp.is_nop else grp.pattern.name
        color = _PATTERN_COLOR.get(kind, "#f5f5f5")
        nparams = sum(1 for v in grp.inputs if v.node is None and v.name in params)
        glabel = f"group {gi}: {kind}" + (f" ({nparams} params)" if nparams else "")
        lines.append(f"  subgraph cluster_g{gi} {{")
        style = "dashed" if grp.is_nop else "rounded,filled"
        lines.append(f"    label={_dot_str(glabel)}; style={_dot_str(style)}; fillcolor={_dot_str(color)}; "
                     f"color=\"#888888\";")
        for k, n in enumerate(grp.nodes):
            nid = f"g{gi}_{k}"
            node_id[n] = nid
            extra = ", penwidth=2" if grp.anchor is n and not grp.is_nop else ""
            out_shape = _shape_str(n.outputs[0].shape) if n.outputs else ""
            lines.append(f"    {nid} [label=" + _lbl(n.op, out_shape) + f"{extra}];")
        lines.append("  }")
    for n, nid in node_id.items():
        for v in n.inputs:
            if v.node is not None and v.node in node_id:
                lines.append(f"  {node_id[v.node]} -> {nid};")
            elif v in src_of:
                lines.append(f"  {src_of[v]} -> {nid};")
    for i, v in enumerate(g.outputs):
        oid = f"out{i}"
        lines.append(f"  {oid} [shape=doubleoctagon, fillcolor=\"#fff8e1\", "
                     "label=" + _lbl(f'output {i}', f'{_shape_str(v.shape)} {v.dtype}') + "];")
        src = node_id.get(v.node) if v.node is not None else src_of.get(v)
        if src:
            lines.append(f"  {src} -> {oid};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _group_ops(node: Any) -> list[str]:
    """The ops fused into a graph-JSON kernel node, from its attrs when the driver records
    them, else guessed from the ``fused_<op>_<op>`` function-name convention."""
    attrs = node.attrs or {}
    for key in ("ops", "fused_ops", "op_names"):
        v = attrs.get(key)
        if isinstance(v, (list, tuple)) and v:
            return [str(x) for x in v]
        if isinstance(v, str) and v:
            return [x for x in v.replace("+", ",").split(",") if x]
    return split_func_name(node.func_name)


def split_func_name(func_name: str) -> list[str]:
    """``kilngen_default_fused_conv2d_bias_add_relu_1`` -> ``[conv2d, bias_add, relu]``.

    Op names are matched greedily (longest first) against the IR's op registry; a name that
    does not follow the convention comes back whole."""
    import re

    _, sep, rest = func_name.partition("_fused_")
    if not sep:
        return [func_name]
    rest = re.sub(r"_\d+$", "", rest)
    try:
        from ..ir import list_ops

        known = sorted(list_ops(), key=len, reverse=True)
    except Exception:  # noqa: BLE001 - the compiler side is optional here
        return [rest]
    ops: list[str] = []
    pos = 0
    while pos < len(rest):
        for op in known:
            if rest.startswith(op, pos) and (pos + len(op) == len(rest) or rest[pos + len(op)] == "_"):
                ops.append(op)
                pos += len(op) + 1
                break
        else:
            return [rest]
    return ops or [rest]


def dot_from_graph_json(graph_json: Any, param_names: Sequence[str] = (), title: str = "") -> str:
    """DOT text for a compiled model's graph JSON: each kernel (a fused group) is a cluster
    holding its fused ops; inputs are ellipses; params are omitted; ``__nop`` is dashed."""
    from ..runtime.graph_json import Graph, load_graph_json

    g = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
    params = set(param_names)
    lines = ["digraph kiln {", *_DOT_HEAD]
    nk = sum(1 for n in g.nodes if n.is_op and n.func_name != "__nop")
    lines.append("  label=" + _dot_str((title or 'compiled graph') + f': {nk} kernels') + "; labelloc=t;")
    first: dict[int, str] = {}   # node id -> DOT id edges go into
    last: dict[int, str] = {}    # node id -> DOT id edges leave from
    for nid, node in enumerate(g.nodes):
        e = g.entry_id(nid)
        if not node.is_op:
            if node.name in params:
                continue
            first[nid] = last[nid] = f"n{nid}"
            lines.append(f"  n{nid} [shape=ellipse, fillcolor=\"#e3f2fd\", "
                         "label=" + _lbl(node.name, f'{_shape_str(g.shape[e])} {g.dltype[e]}') + "];")
            continue
        shape = _shape_str(g.shape[e])
        if node.func_name in ("__nop", "__copy"):
            first[nid] = last[nid] = f"n{nid}"
            label = f"{node.func_name} (alias)" if node.func_name == "__nop" else node.func_name
            lines.append(f"  n{nid} [style=dashed, label={_dot_str(label)}];")
            continue
        ops = _group_ops(node)
        nparams = sum(1 for (src, _, _) in node.inputs if not g.nodes[src].is_op and g.nodes[src].name in params)
        glabel = node.func_name + (f" ({nparams} params)" if nparams else "")
        lines.append(f"  subgraph cluster_n{nid} {{")
        lines.append(f"    label={_dot_str(glabel)}; "
                     'style="rounded,filled"; fillcolor="#fbe9e7"; color="#888888";')
        for k, op in enumerate(ops):
            lab = _lbl(op, shape) if k == len(ops) - 1 else _dot_str(op)
            lines.append(f"    n{nid}_{k} [label={lab}];")
            if k:
                lines.append(f"    n{nid}_{k - 1} -> n{nid}_{k};")
        lines.append("  }")
        first[nid], last[nid] = f"n{nid}_0", f"n{nid}_{len(ops) - 1}"
    for nid, node in enumerate(g.nodes):
        if nid not in first or not node.is_op:
            continue
        for (src, idx, _) in node.inputs:
            if src in last:
                lab = _shape_str(g.shape[g.entry_id(src, idx)])
                lines.append(f"  {last[src]} -> {first[nid]} [label={_dot_str(lab)}];")
    for i, (src, idx, _) in enumerate(g.heads):
        e = g.entry_id(src, idx)
        lines.append(f"  out{i} [shape=doubleoctagon, fillcolor=\"#fff8e1\", "
                     "label=" + _lbl(f'output {i}', f'{_shape_str(g.shape[e])} {g.dltype[e]}') + "];")
        if src in last:
            lines.append(f"  {last[src]} -> out{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(dot_text: str, out_path: str) -> tuple[str, str]:
    """Write a drawing: SVG (or PNG/PDF) through graphviz ``dot`` when the extension asks for it
    and ``dot`` is installed, else the DOT text. Returns ``(path written, note)``."""
    import shutil
    import subprocess

    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise KilnFileNotFoundError(f"output directory does not exist: {out_dir}")
    base, ext = os.path.splitext(out_path)
    fmt = ext.lower().lstrip(".")
    if fmt in ("dot", "gv"):
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(dot_text)
        return out_path, "DOT"
    if fmt not in ("svg", "png", "pdf"):
        raise InputError(f"--graph {out_path}: unknown format {ext or '(none)'!r}; use .svg, .png, .pdf or .dot")
    dot = shutil.which("dot")
    if dot is None:
        dot_path = base + ".dot"
        with open(dot_path, "w", encoding="utf-8") as f:
            f.write(dot_text)
        return dot_path, (f"graphviz 'dot' is not installed, so wrote DOT instead of {fmt.upper()}; "
                          f"render it with: dot -T{fmt} {dot_path} -o {out_path}")
    proc = subprocess.run([dot, f"-T{fmt}", "-o", out_path], input=dot_text, text=True,
                          capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise KilnError(f"graphviz dot failed: {' '.join(proc.stderr.split())[:300]}")
    return out_path, fmt.upper()


def np_dtype_name(dtype: str) -> Any:
    """NumPy dtype of a Kiln dtype name (``bfloat16`` via ml_dtypes)."""
    from ..runtime.dtype import np_dtype

    return np_dtype(dtype)


def executor_devices(graph_json: Any) -> list[Any]:
    """The devices a compiled graph runs on: the CPU first, then one per other device type in
    ``attrs.device_index`` (e.g. ``[cpu(0), opencl(0)]`` for a heterogeneous OpenCL build)."""
    from ..runtime import cpu, device
    from ..runtime.graph_json import Graph, load_graph_json

    g = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
    devs = [cpu()]
    for code in sorted(set(g.device_index or ())):
        if code != devs[0].device_type:
            devs.append(device(code, 0))
    return devs


def create_graph_module(factory: Any, debug: bool = False) -> Any:
    """``GraphModule(factory["default"](*devices))`` (or the debug executor) on the devices the
    graph is placed on (see :func:`executor_devices`); linked params are bound by the executor."""
    from ..runtime import GraphModule

    devs = executor_devices(factory.get_graph_json())
    return factory.debug_create(*devs) if debug else GraphModule(factory[factory.mod_name](*devs))
