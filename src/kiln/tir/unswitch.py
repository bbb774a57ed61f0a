"""Loop unswitching of tile guards.

A register-tiled kernel whose extent is not a multiple of the tile gets guards such as
``if mo * 6 + i < M`` around rows of the tile, *inside* the reduction loop.  The guards
are invariant in that loop but compilers keep the guarded accumulators in memory (a
conditional update of a register tile defeats LLVM's SROA), which made every tile slow,
not only the last.  :func:`unswitch_loops` versions such a loop once::

    for k: ... if c: S ...      →      if c: (for k: ... S ...) else: (for k: ... if c: S ...)

``unrolled`` loops with a constant extent (≤ 64) are unrolled here first, so a guard on
the unrolled row index becomes one invariant condition per row.  A ``vectorized`` loop whose
whole body is a guard invariant in it becomes the guard around the loop.  Only serial loops are
versioned, only for guard ``if`` s without ``else`` that contain a
``vectorized`` or ``unrolled`` loop (the tile body), and only at the outermost loop that the
condition is invariant in, so this versioning grows code by at most one copy per tiled loop
nest (the two passes below add more: a peeled static tail is a second body, a partitioned
runtime tail up to eight narrower ones).

First, :func:`peel_static_tails` gives the tail tiles of a non-exact static split (a dense
with N = 80 in 64-wide panels) constant loop extents. Then :func:`partition_tail_tiles`
splits a tile loop whose trip count is a runtime ``ceil(n / t)`` (a dynamic extent tiled by
``t``) into ``n // t`` full tiles without their tail guards and a remainder of ``n % t``
elements run as unguarded tiles of 8 and then one tile of exactly the 1 .. 7 elements left,
so a runtime width that is no multiple of the tile neither computes a whole guarded tile for
its last few pixels nor pays for guards in every tile; the full tiles of a depthwise conv
also get a version without their per-tap bounds checks for the tiles whose whole window is
inside the image.  Given the kernel's parameters (:func:`extent_bounds`), it also drops a tile's
static guard against the upper bound (``xo * t + v < 256`` when ``t`` does not divide it), which
the runtime extent implies.
"""

from __future__ import annotations

from functools import reduce

from typing import Any, Callable, Sequence

from .expr import BinaryOp, Cast, IntImm, Load, PrimExpr, Select, Var, binary, structural_equal
from .functor import Mutator, collect_vars, post_order_visit, substitute
from .simplify import simplify, simplify_stmt
from .stmt import Allocate, Buffer, BufferStore, For, IfThenElse, LetStmt, SeqStmt, Stmt, seq

__all__ = ["unswitch_loops", "partition_tail_tiles", "peel_static_tails", "extent_bounds"]


def _bound_vars(s: Stmt, out: set[Var]) -> None:
    if isinstance(s, For):
        out.add(s.loop_var)
        _bound_vars(s.body, out)
    elif isinstance(s, LetStmt):
        out.add(s.var)
        _bound_vars(s.body, out)
    elif isinstance(s, SeqStmt):
        for x in s.seq:
            _bound_vars(x, out)
    elif isinstance(s, IfThenElse):
        _bound_vars(s.then_case, out)
        if s.else_case is not None:
            _bound_vars(s.else_case, out)
    elif isinstance(s, Allocate):
        _bound_vars(s.body, out)


def _has_loop(s: Stmt, kinds: tuple[str, ...]) -> bool:
    """Whether ``s`` holds a loop of one of ``kinds``."""
    if isinstance(s, For):
        return s.kind in kinds or _has_loop(s.body, kinds)
    if isinstance(s, SeqStmt):
        return any(_has_loop(x, kinds) for x in s.seq)
    if isinstance(s, (LetStmt, Allocate)):
        return _has_loop(s.body, kinds)
    if isinstance(s, IfThenElse):
        return _has_loop(s.then_case, kinds) or (s.else_case is not None and _has_loop(s.else_case, kinds))
    return False


