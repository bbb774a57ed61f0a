"""The tuning log: one JSON object per line, appended by :func:`kiln.autotune.tune`.

A record::

    {"workload": ["dense", [1, 512], [1000, 512], "float32"], "kind": "dense",
     "target": "llvm -mcpu=znver3", "config": {"mt": 6, "nt": 16}, "is_default": true,
     "median_s": 1.2e-05, "gflops": 85.3, "error": null, "kiln_version": "0.1.0",
     "timestamp": "2026-11-23T12:00:00Z"}

``error`` is a string (and ``median_s`` null) for a candidate that failed to compile, crashed
or gave a different result. :func:`best_configs` picks, per workload, the config with the
smallest median ``median_s`` over its valid records for one target (a config measured again,
e.g. in the tuner's confirmation rounds, has several); :func:`apply_history_best` makes them
the configs the schedules see.

It sits with :mod:`kiln.topi.knobs`, below the driver that reads it (``kiln.build(...,
tuning_log=...)``), and is re-exported as :mod:`kiln.autotune.log`; the tuner that writes it
sits on top.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..runtime.errors import InputError, KilnFileNotFoundError
from .knobs import KNOB_SPACES, DispatchContext, target_key, workload_key

__all__ = ["TuningRecord", "load_records", "append_records", "best_configs", "apply_history_best"]


@dataclass
class TuningRecord:
    """One measured (or failed) candidate config of one workload.

    Attributes
    ----------
    workload : tuple
    target : str
        :func:`~kiln.topi.knobs.target_key` of the target it was measured on.
    config : dict
    median_s : float or None
        Median kernel time in seconds (None when ``error`` is set).
    gflops : float or None
    error : str or None
    is_default : bool
        The config the schedule picks without a log.
    """

    workload: tuple
    target: str
    config: dict[str, Any]
    median_s: float | None = None
    gflops: float | None = None
    error: str | None = None
    is_default: bool = False
    kiln_version: str = ""
    timestamp: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return str(self.workload[0])

    @property
    def valid(self) -> bool:
        return self.error is None and self.median_s is not None and math.isfinite(self.median_s)

    def to_json(self) -> str:
        """The record as one JSON line (no newline)."""
        d: dict[str, Any] = {"workload": _jsonable(self.workload), "kind": self.kind, "target": self.target,
                             "config": dict(self.config), "is_default": bool(self.is_default),
                             "median_s": self.median_s, "gflops": self.gflops, "error": self.error,
                             "kiln_version": self.kiln_version, "timestamp": self.timestamp}
        d.update(self.extra)
        return json.dumps(d, sort_keys=False)


def _jsonable(x: Any) -> Any:
    if isinstance(x, tuple):
        return [_jsonable(y) for y in x]
    return x


def _bad(src: str, lineno: int, why: str) -> InputError:
    return InputError(f"malformed tuning log {src}, line {lineno}: {why}")


def _parse_line(line: str, src: str, lineno: int) -> TuningRecord:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as err:
        raise _bad(src, lineno, f"not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(d, dict):
        raise _bad(src, lineno, f"expected a JSON object, got {type(d).__name__}")
    wl = d.get("workload")
    if not isinstance(wl, list) or not wl or not isinstance(wl[0], str):
        raise _bad(src, lineno, "'workload' must be a non-empty list starting with the kernel kind")
    if wl[0] not in KNOB_SPACES:
        raise _bad(src, lineno, f"unknown kernel kind {wl[0]!r} (expected one of {sorted(KNOB_SPACES)})")
    tgt = d.get("target")
    if not isinstance(tgt, str) or not tgt:
        raise _bad(src, lineno, "'target' must be a non-empty string such as 'llvm -mcpu=znver3'")
    cfg = d.get("config")
    if not isinstance(cfg, dict) or not KNOB_SPACES[wl[0]].contains(cfg):
        raise _bad(src, lineno, f"'config' must be an object with knobs of {wl[0]!r}: "
                   f"{sorted(KNOB_SPACES[wl[0]].knobs)}")
    med: Any = d.get("median_s")  # validated below
    error = d.get("error")
    if error is not None and not isinstance(error, str):
        raise _bad(src, lineno, "'error' must be a string or null")
    if error is None and (not isinstance(med, (int, float)) or isinstance(med, bool) or not med > 0):
        raise _bad(src, lineno, "'median_s' must be a positive number when 'error' is null")
    gf = d.get("gflops")
    known = {"workload", "kind", "target", "config", "median_s", "gflops", "error", "is_default",
             "kiln_version", "timestamp"}
    return TuningRecord(workload_key(*wl), tgt, dict(cfg), float(med) if error is None else None,
                        float(gf) if isinstance(gf, (int, float)) and not isinstance(gf, bool) else None,
                        error, bool(d.get("is_default", False)), str(d.get("kiln_version", "")),
                        str(d.get("timestamp", "")), {k: v for k, v in d.items() if k not in known})


def load_records(log: Any) -> list[TuningRecord]:
    """Read a tuning log.

    Parameters
    ----------
    log : str, os.PathLike or iterable of TuningRecord
        A JSON-lines file (blank lines are skipped), or records already loaded.

    Returns
    -------
    list of TuningRecord

    Raises
    ------
    KilnFileNotFoundError
        The file does not exist.
    InputError
        A line is not a valid record (the message names the file and the line number).
    """
    if log is None:
        return []
    if isinstance(log, (str, os.PathLike)):
        path = os.fspath(log)
        if not os.path.isfile(path):
            raise KilnFileNotFoundError(f"tuning log not found: {path}")
        out = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    out.append(_parse_line(line, path, lineno))
        return out
    recs = list(log)
    for i, r in enumerate(recs):
        if not isinstance(r, TuningRecord):
            raise InputError(f"tuning_log item {i}: expected a kiln.autotune.TuningRecord, got {type(r).__name__}")
    return recs


def append_records(path: str | os.PathLike, records: Sequence[TuningRecord]) -> None:
    """Append records to a JSON-lines log (created if missing), flushing after each."""
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_json() + "\n")
            f.flush()


def best_configs(records: Iterable[TuningRecord], target: Any) -> dict[tuple, TuningRecord]:
    """Per workload, the config with the smallest median time on ``target`` (same kind and ``-mcpu``).

    Only valid records count; a config's time is the median over all its records.

    Parameters
    ----------
    records : iterable of TuningRecord
    target : str or Target
        Records whose ``target`` differs from ``target_key(target)`` are ignored.

    Returns
    -------
    dict
        Workload -> a record of the best config.
    """
    tk = target_key(target)
    # one config may have several records (re-runs, confirmation rounds): rank configs by the
    # median of their times, so one lucky sample on a noisy machine does not win
    times: dict[tuple, dict[tuple, list[float]]] = {}
    first: dict[tuple, dict[tuple, TuningRecord]] = {}
    for r in records:
        if r.target != tk or not r.valid:
            continue
        ck = tuple(sorted((k, repr(v)) for k, v in r.config.items()))
        times.setdefault(r.workload, {}).setdefault(ck, []).append(float(r.median_s))  # type: ignore[arg-type]
        first.setdefault(r.workload, {}).setdefault(ck, r)
    best: dict[tuple, TuningRecord] = {}
    for wl, by_cfg in times.items():
        ck = min(by_cfg, key=lambda c: (statistics.median(by_cfg[c]), c))
        best[wl] = first[wl][ck]
    return best


def apply_history_best(log: Any, target: Any = "llvm", record_queries: bool = False) -> DispatchContext:
    """A context in which the schedules use the best logged config of each workload.

    Parameters
    ----------
    log : str, os.PathLike or iterable of TuningRecord
    target : str or Target
        Only records measured for this target kind and ``-mcpu`` apply.
    record_queries : bool
        Keep every lookup in ``ctx.queries``.

    Returns
    -------
    DispatchContext
        Use as ``with kiln.autotune.apply_history_best("tune.jsonl", "llvm -mcpu=native"): ...``;
        ``ctx.applied`` is the set of workloads that got a tuned config.
    """
    best = best_configs(load_records(log), target)
    return DispatchContext({wl: dict(r.config) for wl, r in best.items()}, target=target_key(target),
                           record=record_queries)

