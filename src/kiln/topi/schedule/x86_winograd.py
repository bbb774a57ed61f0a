"""CPU schedules of the Winograd F(2x2, 3x3) transforms (:mod:`kiln.topi.nn.winograd`).

Both transforms are memory-bound: a few vector adds per value moved.  Their loops:

* input transform ``V[p, t, c]``: ``for t (parallel): for c_block: for p (unrolled): for lane
  (vector)``: one tile's 16 input vectors per channel block are loaded once and its 16
  coefficients, each four adds, are stored to the 16 ``p`` planes.  The zero-padded copy of
  the data is a root stage (a parallel blocked copy; over a dynamic H / W, a parallel loop
  over rows and a column loop that stop at the runtime extents).
* output transform ``out[n, kb, y, x, kc]`` (with its fused epilogue): ``for (n, kb, y/2)
  (parallel): for x/2: for y%2, x%2 (unrolled): for kc (vector)``: one tile's 2x2 outputs
  read its 16 ``M`` vectors.  An odd ``OH`` / ``OW`` leaves a guarded half tile.

Unrolling the coefficient loops turns the compute's select chains into constants, so each
stored vector is exactly its few adds.  This module imports the computes' tags and the generic
building blocks; it must not import the graph IR or the code generators.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ...te.dynamic import PADDED_EXTENTS
from ..nn.winograd import TAG_WINOGRAD_IN, TAG_WINOGRAD_OUT, TAG_WINOGRAD_PAD
from ..registry import get_schedule, register_schedule
from ..util import prod
from .generic import PARALLEL_MIN, finalize, prepare, vector_elements
from .x86 import _find

__all__ = ["schedule_winograd_input", "schedule_winograd_output", "schedule_winograd_matmul"]


def _lane_split(st: te.Stage, axis: te.IterVar, lanes: int) -> tuple[te.IterVar, te.IterVar]:
    """Split a channel axis into (blocks, lanes) when ``lanes`` divides it, else keep it whole."""
    ext = int(axis.dom_extent)
    if ext % lanes == 0 and ext > lanes:
        return st.split(axis, factor=lanes)
    return st.split(axis, factor=ext)


def schedule_winograd_input(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """``winograd_input_transform``: tiles in parallel, the channel block vectorised."""
    s = prepare(outs)
    vec = vector_elements(target)
    st = _find(s, (TAG_WINOGRAD_IN,))
    handled: set[int] = set()
    if st is not None and st.is_output:
        p, t, c = st.op.axis
        # the data block (the compute's ``c // ib``) is the vector: its lane index stays affine
        co, ci = _lane_split(st, c, _data_block(st) or vec)
        st.reorder(t, co, p, ci)
        st.unroll(p)
        st.vectorize(ci)
        if prod(iv.dom_extent for iv in st.op.axis) >= PARALLEL_MIN and int(t.dom_extent) > 1:
            st.parallel(t)
        handled.add(id(st.op))
        pad = _find(s, (TAG_WINOGRAD_PAD,))
        if pad is not None and pad.attach_type == "root" and (pad.op.attrs or {}).get(PADDED_EXTENTS):
            _schedule_dynamic_pad(pad)
            handled.add(id(pad.op))
    return finalize(s, handled, vec)


def _schedule_dynamic_pad(st: te.Stage) -> None:
    """The padded copy of a dynamic H / W: the columns a loop of their own, so that the copy's
    runtime extent bounds it and the rows past theirs cost one test each, instead of one test
    per pixel of the upper-bound image in one fused loop (ResNet-18's input transforms took
    1.5x their static time at 96x96 with a 224x224 bound)."""
    n, cb, y, _, lane = st.op.axis
    outer = st.fuse(n, cb, y)
    st.vectorize(lane)
    if prod(iv.dom_extent for iv in st.op.axis) >= PARALLEL_MIN:
        st.parallel(outer)


def _data_block(st: te.Stage) -> int:
    """Channel block ``ib`` of the transform's (padded) data input."""
    shapes = [t.shape for t in st.op.input_tensors if len(t.shape) == 5]
    return int(shapes[0][4]) if shapes else 0


def schedule_winograd_output(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """``winograd_output_transform`` and its fused elementwise epilogue, one 2x2 tile per step."""
    s = prepare(outs)
    vec = vector_elements(target)
    anchor = _find(s, (TAG_WINOGRAD_OUT,))
    out_st = [st for st in s.stages if st.is_output]
    handled: set[int] = set()
    if anchor is not None and len(out_st) == 1 and tuple(out_st[0].op.output(0).shape) == \
            tuple(anchor.op.output(0).shape) and not out_st[0].op.reduce_axis:
        out = out_st[0]
        if out is not anchor:
            anchor.compute_inline()  # the epilogue reads each transformed value once
        n, kb, y, x, kc = out.op.axis
        yo, yi = out.split(y, factor=2)
        xo, xi = out.split(x, factor=2)
        out.reorder(n, kb, yo, xo, yi, xi, kc)
        outer = out.fuse(n, kb, yo)
        out.unroll(yi)
        out.unroll(xi)
        out.vectorize(kc)
        if prod(iv.dom_extent for iv in out.op.axis) >= PARALLEL_MIN:
            out.parallel(outer)
        handled.update({id(out.op), id(anchor.op)})
    return finalize(s, handled, vec)


def schedule_winograd_matmul(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """``winograd_matmul``: a packed matmul whose panels were made at build time, so the
    target's ``matmul`` schedule (looked up when called: one GEMM schedule, not a copy)."""
    return get_schedule("matmul", None, target)(list(outs), target)


register_schedule("winograd_input_transform", ["c", "llvm"], schedule_winograd_input)
register_schedule("winograd_matmul", ["generic", "c", "llvm"], schedule_winograd_matmul)
register_schedule("winograd_output_transform", ["c", "llvm"], schedule_winograd_output)
