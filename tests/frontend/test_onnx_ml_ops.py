"""TfIdfVectorizer and ai.onnx.ml TreeEnsemble, end to end against ONNX's reference evaluator.

Each model is imported, built (``llvm``, and ``c`` for some), exported, loaded and run on
several inputs, and compared with ``onnx.reference.ReferenceEvaluator`` (and ONNX Runtime for
TfIdfVectorizer, which shares its n-gram semantics). The tree ensembles are random: every node
mode, NaN inputs with both missing-value directions, set membership, several targets and each
aggregate function. Bad attributes must raise Kiln errors naming the attribute.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.runtime.errors import InputError, UnsupportedOpError
from tests.frontend.onnx_check import assert_close, run_ort

_ONNX_TYPES = {
    "string": TensorProto.STRING,
    "float32": TensorProto.FLOAT,
    "float64": TensorProto.DOUBLE,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
}


def _model(node: onnx.NodeProto, x_dtype: str, x_shape: tuple, ml: bool = False) -> onnx.ModelProto:
    g = helper.make_graph(
        [node],
        "m",
        [helper.make_tensor_value_info("x", _ONNX_TYPES[x_dtype], x_shape)],
        [helper.make_empty_tensor_value_info("y")],
    )
    ops = [helper.make_opsetid("", 21)] + ([helper.make_opsetid("ai.onnx.ml", 5)] if ml else [])
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 10
    return m


def _build(model: onnx.ModelProto, target: str, tmp_path) -> kiln.GraphModule:
    graph, params = kiln.frontend.from_onnx(model)
    lib = kiln.build(graph, target=target, params=params)
    path = str(tmp_path / f"m_{target}.so")
    lib.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _check(
    model: onnx.ModelProto, target: str, tmp_path, xs: list[np.ndarray], ort: bool = False, ref: bool = True, post=None
) -> None:
    """Kiln vs ONNX's reference (``ref``, then ``post`` applied) and ONNX Runtime (``ort``)."""
    m = _build(model, target, tmp_path)
    evaluator = ReferenceEvaluator(model) if ref else None
    for x in xs:
        m.run(x=x)
        got = m.get_output(0).numpy()
        if evaluator is not None:
            want = evaluator.run(None, {"x": x})[0]
            if post is not None:
                want = post(want)
            assert_close(got, want, rtol=1e-5, atol=1e-6, what=f"input {x.tolist()}")
        if ort:
            assert_close(got, run_ort(model, {"x": x})[0], what=f"input {x.tolist()} vs ONNX Runtime")


# ----------------------------------------------------------------------------- TfIdfVectorizer
#: 1-grams, 2-grams and 3-grams over the token ids 0..6 (ngram_counts: where each length starts)
_POOL = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 3, 3, 1, 2, 3, 6, 6, 6]
_COUNTS = [0, 4, 12]
_N_GRAMS = 4 + 4 + 2


def _tfidf(
    mode: str = "TF",
    lo: int = 1,
    hi: int = 3,
    skip: int = 0,
    weights: list[float] | None = None,
    indexes: list[int] | None = None,
    pool: list[int] | None = None,
    counts: list[int] | None = None,
    **extra,
) -> onnx.NodeProto:
    attrs = dict(
        mode=mode,
        min_gram_length=lo,
        max_gram_length=hi,
        max_skip_count=skip,
        ngram_counts=_COUNTS if counts is None else counts,
        ngram_indexes=list(range(_N_GRAMS)) if indexes is None else indexes,
        pool_int64s=_POOL if pool is None else pool,
        **extra,
    )
    if weights is not None:
        attrs["weights"] = weights
    return helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)


