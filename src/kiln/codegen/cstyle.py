"""The one printer of C-style languages: loop IR → C, OpenCL C or CUDA C text.

Two halves, as in every C-family code generator:

* :class:`CDialect` — *how a language spells things*: its type names, infinities and NaNs,
  math-function names, ``isnan``-style tests. A language is a subclass that overrides what
  it spells differently (:class:`kiln.codegen.c.HostC`, and through
  :class:`kiln.codegen.gpu_source.Dialect` OpenCL C and CUDA C).
* :class:`CStylePrinter` — *what is printed*, the same for all of them: identifier naming,
  expressions (literals, operators, NumPy-style integer wrap, casts, intrinsics), flat
  buffer offsets and statements (loops, stores, ``if``, ``let``). A code generator is a
  subclass that adds its function structure and the constructs with no common form:
  ``_checked_index`` (an index read from data), ``_allocate``, and ``_special_loop``
  (parallel, vectorized or thread-bound loops). :class:`kiln.codegen.c.CCodeGen` (host C:
  packed functions, argument checks, half-float storage, SIMD, parallel lambdas) and
  :class:`kiln.codegen.gpu_source.GPUSourceGenerator` (kernels and launch metadata) are the two.

Errors name the language (:attr:`CDialect.name`). Imports only the loop IR
(:mod:`kiln.tir`) and the runtime's error types: no device driver, no compiler, no LLVM.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from ..runtime.errors import CompileError
from ..tir.dtype import is_bool, is_float, is_integer, is_uint
from ..tir.expr import (
    CHECKED_INDEX, BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var,
)
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, SeqStmt, Stmt

__all__ = [
    "CStylePrinter", "Scope", "INFIX_OPS", "PREDICATE_OPS", "WRAP_DTYPES", "INT_SUFFIX", "MATH_OPS",
    "SPECIAL_FLOAT_OPS", "C_KEYWORDS", "CDialect", "REINTERPRET",
]

#: Intrinsic ``Call(dst, REINTERPRET, [x], text=dst)`` of ONNX BitCast (``kiln.topi.integer``): the
#: bits of ``x`` read as ``dst``, a dtype of the same width. Dialects opt in by overriding
#: ``CStylePrinter._reinterpret``.
REINTERPRET = "kiln.reinterpret"

#: Binary operators printed as a C infix operator (``min``/``max``/floor division are helpers).
INFIX_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
             "eq": "==", "ne": "!=", "and": "&&", "or": "||", "bitand": "&", "bitor": "|", "bitxor": "^",
             "shl": "<<", "shr": ">>", "truncdiv": "/", "truncmod": "%"}
#: Operators whose result is a 0/1 truth value (never wrapped to the operand type).
PREDICATE_OPS = ("lt", "le", "gt", "ge", "eq", "ne", "and", "or")
#: Integer dtypes whose arithmetic results (not comparisons) are cast back to the dtype: C
#: promotes them to ``int`` (uint32 too where ``int`` is wider than 32 bits); NumPy wraps.
WRAP_DTYPES = ("int8", "int16", "uint8", "uint16", "uint32")
#: Suffix of the per-dtype integer helpers every language defines (``kiln_max_i32`` …).
INT_SUFFIX = {"int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
              "uint32": "u32", "uint64": "u64", "bool": "i32"}
#: Math intrinsics (``Call.op``); :meth:`CDialect.math_function` names them per language.
MATH_OPS = ("exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "tanh", "erf", "sin", "cos", "tan",
            "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "trunc",
            "round", "fabs", "pow", "atan2", "fmod")
#: Floating-point classification intrinsics (0/1 results).
SPECIAL_FLOAT_OPS = ("isnan", "isinf", "isfinite")
#: Identifiers no generated name may take in any C-style language (keywords, math names, macros).
C_KEYWORDS = frozenset({
    "int", "float", "double", "char", "short", "long", "if", "else", "for", "while", "do", "return", "const",
    "static", "void", "struct", "union", "switch", "case", "default", "break", "continue", "goto", "sizeof",
    "typedef", "auto", "register", "signed", "unsigned", "volatile", "extern", "restrict", "inline", "enum",
    "exp", "log", "sqrt", "pow", "floor", "ceil", "round", "trunc", "fabs", "erf", "tanh", "sin", "cos", "tan",
    "abs", "main", "NAN", "INFINITY",
})


class Scope:
    """Naming and range facts of the function (C) or kernel (GPU) being printed.

    ``names`` maps ``id(Var)`` to its identifier, ``used`` holds the identifiers taken, and
    ``nonneg`` the integer variables known to be >= 0 (so floor division may print as ``/``).
    """

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.nonneg: set[Var] = set()


class CDialect:
    """What one C-style language spells its own way. Subclass and override.

    Attributes
    ----------
    name : str
        Language name used in error messages (``"C"``, ``"opencl"``, ``"cuda"``).
    type_names : dict
        dtype name -> scalar storage type in the language; dtypes missing here are rejected
        with a :class:`~kiln.runtime.errors.CompileError`.
    """

    name = "C"
    type_names: dict[str, str] = {}
    #: Qualifier of the helper functions (:meth:`CStylePrinter.helper_source`).
    func_qualifier = "static inline"

    def type_name(self, dtype: str) -> str:
        """Storage type name of ``dtype``; raises for dtypes the language cannot hold."""
        t = self.type_names.get(dtype)
        if t is None:
            raise CompileError(f"{self.name} codegen: dtype {dtype} is not supported "
                               f"(supported: {', '.join(sorted(self.type_names))})")
        return t

    def value_type(self, dtype: str) -> str:
        """Type an expression of ``dtype`` is computed in (bools compute as int)."""
        return self.type_name("int32" if dtype == "bool" else dtype)

    def math_function(self, op: str, dtype: str) -> str:
        """Function name of math intrinsic ``op`` (one of :data:`MATH_OPS`) on ``dtype`` arguments.

        The default suits languages whose math functions are overloaded on float / double
        (OpenCL C); round-half-even is ``rint``.
        """
        return "rint" if op == "round" else op

    def inf_literal(self, dtype: str) -> str:
        """Positive infinity of ``dtype`` (``<math.h>``'s ``INFINITY`` by default)."""
        return "INFINITY" if dtype != "float64" else "((double)INFINITY)"

    def nan_literal(self, dtype: str) -> str:
        """A quiet NaN of ``dtype`` (``<math.h>``'s ``NAN`` by default)."""
        return "NAN" if dtype != "float64" else "((double)NAN)"

    def is_special_float(self, op: str, arg: str, dtype: str) -> str:
        """``isnan`` / ``isinf`` / ``isfinite`` of ``arg`` as an int 0/1 expression."""
        return f"({op}({arg}) != 0)"

    def dtype_guard(self, dtype: str) -> tuple[str, str] | None:
        """Preprocessor lines around helpers of ``dtype`` (e.g. only if fp64 exists), or None."""
        return None


class CStylePrinter:
    """Expression and statement printer shared by the C-family code generators.

    Parameters
    ----------
    dialect : CDialect
        The language: type names and the spelling of literals and intrinsics.

    Subclasses set :attr:`reserved`, define ``_checked_index`` and ``_allocate``, and
    override the other ``_`` hooks where their language differs. ``self._st`` is the
    :class:`Scope` of the function or kernel being printed; a subclass creates it (a
    subclass of ``Scope`` when it needs more).
    """

    #: Identifiers generated names must avoid (C keywords plus the language's own words).
    reserved: frozenset[str] = C_KEYWORDS
    _st: Scope

    def __init__(self, dialect: CDialect) -> None:
        self.d = dialect

    @property
    def lang(self) -> str:
        """Language name in error messages."""
        return self.d.name

    def helper_source(self) -> str:
        """Definitions of the helpers expressions call, for every dtype of the dialect:
        NumPy-semantics ``kiln_fmax[f]`` / ``kiln_fmin[f]`` (NaN-propagating, unlike C's
        ``fmax``) and, per integer type, ``kiln_max_`` / ``kiln_min_`` and the flooring
        ``kiln_floordiv_`` / ``kiln_floormod_`` (signed only: unsigned ones print as ``/``, ``%``)."""
        d = self.d
        q = d.func_qualifier
        out = []
        for dt in ("float32", "float64"):
            if dt not in d.type_names:
                continue
            t = d.type_name(dt)
            sfx = "f" if dt == "float32" else ""
            guard = d.dtype_guard(dt)
            if guard:
                out.append(guard[0])
            out.append(f"{q} {t} kiln_fmax{sfx}({t} a, {t} b) {{ return (a > b || a != a) ? a : b; }}")
            out.append(f"{q} {t} kiln_fmin{sfx}({t} a, {t} b) {{ return (a < b || a != a) ? a : b; }}")
            if guard:
                out.append(guard[1])
        for dt, sfx in INT_SUFFIX.items():
            if dt == "bool" or dt not in d.type_names:
                continue
            t = d.type_name(dt)
            out.append(f"{q} {t} kiln_max_{sfx}({t} a, {t} b) {{ return a > b ? a : b; }}")
            out.append(f"{q} {t} kiln_min_{sfx}({t} a, {t} b) {{ return a < b ? a : b; }}")
            if not is_uint(dt):
                out.append(f"{q} {t} kiln_floordiv_{sfx}({t} a, {t} b) {{ {t} q = a / b, r = a % b; "
                           f"return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q; }}")
                out.append(f"{q} {t} kiln_floormod_{sfx}({t} a, {t} b) {{ {t} r = a % b; "
                           f"return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}")
        return "\n".join(out)

    # ------------------------------------------------------------------ naming
    def _check_symbol(self, name: str, taken: Iterable[str]) -> None:
        """Reject a function name that is no identifier or that this unit already defines."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise CompileError(f"{self.lang} codegen: {name!r} is not a valid {self.lang} function name")
        if name in taken:
            raise CompileError(f"{self.lang} codegen: two functions named {name}")

    def _name(self, v: Var) -> str:
        """The identifier of ``v`` in the current scope (made unique and non-reserved on first use)."""
        st = self._st
        nm = st.names.get(id(v))
        if nm is None:
            base = re.sub(r"[^A-Za-z0-9_]", "_", v.name) or "v"
            if base[0].isdigit():
                base = "v" + base
            nm, k = base, 1
            while nm in st.used or nm in self.reserved:
                nm, k = f"{base}_{k}", k + 1
            st.used.add(nm)
            st.names[id(v)] = nm
        return nm

    def _buf_name(self, b: Buffer) -> str:
        return self._name(b.data)

    # ------------------------------------------------------------------ literals
    def float_literal(self, v: float, dtype: str) -> str:
        """Exact literal of a float constant: hex float, or the language's infinity / NaN."""
        if v != v:
            return self.d.nan_literal(dtype)
        if v in (float("inf"), float("-inf")):
            s = self.d.inf_literal(dtype)
            return s if v > 0 else f"(-{s})"
        return float(v).hex() + ("f" if dtype != "float64" else "")

    def int_literal(self, v: int, dtype: str) -> str:
        """Literal of an integer constant of ``dtype`` (64-bit ones cast, since ``long`` may be 32-bit)."""
        if dtype in ("int64", "uint64"):
            t = self.d.value_type(dtype)
            if v == -(2**63):
                return f"(({t})(-9223372036854775807L) - 1)"
            return f"(({t}){v}{'u' if dtype == 'uint64' else ''}L)" if v >= 0 else f"(({t})({v}L))"
        if dtype == "uint32":
            return f"{v}u"
        if v == -(2**31):
            return "(-2147483647 - 1)"
        return str(v) if v >= 0 else f"({v})"

    # ------------------------------------------------------------------ expressions
    def _nonneg(self, e: PrimExpr) -> bool:
        """Whether integer ``e`` is provably >= 0 (then floor division prints as C division)."""
        if isinstance(e, IntImm):
            return e.value >= 0
        if isinstance(e, Var):
            return e in self._st.nonneg
        if is_uint(e.dtype):
            return True
        if isinstance(e, BinaryOp) and e.op in ("add", "mul", "floordiv", "floormod", "truncdiv", "truncmod",
                                                 "min", "max"):
            return self._nonneg(e.a) and self._nonneg(e.b)
        if isinstance(e, Cast) and is_integer(e.value.dtype):
            return self._nonneg(e.value)
        # a checked index is wrapped into [0, n) (or the function returns / the kernel clamps)
        return isinstance(e, Call) and e.op == CHECKED_INDEX

    def expr(self, e: PrimExpr) -> str:
        """Source text of an expression, computed in :meth:`CDialect.value_type` of its dtype."""
        if isinstance(e, Var):
            return self._name(e)
        if isinstance(e, IntImm):
            if is_bool(e.dtype):
                return "1" if e.value else "0"
            return self.int_literal(e.value, e.dtype)
        if isinstance(e, FloatImm):
            return self.float_literal(e.value, e.dtype)
        if isinstance(e, BinaryOp):
            return self._binary(e)
        if isinstance(e, Not):
            return f"(!{self.expr(e.a)})"
        if isinstance(e, Cast):
            return self._cast(e)
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"
        if isinstance(e, Load):
            return self._load_value(f"{self._buf_name(e.buffer)}[{self._offset(e.buffer, e.indices)}]", e.dtype)
        if isinstance(e, (ProducerLoad, Reduce)):
            raise CompileError(f"{self.lang} codegen: tensor-expression node left in the loop IR; "
                               "lower the schedule first")
        raise CompileError(f"{self.lang} codegen: unsupported expression {type(e).__name__}")

    def _load_value(self, ref: str, dtype: str) -> str:
        """Value of the element ``ref`` of a ``dtype`` buffer (bools are stored narrower)."""
        return f"(({self.d.value_type('bool')}){ref})" if is_bool(dtype) else ref

    def _store_value(self, value: str, dtype: str) -> str:
        """What to store into a ``dtype`` element for the value ``value``."""
        return f"({self.d.type_name('bool')})({value} != 0)" if is_bool(dtype) else value

    def _binary(self, e: BinaryOp) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        dt, op = e.a.dtype, e.op
        if op in ("min", "max"):
            if is_float(dt):
                return f"kiln_f{op}{'' if dt == 'float64' else 'f'}({a}, {b})"
            return f"kiln_{op}_{INT_SUFFIX[dt]}({a}, {b})"
        if op in ("floordiv", "floormod"):
            if (self._nonneg(e.a) and self._nonneg(e.b)) or is_uint(dt):
                return f"({a} {'/' if op == 'floordiv' else '%'} {b})"
            return f"kiln_{op}_{INT_SUFFIX[dt]}({a}, {b})"
        s = f"({a} {INFIX_OPS[op]} {b})"
        if e.dtype in WRAP_DTYPES and op not in PREDICATE_OPS:
            s = f"(({self.d.type_name(e.dtype)}){s})"  # wrap like NumPy instead of C's integer promotion
        return s

    def _cast(self, e: Cast) -> str:
        v = self.expr(e.value)
        if e.dtype == "bool":
            return f"({v} != 0)"
        return f"(({self.d.value_type(e.dtype)}){v})"

    def _call(self, e: Call) -> str:
        if e.op == CHECKED_INDEX:
            return self._checked_index(e)
        if e.op == REINTERPRET:
            return self._reinterpret(e)
        args = [self.expr(a) for a in e.args]
        if e.op in SPECIAL_FLOAT_OPS:
            return self.d.is_special_float(e.op, args[0], e.args[0].dtype)
        if e.op not in MATH_OPS:
            raise CompileError(f"{self.lang} codegen: unknown intrinsic {e.op!r}")
        return self._math_call(e, args)

    def _math_call(self, e: Call, args: Sequence[str]) -> str:
        return f"{self.d.math_function(e.op, e.args[0].dtype)}({', '.join(args)})"

    def _checked_index(self, e: Call) -> str:
        """:data:`~kiln.tir.expr.CHECKED_INDEX` ``(index, n)``: an index read from data."""
        raise NotImplementedError

    def _reinterpret(self, e: Call) -> str:
        """:data:`REINTERPRET` (ONNX BitCast): the argument's bits read as ``e.dtype``."""
        raise CompileError(f"{self.lang} codegen: reinterpreting {e.args[0].dtype} bits as {e.dtype} (BitCast) "
                           f"is not supported")

    def _offset(self, b: Buffer, indices: Sequence[PrimExpr]) -> str:
        if b.ndim == 0 and not indices:
            return "0"
        return self.expr(b.flat_offset(indices, self._st.nonneg, f"{self.lang} codegen"))

    # ------------------------------------------------------------------ statements
    def _stmt(self, s: Stmt, out: list[str], ind: int) -> None:
        """Append the lines of ``s`` to ``out``, indented ``ind`` levels."""
        pad = "  " * ind
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._stmt(x, out, ind)
        elif isinstance(s, For):
            self._for(s, out, ind)
        elif isinstance(s, BufferStore):
            b = s.buffer
            v = self._store_value(self.expr(s.value), b.dtype)
            out.append(f"{pad}{self._buf_name(b)}[{self._offset(b, s.indices)}] = {v};")
        elif isinstance(s, Allocate):
            self._allocate(s, out, ind)
        elif isinstance(s, IfThenElse):
            self._if(s, out, ind)
        elif isinstance(s, LetStmt):
            out.append(f"{pad}{{")
            out.append(f"{pad}  const {self.d.value_type(s.var.dtype)} {self._name(s.var)} = {self.expr(s.value)};")
            if is_integer(s.var.dtype) and self._nonneg(s.value):
                self._st.nonneg.add(s.var)
            self._stmt(s.body, out, ind + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, Evaluate):
            self._evaluate(s, out, ind)
        else:
            raise CompileError(f"{self.lang} codegen: unsupported statement {type(s).__name__}")

    def _allocate(self, s: Allocate, out: list[str], ind: int) -> None:
        raise NotImplementedError

    def _if(self, s: IfThenElse, out: list[str], ind: int) -> None:
        pad = "  " * ind
        out.append(f"{pad}if ({self.expr(s.cond)}) {{")
        self._stmt(s.then_case, out, ind + 1)
        if s.else_case is not None:
            out.append(f"{pad}}} else {{")
            self._stmt(s.else_case, out, ind + 1)
        out.append(f"{pad}}}")

    def _evaluate(self, s: Evaluate, out: list[str], ind: int) -> None:
        if not isinstance(s.value, (IntImm, FloatImm)):
            out.append(f"{'  ' * ind}(void)({self.expr(s.value)});")

    def _for(self, s: For, out: list[str], ind: int) -> None:
        self._name(s.loop_var)  # the loop variable is named before anything in its body
        if self._nonneg(s.min):
            self._st.nonneg.add(s.loop_var)
        if not self._special_loop(s, out, ind):
            self._serial_loop(s, out, ind, self._loop_pragma(s))

    def _special_loop(self, s: For, out: list[str], ind: int) -> bool:
        """Print a loop kind the language maps to something else than a ``for``; False if none."""
        return False

    def _loop_pragma(self, s: For) -> str | None:
        """A pragma line put before the ``for`` of ``s`` (unrolling, vectorization hints), or None."""
        return None

    def _serial_loop(self, s: For, out: list[str], ind: int, pragma: str | None = None) -> None:
        """``s`` as a plain ``for`` statement."""
        pad = "  " * ind
        v = self._name(s.loop_var)
        mn, ext = self.expr(s.min), self.expr(s.extent)
        end = ext if isinstance(s.min, IntImm) and s.min.value == 0 else f"{mn} + {ext}"
        if pragma:
            out.append(f"{pad}{pragma}")
        out.append(f"{pad}for ({self.d.value_type(s.loop_var.dtype)} {v} = {mn}; {v} < {end}; ++{v}) {{")
        self._stmt(s.body, out, ind + 1)
        out.append(f"{pad}}}")
