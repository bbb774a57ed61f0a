"""Schedule knobs: config spaces, workload keys and the dispatch context.

Every tile choice of the CPU schedules goes through :func:`current_config`::

    cfg = current_config("dense", workload, {"mt": 6, "nt": 16})

which returns the hand-picked defaults unless a :class:`DispatchContext` is active and holds
a config for that workload (a tuned record from a log, or a candidate the tuner is trying).
Without a context the schedules behave exactly as before the knobs existed.

A *workload* identifies one kernel instance independently of its fused epilogue: the kind
plus the anchor's input shapes, dtype and (for convolutions) strides / padding / dilation.
The target (kind + ``-mcpu``) is kept apart, in :func:`target_key`: a context is created for
one target and holds only that target's records.

The knobs are a kernel-layer concept: the schedules of :mod:`kiln.topi` ask them, and so does
the layout pass (:mod:`kiln.transform`, one layer up) to pick the blocking a convolution
schedule will use. :mod:`kiln.autotune` (the measured search, on top of the driver) re-exports
them as :mod:`kiln.autotune.space`.
"""

from __future__ import annotations

import itertools
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..target import Target

__all__ = ["KNOB_SPACES", "TUNABLE_KINDS", "ConfigSpace", "DispatchContext", "current_config",
           "current_context", "workload_key", "target_key", "Query"]

#: A workload: ``(kind, *parameters)``, all ints / strings / nested tuples (JSON round-trips it
#: as lists; :func:`workload_key` normalises both to tuples).
Workload = tuple


