"""CPU schedules of the anchor ops dense and matmul, and helpers shared with ``x86_conv``
(which holds the convolution schedules).

All follow one shape: the group's output stage (the anchor's own ``*_out`` stage, or the
fused epilogue that replaced it) is tiled into register blocks; the anchor's reduction is
``compute_at`` the block loop, with its reduction loops outside and the block's unrolled
rows / vectorised columns inside, so the partial sums of one block live in a small local
buffer (registers after the C/LLVM optimisers) and the epilogue runs on a block while it
is hot.  Tails of non-multiple extents are guarded by the lowering.

The same functions serve the ``generic`` registrations (default tiles) and the ``c`` /
``llvm`` ones (tiles picked from the target's vector width).
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ..knobs import current_config
from ..nn.dense import DENSE_PACK_BN, TAG_DENSE, TAG_DENSE_GEMV, TAG_DENSE_PACK, TAG_MATMUL
from ..registry import register_schedule
from ..util import prod
from .generic import PARALLEL_MIN, finalize, prepare, readers_after_inline, schedule_injective_stage

__all__ = ["schedule_dense", "schedule_matmul", "vector_lanes"]


def vector_lanes(target: Any) -> int:
    """float32 lanes of the target's widest vector unit (8 = AVX2 default, 16 with AVX-512)."""
    mattr: list[str] = []
    try:
        mattr = list(getattr(target, "mattr", None) or [])
    except Exception:  # noqa: BLE001 - a foreign target object: use the default
        mattr = []
    if not mattr and isinstance(target, str) and "avx512f" in target and "-avx512f" not in target:
        return 16
    if "+avx512f" in mattr:
        return 16
    return 8


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


def _keep_root_helpers(s: te.Schedule, handled: set[int]) -> None:
    """Materialised helper stages (padding, weight packing): parallel copy loops."""
    for st in s.stages:
        if (isinstance(st.op, te.ComputeOp) and st.attach_type == "root" and not st.is_output
                and not st.op.reduce_axis and id(st.op) not in handled):
            schedule_injective_stage(s, st)
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
    m = axes[-2]
    batch = axes[:-2]
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
    dm, dn = da[-2], da[-1]
    anchor.reorder(*da[:-2], *anchor.op.reduce_axis, dm, dn)
    if mt > 1:
        anchor.unroll(dm)
    anchor.vectorize(dn)
    if pack is not None:
        pack.compute_at(out, par)
        pack.vectorize(pack.op.axis[-1])


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
    def schedule_gemm(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
        """dense / matmul with a fused elementwise epilogue."""
        s = prepare(outs)
        anchor = _find(s, tags)
        handled: set[int] = set()
        if anchor is not None:
            out = _single_output_epilogue(s, anchor)
            mt, nt = tiles_of(target)
            wl = anchor.op.attrs.get("workload")
            if wl is not None and not anchor.op.attrs.get("gemv"):
                cfg = current_config(wl[0], wl, {"mt": mt, "nt": nt})
                mt, nt = int(cfg["mt"]), int(cfg["nt"])
            packed = bool(anchor.op.attrs.get("packed"))
            if packed:
                # columns must be whole panels so n // bn and n % bn simplify away
                nt = int(anchor.op.attrs.get("bn", DENSE_PACK_BN))
            elif len(anchor.op.axis) >= 2 and anchor.op.axis[-2].dom_extent <= 3:
                # few-row product (GEMV-like): a wide row of accumulators hides the FMA latency
                nt = 4 * nt
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
                schedule_injective_stage(s, pack)
                handled.add(id(pack.op))
        _keep_root_helpers(s, handled)
        return finalize(s, handled)

    return schedule_gemm


def _default_gemm_tiles(target: Any) -> tuple[int, int]:
    return 4, 16


def _x86_gemm_tiles(target: Any) -> tuple[int, int]:
    # 6 rows x 16 columns: 12 ymm accumulators + 2 for the B row + 1 broadcast A value of the
    # 16 AVX2 registers (the classic Zen/Haswell SGEMM micro-kernel shape).
    return 6, 16


schedule_dense = _make_gemm_schedule((TAG_DENSE,), _default_gemm_tiles)
schedule_matmul = _make_gemm_schedule((TAG_MATMUL,), _default_gemm_tiles)

register_schedule("dense", "generic", schedule_dense)
register_schedule("matmul", "generic", schedule_matmul)
register_schedule("dense", ["c", "llvm"], _make_gemm_schedule((TAG_DENSE,), _x86_gemm_tiles))
register_schedule("matmul", ["c", "llvm"], _make_gemm_schedule((TAG_MATMUL,), _x86_gemm_tiles))
