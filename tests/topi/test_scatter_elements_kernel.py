"""ScatterElements' CPU kernel (copy, then each update in order): values vs ONNX Runtime.

On the CPU targets ``scatter_elements`` and ``scatter_elements_reduce`` are loop-IR kernels
(``kiln.topi.index``): the extents checked, ``out = data``, then every update written (or
combined) at its checked index, in the updates' row-major order, as ONNX Runtime's CPU kernel
does. So duplicate indices with reduction ``none`` keep the last update, and the sums and
products equal ONNX Runtime's to the bit (float16 and bfloat16 combine in float32 and round
after each update; ONNX Runtime has no float16 add / mul nor any bfloat16 kernel, so those cases
are checked against a NumPy reference of that order). One known difference, not tested: max and
min keep a NaN once it is there (in the data or from an update), where ONNX Runtime's compare
takes a later update (data NaN, update 3: Kiln NaN, ONNX Runtime 3). Many
cases share one graph (one build per target: compilation dominates); the dynamic ones read only
the valid box of padded tensors, which a run at a larger shape first leaves holding stale
values. Device targets lower the op's compute (the search form) instead.
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
from kiln.tir.functor import substitute
from kiln.tir.simplify import simplify

ort = pytest.importorskip("onnxruntime")
ml_dtypes = pytest.importorskip("ml_dtypes")

TARGETS = ("llvm", "c")
RNG = np.random.default_rng(23)
BF16 = ml_dtypes.bfloat16
_T = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16,
      np.int64: TensorProto.INT64, np.int32: TensorProto.INT32, np.int8: TensorProto.INT8, np.bool_: TensorProto.BOOL}


def _values(shape: tuple, dtype: type, lo: int, hi: int) -> np.ndarray:
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        return RNG.integers(lo, hi, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def _case(xshape, ishape, axis, red, dtype=np.float32, idtype=np.int64, dup=False):
    """Inputs of one ScatterElements: negative indices throughout, few distinct ones if ``dup``."""
    n = xshape[axis]
    lo, hi = (-min(n, 2), min(n, 2)) if dup else (-n, n)
    return {"axis": axis, "red": red, "x": _values(xshape, dtype, -9, 9),
            "i": RNG.integers(lo, hi, ishape).astype(idtype), "u": _values(ishape, dtype, -4, 5)}


_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reference(c: dict) -> np.ndarray:
    """The updates applied one by one in row-major order, each combined in the accumulation
    dtype (float32 for float16 / bfloat16, the dtype itself otherwise) and rounded back."""
    x, idx, u = c["x"], c["i"].astype(np.int64), c["u"]
    axis = c["axis"] % x.ndim
    acc = np.float32 if x.dtype in (np.float16, BF16) else x.dtype
    out = x.copy()
    for p in np.ndindex(*idx.shape):
        q = list(p)
        q[axis] = int(idx[p]) % x.shape[axis]
        if c["red"] == "none":
            out[tuple(q)] = u[p]
        else:
            out[tuple(q)] = _COMBINE[c["red"]](np.asarray(out[tuple(q)], acc), np.asarray(u[p], acc)).astype(x.dtype)
    return out


def _ort_runs(c: dict) -> bool:
    """Whether ONNX Runtime's CPU kernel takes this case (no bfloat16, no float16 add / mul)."""
    return c["x"].dtype != BF16 and not (c["x"].dtype == np.float16 and c["red"] in ("add", "mul"))