@dataclass(frozen=True)
class ConfigSpace:
    """The values each knob of one kernel kind may take (a small grid).

    Attributes
    ----------
    kind : str
    knobs : dict of str to tuple
        Knob name -> candidate values.
    """

    kind: str
    knobs: Mapping[str, tuple]

    def __len__(self) -> int:
        n = 1
        for v in self.knobs.values():
            n *= len(v)
        return n

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every config, in a fixed order."""
        names = list(self.knobs)
        for vals in itertools.product(*(self.knobs[k] for k in names)):
            yield dict(zip(names, vals))

    def sample(self, n: int, rng: random.Random, exclude: Sequence[Mapping[str, Any]] = (),
               valid: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
        """Up to ``n`` distinct configs, uniformly without replacement, none in ``exclude``."""
        seen = {_freeze_cfg(c) for c in exclude}
        pool = [c for c in self.grid() if _freeze_cfg(c) not in seen and (valid is None or valid(c))]
        rng.shuffle(pool)
        return pool[:n]

    def contains(self, cfg: Mapping[str, Any]) -> bool:
        """Whether every knob of ``cfg`` is a known knob of this space (values are not checked:
        a log may hold hand-written values outside the grid)."""
        return all(k in self.knobs for k in cfg)


#: The tunable kernel kinds and their spaces.
#:
#: - ``dense`` / ``matmul``: register tile ``mt`` rows x ``nt`` columns; ``nt`` is also the panel
#:   width of the packed right operand (a packed kernel's column tile must be whole panels).
#: - ``conv2d_nchwc``: ``xt`` output pixels per register tile (0 = pick the largest divisor of
#:   the output width that fits the registers, the default) and ``order`` of the outer loops
#:   (``auto``: rows outside the channel blocks when the L2 estimate says so; ``block_outer``,
#:   ``row_outer``: forced).
#: - ``conv2d_layout``: output-channel block ``ob`` the layout pass gives a convolution (0 = the
#:   default rule from the output width). Read by :mod:`kiln.transform.alter_layout`.
KNOB_SPACES: dict[str, ConfigSpace] = {
    "dense": ConfigSpace("dense", {"mt": (1, 2, 3, 4, 5, 6, 7, 8), "nt": (8, 16, 24, 32)}),
    "matmul": ConfigSpace("matmul", {"mt": (1, 2, 3, 4, 5, 6, 7, 8), "nt": (8, 16, 24, 32)}),
    "conv2d_nchwc": ConfigSpace("conv2d_nchwc", {"xt": (0, 1, 2, 3, 4, 5, 6, 7, 8, 14),
                                                 "order": ("auto", "block_outer", "row_outer")}),
    "conv2d_layout": ConfigSpace("conv2d_layout", {"ob": (0, 4, 8, 16, 32)}),
}

#: Kinds the tuner measures by building one kernel (``conv2d_layout`` changes the graph, so it
#: is applied from a log but not searched).
TUNABLE_KINDS = ("dense", "matmul", "conv2d_nchwc")


def _norm(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return tuple(_norm(y) for y in x)
    if hasattr(x, "value") and not isinstance(x, (str, bytes)):  # te IntImm-like
        return _norm(x.value)
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, int):
        return int(x)
    return x if isinstance(x, (str, float)) else str(x)


def workload_key(kind: str, *params: Any) -> Workload:
    """The hashable key of a kernel instance: ``(kind, *params)`` with lists made tuples.

    Parameters
    ----------
    kind : str
        One of :data:`KNOB_SPACES`.
    *params
        Shapes, dtypes, strides... (ints, strings or nested sequences of them).

    Returns
    -------
    tuple
    """
    return (str(kind),) + tuple(_norm(p) for p in params)


def target_key(target: Any) -> str:
    """``"<kind>"`` or ``"<kind> -mcpu=<cpu>"`` of a target (``-mcpu=native`` resolved)."""
    if target is None:
        target = "llvm"
    t = target if isinstance(target, Target) else Target(target)
    kind = getattr(t.kind, "name", str(t.kind))
    mcpu = getattr(t, "mcpu", "") or ""
    return f"{kind} -mcpu={mcpu}" if mcpu else str(kind)


def _freeze_cfg(cfg: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, _norm(v)) for k, v in cfg.items()))


@dataclass
class Query:
    """One :func:`current_config` call seen by a context (what the tuner extracts tasks from)."""

    kind: str
    workload: Workload
    defaults: dict[str, Any]
    tuned: bool


@dataclass
class DispatchContext:
    """Maps workloads to configs while it is active (``with ctx:``).

    Attributes
    ----------
    configs : dict
        Workload tuple -> config dict (merged over the defaults of each query).
    target : str
        The :func:`target_key` the configs are for ("" = any).
    queries : list of Query
        Every lookup made while active (in order).
    record : bool
        Keep :attr:`queries` (the tuner's task extraction); off for plain builds.
    """

    configs: dict[Workload, dict[str, Any]] = field(default_factory=dict)
    target: str = ""
    queries: list[Query] = field(default_factory=list)
    record: bool = True
    hits: int = 0
    applied: set = field(default_factory=set)

    def lookup(self, kind: str, workload: Workload, defaults: Mapping[str, Any]) -> dict[str, Any]:
        cfg = dict(defaults)
        tuned = self.configs.get(workload)
        if tuned is not None:
            cfg.update({k: v for k, v in tuned.items() if k in defaults})
            self.hits += 1
            self.applied.add(workload)
        if self.record:
            self.queries.append(Query(kind, workload, dict(defaults), tuned is not None))
        return cfg

    def __enter__(self) -> "DispatchContext":
        _stack().append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        st = _stack()
        if st and st[-1] is self:
            st.pop()
        elif self in st:
            st.remove(self)


_local = threading.local()


def _stack() -> list[DispatchContext]:
    st = getattr(_local, "stack", None)
    if st is None:
        st = _local.stack = []
    return st


def current_context() -> DispatchContext | None:
    """The innermost active :class:`DispatchContext`, or None."""
    st = _stack()
    return st[-1] if st else None


def current_config(kind: str, workload: Workload, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Knob values for one kernel: the active context's config for ``workload`` over ``defaults``.

    Parameters
    ----------
    kind : str
        Kernel kind (a key of :data:`KNOB_SPACES`).
    workload : tuple
        From :func:`workload_key`.
    defaults : dict
        The hand-picked values; returned unchanged when no context applies.

    Returns
    -------
    dict
        A new dict with exactly the keys of ``defaults``.
    """
    ctx = current_context()
    if ctx is None:
        return dict(defaults)
    return ctx.lookup(kind, workload, defaults)
