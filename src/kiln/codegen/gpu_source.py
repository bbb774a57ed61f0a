"""GPU kernel source generation shared by the OpenCL and CUDA code generators.

:class:`GPUSourceGenerator` turns :class:`~kiln.tir.PrimFunc` s into the source text of a
C-like kernel language plus *launch metadata*. Everything language-specific lives in a
:class:`Dialect`; a new GPU language is a ``Dialect`` subclass, nothing more.

How a PrimFunc becomes kernels
------------------------------
* Top-level :class:`~kiln.tir.Allocate` s of non-``local`` buffers (intermediate tensors of a
  multi-stage schedule, e.g. the row maxima of a softmax) become **temporaries**: global
  device memory the host side allocates and passes like a parameter.
* Every remaining top-level statement (one per root stage of the schedule) becomes **one
  kernel**. Consecutive kernels of a function are launched in order on one queue, which is
  the global barrier between stages. A top-level ``local`` Allocate stays inside one kernel.
* A :class:`~kiln.tir.For` of kind ``"thread_binding"`` with ``annotations["thread_tag"]``
  in ``blockIdx.{x,y,z}`` / ``threadIdx.{x,y,z}`` (made by ``Stage.bind``) is not a loop:
  its variable is the work-group / work-item index (``Dialect.thread_index``). The launch
  size of a tag is the largest extent bound to it in the kernel; a loop with a smaller
  extent gets an ``if`` guard. Extents of bound loops must be constants.
* A kernel without bound loops runs on a single work-item (correct, slow: a schedule
  that binds nothing is a bug in the schedule, not in the output).
* Other Allocates inside a kernel are per-work-item arrays; scope ``"shared"`` ones are
  work-group memory (declared at kernel scope, ``Dialect.shared_qualifier``).
  ``Evaluate(Call("int32", "kiln.barrier", []))`` emits ``Dialect.barrier()``; a barrier
  under a condition on a ``threadIdx`` index (a thread loop shorter than the launch, or an
  ``if`` on the work-item index) is a CompileError: work-items skipping it would deadlock.
  Kernels with work-group memory report its size as ``shared_bytes``.

Metadata (``GPUFunctionInfo.to_dict``), JSON-serializable, is what a runtime module needs to
launch a function::

    {"name": f, "params": [{"name", "dtype", "shape"}...],
     "temps": [{"name", "dtype", "nbytes"}...],
     "kernels": [{"name": k, "args": [["param", i] | ["temp", j], ...],
                  "grid": [x, y, z], "block": [x, y, z]}...]}

Kernel parameters are, per buffer argument in ``args`` order, a pointer
(``Dialect.global_qualifier T* restrict``) and — when ``Dialect.buffer_offset_args`` — a
64-bit *byte* offset added to it on entry (OpenCL buffers are handles, not addresses).
``grid`` counts work-groups (CUDA blocks), ``block`` work-items per group (threads).

Writing a dialect
-----------------
Override the class attributes and the few methods of :class:`Dialect`: ``kernel_prefix``
(text before the kernel name, e.g. ``"__kernel void"``), ``global_qualifier``,
``shared_qualifier``, ``func_qualifier`` (helper functions), ``restrict``, ``preamble``,
``type_names``, :meth:`Dialect.thread_index`, :meth:`Dialect.barrier`,
:meth:`Dialect.math_function`, :meth:`Dialect.vector_type`, :meth:`Dialect.inf_literal`,
:meth:`Dialect.nan_literal`, :meth:`Dialect.is_special_float`, :meth:`Dialect.dtype_guard`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..runtime.errors import CompileError
from ..tir.dtype import is_bool, is_float, is_integer, is_uint
from ..tir.expr import (
    CHECKED_INDEX, BinaryOp, Call, Cast, FloatImm, IntImm, Load, Not, PrimExpr, ProducerLoad, Reduce, Select, Var,
)
from ..tir.functor import post_order_visit
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt

__all__ = [
    "Dialect", "GPUSourceGenerator", "GPUFunctionInfo", "GPUKernelInfo", "generate_gpu_source",
    "THREAD_TAGS", "BARRIER_INTRINSIC",
]

#: Thread tags ``Stage.bind`` accepts, in launch-dimension order.
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
#: Name of the intrinsic call that becomes a work-group barrier.
BARRIER_INTRINSIC = "kiln.barrier"

_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
        "eq": "==", "ne": "!=", "and": "&&", "or": "||", "bitand": "&", "bitor": "|", "bitxor": "^",
        "shl": "<<", "shr": ">>", "truncdiv": "/", "truncmod": "%"}
_CMP = ("lt", "le", "gt", "ge", "eq", "ne", "and", "or")
_INT_SUFFIX = {"int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
               "uint32": "u32", "uint64": "u64", "bool": "i32"}
_MATH_OPS = ("exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "tanh", "erf", "sin", "cos", "tan",
             "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "trunc",
             "round", "fabs", "pow", "atan2", "fmod")


class Dialect:
    """What differs between GPU kernel languages. Subclass and override.

    Attributes
    ----------
    name : str
        Language name used in error messages ("opencl", "cuda").
    kernel_prefix : str
        Text before a kernel's name (``"__kernel void"``, ``'extern "C" __global__ void'``).
    global_qualifier : str
        Address-space qualifier of global-memory pointers (``"__global"``; CUDA: ``""``).
    shared_qualifier : str
        Qualifier of work-group memory (``"__local"``, ``"__shared__"``).
    func_qualifier : str
        Qualifier of helper functions (``"inline"``, ``"__device__ __forceinline__"``).
    restrict : str
        The restrict keyword (``"restrict"``, ``"__restrict__"``).
    buffer_offset_args : bool
        Pass a 64-bit byte offset after every buffer pointer (needed where buffers are handles).
    offset_type : str
        Type of those offsets.
    preamble : str
        Text put at the top of every source (pragmas, includes).
    type_names : dict
        dtype name -> scalar type name in the language (storage type; bools are stored as
        ``type_names["bool"]`` and computed as ``type_names["int32"]``).
    """

    name = "gpu"
    kernel_prefix = "void"
    global_qualifier = ""
    shared_qualifier = ""
    func_qualifier = "static inline"
    restrict = "restrict"
    buffer_offset_args = False
    offset_type = "long"
    preamble = ""
    type_names: dict[str, str] = {
        "bool": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
        "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
        "uint64": "unsigned long long", "float32": "float", "float64": "double",
    }

    def thread_index(self, tag: str) -> str:
        """Expression (an ``int``) for a thread tag such as ``"blockIdx.x"``."""
        raise NotImplementedError

    def barrier(self) -> str:
        """Statement synchronizing the work-items of a work-group (work-group memory fence)."""
        raise NotImplementedError

    def math_function(self, op: str, dtype: str) -> str:
        """Function name of math intrinsic ``op`` (see ``_MATH_OPS``) on ``dtype`` arguments."""
        return {"round": "rint"}.get(op, op)

    def vector_type(self, dtype: str, lanes: int) -> str:
        """Name of the ``lanes``-wide vector type of ``dtype`` (e.g. ``float4``)."""
        return f"{self.type_name(dtype)}{lanes}"

    def inf_literal(self, dtype: str) -> str:
        """Positive infinity of ``dtype``."""
        return "INFINITY" if dtype != "float64" else "((double)INFINITY)"

    def nan_literal(self, dtype: str) -> str:
        """A quiet NaN of ``dtype``."""
        return "NAN" if dtype != "float64" else "((double)NAN)"

    def is_special_float(self, op: str, arg: str, dtype: str) -> str:
        """``isnan`` / ``isinf`` / ``isfinite`` of ``arg`` as an int 0/1 expression."""
        return f"({op}({arg}) != 0)"

    def dtype_guard(self, dtype: str) -> tuple[str, str] | None:
        """Preprocessor lines around helpers of ``dtype`` (e.g. only if fp64 exists), or None."""
        return None

    def type_name(self, dtype: str) -> str:
        """Storage type name of ``dtype``; raises for dtypes the dialect cannot hold."""
        t = self.type_names.get(dtype)
        if t is None:
            raise CompileError(f"{self.name} codegen: dtype {dtype} is not supported "
                               f"(supported: {', '.join(sorted(self.type_names))})")
        return t

    def value_type(self, dtype: str) -> str:
        """Type an expression of ``dtype`` is computed in (bools compute as int)."""
        return self.type_name("int32" if dtype == "bool" else dtype)


@dataclass
class GPUKernelInfo:
    """One kernel: its name, buffer arguments and launch size (see the module docstring)."""

    name: str
    args: list[tuple[str, int]]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    #: bytes of statically sized work-group (shared / local) memory the kernel declares
    shared_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (``shared_bytes`` only when the kernel uses work-group memory)."""
        d = {"name": self.name, "args": [list(a) for a in self.args], "grid": list(self.grid),
             "block": list(self.block)}
        if self.shared_bytes:
            d["shared_bytes"] = self.shared_bytes
        return d


