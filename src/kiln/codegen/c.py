"""C code generator: PrimFuncs → one C translation unit with packed-signature functions.

Each PrimFunc ``f`` becomes ``KILN_DLL int32_t f(KilnValue* args, int32_t* type_codes,
int32_t num_args, KilnValue* ret, int32_t* ret_tcode, void* resource_handle)`` that checks
its arguments (count, type code, device, dtype, ndim, shape, compactness), reports a
mismatch through ``KilnAPISetLastError`` with a message naming the function and argument,
and then runs the loop nest on ``restrict`` typed pointers.

Value conventions inside expressions: float16 / bfloat16 values live in C ``float``
(converted on load and rounded on store or cast); bools are ``int`` 0/1 stored as bytes;
8/16-bit integer arithmetic is truncated back to its type after every operation so results
wrap like NumPy's.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ..runtime.errors import CompileError
from ..tir.dtype import bits_of, dl_code, is_bool, is_float, is_integer, is_uint
from ..tir.expr import (
    BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var,
)
from ..tir.functor import collect_vars, post_order_visit
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt
from .c_prelude import C_PRELUDE

__all__ = ["CCodeGen", "generate_c", "STACK_LIMIT_BYTES"]

#: Temporaries up to this size live on the stack; larger ones in KilnBackendAllocWorkspace memory.
STACK_LIMIT_BYTES = 32 * 1024

_STORAGE = {
    "bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double",
}
_SUFFIX = {"int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
           "uint32": "u32", "uint64": "u64", "bool": "i32"}

_MATH = {
    "exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "log10": "log10", "log1p": "log1p",
    "expm1": "expm1", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "sin": "sin", "cos": "cos", "tan": "tan",
    "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "floor": "floor", "ceil": "ceil", "trunc": "trunc",
    "round": "nearbyint", "fabs": "fabs", "pow": "pow", "atan2": "atan2", "fmod": "fmod",
}
_CBIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
         "eq": "==", "ne": "!=", "and": "&&", "or": "||", "bitand": "&", "bitor": "|", "bitxor": "^",
         "shl": "<<", "shr": ">>", "truncdiv": "/", "truncmod": "%"}


def value_ctype(dtype: str) -> str:
    """C type an expression of ``dtype`` is computed in."""
    if dtype in ("float16", "bfloat16", "float32"):
        return "float"
    if dtype == "bool":
        return "int32_t"
    return _STORAGE[dtype]


def storage_ctype(dtype: str) -> str:
    """C element type of a buffer of ``dtype``."""
    return _STORAGE[dtype]


def c_literal_float(v: float, dtype: str) -> str:
    """Exact C literal of a float constant (hex float; INFINITY / NAN macros)."""
    f = dtype != "float64"
    if v != v:
        return "NAN" if f else "(double)NAN"
    if v in (float("inf"), float("-inf")):
        s = "INFINITY" if v > 0 else "(-INFINITY)"
        return s if f else f"((double){s})"
    return float(v).hex() + ("f" if f else "")


def c_literal_int(v: int, dtype: str) -> str:
    """C literal of an integer constant of ``dtype``."""
    if dtype in ("int64",):
        return f"INT64_C({v})" if v != -(2**63) else "INT64_MIN"
    if dtype == "uint64":
        return f"UINT64_C({v})"
    if dtype in ("uint32",):
        return f"{v}u"
    if v == -(2**31):
        return "(-2147483647 - 1)"
    return str(v) if v >= 0 else f"({v})"


class _FuncState:
    def __init__(self, fname: str) -> None:
        self.fname = fname
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.nonneg: set[Var] = set()
        self.buffers: dict[int, Buffer] = {}
        self.par_depth = 0
        self.n_lambda = 0


class CCodeGen:
    """Accumulates PrimFuncs and produces one C translation unit (:meth:`finish`)."""

    def __init__(self, target: Any = None, stack_limit: int = STACK_LIMIT_BYTES) -> None:
        self.target = target
        self.stack_limit = stack_limit
        self.func_names: list[str] = []
        self._chunks: list[str] = []

    # ------------------------------------------------------------------ public
    def add_function(self, f: PrimFunc) -> None:
        """Generate the packed function for ``f`` (and its outlined parallel lambdas)."""
        name = f.attrs.get("global_symbol", f.name)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise CompileError(f"C codegen: {name!r} is not a valid C function name")
        if name in self.func_names:
            raise CompileError(f"C codegen: two functions named {name}")
        self.func_names.append(name)
        st = _FuncState(name)
        self._st = st
        self._lambdas: list[str] = []
        for b in f.params:
            self._buf_name(b)
        lines: list[str] = []
        w = lines.append
        n = len(f.params)
        w(f"KILN_DLL int32_t {name}(KilnValue* args, int32_t* type_codes, int32_t num_args, "
          "KilnValue* out_ret_value, int32_t* out_ret_tcode, void* resource_handle) {")
        w("  (void)out_ret_value; (void)out_ret_tcode; (void)resource_handle;")
        w(f"  if (num_args != {n}) return kiln_arg_error(\"{name}: expected {n} arguments "
          f"({', '.join(b.name for b in f.params)}), got %d\", num_args);")
        for i, b in enumerate(f.params):
            shape = ", ".join(f"INT64_C({s})" for s in b.shape) or "0"
            w(f"  {{ static const int64_t shape_[] = {{{shape}}};")
            w(f"    if (kiln_check_tensor(\"{name}\", {i}, \"{b.name}\", type_codes, args, {b.ndim}, shape_, "
              f"{dl_code(b.dtype)}, {bits_of(b.dtype)}) != 0) return -1; }}")
        for i, b in enumerate(f.params):
            ct = storage_ctype(b.dtype)
            nm = self._buf_name(b)
            w(f"  {ct}* restrict {nm} = ({ct}*)((char*)((DLTensor*)args[{i}].v_handle)->data + "
              f"((DLTensor*)args[{i}].v_handle)->byte_offset);")
        self._stmt(f.body, lines, 1)
        w("  return 0;")
        w("}")
        self._chunks.extend(self._lambdas)
        self._chunks.append("\n".join(lines))

    def finish(self) -> str:
        """The complete translation unit."""
        hdr = "/* Generated by kiln.codegen.c -- do not edit. */"
        return "\n".join([hdr, C_PRELUDE.strip(), *self._chunks]) + "\n"

    # ------------------------------------------------------------------ naming
    def _name(self, v: Var) -> str:
        st = self._st
        nm = st.names.get(id(v))
        if nm is None:
            base = re.sub(r"[^A-Za-z0-9_]", "_", v.name) or "v"
            if base[0].isdigit():
                base = "v" + base
            nm, k = base, 1
            while nm in st.used or nm in _RESERVED:
                nm, k = f"{base}_{k}", k + 1
            st.used.add(nm)
            st.names[id(v)] = nm
        return nm

    def _buf_name(self, b: Buffer) -> str:
        self._st.buffers[id(b.data)] = b
        return self._name(b.data)

    # ------------------------------------------------------------------ expressions
    def _nonneg(self, e: PrimExpr) -> bool:
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
        return False

    def expr(self, e: PrimExpr) -> str:
        """C text of an expression (in its value type, see :func:`value_ctype`)."""
        if isinstance(e, Var):
            return self._name(e)
        if isinstance(e, IntImm):
            if is_bool(e.dtype):
                return "1" if e.value else "0"
            return c_literal_int(e.value, e.dtype)
        if isinstance(e, FloatImm):
            return c_literal_float(e.value, e.dtype)
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
            ref = f"{self._buf_name(e.buffer)}[{self._offset(e.buffer, e.indices)}]"
            if e.dtype == "float16":
                return f"kiln_h2f({ref})"
            if e.dtype == "bfloat16":
                return f"kiln_bf2f({ref})"
            if is_bool(e.dtype):
                return f"((int32_t){ref})"
            return ref
        if isinstance(e, (ProducerLoad, Reduce)):
            raise CompileError("C codegen: tensor-expression node left in the loop IR; lower the schedule first")
        raise CompileError(f"C codegen: unsupported expression {type(e).__name__}")

    def _binary(self, e: BinaryOp) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        dt = e.a.dtype
        op = e.op
        if op in ("min", "max"):
            if is_float(dt):
                return f"kiln_f{op}{'' if dt == 'float64' else 'f'}({a}, {b})"
            return f"kiln_{op}_{_SUFFIX[dt]}({a}, {b})"
        if op in ("floordiv", "floormod"):
            if (self._nonneg(e.a) and self._nonneg(e.b)) or is_uint(dt):
                return f"({a} {'/' if op == 'floordiv' else '%'} {b})"
            return f"kiln_{op}_{_SUFFIX[dt]}({a}, {b})"
        if op in ("truncdiv", "truncmod", "shl", "shr", "bitand", "bitor", "bitxor"):
            s = f"({a} {_CBIN[op]} {b})"
        else:
            s = f"({a} {_CBIN[op]} {b})"
        if e.dtype in ("int8", "int16", "uint8", "uint16", "uint32") and op not in ("lt", "le", "gt", "ge", "eq",
                                                                                  "ne", "and", "or"):
            s = f"(({_STORAGE[e.dtype]}){s})"  # wrap like numpy instead of C's int promotion
        return s

    def _cast(self, e: Cast) -> str:
        src, dst = e.value.dtype, e.dtype
        v = self.expr(e.value)
        if dst == "bool":
            return f"({v} != 0)"
        if dst == "float16":
            return f"kiln_h2f(kiln_f2h((float){v}))"
        if dst == "bfloat16":
            return f"kiln_bf2f(kiln_f2bf((float){v}))"
        if is_float(src) and is_integer(dst):
            return f"(({_STORAGE[dst]}){v})"
        return f"(({value_ctype(dst)}){v})"

    def _call(self, e: Call) -> str:
        args = [self.expr(a) for a in e.args]
        if e.op in ("isnan", "isinf", "isfinite"):
            return f"({e.op}({args[0]}) != 0)"
        fn = _MATH.get(e.op)
        if fn is None:
            raise CompileError(f"C codegen: unknown intrinsic {e.op!r}")
        adt = e.args[0].dtype
        if adt != "float64":
            fn += "f"
        return f"{fn}({', '.join(args)})"

    def _offset(self, b: Buffer, indices: Sequence[PrimExpr]) -> str:
        if len(indices) != b.ndim:
            raise CompileError(f"C codegen: buffer {b.name} indexed with {len(indices)} indices, has {b.ndim} dims")
        if b.ndim == 0:
            return "0"
        from ..tir.simplify import simplify

        flat: PrimExpr | None = None
        wide = b.size >= 2**31
        for idx, stride in zip(indices, b.strides):
            if wide and idx.dtype != "int64":
                from ..tir.expr import cast

                idx = cast(idx, "int64")
            term = idx * stride
            flat = term if flat is None else flat + term
        flat = simplify(flat, {v: (0, 2**31 - 1) for v in self._st.nonneg})
        return self.expr(flat)

    # ------------------------------------------------------------------ statements
    def _stmt(self, s: Stmt, out: list[str], ind: int) -> None:
        pad = "  " * ind
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._stmt(x, out, ind)
        elif isinstance(s, For):
            self._for(s, out, ind)
        elif isinstance(s, BufferStore):
            b = s.buffer
            v = self.expr(s.value)
            if b.dtype == "float16":
                v = f"kiln_f2h({v})"
            elif b.dtype == "bfloat16":
                v = f"kiln_f2bf({v})"
            elif is_bool(b.dtype):
                v = f"(uint8_t)({v} != 0)"
            out.append(f"{pad}{self._buf_name(b)}[{self._offset(b, s.indices)}] = {v};")
        elif isinstance(s, Allocate):
            self._allocate(s, out, ind)
        elif isinstance(s, IfThenElse):
            out.append(f"{pad}if ({self.expr(s.cond)}) {{")
            self._stmt(s.then_case, out, ind + 1)
            if s.else_case is not None:
                out.append(f"{pad}}} else {{")
                self._stmt(s.else_case, out, ind + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, LetStmt):
            out.append(f"{pad}{{")
            out.append(f"{pad}  const {value_ctype(s.var.dtype)} {self._name(s.var)} = {self.expr(s.value)};")
            if is_integer(s.var.dtype) and self._nonneg(s.value):
                self._st.nonneg.add(s.var)
            self._stmt(s.body, out, ind + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, Evaluate):
            if not isinstance(s.value, (IntImm, FloatImm)):
                out.append(f"{pad}(void)({self.expr(s.value)});")
        else:
            raise CompileError(f"C codegen: unsupported statement {type(s).__name__}")

    def _allocate(self, s: Allocate, out: list[str], ind: int) -> None:
        pad = "  " * ind
        b = s.buffer
        nm = self._buf_name(b)
        ct = storage_ctype(b.dtype)
        out.append(f"{pad}{{")
        if b.scope == "local" or b.nbytes <= self.stack_limit:
            out.append(f"{pad}  {ct} {nm}[{max(b.size, 1)}] __attribute__((aligned(64)));")
            self._stmt(s.body, out, ind + 1)
        else:
            out.append(f"{pad}  {ct}* restrict {nm} = ({ct}*)KilnBackendAllocWorkspace(1, 0, UINT64_C({b.nbytes}), "
                       f"{dl_code(b.dtype)}, {bits_of(b.dtype)});")
            out.append(f"{pad}  if ({nm} == NULL) return -1;")
            self._stmt(s.body, out, ind + 1)
            out.append(f"{pad}  KilnBackendFreeWorkspace(1, 0, {nm});")
        out.append(f"{pad}}}")

    def _for(self, s: For, out: list[str], ind: int) -> None:
        pad = "  " * ind
        v = self._name(s.loop_var)
        ct = value_ctype(s.loop_var.dtype)
        if self._nonneg(s.min):
            self._st.nonneg.add(s.loop_var)
        if s.kind == "parallel" and self._st.par_depth == 0:
            self._parallel_for(s, out, ind)
            return
        mn, ext = self.expr(s.min), self.expr(s.extent)
        end = ext if isinstance(s.min, IntImm) and s.min.value == 0 else f"{mn} + {ext}"
        if s.kind == "vectorized":
            out.append(f"{pad}#pragma GCC ivdep")
        elif s.kind == "unrolled":
            n = s.extent.value if isinstance(s.extent, IntImm) else 8
            out.append(f"{pad}#pragma GCC unroll {max(1, min(n, 256))}")
        out.append(f"{pad}for ({ct} {v} = {mn}; {v} < {end}; ++{v}) {{")
        self._stmt(s.body, out, ind + 1)
        out.append(f"{pad}}}")

    def _parallel_for(self, s: For, out: list[str], ind: int) -> None:
        """Outline the loop body into a lambda run by KilnBackendParallelLaunch over chunks."""
        pad = "  " * ind
        st = self._st
        lam = f"{st.fname}_compute_{st.n_lambda}"
        st.n_lambda += 1
        # free variables: scalars bound outside, and buffers declared outside
        inner_defined: set[int] = set()
        bufs_used: dict[int, Buffer] = {}

        def visit(n: Any) -> None:
            if isinstance(n, For):
                inner_defined.add(id(n.loop_var))
            elif isinstance(n, LetStmt):
                inner_defined.add(id(n.var))
            elif isinstance(n, Allocate):
                inner_defined.add(id(n.buffer.data))
            elif isinstance(n, (Load, BufferStore)):
                bufs_used[id(n.buffer.data)] = n.buffer

        post_order_visit(s.body, visit)
        scalars = [v for v in collect_vars(s.body) if v.dtype != "handle" and id(v) not in inner_defined
                   and v is not s.loop_var]
        scalars.sort(key=lambda v: self._name(v))
        bufs = [b for k, b in bufs_used.items() if k not in inner_defined]
        bufs.sort(key=lambda b: self._buf_name(b))
        members = [(f"{storage_ctype(b.dtype)}*", self._buf_name(b)) for b in bufs]
        members += [(value_ctype(v.dtype), self._name(v)) for v in scalars]
        members += [("int32_t", "kiln_min_"), ("int32_t", "kiln_ext_")]
        lines: list[str] = [f"typedef struct {{ {' '.join(f'{t} {n};' for t, n in members)} }} {lam}_closure_t;",
                            f"static int32_t {lam}(int32_t task_id, int32_t num_task, void* cdata) {{",
                            f"  {lam}_closure_t* c_ = ({lam}_closure_t*)cdata;"]
        for b in bufs:
            t = storage_ctype(b.dtype)
            lines.append(f"  {t}* restrict {self._buf_name(b)} = c_->{self._buf_name(b)};")
        for v in scalars:
            lines.append(f"  const {value_ctype(v.dtype)} {self._name(v)} = c_->{self._name(v)};")
        lines.append("  const int32_t chunk_ = (c_->kiln_ext_ + num_task - 1) / num_task;")
        lines.append("  const int32_t begin_ = task_id * chunk_;")
        lines.append("  const int32_t end_ = begin_ + chunk_ < c_->kiln_ext_ ? begin_ + chunk_ : c_->kiln_ext_;")
        v = self._name(s.loop_var)
        lines.append(f"  for (int32_t {v} = c_->kiln_min_ + begin_; {v} < c_->kiln_min_ + end_; ++{v}) {{")
        st.par_depth += 1
        self._stmt(s.body, lines, 2)
        st.par_depth -= 1
        lines.append("  }")
        lines.append("  return 0;")
        lines.append("}")
        self._lambdas.append("\n".join(lines))
        init = ", ".join([self._buf_name(b) for b in bufs] + [self._name(x) for x in scalars]
                         + [self.expr(s.min), self.expr(s.extent)])
        out.append(f"{pad}{{")
        out.append(f"{pad}  {lam}_closure_t c_ = {{{init}}};")
        out.append(f"{pad}  int32_t nt_ = KilnGetNumThreads();")
        out.append(f"{pad}  if (nt_ > c_.kiln_ext_) nt_ = c_.kiln_ext_;")
        out.append(f"{pad}  if (nt_ > 0 && KilnBackendParallelLaunch({lam}, &c_, nt_) != 0) return -1;")
        out.append(f"{pad}}}")


_RESERVED = {
    "args", "type_codes", "num_args", "out_ret_value", "out_ret_tcode", "resource_handle", "c_", "nt_", "chunk_",
    "begin_", "end_", "task_id", "num_task", "cdata", "shape_", "int", "float", "double", "char", "short", "long",
    "if", "else", "for", "while", "do", "return", "const", "static", "void", "struct", "union", "switch", "case",
    "default", "break", "continue", "goto", "sizeof", "typedef", "auto", "register", "signed", "unsigned",
    "volatile", "extern", "restrict", "inline", "enum", "exp", "log", "sqrt", "pow", "floor", "ceil", "round",
    "trunc", "fabs", "erf", "tanh", "sin", "cos", "tan", "abs", "main", "NAN", "INFINITY",
}


def generate_c(funcs: Sequence[PrimFunc], target: Any = None) -> tuple[str, list[str]]:
    """C source for ``funcs`` and the exported function names."""
    cg = CCodeGen(target)
    for f in funcs:
        cg.add_function(f)
    return cg.finish(), list(cg.func_names)
