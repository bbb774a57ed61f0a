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
    "tile_transpose", "dynamic_transpose", "DYN_W_TILE", "DYN_SUB_BLOCK", "DYN_TRANSPOSE_GROUP",
    "DYN_TRANSPOSE_MIN_WIDTH",
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


def fuse_outer(st: te.Stage, axes: Sequence[te.IterVar], dyn: Sequence[Any] | None = None) -> te.IterVar:
    """Fuse ``axes`` (leading axes of ``st``, in order) into one loop to run in parallel.

    In the padded layout of dynamic dims, a dynamic axis fused below another one makes the
    fused loop run its upper bound with a guard per row (``(b*C + c)*H_ub + h`` skips
    ``H_ub - h_rt`` rows of every channel): the axes are fused only up to the first such
    axis, the rest stay loops of their own, which stop at their runtime extents. A dynamic
    first axis is fine (the fused loop then runs ``n_rt * rest`` times).

    ``dyn``: the ``explicit_dyn`` entries of ``axes`` (None: the stage's own, ``axes`` being
    its leading axes), for axes of ``st`` in another order.
    """
    if dyn is None:
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


# ----------------------------------------------------------------------------- transposes over a runtime width
#: Pixels per tile of a transpose over a runtime width (:func:`tile_transpose`): one 64-byte
#: line of float32 per channel plane.
DYN_W_TILE = 16
#: Channels per unrolled tile body of a ``layout_transform`` over a runtime width (a loop runs
#: over a block's sub-blocks). Never :data:`DYN_W_TILE`: an unrolled loop as long as the tile
#: reads as a second tile loop to the tail partition and keeps it off. Whole 32-channel blocks
#: back to NCHW measured 1.4x faster at 28 x 28 (13-14 vs 18-20 us, the tile loop then outside
#: the channel loop) but take 4x the code: ShuffleNetV2's dynamic build (one such kernel)
#: 26-29 s instead of 20-21 s, 15-17 s without this schedule (``KILN_CACHE_DIR=$(mktemp -d)``,
#: ``kiln.build`` of the ``bench_dynamic_broad.py`` model).
DYN_SUB_BLOCK = 8
#: Channels per tile of a ``transpose`` over a runtime width (:func:`dynamic_transpose`) when
#: it divides the channels: 4 took 0.80-0.85x the time of 8 on ConvNeXt-T's fused ``transpose
#: -> multiply -> add -> transpose`` (96-384 channels, 56 x 56 to 14 x 14), 0.87-1.09x on its
#: plain transposes (Zen 5, AVX-512, 1 thread, kernels under ``GraphModuleDebug.profile``).
DYN_TRANSPOSE_GROUP = 4
#: Fewest pixels (the upper bound) of the runtime width :func:`dynamic_transpose` tiles: at 7 x 7
#: under a bound of 8 the tiles (all tail tiles) still took 0.6-0.7x the time of the
#: pixel-by-pixel kernels.
DYN_TRANSPOSE_MIN_WIDTH = 8


