"""Measured search over the schedule knobs: :func:`tune`.

For a model: optimize and fuse it as :func:`kiln.build` does, lower every group once under a
recording :class:`~kiln.topi.knobs.DispatchContext` to see which workloads the schedules
ask knobs for (the *tasks*), then per task build the one-group kernel with the default config
and with up to ``trials - 1`` other configs sampled from the space, time each with the
runtime's ``time_evaluator``, check it computes what the default computes, and append one
record per candidate to the log.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..runtime.errors import InputError
from ..topi.tuning_log import TuningRecord, append_records
from ..topi.knobs import TUNABLE_KINDS, DispatchContext, knob_space, target_key

__all__ = ["TuneTask", "TuneResult", "extract_tasks", "tune", "workload_flops"]


@dataclass
class TuneTask:
    """One tunable workload of a model.

    Attributes
    ----------
    workload : tuple
    defaults : dict
        The config the schedules pick without a log.
    group : FusedGroup
        A group whose kernel has this workload (the first one in the graph).
    calls : int
        How many kernel calls of the model have this workload.
    """

    workload: tuple
    defaults: dict[str, Any]
    group: Any
    calls: int = 1

    @property
    def kind(self) -> str:
        return str(self.workload[0])

    @property
    def flops(self) -> float:
        return workload_flops(self.workload)


@dataclass
class TuneResult:
    """What :func:`tune` measured for one task.

    Attributes
    ----------
    task : TuneTask
    records : list of TuningRecord
        Default first, then the sampled candidates (errors included).
    """

    task: TuneTask
    records: list[TuningRecord] = field(default_factory=list)
    confirmed: list[TuningRecord] = field(default_factory=list)

    @property
    def default(self) -> TuningRecord | None:
        return self.records[0] if self.records and self.records[0].is_default else None

    def config_median(self, index: int) -> float:
        """Median time of trial ``index``'s config over its trial and confirmation records."""
        cfg = self.records[index].config
        times = [r.median_s for r in self.records + self.confirmed if r.valid and r.config == cfg]
        return float(np.median(times)) if times else math.nan

    @property
    def best(self) -> TuningRecord | None:
        """The trial whose config has the smallest median time (what ``build`` will apply)."""
        valid = [i for i, r in enumerate(self.records) if r.valid]
        if not valid:
            return None
        return self.records[min(valid, key=self.config_median)]

    @property
    def speedup(self) -> float:
        """Default over best, both as medians of all their records."""
        d, b = self.default, self.best
        if d is None or b is None or not d.valid:
            return math.nan
        return self.config_median(0) / self.config_median(self.records.index(b))


def workload_flops(workload: Sequence[Any]) -> float:
    """Floating-point operations (2 per multiply-add) of one kernel of ``workload``; NaN if unknown."""
    kind = workload[0]
    try:
        if kind == "dense":
            data, weight = workload[1], workload[2]
            return 2.0 * math.prod(data[:-1]) * weight[0] * weight[1]
        if kind == "matmul":
            a, b = workload[1], workload[2]
            batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
            return 2.0 * math.prod(batch) * a[-2] * a[-1] * b[-1]
        if kind == "conv2d_nchwc":
            weight, out = workload[3], workload[4]
            return 2.0 * math.prod(out) * weight[1] * weight[2] * weight[3] * weight[4]
    except (TypeError, IndexError, ValueError):
        pass
    return math.nan


class _Groups:
    """The minimal ``FusedGraph`` the lowering needs for a subset of groups."""

    def __init__(self, groups: Sequence[Any]) -> None:
        self.groups = list(groups)

    def dump(self) -> str:
        return f"{len(self.groups)} group(s)"


def _prepare(mod: Any, params: Mapping[str, Any] | None, opt_level: int, target: Any) -> Any:
    from ..driver.build import _check_graph, optimize
    from ..transform.fuse import fuse_ops

    # the same graph the build of this target lowers (its conv layout blocks depend on the ISA),
    # but with dense weights unpacked: the panel width is a knob of the dense tasks, and a build
    # with the tuning log packs them at the tuned width
    return fuse_ops(optimize(_check_graph(mod), params, opt_level, target=target, disabled=("PackDenseWeights",)),
                    opt_level=opt_level)


