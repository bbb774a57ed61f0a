"""Indices read from data are checked: negative ones wrap, out-of-range ones are errors.

ONNX semantics (and ONNX Runtime's behaviour) for Gather and GatherElements: an index ``i``
into an axis of size ``n`` is valid for ``-n <= i < n``; anything else is an error. Kiln's
kernels check every such index before they read with it (``kiln.te.checked_index``), so a bad
index is a ``KernelError`` naming the graph node, the value and the valid range, never a
clamped value or a read outside the tensor. Gather and GatherElements go through the whole
flow (ONNX → build → graph executor) on both CPU targets; the ops without an ONNX converter
yet (gather_nd, one_hot) through the topi harness.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.runtime import ndarray as nd
from kiln.runtime.errors import KernelError

from tests.topi.harness import Case, case_params, ints, module_builder, run_and_check

TARGETS = ("llvm", "c")
_BUILT: dict[tuple, kiln.GraphModule] = {}


def _model(op: str, xshape: tuple[int, ...], ishape: tuple[int, ...], axis: int):
    if op == "Gather":
        oshape = xshape[:axis] + ishape + xshape[axis + 1:]
    else:
        oshape = ishape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))
    i = helper.make_tensor_value_info("i", TensorProto.INT64, list(ishape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(oshape))
    node = helper.make_node(op, ["x", "i"], ["y"], axis=axis, name="lookup")
    graph = helper.make_graph([node], "g", [x, i], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _module(target: str, op: str, xshape: tuple[int, ...], ishape: tuple[int, ...], axis: int = 0):
    """A graph module for one op and shape, built once per test session."""
    key = (target, op, xshape, ishape, axis)
    if key not in _BUILT:
        mod, params = kiln.frontend.from_onnx(_model(op, xshape, ishape, axis))
        lib = kiln.build(mod, target=target, params=params)
        _BUILT[key] = kiln.GraphModule(lib["default"](kiln.cpu()))
    return _BUILT[key]


def _run(m: kiln.GraphModule, x: np.ndarray, idx) -> np.ndarray:
    m.run(x=x, i=np.asarray(idx, dtype="int64"))
    return m.get_output(0).numpy()


def _ort(op: str, x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    model = _model(op, x.shape, idx.shape, axis)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "i": idx})[0]


X5 = np.arange(15, dtype="float32").reshape(5, 3)


@pytest.mark.parametrize("target", TARGETS)
def test_gather_negative_index_wraps(target):
    m = _module(target, "Gather", (5, 3), (4,))
    idx = np.array([0, -1, -5, 4], "int64")
    out = _run(m, X5, idx)
    np.testing.assert_array_equal(out, X5[[0, 4, 0, 4]])
    np.testing.assert_array_equal(out, _ort("Gather", X5, idx, 0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [1000, 5, -6])
def test_gather_out_of_range_is_a_kernel_error(target, bad):
    m = _module(target, "Gather", (5, 3), (4,))
    idx = np.array([0, 1, bad, 2], "int64")
    with pytest.raises(KernelError, match=rf"graph node .*take.*index {bad} is out of range \[-5, 4\]"):
        _run(m, X5, idx)
    # ONNX Runtime rejects the same input (it does not clamp either)
    ort = pytest.importorskip("onnxruntime")
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument):
        _ort("Gather", X5, idx, 0)
    # the module is still usable after the error
    np.testing.assert_array_equal(_run(m, X5, [4, 3, 2, 1]), X5[[4, 3, 2, 1]])


@pytest.mark.parametrize("target", TARGETS)
def test_gather_inner_axis(target):
    x = np.random.default_rng(0).standard_normal((2, 7, 3)).astype("float32")
    m = _module(target, "Gather", (2, 7, 3), (2, 2), axis=1)
    idx = np.array([[6, -7], [0, 3]], "int64")
    np.testing.assert_array_equal(_run(m, x, idx), _ort("Gather", x, idx, 1))
    with pytest.raises(KernelError, match=r"axis 1 \(size 7\).*index 7 is out of range \[-7, 6\]"):
        _run(m, x, [[0, 7], [1, 2]])


@pytest.mark.parametrize("target", TARGETS)
def test_gather_in_a_parallel_loop(target):
    """Large enough for the schedule's parallel loop: the error of a task on any pool thread
    makes the launch, then the kernel, fail with that task's message."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1000, 64)).astype("float32")
    m = _module(target, "Gather", (1000, 64), (4096,))
    good = rng.integers(-1000, 1000, size=4096)
    np.testing.assert_array_equal(_run(m, x, good), x[good])
    for pos in (0, 2047, 4095):
        idx = good.copy()
        idx[pos] = 1000 + pos
        with pytest.raises(KernelError, match=rf"index {1000 + pos} is out of range \[-1000, 999\]"):
            _run(m, x, idx)


