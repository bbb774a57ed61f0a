"""Runtime extents of dynamic dimensions: which axis of which stage stops where.

Owns the *padded layout* rules of dynamic (symbolic) dimensions on the compute side.  Every
tensor is stored at its static upper-bound shape; a tensor whose dimension ``d`` is dynamic
(``Tensor.dyn[d]`` is a :class:`~kiln.tir.Var`) holds valid data only in ``[0, dyn[d])``
along it.  A kernel must compute the valid box of its outputs and never let an element
outside the valid box of an input reach a valid output.

:func:`infer_axis_extents` finds, for one compute operation, the runtime extent of each of
its axes (data-parallel and reduce) from how its body reads its inputs:

* an axis whose variable is *exactly* the index (the plain variable, offset 0) along dynamic
  dimension ``d`` of a tensor ``T`` it reads, with the axis's static extent equal to
  ``T.shape[d]``, runs to ``T.dyn[d]``;
* an explicit ``dyn`` on the operation's output (:func:`kiln.te.set_dyn`) fixes its data
  axes instead (authoritative);
* every read along a dynamic dimension must then be *bounded*: the index is the constant 0
  (every valid dynamic extent is >= 1 wherever there is a valid output element), an axis
  variable whose runtime extent is the same Var, an index from data checked against it at run
  time, or any index the read is guarded by -- a lazy ``if_then_else(index < n, T[index], ..)``
  or a reduction's ``where`` saying ``index < n`` (packing a dynamic axis into panels).
  Anything else is a :class:`~kiln.runtime.errors.CompileError` -- never a silently wrong
  kernel.

The lowering (:mod:`kiln.te.lower_schedule`) turns the extents into guards ``index < n``
and those into loop bounds (:func:`dyn_guard`, :func:`relaxed_guards`).

This module imports ``kiln.tir`` and ``kiln.te.tensor`` only.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..runtime.errors import CompileError
from ..tir.expr import (CHECKED_INDEX, BinaryOp, Call, Cast, IntImm, PrimExpr, ProducerLoad, Reduce, Select, Var,
                        binary, conjuncts, const, structural_equal)
from ..tir.functor import children, collect_vars, post_order_visit
from ..tir.simplify import Analyzer
from .tensor import IterVar, Operation, PlaceholderOp, Tensor

__all__ = ["explicit_dyn", "infer_axis_extents", "tensor_dyn", "dyn_guard", "relaxed_guards", "VALID_BOX_ONLY",
           "PADDED_EXTENTS"]

#: Compute attribute: the operation's readers read nothing outside its valid box, so a stage of
#: it attached to a reader still stops its dynamic axes at their runtime extents (an attached
#: stage otherwise computes the whole region its readers index, bounded statically).
VALID_BOX_ONLY = "valid_box_only"

#: Compute attribute ``((axis, n, add), ...)``: along ``axis`` the values past ``n + add`` (``n``
#: a runtime extent of an input) are never read, so a kernel-internal stage of it stops there.
#: A zero-padded copy of a dynamic axis (:func:`kiln.topi.transform.pad_compute`): a window
#: op's reads end before ``extent + padding``, and the copy's loops otherwise run over the
#: padded upper bound at every size.
PADDED_EXTENTS = "padded_extents"


def _guarded_loads(bodies: Sequence[PrimExpr]) -> list[tuple[ProducerLoad, tuple[PrimExpr, ...]]]:
    """Every load with the conditions known true where it is evaluated: the conjuncts of the
    enclosing lazy selects' conditions (true branch) and of the enclosing reductions' ``where``."""
    out: list[tuple[ProducerLoad, tuple[PrimExpr, ...]]] = []
    stack: list[tuple[Any, tuple[PrimExpr, ...]]] = [(b, ()) for b in reversed(bodies)]
    while stack:
        n, facts = stack.pop()
        if isinstance(n, ProducerLoad):
            out.append((n, facts))
            stack.extend((i, facts) for i in n.indices)
        elif isinstance(n, Select):
            stack.append((n.cond, facts))
            stack.append((n.true_value, facts + conjuncts(n.cond)))
            stack.append((n.false_value, facts))
        elif isinstance(n, Reduce):
            cond = conjuncts(n.condition) if n.condition is not None else ()
            stack.append((n.source, facts + cond))
            if n.condition is not None:
                stack.append((n.condition, facts))
        else:
            stack.extend((c, facts) for c in children(n))
    return out


def _guarded(idx: PrimExpr, v: Var, facts: Sequence[PrimExpr], ana: Analyzer | None = None) -> bool:
    """Whether a fact says ``idx < v`` (the index is below the runtime extent where read): the
    fact is ``idx < v`` itself, or ``a < v`` with ``a >= idx`` over the axes' ranges (``ana``):
    a block's last element ``b * L + L-1 < n`` guards each of its elements ``b * L + l``: one
    condition for the whole vector."""
    for f in facts:
        if isinstance(f, BinaryOp) and f.op == "lt":
            bound = f.b
            while isinstance(bound, Cast):
                bound = bound.value
            if bound is not v:
                continue
            if structural_equal(f.a, idx):
                return True
            if ana is not None and ana.const_int_bound(ana.simplify(binary("sub", f.a, idx)))[0] >= 0:
                return True
    return False


def _loads(bodies: Sequence[PrimExpr]) -> list[ProducerLoad]:
    out: list[ProducerLoad] = []

    def f(n: Any) -> None:
        if isinstance(n, ProducerLoad):
            out.append(n)

    for b in bodies:
        post_order_visit(b, f)
    return out


def explicit_dyn(op: Operation) -> Any:
    """The dyn set with :func:`kiln.te.set_dyn` on one of ``op``'s outputs, or None."""
    return next((t.dyn for t in op.outputs if t.dyn is not None), None)