def _guards(s: Stmt, bound: set[Var], out: list[PrimExpr]) -> None:
    """Conditions of guard ifs in ``s`` that use none of the ``bound`` variables."""
    if isinstance(s, IfThenElse):
        if (s.else_case is None and not (collect_vars(s.cond) & bound)
                and _has_loop(s.then_case, ("vectorized", "unrolled")) and not any(c is s.cond for c in out)):
            out.append(s.cond)
        _guards(s.then_case, bound, out)
        if s.else_case is not None:
            _guards(s.else_case, bound, out)
    elif isinstance(s, SeqStmt):
        for x in s.seq:
            _guards(x, bound, out)
    elif isinstance(s, (For, LetStmt, Allocate)):
        _guards(s.body, bound, out)


def _assume(s: Stmt, conds: list[PrimExpr]) -> Stmt:
    """``s`` with the guard ifs on ``conds`` replaced by their bodies."""
    if isinstance(s, IfThenElse):
        then = _assume(s.then_case, conds)
        els = None if s.else_case is None else _assume(s.else_case, conds)
        if els is None and any(c is s.cond for c in conds):
            return then
        return IfThenElse(s.cond, then, els)
    if isinstance(s, SeqStmt):
        return SeqStmt([_assume(x, conds) for x in s.seq])
    if isinstance(s, For):
        return For(s.loop_var, s.min, s.extent, s.kind, _assume(s.body, conds), s.annotations)
    if isinstance(s, LetStmt):
        return LetStmt(s.var, s.value, _assume(s.body, conds))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _assume(s.body, conds))
    return s


def _tail_extent(e: PrimExpr, v: Var, extent: int) -> tuple[int, int] | None:
    """``(c, r)`` when ``e``, a ``min`` over the loop variable ``v`` in ``range(extent)``, takes
    only the values ``c`` (full tiles) and ``r < c`` (the tail tiles of a non-exact static
    split; several when ``v`` fuses a batch axis with the tile axis)."""
    if not (isinstance(e, BinaryOp) and e.op == "min" and v in collect_vars(e) and 1 < extent <= 1024):
        return None
    vals = set()
    for k in range(extent):
        x = simplify(substitute(e, {v: IntImm(k, v.dtype)}))
        if not isinstance(x, IntImm):
            return None
        vals.add(x.value)
        if len(vals) > 2:
            return None
    if len(vals) != 2:
        return None
    r, c = sorted(vals)
    return (c, r) if r > 0 else None


class _ReplaceExpr(Mutator):
    def __init__(self, old: PrimExpr, new: PrimExpr) -> None:
        self.old, self.new = old, new

    def visit_BinaryOp(self, e: BinaryOp) -> PrimExpr:
        return self.new if structural_equal(e, self.old) else self.generic_expr(e)


def peel_static_tails(s: Stmt) -> Stmt:
    """Give the tail tiles of a tile loop over a static extent a body of their own.

    A split by ``t`` that does not divide a static extent ``E`` leaves the inner loops of every
    tile with the extent ``min(t, E - o*t)``: not a constant, so the vectorized loop over a
    tile's columns falls back to a scalar loop in *every* tile.  The body of ``for o`` becomes
    ``if min(...) == t: body[t] else: body[E % t]``, both with constant extents: a dense with
    N = 80 in 64-wide panels ran 3136 x 384 x 80 at 122 GFLOP/s, now 247-252 (N = 64: 265-274;
    Zen 5, AVX-512, 1 thread; ``python bench/bench_matmul.py --shapes 3136x384x80,3136x384x64
    --variants const --threads 1``).
    """
    if isinstance(s, For):
        body = peel_static_tails(s.body)
        if isinstance(s.min, IntImm) and s.min.value == 0 and isinstance(s.extent, IntImm):
            found: list[tuple[PrimExpr, int, int]] = []
            trips = s.extent.value

            def visit(n: Any) -> None:
                if isinstance(n, For) and not found:
                    cr = _tail_extent(n.extent, s.loop_var, trips)
                    if cr is not None:
                        found.append((n.extent, *cr))

            post_order_visit(body, visit)
            if found:
                e, c, r = found[0]
                full = simplify_stmt(_ReplaceExpr(e, IntImm(c, e.dtype)).stmt(body))
                tail = simplify_stmt(_ReplaceExpr(e, IntImm(r, e.dtype)).stmt(body))
                body = IfThenElse(binary("eq", e, IntImm(c, e.dtype)), full, tail)
        return s if body is s.body else For(s.loop_var, s.min, s.extent, s.kind, body, s.annotations)
    return _map_children(s, peel_static_tails)