SCATTERS = [
    *[_case((5, 6), (7, 6), 0, red, dup=True) for red in ("none", "add", "mul", "max", "min")],
    *[_case((4, 5, 3), (4, 8, 3), 1, red, dup=True) for red in ("none", "add", "mul", "max", "min")],
    *[_case((3, 4, 6), (3, 4, 9), -1, red, dup=True) for red in ("none", "add", "mul", "max", "min")],
    *[_case((6, 5), (9, 5), 0, red, dtype=np.int64, dup=True) for red in ("none", "add", "mul", "max", "min")],
    # distinct-ish indices, int32 ones, and updates smaller than the data off the axis
    _case((8, 7), (5, 3), 0, "none"),
    _case((8, 7), (5, 3), 1, "add", idtype=np.int32),
    _case((4, 9, 5), (2, 4, 3), 1, "max"),
    _case((4, 9, 5), (3, 2, 7), -1, "none", dup=True),
    _case((6,), (11,), 0, "none", dup=True),
    # the other data dtypes (float16 / bfloat16 combine in float32), more int32 indices
    *[_case((5, 4), (7, 3), 0, red, dtype=np.float16, dup=True) for red in ("none", "add", "mul", "max")],
    _case((3, 6, 2), (3, 8, 2), 1, "min", dtype=np.float16, idtype=np.int32, dup=True),
    *[_case((4, 5), (4, 9), 1, red, dtype=BF16, dup=True) for red in ("none", "add", "mul", "min")],
    _case((6, 3), (5, 3), 0, "max", dtype=BF16, idtype=np.int32),
    *[_case((6, 5), (8, 5), 0, red, dtype=np.int8, dup=True) for red in ("none", "add", "mul", "max")],
    _case((2, 7, 3), (2, 9, 3), 1, "min", dtype=np.int8, idtype=np.int32, dup=True),
    _case((5, 6), (9, 4), 0, "none", dtype=np.bool_, dup=True),
    _case((4, 3, 5), (4, 3, 8), -1, "none", dtype=np.bool_, idtype=np.int32, dup=True),
    _case((6, 5), (9, 5), 0, "mul", dtype=np.int64, idtype=np.int32, dup=True),
]


def _node(k: int, c: dict) -> onnx.NodeProto:
    kw = {} if c["red"] == "none" else {"reduction": c["red"]}
    return helper.make_node("ScatterElements", [f"x{k}", f"i{k}", f"u{k}"], [f"y{k}"], name=f"se{k}",
                            axis=c["axis"], **kw)