def _tokens(shape: tuple, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = [rng.integers(0, 9, shape).astype(dtype) for _ in range(3)]
    # a row built from pool n-grams, so every length occurs with and without skips
    row = np.resize(np.array([5, 6, 7, 8, 6, 7, 1, 2, 3, 3, 3, 6, 6, 6, 2, 9]), shape[-1])
    xs.append(np.broadcast_to(row, shape).astype(dtype).copy())
    return xs


_W = [0.5, 2.0, 1.5, 3.0, 0.25, 4.0, 1.0, 2.5, 0.75, 5.0]
_TFIDF_CASES = [
    # (id, node kwargs, x dtype, x shape, target)
    ("tf_1d_all_lengths", dict(mode="TF", lo=1, hi=3, skip=0), "int64", (16,), "llvm"),
    ("tf_2d_skip3", dict(mode="TF", lo=1, hi=3, skip=3), "int32", (3, 12), "c"),
    ("tf_bigrams_only_skip2", dict(mode="TF", lo=2, hi=2, skip=2), "int64", (2, 10), "llvm"),
    ("idf_weights", dict(mode="IDF", lo=1, hi=2, skip=1, weights=_W), "int64", (4, 9), "llvm"),
    ("idf_no_weights", dict(mode="IDF", lo=1, hi=3, skip=2), "int32", (11,), "llvm"),
    ("tfidf_weights", dict(mode="TFIDF", lo=2, hi=3, skip=4, weights=_W), "int32", (2, 14), "c"),
    (
        "tfidf_no_weights_shuffled_cols",
        dict(mode="TFIDF", lo=1, hi=3, skip=1, indexes=[3, 0, 7, 1, 9, 2, 8, 4, 6, 5]),
        "int64",
        (3, 8),
        "llvm",
    ),
    (
        "shared_columns",
        dict(mode="TF", lo=1, hi=3, skip=2, indexes=[0, 1, 0, 1, 2, 2, 3, 3, 0, 4]),
        "int64",
        (2, 10),
        "llvm",
    ),
]


@pytest.mark.parametrize("kw,dtype,shape,target", [c[1:] for c in _TFIDF_CASES], ids=[c[0] for c in _TFIDF_CASES])
def test_tfidf_vectorizer(kw, dtype, shape, target, tmp_path):
    model = _model(_tfidf(**kw), dtype, shape)
    seed = zlib.crc32(repr((kw, dtype, shape)).encode())
    # ONNX's reference fails on IDF / TFIDF without weights (len(None)): ONNX Runtime alone there
    ref = kw["mode"] == "TF" or "weights" in kw
    _check(model, target, tmp_path, _tokens(shape, dtype, seed), ort=True, ref=ref)


def test_tfidf_repeated_ngram_counts_once_in_its_last_column(tmp_path):
    # n-grams (5) (5, 6) (7, 5) (5, 6): the bigram (5, 6) is listed twice, and ONNX's reference
    # counts it once, in the column of its second listing (ONNX Runtime refuses such a pool)
    node = _tfidf(pool=[5, 5, 6, 7, 5, 5, 6], counts=[0, 1], indexes=[0, 1, 2, 3], lo=1, hi=2)
    x = np.array([5, 6, 7, 5, 6, 6], np.int64)
    model = _model(node, "int64", (6,))
    _check(model, "llvm", tmp_path, [x])
    m = _build(model, "llvm", tmp_path)
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), [2, 0, 1, 2])


def test_tfidf_no_ngram_of_a_counted_length_gives_zeros(tmp_path):
    # only unigrams in the pool, only bigrams counted: every output is 0
    node = _tfidf(pool=[1, 2, 3], counts=[0], indexes=[0, 1, 2], lo=2, hi=2)
    x = np.array([[1, 2, 3, 1], [3, 3, 2, 1]], np.int64)
    _check(_model(node, "int64", (2, 4)), "llvm", tmp_path, [x])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(counts=[0, 6, 4]), "ngram_counts"),
        (dict(counts=[0, 5]), "not a multiple of 2"),
        (dict(indexes=[0, 1, 2]), "ngram_indexes has 3 entries"),
        (dict(indexes=[0, -1] + list(range(2, _N_GRAMS))), "ngram_indexes"),
        (dict(weights=[1.0, 2.0]), "weights has 2 entries"),
        (dict(lo=3, hi=2), "min_gram_length"),
        (dict(skip=-1), "max_skip_count"),
        (dict(mode="BM25"), "mode"),
    ],
)
def test_tfidf_bad_attributes_are_named(kw, match):
    with pytest.raises(InputError, match=match):
        kiln.frontend.from_onnx(_model(_tfidf(**kw), "int64", (2, 8)))


