"""Operator registry of the graph IR.

Every IR op is registered once with

* an **attribute schema** ``{name: (kind, default)}`` — attributes are validated, coerced to
  canonical Python values (tuples, ints, floats, str) and missing ones filled with defaults;
* a **type relation** ``type_rel(input_types, attrs) -> list[TensorType]`` that infers the output
  types and raises :class:`~kiln.runtime.errors.InputError` on bad inputs;
* a **fusion pattern** (:class:`OpPattern`, TVM numbering);
* a **reference implementation** ``ref(inputs, attrs) -> list[np.ndarray]`` in NumPy that follows
  ONNX semantics exactly. It is used by constant folding, by :func:`kiln.ir.evaluate` and as the
  test oracle for the kernels;
* optionally a **symbolic rule** ``sym_rel(input_types, attrs, output_types) -> list`` giving
  each output's symbolic dims when an input has some (see :mod:`kiln.ir.sym_rules`, where the
  built-in ops' rules live).

Attribute kinds: ``int``, ``float``, ``bool``, ``str``, ``dtype`` (IR dtype name), ``ints``
(tuple of int), ``floats`` (tuple of float), ``pairs`` (tuple of ``(int, int)``), ``dims``
(tuple of dims: ``int`` or canonical symbolic strings, see :mod:`kiln.runtime.sym`),
``ndarray`` (a NumPy array; only the ``constant`` op) and ``any``. A default of ``None`` makes the
attribute optional (``None`` allowed).
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..runtime import sym as _sym
from ..runtime.errors import InputError, KilnError
from .types import TensorType, normalize_dtype

__all__ = ["OpPattern", "OpDef", "REQUIRED", "register_op", "get_op", "list_ops", "has_op"]


class OpPattern(enum.IntEnum):
    """How an op may be fused (same numbering as TVM's ``OpPatternKind``)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Marks an attribute without default.
REQUIRED: Any = _Required()

TypeRel = Callable[[list[TensorType], dict[str, Any]], list[TensorType]]
RefImpl = Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]
#: ``sym_rel(input_types, attrs, output_types)`` -> per output its ``TensorType.sym`` (a tuple of
#: canonical dims or None per dim, or None when the output is static).
SymRel = Callable[[list[TensorType], dict[str, Any], list[TensorType]], list[Any]]

_KINDS = ("int", "float", "bool", "str", "dtype", "ints", "floats", "pairs", "dims", "ndarray", "any")


@dataclass(eq=False)
class OpDef:
    """A registered operator.

    Attributes
    ----------
    name : str
        IR op name.
    attrs : dict
        ``{attr_name: (kind, default)}``.
    type_rel : callable
        Output type inference.
    pattern : OpPattern
        Fusion pattern.
    ref : callable
        NumPy reference implementation.
    num_inputs : int or tuple or None
        Exact count, ``(min, max)`` (max ``None`` = unbounded), or ``None`` for any.
    num_outputs : int or None
        Exact count, or ``None`` when the type relation decides (``split``).
    doc : str
        One-line description (used in docs/ir.md).
    inputs : tuple of str
        Input names (docs).
    sym_rel : callable or None
        Symbolic-dims rule; ``None`` falls back to the built-in table of
        :mod:`kiln.ir.sym_rules`, and an op with neither rejects symbolic inputs.
    """

    name: str
    attrs: dict[str, tuple[str, Any]]
    type_rel: TypeRel
    pattern: OpPattern
    ref: RefImpl
    num_inputs: int | tuple[int, int | None] | None = 1
    num_outputs: int | None = 1
    doc: str = ""
    inputs: tuple[str, ...] = field(default_factory=tuple)
    sym_rel: SymRel | None = None

    def check_num_inputs(self, n: int) -> None:
        """Raise InputError if ``n`` inputs are not accepted."""
        spec = self.num_inputs
        if spec is None:
            return
        if isinstance(spec, int):
            ok, want = n == spec, str(spec)
        else:
            lo, hi = spec
            ok = n >= lo and (hi is None or n <= hi)
            want = f"{lo}..{'' if hi is None else hi}"
        if not ok:
            raise InputError(f"op {self.name!r} takes {want} inputs, got {n}")

    def normalize_attrs(self, attrs: dict[str, Any] | None) -> dict[str, Any]:
        """Validate ``attrs`` against the schema; return a new dict with defaults filled."""
        attrs = dict(attrs or {})
        unknown = set(attrs) - set(self.attrs)
        if unknown:
            raise InputError(
                f"op {self.name!r} has no attribute(s) {sorted(unknown)}; "
                f"known: {sorted(self.attrs)}"
            )
        out: dict[str, Any] = {}
        for key, (kind, default) in self.attrs.items():
            if key in attrs:
                val = attrs[key]
            elif default is REQUIRED:
                raise InputError(f"op {self.name!r} requires attribute {key!r}")
            else:
                val = default
            if val is None:
                if default is not None:
                    raise InputError(f"op {self.name!r}: attribute {key!r} may not be None")
                out[key] = None
                continue
            try:
                out[key] = _coerce(kind, val)
            except (TypeError, ValueError) as exc:
                raise InputError(
                    f"op {self.name!r}: attribute {key!r} must be {kind}, got {val!r}"
                ) from exc
        return out


