"""LLVM IR generation (llvmlite.ir) for PrimFuncs; the same ABI as the C codegen.

Per PrimFunc ``f`` the module gets

* ``f`` — the exported packed function: checks arguments exactly like the C codegen
  (messages name the function, argument index and name, expected vs. got), unpacks the
  data pointers and calls
* ``f_compute_`` — internal, one ``noalias`` pointer per buffer (LLVM's ``restrict``, kept
  as scoped-alias metadata when inlined), which runs the loop nest; then the dynamic extents,
  then the ``DLTensor::shape`` arrays of the outputs whose extents it reports
  (:data:`kiln.tir.SET_EXTENT`);
* ``f_parN`` / ``f_parN_body`` — for each parallel loop, the lambda handed to
  ``__KilnBackendParallelLaunch`` (it unpacks a closure struct and runs its chunk of the
  range) and the ``noalias`` body it calls.

Value conventions match the C codegen: float16/bfloat16 are computed in ``float`` (half is
converted by ``fpext``/``fptrunc``, bfloat16 by bit operations with round-to-nearest-even),
bools are ``i1`` stored as ``i8``.  Loops marked ``vectorized`` with a constant extent become
``<N x T>`` code (same plan as the C codegen: :mod:`kiln.tir.vectorize`; the rest is left to
LLVM's loop vectorizer); ``unrolled`` loops with a constant extent up to 64 are unrolled (in
:func:`kiln.tir.unswitch.unswitch_loops`, which also hoists tile guards).  Float ``fadd`` /
``fsub`` / ``fmul`` carry the ``contract`` flag (FMA formation, like gcc's default
``-ffp-contract=fast``); the add of a float sum into a one-element accumulator also carries
``reassoc`` so reductions vectorize.  float32 ``exp`` / ``erf`` / ``tanh`` are internal
always-inline polynomial functions (:mod:`kiln.codegen.vmath`), scalar and per vector width.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import llvmlite.ir as ir

from ..runtime.errors import CompileError
from ..tir.dtype import bits_of, dl_bits, dl_code, is_bool, is_float, is_integer, is_uint
from ..tir.expr import (
    CHECKED_INDEX, BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var,
)
from ..tir.functor import collect_vars, loop_closure, post_order_visit
from ..tir.intrin import SET_EXTENT, set_extent_targets
from ..tir.simplify import simplify
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt
from ..tir.unswitch import unswitch_loops
from ..tir.vectorize import (VECTOR_DTYPES, flat_index, plan_vector_loop, split_min_extent, stride_in,
                             tail_chunks)
from .c import STACK_LIMIT_BYTES
from .vmath import VECTOR_MATH, emit_math

__all__ = ["LLVMCodeGen"]

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
DLTENSOR = ir.LiteralStructType([PTR, ir.LiteralStructType([I32, I32]), I32,
                                 ir.LiteralStructType([I8, I8, I16]), PTR, PTR, I64])
PACKED_FTY = ir.FunctionType(I32, [PTR, PTR, I32, PTR, PTR, PTR])
LAMBDA_FTY = ir.FunctionType(I32, [I32, I32, PTR])

_INTRINSIC = {"exp": "llvm.exp", "exp2": "llvm.exp2", "log": "llvm.log", "log2": "llvm.log2",
              "log10": "llvm.log10", "sqrt": "llvm.sqrt", "sin": "llvm.sin", "cos": "llvm.cos",
              "floor": "llvm.floor", "ceil": "llvm.ceil", "trunc": "llvm.trunc", "round": "llvm.roundeven",
              "fabs": "llvm.fabs", "pow": "llvm.pow"}
_LIBM = {"tanh", "erf", "log1p", "expm1", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
         "atanh", "atan2", "fmod"}
#: BitCast's intrinsic (``kiln.topi.integer.REINTERPRET``): same bits, another dtype.
_REINTERPRET = "kiln.reinterpret"
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def storage_type(dtype: str) -> ir.Type:
    """LLVM type of one buffer element."""
    if dtype in ("float16", "bfloat16"):
        return I16
    if dtype == "float32":
        return F32
    if dtype == "float64":
        return F64
    if dtype == "bool":
        return I8
    if dtype == "handle":
        return PTR
    return ir.IntType(bits_of(dtype))


def value_type(dtype: str) -> ir.Type:
    """LLVM type expressions of ``dtype`` are computed in."""
    if dtype in ("float16", "bfloat16", "float32"):
        return F32
    if dtype == "bool":
        return I1
    return storage_type(dtype)


def _nsw(v: Any) -> Any:
    if isinstance(v, ir.Instruction) and "nsw" not in v.flags:
        v.flags.append("nsw")
    return v


def _safe(e: PrimExpr) -> bool:
    """True when evaluating ``e`` speculatively cannot fault (no loads, no integer division)."""
    ok = True

    def f(n: Any) -> None:
        nonlocal ok
        if isinstance(n, Load) or (isinstance(n, BinaryOp) and n.op in ("floordiv", "floormod", "truncdiv",
                                                                         "truncmod") and is_integer(n.dtype)):
            ok = False
        elif isinstance(n, Call) and n.op == CHECKED_INDEX:
            ok = False  # it may leave the function: never speculate it

    post_order_visit(e, f)
    return ok


class _Fn:
    """Emission state of one LLVM function."""

    def __init__(self, fn: ir.Function, fname: str) -> None:
        self.fn = fn
        self.fname = fname
        self.entry = fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.vars: dict[Var, ir.Value] = {}
        self.bufs: dict[int, ir.Value] = {}
        self.nonneg: set[Var] = set()
        self.par_depth = 0
        #: parameter index -> its DLTensor's ``shape`` array (params whose extents are reported)
        self.shapes: dict[int, ir.Value] = {}
        #: id(node) -> uses the lane variable, for the vector loop being emitted (VectorPlan.uses)
        self.vuses: dict[int, bool] = {}


class LLVMCodeGen:
    """Builds one ``llvmlite.ir.Module`` from PrimFuncs (:meth:`add_function`, :meth:`finish`)."""

    def __init__(self, triple: str, data_layout: str = "", stack_limit: int = STACK_LIMIT_BYTES) -> None:
        self.module = ir.Module(name="kiln")
        self.module.triple = triple
        if data_layout:
            self.module.data_layout = data_layout
        self.stack_limit = stack_limit
        self.func_names: list[str] = []
        self._strings: dict[str, ir.GlobalVariable] = {}
        self._decls: dict[str, ir.Function] = {}
        self._globals: dict[str, ir.GlobalVariable] = {}
        self._n_par = 0
        #: SIMD register width in bytes for explicit vector code (0: leave loops to LLVM).  A
        #: placeholder: :mod:`kiln.codegen.llvm_module` sets it from the target's ISA model
        #: (``target_vector_bytes`` -> :func:`kiln.target.isa_of`) before any function is added;
        #: 16 (SSE2, what plain ``llvm`` means) only serves a generator used on its own.
        self.vector_bytes = 16

    # ------------------------------------------------------------------ module-level helpers
    def _declare(self, name: str, fty: ir.FunctionType) -> ir.Function:
        f = self._decls.get(name)
        if f is None:
            f = ir.Function(self.module, fty, name=name)
            self._decls[name] = f
        return f

    def _extern_ptr(self, name: str) -> ir.GlobalVariable:
        g = self._globals.get(name)
        if g is None:
            g = ir.GlobalVariable(self.module, PTR, name=name)
            g.linkage = "external"
            self._globals[name] = g
        return g

    def _cstr(self, s: str) -> ir.GlobalVariable:
        g = self._strings.get(s)
        if g is None:
            data = bytearray(s.encode("utf-8") + b"\0")
            ty = ir.ArrayType(I8, len(data))
            g = ir.GlobalVariable(self.module, ty, name=f".str.{len(self._strings)}")
            g.linkage = "private"
            g.global_constant = True
            g.unnamed_addr = True
            g.initializer = ir.Constant(ty, data)
            g.type = PTR  # llvmlite types globals as typed pointers; make them plain opaque `ptr`
            self._strings[s] = g
        return g

    # ------------------------------------------------------------------ functions
    def add_function(self, f: PrimFunc) -> None:
        """Emit the packed function and its internal compute function for ``f``."""
        name = f.attrs.get("global_symbol", f.name)
        if name in self.func_names:
            raise CompileError(f"LLVM codegen: two functions named {name}")
        self.func_names.append(name)
        # internal compute function with noalias buffer pointers (and the dynamic extents, if any)
        dvars = f.dyn_vars
        # outputs whose data-dependent extents the kernel reports get their shape array passed in
        reported = sorted({p for p, _ in set_extent_targets(f)})
        comp = ir.Function(self.module, ir.FunctionType(I32, [PTR] * len(f.params)
                                                        + [value_type(v.dtype) for v in dvars]
                                                        + [PTR] * len(reported)),
                           name=f"{name}_compute_")
        comp.linkage = "internal"
        st = _Fn(comp, name)
        for a, buf in zip(comp.args, f.params):
            a.add_attribute("noalias")
            a.name = buf.name
            st.bufs[id(buf.data)] = a
        for a, v in zip(comp.args[len(f.params):], dvars):
            a.name = v.name
            st.vars[v] = a
            st.nonneg.add(v)
        for a, p in zip(comp.args[len(f.params) + len(dvars):], reported):
            a.name = f"{f.params[p].name}_shape"
            st.shapes[p] = a
        self._stmt(st, unswitch_loops(f.body, f.params))
        st.b.ret(ir.Constant(I32, 0))
        self._packed_wrapper(name, f.params, comp, dvars, reported)

    def _packed_wrapper(self, name: str, params: Sequence[Buffer], comp: ir.Function,
                        dvars: Sequence[Var] = (), reported: Sequence[int] = ()) -> None:
        fn = ir.Function(self.module, PACKED_FTY, name=name)
        args, tcodes, nargs = fn.args[0], fn.args[1], fn.args[2]
        st = _Fn(fn, name)
        b = st.b
        n = len(params)
        pnames = ", ".join(p.name for p in params)
        self._check(st, b.icmp_signed("!=", nargs, ir.Constant(I32, n)),
                    f"{name}: expected {n} arguments ({pnames}), got %d", [nargs])
        # each argument is checked by the crt's KilnCheckTensorArg (the same words as C kernels);
        # inline checks cost ~70% of a small kernel's IR and compile time
        check = self._declare("KilnCheckTensorArg", ir.FunctionType(
            I32, [PTR, I32, PTR, PTR, PTR, I32, PTR, I8, I8]))
        fname = self._cstr(name)
        ptrs = []
        shapes: dict[int, ir.Value] = {}
        dims: dict[Var, ir.Value] = {}
        for i, buf in enumerate(params):
            shape = self._const_i64_array(buf.check_shape)
            rc = b.call(check, [fname, ir.Constant(I32, i), self._cstr(buf.name), tcodes, args,
                                ir.Constant(I32, buf.ndim), shape, ir.Constant(I8, dl_code(buf.dtype)),
                                ir.Constant(I8, dl_bits(buf.dtype))])
            with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0)), likely=False):
                b.ret(ir.Constant(I32, -1))
            t = b.load(b.gep(args, [ir.Constant(I64, i)], inbounds=True, source_etype=I64), typ=PTR)

            def field(k: int, ty: ir.Type, t: ir.Value = t) -> ir.Value:
                idx = [ir.Constant(I32, 0), ir.Constant(I32, k)]
                return b.load(b.gep(t, idx, inbounds=True, source_etype=DLTENSOR), typ=ty)

            data = field(0, PTR)
            off = field(6, I64)
            ptrs.append(b.gep(data, [off], inbounds=True, source_etype=I8))
            if buf.dyn is not None:
                self._bind_dyn(st, name, params, i, field(4, PTR), dims)
            if i in reported:
                shapes[i] = field(4, PTR)
        r = b.call(comp, ptrs + [b.trunc(dims[v], value_type(v.dtype)) if value_type(v.dtype) != I64 else dims[v]
                                 for v in dvars] + [shapes[i] for i in reported])
        b.ret(r)

    def _bind_dyn(self, st: _Fn, name: str, params: Sequence[Buffer], i: int, shape: ir.Value,
                  dims: dict[Var, ir.Value]) -> None:
        """Read argument ``i``'s dynamic extents (already range-checked by the crt) into ``dims``;
        a Var carried by an earlier argument dim must agree with it."""
        b = st.b
        buf = params[i]
        for d, v in enumerate(buf.dyn or ()):
            if v is None:
                continue
            ext = b.load(b.gep(shape, [ir.Constant(I64, d)], inbounds=True, source_etype=I64), typ=I64)
            if v not in dims:
                dims[v] = ext
                continue
            j, e = next((j, e) for j, p in enumerate(params) for e, u in enumerate(p.dyn or ()) if u is v)
            self._check(st, b.icmp_signed("!=", ext, dims[v]),
                        f"{name}: argument {i} ({buf.name}) dim {d} is %lld but argument {j} ({params[j].name}) "
                        f"dim {e} is %lld; both are the dynamic extent {v.name}", [ext, dims[v]])

    def _const_i64_array(self, values: Sequence[int]) -> ir.Value:
        """A private constant ``int64_t[]`` (a null pointer when empty), shared between equal arrays."""
        key = "shape:" + ",".join(map(str, values))
        g = self._globals.get(key)
        if g is None:
            if not values:
                return ir.Constant(PTR, None)
            ty = ir.ArrayType(I64, len(values))
            g = ir.GlobalVariable(self.module, ty, name=f".shape.{len(self._globals)}")
            g.linkage = "private"
            g.global_constant = True
            g.unnamed_addr = True
            g.initializer = ir.Constant(ty, [int(v) for v in values])
            g.type = PTR  # plain opaque `ptr`, like the string constants
            self._globals[key] = g
        return g

    def _check(self, st: _Fn, bad: ir.Value, fmt: str, fargs: list[ir.Value]) -> None:
        """``if (bad) { set last error to sprintf(fmt, fargs); return -1; }``."""
        b = st.b
        with b.if_then(bad, likely=False):
            self._error(st, fmt, fargs)

    def _error(self, st: _Fn, fmt: str, fargs: list[ir.Value]) -> None:
        b = st.b
        with b.goto_entry_block():
            buf = _opaque(b.alloca(ir.ArrayType(I8, 512)))
        snprintf = self._declare("snprintf", ir.FunctionType(I32, [PTR, I64, PTR], var_arg=True))
        g = self._cstr(fmt.replace("%", "%%").replace("%%d", "%d").replace("%%lld", "%lld").replace("%%s", "%s"))
        b.call(snprintf, [buf, ir.Constant(I64, 512), g, *fargs])
        setter = b.load(self._extern_ptr("__KilnAPISetLastError"), typ=PTR)
        b.call(_fnptr(setter, ir.FunctionType(ir.VoidType(), [PTR])), [buf])
        b.ret(ir.Constant(I32, -1))  # if_then adds no branch after a terminator

    # ------------------------------------------------------------------ statements
    def _stmt(self, st: _Fn, s: Stmt) -> None:
        b = st.b
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._stmt(st, x)
        elif isinstance(s, For):
            self._for(st, s)
        elif isinstance(s, BufferStore):
            ptr = self._addr(st, s.buffer, s.indices)
            v = self._expr(st, s.value)
            if _is_sum_update(s) and isinstance(v, ir.Instruction) and "reassoc" not in v.flags:
                # a float sum into a one-element accumulator: let LLVM reorder it so the loop
                # vectorizes (partial sums per lane, as any BLAS or rfactor schedule would)
                v.flags.append("reassoc")
            b.store(self._to_storage(st, v, s.buffer.dtype), ptr)
        elif isinstance(s, Allocate):
            self._allocate(st, s)
        elif isinstance(s, IfThenElse):
            c = self._expr(st, s.cond)
            if s.else_case is None:
                with b.if_then(c):
                    self._stmt(st, s.then_case)
            else:
                with b.if_else(c) as (then, other):
                    with then:
                        self._stmt(st, s.then_case)
                    with other:
                        self._stmt(st, s.else_case)
        elif isinstance(s, LetStmt):
            st.vars[s.var] = self._expr(st, s.value)
            if is_integer(s.var.dtype) and self._nonneg(st, s.value):
                st.nonneg.add(s.var)
            self._stmt(st, s.body)
        elif isinstance(s, Evaluate):
            if isinstance(s.value, Call) and s.value.op == SET_EXTENT:
                self._set_extent(st, s.value)
            elif not isinstance(s.value, (IntImm, FloatImm)):
                self._expr(st, s.value)
        else:
            raise CompileError(f"LLVM codegen: unsupported statement {type(s).__name__}")

    def _set_extent(self, st: _Fn, e: Call) -> None:
        """:data:`~kiln.tir.SET_EXTENT`: store the extent into the output DLTensor's ``shape[dim]``."""
        p, d = e.args[0].value, e.args[1].value
        shape = st.shapes.get(p)
        if shape is None:  # a parallel body gets no shape arrays; a count is final after the loop
            raise CompileError(f"LLVM codegen: {st.fname}: {SET_EXTENT} inside a parallel loop")
        b = st.b
        v = self._expr(st, e.args[2])
        if v.type != I64:
            v = b.sext(v, I64)
        b.store(v, b.gep(shape, [ir.Constant(I64, d)], inbounds=True, source_etype=I64))

    def _allocate(self, st: _Fn, s: Allocate) -> None:
        b = st.b
        buf = s.buffer
        ety = storage_type(buf.dtype)
        if buf.scope == "local" or buf.nbytes <= self.stack_limit:
            with b.goto_entry_block():
                p = _opaque(b.alloca(ir.ArrayType(ety, max(buf.size, 1))))
                p.align = 64
            st.bufs[id(buf.data)] = p
            self._stmt(st, s.body)
            return
        alloc = _fnptr(b.load(self._extern_ptr("__KilnBackendAllocWorkspace"), typ=PTR),
                       ir.FunctionType(PTR, [I32, I32, I64, I32, I32]))
        p = b.call(alloc, [ir.Constant(I32, 1), ir.Constant(I32, 0), ir.Constant(I64, buf.nbytes),
                           ir.Constant(I32, dl_code(buf.dtype)), ir.Constant(I32, bits_of(buf.dtype))])
        with b.if_then(b.icmp_unsigned("==", p, ir.Constant(PTR, None)), likely=False):
            b.ret(ir.Constant(I32, -1))
        st.bufs[id(buf.data)] = p
        self._stmt(st, s.body)
        free = _fnptr(b.load(self._extern_ptr("__KilnBackendFreeWorkspace"), typ=PTR),
                      ir.FunctionType(I32, [I32, I32, PTR]))
        b.call(free, [ir.Constant(I32, 1), ir.Constant(I32, 0), p])

    def _loop(self, st: _Fn, var: Var, start: ir.Value, end: ir.Value, body: Callable[[], None],
              unroll: bool = True) -> None:
        b = st.b
        pre = b.block
        header = b.append_basic_block(f"for_{var.name}")
        bodyb = b.append_basic_block(f"for_{var.name}_body")
        exitb = b.append_basic_block(f"for_{var.name}_end")
        b.branch(header)
        b.position_at_end(header)
        ity = value_type(var.dtype)
        phi = b.phi(ity, name=var.name)
        phi.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", phi, end), bodyb, exitb)
        b.position_at_end(bodyb)
        st.vars[var] = phi
        body()
        nxt = _nsw(b.add(phi, ir.Constant(ity, 1)))
        phi.add_incoming(nxt, b.block)
        latch = b.branch(header)
        if not unroll:
            latch.set_metadata("llvm.loop", self._no_unroll_md())
        b.position_at_end(exitb)

    def _for(self, st: _Fn, s: For) -> None:
        if self._nonneg(st, s.min):
            st.nonneg.add(s.loop_var)
        if s.kind == "parallel" and st.par_depth == 0:
            self._parallel(st, s)
            return
        if (s.kind == "unrolled" and isinstance(s.extent, IntImm) and isinstance(s.min, IntImm)
                and s.extent.value <= 64):
            for k in range(s.extent.value):
                st.vars[s.loop_var] = ir.Constant(value_type(s.loop_var.dtype), s.min.value + k)
                self._stmt(st, s.body)
            return
        if s.kind == "vectorized" and self._vector_for(st, s):
            return
        start = self._expr(st, s.min, index=True)
        end = self._expr(st, simplify(s.min + s.extent), index=True)
        # a loop around a schedule-unrolled tile (tir.unswitch): LLVM's unroller would only
        # copy the micro-kernel again, and it costs a third of the compile time
        self._loop(st, s.loop_var, start, end, lambda: self._stmt(st, s.body), s.annotations.get("unroll", True))

    def _no_unroll_md(self) -> Any:
        """The loop ID ``!{self, !{"llvm.loop.unroll.disable"}}`` (one per loop, as LLVM requires)."""
        flag = self.module.add_metadata([ir.MetaDataString(self.module, "llvm.loop.unroll.disable")])
        # built directly, not through add_metadata: that would hand every loop the same node
        md = ir.values.MDValue(self.module, [flag], name=str(len(self.module.metadata)))
        md.operands = (md, flag)  # a loop ID's first operand is the node itself
        return md

    def _parallel(self, st: _Fn, s: For) -> None:
        """Outline ``s`` into a lambda for ``__KilnBackendParallelLaunch`` (chunked range)."""
        k = self._n_par
        self._n_par += 1
        base = f"{st.fname}_par{k}"
        bufs, scalars = loop_closure(s)  # what the outlined body needs from outside
        scalars.sort(key=lambda v: v.name)
        sty = [value_type(v.dtype) for v in scalars]
        # body function: noalias buffers, scalars, [begin, end)
        bfn = ir.Function(self.module, ir.FunctionType(I32, [PTR] * len(bufs) + sty + [I32, I32]), name=f"{base}_body")
        bfn.linkage = "internal"
        inner = _Fn(bfn, st.fname)
        inner.par_depth = 1
        for a, bf in zip(bfn.args, bufs):
            a.add_attribute("noalias")
            inner.bufs[id(bf.data)] = a
        for a, v in zip(bfn.args[len(bufs):], scalars):
            inner.vars[v] = a
            if v in st.nonneg:
                inner.nonneg.add(v)
        inner.nonneg.add(s.loop_var)
        begin, end = bfn.args[-2], bfn.args[-1]
        self._loop(inner, s.loop_var, begin, end, lambda: self._stmt(inner, s.body))
        inner.b.ret(ir.Constant(I32, 0))
        # lambda: unpack the closure, compute this task's chunk, call the body
        cty = ir.LiteralStructType([PTR] * len(bufs) + sty + [I32, I32])
        lam = ir.Function(self.module, LAMBDA_FTY, name=base)
        lam.linkage = "internal"
        lb = ir.IRBuilder(lam.append_basic_block("entry"))
        tid, ntask, cdata = lam.args
        members = [lb.load(lb.gep(cdata, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True, source_etype=cty),
                           typ=t) for i, t in enumerate(cty.elements)]
        mn, ext = members[-2], members[-1]
        chunk = lb.sdiv(lb.sub(lb.add(ext, ntask), ir.Constant(I32, 1)), ntask)
        lo = lb.mul(tid, chunk)
        hi = lb.add(lo, chunk)
        hi = lb.select(lb.icmp_signed("<", hi, ext), hi, ext)
        lb.ret(lb.call(bfn, members[:-2] + [lb.add(mn, lo), lb.add(mn, hi)]))
        # launch site
        b = st.b
        with b.goto_entry_block():
            clo = _opaque(b.alloca(cty))
        vals = [st.bufs[id(bf.data)] for bf in bufs] + [st.vars[v] for v in scalars]
        vals += [self._expr(st, s.min, index=True), self._expr(st, s.extent, index=True)]
        for i, v in enumerate(vals):
            b.store(v, b.gep(clo, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True, source_etype=cty))
        nthreads = b.call(self._declare("KilnGetNumThreads", ir.FunctionType(I32, [])), [])
        ext_v = vals[-1]
        nt = b.select(b.icmp_signed(">", nthreads, ext_v), ext_v, nthreads)
        launch = _fnptr(b.load(self._extern_ptr("__KilnBackendParallelLaunch"), typ=PTR),
                        ir.FunctionType(I32, [PTR, PTR, I32]))
        with b.if_then(b.icmp_signed(">", nt, ir.Constant(I32, 0))):
            r = b.call(launch, [lam, clo, nt])
            with b.if_then(b.icmp_signed("!=", r, ir.Constant(I32, 0)), likely=False):
                b.ret(ir.Constant(I32, -1))

    # ------------------------------------------------------------------ expressions
    def _nonneg(self, st: _Fn, e: PrimExpr) -> bool:
        if isinstance(e, IntImm):
            return e.value >= 0
        if isinstance(e, Var):
            return e in st.nonneg
        if is_uint(e.dtype):
            return True
        if isinstance(e, BinaryOp) and e.op in ("add", "mul", "floordiv", "floormod", "truncdiv", "truncmod",
                                                 "min", "max"):
            return self._nonneg(st, e.a) and self._nonneg(st, e.b)
        if isinstance(e, Cast) and is_integer(e.value.dtype):
            return self._nonneg(st, e.value)
        return isinstance(e, Call) and e.op == CHECKED_INDEX

    def _addr(self, st: _Fn, buf: Buffer, indices: Sequence[PrimExpr]) -> ir.Value:
        base = st.bufs.get(id(buf.data))
        if base is None:
            raise CompileError(f"LLVM codegen: buffer {buf.name} used outside its allocation")
        flat = buf.flat_offset(indices, st.nonneg, "LLVM codegen")
        iv = self._expr(st, flat, index=True)
        if iv.type != I64:
            iv = st.b.sext(iv, I64)
        return st.b.gep(base, [iv], inbounds=True, source_etype=storage_type(buf.dtype))

    def _to_storage(self, st: _Fn, v: ir.Value, dtype: str) -> ir.Value:
        b = st.b
        if dtype == "float16":
            return b.bitcast(b.fptrunc(v, ir.HalfType()), I16)
        if dtype == "bfloat16":
            return self._f2bf(st, v)
        if dtype == "bool":
            return b.zext(v, I8)
        return v

    def _f2bf(self, st: _Fn, v: ir.Value) -> ir.Value:
        b = st.b
        u = b.bitcast(v, I32)
        isnan = b.icmp_unsigned(">", b.and_(u, ir.Constant(I32, 0x7FFFFFFF)), ir.Constant(I32, 0x7F800000))
        lsb = b.and_(b.lshr(u, ir.Constant(I32, 16)), ir.Constant(I32, 1))
        rounded = b.lshr(b.add(b.add(u, ir.Constant(I32, 0x7FFF)), lsb), ir.Constant(I32, 16))
        quiet = b.or_(b.lshr(u, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
        return b.trunc(b.select(isnan, quiet, rounded), I16)

    def _bf2f(self, st: _Fn, h: ir.Value) -> ir.Value:
        b = st.b
        return b.bitcast(b.shl(b.zext(h, I32), ir.Constant(I32, 16)), F32)

    def _expr(self, st: _Fn, e: PrimExpr, index: bool = False) -> ir.Value:
        b = st.b
        if isinstance(e, Var):
            v = st.vars.get(e)
            if v is None:
                raise CompileError(f"LLVM codegen: variable {e.name} used outside its scope")
            return v
        if isinstance(e, IntImm):
            return ir.Constant(value_type(e.dtype), e.value)
        if isinstance(e, FloatImm):
            return ir.Constant(value_type(e.dtype), e.value)
        if isinstance(e, BinaryOp):
            return self._binary(st, e, index)
        if isinstance(e, Not):
            return b.xor(self._expr(st, e.a), ir.Constant(I1, 1))
        if isinstance(e, Cast):
            return self._cast(st, self._expr(st, e.value, index), e.value.dtype, e.dtype)
        if isinstance(e, Call):
            return self._call(st, e)
        if isinstance(e, Select):
            c = self._expr(st, e.cond)
            if _safe(e.true_value) and _safe(e.false_value):
                return b.select(c, self._expr(st, e.true_value, index), self._expr(st, e.false_value, index))
            ty = value_type(e.dtype)
            with b.if_else(c) as (then, other):
                with then:
                    tv = self._expr(st, e.true_value, index)
                    tb = b.block
                with other:
                    fv = self._expr(st, e.false_value, index)
                    fb = b.block
            phi = b.phi(ty)
            phi.add_incoming(tv, tb)
            phi.add_incoming(fv, fb)
            return phi
        if isinstance(e, Load):
            v = b.load(self._addr(st, e.buffer, e.indices), typ=storage_type(e.dtype))
            if e.dtype == "float16":
                return b.fpext(b.bitcast(v, ir.HalfType()), F32)
            if e.dtype == "bfloat16":
                return self._bf2f(st, v)
            if e.dtype == "bool":
                return b.icmp_unsigned("!=", v, ir.Constant(I8, 0))
            return v
        if isinstance(e, (ProducerLoad, Reduce)):
            raise CompileError("LLVM codegen: tensor-expression node left in the loop IR; lower the schedule first")
        raise CompileError(f"LLVM codegen: unsupported expression {type(e).__name__}")

    def _binary(self, st: _Fn, e: BinaryOp, index: bool) -> ir.Value:
        b = st.b
        op, dt = e.op, e.a.dtype
        x, y = self._expr(st, e.a, index), self._expr(st, e.b, index)
        if op in _ICMP:
            if is_float(dt):
                return (b.fcmp_unordered("!=", x, y) if op == "ne" else b.fcmp_ordered(_ICMP[op], x, y))
            if is_uint(dt) or is_bool(dt):
                return b.icmp_unsigned(_ICMP[op], x, y)
            return b.icmp_signed(_ICMP[op], x, y)
        if op == "and":
            return b.and_(x, y)
        if op == "or":
            return b.or_(x, y)
        if is_float(dt):
            if op == "add":
                return _contract(b.fadd(x, y))
            if op == "sub":
                return _contract(b.fsub(x, y))
            if op == "mul":
                return _contract(b.fmul(x, y))
            if op == "div":
                return b.fdiv(x, y)
            if op in ("min", "max"):
                # NaN-propagating like numpy.maximum: pick x when it wins or is NaN
                win = b.or_(b.fcmp_ordered(">" if op == "max" else "<", x, y), b.fcmp_unordered("uno", x, x))
                return b.select(win, x, y)
            raise CompileError(f"LLVM codegen: {op} on {dt}")
        signed = not (is_uint(dt) or is_bool(dt))
        if op in ("add", "sub", "mul"):
            r = {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y)
            return _nsw(r) if index and signed else r
        if op in ("min", "max"):
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp("<" if op == "min" else ">", x, y), x, y)
        if op in ("truncdiv", "truncmod"):
            if not signed:
                return b.udiv(x, y) if op == "truncdiv" else b.urem(x, y)
            return b.sdiv(x, y) if op == "truncdiv" else b.srem(x, y)
        if op in ("floordiv", "floormod"):
            if not signed:
                return b.udiv(x, y) if op == "floordiv" else b.urem(x, y)
            if self._nonneg(st, e.a) and self._nonneg(st, e.b):
                return b.sdiv(x, y) if op == "floordiv" else b.srem(x, y)
            q, r = b.sdiv(x, y), b.srem(x, y)
            zero = ir.Constant(x.type, 0)
            fix = b.and_(b.icmp_signed("!=", r, zero),
                         b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
            if op == "floordiv":
                return b.sub(q, b.zext(fix, x.type))
            return b.select(fix, b.add(r, y), r)
        if op == "bitand":
            return b.and_(x, y)
        if op == "bitor":
            return b.or_(x, y)
        if op == "bitxor":
            return b.xor(x, y)
        if op == "shl":
            return b.shl(x, y)
        if op == "shr":
            return b.ashr(x, y) if signed else b.lshr(x, y)
        raise CompileError(f"LLVM codegen: unsupported operator {op} on {dt}")

    def _cast(self, st: _Fn, v: ir.Value, src: str, dst: str) -> ir.Value:
        b = st.b
        if src == dst:
            return v
        if dst == "bool":
            if is_float(src):
                return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0))
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        if dst in ("float16", "bfloat16"):
            if src == "float64" and dst == "float16":
                return b.fpext(b.fptrunc(v, ir.HalfType()), F32)  # one rounding, straight from double
            f = self._cast(st, v, src, "float32") if src not in ("float16", "bfloat16") else v
            if dst == "float16":
                return b.fpext(b.fptrunc(f, ir.HalfType()), F32)
            return self._bf2f(st, self._f2bf(st, f))
        vt = value_type(dst)
        if is_float(dst):
            if is_float(src):
                if vt == v.type:
                    return v
                return b.fpext(v, vt) if vt == F64 else b.fptrunc(v, vt)
            return b.uitofp(v, vt) if (is_uint(src) or is_bool(src)) else b.sitofp(v, vt)
        # integer destination
        if is_float(src):
            return b.fptoui(v, vt) if is_uint(dst) else b.fptosi(v, vt)
        sw, dw = v.type.width, vt.width
        if sw == dw:
            return v
        if sw > dw:
            return b.trunc(v, vt)
        return b.zext(v, vt) if (is_uint(src) or is_bool(src)) else b.sext(v, vt)

    def _call(self, st: _Fn, e: Call) -> ir.Value:
        b = st.b
        if e.op == CHECKED_INDEX:
            return self._checked_index(st, e)
        if e.op == _REINTERPRET:
            return self._reinterpret(st, self._expr(st, e.args[0]), e.args[0].dtype, e.dtype)
        args = [self._expr(st, a) for a in e.args]
        ty = args[0].type
        if e.op in ("isnan", "isinf", "isfinite"):
            x = args[0]
            if e.op == "isnan":
                return b.fcmp_unordered("uno", x, x)
            fabs = self._declare(f"llvm.fabs.{_sfx(ty)}", ir.FunctionType(ty, [ty]))
            ax = b.call(fabs, [x])
            inf = ir.Constant(ty, float("inf"))
            return b.fcmp_ordered("==", ax, inf) if e.op == "isinf" else b.fcmp_ordered("<", ax, inf)
        if e.op in VECTOR_MATH and ty == F32:
            return b.call(self._math_fn(e.op, 1), args)
        if e.op in _INTRINSIC:
            fn = self._declare(f"{_INTRINSIC[e.op]}.{_sfx(ty)}", ir.FunctionType(ty, [ty] * len(args)))
        elif e.op in _LIBM:
            fn = self._declare(e.op + ("f" if ty == F32 else ""), ir.FunctionType(ty, [ty] * len(args)))
        else:
            raise CompileError(f"LLVM codegen: unknown intrinsic {e.op!r}")
        return b.call(fn, args)

    def _reinterpret(self, st: _Fn, v: ir.Value, src: str, dst: str) -> ir.Value:
        """The storage bits of a ``src`` value read as ``dst`` (BitCast; the widths match)."""
        b = st.b
        if src == "float16":  # half values compute widened to float32; narrowing is exact
            bits = b.bitcast(b.fptrunc(v, ir.HalfType()), I16)
        elif src == "bfloat16":
            bits = self._f2bf(st, v)
        elif src == "bool":
            bits = b.zext(v, I8)
        else:
            bits = v if v.type == storage_type(src) else b.bitcast(v, storage_type(src))
        if dst == "float16":
            return b.fpext(b.bitcast(bits, ir.HalfType()), F32)
        if dst == "bfloat16":
            return self._bf2f(st, bits)
        if dst == "bool":
            return b.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0))
        return bits if bits.type == storage_type(dst) else b.bitcast(bits, storage_type(dst))

    def _checked_index(self, st: _Fn, e: Call) -> ir.Value:
        """Wrap a negative index; return the error from the current function (the kernel or a
        parallel body) for one outside ``[-n, n)``, the same message as the C codegen's."""
        b = st.b
        v = self._expr(st, e.args[0])
        if not isinstance(e.args[1], IntImm):  # the runtime extent of a dynamic axis
            nv = self._expr(st, e.args[1])
            bad = b.or_(b.icmp_signed("<", v, b.neg(nv)), b.icmp_signed(">=", v, nv))
            fmt = f"{st.fname}: %s: index %lld is out of range [-%lld, %lld)"
            self._check(st, bad, fmt, [self._cstr(e.text), v, nv, nv])
            return b.select(b.icmp_signed("<", v, ir.Constant(I64, 0)), _nsw(b.add(v, nv)), v)
        n = e.args[1].value
        bad = b.or_(b.icmp_signed("<", v, ir.Constant(I64, -n)), b.icmp_signed(">=", v, ir.Constant(I64, n)))
        if n == 0:
            fmt = f"{st.fname}: %s: index %lld is out of range: the axis has size 0, so no index is valid"
        else:
            fmt = f"{st.fname}: %s: index %lld is out of range [{-n}, {n - 1}]"
        self._check(st, bad, fmt, [self._cstr(e.text), v])
        return b.select(b.icmp_signed("<", v, ir.Constant(I64, 0)), _nsw(b.add(v, ir.Constant(I64, n))), v)

    # ------------------------------------------------------------------ explicit SIMD
    def _vector_for(self, st: _Fn, s: For) -> bool:
        """Emit a vectorized loop as ``<N x T>`` code; False to keep the scalar loop."""
        if self.vector_bytes <= 0:
            return False
        ranges = {v: (0, 2**31 - 1) for v in st.nonneg}
        plan = plan_vector_loop(s, self.vector_bytes, ranges)
        if plan is not None:
            self._vector_body(st, plan)
            return True
        sm = split_min_extent(s)
        if sm is None:
            return False
        full, bound = sm
        plan = plan_vector_loop(For(s.loop_var, s.min, IntImm(full), s.kind, s.body), self.vector_bytes, ranges)
        if plan is None:
            return False
        b = st.b
        bv = self._expr(st, bound, index=True)
        # whole tiles take the full-width vector path
        with b.if_else(b.icmp_signed(">=", bv, ir.Constant(bv.type, full))) as (then, other):
            with then:
                self._vector_body(st, plan)
            with other:  # the last, partial tile: vector chunks of halving widths
                self._stmt(st, tail_chunks(s, full, bound))
        return True

    def _vector_body(self, st: _Fn, plan: Any) -> None:
        from ..tir.functor import substitute

        v = plan.loop.loop_var
        base = plan.loop.min.value
        st.vranges = {x: (0, 2**31 - 1) for x in st.nonneg}
        st.vranges[v] = (base, base + plan.loop.extent.value - 1)
        st.vuses = plan.uses
        for o, w in plan.chunks:
            if w == 1:
                c = IntImm(base + o, v.dtype)
                for sv in plan.stores:
                    self._stmt(st, BufferStore(sv.buffer, simplify(substitute(sv.value, {v: c})),
                                               [simplify(substitute(i, {v: c})) for i in sv.indices]))
                continue
            cx = (v, base + o, w)
            for sv in plan.stores:
                dt = sv.buffer.dtype
                val, kind = self._vx(st, sv.value, cx)
                if kind is None:
                    val = self._splat(st, val, w)
                ptr = self._addr_at(st, sv.buffer, sv.indices, v, base + o)
                st.b.store(val, ptr, align=bits_of(dt) // 8)
        st.vuses = {}

    def _addr_at(self, st: _Fn, buf: Buffer, indices: Sequence[PrimExpr], v: Var, at: int) -> ir.Value:
        from ..tir.functor import substitute

        c = IntImm(at, v.dtype)
        return self._addr(st, buf, [substitute(i, {v: c}) for i in indices])

    def _splat(self, st: _Fn, x: ir.Value, w: int) -> ir.Value:
        vt = ir.VectorType(x.type, w)
        if isinstance(x, ir.Constant):
            return ir.Constant(vt, [x.constant] * w)
        b = st.b
        undef = ir.Constant(vt, ir.Undefined)
        one = b.insert_element(undef, x, ir.Constant(I32, 0))
        return b.shuffle_vector(one, undef, ir.Constant(ir.VectorType(I32, w), [0] * w))

    def _vx(self, st: _Fn, e: PrimExpr, cx: tuple[Var, int, int]) -> tuple[ir.Value, str | None]:
        """Vector value of ``e`` for lanes ``v = o .. o + w - 1``: ``(value, kind)`` with kind None
        for a lane-invariant scalar, the dtype for a vector, ``"mask"`` for ``<w x i1>``."""
        v, o, w = cx
        b = st.b
        uses = st.vuses.get(id(e))
        if not (uses if uses is not None else v in collect_vars(e)):
            return self._expr(st, e), None
        if isinstance(e, Var):
            if e.dtype not in VECTOR_DTYPES:
                return self._lanewise(st, e, cx)
            ty = value_type(e.dtype)
            return ir.Constant(ir.VectorType(ty, w), [o + i for i in range(w)]), e.dtype
        if isinstance(e, Load):
            if e.dtype in VECTOR_DTYPES and stride_in(flat_index(e.buffer, e.indices), v, st.vranges) == 1:
                ptr = self._addr_at(st, e.buffer, e.indices, v, o)
                vt = ir.VectorType(storage_type(e.dtype), w)
                return b.load(ptr, typ=vt, align=bits_of(e.dtype) // 8), e.dtype
            return self._lanewise(st, e, cx)
        if isinstance(e, BinaryOp):
            return self._vbinary(st, e, cx)
        if isinstance(e, Not):
            a, k = self._vx(st, e.a, cx)
            if k == "mask":
                return b.xor(a, ir.Constant(ir.VectorType(I1, w), [1] * w)), k
            return self._lanewise(st, e, cx)
        if isinstance(e, Cast):
            src, dst = e.value.dtype, e.dtype
            if src in VECTOR_DTYPES and dst in VECTOR_DTYPES:
                a, k = self._vx(st, e.value, cx)
                if k == src:
                    return self._vcast(st, a, src, dst, w), dst
            return self._lanewise(st, e, cx)
        if isinstance(e, Call):
            if e.dtype in ("float32", "float64") and e.args[0].dtype == e.dtype and (
                    (e.op in VECTOR_MATH and e.dtype == "float32") or e.op in _VINTRIN):
                args = [self._vx(st, a, cx) for a in e.args]
                if all(k in (None, e.dtype) for _, k in args):
                    vals = [a if k is not None else self._splat(st, a, w) for a, k in args]
                    if e.op in VECTOR_MATH and e.dtype == "float32":
                        return b.call(self._math_fn(e.op, w), vals), e.dtype
                    vt = vals[0].type
                    fn = self._declare(f"{_INTRINSIC[e.op]}.v{w}{_sfx(value_type(e.dtype))}",
                                       ir.FunctionType(vt, [vt] * len(vals)))
                    return b.call(fn, vals), e.dtype
            return self._lanewise(st, e, cx)
        if isinstance(e, Select):
            if e.dtype in VECTOR_DTYPES and v not in collect_vars(e.cond) and not (
                    _safe(e.true_value) and _safe(e.false_value)):
                return self._vguarded(st, e, cx), e.dtype
            if e.dtype in VECTOR_DTYPES and _safe(e.true_value) and _safe(e.false_value):
                m, km = self._vx(st, e.cond, cx)
                x, kx = self._vx(st, e.true_value, cx)
                y, ky = self._vx(st, e.false_value, cx)
                if km == "mask":
                    x = x if kx is not None else self._splat(st, x, w)
                    y = y if ky is not None else self._splat(st, y, w)
                    return b.select(m, x, y), e.dtype
            return self._lanewise(st, e, cx)
        return self._lanewise(st, e, cx)

    def _vguarded(self, st: _Fn, e: Select, cx: tuple[Var, int, int]) -> ir.Value:
        """A select whose condition is the same for every lane and whose branches load: a branch
        on the scalar condition, so the loads of the branch not taken never run."""
        b = st.b
        c = self._expr(st, e.cond)
        vals = []
        with b.if_else(c) as (then, other):
            for arm, x in ((then, e.true_value), (other, e.false_value)):
                with arm:
                    val, k = self._vx(st, x, cx)
                    vals.append((val if k is not None else self._splat(st, val, cx[2]), b.block))
        phi = b.phi(vals[0][0].type)
        for val, blk in vals:
            phi.add_incoming(val, blk)
        return phi

    def _vcast(self, st: _Fn, a: ir.Value, src: str, dst: str, w: int) -> ir.Value:
        b = st.b
        if src == dst:
            return a
        vt = ir.VectorType(value_type(dst), w)
        if is_float(dst):
            if is_float(src):
                return b.fpext(a, vt) if dst == "float64" else b.fptrunc(a, vt)
            return b.sitofp(a, vt)
        if is_float(src):
            return b.fptosi(a, vt)
        return b.sext(a, vt) if bits_of(dst) > bits_of(src) else b.trunc(a, vt)

    def _vbinary(self, st: _Fn, e: BinaryOp, cx: tuple[Var, int, int]) -> tuple[ir.Value, str | None]:
        v, o, w = cx
        b = st.b
        op, dt = e.op, e.a.dtype
        if op in ("and", "or"):
            x, kx = self._vx(st, e.a, cx)
            y, ky = self._vx(st, e.b, cx)
            if kx in (None, "mask") and ky in (None, "mask"):
                x = x if kx is not None else self._splat(st, x, w)
                y = y if ky is not None else self._splat(st, y, w)
                return (b.and_(x, y) if op == "and" else b.or_(x, y)), "mask"
            return self._lanewise(st, e, cx)
        if dt not in VECTOR_DTYPES:
            return self._lanewise(st, e, cx)
        fl = is_float(dt)
        if op not in ("add", "sub", "mul", "min", "max", *_ICMP) and not (fl and op == "div"):
            return self._lanewise(st, e, cx)
        x, kx = self._vx(st, e.a, cx)
        y, ky = self._vx(st, e.b, cx)
        if kx not in (None, dt) or ky not in (None, dt):
            return self._lanewise(st, e, cx)
        x = x if kx is not None else self._splat(st, x, w)
        y = y if ky is not None else self._splat(st, y, w)
        if op in _ICMP:
            if fl:
                return (b.fcmp_unordered("!=", x, y) if op == "ne" else b.fcmp_ordered(_ICMP[op], x, y)), "mask"
            return b.icmp_signed(_ICMP[op], x, y), "mask"
        if op in ("min", "max"):
            if fl:
                win = b.or_(b.fcmp_ordered(">" if op == "max" else "<", x, y), b.fcmp_unordered("uno", x, x))
            else:
                win = b.icmp_signed("<" if op == "min" else ">", x, y)
            return b.select(win, x, y), dt
        if fl:
            f = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv}[op]
            r = f(x, y)
            return (_contract(r) if op != "div" else r), dt
        return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y), dt

    def _lanewise(self, st: _Fn, e: PrimExpr, cx: tuple[Var, int, int]) -> tuple[ir.Value, str | None]:
        """Fallback: evaluate ``e`` once per lane with scalar code and pack the lanes."""
        v, o, w = cx
        b = st.b
        if e.dtype in VECTOR_DTYPES:
            ty, kind = value_type(e.dtype), e.dtype
        elif is_bool(e.dtype):
            ty, kind = I1, "mask"
        else:
            raise CompileError(f"LLVM codegen: cannot vectorize a {e.dtype} expression")
        old = st.vars.get(v)
        vec = ir.Constant(ir.VectorType(ty, w), ir.Undefined)
        for i in range(w):
            st.vars[v] = ir.Constant(value_type(v.dtype), o + i)
            vec = b.insert_element(vec, self._expr(st, e), ir.Constant(I32, i))
        if old is None:
            del st.vars[v]
        else:
            st.vars[v] = old
        return vec, kind

    def _math_fn(self, op: str, w: int) -> ir.Function:
        """Internal always-inline float32 ``op`` (``kiln.codegen.vmath``) over ``w`` lanes."""
        name = f"kiln_v{op}_f32x{w}"
        fn = self._decls.get(name)
        if fn is None:
            ty = F32 if w == 1 else ir.VectorType(F32, w)
            fn = ir.Function(self.module, ir.FunctionType(ty, [ty]), name=name)
            fn.linkage = "internal"
            fn.attributes.add("alwaysinline")
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            b.ret(emit_math(op, _LLMathEmitter(b, w), fn.args[0]))
            self._decls[name] = fn
        return fn

    def finish(self) -> str:
        """The module's LLVM IR text."""
        return str(self.module)


