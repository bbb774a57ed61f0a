"""Reference interpreter: runs a graph with the NumPy ``ref`` of every op.

Slow but simple; it is the oracle the compiler tests compare kernels and passes against.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..runtime import sym
from ..runtime.errors import InputError, KilnError
from .graph import Graph, Value
from .op import get_op
from .types import np_dtype

__all__ = ["evaluate"]


def _as_array(name: str, v: Value, x: Any) -> np.ndarray:
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    arr = np.asarray(x)
    want = np_dtype(v.dtype)
    if arr.dtype != want:
        # Python scalars / lists arrive with default dtypes; accept lossless-enough casts.
        if isinstance(x, np.ndarray):
            raise InputError(f"input {name!r} must have dtype {v.dtype}, got {arr.dtype}")
        arr = arr.astype(want)
    if arr.shape != v.shape and not _fits(arr.shape, v.type):
        raise InputError(f"input {name!r} must have shape {v.type.dims}, got {arr.shape}")
    return arr


def evaluate(graph: Graph, inputs: Mapping[str, Any] | Sequence[Any] | None = None,
             params: Mapping[str, Any] | None = None) -> list[np.ndarray]:
    """Run ``graph`` on NumPy arrays using the op reference implementations.

    Parameters
    ----------
    graph : Graph
    inputs : dict or sequence
        Input arrays by name, or positionally for the leading graph inputs.
    params : dict, optional
        More named arrays (parameters), merged with ``inputs``.

    Returns
    -------
    list of numpy.ndarray
        One array per graph output.

    Raises
    ------
    InputError
        Missing, unknown, or mistyped inputs.
    """
    named: dict[str, Any] = {}
    if isinstance(inputs, Mapping):
        named.update(inputs)
    elif inputs is not None:
        inputs = list(inputs)
        if len(inputs) > len(graph.inputs):
            raise InputError(f"got {len(inputs)} positional inputs, graph has "
                             f"{len(graph.inputs)}")
        for v, x in zip(graph.inputs, inputs):
            named[v.name] = x
    if params:
        named.update(params)
    known = {v.name for v in graph.inputs}
    unknown = sorted(set(named) - known)
    if unknown:
        raise InputError(f"unknown input name(s) {unknown}; graph inputs: {sorted(known)}")
    env: dict[Value, np.ndarray] = {}
    missing = [v.name for v in graph.inputs if v.name not in named]
    if missing:
        raise InputError(f"missing value for graph input(s) {missing}")
    dims: dict[str, int] = {}  # symbol -> actual extent, read off the inputs (and data-dependent outputs)
    for v in graph.inputs:
        env[v] = _as_array(v.name, v, named[v.name])
        _bind_dims(dims, v, env[v].shape)
    # Free intermediates after their last use to keep memory bounded on real models.
    last_use: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[v] = i
    keep = set(graph.outputs)
    for i, node in enumerate(graph.nodes):
        args = [env[v] for v in node.inputs]
        try:
            outs = get_op(node.op).ref(args, _actual_attrs(node.attrs, dims))
        except KilnError:
            raise
        except Exception as exc:  # an op reference failed: say which node
            raise KilnError(f"evaluating {node.op} node {node.name!r} failed: {exc}") from exc
        for v, arr in zip(node.outputs, outs):
            arr = np.asarray(arr)
            want = np_dtype(v.dtype)
            if arr.dtype != want:
                arr = arr.astype(want)
            if arr.shape != v.shape and not _fits(arr.shape, v.type):
                raise KilnError(f"{node.op} node {node.name!r}: reference produced shape "
                                f"{arr.shape}, type says {v.shape}")
            env[v] = arr
            _bind_dims(dims, v, arr.shape)
        for v in node.inputs:
            if last_use.get(v) == i and v not in keep and v.node is not None:
                env.pop(v, None)
    return [env[v] for v in graph.outputs]


def _fits(shape: tuple[int, ...], t: Any) -> bool:
    """Whether an actual ``shape`` fits a dynamic type: static dims equal, symbolic ones at most
    their upper bound (a data-dependent output, or a graph evaluated at a smaller input)."""
    if t.sym is None or len(shape) != t.ndim:
        return False
    return all(a == m if d is None else 0 <= a <= m for a, m, d in zip(shape, t.shape, t.sym))


def _bind_dims(dims: dict[str, int], v: Value, shape: tuple[int, ...]) -> None:
    """Record the actual extent of every plain symbol among ``v``'s dims."""
    if v.type.sym is None:
        return
    for d, a in zip(v.type.sym, shape):
        if isinstance(d, str) and d.isidentifier():
            dims.setdefault(d, int(a))


#: Symbolic attribute -> the attributes holding its static form (upper bounds).
_SYM_ATTRS = {"sym_shape": ("newshape", "shape"), "sym_size": ("size",)}


def _actual_attrs(attrs: Mapping[str, Any], dims: Mapping[str, int]) -> Mapping[str, Any]:
    """``attrs`` with a reshape / broadcast / resize target evaluated at the actual symbol
    values, so a dynamic graph evaluated at a smaller input gets the smaller shape, not the
    upper bound."""
    if not dims:
        return attrs
    for sym_key, keys in _SYM_ATTRS.items():
        target = attrs.get(sym_key)
        key = next((k for k in keys if k in attrs), None)
        if not target or key is None:
            continue
        try:
            actual = [d if isinstance(d, int) else sym.evaluate(d, dims) for d in target]
        except Exception:  # noqa: BLE001 - a symbol not bound here: keep the static target
            return attrs
        return {**attrs, key: tuple(actual)}
    return attrs
