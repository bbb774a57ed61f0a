"""Parser for the text form printed by :mod:`kiln.ir.printer` (grammar in docs/ir.md)."""

from __future__ import annotations

import json
import re
from typing import Any, cast

import numpy as np

from ..runtime.errors import FormatError, InputError, KilnError
from .graph import Graph, Value
from ..runtime import sym as _sym
from .types import TensorType, np_dtype

__all__ = ["parse"]

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+|\#[^\n]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<var>%(?:"(?:[^"\\]|\\.)*"|[A-Za-z0-9_]+(?:\.[0-9]+)?))
  | (?P<gvar>@[A-Za-z0-9_.]+)
  | (?P<num>[-+]?(?:inf|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![A-Za-z0-9_]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[()\[\]{}=,:*/+-])
""", re.VERBOSE)


class _Tokens:
    def __init__(self, text: str) -> None:
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise FormatError(f"IR text: unexpected character {text[pos]!r} at line "
                                  f"{text.count(chr(10), 0, pos) + 1}")
            kind = cast(str, m.lastgroup)  # every alternative of _TOKEN is a named group
            if kind != "ws":
                self.toks.append((kind, m.group(), text.count("\n", 0, pos) + 1))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i] if self.i < len(self.toks) else ("eof", "", -1)

    def next(self) -> tuple[str, str, int]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        kind, val, line = self.next()
        if val != value:
            raise FormatError(f"IR text line {line}: expected {value!r}, got {val!r}")

    def accept(self, value: str) -> bool:
        if self.peek()[1] == value:
            self.i += 1
            return True
        return False


def _var_name(tok: str) -> str:
    body = tok[1:]
    return json.loads(body) if body.startswith('"') else body


def _parse_number(s: str) -> int | float:
    if re.fullmatch(r"[-+]?\d+", s):
        return int(s)
    return float(s)


class _Parser:
    def __init__(self, text: str, constants: dict[str, np.ndarray] | None) -> None:
        self.t = _Tokens(text)
        self.constants = constants or {}
        self.env: dict[str, Value | list[Value]] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        self.data_dims: set[str] = set()

    def fail(self, msg: str) -> FormatError:
        return FormatError(f"IR text line {self.t.peek()[2]}: {msg}")

    # types ------------------------------------------------------------------
    def parse_type(self) -> TensorType:
        kind, val, _ = self.t.next()
        if val != "Tensor":
            raise self.fail(f"expected Tensor[...], got {val!r}")
        self.t.expect("[")
        dims = self.parse_dims()
        self.t.expect(",")
        kind, dtype, _ = self.t.next()
        self.t.expect("]")
        try:
            if not any(isinstance(d, str) for d in dims):
                return TensorType(tuple(int(d) for d in dims), dtype)
            # Symbolic dims: the upper bounds follow from the graph's ranges, as for add_input.
            shape = tuple(d if isinstance(d, int) else _sym.bounds(d, self.ranges)[1] for d in dims)
            return TensorType(shape, dtype, tuple(None if isinstance(d, int) else d for d in dims))
        except (InputError, TypeError) as exc:
            raise self.fail(str(exc)) from None

    def parse_dims(self) -> list[int | str]:
        """``(d, ...)``: each dim an int or a symbolic expression (tokens joined back)."""
        self.t.expect("(")
        dims: list[int | str] = []  # canonical: an int or a symbolic expression
        while not self.t.accept(")"):
            toks: list[str] = []
            depth = 0
            while True:
                kind, val, line = self.t.peek()
                if kind == "eof" or (depth == 0 and val in (",", ")")):
                    break
                depth += {"(": 1, ")": -1}.get(val, 0)
                toks.append(val)
                self.t.next()
            if not toks:
                raise self.fail("expected a dimension")
            text = "".join(toks)
            try:
                d = _sym.canonical(int(text) if text.isdigit() else text)
            except InputError as exc:
                raise self.fail(str(exc)) from None
            dims.append(d)
            if not self.t.accept(","):
                self.t.expect(")")
                break
        return dims

    def parse_types(self) -> list[TensorType]:
        if self.t.peek()[1] == "(":
            self.t.next()
            types = [self.parse_type()]
            while self.t.accept(","):
                if self.t.peek()[1] == ")":
                    break
                types.append(self.parse_type())
            self.t.expect(")")
            return types
        return [self.parse_type()]

    # values -----------------------------------------------------------------
    def parse_value(self) -> Any:
        kind, val, line = self.t.next()
        if kind == "num":
            return _parse_number(val)
        if kind == "str":
            return json.loads(val)
        if kind == "ident":
            if val == "True":
                return True
            if val == "False":
                return False
            if val == "None":
                return None
            if val == "meta":
                self.t.expect("[")
                kind, key, _ = self.t.next()
                self.t.expect("]")
                name = json.loads(key)
                if name not in self.constants:
                    raise FormatError(f"IR text line {line}: constant meta[{key}] not given in "
                                      f"`constants` (have {sorted(self.constants)[:10]})")
                return ("__meta__", name)
            raise FormatError(f"IR text line {line}: unexpected identifier {val!r}")
        if val in ("(", "["):
            close = ")" if val == "(" else "]"
            items = []
            while not self.t.accept(close):
                items.append(self.parse_value())
                if not self.t.accept(","):
                    self.t.expect(close)
                    break
            return tuple(items) if val == "(" else list(items)
        raise FormatError(f"IR text line {line}: unexpected {val!r}")

    def lookup(self, tok: str, line: int) -> Value:
        name = _var_name(tok)
        if name in self.env:
            v = self.env[name]
            if isinstance(v, list):
                raise FormatError(f"IR text line {line}: {tok} has {len(v)} outputs; use "
                                  f"{tok}.<index>")
            return v
        m = re.fullmatch(r"(\d+)\.(\d+)", name)
        outs = self.env.get(m.group(1)) if m else None
        if m and isinstance(outs, list):
            k = int(m.group(2))
            if k < len(outs):
                return outs[k]
        raise FormatError(f"IR text line {line}: undefined value {tok}")

    # graph ------------------------------------------------------------------
    def parse(self) -> Graph:
        t = self.t
        if t.peek()[1] == "dim_ranges":
            t.next()
            t.expect("(")
            while not t.accept(")"):
                kind, name, line = t.next()
                t.expect("=")
                rng = self.parse_value()
                try:
                    _sym.check_name(name)
                    data = isinstance(rng, tuple) and len(rng) == 3 and rng[2] == "data"
                    if data:
                        self.data_dims.add(name)
                    self.ranges[name] = _sym.check_range(name, rng[:2] if data else rng, allow_zero=data)
                except InputError as exc:
                    raise FormatError(f"IR text line {line}: {exc}") from None
                if not t.accept(","):
                    t.expect(")")
                    break
        t.expect("def")
        kind, gname, _ = t.next()
        if kind != "gvar":
            raise self.fail("expected @name after def")
        g = Graph(gname[1:])
        g.dim_ranges.update(self.ranges)
        g.data_dims.update(self.data_dims)
        t.expect("(")
        while not t.accept(")"):
            kind, tok, line = t.next()
            if kind != "var":
                raise FormatError(f"IR text line {line}: expected an input %name, got {tok!r}")
            t.expect(":")
            ty = self.parse_type()
            v = g.add_input(_var_name(tok), ty.dims, ty.dtype)
            self.env[_var_name(tok)] = v
            if not t.accept(","):
                t.expect(")")
                break
        t.expect("{")
        while True:
            kind, tok, line = t.next()
            if tok == "return":
                break
            if kind != "var":
                raise FormatError(f"IR text line {line}: expected %name = op(...), got {tok!r}")
            t.expect("=")
            kind, op, _ = t.next()
            if kind != "ident":
                raise FormatError(f"IR text line {line}: expected an op name, got {op!r}")
            t.expect("(")
            inputs: list[Value] = []
            attrs: dict[str, Any] = {}
            while not t.accept(")"):
                k2, tok2, line2 = t.next()
                if k2 == "var":
                    inputs.append(self.lookup(tok2, line2))
                elif k2 == "ident":
                    t.expect("=")
                    attrs[tok2] = self.parse_value()
                else:
                    raise FormatError(f"IR text line {line2}: unexpected {tok2!r} in call")
                if not t.accept(","):
                    t.expect(")")
                    break
            t.expect(":")
            types = self.parse_types()
            node_name = None
            if op == "constant":
                raw = attrs.get("value")
                if isinstance(raw, tuple) and len(raw) == 2 and raw[0] == "__meta__":
                    node_name = raw[1]
                attrs["value"] = self._const_value(raw, types[0], line)
            try:
                outs = g.add_node(op, inputs, attrs, name=node_name)
            except KilnError as exc:
                raise FormatError(f"IR text line {line}: {exc}") from None
            got = [o.type for o in outs]
            if got != types:
                raise FormatError(f"IR text line {line}: {op} infers {got}, text says {types}")
            name = _var_name(tok)
            self.env[name] = outs[0] if len(outs) == 1 else outs
        outs_tok = []
        if t.peek()[1] == "(":
            t.next()
            while not t.accept(")"):
                kind, tok, line = t.next()
                outs_tok.append((tok, line))
                if not t.accept(","):
                    t.expect(")")
                    break
        else:
            kind, tok, line = t.next()
            outs_tok.append((tok, line))
        g.outputs = [self.lookup(tok, line) for tok, line in outs_tok]
        t.expect("}")
        if t.peek()[0] != "eof":
            raise self.fail(f"trailing text {t.peek()[1]!r}")
        return g

    def _const_value(self, raw: Any, ty: TensorType, line: int) -> np.ndarray:
        if isinstance(raw, tuple) and len(raw) == 2 and raw[0] == "__meta__":
            arr = np.asarray(self.constants[raw[1]])
        elif isinstance(raw, list):
            dt = np_dtype(ty.dtype)
            if ty.dtype in ("float16", "bfloat16", "float32", "float64"):
                arr = np.array([float(x) for x in raw], dtype=np.float64).astype(dt)
            else:
                arr = np.array(raw, dtype=dt)
            if arr.size != ty.size:
                raise FormatError(f"IR text line {line}: constant has {arr.size} values, type "
                                  f"{ty} needs {ty.size}")
            arr = arr.reshape(ty.shape)
        else:
            raise FormatError(f"IR text line {line}: constant needs value=[...] or meta[...]")
        if arr.shape != ty.shape or arr.dtype != np_dtype(ty.dtype):
            raise FormatError(f"IR text line {line}: constant array {arr.shape} {arr.dtype} does "
                              f"not match {ty}")
        return arr


def parse(text: str, constants: dict[str, np.ndarray] | None = None) -> Graph:
    """Parse the text form back into a :class:`Graph`.

    Parameters
    ----------
    text : str
        Output of :func:`kiln.ir.astext` / ``str(graph)``.
    constants : dict, optional
        Arrays for constants printed as ``meta["name"]`` (see :meth:`Graph.constants`).

    Raises
    ------
    FormatError
        Malformed text, unknown ops, missing constants or type annotations that disagree with
        type inference.
    """
    return _Parser(text, constants).parse()
