"""GPU schedules (OpenCL, CUDA): outputs spread over work-items with ``Stage.bind``.

Every fused group gets the same treatment, which is correct for any compute:

* non-output injective stages are inlined into their readers (as on the CPU); padding and
  weight-packing stages stay materialized, i.e. kernels of their own (inlining the padding
  into the convolution measured 2.2x slower on PoCL: 505 vs 232 ms for ResNet-18);
* an injective root stage: all axes fused, split by the work-group size, outer loop bound to
  ``blockIdx.x``, inner to ``threadIdx.x`` (contiguous threads touch contiguous elements,
  so global memory accesses coalesce);
* a reduction (conv2d, dense, matmul, pooling, mean, softmax's max / sum ...): the spatial
  axes are bound the same way and each work-item runs the reduction loops serially into a
  private accumulator. When the group's output is a same-shape elementwise epilogue that
  is the reduction's only reader (bias + relu after a conv), the reduction is computed at
  the epilogue's thread loop — one kernel, accumulators never leave registers — and each
  work-item computes a register tile of outputs (up to 8 channels of NCHW results, 8
  columns of 2-D ones and of dense / matmul results of any rank) so each loaded input is reused from registers;
* GEMM-like reductions (dense, matmul, conv2d) can instead use local-memory tiles
  (:func:`_attach_shared`, :func:`_attach_shared_conv`, built on ``Schedule.cache_read``)
  where the target's ``shared_tiles`` option lists their tag (only where they measured
  faster; on PoCL they never did);
* reductions with few outputs (at most the target's ``tree_max_outputs``) are work-group
  tree reductions (:func:`schedule_tree_reduce`);
* other reductions stay root stages, i.e. separate kernels launched in order (the GPU
  code generator turns their intermediate tensors into temporaries) -- softmax is three.

Work-group sizes: ``max_num_threads`` of the target (default 256) for injective stages,
:data:`REDUCE_THREADS` for reductions (fewer, heavier work-items).

Per-kind choices are target options, not tables here: each GPU kind declares
``tree_max_outputs`` and ``shared_tiles`` with its defaults (``kiln.target``), so a new GPU
kind brings its own values, ``Target("opencl -shared_tiles=dense")`` changes them for one
build, and the compile cache sees them in the target string. The schedules are registered
for the dispatch key ``gpu``, which every GPU kind's default keys include; this module
names no kind.

Measurements behind every choice are in ``docs/devices.md``. Not done: a reduction to a
scalar is one work-group (a second, cross-group stage would spread it over the device).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Sequence

from ... import te
from ...ir.op import OpPattern
from ...runtime.errors import TargetError
from ...target import TargetKind, get_target_kind, list_target_kinds
from ...te.schedule import thread_axis
from ..registry import register_schedule
from ..util import prod
from .generic import prepare, readers_after_inline

__all__ = ["schedule_gpu", "bind_flat", "schedule_tree_reduce", "GPU_KINDS", "REDUCE_THREADS", "DEFAULT_THREADS",
           "SHARED_TAGS", "TREE_MAX_OUTPUTS", "SHARED_TILE_TAGS", "FALLBACK_TREE_MAX_OUTPUTS", "tree_max_outputs",
           "shared_tiles"]

#: Schedule dispatch keys the schedules here are registered for: ``gpu``, in the default keys
#: of every GPU target kind (kiln.topi.registry prefers it over generic CPU schedules).
GPU_KINDS = ["gpu"]
#: Work-items per work-group of reduction stages.
REDUCE_THREADS = 64
#: Work-items per work-group of injective stages when the target does not say.
DEFAULT_THREADS = 256
#: Register tile of 2-D reductions with an epilogue: columns per work-item.
TILE = 8
#: Register tile of 4-D (NCHW) reductions: channels x columns per work-item. Columns stay
#: one per work-item so that neighbouring work-items read neighbouring input pixels
#: (coalesced on GPUs; unit-stride vectors for PoCL, which vectorizes across work-items).
#: Measured on PoCL, ResNet-18 224x224, same process: 8x1 230 ms, 4x4 292 ms, 8x8 349 ms,
#: 16x1 391 ms per inference.
TILE_C, TILE_W = 8, 1
#: Reductions tiled along their last axis whatever their rank (matrix products): with
#: (batch, heads, rows, cols) outputs, 4-D NCHW channel tiles would split the heads axis.
#: Measured on PoCL, MiniLM (attention matmuls 1x12x128x{64,128}) -- see docs/devices.md.
GEMM_TAGS = ("dense", "matmul")
#: Work-items per work-group of register-tiled reductions.
TILED_THREADS = 32
#: Register tiles shrink until a reduction has at least this many work-items.
MIN_WORK_ITEMS = 256
#: Work-group tree reductions (see :func:`schedule_tree_reduce`): work-items per group (a
#: power of two); used for reductions with at most :func:`tree_max_outputs` outputs and at
#: least :data:`TREE_MIN_REDUCE` terms each.
TREE_THREADS = 64
TREE_MIN_REDUCE = 32
#: ``tree_max_outputs`` of a target whose kind does not declare it (and of no target): trees
#: for single outputs only, the choice measured on PoCL (the kinds' reasons are in kiln.target).
FALLBACK_TREE_MAX_OUTPUTS = 1
#: Local-memory tiled GEMM (see :func:`_attach_shared`): a work-group of SHARED_TY x SHARED_TX
#: work-items, each a SHARED_R x SHARED_R register tile, stages SHARED_BM x SHARED_KS tiles
#: of A and SHARED_KS x SHARED_BN tiles of B in local memory per K-step.
SHARED_R = 4
SHARED_TY = SHARED_TX = 16
SHARED_BM = SHARED_BN = SHARED_R * SHARED_TY
SHARED_KS = 8
#: Op tags that have a local-memory tile schedule; a target's ``shared_tiles`` option picks
#: among them (none when its kind does not declare the option).
SHARED_TILE_TAGS = ("dense", "matmul", "conv2d_nchw")
#: Local-memory tiled conv2d (NCHW, groups=1, see :func:`_attach_shared_conv`): a group of
#: CONV_TC channel-threads x 16 pixel-threads, each CONV_R channels x 1 pixel; input
#: channels staged CONV_KS at a time.
CONV_TC, CONV_R, CONV_KS = 16, 4, 8
CONV_PIX = 16


def _threads(target: Any) -> int:
    attrs = getattr(target, "attrs", None) or {}
    n = attrs.get("max_num_threads") or DEFAULT_THREADS
    return max(1, int(n))


def bind_flat(st: te.Stage, axes: Sequence[te.IterVar], threads: int, total: int | None = None
              ) -> te.IterVar | None:
    """Fuse ``axes``, split by ``threads`` and bind to ``blockIdx.x`` / ``threadIdx.x``.

    ``total`` is the number of iterations of the fused loop; it defaults to the product of
    the axes' domains, which only root axes know (pass it for split / fused axes).
    Returns the ``threadIdx.x`` loop (where per-element work can be attached), or None
    when there are no axes (a scalar output runs on one work-item).
    """
    axes = list(axes)
    if not axes:
        return None
    if total is None:
        total = prod(iv.dom_extent for iv in axes)
    fused = st.fuse(*axes) if len(axes) > 1 else axes[0]
    nt = max(1, min(threads, total))
    bx, tx = st.split(fused, factor=nt)
    st.bind(bx, thread_axis("blockIdx.x"))
    st.bind(tx, thread_axis("threadIdx.x"))
    return tx


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _attach_tiled(red: te.Stage, out: te.Stage) -> None:
    """Compute ``red`` inside ``out``'s work-items, each producing a register tile.

    A work-item computes up to :data:`TILE_C` x :data:`TILE_W` outputs (channel axis x last
    axis) of 4-D NCHW results, :data:`TILE` of the last axis of 2-D ones: the reduction loops
    run outside the tile, so every loaded input is reused from registers (the tile is a
    private array with unrolled loops). Measured on PoCL (2 shared cores, ResNet-18
    224x224, same process): 423 ms per inference against 1627 ms with one output per
    work-item.
    """
    axes = list(out.op.axis)
    ext = [iv.dom_extent for iv in axes]
    tiles: dict[int, int] = {}
    if len(axes) == 4 and red.op.tag not in GEMM_TAGS:
        tiles = {1: _largest_divisor(ext[1], TILE_C), 3: _largest_divisor(ext[3], TILE_W)}
    elif len(axes) >= 2:  # 2-D, and batched dense / matmul (e.g. attention's 4-D matmuls)
        tiles = {len(axes) - 1: _largest_divisor(ext[-1], TILE)}
    # small outputs: shrink the tiles until there are enough work-items to fill a device
    while tiles and prod(e // tiles.get(k, 1) for k, e in enumerate(ext)) < MIN_WORK_ITEMS \
            and max(tiles.values()) > 1:
        k = max(tiles, key=lambda j: tiles[j])
        tiles[k] = _largest_divisor(ext[k], tiles[k] // 2)
    tiles = {k: v for k, v in tiles.items() if v > 1}
    if not tiles:
        red.compute_at(out, bind_flat(out, axes, REDUCE_THREADS))
        return
    outer, inner = [], []
    for k, iv in enumerate(axes):
        if k in tiles:
            o, i = out.split(iv, factor=tiles[k])
            outer.append(o)
            inner.append(i)
        else:
            outer.append(iv)
    out.reorder(*outer, *inner)
    # One flat index: binding (batch, channel block) to blockIdx.y instead measured 1.5x
    # slower on PoCL (667 vs 437 ms, ResNet-18).
    n_outer = prod(e // tiles.get(k, 1) for k, e in enumerate(ext))
    tx = bind_flat(out, outer, TILED_THREADS, total=n_outer)
    for i in inner:
        out.unroll(i)
    red.compute_at(out, tx)
    raxes = list(red.op.axis)
    untiled = [iv for k, iv in enumerate(raxes) if k not in tiles]
    tiled = [iv for k, iv in enumerate(raxes) if k in tiles]
    red.reorder(*untiled, *red.op.reduce_axis, *tiled)
    for iv in tiled:
        red.unroll(iv)


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def schedule_tree_reduce(st: te.Stage, threads: int = TREE_THREADS) -> None:
    """One work-group per output element; its work-items reduce strided slices of the
    reduction and combine them in local memory (a tree of barrier-separated halvings).

    All reduction axes are fused into one loop ``r``; work-item ``t`` of the group folds
    ``r = t, t + threads, t + 2 * threads, ...`` (neighbouring work-items read neighbouring
    elements) into a private accumulator before the tree.
    """
    red_axes = list(st.op.reduce_axis)
    total = prod(iv.dom_extent for iv in red_axes)
    nt = max(1, min(_next_pow2(threads), _next_pow2(total)))
    r = st.fuse(*red_axes) if len(red_axes) > 1 else red_axes[0]
    ro, ri = st.split(r, factor=nt)
    st.reorder(ri, ro)
    data = list(st.op.axis)
    if data:
        fused = st.fuse(*data) if len(data) > 1 else data[0]
        st.bind(fused, thread_axis("blockIdx.x"))
    st.bind(ri, thread_axis("threadIdx.x"))


def tree_max_outputs(target: Any) -> int:
    """The most outputs a reduction may have to be a work-group tree reduction on ``target``.

    Parameters
    ----------
    target : kiln.target.Target or None
        Its ``tree_max_outputs`` option; :data:`FALLBACK_TREE_MAX_OUTPUTS` when its kind
        declares none (or for no target).

    Returns
    -------
    int
    """
    v = (getattr(target, "attrs", None) or {}).get("tree_max_outputs")
    return FALLBACK_TREE_MAX_OUTPUTS if v is None else int(v)


def shared_tiles(target: Any) -> frozenset[str]:
    """Op tags scheduled with local-memory tiles on ``target`` (its ``shared_tiles`` option).

    Parameters
    ----------
    target : kiln.target.Target or None

    Returns
    -------
    frozenset of str
        Empty when the target's kind declares no ``shared_tiles`` option.
    """
    return frozenset((getattr(target, "attrs", None) or {}).get("shared_tiles") or ())


def _wants_tree(st: te.Stage, target: Any) -> bool:
    n_out = prod(iv.dom_extent for iv in st.op.axis)
    n_red = prod(iv.dom_extent for iv in st.op.reduce_axis)
    return n_out <= tree_max_outputs(target) and n_red >= TREE_MIN_REDUCE


def _simple_index(e: Any, ok_vars: set[Any], tile: int) -> bool:
    from ...tir.expr import BinaryOp, IntImm, Var

    if isinstance(e, (Var, IntImm)):
        return not isinstance(e, Var) or e in ok_vars
    # packed layouts index panels with j // bn, j % bn: a block tile covers whole panels
    # when bn divides it, so the inferred region stays one tile
    return (isinstance(e, BinaryOp) and e.op in ("floordiv", "floormod") and isinstance(e.a, Var)
            and e.a in ok_vars and isinstance(e.b, IntImm) and e.b.value > 0 and tile % e.b.value == 0)


def _shared_candidates(red: te.Stage, out: te.Stage, target: Any) -> list[te.Tensor] | None:
    """Inputs of a GEMM-like reduction to stage in local memory, or None when the
    local-memory tiles do not apply (shape, access pattern, or op kind not selected)."""
    from ...tir.expr import ProducerLoad
    from ...tir.functor import post_order_visit

    op = red.op
    if not _shared_on(target, op.tag) or len(op.reduce_axis) != 1 or len(op.axis) < 2:
        return None
    ext = [iv.dom_extent for iv in op.axis]
    if ext[-2] < SHARED_BM or ext[-1] < SHARED_BN or op.reduce_axis[0].dom_extent < SHARED_KS:
        return None
    ok = {iv.var for iv in op.axis} | {op.reduce_axis[0].var}
    loads: list[Any] = []
    post_order_visit(op.body[0], lambda n: loads.append(n) if isinstance(n, ProducerLoad) else None)
    tensors: list[te.Tensor] = []
    for pl in loads:
        if not all(_simple_index(i, ok, SHARED_BM) for i in pl.indices):
            return None
        stg = red.schedule[pl.producer]
        if stg.attach_type == "inline":
            continue  # its reads were substituted into the reduction: stays a global read
        if pl.producer not in tensors:
            tensors.append(pl.producer)
    return tensors or None


def _shared_on(target: Any, tag: str) -> bool:
    return tag in shared_tiles(target)


def _conv_tile(red: te.Stage, target: Any) -> tuple[int, int] | None:
    """Pixel tile (rows, cols) of CONV_PIX work-items dividing the output exactly, or None.

    Exact tiles keep tail guards off the work-item loops (a guard there would put the
    barriers of the cooperative loads under a divergent condition)."""
    op = red.op
    if not _shared_on(target, op.tag) or int(op.attrs.get("groups", 1)) != 1 or len(op.axis) != 4:
        return None
    _, co, oh, ow = (iv.dom_extent for iv in op.axis)
    if co % (CONV_TC * CONV_R):
        return None
    for th in (4, 2, 8, 1, 16):
        tw = CONV_PIX // th
        if oh % th == 0 and ow % tw == 0:
            return th, tw
    return None


def _attach_shared_conv(s: te.Schedule, red: te.Stage, out: te.Stage, tile: tuple[int, int]) -> None:
    """conv2d with the weights and input tiles of each input-channel step in local memory.

    A work-group owns CONV_TC * CONV_R output channels x a ``tile`` of output pixels; its
    work-items (one flat ``threadIdx.x``) own CONV_R channels of one pixel. Per step of
    CONV_KS input channels the group copies the weights (channels x step x KH x KW) and
    the input patch the tile reads into local memory.
    """
    th, tw = tile
    n, k, y, x = out.op.axis
    ko, kk = out.split(k, factor=CONV_TC * CONV_R)
    kt, ki = out.split(kk, factor=CONV_R)
    yo, yt = out.split(y, factor=th)
    xo, xt = out.split(x, factor=tw)
    out.reorder(n, ko, yo, xo, kt, yt, xt, ki)
    bz = out.fuse(n, ko)
    out.bind(bz, thread_axis("blockIdx.z"))
    out.bind(yo, thread_axis("blockIdx.y"))
    out.bind(xo, thread_axis("blockIdx.x"))
    t = out.fuse(kt, yt, xt)
    out.bind(t, thread_axis("threadIdx.x"))
    out.unroll(ki)
    red.compute_at(out, t)
    rn, rk, ry_, rx_ = red.op.axis
    rc, ry, rx = red.op.reduce_axis
    rco, rci = red.split(rc, factor=CONV_KS)
    red.reorder(rn, ry_, rx_, rco, rci, ry, rx, rk)
    red.unroll(rk)
    nthreads = CONV_TC * CONV_PIX
    for tns in dict.fromkeys(t_.producer for t_ in _loads_of(red.op)):
        if red.schedule[tns].attach_type == "inline":
            continue
        c = s.cache_read(tns, "shared", [red])
        cs = s[c]
        cs.compute_at(red, rco)
        f = cs.fuse(*c.op.axis)
        _, tt = cs.split(f, factor=nthreads)
        cs.bind(tt, thread_axis("threadIdx.x"))


def _loads_of(op: Any) -> list[Any]:
    from ...tir.expr import ProducerLoad
    from ...tir.functor import post_order_visit

    loads: list[Any] = []
    post_order_visit(op.body[0], lambda n: loads.append(n) if isinstance(n, ProducerLoad) else None)
    return loads


def _attach_shared(s: te.Schedule, red: te.Stage, out: te.Stage, tensors: list[te.Tensor]) -> None:
    """GEMM with local-memory tiles: ``red`` computed inside ``out``'s work-items.

    A work-group owns a SHARED_BM x SHARED_BN block of the last two axes (leading axes:
    ``blockIdx.z``); its SHARED_TY x SHARED_TX work-items (one flat ``threadIdx.x``) own
    SHARED_R x SHARED_R register tiles. Per K-step of SHARED_KS, the group copies the
    block's slices of every input in ``tensors`` into local memory (each work-item copies a
    strided share), synchronizes, and accumulates from local memory.
    """
    axes = list(out.op.axis)
    lead, i, j = axes[:-2], axes[-2], axes[-1]
    by, ii = out.split(i, factor=SHARED_BM)
    bx, jj = out.split(j, factor=SHARED_BN)
    ty, yi = out.split(ii, factor=SHARED_R)
    tx, xi = out.split(jj, factor=SHARED_R)
    out.reorder(*lead, by, bx, ty, tx, yi, xi)
    if lead:
        bz = out.fuse(*lead) if len(lead) > 1 else lead[0]
        out.bind(bz, thread_axis("blockIdx.z"))
    out.bind(by, thread_axis("blockIdx.y"))
    out.bind(bx, thread_axis("blockIdx.x"))
    t = out.fuse(ty, tx)
    out.bind(t, thread_axis("threadIdx.x"))
    out.unroll(yi)
    out.unroll(xi)
    red.compute_at(out, t)
    rax = list(red.op.axis)
    ko, ki = red.split(red.op.reduce_axis[0], factor=SHARED_KS)
    red.reorder(ko, ki, rax[-2], rax[-1])
    red.unroll(rax[-2])
    red.unroll(rax[-1])
    nthreads = SHARED_TY * SHARED_TX
    for tns in tensors:
        c = s.cache_read(tns, "shared", [red])
        cs = s[c]
        cs.compute_at(red, ko)
        f = cs.fuse(*c.op.axis) if len(c.op.axis) > 1 else c.op.axis[0]
        _, tt = cs.split(f, factor=nthreads)
        cs.bind(tt, thread_axis("threadIdx.x"))


def schedule_gpu(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """Schedule any fused group for a GPU target (see the module docstring)."""
    s = prepare(outs)
    threads = _threads(target)
    readers = readers_after_inline(s)
    handled: set[int] = set()
    for st in list(s.stages):
        if not isinstance(st.op, te.ComputeOp) or st.attach_type != "root" or id(st.op) in handled:
            continue
        if st.op.reduce_axis:
            rd = readers.get(id(st.op), [])
            out = rd[0] if len(rd) == 1 else None
            if _wants_tree(st, target):
                schedule_tree_reduce(st)
            elif (out is not None and out.is_output and not st.is_output and not out.op.reduce_axis
                    and id(out.op) not in handled and out.op.axis
                    and tuple(out.op.output(0).shape) == tuple(st.op.output(0).shape)):
                cached = _shared_candidates(st, out, target)
                ctile = _conv_tile(st, target) if cached is None else None
                if cached is not None:
                    _attach_shared(s, st, out, cached)
                elif ctile is not None:
                    _attach_shared_conv(s, st, out, ctile)
                else:
                    _attach_tiled(st, out)
                handled.add(id(out.op))
            else:
                bind_flat(st, st.op.axis, REDUCE_THREADS)
        else:
            bind_flat(st, st.op.axis, threads)
        handled.add(id(st.op))
    return s


for _p in (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE, OpPattern.TUPLE, OpPattern.OPAQUE,
           OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.COMM_REDUCE):
    register_schedule(_p, GPU_KINDS, schedule_gpu, override=True)


# ---------------------------------------------------------------- deprecated per-kind tables
# Benches and tests written before the knobs became target options read and patch
# SHARED_TAGS[kind][tag] and TREE_MAX_OUTPUTS[kind]. These views keep them working without a
# second copy of the values: they read and write the kind's registered option defaults, so
# a change applies to targets created afterwards. New code passes target options instead.


def _kind_with(kind: str, option: str) -> TargetKind | None:
    try:
        k = get_target_kind(kind)
    except TargetError:
        return None
    return k if option in k.options else None


def _kinds_with(option: str) -> list[str]:
    return [n for n in list_target_kinds() if _kind_with(n, option) is not None]


class _TreeMaxOutputsView(MutableMapping[str, int]):
    """``TREE_MAX_OUTPUTS[kind]``: the ``tree_max_outputs`` default of a registered kind
    (``"gpu"``: the read-only fallback). Deprecated, see above."""

    def __getitem__(self, kind: str) -> int:
        k = _kind_with(kind, "tree_max_outputs")
        if k is None:
            if kind == "gpu":
                return FALLBACK_TREE_MAX_OUTPUTS
            raise KeyError(kind)
        return int(k.default("tree_max_outputs"))

    def __setitem__(self, kind: str, value: int) -> None:
        k = _kind_with(kind, "tree_max_outputs")
        if k is None:
            raise KeyError(f"target kind {kind!r} has no tree_max_outputs option")
        k.options["tree_max_outputs"] = (int, int(value))

    def __delitem__(self, kind: str) -> None:
        raise TypeError("TREE_MAX_OUTPUTS entries are target-kind options and cannot be deleted")

    def __iter__(self) -> Iterator[str]:
        return iter([*_kinds_with("tree_max_outputs"), "gpu"])

    def __len__(self) -> int:
        return len(_kinds_with("tree_max_outputs")) + 1


class _SharedTilesView(MutableMapping[str, bool]):
    """``SHARED_TAGS[kind][tag]``: whether ``tag`` is in the kind's ``shared_tiles`` default."""

    def __init__(self, kind: str) -> None:
        self._kind = kind

    def _tags(self) -> list[str]:
        k = _kind_with(self._kind, "shared_tiles")
        return [] if k is None else list(k.default("shared_tiles"))

    def __getitem__(self, tag: str) -> bool:
        if tag not in SHARED_TILE_TAGS:
            raise KeyError(tag)
        return tag in self._tags()

    def __setitem__(self, tag: str, on: bool) -> None:
        k = _kind_with(self._kind, "shared_tiles")
        if k is None or tag not in SHARED_TILE_TAGS:
            raise KeyError(f"{self._kind!r} has no shared_tiles option or {tag!r} has no local-memory tile schedule")
        tags = [t for t in self._tags() if t != tag] + ([tag] if on else [])
        k.options["shared_tiles"] = (list, [t for t in SHARED_TILE_TAGS if t in tags])

    def __delitem__(self, tag: str) -> None:
        self[tag] = False

    def clear(self) -> None:
        for tag in SHARED_TILE_TAGS:
            self[tag] = False

    def __iter__(self) -> Iterator[str]:
        return iter(SHARED_TILE_TAGS)

    def __len__(self) -> int:
        return len(SHARED_TILE_TAGS)


