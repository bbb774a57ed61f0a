"""Lowering: a :class:`kiln.te.Schedule` plus argument tensors → a :class:`PrimFunc`.

It lives in ``kiln.te`` because it reads te's stages and writes tir: te sits above tir in the
layer table (``docs/architecture.md``). ``kiln.tir.lower`` reaches it through
:meth:`kiln.te.Schedule.lower`, so tir never imports te.

Steps
-----
1. *Inline*: the bodies of ``compute_inline`` stages are substituted into their readers.
2. *Loop nests*: every root stage gets a loop nest over its leaf iteration variables, in
   topological order; split / fuse relations are turned into index arithmetic, and a
   split whose factor does not divide the extent gets a guard (turned into a shorter loop
   extent where the guard is ``inner < bound`` on the innermost variable it uses).
3. *Reductions*: when all reduce loops are innermost the result is accumulated in a
   one-element local buffer (a register after C/LLVM optimisation) and stored once;
   otherwise the output is initialised by its own loop nest before the update nest.
4. *compute_at*: an attached stage is computed inside its consumer's loop; the region it
   must produce is inferred from the consumer's accesses (interval analysis on the linear
   index forms), it is stored in a buffer of that region's size and read with an offset.
   A stage made by ``Schedule.cache_read`` with scope ``"shared"`` gets the region the
   whole work-group reads (``threadIdx`` loops relaxed), a buffer of that scope, and
   work-group barriers after its copy and after the reader's use.
   A reduction whose outermost reduction loop is bound to ``threadIdx.*`` becomes a
   work-group tree reduction (:meth:`_Lowerer._cross_thread`; GPU targets only).
5. Non-argument root stages become :class:`Allocate` s around the whole body; the codegen
   decides stack vs workspace by size.  The result is simplified.

Dynamic dimensions (:mod:`kiln.te.dynamic`): every stage's axes that stop at a runtime
extent are inferred before step 2; a root stage gets the guard ``index < n`` on each such
data axis and every stage on each such reduce axis.  Guards become loop bounds where they can
(``_as_extent_bound``): on the innermost variable they use, and, relaxed, on the outer split
or fused variables, so every loop over a dynamic axis (parallel ones included) runs to the
runtime extent.  Parameter buffers carry their tensor's ``dyn``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from ..runtime.errors import CompileError
from ..tir.expr import (BinaryOp, Call, IntImm, Load, PrimExpr, ProducerLoad, Reduce, Var, binary, conjuncts, const,
                        structural_equal)
from ..tir.functor import Mutator, collect_vars, post_order_visit, substitute
from ..tir.simplify import INF, Analyzer, simplify_stmt
from ..tir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, IfThenElse, PrimFunc, Stmt, seq
from .dynamic import PADDED_EXTENTS, VALID_BOX_ONLY, dyn_guard, infer_axis_extents, relaxed_guards, tensor_dyn
from .schedule import Fuse, Split
from .tensor import ComputeOp, IterVar, PlaceholderOp, Tensor

__all__ = ["lower", "BARRIER_INTRINSIC"]

#: Intrinsic call (``Evaluate(Call("int32", BARRIER_INTRINSIC, []))``) that the GPU code
#: generators turn into a work-group barrier.
BARRIER_INTRINSIC = "kiln.barrier"


def _barrier() -> Stmt:
    return Evaluate(Call("int32", BARRIER_INTRINSIC, []))


def _ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def _reads(e: PrimExpr) -> bool:
    """Whether ``e`` loads from a tensor or buffer."""
    found = False

    def f(n: Any) -> None:
        nonlocal found
        found = found or isinstance(n, (ProducerLoad, Load))

    post_order_visit(e, f)
    return found


def _all_of(conds: list[PrimExpr]) -> PrimExpr:
    out = conds[0]
    for c in conds[1:]:
        out = binary("and", out, c)
    return out


class _TrustingSubstituter(Mutator):
    """``substitute`` that keeps the loads of ``trusted`` trusted in the result."""

    def __init__(self, vmap: dict[Var, PrimExpr], trusted: dict[int, ProducerLoad], trust_all: bool) -> None:
        self.vmap, self.trusted, self.trust_all = vmap, trusted, trust_all

    def visit_Var(self, v: Var) -> PrimExpr:
        return self.vmap.get(v, v)

    def visit_ProducerLoad(self, e: ProducerLoad) -> PrimExpr:
        out = self.generic_expr(e)
        if isinstance(out, ProducerLoad) and (self.trust_all or _is_trusted(self.trusted, e)):
            self.trusted[id(out)] = out
        return out


def _is_trusted(trusted: dict[int, ProducerLoad], e: ProducerLoad) -> bool:
    # (the node itself is kept: an id alone could be reused by a later node)
    return trusted.get(id(e)) is e


class _Inliner(Mutator):
    """Replaces reads of inlined operations by their (already inlined) bodies.

    The loads of an inlined operation that declared its reads in bounds
    (``dyn_reads_in_bounds``) stay trusted in its readers' bodies, however deep the inlining:
    they are in ``trusted`` (:func:`kiln.te.dynamic.infer_axis_extents` skips them).
    """

    def __init__(self, bodies: dict[int, list[PrimExpr]], inlined: set[int], trusted: dict[int, ProducerLoad]) -> None:
        self.bodies, self.inlined, self.trusted = bodies, inlined, trusted

    def visit_ProducerLoad(self, e: ProducerLoad) -> PrimExpr:
        idx = [self.expr(i) for i in e.indices]
        op = e.producer.op
        if id(op) in self.inlined:
            trust_all = bool(getattr(op, "attrs", {}).get("dyn_reads_in_bounds"))
            sub = _TrustingSubstituter({iv.var: i for iv, i in zip(op.axis, idx)}, self.trusted, trust_all)
            return sub.expr(self.bodies[id(op)][e.producer.value_index])
        out = ProducerLoad(e.producer, idx)
        if _is_trusted(self.trusted, e):
            self.trusted[id(out)] = out
        return out


class _Redirect(Mutator):
    """Reads of cached tensors go to their cache tensors (``Schedule.cache_read``)."""

    def __init__(self, redirects: dict[Any, Any], trusted: dict[int, ProducerLoad]) -> None:
        self.redirects, self.trusted = redirects, trusted

    def visit_ProducerLoad(self, e: ProducerLoad) -> PrimExpr:
        idx = [self.expr(i) for i in e.indices]
        out = ProducerLoad(self.redirects.get(e.producer, e.producer), idx)
        if _is_trusted(self.trusted, e):
            self.trusted[id(out)] = out
        return out


class _Resolver(Mutator):
    """ProducerLoad → Load of the tensor's buffer, minus the region offset of attached stages."""

    def __init__(self, tmap: dict[Any, tuple[Buffer, list[PrimExpr] | None]]) -> None:
        self.tmap = tmap

    def visit_ProducerLoad(self, e: ProducerLoad) -> PrimExpr:
        idx = [self.expr(i) for i in e.indices]
        ent = self.tmap.get(e.producer)
        if ent is None:
            raise CompileError(f"internal: tensor {e.producer.name} has no buffer at this point of the loop nest")
        buf, off = ent
        if off is not None:
            idx = [binary("sub", i, o) for i, o in zip(idx, off)]
        return Load(buf, idx)


