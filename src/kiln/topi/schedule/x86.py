"""CPU schedules of the anchor ops: conv2d (+ depthwise), dense, matmul, pools.

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
from ..nn.conv2d import TAG_CONV2D, TAG_CONV2D_T, TAG_DEPTHWISE
from ..nn.dense import DENSE_PACK_BN, TAG_DENSE, TAG_DENSE_PACK, TAG_MATMUL
from ..registry import register_schedule
from ..util import prod
from .generic import PARALLEL_MIN, finalize, prepare, readers_after_inline, schedule_injective_stage

__all__ = ["schedule_conv2d", "schedule_dense", "schedule_matmul", "vector_lanes"]


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


# ----------------------------------------------------------------------------- conv2d
def _conv_tiles(out: te.Stage, anchor: te.Stage, depthwise: bool, lanes: int) -> None:
    n, k, y, x = out.op.axis
    kk, oh, ow = k.dom_extent, y.dom_extent, x.dom_extent
    kt = 1 if depthwise else min(4, kk)
    xt = min(2 * lanes, ow) if ow >= 2 * lanes else min(lanes, ow)
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


def _conv_root(anchor: te.Stage, lanes: int) -> None:
    """Anchor without a fusable epilogue: plain parallel loops, reduction innermost."""
    n, k, y, x = anchor.op.axis
    outer = anchor.fuse(n, k, y)
    work = prod(iv.dom_extent for iv in anchor.op.axis) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if work >= PARALLEL_MIN:
        anchor.parallel(outer)


def _make_conv_schedule(lanes_of: Any) -> Any:
    def schedule_conv2d(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
        """conv2d / depthwise / transposed conv with a fused epilogue (bias, activation, residual)."""
        s = prepare(outs)
        lanes = lanes_of(target)
        anchor = _find(s, (TAG_CONV2D, TAG_DEPTHWISE, TAG_CONV2D_T))
        handled: set[int] = set()
        if anchor is not None:
            out = _single_output_epilogue(s, anchor)
            if out is not None:
                _conv_tiles(out, anchor, anchor.op.tag != TAG_CONV2D, lanes)
                handled.update({id(out.op), id(anchor.op)})
            else:
                _conv_root(anchor, lanes)
                handled.add(id(anchor.op))
        _keep_root_helpers(s, handled)
        return finalize(s, handled)

    return schedule_conv2d


# ----------------------------------------------------------------------------- dense / matmul
def _gemm_tiles(out: te.Stage, anchor: te.Stage, mt: int, nt: int) -> None:
    """Register-tile the last two output axes (rows ``mt`` × columns ``nt``); batch axes parallel."""
    axes = list(out.op.axis)
    n = axes[-1]
    nn = n.dom_extent
    nt = min(nt, nn)
    if len(axes) == 1:
        no, ni = out.split(n, factor=nt)
        out.vectorize(ni)
        if nn * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis)) >= PARALLEL_MIN and nn > nt:
            out.parallel(no)
        anchor.compute_at(out, no)
        (dn,) = anchor.op.axis
        anchor.reorder(*anchor.op.reduce_axis, dn)
        anchor.vectorize(dn)
        return
    m = axes[-2]
    batch = axes[:-2]
    mm = m.dom_extent
    mt = min(mt, mm)
    mo, mi = out.split(m, factor=mt)
    no, ni = out.split(n, factor=nt)
    out.reorder(*batch, mo, no, mi, ni)
    par = out.fuse(*batch, mo) if batch else mo
    work = prod(iv.dom_extent for iv in axes) * max(1, prod(iv.dom_extent for iv in anchor.op.reduce_axis))
    if work >= PARALLEL_MIN:
        out.parallel(par)
    out.vectorize(ni)
    anchor.compute_at(out, no)
    da = list(anchor.op.axis)
    dm, dn = da[-2], da[-1]
    anchor.reorder(*da[:-2], *anchor.op.reduce_axis, dm, dn)
    if mt > 1:
        anchor.unroll(dm)
    anchor.vectorize(dn)


def _make_gemm_schedule(tags: tuple[str, ...], tiles_of: Any) -> Any:
    def schedule_gemm(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
        """dense / matmul with a fused elementwise epilogue."""
        s = prepare(outs)
        anchor = _find(s, tags)
        handled: set[int] = set()
        if anchor is not None:
            out = _single_output_epilogue(s, anchor)
            mt, nt = tiles_of(target)
            if anchor.op.tag == TAG_DENSE and anchor.op.attrs.get("packed"):
                # columns must be whole panels so n // bn and n % bn simplify away
                nt = DENSE_PACK_BN
            if out is not None:
                _gemm_tiles(out, anchor, mt, nt)
                handled.update({id(out.op), id(anchor.op)})
            pack = _find(s, (TAG_DENSE_PACK,))
            if pack is not None and pack.attach_type == "root":
                schedule_injective_stage(s, pack)
                handled.add(id(pack.op))
        _keep_root_helpers(s, handled)
        return finalize(s, handled)

    return schedule_gemm


def _default_gemm_tiles(target: Any) -> tuple[int, int]:
    return 4, 32


def _x86_gemm_tiles(target: Any) -> tuple[int, int]:
    # 4 rows x 32 columns of accumulators (16 ymm on AVX2; measured best of 2..8 x 16..64 for
    # 1024^3 with the C codegen: ~50 GFLOP/s on one Zen core); AVX-512 doubles the columns.
    lanes = vector_lanes(target)
    return 4, 4 * lanes


schedule_conv2d = _make_conv_schedule(lambda t: 8)
schedule_dense = _make_gemm_schedule((TAG_DENSE,), _default_gemm_tiles)
schedule_matmul = _make_gemm_schedule((TAG_MATMUL,), _default_gemm_tiles)

for _op in ("conv2d", "conv2d_transpose"):
    register_schedule(_op, "generic", schedule_conv2d)
    register_schedule(_op, ["c", "llvm"], _make_conv_schedule(vector_lanes))
register_schedule("dense", "generic", schedule_dense)
register_schedule("matmul", "generic", schedule_matmul)
register_schedule("dense", ["c", "llvm"], _make_gemm_schedule((TAG_DENSE,), _x86_gemm_tiles))
register_schedule("matmul", ["c", "llvm"], _make_gemm_schedule((TAG_MATMUL,), _x86_gemm_tiles))