def _model(nodes: list, inputs: list, outputs: list) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def _static_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    ins, outs, feeds = [], [], {}
    for k, c in enumerate(SCATTERS):
        for key in ("x", "i", "u"):
            ins.append(helper.make_tensor_value_info(f"{key}{k}", _T[c[key].dtype.type], list(c[key].shape)))
            feeds[f"{key}{k}"] = c[key]
        outs.append(helper.make_tensor_value_info(f"y{k}", _T[c["x"].dtype.type], list(c["x"].shape)))
    return _model([_node(k, c) for k, c in enumerate(SCATTERS)], ins, outs), feeds


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _ort_static(feeds: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """ONNX Runtime's outputs of the static cases it runs (:func:`_ort_runs`), by case number."""
    ks = [k for k, c in enumerate(SCATTERS) if _ort_runs(c)]
    ins = [helper.make_tensor_value_info(f"{key}{k}", _T[feeds[f"{key}{k}"].dtype.type], list(feeds[f"{key}{k}"].shape))
           for k in ks for key in ("x", "i", "u")]
    outs = [helper.make_tensor_value_info(f"y{k}", _T[feeds[f"x{k}"].dtype.type], list(feeds[f"x{k}"].shape))
            for k in ks]
    model = _model([_node(k, SCATTERS[k]) for k in ks], ins, outs)
    got = _ort(model, {f"{key}{k}": feeds[f"{key}{k}"] for k in ks for key in ("x", "i", "u")})
    return dict(zip(ks, got))


def _build(model: onnx.ModelProto, target: str, **kw) -> kiln.GraphModule:
    mod, params = kiln.frontend.from_onnx(model, **kw)
    return kiln.GraphModule(kiln.build(mod, target=target, params=params)["default"](kiln.cpu()))


_BUILT: dict[tuple[str, str], kiln.GraphModule] = {}


def _static(target: str) -> tuple[kiln.GraphModule, onnx.ModelProto, dict[str, np.ndarray]]:
    model, feeds = _static_model()
    if ("static", target) not in _BUILT:
        _BUILT["static", target] = _build(model, target)
    return _BUILT["static", target], model, feeds


@pytest.mark.parametrize("target", TARGETS)
def test_every_reduction_axis_and_dtype_matches_onnxruntime(target: str) -> None:
    m, model, feeds = _static(target)
    m.run(**feeds)
    ort_out = _ort_static(feeds)
    assert len(ort_out) > len(SCATTERS) // 2
    for k, c in enumerate(SCATTERS):
        got = m.get_output(k).numpy()
        msg = f"case {k}: axis {c['axis']} {c['red']} {c['x'].dtype} indices {c['i'].dtype}"
        assert got.dtype == c["x"].dtype, msg
        # sequential, in ONNX Runtime's order: equal to the bit, last duplicate winning
        np.testing.assert_array_equal(got, _reference(c), err_msg=msg)
        if k in ort_out:
            np.testing.assert_array_equal(got, ort_out[k], err_msg=msg)


@pytest.mark.parametrize("target", TARGETS)
def test_duplicates_without_reduction_keep_the_last_update(target: str) -> None:
    m, model, feeds = _static(target)
    feeds = dict(feeds)
    feeds["i0"] = np.full_like(feeds["i0"], -1)  # every update of a column lands on the last row
    m.run(**feeds)
    got = m.get_output(0).numpy()
    np.testing.assert_array_equal(got[-1], feeds["u0"][-1])
    np.testing.assert_array_equal(got[:-1], feeds["x0"][:-1])
    np.testing.assert_array_equal(got, _ort_static(feeds)[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case,bad,axis,size", [(0, 5, 0, 5), (5, -6, 1, 5), (10, 6, 2, 6), (15, -7, 0, 6)])
def test_out_of_range_index_is_a_kernel_error(target: str, case: int, bad: int, axis: int, size: int) -> None:
    m, model, feeds = _static(target)
    feeds = dict(feeds)
    idx = feeds[f"i{case}"].copy()
    idx.flat[-1] = bad  # the last update: the updates before it were already applied
    feeds[f"i{case}"] = idx
    op = "scatter_elements" if SCATTERS[case]["red"] == "none" else "scatter_elements_reduce"
    with pytest.raises(KernelError, match=rf"graph node .*{op}: index into axis {axis} \(size {size}\).*"
                                          rf"index {bad} is out of range \[-{size}, {size - 1}\]"):
        m.run(**feeds)
    with pytest.raises(Exception):  # noqa: B017 - ORT's own error type; only that it refuses matters
        _ort_static(feeds)


# ----------------------------------------------------------------------------- dynamic shapes
def _dynamic_model(red: str, axis: int) -> onnx.ModelProto:
    """Data ``[n, 5]``, indices and updates ``[m, k]``: symbols on and off the axis."""
    kw = {} if red == "none" else {"reduction": red}
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="se_dyn", axis=axis, **kw)
    xs: list[str | int] = ["n", 5] if axis == 0 else [5, "n"]
    us = ["m", "k"] if axis == 0 else ["k", "m"]
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs),
                           helper.make_tensor_value_info("i", TensorProto.INT64, us),
                           helper.make_tensor_value_info("u", TensorProto.FLOAT, us)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, xs)])


_RANGES = {"n": (1, 9), "m": (1, 12), "k": (1, 5)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("red,axis", [("none", 0), ("add", 0), ("max", 1), ("none", 1)])
def test_dynamic_shapes_read_only_the_valid_box(target: str, red: str, axis: int) -> None:
    model = _dynamic_model(red, axis)
    m = _build(model, target, dim_ranges=_RANGES)

    def feeds(n: int, mm: int, k: int, dup: bool) -> dict[str, np.ndarray]:
        xs, us = ((n, 5), (mm, k)) if axis == 0 else ((5, n), (k, mm))
        lo = -min(n, 2) if dup else -n
        return {"x": RNG.standard_normal(xs).astype(np.float32),
                "i": RNG.integers(lo, -lo if dup else n, us).astype(np.int64),
                "u": RNG.standard_normal(us).astype(np.float32)}

    # the largest shapes first: the padding of every buffer then holds stale values the smaller
    # runs must neither read nor let into their outputs
    for n, mm, k, dup in [(9, 12, 5, False), (3, 7, 2, True), (6, 1, 5, False), (1, 4, 3, True)]:
        f = feeds(n, mm, k, dup)
        m.run(**f)
        got = m.get_output(0).numpy()
        want = _ort(model, f)[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want, err_msg=f"n={n} m={mm} k={k}")
    # an index into the padding (inside the storage, past the runtime extent) is out of range
    f = feeds(3, 4, 2, False)
    f["i"].flat[-1] = 3
    op = "scatter_elements" if red == "none" else "scatter_elements_reduce"
    with pytest.raises(KernelError, match=rf"{op}: index into axis {axis} \(dynamic size, at most 9\).*index 3 is "
                                          r"out of range \[-3, (2\]|3\))"):  # C and LLVM word it apart
        m.run(**f)


def _ranked_model(xs: list, us: list, axis: int, red: str = "none", upd: list | None = None) -> onnx.ModelProto:
    """One ScatterElements of float32 data of dims ``xs``, indices of dims ``us`` and updates of
    dims ``upd`` (default ``us``)."""
    kw = {} if red == "none" else {"reduction": red}
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="se", axis=axis, **kw)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs),
                           helper.make_tensor_value_info("i", TensorProto.INT64, us),
                           helper.make_tensor_value_info("u", TensorProto.FLOAT, us if upd is None else upd)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, xs)])


