"""Symbolic dims needed as tensor data (``x / x.shape[0]``, a Range over a symbolic length):
one place for both frontends.

A value's symbolic dim is known to its kernels only through the DLTensor shapes of their
arguments, so a dim used as *data* is computed by a ``dim_value`` node whose inputs carry
the dim's symbols as plain dims (a graph input, or the output of the op that decided a
data-dependent dim). Its kernel reads only their extents.
"""

from __future__ import annotations

from ..ir import Graph, Value
from ..ir.ops.dynamic import dim_value_attrs
from ..runtime import sym
from ..runtime.errors import InputError

__all__ = ["dim_value", "carrier"]


def carrier(graph: Graph, name: str) -> Value:
    """A value of ``graph`` that has the symbol ``name`` as a plain dim: an input if one has it,
    else the first node output that does.

    Raises
    ------
    InputError
        No value carries it.
    """
    for v in graph.inputs:
        if name in v.type.dims:
            return v
    for n in graph.nodes:
        for v in n.outputs:
            if name in v.type.dims:
                return v
    raise InputError(f"no value of the graph has the dimension {name!r}, so its value cannot be computed")


def dim_value(graph: Graph, d: str) -> Value:
    """An int64 ``(1,)`` value holding the run-time value of the symbolic dim ``d``."""
    carriers: list[Value] = []
    for s in sorted(sym.symbols(d)):
        c = carrier(graph, s)
        if c not in carriers:
            carriers.append(c)
    attrs = dim_value_attrs([c.type for c in carriers], d)
    return graph.add_node("dim_value", carriers, attrs)[0]
