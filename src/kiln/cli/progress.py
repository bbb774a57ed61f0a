"""The stage-by-stage progress display of long ``kiln`` commands (``build``, ``bench``, ``demo``).

Owns drawing on stderr and the per-stage clock; which stages a build has, and how the build
driver's events map onto them, is :mod:`kiln.cli.build_steps`. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, Iterator, Sequence

from .fmt import fmt_seconds

__all__ = ["Progress"]


class Progress:
    """Stage-by-stage progress on stderr.

    On a terminal the current stage is redrawn in place with a running clock (so a long
    codegen or C compile visibly makes progress); otherwise (logs, pipes, tests) one line is
    printed per finished stage. ``enabled=False`` prints nothing but still records timings.

    Parameters
    ----------
    stages : sequence of str
        The stages in order, for the ``[i/n]`` labels (a stage not listed shows ``[-/n]``).
    enabled : bool
        Draw anything at all.
    stream : file, optional
        Where to draw (default ``sys.stderr``).

    Usage::

        prog = Progress(BUILD_STAGES)
        with prog.stage("import"):
            ...
        prog.timings  # {"import": 0.12, ...}
    """

    _SPIN = "|/-\\"

    def __init__(self, stages: Sequence[str], enabled: bool = True, stream: Any = None) -> None:
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
    @property
    def current(self) -> str | None:
        """The stage running now, or None between stages."""
        return self._current

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
            except (OSError, ValueError):  # a closed or broken stderr must not fail the build
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
