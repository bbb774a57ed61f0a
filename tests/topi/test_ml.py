"""Loop-IR kernels over constant tables (``kiln.topi.ml``): ``ngram_count`` and ``tree_ensemble``.

The ops are built as IR graphs with hand-made tables, compiled for ``llvm`` and ``c``, exported,
loaded and compared with the ops' NumPy references, including tables with entries the kernels
must skip (a length, column, child, feature, member range or target out of range, a walk
longer than ``max_depth``) and a kernel reading the same value twice.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ir
from kiln.ir import get_op
from kiln.runtime.errors import InputError

TARGETS = ["llvm", "c"]


def _load(graph, target, tmp_path) -> kiln.GraphModule:
    lib = kiln.build(graph, target=target)
    path = str(tmp_path / f"ml_{target}.so")
    lib.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _run(graph, target, tmp_path, feeds_list, op, tables, attrs) -> None:
    m = _load(graph, target, tmp_path)
    opdef = get_op(op)
    for x in feeds_list:
        m.run(x=x)
        want = opdef.ref([x, *tables], opdef.normalize_attrs(attrs))[0]
        got = m.get_output(0).numpy()
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"input {x.tolist()}")


# ----------------------------------------------------------------------------- ngram_count
_POOL = np.array([[1, 0, 0], [2, 3, 0], [3, 3, 3], [4, 4, 0], [1, 2, 0], [5, 0, 0], [2, 0, 0]], np.int64)
# rows 3..5 are unusable: length 0, length 4 > L = 3, column 9 >= num_cols
_LEN = np.array([1, 2, 3, 0, 4, 1, 1], np.int32)
_COL = np.array([0, 1, 2, 3, 3, 9, 0], np.int32)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,skip", [((3, 9), 2), ((12,), 0)])
def test_ngram_count(target, shape, skip, tmp_path):
    attrs = {"num_cols": 4, "max_skip_count": skip}
    g = ir.Graph("ngram")
    x = g.add_input("x", shape, "int32")
    tables = [_POOL, _LEN, _COL]
    g.outputs = g.add_node("ngram_count", [x, *(g.add_constant(t) for t in tables)], attrs)
    rng = np.random.default_rng(4)
    xs = [rng.integers(0, 6, shape).astype(np.int32) for _ in range(3)]
    xs.append(np.resize(np.array([3, 3, 3, 2, 3, 1, 2, 4, 4], np.int32), shape))
    _run(g, target, tmp_path, xs, "ngram_count", tables, attrs)


def test_ngram_count_reference_by_hand():
    ref = get_op("ngram_count").ref
    x = np.array([1, 2, 1, 3, 1], np.int64)
    pool = np.array([[1, 0], [1, 1]], np.int64)
    # (1) three times; (1, 1) at skip distance 2 (positions 0-2 and 2-4) and 4 (0-4)
    got = ref([x, pool, np.array([1, 2], np.int32), np.array([0, 1], np.int32)], {"num_cols": 2, "max_skip_count": 3})[
        0
    ]
    np.testing.assert_array_equal(got, [3, 3])


def test_ngram_count_rejects_bad_tables():
    g = ir.Graph("bad")
    x = g.add_input("x", (2, 5), "int64")
    pool = g.add_constant(_POOL)
    with pytest.raises(InputError, match="pool_len"):
        g.add_node("ngram_count", [x, pool, g.add_constant(_LEN[:3]), g.add_constant(_COL)], {"num_cols": 4})
    with pytest.raises(InputError, match="x must be int32 or int64"):
        g.add_node(
            "ngram_count", [g.add_input("f", (5,)), pool, g.add_constant(_LEN), g.add_constant(_COL)], {"num_cols": 4}
        )


# ----------------------------------------------------------------------------- tree_ensemble
def _tree_tables(dtype: str) -> list[np.ndarray]:
    # node fields: feature, mode, true, false, missing_true, member_begin, member_end
    nodes = np.array(
        [
            [0, 0, 1, 2, 1, 0, 0],  # x0 <= 0.5 (NaN: true)
            [1, 6, -1, -2, 0, 0, 2],  # x1 in {1, 2}
            [2, 3, 3, -3, 0, 0, 0],  # x2 > 0
            [1, 5, -4, 40, 0, 0, 0],  # x1 != 1, else child 40: outside the table
            [0, 4, -1, -2, 0, 0, 0],  # tree 2: x0 == 1
            [7, 0, -1, -2, 0, 0, 0],  # tree 3: feature 7 is outside x
            [1, 6, -1, -9, 0, 2, 9],  # tree 4: member range past the table; else leaf 8: outside
            [0, 9, -1, -3, 0, 0, 0],  # tree 5: mode 9 never holds; leaf 2 targets column 5: outside
            [0, 1, 9, 9, 0, 0, 0],  # tree 6: goes round a chain longer than max_depth
            [0, 1, 8, 8, 0, 0, 0],
        ],
        np.int32,
    )
    splits = np.array([0.5, 0, 0, 1, 1, 0, 0, 0, 0, 0], dtype)
    members = np.array([1, 2, 3], dtype)
    roots = np.array([0, 4, 5, 6, 7, 8], np.int32)
    weights = np.array([1.5, -2, 4, 0.25], dtype)
    targets = np.array([0, 1, 5, 1], np.int32)
    return [nodes, splits, members, roots, weights, targets]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "dtype,agg", [("float32", "SUM"), ("float64", "AVERAGE"), ("float32", "MIN"), ("float64", "MAX")]
)
def test_tree_ensemble(target, dtype, agg, tmp_path):
    attrs = {"n_targets": 2, "aggregate": agg, "max_depth": 4}
    tables = _tree_tables(dtype)
    g = ir.Graph("trees")
    x = g.add_input("x", (6, 3), dtype)
    g.outputs = g.add_node("tree_ensemble", [x, *(g.add_constant(t) for t in tables)], attrs)
    rng = np.random.default_rng(8)
    xs = []
    for _ in range(3):
        v = rng.integers(-1, 4, (6, 3)).astype(dtype) / 2
        v[rng.random((6, 3)) < 0.15] = np.nan
        xs.append(v)
    _run(g, target, tmp_path, xs, "tree_ensemble", tables, attrs)


def test_tree_ensemble_rejects_bad_tables():
    t = _tree_tables("float32")
    g = ir.Graph("bad")
    x = g.add_input("x", (2, 3))
    with pytest.raises(InputError, match="nodes must be an int32 table"):
        g.add_node(
            "tree_ensemble", [x, *(g.add_constant(a) for a in [t[0][:, :5], *t[1:]])], {"n_targets": 2, "max_depth": 3}
        )
    with pytest.raises(InputError, match="aggregate must be one of"):
        g.add_node(
            "tree_ensemble",
            [x, *(g.add_constant(a) for a in t)],
            {"n_targets": 2, "max_depth": 3, "aggregate": "MEDIAN"},
        )


# ----------------------------------------------------------------------------- one value, two inputs
@pytest.mark.parametrize("target", TARGETS)
def test_loop_ir_kernel_reading_one_value_twice(target, tmp_path):
    """A node whose inputs repeat a value gets one kernel argument per input (regression: the
    kernel used to get the distinct values only, and failed to unpack them)."""
    g = ir.Graph("twice")
    b = g.add_input("x", (7,), "bool")
    g.declare_dim("n", 0, 7, data_dependent=True)
    g.outputs = g.add_node("compress", [b, b], {"axis": 0, "out_dim": "n"})
    m = _load(g, target, tmp_path)
    x = np.array([1, 0, 1, 1, 0, 0, 1], bool)
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), [True] * 4)