def _scatter_func(model: onnx.ModelProto, target: str, **kw) -> tir.PrimFunc:
    mod, params = kiln.frontend.from_onnx(model, **kw)
    (func,) = [f for f in lower(mod, target, params=params).funcs if "scatter_elements" in f.name]
    return func


def _copy_and_scatter(f: tir.PrimFunc) -> tuple[tir.For, tir.For]:
    """The kernel's two loop nests: the copy, then the scatter (after the extent checks)."""
    nests = [s for s in (f.body.seq if isinstance(f.body, tir.SeqStmt) else [f.body]) if isinstance(s, tir.For)]
    assert len(nests) == 2
    return nests[0], nests[1]


@pytest.mark.parametrize("target", TARGETS)
def test_large_data_copies_in_parallel(target: str) -> None:
    """Past ``SCATTER_PARALLEL_COPY_MIN`` elements the copy is one parallel loop over the valid
    box (chunks of the leading dims, the runtime extents unravelled); the scatter after it
    stays serial and ordered."""
    from kiln.topi.index import SCATTER_COPY_GRAIN, SCATTER_PARALLEL_COPY_MIN

    # 5000 per row: chunks of 4096 and a partial one; dims n and 3 unravelled from the fused index
    model = _ranked_model(["n", 3, 5000], ["m", 3, "k"], 0)
    ranges = {"n": (1, 64), "m": (1, 12), "k": (1, 5)}
    assert 3 * 5000 >= SCATTER_COPY_GRAIN and 64 * 3 * 5000 >= SCATTER_PARALLEL_COPY_MIN
    copy, scatter = _copy_and_scatter(_scatter_func(model, target, dim_ranges=ranges))
    assert copy.kind == "parallel"
    assert all(s.kind == "serial" for s in _loops(copy) if s is not copy)
    assert all(s.kind == "serial" for s in _loops(scatter))
    m = _build(model, target, dim_ranges=ranges)
    for n, mm in ((64, 12), (37, 5), (1, 3)):
        f: dict[str, np.ndarray] = {"x": RNG.standard_normal((n, 3, 5000)).astype(np.float32),
                                    "i": RNG.integers(-min(n, 2), min(n, 2), (mm, 3, 4)).astype(np.int64),
                                    "u": RNG.standard_normal((mm, 3, 4)).astype(np.float32)}
        m.run(**f)
        np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0], err_msg=f"n={n}")


@pytest.mark.parametrize("shape,dyn,at_least", [((2, 1_000_000), False, 2 * 244), ((4, 2, 1 << 18), True, 128),
                                                ((64, 1024), True, 1)])
def test_copy_is_cut_into_many_parallel_iterations(shape: tuple, dyn: bool, at_least: int) -> None:
    """The parallel copy does not stop at the first dim: a (2, 10^6) tensor, or a dynamic
    batch that is 1 at run time, still gives many iterations of about ``SCATTER_COPY_GRAIN``
    elements (a batch-1 (1, 1024) is one, as it is small)."""
    from kiln.topi import get_prim_kernel

    fn = get_prim_kernel("scatter_elements", "llvm")
    assert fn is not None
    n = tir.Var("n_rt", "int32")
    xdyn = (n,) + (None,) * (len(shape) - 1) if dyn else None
    x = tir.Buffer("p0", shape, "float32", dyn=xdyn)
    i = tir.Buffer("p1", (1,) * len(shape), "int64")
    u = tir.Buffer("p2", (1,) * len(shape), "float32")
    out = tir.Buffer("out0", shape, "float32", dyn=xdyn)
    copy, _ = _copy_and_scatter(fn({"axis": 0}, [x, i, u], [out], "k", "llvm"))
    assert copy.kind == "parallel"
    iters = simplify(substitute(copy.extent, {n: tir.const(1, "int32")}))
    assert isinstance(iters, tir.IntImm) and iters.value >= at_least


