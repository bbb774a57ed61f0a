"""IR ops: control flow whose decision is only known at run time (``if``, ``loop``).

Such an op holds whole IR graphs as attributes (:class:`Subgraph`): its branches or its body.
Every value a subgraph reads from outside is an explicit input of the node and an input of
the subgraph (in the same order), so passes can treat the node as one OPAQUE op and never
look inside; the driver compiles each subgraph with the same pipeline into kernels of the
same library, and the graph executor runs it (``docs/graph_json_format.md``, "Control flow").

This module must not import the compiler (topi, driver) or the runtime executor.

* ``if(cond, *captured)``: ``cond`` a one-element bool tensor; ``then_branch`` and
  ``else_branch`` take the captured values and give the results (equal types in both).
* ``loop(max_trip, cond, *carried, *captured)``: ONNX ``Loop``; ``body`` takes
  ``(iteration int64 scalar, cond bool scalar, *carried, *captured)`` and gives
  ``(cond, *carried, *scan)``; runs while ``iteration < max_trip`` and ``cond``. The results are
  the last carried values, then (``num_scan > 0``) each scan value stacked over the iterations:
  ``[T, *scan_shape]`` where the iteration count ``T`` is the data-dependent symbol ``out_dim``
  (range ``0..max_iterations``, the bound the storage is planned for; the executor reports the
  actual count like a data-dependent kernel does, ``docs/dynamic_shapes.md``).

Symbolic dims: a subgraph's inputs have exactly the types of what the node passes, symbolic dims
included, and the subgraph declares the enclosing graph's symbols (same names and ranges), so a
branch or body runs at whatever the symbols' values are when the node runs. Types compare their
canonical dims: the two branches' outputs, and a carried value and its next value, must agree
symbol for symbol. A scan value may have symbolic dims too; its stacked output is
``[T, *scan_dims]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime import sym
from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..sym_rules import sym_rule
from ..types import TensorType, np_dtype
from ._util import Attrs

__all__ = ["Subgraph", "CONTROL_OPS"]

#: Ops run by the executor itself (a reserved graph-JSON function each), never lowered to a kernel.
CONTROL_OPS = {"if": "__if", "loop": "__loop"}


class Subgraph(str):
    """An IR graph held as an op attribute (a branch of ``if``, the body of ``loop``).

    A ``str`` whose text is ``<graph NAME>``: every attribute printer, hasher and comparer
    treats it as an opaque token. Equality and hashing are by identity, so CSE merges two
    nodes only when they hold the very same graph, and a rewritten copy of a node (which
    keeps its attribute objects) stays structurally equal to the original. The text form
    does not parse back into a graph.

    Parameters
    ----------
    graph : Graph
    """

    graph: Any

    def __new__(cls, graph: Any) -> "Subgraph":
        obj = super().__new__(cls, f"<graph {graph.name}>")
        obj.graph = graph
        return obj

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return id(self)

    def __reduce__(self) -> Any:
        return (Subgraph, (self.graph,))


def _subgraph(attrs: Attrs, key: str) -> Any:
    sub = attrs[key]
    if not isinstance(sub, Subgraph):
        raise InputError(f"attribute {key!r} must be a kiln.ir.ops.control.Subgraph (an IR graph), "
                         f"got {type(sub).__name__}")
    return sub.graph


def _check_inputs(g: Any, ts: list[TensorType], what: str) -> None:
    if len(g.inputs) != len(ts):
        raise InputError(f"{what} takes {len(g.inputs)} inputs, the node passes {len(ts)}")
    for k, (v, t) in enumerate(zip(g.inputs, ts)):
        if v.type != t:
            raise InputError(f"{what} input {k} ({v.name!r}) is {v.type}, the node passes {t}")


def _scalar_of(t: TensorType, dtypes: tuple[str, ...], what: str) -> None:
    if t.size != 1 or t.dtype not in dtypes or t.is_dynamic:
        raise InputError(f"{what} must be a one-element {' or '.join(dtypes)} tensor, got {t}")


# ----------------------------------------------------------------------------- if
def _if_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    _scalar_of(ts[0], ("bool",), "cond")
    then_g, else_g = _subgraph(attrs, "then_branch"), _subgraph(attrs, "else_branch")
    _check_inputs(then_g, ts[1:], "then_branch")
    _check_inputs(else_g, ts[1:], "else_branch")
    a = [v.type for v in then_g.outputs]
    b = [v.type for v in else_g.outputs]
    if a != b:
        raise InputError(f"the branches give different output types: then {[str(t) for t in a]}, "
                         f"else {[str(t) for t in b]}")
    if not a:
        raise InputError("the branches give no outputs")
    return list(a)


def _if_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    from ..interpreter import evaluate

    g = _subgraph(attrs, "then_branch" if bool(np.asarray(xs[0]).reshape(-1)[0]) else "else_branch")
    return evaluate(g, list(xs[1:]))


register_op(
    "if",
    attrs={"then_branch": ("any", REQUIRED), "else_branch": ("any", REQUIRED)},
    type_rel=_if_rel, pattern=OpPattern.OPAQUE, ref=_if_ref, num_inputs=(1, None), num_outputs=None,
    inputs=("cond", "*captured"),
    doc="runtime If: runs then_branch or else_branch (IR graphs taking the captured inputs) "
        "by the one-element bool cond; run by the executor (`__if`), not a kernel",
)


# ----------------------------------------------------------------------------- loop
def _loop_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    _scalar_of(ts[0], ("int64",), "max_trip")
    _scalar_of(ts[1], ("bool",), "cond")
    body = _subgraph(attrs, "body")
    n, n_scan = attrs["num_carried"], attrs["num_scan"]
    if not 0 <= n <= len(ts) - 2:
        raise InputError(f"num_carried={n} with {len(ts) - 2} inputs after max_trip and cond")
    if n_scan < 0:
        raise InputError(f"num_scan must be >= 0, got {n_scan}")
    _check_inputs(body, [TensorType((), "int64"), TensorType((), "bool")] + ts[2:], "body")
    outs = [v.type for v in body.outputs]
    if len(outs) != 1 + n + n_scan:
        raise InputError(f"body gives {len(outs)} outputs, expected cond + {n} carried + {n_scan} scan values")
    _scalar_of(outs[0], ("bool",), "the body's cond output")
    for k, (o, t) in enumerate(zip(outs[1:], ts[2: 2 + n])):
        if o != t:
            raise InputError(f"carried value {k} is {t} but the body gives {o}")
    if n + n_scan == 0:
        raise InputError("a loop without carried values or scan outputs computes nothing")
    scans: list[TensorType] = []
    if n_scan:
        d, hi = _scan_dim(attrs)
        for o in outs[1 + n:]:
            scans.append(TensorType((hi,) + o.shape, o.dtype, (d,) + (o.sym or (None,) * o.ndim)))
    return list(ts[2: 2 + n]) + scans


def _scan_dim(attrs: Attrs) -> tuple[str, int]:
    """The data-dependent symbol counting the iterations, and its upper bound."""
    d, hi = attrs["out_dim"], attrs["max_iterations"]
    if not isinstance(d, str) or not sym.is_symbolic(d) or sym.canonical(d) != d:
        raise InputError(f"out_dim must name a data-dependent symbol (the iteration count), got {d!r}")
    if not isinstance(hi, int) or hi < 0:
        raise InputError(f"max_iterations must be a non-negative int (the bound of {d!r}), got {hi!r}")
    return d, hi


def _loop_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    from ..interpreter import evaluate

    body, n, n_scan = _subgraph(attrs, "body"), attrs["num_carried"], attrs["num_scan"]
    trip = int(np.asarray(xs[0]).reshape(-1)[0])
    cond = bool(np.asarray(xs[1]).reshape(-1)[0])
    carried, captured = list(xs[2: 2 + n]), list(xs[2 + n:])
    rows: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
    it = 0
    while cond and it < trip:
        if n_scan and it >= attrs["max_iterations"]:
            raise InputError(f"the loop runs more than max_iterations={attrs['max_iterations']} iterations, "
                             f"the bound of its scan outputs' length {attrs['out_dim']!r}")
        outs = evaluate(body, [np.array(it, np.int64), np.array(cond)] + carried + captured)
        cond = bool(np.asarray(outs[0]).reshape(-1)[0])
        carried = list(outs[1: 1 + n])
        for k, v in enumerate(outs[1 + n:]):
            rows[k].append(np.asarray(v))
        it += 1
    scans = [np.stack(r) if r else np.zeros((0,) + v.shape, np_dtype(v.dtype))
             for r, v in zip(rows, body.outputs[1 + n:])]
    return carried + scans


register_op(
    "loop",
    attrs={"body": ("any", REQUIRED), "num_carried": ("int", REQUIRED), "num_scan": ("int", 0),
           "out_dim": ("str", ""), "max_iterations": ("int", 0)},
    type_rel=_loop_rel, pattern=OpPattern.OPAQUE, ref=_loop_ref, num_inputs=(2, None), num_outputs=None,
    inputs=("max_trip", "cond", "*carried", "*captured"),
    doc="runtime Loop: runs body (iteration, cond, *carried, *captured) -> (cond, *carried, *scan) while "
        "iteration < max_trip and cond; gives the last carried values, then each scan value stacked "
        "over the iterations (leading dim the data-dependent symbol out_dim, at most max_iterations); "
        "run by the executor (`__loop`), not a kernel",
)


@sym_rule("if", "loop")
def _subgraph_dims(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    # The type relation already took every output type, symbolic dims included, from the
    # subgraphs (whose inputs carry the node's input dims) and checked that they agree.
    return [t.sym for t in outs]