@pytest.mark.parametrize(
    "x_dtype,pools,match",
    [
        ("float32", ("pool_int64s",), "must be string, int32 or int64"),
        ("int64", ("pool_strings",), "pool_strings needs string tokens"),
        ("string", ("pool_int64s",), "pool_int64s int32 or int64"),
        ("string", ("pool_int64s", "pool_strings"), "only one of"),
    ],
)
def test_tfidf_token_type_must_match_the_pool(x_dtype, pools, match):
    node = _tfidf()
    if "pool_int64s" not in pools:
        node.attribute.remove(next(a for a in node.attribute if a.name == "pool_int64s"))
    if "pool_strings" in pools:
        node.attribute.append(helper.make_attribute("pool_strings", [str(v) for v in _POOL]))
    with pytest.raises(InputError, match=match):
        kiln.frontend.from_onnx(_model(node, x_dtype, (2, 8)))


@pytest.mark.parametrize("shape,target", [((2, 9), "llvm"), ((11,), "c")])
def test_tfidf_string_tokens(shape, target, tmp_path):
    """pool_strings: tokens become ids through the label_encoder host op, then counted as ints."""
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "Cat", ""]
    node = _tfidf(mode="TFIDF", lo=1, hi=3, skip=1, weights=_W)
    node.attribute.remove(next(a for a in node.attribute if a.name == "pool_int64s"))
    node.attribute.append(helper.make_attribute("pool_strings", [words[v] for v in _POOL]))
    model = _model(node, "string", shape)
    xs = [
        np.array([words[i] for i in t.reshape(-1)], dtype=object).reshape(shape)
        for t in _tokens(shape, "int64", len(shape))
    ]
    xs.append(np.full(shape, "unseen", dtype=object))
    _check(model, target, tmp_path, xs, ort=True)


# ----------------------------------------------------------------------------- TreeEnsemble
def _random_ensemble(
    rng: np.random.Generator,
    n_trees: int,
    n_feat: int,
    n_targets: int,
    dtype: str,
    max_depth: int = 4,
    sets: bool = True,
) -> dict:
    """TreeEnsemble attributes of random trees, nodes numbered in depth-first order (true branch
    first), which is the order ONNX's reference reads membership sets in; BRANCH_MEMBER nodes
    only with ``sets``."""
    modes, feats, splits, t_ids, t_leaf, f_ids, f_leaf, missing, members = ([] for _ in range(9))
    weights, targets, roots = [], [], []

    def leaf() -> int:
        weights.append(float(rng.integers(-20, 20)) / 4)
        targets.append(int(rng.integers(0, n_targets)))
        return len(weights) - 1

    def node(depth: int) -> int:
        i = len(modes)
        mode = int(rng.integers(0, 7 if sets else 6))
        modes.append(mode)
        feats.append(int(rng.integers(0, n_feat)))
        # splits and members from the grid the inputs are drawn from, so EQ / MEMBER can hit
        splits.append(float(rng.integers(-4, 5)) / 2 if mode != 6 else 0.0)
        if mode == 6:  # integers (ONNX Runtime's limit), not 0.0 (ONNX's reference ends a set there)
            members.extend(float(v) for v in rng.choice([-2, -1, 1, 2], 2, replace=False))
            members.append(np.nan)
        missing.append(int(rng.integers(0, 2)))
        for ids, is_leaf in ((t_ids, t_leaf), (f_ids, f_leaf)):
            ids.append(0)
            is_leaf.append(0)
        for ids, is_leaf in ((t_ids, t_leaf), (f_ids, f_leaf)):
            if depth >= max_depth or rng.random() < 0.3:
                ids[i], is_leaf[i] = leaf(), 1
            else:
                ids[i] = node(depth + 1)
        return i

    for _ in range(n_trees):
        roots.append(node(1))
    np_dt = np.dtype(dtype)
    attrs = dict(
        nodes_modes=numpy_helper.from_array(np.array(modes, np.uint8)),
        nodes_featureids=feats,
        nodes_splits=numpy_helper.from_array(np.array(splits, np_dt)),
        nodes_truenodeids=t_ids,
        nodes_trueleafs=t_leaf,
        nodes_falsenodeids=f_ids,
        nodes_falseleafs=f_leaf,
        nodes_missing_value_tracks_true=missing,
        leaf_weights=numpy_helper.from_array(np.array(weights, np_dt)),
        leaf_targetids=targets,
        tree_roots=roots,
        n_targets=n_targets,
    )
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, np_dt))
    return attrs


def _tree_inputs(rng: np.random.Generator, n: int, n_feat: int, dtype: str) -> list[np.ndarray]:
    xs = []
    for _ in range(3):
        x = (rng.integers(-5, 6, (n, n_feat)) / 2).astype(dtype)
        x[rng.random((n, n_feat)) < 0.1] = np.nan
        xs.append(x)
    return xs


