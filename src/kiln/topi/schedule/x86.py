"""CPU schedules of the anchor ops dense and matmul, and helpers shared with ``x86_conv``
(which holds the convolution schedules).

All follow one shape: the group's output stage (the anchor's own ``*_out`` stage, or the
fused epilogue that replaced it) is tiled into register blocks; the anchor's reduction is
``compute_at`` the block loop, with its reduction loops outside and the block's unrolled
rows / vectorised columns inside, so the partial sums of one block live in a small local
buffer (registers after the C/LLVM optimisers) and the epilogue runs on a block while it
is hot.  Tails of non-multiple extents are guarded by the lowering.

Vector lanes and register counts come from the target's instruction-set model
(:func:`kiln.target.isa_of`), the same model the code generators size their vectors from, so
a tile is chosen for the registers the emitted code really has (``llvm`` without ``-mcpu``:
SSE2, 16 ``xmm``; ``-mcpu=haswell``: 16 ``ymm``; ``-mcpu=skylake-avx512``: 32 ``zmm``).  The
``generic`` registrations keep fixed default tiles.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ...te.dynamic import explicit_dyn
from ...target import ISA, isa_of
from ...tir.expr import ProducerLoad
from ...tir.functor import collect_vars, post_order_visit
from ..knobs import current_config
from ..nn.dense import DENSE_PACK_BN, TAG_DENSE, TAG_DENSE_GEMV, TAG_DENSE_PACK, TAG_MATMUL
from ..registry import register_schedule
from ..util import prod
from .generic import (PARALLEL_MIN, VEC, finalize, prepare, readers_after_inline, schedule_injective_stage,
                      vector_elements)

__all__ = ["schedule_dense", "schedule_matmul", "vector_lanes", "schedule_isa", "gemm_register_tile",
           "few_row_columns", "NO_TARGET_CPU", "MAX_TILE_ROWS"]

#: The target assumed when a schedule is called with no target at all (direct calls in tests
#: and tools): x86-64-v3 (AVX2 + FMA, 16 ``ymm``), the register file the hand-tuned defaults
#: were measured on.  A build always passes its target.
NO_TARGET_CPU = "llvm -mcpu=x86-64-v3"

#: Register-tile rows are unrolled code; beyond this many the extra reuse of the ``B`` vectors
#: is small (``mt * nv / (mt + nv)`` approaches ``nv``) while code size keeps growing.
MAX_TILE_ROWS = 12


def schedule_isa(target: Any) -> ISA:
    """The instruction-set model a CPU schedule tiles for (:data:`NO_TARGET_CPU` for None)."""
    return isa_of(NO_TARGET_CPU if target is None else target)


def vector_lanes(target: Any, dtype: str = "float32") -> int:
    """``dtype`` lanes of one vector register of the target (float32: 4 SSE2 / NEON, 8 AVX2,
    16 AVX-512); see :func:`schedule_isa`."""
    return schedule_isa(target).lanes(dtype)


def gemm_register_tile(isa: ISA, dtype: str = "float32", nt: int | None = None) -> tuple[int, int]:
    """Rows ``mt`` × columns ``nt`` of the GEMM register tile for an instruction set.

    Per reduction step the micro-kernel keeps ``mt * nv`` accumulators, loads ``nv = nt /
    lanes`` vectors of the ``B`` row and broadcasts one ``A`` value at a time, so it fits the
    ``R = isa.vector_registers`` registers when::

        mt * nv + nv + 1 <= R

    Among ``nv`` in 1, 2, 4 (powers of two, so ``nt`` divides the usual N) with ``mt`` the
    largest that fits (at most :data:`MAX_TILE_ROWS`), the tile is the one that (a) has at
    least ``isa.min_accumulators`` accumulators (FMA latency × throughput: fewer stall on
    their own dependency chains), then (b) the most FMAs per load, ``mt * nv / (mt + nv)``,
    then (c) the most accumulators.  Results: SSE2 (16 ``xmm``) 6 × 8; AVX2 (16 ``ymm``)
    6 × 16 — 12 accumulators, 2 ``B`` vectors, 1 broadcast, the classic Haswell/Zen SGEMM
    shape; AVX-512 (32 ``zmm``) 6 × 64 — 24 + 4 + 1 of 32; NEON (32 × 128-bit) 6 × 16.

    Parameters
    ----------
    isa : ISA
        The instruction-set model (:func:`schedule_isa`).
    dtype : str
        Accumulator dtype (sets the lanes per register).
    nt : int, optional
        Fixed column count (a packed panel's width): only ``mt`` is chosen, for
        ``nv = ceil(nt / lanes)``.

    Returns
    -------
    tuple of int
        ``(mt, nt)``.
    """
    lanes = isa.lanes(dtype)
    regs = isa.vector_registers

    def rows(nv: int) -> int:
        return max(1, min(MAX_TILE_ROWS, (regs - 1 - nv) // nv))

    if nt is not None:
        return rows(max(1, -(-nt // lanes))), nt
    best: tuple[tuple[bool, float, int], int, int] | None = None
    for nv in (1, 2, 4):
        if nv + 2 > regs:
            break
        mt = rows(nv)
        acc = mt * nv
        key = (acc >= isa.min_accumulators, acc / (mt + nv), acc)
        if best is None or key > best[0]:
            best = (key, mt, nv * lanes)
    assert best is not None  # nv = 1 always fits a register file of 3 or more
    return best[1], best[2]


def few_row_columns(isa: ISA, rows: int, nt: int, dtype: str = "float32") -> int:
    """Columns of a tile with only ``rows`` (<= 3) rows: up to 4× wider, within the registers.

    A wide row of accumulators hides the FMA latency that few rows cannot.  With so few rows
    each ``B`` vector is loaded right before its ``rows`` FMAs, so one ``B`` vector and one
    broadcast are live beside the accumulators: ``nv`` is the largest power of two
    ``<= 4 * nt / lanes`` with ``rows * nv + 2 <= R`` (AVX2: 8 vectors for one row, 4 for
    two or three).
    """
    lanes = isa.lanes(dtype)
    nv = max(1, -(-nt // lanes))
    fit = max(1, (isa.vector_registers - 2) // max(1, rows))
    want = min(4 * nv, fit)
    p = 1
    while p * 2 <= want:
        p *= 2
    return max(nt, p * lanes)


def _find(s: te.Schedule, tags: Sequence[str]) -> te.Stage | None:
    for st in s.stages:
        if isinstance(st.op, te.ComputeOp) and st.op.tag in tags:
            return st
    return None


def _single_output_epilogue(s: te.Schedule, anchor: te.Stage) -> te.Stage | None:
    """The output stage that is the anchor's only reader and has the anchor's shape, else None."""
    outs = [st for st in s.stages if st.is_output]
    if len(outs) != 1 or outs[0] is anchor or outs[0].op.reduce_axis:
        return None
    out = outs[0]
    if readers_after_inline(s).get(id(anchor.op), []) != [out]:
        return None
    if tuple(out.op.output(0).shape) != tuple(anchor.op.output(0).shape):
        return None
    return out


def _keep_root_helpers(s: te.Schedule, handled: set[int], vec: int = VEC) -> None:
    """Materialised helper stages (padding, weight packing): parallel copy loops split by ``vec``."""
    for st in s.stages:
        if (isinstance(st.op, te.ComputeOp) and st.attach_type == "root" and not st.is_output
                and not st.op.reduce_axis and id(st.op) not in handled):
            schedule_injective_stage(s, st, vec)
            handled.add(id(st.op))


# ----------------------------------------------------------------------------- dense / matmul
def _gemm_tiles(out: te.Stage, anchor: te.Stage, mt: int, nt: int, pack: te.Stage | None = None) -> None:
    """Register-tile the last two output axes (rows ``mt`` × columns ``nt``).

    Loop order ``batch, n-block, m-block, tile``: the parallel loop runs over (batch,
    column block) pairs, and a column block's packed ``B`` panel (``pack``, built right
    there by ``compute_at``) stays in L1/L2 while every row block streams past it.
    """
    axes = list(out.op.axis)
    n = axes[-1]
    nn = n.dom_extent
    # max(1, ...): an empty output (a zero M or N, as ONNX allows) still needs a valid split;
    # its loops then simply run zero times.
    nt = max(1, min(nt, nn))
    work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if len(axes) == 1:
        no, ni = out.split(n, factor=nt)
        out.vectorize(ni)
        if work >= PARALLEL_MIN and nn > nt:
            out.parallel(no)
        anchor.compute_at(out, no)
        (dn,) = anchor.op.axis
        anchor.reorder(*anchor.op.reduce_axis, dn)
        anchor.vectorize(dn)
        return
    r = _row_axis(out, anchor, mt)
    m = axes[r]
    batch = [a for i, a in enumerate(axes[:-1]) if i != r]
    mm = m.dom_extent
    mt = max(1, min(mt, mm))
    mo, mi = out.split(m, factor=mt)
    no, ni = out.split(n, factor=nt)
    out.reorder(*batch, no, mo, mi, ni)
    par = out.fuse(*batch, no) if batch else no
    if work >= PARALLEL_MIN:
        out.parallel(par)
    if mt > 1:
        # constant row indices everywhere the accumulator tile is touched, so it can live in
        # registers (LLVM's SROA only splits an array indexed by constants)
        out.unroll(mi)
    out.vectorize(ni)
    anchor.compute_at(out, mo)
    da = list(anchor.op.axis)
    dm, dn = da[r], da[-1]
    anchor.reorder(*[a for i, a in enumerate(da[:-1]) if i != r], *anchor.op.reduce_axis, dm, dn)
    if mt > 1:
        anchor.unroll(dm)
    anchor.vectorize(dn)
    if pack is not None:
        pack.compute_at(out, par)
        if anchor.op.tag == TAG_DENSE:
            _pack_panel_rows(pack)  # panels of W's rows (dense reads W[n, k])
        else:
            pack.vectorize(pack.op.axis[-1])  # matmul's B[k, n]: a panel row is contiguous


def _row_axis(out: te.Stage, anchor: te.Stage, mt: int) -> int:
    """The output axis a GEMM's register tile runs its rows along: the last but one, unless
    that is a dynamic dim and a static dim before it has at least ``mt`` rows along which the
    right-hand matrix stays the same (a dense's weight, a 2-D matmul operand: no read of the
    product indexes that axis without also indexing the rows; a batched product's ``B[h]``
    does, and tiling ``h`` would reuse nothing).

    A sequence-first product ``(seq, batch, K) x (K, N)`` (``nn.MultiheadAttention``'s layout,
    ViT) with a dynamic ``batch``: tiling the batch rows computes a whole tile for one valid row
    at batch 1 and streams the weight panel once per sequence position (ViT-B/16 at batch 1:
    6x its static kernel); tiling ``seq`` keeps the static build's reuse of every panel.
    """
    axes = list(out.op.axis)
    r = len(axes) - 2
    dyn = explicit_dyn(out.op)
    if dyn is None or dyn[r] is None:
        return r
    avars = [iv.var for iv in anchor.op.axis]
    reads: list[set[Any]] = []
    for b in getattr(anchor.op, "body", ()):
        post_order_visit(b, lambda n: reads.append(set().union(*(collect_vars(i) for i in n.indices)))
                         if isinstance(n, ProducerLoad) else None)

    def shared(i: int) -> bool:  # every read using axis i also uses the rows: B does not move
        return all(avars[r] in vs for vs in reads if avars[i] in vs)

    static = [i for i in range(r) if dyn[i] is None and axes[i].dom_extent >= mt and shared(i)]
    return static[-1] if static else r


def _pack_panel_rows(pack: te.Stage) -> None:
    """Loop order of a column block's panel copy ``wp[k, j] = W[j, k]`` (``bn`` rows of W).

    Reading the ``bn`` rows one element each per ``k`` strides by a whole row: for K = 1024
    floats every read is 4 KiB from the last, the rows alias in L1, and packing took a fifth
    of a [64, 1024] x [1024, 256] dense (62 GFLOP/s, against 82 with this order on Zen 3,
    1 thread). Instead each row contributes one cache line (16 floats of K) per step.
    """
    *_, pk, pn = pack.op.axis
    kk = pk.dom_extent
    step = next((f for f in (16, 8, 4) if kk % f == 0 and kk > f), 0)
    if not step:
        pack.vectorize(pn)
        return
    ko, ki = pack.split(pk, factor=step)
    pack.reorder(ko, pn, ki)
    pack.unroll(ki)


def _gemv_tiles(out: te.Stage, anchor: te.Stage, part: te.Stage) -> None:
    """One output element per iteration; its ``lanes`` partial sums live in one register tile."""
    axes = list(out.op.axis)
    fused = out.fuse(*axes) if len(axes) > 1 else axes[0]
    work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in part.op.reduce_axis)) * \
        part.op.axis[-1].dom_extent
    if work >= PARALLEL_MIN:
        out.parallel(fused)
    anchor.compute_at(out, fused)
    part.compute_at(anchor, anchor.op.axis[-1])
    pa = list(part.op.axis)
    part.reorder(*pa[:-1], *part.op.reduce_axis, pa[-1])
    part.vectorize(pa[-1])


def _make_gemm_schedule(tags: tuple[str, ...], tiles_of: Any) -> Any:
    """A dense / matmul schedule.

    ``tiles_of(target, nt=None, rows=None) -> (mt, nt)`` picks the register tile: with ``nt``
    (a packed panel's width) only the rows; with ``rows`` (a product of at most 3 rows) the
    widened column count for that many rows and the given ``nt``.
    """

    def schedule_gemm(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
        """dense / matmul with a fused elementwise epilogue."""
        s = prepare(outs)
        anchor = _find(s, tags)
        handled: set[int] = set()
        if anchor is not None:
            out = _single_output_epilogue(s, anchor)
            packed = bool(anchor.op.attrs.get("packed"))
            bn = int(anchor.op.attrs.get("bn", DENSE_PACK_BN))
            # packed: the rows are what fits beside a panel's column vectors
            mt, nt = tiles_of(target, nt=bn) if packed else tiles_of(target)
            wl = anchor.op.attrs.get("workload")
            if wl is not None and not anchor.op.attrs.get("gemv"):
                cfg = current_config(wl[0], wl, {"mt": mt, "nt": nt})
                mt, nt = int(cfg["mt"]), int(cfg["nt"])
            if packed:
                # columns must be whole panels so n // bn and n % bn simplify away
                nt = bn
            elif len(anchor.op.axis) >= 2 and anchor.op.axis[-2].dom_extent <= 3:
                # few-row product (GEMV-like): a wide row of accumulators hides the FMA latency
                nt = tiles_of(target, nt=nt, rows=anchor.op.axis[-2].dom_extent)[1]
            pack = _find(s, (TAG_DENSE_PACK,)) if packed else None
            part = _find(s, (TAG_DENSE_GEMV,)) if anchor.op.attrs.get("gemv") else None
            if out is not None and part is not None:
                _gemv_tiles(out, anchor, part)
                handled.update({id(out.op), id(anchor.op), id(part.op)})
            elif out is not None:
                attach = pack is not None and len(out.op.axis) >= 2 and pack.attach_type == "root"
                _gemm_tiles(out, anchor, mt, nt, pack if attach else None)
                handled.update({id(out.op), id(anchor.op)})
                if attach:
                    handled.add(id(pack.op))
            if pack is not None and pack.attach_type == "root":
                schedule_injective_stage(s, pack, vector_elements(target))
                handled.add(id(pack.op))
        _keep_root_helpers(s, handled, vector_elements(target))
        return finalize(s, handled, vector_elements(target))

    return schedule_gemm


def _default_gemm_tiles(target: Any, nt: int | None = None, rows: int | None = None) -> tuple[int, int]:
    # the generic registration knows no register file: a fixed, modest 4 x 16 tile, 4x wider
    # for few-row products
    if nt is None:
        return 4, 16
    return 4, 4 * nt if rows is not None else nt


def _x86_gemm_tiles(target: Any, nt: int | None = None, rows: int | None = None) -> tuple[int, int]:
    # from the register file of the target's ISA; gemm_register_tile states the formula
    isa = schedule_isa(target)
    if rows is not None and nt is not None:
        return gemm_register_tile(isa, nt=nt)[0], few_row_columns(isa, rows, nt)
    return gemm_register_tile(isa, nt=nt)


schedule_dense = _make_gemm_schedule((TAG_DENSE,), _default_gemm_tiles)
schedule_matmul = _make_gemm_schedule((TAG_MATMUL,), _default_gemm_tiles)

register_schedule("dense", "generic", schedule_dense)
register_schedule("matmul", "generic", schedule_matmul)
register_schedule("dense", ["c", "llvm"], _make_gemm_schedule((TAG_DENSE,), _x86_gemm_tiles))
register_schedule("matmul", ["c", "llvm"], _make_gemm_schedule((TAG_MATMUL,), _x86_gemm_tiles))
