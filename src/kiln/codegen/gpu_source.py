"""GPU kernel source generation shared by the OpenCL and CUDA code generators.

:class:`GPUSourceGenerator` turns :class:`~kiln.tir.PrimFunc` s into the source text of a
C-like kernel language plus *launch metadata*. Everything language-specific lives in a
:class:`Dialect`; a new GPU language is a ``Dialect`` subclass, nothing more. Expressions
and statements are printed by :class:`kiln.codegen.cstyle.CStylePrinter`, the printer of
host C too: this module owns only the kernel structure.

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

Dynamic dimensions
------------------
A parameter with dynamic dims (``Buffer.dyn``, ``docs/dynamic_shapes.md``) is stored at its
upper-bound shape; the lowering already bounds serial loops over a dynamic axis by its
runtime extent and guards thread-bound loops with ``if (index < n)`` (their extents stay the
constant launch size). So a kernel only needs the extents it reads: each becomes a by-value
``int`` / ``long`` parameter after the buffers, named after its variable, and the function's
metadata lists them (``extents``) with every ``(param, dim)`` that has each, from which the
launcher takes and checks the value. Work-items past an extent fail their guard and exit, and
work-groups keep their full size, which barriers need.

The *grid* may follow the extents (:func:`dynamic_grid`): a grid dim whose every global write
sits under a guard ``k * b + rest < R`` on its work-group index ``b`` (``k > 0``, ``rest``
bounded below by a constant, ``R`` built from runtime extents with ``+ - * //``, all signed:
the relaxed guards the lowering writes) gets the run-time grid ``ceil((R - min rest) / k)``,
recorded as a :mod:`kiln.runtime.sym` expression over the extents' names (``dyn_grid``; the
launcher clamps it to ``[0, grid]``). Work-groups past it would have written nothing, so leaving them
out changes no result. Anything else keeps the upper-bound grid.

Metadata (``GPUFunctionInfo.to_dict``), JSON-serializable, is what a runtime module needs to
launch a function::

    {"name": f, "params": [{"name", "dtype", "shape"}...],
     "temps": [{"name", "dtype", "nbytes"}...],
     "kernels": [{"name": k, "args": [["param", i] | ["temp", j] | ["extent", e], ...],
                  "grid": [x, y, z], "block": [x, y, z],
                  "dyn_grid": [ex, ey, ez]}...],       # only when a grid dim follows the extents
     "extents": [{"name", "dtype", "dims": [[param, dim], ...]}...]}   # dynamic only

Kernel parameters are, per buffer argument in ``args`` order, a pointer
(``Dialect.global_qualifier T* restrict``) and — when ``Dialect.buffer_offset_args`` — a
64-bit *byte* offset added to it on entry (OpenCL buffers are handles, not addresses); then
one scalar per ``["extent", e]``. ``grid`` counts work-groups (CUDA blocks), ``block``
work-items per group (threads); ``dyn_grid`` gives, per grid dim, the run-time grid as a
:mod:`kiln.runtime.sym` expression over the extents' names (``""``: the dim stays ``grid``).

Writing a dialect
-----------------
Set ``name`` and ``type_names`` and override the kernel words of :class:`Dialect`:
``kernel_prefix`` (text before the kernel name, e.g. ``"__kernel void"``),
``global_qualifier``, ``shared_qualifier``, ``func_qualifier`` (helper functions),
``restrict``, ``preamble``, :meth:`Dialect.thread_index`, :meth:`Dialect.barrier`,
:meth:`Dialect.vector_type`; and, where the language spells them differently from the
:class:`~kiln.codegen.cstyle.CDialect` defaults (``<math.h>`` names, overloaded math
functions), ``math_function``, ``inf_literal``, ``nan_literal``, ``is_special_float``,
``dtype_guard``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..runtime import sym
from ..runtime.errors import CompileError, InputError
from ..tir.dtype import bits_of, is_int, is_uint
from ..tir.expr import BinaryOp, Call, Cast, FloatImm, IntImm, Load, PrimExpr, Var, conjuncts
from ..tir.functor import collect_vars, post_order_visit
from ..tir.intrin import SET_EXTENT, set_extent_targets
from ..tir.simplify import INF, Analyzer
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt
from ..tir.unswitch import extent_bounds
from .cstyle import C_KEYWORDS, CDialect, CStylePrinter, Scope

__all__ = [
    "Dialect", "GPUSourceGenerator", "GPUFunctionInfo", "GPUKernelInfo", "generate_gpu_source",
    "THREAD_TAGS", "BARRIER_INTRINSIC", "dynamic_grid",
]

#: Thread tags ``Stage.bind`` accepts, in launch-dimension order.
THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
#: Name of the intrinsic call that becomes a work-group barrier.
BARRIER_INTRINSIC = "kiln.barrier"

class Dialect(CDialect):
    """What differs between GPU kernel languages. Subclass and override.

    Extends :class:`~kiln.codegen.cstyle.CDialect` (type names, literals, math names) with
    the kernel structure.

    Attributes
    ----------
    kernel_prefix : str
        Text before a kernel's name (``"__kernel void"``, ``'extern "C" __global__ void'``).
    global_qualifier : str
        Address-space qualifier of global-memory pointers (``"__global"``; CUDA: ``""``).
    shared_qualifier : str
        Qualifier of work-group memory (``"__local"``, ``"__shared__"``).
    func_qualifier : str
        As in ``CDialect`` (``"inline"``, ``"static __device__ __forceinline__"``).
    restrict : str
        The restrict keyword (``"restrict"``, ``"__restrict__"``).
    buffer_offset_args : bool
        Pass a 64-bit byte offset after every buffer pointer (needed where buffers are handles).
    offset_type : str
        Type of those offsets.
    preamble : str
        Text put at the top of every source (pragmas, includes).
    type_names : dict
        As in ``CDialect`` (a dialect must set it); bools are stored as ``type_names["bool"]``
        and computed as ``type_names["int32"]``.
    """

    name = "gpu"
    kernel_prefix = "void"
    global_qualifier = ""
    shared_qualifier = ""
    restrict = "restrict"
    buffer_offset_args = False
    offset_type = "long"
    preamble = ""

    def thread_index(self, tag: str) -> str:
        """Expression (an ``int``) for a thread tag such as ``"blockIdx.x"``."""
        raise NotImplementedError

    def barrier(self) -> str:
        """Statement synchronizing the work-items of a work-group (work-group memory fence)."""
        raise NotImplementedError

    def vector_type(self, dtype: str, lanes: int) -> str:
        """Name of the ``lanes``-wide vector type of ``dtype`` (e.g. ``float4``)."""
        return f"{self.type_name(dtype)}{lanes}"


@dataclass
class GPUKernelInfo:
    """One kernel: its name, arguments (buffers, then runtime extents) and launch size (see the
    module docstring)."""

    name: str
    args: list[tuple[str, int]]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    #: bytes of statically sized work-group (shared / local) memory the kernel declares
    shared_bytes: int = 0
    #: per grid dim, the run-time grid over the extents' names (``""``: static); ``()`` for none
    dyn_grid: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (``shared_bytes`` only when the kernel uses work-group memory,
        ``dyn_grid`` only when a grid dim follows the runtime extents)."""
        d: dict[str, Any] = {"name": self.name, "args": [list(a) for a in self.args], "grid": list(self.grid),
                             "block": list(self.block)}
        if self.shared_bytes:
            d["shared_bytes"] = self.shared_bytes
        if self.dyn_grid:
            d["dyn_grid"] = list(self.dyn_grid)
        return d