def _coerce(kind: str, val: Any) -> Any:
    if kind == "int":
        if isinstance(val, (bool, np.bool_)):
            return int(val)
        if isinstance(val, (float, np.floating)) and not float(val).is_integer():
            raise ValueError("not an integer")
        return int(val)
    if kind == "float":
        return float(val)
    if kind == "bool":
        return bool(val)
    if kind == "str":
        if not isinstance(val, str):
            raise TypeError("not a string")
        return val
    if kind == "dtype":
        return normalize_dtype(val)
    if kind == "ints":
        if isinstance(val, (int, np.integer)):
            return (int(val),)
        return tuple(_coerce("int", v) for v in val)
    if kind == "floats":
        if isinstance(val, (int, float, np.number)):
            return (float(val),)
        return tuple(float(v) for v in val)
    if kind == "pairs":
        res = []
        for p in val:
            a, b = p
            res.append((_coerce("int", a), _coerce("int", b)))
        return tuple(res)
    if kind == "dims":
        if isinstance(val, (str, int, np.integer)):
            val = (val,)
        return tuple(_canonical_dim(v) for v in val)
    if kind == "ndarray":
        if not isinstance(val, np.ndarray):
            raise TypeError("not an ndarray")
        return val
    return val


def _canonical_dim(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError("a dim may not be a bool")
    try:
        return _sym.canonical(v if isinstance(v, str) else int(v))
    except InputError as exc:
        raise ValueError(str(exc)) from None


_REGISTRY: dict[str, OpDef] = {}


def register_op(
    name: str,
    *,
    attrs: dict[str, tuple[str, Any]] | None = None,
    type_rel: TypeRel,
    pattern: OpPattern,
    ref: RefImpl,
    num_inputs: int | tuple[int, int | None] | None = 1,
    num_outputs: int | None = 1,
    doc: str = "",
    inputs: Sequence[str] = (),
    override: bool = False,
    sym_rel: SymRel | None = None,
) -> OpDef:
    """Register an IR operator.

    Parameters
    ----------
    name : str
        The op name used in graphs (``"conv2d"``).
    attrs : dict, optional
        Schema ``{attr: (kind, default or REQUIRED)}``; see the module docstring for kinds.
    type_rel, pattern, ref, num_inputs, num_outputs, doc, inputs, sym_rel
        See :class:`OpDef`.
    override : bool
        Replace an existing registration instead of raising.

    Returns
    -------
    OpDef
    """
    if name in _REGISTRY and not override:
        raise KilnError(f"op {name!r} is already registered")
    attrs = dict(attrs or {})
    for key, spec in attrs.items():
        if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] in _KINDS):
            raise KilnError(f"op {name!r}: bad schema for attribute {key!r}: {spec!r}")
    op = OpDef(name, attrs, type_rel, OpPattern(pattern), ref, num_inputs, num_outputs, doc,
               tuple(inputs), sym_rel)
    _REGISTRY[name] = op
    return op


def unregister_op(name: str) -> OpDef:
    """Remove the registered op ``name`` (for tests and plugins that register temporary ops).

    Parameters
    ----------
    name : str
        The op name.

    Returns
    -------
    OpDef
        The definition that was removed.

    Raises
    ------
    KilnError
        If no op ``name`` is registered.
    """
    op = _REGISTRY.pop(name, None)
    if op is None:
        raise KilnError(f"cannot unregister IR op {name!r}: it is not registered")
    return op


def _ensure_builtin() -> None:
    # The built-in ops live in kiln.ir.ops; importing it registers them.
    from . import ops  # noqa: F401


def get_op(name: str) -> OpDef:
    """Return the registered op ``name``.

    Raises
    ------
    KilnError
        If no such op exists; the message lists close names.
    """
    op = _REGISTRY.get(name)
    if op is None:
        _ensure_builtin()
        op = _REGISTRY.get(name)
    if op is None:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KilnError(f"unknown IR op {name!r}{hint}")
    return op


def has_op(name: str) -> bool:
    """Whether ``name`` is a registered op."""
    _ensure_builtin()
    return name in _REGISTRY


def list_ops() -> list[str]:
    """Names of all registered ops, sorted."""
    _ensure_builtin()
    return sorted(_REGISTRY)


def op_table_markdown() -> str:
    """The markdown table of all registered ops (docs/ir.md is generated from this)."""
    _ensure_builtin()
    rows = ["| op | inputs | attributes (kind = default) | pattern | outputs | semantics |",
            "|---|---|---|---|---|---|"]
    for name in sorted(_REGISTRY):
        op = _REGISTRY[name]
        attrs = ", ".join(
            f"`{k}`: {kind}" + ("" if d is REQUIRED else f" = `{d!r}`")
            for k, (kind, d) in op.attrs.items()) or "—"
        nout = "n (from attrs)" if op.num_outputs is None else str(op.num_outputs)
        ins = ", ".join(op.inputs) or "—"
        rows.append(f"| `{name}` | {ins} | {attrs} | {op.pattern.name} ({int(op.pattern)}) "
                    f"| {nout} | {op.doc.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def update_docs(path: str) -> bool:
    """Rewrite the op table between the OPTABLE markers of ``path``; True if it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin, end = "<!-- OPTABLE:BEGIN -->", "<!-- OPTABLE:END -->"
    i, j = text.index(begin) + len(begin), text.index(end)
    new = text[:i] + "\n" + op_table_markdown() + "\n" + text[j:]
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text