class _Lowerer:
    def __init__(self, sch: Any, args: Sequence[Any], name: str) -> None:
        self.sch, self.name = sch, name
        self.ComputeOp = ComputeOp
        self.names: dict[str, int] = {}
        self.tmap: dict[Any, tuple[Buffer, list[PrimExpr] | None]] = {}
        self.params: list[Buffer] = []
        argset: set[Tensor] = set()
        for t in args:
            if not isinstance(t, Tensor):
                raise CompileError(f"lower {name}: args must be te.Tensors, got {t!r}")
            if t in argset:
                raise CompileError(f"lower {name}: tensor {t.name} appears twice in args")
            argset.add(t)
        for st in sch.stages:
            op = st.op
            if isinstance(op, PlaceholderOp) and op.output(0) not in argset:
                raise CompileError(f"lower {name}: input {op.name} is used but not listed in args")
            if st.is_output and any(t not in argset for t in op.outputs):
                raise CompileError(f"lower {name}: output {op.name} must be listed in args")
            if st.attach_type == "inline" and any(t in argset for t in op.outputs):
                raise CompileError(f"lower {name}: {op.name} is an argument and cannot be compute_inline'd")
        # 1. inline
        inlined = {id(st.op) for st in sch.stages if st.attach_type == "inline"}
        self.bodies: dict[int, list[PrimExpr]] = {}
        #: loads (by id) inlined from an operation that declared its reads in bounds
        self.trusted: dict[int, ProducerLoad] = {}
        inl = _Inliner(self.bodies, inlined, self.trusted)
        for st in sch.stages:
            if isinstance(st.op, ComputeOp):
                self.bodies[id(st.op)] = [inl.expr(b) for b in st.op.body]
        for op_id, red in getattr(sch, "read_redirects", {}).items():
            if op_id in self.bodies:
                rdr = _Redirect(red, self.trusted)
                self.bodies[op_id] = [rdr.expr(b) for b in self.bodies[op_id]]
        # runtime extents of dynamic dimensions (kiln.te.dynamic), then the parameters
        self.inlined = inlined
        self.tdyn: dict[Tensor, Any] = {}
        self.axis_dyn: dict[IterVar, Var] = {}
        for st in sch.stages:
            if isinstance(st.op, ComputeOp) and st.attach_type != "inline":
                self._dyn_of(st.op.output(0))
        for t in args:
            dyn = self._dyn_of(t)
            buf = Buffer(self._uniq(t.name), t.shape, t.dtype, dyn=dyn)
            self.tmap[t] = (buf, None)
            self.params.append(buf)
        self.dyn_ranges: dict[Var, tuple[int, int]] = {}
        for b in self.params:
            for v, n in zip(b.dyn or (), b.shape):
                if v is not None:
                    self.dyn_ranges[v] = (0, min(n, self.dyn_ranges.get(v, (0, n))[1]))
        for iv, v in self.axis_dyn.items():
            if v not in self.dyn_ranges:
                raise CompileError(f"lower {name}: the runtime extent {v.name} of axis {iv.name} is the extent of no "
                                   "argument's dimension, so the kernel cannot know it")
        #: loop variables bound to threadIdx.* (relaxed by region inference of shared stages)
        self.thread_vars: dict[Var, str] = {}
        # who reads whom, after inlining
        self.readers: dict[int, list[Any]] = {}
        for st in sch.stages:
            if isinstance(st.op, ComputeOp) and st.attach_type != "inline":
                for b in self.bodies[id(st.op)]:
                    for t in _producers(b):
                        lst = self.readers.setdefault(id(t.op), [])
                        if st not in lst:
                            lst.append(st)
        #: a kernel with work-items (a loop bound to a thread index): every work-item must reach
        #: each barrier
        self.device_kernel = any(k == "thread_binding" for st in sch.stages for k in st.iter_var_attrs.values())
        self.attached: dict[int, dict[Any, list[Any]]] = {}
        for st in sch.stages:
            if st.attach_type == "scope":
                rd = self.readers.get(id(st.op), [])
                if rd != [st.attach_stage] and not self._nested_reader_ok(st, rd):
                    who = ", ".join(r.op.name for r in rd) or "nothing"
                    raise CompileError(
                        f"lower {name}: {st.op.name} is compute_at {st.attach_stage.op.name} but is read by {who}; "
                        "compute_at needs the attach stage to be its only reader")
                if any(t in self.tmap for t in st.op.outputs):
                    raise CompileError(f"lower {name}: argument {st.op.name} cannot be compute_at another stage")
                self.attached.setdefault(id(st.attach_stage), {}).setdefault(st.attach_ivar, []).append(st)

    def _dyn_of(self, t: Tensor) -> Any:
        """``t``'s dynamic dims (explicit, or inferred from its operation's reads; memoised)."""
        if t in self.tdyn:
            return self.tdyn[t]
        op = t.op
        if isinstance(op, PlaceholderOp):
            dyn = t.dyn
        else:
            self.tdyn[t] = None  # a cycle cannot happen in a DAG; this only ends recursion early
            bodies = self.bodies.get(id(op), op.body)
            ext = infer_axis_extents(op, bodies, self._dyn_of, self.name, original=op.body, trusted=self.trusted)
            self.axis_dyn.update(ext)
            dyn = tensor_dyn(op, ext)
        for o in op.outputs:
            self.tdyn[o] = dyn
        return dyn

    def _nested_reader_ok(self, st: Any, readers: list[Any]) -> bool:
        """True when every reader of ``st`` is its host or a stage attached to the same host,
        at the same or a deeper loop, and declared after ``st`` (so ``st``'s nest runs first).

        This is what a GEMM needs: the packed panel of B is built per column block, read by
        the accumulation stage that is attached one loop further in.  A row softmax needs
        several readers: its row of exponentials is read by the row sum (a sibling) and by
        the output (the host)."""
        host = st.attach_stage
        leaves = list(host.leaf_iter_vars)
        stages = list(self.sch.stages)
        if not readers or st.attach_ivar not in leaves:
            return False
        for r in readers:
            if r is host:
                continue
            if r.attach_type != "scope" or r.attach_stage is not host or r.attach_ivar not in leaves:
                return False
            if leaves.index(r.attach_ivar) < leaves.index(st.attach_ivar) or stages.index(st) >= stages.index(r):
                return False
        return True

    def _reader_accesses(self, reader: Any, raw: list[PrimExpr], lvars: list[Var], exts: list[int], level: int,
                         ranges: dict[Var, tuple[float, float]]) -> tuple[list[PrimExpr], dict[Var, tuple[int, int]]]:
        """The attached ``reader``'s bodies in its host's coordinates, plus the ranges of the
        variables introduced for its own loops (its axes as region offset + local index)."""
        rlevel = list(reader.attach_stage.leaf_iter_vars).index(reader.attach_ivar)
        region = self._infer_region(reader, raw, lvars, exts, rlevel, ranges)
        vmap: dict[Var, PrimExpr] = {}
        extra: dict[Var, tuple[int, int]] = {}
        for iv, (lo, n) in zip(reader.op.axis, region):
            u = Var(self._uniq(iv.var.name + "_loc"), "int32")
            extra[u] = (0, n - 1)
            vmap[iv.var] = lo + u
        for iv in reader.op.reduce_axis:
            extra[iv.var] = (int(iv.dom_min), int(iv.dom_min) + iv.dom_extent - 1)
        bodies = []
        for b in self.bodies[id(reader.op)]:
            b = substitute(b, vmap)
            bodies.append(b.source if isinstance(b, Reduce) else b)
        return bodies, extra

    def _uniq(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", base) or "v"
        n = self.names.get(base, 0)
        self.names[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # ------------------------------------------------------------------ driver
    def run(self) -> PrimFunc:
        stmts: list[Stmt] = []
        temps: list[Buffer] = []
        for st in self.sch.stages:
            if not isinstance(st.op, self.ComputeOp) or st.attach_type != "root":
                continue
            bufs = []
            for t in st.op.outputs:
                if t not in self.tmap:
                    b = Buffer(self._uniq(t.name), t.shape, t.dtype)
                    temps.append(b)
                    self.tmap[t] = (b, None)
                bufs.append(self.tmap[t][0])
            region = [(const(0), n) for n in st.op.output(0).shape]
            stmts.append(self.stage_nest(st, region, bufs, {}))
        body = seq(*stmts)
        for b in reversed(temps):
            body = Allocate(b, body)
        body = simplify_stmt(body, self.dyn_ranges)
        return PrimFunc(self.name, self.params, body, {"global_symbol": self.name})

    # ------------------------------------------------------------------ one stage
    def stage_nest(self, st: Any, region: list[tuple[PrimExpr, int]], bufs: list[Buffer],
                   outer: dict[Var, tuple[float, float]]) -> Stmt:
        op = st.op
        ext: dict[Any, int] = {}
        for iv, (_, n) in zip(op.axis, region):
            ext[iv] = n
        for iv in op.reduce_axis:
            ext[iv] = iv.dom_extent
        for rel in st.relations:
            if isinstance(rel, Split):
                pe = ext[rel.parent]
                if rel.factor is not None:
                    ext[rel.inner] = min(rel.factor, pe) if pe > 0 else rel.factor
                    ext[rel.outer] = _ceildiv(pe, ext[rel.inner]) if pe > 0 else 0
                else:
                    ext[rel.outer] = min(rel.nparts, pe) if pe > 0 else rel.nparts
                    ext[rel.inner] = _ceildiv(pe, ext[rel.outer]) if pe > 0 else 0
            else:
                ext[rel.fused] = ext[rel.outer] * ext[rel.inner]
        leaves = list(st.leaf_iter_vars)
        lvars = [Var(self._uniq(iv.name.replace(".", "_")), "int32") for iv in leaves]
        exts = [ext[iv] for iv in leaves]
        kinds = [st.iter_var_attrs.get(iv, "serial") for iv in leaves]
        tags = [getattr(st, "thread_bindings", {}).get(iv) for iv in leaves]
        for v, t in zip(lvars, tags):
            if t and t.startswith("threadIdx."):
                self.thread_vars[v] = t
        ranges = dict(outer)
        for v, e in zip(lvars, exts):
            ranges[v] = (0, e - 1)
        ana = Analyzer()
        ana.ranges.update(self.dyn_ranges)
        ana.ranges.update(ranges)

        def pass_up(leaf_vals: dict[Any, PrimExpr]) -> tuple[dict[Any, PrimExpr], list[PrimExpr]]:
            val = dict(leaf_vals)
            guards: list[PrimExpr] = []
            for rel in reversed(st.relations):
                if isinstance(rel, Split):
                    if rel.outer not in val or rel.inner not in val:
                        continue
                    val[rel.parent] = val[rel.outer] * ext[rel.inner] + val[rel.inner]
                    if ext[rel.outer] * ext[rel.inner] != ext[rel.parent]:
                        guards.append(binary("lt", val[rel.parent], ext[rel.parent]))
                elif isinstance(rel, Fuse):
                    if rel.fused not in val:
                        continue
                    val[rel.outer] = binary("floordiv", val[rel.fused], ext[rel.inner])
                    val[rel.inner] = binary("floormod", val[rel.fused], ext[rel.inner])
            return val, guards

        val, guards = pass_up({iv: v for iv, v in zip(leaves, lvars)})
        # global indices of data axes, and guards keeping attached regions inside the tensor
        gidx = [mn + val[iv] for iv, (mn, _) in zip(op.axis, region)]
        guards = self._dyn_guards(st, {**val, **dict(zip(op.axis, gidx))}, guards, lvars, ana)
        local_idx = [val[iv] for iv in op.axis]
        dom_guards: list[PrimExpr] = []
        full = all(isinstance(mn, IntImm) and mn.value == 0 and e == n
                   for (mn, e), n in zip(region, op.output(0).shape))
        for g, n in zip(gidx, () if full else op.output(0).shape):
            for c in (binary("ge", g, 0), binary("lt", g, n)):
                if not ana.can_prove(c):
                    dom_guards.append(c)
        vmap: dict[Var, PrimExpr] = {iv.var: g for iv, g in zip(op.axis, gidx)}
        for iv in op.reduce_axis:
            vmap[iv.var] = val[iv] + iv.dom_min
        raw = [substitute(b, vmap) for b in self.bodies[id(op)]]
        is_red = isinstance(raw[0], Reduce)
        # attached children: infer their regions and build their nests
        children: dict[int, list[tuple[Buffer, Stmt]]] = {}
        for level, iv in enumerate(leaves):
            for child in self.attached.get(id(st), {}).get(iv, []):
                children.setdefault(level, []).append(
                    self.child_nest(child, raw, lvars, exts, level, ranges))
        res = _Resolver(self.tmap)
        depth = {v: i for i, v in enumerate(lvars)}
        dyn_vars = set(self.dyn_ranges)

        def level_of(cond: PrimExpr) -> int:
            return max((depth[v] for v in collect_vars(cond) if v in depth), default=-1)

        def build(levels: list[int], vars_: list[Var], body: Stmt, gl: list[PrimExpr], with_children: bool) -> Stmt:
            by_level: dict[int, list[PrimExpr]] = {}
            dv = {v: i for i, v in enumerate(vars_)}
            for c in gl:
                lv = max((dv[v] for v in collect_vars(c) if v in dv), default=-1)
                by_level.setdefault(lv, []).append(c)
            for pos in reversed(range(len(levels))):
                lvl = levels[pos]
                v = vars_[pos]
                extent: PrimExpr = const(exts[lvl])
                conds, dconds = [], []
                for c in by_level.get(pos, []):
                    # dynamic guards may bound a loop with a coefficient (relaxed outer guards)
                    bound = _as_extent_bound(c, v, ana, scaled=bool(collect_vars(c) & dyn_vars))
                    # a thread-bound loop keeps its constant extent: it is the launch size
                    if bound is not None and kinds[lvl] not in ("unrolled", "thread_binding"):
                        extent = binary("min", extent, bound)
                    elif with_children and not self.device_kernel and collect_vars(c) & dyn_vars:
                        # (in a device kernel, hoisted around attached stages it could split a
                        # work-group at a barrier)
                        dconds.append(c)  # see below
                    else:
                        conds.append(c)
                if conds:
                    body = IfThenElse(_all_of(conds), body)
                if with_children:
                    kids = children.get(lvl, [])
                    if any(cbuf.scope == "shared" for cbuf, _ in kids):
                        # the group's copies must be complete before anyone reads them, and
                        # every read done before the next iteration overwrites them
                        body = seq(_barrier(), body, _barrier())
                    for cbuf, cnest in reversed(kids):
                        body = Allocate(cbuf, seq(cnest, body))
                if dconds:
                    # an iteration past a runtime extent writes nothing: the stages attached
                    # here (a row's statistics) are only read by it, so skip them too
                    body = IfThenElse(_all_of(dconds), body)
                body = For(v, 0, extent, kinds[lvl], body,
                           {"thread_tag": tags[lvl]} if tags[lvl] else None)
            if by_level.get(-1):
                body = IfThenElse(_all_of(by_level[-1]), body)
            return body

        n = len(leaves)
        all_guards = guards + dom_guards
        if not is_red:
            stores = [BufferStore(b, res.expr(e), local_idx) for b, e in zip(bufs, raw)]
            return build(list(range(n)), lvars, seq(*stores), all_guards, True)
        if len(raw) != 1:
            raise CompileError(f"lower {self.name}: multi-output reductions are not supported ({op.name})")
        red: Reduce = raw[0]
        buf = bufs[0]
        src = res.expr(red.source)
        cond = None if red.condition is None else res.expr(red.condition)
        p = next(i for i, iv in enumerate(leaves) if iv.iter_type == "reduce")
        tail_is_reduce = all(iv.iter_type == "reduce" for iv in leaves[p:])
        data_levels = list(range(p))
        red_levels = list(range(p, n))
        outer_guards = [g for g in all_guards if level_of(g) < p]
        inner_guards = [g for g in all_guards if level_of(g) >= p]
        tpos = [i for i, iv in enumerate(leaves)
                if iv.iter_type == "reduce" and (tags[i] or "").startswith("threadIdx.")]
        if tpos:
            return self._cross_thread(st, red, buf, src, cond, p, tpos[0], tail_is_reduce, lvars, exts, local_idx,
                                      outer_guards, inner_guards, build, level_of)
        # A reduction's condition on runtime extents (a dilated conv's rows that only read
        # padding at this size) goes to the loop where its variables are bound, as a guard:
        # it then skips the loops inside instead of testing every update. Static conditions
        # stay on the update, so static kernels do not change.
        hoisted: list[PrimExpr] = []
        if cond is not None:
            kept = []
            for c in conjuncts(cond):
                # (not one that reads a tensor: a stage attached at that loop, which the guard
                # encloses, may be what produces it)
                if collect_vars(c) & dyn_vars and p <= level_of(c) < n - 1 and not _reads(c):
                    hoisted.append(c)
                else:
                    kept.append(c)
            cond = _all_of(kept) if kept else None
        if tail_is_reduce:
            acc = Buffer(self._uniq(f"{buf.name}_acc"), (1,), buf.dtype, scope="local")
            upd: Stmt = BufferStore(acc, red.combine(acc[0], src), [0])
            if cond is not None:
                upd = IfThenElse(cond, upd)
            red_nest = build(red_levels, lvars[p:], upd, inner_guards + hoisted, True)
            # children attached at reduce levels are built inside `build` above;
            # data-level guards/children are handled by the outer build
            block = Allocate(acc, seq(BufferStore(acc, red.identity, [0]), red_nest,
                                      BufferStore(buf, acc[0], local_idx)))
            return build(data_levels, lvars[:p], block, outer_guards, True)
        # general case: separate init nest over the data axes that sit inside the reduction
        init_leaves = [(i, iv) for i, iv in enumerate(leaves) if i >= p and iv.iter_type != "reduce"]
        init_vars = {iv: Var(self._uniq(iv.name.replace(".", "_") + "_init"), "int32") for _, iv in init_leaves}
        leaf_vals = {iv: (init_vars[iv] if iv in init_vars else v) for iv, v in zip(leaves, lvars)
                     if iv.iter_type != "reduce"}
        ival, iguards = pass_up(leaf_vals)
        for iv_, nv in init_vars.items():
            ana.ranges[nv] = (0, ext[iv_] - 1)
        init_idx = [ival[iv] for iv in op.axis]
        init_dom = []
        for (mn, _), li, nn in zip(region, init_idx, () if full else op.output(0).shape):
            g = mn + li
            for c in (binary("ge", g, 0), binary("lt", g, nn)):
                if not ana.can_prove(c):
                    init_dom.append(c)
        init_body: Stmt = BufferStore(buf, red.identity, init_idx)
        init_guards = [g for g in iguards + init_dom if any(v in init_vars.values() for v in collect_vars(g))]
        init_nest = build([i for i, _ in init_leaves], [init_vars[iv] for _, iv in init_leaves], init_body,
                          init_guards, False)
        upd = BufferStore(buf, red.combine(Load(buf, local_idx), src), local_idx)
        if cond is not None:
            upd = IfThenElse(cond, upd)
        upd_nest = build(red_levels, lvars[p:], upd, inner_guards + hoisted, True)
        return build(data_levels, lvars[:p], seq(init_nest, upd_nest), outer_guards, True)

    def _dyn_guards(self, st: Any, val: dict[Any, PrimExpr], guards: list[PrimExpr], lvars: list[Var],
                    ana: Analyzer) -> list[PrimExpr]:
        """``guards`` plus ``index < n`` for the axes of ``st`` with a runtime extent ``n``
        (``val``: each axis's global index, an attached region's start included).

        Data axes are guarded in root stages only: an attached stage computes the region its
        reader needs, and its reader reads only valid elements; unless the compute says that its
        readers read nothing outside its valid box (:data:`VALID_BOX_ONLY`), when the region's
        runtime extent is the tighter bound (a softmax row's scratch of exponentials).  A
        kernel-internal root stage with :data:`PADDED_EXTENTS` (a conv's zero-padded copy of its
        input) stops those axes at ``extent + padding``.  A static split guard on the same index is
        dropped (``n`` never exceeds the static extent), and each dynamic guard adds its relaxed
        forms for the outer loops (:func:`kiln.te.dynamic.relaxed_guards`).
        """
        op = st.op
        attrs = getattr(op, "attrs", None) or {}
        # (an attached stage whose readers read only its valid box says so: it computes no more)
        own = st.attach_type == "root" or attrs.get(VALID_BOX_ONLY)
        axes = (list(op.axis) if own else []) + list(op.reduce_axis)
        dg = [dyn_guard(val[iv], self.axis_dyn[iv]) for iv in axes if iv in self.axis_dyn]
        if own and not st.is_output:
            # a kernel-internal padded copy stops at the padded runtime extent (PADDED_EXTENTS)
            dg += [binary("lt", val[op.axis[a]], binary("add", v, const(add)))
                   for a, v, add in attrs.get(PADDED_EXTENTS, ()) if v in self.dyn_ranges]
        if not dg:
            return guards
        guards = [g for g in guards if not any(structural_equal(g.a, d.a) for d in dg)]
        depth = {v: i for i, v in enumerate(lvars)}
        extra: list[PrimExpr] = []
        for g in dg:
            extra += relaxed_guards(g, depth, ana)
        return guards + dg + extra

    def _cross_thread(self, st: Any, red: Reduce, buf: Buffer, src: PrimExpr, cond: PrimExpr | None, p: int,
                      tpos: int, tail_is_reduce: bool, lvars: list[Var], exts: list[int], local_idx: list[PrimExpr],
                      outer_guards: list[PrimExpr], inner_guards: list[PrimExpr], build: Any, level_of: Any) -> Stmt:
        """A reduction whose reduce loop ``lvars[tpos]`` is bound to ``threadIdx.*``: a
        work-group tree reduction.

        Every work-item folds its strided share of the reduction into a private accumulator,
        writes it to work-group memory, and the group halves the live values with a barrier
        per step (ceil(log2(threads)) steps); work-item 0 stores the result.
        """
        if tpos != p or not tail_is_reduce:
            raise CompileError(f"lower {self.name}: {st.op.name}: the reduction axis bound to a thread must be the "
                               "outermost reduction loop, after all data-parallel loops")
        nt = exts[p]
        tv = lvars[p]
        acc = Buffer(self._uniq(f"{buf.name}_acc"), (1,), buf.dtype, scope="local")
        upd: Stmt = BufferStore(acc, red.combine(acc[0], src), [0])
        if cond is not None:
            upd = IfThenElse(cond, upd)
        deeper = [g for g in inner_guards if level_of(g) > p]
        at_thread = [g for g in inner_guards if level_of(g) == p]
        nest = build(list(range(p + 1, len(lvars))), lvars[p + 1:], upd, deeper, True)
        if at_thread:
            c = at_thread[0]
            for g in at_thread[1:]:
                c = binary("and", c, g)
            nest = IfThenElse(c, nest)
        shm = Buffer(self._uniq(f"{buf.name}_red"), (nt,), buf.dtype, scope="shared")
        stmts: list[Stmt] = [BufferStore(acc, red.identity, [0]), nest, BufferStore(shm, acc[0], [tv]), _barrier()]
        h = 1
        while 2 * h < nt:
            h *= 2
        live = nt  # values still to combine: the first step folds them onto a power of two
        while live > 1:
            c = binary("lt", tv, h)
            if 2 * h > live:
                c = binary("and", c, binary("lt", tv + h, live))
            stmts.append(IfThenElse(c, BufferStore(shm, red.combine(Load(shm, [tv]), Load(shm, [tv + h])), [tv])))
            live = h
            if h > 1:  # the last step's only writer is work-item 0, which also reads the result
                stmts.append(_barrier())
            h //= 2
        stmts.append(IfThenElse(binary("eq", tv, 0), BufferStore(buf, Load(shm, [const(0)]), local_idx)))
        block = Allocate(shm, Allocate(acc, seq(*stmts)))
        return build(list(range(p + 1)), lvars[:p + 1], block, outer_guards, True)

    def child_nest(self, child: Any, raw: list[PrimExpr], lvars: list[Var], exts: list[int], level: int,
                   ranges: dict[Var, tuple[float, float]]) -> tuple[Buffer, Stmt]:
        """Region inference + loop nest of a stage attached at ``lvars[level]``."""
        cop = child.op
        region = self._infer_region(child, raw, lvars, exts, level, ranges)
        inner = {v: (0, e - 1) for v, e in zip(lvars[level + 1:], exts[level + 1:])}
        bufs = []
        for t in cop.outputs:
            b = Buffer(self._uniq(t.name), [e for _, e in region], t.dtype, scope=getattr(child, "scope", "global"))
            self.tmap[t] = (b, [lo for lo, _ in region])
            bufs.append(b)
        outer = {v: r for v, r in ranges.items() if v not in inner}
        nest = self.stage_nest(child, region, bufs, outer)
        if len(bufs) > 1:
            raise CompileError(f"compute_at of multi-output operation {cop.name} is not supported")
        return bufs[0], nest

    def _infer_region(self, child: Any, raw: list[PrimExpr], lvars: list[Var], exts: list[int], level: int,
                      ranges: dict[Var, tuple[float, float]]) -> list[tuple[PrimExpr, int]]:
        """The region of ``child`` its readers need inside loop ``lvars[level]``."""
        cop = child.op
        t0 = cop.output(0)
        inner = {v: (0, e - 1) for v, e in zip(lvars[level + 1:], exts[level + 1:])}
        if getattr(child, "scope", "global") == "shared":
            # work-group memory holds what the whole group reads: relax the work-item indices
            for v in ranges:
                if v in self.thread_vars and v not in inner:
                    inner[v] = (int(ranges[v][0]), int(ranges[v][1]))
        ana = Analyzer()
        ana.ranges.update(ranges)
        rd = self.readers.get(id(cop), [])
        if any(r is not child.attach_stage for r in rd):
            # read by siblings attached at the same or a deeper loop (see _nested_reader_ok):
            # the region is the union of their accesses (and the host's, if it reads too)
            host_raw, raw = raw, []
            for r in rd:
                if r is child.attach_stage:
                    raw += host_raw
                    continue
                r_raw, extra = self._reader_accesses(r, host_raw, lvars, exts, level, ranges)
                raw += r_raw
                inner.update(extra)
                ana.ranges.update(extra)
        accesses: list[tuple[PrimExpr, ...]] = []
        for b in raw:
            for pl in _loads(b):
                if pl.producer.op is cop:
                    accesses.append(pl.indices)
        region: list[tuple[PrimExpr, int]] = []
        for k, n in enumerate(t0.shape):
            los, his = [], []
            ok = True
            for idx in accesses:
                r = _relax(idx[k], inner, ana)
                if r is None:
                    ok = False
                    break
                los.append(r[0])
                his.append(r[1])
            if not ok or not los:
                region.append((const(0), n))
                continue
            lo = _union(los, "min", ana)
            hi = _union(his, "max", ana)
            extent = ana.simplify(hi - lo + 1)
            if not isinstance(extent, IntImm):
                outer_ana = Analyzer()
                outer_ana.ranges.update({v: r for v, r in ranges.items() if v not in inner})
                ub = outer_ana.const_int_bound(extent)[1]
                if ub == INF:
                    region.append((const(0), n))
                    continue
                extent = const(int(ub))
            region.append((lo, max(1, int(extent.value))))
        return region


def _as_extent_bound(cond: PrimExpr, v: Var, ana: Analyzer, scaled: bool = False) -> PrimExpr | None:
    """For ``cond`` equivalent to ``v < B`` (v with coefficient 1), return ``B`` (else None).

    With ``scaled``, also ``k * v < B`` for a constant ``k > 1``: ``v < ceil(B / k)`` (used
    for guards on runtime extents only, so static kernels keep their loops as they were).
    """
    if not (isinstance(cond, BinaryOp) and cond.op == "lt"):
        return None
    diff = ana.simplify(cond.a - cond.b)  # cond: diff < 0
    terms, c = ana.linear(diff)
    coeff = 0
    rest_terms = {}
    for key, (atom, k) in terms.items():
        if atom is v:
            coeff = k
        else:
            if v in collect_vars(atom):
                return None
            rest_terms[key] = [atom, k]
    if coeff != 1 and not (scaled and coeff > 1):
        return None
    rest = Analyzer._rebuild(rest_terms, c, diff.dtype)  # v + rest < 0  <=>  v < -rest
    if coeff == 1:
        return ana.simplify(const(0) - rest)
    # k*v + rest < 0  <=>  v < ceil(-rest / k)
    return ana.simplify(binary("floordiv", const(coeff - 1) - rest, const(coeff)))


def _relax(e: PrimExpr, inner: dict[Var, tuple[float, float]], ana: Analyzer) -> tuple[PrimExpr, PrimExpr] | None:
    """Symbolic ``(lo, hi)`` of ``e`` as the ``inner`` variables sweep their ranges."""
    e = ana.simplify(e)
    terms, c = ana.linear(e)
    lo: PrimExpr = const(c)
    hi: PrimExpr = const(c)
    for atom, k in terms.values():
        vs = collect_vars(atom)
        if not (vs & set(inner)):
            lo = lo + atom * k
            hi = hi + atom * k
            continue
        if isinstance(atom, Var):
            alo, ahi = inner[atom]
        else:
            alo, ahi = ana.const_int_bound(atom)
            if alo == -INF or ahi == INF:
                return None
        a, b = (alo * k, ahi * k) if k > 0 else (ahi * k, alo * k)
        lo = lo + const(int(a))
        hi = hi + const(int(b))
    return ana.simplify(lo), ana.simplify(hi)


def _union(xs: list[PrimExpr], op: str, ana: Analyzer) -> PrimExpr:
    out = xs[0]
    for x in xs[1:]:
        if structural_equal(out, x):
            continue
        d = ana.simplify(x - out)
        if isinstance(d, IntImm):
            out = x if (d.value > 0) == (op == "max") else out
        else:
            out = ana.simplify(binary(op, out, x))
    return out


def _producers(e: PrimExpr) -> list[Any]:
    out: list[Any] = []

    def f(n: Any) -> None:
        if isinstance(n, ProducerLoad) and n.producer not in out:
            out.append(n.producer)

    post_order_visit(e, f)
    return out


def _loads(e: PrimExpr) -> list[ProducerLoad]:
    out: list[ProducerLoad] = []

    def f(n: Any) -> None:
        if isinstance(n, ProducerLoad):
            out.append(n)

    post_order_visit(e, f)
    return out


def lower(sch: Any, args: Sequence[Any], name: str = "main", simple_mode: bool = False) -> PrimFunc:
    """Lower a schedule to a :class:`PrimFunc`.

    Parameters
    ----------
    sch : kiln.te.Schedule
        The schedule (``te.create_schedule(outputs)`` plus primitives).
    args : list of kiln.te.Tensor
        The kernel's parameters in order: inputs then outputs.  Every placeholder the
        computation reads and every schedule output must be listed.  A placeholder's ``dyn``
        and an output's :func:`kiln.te.set_dyn` declare dynamic dimensions; the parameter
        buffers get the tensors' (declared or inferred) ``dyn`` and every loop over a dynamic
        axis stops at its runtime extent (:mod:`kiln.te.dynamic`).
    name : str
        Function name (the exported symbol).
    simple_mode : bool
        Accepted for TVM familiarity; ignored.

    Returns
    -------
    PrimFunc

    Raises
    ------
    CompileError
        Among others, for a read along a dynamic dimension that cannot be bounded by its
        runtime extent.
    """
    del simple_mode
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise CompileError(f"lower: function name {name!r} is not a valid C identifier")
    return _Lowerer(sch, args, name).run()