@dataclass
class GPUFunctionInfo:
    """A PrimFunc as a sequence of kernel launches (see the module docstring)."""

    name: str
    params: list[dict[str, Any]]
    temps: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[GPUKernelInfo] = field(default_factory=list)
    #: runtime extents of dynamic dims: ``{"name", "dtype", "dims": [[param, dim], ...]}``
    extents: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (``extents`` only when the function has dynamic dims)."""
        d = {"name": self.name, "params": self.params, "temps": self.temps,
             "kernels": [k.to_dict() for k in self.kernels]}
        if self.extents:
            d["extents"] = self.extents
        return d


class _KState(Scope):
    def __init__(self) -> None:
        super().__init__()
        self.launch: dict[str, int] = {}
        self.shared: list[Buffer] = []
        self.thread_vars: set[Var] = set()  # loop variables bound to threadIdx.*


class GPUSourceGenerator(CStylePrinter):
    """Accumulates PrimFuncs; :meth:`finish` gives the source, :attr:`functions` the metadata.

    The GPU code generator of :class:`~kiln.codegen.cstyle.CStylePrinter`, which prints
    expressions and statements; this class adds the kernel structure (splitting, launch
    sizes, work-group memory, barriers, clamped data-dependent indices).

    Parameters
    ----------
    dialect : Dialect
        The kernel language.
    """

    # OpenCL C / CUDA C words, and the parameter names of the helpers (kiln_floordiv_* …)
    reserved = C_KEYWORDS | {
        "uint", "uchar", "ushort", "ulong", "half", "bool", "min", "max", "kernel", "global", "local", "constant",
        "private", "image2d_t", "sampler_t", "event_t", "vector", "threadIdx", "blockIdx", "blockDim", "gridDim",
        "warpSize", "q", "r", "a", "b", "new", "delete", "this", "class", "template", "namespace", "using", "true",
        "false", "operator", "public",
    }
    _st: _KState

    d: Dialect

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(dialect)
        self.functions: list[GPUFunctionInfo] = []
        self._chunks: list[str] = []
        self._kernel_names: set[str] = set()
        self._grid_extents: dict[Var, int] = {}  # the current function's extents (see add_function)

    # ------------------------------------------------------------------ public
    def add_function(self, f: PrimFunc) -> GPUFunctionInfo:
        """Generate the kernels of ``f`` and return its launch metadata."""
        name = f.attrs.get("global_symbol", f.name)
        self._check_symbol(name, [fi.name for fi in self.functions])
        if set_extent_targets(f):
            raise CompileError(f"{name}: a kernel reporting a data-dependent output extent ({SET_EXTENT}: NonZero, "
                               f"Unique, NonMaxSuppression, ...) is not supported by the {self.d.name} code "
                               "generator: place that op on the CPU (kiln.build(..., placement={'<op>': 'cpu'}); "
                               "left unplaced, such ops go to the CPU by themselves)")
        for b in f.params:
            self.d.type_name(b.dtype)
        info = GPUFunctionInfo(name, [{"name": b.name, "dtype": b.dtype, "shape": list(b.shape)} for b in f.params])
        slots: dict[int, tuple[str, int]] = {id(b.data): ("param", i) for i, b in enumerate(f.params)}
        for j, v in enumerate(f.dyn_vars):
            info.extents.append({"name": v.name, "dtype": v.dtype, "dims": [
                [i, d] for i, b in enumerate(f.params) for d, u in enumerate(b.dyn or ()) if u is v]})
            slots[id(v)] = ("extent", j)
        # run-time grids name the extents, so they need distinct valid names (always so for
        # what the lowering makes; a hand-written PrimFunc may differ and keeps static grids)
        names = [v.name for v in f.dyn_vars]
        # each with the bound the launcher enforces: the smallest dim it sizes
        self._grid_extents = {}
        if len(set(names)) == len(names) and all(_valid_name(n) for n in names):
            self._grid_extents = extent_bounds(f.params)
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
        return "\n".join([hdr, self.d.preamble.strip(), self.helper_source(), *self._chunks]) + "\n"

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
        ext: dict[int, Var] = {}  # the runtime extents the kernel reads

        def visit(n: Any) -> None:
            if isinstance(n, Var):
                if slots.get(id(n), ("",))[0] == "extent":
                    ext[id(n)] = n
            elif isinstance(n, (Load, BufferStore)):
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
        # runtime extents the kernel reads: scalar parameters after the buffers, in the
        # function's extent order (the launcher fills them from the arguments' actual shapes)
        exts = sorted(ext.values(), key=lambda v: slots[id(v)][1])
        for v in exts:
            self._name(v)
            st.nonneg.add(v)
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
        for v in exts:
            sig.append(f"const {d.type_name(v.dtype)} {self._name(v)}")
        lines: list[str] = []
        self._stmt(body, lines, 1)
        shared = [f"  {d.shared_qualifier} {d.type_name(b.dtype)} {self._buf_name(b)}[{max(b.size, 1)}];"
                  for b in st.shared]
        src = "\n".join([f"{d.kernel_prefix} {kname}({', '.join(sig)}) {{", *shared, *pro, *lines, "}"])
        self._chunks.append(src)
        grid = tuple(st.launch.get(f"blockIdx.{a}", 1) for a in "xyz")
        block = tuple(st.launch.get(f"threadIdx.{a}", 1) for a in "xyz")
        shared_bytes = sum(int(b.nbytes) for b in st.shared)
        dyn = dynamic_grid(body, grid, self._grid_extents, local) if exts and self._grid_extents else ()
        return GPUKernelInfo(kname, [slots[k] for k in args] + [slots[id(v)] for v in exts],
                             grid, block, int(shared_bytes), dyn)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ expressions
    def _checked_index(self, e: Call) -> str:
        """:data:`~kiln.tir.expr.CHECKED_INDEX` on a device: a kernel has no error path, so a
        negative index wraps and an out-of-range one is clamped into ``[0, n)`` (memory stays
        safe; the value is not an error as on the CPU targets). ``n`` may be a runtime extent:
        the index is then clamped to the valid data, never into the padding."""
        t = self.d.type_name("int64")
        if not isinstance(e.args[1], IntImm):
            v, n_rt = self.expr(e.args[0]), f"(({t}){self.expr(e.args[1])})"
            wrapped = f"({v} < 0 ? {v} + {n_rt} : {v})"
            # an extent of 0 clamps to element 0, which the upper-bound storage always has
            return f"kiln_max_i64(kiln_min_i64({wrapped}, {n_rt} - 1), ({t})0)"
        n = e.args[1].value
        if n == 0:
            raise CompileError(f"{self.lang} codegen: {e.text}: an index into a zero-size axis is never valid, "
                               "and device kernels cannot report the error; run this op on the CPU")
        v = self.expr(e.args[0])
        wrapped = f"({v} < 0 ? {v} + ({t}){n} : {v})"
        return f"kiln_min_i64(kiln_max_i64({wrapped}, ({t})0), ({t}){n - 1})"

    # ------------------------------------------------------------------ statements
    def _allocate(self, s: Allocate, out: list[str], ind: int) -> None:
        b = s.buffer
        if b.scope == "shared":  # declared once at kernel scope (see _kernel)
            self._st.shared.append(b)
            self._stmt(s.body, out, ind)
            return
        pad = "  " * ind
        out.append(f"{pad}{{")
        out.append(f"{pad}  {self.d.type_name(b.dtype)} {self._buf_name(b)}[{max(b.size, 1)}];")
        self._stmt(s.body, out, ind + 1)
        out.append(f"{pad}}}")

    def _if(self, s: IfThenElse, out: list[str], ind: int) -> None:
        if (self._st.thread_vars & _vars_of(s.cond)) and (
                _has_barrier(s.then_case) or (s.else_case is not None and _has_barrier(s.else_case))):
            raise CompileError(
                f"{self.lang} codegen: a work-group barrier under a condition on the work-item index "
                f"({self.expr(s.cond)}): work-items that skip it would deadlock the group; the schedule must "
                "split thread-bound loops exactly (no tail guards) where a barrier is reached")
        super()._if(s, out, ind)

    def _evaluate(self, s: Evaluate, out: list[str], ind: int) -> None:
        if isinstance(s.value, Call) and s.value.op == BARRIER_INTRINSIC:
            out.append(f"{'  ' * ind}{self.d.barrier()}")
        else:
            super()._evaluate(s, out, ind)

    def _special_loop(self, s: For, out: list[str], ind: int) -> bool:
        """A ``thread_binding`` loop is no loop: its variable is the work-group / work-item index."""
        if s.kind != "thread_binding":
            return False
        pad = "  " * ind
        v = self._name(s.loop_var)
        ct = self.d.value_type(s.loop_var.dtype)
        tag = s.annotations["thread_tag"]
        idx = f"(({ct}){self.d.thread_index(tag)})"
        if tag.startswith("threadIdx."):
            self._st.thread_vars.add(s.loop_var)
        zero_min = isinstance(s.min, IntImm) and s.min.value == 0
        out.append(f"{pad}{{")
        out.append(f"{pad}  const {ct} {v} = {idx if zero_min else f'{self.expr(s.min)} + {idx}'};")
        if int(s.extent.value) < self._st.launch[tag]:
            if _has_barrier(s.body):
                raise CompileError(
                    f"{self.lang} codegen: loop {s.loop_var.name} bound to {tag} has extent {s.extent.value} < "
                    f"the launch size {self._st.launch[tag]} and contains a work-group barrier: the idle "
                    "work-items would skip it (deadlock); bind the same extent everywhere a barrier is reached")
            out.append(f"{pad}  if ({idx} < {self.expr(s.extent)}) {{")
            self._stmt(s.body, out, ind + 2)
            out.append(f"{pad}  }}")
        else:
            self._stmt(s.body, out, ind + 1)
        out.append(f"{pad}}}")
        return True

    def _loop_pragma(self, s: For) -> str | None:
        return "#pragma unroll" if s.kind == "unrolled" and isinstance(s.extent, IntImm) else None


#: per grid dim, a grid bound (a :mod:`kiln.runtime.sym` expression) or None
_Bounds = tuple[str | None, ...]


def _valid_name(name: str) -> bool:
    try:
        sym.check_name(name)
    except InputError:
        return False
    return True


def dynamic_grid(body: Stmt, grid: Sequence[int], extents: dict[Var, int], local: set[int]) -> tuple[str, ...]:
    """The run-time grid of a kernel, per grid dim, as :mod:`kiln.runtime.sym` expressions.

    A grid dim ``a`` (work-group index ``b``, bound by a ``blockIdx`` loop) gets an expression
    only when *every* side effect of the kernel -- a store into a buffer it does not allocate
    itself, an ``Evaluate`` of anything but a barrier -- is under an ``if`` whose condition has
    a conjunct ``k * b + rest < R`` with ``k > 0`` (after ``floordiv(x, c) < R`` became
    ``x < R * c``, the inverse of :func:`kiln.te.dynamic.dyn_guard`), ``rest`` not involving
    ``b`` and bounded below by a constant ``lo`` over the ranges of the loops around that
    ``if``, and ``R`` an integer expression of runtime extents, all in signed integer types
    (unsigned arithmetic wraps). Such a guard fails for every ``b >= ceil((R - lo) / k)``, so
    those work-groups write nothing and the grid may stop there. All side effects must give
    the same bound (a kernel writing under two different guards keeps its grid).

    A dim of launch size 1 may also take a guard without ``b`` (``k = 0``: the kernel's
    ``if (0 < batch * 6)``): its expression ``R - lo`` is clamped to ``[0, 1]`` by the
    launcher, so the launch is left out when no work-item could pass. Only the first such
    dim gets it, and only when no larger dim has an expression.

    Parameters
    ----------
    body : Stmt
        The kernel's statement.
    grid : sequence of 3 ints
        The compile-time (upper-bound) grid.
    extents : dict of Var to int
        The function's runtime extents with their upper bounds (the smallest dim each sizes,
        which the launcher enforces); the expressions use the variables' names (distinct,
        valid :mod:`kiln.runtime.sym` names).
    local : set of int
        ``id(buffer.data)`` of the buffers the kernel allocates (per work-item or work-group
        memory): stores into them are invisible outside the work-group.

    Returns
    -------
    tuple of str
        Three expressions (``""`` for a dim that keeps its size), or ``()`` when no dim follows
        the extents.
    """
    ana = Analyzer()
    for v, hi in extents.items():
        ana.bind(v, 0, hi)
    tags = tuple(f"blockIdx.{a}" for a in "xyz")
    # per side effect, per grid dim: the bound of the first enclosing conjunct that gives one.
    # A conjunct is read where its ``if`` is, with the ranges of the loops around it then in
    # force (a loop variable may be bound again by a later or an inner loop).
    effects: list[_Bounds] = []

    def scoped(var: Var, rng: tuple[float, float] | None, body: Stmt, facts: tuple[_Bounds, ...],
               blocks: dict[str, Var]) -> None:
        """Walk ``body`` with ``var`` in ``rng`` (``None``: unknown), then restore its range."""
        old = ana.ranges.pop(var, None)
        if rng is not None:
            ana.bind(var, *rng)
        try:
            walk(body, facts, blocks)
        finally:
            ana.ranges.pop(var, None)
            if old is not None:
                ana.ranges[var] = old

    def walk(s: Stmt, facts: tuple[_Bounds, ...], blocks: dict[str, Var]) -> None:
        if isinstance(s, SeqStmt):
            for x in s.seq:
                walk(x, facts, blocks)
        elif isinstance(s, IfThenElse):
            new = tuple(tuple(_guard_bound(c, blocks.get(tag), grid[a], ana, extents) for a, tag in enumerate(tags))
                        for c in conjuncts(s.cond))
            walk(s.then_case, facts + new, blocks)
            if s.else_case is not None:
                walk(s.else_case, facts, blocks)
        elif isinstance(s, For):
            lo, mhi = ana.const_int_bound(s.min)
            _, ehi = ana.const_int_bound(s.extent)
            rng = (lo, mhi + ehi - 1 if INF not in (mhi, ehi) else INF) if lo != -INF else None
            tag = s.annotations.get("thread_tag") if s.kind == "thread_binding" else None
            if tag in tags and isinstance(s.min, IntImm) and s.min.value == 0:
                blocks = {**blocks, tag: s.loop_var}
            scoped(s.loop_var, rng, s.body, facts, blocks)
        elif isinstance(s, LetStmt):
            scoped(s.var, None, s.body, facts, blocks)
        elif isinstance(s, Allocate):
            walk(s.body, facts, blocks)
        elif isinstance(s, BufferStore):
            if id(s.buffer.data) not in local:
                effects.append(_first_bounds(facts))
        elif isinstance(s, Evaluate):
            if not (isinstance(s.value, (IntImm, FloatImm))
                    or (isinstance(s.value, Call) and s.value.op == BARRIER_INTRINSIC)):
                effects.append(_first_bounds(facts))
        else:  # a statement this analysis does not know: assume it writes, unguarded
            effects.append((None, None, None))

    walk(body, (), {})
    if not effects:
        return ()
    out = []
    for a in range(3):
        bound = effects[0][a]
        if any(b[a] != bound for b in effects):
            bound = None  # unguarded somewhere, or guards giving different bounds
        # a bound that is never below the launch size (over extents 0..upper bound) is no use
        if bound is not None and sym.bounds(bound, {v.name: (0, hi) for v, hi in extents.items()})[0] >= grid[a]:
            bound = None
        out.append(bound or "")
    # a launch size of 1 needs its guard only when nothing else can empty the launch
    big = [a for a in range(3) if out[a] and grid[a] > 1]
    ones = [a for a in range(3) if out[a] and grid[a] == 1]
    for a in ones[1:] if not big else ones:
        out[a] = ""
    return tuple(out) if any(out) else ()


def _first_bounds(facts: Sequence[_Bounds]) -> _Bounds:
    """Per grid dim, the first bound among ``facts`` (each conjunct's, outermost first)."""
    return tuple(next((f[a] for f in facts if f[a] is not None), None) for a in range(3))


def _guard_bound(fact: PrimExpr, b: Var | None, size: int, ana: Analyzer, extents: dict[Var, int]) -> str | None:
    """The grid ``fact`` implies for the block index ``b`` (see :func:`dynamic_grid`), or None."""
    if not (isinstance(fact, BinaryOp) and fact.op in ("lt", "le")):
        return None
    # signed arithmetic only: an unsigned value wraps (``(u64)(n - 40)`` is huge for n < 40)
    if not is_int(fact.a.dtype) or _has_unsigned(fact.a):
        return None
    bound = _as_sym(fact.b, extents)
    if bound is None or not sym.is_symbolic(bound):
        return None
    if fact.op == "le":
        bound = sym.add(bound, 1)
    lhs = fact.a
    while isinstance(lhs, BinaryOp) and lhs.op == "floordiv" and isinstance(lhs.b, IntImm) and lhs.b.value > 0:
        bound = sym.mul(bound, lhs.b.value)  # floordiv(x, c) < R  <=>  x < R * c  (c > 0)
        lhs = lhs.a
    terms, lo = ana.linear(ana.simplify(lhs))
    k = 0
    for atom, coef in terms.values():
        if b is not None and atom is b:
            k += coef
            continue
        if coef == 0:
            continue
        if b is not None and b in collect_vars(atom):
            return None
        alo, ahi = ana.const_int_bound(atom)
        least = coef * (alo if coef > 0 else ahi)
        if least in (float("inf"), float("-inf")) or least != least:
            return None
        lo += int(least)
    if k < 0 or (k == 0 and size != 1):
        return None
    room = sym.sub(bound, lo)
    out = room if k == 0 else sym.floordiv(sym.add(room, k - 1), k)
    return out if isinstance(out, str) else None


def _as_sym(e: PrimExpr, extents: dict[Var, int]) -> sym.Dim | None:
    """``e`` as a :mod:`kiln.runtime.sym` dim when it is built from runtime extents and integer
    constants with ``+ - *``, ``floordiv`` by a positive constant and widening casts, all of
    signed integer types (unsigned arithmetic wraps where ``sym`` does not)."""
    if not is_int(e.dtype):
        return None
    if isinstance(e, IntImm):
        return int(e.value)
    if isinstance(e, Var):
        return e.name if e in extents else None
    if isinstance(e, Cast):
        # exact for every value: a strictly wider signed type, or the same type
        if is_int(e.value.dtype) and bits_of(e.dtype) >= bits_of(e.value.dtype):
            return _as_sym(e.value, extents)
        return None
    if isinstance(e, BinaryOp) and e.op in ("add", "sub", "mul", "floordiv"):
        a = _as_sym(e.a, extents)
        if a is None:
            return None
        if e.op == "floordiv":
            return sym.floordiv(a, e.b.value) if isinstance(e.b, IntImm) and e.b.value > 0 else None
        c = _as_sym(e.b, extents)
        if c is None:
            return None
        return {"add": sym.add, "sub": sym.sub, "mul": sym.mul}[e.op](a, c)
    return None


def _has_unsigned(e: PrimExpr) -> bool:
    """Whether a node of ``e`` has an unsigned integer type."""
    found: list[bool] = []
    post_order_visit(e, lambda n: found.append(True) if is_uint(getattr(n, "dtype", "")) else None)
    return bool(found)


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
