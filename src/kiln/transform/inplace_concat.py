"""Concatenations written in place: which concat kernels need not exist.

A concatenation along an axis with only 1s before it (the channel concat of a batch-1 CNN,
blocked or not) lays its inputs out as contiguous byte ranges of its output. If every input is
written by a kernel straight into its range of the output's memory, the concatenation is
already done when its last input is: the group becomes a ``__concat`` node of the graph JSON,
which does nothing at run time, and no kernel is generated for it. DenseNet-121 has 58 such
concatenations (``c_k = concat(c_{k-1}, y_k)`` per layer, about 13% of its run time and a
quarter of its kernels); ShuffleNet and Inception-style blocks have them too.

The placement itself (which inputs go where, chains that share inputs) is
:func:`kiln.transform.memory_plan.place_concats`; the memory planner follows it with the same
function on entry ids, so what is decided here is what is planned there.

An input can move into its concatenation only when nothing else pins its memory: it must be
written by a kernel of this graph (not a graph input, param or constant), must not be a graph
output (the user may bind an output to their own buffer) or an alias of one, and must not be
itself an alias (``__nop``) of another value. Graphs with dynamic dimensions are left alone:
their padded layout leaves gaps between the pieces. Only CPU targets use it (device memory
views would need device-side offsets that not every runtime honours).
"""

from __future__ import annotations

import math

from ..ir import Value
from ..ir.ops.control import CONTROL_OPS
from .fuse import FusedGraph, FusedGroup
from .memory_plan import place_concats

__all__ = ["inplace_concat_groups", "concat_pieces"]


def concat_pieces(group: FusedGroup) -> list[Value] | None:
    """The inputs of ``group`` if it is a lone concatenation whose inputs are contiguous byte
    ranges of its output (only 1s before the axis, one dtype, static shapes); else None."""
    if group.is_nop or len(group.nodes) != 1 or group.nodes[0].op != "concatenate":
        return None
    node = group.nodes[0]
    out = node.outputs[0]
    ins = list(node.inputs)
    vals = ins + [out]
    if any(isinstance(d, str) for v in vals for d in v.type.dims):
        return None
    if len({v.dtype for v in vals}) != 1 or any(v.is_constant for v in ins):
        return None
    rank = len(out.shape)
    axis = int(node.attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank or math.prod(int(d) for d in out.shape[:axis]) != 1:
        return None
    return ins


def inplace_concat_groups(fused: FusedGraph) -> set[int]:
    """Indices (into ``fused.groups``) of the concatenations to write in place.

    Parameters
    ----------
    fused : FusedGraph
        The whole graph's groups in execution order.

    Returns
    -------
    set of int
    """
    graph = fused.graph
    if graph.dim_ranges:
        return set()
    alias_of: dict[Value, Value] = {}  # __nop output -> the value whose memory it is
    for g in fused.groups:
        if g.is_nop:
            src = g.inputs[0]
            alias_of[g.outputs[0]] = alias_of.get(src, src)
    pinned = {alias_of.get(v, v) for v in graph.outputs}
    written: set[Value] = set()  # values a kernel writes (or a concatenation produces)
    cands: list[tuple[int, Value, list[Value]]] = []
    for i, g in enumerate(fused.groups):
        if g.is_nop or any(n.op in CONTROL_OPS for n in g.nodes):
            continue  # the executor, not a kernel, writes a control-flow node's outputs
        pieces = concat_pieces(g)
        if pieces is not None:
            cands.append((i, g.outputs[0], pieces))
        written.update(g.outputs)
    if not cands:
        return set()

    def movable(v: Value) -> bool:
        return v in written and v not in pinned and v not in alias_of

    accepted, _ = place_concats([(out, ins) for _, out, ins in cands], lambda v: v.type.nbytes, movable)
    return {i for (i, _, _), ok in zip(cands, accepted) if ok}
