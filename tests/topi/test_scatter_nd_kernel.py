"""ScatterND's CPU kernel (copy, then each index row's slice in order): values vs ONNX Runtime.

On the CPU targets ``scatter_nd`` and ``scatter_nd_reduce`` are loop-IR kernels
(``kiln.topi.index``): the extents checked, ``out = data``, then for every index row, in
row-major order, its ``k`` indices checked and its slice of the updates written (or combined)
there, as ONNX Runtime's CPU kernel does. So duplicate rows with reduction ``none`` keep the
last update, and sums and products equal ONNX Runtime's to the bit (float16 combines in float32
and rounds after each update; ONNX Runtime runs float16 with reduction ``none`` only, so the
other float16 cases are checked against a NumPy reference of that order). Index depths 1, 2 and
the data's rank (scalar slices) are covered; PyTorch exports ``x[idx] = v``, ``index_put_`` and
KV-cache updates as ScatterND. Many cases share one graph (one build per target: compilation
dominates); the dynamic ones read only the valid box of padded tensors, which a run at a larger
shape first leaves holding stale values. Device targets lower the op's compute (the search
form) instead.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import tir
from kiln.driver.build import lower
from kiln.runtime.errors import KernelError

ort = pytest.importorskip("onnxruntime")

TARGETS = ("llvm", "c")
RNG = np.random.default_rng(29)
REDUCTIONS = ("none", "add", "mul", "max", "min")
_T = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.int64: TensorProto.INT64,
      np.bool_: TensorProto.BOOL}
#: The start of a kernel error of the ScatterND node (the executor names it by number and function).
_NODE = r"graph node \d+ \('[^']*scatter_nd[^']*'\).*: "
_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _values(shape: tuple, dtype: type) -> np.ndarray:
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    if dtype == np.int64:
        return RNG.integers(-4, 5, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _rows(xshape: tuple, rows: tuple, k: int, dup: bool) -> np.ndarray:
    """Index rows ``rows + (k,)`` into ``xshape``: negative ones throughout; with ``dup`` each
    entry takes one of two values, so rows repeat."""
    cols = []
    for m in range(k):
        n = xshape[m]
        lo, hi = (-min(n, 2), min(n, 2)) if dup else (-n, n)
        cols.append(RNG.integers(lo, hi, rows))
    return np.stack(cols, -1).astype(np.int64)


def _case(xshape: tuple, rows: tuple, k: int, red: str, dtype: type = np.float32, dup: bool = True) -> dict:
    """Inputs of one ScatterND with index rows of shape ``rows`` and depth ``k``."""
    return {"red": red, "x": _values(xshape, dtype), "i": _rows(xshape, rows, k, dup),
            "u": _values(rows + xshape[k:], dtype)}


def _reference(c: dict) -> np.ndarray:
    """The rows applied one by one in row-major order, each combined in the accumulation dtype
    (float32 for float16, the dtype itself otherwise) and rounded back."""
    x, idx, u = c["x"], c["i"], c["u"]
    acc = np.float32 if x.dtype == np.float16 else x.dtype
    out = x.copy()
    for q in np.ndindex(*idx.shape[:-1]):
        p = tuple(int(v) % n for v, n in zip(idx[q], x.shape))
        if c["red"] == "none":
            out[p] = u[q]
        else:
            out[p] = _COMBINE[c["red"]](np.asarray(out[p], acc), np.asarray(u[q], acc)).astype(x.dtype)
    return out


def _ort_runs(c: dict) -> bool:
    """Whether ONNX Runtime's CPU kernel takes this case (float16 with reduction none only)."""
    return c["x"].dtype != np.float16 or c["red"] == "none"


SCATTERS = [
    # depth 1 (rows), 2 (a slice of the last dim) and the rank (scalars), many duplicates
    *[_case((5, 6), (7,), 1, red) for red in REDUCTIONS],
    *[_case((4, 5, 3), (3, 4), 2, red) for red in REDUCTIONS],
    *[_case((3, 4, 6), (9,), 3, red) for red in REDUCTIONS],
    *[_case((6, 5), (3, 3), 1, red, dtype=np.int64) for red in REDUCTIONS],
    *[_case((4, 3, 5), (8,), 2, red, dtype=np.float16) for red in REDUCTIONS],
    # distinct-ish rows, one row (indices of rank 1, a scalar update), bool data, no rows at all
    _case((8, 7), (5,), 1, "none", dup=False),
    _case((6, 5, 4), (2, 2), 3, "add", dup=False),
    _case((4, 5), (), 2, "none", dup=False),
    _case((5, 4), (6,), 1, "none", dtype=np.bool_),
    _case((5, 4), (0,), 1, "add"),
]