def test_parallel_gather_kernel_is_parallel():
    """The kernel of the test above really launches a parallel loop (else it proves nothing)."""
    mod, params = kiln.frontend.from_onnx(_model("Gather", (1000, 64), (4096,), 0))
    src = kiln.build(mod, target="c", params=params).get_lib().get_source()
    assert "KilnBackendParallelLaunch(" in src and "kiln_index_error(" in src


@pytest.mark.parametrize("target", TARGETS)
def test_gather_elements(target):
    x = np.random.default_rng(2).standard_normal((4, 6)).astype("float32")
    m = _module(target, "GatherElements", (4, 6), (4, 3), axis=1)
    idx = np.array([[0, -1, 5], [-6, 2, 3], [1, 1, 1], [5, 4, -2]], "int64")
    np.testing.assert_array_equal(_run(m, x, idx), _ort("GatherElements", x, idx, 1))
    bad = idx.copy()
    bad[3, 2] = 6
    with pytest.raises(KernelError, match=r"gather_elements: index into axis 1 \(size 6\).*index 6 is out of "
                                          r"range \[-6, 5\]"):
        _run(m, x, bad)
    bad[3, 2] = -7
    with pytest.raises(KernelError, match=r"index -7 is out of range"):
        _run(m, x, bad)


@pytest.mark.parametrize("target", TARGETS)
def test_gather_zero_indices(target):
    m = _module(target, "Gather", (5, 3), (0,))
    out = _run(m, X5, np.zeros((0,), "int64"))
    assert out.shape == (0, 3)


@pytest.mark.parametrize("target", TARGETS)
def test_gather_zero_size_axis(target):
    empty = np.zeros((0, 3), "float32")
    # zero indices into a zero-size axis: an empty result, and no read
    m = _module(target, "Gather", (0, 3), (0,))
    assert _run(m, empty, np.zeros((0,), "int64")).shape == (0, 3)
    # any index into a zero-size axis is out of range (this read used to overflow the buffer)
    m = _module(target, "Gather", (0, 3), (2,))
    with pytest.raises(KernelError, match=r"index 0 is out of range: the axis has size 0"):
        _run(m, empty, [0, 0])


def test_reference_rejects_out_of_range():
    """The IR ops' NumPy references (constant folding, the interpreter) agree with the kernels."""
    from kiln.ir import get_op
    from kiln.runtime.errors import InputError

    take = get_op("take")
    np.testing.assert_array_equal(take.ref([X5, np.array([-1])], {"axis": 0})[0], X5[[4]])
    with pytest.raises(InputError, match=r"take: index 1000 into axis 0 \(size 5\) is out of range \[-5, 4\]"):
        take.ref([X5, np.array([1000])], {"axis": 0})
    ge = get_op("gather_elements")
    with pytest.raises(InputError, match=r"gather_elements: index -4 into axis 1 \(size 3\)"):
        ge.ref([X5, np.full((5, 1), -4)], {"axis": 1})


