"""Index, scatter and scan-like ONNX ops (issue 12) against ONNX Runtime: Trilu, CumSum, CumProd,
ReverseSequence, TensorScatter, Det, EyeLike, the window functions, Compress and the
scatters with a reduction. ``check_node`` runs the imported graph with the IR reference; the
compiled kernels are checked against that reference in tests/topi/test_index.py, and end to
end here for a few ops."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.errors import InputError, KernelError, UnsupportedOpError
from tests.frontend.onnx_check import check_node, make_model, rand, run_ort

pytest.importorskip("onnxruntime")


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2, 9])
def test_trilu(upper: int, k: int | None) -> None:
    ins = {"x": rand(2, 4, 5, lo=-3, hi=3)}
    if k is not None:
        ins["k"] = np.array(k, np.int64)
    check_node("Trilu", ins, {"upper": upper}, opset=14, const_inputs=["k"] if k is not None else ())


@pytest.mark.parametrize("op,opset", [("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_scans(op: str, opset: int, exclusive: int, reverse: int, axis: int) -> None:
    x = rand(3, 6, lo=0.5, hi=1.5)
    check_node(op, {"x": x, "axis": np.array(axis, np.int32)}, {"exclusive": exclusive, "reverse": reverse},
               opset=opset, const_inputs=["axis"])


def test_cumsum_int() -> None:
    check_node("CumSum", {"x": rand(4, 5, dtype="int32", lo=-9, hi=9), "axis": np.array(1, np.int64)},
               {"exclusive": 1}, opset=14, const_inputs=["axis"])


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    x = rand(4, 4, 3)
    check_node("ReverseSequence", {"x": x, "lens": _i64(4, 0, 2, 1)},
               {"batch_axis": batch_axis, "time_axis": time_axis}, opset=10)


@pytest.mark.parametrize("mode,wi", [("linear", None), ("linear", (0, 3)), ("circular", (6, 1))])
def test_tensor_scatter(mode: str, wi: tuple[int, ...] | None) -> None:
    ins = {"cache": rand(2, 3, 7, 4), "upd": rand(2, 3, 3, 4, seed=1),
           "wi": None if wi is None else _i64(*wi)}
    check_node("TensorScatter", ins, {"mode": mode}, opset=24)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (1, 1)])
def test_det(shape: tuple[int, ...]) -> None:
    check_node("Det", {"x": rand(*shape, lo=-2, hi=2)}, opset=11, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs", [{}, {"k": 1}, {"k": -2, "dtype": 6}])
def test_eye_like(attrs: dict) -> None:
    check_node("EyeLike", {"x": rand(3, 5)}, attrs, opset=9)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op: str, periodic: int) -> None:
    check_node(op, {"size": np.array(10, np.int64)}, {"periodic": periodic}, opset=17, const_inputs=["size"],
               atol=1e-6)


@pytest.mark.parametrize("axis", [None, 0, -1])
def test_compress(axis: int | None) -> None:
    x = rand(3, 4)
    n = x.size if axis is None else x.shape[axis]
    cond = (np.arange(n) % 3 != 1)[: n - 1]  # shorter than the axis, as numpy.compress allows
    check_node("Compress", {"x": x, "cond": cond}, {} if axis is None else {"axis": axis}, opset=11,
               const_inputs=["cond"])


def test_compress_with_a_runtime_condition() -> None:
    # the number of kept rows is decided by the kernel at run time (a data-dependent dim)
    check_node("Compress", {"x": rand(3, 4), "cond": np.array([True, False, True])}, {"axis": 0}, opset=11)


@pytest.mark.parametrize("red", ["add", "mul", "max", "min"])
def test_scatter_reductions(red: str) -> None:
    x = rand(4, 5, 3)
    check_node("ScatterElements", {"x": x, "i": rand(4, 6, 3, dtype="int64", lo=-5, hi=4),
                                   "u": rand(4, 6, 3, seed=2)}, {"axis": 1, "reduction": red}, opset=18)
    check_node("ScatterND", {"x": x, "i": rand(5, 2, dtype="int64", lo=-2, hi=1), "u": rand(5, 3, seed=3)},
               {"reduction": red}, opset=18)


def test_det_too_large_is_unsupported() -> None:
    with pytest.raises(UnsupportedOpError, match="Det node .*6x6"):
        check_node("Det", {"x": rand(6, 6)}, opset=11)


def test_bad_sequence_length_raises_at_run_time() -> None:
    """The compiled kernel (not only the reference) refuses a length past the time axis, like ORT."""
    from onnx import helper

    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], name="rs", batch_axis=0, time_axis=1)
    feeds = {"x": rand(2, 3), "lens": _i64(1, 4)}
    model = make_model([node], feeds, ["y"], opset=10)
    with pytest.raises(Exception):  # noqa: B017 - ORT's own error type; only that it refuses matters
        run_ort(model, feeds)
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target="llvm", params=params)["default"](kiln.cpu()))
    feeds["lens"] = _i64(1, 3)
    m.run(**feeds)
    np.testing.assert_array_equal(m.get_output(0).numpy(), run_ort(model, feeds)[0])
    feeds["lens"] = _i64(1, 4)
    with pytest.raises(KernelError, match="sequence length"):
        m.run(**feeds)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_compiled_scatter_and_scan_match_onnxruntime(target: str) -> None:
    from onnx import helper

    nodes = [helper.make_node("ScatterElements", ["x", "i", "u"], ["s"], axis=0, reduction="add"),
             helper.make_node("CumSum", ["s", "ax"], ["c"], reverse=1),
             helper.make_node("Trilu", ["c"], ["y"], upper=0)]
    feeds = {"x": rand(5, 5), "i": rand(7, 5, dtype="int64", lo=-5, hi=4), "u": rand(7, 5, seed=4)}
    model = make_model(nodes, feeds, ["y"], opset=18, initializers={"ax": np.array(1, np.int64)})
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target=target, params=params)["default"](kiln.cpu()))
    m.run(**feeds)
    np.testing.assert_allclose(m.get_output(0).numpy(), run_ort(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_trilu_of_a_vector_is_an_input_error() -> None:
    from onnx import helper

    feeds = {"x": rand(5)}
    model = make_model([helper.make_node("Trilu", ["x"], ["y"], name="tri")], feeds, ["y"], opset=14)
    with pytest.raises(InputError, match="Trilu node .tri.*rank >= 2"):
        kiln.frontend.from_onnx(model)


@pytest.mark.parametrize("n_mel,dft,rate,lo,hi", [(8, 16, 8192, 0.0, 4096.0), (12, 64, 16000, 100.0, 5000.0)])
def test_mel_weight_matrix(n_mel: int, dft: int, rate: int, lo: float, hi: float) -> None:
    """The edge frequencies stay run-time inputs (elementwise kernels); the sizes are frozen."""
    ins = {"n": np.array(n_mel, np.int64), "dft": np.array(dft, np.int64), "rate": np.array(rate, np.int64),
           "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
    check_node("MelWeightMatrix", ins, opset=17, const_inputs=["n", "dft", "rate"], atol=1e-6)