_TREE_CASES = [
    ("float32", 1, "llvm"),
    ("float64", 1, "c"),
    ("float32", 0, "llvm"),
    ("float64", 0, "llvm"),
    ("float32", 2, "llvm"),
    ("float64", 2, "c"),
    ("float32", 3, "llvm"),
    ("float64", 3, "llvm"),
]


@pytest.mark.parametrize("dtype,agg,target", _TREE_CASES)
def test_tree_ensemble_random(dtype, agg, target, tmp_path):
    rng = np.random.default_rng(zlib.crc32(f"tree{dtype}{agg}".encode()))
    attrs = _random_ensemble(rng, n_trees=5, n_feat=4, n_targets=3, dtype=dtype)
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", aggregate_function=agg, **attrs)
    _check(_model(node, dtype, (7, 4), ml=True), target, tmp_path, _tree_inputs(rng, 7, 4, dtype))


@pytest.mark.parametrize("dtype,agg", [("float32", 1), ("float64", 0)])
def test_tree_ensemble_matches_onnxruntime(dtype, agg, tmp_path):
    # ONNX Runtime differs from ONNX's reference on BRANCH_MEMBER sets and gives 0 (not the
    # type's extreme) for a target no tree reaches under MIN / MAX: compared where they agree
    rng = np.random.default_rng(zlib.crc32(f"ort{dtype}{agg}".encode()))
    attrs = _random_ensemble(rng, n_trees=6, n_feat=5, n_targets=2, dtype=dtype, sets=False)
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", aggregate_function=agg, **attrs)
    _check(_model(node, dtype, (9, 5), ml=True), "llvm", tmp_path, _tree_inputs(rng, 9, 5, dtype), ort=True)


def test_tree_ensemble_single_leaf_tree_uses_the_leaf_its_root_names(tmp_path):
    # tree 1 is node 2 alone, both branches naming leaf 0 (the ONNX spec's encoding, ONNX
    # Runtime's reading); ONNX's reference reads leaf 2 instead (the root's node index)
    node = _small_tree(
        nodes_modes=numpy_helper.from_array(np.array([0, 1, 0], np.uint8)),
        nodes_featureids=[0, 1, 0],
        nodes_splits=numpy_helper.from_array(np.array([1, 2, 0], np.float32)),
        nodes_truenodeids=[0, 1, 0],
        nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 0],
        nodes_falseleafs=[0, 1, 1],
        leaf_weights=numpy_helper.from_array(np.array([1, 2, 30], np.float32)),
        tree_roots=[0, 2],
    )
    model = _model(node, "float32", (2, 2), ml=True)
    x = np.array([[0, 5], [2, 2]], np.float32)
    _check(model, "llvm", tmp_path, [x], ort=True, ref=False)
    m = _build(model, "llvm", tmp_path)
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), [[2], [31]])


