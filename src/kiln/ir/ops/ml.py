"""IR ops of classical ML models whose tables are compile-time constants: n-gram counting
(ONNX ``TfIdfVectorizer``) and tree-ensemble evaluation (``ai.onnx.ml.TreeEnsemble``).

Both ops take their tables (the n-gram pool, the tree nodes and leaves) as *inputs*, which the
ONNX frontend (``kiln/frontend/onnx/ops_ml.py``) builds as constants from the node's attributes
after validating them; the generated kernels (``kiln.topi.ml``, loop IR) read them as parameters
and loop over them, so a model with thousands of n-grams or tree nodes compiles to one small
kernel rather than unrolled code. The table layouts are documented on each op below and in
``docs/ir.md``.

The type relations check the table shapes and dtypes; the values are the frontend's to
validate (the references raise on bad ones; the kernels skip entries they cannot use rather
than read or write outside a buffer).

Imports only the IR types and the op registry.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType
from ._util import Attrs

__all__ = ["TREE_MODES", "TREE_AGGREGATES", "TREE_NODE_FIELDS"]


def _batch_sym(t: TensorType) -> Any:
    """The symbolic batch dim (axis 0) of a 2-D ``t``; InputError for any other symbolic dim."""
    dims = t.dims
    if any(isinstance(d, str) for d in dims[1:]):
        raise InputError(f"only a symbolic batch dim (axis 0) is supported, got dims {dims}")
    return dims[0] if isinstance(dims[0], str) else None


# ----------------------------------------------------------------------------- n-gram counting
def _ngram_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x, pool, plen, pcol = ts
    if x.dtype not in ("int32", "int64"):
        raise InputError(f"x must be int32 or int64, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise InputError(f"x must be 1-D [C] or 2-D [N, C], got shape {x.shape}")
    if pool.ndim != 2 or pool.dtype != "int64":
        raise InputError(f"pool must be a 2-D int64 table [G, L], got {pool.dtype}{list(pool.shape)}")
    for t, what in ((plen, "pool_len"), (pcol, "pool_col")):
        if t.ndim != 1 or t.dtype != "int32" or t.shape[0] != pool.shape[0]:
            raise InputError(
                f"{what} must be int32 [{pool.shape[0]}] (one entry per pool row), got {t.dtype}{list(t.shape)}"
            )
    if attrs["num_cols"] < 1:
        raise InputError(f"num_cols must be >= 1, got {attrs['num_cols']}")
    if attrs["max_skip_count"] < 0:
        raise InputError(f"max_skip_count must be >= 0, got {attrs['max_skip_count']}")
    shape = (attrs["num_cols"],) if x.ndim == 1 else (x.shape[0], attrs["num_cols"])
    return [TensorType(shape, "float32")]


def _ngram_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    x = ts[0]
    if any(t.sym is not None for t in ts[1:]):
        raise InputError("the n-gram tables must have static shapes")
    if x.ndim == 1:  # the row length does not reach the output
        return [None]
    n = x.dims[0] if isinstance(x.dims[0], str) else None
    return [None if n is None else (n, None)]


def _ngram_counts(
    x: np.ndarray, pool: np.ndarray, pool_len: np.ndarray, pool_col: np.ndarray, num_cols: int, max_skip_count: int
) -> np.ndarray:
    """How often each pool n-gram occurs in each row of ``x``, summed into its output column.

    An n-gram of length ``n`` occurs at start ``s`` with skip distance ``d`` when
    ``x[s + d*k] == gram[k]`` for ``k < n``; ``d`` runs over ``1 .. max_skip_count + 1`` for
    n >= 2 and is 1 for unigrams (they are counted once, as ONNX specifies). Pool rows whose
    length is outside ``1..L`` or whose column is outside ``0..num_cols-1`` count nothing.

    Returns
    -------
    numpy.ndarray
        float32 ``[num_cols]`` for a 1-D ``x``, ``[N, num_cols]`` for a 2-D one.
    """
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    c = rows.shape[1]
    out = np.zeros((rows.shape[0], num_cols), np.float32)
    for g in range(pool.shape[0]):
        n, col = int(pool_len[g]), int(pool_col[g])
        if not (1 <= n <= pool.shape[1] and 0 <= col < num_cols):
            continue
        gram = pool[g, :n].astype(np.int64)
        for d in (1,) if n == 1 else range(1, max_skip_count + 2):
            span = d * (n - 1)
            if span >= c:
                continue
            hit = np.ones((rows.shape[0], c - span), bool)
            for k in range(n):
                hit &= rows[:, k * d : c - span + k * d].astype(np.int64) == gram[k]
            out[:, col] += hit.sum(axis=1)
    return out.reshape(num_cols) if x.ndim == 1 else out


def _ngram_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, pool, plen, pcol = xs
    return [_ngram_counts(x, pool, plen, pcol, attrs["num_cols"], attrs["max_skip_count"])]


register_op(
    "ngram_count",
    attrs={"num_cols": ("int", REQUIRED), "max_skip_count": ("int", 0)},
    type_rel=_ngram_rel,
    pattern=OpPattern.OPAQUE,
    ref=_ngram_ref,
    num_inputs=4,
    inputs=("x", "pool", "pool_len", "pool_col"),
    sym_rel=_ngram_sym,
    doc="float32 counts [N?, num_cols] of the n-grams of pool (int64 [G, L], row g's first "
    "pool_len[g] entries) in each row of x, n-gram g adding to column pool_col[g]; skips "
    "up to max_skip_count between items (ONNX TfIdfVectorizer before weighting)",
)


# ----------------------------------------------------------------------------- tree ensemble
#: Node comparison modes, by their ``ai.onnx.ml.TreeEnsemble`` number (``nodes_modes``).
TREE_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER")
#: Aggregate functions, by their ``ai.onnx.ml.TreeEnsemble`` number (``aggregate_function``).
TREE_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
#: Columns of the int32 ``nodes`` table of ``tree_ensemble``. A child (``true``, ``false``) or
#: a root is a node index when >= 0 and the leaf ``-1 - child`` when < 0; ``member_begin`` /
#: ``member_end`` delimit the node's set in ``members`` (empty unless mode is BRANCH_MEMBER).
TREE_NODE_FIELDS = ("feature", "mode", "true", "false", "missing_true", "member_begin", "member_end")


def _tree_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    x, nodes, splits, members, roots, lw, lt = ts
    if x.dtype not in ("float32", "float64") or x.ndim != 2:
        raise InputError(f"x must be a 2-D float32 or float64 tensor [N, F], got {x.dtype}{list(x.shape)}")
    m = nodes.shape[0] if nodes.ndim == 2 else -1
    if nodes.dtype != "int32" or nodes.ndim != 2 or nodes.shape[1] != len(TREE_NODE_FIELDS):
        raise InputError(
            f"nodes must be an int32 table [M, {len(TREE_NODE_FIELDS)}] "
            f"({', '.join(TREE_NODE_FIELDS)}), got {nodes.dtype}{list(nodes.shape)}"
        )
    for t, what, n in ((splits, "splits", m), (members, "members", None)):
        if t.dtype not in ("float32", "float64") or t.ndim != 1 or (n is not None and t.shape[0] != n):
            raise InputError(
                f"{what} must be a 1-D float table{f' [{n}]' if n is not None else ''}, got {t.dtype}{list(t.shape)}"
            )
    if roots.dtype != "int32" or roots.ndim != 1 or roots.shape[0] < 1:
        raise InputError(f"roots must be int32 [T] with T >= 1, got {roots.dtype}{list(roots.shape)}")
    if lw.dtype not in ("float32", "float64") or lw.ndim != 1:
        raise InputError(f"leaf_weights must be a 1-D float table, got {lw.dtype}{list(lw.shape)}")
    if lt.dtype != "int32" or lt.shape != lw.shape:
        raise InputError(f"leaf_targets must be int32 {list(lw.shape)}, got {lt.dtype}{list(lt.shape)}")
    if attrs["n_targets"] < 1:
        raise InputError(f"n_targets must be >= 1, got {attrs['n_targets']}")
    if attrs["aggregate"] not in TREE_AGGREGATES:
        raise InputError(f"aggregate must be one of {', '.join(TREE_AGGREGATES)}, got {attrs['aggregate']!r}")
    if attrs["max_depth"] < 0:
        raise InputError(f"max_depth must be >= 0, got {attrs['max_depth']}")
    return [TensorType((x.shape[0], attrs["n_targets"]), x.dtype)]


def _tree_sym(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[Any]:
    if any(t.sym is not None for t in ts[1:]):
        raise InputError("the tree tables must have static shapes")
    n = _batch_sym(ts[0])
    return [None if n is None else (n, None)]


def _wide(*dtypes: str) -> Any:
    return np.float64 if "float64" in dtypes else np.float32


def _tree_leaf(
    row: np.ndarray,
    root: int,
    nodes: np.ndarray,
    splits: np.ndarray,
    members: np.ndarray,
    max_depth: int,
    nan_follows_missing: bool,
) -> int:
    """The leaf index a tree starting at ``root`` sends ``row`` to, or -1 if the walk does not end
    at a leaf within ``max_depth`` comparisons (the kernel then adds nothing for that tree)."""
    wide = _wide(str(row.dtype), str(splits.dtype), str(members.dtype))
    cur = root
    for _ in range(max_depth):
        if cur < 0:
            break
        if cur >= len(nodes):
            return -1
        feat, mode, t, f, miss, mb, me = (int(v) for v in nodes[cur])
        if not 0 <= feat < len(row):
            return -1
        v = wide(row[feat])
        s = wide(splits[cur])
        if mode == 6:
            cond = bool(np.any(members[max(mb, 0) : max(me, 0)].astype(wide) == v))
        else:
            cond = bool((v <= s, v < s, v >= s, v > s, v == s, v != s)[mode]) if 0 <= mode < 6 else False
        if nan_follows_missing and np.isnan(v):
            cond = miss != 0
        cond = cond or (miss != 0 and bool(np.isnan(v)))
        cur = t if cond else f
    return -1 - cur if cur < 0 else -1


def _tree_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, nodes, splits, members, roots, lw, lt = xs
    k, agg = attrs["n_targets"], attrs["aggregate"]
    dt = x.dtype
    wide = _wide(str(dt), str(lw.dtype))
    if agg in ("SUM", "AVERAGE"):
        out = np.zeros((x.shape[0], k), dt)
    else:
        out = np.full((x.shape[0], k), np.finfo(dt).max if agg == "MIN" else np.finfo(dt).min, dt)
    n_trees = lw.dtype.type(len(roots))
    for r in range(x.shape[0]):
        for root in roots:
            leaf = _tree_leaf(x[r], int(root), nodes, splits, members, attrs["max_depth"], attrs["nan_follows_missing"])
            if not 0 <= leaf < len(lw) or not 0 <= lt[leaf] < k:
                continue
            w, t = lw[leaf], int(lt[leaf])
            if agg == "SUM":
                out[r, t] = wide(out[r, t]) + wide(w)
            elif agg == "AVERAGE":
                out[r, t] = wide(out[r, t]) + wide(w / n_trees)
            elif agg == "MIN":
                out[r, t] = min(wide(out[r, t]), wide(w))
            else:
                out[r, t] = max(wide(out[r, t]), wide(w))
    return [out]


register_op(
    "tree_ensemble",
    attrs={
        "n_targets": ("int", REQUIRED),
        "aggregate": ("str", "SUM"),
        "max_depth": ("int", REQUIRED),
        "nan_follows_missing": ("bool", False),
    },
    type_rel=_tree_rel,
    pattern=OpPattern.OPAQUE,
    ref=_tree_ref,
    num_inputs=7,
    inputs=("x", "nodes", "splits", "members", "roots", "leaf_weights", "leaf_targets"),
    sym_rel=_tree_sym,
    doc="[N, n_targets] aggregate (SUM, AVERAGE, MIN, MAX) over the trees of the leaf weights each "
    "row of x reaches, walking at most max_depth nodes from each root; the tables' layout is "
    "kiln.ir.ops.ml.TREE_NODE_FIELDS; a leaf targeting no column adds nothing. A NaN feature also takes "
    "the true branch where missing_true is set, or, with nan_follows_missing, exactly there "
    "(ai.onnx.ml TreeEnsemble / TreeEnsembleRegressor before post_transform)",
)