def _node(k: int, c: dict) -> onnx.NodeProto:
    kw = {} if c["red"] == "none" else {"reduction": c["red"]}
    return helper.make_node("ScatterND", [f"x{k}", f"i{k}", f"u{k}"], [f"y{k}"], name=f"snd{k}", **kw)


def _model(nodes: list, inputs: list, outputs: list) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def _batched(ks: list[int], feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """One graph of the static cases ``ks`` (their node names kept)."""
    ins = [helper.make_tensor_value_info(f"{key}{k}", _T[feeds[f"{key}{k}"].dtype.type], list(feeds[f"{key}{k}"].shape))
           for k in ks for key in ("x", "i", "u")]
    outs = [helper.make_tensor_value_info(f"y{k}", _T[feeds[f"x{k}"].dtype.type], list(feeds[f"x{k}"].shape))
            for k in ks]
    return _model([_node(k, SCATTERS[k]) for k in ks], ins, outs)


def _feeds() -> dict[str, np.ndarray]:
    return {f"{key}{k}": c[key] for k, c in enumerate(SCATTERS) for key in ("x", "i", "u")}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _ort_static(feeds: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """ONNX Runtime's outputs of the static cases it runs (:func:`_ort_runs`), by case number."""
    ks = [k for k, c in enumerate(SCATTERS) if _ort_runs(c)]
    got = _ort(_batched(ks, feeds), {f"{key}{k}": feeds[f"{key}{k}"] for k in ks for key in ("x", "i", "u")})
    return dict(zip(ks, got))


def _build(model: onnx.ModelProto, target: str, **kw) -> kiln.GraphModule:
    mod, params = kiln.frontend.from_onnx(model, **kw)
    return kiln.GraphModule(kiln.build(mod, target=target, params=params)["default"](kiln.cpu()))


_BUILT: dict[str, kiln.GraphModule] = {}


def _static(target: str) -> tuple[kiln.GraphModule, dict[str, np.ndarray]]:
    feeds = _feeds()
    if target not in _BUILT:
        _BUILT[target] = _build(_batched(list(range(len(SCATTERS))), feeds), target)
    return _BUILT[target], feeds


@pytest.mark.parametrize("target", TARGETS)
def test_every_reduction_depth_and_dtype_matches_onnxruntime(target: str) -> None:
    m, feeds = _static(target)
    m.run(**feeds)
    ort_out = _ort_static(feeds)
    assert len(ort_out) > len(SCATTERS) // 2
    for k, c in enumerate(SCATTERS):
        got = m.get_output(k).numpy()
        msg = f"case {k}: {c['red']} {c['x'].dtype} data {c['x'].shape} indices {c['i'].shape}"
        assert got.dtype == c["x"].dtype, msg
        # sequential, in ONNX Runtime's order: equal to the bit, last duplicate winning
        np.testing.assert_array_equal(got, _reference(c), err_msg=msg)
        if k in ort_out:
            np.testing.assert_array_equal(got, ort_out[k], err_msg=msg)


@pytest.mark.parametrize("target", TARGETS)
def test_duplicates_without_reduction_keep_the_last_update(target: str) -> None:
    m, feeds = _static(target)
    feeds = dict(feeds)
    # case 0: every row lands on row -1; case 10: every scalar on element (-1, 0, 2)
    feeds["i0"] = np.full_like(feeds["i0"], -1)
    feeds["i10"] = np.broadcast_to(np.array([-1, 0, 2]), feeds["i10"].shape).copy()
    m.run(**feeds)
    got0, got10 = m.get_output(0).numpy(), m.get_output(10).numpy()
    np.testing.assert_array_equal(got0[-1], feeds["u0"][-1])
    np.testing.assert_array_equal(got0[:-1], feeds["x0"][:-1])
    assert got10[-1, 0, 2] == feeds["u10"][-1]
    ort_out = _ort_static(feeds)
    np.testing.assert_array_equal(got0, ort_out[0])
    np.testing.assert_array_equal(got10, ort_out[10])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case,entry,bad,axis,shape", [(0, 0, 5, 0, (5, 6)), (6, 1, -6, 1, (4, 5, 3)),
                                                       (13, 2, 6, 2, (3, 4, 6)), (17, 0, -7, 0, (6, 5)),
                                                       (27, 1, 5, 1, (4, 5))])
