"""The C API example ``examples/c/run_model.c`` on a library with dynamic dims.

One ONNX model with a symbolic batch and sequence (``x`` of shape (batch, seq, 8), ``mask`` of
shape (batch, seq)) is exported once; the example runs it at several shapes given with
``--shape``, and what it writes is compared with NumPy at the same shape. ``--info`` must show
the symbols, their ranges and each tensor's dims; bad shapes and input files must end the program
with a message and a non-zero status (never a signal).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from tests.capi.test_c_api import EXAMPLE, _cc, _run
from tests.capi.test_c_api import pytestmark as _needs_cc

pytestmark = _needs_cc
RNG = np.random.default_rng(5)
W = RNG.standard_normal((8, 4)).astype("float32")
B = RNG.standard_normal(4).astype("float32")
RANGES = {"batch": (1, 4), "seq": (1, 6)}


def _onnx_model():
    # y = relu(x @ W + B) * mask[..., None]; pooled = y summed over seq: the outputs' dims are
    # (batch, seq, 4) and (batch, 4), so both symbols reach the outputs
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Unsqueeze", ["mask", "axis"], ["mask3"]),
             helper.make_node("Mul", ["r", "mask3"], ["y"]),
             helper.make_node("ReduceSum", ["y", "axis1"], ["pooled"], keepdims=0)]
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B"),
             numpy_helper.from_array(np.array([2], "int64"), "axis"),
             numpy_helper.from_array(np.array([1], "int64"), "axis1")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
           helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 4])]
    graph = helper.make_graph(nodes, "masked_dense", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _numpy(x: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    y = np.maximum(x @ W + B, 0) * mask[..., None]
    return [y, y.sum(axis=1)]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[str, str]:
    """The exported library, and the example compiled as plain C99 with every warning an error."""
    tmp = tmp_path_factory.mktemp("run_model_dynamic")
    graph, params = kiln.frontend.from_onnx(_onnx_model(), dim_ranges=RANGES)
    lib = kiln.build(graph, params=params, target="llvm").export_library(str(tmp / "dyn.so"))
    exe = _cc(str(tmp / "run_model"), "-std=c99", "-Wextra", "-pedantic", EXAMPLE, "-ldl")
    return lib, exe


def _feeds(b: int, s: int) -> dict[str, np.ndarray]:
    mask = np.ones((b, s), "float32")
    mask[:, s // 2 + 1:] = 0
    return {"x": RNG.standard_normal((b, s, 8)).astype("float32"), "mask": mask}


def _files(tmp, feeds: dict[str, np.ndarray]) -> list[str]:
    paths = []
    for name, arr in feeds.items():
        path = str(tmp / f"{name}.bin")
        np.ascontiguousarray(arr).tofile(path)
        paths.append(path)
    return paths


def _shape_args(feeds: dict[str, np.ndarray]) -> list[str]:
    return [a for name, arr in feeds.items() for a in ("--shape", f"{name}:{','.join(map(str, arr.shape))}")]


@pytest.mark.parametrize("b, s", [(2, 5), (1, 1), (4, 6)])
def test_runs_at_the_given_shapes_and_writes_actual_shapes(built, tmp_path, b, s):
    lib, exe = built
    feeds = _feeds(b, s)
    prefix = str(tmp_path / "out")
    proc = _run([exe, lib, *_shape_args(feeds), *_files(tmp_path, feeds), "--out", prefix])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"input 0 'x': dtype code 2 bits 32, shape ({b}, {s}, 8), {b * s * 32} bytes" in proc.stdout
    for i, want in enumerate(_numpy(**feeds)):
        shape = ", ".join(map(str, want.shape))
        assert f"output {i} 'output{i}': dtype code 2 bits 32, shape ({shape}), {want.nbytes} bytes" in proc.stdout
        got = np.fromfile(f"{prefix}{i}.bin", np.float32)
        assert got.size == want.size, f"output {i}: {got.size} values written, shape {want.shape}"
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_without_shapes_inputs_are_the_upper_bounds(built):
    lib, exe = built
    proc = _run([exe, lib])  # no files: zeros at (4, 6, 8) and (4, 6)
    assert proc.returncode == 0, proc.stderr
    assert "input 0 'x': dtype code 2 bits 32, shape (4, 6, 8), 768 bytes" in proc.stdout
    assert "output 1 'output1': dtype code 2 bits 32, shape (4, 4), 64 bytes" in proc.stdout


def _dims_under(lines: list[str], tensor_line: str) -> str:
    return lines[lines.index(tensor_line) + 1]


def test_info_lists_symbols_ranges_and_dims(built):
    lib, exe = built
    proc = _run([exe, lib, "--info"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "symbol 0 'batch': 1..4" in lines and "symbol 1 'seq': 1..6" in lines
    f32 = "dtype code 2 bits 32"
    assert _dims_under(lines, f"input 0 'x': {f32}, shape (4, 6, 8), 768 bytes") == "  dims (batch, seq, 8)"
    assert _dims_under(lines, f"input 1 'mask': {f32}, shape (4, 6), 96 bytes") == "  dims (batch, seq)"
    assert _dims_under(lines, f"output 0 'output0': {f32}, shape (4, 6, 4), 384 bytes") == "  dims (batch, seq, 4)"
    assert _dims_under(lines, f"output 1 'output1': {f32}, shape (4, 4), 64 bytes") == "  dims (batch, 4)"


@pytest.mark.parametrize("case, status, message", [
    ("batch_out_of_range", 2, "KilnModelSetInputShaped: input 'x': dim 0 (batch) is 5, outside its range 1..4"),
    ("seq_out_of_range", 2, "input 'mask': dim 1 (seq) is 7, outside its range 1..6"),
    ("wrong_rank", 2, "input 'x': shape (2, 3) has 2 dims, expected 3"),
    ("inconsistent", 2, "KilnModelRun: inconsistent input shapes"),
    ("file_too_short", 2, "input 'x' of shape (2, 3, 8) takes 192 bytes, but {x} has 188 bytes"),
    ("file_too_long", 2, "input 'mask' of shape (4, 6) takes 96 bytes, but {mask} has 24 bytes"),
    ("unknown_name", 1, "--shape nope: model 'default' has no input 'nope'; its inputs: 'x', 'mask'"),
    ("malformed", 2, "bad --shape 'x:2,,8'"),
])
def test_errors_are_messages_and_statuses(built, tmp_path, case, status, message):
    lib, exe = built
    feeds = _feeds(2, 3)
    shapes = {"x": "2,3,8", "mask": "2,3"}
    if case == "batch_out_of_range":
        feeds, shapes = _feeds(5, 3), {"x": "5,3,8", "mask": "5,3"}
    elif case == "seq_out_of_range":
        feeds, shapes = {"x": _feeds(2, 6)["x"], "mask": np.ones((2, 7), "float32")}, {"x": "2,6,8", "mask": "2,7"}
    elif case == "wrong_rank":
        shapes["x"] = "2,3"
        feeds["x"] = feeds["x"][:, :, 0]
    elif case == "inconsistent":
        shapes["mask"] = "3,3"
        feeds["mask"] = np.ones((3, 3), "float32")
    elif case == "file_too_short":
        feeds["x"] = feeds["x"].reshape(-1)[:-1]
    elif case == "file_too_long":
        shapes = {"x": "2,3,8"}  # mask at its upper bounds (4, 6), but the file holds (2, 3)
    elif case == "unknown_name":
        shapes["nope"] = "1"
    elif case == "malformed":
        shapes["x"] = "2,,8"
    files = _files(tmp_path, feeds)
    args = [a for name, dims in shapes.items() for a in ("--shape", f"{name}:{dims}")]
    proc = _run([exe, lib, *args, *files])
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert message.format(x=files[0], mask=files[1]) in proc.stderr, proc.stderr


def test_scalar_and_colon_in_names_parse(built, tmp_path):
    # "NAME:" is a scalar and only the last ':' splits: both reach the API, which names the input
    lib, exe = built
    proc = _run([exe, lib, "--shape", "x:"])
    assert proc.returncode == 2 and "input 'x': shape () has 0 dims, expected 3" in proc.stderr, proc.stderr
    proc = _run([exe, lib, "--shape", "a:b:2"])
    assert proc.returncode == 1 and "has no input 'a:b'" in proc.stderr, proc.stderr


def test_static_model_runs_at_its_own_shape(tmp_path):
    # --shape on a static model is its one shape; anything else is the API's shape error
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    g, params = kiln.frontend.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    lib = kiln.build(g, params=params, target="llvm").export_library(str(tmp_path / "relu.so"))
    exe = _cc(str(tmp_path / "run_model"), EXAMPLE, "-ldl")
    data = RNG.standard_normal((2, 3)).astype("float32")
    (path,) = _files(tmp_path, {"x": data})
    proc = _run([exe, lib, "--shape", "x:2,3", path, "--out", str(tmp_path / "o")])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "o0.bin", np.float32).reshape(2, 3), np.maximum(data, 0))
    info = _run([exe, lib, "--info"]).stdout
    assert "symbol" not in info and "dims" not in info
    proc = _run([exe, lib, "--shape", "x:3,2", path])
    assert proc.returncode == 2 and "input 'x': dim 0 is 3, expected 2" in proc.stderr, proc.stderr
