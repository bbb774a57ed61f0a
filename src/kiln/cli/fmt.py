"""How the ``kiln`` subcommands write numbers for people: durations, byte counts, arrays.

Owns the text form of a quantity, so that ``build``, ``run``, ``bench``, ``demo`` and
``inspect`` print ``12.3 ms`` and ``3.4 MiB`` the same way. NumPy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fmt_seconds", "fmt_bytes", "array_summary"]


def fmt_seconds(s: float) -> str:
    """``0.8 us``, ``12.3 ms``, ``1.52 s``."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_bytes(n: float) -> str:
    """``512 B``, ``12.0 KiB``, ``3.4 MiB`` (binary units, GiB at most)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # not reached: the loop returns at GiB


def array_summary(arr: np.ndarray) -> str:
    """``shape (1, 10) float32  min .. max .. mean ..`` (true count for bool arrays)."""
    a = np.asarray(arr)
    head = f"shape {tuple(a.shape)} {a.dtype}"
    if a.size == 0:
        return head + "  (empty)"
    if a.dtype == np.bool_:
        return head + f"  true {int(a.sum())}/{a.size}"
    f = a.astype(np.float64)
    return head + f"  min {f.min():.6g}  max {f.max():.6g}  mean {f.mean():.6g}"
