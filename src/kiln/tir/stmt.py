"""Statements of the loop IR, buffers and :class:`PrimFunc`, the unit every codegen consumes."""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.errors import CompileError
from .dtype import bits_of, check_dtype
from .expr import BinaryOp, IntImm, Load, PrimExpr, Var, convert

__all__ = [
    "Buffer",
    "Stmt",
    "For",
    "ForKind",
    "BufferStore",
    "Allocate",
    "SeqStmt",
    "IfThenElse",
    "LetStmt",
    "Evaluate",
    "PrimFunc",
    "seq",
]


class Buffer:
    """A dense row-major array: ``name``, static ``shape`` (ints), scalar ``dtype``.

    ``scope`` is ``"global"`` for function parameters and workspace, ``"local"`` for small
    temporaries the codegen may keep on the stack.  ``buffer[i, j]`` builds a :class:`Load`.

    ``dyn`` (parameters only) marks dynamic dimensions: ``None`` for a static buffer, else one
    entry per dimension, a :class:`Var` (integer) for a dimension whose actual extent is only
    known at run time, ``None`` for a static one.  Storage and strides stay those of the
    static ``shape`` (the upper bounds); the valid data is the box ``[0:dyn0, 0:dyn1, ...]``.
    The CPU code generators bind each Var from the first argument dimension that carries it
    (``DLTensor::shape[d]``) at entry, after the crt's argument check has accepted
    ``0 <= extent <= shape[d]`` there (:attr:`check_shape`); later dimensions carrying the
    same Var must agree.
    """

    def __init__(self, name: str, shape: Sequence[int], dtype: str = "float32", scope: str = "global",
                 dyn: Sequence[Var | None] | None = None) -> None:
        self.name = name
        self.shape: tuple[int, ...] = tuple(int(s) for s in shape)
        if any(s < 0 for s in self.shape):
            raise CompileError(f"buffer {name}: negative extent in shape {self.shape}")
        self.dtype = check_dtype(dtype)
        self.scope = scope
        self.data = Var(name, "handle")
        self.dyn: tuple[Var | None, ...] | None = _check_dyn(name, self.shape, dyn)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Storage size in bytes."""
        return self.size * bits_of(self.dtype) // 8

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    @property
    def check_shape(self) -> tuple[int, ...]:
        """The shape the argument check (``KilnCheckTensorArg`` in the crt) is given: a dynamic
        dimension as ``-1 - max`` (negative, and distinct from a static 0), a static one as is."""
        if self.dyn is None:
            return self.shape
        return tuple(s if v is None else -1 - s for s, v in zip(self.shape, self.dyn))

    def flat_offset(self, indices: Sequence[PrimExpr], nonneg: Any = (), who: str = "codegen") -> PrimExpr:
        """Row-major element offset of ``self[indices]``, simplified for code generation.

        Indices are widened to int64 when the buffer has 2**31 or more elements; ``nonneg``
        are variables known to be in ``[0, 2**31)`` (loop indices), which lets the simplifier
        fold the sum. ``who`` names the caller in the error for a wrong index count.
        """
        from .expr import cast
        from .simplify import simplify

        if len(indices) != self.ndim:
            raise CompileError(f"{who}: buffer {self.name} indexed with {len(indices)} indices, "
                               f"has {self.ndim} dims")
        if self.ndim == 0:
            return IntImm(0)
        if self.size >= 2**31:
            indices = [i if i.dtype == "int64" else cast(i, "int64") for i in indices]
        return simplify(self.flat_sum(indices), {v: (0, 2**31 - 1) for v in nonneg})

    def flat_sum(self, indices: Sequence[PrimExpr]) -> PrimExpr:
        """``sum(index * stride)`` over the dims of ``self[indices]``, unsimplified."""
        flat: PrimExpr | None = None
        for idx, stride in zip(indices, self.strides):
            # nodes built directly where the dtypes agree: every access the codegens emit or
            # the vectorizer inspects comes here, and binary()'s matching is most of the cost
            if stride == 1:
                t: PrimExpr = idx
            elif isinstance(idx, IntImm):
                c = idx.value * stride
                # folded here when it fits; else binary() wraps it as the index dtype wraps
                t = IntImm(c, idx.dtype) if -(2**31) <= c < 2**31 else idx * stride
            else:
                t = BinaryOp("mul", idx, IntImm(stride, idx.dtype), idx.dtype)
            if flat is None:
                flat = t
            elif flat.dtype == t.dtype:
                flat = BinaryOp("add", flat, t, t.dtype)
            else:
                flat = flat + t
        return flat if flat is not None else IntImm(0)

    def __getitem__(self, idx: Any) -> Load:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.ndim:
            raise CompileError(f"buffer {self.name} has {self.ndim} dims, indexed with {len(idx)}")
        return Load(self, [convert(i) for i in idx])

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {list(self.shape)}, {self.dtype})"


def _check_dyn(name: str, shape: tuple[int, ...], dyn: Sequence[Var | None] | None) -> tuple[Var | None, ...] | None:
    """``dyn`` as a tuple, or None when it marks no dimension dynamic."""
    if dyn is None:
        return None
    dyn = tuple(dyn)
    if len(dyn) != len(shape):
        raise CompileError(f"buffer {name}: dyn has {len(dyn)} entries for {len(shape)} dims")
    for d, v in enumerate(dyn):
        if v is None:
            continue
        if not isinstance(v, Var) or v.dtype not in ("int32", "int64"):
            raise CompileError(f"buffer {name}: dyn[{d}] must be an int32/int64 tir.Var or None, got {v!r}")
        if v.dtype == "int32" and shape[d] >= 2**31:
            raise CompileError(f"buffer {name}: dim {d} bound {shape[d]} does not fit the int32 Var {v.name}")
    return dyn if any(v is not None for v in dyn) else None


class Stmt:
    """Base class of statements."""

    __slots__ = ()

    def __str__(self) -> str:
        from .printer import stmt_to_str

        return stmt_to_str(self)


class ForKind:
    """Loop kinds: how the code generators execute a :class:`For`."""

    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"


class For(Stmt):
    """``for loop_var in range(min, min + extent): body`` of the given kind."""

    __slots__ = ("loop_var", "min", "extent", "kind", "body", "annotations")

    def __init__(self, loop_var: Var, min: Any, extent: Any, kind: str, body: Stmt,
                 annotations: dict[str, Any] | None = None) -> None:
        self.loop_var, self.min, self.extent = loop_var, convert(min), convert(extent)
        self.kind, self.body, self.annotations = kind, body, dict(annotations or {})


class BufferStore(Stmt):
    """``buffer[indices] = value``."""

    __slots__ = ("buffer", "value", "indices")

    def __init__(self, buffer: Buffer, value: PrimExpr, indices: Sequence[Any]) -> None:
        self.buffer, self.value, self.indices = buffer, convert(value), tuple(convert(i) for i in indices)


class Allocate(Stmt):
    """Storage for ``buffer`` live during ``body``.

    The codegen puts ``scope == "local"`` buffers (and any buffer under ``stack_limit``
    bytes) on the stack, the rest in ``KilnBackendAllocWorkspace`` memory.
    """

    __slots__ = ("buffer", "body")

    def __init__(self, buffer: Buffer, body: Stmt) -> None:
        self.buffer, self.body = buffer, body


class SeqStmt(Stmt):
    """Statements run in order."""

    __slots__ = ("seq",)

    def __init__(self, seq: Sequence[Stmt]) -> None:
        self.seq = tuple(seq)


class IfThenElse(Stmt):
    """``if cond: then_case else: else_case`` (``else_case`` may be None)."""

    __slots__ = ("cond", "then_case", "else_case")

    def __init__(self, cond: PrimExpr, then_case: Stmt, else_case: Stmt | None = None) -> None:
        self.cond, self.then_case, self.else_case = convert(cond), then_case, else_case


class LetStmt(Stmt):
    """Bind ``var = value`` for ``body``."""

    __slots__ = ("var", "value", "body")

    def __init__(self, var: Var, value: PrimExpr, body: Stmt) -> None:
        self.var, self.value, self.body = var, convert(value), body


class Evaluate(Stmt):
    """Evaluate an expression for its side effects (or a no-op when it is a constant)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = convert(value)