def test_out_of_range_index_is_a_kernel_error(target: str, case: int, entry: int, bad: int, axis: int,
                                              shape: tuple) -> None:
    """Each entry of an index row is checked against its own dim (a negative one wraps), the
    error naming the graph node and the op."""
    m, feeds = _static(target)
    feeds = dict(feeds)
    idx = feeds[f"i{case}"].copy()
    idx.reshape(-1, idx.shape[-1])[-1, entry] = bad  # the last row: the rows before it were applied
    feeds[f"i{case}"] = idx
    op = "scatter_nd" if SCATTERS[case]["red"] == "none" else "scatter_nd_reduce"
    size = shape[axis]
    with pytest.raises(KernelError, match=_NODE + rf"{op}: index into axis {axis} \(size {size}\) "
                                          rf"of data with shape \({', '.join(map(str, shape))}\).*"
                                          rf"index {bad} is out of range \[-{size}, {size - 1}\]"):
        m.run(**feeds)
    with pytest.raises(Exception):  # noqa: B017 - ORT's own error type; only that it refuses matters
        _ort_static(feeds)


# ----------------------------------------------------------------------------- dynamic shapes
def _one(xs: list, is_: list, us: list, red: str = "none", dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One ScatterND (node ``snd``) of data of dims ``xs``, indices ``is_`` and updates ``us``."""
    kw = {} if red == "none" else {"reduction": red}
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="snd", **kw)
    return _model([node], [helper.make_tensor_value_info("x", dtype, xs),
                           helper.make_tensor_value_info("i", TensorProto.INT64, is_),
                           helper.make_tensor_value_info("u", dtype, us)],
                  [helper.make_tensor_value_info("y", dtype, xs)])


_RANGES = {"n": (1, 9), "c": (1, 6), "m": (1, 12)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("red", ["none", "add", "max"])
def test_dynamic_shapes_read_only_the_valid_box(target: str, red: str) -> None:
    """Data ``[n, c, 4]`` indexed by rows of depth 2 (both indexed dims dynamic), ``m`` rows."""
    model = _one(["n", "c", 4], ["m", 2], ["m", 4], red)
    m = _build(model, target, dim_ranges=_RANGES)

    def feeds(n: int, c: int, mm: int, dup: bool) -> dict[str, np.ndarray]:
        return {"x": RNG.standard_normal((n, c, 4)).astype(np.float32), "i": _rows((n, c), (mm,), 2, dup),
                "u": RNG.standard_normal((mm, 4)).astype(np.float32)}

    # the largest shapes first: the padding of every buffer then holds stale values the smaller
    # runs must neither read nor let into their outputs
    for n, c, mm, dup in [(9, 6, 12, False), (3, 2, 7, True), (6, 5, 1, False), (1, 1, 4, True), (2, 6, 12, True)]:
        f = feeds(n, c, mm, dup)
        m.run(**f)
        got = m.get_output(0).numpy()
        want = _ort(model, f)[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"n={n} c={c} m={mm}")
    # an index into the padding (inside the storage, past the runtime extent) is out of range,
    # on either indexed dim
    op = "scatter_nd" if red == "none" else "scatter_nd_reduce"
    for axis, (size, at_most) in enumerate(((3, 9), (2, 6))):
        f = feeds(3, 2, 4, False)
        f["i"][-1, axis] = size
        with pytest.raises(KernelError, match=_NODE + rf"{op}: index into axis {axis} \(dynamic size, at most "
                                              rf"{at_most}\).*index {size} is out of range "
                                              rf"\[-{size}, ({size - 1}\]|{size}\))"):  # C and LLVM word it apart
            m.run(**f)


_EXTENTS = {"r": (1, 8), "s": (1, 8), "t": (1, 8), "m": (1, 8), "p": (1, 8)}


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_extents_are_checked(target: str) -> None:
    """ONNX requires updates of shape ``indices.shape[:-1] + data.shape[k:]``; with symbols on
    those dims it is checked at run time (a kernel error naming the dims and their extents),
    not by looping over one of them and reading the other's padding."""
    model = _one([3, "s", "r"], ["m", 1], ["p", "t", "r"])
    m = _build(model, target, dim_ranges=_EXTENTS)

    def feeds(s: int, r: int, mm: int, p: int, t: int) -> dict[str, np.ndarray]:
        return {"x": RNG.standard_normal((3, s, r)).astype(np.float32), "i": _rows((3,), (mm,), 1, False),
                "u": RNG.standard_normal((p, t, r)).astype(np.float32)}

    for s, r, mm in ((8, 8, 8), (2, 5, 3), (7, 1, 1), (3, 4, 8)):
        f = feeds(s, r, mm, mm, s)
        m.run(**f)
        np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0], err_msg=f"s={s} r={r} m={mm}")
    top = r"(2\]|3\))"  # the largest valid value 2: C writes [-3, 2], LLVM [-3, 3)
    bad = [((5, 4, 3, 2, 5), "indices and updates of different shapes: dim 0 of the indices, the index shown, "
                             rf"must equal dim 0 of the updates, .*index 3 is out of range \[-3, {top}"),
           ((5, 4, 2, 3, 5), "indices and updates of different shapes: dim 0 of the updates, the index shown, "
                             rf"must equal dim 0 of the indices, .*index 3 is out of range \[-3, {top}"),
           ((2, 4, 2, 2, 3), r"updates not of shape indices.shape\[:-1\] \+ data.shape\[1:\]: dim 1 of the updates, "
                             rf"the index shown, must equal dim 1 of the data, .*index 3 is out of range \[-3, {top}"),
           ((3, 4, 2, 2, 2), r"updates not of shape indices.shape\[:-1\] \+ data.shape\[1:\]: dim 1 of the data, "
                             rf"the index shown, must equal dim 1 of the updates, .*index 3 is out of range "
                             rf"\[-3, {top}")]
    for (s, r, mm, p, t), msg in bad:
        f = feeds(s, r, mm, p, t)
        with pytest.raises(KernelError, match=_NODE + rf"scatter_nd: {msg}"):
            m.run(**f)
        with pytest.raises(Exception):  # noqa: B017 - ORT's own error type; only that it refuses matters
            _ort(model, f)


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_index_depth_must_be_the_one_the_ranks_fix(target: str) -> None:
    """A symbolic last dim of the indices is built at its upper bound, the depth the ranks of
    data and updates fix (here 2: updates ``[m, 3]`` of data ``[4, 5, 3]``); a run with
    shallower rows is a kernel error, not a read of the indices' padding."""
    model = _one([4, 5, 3], ["m", "k"], ["m", 3])
    m = _build(model, target, dim_ranges={"m": (1, 6), "k": (1, 2)})
    f = {"x": RNG.standard_normal((4, 5, 3)).astype(np.float32), "i": _rows((4, 5), (5,), 2, True),
         "u": RNG.standard_normal((5, 3)).astype(np.float32)}
    m.run(**f)
    np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0])
    f["i"] = f["i"][:, :1].copy()
    with pytest.raises(KernelError, match=_NODE + r"scatter_nd: index depth 2 \(fixed by the ranks of data and "
                                                  r"updates\), the index shown, must equal the last dim of the "
                                                  r"indices, .*index 2 is out of range \[-2, (1\]|2\))"):
        m.run(**f)


