"""InferType: re-run every op's type relation (after attributes were edited in place, or to
validate a hand-built graph)."""

from __future__ import annotations

from ..ir import Graph, rewrite
from .pipeline import Pass

__all__ = ["infer_type", "InferType"]


def infer_type(graph: Graph) -> Graph:
    """Return a copy of ``graph`` with every node re-validated and its output types re-inferred.

    Raises
    ------
    InputError
        A node's attributes or input types are invalid (the message names the node).
    """
    return rewrite(graph, lambda g, node, ins: g.add_node(
        node.op, ins, node.attrs, name=node.name, output_names=[v.name for v in node.outputs]))


def InferType() -> Pass:  # noqa: N802  (TVM-style pass constructor)
    """The :func:`infer_type` pass (required: runs at every opt level)."""
    return Pass(infer_type, "InferType", 0, required=True)
