"""CPU schedule of a separable bilinear ``resize2d`` (:func:`kiln.topi.resize.resize2d`).

The compute's horizontal pass (the stage tagged :data:`~kiln.topi.resize.TAG_ROWS`: every
input row interpolated to the output width) is computed per channel inside the output's
parallel channel loop, so the rows the vertical pass reads are a small buffer still hot in
L1 / L2::

    for bc in batch * channels:                 # parallel
        rows[iy, x] = lerp(in[iy, x0[x]], in[iy, x1[x]], fx[x])      # H x OW, gathers
        for y in OH:
            out[y, x] = lerp(rows[y0[y], x], rows[y1[y], x], fy[y])  # vectorised, contiguous

When the width grows by a whole factor ``s`` the horizontal pass is instead split into blocks
of ``s`` columns (:data:`~kiln.topi.resize.PHASE_ATTR`), each vectorised over its phases with
three broadcast source pixels: no gathers left. With fewer than :data:`MIN_CHANNEL_TASKS`
channels the output's rows are the parallel loop and the horizontal pass is a root stage.

Groups without that stage (nearest, dynamic shapes, downscales, GPU computes) and groups in
which the resize is not the output get the generic injective schedule (which still runs the
two passes, the horizontal one as a root stage).

This module imports the compute's tag and the generic building blocks; it must not import
the graph IR or the code generators.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ..registry import register_schedule
from ..resize import PHASE_ATTR, TAG_ROWS
from ..util import prod
from .generic import PARALLEL_MIN, finalize, prepare, readers_after_inline, vector_elements

__all__ = ["schedule_resize"]

#: With fewer channels than this the output's rows, not its channels, are the parallel loop
#: and the horizontal pass is a root stage computed once for all channels up front.
MIN_CHANNEL_TASKS = 8
#: Output rows up to this long are one vectorised loop: the code generators cut it into whole
#: vectors and power-of-two remainders. A split by the vector block leaves a partial last
#: block that runs scalar: a 2x upsample of [1, 64, 56, 56] (112 columns, 16 of them scalar)
#: took 176 us against 102 (medians, Zen 5 AVX-512, ``llvm -mcpu=native``, 1 thread; the
#: command is in ``docs/topi.md``).
WHOLE_ROW = 256


def _rows_loops(rows: te.Stage, outer: te.IterVar | None) -> None:
    """Vectorise the horizontal pass's columns; ``outer`` (its fused root loops) runs parallel."""
    if outer is not None:
        rows.parallel(outer)
    step = (rows.op.attrs or {}).get(PHASE_ATTR)
    if step:
        # one phase block per source column: its three source pixels are lane-invariant
        # (broadcasts) and its weights one contiguous load, so this is explicit SIMD
        _, pi = rows.split(rows.op.axis[-1], factor=step)
        rows.vectorize(pi)
    else:
        # the source columns are table lookups: the compilers' loop vectorisers gather them
        rows.vectorize(rows.op.axis[-1])


def schedule_resize(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """``resize2d`` groups: the separable form as described above, anything else generically."""
    s = prepare(outs)
    vec = vector_elements(target)
    rows = next((st for st in s.stages if isinstance(st.op, te.ComputeOp) and st.op.tag == TAG_ROWS), None)
    out_st = [st for st in s.stages if st.is_output]
    if rows is None or len(out_st) != 1:
        return finalize(s, set(), vec)
    out = out_st[0]
    if readers_after_inline(s).get(id(rows.op), []) != [out] or len(out.op.axis) != 4 \
            or any(getattr(t, "dyn", None) for t in (*out.op.outputs, *rows.op.outputs)):
        return finalize(s, set(), vec)
    b, c, y, x = out.op.axis
    work = prod(iv.dom_extent for iv in out.op.axis)
    channels = b.dom_extent * c.dom_extent
    per_channel = channels >= MIN_CHANNEL_TASKS
    outer = out.fuse(b, c) if per_channel else out.fuse(b, c, y)
    # (a fused IterVar has no extent before lowering: count the iterations from the axes)
    if work >= PARALLEL_MIN and (channels if per_channel else channels * y.dom_extent) > 1:
        out.parallel(outer)
    if x.dom_extent <= WHOLE_ROW:
        out.vectorize(x)
    else:
        _, xi = out.split(x, factor=vec)
        out.vectorize(xi)
    if per_channel:
        rows.compute_at(out, outer)
        _rows_loops(rows, None)
    else:
        rb, rc, ry, _ = rows.op.axis
        rwork = prod(iv.dom_extent for iv in rows.op.axis)
        fused = rows.fuse(rb, rc, ry)
        _rows_loops(rows, fused if rwork >= PARALLEL_MIN and channels * ry.dom_extent > 1 else None)
    return finalize(s, {id(out.op), id(rows.op)}, vec)


register_schedule("resize2d", ["c", "llvm"], schedule_resize)