_VINTRIN = ("sqrt", "fabs", "floor", "ceil", "trunc", "round")


def _is_sum_update(s: BufferStore) -> bool:
    """``acc[0] = acc[0] + x`` on a float32/64 one-element local accumulator."""
    buf, v = s.buffer, s.value
    if buf.scope != "local" or buf.size != 1 or buf.dtype not in ("float32", "float64"):
        return False
    if not (isinstance(v, BinaryOp) and v.op == "add"):
        return False
    return any(isinstance(x, Load) and x.buffer.data is buf.data for x in (v.a, v.b))


def _contract(v: Any) -> Any:
    # allow a*b+c to become one FMA (what gcc's -ffp-contract=fast does); no other fast-math
    if isinstance(v, ir.Instruction) and "contract" not in v.flags:
        v.flags.append("contract")
    return v


class _LLMathEmitter:
    """:class:`kiln.codegen.vmath.MathEmitter` building LLVM IR over ``float`` or ``<w x float>``."""

    def __init__(self, b: ir.IRBuilder, w: int) -> None:
        self.b, self.w = b, w
        self.ft = F32 if w == 1 else ir.VectorType(F32, w)
        self.it = I32 if w == 1 else ir.VectorType(I32, w)

    def c(self, v: float) -> Any:
        return ir.Constant(self.ft, v if self.w == 1 else [v] * self.w)

    def ic(self, v: int) -> Any:
        return ir.Constant(self.it, v if self.w == 1 else [v] * self.w)

    def add(self, a: Any, b: Any) -> Any:
        return _contract(self.b.fadd(a, b))

    def sub(self, a: Any, b: Any) -> Any:
        return _contract(self.b.fsub(a, b))

    def mul(self, a: Any, b: Any) -> Any:
        return _contract(self.b.fmul(a, b))

    def div(self, a: Any, b: Any) -> Any:
        return self.b.fdiv(a, b)

    def lt(self, a: Any, b: Any) -> Any:
        return self.b.fcmp_ordered("<", a, b)

    def isnan(self, a: Any) -> Any:
        return self.b.fcmp_unordered("uno", a, a)

    def sel(self, m: Any, a: Any, b: Any) -> Any:
        return self.b.select(m, a, b)

    def f2i(self, a: Any) -> Any:
        return self.b.fptosi(a, self.it)

    def bits(self, a: Any) -> Any:
        return self.b.bitcast(a, self.it)

    def from_bits(self, i: Any) -> Any:
        return self.b.bitcast(i, self.ft)

    def iadd(self, a: Any, b: Any) -> Any:
        return self.b.add(a, b)

    def isub(self, a: Any, b: Any) -> Any:
        return self.b.sub(a, b)

    def iand(self, a: Any, b: Any) -> Any:
        return self.b.and_(a, b)

    def ior(self, a: Any, b: Any) -> Any:
        return self.b.or_(a, b)

    def ishl(self, a: Any, n: int) -> Any:
        return self.b.shl(a, self.ic(n))

    def ishr(self, a: Any, n: int) -> Any:
        return self.b.ashr(a, self.ic(n))


def _opaque(v: Any) -> Any:
    # llvmlite gives allocas typed pointer types, which makes loads/stores of other types
    # fail its checks; every pointer here is an opaque `ptr` (LLVM 17+ IR).
    v.type = PTR
    return v


def _sfx(ty: ir.Type) -> str:
    return "f32" if ty == F32 else "f64"


def _fnptr(p: ir.Value, fty: ir.FunctionType) -> Any:
    """Wrap a loaded function pointer so ``IRBuilder.call`` knows its signature."""
    return _TypedPtr(p, fty)


class _TypedPtr:
    # llvmlite's call() reads fn.function_type (opaque pointers carry no signature)
    def __init__(self, p: ir.Value, fty: ir.FunctionType) -> None:
        self._p, self.function_type = p, fty
        self.type = PTR

    def get_reference(self) -> str:
        return self._p.get_reference()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._p, name)