def infer_axis_extents(op: Operation, bodies: Sequence[PrimExpr], dyn_of: Callable[[Tensor], Any],
                       fname: str, original: Sequence[PrimExpr] = (),
                       trusted: Any = None) -> dict[IterVar, Var]:
    """Runtime extents of ``op``'s axes (data and reduce) that are dynamic.

    Parameters
    ----------
    op : ComputeOp
        The operation.
    bodies : list of PrimExpr
        Its bodies as lowered (after inlining and cache redirection), in ``op``'s axis variables.
    dyn_of : callable
        ``Tensor -> dyn tuple or None`` for the tensors the bodies read.
    fname : str
        Function name for error messages.
    original : list of PrimExpr
        ``op``'s own bodies before inlining. Their reads of inlined producers count too: a
        producer whose values do not depend on any dynamic input (``broadcast_to`` of a
        constant to a symbolic length) leaves no dynamic read behind once inlined, yet the
        reader's axis over it must still stop at the runtime extent.
    trusted : dict of int to ProducerLoad
        Loads (by id) inlined from an operation that declared its reads in bounds
        (``dyn_reads_in_bounds``, e.g. the Winograd output transform inlined into its fused
        epilogue): not checked again here.

    Returns
    -------
    dict
        ``IterVar -> Var`` for every axis that stops at a runtime extent.

    Raises
    ------
    CompileError
        A read along a dynamic dimension that cannot be bounded by its runtime extent, or an
        axis that two different dynamic extents claim.
    """
    axes = list(op.axis) + list(op.reduce_axis)
    by_var = {iv.var: iv for iv in axes}
    ext: dict[IterVar, Var] = {}
    explicit = explicit_dyn(op)
    if explicit is not None:
        for iv, v in zip(op.axis, explicit):
            if v is not None:
                ext[iv] = v
    fixed = set(op.axis) if explicit is not None else set()
    guarded = _guarded_loads(list(bodies) + list(original))
    loads = [(pl, dyn_of(pl.producer)) for pl, _ in guarded]
    facts_of = {id(pl): f for pl, f in guarded}
    # pass 1: exact reads give axes their extents
    for pl, dyn in loads:
        for d, v in enumerate(dyn or ()):
            if v is None:
                continue
            idx = pl.indices[d]
            ax = by_var.get(idx) if isinstance(idx, Var) else None
            if ax is None or ax in fixed or ax.dom_min != 0 or ax.dom_extent != pl.producer.shape[d]:
                continue
            iv = ax
            old = ext.get(iv)
            if old is not None and old is not v:
                raise CompileError(
                    f"lower {fname}: {op.name}: axis {iv.name} reads dynamic axis {d} of {pl.producer.name} "
                    f"(runtime extent {v.name}) and another dynamic axis with runtime extent {old.name}; one "
                    "axis needs one symbolic extent (give the tensors the same Var)")
            ext[iv] = v
    # pass 2: every read along a dynamic dimension must stay inside its runtime extent (a
    # compute that proves that itself -- index arithmetic on the runtime extents -- says so)
    if getattr(op, "attrs", {}).get("dyn_reads_in_bounds"):
        loads = []
    ana = Analyzer()
    for iv in axes:
        if isinstance(iv.dom_min, int) and isinstance(iv.dom_extent, int):
            ana.bind(iv.var, iv.dom_min, iv.dom_min + iv.dom_extent - 1)
    trusted = trusted or {}
    for pl, dyn in loads:
        if trusted.get(id(pl)) is pl:
            continue
        for d, v in enumerate(dyn or ()):
            if v is None:
                continue
            idx = pl.indices[d]
            if isinstance(idx, IntImm) and idx.value == 0:
                continue
            if isinstance(idx, Var) and idx in by_var and ext.get(by_var[idx]) is v:
                continue
            if _checked_against(idx, v) or _guarded(idx, v, facts_of.get(id(pl), ()), ana):
                continue
            raise CompileError(
                f"lower {fname}: {op.name}: index {idx} along dynamic axis {d} (runtime extent {v.name}, at most "
                f"{pl.producer.shape[d]}) of {pl.producer.name} cannot be bounded by the runtime extent; a "
                "dynamic axis may only be read with an axis variable of the same extent or the constant 0")
    return ext