class _SharedTagsView(MutableMapping[str, _SharedTilesView]):
    """``SHARED_TAGS[kind]``: a :class:`_SharedTilesView` per kind with a ``shared_tiles`` option."""

    def __getitem__(self, kind: str) -> _SharedTilesView:
        if kind != "gpu" and _kind_with(kind, "shared_tiles") is None:
            raise KeyError(kind)
        return _SharedTilesView(kind)

    def __setitem__(self, kind: str, value: Any) -> None:
        raise TypeError("set SHARED_TAGS[kind][tag] (or the target's -shared_tiles option) instead")

    def __delitem__(self, kind: str) -> None:
        raise TypeError("SHARED_TAGS entries are target-kind options and cannot be deleted")

    def __iter__(self) -> Iterator[str]:
        return iter([*_kinds_with("shared_tiles"), "gpu"])

    def __len__(self) -> int:
        return len(_kinds_with("shared_tiles")) + 1


#: Deprecated view: ``TREE_MAX_OUTPUTS[kind]`` is the kind's ``tree_max_outputs`` default.
TREE_MAX_OUTPUTS: MutableMapping[str, int] = _TreeMaxOutputsView()
#: Deprecated view: ``SHARED_TAGS[kind][tag]`` says whether the kind's ``shared_tiles``
#: default lists ``tag``.
SHARED_TAGS: MutableMapping[str, _SharedTilesView] = _SharedTagsView()
