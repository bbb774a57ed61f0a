"""Constant folding and parameter binding."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..ir import Graph, Value, get_op, rewrite
from ..ir.graph import _copy_node
from ..ir.types import np_dtype
from ..runtime.errors import InputError
from .pipeline import Pass

__all__ = ["fold_constant", "FoldConstant", "bind_params", "BindParams", "DEFAULT_FOLD_LIMIT"]

#: Folding never creates a constant larger than this many bytes unless the result is no larger
#: than the node's constant inputs (so a broadcast of a scalar to a huge shape stays an op).
DEFAULT_FOLD_LIMIT = 1 << 20


def fold_constant(graph: Graph, max_bytes: int = DEFAULT_FOLD_LIMIT,
                  skip_ops: frozenset[str] | set[str] = frozenset()) -> Graph:
    """Evaluate every node whose inputs are all constants with the op's NumPy reference.

    Parameters
    ----------
    graph : Graph
    max_bytes : int
        Size limit for new constants (see :data:`DEFAULT_FOLD_LIMIT`).
    skip_ops : set of str
        Ops never folded.

    Returns
    -------
    Graph
        New graph; constants made dead by folding are removed.
    """
    from .simplify import dead_code_elimination

    changed = False

    def visit(g: Graph, node, ins: list[Value]):
        nonlocal changed
        if node.op == "constant" or not ins or node.op in skip_ops:
            return None
        if not all(v.is_constant for v in ins):
            return None
        if any(v.type.is_dynamic for v in node.outputs):
            return None  # a constant has no symbolic dims (broadcast_to with sym_shape)
        out_bytes = sum(v.type.nbytes for v in node.outputs)
        in_bytes = sum(v.type.nbytes for v in ins)
        if out_bytes > max(max_bytes, in_bytes):
            return None
        outs = get_op(node.op).ref([v.const_value for v in ins], node.attrs)
        changed = True
        res = []
        for old, arr in zip(node.outputs, outs):
            arr = np.asarray(arr).astype(np_dtype(old.dtype), copy=False).reshape(old.shape)
            res.append(g.add_constant(arr, name=None))
        return res

    new = rewrite(graph, visit)
    return dead_code_elimination(new) if changed else new


def FoldConstant(max_bytes: int = DEFAULT_FOLD_LIMIT) -> Pass:  # noqa: N802
    """The :func:`fold_constant` pass (opt level 2)."""
    return Pass(lambda g: fold_constant(g, max_bytes), "FoldConstant", 2)


def bind_params(graph: Graph, params: Mapping[str, Any], strict: bool = True) -> Graph:
    """Turn the graph inputs named in ``params`` into constants.

    Parameters
    ----------
    graph : Graph
    params : dict of str to array
        Arrays (NumPy or anything with ``.numpy()``) with exactly the input's shape and dtype.
    strict : bool
        Raise for names that are not graph inputs (otherwise ignore them).

    Raises
    ------
    InputError
        Unknown name (strict) or shape / dtype mismatch.
    """
    names = set(graph.input_names)
    unknown = sorted(set(params) - names)
    if unknown and strict:
        raise InputError(f"bind_params: {unknown} are not graph inputs; inputs: "
                         f"{graph.input_names}")
    new = Graph(graph.name)
    new.copy_dims(graph)
    vmap: dict[Value, Value] = {}
    for v in graph.inputs:
        if v.name in params:
            arr = params[v.name]
            if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray):
                arr = arr.numpy()
            arr = np.asarray(arr)
            if arr.shape != v.shape or arr.dtype != np_dtype(v.dtype):
                raise InputError(f"param {v.name!r} is {arr.shape} {arr.dtype}, graph expects "
                                 f"{v.type}")
            c = new.add_constant(arr, name=v.name)
            c.name = v.name
            vmap[v] = c
        else:
            nv = Value(v.type, None, 0, v.name)
            new.inputs.append(nv)
            vmap[v] = nv
    for node in graph.nodes:
        outs = _copy_node(new, node, [vmap[x] for x in node.inputs])
        for a, b in zip(node.outputs, outs):
            vmap[a] = b
    new.outputs = [vmap[v] for v in graph.outputs]
    return new


def BindParams(params: Mapping[str, Any]) -> Pass:  # noqa: N802
    """The :func:`bind_params` pass (required)."""
    return Pass(lambda g: bind_params(g, params, strict=False), "BindParams", 0, required=True)
