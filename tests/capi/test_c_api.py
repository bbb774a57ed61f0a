"""The model C API (``kiln/kiln_model.h``): libraries run from C programs with no Python in them.

Each test builds a small ONNX model, exports it, compiles ``examples/c/run_model.c`` (or the C
checks beside this file) with the system compiler, runs the program in a child process and
compares what it wrote with the Python executor's outputs for the same inputs.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.runtime import include_path, model_api, save_param_dict_to_file
from kiln.runtime.cc import get_cc
from kiln.runtime.graph_json import load_graph_json

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "c", "run_model.c")
CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capi_check.c")

pytestmark = pytest.mark.skipif(shutil.which(get_cc().split()[0]) is None, reason="no C compiler")


def kiln_cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "kiln.cli"]


def _cc(out: str, *args: str) -> str:
    subprocess.run([*get_cc().split(), "-O2", "-Wall", "-Werror", "-I", include_path(), *args, "-o", out],
                   check=True, capture_output=True, text=True)
    return out


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    # A minimal environment: the program needs nothing of Python's
    return subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120)


def _model(kind: str) -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    if kind == "cnn":
        w = rng.standard_normal((8, 3, 3, 3)).astype("float32")
        b = rng.standard_normal(8).astype("float32")
        d = rng.standard_normal((8 * 6 * 6, 10)).astype("float32")
        nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                 helper.make_node("Flatten", ["p"], ["f"]),
                 helper.make_node("MatMul", ["f", "D"], ["y"]),
                 helper.make_node("Sigmoid", ["y"], ["prob"])]
        inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B"), numpy_helper.from_array(d, "D")]
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])]
        outs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 10])]
        feeds = {"x": rng.standard_normal((1, 3, 12, 12)).astype("float32")}
    else:  # several inputs and outputs of several dtypes, a reshape (an alias, no kernel), an input as output
        s = rng.standard_normal((6, 4)).astype("float32")
        nodes = [helper.make_node("MatMul", ["a", "S"], ["m"]),
                 helper.make_node("Add", ["m", "b"], ["sum"]),
                 helper.make_node("Reshape", ["sum", "shape"], ["flat"]),
                 helper.make_node("Cast", ["idx"], ["idx_f"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["flat", "idx_f"], ["scaled"]),
                 helper.make_node("ReduceMax", ["idx"], ["top"], keepdims=0)]
        inits = [numpy_helper.from_array(s, "S"),
                 numpy_helper.from_array(np.array([12], dtype=np.int64), "shape")]
        ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 6]),
               helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 4]),
               helper.make_tensor_value_info("idx", TensorProto.INT64, [12])]
        outs = [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [12]),
                helper.make_tensor_value_info("top", TensorProto.INT64, []),
                helper.make_tensor_value_info("flat", TensorProto.FLOAT, [12])]
        feeds = {"a": rng.standard_normal((3, 6)).astype("float32"),
                 "b": rng.standard_normal((3, 4)).astype("float32"),
                 "idx": rng.integers(-5, 50, 12).astype("int64")}
    graph = helper.make_graph(nodes, kind, ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def _build(kind: str, **kw: object) -> tuple[object, dict[str, np.ndarray], list[np.ndarray]]:
    onnx_model, feeds = _model(kind)
    graph, params = kiln.frontend.from_onnx(onnx_model)
    factory = kiln.build(graph, params=params, target="llvm", **kw)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    for k, v in feeds.items():
        m.set_input(k, v)
    m.run()
    return factory, feeds, [m.get_output(i).numpy() for i in range(m.get_num_outputs())]


def _write_inputs(tmp: str, feeds: dict[str, np.ndarray]) -> list[str]:
    # the model's inputs are its graph inputs in ONNX order, which is the order of `feeds`
    paths = []
    for i, arr in enumerate(feeds.values()):
        p = os.path.join(tmp, f"in{i}.bin")
        np.ascontiguousarray(arr).tofile(p)
        paths.append(p)
    return paths


def _outputs(prefix: str, ref: list[np.ndarray]) -> list[np.ndarray]:
    return [np.fromfile(f"{prefix}{i}.bin", dtype=r.dtype).reshape(r.shape) for i, r in enumerate(ref)]


@pytest.mark.parametrize("kind", ["cnn", "multi"])
def test_shared_library_runs_from_c(tmp_path, kind):
    tmp = str(tmp_path)
    factory, feeds, ref = _build(kind)
    lib = factory.export_library(os.path.join(tmp, "model.so"))
    exe = _cc(os.path.join(tmp, "run_model"), EXAMPLE, "-ldl")
    proc = _run([exe, lib, *_write_inputs(tmp, feeds), "--out", os.path.join(tmp, "out"), "--repeat", "3"])
    assert proc.returncode == 0, proc.stderr
    assert "median latency" in proc.stdout
    for got, want in zip(_outputs(os.path.join(tmp, "out"), ref), ref):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # the same file still loads in Python
    m = kiln.GraphModule(kiln.runtime.load_module(lib)["default"](kiln.cpu()))
    for k, v in feeds.items():
        m.set_input(k, v)
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), ref[0])


def test_info_names_inputs_in_graph_order(tmp_path):
    factory, feeds, ref = _build("multi")
    lib = factory.export_library(os.path.join(str(tmp_path), "model.so"))
    exe = _cc(os.path.join(str(tmp_path), "run_model"), EXAMPLE, "-ldl")
    proc = _run([exe, lib, "--info"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("input 0 'a'") and "shape (3, 6)" in lines[0]
    assert lines[2].startswith("input 2 'idx'") and "dtype code 0 bits 64" in lines[2]
    assert lines[4].startswith("output 1 'output1'") and "shape ()" in lines[4] and "8 bytes" in lines[4]
    inspect = subprocess.run([*kiln_cli(), "inspect", lib], capture_output=True, text=True)
    assert "C API (kiln/kiln_model.h): yes" in inspect.stdout, inspect.stdout + inspect.stderr
    assert "KilnModelRun" not in inspect.stdout  # listed as the C API, not as kernels


def test_static_archive_links_into_an_application(tmp_path):
    tmp = str(tmp_path)
    factory, feeds, ref = _build("cnn")
    archive = factory.export_library(os.path.join(tmp, "model.a"))
    exe = _cc(os.path.join(tmp, "app"), "-DKILN_STATIC", EXAMPLE, archive, "-lm", "-lpthread")
    proc = _run([exe, *_write_inputs(tmp, feeds), "--out", os.path.join(tmp, "out")])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(_outputs(os.path.join(tmp, "out"), ref)[0], ref[0], rtol=1e-6, atol=1e-6)
    # the application does not load anything at run time: no dlopen, the model is in the binary
    syms = {line.split()[-1]: line.split()[-2] for line in
            subprocess.run(["nm", exe], capture_output=True, text=True).stdout.splitlines()}
    assert syms.get("KilnModelCreate") == "T" and not any(s.startswith("dlopen") for s in syms)


def test_params_file_and_library_without_params(tmp_path):
    tmp = str(tmp_path)
    factory, feeds, ref = _build("cnn")
    params = os.path.join(tmp, "model.params")
    save_param_dict_to_file(factory.get_params(), params)
    lib = factory.remove_params().export_library(os.path.join(tmp, "bare.so"))
    exe = _cc(os.path.join(tmp, "run_model"), EXAMPLE, "-ldl")
    inputs = _write_inputs(tmp, feeds)
    proc = _run([exe, lib, *inputs, "--out", os.path.join(tmp, "out")])
    assert proc.returncode == 1 and "params file" in proc.stderr and "remove_params" in proc.stderr
    proc = _run([exe, lib, *inputs, "--params", params, "--out", os.path.join(tmp, "out")])
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(_outputs(os.path.join(tmp, "out"), ref)[0], ref[0], rtol=1e-6, atol=1e-6)
    # a params file for another model: named, refused
    other = os.path.join(tmp, "other.params")
    save_param_dict_to_file({"p0": np.zeros((2, 2), "float32")}, other)
    proc = _run([exe, lib, *inputs, "--params", other])
    assert proc.returncode == 2 and "param 'p0'" in proc.stderr and "expects" in proc.stderr


def test_linked_params(tmp_path):
    tmp = str(tmp_path)
    factory, feeds, ref = _build("cnn", link_params=True)
    assert not factory.get_params()
    lib = factory.export_library(os.path.join(tmp, "model.so"))
    exe = _cc(os.path.join(tmp, "run_model"), EXAMPLE, "-ldl")
    proc = _run([exe, lib, *_write_inputs(tmp, feeds), "--out", os.path.join(tmp, "out")])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("input ") == 1  # the weights are not inputs
    np.testing.assert_allclose(_outputs(os.path.join(tmp, "out"), ref)[0], ref[0], rtol=1e-6, atol=1e-6)


def test_errors_and_threads(tmp_path):
    tmp = str(tmp_path)
    factory, feeds, ref = _build("cnn")
    factory.export_library(os.path.join(tmp, "libmodel.so"))  # linked as -lmodel below
    exe = _cc(os.path.join(tmp, "capi_check"), CHECKS, f"-L{tmp}", "-lmodel", f"-Wl,-rpath,{tmp}", "-lpthread", "-lm")
    x = _write_inputs(tmp, feeds)[0]
    bad = os.path.join(tmp, "bad.params")
    with open(bad, "wb") as f:
        f.write(b"\xb7\x9c\x04\x05\x4f\x8d\xe5\xf7" + b"\0" * 8 + b"\x05")  # right magic, then truncated
    proc = _run([exe, "errors", x, bad])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 16
    expected = os.path.join(tmp, "expected.bin")
    ref[0].tofile(expected)
    proc = _run([exe, "threads", x, expected])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok four_instances_four_threads" in proc.stdout and "ok one_instance_four_threads" in proc.stdout


def test_tar_carries_the_c_api(tmp_path):
    import tarfile

    factory, feeds, ref = _build("cnn")
    path = factory.export_library(os.path.join(str(tmp_path), "model.tar"))
    with tarfile.open(path) as t:
        names = t.getnames()
    assert model_api.MODEL_FILE in names and model_api.API_FILE in names
    m = kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))
    for k, v in feeds.items():
        m.set_input(k, v)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), ref[0], rtol=1e-6)


def test_graph_on_a_device_is_refused_with_the_reason():
    g = {
        "nodes": [{"op": "null", "name": "x", "inputs": []},
                  {"op": "tvm_op", "name": "k", "inputs": [[0, 0, 0]],
                   "attrs": {"func_name": "kern", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
        "attrs": {"dltype": ["list_str", ["float32", "float32"]], "shape": ["list_shape", [[4], [4]]],
                  "storage_id": ["list_int", [0, 1]], "device_index": ["list_int", [1, 4]]},
    }
    src = model_api.model_api_source(load_graph_json(g), [], "default", {"kern"})
    assert "device type(s) [4]" in src and "kern(" not in src
    src = model_api.model_api_source(load_graph_json({**g, "attrs": {k: v for k, v in g["attrs"].items()
                                                                      if k != "device_index"}}), [], "default", set())
    assert "which no module compiled into this library defines" in src


def test_graph_with_dynamic_dims_gets_its_symbol_tables():
    # runs through the C API since version 2 (tests/capi/test_c_api_dynamic.py); data-dependent
    # dims since tables version 3 (tests/capi/test_c_api_data_dependent.py), unless an input has one
    g = {
        "nodes": [{"op": "null", "name": "x", "inputs": []},
                  {"op": "tvm_op", "name": "k", "inputs": [[0, 0, 0]],
                   "attrs": {"func_name": "kern", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}],
        "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
        "attrs": {"dltype": ["list_str", ["float32", "float32"]], "shape": ["list_shape", [[4], [4]]],
                  "storage_id": ["list_int", [0, 1]], "sym_shape": ["list_sym_shape", [["n"], ["n"]]],
                  "dim_ranges": ["list_dim_range", [["n", 1, 4]]]},
    }
    src = model_api.model_api_source(load_graph_json(g), [], "default", {"kern"})
    assert '{"n", 1LL, 4LL, 0, 0}' in src and "kern(" in src
    assert "kiln_model_desc = {\n  2, " in src
    g["attrs"]["dim_ranges"] = ["list_dim_range", [["n", 0, 4, "data"]]]
    src = model_api.model_api_source(load_graph_json(g), [], "default", {"kern"})
    assert "input 'x' has dims (n) with data-dependent dimension(s) ['n']" in src and "kern(" not in src
    g["attrs"]["sym_shape"] = ["list_sym_shape", [[4], ["n"]]]  # kern reports n
    src = model_api.model_api_source(load_graph_json(g), [], "default", {"kern"})
    assert '{"n", 0LL, 4LL, -1, 0}' in src and "kern(" in src and "kiln_model_desc = {\n  3, " in src


def test_cli_builds_static_library_params_file_and_headers(tmp_path):
    from kiln.cli import main

    tmp = str(tmp_path)
    onnx_model, feeds = _model("cnn")
    import onnx

    src = os.path.join(tmp, "cnn.onnx")
    onnx.save(onnx_model, src)
    out, params, inc = os.path.join(tmp, "cnn.a"), os.path.join(tmp, "cnn.params"), os.path.join(tmp, "include")
    assert main(["build", src, "-o", out, "--target", "llvm", "-q", "--params-file", params, "--c-header", inc]) == 0
    assert os.path.isfile(os.path.join(inc, "kiln", "kiln_model.h"))
    # the application sees only the headers kiln build wrote, not the package's include path
    exe = os.path.join(tmp, "app")
    subprocess.run([*get_cc().split(), "-O2", "-DKILN_STATIC", "-I", inc, EXAMPLE, out, "-o", exe, "-lm", "-lpthread"],
                   check=True, capture_output=True, text=True)
    inputs = _write_inputs(tmp, feeds)
    proc = _run([exe, *inputs, "--out", os.path.join(tmp, "o")])
    assert proc.returncode != 0 and "params file" in proc.stderr
    proc = _run([exe, *inputs, "--params", params, "--out", os.path.join(tmp, "o")])
    assert proc.returncode == 0, proc.stderr
    graph, weights = kiln.frontend.from_onnx(onnx_model)
    m = kiln.GraphModule(kiln.build(graph, params=weights, target="llvm")["default"](kiln.cpu()))
    m.set_input("x", feeds["x"])
    m.run()
    ref = [m.get_output(0).numpy()]
    np.testing.assert_allclose(_outputs(os.path.join(tmp, "o"), ref)[0], ref[0], rtol=1e-6, atol=1e-6)
