"""Registry of per-op compute definitions and per-target schedules.

Two tables connect the graph IR (:mod:`kiln.ir`) to kernels:

* **computes** — ``op name -> fn(attrs, inputs, out_types) -> list[te.Tensor]``; ``attrs`` are
  the op's canonical (schema-normalised) attributes, ``inputs`` the kernel's input placeholders
  (or upstream tensors of a fused group), ``out_types`` the IR output types (the compute must
  produce exactly these shapes/dtypes).
* **schedules** — ``(op name or fusion pattern, target kind) -> fn(outs, target) -> Schedule``.
  :func:`schedule_group` picks the most specific one for a fused group:
  ``op+kind``, ``op+generic``, ``pattern+kind``, ``pattern+generic``.

Target kinds are the first word of a target string (``"llvm -mcpu=native"`` → ``"llvm"``) or
``target.kind`` (a string or an object with ``.name``) of a :class:`kiln.target.Target`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..runtime.errors import KilnError
from ..target.kind import get_target_kind

__all__ = [
    "ComputeFn", "ScheduleFn", "register_compute", "get_compute", "has_compute", "list_computes",
    "register_schedule", "get_schedule", "schedule_group", "target_kind", "target_keys", "PrimKernelFn",
    "register_prim_kernel", "get_prim_kernel",
]

#: ``fn(attrs, inputs, out_types) -> list[te.Tensor]``
ComputeFn = Callable[[dict, list, list], list]
#: ``fn(outs, target) -> te.Schedule``
ScheduleFn = Callable[[list, Any], Any]

_COMPUTES: dict[str, ComputeFn] = {}
#: ``fn(attrs, args: list[tir.Buffer], outs: list[tir.Buffer], name: str, target) -> PrimFunc``
PrimKernelFn = Callable[[dict, list, list, str, Any], Any]
#: op name -> (kernel, the target keys it is for or None for every target)
_PRIM_KERNELS: dict[str, tuple[PrimKernelFn, tuple[str, ...] | None]] = {}
_SCHEDULES: dict[tuple[str, str], ScheduleFn] = {}

_PATTERN_NAMES = {0: "ELEMWISE", 1: "BROADCAST", 2: "INJECTIVE", 3: "COMM_REDUCE",
                  4: "OUT_ELEMWISE_FUSABLE", 7: "TUPLE", 8: "OPAQUE"}


def _ensure_builtin() -> None:
    # The built-in computes/schedules register themselves on import of their modules.
    from . import _builtin  # noqa: F401
    from .schedule import gpu  # noqa: F401


def _pattern_key(pattern: Any) -> str | None:
    """``"pattern:<NAME>"`` for an OpPattern / int / pattern name, else None."""
    if isinstance(pattern, bool):
        return None
    if isinstance(pattern, int):  # OpPattern is an IntEnum
        name = _PATTERN_NAMES.get(int(pattern))
        return None if name is None else f"pattern:{name}"
    if isinstance(pattern, str) and pattern.upper() in _PATTERN_NAMES.values():
        return f"pattern:{pattern.upper()}"
    return None


def _key(op_name_or_pattern: Any) -> str:
    pk = _pattern_key(op_name_or_pattern)
    if pk is not None:
        return pk
    if not isinstance(op_name_or_pattern, str) or not op_name_or_pattern:
        raise KilnError(f"schedule key must be an op name or an OpPattern, got {op_name_or_pattern!r}")
    return f"op:{op_name_or_pattern}"


def _kind_keys(kind: str) -> list[str]:
    """The registered default keys of a target kind (none for an unknown kind or "generic")."""
    try:
        return get_target_kind(kind).default_keys
    except KilnError:  # "generic" or an unregistered kind: no keys
        return []


def target_keys(target: Any) -> list[str]:
    """The keys (``"cpu"``, ``"gpu"``, ...) of a target string or Target object: its own
    ``keys``, else its kind's default keys (none for None or an unknown kind)."""
    return list(getattr(target, "keys", None) or _kind_keys(target_kind(target)))