# ----------------------------------------------------------------------------- run-time extents
_OFF_AXIS = {"r": (1, 8), "n": (1, 8), "q": (1, 8), "p": (1, 8), "m": (1, 8)}


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_extents_off_the_axis_are_checked(target: str) -> None:
    """ONNX requires the indices' shape to equal the updates' and not to exceed the data's off
    the axis; with symbols on those dims it is checked at run time (a kernel error naming the
    dims and their extents), not by skipping the indices past the data's or the updates' rows."""
    model = _ranked_model(["r", "n"], ["q", "m"], 1, upd=["p", "m"])
    m = _build(model, target, dim_ranges=_OFF_AXIS)

    def feeds(xs: tuple, ishape: tuple, ushape: tuple) -> dict[str, np.ndarray]:
        return {"x": RNG.standard_normal(xs).astype(np.float32),
                "i": RNG.integers(-xs[1], xs[1], ishape).astype(np.int64),
                "u": RNG.standard_normal(ushape).astype(np.float32)}

    for xs, us in (((8, 8), (8, 8)), ((2, 5), (2, 3)), ((6, 5), (4, 3)), ((3, 2), (1, 7))):
        f = feeds(xs, us, us)
        m.run(**f)
        np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0], err_msg=f"data {xs} indices {us}")
    top = r"(2\]|3\))"  # the largest valid value 2: C writes [-3, 2], LLVM [-3, 3)
    bad = [(((2, 5), (4, 3), (4, 3)),
            r"indices larger than the data off axis 1: dim 0 of the indices, the index shown, "
            rf"must be at most dim 0 of the data, .*index 4 is out of range \[-3, {top}"),
           (((5, 5), (2, 3), (3, 3)),
            r"indices and updates of different shapes: dim 0 of the updates, the index shown, "
            rf"must equal dim 0 of the indices, .*index 3 is out of range \[-3, {top}"),
           (((5, 5), (3, 3), (2, 3)),
            r"indices and updates of different shapes: dim 0 of the indices, the index shown, "
            rf"must equal dim 0 of the updates, .*index 3 is out of range \[-3, {top}")]
    for (xs, ishape, ushape), msg in bad:
        f = feeds(xs, ishape, ushape)
        with pytest.raises(KernelError, match=rf"graph node .*scatter_elements: {msg}"):
            m.run(**f)
        with pytest.raises(Exception):  # noqa: B017 - ORT's own error type; only that it refuses matters
            _ort(model, f)


@pytest.mark.parametrize("target", TARGETS)
def test_updates_along_a_data_dependent_axis(target: str) -> None:
    """Faster R-CNN's RoI pooling: a NonZero-selected subset of rows, scattered back along that
    count (the detection-pattern test runs the whole pattern; this one the scatter alone)."""
    nodes = [helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Reshape", ["nz", "col"], ["rows"]),
             helper.make_node("Gather", ["feats", "rows"], ["sel"], axis=0),
             helper.make_node("Squeeze", ["rows", "one"], ["rows1"]),
             helper.make_node("Gather", ["feats", "rows1"], ["sel2"], axis=0),
             helper.make_node("Mul", ["sel2", "two"], ["upd"]),
             helper.make_node("Shape", ["upd"], ["ush"]),
             helper.make_node("Expand", ["rows", "ush"], ["index"]),
             helper.make_node("ScatterElements", ["base", "index", "upd"], ["y"], axis=0, name="se_rows")]
    inits = [helper.make_tensor("col", TensorProto.INT64, [2], [-1, 1]),
             helper.make_tensor("one", TensorProto.INT64, [1], [1]),
             helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("mask", TensorProto.BOOL, [10]),
                                       helper.make_tensor_value_info("feats", TensorProto.FLOAT, [10, 3]),
                                       helper.make_tensor_value_info("base", TensorProto.FLOAT, [10, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 3])], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    m = _build(model, target)
    feats = RNG.standard_normal((10, 3)).astype(np.float32)
    for mask in (np.ones(10, bool), RNG.random(10) < 0.4, np.zeros(10, bool), RNG.random(10) < 0.7):
        f = {"mask": mask, "feats": feats, "base": RNG.standard_normal((10, 3)).astype(np.float32)}
        m.run(**f)
        np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0])


