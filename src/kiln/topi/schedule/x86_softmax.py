"""CPU schedule of softmax / log_softmax along the last axis (the row form of
:func:`kiln.topi.nn.norm.softmax`); other forms get the generic schedule.

One parallel loop over rows; inside it, in order, every statistic stage and the row of
exponentials are ``compute_at`` the row, so a row is read from memory once, is then hot in L1
for the later passes, and the output is written once::

    for row in rows:                         # parallel
        max_part[l]  = max over blocks of x[b*L + l]        # L partials, vectorised over l
        max_tail     = max of the n % L tail elements       # scalar
        max          = tree of max over max_part[] and max_tail   # 4 levels for L = 16
        exp[k]       = exp(max(x[k] - max, -87.3))          # vectorised (vmath exp), scratch row
        sum_part[l], sum_tail, sum                          # as for max, over exp[]
        rcp          = 1 / sum                              # log_softmax: lse = log(sum)
        out[k]       = exp[k] * rcp * (exp[k] >= 1e-30)     # vectorised; log_softmax: x - max - lse

``L`` (two float32 vectors of the target) is fixed by the compute; the element loops are split
by :func:`~kiln.topi.schedule.generic.vector_elements` (also two vectors), their tails
guarded by the lowering.  The scratch row (at most
:data:`~kiln.topi.nn.norm.SOFTMAX_MAX_ROW` floats) lives on the stack of each task.  A 1-D
input is a single row: the same stages as root loop nests.

This module imports the computes' tags and the generic building blocks; it must not import
the graph IR or the code generators.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ..nn.norm import SOFTMAX_ROLE
from ..registry import register_schedule
from ..util import is_injective_stage, prod
from .generic import PARALLEL_MIN, finalize, schedule_injective, vector_elements

__all__ = ["schedule_softmax"]


def _role(st: te.Stage) -> str | None:
    attrs = getattr(st.op, "attrs", None) or {}
    return attrs.get(SOFTMAX_ROLE)


def schedule_softmax(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """softmax / log_softmax: the row form as described above, anything else generically."""
    s = te.create_schedule([o.op for o in outs])
    stages = [st for st in s.stages if _role(st) is not None]
    outs_st = [st for st in s.stages if st.is_output]
    if not stages or len(outs_st) != 1:
        # the three-stage form (other axes, long rows): the generic schedule
        return schedule_injective(outs, target)
    vec = vector_elements(target)
    out = outs_st[0]
    for st in s.stages:
        if isinstance(st.op, te.ComputeOp) and not st.is_output and is_injective_stage(st.op) \
                and _role(st) is None:
            st.compute_inline()
    axes = list(out.op.axis)
    # a 1-D input is one row: no row loop, every stage a root nest (inlining the row stages
    # instead would repeat the max tree and the exp per element)
    row = None if len(axes) == 1 else out.fuse(*axes[:-1]) if len(axes) > 2 else axes[0]
    if row is not None and prod(iv.dom_extent for iv in axes) >= PARALLEL_MIN \
            and prod(iv.dom_extent for iv in axes[:-1]) > 1:
        out.parallel(row)
    _, ki = out.split(axes[-1], factor=vec)
    out.vectorize(ki)
    handled = {id(out.op)}
    for st in stages:  # topological order: each stage after the ones it reads
        if row is not None:
            st.compute_at(out, row)
        role = _role(st)
        if role == "exp":
            _, ei = st.split(st.op.axis[-1], factor=vec)
            st.vectorize(ei)
        elif role is not None and role.endswith("_part"):
            # blocks outside, the partial accumulators (contiguous lanes) inside as one vector op
            lane = st.op.axis[-1]
            st.reorder(*st.op.reduce_axis, lane)
            st.vectorize(lane)
        handled.add(id(st.op))
    return finalize(s, handled, vec)


# generic: any CPU kind (GPU kinds prefer their own ``gpu`` schedules, and their computes are
# the three-stage form anyway)
register_schedule("softmax", "generic", schedule_softmax)
register_schedule("log_softmax", "generic", schedule_softmax)