def tile_transpose(s: te.Schedule, st: te.Stage, srcs: Sequence[te.Tensor], outer: Sequence[te.IterVar],
                   pixel: te.IterVar, chan: te.IterVar, group: int, planar: bool, stage_axes: Sequence[int],
                   outer_dyn: Sequence[Any] | None = None) -> te.IterVar:
    """Schedule a copy between a layout whose contiguous axis is the pixels of a runtime width
    and one whose contiguous axis is the channels (NCHW <-> NHWC, NCHW <-> NCHW[x]c) as tiles
    of :data:`DYN_W_TILE` pixels x ``group`` channels whose source is staged through a ``local``
    copy; returns the fused outer loop (parallel when the copy is large).

    Loops ``outer, channel group, pixel tile, channel, pixel``: a group of ``group`` channel
    planes walks the row in runs of :data:`DYN_W_TILE` pixels (a 64-byte line per plane), so
    at most ``group`` planes are in flight whatever their spacing, and a line's full tile and
    its tail tiles (which share the row's last line) follow each other. The padded layout
    often makes the spacing a power of two (a 28 x 28 stage of an ``h, w <= 256`` model is
    stored 32 x 32, 4 KiB per plane): a pixel-by-pixel copy touches one float of every plane
    per pixel, every plane maps to the same L1 set, and each line is fetched again for every
    pixel it holds. (With the pixel tiles outside the channel groups, the tails wrote the last
    line of every plane twice, the second time after the other planes evicted it: NCHW32c ->
    NCHW at 28 x 28, ``[1,6,28,28,32]``, 73 us against 36 us this way and 35 us static.)

    Each source in ``srcs`` (read by ``st``, possibly through inlined stages) is a ``local``
    copy (:meth:`te.Schedule.cache_read`): a planar source (``planar``: its contiguous axis is
    the pixels) one channel's run of the tile at a time, attached at the channel loop (the
    copy's region is one point of the channel axis even when a padded block clamps the channel
    index); a channel-contiguous one the whole ``pixels x group`` tile, attached at the tile
    loop. That makes the tile the register-tile form
    :func:`kiln.tir.unswitch.partition_tail_tiles` cuts into ``W // 16`` unguarded full tiles
    plus static-width tails (a tile of 8, then one of exactly the 1-7 pixels left), so every
    inner loop has a static extent and no per-pixel guard; the copy is unrolled and lives in
    registers. Pixels past the runtime width are never read once the tiles are partitioned;
    were they not, the copy would read them, and the guarded stores drop them.

    Parameters
    ----------
    s : te.Schedule
        The schedule.
    st : te.Stage
        The copy's stage.
    srcs : sequence of te.Tensor
        The tensors to stage.
    outer : sequence of te.IterVar
        The axes of ``st`` outside the tiles, in order (fused up to a dynamic one,
        :func:`fuse_outer`).
    pixel, chan : te.IterVar
        The axes of ``st`` tiled by :data:`DYN_W_TILE` and by ``group`` (never
        :data:`DYN_W_TILE`).
    group : int
        Channels per tile.
    planar : bool
        Whether the sources are contiguous along the pixels.
    stage_axes : sequence of int
        The axes of each staged copy the tile spans (unrolled).
    outer_dyn : sequence, optional
        The ``explicit_dyn`` entries of ``outer`` when they are not ``st``'s leading axes.
    """
    total = prod(iv.dom_extent for iv in st.op.axis)
    co, ci = st.split(chan, factor=group)
    wo, wi = st.split(pixel, factor=DYN_W_TILE)
    st.reorder(*outer, co, wo, ci, wi)
    fused = fuse_outer(st, outer, outer_dyn)
    st.unroll(ci)
    st.unroll(wi)
    for src in srcs:
        stage = s[s.cache_read(src, "local", st)]
        stage.compute_at(st, ci if planar else wo)
        for i in stage_axes:
            stage.unroll(stage.op.axis[i])
    if total >= PARALLEL_MIN:
        st.parallel(fused)
    return fused


def _transpose_group(channels: int) -> int:
    """Channels per tile of :func:`dynamic_transpose`: :data:`DYN_TRANSPOSE_GROUP` when it
    divides ``channels``, else the largest divisor up to 8."""
    if channels % DYN_TRANSPOSE_GROUP == 0:
        return DYN_TRANSPOSE_GROUP
    return next(f for f in range(min(channels, 8), 0, -1) if channels % f == 0)


