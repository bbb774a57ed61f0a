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
from ...te.dynamic import explicit_dyn
from ...tir.expr import IntImm, PrimExpr, ProducerLoad, Var
from ...tir.functor import post_order_visit, substitute
from ...tir.vectorize import stride_in
from ...ir.op import OpPattern
from ...runtime.errors import TargetError
from ...target import isa_of
from ..registry import register_schedule
from ..util import is_injective_stage, prod

__all__ = [
    "VEC", "PARALLEL_MIN", "vector_elements", "prepare", "readers_after_inline", "schedule_injective_stage",
    "schedule_reduce_stage", "attach_to_output", "schedule_injective", "schedule_reduce", "finalize", "fuse_outer",
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
    """Split a vector loop of ``vec`` off the trailing axes (see :func:`_vector_block`), fuse
    the axes outside it (parallel) and vectorise it."""
    axes = list(st.op.axis)
    if not axes:
        return
    shape = [iv.dom_extent for iv in axes]
    total = prod(shape)
    if total <= 1:
        return
    k = _vector_block(s, st, vec)
    if k < len(axes):
        outer = fuse_outer(st, axes[:-k])
        _, xi = st.split(st.fuse(*axes[-k:]), factor=vec)
        st.vectorize(xi)
        if _parallel_ok(total):
            st.parallel(outer)
        return
    fused = st.fuse(*axes)
    if total >= vec:
        fo, fi = st.split(fused, factor=vec)
        st.vectorize(fi)
        if _parallel_ok(total):
            st.parallel(fo)
    elif _parallel_ok(total):
        st.parallel(fused)


def fuse_outer(st: te.Stage, axes: Sequence[te.IterVar]) -> te.IterVar:
    """Fuse ``axes`` (leading axes of ``st``, in order) into one loop to run in parallel.

    In the padded layout of dynamic dims, a dynamic axis fused below another one makes the
    fused loop run its upper bound with a guard per row (``(b*C + c)*H_ub + h`` skips
    ``H_ub - h_rt`` rows of every channel): the axes are fused only up to the first such
    axis, the rest stay loops of their own, which stop at their runtime extents. A dynamic
    first axis is fine (the fused loop then runs ``n_rt * rest`` times).
    """
    dyn = explicit_dyn(st.op)
    cut = len(axes)
    if dyn is not None:
        cut = next((i for i in range(1, cut) if dyn[i] is not None), cut)
        # ... unless that leaves too few parallel iterations (a blocked layout's two channel
        # blocks at batch 1): then the guarded rows are the price of using the threads
        if prod(axes[i].dom_extent for i in range(1 if dyn[0] is not None else 0, cut)) < _MIN_PARALLEL_ROWS:
            cut = len(axes)
    return st.fuse(*axes[:cut]) if cut > 1 else axes[0]


#: Static iterations :func:`fuse_outer` keeps in a parallel loop before it stops at a dynamic axis.
_MIN_PARALLEL_ROWS = 64


def _inlined_loads(s: te.Schedule, st: te.Stage) -> list[ProducerLoad]:
    """Reads of materialised tensors in ``st``'s body once inlined stages are substituted."""
    inline = {id(x.op): x.op for x in s.stages if x.attach_type == "inline"}
    found: list[ProducerLoad] = []

    def walk(e: PrimExpr) -> None:
        def f(n: Any) -> None:
            if not isinstance(n, ProducerLoad):
                return
            op = n.producer.op
            if id(op) in inline:
                body = op.body[n.producer.value_index]
                walk(substitute(body, {iv.var: i for iv, i in zip(op.axis, n.indices)}))
            else:
                found.append(n)
        post_order_visit(e, f)

    if isinstance(st.op, te.ComputeOp):
        for b in st.op.body:
            walk(b)
    return found


def _reads_linear(loads: Sequence[ProducerLoad], axes: Sequence[te.IterVar], k: int) -> bool:
    """Every read's flat offset moves by a constant step along the last ``k`` axes fused."""
    g = Var("g", "int32")
    shape = [iv.dom_extent for iv in axes]
    sub: dict[Var, PrimExpr] = {}
    step = 1
    for d in range(len(axes) - 1, len(axes) - 1 - k, -1):
        q = g // step if step > 1 else g
        sub[axes[d].var] = q % shape[d] if d > len(axes) - k else q
        step *= shape[d]
    ranges = {iv.var: (0, iv.dom_extent - 1) for iv in axes[:len(axes) - k]}
    ranges[g] = (0, step - 1)
    for ld in loads:
        pshape = ld.producer.shape
        if any(not isinstance(n, int) for n in pshape):
            return False
        flat: PrimExpr = IntImm(0)
        stride = 1
        for idx, n in zip(reversed(ld.indices), reversed(pshape)):
            flat = flat + idx * stride
            stride *= n
        if stride_in(substitute(flat, sub), g, ranges) is None:
            return False
    return True


def _vector_block(s: te.Schedule, st: te.Stage, vec: int) -> int:
    """How many trailing axes of an injective stage its vector loop runs over.

    * The last axis alone when it is a multiple of ``vec``: cheap index math, no tails.
    * Every axis (one flat loop, no row tails) when the flat loop's reads stay contiguous or
      broadcast — elementwise ops, slices and concatenations, whose flattened indices the
      simplifier folds back to the loop variable.
    * Otherwise (a transpose, a broadcast from a smaller tensor) the last axis when it holds at
      least ``vec`` elements, else the fewest trailing axes, at least ``vec`` elements, whose
      reads stay contiguous (a channel shuffle's H*W rows) — flattening those would turn every
      read into a gather.
    * With dynamic dims, never across one: the static axes after the last dynamic one when
      their reads are contiguous, else the last axis alone.
    """
    axes = list(st.op.axis)
    n = len(axes)
    last = axes[-1].dom_extent
    dyn = explicit_dyn(st.op)
    if dyn is not None:
        # a dynamic dim's rows are padded to its upper bound: a flat loop across it would
        # test every element against the runtime extents, so the vector loop stays inside the
        # trailing static axes, or is the last axis itself (its runtime tail in vector chunks)
        inner = n - 1 - max(i for i, d in enumerate(dyn) if d is not None)
        if inner <= 1 or (last >= vec and last % vec == 0):
            return 1
        return inner if _reads_linear(_inlined_loads(s, st), axes, inner) else 1
    if last >= vec and (last % vec == 0 or n == 1):
        return 1
    if n == 1:
        return n
    loads = _inlined_loads(s, st)
    if _reads_linear(loads, axes, n):
        return n
    if last >= vec:
        return 1
    block = last
    for k in range(2, n):
        block *= axes[-k].dom_extent
        if block >= vec and _reads_linear(loads, axes, k):
            return k
    return n


#: Extents of a reduction's last (kept) axis that :func:`_lane_axis_reduce` vectorises: a
#: channel block of a blocked layout (4 to 64 lanes).
_LANE_AXIS = (4, 64)


def _lane_axis_reduce(s: te.Schedule, st: te.Stage) -> bool:
    """The reduction keeps its last axis and reads it contiguously: ``sum over (h, w) of
    x[n, c, h, w, k]`` (a global pool over a blocked layout). Such a reduction runs with the
    reduce loops outside the last axis, which becomes a vector of ``k`` accumulators.
    """
    axes = list(st.op.axis)
    if not isinstance(st.op, te.ComputeOp) or len(axes) < 2 or len(st.op.body) != 1 \
            or any(getattr(t, "dyn", None) for t in st.op.outputs):
        return False
    last = axes[-1]
    if not _LANE_AXIS[0] <= last.dom_extent <= _LANE_AXIS[1]:
        return False
    loads = _inlined_loads(s, st)
    return bool(loads) and all(ld.indices and ld.indices[-1] is last.var for ld in loads)


def _vectorize_lane_reduce(red: te.Stage, outer: Sequence[te.IterVar]) -> None:
    """Reduce loops between ``outer`` and the kept last axis, which is vectorised (see
    _lane_axis_reduce)."""
    last = red.op.axis[-1]
    red.reorder(*outer, *red.op.reduce_axis, last)
    red.vectorize(last)


def schedule_reduce_stage(s: te.Schedule, st: te.Stage) -> te.IterVar | None:
    """Root reduction: fuse the spatial axes (parallel when there is enough work)."""
    axes = list(st.op.axis)
    if not axes:
        return None
    if _lane_axis_reduce(s, st):
        outer = st.fuse(*axes[:-1])
        _vectorize_lane_reduce(st, [outer])
        work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in st.op.reduce_axis))
        if outer.dom_extent > 1 and _parallel_ok(work):
            st.parallel(outer)
        return outer
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
    lanes = _lane_axis_reduce(s, red)
    fused = out.fuse(*(axes[:-1] if lanes else axes))
    work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in red.op.reduce_axis))
    if prod(iv.dom_extent for iv in axes) > 1 and _parallel_ok(work):
        out.parallel(fused)
    red.compute_at(out, fused)
    if lanes:
        out.vectorize(axes[-1])
        _vectorize_lane_reduce(red, red.op.axis[:-1])
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