def target_kind(target: Any) -> str:
    """The target kind (``"c"``, ``"llvm"``, ...) of a target string or Target object.

    ``None`` means ``"generic"``.
    """
    if target is None:
        return "generic"
    if isinstance(target, str):
        s = target.strip()
        return s.split()[0] if s else "generic"
    kind = getattr(target, "kind", None)
    if kind is None:
        return "generic"
    if isinstance(kind, str):
        return kind
    name = getattr(kind, "name", None)
    return str(name if name is not None else kind)


# ----------------------------------------------------------------------------- computes
def register_compute(op_name: str, fn: ComputeFn | None = None, *, override: bool = False) -> Any:
    """Register the compute definition of IR op ``op_name`` (usable as a decorator).

    Parameters
    ----------
    op_name : str
        IR op name (``"conv2d"``).
    fn : callable, optional
        ``fn(attrs: dict, inputs: list[te.Tensor], out_types: list[TensorType]) ->
        list[te.Tensor]``.  When omitted, a decorator is returned.
    override : bool
        Replace an existing registration instead of raising.

    Returns
    -------
    callable
        ``fn`` (or the decorator).
    """

    def reg(f: ComputeFn) -> ComputeFn:
        if op_name in _COMPUTES and not override:
            raise KilnError(f"a compute for op {op_name!r} is already registered")
        _COMPUTES[op_name] = f
        return f

    return reg if fn is None else reg(fn)


def get_compute(op_name: str) -> ComputeFn:
    """The compute of ``op_name``.

    Raises
    ------
    KilnError
        If no compute is registered for the op (the message names it).
    """
    _ensure_builtin()
    fn = _COMPUTES.get(op_name)
    if fn is None:
        raise KilnError(f"no compute registered for op {op_name!r} (kiln.topi has computes for "
                        f"{len(_COMPUTES)} ops; see kiln.topi.list_computes())")
    return fn


def has_compute(op_name: str) -> bool:
    """Whether a compute is registered for ``op_name``."""
    _ensure_builtin()
    return op_name in _COMPUTES


def register_prim_kernel(op_name: str, fn: PrimKernelFn | None = None, *,
                         keys: Sequence[str] | None = None) -> Any:
    """Register a kernel written directly as loop IR for IR op ``op_name`` (a decorator too).

    For ops a tensor expression cannot state: data-dependent outputs (NonZero, Unique, NMS)
    whose kernel counts as it writes and reports the count as its output's extent
    (``tir.set_extent``), and loops whose extents and indices come from tables
    (``kiln.topi.ml``: n-gram matching, tree walks); and for ops a tensor expression states only
    at a cost (ScatterElements, whose search form is ``O(data * updates along the axis)``).
    The op must be ``OPAQUE`` (a kernel of its own). The driver calls
    ``fn(attrs, args, outs, name, target)`` with parameter :class:`~kiln.tir.Buffer` s, one per
    input of the node (a value it reads twice is two arguments) and per output (``dyn``
    set for symbolic dims the kernel reads; a data-dependent dim the kernel decides is left
    static at its upper bound) and uses the returned :class:`~kiln.tir.PrimFunc` as is.

    Parameters
    ----------
    op_name : str
        IR op name.
    fn : callable, optional
        The kernel builder; when omitted, a decorator is returned.
    keys : sequence of str, optional
        Target keys (``("cpu",)``) the kernel is for: on a target with none of them the driver
        lowers the op's compute (:func:`register_compute`, which must then exist) as for any
        op. None (the default): every target.
    """
    for_keys = None if keys is None else tuple(keys)
    if for_keys is not None and (not for_keys or not all(isinstance(k, str) and k for k in for_keys)):
        raise KilnError(f"loop-IR kernel of op {op_name!r}: keys must be non-empty target keys, got {keys!r}")

    def reg(f: PrimKernelFn) -> PrimKernelFn:
        if op_name in _PRIM_KERNELS:
            raise KilnError(f"a loop-IR kernel for op {op_name!r} is already registered")
        _PRIM_KERNELS[op_name] = (f, for_keys)
        return f

    return reg if fn is None else reg(fn)


