"""Schedules: how the loop nest of each operation is shaped (split, fuse, reorder, ...).

A :class:`Schedule` holds one :class:`Stage` per operation reachable from the outputs.
Schedule primitives only *record* loop transformations (as split / fuse relations between
:class:`IterVar` s); :func:`kiln.tir.lower` turns the records into loops.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..runtime.errors import CompileError
from .tensor import ComputeOp, IterVar, Operation, PlaceholderOp, Tensor

__all__ = ["Schedule", "Stage", "Split", "Fuse", "create_schedule", "inline_injective", "thread_axis"]

#: GPU thread tags :meth:`Stage.bind` accepts (work-group / work-item indices per dimension).
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def thread_axis(tag: str) -> IterVar:
    """A GPU thread index to :meth:`Stage.bind` a loop to (TVM's ``te.thread_axis``).

    Parameters
    ----------
    tag : str
        One of ``blockIdx.{x,y,z}`` (work-group index) or ``threadIdx.{x,y,z}`` (work-item
        index within the group).

    Returns
    -------
    IterVar
        An iteration variable of type ``"thread"`` whose name is the tag.
    """
    if tag not in THREAD_TAGS:
        raise CompileError(f"thread_axis: unknown thread tag {tag!r}; expected one of {', '.join(THREAD_TAGS)}")
    return IterVar((0, 0), tag, "thread")


class Split:
    """``parent = outer * inner_extent + inner`` (``factor`` or ``nparts`` given)."""

    def __init__(self, parent: IterVar, outer: IterVar, inner: IterVar, factor: int | None, nparts: int | None):
        self.parent, self.outer, self.inner, self.factor, self.nparts = parent, outer, inner, factor, nparts


class Fuse:
    """``fused = outer * inner_extent + inner``."""

    def __init__(self, outer: IterVar, inner: IterVar, fused: IterVar) -> None:
        self.outer, self.inner, self.fused = outer, inner, fused


class Stage:
    """The schedule of one operation.

    Attributes
    ----------
    op : Operation
    leaf_iter_vars : list of IterVar
        Current loop order, outermost first.
    relations : list of Split / Fuse
    iter_var_attrs : dict
        IterVar → loop kind (``"parallel"``, ``"vectorized"``, ``"unrolled"``).
    attach_type : str
        ``"root"`` (own loop nest at the top level), ``"inline"``, ``"scope"`` (computed
        inside another stage's loop, see :meth:`compute_at`) or ``"placeholder"``.
    """

    def __init__(self, op: Operation, schedule: "Schedule") -> None:
        self.op = op
        self.schedule = schedule
        self.root_iter_vars: list[IterVar] = list(op.axis) + list(op.reduce_axis)
        self.leaf_iter_vars: list[IterVar] = list(self.root_iter_vars)
        self.all_iter_vars: list[IterVar] = list(self.root_iter_vars)
        self.relations: list[Split | Fuse] = []
        self.iter_var_attrs: dict[IterVar, str] = {}
        self.thread_bindings: dict[IterVar, str] = {}  # leaf IterVar -> thread tag (see bind)
        self.attach_type = "placeholder" if isinstance(op, PlaceholderOp) else "root"
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.is_output = False
        #: Memory scope of the stage's buffer when it is compute_at another stage: "global"
        #: (default), "shared" (work-group memory, see Schedule.cache_read) or "local".
        self.scope = "global"

    def __repr__(self) -> str:
        return f"stage({self.op.name}, {self.attach_type})"

    # ------------------------------------------------------------------ helpers
    def _check_leaf(self, iv: IterVar, prim: str) -> int:
        if not isinstance(iv, IterVar):
            raise CompileError(f"{prim} on stage {self.op.name}: expected an IterVar, got {iv!r}")
        try:
            return self.leaf_iter_vars.index(iv)
        except ValueError:
            names = ", ".join(v.name for v in self.leaf_iter_vars)
            raise CompileError(
                f"{prim} on stage {self.op.name}: {iv.name} is not a current loop axis of this stage "
                f"(axes: {names}); it may already have been split or fused"
            ) from None

    def _new(self, name: str, iter_type: str) -> IterVar:
        iv = IterVar((0, 0), name, iter_type)  # extent is derived at lowering
        self.all_iter_vars.append(iv)
        return iv

    def _compute_only(self, prim: str) -> None:
        if not isinstance(self.op, ComputeOp):
            raise CompileError(f"{prim}: {self.op.name} is a placeholder and has no loops")

    # ------------------------------------------------------------------ primitives
    def split(self, parent: IterVar, factor: int | None = None, nparts: int | None = None) -> tuple[IterVar, IterVar]:
        """Split ``parent`` into ``(outer, inner)`` loops.

        Exactly one of ``factor`` (inner extent) or ``nparts`` (outer extent) is given.  A
        factor that does not divide the extent is fine: the tail is guarded.
        """
        self._compute_only("split")
        pos = self._check_leaf(parent, "split")
        if (factor is None) == (nparts is None):
            raise CompileError(f"split on stage {self.op.name}: give exactly one of factor= or nparts=")
        n = int(factor if factor is not None else nparts)
        if n < 1:
            raise CompileError(f"split on stage {self.op.name}: factor/nparts must be >= 1, got {n}")
        outer = self._new(parent.name + ".outer", parent.iter_type)
        inner = self._new(parent.name + ".inner", parent.iter_type)
        self.relations.append(Split(parent, outer, inner, n if factor is not None else None,
                                    n if nparts is not None else None))
        self.leaf_iter_vars[pos:pos + 1] = [outer, inner]
        return outer, inner

    def tile(self, x: IterVar, y: IterVar, x_factor: int, y_factor: int) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """Split ``x`` and ``y`` and reorder to ``(xo, yo, xi, yi)``."""
        xo, xi = self.split(x, x_factor)
        yo, yi = self.split(y, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *ivs: IterVar) -> IterVar:
        """Fuse adjacent loops (outermost first) into one."""
        self._compute_only("fuse")
        if len(ivs) == 1 and isinstance(ivs[0], (list, tuple)):
            ivs = tuple(ivs[0])
        if not ivs:
            raise CompileError(f"fuse on stage {self.op.name}: nothing to fuse")
        if len(ivs) == 1:
            return ivs[0]
        pos = [self._check_leaf(iv, "fuse") for iv in ivs]
        if pos != list(range(pos[0], pos[0] + len(pos))):
            raise CompileError(
                f"fuse on stage {self.op.name}: axes {[iv.name for iv in ivs]} must be adjacent loops, "
                f"outermost first (current order: {[v.name for v in self.leaf_iter_vars]})"
            )
        types = {iv.iter_type for iv in ivs}
        if len(types) > 1:
            raise CompileError(f"fuse on stage {self.op.name}: cannot fuse data-parallel and reduce axes")
        acc = ivs[0]
        for nxt in ivs[1:]:
            fused = self._new(f"{acc.name}.{nxt.name}.fused", acc.iter_type)
            self.relations.append(Fuse(acc, nxt, fused))
            acc = fused
        self.leaf_iter_vars[pos[0]:pos[-1] + 1] = [acc]
        return acc

    def reorder(self, *ivs: IterVar) -> None:
        """Put the given loops in this order (the other loops keep their positions)."""
        self._compute_only("reorder")
        if len(ivs) == 1 and isinstance(ivs[0], (list, tuple)):
            ivs = tuple(ivs[0])
        pos = [self._check_leaf(iv, "reorder") for iv in ivs]
        if len(set(pos)) != len(pos):
            raise CompileError(f"reorder on stage {self.op.name}: an axis is given twice")
        for p, iv in zip(sorted(pos), ivs):
            self.leaf_iter_vars[p] = iv

    def _annotate(self, iv: IterVar, kind: str) -> None:
        self._compute_only(kind)
        self._check_leaf(iv, kind)
        self.iter_var_attrs[iv] = kind

    def parallel(self, iv: IterVar) -> None:
        """Run the loop's iterations on the thread pool (``KilnBackendParallelLaunch``)."""
        if iv.iter_type == IterVar.REDUCE:
            raise CompileError(f"parallel on stage {self.op.name}: {iv.name} is a reduction axis")
        self._annotate(iv, "parallel")

    def vectorize(self, iv: IterVar) -> None:
        """Mark the loop for SIMD execution (should be innermost with a small constant extent)."""
        self._annotate(iv, "vectorized")

    def unroll(self, iv: IterVar) -> None:
        """Fully unroll the loop."""
        self._annotate(iv, "unrolled")

    def bind(self, iv: IterVar, thread_iv: IterVar | str) -> None:
        """Run the loop's iterations as GPU work-groups / work-items (``thread_axis``).

        The loop disappears from the kernel: its variable becomes the thread index, and the
        launch size of the tag is the loop's extent (the GPU code generators read it).
        ``thread_iv`` may also be the tag itself (``"threadIdx.x"``). CPU code generators
        run a bound loop as an ordinary serial loop.
        """
        if isinstance(thread_iv, str):
            thread_iv = thread_axis(thread_iv)
        if not isinstance(thread_iv, IterVar) or thread_iv.iter_type != "thread":
            raise CompileError(f"bind on stage {self.op.name}: second argument must be te.thread_axis(tag), "
                               f"got {thread_iv!r}")
        if iv.iter_type == IterVar.REDUCE and not thread_iv.name.startswith("threadIdx."):
            raise CompileError(f"bind on stage {self.op.name}: reduction axis {iv.name} can only be bound to a "
                               f"threadIdx tag (a work-group tree reduction), not {thread_iv.name}")
        if iv.iter_type == IterVar.REDUCE and any(
                t.startswith("threadIdx.") and v.iter_type == IterVar.REDUCE for v, t in self.thread_bindings.items()):
            raise CompileError(f"bind on stage {self.op.name}: only one reduction axis may be bound to a thread")
        self._annotate(iv, "thread_binding")
        self.thread_bindings[iv] = thread_iv.name

    def compute_inline(self) -> None:
        """Substitute this stage's expression into its consumers (no loop nest, no buffer)."""
        self._compute_only("compute_inline")
        if self.op.reduce_axis:
            raise CompileError(f"compute_inline: {self.op.name} is a reduction and cannot be inlined")
        self.attach_type, self.attach_stage, self.attach_ivar = "inline", None, None

    def compute_root(self) -> None:
        """Give this stage its own top-level loop nest (the default)."""
        self._compute_only("compute_root")
        self.attach_type, self.attach_stage, self.attach_ivar = "root", None, None

    def compute_at(self, parent: "Stage", iv: IterVar) -> None:
        """Compute the part of this stage that ``parent`` needs, inside ``parent``'s loop ``iv``."""
        self._compute_only("compute_at")
        if not isinstance(parent, Stage):
            raise CompileError("compute_at: first argument must be a stage (s[tensor])")
        parent._check_leaf(iv, "compute_at")
        if parent is self:
            raise CompileError(f"compute_at: stage {self.op.name} cannot be attached to itself")
        self.attach_type, self.attach_stage, self.attach_ivar = "scope", parent, iv


class Schedule:
    """All stages of a computation, in topological order (producers first)."""

    def __init__(self, outputs: Sequence[Operation]) -> None:
        self.outputs = list(outputs)
        order: list[Operation] = []
        seen: set[int] = set()
        for out in self.outputs:
            stack: list[tuple[Operation, bool]] = [(out, False)]
            while stack:
                op, expanded = stack.pop()
                if expanded:
                    if id(op) not in seen:
                        seen.add(id(op))
                        order.append(op)
                    continue
                if id(op) in seen:
                    continue
                stack.append((op, True))
                for t in reversed(op.input_tensors):
                    if id(t.op) not in seen:
                        stack.append((t.op, False))
        self.stages: list[Stage] = [Stage(op, self) for op in order]
        self._map: dict[int, Stage] = {id(st.op): st for st in self.stages}
        for op in self.outputs:
            self._map[id(op)].is_output = True
        #: id(reader op) -> {tensor: cache tensor}: reads the lowering redirects (cache_read).
        self.read_redirects: dict[int, dict[Tensor, Tensor]] = {}

    def __getitem__(self, t: Tensor | Operation) -> Stage:
        op = t.op if isinstance(t, Tensor) else t
        st = self._map.get(id(op))
        if st is None:
            raise CompileError(f"{op.name} is not part of this schedule")
        return st

    def __contains__(self, t: Tensor | Operation) -> bool:
        op = t.op if isinstance(t, Tensor) else t
        return id(op) in self._map

    def cache_read(self, tensor: Tensor, scope: str, readers: Stage | Tensor | Sequence[Stage | Tensor]) -> Tensor:
        """A copy of ``tensor`` in memory ``scope`` that ``readers`` read instead of it.

        The new stage (TVM's ``cache_read``) is ``cache[i] = tensor[i]``; place it with
        :meth:`Stage.compute_at` in a loop of the (single) reader: lowering then copies only
        the tile the reader touches inside that loop (region inference) into a buffer of
        that size and scope. For ``"shared"`` the region is taken over the whole work-group
        (loops bound to ``threadIdx.*`` outside the attach point are relaxed), the copy is
        meant to be split across the group's work-items (bind its fused loop to
        ``threadIdx.x``), and a work-group barrier follows the copy and the reader's use
        of it (so the next iteration does not overwrite data still being read).

        Parameters
        ----------
        tensor : Tensor
            The tensor to cache (a placeholder or a materialized stage).
        scope : {"shared", "local"}
            Work-group memory or per-work-item memory.
        readers : Stage, Tensor or list of them
            The stages whose reads of ``tensor`` go to the cache instead.

        Returns
        -------
        Tensor
            The cache tensor (``s[cache]`` is its stage).
        """
        from .tensor import compute

        if not isinstance(tensor, Tensor) or tensor not in self:
            raise CompileError(f"cache_read: expected a tensor of this schedule, got {tensor!r}")
        if scope not in ("shared", "local"):
            raise CompileError(f"cache_read of {tensor.name}: scope must be 'shared' or 'local', got {scope!r}")
        if isinstance(readers, (Stage, Tensor)):
            readers = [readers]
        rstages = [r if isinstance(r, Stage) else self[r] for r in readers]
        if not rstages:
            raise CompileError(f"cache_read of {tensor.name}: no readers given")
        for r in rstages:
            if not isinstance(r.op, ComputeOp) or r.schedule is not self:
                raise CompileError(f"cache_read of {tensor.name}: reader {r.op.name} is not a compute stage of this "
                                   "schedule")
        cache = compute(tensor.shape, lambda *i: tensor(*i), name=f"{tensor.name}.{scope}", tag="cache_read")
        st = Stage(cache.op, self)
        st.scope = scope
        pos = min(self.stages.index(r) for r in rstages)
        self.stages.insert(pos, st)
        self._map[id(cache.op)] = st
        for r in rstages:
            self.read_redirects.setdefault(id(r.op), {})[tensor] = cache
        return cache

    def consumers(self, op: Operation) -> list[Stage]:
        """Stages reading an output of ``op``."""
        return [st for st in self.stages if any(t.op is op for t in st.op.input_tensors)]

    def lower(self, args: Sequence[Tensor], name: str = "main", simple_mode: bool = False) -> Any:
        """Lower this schedule to a :class:`kiln.tir.PrimFunc` (see :mod:`kiln.te.lower_schedule`).

        ``kiln.tir.lower(sch, args)`` calls this, so the loop IR needs no import of te.
        """
        from .lower_schedule import lower  # lower_schedule imports this module

        return lower(self, args, name, simple_mode)

    def __repr__(self) -> str:
        return f"Schedule({', '.join(repr(s) for s in self.stages)})"


def create_schedule(outputs: Tensor | Operation | Iterable[Tensor | Operation]) -> Schedule:
    """A default schedule: every compute stage gets its own root loop nest.

    Parameters
    ----------
    outputs : Tensor, Operation or list of them
        The computation's outputs.
    """
    if isinstance(outputs, (Tensor, Operation)):
        outputs = [outputs]
    ops: list[Operation] = []
    for o in outputs:
        op = o.op if isinstance(o, Tensor) else o
        if not isinstance(op, Operation):
            raise CompileError(f"create_schedule: expected tensors or operations, got {o!r}")
        if op not in ops:
            ops.append(op)
    return Schedule(ops)


def inline_injective(s: Schedule) -> Schedule:
    """Inline every non-output, non-reduction compute stage (the usual fused-kernel schedule)."""
    for st in s.stages:
        if isinstance(st.op, ComputeOp) and not st.is_output and not st.op.reduce_axis:
            st.compute_inline()
    return s
