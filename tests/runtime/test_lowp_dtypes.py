"""The low-precision dtypes (float8 variants, float4_e2m1fn, int4, uint4, int2, uint2) end to end:
the dtype table, NDArrays and params files (one element per byte, ml_dtypes' layout), DLPack
(sub-byte types refused), and ONNX models whose initializers ONNX packs (int4 two per byte)
compiled, exported and run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.runtime import dtype as rt
from kiln.runtime import load_param_dict, save_param_dict
from kiln.runtime.errors import InputError

# name -> (DLPack code, DLPack bits)
DL = {
    "float8_e4m3fn": (10, 8), "float8_e4m3fnuz": (11, 8), "float8_e5m2": (12, 8), "float8_e5m2fnuz": (13, 8),
    "float8_e8m0fnu": (14, 8), "float4_e2m1fn": (17, 4), "int4": (0, 4), "uint4": (1, 4), "int2": (0, 2),
    "uint2": (1, 2),
}


def _values(name: str, n: int = 24) -> np.ndarray:
    """Every storage byte's value, repeated: float8 codes 0..255, small types their valid codes."""
    codes = (np.arange(n) % (1 << rt.dl_bits(name))).astype(np.uint8)
    return codes.view(rt.np_dtype(name))


@pytest.mark.parametrize("name", sorted(DL))
def test_table(name):
    assert name in rt.SUPPORTED and name in rt.LOW_PRECISION_DTYPES
    assert name not in rt.FLOAT_DTYPES | rt.SIGNED_DTYPES | rt.UNSIGNED_DTYPES
    dl = rt.to_dl(name)
    assert (dl.code, dl.bits, dl.lanes) == (*DL[name], 1)
    assert rt.from_dl(*DL[name]) == name
    assert rt.itemsize(name) == 1 and rt.bits(name) == 8 and rt.dl_bits(name) == DL[name][1]
    assert (name in rt.SUB_BYTE_DTYPES) == (DL[name][1] < 8)
    assert rt.np_dtype(name) == np.dtype(getattr(ml_dtypes, name))
    assert rt.canonical(getattr(ml_dtypes, name)) == rt.canonical(np.dtype(getattr(ml_dtypes, name))) == name


@pytest.mark.parametrize("name", sorted(DL))
def test_ndarray_holds_one_element_per_byte(name):
    x = _values(name).reshape(4, 6)
    a = kiln.nd.array(x)
    assert a.dtype == name and a.nbytes == 24 and a.shape == (4, 6)
    y = a.numpy()
    assert y.dtype == x.dtype
    assert y.view(np.uint8).tolist() == x.view(np.uint8).tolist()
    v = a._create_view((6,), byte_offset=6)
    assert v.numpy().view(np.uint8).tolist() == x.view(np.uint8)[1].tolist()


@pytest.mark.parametrize("name", sorted(DL))
def test_params_round_trip(name):
    x = _values(name).reshape(2, 12)
    blob = save_param_dict({"w": x})
    # the record's DLDataType is DLPack's, its data one byte per element
    head = blob.index(b"\x3f\xa1\xb4\x96\xf0\x40\x5e\xdd")  # tensor magic
    code, bits = blob[head + 28], blob[head + 29]
    assert (code, bits) == DL[name]
    assert int.from_bytes(blob[head + 48:head + 56], "little") == 24  # nbytes
    got = load_param_dict(blob)["w"]
    assert got.dtype == name and got.numpy().view(np.uint8).tolist() == x.view(np.uint8).tolist()


@pytest.mark.parametrize("name", sorted(rt.SUB_BYTE_DTYPES))
def test_dlpack_refuses_sub_byte_types(name):
    a = kiln.nd.array(_values(name))
    with pytest.raises(BufferError, match="one per byte"):
        a.__dlpack__()


def test_dlpack_carries_float8():
    a = kiln.nd.array(_values("float8_e4m3fn", 256))
    b = kiln.nd.from_dlpack(a)
    assert b.dtype == "float8_e4m3fn" and b.data_ptr == a.data_ptr


def test_unknown_dlpack_sub_byte_import_is_refused():
    from kiln.runtime import dlpack as kdl

    a = kiln.nd.array(np.zeros(4, np.int8))
    a.handle.dtype = rt.to_dl("int4")  # what a producer of packed int4 would hand over
    cap = kdl.export_capsule(a.handle, a)
    with pytest.raises(InputError, match="one element per byte"):
        kiln.nd.from_dlpack(cap)