def get_prim_kernel(op_name: str, target: Any = None) -> PrimKernelFn | None:
    """The loop-IR kernel of ``op_name`` (:func:`register_prim_kernel`) for ``target``, or None.

    ``target`` (a target string or :class:`~kiln.target.Target`) None: the kernel whatever
    targets it is for. Otherwise None too where the kernel was registered for target keys of
    which ``target`` has none (the op's compute is its form there).
    """
    _ensure_builtin()
    entry = _PRIM_KERNELS.get(op_name)
    if entry is None:
        return None
    fn, for_keys = entry
    if target is None or for_keys is None or set(for_keys) & set(target_keys(target)):
        return fn
    return None


def list_computes() -> list[str]:
    """Names of the ops that have a compute, sorted."""
    _ensure_builtin()
    return sorted(_COMPUTES)


# ----------------------------------------------------------------------------- schedules
def register_schedule(op_name_or_pattern: Any, target_kind: str | Sequence[str] = "generic",
                      fn: ScheduleFn | None = None, *,
                      override: bool = False) -> Any:
    """Register a schedule for an op name or a fusion pattern on a target kind (decorator).

    Parameters
    ----------
    op_name_or_pattern : str or OpPattern
        An IR op name (``"dense"``) or a fusion pattern (``OpPattern.INJECTIVE``, its int value,
        or its name ``"injective"``).
    target_kind : str or sequence of str
        ``"generic"`` (any target) or a target kind such as ``"llvm"`` / ``"c"``; a list
        registers the same function for several kinds.
    fn : callable, optional
        ``fn(outs: list[te.Tensor], target) -> te.Schedule``.
    override : bool
        Replace an existing registration instead of raising.
    """
    key = _key(op_name_or_pattern)
    kinds = [target_kind] if isinstance(target_kind, str) else list(target_kind)

    def reg(f: ScheduleFn) -> ScheduleFn:
        for k in kinds:
            if (key, k) in _SCHEDULES and not override:
                raise KilnError(f"a schedule for {key} on target kind {k!r} is already registered")
            _SCHEDULES[(key, k)] = f
        return f

    return reg if fn is None else reg(fn)


def get_schedule(anchor_op_name: str | None, pattern: Any, target: Any) -> ScheduleFn:
    """The most specific schedule function: op+kind, op+generic, pattern+kind, pattern+generic.

    Raises
    ------
    KilnError
        If nothing matches (the message names the op, pattern and target kind).
    """
    _ensure_builtin()
    kind = target_kind(target)
    keys: list[str] = []
    if anchor_op_name:
        keys.append(f"op:{anchor_op_name}")
    pk = _pattern_key(pattern) if pattern is not None else None
    if pk is not None:
        keys.append(pk)
    # GPU targets (keys contain "gpu") prefer any GPU schedule over the generic CPU ones
    gpu = "gpu" in target_keys(target)
    order = ([(key, k) for k in (kind, "gpu") for key in keys] + [(key, "generic") for key in keys] if gpu
             else [(key, k) for key in keys for k in (kind, "generic")])
    for key, k in order:
        fn = _SCHEDULES.get((key, k))
        if fn is not None:
            return fn
    raise KilnError(f"no schedule for op {anchor_op_name!r} / pattern {pattern!r} on target kind {kind!r}")


def schedule_group(anchor_op_name: str | None, pattern: Any, outs: Sequence[Any], target: Any) -> Any:
    """Schedule a fused group of computes.

    Parameters
    ----------
    anchor_op_name : str or None
        The group's master op (conv2d, dense, a reduction, ...; for pure injective groups any
        op of the group, or None).
    pattern : OpPattern or int or str
        The group's fusion pattern (used when no op-specific schedule exists).
    outs : list of te.Tensor
        The group's output tensors.
    target : str or Target or None
        Where the kernel runs.

    Returns
    -------
    te.Schedule
        A schedule in which every non-output injective stage is inlined and the anchor keeps
        its own stage (attached to the output loops when the epilogue can be fused).
    """
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return get_schedule(anchor_op_name, pattern, target)(outs, target)
