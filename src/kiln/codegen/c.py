"""C code generator: PrimFuncs → one C translation unit with packed-signature functions.

:class:`CCodeGen` is the host-C language of the one C-style printer
(:class:`kiln.codegen.cstyle.CStylePrinter`, which owns naming, expressions, literals, offsets
and statements); this module adds only what host C does differently.

Each PrimFunc ``f`` becomes ``KILN_DLL int32_t f(KilnValue* args, int32_t* type_codes,
int32_t num_args, KilnValue* ret, int32_t* ret_tcode, void* resource_handle)`` that checks
its arguments (count, type code, device, dtype, ndim, shape, compactness), reports a
mismatch through ``KilnAPISetLastError`` with a message naming the function and argument,
and then runs the loop nest on ``restrict`` typed pointers.

Value conventions inside expressions: float16 / bfloat16 values live in C ``float``
(converted on load and rounded on store or cast); bools are ``int`` 0/1 stored as bytes;
8/16-bit integer arithmetic is truncated back to its type after every operation so results
wrap like NumPy's.

Explicit SIMD: a ``vectorized`` loop with a constant extent whose body is buffer stores
(:func:`kiln.tir.vectorize.plan_vector_loop`) is emitted as straight-line code on GCC
vector-extension types (``kiln_f32x8`` …, unaligned ``*_u`` variants for memory): contiguous
accesses become vector loads/stores, lane-invariant values broadcasts, other accesses are
gathered lane by lane; a ``min(C, bound)`` extent (tile tail) runs the vector body when the
tile is whole and the scalar loop otherwise.  float32 ``exp`` / ``erf`` / ``tanh`` use the
polynomial versions of :mod:`kiln.codegen.vmath` (scalar and vector) instead of libm.  Loops
are first passed through :func:`kiln.tir.unswitch.unswitch_loops` (tile guards hoisted).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.dtype import LOW_PRECISION_DTYPES
from ..runtime.errors import CompileError
from ..target.isa import isa_of
from ..tir.dtype import bits_of, dl_bits, dl_code, is_bool, is_float
from ..tir.expr import BinaryOp, Call, Cast, IntImm, Load, Not, PrimExpr, Select, Var
from ..tir.functor import collect_vars, loop_closure, post_order_visit
from ..tir.intrin import SET_EXTENT, set_extent_targets
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, PrimFunc
from ..tir.unswitch import unswitch_loops
from ..tir.vectorize import (VECTOR_DTYPES, flat_index, plan_vector_loop, split_min_extent, stride_in,
                             tail_chunks)
from .c_prelude import C_PRELUDE, C_PRELUDE_END
from .cstyle import C_KEYWORDS, INFIX_OPS, CDialect, CStylePrinter, Scope
from .vmath import VECTOR_MATH, emit_math

__all__ = ["CCodeGen", "HostC", "generate_c", "STACK_LIMIT_BYTES", "target_vector_bytes"]

#: Temporaries up to this size live on the stack; larger ones in KilnBackendAllocWorkspace memory.
STACK_LIMIT_BYTES = 32 * 1024


class HostC(CDialect):
    """C99 with ``<stdint.h>`` / ``<math.h>`` as the host compiler sees it (GCC / Clang)."""

    name = "C"
    type_names = {
        "bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
        "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
        "float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double",
        # low-precision storage types: one byte each, only loaded, stored and reinterpreted
        **{dt: "uint8_t" for dt in LOW_PRECISION_DTYPES},
    }

    def value_type(self, dtype: str) -> str:
        """Half floats compute in ``float`` (see the module docstring), bools in ``int32_t``."""
        return "float" if dtype in ("float16", "bfloat16") else super().value_type(dtype)

    def math_function(self, op: str, dtype: str) -> str:
        """libm name: ``f``-suffixed below float64; round-half-even is ``nearbyint``."""
        fn = "nearbyint" if op == "round" else op
        return fn if dtype == "float64" else fn + "f"


#: float16 / bfloat16: (load: storage bits -> float, store: float -> storage bits) helpers of the prelude.
_HALF_CONVERT = {"float16": ("kiln_h2f", "kiln_f2h"), "bfloat16": ("kiln_bf2f", "kiln_f2bf")}


def _c_string(text: str) -> str:
    """``text`` as a C string literal (printable ASCII kept, everything else escaped in octal)."""
    body = "".join(ch if 32 <= ord(ch) < 127 and ch not in '"\\?' else
                   "".join(f"\\{b:03o}" for b in ch.encode("utf-8")) for ch in text)
    return f'"{body}"'


class _FuncState(Scope):
    def __init__(self, fname: str) -> None:
        super().__init__()
        self.fname = fname
        self.par_depth = 0
        self.n_lambda = 0
        self.n_index = 0  # checked-index temporaries (kiln_ixN_)


class CCodeGen(CStylePrinter):
    """Accumulates PrimFuncs and produces one C translation unit (:meth:`finish`).

    The host-C generator of :class:`~kiln.codegen.cstyle.CStylePrinter` (language
    :class:`HostC`); it adds packed functions with argument checks, half-float loads, stores
    and casts, GCC vector code for vectorized loops, parallel loops outlined into lambdas,
    workspace allocation, and checked indices that return an error.

    Parameters
    ----------
    target : Target, optional
        Sets the SIMD width (:func:`target_vector_bytes`).
    stack_limit : int
        Temporaries up to this many bytes live on the stack, larger ones in workspace memory.
    """

    # the packed signature's and the parallel lambdas' own identifiers
    reserved = C_KEYWORDS | {
        "args", "type_codes", "num_args", "out_ret_value", "out_ret_tcode", "resource_handle", "c_", "nt_",
        "chunk_", "begin_", "end_", "task_id", "num_task", "cdata", "shape_",
    }
    _st: _FuncState

    def __init__(self, target: Any = None, stack_limit: int = STACK_LIMIT_BYTES) -> None:
        super().__init__(HostC())
        self.target = target
        self.stack_limit = stack_limit
        self.func_names: list[str] = []
        self._chunks: list[str] = []
        self.vector_bytes = target_vector_bytes(target)
        self._vtypes: dict[str, str] = {}  # name -> typedef text (+ helpers), in first-use order
        self._vmath: dict[str, str] = {}   # function name -> definition

    # ------------------------------------------------------------------ public
    def add_function(self, f: PrimFunc) -> None:
        """Generate the packed function for ``f`` (and its outlined parallel lambdas)."""
        name = f.attrs.get("global_symbol", f.name)
        self._check_symbol(name, self.func_names)
        self.func_names.append(name)
        self._st = _FuncState(name)
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
            shape = ", ".join(f"INT64_C({s})" for s in b.check_shape) or "0"
            w(f"  {{ static const int64_t shape_[] = {{{shape}}};")
            w(f"    if (kiln_check_tensor(\"{name}\", {i}, \"{b.name}\", type_codes, args, {b.ndim}, shape_, "
              f"{dl_code(b.dtype)}, {dl_bits(b.dtype)}) != 0) return -1; }}")
        self._bind_dyn(f, name, w)
        set_extent_targets(f)  # checks every reported (param, dim) names a real one
        for i, b in enumerate(f.params):
            ct = self.d.type_name(b.dtype)
            nm = self._buf_name(b)
            w(f"  {ct}* restrict {nm} = ({ct}*)((char*)((DLTensor*)args[{i}].v_handle)->data + "
              f"((DLTensor*)args[{i}].v_handle)->byte_offset);")
        self._stmt(unswitch_loops(f.body, f.params), lines, 1)
        w("  return 0;")
        w("}")
        self._chunks.extend(self._lambdas)
        self._chunks.append("\n".join(lines))

    def _bind_dyn(self, f: PrimFunc, name: str, w: Any) -> None:
        """Bind each dynamic extent from the first argument dim that carries it; later dims that
        carry the same Var must agree (the range ``[0, max]`` is checked by the crt)."""
        bound: dict[int, tuple[int, int]] = {}
        for i, b in enumerate(f.params):
            for d, v in enumerate(b.dyn or ()):
                if v is None:
                    continue
                ext = f"((DLTensor*)args[{i}].v_handle)->shape[{d}]"
                nm = self._name(v)
                if id(v) not in bound:
                    bound[id(v)] = (i, d)
                    self._st.nonneg.add(v)
                    w(f"  const {self.d.value_type(v.dtype)} {nm} = ({self.d.value_type(v.dtype)}){ext};")
                    continue
                j, e = bound[id(v)]
                w(f"  if ({ext} != (int64_t){nm}) return kiln_arg_error(\"{name}: argument {i} ({b.name}) dim {d} is "
                  f"%lld but argument {j} ({f.params[j].name}) dim {e} is %lld; both are the dynamic extent "
                  f"{v.name}\", (long long){ext}, (long long){nm});")

    def finish(self) -> str:
        """The complete translation unit."""
        hdr = "/* Generated by kiln.codegen.c -- do not edit. */"
        prelude = [C_PRELUDE.strip(), self.helper_source(), C_PRELUDE_END.strip()]
        return "\n".join([hdr, *prelude, *self._vtypes.values(), *self._vmath.values(), *self._chunks]) + "\n"

    # ------------------------------------------------------------------ expressions
    def _load_value(self, ref: str, dtype: str) -> str:
        if dtype in _HALF_CONVERT:
            return f"{_HALF_CONVERT[dtype][0]}({ref})"
        return super()._load_value(ref, dtype)

    def _store_value(self, value: str, dtype: str) -> str:
        if dtype in _HALF_CONVERT:
            return f"{_HALF_CONVERT[dtype][1]}({value})"
        return super()._store_value(value, dtype)

    def _cast(self, e: Cast) -> str:
        if e.dtype in _HALF_CONVERT:  # round to the narrow type, keep computing in float
            to_float, to_bits = _HALF_CONVERT[e.dtype]
            return f"{to_float}({to_bits}((float){self.expr(e.value)}))"
        return super()._cast(e)

    def _reinterpret(self, e: Call) -> str:
        """BitCast: the storage bits of the argument read as ``e.dtype`` (a GNU statement
        expression; ``memcpy`` is the aliasing-safe way to move bits between types)."""
        src, dst = e.args[0].dtype, e.dtype
        v = self.expr(e.args[0])
        bits = f"{_HALF_CONVERT[src][1]}({v})" if src in _HALF_CONVERT else v
        src_t, dst_t = self.d.type_name(src), self.d.type_name(dst)
        out = f"{_HALF_CONVERT[dst][0]}(kiln_rd_)" if dst in _HALF_CONVERT else "kiln_rd_"
        if dst == "bool":
            out = "(kiln_rd_ != 0)"
        return (f"({{ {src_t} kiln_rs_ = ({src_t})({bits}); {dst_t} kiln_rd_; "
                f"__builtin_memcpy(&kiln_rd_, &kiln_rs_, sizeof kiln_rd_); {out}; }})")

    def _math_call(self, e: Call, args: Sequence[str]) -> str:
        if e.op in VECTOR_MATH and e.args[0].dtype != "float64":
            return f"{self._math_fn(e.op, 1)}({args[0]})"
        return super()._math_call(e, args)

    def _checked_index(self, e: Call) -> str:
        """A GNU statement expression: wrap a negative index, return the error from the function
        being emitted (the kernel or a parallel lambda) for one outside ``[-n, n)``."""
        st = self._st
        t = f"kiln_ix{st.n_index}_"
        st.n_index += 1
        v, n = self.expr(e.args[0]), self.expr(e.args[1])
        return (f"({{ const int64_t {t} = {v}; if (__builtin_expect({t} < -{n} || {t} >= {n}, 0)) "
                f"return kiln_index_error(\"{st.fname}\", {_c_string(e.text)}, {t}, {n}); "
                f"{t} < 0 ? {t} + {n} : {t}; }})")

    # ------------------------------------------------------------------ statements
    def _evaluate(self, s: Evaluate, out: list[str], ind: int) -> None:
        v = s.value
        if not (isinstance(v, Call) and v.op == SET_EXTENT):
            super()._evaluate(s, out, ind)
            return
        if self._st.par_depth:
            # an outlined lambda has no ``args``; a count is final only after the loop anyway
            raise CompileError(f"C codegen: {self._st.fname}: {SET_EXTENT} inside a parallel loop")
        p, d = v.args[0], v.args[1]
        assert isinstance(p, IntImm) and isinstance(d, IntImm)  # set_extent_targets checked them
        out.append(f"{'  ' * ind}((DLTensor*)args[{p.value}].v_handle)->shape[{d.value}] = "
                   f"(int64_t)({self.expr(v.args[2])});")

    def _allocate(self, s: Allocate, out: list[str], ind: int) -> None:
        pad = "  " * ind
        b = s.buffer
        nm = self._buf_name(b)
        ct = self.d.type_name(b.dtype)
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

    def _special_loop(self, s: For, out: list[str], ind: int) -> bool:
        if s.kind == "parallel" and self._st.par_depth == 0:
            self._parallel_for(s, out, ind)
            return True
        return s.kind == "vectorized" and self._vector_for(s, out, ind)

    def _loop_pragma(self, s: For) -> str | None:
        if s.kind == "vectorized":
            return "#pragma GCC ivdep"
        if s.kind == "unrolled":
            n = s.extent.value if isinstance(s.extent, IntImm) else 8
            return f"#pragma GCC unroll {max(1, min(n, 256))}"
        return None

    # ------------------------------------------------------------------ explicit SIMD
    def _vector_for(self, s: For, out: list[str], ind: int) -> bool:
        """Emit a vectorized loop as GCC vector-extension code; False to keep the scalar loop."""
        if self.vector_bytes <= 0:
            return False
        ranges = {v: (0, 2**31 - 1) for v in self._st.nonneg}
        plan = plan_vector_loop(s, self.vector_bytes, ranges)
        if plan is not None:
            self._vector_body(plan, out, ind)
            return True
        sm = split_min_extent(s)
        if sm is None:
            return False
        full, bound = sm
        plan = plan_vector_loop(For(s.loop_var, s.min, IntImm(full), s.kind, s.body), self.vector_bytes, ranges)
        if plan is None:
            return False
        pad = "  " * ind
        # whole tiles take the full-width vector path
        out.append(f"{pad}if ({self.expr(bound)} >= {full}) {{")
        self._vector_body(plan, out, ind + 1)
        out.append(f"{pad}}} else {{")  # the last, partial tile: vector chunks of halving widths
        self._stmt(tail_chunks(s, full, bound), out, ind + 1)
        out.append(f"{pad}}}")
        return True

    def _vector_body(self, plan: Any, out: list[str], ind: int) -> None:
        from ..tir.functor import substitute
        from ..tir.simplify import simplify

        pad = "  " * ind
        v = plan.loop.loop_var
        base = plan.loop.min.value
        self._vranges = {x: (0, 2**31 - 1) for x in self._st.nonneg}
        self._vranges[v] = (base, base + plan.loop.extent.value - 1)
        for o, w in plan.chunks:
            if w == 1:
                c = IntImm(base + o, v.dtype)
                for stv in plan.stores:
                    self._stmt(BufferStore(stv.buffer, simplify(substitute(stv.value, {v: c})),
                                           [simplify(substitute(i, {v: c})) for i in stv.indices]), out, ind)
                continue
            cx = (v, base + o, w)
            for stv in plan.stores:
                dt = stv.buffer.dtype
                val, kind = self._vx(stv.value, cx)
                if kind is None:
                    val = f"{self._bcast_fn(dt, w)}({val})"
                ut = self._vtype(dt, w, unaligned=True)
                off = self._offset_at(stv.buffer, stv.indices, v, base + o)
                out.append(f"{pad}*({ut}*)&{self._buf_name(stv.buffer)}[{off}] = {val};")

    def _offset_at(self, b: Buffer, indices: Sequence[PrimExpr], v: Var, at: int) -> str:
        from ..tir.functor import substitute

        c = IntImm(at, v.dtype)
        return self._offset(b, [substitute(i, {v: c}) for i in indices])

    def _vtype(self, dtype: str, w: int, unaligned: bool = False) -> str:
        """Name of the GCC vector type of ``w`` lanes of ``dtype`` (declared on first use)."""
        short = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}[dtype]
        nm = f"kiln_{short}x{w}"
        if nm not in self._vtypes:
            ct = self.d.type_name(dtype)
            nb = w * bits_of(dtype) // 8
            args = ", ".join(["x"] * w)
            self._vtypes[nm] = (
                f"typedef {ct} {nm} __attribute__((vector_size({nb})));\n"
                f"typedef {ct} {nm}_u __attribute__((vector_size({nb}), aligned({bits_of(dtype) // 8}), may_alias));\n"
                f"static inline {nm} {nm}_bc({ct} x) {{ {nm} r = {{{args}}}; return r; }}")
        return nm + ("_u" if unaligned else "")

    def _bcast_fn(self, dtype: str, w: int) -> str:
        return self._vtype(dtype, w) + "_bc"

    def _math_fn(self, op: str, w: int) -> str:
        """Name of the float32 ``op`` (``kiln.codegen.vmath``) for ``w`` lanes, defined on first use."""
        nm = f"kiln_v{op}_f32x{w}"
        if nm not in self._vmath:
            em = _CMathEmitter(self, w)
            res = emit_math(op, em, "x")
            vt = "float" if w == 1 else self._vtype("float32", w)
            body = "\n".join(f"  {ln}" for ln in em.lines)
            self._vmath[nm] = f"static inline {vt} {nm}({vt} x) {{\n{body}\n  return {res};\n}}"
        return nm

    def _depends(self, e: PrimExpr, v: Var) -> bool:
        return v in collect_vars(e)

    def _vx(self, e: PrimExpr, cx: tuple[Var, int, int]) -> tuple[str, str | None]:
        """Vector C text of ``e`` for lanes ``v = o .. o + w - 1``.

        Returns ``(text, kind)``: kind None means a scalar (lane-invariant) value, a dtype
        a vector of it, ``"mask32"`` / ``"mask64"`` a comparison result (-1 / 0 lanes).
        """
        v, o, w = cx
        if not self._depends(e, v):
            return self.expr(e), None
        if isinstance(e, Var):
            if e.dtype not in VECTOR_DTYPES:
                return self._lanewise(e, cx)
            return f"(({self._vtype(e.dtype, w)}){{{', '.join(str(o + i) for i in range(w))}}})", e.dtype
        if isinstance(e, Load):
            if e.dtype in VECTOR_DTYPES and stride_in(flat_index(e.buffer, e.indices), v, self._vranges) == 1:
                ut = self._vtype(e.dtype, w, unaligned=True)
                return (f"(*(const {ut}*)&{self._buf_name(e.buffer)}[{self._offset_at(e.buffer, e.indices, v, o)}])",
                        e.dtype)
            return self._lanewise(e, cx)
        if isinstance(e, BinaryOp):
            return self._vbinary(e, cx)
        if isinstance(e, Not):
            a, k = self._vx(e.a, cx)
            if k in ("mask32", "mask64"):
                return f"(~{a})", k
            return self._lanewise(e, cx)
        if isinstance(e, Cast):
            src, dst = e.value.dtype, e.dtype
            if src in VECTOR_DTYPES and dst in VECTOR_DTYPES:
                a, k = self._vx(e.value, cx)
                if k == src:
                    if src == dst:
                        return a, k
                    return f"__builtin_convertvector({a}, {self._vtype(dst, w)})", dst
            return self._lanewise(e, cx)
        if isinstance(e, Call):
            if e.op in VECTOR_MATH and e.dtype == "float32" and e.args[0].dtype == "float32":
                a, k = self._vx(e.args[0], cx)
                if k == "float32":
                    return f"{self._math_fn(e.op, w)}({a})", "float32"
            return self._lanewise(e, cx)
        if isinstance(e, Select):
            if e.dtype in VECTOR_DTYPES and not self._depends(e.cond, v) and (
                    _has_load(e.true_value) or _has_load(e.false_value)):
                # the condition is the same for every lane: C's ?: evaluates only the arm taken,
                # so the loads of the other never run
                a, ka = self._vx(e.true_value, cx)
                b, kb = self._vx(e.false_value, cx)
                vt = self._vtype(e.dtype, w)  # a load's unaligned type and a splat's must agree
                return (f"({self.expr(e.cond)} ? ({vt}){self._as_vec(a, ka, e.dtype, w)} : "
                        f"({vt}){self._as_vec(b, kb, e.dtype, w)})"), e.dtype
            if e.dtype in VECTOR_DTYPES and not _has_load(e.true_value) and not _has_load(e.false_value):
                m, km = self._vx(e.cond, cx)
                a, ka = self._vx(e.true_value, cx)
                b, kb = self._vx(e.false_value, cx)
                if km == f"mask{bits_of(e.dtype)}":
                    return self._vsel(m, a, ka, b, kb, e.dtype, w), e.dtype
            return self._lanewise(e, cx)
        return self._lanewise(e, cx)

    def _as_vec(self, text: str, kind: str | None, dtype: str, w: int) -> str:
        return f"{self._bcast_fn(dtype, w)}({text})" if kind is None else text

    def _vsel(self, m: str, a: str, ka: str | None, b: str, kb: str | None, dtype: str, w: int) -> str:
        vt = self._vtype(dtype, w)
        it = self._vtype("int32" if bits_of(dtype) == 32 else "int64", w)
        a, b = self._as_vec(a, ka, dtype, w), self._as_vec(b, kb, dtype, w)
        return f"(({vt})((({it}){a} & {m}) | (({it}){b} & ~{m})))"

    def _vbinary(self, e: BinaryOp, cx: tuple[Var, int, int]) -> tuple[str, str | None]:
        v, o, w = cx
        op, dt = e.op, e.a.dtype
        if op in ("and", "or"):
            a, ka = self._vx(e.a, cx)
            b, kb = self._vx(e.b, cx)
            kinds = {k for k in (ka, kb) if k is not None}
            if len(kinds) == 1 and next(iter(kinds)) in ("mask32", "mask64"):
                k = next(iter(kinds))
                it = self._vtype("int32" if k == "mask32" else "int64", w)
                if ka is None:
                    a = f"{it}_bc(-({self.d.type_name('int32' if k == 'mask32' else 'int64')})({a}))"
                if kb is None:
                    b = f"{it}_bc(-({self.d.type_name('int32' if k == 'mask32' else 'int64')})({b}))"
                return f"({a} {'&' if op == 'and' else '|'} {b})", k
            return self._lanewise(e, cx)
        if dt not in VECTOR_DTYPES:
            return self._lanewise(e, cx)
        fl = is_float(dt)
        if op not in ("add", "sub", "mul", "min", "max", "lt", "le", "gt", "ge", "eq", "ne") and not (
                fl and op == "div"):
            return self._lanewise(e, cx)
        a, ka = self._vx(e.a, cx)
        b, kb = self._vx(e.b, cx)
        if (ka is not None and ka != dt) or (kb is not None and kb != dt):
            return self._lanewise(e, cx)
        a, b = self._as_vec(a, ka, dt, w), self._as_vec(b, kb, dt, w)
        mk = f"mask{bits_of(dt)}"
        if op in ("min", "max"):
            cmp = ">" if op == "max" else "<"
            m = f"(({a} {cmp} {b}) | ({a} != {a}))" if fl else f"({a} {cmp} {b})"
            return self._vsel(m, a, dt, b, dt, dt, w), dt
        if op in _CMPS:
            return f"({a} {INFIX_OPS[op]} {b})", mk
        return f"({a} {INFIX_OPS[op]} {b})", dt

    def _lanewise(self, e: PrimExpr, cx: tuple[Var, int, int]) -> tuple[str, str | None]:
        """Fallback: evaluate ``e`` once per lane with scalar code and pack the lanes."""
        from ..tir.functor import substitute
        from ..tir.simplify import simplify

        v, o, w = cx
        lanes = [self.expr(simplify(substitute(e, {v: IntImm(o + i, v.dtype)}))) for i in range(w)]
        if e.dtype in VECTOR_DTYPES:
            return f"(({self._vtype(e.dtype, w)}){{{', '.join(lanes)}}})", e.dtype
        if is_bool(e.dtype):
            return f"(({self._vtype('int32', w)}){{{', '.join(f'-(int32_t)({x})' for x in lanes)}}})", "mask32"
        raise CompileError(f"C codegen: internal: no vector form for a {e.dtype} expression in a vectorized loop")

    def _parallel_for(self, s: For, out: list[str], ind: int) -> None:
        """Outline the loop body into a lambda run by KilnBackendParallelLaunch over chunks."""
        pad = "  " * ind
        st = self._st
        lam = f"{st.fname}_compute_{st.n_lambda}"
        st.n_lambda += 1
        bufs, scalars = loop_closure(s)  # what the outlined body needs from outside
        scalars.sort(key=lambda v: self._name(v))
        bufs.sort(key=lambda b: self._buf_name(b))
        members = [(f"{self.d.type_name(b.dtype)}*", self._buf_name(b)) for b in bufs]
        members += [(self.d.value_type(v.dtype), self._name(v)) for v in scalars]
        members += [("int32_t", "kiln_min_"), ("int32_t", "kiln_ext_")]
        lines: list[str] = [f"typedef struct {{ {' '.join(f'{t} {n};' for t, n in members)} }} {lam}_closure_t;",
                            f"static int32_t {lam}(int32_t task_id, int32_t num_task, void* cdata) {{",
                            f"  {lam}_closure_t* c_ = ({lam}_closure_t*)cdata;"]
        for b in bufs:
            t = self.d.type_name(b.dtype)
            lines.append(f"  {t}* restrict {self._buf_name(b)} = c_->{self._buf_name(b)};")
        for v in scalars:
            lines.append(f"  const {self.d.value_type(v.dtype)} {self._name(v)} = c_->{self._name(v)};")
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


_CMPS = ("lt", "le", "gt", "ge", "eq", "ne")


def _has_load(e: PrimExpr) -> bool:
    found = False

    def f(n: Any) -> None:
        nonlocal found
        found = found or isinstance(n, Load)

    post_order_visit(e, f)
    return found


class _CMathEmitter:
    """:class:`kiln.codegen.vmath.MathEmitter` writing C statements (``w == 1``: scalar C)."""

    def __init__(self, cg: "CCodeGen", w: int) -> None:
        self.cg = cg
        self.w = w
        self.lines: list[str] = []
        self.n = 0
        self.ft = "float" if w == 1 else cg._vtype("float32", w)
        self.it = "int32_t" if w == 1 else cg._vtype("int32", w)

    def _t(self, ty: str, text: str) -> str:
        nm = f"t{self.n}"
        self.n += 1
        self.lines.append(f"const {ty} {nm} = {text};")
        return nm

    def c(self, v: float) -> str:
        lit = self.cg.float_literal(v, "float32")
        return lit if self.w == 1 else f"{self.ft}_bc({lit})"

    def ic(self, v: int) -> str:
        lit = self.cg.int_literal(v, "int32")
        return lit if self.w == 1 else f"{self.it}_bc({lit})"

    def add(self, a: str, b: str) -> str:
        return self._t(self.ft, f"{a} + {b}")

    def sub(self, a: str, b: str) -> str:
        return self._t(self.ft, f"{a} - {b}")

    def mul(self, a: str, b: str) -> str:
        return self._t(self.ft, f"{a} * {b}")

    def div(self, a: str, b: str) -> str:
        return self._t(self.ft, f"{a} / {b}")

    def lt(self, a: str, b: str) -> str:
        return self._t("int32_t" if self.w == 1 else self.it, f"{a} < {b}")

    def isnan(self, a: str) -> str:
        return self._t("int32_t" if self.w == 1 else self.it, f"{a} != {a}")

    def sel(self, m: str, a: str, b: str) -> str:
        if self.w == 1:
            return self._t(self.ft, f"{m} ? {a} : {b}")
        return self._t(self.ft, f"({self.ft})((({self.it}){a} & {m}) | (({self.it}){b} & ~{m}))")

    def f2i(self, a: str) -> str:
        if self.w == 1:
            return self._t(self.it, f"(int32_t){a}")
        return self._t(self.it, f"__builtin_convertvector({a}, {self.it})")

    def bits(self, a: str) -> str:
        if self.w == 1:
            nm = self._t(self.it, "0")
            self.lines[-1] = f"int32_t {nm}; memcpy(&{nm}, &{a}, 4);"
            return nm
        return self._t(self.it, f"({self.it}){a}")

    def from_bits(self, i: str) -> str:
        if self.w == 1:
            nm = self._t(self.ft, "0")
            self.lines[-1] = f"float {nm}; memcpy(&{nm}, &{i}, 4);"
            return nm
        return self._t(self.ft, f"({self.ft}){i}")

    def iadd(self, a: str, b: str) -> str:
        return self._t(self.it, f"{a} + {b}")

    def isub(self, a: str, b: str) -> str:
        return self._t(self.it, f"{a} - {b}")

    def iand(self, a: str, b: str) -> str:
        return self._t(self.it, f"{a} & {b}")

    def ior(self, a: str, b: str) -> str:
        return self._t(self.it, f"{a} | {b}")

    def ishl(self, a: str, n: int) -> str:
        return self._t(self.it, f"{a} << {n}")

    def ishr(self, a: str, n: int) -> str:
        return self._t(self.it, f"{a} >> {n}")


def target_vector_bytes(target: Any) -> int:
    """SIMD register width (bytes) the codegens vectorize for; 0 disables explicit SIMD.

    The target's instruction-set model decides (:func:`kiln.target.isa_of`, the same one the
    CPU schedules tile for): ``llvm`` without ``-mcpu`` is the SSE2 baseline (16), a ``c``
    target without ``-mcpu`` / ``-mtriple`` this machine, ``-mcpu=haswell`` 32,
    ``-mattr=+avx512f`` 64, a scalar ISA (RISC-V without ``V``) 0.  No target at all (``None``,
    direct :class:`CCodeGen` use) means plain ``llvm``.  A ``vectorize=False`` attribute (a
    plug-in kind's option) turns explicit SIMD off.
    """
    attrs = getattr(target, "attrs", None) or {}
    if attrs.get("vectorize", True) is False:
        return 0
    return isa_of("llvm" if target is None else target).vector_bytes


def generate_c(funcs: Sequence[PrimFunc], target: Any = None) -> tuple[str, list[str]]:
    """C source for ``funcs`` and the exported function names."""
    cg = CCodeGen(target)
    for f in funcs:
        cg.add_function(f)
    return cg.finish(), list(cg.func_names)