# ----------------------------------------------------------------------------- ONNX models
W = np.array([[-8, -3, 0, 7, 5], [1, 2, 3, -1, -2], [4, -4, 6, -6, 0]], ml_dtypes.int4)  # an odd count


def _dequant_model(w_input: bool = False) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """y = float8(x_f8 @ DequantizeLinear(w_int4, scale, zp) / ys); the int4 weights an initializer
    (packed two per byte by ONNX; folded at import) or a graph input (an int4 runtime input)."""
    w = W
    t = numpy_helper.from_array(w, "w")
    assert len(t.raw_data) == (w.size + 1) // 2  # packed in the file
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s", "zp"], ["wf"], axis=0),
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["xf", "wf"], ["y0"]),
        helper.make_node("QuantizeLinear", ["y0", "ys"], ["y"], output_dtype=TensorProto.FLOAT8E5M2,
                         saturate=0),
    ]
    inits = [] if w_input else [t]
    inits += [numpy_helper.from_array(np.array([0.5, 0.25, 2.0], np.float32), "s"),
             numpy_helper.from_array(np.array([1, 0, -1], ml_dtypes.int4), "zp"),
             numpy_helper.from_array(np.array(0.125, np.float32), "ys")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [2, 3])]
    if w_input:
        ins.append(helper.make_tensor_value_info("w", TensorProto.INT4, [3, 5]))
    g = helper.make_graph(nodes, "lowp", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT8E5M2, [2, 5])],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 11
    x = np.array([[1.5, -0.25, 448], [-3, 0.0625, 20]], ml_dtypes.float8_e4m3fn)
    wf = (w.astype(np.float32) - np.array([[1], [0], [-1]], np.float32)) * np.array([[0.5], [0.25], [2.0]], np.float32)
    want = ((x.astype(np.float32) @ wf) / np.float32(0.125)).astype(ml_dtypes.float8_e5m2)
    return m, x, want


def _build(target: str = "llvm", w_input: bool = True):
    m, x, want = _dequant_model(w_input)
    graph, params = kiln.frontend.from_onnx(m)
    assert graph.inputs[0].dtype == "float8_e4m3fn" and graph.outputs[0].dtype == "float8_e5m2"
    if w_input:
        assert graph.inputs[1].dtype == "int4"
    return kiln.build(graph, target=target, params=params), x, want


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("w_input", [False, True], ids=["packed-initializer", "int4-input"])
def test_onnx_model_with_int4_weights_runs(target, w_input):
    factory, x, want = _build(target, w_input)
    assert ('"int4"' in factory.get_graph_json()) == w_input
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.run(x=x, **({"w": W} if w_input else {}))
    got = m.get_output(0).numpy()
    assert got.dtype == want.dtype
    assert got.view(np.uint8).tolist() == want.view(np.uint8).tolist()


FRESH = textwrap.dedent(
    """
    import sys, numpy as np, ml_dtypes, kiln
    m = kiln.GraphModule(kiln.runtime.load_module(sys.argv[1])["default"](kiln.cpu()))
    x = np.array([[1.5, -0.25, 448], [-3, 0.0625, 20]], ml_dtypes.float8_e4m3fn)
    w = np.array([[-8, -3, 0, 7, 5], [1, 2, 3, -1, -2], [4, -4, 6, -6, 0]], ml_dtypes.int4)
    m.run(x=x, w=w)
    y = m.get_output(0).numpy()
    print(y.dtype.name, y.view(np.uint8).ravel().tolist())
    """
)


def test_exported_library_keeps_the_low_precision_types(tmp_path):
    factory, x, want = _build()
    path = str(tmp_path / "lowp.so")
    factory.export_library(path)
    res = subprocess.run([sys.executable, "-c", FRESH, path], capture_output=True, text=True, timeout=300,
                         env={**os.environ})
    assert res.returncode == 0, res.stderr
    name, data = res.stdout.strip().split(" ", 1)
    assert name == "float8_e5m2" and eval(data) == want.view(np.uint8).ravel().tolist()
    assert '"float8_e4m3fn"' in factory.get_graph_json() and '"int4"' in factory.get_graph_json()
