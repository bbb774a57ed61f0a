"""Structural fingerprints of PrimFuncs: a cache key that is known before any code is generated.

The compile cache used to be keyed by the generated LLVM IR, so a cached build still paid for
IR generation (most of the codegen time of a big model). :func:`structural_fingerprint` hashes
the TIR itself instead. It is built by reflection over every field of every node (``__slots__``
and ``__dict__``), so a field added to a node class later is part of the key without anyone
remembering to add it here. Variables and buffers are numbered by first appearance, so two
kernels that differ only in the identity of their objects hash alike; names, dtypes, shapes,
constants (floats exactly, via ``float.hex``) and attributes all count.

A node of a type the walker does not know (anything but TIR nodes, ``Buffer``, ``PrimFunc``
and plain data) makes the fingerprint ``None``: the caller then falls back to keying by
the generated code rather than risk two different kernels sharing an entry.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .expr import PrimExpr
from .stmt import Buffer, PrimFunc, Stmt

__all__ = ["structural_fingerprint"]

_NODE_TYPES = (PrimExpr, Stmt, Buffer, PrimFunc)


class _Unhashable(Exception):
    """Raised inside the walk for a value whose structure is not known to be complete."""


def _fields(obj: Any) -> list[tuple[str, Any]]:
    names: list[str] = []
    for cls in type(obj).__mro__:
        for n in getattr(cls, "__slots__", ()):
            if n not in names:
                names.append(n)
    d = getattr(obj, "__dict__", None)
    if d:
        names.extend(n for n in d if n not in names)
    return [(n, getattr(obj, n)) for n in sorted(names) if hasattr(obj, n)]


class _Walker:
    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.ids: dict[int, int] = {}  # id(node) -> first-visit number (objects stay alive during the walk)

    def put(self, s: str) -> None:
        self.h.update(s.encode("utf-8"))
        self.h.update(b"\x1f")

    def walk(self, v: Any) -> None:
        # scalars first: they are the bulk of a tree
        if v is None or isinstance(v, bool):
            self.put(repr(v))
        elif isinstance(v, int):
            self.put(f"i{v}")
        elif isinstance(v, float):
            self.put(f"f{v.hex()}")
        elif isinstance(v, str):
            self.put(f"s{len(v)}:{v}")
        elif isinstance(v, (list, tuple)):
            self.put(f"{type(v).__name__[0]}{len(v)}")
            for x in v:
                self.walk(x)
        elif isinstance(v, dict):
            self.put(f"d{len(v)}")
            for k in sorted(v, key=repr):
                self.walk(k)
                self.walk(v[k])
        elif isinstance(v, _NODE_TYPES):
            seen = self.ids.get(id(v))
            if seen is not None:  # shared subtree or a variable used again: a back reference
                self.put(f"@{seen}")
                return
            self.ids[id(v)] = len(self.ids)
            self.put(f"<{type(v).__module__}.{type(v).__qualname__}")
            for name, x in _fields(v):
                self.put(name)
                self.walk(x)
            self.put(">")
        else:
            raise _Unhashable(type(v).__qualname__)


def structural_fingerprint(*funcs: PrimFunc) -> str | None:
    """SHA-256 hex digest of the complete structure of ``funcs``, or None if it cannot be trusted.

    Parameters
    ----------
    *funcs : PrimFunc
        The kernels, in order (their order is part of the key).

    Returns
    -------
    str or None
        The digest; ``None`` when a node holds a value the walker cannot serialise faithfully
        (or nests too deeply), in which case the caller must key by the generated code.
    """
    w = _Walker()
    try:
        for f in funcs:
            w.walk(f)
    except (_Unhashable, RecursionError):
        return None
    return w.h.hexdigest()
