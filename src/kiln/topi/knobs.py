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

The ranges of the register-tile knobs come from the target's instruction set
(:func:`knob_space`): columns are one to four vectors, rows go as far as the register rule of
:func:`kiln.topi.schedule.x86.gemm_register_tile` allows, so every ISA's default tile (AVX2
6 x 16, AVX-512 6 x 64 and 12 rows beside a 16-wide panel) is inside its own space.
:data:`KNOB_SPACES` holds the spaces of the schedules' no-target ISA (x86-64-v3).

:func:`kernel_target` is the other half of the context: the computes registered for graph ops
take no target argument, yet a dense must lay its packed weight out for the target's vector
width; whoever lowers a graph's kernels for a target calls them inside
``with kernel_target(target):`` (without it they lay out for the no-target ISA).

The knobs are a kernel-layer concept: the schedules of :mod:`kiln.topi` ask them, and so does
the layout pass (:mod:`kiln.transform`, one layer up) to pick the blocking a convolution
schedule will use. :mod:`kiln.autotune` (the measured search, on top of the driver) re-exports
them as :mod:`kiln.autotune.space`.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..target import ISA, Target

__all__ = ["KNOB_SPACES", "TUNABLE_KINDS", "ConfigSpace", "DispatchContext", "current_config",
           "current_context", "workload_key", "target_key", "Query", "knob_space", "kernel_target",
           "current_kernel_target", "kernel_dims", "output_dyn"]

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


#: The tunable kernel kinds (the spaces are :func:`knob_space`'s):
#:
#: - ``dense`` / ``matmul``: register tile ``mt`` rows x ``nt`` columns; ``nt`` is also the panel
#:   width of the packed right operand (a packed kernel's column tile must be whole panels).
#: - ``conv2d_nchwc``: ``xt`` output pixels per register tile (0 = pick the largest divisor of
#:   the output width that fits the registers, the default) and ``order`` of the outer loops
#:   (``auto``: rows outside the channel blocks when the L2 estimate says so; ``block_outer``,
#:   ``row_outer``: forced).
#: - ``conv2d_layout``: output-channel block ``ob`` the layout pass gives a convolution (0 = the
#:   default rule from the output width). Read by :mod:`kiln.transform.alter_layout`.
_KINDS = ("dense", "matmul", "conv2d_nchwc", "conv2d_layout")

#: Pixels of a blocked-conv register tile the tuner tries besides 0 (the rule's choice); 14
#: is the largest tile the conv schedule ever makes (``x86_conv.MAX_X_TILE``).
_XT_VALUES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 14)


def _isa_of_space(target: Any) -> ISA:
    # imported here: the schedules import this module for current_config
    from .schedule.x86 import schedule_isa

    return schedule_isa(target)


def knob_space(kind: str, target: Any = None) -> ConfigSpace:
    """The knob values the tuner may try for ``kind`` on ``target``'s instruction set.

    Derived from :func:`kiln.target.isa_of` with ``L`` float32 lanes and ``R`` vector registers:

    * ``dense`` / ``matmul``: ``nt`` in ``L, 2L, 3L, 4L`` (one to four vectors — the widths the
      register rule considers — plus the ISA's default tile width), ``mt`` from 1 to the most
      rows :func:`~kiln.topi.schedule.x86.gemm_register_tile` fits beside any of those widths
      (at least 8).  AVX2: ``nt`` 8…32, ``mt`` 1…12; AVX-512: ``nt`` 16…64, ``mt`` 1…12; SSE2
      and NEON: ``nt`` 4…16.
    * ``conv2d_layout``: ``ob`` 0 (the rule) and ``L/2`` (at least 4), ``L``, ``2L``, ``4L``:
      AVX2 4, 8, 16, 32; AVX-512 8…64.
    * ``conv2d_nchwc``: pixels and loop order, which do not depend on the vector width.

    Parameters
    ----------
    kind : str
        One of the tunable kinds (``"dense"``, ``"matmul"``, ``"conv2d_nchwc"``,
        ``"conv2d_layout"``).
    target : Target or str, optional
        A CPU target; None means the schedules' no-target ISA (x86-64-v3, AVX2).

    Returns
    -------
    ConfigSpace

    Raises
    ------
    KeyError
        For an unknown kind.
    """
    if kind not in _KINDS:
        raise KeyError(f"no knob space for kernel kind {kind!r}; known: {', '.join(_KINDS)}")
    return _space_for(kind, _isa_of_space(target))


