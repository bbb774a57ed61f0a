"""Small ONNX models built with ``onnx.helper`` (no torch) and helpers to check Kiln on them.

Shapes are tiny on purpose: the point is coverage of the compile path (fusion, memory
planning, codegen, export/load), not speed, and the whole suite must run in a few minutes
on two cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RTOL, ATOL = 1e-4, 1e-5
OPSET = 17


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _w(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes: list, inputs: dict[str, tuple], outputs: list[str], inits: dict[str, np.ndarray],
           name: str) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    g = helper.make_graph(nodes, name, vis, outs, initializer=init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m


# ----------------------------------------------------------------------------- models
def mlp(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Gemm + Relu + Gemm + Relu + Gemm on (4, 16)."""
    r = _rng(seed)
    inits = {"fc1.weight": _w(r, 32, 16), "fc1.bias": _w(r, 32),
             "fc2.weight": _w(r, 32, 32), "fc2.bias": _w(r, 32),
             "fc3.weight": _w(r, 10, 32), "fc3.bias": _w(r, 10)}
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "fc2.weight", "fc2.bias"], ["h2"], transB=1),
        helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "fc3.weight", "fc3.bias"], ["y"], transB=1),
    ]
    feeds = {"x": r.standard_normal((4, 16)).astype(np.float32)}
    return _model(nodes, {"x": (4, 16)}, ["y"], inits, "mlp"), feeds


def _bn(r: np.random.Generator, prefix: str, c: int, inits: dict) -> list[str]:
    names = [f"{prefix}.{k}" for k in ("scale", "bias", "mean", "var")]
    inits[names[0]] = (1.0 + 0.1 * r.standard_normal(c)).astype(np.float32)
    inits[names[1]] = (0.1 * r.standard_normal(c)).astype(np.float32)
    inits[names[2]] = (0.1 * r.standard_normal(c)).astype(np.float32)
    inits[names[3]] = (0.5 + r.random(c)).astype(np.float32)
    return names