def unswitch_loops(s: Stmt, params: Sequence[Buffer] = ()) -> Stmt:
    """Version serial loops on their loop-invariant tile guards (see the module docstring).

    Parameters
    ----------
    s : Stmt
        A kernel body.
    params : sequence of Buffer
        The kernel's parameters: a runtime extent is at most its buffer's static dim (the
        argument check enforces it), which lets :func:`partition_tail_tiles` drop a split's
        static guards that the runtime extent implies.

    Returns
    -------
    Stmt
        The body with runtime-extent tile loops partitioned (:func:`partition_tail_tiles`) and
        the guard-carrying loops versioned.
    """
    bounds = extent_bounds(params)
    return _unswitch(cap_vector_extents(partition_tail_tiles(peel_static_tails(s), bounds), bounds))


#: Widest vectorized loop :func:`cap_vector_extents` gives a constant cap (a vector tile).
_MAX_VECTOR_CAP = 64


def cap_vector_extents(s: Stmt, bounds: dict[Var, int]) -> Stmt:
    """Write the extent ``E`` of a vectorized loop over a runtime extent as ``min(C, E)``, ``C``
    the most it can be (from the runtime extents' ``bounds`` and the enclosing loops' ranges).

    A split whose factor covers the whole upper bound of a runtime row (a row of at most 16
    floats split by 16) leaves ``n - o*16``: the ``min`` with the factor simplified away. The
    codegens vectorise ``min(C, E)`` as a full vector when ``E >= C`` and vector chunks of
    halving widths otherwise (:func:`kiln.tir.vectorize.tail_chunks`); a bare ``E`` would run
    as a scalar loop. Loops with a constant extent or an explicit ``min`` are left alone.
    """
    from .simplify import Analyzer
    from .vectorize import split_min_extent

    ana = Analyzer()
    for v, n in bounds.items():
        ana.bind(v, 0, n)

    def visit(st: Stmt) -> Stmt:
        if not isinstance(st, For):
            return _map_children(st, visit)
        lo, ext = ana.const_int_bound(st.min), ana.const_int_bound(st.extent)
        ana.bind(st.loop_var, lo[0], lo[1] + ext[1] - 1)
        body = visit(st.body)
        extent = st.extent
        if st.kind == "vectorized" and not isinstance(extent, IntImm) and split_min_extent(st) is None:
            cap = ext[1]
            if 1 < cap <= _MAX_VECTOR_CAP:
                extent = binary("min", IntImm(int(cap), extent.dtype), extent)
        if body is st.body and extent is st.extent:
            return st
        return For(st.loop_var, st.min, extent, st.kind, body, st.annotations)

    return visit(s)


def extent_bounds(params: Sequence[Buffer]) -> dict[Var, int]:
    """Upper bound of each runtime extent of ``params``: the smallest static dim it sizes."""
    out: dict[Var, int] = {}
    for b in params:
        for v, n in zip(b.dyn or (), b.shape):
            if v is not None:
                out[v] = min(int(n), out.get(v, int(n)))
    return out