def dynamic_transpose(s: te.Schedule, st: te.Stage) -> bool:
    """An injective stage that moves a static channel axis across a runtime width (NCHW ->
    NHWC, NHWC -> NCHW, with elementwise ops fused) gets :func:`tile_transpose`; False (nothing
    scheduled) for anything else.

    The stage qualifies when some of its reads (through inlined stages) are transposed: their
    contiguous (last) index is a bare axis ``a`` of the output other than its last, and the
    output's last axis is a bare index before it. ``a`` and the output's last axis are the
    pixels and the channels: one dynamic (the pixels, an upper bound of at least
    :data:`DYN_TRANSPOSE_MIN_WIDTH`), the other static. Those reads (one index tuple per tensor)
    are staged; the others (contiguous along the output, broadcast) stay as they are. A stage
    without a dynamic dim never qualifies: static kernels do not change.

    ConvNeXt-T with ``batch, h, w`` in ``1..8 x 64..256`` at 1 x 224 x 224, where the feature
    maps are stored 64 x 64 down to 8 x 8: NCHW -> NHWC at 56 x 56 x 96 555 -> 71 us per call
    (static build 92), 28 x 28 x 192 263 -> 35 (44), 14 x 14 x 384 45 -> 16 (21); the fused
    ``transpose -> multiply -> add -> transpose`` 557 -> 91 (86); NHWC -> NCHW at 56 x 56 x 96
    135 -> 64 (97); its transposes and layout transforms together 5967 -> 2246 us (static 2793),
    the whole model's kernels 1.14x -> 1.03x the static build's (Zen 5, AVX-512,
    ``KILN_NUM_THREADS=1 python bench/profile_dynamic.py --model convnext_t --shape 1x224x224``).
    """
    op = st.op
    dyn = explicit_dyn(op)
    if (dyn is None or not isinstance(op, te.ComputeOp) or op.reduce_axis or len(op.body) != 1
            or st.attach_type != "root"):
        return False
    axes = list(op.axis)
    last = len(axes) - 1
    if last < 2:
        return False
    pos = {iv.var: i for i, iv in enumerate(axes)}
    plan: tuple[int, int] | None = None  # (pixel axis, channel axis)
    srcs: dict[te.Tensor, ProducerLoad] = {}
    for ld in _inlined_loads(s, st):
        idx = list(ld.indices)
        a = pos.get(idx[-1]) if idx and isinstance(idx[-1], Var) else None
        if a is None or a == last:
            continue  # contiguous along the output, or along none of its axes
        if not any(i is axes[last].var for i in idx[:-1]):
            return False  # a broadcast across the output's last axis
        if dyn[last] is None and dyn[a] is not None:
            this = (a, last)
        elif dyn[last] is not None and dyn[a] is None:
            this = (last, a)
        else:
            return False
        prev = srcs.get(ld.producer)
        if (plan is not None and this != plan) or (prev is not None and any(
                not (x is y or str(x) == str(y)) for x, y in zip(prev.indices, ld.indices))):
            return False
        plan = this
        srcs[ld.producer] = ld
    if plan is None:
        return False
    pixel, chan = plan
    channels = axes[chan].dom_extent
    if axes[pixel].dom_extent < DYN_TRANSPOSE_MIN_WIDTH or not isinstance(channels, int):
        return False
    planar = pixel != last
    stage_axes: set[int] = set()
    for ld in srcs.values():
        stage_axes.add(len(ld.indices) - 1)
        if not planar:
            stage_axes.add(next(k for k, i in enumerate(ld.indices) if i is axes[pixel].var))
    outer = [i for i in range(len(axes)) if i not in plan]
    tile_transpose(s, st, list(srcs), [axes[i] for i in outer], axes[pixel], axes[chan], _transpose_group(channels),
                   planar, sorted(stage_axes), [dyn[i] for i in outer])
    return True


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
    """Elementwise / broadcast / injective groups (and the fallback for everything else).

    Outputs that transpose a channel axis across a runtime width get :func:`dynamic_transpose`.
    """
    s = prepare(outs)
    handled: set[int] = set()
    for st in list(s.stages):  # (a staging copy adds a stage)
        if isinstance(st.op, te.ComputeOp) and st.is_output and dynamic_transpose(s, st):
            handled.add(id(st.op))
    return finalize(s, handled, vector_elements(target))


def schedule_reduce(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """Reduction groups: injective producers inlined, reductions parallel over spatial axes."""
    s = prepare(outs)
    return finalize(s, set(), vector_elements(target))


for _p in (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE, OpPattern.TUPLE, OpPattern.OPAQUE,
           OpPattern.OUT_ELEMWISE_FUSABLE):
    register_schedule(_p, "generic", schedule_injective)
register_schedule(OpPattern.COMM_REDUCE, "generic", schedule_reduce)
