"""Loop-IR kernels of the constant-table ML ops (``kiln.ir.ops.ml``): ``ngram_count`` and
``tree_ensemble``.

Both walk tables that arrive as parameters (constants the frontend built) with loops whose
extents are read from those tables, which a tensor expression cannot state: an n-gram's length
bounds its comparison loop, a tree walk follows child indices. They are written directly as
loop IR (:func:`~kiln.topi.registry.register_prim_kernel`), serial, one output row at a time.
An entry the kernel cannot use (a length or column out of range, a child outside the node
table, a leaf target outside the output) is skipped, so a bad table never reads or writes
outside a buffer; the references in ``kiln.ir.ops.ml`` skip the same entries.

Imports only the loop IR and the kernel registry; never a code generator or the executor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import tir
from ..tir.expr import binary, cast, const, select
from ..tir.stmt import Allocate, Buffer, BufferStore, For, IfThenElse, LetStmt, PrimFunc, Stmt, seq
from .data_dependent import runtime_extent as _ext
from .registry import register_prim_kernel

__all__: list[str] = []

_I32 = "int32"




def _local(name: str, dtype: str = _I32) -> Buffer:
    return Buffer(name, (1,), dtype, scope="local")


def _set(b: Buffer, value: Any, *idx: Any) -> BufferStore:
    return BufferStore(b, const(value, b.dtype) if isinstance(value, (int, float)) else value, list(idx))


def _in(v: Any, lo: int, hi: Any) -> Any:
    """``lo <= v < hi``."""
    return binary("ge", v, const(lo, _I32)) & binary("lt", v, hi)


def _func(name: str, params: list[Buffer], locals_: list[Buffer], body: Stmt) -> PrimFunc:
    for b in reversed(locals_):
        body = Allocate(b, body)
    return PrimFunc(name, params, body, {"global_symbol": name})


# ----------------------------------------------------------------------------- ngram_count
@register_prim_kernel("ngram_count")
def _ngram_count(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    x, pool, plen, pcol = args
    (out,) = outs
    k_cols = attrs["num_cols"]
    max_len = pool.shape[1]
    n_dist = attrs["max_skip_count"] + 1
    batched = x.ndim == 2
    rows = _ext(x, 0) if batched else const(1, _I32)
    c = _ext(x, x.ndim - 1)
    flag = _local("flag")
    r, g, d, s, t, k = (tir.Var(v, _I32) for v in ("r", "g", "d", "s", "t", "k"))

    def xat(i: Any) -> Any:
        return x[r, i] if batched else x[i]

    def oat(col: Any) -> tuple:
        return (r, col) if batched else (col,)

    n, col = plen[g], pcol[g]
    dist = d + 1
    span = dist * (n - 1)
    # x[s + dist*t] == pool[g, t] for every t < n; the n-th item is inside the row (s + span < c)
    compare = For(
        t, 0, n, "serial", IfThenElse(binary("ne", cast(xat(s + dist * t), "int64"), pool[g, t]), _set(flag, 0, 0))
    )
    at_start = IfThenElse(
        binary("lt", s + span, c),
        seq(
            _set(flag, 1, 0),
            compare,
            IfThenElse(
                binary("ne", flag[0], 0), BufferStore(out, out[oat(col)] + const(1.0, "float32"), list(oat(col)))
            ),
        ),
    )
    # unigrams are counted once, not once per skip distance (ONNX)
    per_dist = IfThenElse(binary("eq", d, 0) | binary("gt", n, 1), For(s, 0, c, "serial", at_start))
    usable = binary("ge", n, const(1, _I32)) & binary("le", n, const(max_len, _I32)) & _in(col, 0, const(k_cols, _I32))
    per_gram = IfThenElse(usable, For(d, 0, n_dist, "serial", per_dist))
    row = seq(
        For(k, 0, k_cols, "serial", _set(out, 0.0, *oat(k))),
        For(g, 0, pool.shape[0], "serial", per_gram) if pool.shape[0] and max_len else None,
    )
    body = For(r, 0, rows, "serial", row)
    return _func(name, [x, pool, plen, pcol, out], [flag], body)


# ----------------------------------------------------------------------------- tree_ensemble
def _wide(*dtypes: str) -> str:
    return "float64" if "float64" in dtypes else "float32"


@register_prim_kernel("tree_ensemble")
def _tree_ensemble(attrs: dict, args: list, outs: list, name: str, target: Any) -> PrimFunc:
    x, nodes, splits, members, roots, lw, lt = args
    (out,) = outs
    k_cols, agg, depth = attrs["n_targets"], attrs["aggregate"], attrs["max_depth"]
    n_nodes, n_feat, n_leaves = nodes.shape[0], x.shape[1], lw.shape[0]
    cmp_dt = _wide(x.dtype, splits.dtype, members.dtype)
    acc_dt = _wide(x.dtype, lw.dtype)
    cur, hit = _local("cur"), _local("hit")
    r, tr, step, j, k = (tir.Var(v, _I32) for v in ("r", "tr", "step", "j", "k"))

    node = cur[0]
    feat = nodes[node, 0]
    # the node's fields are read once per visit, not once per mode tested
    v, split, mode = tir.Var("v", cmp_dt), tir.Var("split", cmp_dt), tir.Var("mode", _I32)
    cond: Any = const(False, "bool")
    for m, op in enumerate(("le", "lt", "ge", "gt", "eq", "ne")):
        cond = cond | (binary("eq", mode, const(m, _I32)) & binary(op, v, split))
    find: Stmt | None = None
    if members.shape[0]:
        begin = nodes[node, 5]
        at = begin + j
        find = seq(
            _set(hit, 0, 0),
            For(
                j,
                0,
                nodes[node, 6] - begin,
                "serial",
                IfThenElse(
                    _in(at, 0, const(members.shape[0], _I32)),
                    IfThenElse(binary("eq", cast(members[at], cmp_dt), v), _set(hit, 1, 0)),
                ),
            ),
        )
        cond = cond | (binary("eq", mode, const(6, _I32)) & binary("ne", hit[0], 0))
    missing_true, nan = binary("ne", nodes[node, 4], 0), tir.Call("bool", "isnan", [v])
    # nan_follows_missing (TreeEnsembleRegressor): a NaN goes where missing_true says, whatever
    # the comparison; else (TreeEnsemble) missing_true only adds the true branch for a NaN
    cond = select(nan, missing_true, cond) if attrs["nan_follows_missing"] else cond | (missing_true & nan)
    visit = LetStmt(
        v,
        cast(x[r, feat], cmp_dt),
        LetStmt(
            split,
            cast(splits[node], cmp_dt),
            LetStmt(mode, nodes[node, 1], seq(find, _set(cur, select(cond, nodes[node, 2], nodes[node, 3]), 0))),
        ),
    )
    # a feature outside x ends the walk without a leaf (the tree adds nothing)
    step_stmt = IfThenElse(
        _in(node, 0, const(n_nodes, _I32)), IfThenElse(_in(feat, 0, const(n_feat, _I32)), visit, _set(cur, n_nodes, 0))
    )
    walk = For(step, 0, depth, "serial", step_stmt) if depth and n_nodes else None

    leaf = const(-1, _I32) - cur[0]
    tgt = lt[leaf]
    o = out[r, tgt]
    w = lw[leaf]
    if agg == "AVERAGE":  # each leaf's share, in the weights' type (what ONNX's reference does)
        w = w / const(float(roots.shape[0]), lw.dtype)
    new = {
        "SUM": lambda a, b: a + b,
        "AVERAGE": lambda a, b: a + b,
        "MIN": lambda a, b: binary("min", a, b),
        "MAX": lambda a, b: binary("max", a, b),
    }[agg](cast(o, acc_dt), cast(w, acc_dt))
    add = IfThenElse(
        binary("lt", cur[0], 0) & binary("lt", leaf, const(n_leaves, _I32)),
        IfThenElse(_in(tgt, 0, const(k_cols, _I32)), BufferStore(out, cast(new, out.dtype), [r, tgt])),
    )
    per_tree = seq(_set(cur, roots[tr], 0), walk, add)
    fdt = np.finfo(np.dtype(out.dtype))
    init = {"MIN": float(fdt.max), "MAX": float(fdt.min)}.get(agg, 0.0)
    row = seq(For(k, 0, k_cols, "serial", _set(out, init, r, k)), For(tr, 0, roots.shape[0], "serial", per_tree))
    body = For(r, 0, _ext(x, 0), "serial", row)
    return _func(name, [x, nodes, splits, members, roots, lw, lt, out], [cur, hit], body)
