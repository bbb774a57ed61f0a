"""Computes and schedules: index, scatter and scan-like ops (ScatterElements, ScatterND, GatherND, TensorScatter,
Trilu, CumSum, CumProd, OneHot, EyeLike, ReverseSequence, Det, window functions).

The ops of :mod:`kiln.ir.ops.index`. Like the scatters of :mod:`.transform` (ScatterElements
without a reduction among them), the scatters with a reduction (ScatterElements', ScatterND's)
are written as searches (every output element reduces over the updates that land on it), so a
kernel only ever writes its own output element and reads with indices proven in bounds: each
index read from data goes through :func:`.transform.data_index` (checked at run time). The
ScatterElements searches are the form of device targets (one work-item per output element). On
CPU targets ScatterElements (with or without a reduction) has a loop-IR kernel instead
(:func:`_scatter_elements_loops`, registered for the ``cpu`` target key): the extents checked, a
parallel copy of the data, then each update applied in order at its checked index,
``O(data + updates)`` against the search's ``O(data * updates along the axis)``: Faster R-CNN's
RoI-pooling scatter of ``(150, 256, 7, 7)`` took 391 ms as a search and 1.5 ms as a loop, of
724 -> 231 ms end to end (``python bench/detection_onnx.py --models
fasterrcnn_mobilenet_v3_large_320_fpn --threads 1``, the kernel from the debug executor's
profile; Zen 5, 1 thread, then still built for baseline x86-64). ScatterND (with or without a
reduction) has one of the same design on CPU targets (:func:`_scatter_nd_loops`: each index
row's ``k`` entries checked, then its slice written), ``O(data + updates)`` against the search's
``O(data * rows)``: a KV-cache write of 16 rows into ``(1, 8, 1024, 64)`` went from 0.28 to
0.043 ms, 10000 scalars into ``(100000,)`` from 724 to 0.011 ms (``KILN_NUM_THREADS=1``, a
single-ScatterND ONNX graph built for ``llvm -mcpu=native``, ``GraphModule.benchmark``
medians; AMD EPYC, 2 vCPUs, 1 thread). The scans are ``O(n^2)`` along the scanned
axis for the same reason as the searches (one independent reduction per output element, which
the generic schedules parallelise). The generic schedules are used for all the computes.

Imports the tensor expressions, the loop IR and the kernel registry; never a code generator or
the driver.
"""

from __future__ import annotations

from typing import Any, cast

from .. import te, tir
from ..ir.ops.index import permutation_terms
from ..tir.expr import CHECKED_INDEX, Call, binary, checked_index
from ..tir.expr import cast as tir_cast
from ..tir.simplify import simplify
from ..tir.stmt import Buffer, BufferStore, Evaluate, For, LetStmt, PrimFunc, Stmt, seq
from .data_dependent import runtime_extent
from .registry import register_compute, register_prim_kernel
from .transform import data_index, index_subject, unravel
from .util import TAG_INJECTIVE, acc_dtype, load, norm_axis

__all__ = ["TAG_SCAN", "TAG_SCATTER_REDUCE", "SCAN_BLOCK_MIN", "SCATTER_PARALLEL_COPY_MIN", "SCATTER_COPY_GRAIN",
           "checked_count"]

#: Tag of the reduction stage of cumsum / cumprod.
TAG_SCAN = "scan"
#: Tag of the reduction stage of the scatters with a reduction.
TAG_SCATTER_REDUCE = "scatter_reduce"


def checked_count(v: Any, n: int, what: str) -> Any:
    """A value read from data that must lie in ``[0, n)``, checked at run time (int64).

    Unlike :func:`kiln.te.checked_index` a negative value does not count from the end: it is
    moved below ``-n`` first, so it fails the check too (the error then shows ``v - n``).

    Parameters
    ----------
    v : PrimExpr
        The value (any integer type).
    n : int
        One past the largest valid value.
    what : str
        Subject of the run-time error message.

    Returns
    -------
    PrimExpr
        ``v`` as int64; the kernel fails with an error naming ``what`` for a value outside ``[0, n)``.
    """
    v = te.cast(v, "int64")
    shifted = te.if_then_else(v < te.const(0, "int64"), v - te.const(n, "int64"), v)
    return te.checked_index(shifted, n, f"{what} (a negative value is shown minus {n})")