def _space_for(kind: str, isa: ISA) -> ConfigSpace:
    from .schedule.x86 import gemm_register_tile

    lanes = isa.lanes("float32")
    if kind in ("dense", "matmul"):
        nts = sorted({lanes * v for v in (1, 2, 3, 4)} | {gemm_register_tile(isa)[1]})
        rows = max([8] + [gemm_register_tile(isa, nt=nt)[0] for nt in nts])
        return ConfigSpace(kind, {"mt": tuple(range(1, rows + 1)), "nt": tuple(nts)})
    if kind == "conv2d_layout":
        return ConfigSpace(kind, {"ob": (0,) + tuple(sorted({max(4, lanes // 2), lanes, 2 * lanes, 4 * lanes}))})
    return ConfigSpace(kind, {"xt": _XT_VALUES, "order": ("auto", "block_outer", "row_outer")})


class _NoTargetSpaces(Mapping[str, ConfigSpace]):
    """``KNOB_SPACES``: :func:`knob_space` of every kind for no target, built on first use
    (the register rule lives in the schedules, which import this module)."""

    def __init__(self) -> None:
        self._spaces: dict[str, ConfigSpace] | None = None

    def _all(self) -> dict[str, ConfigSpace]:
        if self._spaces is None:
            self._spaces = {k: knob_space(k) for k in _KINDS}
        return self._spaces

    def __getitem__(self, kind: str) -> ConfigSpace:
        return self._all()[kind]

    def __contains__(self, kind: object) -> bool:
        return kind in _KINDS

    def __iter__(self) -> Iterator[str]:
        return iter(_KINDS)

    def __len__(self) -> int:
        return len(_KINDS)


#: The spaces of the schedules' no-target ISA (x86-64-v3: ``nt`` 8…32, ``mt`` 1…12); a tuner
#: for a named target asks :func:`knob_space` instead.  Its keys are the knob names a tuning
#: log may hold.
KNOB_SPACES: Mapping[str, ConfigSpace] = _NoTargetSpaces()

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


_target_local = threading.local()


@contextlib.contextmanager
def _pushed(local: threading.local, value: Any) -> Iterator[None]:
    """``value`` on top of ``local``'s per-thread stack while active."""
    stack = getattr(local, "stack", None)
    if stack is None:
        stack = local.stack = []
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def kernel_target(target: Any) -> Iterator[None]:
    """Lay kernels out for ``target`` while active: the registered computes read it.

    A compute registered for a graph op is called as ``fn(attrs, inputs, out_types)``, without
    the target, yet some must choose a data layout for its vector width (the packed panels of
    :func:`kiln.topi.nn.dense`).  Code that lowers a graph's kernels for ``target`` calls them
    inside ``with kernel_target(target):``; outside one (direct calls from tests and tools)
    they lay out for the schedules' no-target ISA, which the schedules assume too.  A GPU
    target is allowed and means the same as None.

    Parameters
    ----------
    target : Target, str or None
        A CPU target (None: no target).
    """
    with _pushed(_target_local, target):
        yield


def current_kernel_target() -> Any:
    """The target of the innermost active :func:`kernel_target`, or None."""
    stack = getattr(_target_local, "stack", None)
    return stack[-1] if stack else None


_dims_local = threading.local()


@contextlib.contextmanager
def kernel_dims(dim_var: Callable[[str], Any]) -> Iterator[None]:
    """Give the registered computes the runtime-extent Vars of the kernel being lowered.

    A compute sees its outputs as IR types only, yet a resize to runtime sizes needs its
    output's runtime extent, which no input carries: its coordinate scale is ``out / in`` at
    run time. :func:`output_dyn` asks ``dim_var`` for the Var of a symbolic dim, the one the
    kernel binds from the output's DLTensor.

    Parameters
    ----------
    dim_var : callable
        Canonical symbolic dim (str) -> its ``tir.Var`` in this kernel.
    """
    with _pushed(_dims_local, dim_var):
        yield


def output_dyn(out_type: Any) -> tuple[Any, ...] | None:
    """The dyn tuple (a Var per symbolic dim, None per static one) of an output type inside
    :func:`kernel_dims`; None for a static type. Outside one a symbolic output is a
    ``CompileError`` (a caller building a dynamic kernel must give the Vars)."""
    if out_type.sym is None:
        return None
    stack = getattr(_dims_local, "stack", None)
    if not stack:
        from ..runtime.errors import CompileError

        raise CompileError(f"the runtime extents of an output with dims {out_type.dims} are only "
                           "known inside kernel_dims()")
    return tuple(stack[-1](d) if isinstance(d, str) else None for d in out_type.sym)


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