def _softmax(y: np.ndarray) -> np.ndarray:
    e = np.exp(y - y.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(y.dtype)


@pytest.mark.parametrize(
    "post,fn", [(1, _softmax), (2, lambda y: (1 / (1 + np.exp(-y))).astype(y.dtype))], ids=["softmax", "logistic"]
)
def test_tree_ensemble_post_transform(post, fn, tmp_path):
    # ONNX's reference ignores post_transform; it is applied here as ONNX Runtime does
    rng = np.random.default_rng(11 + post)
    attrs = _random_ensemble(rng, n_trees=3, n_feat=3, n_targets=4, dtype="float32")
    node = helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", post_transform=post, **attrs)
    _check(_model(node, "float32", (5, 3), ml=True), "llvm", tmp_path, _tree_inputs(rng, 5, 3, "float32"), post=fn)


def _small_tree(**over) -> onnx.NodeProto:
    """x[0] <= 1 ? leaf 0 : (x[1] < 2 ? leaf 1 : leaf 2), target 0."""
    attrs = dict(
        nodes_modes=numpy_helper.from_array(np.array([0, 1], np.uint8)),
        nodes_featureids=[0, 1],
        nodes_splits=numpy_helper.from_array(np.array([1.0, 2.0], np.float32)),
        nodes_truenodeids=[0, 1],
        nodes_trueleafs=[1, 1],
        nodes_falsenodeids=[1, 2],
        nodes_falseleafs=[0, 1],
        leaf_weights=numpy_helper.from_array(np.array([1, 2, 3], np.float32)),
        leaf_targetids=[0, 0, 0],
        tree_roots=[0],
        n_targets=1,
    )
    attrs.update(over)
    return helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", **attrs)


def test_tree_ensemble_small_tree_by_hand(tmp_path):
    m = _build(_model(_small_tree(), "float32", (4, 2), ml=True), "llvm", tmp_path)
    m.run(x=np.array([[0, 5], [1, 5], [2, 1], [2, 2]], np.float32))
    np.testing.assert_array_equal(m.get_output(0).numpy(), [[1], [1], [2], [3]])


@pytest.mark.parametrize(
    "over,err,match",
    [
        (dict(post_transform=4), UnsupportedOpError, "PROBIT"),
        (dict(nodes_falsenodeids=[1, 0], nodes_falseleafs=[0, 0]), InputError, "cycle"),
        (dict(nodes_falsenodeids=[5, 2]), InputError, "nodes_falsenodeids"),
        (dict(nodes_featureids=[0, 2]), InputError, "nodes_featureids"),
        (dict(leaf_targetids=[0, 1, 0]), InputError, "leaf_targetids"),
        (dict(tree_roots=[2]), InputError, "tree_roots"),
        (dict(nodes_modes=numpy_helper.from_array(np.array([0, 6], np.uint8))), InputError, "membership_values"),
        (dict(nodes_modes=numpy_helper.from_array(np.array([0, 9], np.uint8))), InputError, "nodes_modes"),
        (dict(aggregate_function=7), InputError, "aggregate_function"),
        (dict(nodes_splits=numpy_helper.from_array(np.array([1.0], np.float32))), InputError, "nodes_splits"),
    ],
)
def test_tree_ensemble_bad_attributes_are_named(over, err, match):
    with pytest.raises(err, match=match):
        kiln.frontend.from_onnx(_model(_small_tree(**over), "float32", (4, 2), ml=True))


def test_tree_ensemble_integer_input_is_refused():
    with pytest.raises(UnsupportedOpError, match="float32 or float64"):
        kiln.frontend.from_onnx(_model(_small_tree(), "int64", (4, 2), ml=True))


# ----------------------------------------------------------------------------- TreeEnsembleRegressor
def _regressor(**over) -> onnx.NodeProto:
    """Tree ids 3, 1 and 7 (walked in sorted order); tree 1's leaf 1 votes twice; tree 7 is one
    leaf; tree 3 has a BRANCH_NEQ node and a NaN-to-true LEQ root."""
    attrs = dict(
        nodes_treeids=[3, 3, 3, 3, 3, 1, 1, 1, 7],
        nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2, 0],
        nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "BRANCH_NEQ", "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF", "LEAF", "LEAF"],
        nodes_values=[0.5, 1.0, 0, 0, 0, -0.5, 0, 0, 0],
        nodes_truenodeids=[1, 2, 0, 0, 0, 1, 0, 0, 0],
        nodes_falsenodeids=[4, 3, 0, 0, 0, 2, 0, 0, 0],
        nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0, 0],
        target_treeids=[3, 3, 3, 1, 1, 1, 7],
        target_nodeids=[2, 3, 4, 1, 1, 2, 0],
        target_ids=[0, 1, 0, 0, 1, 1, 0],
        target_weights=[1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 0.5],
        base_values=[0.25, -1.0],
        n_targets=2,
    )
    attrs.update(over)
    return helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", **attrs)


def _regressor_model(node: onnx.NodeProto, dtype: str = "float32") -> onnx.ModelProto:
    model = _model(node, dtype, (6, 3), ml=True)
    model.opset_import[1].version = 3
    return model


_REG_X = np.array([[0, 1, 0], [0, 2, 0], [1, 1, 1], [np.nan, 1, -1], [0.5, 3, np.nan], [0.5, 1, -0.5]], np.float32)


@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_ensemble_regressor(agg, tmp_path):
    model = _regressor_model(_regressor(aggregate_function=agg))
    # ONNX's reference answers in X's type; the schema (and ONNX Runtime) in float32
    _check(model, "llvm", tmp_path, [_REG_X], ort=True)