def _checked_against(idx: PrimExpr, v: Var) -> bool:
    """Whether ``idx`` is an index read from data checked at run time against the runtime
    extent ``v`` (``kiln.checked_index(value, v)``, possibly cast): in bounds by construction."""
    while isinstance(idx, Cast):
        idx = idx.value
    if not (isinstance(idx, Call) and idx.op == CHECKED_INDEX):
        return False
    n = idx.args[1]
    while isinstance(n, Cast):
        n = n.value
    return n is v


def tensor_dyn(op: Operation, ext: dict[IterVar, Var]) -> Any:
    """The ``dyn`` of ``op``'s outputs: explicit, else from the inferred axis extents."""
    if isinstance(op, PlaceholderOp):
        return op.output(0).dyn
    explicit = explicit_dyn(op)
    if explicit is not None:
        return explicit if any(v is not None for v in explicit) else None
    dyn = tuple(ext.get(iv) for iv in op.axis)
    return dyn if any(v is not None for v in dyn) else None


def dyn_guard(index: PrimExpr, bound: Var) -> PrimExpr:
    """The guard ``index < bound`` with floor divisions by constants moved to the bound.

    ``floordiv(x, c) < n`` is ``x < n * c`` for ``c > 0``: the form a fused loop variable
    gives, which :func:`kiln.te.lower_schedule._as_extent_bound` turns into a loop bound.
    """
    b: PrimExpr = bound
    while isinstance(index, BinaryOp) and index.op == "floordiv" and isinstance(index.b, IntImm) \
            and index.b.value > 0:
        b = binary("mul", b, const(index.b.value))
        index = index.a
    return binary("lt", index, b)


def relaxed_guards(guard: PrimExpr, depth: dict[Var, int], ana: Analyzer) -> list[PrimExpr]:
    """Guards on outer loops implied by ``guard``.

    For ``sum(k_i * v_i) < B`` with positive coefficients over loop variables ``v_i`` (all
    ``>= 0``) and ``B`` free of them, dropping the deeper variables gives a necessary
    condition on the outer ones: ``io * 8 < n`` from ``io * 8 + ii < n``.  As a loop bound
    it stops the outer loop at ``ceil(n / 8)`` instead of its static extent, so the work
    (and a parallel loop's split between threads) follows the runtime size.  Returns one
    guard per outer level, or nothing when ``guard`` is not of that form.
    """
    if not (isinstance(guard, BinaryOp) and guard.op == "lt"):
        return []
    terms, c = ana.linear(ana.simplify(guard.a))
    levels: list[tuple[int, Any, int]] = []
    for atom, k in terms.values():
        # a loop variable, or the quotient / remainder of one by a positive constant (a split
        # axis inside a fused loop): non-negative, and known at that variable's level
        var = atom
        if isinstance(atom, BinaryOp) and atom.op in ("floordiv", "floormod") and isinstance(atom.b, IntImm) \
                and atom.b.value > 0:
            var = atom.a
        if not (isinstance(var, Var) and var in depth and k > 0):
            return []
        levels.append((depth[var], atom, k))
    if any(v in depth for v in collect_vars(guard.b)):
        return []
    levels.sort(key=lambda t: t[0])
    out = []
    # (two atoms of one variable, e.g. quotient and remainder of a fused loop, share a level)
    for n in range(1, len(levels)):
        if levels[n][0] == levels[n - 1][0]:
            continue
        lhs: PrimExpr = const(c)
        for _, v, k in levels[:n]:
            lhs = lhs + (v if k == 1 else v * k)
        out.append(binary("lt", ana.simplify(lhs), guard.b))
    return out
