"""Wall-clock measurement of a callable, with TVM ``time_evaluator`` semantics."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

__all__ = ["BenchmarkResult", "measure"]


@dataclass(frozen=True)
class BenchmarkResult:
    """Per-repeat mean times of one call, in seconds.

    Attributes
    ----------
    results : tuple of float
        One entry per repeat: the repeat's total time divided by ``number``.
    number : int
        Calls per repeat actually used (it may have grown to honour ``min_repeat_ms``).
    """

    results: tuple[float, ...]
    number: int = 1

    def __init__(self, results: Sequence[float], number: int = 1) -> None:
        object.__setattr__(self, "results", tuple(float(r) for r in results))
        object.__setattr__(self, "number", int(number))

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results) if self.results else math.nan

    @property
    def median(self) -> float:
        return statistics.median(self.results) if self.results else math.nan

    @property
    def min(self) -> float:
        return min(self.results) if self.results else math.nan

    @property
    def max(self) -> float:
        return max(self.results) if self.results else math.nan

    @property
    def std(self) -> float:
        return statistics.pstdev(self.results) if len(self.results) > 1 else 0.0

    def __repr__(self) -> str:
        return (
            f"BenchmarkResult(mean={self.mean * 1e3:.4f} ms, median={self.median * 1e3:.4f} ms, "
            f"min={self.min * 1e3:.4f} ms, max={self.max * 1e3:.4f} ms, std={self.std * 1e3:.4f} ms, "
            f"repeat={len(self.results)}, number={self.number})"
        )

    def __str__(self) -> str:
        return (
            "Execution time summary:\n"
            f" mean (ms)   median (ms)    max (ms)     min (ms)     std (ms)\n"
            f" {self.mean * 1e3:<12.4f} {self.median * 1e3:<12.4f} {self.max * 1e3:<12.4f} "
            f"{self.min * 1e3:<12.4f} {self.std * 1e3:<12.4f}"
        )


def measure(
    fn: Callable[[], Any],
    number: int = 10,
    repeat: int = 1,
    min_repeat_ms: float = 0,
    sync: Callable[[], Any] | None = None,
    warmup: int = 1,
) -> BenchmarkResult:
    """Time ``fn()``.

    Each of ``repeat`` repeats calls ``fn`` ``number`` times back to back and records the
    mean. If the first repeat is shorter than ``min_repeat_ms``, ``number`` grows (as in
    TVM) until a repeat lasts that long, so that timer resolution does not dominate.

    Parameters
    ----------
    fn : callable
        Called with no arguments.
    number, repeat : int
        Calls per repeat, number of repeats (both at least 1).
    min_repeat_ms : float
        Minimum duration of one repeat in milliseconds.
    sync : callable, optional
        Called after each repeat's calls and before the clock stops (device sync).
    warmup : int
        Untimed calls made first (first-call costs such as lazy compilation or page faults).

    Returns
    -------
    BenchmarkResult
    """
    number = max(1, int(number))
    repeat = max(1, int(repeat))
    for _ in range(max(0, warmup)):
        fn()
    if sync is not None:
        sync()
    results: list[float] = []
    clock = time.perf_counter
    for _ in range(repeat):
        while True:
            t0 = clock()
            for _ in range(number):
                fn()
            if sync is not None:
                sync()
            elapsed = clock() - t0
            if elapsed * 1e3 >= min_repeat_ms or min_repeat_ms <= 0:
                break
            # Grow toward the target in one step when possible, at least by the golden ratio.
            per_call = max(elapsed / number, 1e-9)
            number = max(int(min_repeat_ms / 1e3 / per_call) + 1, int(number * 1.618) + 1)
        results.append(elapsed / number)
    return BenchmarkResult(results, number)
