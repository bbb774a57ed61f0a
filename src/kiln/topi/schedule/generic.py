"""Target-independent CPU schedules and the building blocks the per-target ones reuse.

Rules every schedule here follows for a fused group:

* non-output injective stages (tags ``elemwise`` / ``broadcast`` / ``injective``) are
  inlined into their readers;
* other non-reduction stages (padding copies, weight packing) stay materialised and get an
  injective loop schedule;
* reductions keep their own stage; when the group's output is a same-shape injective
  epilogue that is the reduction's only reader, the reduction is ``compute_at`` the
  output's loops (the epilogue is fused, the accumulator stays in a small local buffer);
  otherwise it is a root stage with parallel outer spatial loops.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ...ir.op import OpPattern
from ...runtime.errors import TargetError
from ...target import isa_of
from ..registry import register_schedule
from ..util import is_injective_stage, prod

__all__ = [
    "VEC", "PARALLEL_MIN", "vector_elements", "prepare", "readers_after_inline", "schedule_injective_stage",
    "schedule_reduce_stage", "attach_to_output", "schedule_injective", "schedule_reduce", "finalize",
]

#: Innermost split of vectorised loops (elements) when no CPU target is known: two AVX2
#: vectors of float32, what :func:`vector_elements` gives for x86-64-v3.
VEC = 16
#: Loops with fewer total elements than this run on one thread (launch overhead dominates).
PARALLEL_MIN = 1 << 14


def vector_elements(target: Any) -> int:
    """Innermost split of a vectorised injective loop for ``target``: two vectors of float32.

    Two registers per iteration give the out-of-order core two independent load / op / store
    chains; more only lengthens the guarded tail of short rows.  SSE2 and NEON 8, AVX2 16,
    AVX-512 32 (from :func:`kiln.target.isa_of`).  :data:`VEC` when ``target`` is None or not
    a CPU target (a GPU target has no vector registers to fill).
    """
    if target is None:
        return VEC
    try:
        isa = isa_of(target)
    except TargetError:  # a device target: it has no CPU ISA
        return VEC
    return max(1, 2 * isa.lanes("float32"))


def prepare(outs: Sequence[te.Tensor]) -> te.Schedule:
    """``create_schedule(outs)`` and inline every non-output injective stage."""
    s = te.create_schedule([o.op for o in outs])
    for st in s.stages:
        if isinstance(st.op, te.ComputeOp) and not st.is_output and is_injective_stage(st.op):
            st.compute_inline()
    return s


def readers_after_inline(s: te.Schedule) -> dict[int, list[te.Stage]]:
    """``id(op) -> non-inlined stages that read it`` (reads through inlined stages count)."""
    direct: dict[int, list[te.Stage]] = {}
    for st in s.stages:
        for t in st.op.input_tensors:
            lst = direct.setdefault(id(t.op), [])
            if st not in lst:
                lst.append(st)
    out: dict[int, list[te.Stage]] = {}

    def resolve(op_id: int, seen: set[int]) -> list[te.Stage]:
        res: list[te.Stage] = []
        for r in direct.get(op_id, []):
            if r.attach_type == "inline":
                if id(r.op) in seen:
                    continue
                seen.add(id(r.op))
                cands = resolve(id(r.op), seen)
            else:
                cands = [r]
            for c in cands:
                if c not in res:
                    res.append(c)
        return res

    for st in s.stages:
        out[id(st.op)] = resolve(id(st.op), set())
    return out


def _parallel_ok(n: int) -> bool:
    return n >= PARALLEL_MIN


def schedule_injective_stage(s: te.Schedule, st: te.Stage, vec: int = VEC) -> None:
    """Fuse outer axes (parallel), split the innermost by ``vec`` and vectorise it."""
    axes = list(st.op.axis)
    if not axes:
        return
    shape = [iv.dom_extent for iv in axes]
    total = prod(shape)
    if total <= 1:
        return
    if shape[-1] >= vec:
        # keep the contiguous last axis whole: cheap index math, clean vector loop
        outer = st.fuse(*axes[:-1]) if len(axes) > 1 else None
        xo, xi = st.split(axes[-1], factor=vec)
        st.vectorize(xi)
        if outer is not None:
            if _parallel_ok(total):
                st.parallel(outer)
        elif _parallel_ok(total):
            st.parallel(xo)
        return
    fused = st.fuse(*axes)
    if total >= vec:
        fo, fi = st.split(fused, factor=vec)
        st.vectorize(fi)
        if _parallel_ok(total):
            st.parallel(fo)
    elif _parallel_ok(total):
        st.parallel(fused)


def schedule_reduce_stage(s: te.Schedule, st: te.Stage) -> te.IterVar | None:
    """Root reduction: fuse the spatial axes (parallel when there is enough work)."""
    axes = list(st.op.axis)
    if not axes:
        return None
    fused = st.fuse(*axes)
    work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in st.op.reduce_axis))
    if prod(iv.dom_extent for iv in axes) > 1 and _parallel_ok(work):
        st.parallel(fused)
    return fused


def attach_to_output(s: te.Schedule, red: te.Stage, out: te.Stage,
                     readers: dict[int, list[te.Stage]] | None = None) -> bool:
    """``compute_at`` a reduction into a same-shape injective output (one point per iteration).

    Returns False (and leaves the reduction at root) when the output is not its only reader
    or the shapes differ.
    """
    readers = readers if readers is not None else readers_after_inline(s)
    if red.is_output or readers.get(id(red.op), []) != [out] or out.op.reduce_axis:
        return False
    if tuple(red.op.output(0).shape) != tuple(out.op.output(0).shape) or not out.op.axis:
        return False
    axes = list(out.op.axis)
    fused = out.fuse(*axes)
    work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in red.op.reduce_axis))
    if prod(iv.dom_extent for iv in axes) > 1 and _parallel_ok(work):
        out.parallel(fused)
    red.compute_at(out, fused)
    return True


def finalize(s: te.Schedule, handled: set[int], vec: int = VEC) -> te.Schedule:
    """Give every root compute stage not in ``handled`` a default loop schedule.

    ``vec`` is the innermost split of the injective stages (:func:`vector_elements` of the
    target).
    """
    readers = None
    for st in s.stages:
        if not isinstance(st.op, te.ComputeOp) or id(st.op) in handled or st.attach_type != "root":
            continue
        if st.op.reduce_axis:
            if readers is None:
                readers = readers_after_inline(s)
            rd = readers.get(id(st.op), [])
            if len(rd) == 1 and rd[0].is_output and id(rd[0].op) not in handled and not rd[0].op.reduce_axis \
                    and attach_to_output(s, st, rd[0], readers):
                handled.add(id(rd[0].op))
            else:
                schedule_reduce_stage(s, st)
        else:
            schedule_injective_stage(s, st, vec)
        handled.add(id(st.op))
    return s


def schedule_injective(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """Elementwise / broadcast / injective groups (and the fallback for everything else)."""
    s = prepare(outs)
    return finalize(s, set(), vector_elements(target))


def schedule_reduce(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """Reduction groups: injective producers inlined, reductions parallel over spatial axes."""
    s = prepare(outs)
    return finalize(s, set(), vector_elements(target))


for _p in (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE, OpPattern.TUPLE, OpPattern.OPAQUE,
           OpPattern.OUT_ELEMWISE_FUSABLE):
    register_schedule(_p, "generic", schedule_injective)
register_schedule(OpPattern.COMM_REDUCE, "generic", schedule_reduce)
