"""Schedule knobs: config spaces, workload keys and the dispatch context.

They live in :mod:`kiln.topi.knobs` (the schedules and the layout pass below this package ask
them); this module keeps ``kiln.autotune.space`` working.
"""

from __future__ import annotations

from ..topi.knobs import (KNOB_SPACES, TUNABLE_KINDS, ConfigSpace, DispatchContext, Query, Workload,
                          current_config, current_context, target_key, workload_key)

__all__ = ["KNOB_SPACES", "TUNABLE_KINDS", "ConfigSpace", "DispatchContext", "current_config",
           "current_context", "workload_key", "target_key", "Query", "Workload"]