def extract_tasks(mod: Any, params: Mapping[str, Any] | None = None, target: Any = "llvm",
                  kinds: Sequence[str] | None = None, opt_level: int = 3) -> list[TuneTask]:
    """The tunable workloads of a model, in graph order.

    Parameters
    ----------
    mod : Graph
    params : dict, optional
    target : str or Target
    kinds : sequence of str, optional
        Keep only these kernel kinds (default: all of :data:`~kiln.topi.knobs.TUNABLE_KINDS`).
    opt_level : int

    Returns
    -------
    list of TuneTask
    """
    from ..driver.build import _as_target
    from ..driver.lower_graph import lower_fused_graph

    kinds = tuple(kinds) if kinds else TUNABLE_KINDS
    for k in kinds:
        if k not in TUNABLE_KINDS:
            raise InputError(f"unknown task kind {k!r}: expected some of {', '.join(TUNABLE_KINDS)}")
    tgt = _as_target(target)
    fused = _prepare(mod, params, opt_level, tgt)
    ctx = DispatchContext(target=target_key(tgt), record=True)
    tasks: dict[tuple, TuneTask] = {}
    seen = {"n": 0}
    func_of_group: dict[int, str] = {}

    def on_kernel(i: int, n: int, name: str) -> None:
        group = fused.groups[i - 1]
        new = ctx.queries[seen["n"]:]
        seen["n"] = len(ctx.queries)
        for q in new:
            if q.kind not in kinds:
                continue
            t = tasks.get(q.workload)
            if t is None:
                tasks[q.workload] = TuneTask(q.workload, dict(q.defaults), group, calls=0)
            else:
                for k, v in q.defaults.items():
                    t.defaults.setdefault(k, v)
        func_of_group[i - 1] = name

    with ctx:
        low = lower_fused_graph(fused, tgt, "tune", on_kernel=on_kernel)
    # count the kernel calls of each workload (identical groups share a function)
    wl_of_func: dict[str, set] = {}
    for t in tasks.values():
        wl_of_func.setdefault(func_of_group[fused.groups.index(t.group)], set()).add(t.workload)
    for c in low.calls:
        for wl in wl_of_func.get(c.func_name, ()):
            tasks[wl].calls += 1
    return list(tasks.values())


def _valid_config(task: TuneTask, cfg: Mapping[str, Any]) -> bool:
    wl = task.workload
    if task.kind in ("dense", "matmul"):
        rows = math.prod(wl[1][:-1]) if task.kind == "dense" else wl[1][-2]
        return int(cfg["mt"]) <= max(1, rows)
    if task.kind == "conv2d_nchwc":
        ow = wl[4][3]
        if wl[1].startswith("depthwise") and cfg["order"] != "auto":
            return False
        return int(cfg["xt"]) <= ow
    return True