def seq(*stmts: Stmt | None) -> Stmt:
    """Flatten statements into one (dropping Nones and nested sequences)."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            out.extend(s.seq)
        elif isinstance(s, Evaluate) and isinstance(s.value, IntImm):
            continue
        else:
            out.append(s)
    if not out:
        return Evaluate(0)
    return out[0] if len(out) == 1 else SeqStmt(out)


class PrimFunc:
    """A kernel: ``name``, parameter buffers (inputs then outputs), a loop-nest ``body``.

    ``attrs`` is free-form metadata (``"global_symbol"``, ``"tag"``, ...) the codegens and
    the build driver may read.  ``str(func)`` prints TVMScript-like pseudo code.
    """

    def __init__(self, name: str, params: Sequence[Buffer], body: Stmt, attrs: dict[str, Any] | None = None) -> None:
        self.name = name
        self.params = list(params)
        self.body = body
        self.attrs = dict(attrs or {})
        self.attrs.setdefault("global_symbol", name)

    def with_body(self, body: Stmt) -> "PrimFunc":
        """A copy with another body (same params and attrs)."""
        return PrimFunc(self.name, self.params, body, self.attrs)

    def __str__(self) -> str:
        from .printer import func_to_str

        return func_to_str(self)

    @property
    def dyn_vars(self) -> list[Var]:
        """The dynamic-extent variables of the parameters, in binding order (first argument and
        dimension that carries each)."""
        out: list[Var] = []
        for b in self.params:
            for v in b.dyn or ():
                if v is not None and not any(v is u for u in out):
                    out.append(v)
        return out

    def __repr__(self) -> str:
        return f"<PrimFunc {self.name}({', '.join(b.name for b in self.params)})>"
