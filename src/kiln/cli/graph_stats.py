"""Numbers the ``kiln`` subcommands read off a compiled graph: kernel calls and the memory plan.

Owns :class:`GraphStats` and the one text form of a memory plan that ``build``, ``inspect``
and ``inspect --plan`` print. Reads the graph through :mod:`kiln.runtime.graph_json` (which
validates it and knows every entry's byte size); runtime only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .fmt import fmt_bytes

__all__ = ["GraphStats", "graph_json_stats", "memory_text"]


@dataclass
class GraphStats:
    """Numbers read off a graph JSON (the executor's view of a compiled model).

    ``planned_bytes`` sums the storages that only activations use (the plan's peak activation
    memory); ``no_reuse_bytes`` is what one buffer per kernel output would need (``__nop``
    aliases excluded); ``fixed_bytes`` are the input and param storages. ``nop_calls`` counts
    the nodes that do no work: ``__nop`` aliases and concatenations written in place
    (``__concat``).
    """

    num_nodes: int
    num_inputs: int
    num_params: int
    kernel_calls: int
    unique_functions: int
    nop_calls: int
    copy_calls: int
    planned_bytes: int
    no_reuse_bytes: int
    fixed_bytes: int
    num_storages: int
    func_counts: dict[str, int]

    def memory(self) -> dict[str, int]:
        """The memory plan as the JSON summaries write it (the keys :func:`memory_text` reads)."""
        return {"num_storages": self.num_storages, "planned_bytes": self.planned_bytes,
                "no_reuse_bytes": self.no_reuse_bytes, "fixed_bytes": self.fixed_bytes}


def graph_json_stats(graph_json: Any, param_names: Sequence[str] = ()) -> GraphStats:
    """Kernel counts and the memory plan of a graph JSON.

    Parameters
    ----------
    graph_json : str, dict or kiln.runtime.graph_json.Graph
        The graph, as text, as parsed JSON or already loaded.
    param_names : sequence of str
        Names of the graph's params (the other argument nodes are its inputs).

    Raises
    ------
    FormatError
        If the graph JSON is malformed (see :func:`kiln.runtime.graph_json.load_graph_json`).
    """
    from ..runtime.graph_json import Graph, load_graph_json

    g = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
    arg_entries = {g.entry_id(n) for n in g.arg_nodes}
    arg_names = {g.nodes[n].name for n in g.arg_nodes}
    nparams = len(set(param_names) & arg_names)
    sizes: dict[int, int] = {}
    for e in range(g.num_entries):
        sid = g.storage_id[e]
        sizes[sid] = max(sizes.get(sid, 0), g.entry_offset(e) + g.entry_bytes(e))
    fixed_sids = {g.storage_id[e] for e in arg_entries}
    func_counts: dict[str, int] = {}
    no_reuse = nop = copy = 0
    for nid, node in enumerate(g.nodes):
        if not node.is_op:
            continue
        if node.func_name in ("__nop", "__concat"):  # no work: an alias, or a concat written in place
            nop += 1
            continue
        if node.func_name == "__copy":
            copy += 1
        else:
            func_counts[node.func_name] = func_counts.get(node.func_name, 0) + 1
        no_reuse += sum(g.entry_bytes(e) for e in g.node_entries(nid))
    return GraphStats(
        num_nodes=len(g.nodes),
        num_inputs=len(g.arg_nodes) - nparams,
        num_params=nparams,
        kernel_calls=sum(func_counts.values()),
        unique_functions=len(func_counts),
        nop_calls=nop,
        copy_calls=copy,
        planned_bytes=sum(s for sid, s in sizes.items() if sid not in fixed_sids),
        no_reuse_bytes=no_reuse,
        fixed_bytes=sum(sizes[s] for s in fixed_sids),
        num_storages=len(sizes),
        func_counts=func_counts,
    )


def memory_text(mem: Mapping[str, int]) -> str:
    """``activations 1.2 MiB planned vs 3.4 MiB without reuse (65% saved); inputs+params 5.6 MiB``.

    ``mem`` holds ``planned_bytes``, ``no_reuse_bytes`` and ``fixed_bytes``
    (:meth:`GraphStats.memory`, or the driver's own memory plan).
    """
    planned, no_reuse = mem["planned_bytes"], mem["no_reuse_bytes"]
    saved = 0.0 if not no_reuse else 100.0 * (1 - planned / no_reuse)
    return (f"activations {fmt_bytes(planned)} planned vs {fmt_bytes(no_reuse)} without reuse "
            f"({saved:.0f}% saved); inputs+params {fmt_bytes(mem['fixed_bytes'])}")