def _inputs_of(group: Any, args: Sequence[Any], rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for v in args:
        arr = v.const_value
        if arr is not None:
            out.append(np.array(arr, copy=True, order="C"))  # writable: DLPack refuses read-only
            continue
        dt = np.dtype(v.dtype)
        if np.issubdtype(dt, np.floating):
            out.append(rng.standard_normal(v.shape).astype(dt))
        elif dt == np.bool_:
            out.append(rng.integers(0, 2, v.shape).astype(dt))
        else:
            out.append(rng.integers(0, 4, v.shape).astype(dt))
    return out


def _lower_one(task: TuneTask, cfg: Mapping[str, Any] | None, tgt: Any) -> Any:
    """Lower the task's group alone with ``cfg`` applied (a LoweredModel of one kernel)."""
    from ..driver.lower_graph import lower_fused_graph

    ctx = DispatchContext({task.workload: dict(cfg)} if cfg else {}, record=False)
    with ctx:
        low = lower_fused_graph(_Groups([task.group]), tgt, "tune", whole_graph=False)
    if cfg and task.workload not in ctx.applied:
        raise RuntimeError("the schedule did not ask for this workload's knobs")
    return low


def _measure(module: Any, call: Any, inputs: Sequence[np.ndarray], number: int, repeat: int,
             min_repeat_ms: float, timeout: float | None) -> tuple[float, list[np.ndarray]]:
    outs = [np.zeros(v.shape, np.dtype(v.dtype)) for v in call.outputs]
    f = module[call.func_name]
    t0 = time.perf_counter()
    f(*inputs, *outs)
    first = time.perf_counter() - t0
    if timeout is not None and first > timeout:
        raise TimeoutError(f"one run took {first:.3f} s (> --timeout {timeout} s)")
    res = module.time_evaluator(call.func_name, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)(
        *inputs, *outs)
    return float(res.median), outs


def _close(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            return f"output {i} shape {x.shape} != {y.shape}"
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        scale = float(np.max(np.abs(yf))) if yf.size else 0.0
        # a different tile changes the summation order: allow float32 rounding on that scale
        tol = 1e-4 * scale + 1e-6
        if not np.all(np.isfinite(xf) == np.isfinite(yf)):
            return f"output {i}: non-finite values differ from the default's"
        err = float(np.max(np.abs(xf - yf), initial=0.0, where=np.isfinite(yf)))
        if err > tol:
            return f"output {i} differs from the default config's by {err:.3g} (> {tol:.3g})"
    return None


def tune(mod: Any, params: Mapping[str, Any] | None = None, target: Any = "llvm",
         log_file: str | None = None, trials: int = 8, kinds: Sequence[str] | None = None,
         number: int = 5, repeat: int = 3, min_repeat_ms: float = 20.0, timeout: float | None = 10.0,
         num_threads: int | None = None, seed: int = 0, opt_level: int = 3, confirm: int = 3,
         progress: Callable[[str], None] | None = None) -> list[TuneResult]:
    """Measure schedule configs of every tunable kernel of a model and log the results.

    Parameters
    ----------
    mod : Graph
        The model (e.g. from :func:`kiln.frontend.from_onnx`).
    params : dict, optional
        Weights; the measured kernels read the real constants.
    target : str or Target
        A CPU target (``"llvm"``, ``"llvm -mcpu=native"``, ``"c"``).
    log_file : str, optional
        JSON-lines log the records are appended to (one line per candidate, as it is measured).
    trials : int
        Candidates per task, the default config included (1 = measure the default only).
    kinds : sequence of str, optional
        Task kinds to tune (``"dense"``, ``"matmul"``, ``"conv2d_nchwc"``; default all). ``"conv"``
        is accepted for ``"conv2d_nchwc"``.
    number, repeat, min_repeat_ms
        Timing per candidate (see :meth:`kiln.runtime.Module.time_evaluator`); the median of
        the repeats is recorded.
    timeout : float, optional
        A candidate whose first run takes longer than this many seconds is recorded as an
        error and not timed further (a run is not interrupted).
    num_threads : int, optional
        Kernel threads while measuring (default: ``$KILN_NUM_THREADS`` or all cores).
    confirm : int
        When a candidate beat the default, time the default and the best candidate again this
        many times, alternating, and log those runs too: a single timing on a shared machine
        is noisy, and :func:`~kiln.topi.tuning_log.best_configs` ranks configs by the median of
        all their records.
    seed : int
        Seed of the candidate sampling and of the random inputs.
    progress : callable, optional
        Called with one line of text per measured candidate (``kiln tune`` prints it to stderr).

    Returns
    -------
    list of TuneResult
        One per task, in graph order.
    """
    from .. import codegen
    from .._version import __version__
    from ..driver.build import _as_target

    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise InputError(f"trials must be a positive integer, got {trials!r}")
    tgt = _as_target(target)
    tkind = getattr(tgt.kind, "name", str(tgt.kind))
    if tkind not in ("llvm", "c"):
        raise InputError(f"kiln tune measures CPU kernels: target must be 'llvm' or 'c', got {str(tgt)!r}")
    alias = {"conv": "conv2d_nchwc", "conv2d": "conv2d_nchwc"}
    kinds = tuple(dict.fromkeys(alias.get(k, k) for k in kinds)) if kinds else None
    tk = target_key(tgt)
    say = progress or (lambda s: None)
    tasks = extract_tasks(mod, params, tgt, kinds, opt_level)
    say(f"{len(tasks)} tasks for {tk}")
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    results: list[TuneResult] = []
    for ti, task in enumerate(tasks):
        space = knob_space(task.kind, tgt)
        defaults = dict(task.defaults)
        cands = [defaults] + space.sample(trials - 1, rng, exclude=[defaults],
                                          valid=lambda c, t=task, d=defaults: _valid_config(t, c) and _differs(t, c, d))
        res = TuneResult(task)
        ref: list[np.ndarray] | None = None
        inputs: list[np.ndarray] | None = None
        kernels: dict[str, int] = {}
        built: dict[int, tuple[Any, Any]] = {}
        for ci, cfg in enumerate(cands):
            rec = TuningRecord(task.workload, tk, dict(cfg), is_default=(ci == 0), kiln_version=__version__,
                               timestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                               extra={"calls": task.calls})
            try:
                low = _lower_one(task, None if ci == 0 else cfg, tgt)
                text = "\n".join(str(f) for f in low.funcs)
                if text in kernels:
                    # e.g. xt equal to what the default rule picks: same loops, nothing to learn
                    raise _Duplicate(f"same kernel as trial {kernels[text] + 1}")
                kernels[text] = ci
                module, call = codegen.build_module(low.funcs, tgt), low.calls[0]
                if num_threads is not None and hasattr(module, "set_num_threads"):
                    module.set_num_threads(int(num_threads))
                if inputs is None:
                    inputs = _inputs_of(task.group, call.args, nrng)
                med, outs = _measure(module, call, inputs, number, repeat, min_repeat_ms, timeout)
                built[ci] = (module, call)
                if ref is None:
                    if ci != 0:
                        raise RuntimeError("no reference: the default config failed")
                    ref = outs
                else:
                    bad = _close(outs, ref)
                    if bad:
                        raise ValueError(bad)
                rec.median_s = med
                fl = task.flops
                rec.gflops = None if math.isnan(fl) else round(fl / med / 1e9, 3)
            except _Duplicate as err:
                rec.error = f"duplicate: {err}"
            except Exception as err:  # noqa: BLE001 - a broken candidate is a logged result, not a crash
                rec.error = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            res.records.append(rec)
            if log_file is not None:
                append_records(log_file, [rec])
            what = (f"{rec.median_s * 1e3:.4f} ms" + (f" {rec.gflops:.1f} GFLOP/s" if rec.gflops else "")
                    if rec.valid else f"error: {rec.error}")
            say(f"[task {ti + 1}/{len(tasks)} {task.kind}] trial {ci + 1}/{len(cands)} "
                f"{_fmt_cfg(cfg)}{' (default)' if ci == 0 else ''}: {what}")
        best = res.best
        if confirm > 0 and best is not None and not best.is_default and res.default is not None and res.default.valid:
            bi = res.records.index(best)
            for rnd in range(confirm):
                for ci in (0, bi):
                    module, call = built[ci]
                    src = res.records[ci]
                    rec = TuningRecord(task.workload, tk, dict(src.config), is_default=src.is_default,
                                       kiln_version=__version__,
                                       timestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                       extra={"calls": task.calls, "confirm": rnd + 1})
                    try:
                        rec.median_s = _measure(module, call, inputs, number, repeat, min_repeat_ms, timeout)[0]
                        fl = task.flops
                        rec.gflops = None if math.isnan(fl) else round(fl / rec.median_s / 1e9, 3)
                    except Exception as err:  # noqa: BLE001
                        rec.error = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
                    res.confirmed.append(rec)
                    if log_file is not None:
                        append_records(log_file, [rec])
            d_med, b_med = res.config_median(0), res.config_median(bi)
            say(f"[task {ti + 1}/{len(tasks)} {task.kind}] confirm: default {d_med * 1e3:.4f} ms, "
                f"{_fmt_cfg(best.config)} {b_med * 1e3:.4f} ms (medians of all runs)")
        built.clear()
        results.append(res)
    return results


class _Duplicate(Exception):
    pass


def _differs(task: TuneTask, cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
    return any(cfg.get(k) != v for k, v in defaults.items())


def _fmt_cfg(cfg: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg.items())


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