@dataclass
class GPUFunctionInfo:
    """A PrimFunc as a sequence of kernel launches (see the module docstring)."""

    name: str
    params: list[dict[str, Any]]
    temps: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[GPUKernelInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form."""
        return {"name": self.name, "params": self.params, "temps": self.temps,
                "kernels": [k.to_dict() for k in self.kernels]}


class _KState:
    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.nonneg: set[Var] = set()
        self.launch: dict[str, int] = {}
        self.shared: list[Buffer] = []
        self.thread_vars: set[Var] = set()  # loop variables bound to threadIdx.*


class GPUSourceGenerator:
    """Accumulates PrimFuncs; :meth:`finish` gives the source, :attr:`functions` the metadata.

    Parameters
    ----------
    dialect : Dialect
        The kernel language.
    """

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect
        self.functions: list[GPUFunctionInfo] = []
        self._chunks: list[str] = []
        self._kernel_names: set[str] = set()

    # ------------------------------------------------------------------ public
    def add_function(self, f: PrimFunc) -> GPUFunctionInfo:
        """Generate the kernels of ``f`` and return its launch metadata."""
        name = f.attrs.get("global_symbol", f.name)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise CompileError(f"{self.d.name} codegen: {name!r} is not a valid function name")
        if any(fi.name == name for fi in self.functions):
            raise CompileError(f"{self.d.name} codegen: two functions named {name}")
        for b in f.params:
            self.d.type_name(b.dtype)
        info = GPUFunctionInfo(name, [{"name": b.name, "dtype": b.dtype, "shape": list(b.shape)} for b in f.params])
        slots: dict[int, tuple[str, int]] = {id(b.data): ("param", i) for i, b in enumerate(f.params)}
        bufs: dict[int, Buffer] = {id(b.data): b for b in f.params}
        parts: list[Stmt] = []
        self._split(f.body, info, slots, bufs, parts)
        for k, part in enumerate(parts):
            kname = f"{name}_kernel{k}"
            if kname in self._kernel_names:
                raise CompileError(f"{self.d.name} codegen: duplicate kernel name {kname}")
            self._kernel_names.add(kname)
            info.kernels.append(self._kernel(kname, part, slots, bufs))
        self.functions.append(info)
        return info

    def finish(self) -> str:
        """The complete source text."""
        hdr = f"/* Generated by kiln.codegen ({self.d.name}) -- do not edit. */"
        return "\n".join([hdr, self.d.preamble.strip(), self._helpers(), *self._chunks]) + "\n"

    # ------------------------------------------------------------------ structure
    def _split(self, s: Stmt, info: GPUFunctionInfo, slots: dict[int, tuple[str, int]], bufs: dict[int, Buffer],
               parts: list[Stmt]) -> None:
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._split(x, info, slots, bufs, parts)
        elif isinstance(s, Allocate) and s.buffer.scope not in ("local", "shared"):
            b = s.buffer
            self.d.type_name(b.dtype)
            slots[id(b.data)] = ("temp", len(info.temps))
            bufs[id(b.data)] = b
            info.temps.append({"name": b.name, "dtype": b.dtype, "nbytes": int(b.nbytes)})
            self._split(s.body, info, slots, bufs, parts)
        elif isinstance(s, Evaluate) and isinstance(s.value, (IntImm, FloatImm)):
            return
        else:
            parts.append(s)

    def _kernel(self, kname: str, body: Stmt, slots: dict[int, tuple[str, int]],
                bufs: dict[int, Buffer]) -> GPUKernelInfo:
        d = self.d
        st = _KState()
        self._st = st
        used: list[int] = []
        local: set[int] = set()

        def visit(n: Any) -> None:
            if isinstance(n, (Load, BufferStore)):
                k = id(n.buffer.data)
                if k not in used:
                    used.append(k)
            elif isinstance(n, Allocate):
                local.add(id(n.buffer.data))
            elif isinstance(n, For) and n.kind == "thread_binding":
                tag = n.annotations.get("thread_tag")
                if tag not in THREAD_TAGS:
                    raise CompileError(f"{d.name} codegen: {kname}: loop {n.loop_var.name} is bound to unknown "
                                       f"thread tag {tag!r}; expected one of {', '.join(THREAD_TAGS)}")
                if not isinstance(n.extent, IntImm):
                    raise CompileError(f"{d.name} codegen: {kname}: loop {n.loop_var.name} bound to {tag} has a "
                                       f"non-constant extent {n.extent}")
                st.launch[tag] = max(st.launch.get(tag, 1), int(n.extent.value))

        post_order_visit(body, visit)
        args = [k for k in used if k not in local]
        for k in args:
            if k not in slots:
                raise CompileError(f"{d.name} codegen: {kname}: buffer {bufs.get(k, '?')} is neither a parameter "
                                   "nor a temporary")
        sig: list[str] = []
        pro: list[str] = []
        for k in args:
            b = bufs[k]
            t = d.type_name(b.dtype)
            nm = self._buf_name(b)
            gq = f"{d.global_qualifier} " if d.global_qualifier else ""
            if d.buffer_offset_args:
                sig.append(f"{gq}{t}* {nm}_base")
                sig.append(f"{d.offset_type} {nm}_off")
                pro.append(f"  {gq}{t}* {d.restrict} {nm} = ({gq}{t}*)(({gq}char*){nm}_base + {nm}_off);")
            else:
                sig.append(f"{gq}{t}* {d.restrict} {nm}")
        lines: list[str] = []
        self._stmt(body, lines, 1)
        shared = [f"  {d.shared_qualifier} {d.type_name(b.dtype)} {self._buf_name(b)}[{max(b.size, 1)}];"
                  for b in st.shared]
        src = "\n".join([f"{d.kernel_prefix} {kname}({', '.join(sig)}) {{", *shared, *pro, *lines, "}"])
        self._chunks.append(src)
        grid = tuple(st.launch.get(f"blockIdx.{a}", 1) for a in "xyz")
        block = tuple(st.launch.get(f"threadIdx.{a}", 1) for a in "xyz")
        shared_bytes = sum(int(b.nbytes) for b in st.shared)
        return GPUKernelInfo(kname, [slots[k] for k in args], grid, block,  # type: ignore[arg-type]
                             int(shared_bytes))

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
        return self._name(b.data)

    # ------------------------------------------------------------------ helpers text
    def _helpers(self) -> str:
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
            # NaN-propagating min/max, like NumPy's (fmin/fmax would drop the NaN)
            out.append(f"{q} {t} kiln_fmax{sfx}({t} a, {t} b) {{ return (a > b || a != a) ? a : b; }}")
            out.append(f"{q} {t} kiln_fmin{sfx}({t} a, {t} b) {{ return (a < b || a != a) ? a : b; }}")
            if guard:
                out.append(guard[1])
        for dt, sfx in _INT_SUFFIX.items():
            if dt == "bool" or dt not in d.type_names:
                continue
            t = d.type_name(dt)
            out.append(f"{q} {t} kiln_max_{sfx}({t} a, {t} b) {{ return a > b ? a : b; }}")
            out.append(f"{q} {t} kiln_min_{sfx}({t} a, {t} b) {{ return a < b ? a : b; }}")
            if not is_uint(dt):
                out.append(f"{q} {t} kiln_floordiv_{sfx}({t} a, {t} b) {{ {t} q = a / b; "
                           f"return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }}")
                out.append(f"{q} {t} kiln_floormod_{sfx}({t} a, {t} b) {{ {t} r = a % b; "
                           f"return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}")
        return "\n".join(out)

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

    def _float_lit(self, v: float, dtype: str) -> str:
        d = self.d
        if v != v:
            return d.nan_literal(dtype)
        if v in (float("inf"), float("-inf")):
            s = d.inf_literal(dtype)
            return s if v > 0 else f"(-{s})"
        return float(v).hex() + ("f" if dtype != "float64" else "")

    def _int_lit(self, v: int, dtype: str) -> str:
        t = self.d.value_type(dtype)
        if dtype == "int64" or dtype == "uint64":
            if v == -(2**63):
                return f"(({t})(-9223372036854775807) - 1)"
            return f"(({t}){v}{'u' if dtype == 'uint64' else ''}L)" if v >= 0 else f"(({t})({v}L))"
        if dtype == "uint32":
            return f"{v}u"
        if v == -(2**31):
            return "(-2147483647 - 1)"
        return str(v) if v >= 0 else f"({v})"

    def expr(self, e: PrimExpr) -> str:
        """Source text of an expression, computed in :meth:`Dialect.value_type` of its dtype."""
        d = self.d
        if isinstance(e, Var):
            return self._name(e)
        if isinstance(e, IntImm):
            if is_bool(e.dtype):
                return "1" if e.value else "0"
            return self._int_lit(e.value, e.dtype)
        if isinstance(e, FloatImm):
            return self._float_lit(e.value, e.dtype)
        if isinstance(e, BinaryOp):
            return self._binary(e)
        if isinstance(e, Not):
            return f"(!{self.expr(e.a)})"
        if isinstance(e, Cast):
            v = self.expr(e.value)
            if e.dtype == "bool":
                return f"({v} != 0)"
            return f"(({d.value_type(e.dtype)}){v})"
        if isinstance(e, Call):
            return self._call(e)
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"
        if isinstance(e, Load):
            ref = f"{self._buf_name(e.buffer)}[{self._offset(e.buffer, e.indices)}]"
            if is_bool(e.dtype):
                return f"(({d.value_type('bool')}){ref})"
            return ref
        if isinstance(e, (ProducerLoad, Reduce)):
            raise CompileError(f"{d.name} codegen: tensor-expression node left in the loop IR; lower first")
        raise CompileError(f"{d.name} codegen: unsupported expression {type(e).__name__}")

    def _binary(self, e: BinaryOp) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        dt, op = e.a.dtype, e.op
        if op in ("min", "max"):
            if is_float(dt):
                return f"kiln_f{op}{'' if dt == 'float64' else 'f'}({a}, {b})"
            return f"kiln_{op}_{_INT_SUFFIX[dt]}({a}, {b})"
        if op in ("floordiv", "floormod"):
            if (self._nonneg(e.a) and self._nonneg(e.b)) or is_uint(dt):
                return f"({a} {'/' if op == 'floordiv' else '%'} {b})"
            return f"kiln_{op}_{_INT_SUFFIX[dt]}({a}, {b})"
        s = f"({a} {_BIN[op]} {b})"
        if e.dtype in ("int8", "int16", "uint8", "uint16") and op not in _CMP:
            s = f"(({self.d.type_name(e.dtype)}){s})"  # wrap like NumPy instead of integer promotion
        return s

    def _call(self, e: Call) -> str:
        if e.op == CHECKED_INDEX:
            return self._clamped_index(e)
        args = [self.expr(a) for a in e.args]
        if e.op in ("isnan", "isinf", "isfinite"):
            return self.d.is_special_float(e.op, args[0], e.args[0].dtype)
        if e.op not in _MATH_OPS:
            raise CompileError(f"{self.d.name} codegen: unknown intrinsic {e.op!r}")
        return f"{self.d.math_function(e.op, e.args[0].dtype)}({', '.join(args)})"

    def _clamped_index(self, e: Call) -> str:
        """:data:`~kiln.tir.expr.CHECKED_INDEX` on a device: a kernel has no error path, so a
        negative index wraps and an out-of-range one is clamped into ``[0, n)`` (memory stays
        safe; the value is not an error as on the CPU targets)."""
        n = e.args[1].value
        if n == 0:
            raise CompileError(f"{self.d.name} codegen: {e.text}: an index into a zero-size axis is never valid, "
                               "and device kernels cannot report the error; run this op on the CPU")
        t = self.d.type_name("int64")
        v = self.expr(e.args[0])
        wrapped = f"({v} < 0 ? {v} + ({t}){n} : {v})"
        return f"kiln_min_i64(kiln_max_i64({wrapped}, ({t})0), ({t}){n - 1})"

    def _offset(self, b: Buffer, indices: Sequence[PrimExpr]) -> str:
        if b.ndim == 0 and not indices:
            return "0"
        return self.expr(b.flat_offset(indices, self._st.nonneg, f"{self.d.name} codegen"))

    # ------------------------------------------------------------------ statements
    def _stmt(self, s: Stmt, out: list[str], ind: int) -> None:
        d = self.d
        pad = "  " * ind
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._stmt(x, out, ind)
        elif isinstance(s, For):
            self._for(s, out, ind)
        elif isinstance(s, BufferStore):
            b = s.buffer
            v = self.expr(s.value)
            if is_bool(b.dtype):
                v = f"({d.type_name('bool')})({v} != 0)"
            out.append(f"{pad}{self._buf_name(b)}[{self._offset(b, s.indices)}] = {v};")
        elif isinstance(s, Allocate):
            b = s.buffer
            if b.scope == "shared":
                self._st.shared.append(b)
                self._stmt(s.body, out, ind)
                return
            out.append(f"{pad}{{")
            out.append(f"{pad}  {d.type_name(b.dtype)} {self._buf_name(b)}[{max(b.size, 1)}];")
            self._stmt(s.body, out, ind + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, IfThenElse):
            if (self._st.thread_vars & _vars_of(s.cond)) and (
                    _has_barrier(s.then_case) or (s.else_case is not None and _has_barrier(s.else_case))):
                raise CompileError(
                    f"{d.name} codegen: a work-group barrier under a condition on the work-item index "
                    f"({self.expr(s.cond)}): work-items that skip it would deadlock the group; the schedule must "
                    "split thread-bound loops exactly (no tail guards) where a barrier is reached")
            out.append(f"{pad}if ({self.expr(s.cond)}) {{")
            self._stmt(s.then_case, out, ind + 1)
            if s.else_case is not None:
                out.append(f"{pad}}} else {{")
                self._stmt(s.else_case, out, ind + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, LetStmt):
            out.append(f"{pad}{{")
            out.append(f"{pad}  const {d.value_type(s.var.dtype)} {self._name(s.var)} = {self.expr(s.value)};")
            if is_integer(s.var.dtype) and self._nonneg(s.value):
                self._st.nonneg.add(s.var)
            self._stmt(s.body, out, ind + 1)
            out.append(f"{pad}}}")
        elif isinstance(s, Evaluate):
            if isinstance(s.value, Call) and s.value.op == BARRIER_INTRINSIC:
                out.append(f"{pad}{d.barrier()}")
            elif not isinstance(s.value, (IntImm, FloatImm)):
                out.append(f"{pad}(void)({self.expr(s.value)});")
        else:
            raise CompileError(f"{d.name} codegen: unsupported statement {type(s).__name__}")

    def _for(self, s: For, out: list[str], ind: int) -> None:
        d = self.d
        pad = "  " * ind
        v = self._name(s.loop_var)
        ct = d.value_type(s.loop_var.dtype)
        if self._nonneg(s.min):
            self._st.nonneg.add(s.loop_var)
        mn, ext = self.expr(s.min), self.expr(s.extent)
        zero_min = isinstance(s.min, IntImm) and s.min.value == 0
        if s.kind == "thread_binding":
            tag = s.annotations["thread_tag"]
            idx = f"(({ct}){d.thread_index(tag)})"
            if tag.startswith("threadIdx."):
                self._st.thread_vars.add(s.loop_var)
            out.append(f"{pad}{{")
            out.append(f"{pad}  const {ct} {v} = {idx if zero_min else f'{mn} + {idx}'};")
            if int(s.extent.value) < self._st.launch[tag]:
                if _has_barrier(s.body):
                    raise CompileError(
                        f"{d.name} codegen: loop {s.loop_var.name} bound to {tag} has extent {s.extent.value} < the "
                        f"launch size {self._st.launch[tag]} and contains a work-group barrier: the idle work-items "
                        "would skip it (deadlock); bind the same extent everywhere a barrier is reached")
                out.append(f"{pad}  if ({idx} < {ext}) {{")
                self._stmt(s.body, out, ind + 2)
                out.append(f"{pad}  }}")
            else:
                self._stmt(s.body, out, ind + 1)
            out.append(f"{pad}}}")
            return
        end = ext if zero_min else f"{mn} + {ext}"
        if s.kind == "unrolled" and isinstance(s.extent, IntImm):
            out.append(f"{pad}#pragma unroll")
        out.append(f"{pad}for ({ct} {v} = {mn}; {v} < {end}; ++{v}) {{")
        self._stmt(s.body, out, ind + 1)
        out.append(f"{pad}}}")


def _vars_of(e: PrimExpr) -> set[Var]:
    out: set[Var] = set()
    post_order_visit(e, lambda n: out.add(n) if isinstance(n, Var) else None)
    return out


def _has_barrier(s: Stmt) -> bool:
    found: list[bool] = []

    def f(n: Any) -> None:
        if isinstance(n, Call) and n.op == BARRIER_INTRINSIC:
            found.append(True)

    post_order_visit(s, f)
    return bool(found)


_RESERVED = {
    "int", "float", "double", "char", "short", "long", "uint", "uchar", "ushort", "ulong", "half", "bool",
    "if", "else", "for", "while", "do", "return", "const", "static", "void", "struct", "union", "switch", "case",
    "default", "break", "continue", "goto", "sizeof", "typedef", "auto", "register", "signed", "unsigned",
    "volatile", "extern", "restrict", "inline", "enum", "exp", "log", "sqrt", "pow", "floor", "ceil", "round",
    "trunc", "fabs", "erf", "tanh", "sin", "cos", "tan", "abs", "min", "max", "main", "NAN", "INFINITY",
    "kernel", "global", "local", "constant", "private", "image2d_t", "sampler_t", "event_t", "vector",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "q", "r", "a", "b", "new", "delete", "this",
    "class", "template", "namespace", "using", "true", "false", "operator", "public",
}


def generate_gpu_source(funcs: Sequence[PrimFunc], dialect: Dialect) -> tuple[str, list[GPUFunctionInfo]]:
    """Source text and per-function launch metadata of ``funcs`` in ``dialect``.

    Parameters
    ----------
    funcs : sequence of PrimFunc
    dialect : Dialect

    Returns
    -------
    source : str
    functions : list of GPUFunctionInfo
    """
    g = GPUSourceGenerator(dialect)
    for f in funcs:
        g.add_function(f)
    return g.finish(), g.functions
