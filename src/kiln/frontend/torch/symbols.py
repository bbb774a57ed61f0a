"""``torch.export`` symbolic dims (SymInts) -> Kiln symbolic dims (:mod:`kiln.runtime.sym`).

A program exported with ``torch.export.Dim`` s records its shapes over sympy symbols (``s17``,
``2*s17``, ``s17 + 1``, ``FloorDiv(s17, 2)``) with ranges in ``ep.range_constraints``. This
module names every symbol (the ``Dim``'s name when the program still knows it, else the sympy
name), computes the Kiln range of each (torch's lower bound 0 is raised to 1, an unbounded upper
bound needs ``Dim(max=...)`` or ``dim_ranges=``) and turns sympy expressions into canonical Kiln
dims. Imports ``torch`` / ``sympy`` only inside functions.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping

from ...runtime import sym
from ...runtime.errors import InputError, UnsupportedOpError
from ...runtime.sym import Dim

__all__ = ["SymbolTable", "symbol_table", "expr_to_dim"]

#: Upper bounds at or above this are "unbounded": torch used ``sys.maxsize - 1`` before
#: ``int_oo``, and no tensor dim that large can be stored at its upper bound anyway.
_UNBOUNDED = 1 << 31

SymbolTable = dict[str, str]
_ZERO: Dim = 0
_ONE: Dim = 1


def _user_dims(ep: Any) -> dict[tuple[str, int], Any]:
    """(user input name, dim index) -> the sympy symbol of that input dim (plain symbols only)."""
    import sympy  # type: ignore[import-untyped]
    import torch
    from torch.export.graph_signature import InputKind

    names = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    out: dict[tuple[str, int], Any] = {}
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if node.op != "placeholder" or node.name not in names or not isinstance(val, torch.Tensor):
            continue
        for i, d in enumerate(val.shape):
            if isinstance(d, torch.SymInt) and isinstance(d.node.expr, sympy.Symbol):
                out[(node.name, i)] = d.node.expr
    return out


def _debug_names(ep: Any) -> dict[str, str]:
    """sympy symbol name -> the ``torch.export.Dim`` name the user gave it, where recorded.

    ``torch.export`` keeps the Dim names in the shape environment as source -> name
    (``"L['x'].size()[0]" -> "batch"``); a program loaded from disk has lost them.
    """
    shape_env = None
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        for d in getattr(val, "shape", ()):
            shape_env = getattr(getattr(d, "node", None), "shape_env", None)
            if shape_env is not None:
                break
        if shape_env is not None:
            break
    by_source: Mapping[str, str] = getattr(shape_env, "source_name_to_debug_name", None) or {}
    if not by_source:
        return {}
    out: dict[str, str] = {}
    for (inp, i), s in _user_dims(ep).items():
        name = by_source.get(f"L['{inp}'].size()[{i}]")
        if name:
            out.setdefault(s.name, name)
    # sources of symbols torch did not unify into an input dim's symbol
    for s, sources in (getattr(shape_env, "var_to_sources", None) or {}).items():
        for src in sources:
            try:
                name = by_source.get(src.name())
            except Exception:  # noqa: BLE001  (source kinds without a printable name)
                name = None
            if name:
                out.setdefault(str(s), name)
    return out


def _sanitise(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return name if re.match(r"[A-Za-z_]", name) else f"d_{name}"


def symbol_table(ep: Any, original: Any | None = None,
                 dim_ranges: Mapping[str, tuple[int, int]] | None = None,
                 ) -> tuple[SymbolTable, dict[str, tuple[int, int]]]:
    """Kiln names and ranges of the symbols of ``ep``.

    Parameters
    ----------
    ep : torch.export.ExportedProgram
        The program being converted (possibly decomposed).
    original : torch.export.ExportedProgram, optional
        The program as exported, whose shape environment still knows the ``Dim`` names when
        ``ep`` was re-traced by a decomposition.
    dim_ranges : mapping, optional
        ``{name: (lo, hi)}`` overriding the range of a symbol, keyed by the ``Dim`` name or the
        sympy name (``"s17"``); needed for a ``Dim`` exported without ``max``.

    Returns
    -------
    names : dict of str to str
        sympy symbol name -> Kiln symbol name.
    ranges : dict of str to (int, int)
        Kiln symbol name -> ``(lo, hi)``.

    Raises
    ------
    InputError
        A symbol without an upper bound and no ``dim_ranges`` entry, a ``dim_ranges`` key that
        names no symbol, or a range outside the one torch exported the program for.
    """
    debug = _debug_names(ep)
    if original is not None and original is not ep:
        # the decomposition may have renamed the symbols: match them through the input dims
        before, after = _user_dims(original), _user_dims(ep)
        orig_debug = _debug_names(original)
        for key, s in after.items():
            old = before.get(key)
            if old is not None and old.name in orig_debug:
                debug.setdefault(s.name, orig_debug[old.name])
    names: SymbolTable = {}
    used: set[str] = set()
    symbols = sorted(ep.range_constraints, key=lambda s: str(s))
    # symbols named by a Dim first, so a fallback name never takes a Dim's name
    for s in sorted(symbols, key=lambda s: str(s) not in debug):
        base = debug.get(str(s))
        base = base if base and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", base) else _sanitise(str(s))
        name, k = base, 2
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        names[str(s)] = name
    overrides = dict(dim_ranges or {})
    by_kiln = {v: k for k, v in names.items()}
    unknown = [k for k in overrides if k not in by_kiln and k not in names]
    if unknown:
        raise InputError(f"dim_ranges names {', '.join(map(repr, sorted(unknown)))}, which the "
                         f"program does not have; its symbolic dims are "
                         f"{', '.join(sorted(by_kiln)) or 'none'}")
    ranges: dict[str, tuple[int, int]] = {}
    for s in symbols:
        kname = names[str(s)]
        vr = ep.range_constraints[s]
        lo = max(_bound(vr.lower) or 1, 1)  # Kiln dims are >= 1; torch's default min is 0
        hi = _bound(vr.upper)
        given = overrides.get(kname, overrides.get(str(s)))
        if given is not None:
            glo, ghi = sym.check_range(kname, given)
            if glo < lo or (hi is not None and ghi > hi):
                raise InputError(f"dim_ranges[{kname!r}] = {(glo, ghi)} lies outside the range "
                                 f"{lo}..{hi if hi is not None else 'inf'} the program was "
                                 f"exported for")
            lo, hi = glo, ghi
        if hi is None:
            raise InputError(
                f"symbolic dim {kname!r} (torch symbol {s}) has no upper bound: Kiln stores "
                f"tensors at their largest shape, so export with torch.export.Dim({kname!r}, "
                f"max=N) or pass dim_ranges={{{kname!r}: (1, N)}}")
        ranges[kname] = sym.check_range(kname, (lo, hi))
    return names, ranges


def _bound(b: Any) -> int | None:
    """An int bound of a torch ValueRange, None when infinite or too large to store."""
    import sympy

    if isinstance(b, (int, sympy.Integer)):
        v = int(b)
    else:  # torch's int_oo / sympy's oo, or any other non-integer bound
        return None
    return None if v >= _UNBOUNDED else v


def expr_to_dim(expr: Any, names: Mapping[str, str]) -> Dim:
    """A sympy expression over the program's symbols as a canonical Kiln dim.

    Integers, symbols, ``+``, ``*``, positive integer powers and floor division by a positive
    integer (``FloorDiv`` / ``CleanDiv``) convert; anything else (``Max``, ``Mod``, a rational
    coefficient) raises :class:`UnsupportedOpError` naming the expression.
    """
    import sympy

    def conv(e: Any) -> Dim:
        if isinstance(e, (int, sympy.Integer)):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e.name not in names:
                raise UnsupportedOpError(f"symbol {e} of {expr} is not a dim of the program")
            return names[e.name]
        if isinstance(e, sympy.Add):
            return functools.reduce(sym.add, (conv(a) for a in e.args), _ZERO)
        if isinstance(e, sympy.Mul):
            return functools.reduce(sym.mul, (conv(a) for a in e.args), _ONE)
        if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
            base = conv(e.base)
            return functools.reduce(sym.mul, [base] * int(e.exp), _ONE)
        if type(e).__name__ in ("FloorDiv", "CleanDiv", "IntTrueDiv") and len(e.args) == 2:
            num, den = conv(e.args[0]), conv(e.args[1])
            if isinstance(den, int) and den > 0:
                return sym.floordiv(num, den)
        raise UnsupportedOpError(f"the symbolic size {expr} ({type(e).__name__} {e}) has no "
                                 f"Kiln form (supported: +, *, integer powers, // by a positive "
                                 f"integer)")

    return sym.canonical(conv(expr))
