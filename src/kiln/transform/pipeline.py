"""Pass infrastructure: a pass is a callable Graph -> Graph with a name and an opt level."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

from ..ir import Graph
from ..runtime.errors import KilnError

__all__ = ["Pass", "Sequential", "graph_pass"]


class Pass:
    """A named graph transformation.

    Parameters
    ----------
    fn : callable
        ``fn(graph) -> graph``; must not mutate its argument's nodes in a way visible to the
        caller (passes in this package always build a new graph or return the input unchanged).
    name : str
        Display name (also used by ``Sequential(disabled=...)``).
    opt_level : int
        The pass runs under a pipeline whose ``opt_level`` is >= this.
    required : bool
        Run regardless of opt_level and ``disabled`` (e.g. ``InferType``).
    """

    def __init__(self, fn: Callable[[Graph], Graph], name: str | None = None,
                 opt_level: int = 0, required: bool = False) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.opt_level = opt_level
        self.required = required

    def __call__(self, graph: Graph) -> Graph:
        out = self.fn(graph)
        if not isinstance(out, Graph):
            raise KilnError(f"pass {self.name} returned {type(out).__name__}, not a Graph")
        return out

    def __repr__(self) -> str:
        return f"Pass({self.name}, opt_level={self.opt_level})"


def graph_pass(name: str | None = None, opt_level: int = 0, required: bool = False
               ) -> Callable[[Callable[[Graph], Graph]], Pass]:
    """Decorator turning ``fn(graph) -> graph`` into a :class:`Pass`."""

    def deco(fn: Callable[[Graph], Graph]) -> Pass:
        return Pass(fn, name or fn.__name__, opt_level, required)

    return deco


class Sequential(Pass):
    """Run passes in order, skipping those above ``opt_level`` or named in ``disabled``.

    Parameters
    ----------
    passes : iterable of Pass or callable
        Plain callables count as opt level 0.
    opt_level : int
        Pipeline level (TVM convention: 0 = only required, 3 = everything).
    disabled : iterable of str
        Names of passes to skip, in addition to those listed (comma-separated) in the
        environment variable ``KILN_DISABLE_PASSES`` (e.g. ``AlterConvLayout``), which lets
        a benchmark or a bug hunt turn a pass off without code changes.
    name : str
    trace : callable, optional
        ``trace(pass_name, graph, seconds)`` after every pass that ran (for debugging/timing).
    """

    def __init__(self, passes: Iterable[Pass | Callable[[Graph], Graph]], opt_level: int = 2,
                 disabled: Iterable[str] = (), name: str = "Sequential",
                 trace: Callable[[str, Graph, float], None] | None = None) -> None:
        self.passes = [p if isinstance(p, Pass) else Pass(p) for p in passes]
        self.pipeline_level = opt_level
        self.disabled = set(disabled) | {p.strip() for p in os.environ.get("KILN_DISABLE_PASSES", "").split(",")
                                         if p.strip()}
        self.trace = trace
        super().__init__(self._run, name, 0)

    def _run(self, graph: Graph) -> Graph:
        for p in self.passes:
            if not p.required and (p.opt_level > self.pipeline_level or p.name in self.disabled):
                continue
            t0 = time.perf_counter()
            graph = p(graph)
            if self.trace is not None:
                self.trace(p.name, graph, time.perf_counter() - t0)
        return graph

    def __repr__(self) -> str:
        return f"Sequential({[p.name for p in self.passes]}, opt_level={self.pipeline_level})"
