"""PackDenseWeights: a dense's constant weight re-stored once, at build time, as the panels its
kernel reads.

The CPU dense kernel reads its weight ``(N, K)`` through ``(ceil(N / bn), K, bn)`` panels
(:mod:`kiln.topi.nn.dense`); the kernel builds them on every call, one copy of the whole
weight (a ``[64, 1024] x [1024, 256]`` dense ran at 82 GFLOP/s with the copy, 98–100 without:
``bench/RESULTS.md``, "Dense weights", Zen 3, 1 thread).
For a constant weight this pass stores the panels instead, as a new constant, and marks the
dense with ``units = N``: the kernel then has no pack stage. Whether and how wide to pack is
:func:`kiln.topi.nn.dense.dense_panels` of the build's target — the rule the kernel itself
follows, a tuning log's panel width included — so the pass and an unpacked kernel never
disagree. A weight shared by several denses is packed once. GPU builds skip the pass (their
schedules read ``(N, K)``), as does the tuner, whose panel-width knob needs the unpacked form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, Value, dead_code_elimination, rewrite
from ..topi.knobs import kernel_target
from ..topi.nn.dense import dense_panels, pack_dense_weight
from .pipeline import Pass

__all__ = ["pack_dense_weights", "PackDenseWeights"]


def pack_dense_weights(graph: Graph, target: Any = None) -> Graph:
    """Re-store the constant weights of ``graph``'s denses as kernel panels (module docstring).

    Parameters
    ----------
    graph : Graph
        A typed graph with params bound as constants.
    target : Target or str, optional
        The CPU target the kernels are built for (its ISA sets the panel width; default: the
        schedules' no-target ISA).

    Returns
    -------
    Graph
        The rewritten graph (the input itself when no dense has a constant weight to pack).
    """
    if not any(n.op == "dense" and not n.attrs.get("units") and n.inputs[1].const_value is not None
               for n in graph.nodes):
        return graph
    packed: dict[tuple[int, int], Value] = {}

    def visit(g: Graph, node: Node, ins: list[Value]) -> Value | None:
        if node.op != "dense" or node.attrs.get("units"):
            return None
        data, weight = node.inputs
        arr = weight.const_value
        if arr is None or data.dtype != weight.dtype:
            return None
        bn = dense_panels(data.shape, weight.shape, data.dtype)
        if not bn:
            return None
        key = (id(weight), bn)  # a shared weight is packed once
        if key not in packed:
            # named after the weight, so a library's params still say where they came from
            name = f"{weight.name}.panels{bn}" if weight.name else None
            packed[key] = g.add_constant(pack_dense_weight(np.asarray(arr), bn), name=name)
        return g.add("dense", ins[0], packed[key], name=node.name, units=int(weight.shape[0]))

    with kernel_target(target):
        return dead_code_elimination(rewrite(graph, visit))


def PackDenseWeights(target: Any = None) -> Pass:  # noqa: N802 - pass constructor, TVM style
    """:func:`pack_dense_weights` for ``target`` as a pass (``opt_level`` 3; disable by name
    ``PackDenseWeights``)."""
    return Pass(lambda graph: pack_dense_weights(graph, target), "PackDenseWeights", opt_level=3)