# ----------------------------------------------------------------------------- trilu
@register_compute("trilu")
def trilu(attrs: dict, inputs: list, out_types: list) -> list:
    """``x`` where ``j - i >= k`` (upper) or ``j - i <= k`` (lower) in the last two dims, else 0."""
    x = inputs[0]
    k = int(attrs.get("k", 0))
    upper = bool(attrs.get("upper", True))
    zero = te.const(False, "bool") if x.dtype == "bool" else te.const(0, x.dtype)

    def body(*p: Any) -> Any:
        d = p[-1] - p[-2]
        keep = d >= k if upper else d <= k
        return te.if_then_else(keep, load(x, p), zero)

    return [te.compute(tuple(x.shape), body, name="trilu", tag=TAG_INJECTIVE)]


# ----------------------------------------------------------------------------- cumsum / cumprod
#: Scans along an axis longer than this are blocked (see :func:`_scan`).
SCAN_BLOCK_MIN = 64


def _scan(kind: str) -> Any:
    """The cumsum / cumprod compute. Each output element is an independent reduction (no
    loop-carried state, so the generic schedules parallelise it): directly over the axis
    (``O(n^2)``) for a short axis; for a longer one in blocks of ``B ~ sqrt(n)``: block totals,
    their running totals, and each element's partial block (``O(n * sqrt(n))``)."""

    def compute(attrs: dict, inputs: list, out_types: list) -> list:
        x = inputs[0]
        nd = len(x.shape)
        axis = norm_axis(int(attrs.get("axis", 0)), nd)
        exclusive, reverse = bool(attrs.get("exclusive", False)), bool(attrs.get("reverse", False))
        n = int(x.shape[axis])
        acc = acc_dtype(x.dtype)
        red = te.sum if kind == "sum" else te.reduce_prod
        shape = tuple(x.shape)

        def taken(r: Any, i: Any) -> Any:
            # the terms of out[i]: r <= i (inclusive), r < i (exclusive); mirrored for reverse
            if reverse:
                return r > i if exclusive else r >= i
            return r < i if exclusive else r <= i

        def read(p: tuple, j: Any) -> Any:
            src = list(p)
            src[axis] = j
            return te.cast(load(x, src), acc)

        # blocks index the axis as ``q * bs + r``, which no runtime extent bounds: a dynamic
        # axis takes the direct form
        dynamic = x.dyn is not None and x.dyn[axis] is not None
        if n <= SCAN_BLOCK_MIN or dynamic:
            r = te.reduce_axis((0, max(n, 1)), name="r")
            # n == 0: nothing to read, and the (empty) output is never evaluated
            scan = te.compute(shape, lambda *p: red(read(p, r.var), axis=r,
                                                    where=taken(r.var, p[axis]) if n else te.const(False, "bool")),
                              name=f"cum{kind}_acc", tag=TAG_SCAN)
        else:
            bs = max(1, int(round(n ** 0.5)))
            nb = -(-n // bs)
            bshape = shape[:axis] + (nb,) + shape[axis + 1:]
            rb = te.reduce_axis((0, bs), name="rb")
            # (the where-clauses keep the last, partial block inside the axis; the minimum only
            # keeps the address in bounds should a code generator evaluate the term anyway)
            total = cast(te.Tensor, te.compute(
                bshape, lambda *p: red(read(p, te.minimum(p[axis] * bs + rb.var, n - 1)), axis=rb,
                                       where=p[axis] * bs + rb.var < n),
                name=f"cum{kind}_block", tag=TAG_SCAN))
            rq = te.reduce_axis((0, nb), name="rq")
            # blocks wholly before (after, for reverse) block q: exclusive or not, all of them count
            before = cast(te.Tensor, te.compute(
                bshape, lambda *p: red(load(total, p[:axis] + (rq.var,) + p[axis + 1:]), axis=rq,
                                       where=rq.var > p[axis] if reverse else rq.var < p[axis]),
                name=f"cum{kind}_blocks", tag=TAG_SCAN))
            rr = te.reduce_axis((0, bs), name="rr")

            def part_body(*p: Any) -> Any:
                j = te.floordiv(p[axis], bs) * bs + rr.var
                return red(read(p, te.minimum(j, n - 1)), axis=rr, where=te.all(j < n, taken(j, p[axis])))

            part = cast(te.Tensor, te.compute(shape, part_body, name=f"cum{kind}_part", tag=TAG_SCAN))

            def join(*p: Any) -> Any:
                q = list(p)
                q[axis] = te.floordiv(p[axis], bs)
                a, b = load(before, q), load(part, p)
                return a + b if kind == "sum" else a * b

            scan = te.compute(shape, join, name=f"cum{kind}_acc", tag=TAG_INJECTIVE)
        scan = cast(te.Tensor, scan)
        if acc == x.dtype:
            return [scan]
        return [te.compute(shape, lambda *p: te.cast(load(scan, p), x.dtype), name=f"cum{kind}", tag=TAG_INJECTIVE)]

    return compute


register_compute("cumsum", _scan("sum"))
register_compute("cumprod", _scan("prod"))


# ----------------------------------------------------------------------------- reverse_sequence
@register_compute("reverse_sequence")
def reverse_sequence(attrs: dict, inputs: list, out_types: list) -> list:
    """``out[b, t] = x[b, len[b] - 1 - t]`` for ``t < len[b]``, else ``x[b, t]`` (batch/time in
    either order); each length is checked to lie in ``[0, time size]``."""
    x, lens = inputs
    nd = len(x.shape)
    b = norm_axis(int(attrs.get("batch_axis", 1)), nd)
    t = norm_axis(int(attrs.get("time_axis", 0)), nd)
    n = int(x.shape[t])
    what = f"reverse_sequence: sequence length (valid: [0, {n}]) for data with shape {tuple(int(d) for d in x.shape)}"

    def body(*p: Any) -> Any:
        m = checked_count(load(lens, [p[b]]), n + 1, what)
        ti = te.cast(p[t], "int64")
        # 0 <= m - 1 - ti < n whenever ti < m <= n
        src = list(p)
        src[t] = te.cast(te.if_then_else(ti < m, m - te.const(1, "int64") - ti, ti), "int32")
        return load(x, src)

    return [te.compute(tuple(x.shape), body, name="reverse_sequence", tag=TAG_INJECTIVE)]


# ----------------------------------------------------------------------------- tensor_scatter
@register_compute("tensor_scatter")
def tensor_scatter(attrs: dict, inputs: list, out_types: list) -> list:
    """Each cache position reads the update that lands on it, if any: ``q = t - w[batch]``
    (modulo the axis size when circular) and ``out = update[q]`` for ``0 <= q < seq`` else the
    cache. In linear mode each write index is checked to lie in ``[0, max_seq - seq]``."""
    cache, upd = inputs[0], inputs[1]
    wi = inputs[2] if len(inputs) > 2 else None
    nd = len(cache.shape)
    axis = norm_axis(int(attrs.get("axis", -2)), nd)
    circular = attrs.get("mode", "linear") == "circular"
    m, s = int(cache.shape[axis]), int(upd.shape[axis])
    if s == 0:
        return [te.compute(tuple(cache.shape), lambda *p: load(cache, p), name="tensor_scatter", tag=TAG_INJECTIVE)]
    what = (f"tensor_scatter: write index (linear mode, valid: [0, {m - s}]) of {s} updates into an axis of size "
            f"{m}")

    def body(*p: Any) -> Any:
        t = te.cast(p[axis], "int64")
        if wi is None:
            q = t
        elif circular:
            w = te.floormod(te.cast(load(wi, [p[0]]), "int64"), te.const(m, "int64"))
            q = te.floormod(t - w, te.const(m, "int64"))
        else:
            q = t - checked_count(load(wi, [p[0]]), m - s + 1, what)
        inside = te.all(q >= te.const(0, "int64"), q < te.const(s, "int64"))
        src = list(p)
        src[axis] = te.cast(q, "int32")
        return te.if_then_else(inside, load(upd, src), load(cache, p))

    return [te.compute(tuple(cache.shape), body, name="tensor_scatter", tag=TAG_INJECTIVE)]


# ----------------------------------------------------------------------------- det
@register_compute("det")
def det(attrs: dict, inputs: list, out_types: list) -> list:
    """Leibniz expansion (``n!`` products, ``n <= DET_MAX_N``) evaluated in float64."""
    x = inputs[0]
    n = int(x.shape[-1])
    terms = permutation_terms(n)

    def body(*p: Any) -> Any:
        total: Any = te.const(1.0 if n == 0 else 0.0, "float64")
        for sign, perm in terms:
            prod: Any = None
            for i, j in enumerate(perm):
                v = te.cast(load(x, list(p) + [te.const(i), te.const(j)]), "float64")
                prod = v if prod is None else prod * v
            if prod is not None:
                total = total + prod if sign > 0 else total - prod
        return te.cast(total, x.dtype)

    return [te.compute(tuple(x.shape[:-2]), body, name="det", tag=TAG_INJECTIVE)]


# ----------------------------------------------------------------------------- scatters with a reduction
_REDUCERS = {"add": te.sum, "mul": te.reduce_prod, "max": te.reduce_max, "min": te.reduce_min}


def _combine(kind: str, a: Any, b: Any) -> Any:
    if kind == "add":
        return a + b
    if kind == "mul":
        return a * b
    return te.maximum(a, b) if kind == "max" else te.minimum(a, b)


def _identity(kind: str, dtype: str) -> Any:
    if kind == "add":
        return te.const(0, dtype)
    if kind == "mul":
        return te.const(1, dtype)
    return te.min_value(dtype) if kind == "max" else te.max_value(dtype)


def _finish(x: te.Tensor, red: te.Tensor, kind: str, acc: str, name: str) -> te.Tensor:
    def body(*p: Any) -> Any:
        return te.cast(_combine(kind, te.cast(load(x, p), acc), load(red, p)), x.dtype)

    return cast(te.Tensor, te.compute(tuple(x.shape), body, name=name, tag=TAG_INJECTIVE))


@register_compute("scatter_elements_reduce")
def scatter_elements_reduce(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX ScatterElements with a reduction, as a search: ``out[p]`` combines ``data[p]`` with
    the reduction of every update along ``axis`` whose index is ``p[axis]``
    (``O(size * updates along axis)``). Every index is checked (see :func:`data_index`). The
    form of device targets; CPU targets use :func:`_scatter_elements_loops`."""
    x, ind, upd = inputs
    nd = len(x.shape)
    axis = norm_axis(int(attrs.get("axis", 0)), nd)
    kind = attrs.get("reduction", "add")
    acc = acc_dtype(x.dtype)
    us = tuple(int(d) for d in ind.shape)
    if 0 in us:
        return [te.compute(tuple(x.shape), lambda *p: load(x, p), name="scatter_elements_reduce", tag=TAG_INJECTIVE)]
    k = te.reduce_axis((0, us[axis]), name="k")
    ident = _identity(kind, acc)

    def red_body(*p: Any) -> Any:
        u = list(p)
        u[axis] = k.var
        hit = te.equal(data_index(load(ind, u), x, axis, "scatter_elements_reduce"), p[axis])
        val = te.cast(load(upd, u), acc)
        # positions past the updates' extent (off axis) read nothing: the selects are lazy
        inside = [p[m] < us[m] for m in range(nd) if m != axis and us[m] < x.shape[m]]
        if inside:
            ok = te.all(*inside)
            hit = te.if_then_else(ok, hit, te.const(False, "bool"))
            val = te.if_then_else(ok, val, ident)
        return _REDUCERS[kind](val, axis=k, where=hit)

    red = cast(te.Tensor, te.compute(tuple(x.shape), red_body, name="scatter_elements_reduce_acc",
                                     tag=TAG_SCATTER_REDUCE))
    return [_finish(x, red, kind, acc, "scatter_elements_reduce")]


@register_compute("scatter_nd_reduce")
def scatter_nd_reduce(attrs: dict, inputs: list, out_types: list) -> list:
    """ONNX ScatterND with a reduction, as a search: ``out[p, j]`` combines ``data[p, j]`` with
    the reduction of ``updates[row, j]`` over every index row equal to ``p``
    (``O(size * rows * k)``). Every index is checked. The form of device targets; CPU targets
    use :func:`_scatter_nd_loops`."""
    x, ind, upd = inputs
    kind = attrs.get("reduction", "add")
    acc = acc_dtype(x.dtype)
    k = int(ind.shape[-1])
    qs = tuple(int(d) for d in ind.shape[:-1])
    nq = 1
    for d in qs:
        nq *= d
    if nq == 0:
        return [te.compute(tuple(x.shape), lambda *p: load(x, p), name="scatter_nd_reduce", tag=TAG_INJECTIVE)]
    r = te.reduce_axis((0, nq), name="r")

    def red_body(*p: Any) -> Any:
        q = unravel(r.var, qs)
        hit = te.all(*[te.equal(data_index(load(ind, q + [te.const(m)]), x, m, "scatter_nd_reduce"), p[m])
                       for m in range(k)])
        return _REDUCERS[kind](te.cast(load(upd, q + list(p[k:])), acc), axis=r, where=hit)

    red = cast(te.Tensor, te.compute(tuple(x.shape), red_body, name="scatter_nd_reduce_acc", tag=TAG_SCATTER_REDUCE))
    return [_finish(x, red, kind, acc, "scatter_nd_reduce")]


# ----------------------------------------------------------------------------- scatter_elements, scatter_nd on the CPU
#: A copy of data of at least this many elements (its upper-bound shape) runs in parallel.
SCATTER_PARALLEL_COPY_MIN = 1 << 15
#: About how many elements one iteration of the parallel copy moves (see :func:`_copy`).
SCATTER_COPY_GRAIN = 1 << 12

_I32 = "int32"


def _at_most(value: Any, bound: Any, what: str) -> Stmt:
    """Fail the kernel unless the run-time extent ``value <= bound``: the :data:`CHECKED_INDEX`
    check of ``value`` against ``[-(bound + 1), bound]`` (``value`` is never negative), whose
    error shows ``value`` as the index and ``bound`` as the largest index the range allows."""
    v, n = tir_cast(value, "int64"), tir_cast(bound, "int64") + tir.const(1, "int64")
    return Evaluate(Call("int64", CHECKED_INDEX, [v, n], text=what))


def _equal_extents(op: str, subject: str, a: tuple[Buffer, int, str], b: tuple[Buffer, int, str]) -> list[Stmt]:
    """The run-time checks that dim ``da`` of ``A`` equals dim ``db`` of ``B`` (``a = (A, da,
    name)``, ``b`` alike): each at most the other (:func:`_at_most`), the error opening
    ``"{op}: {subject}: "``. None where both extents are static (the op's type relation has
    compared them) or one symbol."""
    (ab, ad, an), (bb, bd, bn) = a, b
    ae, be = runtime_extent(ab, ad), runtime_extent(bb, bd)
    if ae is be or isinstance(ae, tir.IntImm) and isinstance(be, tir.IntImm):
        return []
    return [_at_most(u, v, f"{op}: {subject}: dim {ud} of the {un}, the index shown, must equal dim {vd} of the "
                           f"{vn}, the largest index the range allows")
            for (u, ud, un), (v, vd, vn) in (((ae, ad, an), (be, bd, bn)), ((be, bd, bn), (ae, ad, an)))]


def _extent_checks(op: str, axis: int, x: Buffer, ind: Buffer, upd: Buffer) -> list[Stmt]:
    """The run-time checks of the extents ONNX requires of ScatterElements: the indices' equal
    the updates' on every dim, and are at most the data's on every dim but ``axis``. Only dims
    that are dynamic somewhere are checked: the op's type relation has checked the upper bounds."""
    checks: list[Stmt] = []
    for d in range(x.ndim):
        checks += _equal_extents(op, "indices and updates of different shapes", (ind, d, "indices"),
                                 (upd, d, "updates"))
        ie, xe = runtime_extent(ind, d), runtime_extent(x, d)
        if d != axis and not (ie is xe or isinstance(xe, tir.IntImm)):
            checks.append(_at_most(ie, xe, f"{op}: indices larger than the data off axis {axis}: dim {d} of the "
                                           f"indices, the index shown, must be at most dim {d} of the data, the "
                                           "largest index the range allows"))
    return checks


def _copy(out: Buffer, x: Buffer) -> Stmt:
    """``out = x`` over the valid box (the runtime extents).

    Data of :data:`SCATTER_PARALLEL_COPY_MIN` elements or more is copied by one parallel loop
    over a fused range: the leading dims up to dim ``k`` (the outermost one with fewer than
    :data:`SCATTER_COPY_GRAIN` elements after it) and chunks of ``c`` rows of dim ``k``, about
    :data:`SCATTER_COPY_GRAIN` elements each; each iteration copies its chunk with serial
    loops (so a (2, 10^6) tensor, or a dynamic batch that is 1 at run time, is still cut into
    many iterations). Smaller data is copied by serial loops.
    """
    nd = x.ndim
    xe = [runtime_extent(x, d) for d in range(nd)]
    cv = [tir.Var(f"c{d}", _I32) for d in range(nd)]
    if x.size < SCATTER_PARALLEL_COPY_MIN:
        s: Stmt = BufferStore(out, x[tuple(cv)], cv)
        for d in reversed(range(nd)):
            s = For(cv[d], 0, xe[d], "serial", s)
        return s
    inner = [1] * (nd + 1)  # inner[d]: elements of dims d.. (upper bounds)
    for d in reversed(range(nd)):
        inner[d] = inner[d + 1] * int(x.shape[d])
    k = next(d for d in range(nd) if inner[d + 1] < SCATTER_COPY_GRAIN)
    c = max(1, min(int(x.shape[k]), -(-SCATTER_COPY_GRAIN // inner[k + 1])))
    chunks = xe[k] if c == 1 else simplify((xe[k] + (c - 1)) // c)
    q, r, f = tir.Var("cq", _I32), tir.Var(f"c{k}", _I32), tir.Var("cf", _I32)
    idx: list[Any] = list(cv)
    idx[k] = r if c == 1 else simplify(q * c) + r
    s = BufferStore(out, x[tuple(idx)], idx)
    for d in reversed(range(k + 1, nd)):
        s = For(cv[d], 0, xe[d], "serial", s)
    if c > 1:
        s = For(r, 0, simplify(binary("min", tir.const(c, _I32), xe[k] - q * c)), "serial", s)
    # unravel the fused index: dim k's chunk fastest, then dims k-1, ..., 0
    lets: list[tuple[Any, Any]] = [(q if c > 1 else r, f if k == 0 else f % chunks)]
    rest: Any = f // chunks
    for d in reversed(range(k)):
        lets.append((cv[d], rest if d == 0 else rest % xe[d]))
        rest = rest // xe[d]
    for var, val in reversed(lets):
        s = LetStmt(var, val, s)
    total: Any = chunks
    for d in range(k):
        total = total * xe[d]
    return For(f, 0, simplify(total), "parallel", s)


def _checked(op: str, x: Buffer, axis: int, v: Any) -> Any:
    """The index ``v`` read from data into ``x``'s ``axis``, wrapped and checked (int32): against
    the runtime extent of a dynamic axis (an index into the padding is out of range), the
    error naming ``op`` as :func:`.transform.data_index` (the search forms') does."""
    rt = x.dyn[axis] if x.dyn is not None else None
    what = index_subject(op, x.shape, axis, rt is not None)
    return tir_cast(checked_index(v, int(x.shape[axis]) if rt is None else rt, what), _I32)


def _update(kind: str, out: Buffer, dst: list, new: Any) -> Stmt:
    """``out[dst] = new`` (reduction ``none``), or combined with ``out[dst]`` in the
    accumulation dtype and rounded back to the data's (float16 / bfloat16 in float32)."""
    if kind != "none":
        acc = acc_dtype(out.dtype)
        new = tir_cast(_combine(kind, tir_cast(out[tuple(dst)], acc), tir_cast(new, acc)), out.dtype)
    return BufferStore(out, new, dst)


_ORDER_NOTE = ("ONNX Runtime's order, so sums and products round as its do; but max / min keep a NaN once it is "
               "there, where ONNX Runtime's compare takes a later update.")


def _scatter_elements_loops(op: str) -> Any:
    """The CPU kernel of ``op`` (``scatter_elements`` or ``scatter_elements_reduce``)."""

    def kernel(attrs: dict, args: list, outs: list, name: str, target: Any) -> Any:
        x, ind, upd = args
        (out,) = outs
        nd = x.ndim
        axis = norm_axis(int(attrs.get("axis", 0)), nd)
        kind = attrs.get("reduction", "add") if op == "scatter_elements_reduce" else "none"
        # with the extents checked, the loops over the indices' stay inside the updates, and off
        # the axis inside the data: no padding is read and none written
        checks = _extent_checks(op, axis, x, ind, upd)
        uv = [tir.Var(f"u{d}", _I32) for d in range(nd)]
        j = tir.Var("j", _I32)
        dst = list(uv)
        dst[axis] = j
        # j is bound once: the check ends the kernel (with the error naming the op) on a bad index
        scatter: Stmt = LetStmt(j, _checked(op, x, axis, ind[tuple(uv)]), _update(kind, out, dst, upd[tuple(uv)]))
        # serial, in the updates' row-major order: with reduction none the last duplicate wins
        for d in reversed(range(nd)):
            scatter = For(uv[d], 0, runtime_extent(ind, d), "serial", scatter)
        return PrimFunc(name, [x, ind, upd, out], seq(*checks, _copy(out, x), scatter), {"global_symbol": name})

    kernel.__doc__ = (f"{op} on a CPU target: the extents checked (:func:`_extent_checks`), ``out = data`` "
                      "(the valid box, :func:`_copy`), then each update in the updates' row-major order "
                      "written (combined, for a reduction) at its checked index; ``O(data + updates)``. "
                      + _ORDER_NOTE)
    return kernel


def _scatter_nd_loops(op: str) -> Any:
    """The CPU kernel of ``op`` (``scatter_nd`` or ``scatter_nd_reduce``)."""

    def kernel(attrs: dict, args: list, outs: list, name: str, target: Any) -> Any:
        x, ind, upd = args
        (out,) = outs
        k = int(ind.shape[-1])
        nq = ind.ndim - 1  # the index rows' dims, the updates' leading ones
        kind = attrs.get("reduction", "add") if op == "scatter_nd_reduce" else "none"
        # updates' shape = indices.shape[:-1] + data.shape[k:], dynamic dims checked at run time;
        # then the loops over the indices' rows stay inside the updates, and those over a slice
        # inside the data: no padding is read and none written
        checks: list[Stmt] = []
        for d in range(nq):
            checks += _equal_extents(op, "indices and updates of different shapes", (ind, d, "indices"),
                                     (upd, d, "updates"))
        for d in range(k, x.ndim):
            checks += _equal_extents(op, f"updates not of shape indices.shape[:-1] + data.shape[{k}:]",
                                     (upd, nq + d - k, "updates"), (x, d, "data"))
        if ind.dyn is not None and ind.dyn[-1] is not None:
            # the ranks fix the index depth at its upper bound; the extent is at most that
            checks.append(_at_most(tir.const(k, _I32), ind.dyn[-1],
                                   f"{op}: index depth {k} (fixed by the ranks of data and updates), the index "
                                   f"shown, must equal the last dim of the indices, the largest index the range "
                                   "allows"))
        qv = [tir.Var(f"q{d}", _I32) for d in range(nq)]
        jv = [tir.Var(f"j{m}", _I32) for m in range(k)]
        tv = [tir.Var(f"t{d}", _I32) for d in range(k, x.ndim)]
        scatter: Stmt = _update(kind, out, jv + tv, upd[tuple(qv + tv)])
        for t, d in reversed(list(zip(tv, range(k, x.ndim)))):
            scatter = For(t, 0, runtime_extent(x, d), "serial", scatter)
        # a row's k indices are all checked before any element of its slice is written
        for m in reversed(range(k)):
            scatter = LetStmt(jv[m], _checked(op, x, m, ind[tuple(qv) + (tir.const(m, _I32),)]), scatter)
        # serial, in the rows' row-major order: with reduction none the last duplicate wins
        for d in reversed(range(nq)):
            scatter = For(qv[d], 0, runtime_extent(ind, d), "serial", scatter)
        return PrimFunc(name, [x, ind, upd, out], seq(*checks, _copy(out, x), scatter), {"global_symbol": name})

    kernel.__doc__ = (f"{op} on a CPU target: the extents checked (:func:`_equal_extents`), ``out = data`` "
                      "(the valid box, :func:`_copy`), then for each index row in row-major order its ``k`` "
                      "indices checked and its slice of the updates written (combined, for a reduction) there; "
                      "``O(data + updates)``. " + _ORDER_NOTE)
    return kernel


# CPU targets only: a device kernel has no order among its work-items, so the driver lowers the
# search form (the op's compute) there
register_prim_kernel("scatter_elements", _scatter_elements_loops("scatter_elements"), keys=("cpu",))
register_prim_kernel("scatter_elements_reduce", _scatter_elements_loops("scatter_elements_reduce"), keys=("cpu",))
register_prim_kernel("scatter_nd", _scatter_nd_loops("scatter_nd"), keys=("cpu",))
register_prim_kernel("scatter_nd_reduce", _scatter_nd_loops("scatter_nd_reduce"), keys=("cpu",))