def _unswitch(s: Stmt) -> Stmt:
    if isinstance(s, For):
        if (s.kind == "unrolled" and isinstance(s.min, IntImm) and isinstance(s.extent, IntImm)
                and s.extent.value <= 64):
            # unroll here so that guards on the unrolled variable become per-row constants
            v, lo = s.loop_var, s.min.value
            return _unswitch(seq(*[simplify_stmt(substitute(s.body, {v: IntImm(lo + i, v.dtype)}))
                                        for i in range(s.extent.value)]))
        ann = s.annotations
        if s.kind == "serial" and _has_loop(s.body, ("unrolled",)):
            ann = {**ann, "unroll": False}  # llvm: not unrolled again (llvm.loop.unroll.disable)
        body = _unswitch(s.body)
        if (s.kind == "vectorized" and isinstance(body, IfThenElse) and body.else_case is None
                and s.loop_var not in collect_vars(body.cond)):
            # a guard the same for every lane (a padded pool's window tap): test it once, outside
            # the vector loop, whose body is then plain stores the codegens vectorise
            return IfThenElse(body.cond, For(s.loop_var, s.min, s.extent, s.kind, body.then_case, s.annotations))
        if s.kind == "serial":
            bound: set[Var] = {s.loop_var}
            _bound_vars(body, bound)
            conds: list[PrimExpr] = []
            _guards(body, bound, conds)
            if conds:
                fast = For(s.loop_var, s.min, s.extent, s.kind, _assume(body, conds), ann)
                slow = For(s.loop_var, s.min, s.extent, s.kind, body, ann)
                return IfThenElse(reduce(lambda a, b: binary("and", a, b), conds), fast, slow)
        return For(s.loop_var, s.min, s.extent, s.kind, body, ann)
    return _map_children(s, _unswitch)


def _map_children(s: Stmt, fn: Callable[[Stmt], Stmt]) -> Stmt:
    """``s`` rebuilt with ``fn`` applied to the statements it holds (not a For: each pass
    handles its loops itself); leaves (stores, evaluations) as they are."""
    if isinstance(s, SeqStmt):
        return SeqStmt([fn(x) for x in s.seq])
    if isinstance(s, IfThenElse):
        return IfThenElse(s.cond, fn(s.then_case), None if s.else_case is None else fn(s.else_case))
    if isinstance(s, LetStmt):
        return LetStmt(s.var, s.value, fn(s.body))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, fn(s.body))
    return s


# ----------------------------------------------------------------------------- tail tiles
def _runtime_tiles(s: For) -> tuple[PrimExpr, int] | None:
    """``(n, t)`` when ``s`` runs ``ceil(n / t)`` times for a runtime ``n`` (``(n + t-1) // t``)."""
    e = s.extent
    if not (s.kind == "serial" and isinstance(s.min, IntImm) and s.min.value == 0 and isinstance(e, BinaryOp)
            and e.op == "floordiv" and isinstance(e.b, IntImm) and e.b.value > 1):
        return None
    t, num = e.b.value, e.a
    if not (isinstance(num, BinaryOp) and num.op == "add" and isinstance(num.b, IntImm)
            and num.b.value == t - 1 and not isinstance(num.a, IntImm)):
        return None
    return num.a, t


def _local_buffers(s: Stmt) -> set[Buffer]:
    out: set[Buffer] = set()

    def visit(n: Any) -> None:
        if isinstance(n, Allocate):
            out.add(n.buffer)

    post_order_visit(s, visit)
    return out


def _global_exprs(s: Stmt, local: set[Buffer]) -> list[PrimExpr]:
    """Index expressions of non-local buffers and conditions: where a tile position is used."""
    out: list[PrimExpr] = []

    def visit(n: Any) -> None:
        if isinstance(n, (Load, BufferStore)) and n.buffer not in local:
            out.extend(n.indices)
        elif isinstance(n, (IfThenElse, Select)):
            out.append(n.cond)
        elif isinstance(n, For):
            out.extend((n.min, n.extent))

    post_order_visit(s, visit)
    return out