def _kv_feeds(b: int, heads: int, s: int, d: int, pos: np.ndarray) -> dict[str, np.ndarray]:
    """A KV-cache write as PyTorch exports ``cache[:, :, pos] = new``: one index row
    ``(batch, head, position)`` per new token, a ``d``-vector each."""
    bi, hi, ti = np.meshgrid(np.arange(b), np.arange(heads), pos, indexing="ij")
    return {"x": RNG.standard_normal((b, heads, s, d)).astype(np.float32),
            "i": np.stack([bi, hi, ti], -1).astype(np.int64),
            "u": RNG.standard_normal((b, heads, len(pos), d)).astype(np.float32)}


@pytest.mark.parametrize("target", TARGETS)
def test_kv_cache_update(target: str) -> None:
    """Data ``[b, heads, S, d]`` with new positions written at two shapes: the largest first
    (the data past 32768 elements, so its copy is the parallel one), then a smaller batch and
    cache with one new token and a negative position."""
    model = _one(["b", 4, "S", 32], ["b", 4, "T", 3], ["b", 4, "T", 32])
    m = _build(model, target, dim_ranges={"b": (1, 2), "S": (1, 256), "T": (1, 8)})
    for b, s, pos in ((2, 256, np.array([250, 3, 251, 252, 0, 255, 7, 8])), (1, 10, np.array([-1]))):
        f = _kv_feeds(b, 4, s, 32, pos)
        m.run(**f)
        want = _ort(model, f)[0]
        np.testing.assert_array_equal(m.get_output(0).numpy(), want, err_msg=f"b={b} S={s}")
        np.testing.assert_array_equal(want[:, :, pos], f["u"])


