"""The tuning log (JSON lines): read, write, best record per workload, :func:`apply_history_best`.

It lives in :mod:`kiln.topi.tuning_log` (``kiln.build(..., tuning_log=...)`` reads it below
this package); this module keeps ``kiln.autotune.log`` working.
"""

from __future__ import annotations

from ..topi.tuning_log import TuningRecord, append_records, apply_history_best, best_configs, load_records

__all__ = ["TuningRecord", "load_records", "append_records", "best_configs", "apply_history_best"]