def _tile_loops(body: Stmt, xo: Var, t: int, local: set[Buffer]) -> set[Var] | None:
    """The unrolled loops over the ``t`` positions of a tile, or None when the body is not a
    tile of independent positions that the tail rewrite may cut (see :func:`partition_tail_tiles`)."""
    loops: list[For] = []

    def visit(n: Any) -> None:
        if isinstance(n, For) and n.kind == "unrolled" and isinstance(n.extent, IntImm) and n.extent.value == t:
            loops.append(n)

    post_order_visit(body, visit)
    exprs = [collect_vars(e) for e in _global_exprs(body, local)]
    tile: set[Var] = set()
    for lp in loops:
        uses = [vs for vs in exprs if lp.loop_var in vs]
        if not uses:
            continue  # local only (the accumulators' initialisation): runs over the whole tile
        if not all(xo in vs for vs in uses):
            return None
        tile.add(lp.loop_var)
    if not tile:
        return None
    ok = True

    def check(n: Any) -> None:
        nonlocal ok
        # every global store belongs to one position of the tile: its index holds the tile
        # loop's variable and the tile index
        if isinstance(n, BufferStore) and n.buffer not in local:
            vs = set().union(*(collect_vars(i) for i in n.indices))
            ok = ok and xo in vs and bool(vs & tile)

    post_order_visit(body, check)
    return tile if ok else None


def _is_tail_guard(cond: PrimExpr, xo: Var, t: int, n: PrimExpr, tile: set[Var], limit: int | None) -> bool:
    """Whether ``cond`` is ``xo * t + v < n`` for a tile loop variable ``v``, or ``xo * t + v < c``
    for a constant ``c`` at least ``n``'s upper bound ``limit`` (the static split's guard of the
    upper-bound extent, which every position below ``n`` passes)."""
    if not (isinstance(cond, BinaryOp) and cond.op == "lt"):
        return False
    if not (structural_equal(cond.b, n)
            or (limit is not None and isinstance(cond.b, IntImm) and cond.b.value >= limit)):
        return False
    rest = simplify(binary("sub", cond.a, binary("mul", xo, IntImm(t, xo.dtype))))
    return isinstance(rest, Var) and rest in tile


class _DropTailGuards(Mutator):
    def __init__(self, xo: Var, t: int, n: PrimExpr, tile: set[Var], limit: int | None) -> None:
        self.xo, self.t, self.n, self.tile, self.limit = xo, t, n, tile, limit

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        if s.else_case is None and _is_tail_guard(s.cond, self.xo, self.t, self.n, self.tile, self.limit):
            return self.stmt(s.then_case)
        return self.generic_stmt(s)


class _NarrowTile(Mutator):
    """The tile body for ``width`` positions from ``offset``: the tile loops run ``width`` times,
    global indices and conditions see position ``v + offset``, the accumulator slots stay ``v``
    (constant after unrolling, so the accumulators stay in registers)."""

    def __init__(self, tile: set[Var], local: set[Buffer], width: int, offset: PrimExpr) -> None:
        self.tile, self.local, self.width = tile, local, width
        self.shift = {v: binary("add", v, offset) for v in tile}

    def visit_Var(self, v: Var) -> PrimExpr:
        return self.shift.get(v, v)

    def visit_Load(self, e: Load) -> PrimExpr:
        return e if e.buffer in self.local else self.generic_expr(e)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        if s.buffer in self.local:
            return BufferStore(s.buffer, self.expr(s.value), s.indices)
        return self.generic_stmt(s)

    def visit_For(self, s: For) -> Stmt:
        body = self.stmt(s.body)
        extent = IntImm(self.width, s.extent.dtype) if s.loop_var in self.tile else self.expr(s.extent)
        return For(s.loop_var, self.expr(s.min), extent, s.kind, body, s.annotations)


def _span(e: PrimExpr, ranges: dict[Var, tuple[int, int]]) -> tuple[PrimExpr, PrimExpr] | None:
    """Least and greatest value of an affine ``e`` over the loop ``ranges`` (inclusive), as
    expressions of the other variables; None when ``e`` is not affine in the ranged ones."""
    if not collect_vars(e) & ranges.keys():
        return e, e
    if isinstance(e, Var):
        lo, hi = ranges[e]
        return IntImm(lo, e.dtype), IntImm(hi, e.dtype)
    if isinstance(e, BinaryOp) and e.op in ("add", "sub"):
        a, b = _span(e.a, ranges), _span(e.b, ranges)
        if a is None or b is None:
            return None
        if e.op == "add":
            return binary("add", a[0], b[0]), binary("add", a[1], b[1])
        return binary("sub", a[0], b[1]), binary("sub", a[1], b[0])
    if isinstance(e, BinaryOp) and e.op == "mul" and isinstance(e.b, IntImm) and e.b.value >= 0:
        a = _span(e.a, ranges)
        return None if a is None else (binary("mul", a[0], e.b), binary("mul", a[1], e.b))
    return None