# ----------------------------------------------------------------------------- kernels directly
# gather_nd and one_hot have no ONNX converter yet: their kernels are checked through the
# topi harness (compute → schedule → lower → one module per target).
_F32 = "float32"
CASES = [
    Case("gather_nd", [((4, 5, 3), _F32), ((2, 2), "int64", ints(-4, 4))], {}),
    Case("gather_nd", [((4, 5, 3), _F32), ((3, 1, 3), "int32", ints(-3, 3))], {}, label="full"),
    Case("gather_nd", [((2, 5, 3), _F32), ((2, 4, 1), "int64", ints(-5, 5))], {"batch_dims": 1}, label="batch"),
    Case("one_hot", [((3, 4), "int64", ints(-9, 9)), ((2,), _F32)], {"depth": 5}),
    Case("one_hot", [((6,), "int32", ints(-7, 7)), ((2,), "int64")], {"depth": 6, "axis": 0}, label="ax0"),
    Case("scatter_elements", [((4, 6), _F32), ((3, 2), "int64", ints(-4, 4)), ((3, 2), _F32)], {}),
    Case("scatter_elements", [((4, 6), _F32), ((4, 6), "int32", ints(-6, 6)), ((4, 6), _F32)], {"axis": 1},
         label="full"),
    Case("scatter_nd", [((5, 4, 3), _F32), ((2, 2), "int64", ints(-4, 4)), ((2, 3), _F32)], {}),
    Case("scatter_nd", [((5, 4), _F32), ((3, 1), "int64", ints(-5, 5)), ((3, 4), _F32)], {}, label="rows"),
]
_kernels = module_builder(CASES, "ib")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_kernel_matches_reference(target, idx):
    mod, built = _kernels(target)
    run_and_check(mod, built[idx])


def _call(target: str, idx: int, *arrays: np.ndarray) -> np.ndarray:
    mod, built = _kernels(target)
    b = built[idx]
    out = nd.empty(b.out_types[0].shape, b.out_types[0].dtype)
    mod[b.name](*[nd.array(a) for a in arrays], out)
    return out.numpy()


@pytest.mark.parametrize("target", TARGETS)
def test_gather_nd_out_of_range(target):
    x = np.arange(60, dtype="float32").reshape(4, 5, 3)
    np.testing.assert_array_equal(_call(target, 0, x, np.array([[-1, -5], [3, 4]], "int64")), x[[3, 3], [0, 4]])
    with pytest.raises(KernelError, match=r"gather_nd: index into axis 1 \(size 5\).*index 5 is out of range "
                                          r"\[-5, 4\]"):
        _call(target, 0, x, np.array([[0, 0], [1, 5]], "int64"))
    with pytest.raises(KernelError, match=r"gather_nd: index into axis 0 \(size 4\).*index -5 is out of range"):
        _call(target, 0, x, np.array([[-5, 0], [1, 1]], "int64"))
    xb = np.arange(30, dtype="float32").reshape(2, 5, 3)
    with pytest.raises(KernelError, match=r"index 5 is out of range \[-5, 4\]"):
        _call(target, 2, xb, np.array([[[0], [1], [2], [5]], [[0], [0], [0], [0]]], "int64"))


