"""Text form of a graph (grammar in docs/ir.md)::

    def @main(%data: Tensor[(1, 3, 8, 8), float32], %"conv.w": Tensor[(4, 3, 3, 3), float32]) {
      %0 = conv2d(%data, %"conv.w", strides=(1, 1), padding=(1, 1, 1, 1), ...) : Tensor[...]
      %1 = relu(%0) : Tensor[(1, 4, 8, 8), float32]
      return %1
    }

A dynamic graph starts with its dim ranges, and its types show symbolic dims (the static upper
bounds follow from the ranges)::

    dim_ranges(batch=(1, 8), seq=(1, 512))
    def @main(%x: Tensor[(batch, seq, 384), float32]) {
      %0 = reshape(%x, newshape=(8, 512, 12, 32), alias=False) : Tensor[(batch, seq, 12, 32), float32]
      ...
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .graph import Graph, Node, Value

__all__ = ["astext", "constant_names", "format_attr"]

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _name(name: str) -> str:
    return "%" + name if _BARE.match(name) else "%" + json.dumps(name)


def constant_names(graph: Graph) -> dict[Node, str]:
    """The name under which each constant node's array is printed / looked up."""
    res: dict[Node, str] = {}
    used: set[str] = set()
    for i, node in enumerate(graph.nodes):
        if node.op != "constant":
            continue
        name = node.name
        if not name or name in used:
            name = f"const{i}"
            k = 0
            while name in used:
                k += 1
                name = f"const{i}_{k}"
        used.add(name)
        res[node] = name
    return res


def _scalar(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "True" if x else "False"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    f = float(x)
    if f != f:
        return "nan"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    s = str(x) if isinstance(x, np.generic) else repr(f)
    if not any(c in s for c in ".en"):
        s += ".0"
    return s


def format_attr(v: Any) -> str:
    """Format one attribute value (not constant arrays)."""
    if v is None:
        return "None"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple):
        if len(v) == 1:
            return "(" + format_attr(v[0]) + ",)"
        return "(" + ", ".join(format_attr(x) for x in v) + ")"
    return _scalar(v)


def _format_array(arr: np.ndarray) -> str:
    flat = arr.reshape(-1)
    return "[" + ", ".join(_scalar(x) for x in flat) + "]"


def _type_str(node: Node) -> str:
    if len(node.outputs) == 1:
        return str(node.outputs[0].type)
    return "(" + ", ".join(str(v.type) for v in node.outputs) + ")"


def astext(graph: Graph, inline_limit: int = 16, show_names: bool = False) -> str:
    """Render ``graph`` as text.

    Parameters
    ----------
    graph : Graph
    inline_limit : int
        Constants with at most this many elements are printed inline; larger ones as
        ``meta["name"]`` (see :meth:`Graph.constants` for the arrays).
    show_names : bool
        Append each node's source name as a ``# comment``.

    Returns
    -------
    str
    """
    names: dict[Value, str] = {}
    for v in graph.inputs:
        names[v] = _name(v.name or f"in{len(names)}")
    cnames = constant_names(graph)
    params = ", ".join(f"{names[v]}: {v.type}" for v in graph.inputs)
    lines = [f"def @{graph.name}({params}) {{"]
    if graph.dim_ranges:
        # a data-dependent dim (a kernel decides it) is marked "data"
        mark = {k: ', "data"' for k in graph.data_dims}
        ranges = ", ".join(f"{k}=({lo}, {hi}{mark.get(k, '')})" for k, (lo, hi) in graph.dim_ranges.items())
        lines.insert(0, f"dim_ranges({ranges})")
    for i, node in enumerate(graph.nodes):
        ident = f"%{i}"
        if len(node.outputs) == 1:
            names[node.outputs[0]] = ident
        else:
            for v in node.outputs:
                names[v] = f"{ident}.{v.index}"
        args = [names.get(v, "%<undefined>") for v in node.inputs]
        for key, val in node.attrs.items():
            if node.op == "constant" and key == "value":
                if val.size <= inline_limit:
                    args.append(f"value={_format_array(val)}")
                else:
                    args.append(f"value=meta[{json.dumps(cnames[node])}]")
            elif val is None and node.opdef.attrs.get(key, ("", 0))[0] == "dims":
                continue  # an unset symbolic target (static graphs print as before)
            else:
                args.append(f"{key}={format_attr(val)}")
        line = f"  {ident} = {node.op}({', '.join(args)}) : {_type_str(node)}"
        if show_names and node.name:
            line += f"  # {node.name}"
        lines.append(line)
    outs = [names.get(v, "%<undefined>") for v in graph.outputs]
    lines.append("  return " + (outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"))
    lines.append("}")
    return "\n".join(lines)
