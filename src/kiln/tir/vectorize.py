"""Analysis shared by the C and LLVM codegens for explicit SIMD of ``vectorized`` loops.

A loop marked ``vectorized`` whose extent is a constant and whose body is a sequence of
buffer stores becomes straight-line vector code: the loop range is cut into chunks of the
target's vector width (then smaller powers of two for the remainder, one lane at the end),
and every chunk evaluates the body once on vectors.  Per access, the flat index's stride in
the loop variable decides how it is emitted: 0 → one scalar load broadcast to all lanes,
1 → one contiguous vector load/store.  Stores must be contiguous, a buffer both stored and
loaded in the body must be accessed at the same index (no cross-lane dependence), and every
lane-dependent part must have a vector form (arithmetic, comparisons, selects without loads,
casts among float32/float64/int32/int64, the :mod:`kiln.codegen.vmath` functions); otherwise
— gathers, guarded loads, integer division — the codegen keeps the scalar loop and leaves it
to the compiler's loop vectorizer.  (The codegens can still evaluate any sub-expression lane
by lane; that path is only reached for mask-width mismatches.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .dtype import bits_of
from .expr import BinaryOp, Call, Cast, IntImm, Load, Not, PrimExpr, Select, Var, structural_equal
from .functor import _children, collect_vars, post_order_visit, substitute
from .simplify import simplify, simplify_stmt
from .stmt import Buffer, BufferStore, For, IfThenElse, LetStmt, SeqStmt, Stmt

__all__ = ["VectorPlan", "plan_vector_loop", "flat_index", "stride_in", "chunk_lanes", "split_min_extent",
           "tail_chunks", "var_uses", "VECTOR_DTYPES"]

#: Element types the vector paths handle; other accesses keep the scalar loop.
VECTOR_DTYPES = ("float32", "float64", "int32", "int64")


@dataclass
class VectorPlan:
    """How one vectorized loop is emitted: the stores, chunks ``(offset, lanes)``, and which
    nodes of the stored values use the loop variable (:func:`var_uses`, ``id(node) -> bool``;
    the nodes live as long as the loop, so their ids stay theirs)."""

    loop: For
    stores: list[BufferStore]
    chunks: list[tuple[int, int]]
    uses: dict[int, bool] = field(default_factory=dict)


def flat_index(buf: Buffer, indices: Sequence[PrimExpr]) -> PrimExpr:
    """Row-major flat element offset of ``buf[indices]`` (unsimplified, :meth:`Buffer.flat_sum`)."""
    return buf.flat_sum(indices)


def _affine_coeff(e: PrimExpr, v: Var) -> int | None:
    """The coefficient of ``v`` in ``e`` when ``e`` is visibly affine in it, else None.

    Covers sums, differences and products by constants of integer terms (an index as the
    schedules write it); anything else involving ``v`` (a quotient, a select) is left to the
    simplifier. Terms without ``v`` count 0 without being looked into further than needed.
    """
    if e is v:
        return 1
    if isinstance(e, (IntImm, Var)):
        return 0
    if isinstance(e, BinaryOp) and e.op in ("add", "sub", "mul"):
        ca, cb = _affine_coeff(e.a, v), _affine_coeff(e.b, v)
        if ca is None or cb is None:
            return None
        if e.op == "add":
            return ca + cb
        if e.op == "sub":
            return ca - cb
        if cb == 0 and isinstance(e.b, IntImm):
            return ca * e.b.value
        if ca == 0 and isinstance(e.a, IntImm):
            return cb * e.a.value
        return None if ca or cb else 0
    if isinstance(e, Cast) and e.dtype in ("int32", "int64") and e.value.dtype in ("int32", "int64") \
            and bits_of(e.dtype) >= bits_of(e.value.dtype):
        return _affine_coeff(e.value, v)
    return None if v in collect_vars(e) else 0


def stride_in(flat: PrimExpr, v: Var, ranges: dict[Var, tuple[int, int]] | None = None) -> int | None:
    """Constant change of ``flat`` when ``v`` grows by one, or None when it is not constant."""
    c = _affine_coeff(flat, v)
    if c is not None:
        return c
    # v occurs, and not affinely on sight (a quotient, a product of variables): ask the simplifier
    d = simplify(substitute(flat, {v: v + 1}) - flat, ranges)
    return d.value if isinstance(d, IntImm) else None


def chunk_lanes(extent: int, width: int) -> list[tuple[int, int]]:
    """Cut ``[0, extent)`` into full vectors of ``width`` then power-of-two remainders."""
    out: list[tuple[int, int]] = []
    o = 0
    w = width
    while o < extent:
        while w > extent - o:
            w //= 2
        out.append((o, w))
        o += w
    return out


def _stores(s: Stmt) -> list[BufferStore] | None:
    if isinstance(s, BufferStore):
        return [s]
    if isinstance(s, SeqStmt):
        out: list[BufferStore] = []
        for x in s.seq:
            sub = _stores(x)
            if sub is None:
                return None
            out.extend(sub)
        return out
    return None


def plan_vector_loop(s: For, vector_bytes: int, ranges: dict[Var, tuple[int, int]] | None = None
                     ) -> VectorPlan | None:
    """A :class:`VectorPlan` for ``s`` or None when it must stay a scalar loop.

    Parameters
    ----------
    s : For
        A loop of kind ``vectorized``.
    vector_bytes : int
        Register width of the target (32 for AVX2, 64 for AVX-512, 16 for SSE/NEON).
    ranges : dict, optional
        Known ranges of enclosing loop variables (helps the stride analysis).
    """
    if s.kind != "vectorized" or not isinstance(s.min, IntImm) or not isinstance(s.extent, IntImm):
        return None
    ext = s.extent.value
    if ext < 2 or ext > 1024:
        return None
    stores = _stores(s.body)
    if not stores:
        return None
    v = s.loop_var
    rng = dict(ranges or {})
    rng[v] = (s.min.value, s.min.value + ext - 1)
    stored: dict[int, list[PrimExpr]] = {}
    widest = 0
    for st in stores:
        if st.buffer.dtype not in VECTOR_DTYPES:
            return None
        if stride_in(flat_index(st.buffer, st.indices), v, rng) != 1:
            return None
        stored.setdefault(id(st.buffer.data), []).append(flat_index(st.buffer, st.indices))
        widest = max(widest, bits_of(st.buffer.dtype))
    ok = True

    def visit(n: object) -> None:
        nonlocal ok, widest
        if not ok:
            return
        if isinstance(n, Load) and v in collect_vars(flat_index(n.buffer, n.indices)):
            if n.buffer.dtype not in VECTOR_DTYPES:
                ok = False
                return
            widest = max(widest, bits_of(n.buffer.dtype))
            if id(n.buffer.data) in stored:
                f = flat_index(n.buffer, n.indices)
                if not all(structural_equal(f, g) for g in stored[id(n.buffer.data)]):
                    ok = False
        elif isinstance(n, Load) and id(n.buffer.data) in stored:
            ok = False  # a lane-invariant read of a buffer this loop writes
        elif isinstance(n, BinaryOp) and n.dtype in ("float64", "int64"):
            widest = max(widest, 64)

    uses: dict[int, bool] = {}
    for st in stores:
        post_order_visit(st.value, visit)
        for i in st.indices:
            post_order_visit(i, visit)
        uses.update(var_uses(st.value, v))
        if ok and _needs_lanes(st.value, v, rng, uses):
            # a gather / guarded load / unsupported op would be emitted lane by lane: the
            # compilers' own loop vectorizers do as well on such loops, with far less IR
            ok = False
    if not ok:
        return None
    width = max(1, vector_bytes * 8 // max(widest, 32))
    return VectorPlan(s, stores, chunk_lanes(ext, width), uses)


_VEC_CALLS = ("exp", "erf", "tanh")
_VEC_BINARY = ("add", "sub", "mul", "div", "min", "max", "lt", "le", "gt", "ge", "eq", "ne", "and", "or")


def _needs_lanes(e: PrimExpr, v: Var, rng: dict[Var, tuple[int, int]],
                 uses: dict[int, bool] | None = None) -> bool:
    """True when some part of ``e`` that depends on ``v`` has no vector form in the codegens."""
    # which subtrees use v, answered once per node (a fresh collect_vars per level is quadratic)
    uses = var_uses(e, v) if uses is None else uses
    if not uses[id(e)]:
        return False

    def sub(x: PrimExpr) -> bool:
        return _needs_lanes(x, v, rng, uses)

    if isinstance(e, Var):
        return e.dtype not in ("int32", "int64")
    if isinstance(e, Load):
        return e.dtype not in VECTOR_DTYPES or stride_in(flat_index(e.buffer, e.indices), v, rng) != 1
    if isinstance(e, BinaryOp):
        if e.op not in _VEC_BINARY or (e.op == "div" and e.dtype not in ("float32", "float64")):
            return True
        if e.op not in ("and", "or") and e.a.dtype not in VECTOR_DTYPES:
            return True
        return sub(e.a) or sub(e.b)
    if isinstance(e, Not):
        return sub(e.a)
    if isinstance(e, Cast):
        return e.dtype not in VECTOR_DTYPES or e.value.dtype not in VECTOR_DTYPES or sub(e.value)
    if isinstance(e, Call):
        return e.op not in _VEC_CALLS or e.dtype != "float32" or any(sub(a) for a in e.args)
    if isinstance(e, Select):
        if e.dtype not in VECTOR_DTYPES:
            return True
        if _has_load(e.true_value) or _has_load(e.false_value):
            # guarded loads (a padded conv's taps): vectorisable when the guard is the same for
            # every lane — the codegens branch on it, so a false guard never loads
            return uses[id(e.cond)] or sub(e.true_value) or sub(e.false_value)
        return any(sub(x) for x in (e.cond, e.true_value, e.false_value))
    return True


def var_uses(e: PrimExpr, v: Var) -> dict[int, bool]:
    """``id(node) -> node references v`` for every node of ``e`` (one post-order pass)."""
    out: dict[int, bool] = {}

    def f(n: object) -> None:
        if id(n) not in out:
            out[id(n)] = n is v or any(out.get(id(c), False) for c in _children(n))

    post_order_visit(e, f)
    return out


def _has_load(e: PrimExpr) -> bool:
    found = False

    def f(n: object) -> None:
        nonlocal found
        found = found or isinstance(n, Load)

    post_order_visit(e, f)
    return found


def split_min_extent(s: For) -> tuple[int, PrimExpr] | None:
    """``(C, bound)`` when a vectorized loop's extent is ``min(C, bound)`` with constant ``C``.

    The codegens then emit ``if (bound >= C) <vector body> else <scalar loop>``, so only
    the last tile of a non-multiple extent runs scalar.
    """
    e = s.extent
    if s.kind != "vectorized" or not isinstance(e, BinaryOp) or e.op != "min":
        return None
    if isinstance(e.a, IntImm) and not isinstance(e.b, IntImm):
        return e.a.value, e.b
    if isinstance(e.b, IntImm) and not isinstance(e.a, IntImm):
        return e.b.value, e.a
    return None


def tail_chunks(s: For, full: int, bound: PrimExpr) -> Stmt:
    """The partial last tile of a vectorized loop of extent ``min(full, bound)``, for
    ``bound < full``: vectorized loops of the powers of two below ``full``, largest first,
    each run when that many positions are left (``16 + 8 + 2`` for 26 of 32; the last, of one
    position, is plain code). A runtime row of 14 floats thus costs three vector chunks instead
    of 14 scalar iterations; the codegens emit each chunk like any constant-extent vector loop.
    """
    v, lo = s.loop_var, s.min
    n = Var(f"{v.name}_left", v.dtype)
    widths = []
    w = 1
    while w * 2 < full:
        w *= 2
    while w >= 1:
        widths.append(w)
        w //= 2

    def chunk(at: PrimExpr, w: int) -> Stmt:
        if w == 1:
            return simplify_stmt(substitute(s.body, {v: at}))
        i = Var(f"{v.name}_c{w}", v.dtype)
        return For(i, IntImm(0, v.dtype), IntImm(w, v.dtype), "vectorized", substitute(s.body, {v: at + i}))

    def rest(k: int, at: PrimExpr, done: PrimExpr) -> Stmt:
        w = widths[k]
        left = simplify(n - done)
        step = IfThenElse(left >= w, chunk(at, w))
        if k + 1 == len(widths):
            return step
        nxt = Var(f"{v.name}_o{w}", v.dtype)
        taken = Select(left >= w, IntImm(w, v.dtype), IntImm(0, v.dtype))
        return SeqStmt([step, LetStmt(nxt, simplify(done + taken), rest(k + 1, lo + nxt, nxt))])

    return LetStmt(n, bound, rest(0, lo, IntImm(0, v.dtype)))
