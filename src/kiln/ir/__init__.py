"""Kiln's graph IR.

Public API
----------
- Types: :class:`TensorType`, :func:`normalize_dtype`, :func:`np_dtype`.
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
- Graph inputs include parameter placeholders; constants are ``constant`` nodes whose
  ``attrs["value"]`` is a read-only NumPy array.
- ``get_op(name).ref(list_of_arrays, attrs) -> list_of_arrays`` is the numerical oracle.
- ``get_op(name).pattern`` is an :class:`OpPattern` (TVM numbering) for fusion.
"""

from __future__ import annotations

from .types import DTYPES, TensorType, normalize_dtype, np_dtype
from .op import REQUIRED, OpDef, OpPattern, get_op, has_op, list_ops, register_op
from .graph import Graph, IRModule, Node, Value, dead_code_elimination, rewrite, structural_equal
from . import ops  # noqa: F401  (registers the built-in ops)
from .printer import astext
from .parser import parse
from .interpreter import evaluate

__all__ = [
    "DTYPES", "TensorType", "normalize_dtype", "np_dtype",
    "REQUIRED", "OpDef", "OpPattern", "get_op", "has_op", "list_ops", "register_op",
    "Graph", "IRModule", "Node", "Value", "rewrite", "structural_equal", "dead_code_elimination",
    "astext", "parse", "evaluate",
]