def _window_checks(body: Stmt) -> tuple[list[PrimExpr], list[PrimExpr]]:
    """The runtime bounds checks ``uint32(i) < uint32(n)`` of ``body``'s lazy reads (a
    depthwise conv's taps, :func:`kiln.topi.nn.conv2d_nchwc.conv2d_nchwc`) whose index ``i``
    is affine in ``body``'s constant loops, and for each the condition, on the variables
    outside, under which it holds in every iteration."""
    ranges: dict[Var, tuple[int, int]] = {}
    selects: list[Select] = []

    def visit(n: Any) -> None:
        if isinstance(n, For) and isinstance(n.min, IntImm) and isinstance(n.extent, IntImm) and n.extent.value > 0:
            lo, hi = n.min.value, n.min.value + n.extent.value - 1
            # a loop copied with another extent (a peeled or partitioned tile): the union,
            # so the condition covers every copy
            old = ranges.get(n.loop_var, (lo, hi))
            ranges[n.loop_var] = (min(lo, old[0]), max(hi, old[1]))
        elif isinstance(n, Select):
            selects.append(n)

    post_order_visit(body, visit)
    inner: set[Var] = set()
    _bound_vars(body, inner)
    inner -= set(ranges)  # bound inside but not a constant loop: the condition cannot name it
    checks: list[PrimExpr] = []
    holds: list[PrimExpr] = []
    for sel in selects:
        terms, todo = [], [sel.cond]
        while todo:
            c = todo.pop()
            if isinstance(c, BinaryOp) and c.op == "and":
                todo += [c.a, c.b]
            else:
                terms.append(c)
        for c in terms:
            if not (isinstance(c, BinaryOp) and c.op == "lt" and isinstance(c.a, Cast) and isinstance(c.b, Cast)
                    and c.a.dtype == "uint32" and isinstance(c.b.value, Var) and c.b.value not in ranges):
                continue
            span = _span(c.a.value, ranges)
            if span is None or any(c is k for k in checks) or (collect_vars(span[0]) | collect_vars(span[1])) & inner:
                continue
            checks.append(c)
            holds += [binary("ge", span[0], IntImm(0, span[0].dtype)), binary("lt", span[1], c.b.value)]
    return checks, holds


class _AssumeChecks(Mutator):
    def __init__(self, checks: list[PrimExpr]) -> None:
        self.checks = checks

    def visit_BinaryOp(self, e: BinaryOp) -> PrimExpr:
        if any(e is c for c in self.checks):
            return IntImm(1, "bool")
        return self.generic_expr(e)


def _version_interior(body: Stmt) -> Stmt:
    """``body`` (one tile) run without its window bounds checks when the whole window of the
    tile is inside the image, with them otherwise (only the border tiles)."""
    checks, holds = _window_checks(body)
    if not checks:
        return body
    fast = simplify_stmt(_AssumeChecks(checks).stmt(body))
    return IfThenElse(simplify(reduce(lambda a, b: binary("and", a, b), holds)), fast, body)


#: Widest tail tile of :func:`partition_tail_tiles` below which every width has its own code.
_TAIL_SPLIT = 8


