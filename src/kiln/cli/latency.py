"""Latency statistics of ``kiln bench`` and ``kiln demo``: the numbers and their table.

Owns which statistics a latency report has (median, mean, min, max, std, p90, in ms) and how
they are printed. NumPy only.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["LATENCY_COLUMNS", "latency_stats", "format_latency_table"]

#: The statistics of a latency report, in table order.
LATENCY_COLUMNS = ("median", "mean", "min", "max", "std", "p90")


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """:data:`LATENCY_COLUMNS` of per-run times, in milliseconds (all NaN for no runs)."""
    a = np.asarray(seconds, dtype=np.float64) * 1e3
    if a.size == 0:
        return {k: float("nan") for k in LATENCY_COLUMNS}
    return {
        "median": float(np.median(a)),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "std": float(a.std()),
        "p90": float(np.percentile(a, 90)),
    }


def format_latency_table(rows: Mapping[str, Mapping[str, float]]) -> str:
    """A small table of latency statistics (ms), one row per engine (``kiln``, ``onnxruntime``)."""
    name_w = max(8, *(len(k) for k in rows))
    lines = [f"{'latency (ms)':<{name_w}}  " + "  ".join(f"{c:>9}" for c in LATENCY_COLUMNS)]
    for name, st in rows.items():
        lines.append(f"{name:<{name_w}}  " + "  ".join(f"{st[c]:>9.4f}" for c in LATENCY_COLUMNS))
    return "\n".join(lines)
