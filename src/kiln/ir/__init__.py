"""Kiln's graph IR.

Public API
----------
- Types: :class:`TensorType` (static upper-bound ``shape``, optional per-dim symbolic
  ``sym``; ``dims`` / ``is_dynamic``), :data:`Dim`, :func:`normalize_dtype`, :func:`np_dtype`.
- Dynamic dims: :attr:`Graph.dim_ranges`, :meth:`Graph.declare_dim`, ``add_input`` with
  symbolic dims; the per-op symbolic rules live in :mod:`kiln.ir.sym_rules`.
- Graph: :class:`Graph` (alias :class:`IRModule`), :class:`Node`, :class:`Value`,
  :func:`structural_equal`, :func:`rewrite` (node-by-node rebuild used by passes),
  :func:`dead_code_elimination`.
- Operators: :func:`register_op`, :func:`get_op`, :func:`list_ops`, :class:`OpPattern`,
  :data:`REQUIRED`; the built-in ops live in :mod:`kiln.ir.ops` (table in docs/ir.md).
- Text: :func:`astext` (``str(graph)``), :func:`parse`.
- Reference interpreter: :func:`evaluate`.

Contracts other layers rely on
------------------------------
- ``graph.nodes`` is topologically ordered; ``node.attrs`` is canonical (schema-validated,
  defaults filled, sequences as tuples); values compare by identity.
- ``TensorType.shape`` is always ints (the upper bound of a symbolic dim), so static code keeps
  working on dynamic graphs; ``TensorType.sym`` is ``None`` for every static type.
- Graph inputs include parameter placeholders; constants are ``constant`` nodes whose
  ``attrs["value"]`` is a read-only NumPy array.
- ``get_op(name).ref(list_of_arrays, attrs) -> list_of_arrays`` is the numerical oracle.
- ``get_op(name).pattern`` is an :class:`OpPattern` (TVM numbering) for fusion.
"""

from __future__ import annotations

from .types import DTYPES, Dim, TensorType, normalize_dtype, np_dtype
from .op import REQUIRED, OpDef, OpPattern, get_op, has_op, list_ops, register_op
from .graph import Graph, IRModule, Node, Value, dead_code_elimination, rewrite, structural_equal
from . import ops  # noqa: F401  (registers the built-in ops)
from .printer import astext
from .parser import parse
from .interpreter import evaluate

__all__ = [
    "DTYPES", "Dim", "TensorType", "normalize_dtype", "np_dtype",
    "REQUIRED", "OpDef", "OpPattern", "get_op", "has_op", "list_ops", "register_op",
    "Graph", "IRModule", "Node", "Value", "rewrite", "structural_equal", "dead_code_elimination",
    "astext", "parse", "evaluate",
]
