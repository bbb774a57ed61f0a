"""Converters for the ``ai.onnx.ml`` domain (classical ML operators), built from IR ops.

Registered as ``"ai.onnx.ml.<OpType>"`` (see :func:`~kiln.frontend.onnx.converter.onnx_op`).
TreeEnsemble's attributes become the constant tables of the ``tree_ensemble`` IR op
(``kiln.ir.ops.ml``), validated here. LabelEncoder lives in ``ops_string.py``.
"""

from __future__ import annotations

import numpy as np

from ...ir.ops.ml import TREE_AGGREGATES, TREE_MODES
from .converter import Context, onnx_op

_NUMERIC = ("float32", "float64", "int32", "int64")


@onnx_op("ai.onnx.ml.Binarizer")
def _binarizer(ctx: Context, node, ins, attrs):
    """``1`` where ``x > threshold``, else ``0``, in the input's type."""
    x = ins[0]
    if x.dtype not in _NUMERIC:
        raise ctx.bad(f"input must be one of {', '.join(_NUMERIC)}, got {x.dtype}")
    thr = ctx.const(np.array(attrs.get("threshold", 0.0), dtype=np.dtype(x.dtype)))
    return ctx.cast(ctx.emit1("greater", x, thr), x.dtype)


@onnx_op("ai.onnx.ml.ArrayFeatureExtractor")
def _array_feature_extractor(ctx: Context, node, ins, attrs):
    """The columns ``Y`` (int64 indices into the last axis) of ``X``; a 1-D ``X`` is one row."""
    x, idx = ins
    if idx.dtype != "int64":
        raise ctx.bad(f"indices must be int64, got {idx.dtype}")
    if len(x.shape) == 0:
        raise ctx.bad("X must have at least one dimension")
    if len(x.shape) == 1:
        x = ctx.reshape(x, (1,) + tuple(x.shape))
    flat = ctx.reshape(idx, (int(np.prod(idx.shape, dtype=np.int64)),))
    return ctx.emit1("take", x, flat, axis=len(x.shape) - 1)


# ----------------------------------------------------------------------------- TreeEnsemble
#: post_transform values of ai.onnx.ml tree ensembles, by number; the ones Kiln applies map to
#: the IR op that does it
_POST = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
_POST_OPS = {"SOFTMAX": "softmax", "LOGISTIC": "sigmoid"}
_MEMBER = TREE_MODES.index("BRANCH_MEMBER")


def _float_table(ctx: Context, attrs, name: str) -> np.ndarray:
    """A float tensor attribute as a 1-D float32/float64 array (float16 widened to float32)."""
    arr = np.asarray(attrs[name]).reshape(-1)
    if arr.dtype.kind != "f":
        raise ctx.bad(f"attribute {name!r} must be a float tensor, got {arr.dtype}")
    return arr if arr.dtype in (np.float32, np.float64) else arr.astype(np.float32)


def _ints(ctx: Context, attrs, name: str, n: int | None, lo: int, hi: int, what: str) -> list[int]:
    """An ints attribute of length ``n`` (any length when None) with every entry in ``lo..hi-1``."""
    vals = [int(v) for v in np.asarray(attrs[name]).reshape(-1)]
    if n is not None and len(vals) != n:
        raise ctx.bad(f"attribute {name!r} has {len(vals)} entries; expected {n} (one per {what})")
    bad = [(i, v) for i, v in enumerate(vals) if not lo <= v < hi]
    if bad:
        i, v = bad[0]
        raise ctx.bad(f"attribute {name!r}[{i}] = {v} is out of range; expected {lo} <= value < {hi}")
    return vals