def cnn(seed: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """conv-bn-relu, maxpool, two identical residual blocks, global avg pool, flatten, gemm."""
    r = _rng(seed)
    c = 8
    inits: dict[str, np.ndarray] = {"stem.w": _w(r, c, 3, 3, 3), "stem.b": _w(r, c)}
    nodes = [
        helper.make_node("Conv", ["x", "stem.w", "stem.b"], ["s0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["s0", *_bn(r, "stem.bn", c, inits)], ["s1"]),
        helper.make_node("Relu", ["s1"], ["s2"]),
        helper.make_node("MaxPool", ["s2"], ["b0"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    cur = "b0"
    for blk in range(2):  # two blocks of identical shapes: their kernels must be shared
        p = f"blk{blk}"
        inits[f"{p}.w1"] = _w(r, c, c, 3, 3, scale=0.2)
        inits[f"{p}.w2"] = _w(r, c, c, 3, 3, scale=0.2)
        nodes += [
            helper.make_node("Conv", [cur, f"{p}.w1"], [f"{p}.c1"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"{p}.c1", *_bn(r, f"{p}.bn1", c, inits)],
                             [f"{p}.n1"]),
            helper.make_node("Relu", [f"{p}.n1"], [f"{p}.r1"]),
            helper.make_node("Conv", [f"{p}.r1", f"{p}.w2"], [f"{p}.c2"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"{p}.c2", *_bn(r, f"{p}.bn2", c, inits)],
                             [f"{p}.n2"]),
            helper.make_node("Add", [f"{p}.n2", cur], [f"{p}.sum"]),
            helper.make_node("Relu", [f"{p}.sum"], [f"{p}.out"]),
        ]
        cur = f"{p}.out"
    inits["fc.w"] = _w(r, 10, c)
    inits["fc.b"] = _w(r, 10)
    nodes += [
        helper.make_node("GlobalAveragePool", [cur], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["y"], transB=1),
    ]
    feeds = {"x": r.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    return _model(nodes, {"x": (1, 3, 12, 12)}, ["y"], inits, "cnn"), feeds


def depthwise_separable(seed: int = 2) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Depthwise conv (groups=C) + BN + Relu6 (Clip), pointwise conv + BN + Relu."""
    r = _rng(seed)
    c, co = 8, 16
    inits: dict[str, np.ndarray] = {"dw.w": _w(r, c, 1, 3, 3), "pw.w": _w(r, co, c, 1, 1),
                                    "clip.min": np.array(0.0, np.float32),
                                    "clip.max": np.array(6.0, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "dw.w"], ["d0"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("BatchNormalization", ["d0", *_bn(r, "dw.bn", c, inits)], ["d1"]),
        helper.make_node("Clip", ["d1", "clip.min", "clip.max"], ["d2"]),
        helper.make_node("Conv", ["d2", "pw.w"], ["p0"]),
        helper.make_node("BatchNormalization", ["p0", *_bn(r, "pw.bn", co, inits)], ["p1"]),
        helper.make_node("Relu", ["p1"], ["y"]),
    ]
    feeds = {"x": (2.0 * r.standard_normal((1, c, 10, 10))).astype(np.float32)}
    return _model(nodes, {"x": (1, c, 10, 10)}, ["y"], inits, "dwsep"), feeds


def transformer_layer(seed: int = 3) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One post-norm encoder layer: MHA (2 heads) + residual + LayerNorm, Erf-GELU FFN."""
    r = _rng(seed)
    b, s, d, h = 1, 8, 16, 2
    dh = d // h
    ff = 32
    inits: dict[str, np.ndarray] = {}
    for n in ("q", "k", "v", "o"):
        inits[f"attn.{n}.w"] = _w(r, d, d)
        inits[f"attn.{n}.b"] = _w(r, d, scale=0.1)
    inits.update({
        "ln1.g": (1 + 0.1 * r.standard_normal(d)).astype(np.float32), "ln1.b": _w(r, d, scale=0.1),
        "ln2.g": (1 + 0.1 * r.standard_normal(d)).astype(np.float32), "ln2.b": _w(r, d, scale=0.1),
        "ff1.w": _w(r, d, ff), "ff1.b": _w(r, ff, scale=0.1),
        "ff2.w": _w(r, ff, d), "ff2.b": _w(r, d, scale=0.1),
        "shape.heads": np.array([b, s, h, dh], np.int64),
        "shape.model": np.array([b, s, d], np.int64),
        "scale": np.array(np.sqrt(dh), np.float32),
        "sqrt2": np.array(np.sqrt(2.0), np.float32),
        "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32),
    })
    nodes = []
    for n in ("q", "k", "v"):
        nodes += [
            helper.make_node("MatMul", ["x", f"attn.{n}.w"], [f"{n}0"]),
            helper.make_node("Add", [f"{n}0", f"attn.{n}.b"], [f"{n}1"]),
            helper.make_node("Reshape", [f"{n}1", "shape.heads"], [f"{n}2"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["q2"], ["qh"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k2"], ["kT"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v2"], ["vh"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qh", "kT"], ["sc0"]),
        helper.make_node("Div", ["sc0", "scale"], ["sc1"]),
        helper.make_node("Softmax", ["sc1"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "vh"], ["ctx0"]),
        helper.make_node("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx1", "shape.model"], ["ctx2"]),
        helper.make_node("MatMul", ["ctx2", "attn.o.w"], ["o0"]),
        helper.make_node("Add", ["o0", "attn.o.b"], ["o1"]),
        helper.make_node("Add", ["o1", "x"], ["res1"]),
        helper.make_node("LayerNormalization", ["res1", "ln1.g", "ln1.b"], ["ln1"], axis=-1,
                         epsilon=1e-5),
        helper.make_node("MatMul", ["ln1", "ff1.w"], ["f0"]),
        helper.make_node("Add", ["f0", "ff1.b"], ["f1"]),
        # GELU(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
        helper.make_node("Div", ["f1", "sqrt2"], ["g0"]),
        helper.make_node("Erf", ["g0"], ["g1"]),
        helper.make_node("Add", ["g1", "one"], ["g2"]),
        helper.make_node("Mul", ["f1", "g2"], ["g3"]),
        helper.make_node("Mul", ["g3", "half"], ["g4"]),
        helper.make_node("MatMul", ["g4", "ff2.w"], ["f2"]),
        helper.make_node("Add", ["f2", "ff2.b"], ["f3"]),
        helper.make_node("Add", ["f3", "ln1"], ["res2"]),
        helper.make_node("LayerNormalization", ["res2", "ln2.g", "ln2.b"], ["y"], axis=-1,
                         epsilon=1e-5),
    ]
    feeds = {"x": r.standard_normal((b, s, d)).astype(np.float32)}
    return _model(nodes, {"x": (b, s, d)}, ["y"], inits, "encoder"), feeds


MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray]]]] = {
    "mlp": mlp, "cnn": cnn, "dwsep": depthwise_separable, "transformer": transformer_layer,
}


# ----------------------------------------------------------------------------- helpers
def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Reference outputs from ONNX Runtime (one thread, no graph rewrites)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_factory(factory: Any, feeds: dict[str, np.ndarray], params: dict | None = None) -> list[np.ndarray]:
    """Run a build result in-process."""
    import kiln

    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    if params:
        m.load_params(params)
    m.set_input(**feeds)
    m.run()
    return [m.get_output(i).numpy() for i in range(m.get_num_outputs())]


_FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    import kiln
    lib_path, in_path, out_path, linked = sys.argv[1:5]
    lib = kiln.runtime.load_module(lib_path)
    m = kiln.GraphModule(lib["default"](kiln.cpu()))
    if linked == "1":
        from kiln.driver import load_linked_params
        m.load_params(load_linked_params(lib, lib.get_graph_json()))
    feeds = dict(np.load(in_path))
    m.set_input(**feeds)
    m.run()
    np.savez(out_path, *[m.get_output(i).numpy() for i in range(m.get_num_outputs())])
    # Prove no compiler package was needed to run the library.
    assert "kiln.codegen" not in sys.modules and "llvmlite" not in sys.modules, sorted(
        k for k in sys.modules if k.startswith(("kiln.codegen", "llvmlite")))
""")


def run_in_fresh_process(lib_path: str, feeds: dict[str, np.ndarray], workdir: str,
                         linked: bool = False) -> list[np.ndarray]:
    """Load an exported library in a new Python process, run it, return the outputs."""
    in_path = os.path.join(workdir, "inputs.npz")
    out_path = os.path.join(workdir, "outputs.npz")
    np.savez(in_path, **feeds)
    proc = subprocess.run([sys.executable, "-c", _FRESH, lib_path, in_path, out_path,
                           "1" if linked else "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out_path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]