def _partition(s: For, bounds: dict[Var, int]) -> Stmt | None:
    split = _runtime_tiles(s)
    if split is None:
        return None
    n, t = split
    xo = s.loop_var
    local = _local_buffers(s.body)
    if not local:
        return None
    tile = _tile_loops(s.body, xo, t, local)
    if tile is None:
        return None
    limit = bounds.get(n) if isinstance(n, Var) else None
    body = _DropTailGuards(xo, t, n, tile, limit).stmt(s.body)
    full_tiles = binary("floordiv", n, IntImm(t, n.dtype))
    parts: list[Stmt] = [For(xo, s.min, full_tiles, s.kind, _version_interior(body), s.annotations)]
    # the remainder r = n - t * (n // t) of the last (partial) tile: tiles of 8 positions
    # while 8 are left (at most one for t <= 15), then one tile of exactly the positions left
    # (1 .. 7, a switch), each unguarded: a row's tail costs at most two passes over the weights
    rem = Var(f"{xo.name}_rem", n.dtype)
    last = substitute(body, {xo: full_tiles})
    tails: list[Stmt] = []
    base: PrimExpr = IntImm(0, n.dtype)
    if t > _TAIL_SPLIT:
        wide = IntImm(_TAIL_SPLIT, n.dtype)
        j = Var(f"{xo.name}_wide", n.dtype)
        narrow = _NarrowTile(tile, local, _TAIL_SPLIT, binary("mul", j, wide)).stmt(last)
        tails.append(For(j, 0, binary("floordiv", rem, wide), "serial", simplify_stmt(narrow)))
        base = binary("mul", binary("floordiv", rem, wide), wide)
    left = Var(f"{xo.name}_left", n.dtype)
    switch: Stmt | None = None
    for w in range(1, min(t, _TAIL_SPLIT)):
        narrow = simplify_stmt(_NarrowTile(tile, local, w, base).stmt(last))
        switch = IfThenElse(binary("eq", left, IntImm(w, n.dtype)), narrow, switch)
    if switch is not None:
        tails.append(LetStmt(left, binary("sub", rem, base), switch))
    parts.append(LetStmt(rem, binary("sub", n, binary("mul", full_tiles, IntImm(t, n.dtype))), seq(*tails)))
    return seq(*parts)


def partition_tail_tiles(s: Stmt, bounds: dict[Var, int] | None = None) -> Stmt:
    """Split runtime-extent tile loops into unguarded full tiles and narrower tail tiles.

    A loop ``for xo in range((n + t-1) // t)`` over tiles of ``t`` positions of a runtime extent
    ``n``, whose body allocates the tile's accumulators, runs its positions in ``unrolled``
    loops of extent ``t`` and guards each position's store with ``xo * t + v < n``, becomes::

        for xo in range(n // t): body without the guards
        rem = n - t * (n // t)                    # positions of the last, partial tile
        for j in range(rem // 8): the body for 8 positions from j * 8 of the last tile
        left = rem - rem // 8 * 8
        if left == 1: the body for 1 position from rem // 8 * 8
        elif left == 2: ...  (up to 7, or t - 1 when t <= 8)

    The rewrite holds only when the positions of a tile are independent (each global store
    is indexed by ``xo`` and a tile loop variable, every global use of a tile loop variable is
    next to ``xo``); other loops are left as they are, as are loops with constant trip counts,
    so static kernels do not change.  The full tiles whose lazy reads are bounds-checked
    against runtime extents (a depthwise conv's taps) get a second version without the checks,
    taken when the whole window of the tile is inside the image.

    One body per tail width costs compile time (ResNet-18 with ``h, w`` in ``32..224``,
    ``KILN_CACHE=0``: 3.9 s -> 12 s), which buys ResNet-18 at 96x96 1.62x
    -> 1.16x of a static build (``docs/dynamic_shapes.md``).

    Parameters
    ----------
    s : Stmt
        A kernel body.
    bounds : dict of Var to int, optional
        Upper bounds of runtime extents (:func:`extent_bounds`): a tile's static guard
        ``xo * t + v < c`` with ``c`` at least the bound of ``n`` is dropped too (a dynamic axis
        split by a tile that does not divide its upper bound guards both ways).

    Returns
    -------
    Stmt
        The body with each such loop partitioned.
    """
    bounds = bounds or {}
    if isinstance(s, For):
        body = partition_tail_tiles(s.body, bounds)
        loop = s if body is s.body else For(s.loop_var, s.min, s.extent, s.kind, body, s.annotations)
        out = _partition(loop, bounds)
        return loop if out is None else out
    return _map_children(s, lambda c: partition_tail_tiles(c, bounds))