def test_tree_ensemble_regressor_nan_follows_missing_value_tracks_true(tmp_path):
    # x1 = NaN at the BRANCH_NEQ node (missing_value_tracks_true 0): the false branch, as the
    # spec and ONNX's reference say (ONNX Runtime takes the true one: NaN != 1)
    model = _regressor_model(_regressor())
    x = np.array([[0, np.nan, 0]] * 6, np.float32)
    _check(model, "llvm", tmp_path, [x])
    m = _build(model, "llvm", tmp_path)
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy()[0], [0.25 + 0.5 + 10, -1 + 2 + 20])


@pytest.mark.parametrize("dtype,post", [("float64", "LOGISTIC"), ("int64", "SOFTMAX"), ("int32", "NONE")])
def test_tree_ensemble_regressor_types_and_post_transform(dtype, post, tmp_path):
    # ONNX's reference implements neither post_transform nor integer inputs, ONNX Runtime no
    # integer inputs: integer inputs are checked against ONNX Runtime on the same values as floats
    node = _regressor(post_transform=post, aggregate_function="AVERAGE")
    x = (
        _REG_X
        if dtype.startswith("float")
        else np.array([[0, 1, 0], [0, 2, 0], [1, 1, 1], [3, -1, -1], [-2, 1, 0], [1, 0, 5]])
    )
    m = _build(_regressor_model(node, dtype), "llvm", tmp_path)
    m.run(x=x.astype(dtype))
    want = run_ort(
        _regressor_model(node, "float64" if dtype == "float64" else "float32"),
        {"x": x.astype("float64" if dtype == "float64" else "float32")},
    )[0]
    assert_close(m.get_output(0).numpy(), want, what=f"{dtype} {post}")


@pytest.mark.parametrize(
    "over,match",
    [
        (
            dict(
                nodes_modes=["BRANCH_LEQ", "BRANCH_MEMBER", "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF", "LEAF", "LEAF"]
            ),
            "nodes_modes",
        ),
        (dict(nodes_falsenodeids=[9, 3, 0, 0, 0, 2, 0, 0, 0]), "child node id 9"),
        (dict(target_nodeids=[2, 3, 4, 1, 1, 2, 1]), "not a LEAF node"),
        (dict(nodes_nodeids=[0, 1, 2, 3, 3, 0, 1, 2, 0]), "twice"),
        (dict(target_ids=[0, 1, 0, 0, 5, 1, 0]), "target_ids"),
        (dict(nodes_truenodeids=[1, 0, 0, 0, 0, 1, 0, 0, 0]), "cycle"),
    ],
)
def test_tree_ensemble_regressor_bad_attributes_are_named(over, match):
    with pytest.raises(InputError, match=match):
        kiln.frontend.from_onnx(_regressor_model(_regressor(**over)))


# ----------------------------------------------------------------------------- symbolic dims
def test_symbolic_batch_and_row_length(tmp_path):
    """One library serves every batch size (and, for TfIdfVectorizer, row length) in range."""
    tf = _model(_tfidf(mode="TF", lo=1, hi=3, skip=2), "int64", ("batch", "seq"))
    graph, params = kiln.frontend.from_onnx(tf, dim_ranges={"batch": (1, 6), "seq": (1, 20)})
    m = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    ref = ReferenceEvaluator(tf)
    for shape in [(1, 20), (6, 3), (3, 11), (2, 1)]:
        x = _tokens(shape, "int64", shape[0] * 100 + shape[1])[-1]
        m.run(x=x)
        assert_close(m.get_output(0).numpy(), ref.run(None, {"x": x})[0], what=f"TfIdf {shape}")

    rng = np.random.default_rng(5)
    node = helper.make_node(
        "TreeEnsemble",
        ["x"],
        ["y"],
        domain="ai.onnx.ml",
        **_random_ensemble(rng, n_trees=4, n_feat=3, n_targets=2, dtype="float32"),
    )
    te = _model(node, "float32", ("batch", 3), ml=True)
    graph, params = kiln.frontend.from_onnx(te, dim_ranges={"batch": (1, 8)})
    m = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    ref = ReferenceEvaluator(te)
    for n in (8, 1, 5):
        x = _tree_inputs(rng, n, 3, "float32")[0]
        m.run(x=x)
        assert_close(m.get_output(0).numpy(), ref.run(None, {"x": x})[0], what=f"TreeEnsemble batch {n}")