def _tree_depth(ctx: Context, root: int, child: list[tuple[int, int]], memo: dict[int, int]) -> int:
    """How many comparisons the longest path from node ``root`` to a leaf makes (``child[i]``:
    node i's children, a leaf as ``-1 - leaf``); InputError for a cycle."""
    stack, on_path = [root], {root}
    while stack:
        i = stack[-1]
        pending = [c for c in child[i] if c >= 0 and c not in memo]
        for c in pending:
            if c in on_path:
                raise ctx.bad(f"the trees contain a cycle through node {c}")
        if pending:
            stack.append(pending[0])
            on_path.add(pending[0])
            continue
        memo[i] = 1 + max(memo[c] if c >= 0 else 0 for c in child[i])
        stack.pop()
        on_path.discard(i)
    return memo[root]


@onnx_op("ai.onnx.ml.TreeEnsemble")
def _tree_ensemble(ctx: Context, node, ins, attrs):
    """A tree ensemble over ``X [N, F]`` (float32/float64): per row, each tree's leaf weight adds
    to (or bounds) its target; ``[N, n_targets]`` in X's type, then ``post_transform``."""
    x = ins[0]
    if x.dtype not in ("float32", "float64"):
        raise ctx.unsupported(f"input X must be float32 or float64, got {x.dtype}")
    if len(x.shape) != 2:
        raise ctx.bad(f"input X must be 2-D [N, F], got shape {tuple(x.shape)}")
    n_feat = int(x.shape[1])
    feats = _ints(ctx, attrs, "nodes_featureids", None, 0, n_feat, "node")
    m = len(feats)
    if m == 0:
        raise ctx.bad("attribute 'nodes_featureids' is empty: the ensemble needs at least one node")
    modes = _ints(ctx, attrs, "nodes_modes", m, 0, len(TREE_MODES), "node")
    splits = _float_table(ctx, attrs, "nodes_splits")
    if len(splits) != m:
        raise ctx.bad(f"attribute 'nodes_splits' has {len(splits)} entries; expected {m} (one per node)")
    weights = _float_table(ctx, attrs, "leaf_weights")
    n_leaves = len(weights)
    if n_leaves == 0:
        raise ctx.bad("attribute 'leaf_weights' is empty: the ensemble needs at least one leaf")
    raw_targets = [int(v) for v in attrs["leaf_targetids"]]
    n_targets = int(attrs.get("n_targets", max(raw_targets, default=0) + 1))
    if n_targets < 1:
        raise ctx.bad(f"n_targets must be >= 1, got {n_targets}")
    targets = _ints(ctx, attrs, "leaf_targetids", n_leaves, 0, n_targets, "leaf")
    children = []
    for side in ("true", "false"):
        is_leaf = _ints(ctx, attrs, f"nodes_{side}leafs", m, 0, 2, "node")
        ids = [int(v) for v in attrs[f"nodes_{side}nodeids"]]
        if len(ids) != m:
            raise ctx.bad(f"attribute 'nodes_{side}nodeids' has {len(ids)} entries; expected {m} (one per node)")
        for i, (leaf, c) in enumerate(zip(is_leaf, ids)):
            if not 0 <= c < (n_leaves if leaf else m):
                raise ctx.bad(
                    f"nodes_{side}nodeids[{i}] = {c} is not a {'leaf' if leaf else 'node'} index "
                    f"(0..{(n_leaves if leaf else m) - 1})"
                )
        children.append([-1 - c if leaf else c for leaf, c in zip(is_leaf, ids)])
    missing = (
        _ints(ctx, attrs, "nodes_missing_value_tracks_true", m, 0, 2, "node")
        if "nodes_missing_value_tracks_true" in attrs
        else [0] * m
    )
    # BRANCH_MEMBER sets, NaN-delimited, in the order their nodes appear (the ONNX spec)
    n_member = modes.count(_MEMBER)
    members = _float_table(ctx, attrs, "membership_values") if "membership_values" in attrs else np.zeros(0, x.dtype)
    ends = np.flatnonzero(np.isnan(members))
    if len(ends) != n_member:
        raise ctx.bad(
            f"membership_values holds {len(ends)} NaN-delimited sets; expected one per BRANCH_MEMBER node ({n_member})"
        )
    bounds = [(0 if k == 0 else int(ends[k - 1]) + 1, int(ends[k])) for k in range(n_member)]
    member_at = iter(bounds)
    table = np.zeros((m, 7), np.int32)
    for i in range(m):
        mb, me = next(member_at) if modes[i] == _MEMBER else (0, 0)
        table[i] = (feats[i], modes[i], children[0][i], children[1][i], missing[i], mb, me)
    roots = _ints(ctx, attrs, "tree_roots", None, 0, m, "tree")
    if not roots:
        raise ctx.bad("attribute 'tree_roots' is empty: the ensemble needs at least one tree")
    memo: dict[int, int] = {}
    pairs = list(zip(children[0], children[1]))
    root_ids, depth = [], 0
    for r in roots:
        t, f = children[0][r], children[1][r]
        if t < 0 and t == f:  # a tree that is one leaf: both branches name the same leaf
            root_ids.append(t)
            continue
        root_ids.append(r)
        depth = max(depth, _tree_depth(ctx, r, pairs, memo))
    agg = int(attrs.get("aggregate_function", 1))
    if not 0 <= agg < len(TREE_AGGREGATES):
        raise ctx.bad(
            f"aggregate_function must be 0..{len(TREE_AGGREGATES) - 1} ({', '.join(TREE_AGGREGATES)}), got {agg}"
        )
    post = int(attrs.get("post_transform", 0))
    if not 0 <= post < len(_POST):
        raise ctx.bad(f"post_transform must be 0..{len(_POST) - 1} ({', '.join(_POST)}), got {post}")
    if post and _POST[post] not in _POST_OPS:
        raise ctx.unsupported(
            f"post_transform {_POST[post]} ({post}) is not supported; Kiln applies {', '.join(['NONE', *_POST_OPS])}"
        )
    if not len(members):
        members = np.full(1, np.nan, x.dtype)  # no sets: one unused entry keeps the table non-empty
    y = ctx.emit1(
        "tree_ensemble",
        x,
        ctx.const(table),
        ctx.const(splits),
        ctx.const(members),
        ctx.const(np.asarray(root_ids, np.int32)),
        ctx.const(weights),
        ctx.const(np.asarray(targets, np.int32)),
        n_targets=n_targets,
        aggregate=TREE_AGGREGATES[agg],
        max_depth=depth,
    )
    if post:
        y = ctx.emit1(_POST_OPS[_POST[post]], y, **({"axis": -1} if _POST[post] == "SOFTMAX" else {}))
    return y