@pytest.mark.parametrize("target", TARGETS)
def test_one_hot_out_of_range_is_an_all_off_row(target):
    """ONNX: indices outside [-depth, depth) give all-off rows (not an error)."""
    idx = np.array([[0, -1, 5, -6], [4, 100, -100, 2], [1, 1, 1, 1]], "int64")
    vals = np.array([-1.0, 3.0], "float32")
    out = _call(target, 3, idx, vals)
    ref = np.full((3, 4, 5), -1.0, "float32")
    for pos in np.ndindex(3, 4):
        v = idx[pos]
        if -5 <= v < 5:
            ref[pos + (v % 5,)] = 3.0
    np.testing.assert_array_equal(out, ref)
    ort = pytest.importorskip("onnxruntime")
    model = helper.make_model(helper.make_graph(
        [helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=-1)], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [3, 4]),
         helper.make_tensor_value_info("d", TensorProto.INT64, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 5])]),
        opset_imports=[helper.make_opsetid("", 11)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(out, sess.run(None, {"i": idx, "d": np.array(5, "int64"), "v": vals})[0])


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_elements_out_of_range(target):
    x = np.zeros((4, 6), "float32")
    upd = np.arange(1, 7, dtype="float32").reshape(3, 2)
    idx = np.array([[0, -1], [3, 1], [-4, 2]], "int64")
    ref = x.copy()
    for u in np.ndindex(3, 2):
        ref[idx[u] % 4, u[1]] = upd[u]
    np.testing.assert_array_equal(_call(target, 5, x, idx, upd), ref)
    for bad in (4, -5, 1000):
        b = idx.copy()
        b[2, 1] = bad
        with pytest.raises(KernelError, match=rf"scatter_elements: index into axis 0 \(size 4\).*index {bad} is "
                                              r"out of range \[-4, 3\]"):
            _call(target, 5, x, b, upd)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_nd_out_of_range(target):
    x = np.zeros((5, 4, 3), "float32")
    upd = np.arange(6, dtype="float32").reshape(2, 3)
    idx = np.array([[4, -1], [-5, 0]], "int64")
    ref = x.copy()
    ref[4, 3], ref[0, 0] = upd[0], upd[1]
    np.testing.assert_array_equal(_call(target, 7, x, idx, upd), ref)
    with pytest.raises(KernelError, match=r"scatter_nd: index into axis 1 \(size 4\).*index 4 is out of range "
                                          r"\[-4, 3\]"):
        _call(target, 7, x, np.array([[0, 0], [1, 4]], "int64"), upd)
    with pytest.raises(KernelError, match=r"scatter_nd: index into axis 0 \(size 5\).*index -6 is out of range"):
        _call(target, 7, x, np.array([[-6, 0], [1, 1]], "int64"), upd)


def test_scatter_into_zero_size_axis_is_rejected_at_compile_time():
    """With static shapes, a non-empty scatter into a zero-size axis can never be valid."""
    from kiln.ir import TensorType, get_op
    from kiln.runtime.errors import InputError

    op = get_op("scatter_nd")
    with pytest.raises(InputError, match="none can be valid"):
        op.type_rel([TensorType((0, 3), "float32"), TensorType((1, 1), "int64"), TensorType((1, 3), "float32")],
                    op.normalize_attrs({}))
    op = get_op("scatter_elements")
    with pytest.raises(InputError, match="none can be valid"):
        op.type_rel([TensorType((0, 3), "float32"), TensorType((2, 3), "int64"), TensorType((2, 3), "float32")],
                    op.normalize_attrs({}))
    # no indices at all is fine
    assert op.type_rel([TensorType((0, 3), "float32"), TensorType((0, 3), "int64"),
                        TensorType((0, 3), "float32")], op.normalize_attrs({}))[0].shape == (0, 3)


@pytest.mark.skipif(not kiln.opencl().exist, reason="no OpenCL device")
def test_gather_on_opencl_wraps_and_clamps():
    """Device kernels have no error path: the documented fallback is wrap + clamp (no stray
    read). An index into a zero-size axis cannot be made safe, so it does not compile."""
    mod, params = kiln.frontend.from_onnx(_model("Gather", (5, 3), (4,), 0))
    lib = kiln.build(mod, target="opencl", params=params)
    m = kiln.GraphModule(lib["default"](kiln.cpu(), kiln.opencl()))
    np.testing.assert_array_equal(_run(m, X5, [0, -1, 1000, -6]), X5[[0, 4, 4, 0]])
    mod, params = kiln.frontend.from_onnx(_model("Gather", (0, 3), (2,), 0))
    with pytest.raises(kiln.runtime.errors.CompileError, match="zero-size axis"):
        kiln.build(mod, target="opencl", params=params)
