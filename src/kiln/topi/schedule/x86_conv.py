"""CPU schedules of convolutions: the blocked ``conv2d_nchwc`` (and its depthwise form), and
the plain NCHW ``conv2d`` / ``conv2d_transpose`` kernels (moved here from ``x86.py``).

Register tile (groups = 1): ``xt`` consecutive output pixels of one row × the whole
output-channel block ``ob`` (the innermost, contiguous axis of output and weight).  Per
reduction step ``(rco, ry, rx, rci)`` the kernel broadcasts ``xt`` input values and loads
``ob / lanes`` weight vectors, and issues ``xt * ob / lanes`` FMAs into accumulators that
stay in registers: ``xt * ob / lanes + ob / lanes + 1 <= R`` (:func:`max_x_tile`; ``lanes`` and
the register count ``R`` come from the target's ISA model, :func:`kiln.target.isa_of`: 16 ``ymm``
on AVX2, 32 ``zmm`` with AVX-512, 16 ``xmm`` for the SSE2 baseline of plain ``llvm``).  The reduction
loops run outside the tile, so the whole ``C·KH·KW`` reduction of a tile happens before the
fused epilogue (bias, ReLU/clip, residual add) stores it.

When no divisor of the output width gives :data:`MIN_ACCUMULATORS`, the tile spans ``yr``
rows × ``xt`` pixels instead (:func:`row_x_tile`, e.g. 2 × 2 for 14×14 with ``ob = 16``).

``xt`` is chosen to *divide* the output width where possible, so no output row has a tail
(a guarded tail tile runs ~10x slower): on AVX2, with ``ob = 16`` (two vectors, at most 6
pixels) 56/28/112 get 4; with ``ob = 8`` (up to 14 pixels) 14 and 7 get 14 and 7 — the
layout pass picks ``ob`` from the output width for this reason.  When no divisor in range
exists the last tile of a row is guarded by the lowering.

Loop order: parallel over the fused (batch, channel block, output row) axis; when the input
does not fit in L2 but re-reading the weights is cheaper, rows go outside the channel-block
loop (:func:`row_tile`).  Zen 3, 1 thread, LLVM: 3×3 convs 80–95 GFLOP/s (64 ch 56×56,
256 ch 14×14), 512 ch 7×7 ~75; 1×1 convs 75–90; depthwise 25–35 (memory bound).  Zen 5,
AVX-512 (``ob = 32``, tiles of up to 14 pixels × 2 ``zmm``): ResNet-50's 53 conv kernels at
237–273 GFLOP/s, 97% of the measured 272 GFLOP/s GEMM peak time-weighted, the 7×7 stage
included (7 pixels × 2 vectors fit 32 registers) (``bench/conv_flops.py``).
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ...target import ISA
from ...te.dynamic import explicit_dyn
from ...tir.vectorize import chunk_lanes
from ..knobs import current_config, workload_key
from ..nn.conv2d import TAG_CONV2D, TAG_CONV2D_T, TAG_DEPTHWISE
from ..nn.conv2d_nchwc import TAG_CONV2D_NCHWC, TAG_DEPTHWISE_NCHWC, TAG_POOL_NCHWC
from ..registry import register_schedule
from ..util import prod
from .generic import (DYN_SUB_BLOCK, DYN_W_TILE, PARALLEL_MIN, finalize, fuse_outer, prepare,
                      schedule_injective_stage, tile_transpose, vector_elements)
from .x86 import _find, _keep_root_helpers, _single_output_epilogue, schedule_isa

__all__ = ["schedule_conv2d", "schedule_conv2d_nchwc", "schedule_layout_transform", "schedule_blocked_copy",
           "schedule_max_pool2d_nchwc", "pick_x_tile", "max_x_tile", "row_x_tile", "tile_vectors", "row_tile",
           "nchwc_workload", "MIN_ACCUMULATORS"]

#: Most output pixels of one register tile (the pixels are unrolled code): the AVX2 maximum of
#: the register formula, so a 32-register file gets more pixels only for wide blocks.
MAX_X_TILE = 14
#: The same for depthwise tiles.
MAX_X_TILE_DEPTHWISE = 8


def pick_x_tile(ow: int, max_tile: int, min_tile: int = 4) -> int:
    """Output-width tile: the largest divisor of ``ow`` in ``[min_tile, max_tile]``.

    Without such a divisor: ``ow`` itself when it fits, else ``max_tile`` (one guarded tail
    tile per row).
    """
    if ow <= max_tile:
        return ow
    for t in range(max_tile, min_tile - 1, -1):
        if ow % t == 0:
            return t
    return max_tile


def tile_vectors(ob: int, lanes: int) -> int:
    """Vector registers one pixel of an ``ob``-channel block takes: the pieces the codegens cut
    ``ob`` lanes into (:func:`kiln.tir.vectorize.chunk_lanes`: 7 on 8 lanes is 4 + 2 + 1)."""
    return max(1, len(chunk_lanes(ob, lanes)))


def max_x_tile(ob: int, lanes: int, depthwise: bool, registers: int = 16) -> int:
    """Most output pixels ``xt`` whose tile of ``ob`` channels fits ``registers`` vector registers.

    With ``v`` vectors per pixel (:func:`tile_vectors`): ``xt * v + v + 1 <= registers`` (``xt * v``
    accumulators, ``v`` weight vectors, one broadcast input value), at most
    :data:`MAX_X_TILE`; depthwise ``xt * v + v + 2 <= registers`` (its input is a vector load,
    not a broadcast: two registers for the operands in flight), at most
    :data:`MAX_X_TILE_DEPTHWISE`.
    """
    vecs = tile_vectors(ob, lanes)
    if depthwise:
        return max(1, min(MAX_X_TILE_DEPTHWISE, (registers - 2 - vecs) // vecs))
    return max(1, min(MAX_X_TILE, (registers - 1 - vecs) // vecs))


#: Fewest accumulators of a register tile that keeps both FMA pipes busy: FMA latency (4
#: cycles on Zen 3) x 2 pipes; 8 is also ``min_accumulators`` of Zen 3 and of the x86-64
#: levels (``bench/fma_ceiling.c``: 8 reach the FMA peak).  Fixed rather than
#: ``isa.min_accumulators`` so that Haswell (10) keeps the blocks it had: no Haswell was
#: available to measure a change.  The layout pass's block choice and ``row_x_tile`` use it.
MIN_ACCUMULATORS = 8


def row_x_tile(oh: int, ow: int, ob: int, lanes: int, registers: int = 16) -> tuple[int, int] | None:
    """A register tile of ``yr`` rows x ``xt`` pixels, both dividing the output, when one row
    cannot give :data:`MIN_ACCUMULATORS` accumulators without a tail; else None.

    The case it exists for: 14x14 outputs with 16-channel blocks. One row of 14 has no divisor
    that fits 16 ymm registers with two vectors per pixel (7 pixels need 17), so the layout used
    8-channel blocks and 14-pixel rows: one broadcast per FMA, which caps a micro-kernel at
    90-96 GFLOP/s on Zen 3 where one broadcast per two FMAs reaches the 103 GFLOP/s FMA peak
    (``bench/RESULTS.md``). A 2 x 2 tile of 16 channels is 8 accumulators, one broadcast per two
    FMAs and no tail: ResNet-50 ran in 0.964 of its previous time (``bench/bench_ab.py``, 1 thread).
    Not for depthwise tiles (no broadcast).
    """
    most = max_x_tile(ob, lanes, False, registers)
    vecs = tile_vectors(ob, lanes)
    if any(ow % t == 0 and t * vecs >= MIN_ACCUMULATORS for t in range(1, min(ow, most) + 1)):
        return None
    best: tuple[int, int] | None = None
    for yr in range(2, oh + 1):
        for xt in range(1, ow + 1):
            if oh % yr or ow % xt or yr * xt > most or yr * xt * vecs < MIN_ACCUMULATORS:
                continue
            if best is None or (yr * xt, xt) > (best[0] * best[1], best[1]):
                best = (yr, xt)
    return best


#: Bytes of one core's L2 that a kernel's re-used operand may occupy when the ISA model is not
#: consulted (half of Zen 3's 512 KiB); the schedules use half of ``ISA.l2_bytes``.
L2_BUDGET = 256 * 1024


def row_tile(anchor: te.Stage, l2_budget: int = L2_BUDGET) -> int:
    """Output rows per outer iteration when the channel-block loop should run *inside* rows.

    The default order (channel block outer, rows inner) keeps one block's weights hot and
    re-reads the whole input once per block: cheap while the input fits in L2, ruinous when
    it does not (ResNet-50's 1x1 convs at 28x28x512 re-stream 1.6 MB from L3 128 times).
    Then rows go outside: a tile of rows whose input slice fits in L2 is read once, the
    weights once per tile.  ``l2_budget``: the bytes of L2 the re-used slice may take (half
    the core's L2: the other operand streams through the rest).  Returns 0 to keep the
    default order.
    """
    data, weight = anchor.op.input_tensors[:2]
    if len(data.shape) != 5 or len(weight.shape) != 6:
        return 0
    _, cb, h, w, ib = data.shape
    obk, _, kh, kw, _, ob = weight.shape
    (sh, _), (dh, _) = anchor.op.attrs["strides"], anchor.op.attrs["dilation"]
    oh = anchor.op.axis[2].dom_extent
    in_bytes = 4 * cb * h * w * ib
    w_bytes = 4 * prod(weight.shape)
    if in_bytes <= l2_budget or obk == 1:
        return 0
    row_bytes = 4 * cb * w * ib

    def slice_rows(t: int) -> int:
        return (t - 1) * sh + (kh - 1) * dh + 1

    yt = 1
    for t in range(oh, 0, -1):
        if oh % t == 0 and slice_rows(t) * row_bytes <= l2_budget:
            yt = t
            break
    traffic_a = w_bytes + in_bytes * obk
    traffic_b = in_bytes + w_bytes * (oh // yt if w_bytes > l2_budget else 1)
    return yt if traffic_b < traffic_a else 0


def nchwc_workload(anchor: te.Stage) -> tuple:
    """Workload key of a blocked convolution (its padded input, weight and output shapes fix
    the padding; the tag tells depthwise apart)."""
    data, weight = anchor.op.input_tensors[:2]
    return workload_key("conv2d_nchwc", anchor.op.tag, data.shape, weight.shape, anchor.op.output(0).shape,
                        anchor.op.attrs.get("strides", ()), anchor.op.attrs.get("dilation", ()), data.dtype)


def _tile_nchwc(out: te.Stage, anchor: te.Stage, isa: ISA) -> None:
    lanes, registers = isa.lanes("float32"), isa.vector_registers
    depthwise = anchor.op.tag == TAG_DEPTHWISE_NCHWC
    n, k, y, x, kc = out.op.axis
    ob, ow = kc.dom_extent, x.dom_extent
    # knobs: xt 0 / order "auto" are the hand-written rules below (the defaults)
    cfg = current_config("conv2d_nchwc", nchwc_workload(anchor), {"xt": 0, "order": "auto"})
    # rows of the register tile: 1, or a row_x_tile when one row cannot fill the FMA pipes
    rows = None if depthwise or int(cfg["xt"]) else row_x_tile(y.dom_extent, ow, ob, lanes, registers)
    widest = max_x_tile(ob, lanes, depthwise, registers)
    # a runtime width: a divisor of its upper bound means nothing at the actual width, whose
    # last partial tile the tail partition runs unguarded anyway, so the widest tile that fits
    # (EfficientNet-B0's 1x1 convs at 56 x 56 under a bound of 64: tiles of 8 -> 14 pixels)
    dyn = explicit_dyn(out.op)
    xt_auto = min(ow, widest) if dyn is not None and dyn[3] is not None else pick_x_tile(ow, widest)
    yr, xt = rows or (1, int(cfg["xt"]) or xt_auto)
    xt = max(1, min(xt, ow))
    xo, xi = out.split(x, factor=xt)
    order = cfg["order"]
    if depthwise or order == "block_outer":
        yt = 0
    elif order == "row_outer":
        yt = row_tile(anchor, isa.l2_bytes // 2) or 1
    else:
        yt = row_tile(anchor, isa.l2_bytes // 2)
    oh = y.dom_extent  # y is re-bound to split parts below
    inner = [xi, kc]
    if yt:
        yo, y = out.split(y, factor=yt)
    if yr > 1:
        y, yri = out.split(y, factor=yr)
        inner = [yri, xi, kc]
    if yt:
        out.reorder(n, yo, k, y, xo, *inner)
        outer = out.fuse(n, yo, k)
    else:
        out.reorder(n, k, y, xo, *inner)
        outer = out.fuse(n, k, y)
    work = prod(iv.dom_extent for iv in anchor.op.axis) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if work >= PARALLEL_MIN and n.dom_extent * k.dom_extent * oh > 1:
        out.parallel(outer)
    out.unroll(xi)
    if yr > 1:
        out.unroll(yri)
    out.vectorize(kc)
    anchor.compute_at(out, xo)
    cn, ck, cy, cx, ckc = anchor.op.axis
    red = list(anchor.op.reduce_axis)
    if yr > 1:
        anchor.reorder(cn, ck, *red, cy, cx, ckc)
        anchor.unroll(cy)
    else:
        anchor.reorder(cn, ck, cy, *red, cx, ckc)
    anchor.unroll(cx)
    anchor.vectorize(ckc)


def schedule_blocked_copy(s: te.Schedule, st: te.Stage) -> None:
    """Loop schedule of a copy whose innermost axis is a short channel block (pad, layout).

    The generic injective schedule fuses every axis and re-splits by 16 when the last axis
    is shorter than 16, which puts ``// 8`` and ``% 8`` inside the vector lane index (a scalar,
    gather-like loop).  Here the block axis itself is the vector, the rest is the parallel
    outer loop.
    """
    axes = list(st.op.axis)
    last = axes[-1].dom_extent if axes else 0
    if len(axes) < 2 or not 2 <= last <= 64:
        schedule_injective_stage(s, st)
        return
    total = prod(iv.dom_extent for iv in axes)
    if len(axes) >= 3:
        # (a fused IterVar has no extent until bound: count the outer iterations here)
        outer_extent = prod(iv.dom_extent for iv in axes[:-2])
        outer = fuse_outer(st, axes[:-2])
        if total >= PARALLEL_MIN and outer_extent > 1:
            st.parallel(outer)
    elif total >= PARALLEL_MIN:
        st.parallel(axes[0])
    src = st.op.input_tensors[0] if len(st.op.input_tensors) == 1 else None
    narrower = src.shape[-1] if src is not None and len(src.shape) == len(axes) else 0
    if isinstance(narrower, int) and 4 <= narrower < last and last % narrower == 0:
        # from a narrower block (NCHW8c -> NCHW16c): each source block is one contiguous
        # vector, the lanes of one destination block are not
        _, lane = st.split(axes[-1], factor=narrower)
        st.vectorize(lane)
    elif last >= 4:
        st.vectorize(axes[-1])
    else:
        st.unroll(axes[-1])


def _transpose_copy(st: te.Stage) -> bool:
    """A layout transform between NCHW and a channel-blocked layout, scheduled as small 2-D
    transposes of scalar moves; False (nothing scheduled) for any other pair of layouts.

    ``st`` is a ``layout_transform`` compute by construction (:func:`schedule_layout_transform`
    calls this on its group's output): the checks here are on ranks and blocks only, which,
    say, a reshape to or from 5-D could pass as well.

    One side of such a copy is strided whatever axis is vectorised: a 16-lane vector along
    the block is a gather from 16 NCHW planes, one along the width a gather at the block's
    stride. Zen 5 runs those gathers at ~1.3 cycles per element; tiles of unrolled scalar
    loads and stores, each row contiguous on one side, measured faster (1 thread, AVX-512):
    ``[1,4,56,56,32] -> NCHW`` 140 -> 103 us, ``NCHW [1,128,56,56] -> 32c`` 115 -> 90 us
    (``KILN_CACHE=0 KILN_NUM_THREADS=1 python bench/bench_layout_transform.py
    NCHW32c:NCHW:1,4,56,56,32 NCHW:NCHW32c:1,128,56,56``, the tree before and after).
    """
    if len(st.op.input_tensors) != 1:
        return False
    src = st.op.input_tensors[0]
    axes = list(st.op.axis)
    total = prod(iv.dom_extent for iv in axes)
    if len(axes) == 4 and len(src.shape) == 5 and isinstance(src.shape[-1], int) and src.shape[-1] >= 4:
        n, c, h, w = axes  # blocked -> NCHW: rows of one block's channels, one pixel at a time
        co, ci = st.split(c, factor=src.shape[-1])
        st.reorder(n, co, h, w, ci)
        outer = fuse_outer(st, [n, co, h])
        st.unroll(ci)
    elif len(axes) == 5 and len(src.shape) == 4 and axes[-1].dom_extent >= 4:
        n, cb, h, w, ci = axes  # NCHW -> blocked: a few pixels of a whole block
        width = w.dom_extent
        wt = next((f for f in (8, 7, 4, 2) if width % f == 0), 1)
        wo, wi = st.split(w, factor=wt)
        st.reorder(n, cb, h, wo, wi, ci)
        outer = fuse_outer(st, [n, cb, h])
        st.unroll(wi)
        st.unroll(ci)
    else:
        return False
    if total >= PARALLEL_MIN:
        st.parallel(outer)
    return True


def _transpose_copy_dynamic(s: te.Schedule, st: te.Stage) -> bool:
    """An NCHW <-> blocked ``layout_transform`` over a runtime width ``W``, scheduled as tiles
    of :data:`DYN_W_TILE` pixels whose source is staged through a ``local`` copy
    (:func:`~kiln.topi.schedule.generic.tile_transpose`); False (nothing scheduled) for a static
    width, one whose upper bound is below two tiles, other layout pairs, and blocked -> NCHW
    with blocks of fewer than 16 channels.

    :func:`_transpose_copy` keeps the static width inside its tile loops. Over a runtime ``W``
    that loop has a runtime trip count, and LLVM vectorises it itself: gathers across the block
    (blocked -> NCHW) or the planes (NCHW -> blocked) and a scalar epilogue. The padded layout
    makes it worse: planes are the upper bound's, often a power of two (a 28 x 28 stage of an
    ``h, w <= 256`` model is stored 32 x 32, 4 KiB per plane), so the one float per plane per
    pixel that a pixel-by-pixel copy touches maps every channel to the same L1 set.

    Here a sub-block of :data:`DYN_SUB_BLOCK` channels (the whole block when it does not divide
    it) walks the row in tiles of ``t`` pixels, each moving whole runs of ``t`` pixels of its
    channel planes (blocked -> NCHW: stores of ``t`` contiguous floats per channel; NCHW ->
    blocked: loads of them), with unguarded full tiles and static-width tail tiles
    (``tile_transpose`` says how).

    Blocks of 8 channels or fewer back to NCHW keep :func:`_transpose_copy`: LLVM vectorises its
    loop as an interleave group (shuffles, no gathers), ``[1,8,28,28,8]`` at 4.3 us against 8.8
    us tiled. So do widths of at most 31: their planes are small (16 x 16 floats, 1 KiB, no
    set conflicts) and most pixels would be in tail tiles; ShuffleNetV2's 14 x 14 and 7 x 7
    transforms (upper bounds 16, 8) took 1.0-2.3x their time tiled, and already matched their
    static kernels. (Zen 5, AVX-512, 1 thread, ``n, h, w <= 8, 32, 32``; per-kernel numbers of the
    ShuffleNetV2 transforms: ``KILN_NUM_THREADS=1 python bench/profile_dynamic.py --model
    shufflenetv2 --shape 1x224x224``: ``[1,2,28,28,32] -> NCHW`` 47 -> 20 us, ``[1,116,28,28] ->
    32c`` 62 -> 28 us; static 12 and 23 us. With the tiles inside the sub-block loop rather than
    outside it, the ConvNeXt-T transforms at 28 x 28 under a bound of 32, ``[1,6,28,28,32] ->
    NCHW`` 73 -> 36 us and ``[1,192,28,28] -> 32c`` 46 -> 34 us, static 35 and 31 us.)
    """
    dyn = explicit_dyn(st.op)
    axes = list(st.op.axis)
    if (dyn is None or len(dyn) < 4 or dyn[3] is None or len(st.op.input_tensors) != 1
            or axes[3].dom_extent < 2 * DYN_W_TILE):
        return False
    src = st.op.input_tensors[0]
    if len(axes) == 4 and len(src.shape) == 5 and isinstance(src.shape[-1], int) and src.shape[-1] >= 16:
        n, c, h, w = axes  # blocked -> NCHW: t pixels of a sub-block in registers, stored by channel
        blk = src.shape[-1]
        co, ci = st.split(c, factor=blk)
        sub = DYN_SUB_BLOCK if blk % DYN_SUB_BLOCK == 0 else blk
        tile_transpose(s, st, [src], [n, co, h], w, ci, sub, False, (3, 4))  # source: t pixels x sub
    elif len(axes) == 5 and len(src.shape) == 4 and isinstance(axes[-1].dom_extent, int) and axes[-1].dom_extent >= 4:
        n, cb, h, w, ci = axes  # NCHW -> blocked: one channel's run of t pixels at a time
        blk = ci.dom_extent
        sub = DYN_SUB_BLOCK if blk % DYN_SUB_BLOCK == 0 else blk
        tile_transpose(s, st, [src], [n, cb, h], w, ci, sub, True, (3,))
    else:
        return False
    return True


def _root_nchwc(anchor: te.Stage) -> None:
    n, k, y, x, kc = anchor.op.axis
    outer = anchor.fuse(n, k, y)
    work = prod(iv.dom_extent for iv in anchor.op.axis) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if work >= PARALLEL_MIN:
        anchor.parallel(outer)
    anchor.vectorize(kc)


def _make(isa_of_target: Any) -> Any:
    """The blocked-conv schedule; ``isa_of_target(target) -> ISA`` gives lanes, registers, L2."""

    def schedule_conv2d_nchwc(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
        """``conv2d_nchwc`` (plain or depthwise) with a fused elementwise epilogue."""
        s = prepare(outs)
        anchor = _find(s, (TAG_CONV2D_NCHWC, TAG_DEPTHWISE_NCHWC))
        handled: set[int] = set()
        if anchor is not None:
            out = _single_output_epilogue(s, anchor)
            if out is not None:
                _tile_nchwc(out, anchor, isa_of_target(target))
                handled.update({id(out.op), id(anchor.op)})
            else:
                _root_nchwc(anchor)
                handled.add(id(anchor.op))
        for st in s.stages:
            if (isinstance(st.op, te.ComputeOp) and st.attach_type == "root" and not st.is_output
                    and not st.op.reduce_axis and id(st.op) not in handled):
                schedule_blocked_copy(s, st)
                handled.add(id(st.op))
        return finalize(s, handled, vector_elements(target))

    return schedule_conv2d_nchwc


def schedule_layout_transform(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """A ``layout_transform`` group: the op alone (it is OPAQUE, nothing fuses into it).

    Its output stage is the ``layout_transform`` compute: NCHW <-> blocked transposes get
    :func:`_transpose_copy_dynamic` over a runtime width, else :func:`_transpose_copy`; other
    layout pairs :func:`schedule_blocked_copy`.
    """
    s = prepare(outs)
    handled: set[int] = set()
    for st in list(s.stages):  # (a staging copy adds a stage)
        if isinstance(st.op, te.ComputeOp) and st.is_output and not st.op.reduce_axis:
            if not (_transpose_copy_dynamic(s, st) or _transpose_copy(st)):
                schedule_blocked_copy(s, st)
            handled.add(id(st.op))
    return finalize(s, handled, vector_elements(target))


def schedule_max_pool2d_nchwc(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """Blocked max pooling: parallel rows, the window loops outside the vectorised block."""
    s = prepare(outs)
    pool = _find(s, (TAG_POOL_NCHWC,))
    handled: set[int] = set()
    if pool is not None:
        out = _single_output_epilogue(s, pool)
        st = out if out is not None else pool
        n, c, y, x, kc = st.op.axis
        outer = st.fuse(n, c, y)
        if prod(iv.dom_extent for iv in st.op.axis) >= PARALLEL_MIN:
            st.parallel(outer)
        if out is not None:
            st.vectorize(kc)
            pool.compute_at(out, x)
            handled.add(id(out.op))
            pn, pc, py, px, pkc = pool.op.axis
            pool.reorder(pn, pc, py, px, *pool.op.reduce_axis, pkc)
            pool.vectorize(pkc)
        else:
            st.reorder(outer, x, *pool.op.reduce_axis, kc)
            st.vectorize(kc)
        handled.add(id(pool.op))
    return finalize(s, handled, vector_elements(target))


# ----------------------------------------------------------------------------- conv2d (NCHW)
# The plain-layout kernels: what conv2d / conv2d_transpose use when AlterConvLayout is off or
# does not apply (grouped convs, float16, < 4 output channels).  Vectorised over output x.
def _plain_x_tile(ow: int, kt: int, lanes: int, registers: int) -> int:
    """Output pixels of a plain-layout register tile: the widest divisor of ``ow`` up to four
    vectors whose ``kt`` rows of accumulators, input vectors and a broadcast fit the registers
    (no guarded tail tile); without one, two vectors (one when ``ow`` is narrower).

    ResNeXt-50's grouped 3x3 convs (56 wide, 4 channels per group, NCHW) had 32-pixel tiles on
    AVX-512 and a guarded 24-pixel tail on every row: 731 us each (40 GFLOP/s, Zen 5, 1 thread;
    per-node time of ``conv2d_bias_add_relu`` in ``kiln bench bench/out/resnext50.onnx
    --threads 1 --profile``), now ~165 us.
    """
    for d in range(min(ow, 4 * lanes), lanes - 1, -1):
        vecs = tile_vectors(d, lanes)
        if ow % d == 0 and kt * vecs + vecs + 1 <= registers:
            return d
    return min(2 * lanes, ow) if ow >= 2 * lanes else min(lanes, ow)


def _conv_tiles(out: te.Stage, anchor: te.Stage, depthwise: bool, lanes: int, registers: int = 16) -> None:
    n, k, y, x = out.op.axis
    kk, oh, ow = k.dom_extent, y.dom_extent, x.dom_extent
    kt = 1 if depthwise else min(4, kk)
    xt = _plain_x_tile(ow, kt, lanes, registers)
    ko, ki = out.split(k, factor=kt)
    xo, xi = out.split(x, factor=xt)
    out.reorder(n, ko, y, xo, ki, xi)
    outer = out.fuse(n, ko, y)
    work = prod(iv.dom_extent for iv in anchor.op.axis) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if work >= PARALLEL_MIN and n.dom_extent * kk * oh > 1:
        out.parallel(outer)
    out.vectorize(xi)
    anchor.compute_at(out, xo)
    cn, ck, cy, cx = anchor.op.axis
    red = list(anchor.op.reduce_axis)
    anchor.reorder(cn, cy, *red, ck, cx)
    if kt > 1:
        anchor.unroll(ck)
    anchor.vectorize(cx)


def _conv_root(anchor: te.Stage) -> None:
    """Anchor without a fusable epilogue: plain parallel loops, reduction innermost."""
    n, k, y, x = anchor.op.axis
    outer = anchor.fuse(n, k, y)
    work = prod(iv.dom_extent for iv in anchor.op.axis) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if work >= PARALLEL_MIN:
        anchor.parallel(outer)


def _make_conv_schedule(isa_of_target: Any) -> Any:
    """The plain-layout conv schedule; ``isa_of_target(target) -> ISA`` gives lanes and registers."""

    def schedule_conv2d(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
        """conv2d / depthwise / transposed conv with a fused epilogue (bias, activation, residual)."""
        s = prepare(outs)
        isa = isa_of_target(target)
        lanes, registers = isa.lanes("float32"), isa.vector_registers
        anchor = _find(s, (TAG_CONV2D, TAG_DEPTHWISE, TAG_CONV2D_T))
        handled: set[int] = set()
        if anchor is not None:
            out = _single_output_epilogue(s, anchor)
            if out is not None:
                _conv_tiles(out, anchor, anchor.op.tag != TAG_CONV2D, lanes, registers)
                handled.update({id(out.op), id(anchor.op)})
            else:
                _conv_root(anchor)
                handled.add(id(anchor.op))
        _keep_root_helpers(s, handled, vector_elements(target))
        return finalize(s, handled, vector_elements(target))

    return schedule_conv2d


# ----------------------------------------------------------------------------- registrations
# ``generic`` (a kind without schedules of its own, whose ISA is unknown): the no-target model
schedule_conv2d = _make_conv_schedule(lambda t: schedule_isa(None))
schedule_conv2d_nchwc = _make(lambda t: schedule_isa(None))

for _op in ("conv2d", "conv2d_transpose"):
    register_schedule(_op, "generic", schedule_conv2d)
    register_schedule(_op, ["c", "llvm"], _make_conv_schedule(schedule_isa))

register_schedule("conv2d_nchwc", "generic", schedule_conv2d_nchwc)
register_schedule("conv2d_nchwc", ["c", "llvm"], _make(schedule_isa))
register_schedule("layout_transform", ["generic", "c", "llvm"], schedule_layout_transform)
register_schedule("max_pool2d_nchwc", ["generic", "c", "llvm"], schedule_max_pool2d_nchwc)
