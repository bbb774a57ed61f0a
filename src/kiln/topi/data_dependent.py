"""Loop-IR kernels of the ops with data-dependent output extents (``kiln.ir.ops.dynamic``).

A tensor expression cannot state "write the i-th selected element at the next free slot", so
these kernels are written directly as loop IR (:func:`~kiln.topi.registry.register_prim_kernel`):
serial loops with one-element local counters. TopK and NonMaxSuppression order their
candidates with a stable merge sort (:func:`_merge_sort`, ``n log n``: a detection head sends
tens of thousands of boxes into NMS); Unique's steps are quadratic (a search among the values
found so far).

Every kernel ends by reporting the count it wrote with :func:`kiln.tir.set_extent` on each
output dim carrying the op's data-dependent symbol; the executor reads the extent from the
first of them and re-shapes every later entry (``docs/dynamic_shapes.md``). Dims the kernel
reads (the inputs' symbolic dims) are bounded by their runtime extents, so padding is never read.

Imports only the loop IR and the kernel registry; never a code generator or the executor.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .. import tir
from ..tir.expr import binary, cast, const, logical_not, select
from ..tir.stmt import Allocate, Buffer, BufferStore, For, IfThenElse, PrimFunc, Stmt, seq
from .registry import register_compute, register_prim_kernel

__all__: list[str] = []

_I32 = "int32"


# ----------------------------------------------------------------------------- helpers
def runtime_extent(b: Buffer, d: int) -> Any:
    """Runtime extent of dim ``d`` of ``b``: its dyn Var, else the static extent."""
    v = b.dyn[d] if b.dyn is not None else None
    return v if v is not None else const(b.shape[d], _I32)


def _reported(b: Buffer, dims: Sequence[int]) -> Buffer:
    """``b`` with the dims its kernel reports marked dynamic.

    The driver leaves a decided dim static at its upper bound; but from the second run on the
    DLTensor holds the extent reported by the previous run, which the argument check must
    accept: a dynamic dim is checked against ``0..upper bound`` instead.
    """
    dyn: list[Any] = list(b.dyn) if b.dyn is not None else [None] * b.ndim
    for d in dims:
        if dyn[d] is None:
            dyn[d] = tir.Var(f"{b.name}_n{d}", _I32)
    return Buffer(b.name, b.shape, b.dtype, b.scope, dyn=dyn)


def _nest(exts: Sequence[Any], body: Callable[[list[tir.Var]], Stmt], prefix: str = "i") -> Stmt:
    """Serial loops over ``exts`` (outermost first) around ``body(loop vars)``."""
    vs = [tir.Var(f"{prefix}{k}", _I32) for k in range(len(exts))]
    s = body(vs)
    for v, e in reversed(list(zip(vs, exts))):
        s = For(v, 0, e, "serial", s)
    return s


def _flat(vs: Sequence[Any], exts: Sequence[Any]) -> Any:
    """Row-major index of ``vs`` in a box of extents ``exts`` (the actual, compact shape)."""
    flat: Any = const(0, _I32)
    for v, e in zip(vs, exts):
        flat = flat * e + v
    return flat


def _store(b: Buffer, value: Any, indices: Sequence[Any]) -> BufferStore:
    """``b[indices] = value`` (Python numbers become constants of ``b``'s dtype)."""
    return BufferStore(b, const(value, b.dtype) if isinstance(value, (int, float)) else value, indices)


def _local(name: str, dtype: str = _I32, n: int = 1, scope: str = "local") -> Buffer:
    return Buffer(name, (max(n, 1),), dtype, scope=scope)


def _alloc(bufs: Sequence[Buffer], body: Stmt) -> Stmt:
    for b in reversed(bufs):
        body = Allocate(b, body)
    return body


def _nonzero_of(e: Any) -> Any:
    return e if e.dtype == "bool" else binary("ne", e, const(0, e.dtype))


def _func(name: str, params: Sequence[Buffer], body: Stmt) -> PrimFunc:
    return PrimFunc(name, list(params), body, {"global_symbol": name})


def _set_all(params: Sequence[Buffer], reports: Sequence[tuple[Buffer, int]], value: Any) -> Stmt:
    idx = {id(b): i for i, b in enumerate(params)}
    return seq(*[tir.set_extent(idx[id(b)], d, value) for b, d in reports])


def _merge_sort(order: Buffer, tmp: Buffer, m: Any, upper: int, before: Callable[[Any, Any], Any],
                prefix: str = "s") -> tuple[Stmt, list[Buffer]]:
    """A stable sort of the int32 indices ``order[0:m]`` (``m <= upper``): bottom-up merge sort,
    ``ceil(log2(upper))`` passes of ``m`` steps through ``tmp`` (same size). ``before(a, b)``:
    whether the element of index ``a`` goes strictly before that of ``b``; equal elements keep
    their order. Returns the statement and the local buffers it needs allocated.

    Selection kernels used repeated arg-best scans, ``m`` steps per selected element: NMS over a
    detection head's 27000 candidates (SSDlite at a low score threshold) took 0.8 s that way.
    """
    w, mid, hi, i, j = (_local(f"{prefix}_{k}") for k in ("w", "mid", "hi", "i", "j"))
    k, p = tir.Var(f"{prefix}_k", _I32), tir.Var(f"{prefix}_p", _I32)
    take_i = seq(_store(tmp, order[i[0]], [k]), _store(i, i[0] + 1, [0]))
    take_j = seq(_store(tmp, order[j[0]], [k]), _store(j, j[0] + 1, [0]))
    # output position k of a pass: the start of a pair of runs resets the two run pointers; the
    # left run's element goes first unless the right one is strictly before it (stable)
    start = IfThenElse(binary("eq", binary("floormod", k, w[0] * 2), 0), seq(
        _store(mid, binary("min", k + w[0], m), [0]), _store(hi, binary("min", k + w[0] * 2, m), [0]),
        _store(i, k, [0]), _store(j, mid[0], [0])))
    pick = IfThenElse(binary("lt", i[0], mid[0]),
                      IfThenElse(binary("lt", j[0], hi[0]),
                                 IfThenElse(before(order[j[0]], order[i[0]]), take_j, take_i), take_i),
                      take_j)
    one_pass = IfThenElse(binary("lt", w[0], m), seq(
        For(k, 0, m, "serial", seq(start, pick)),
        For(k, 0, m, "serial", _store(order, tmp[k], [k])),
        _store(w, w[0] * 2, [0])))
    passes = max(1, (max(upper, 1) - 1).bit_length())
    return seq(_store(w, 1, [0]), For(p, 0, passes, "serial", one_pass)), [w, mid, hi, i, j]


# ----------------------------------------------------------------------------- nonzero
@register_prim_kernel("nonzero")
def _nonzero(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    (x,), out = args, _reported(outs[0], [1])
    cnt = _local("cnt")
    exts = [runtime_extent(x, d) for d in range(x.ndim)]

    def body(vs: list[tir.Var]) -> Stmt:
        n = cnt[0]
        writes = [_store(out, cast(v, "int64"), [const(d, _I32), n]) for d, v in enumerate(vs)]
        return IfThenElse(_nonzero_of(x[tuple(vs)]), seq(*writes, _store(cnt, n + 1, [0])))

    stmts = seq(_store(cnt, 0, [0]), _nest(exts, body), _set_all([x, out], [(out, 1)], cnt[0]))
    return _func(name, [x, out], _alloc([cnt], stmts))


# ----------------------------------------------------------------------------- compress
@register_prim_kernel("compress")
def _compress(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    x, cond = args
    axis = attrs["axis"]
    cnt = _local("cnt")
    nc = runtime_extent(cond, 0)
    if axis is None:
        out = _reported(outs[0], [0])
        exts = [runtime_extent(x, d) for d in range(x.ndim)]

        def body(vs: list[tir.Var]) -> Stmt:
            f = _flat(vs, exts)
            # a condition shorter than the input drops the tail (ONNX)
            take = binary("lt", f, nc) & _nonzero_of(cond[select(binary("lt", f, nc), f, 0)])
            return IfThenElse(take, seq(_store(out, x[tuple(vs)], [cnt[0]]), _store(cnt, cnt[0] + 1, [0])))

        stmts = seq(_store(cnt, 0, [0]), _nest(exts, body), _set_all([x, cond, out], [(out, 0)], cnt[0]))
        return _func(name, [x, cond, out], _alloc([cnt], stmts))
    axis = axis + x.ndim if axis < 0 else axis
    out = _reported(outs[0], [axis])
    sel = _local("sel", _I32, x.shape[axis], scope="global")
    i = tir.Var("c", _I32)
    pick = For(i, 0, binary("min", runtime_extent(x, axis), nc), "serial",
               IfThenElse(_nonzero_of(cond[i]), seq(_store(sel, i, [cnt[0]]), _store(cnt, cnt[0] + 1, [0]))))
    exts = [runtime_extent(x, d) if d != axis else cnt[0] for d in range(x.ndim)]

    def copy(vs: list[tir.Var]) -> Stmt:
        src: list[Any] = list(vs)
        src[axis] = sel[vs[axis]]
        return _store(out, x[tuple(src)], vs)

    stmts = seq(_store(cnt, 0, [0]), pick, _nest(exts, copy), _set_all([x, cond, out], [(out, axis)], cnt[0]))
    return _func(name, [x, cond, out], _alloc([cnt, sel], stmts))


# ----------------------------------------------------------------------------- NMS
def _corners(boxes: Buffer, b: Any, i: Any, center: bool) -> tuple[Any, Any, Any, Any]:
    """``(x_min, x_max, y_min, y_max)`` of box ``i`` in float32, as ONNX Runtime computes them."""
    c = [cast(boxes[b, i, k], "float32") for k in range(4)]
    if center:  # [x_center, y_center, width, height]
        hw, hh = c[2] / const(2.0, "float32"), c[3] / const(2.0, "float32")
        return c[0] - hw, c[0] + hw, c[1] - hh, c[1] + hh
    # [y1, x1, y2, x2], either corner order
    return (binary("min", c[1], c[3]), binary("max", c[1], c[3]), binary("min", c[0], c[2]),
            binary("max", c[0], c[2]))


@register_prim_kernel("non_max_suppression")
def _nms(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    boxes, scores = args
    out = _reported(outs[0], [0])
    n = scores.shape[2]
    limit = max(0, min(n, attrs["max_output_boxes_per_class"]))
    # symbolic dims (a detection head's data-dependent number of candidates) are looped over to
    # their runtime extents; the upper bound n sizes the scratch buffers
    nb, nc, n_rt = (runtime_extent(scores, d) for d in range(3))
    thr = attrs["score_threshold"]
    iou_thr = const(float(attrs["iou_threshold"]), "float32")
    center = bool(attrs["center_point_box"])
    f32 = "float32"
    total, nsel, ncand, fin, keep, cur = (_local(k) for k in ("total", "nsel", "ncand", "fin", "keep", "cur"))
    order = _local("order", _I32, n, scope="global")
    tmp = _local("order_tmp", _I32, n, scope="global")
    b, c, a, i, j = (tir.Var(v, _I32) for v in ("b", "c", "a", "i", "j"))
    # the candidates (above the score threshold, strictly), best first; ties by box index (ONNX
    # Runtime's order): a stable sort of the indices in ascending order
    ok = binary("gt", cast(scores[b, c, i], f32), const(float(thr), f32)) if thr is not None else None
    gather = For(i, 0, n_rt, "serial", seq(_store(order, i, [ncand[0]]), _store(ncand, ncand[0] + 1, [0]))
                 if ok is None else IfThenElse(ok, seq(_store(order, i, [ncand[0]]), _store(ncand, ncand[0] + 1, [0]))))
    sort, sort_regs = _merge_sort(order, tmp, ncand[0], n,
                                  lambda u, v: binary("gt", cast(scores[b, c, u], f32), cast(scores[b, c, v], f32)))
    # does kept box j suppress candidate cur? (ONNX Runtime's SuppressByIOU, float32). The corners
    # and area of the candidate (``cand``) and of every kept box (``kept``, 5 floats a box) are
    # computed once; a pair whose boxes do not intersect -- most of them -- costs two compares
    cand = _local("cand", f32, 5)
    kept = _local("kept", f32, 5 * n, scope="global")
    ax0, ax1, ay0, ay1, area_a = (cand[q] for q in range(5))
    bx0, bx1, by0, by1, area_b = (kept[j * 5 + q] for q in range(5))
    ix0, ix1 = binary("max", ax0, bx0), binary("min", ax1, bx1)
    iy0, iy1 = binary("max", ay0, by0), binary("min", ay1, by1)
    inter = (ix1 - ix0) * (iy1 - iy0)
    union = area_a + area_b - inter
    zero = const(0.0, f32)
    suppress = (binary("gt", inter, zero) & binary("gt", area_a, zero) & binary("gt", area_b, zero)
                & binary("gt", union, zero)
                & binary("gt", select(binary("gt", union, zero), inter / union, zero), iou_thr))
    check = For(j, 0, nsel[0], "serial", IfThenElse(
        binary("ne", keep[0], 0) & binary("gt", ix1, ix0) & binary("gt", iy1, iy0),
        IfThenElse(suppress, _store(keep, 0, [0]))))
    cx0, cx1, cy0, cy1 = _corners(boxes, b, cur[0], center)
    corners = seq(*[_store(cand, v, [q]) for q, v in enumerate((cx0, cx1, cy0, cy1))],
                  _store(cand, (cand[1] - cand[0]) * (cand[3] - cand[2]), [4]))
    row = total[0]
    accept = seq(*[_store(kept, cand[q], [nsel[0] * 5 + q]) for q in range(5)],
                 _store(out, cast(b, "int64"), [row, 0]), _store(out, cast(c, "int64"), [row, 1]),
                 _store(out, cast(cur[0], "int64"), [row, 2]),
                 _store(nsel, nsel[0] + 1, [0]), _store(total, row + 1, [0]))
    step = IfThenElse(
        binary("eq", fin[0], 0),
        seq(_store(cur, order[a], [0]), corners, _store(keep, 1, [0]), check,
            IfThenElse(binary("ne", keep[0], 0), accept),
            IfThenElse(binary("ge", nsel[0], limit), _store(fin, 1, [0]))))
    per_class = seq(_store(ncand, 0, [0]), gather, sort,
                    _store(nsel, 0, [0]), _store(fin, int(limit == 0), [0]),
                    For(a, 0, ncand[0], "serial", step))
    body = seq(_store(total, 0, [0]),
               For(b, 0, nb, "serial", For(c, 0, nc, "serial", per_class)) if all(scores.shape) else None,
               _set_all([boxes, scores, out], [(out, 0)], total[0]))
    regs = [total, nsel, ncand, fin, keep, cur, order, tmp, cand, kept, *sort_regs]
    return _func(name, [boxes, scores, out], _alloc(regs, body))


# ----------------------------------------------------------------------------- unique
@register_prim_kernel("unique")
def _unique(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    (x,) = args
    if attrs.get("axis") is not None:
        return _unique_slices(attrs, x, outs, name)
    y, first, inv, counts = outs
    y, first, counts = (_reported(o, [0]) for o in (y, first, counts))
    n = x.size
    is_sorted = bool(attrs["sorted"])
    cnt, found = _local("cnt"), _local("found")
    # first-occurrence order goes straight to the outputs; sorted order through temporaries
    ty, tf, tc = ((_local("tv", x.dtype, n, "global"), _local("tf", "int64", n, "global"),
                   _local("tc", "int64", n, "global")) if is_sorted else (y, first, counts))
    rank = _local("rank", _I32, n, "global")
    exts = [runtime_extent(x, d) for d in range(x.ndim)]
    j = tir.Var("j", _I32)

    def visit(vs: list[tir.Var]) -> Stmt:
        f = _flat(vs, exts)
        v = x[tuple(vs)]
        search = For(j, 0, cnt[0], "serial",
                     IfThenElse(binary("lt", found[0], 0) & binary("eq", ty[j], v), _store(found, j, [0])))
        new = seq(_store(ty, v, [cnt[0]]), _store(tf, cast(f, "int64"), [cnt[0]]),
                  _store(tc, const(1, "int64"), [cnt[0]]), _store(inv, cast(cnt[0], "int64"), [f]),
                  _store(cnt, cnt[0] + 1, [0]))
        old = seq(_store(tc, tc[found[0]] + const(1, "int64"), [found[0]]),
                  _store(inv, cast(found[0], "int64"), [f]))
        return seq(_store(found, -1, [0]), search, IfThenElse(binary("lt", found[0], 0), new, old))

    stmts: list[Stmt] = [_store(cnt, 0, [0]), _nest(exts, visit)]
    bufs = [cnt, found]
    if is_sorted:
        k = tir.Var("k", _I32)
        r = tir.Var("r", _I32)
        # the unique values are distinct: a value's sorted position is how many are smaller
        count_smaller = For(k, 0, cnt[0], "serial",
                            IfThenElse(binary("lt", ty[k], ty[j]), _store(rank, rank[j] + 1, [j])))
        place = seq(_store(y, ty[j], [rank[j]]), _store(first, tf[j], [rank[j]]),
                    _store(counts, tc[j], [rank[j]]))
        stmts += [For(j, 0, cnt[0], "serial", seq(_store(rank, 0, [j]), count_smaller, place)),
                  For(r, 0, _flat_len(exts), "serial",
                      _store(inv, cast(rank[cast(inv[r], _I32)], "int64"), [r]))]
        bufs += [ty, tf, tc, rank]
    stmts.append(_set_all([x, y, first, inv, counts], [(y, 0), (first, 0), (counts, 0)], cnt[0]))
    return _func(name, [x, y, first, inv, counts], _alloc(bufs, seq(*stmts)))


def _unique_slices(attrs: dict, x: Buffer, outs: list, name: str) -> PrimFunc:
    """Unique of the slices of ``x`` along ``axis`` (same scheme as the flattened case; a slice
    compares element by element, sorted order is lexicographic in row-major order)."""
    axis = attrs["axis"] + (x.ndim if attrs["axis"] < 0 else 0)
    y, first, inv, counts = outs
    y = _reported(y, [axis])
    first, counts = (_reported(o, [0]) for o in (first, counts))
    n = x.shape[axis]
    is_sorted = bool(attrs["sorted"])
    cnt, found, flag = _local("cnt"), _local("found"), _local("flag")
    ty = Buffer("tv", x.shape, x.dtype) if is_sorted else y
    tf, tc = ((_local("tf", "int64", n, "global"), _local("tc", "int64", n, "global")) if is_sorted
              else (first, counts))
    rank = _local("rank", _I32, n, "global")
    exts = [runtime_extent(x, d) if d != axis else const(1, _I32) for d in range(x.ndim)]
    i, j, k = (tir.Var(v, _I32) for v in ("i", "j", "k"))

    def over_slice(fn: Callable[[Callable[[Any], tuple]], Stmt]) -> Stmt:
        """Loops over one slice's elements; ``fn(at)`` with ``at(p)`` the index at axis position p."""
        def body(vs: list[tir.Var]) -> Stmt:
            def at(pos: Any) -> tuple:
                q = list(vs)
                q[axis] = pos
                return tuple(q)
            return fn(at)
        return _nest(exts, body, "e")

    same = over_slice(lambda at: IfThenElse(binary("ne", x[at(i)], ty[at(j)]), _store(flag, 0, [0])))
    search = For(j, 0, cnt[0], "serial", IfThenElse(binary("lt", found[0], 0), seq(
        _store(flag, 1, [0]), same, IfThenElse(binary("ne", flag[0], 0), _store(found, j, [0])))))
    new = seq(over_slice(lambda at: _store(ty, x[at(i)], at(cnt[0]))),
              _store(tf, cast(i, "int64"), [cnt[0]]), _store(tc, const(1, "int64"), [cnt[0]]),
              _store(inv, cast(cnt[0], "int64"), [i]), _store(cnt, cnt[0] + 1, [0]))
    old = seq(_store(tc, tc[found[0]] + const(1, "int64"), [found[0]]),
              _store(inv, cast(found[0], "int64"), [i]))
    stmts: list[Stmt] = [_store(cnt, 0, [0]), For(i, 0, runtime_extent(x, axis), "serial", seq(
        _store(found, -1, [0]), search, IfThenElse(binary("lt", found[0], 0), new, old)))]
    bufs = [cnt, found, flag]
    if is_sorted:
        # flag: 0 while slices k and j agree so far, -1 once k < j, 1 once k > j
        cmp = over_slice(lambda at: IfThenElse(
            binary("eq", flag[0], 0) & binary("ne", ty[at(k)], ty[at(j)]),
            _store(flag, select(binary("lt", ty[at(k)], ty[at(j)]), const(-1, _I32), const(1, _I32)), [0])))
        count_smaller = For(k, 0, cnt[0], "serial", seq(
            _store(flag, 0, [0]), cmp, IfThenElse(binary("lt", flag[0], 0), _store(rank, rank[j] + 1, [j]))))
        place = seq(over_slice(lambda at: _store(y, ty[at(j)], at(rank[j]))),
                    _store(first, tf[j], [rank[j]]), _store(counts, tc[j], [rank[j]]))
        stmts += [For(j, 0, cnt[0], "serial", seq(_store(rank, 0, [j]), count_smaller, place)),
                  For(i, 0, runtime_extent(x, axis), "serial",
                      _store(inv, cast(rank[cast(inv[i], _I32)], "int64"), [i]))]
        bufs += [ty, tf, tc, rank]
    params = [x, y, first, inv, counts]
    stmts.append(_set_all(params, [(y, axis), (first, 0), (counts, 0)], cnt[0]))
    return _func(name, params, _alloc(bufs, seq(*stmts)))


def _flat_len(exts: Sequence[Any]) -> Any:
    n: Any = const(1, _I32)
    for e in exts:
        n = n * e
    return n


# ----------------------------------------------------------------------------- topk, run-time k
@register_prim_kernel("topk_runtime_k")
def _topk_runtime_k(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    x, kbuf = args
    axis = attrs["axis"] + (x.ndim if attrs["axis"] < 0 else 0)
    vals, idxs = (_reported(o, [axis]) for o in outs)
    n = x.shape[axis]
    # a symbolic axis (the NonZero count of a detection head's scores) is sorted to its
    # runtime extent; its upper bound n sizes the scratch buffers
    n_rt = runtime_extent(x, axis)
    largest = bool(attrs["largest"])
    order, tmp = _local("order", _I32, n, "global"), _local("order_tmp", _I32, n, "global")
    kk = _local("kk")
    # k as given is reported (the executor rejects one outside 0..n); the loops use it clamped.
    # A k past a smaller runtime extent is reported as n + 1, which the executor rejects too
    # (ONNX: k must not exceed the axis)
    k64 = cast(kbuf[tuple(0 for _ in range(kbuf.ndim))], "int64")
    n_rt64 = cast(n_rt, "int64")
    kc = cast(binary("min", binary("max", k64, const(0, "int64")), n_rt64), _I32)
    k_rep = select(binary("gt", k64, n_rt64), binary("max", k64, const(n + 1, "int64")), k64)
    exts = [runtime_extent(x, d) if d != axis else const(1, _I32) for d in range(x.ndim)]
    i, j = tir.Var("i", _I32), tir.Var("j", _I32)
    regs: list[Buffer] = []

    def row(vs: list[tir.Var]) -> Stmt:
        def at(pos: Any) -> tuple:
            p = list(vs)
            p[axis] = pos
            return tuple(p)

        # best first, ties by index (ONNX): a stable sort of the indices in ascending order
        sort, sort_regs = _merge_sort(order, tmp, n_rt, n,
                                      lambda u, v: binary("gt" if largest else "lt", x[at(u)], x[at(v)]))
        regs[:] = sort_regs
        pick = seq(_store(vals, x[at(order[j])], at(j)), _store(idxs, cast(order[j], "int64"), at(j)))
        return seq(For(i, 0, n_rt, "serial", _store(order, i, [i])), sort, For(j, 0, kk[0], "serial", pick))

    params = [x, kbuf, vals, idxs]
    nest = _nest(exts, row, "o")
    body = seq(_store(kk, kc, [0]), nest, _set_all(params, [(vals, axis), (idxs, axis)], k_rep))
    return _func(name, params, _alloc([order, tmp, kk, *regs], body))


# ----------------------------------------------------------------------------- range, run-time bounds
@register_prim_kernel("range_runtime")
def _range_runtime(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    start, limit, delta = (b[tuple(0 for _ in range(b.ndim))] for b in args)
    out = _reported(outs[0], [0])
    hi = attrs["max_length"]
    f64 = "float64"
    s, lim, d = (cast(v, f64) for v in (start, limit, delta))
    # ceil((limit - start) / delta), at least 0; a zero delta or a count past max_length is
    # reported as max_length + 1, which the executor rejects with the dim's range
    nf: Any = tir.Call(f64, "ceil", [(lim - s) / d])
    over = const(float(hi + 1), f64)
    nf = select(binary("eq", d, const(0.0, f64)) | logical_not(binary("le", nf, over)), over,
                binary("max", nf, const(0.0, f64)))
    cnt = _local("cnt", "int64")
    i = tir.Var("i", _I32)
    dt = outs[0].dtype
    val = cast(start, dt) + cast(i, dt) * cast(delta, dt) if dt not in ("int8", "int16", "uint8", "uint16") else \
        cast(cast(start, _I32) + i * cast(delta, _I32), dt)
    body = seq(_store(cnt, cast(nf, "int64"), [0]),
               For(i, 0, cast(binary("min", cnt[0], const(hi, "int64")), _I32), "serial",
                   _store(out, val, [i])),
               _set_all([*args, out], [(out, 0)], cnt[0]))
    return _func(name, [*args, out], _alloc([cnt], body))


# ----------------------------------------------------------------------------- dim_value
@register_compute("dim_value")
def _dim_value(attrs: dict, inputs: list, out_types: list) -> list:
    """The value of a symbolic dim expression, from the runtime extents of the inputs that carry
    its symbols (their data is never read; being arguments makes their extents known)."""
    from .. import te
    from ..runtime import sym

    env: dict[str, Any] = {}
    for s, i, k in attrs["sources"]:
        v = inputs[i].dyn[k] if inputs[i].dyn is not None else None
        env[s] = te.cast(v, "int64") if v is not None else te.const(int(inputs[i].shape[k]), "int64")
    value = sym.expand(attrs["dim"], env)
    return [te.compute((1,), lambda i: te.cast(value, "int64"), name="dim_value", tag="injective")]