# ----------------------------------------------------------------------------- the kernel's form
def _buffers(dyn: bool) -> tuple[list, list]:
    n = tir.Var("n_rt", "int32") if dyn else None
    x = tir.Buffer("p0", (6, 4), "float32", dyn=(n, None) if dyn else None)
    i = tir.Buffer("p1", (5, 4), "int64")
    u = tir.Buffer("p2", (5, 4), "float32")
    return [x, i, u], [tir.Buffer("out0", (6, 4), "float32", dyn=x.dyn)]


def _loops(f: tir.PrimFunc | tir.Stmt) -> list:
    found: list = []
    body = f.body if isinstance(f, tir.PrimFunc) else f
    tir.post_order_visit(body, lambda s: found.append(s) if isinstance(s, tir.For) else None)
    return found


@pytest.mark.parametrize("op,attrs", [("scatter_elements", {"axis": 0}),
                                      ("scatter_elements_reduce", {"axis": 0, "reduction": "mul"})])
def test_cpu_kernel_is_copy_then_scatter(op: str, attrs: dict) -> None:
    from kiln.topi import get_prim_kernel

    fn = get_prim_kernel(op, "llvm")
    assert fn is not None and get_prim_kernel(op, "c -keys=cpu") is fn
    args, outs = _buffers(dyn=True)
    cpu = fn(attrs, args, outs, "k", "llvm")
    # two loop nests, over the data (2 loops) and over the updates (2 loops), no reduction:
    # O(data + updates), where the search is O(data * updates along the axis)
    loops = _loops(cpu)
    assert len(loops) == 4 and all(s.kind == "serial" for s in loops)
    found: list = []
    tir.post_order_visit(cpu.body, lambda e: found.append(e) if isinstance(e, tir.Reduce) else None)
    assert not found


@pytest.mark.parametrize("target", ["cuda", "opencl"])
@pytest.mark.parametrize("red", ["none", "max"])
def test_device_targets_lower_the_search(target: str, red: str) -> None:
    """The loop-IR kernel is registered for CPU targets only: a device target gets the op's
    compute, lowered as any group (one work-item per output element; no device needed)."""
    from kiln.target import Target
    from kiln.topi import get_prim_kernel

    op = "scatter_elements" if red == "none" else "scatter_elements_reduce"
    assert get_prim_kernel(op, target) is None and get_prim_kernel(op, Target(target)) is None
    assert get_prim_kernel(op) is get_prim_kernel(op, Target("llvm")) is not None
    f = _scatter_func(_ranked_model([6, 5], [9, 5], 0, red), target)
    assert any(s.kind == "thread_binding" for s in _loops(f))


@pytest.mark.skipif(not kiln.opencl().exist, reason="no OpenCL device")
def test_opencl_runs_the_search() -> None:
    model = _ranked_model([6, 5], [9, 5], 0, "max")
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target="opencl", params=params)["default"](kiln.opencl()))
    f: dict[str, np.ndarray] = {"x": RNG.standard_normal((6, 5)).astype(np.float32),
                                "i": RNG.integers(-6, 6, (9, 5)).astype(np.int64),
                                "u": RNG.standard_normal((9, 5)).astype(np.float32)}
    m.run(**f)
    np.testing.assert_array_equal(m.get_output(0).numpy(), _ort(model, f)[0])


def test_prim_kernel_keys_are_validated() -> None:
    from kiln.runtime.errors import KilnError
    from kiln.topi import register_prim_kernel

    with pytest.raises(KilnError, match="keys must be non-empty target keys"):
        register_prim_kernel("scatter_elements_test_only", lambda *a: None, keys=())