# ----------------------------------------------------------------------------- the kernel's form
def _loops(f: tir.PrimFunc) -> list:
    found: list = []
    tir.post_order_visit(f.body, lambda s: found.append(s) if isinstance(s, tir.For) else None)
    return found


def _scatter_func(model: onnx.ModelProto, target: str, **kw) -> tir.PrimFunc:
    mod, params = kiln.frontend.from_onnx(model, **kw)
    (func,) = [f for f in lower(mod, target, params=params).funcs if "scatter_nd" in f.name]
    return func


@pytest.mark.parametrize("op,attrs", [("scatter_nd", {}), ("scatter_nd_reduce", {"reduction": "mul"})])
def test_cpu_kernel_is_copy_then_scatter(op: str, attrs: dict) -> None:
    from kiln.topi import get_prim_kernel

    fn = get_prim_kernel(op, "llvm")
    assert fn is not None and get_prim_kernel(op, "c -keys=cpu") is fn
    n = tir.Var("n_rt", "int32")
    x = tir.Buffer("p0", (6, 4, 5), "float32", dyn=(n, None, None))
    ind = tir.Buffer("p1", (3, 7, 2), "int64")
    upd = tir.Buffer("p2", (3, 7, 5), "float32")
    cpu = fn(attrs, [x, ind, upd], [tir.Buffer("out0", (6, 4, 5), "float32", dyn=x.dyn)], "k", "llvm")
    # the copy (3 loops), then the rows (2) and each row's slice (1), no reduction:
    # O(data + updates), where the search is O(data * rows)
    loops = _loops(cpu)
    assert len(loops) == 6 and all(s.kind == "serial" for s in loops)
    found: list = []
    tir.post_order_visit(cpu.body, lambda e: found.append(e) if isinstance(e, tir.Reduce) else None)
    assert not found


@pytest.mark.parametrize("target", ["cuda", "opencl"])
@pytest.mark.parametrize("red", ["none", "add"])
def test_device_targets_lower_the_search(target: str, red: str) -> None:
    """The loop-IR kernel is registered for CPU targets only: a device target gets the op's
    compute, lowered as any group (one work-item per output element; no device needed)."""
    from kiln.target import Target
    from kiln.topi import get_prim_kernel

    op = "scatter_nd" if red == "none" else "scatter_nd_reduce"
    assert get_prim_kernel(op, target) is None and get_prim_kernel(op, Target(target)) is None
    assert get_prim_kernel(op) is get_prim_kernel(op, Target("llvm")) is not None
    f = _scatter_func(_one([6, 5, 4], [9, 2], [9, 4], red), target)
    assert any(s.kind == "thread_binding" for s in _loops(f))


@pytest.mark.skipif(not kiln.opencl().exist, reason="no OpenCL device")
def test_opencl_runs_the_search() -> None:
    model = _one([6, 5], [9, 1], [9, 5], "none")
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target="opencl", params=params)["default"](kiln.opencl()))
    f: dict[str, np.ndarray] = {"x": RNG.standard_normal((6, 5)).astype(np.float32),
                                "i": _rows((6,), (9,), 1, True), "u": RNG.standard_normal((9, 5)).astype(np.float32)}
    m.run(**f)
    np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0])