# ----------------------------------------------------------------------------- TreeEnsembleRegressor
def _legacy_floats(ctx: Context, attrs, name: str) -> np.ndarray | None:
    """``name`` (floats) or ``name_as_tensor`` (doubles) as a 1-D array, or None if neither is given."""
    if f"{name}_as_tensor" in attrs:
        return _float_table(ctx, attrs, f"{name}_as_tensor")
    if name in attrs:
        return np.asarray(attrs[name], np.float32).reshape(-1)
    return None


@onnx_op("ai.onnx.ml.TreeEnsembleRegressor")
def _tree_ensemble_regressor(ctx: Context, node, ins, attrs):
    """The older tree-per-id encoding, on the ``tree_ensemble`` kernel: float32 ``[N, n_targets]``.

    Trees are numbered by ``nodes_treeids`` (in sorted order, each rooted at its first listed
    node); a leaf is a ``LEAF`` node, and its votes are the ``target_*`` entries naming it. The
    kernel takes one vote per leaf, so an ensemble whose leaves vote up to ``R`` times is walked
    as ``R`` copies, copy ``r`` carrying each leaf's ``r``-th vote (none: it adds nothing).
    AVERAGE divides the sum by the number of trees, then ``base_values`` are added, as ONNX's
    reference does; a NaN feature follows ``nodes_missing_value_tracks_true`` whatever the mode.
    """
    x = ins[0]
    if x.dtype not in ("float32", "float64", "int32", "int64"):
        raise ctx.bad(f"input X must be float32, float64, int32 or int64, got {x.dtype}")
    if len(x.shape) != 2:
        raise ctx.bad(f"input X must be 2-D [N, F], got shape {tuple(x.shape)}")
    if x.dtype in ("int32", "int64"):
        x = ctx.cast(x, "float64")  # exact for |values| < 2**53; thresholds are floats
    n_feat = int(x.shape[1])
    tree_ids = [int(v) for v in attrs["nodes_treeids"]]
    m = len(tree_ids)
    if m == 0:
        raise ctx.bad("attribute 'nodes_treeids' is empty: the ensemble needs at least one node")
    node_ids = _ints(ctx, attrs, "nodes_nodeids", m, -(2**62), 2**62, "node")
    feats = _ints(ctx, attrs, "nodes_featureids", m, 0, n_feat, "node")
    modes = [str(v) for v in attrs["nodes_modes"]]
    if len(modes) != m:
        raise ctx.bad(f"attribute 'nodes_modes' has {len(modes)} entries; expected {m} (one per node)")
    for i, mode in enumerate(modes):
        if mode != "LEAF" and mode not in TREE_MODES[:_MEMBER]:
            raise ctx.bad(f"nodes_modes[{i}] = {mode!r}; expected LEAF or one of {', '.join(TREE_MODES[:_MEMBER])}")
    values = _legacy_floats(ctx, attrs, "nodes_values")
    if values is None or len(values) != m:
        raise ctx.bad(f"nodes_values (or nodes_values_as_tensor) must have {m} entries (one per node)")
    true_ids = _ints(ctx, attrs, "nodes_truenodeids", m, -(2**62), 2**62, "node")
    false_ids = _ints(ctx, attrs, "nodes_falsenodeids", m, -(2**62), 2**62, "node")
    missing = (
        _ints(ctx, attrs, "nodes_missing_value_tracks_true", m, 0, 2, "node")
        if "nodes_missing_value_tracks_true" in attrs
        else [0] * m
    )
    at = {}
    for i, key in enumerate(zip(tree_ids, node_ids)):
        if key in at:
            raise ctx.bad(f"tree {key[0]} lists node id {key[1]} twice")
        at[key] = i
    n_targets = int(attrs.get("n_targets", 1))
    if n_targets < 1:
        raise ctx.bad(f"n_targets must be >= 1, got {n_targets}")
    v_trees = [int(v) for v in attrs.get("target_treeids", [])]
    v_nodes = [int(v) for v in attrs.get("target_nodeids", [])]
    v_targets = [int(v) for v in attrs.get("target_ids", [])]
    v_weights = _legacy_floats(ctx, attrs, "target_weights")
    v_weights = np.zeros(0, np.float32) if v_weights is None else v_weights
    if not len(v_trees) == len(v_nodes) == len(v_targets) == len(v_weights):
        raise ctx.bad(
            f"target_treeids, target_nodeids, target_ids and target_weights must have one entry per vote; got "
            f"{len(v_trees)}, {len(v_nodes)}, {len(v_targets)} and {len(v_weights)}"
        )
    leaves = [i for i in range(m) if modes[i] == "LEAF"]
    slot = {i: k for k, i in enumerate(leaves)}
    votes: list[list[tuple[int, float]]] = [[] for _ in leaves]
    for j, (key, t) in enumerate(zip(zip(v_trees, v_nodes), v_targets)):
        if key not in at or modes[at[key]] != "LEAF":
            raise ctx.bad(f"vote {j} names tree {key[0]} node {key[1]}, which is not a LEAF node")
        if not 0 <= t < n_targets:
            raise ctx.bad(f"target_ids[{j}] = {t} is out of range; expected 0 <= value < {n_targets}")
        votes[slot[at[key]]].append((t, v_weights[j]))
    copies = max([len(v) for v in votes] + [1])
    interior = [i for i in range(m) if modes[i] != "LEAF"]
    inner = {i: k for k, i in enumerate(interior)}
    n_inner, n_leaves = len(interior), len(leaves)

    def ref(i: int, child: int, copy: int) -> int:
        """Node ``child`` of node ``i``'s tree, encoded for copy ``copy`` of the ensemble."""
        j = at.get((tree_ids[i], child))
        if j is None:
            raise ctx.bad(f"tree {tree_ids[i]} node {node_ids[i]} names child node id {child}, which the tree lacks")
        return -1 - (slot[j] + copy * n_leaves) if modes[j] == "LEAF" else inner[j] + copy * n_inner

    rows = []
    for c in range(copies):
        for i in interior:
            code = TREE_MODES.index(modes[i])
            rows.append((feats[i], code, ref(i, true_ids[i], c), ref(i, false_ids[i], c), missing[i], 0, 0))
    table = np.asarray(rows, np.int32).reshape(-1, 7)
    pairs = [(int(t), int(f)) for t, f in table[:n_inner, 2:4]]
    memo: dict[int, int] = {}
    trees = sorted(set(tree_ids))
    first = {t: tree_ids.index(t) for t in trees}
    roots, depth = [], 0
    for c in range(copies):
        for t in trees:
            r = first[t]
            roots.append(ref(r, node_ids[r], c))
            if c == 0 and modes[r] != "LEAF":
                depth = max(depth, _tree_depth(ctx, inner[r], pairs, memo))
    weights = np.zeros(copies * n_leaves, v_weights.dtype)
    targets = np.full(copies * n_leaves, -1, np.int32)  # a leaf with fewer votes adds nothing in later copies
    for k, vs in enumerate(votes):
        for c, (t, w) in enumerate(vs):
            weights[c * n_leaves + k], targets[c * n_leaves + k] = w, t
    agg = str(attrs.get("aggregate_function", "SUM"))
    if agg not in TREE_AGGREGATES:
        raise ctx.bad(f"aggregate_function must be one of {', '.join(TREE_AGGREGATES)}, got {agg!r}")
    post = str(attrs.get("post_transform", "NONE"))
    if post not in _POST:
        raise ctx.bad(f"post_transform must be one of {', '.join(_POST)}, got {post!r}")
    if post != "NONE" and post not in _POST_OPS:
        raise ctx.unsupported(f"post_transform {post} is not supported; Kiln applies {', '.join(['NONE', *_POST_OPS])}")
    base = _legacy_floats(ctx, attrs, "base_values")
    if base is not None and len(base) not in (0, n_targets):
        raise ctx.bad(f"base_values has {len(base)} entries; expected n_targets = {n_targets}")
    if not n_leaves:
        raise ctx.bad("the ensemble has no LEAF node")
    if not len(table):
        table = np.zeros((1, 7), np.int32)  # only one-leaf trees: an unused row keeps the table non-empty
    y = ctx.emit1(
        "tree_ensemble",
        x,
        ctx.const(table),
        ctx.const(np.resize(values[interior] if interior else values[:1], len(table))),
        ctx.const(np.full(1, np.nan, x.dtype)),
        ctx.const(np.asarray(roots, np.int32)),
        ctx.const(weights),
        ctx.const(targets),
        n_targets=n_targets,
        aggregate="SUM" if agg == "AVERAGE" else agg,
        max_depth=depth,
        nan_follows_missing=True,
    )
    if agg == "AVERAGE":
        y = ctx.emit1("divide", y, ctx.const(np.array(len(trees), x.dtype)))
    if base is not None and len(base):
        y = ctx.emit1("add", y, ctx.const(base.astype(x.dtype)))
    if post != "NONE":
        y = ctx.emit1(_POST_OPS[post], y, **({"axis": -1} if post == "SOFTMAX" else {}))
    return ctx.cast(y, "float32")
