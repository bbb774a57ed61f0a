"""Schedule knobs and measured tuning.

- :mod:`kiln.autotune.space` (code in :mod:`kiln.topi.knobs`): config spaces, workload keys,
  :func:`current_config` (what the schedules call) and the :class:`DispatchContext`.
- :mod:`kiln.autotune.log` (code in :mod:`kiln.topi.tuning_log`): the JSON-lines tuning log
  (read, write, best record per workload) and :func:`apply_history_best`.
- :mod:`kiln.autotune.tuner`: :func:`tune`, the measured search.

This package sits on top of the layer table (the tuner drives :mod:`kiln.driver`); the knobs
and the log sit in the kernel layer because the schedules, the layout pass and the driver read
them. The tuner loads on first use. See ``docs/tuning.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..topi.knobs import (KNOB_SPACES, TUNABLE_KINDS, ConfigSpace, DispatchContext, current_config, current_context,
                          target_key, workload_key)

__all__ = ["KNOB_SPACES", "TUNABLE_KINDS", "ConfigSpace", "DispatchContext", "current_config", "current_context",
           "target_key", "workload_key", "tune", "TuneTask", "TuneResult", "extract_tasks", "apply_history_best",
           "load_records", "best_configs", "TuningRecord"]

_LAZY = {"tune": "tuner", "TuneTask": "tuner", "TuneResult": "tuner", "extract_tasks": "tuner",
         "apply_history_best": "log", "load_records": "log", "best_configs": "log", "TuningRecord": "log"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kiln.autotune' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
