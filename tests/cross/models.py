"""ONNX models for the cross-compilation tests, built with ``onnx.helper`` (no torch).

Channel and hidden sizes are multiples of 16 so that the vector paths of every target (4
float32 lanes on NEON and RVV at VLEN 128, register tiles of 16 columns) are taken, not only
their scalar tails. Weights and inputs are seeded.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _w(r: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (r.standard_normal(shape) * scale).astype(np.float32)


def _make(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], name: str) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs,
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m


def matmul(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    """One op, ``y = x @ W`` (5×48 by 48×20: vector body and tails), with its NumPy result."""
    r = np.random.default_rng(seed)
    w = _w(r, 48, 20)
    x = r.standard_normal((5, 48)).astype(np.float32)
    m = _make([helper.make_node("MatMul", ["x", "W"], ["y"])],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 48])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 20])], {"W": w}, "matmul")
    return m, {"x": x}, x.astype(np.float64) @ w.astype(np.float64)


def conv_dense(seed: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv-BN-Relu (3→16), strided conv (16→32) + Relu, depthwise conv, max pool, flatten, Gemm, Softmax."""
    r = np.random.default_rng(seed)
    inits = {
        "c1.w": _w(r, 16, 3, 3, 3), "c1.b": _w(r, 16, scale=0.1),
        "bn.s": (1 + 0.1 * r.standard_normal(16)).astype(np.float32), "bn.b": _w(r, 16, scale=0.1),
        "bn.m": _w(r, 16, scale=0.1), "bn.v": (0.5 + r.random(16)).astype(np.float32),
        "c2.w": _w(r, 32, 16, 3, 3, scale=0.1), "c2.b": _w(r, 32, scale=0.1),
        "dw.w": _w(r, 32, 1, 3, 3),
        "fc.w": _w(r, 10, 32 * 4 * 4, scale=0.05), "fc.b": _w(r, 10, scale=0.1),
    }
    nodes = [
        helper.make_node("Conv", ["x", "c1.w", "c1.b"], ["a0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["a0", "bn.s", "bn.b", "bn.m", "bn.v"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["a2"]),
        helper.make_node("Conv", ["a2", "c2.w", "c2.b"], ["b0"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["b0"], ["b1"]),
        helper.make_node("Conv", ["b1", "dw.w"], ["d0"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("MaxPool", ["d0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p0"], ["f0"]),
        helper.make_node("Gemm", ["f0", "fc.w", "fc.b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    x = r.standard_normal((1, 3, 16, 16)).astype(np.float32)
    m = _make(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits, "conv_dense")
    return m, {"x": x}


def _linear(prefix: str, src: str, name: str, out: str) -> list:
    return [helper.make_node("MatMul", [src, f"{prefix}{name}.w"], [out + "_m"]),
            helper.make_node("Add", [out + "_m", f"{prefix}{name}.b"], [out])]


def bert_like(hidden: int = 64, heads: int = 4, inter: int = 128, layers: int = 2, seq: int = 16,
              vocab: int = 100, seed: int = 2) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A BERT sentence encoder as all-MiniLM-L6-v2 is one, with random weights.

    Token + position embeddings (``Gather``), LayerNorm, ``layers`` post-norm encoder layers
    (multi-head attention with a padding-mask bias, Erf-GELU feed-forward), mean pooling over
    the mask and L2 normalisation. Inputs ``input_ids`` and ``attention_mask`` (int64, 1 ×
    ``seq``); output ``embedding`` (1 × ``hidden``). MiniLM-L6: ``bert_like(384, 12, 1536, 6,
    128, 30522)``.
    """
    r = np.random.default_rng(seed)
    dh = hidden // heads
    inits: dict[str, np.ndarray] = {
        "emb.word": _w(r, vocab, hidden, scale=0.5), "emb.pos": _w(r, 1, seq, hidden, scale=0.1),
        "emb.ln.g": (1 + 0.1 * r.standard_normal(hidden)).astype(np.float32),
        "emb.ln.b": _w(r, hidden, scale=0.1),
        "shape.heads": np.array([1, seq, heads, dh], np.int64),
        "shape.model": np.array([1, seq, hidden], np.int64),
        "shape.mask": np.array([1, 1, 1, seq], np.int64),
        "c.scale": np.array(np.sqrt(dh), np.float32), "c.sqrt2": np.array(np.sqrt(2.0), np.float32),
        "c.one": np.array(1.0, np.float32), "c.half": np.array(0.5, np.float32),
        "c.neg": np.array(-10000.0, np.float32), "c.eps": np.array(1e-12, np.float32),
        "axis.seq": np.array([1], np.int64), "axis.last": np.array([-1], np.int64),
    }
    nodes = [
        helper.make_node("Gather", ["emb.word", "input_ids"], ["e0"]),
        helper.make_node("Add", ["e0", "emb.pos"], ["e1"]),
        helper.make_node("LayerNormalization", ["e1", "emb.ln.g", "emb.ln.b"], ["h0"], axis=-1, epsilon=1e-12),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["c.one", "mf"], ["mi"]),
        helper.make_node("Mul", ["mi", "c.neg"], ["mb0"]),
        helper.make_node("Reshape", ["mb0", "shape.mask"], ["mbias"]),
    ]
    x = "h0"
    for i in range(layers):
        p = f"l{i}."
        for n, (a, b) in {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden),
                          "o": (hidden, hidden), "f1": (hidden, inter), "f2": (inter, hidden)}.items():
            inits[f"{p}{n}.w"] = _w(r, a, b, scale=1 / np.sqrt(a))
            inits[f"{p}{n}.b"] = _w(r, b, scale=0.05)
        for n in ("ln1", "ln2"):
            inits[f"{p}{n}.g"] = (1 + 0.1 * r.standard_normal(hidden)).astype(np.float32)
            inits[f"{p}{n}.b"] = _w(r, hidden, scale=0.1)

        for n in ("q", "k", "v"):
            nodes += _linear(p, x, n, p + n)
            nodes.append(helper.make_node("Reshape", [p + n, "shape.heads"], [p + n + "h"]))
        nodes += [
            helper.make_node("Transpose", [p + "qh"], [p + "qt"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", [p + "kh"], [p + "kt"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", [p + "vh"], [p + "vt"], perm=[0, 2, 1, 3]),
            helper.make_node("MatMul", [p + "qt", p + "kt"], [p + "s0"]),
            helper.make_node("Div", [p + "s0", "c.scale"], [p + "s1"]),
            helper.make_node("Add", [p + "s1", "mbias"], [p + "s2"]),
            helper.make_node("Softmax", [p + "s2"], [p + "att"], axis=-1),
            helper.make_node("MatMul", [p + "att", p + "vt"], [p + "c0"]),
            helper.make_node("Transpose", [p + "c0"], [p + "c1"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "c1", "shape.model"], [p + "c2"]),
        ]
        nodes += _linear(p, p + "c2", "o", p + "ao")
        nodes += [
            helper.make_node("Add", [p + "ao", x], [p + "r1"]),
            helper.make_node("LayerNormalization", [p + "r1", p + "ln1.g", p + "ln1.b"], [p + "x1"], axis=-1,
                             epsilon=1e-12),
        ]
        nodes += _linear(p, p + "x1", "f1", p + "f")
        nodes += [  # GELU(f) = 0.5 f (1 + erf(f / sqrt 2))
            helper.make_node("Div", [p + "f", "c.sqrt2"], [p + "g0"]),
            helper.make_node("Erf", [p + "g0"], [p + "g1"]),
            helper.make_node("Add", [p + "g1", "c.one"], [p + "g2"]),
            helper.make_node("Mul", [p + "f", p + "g2"], [p + "g3"]),
            helper.make_node("Mul", [p + "g3", "c.half"], [p + "g4"]),
        ]
        nodes += _linear(p, p + "g4", "f2", p + "f2o")
        nodes += [
            helper.make_node("Add", [p + "f2o", p + "x1"], [p + "r2"]),
            helper.make_node("LayerNormalization", [p + "r2", p + "ln2.g", p + "ln2.b"], [p + "out"], axis=-1,
                             epsilon=1e-12),
        ]
        x = p + "out"
    nodes += [  # mean over the tokens the mask keeps, then L2 normalisation
        helper.make_node("Unsqueeze", ["mf", "axis.last"], ["m3"]),
        helper.make_node("Mul", [x, "m3"], ["pm"]),
        helper.make_node("ReduceSum", ["pm", "axis.seq"], ["ps"], keepdims=0),
        helper.make_node("ReduceSum", ["mf", "axis.seq"], ["cnt"], keepdims=1),
        helper.make_node("Div", ["ps", "cnt"], ["pooled"]),
        helper.make_node("Mul", ["pooled", "pooled"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axis.last"], ["ss"], keepdims=1),
        helper.make_node("Sqrt", ["ss"], ["nrm0"]),
        helper.make_node("Max", ["nrm0", "c.eps"], ["nrm"]),
        helper.make_node("Div", ["pooled", "nrm"], ["embedding"]),
    ]
    ids = r.integers(1, vocab, size=(1, seq)).astype(np.int64)
    mask = np.ones((1, seq), np.int64)
    mask[0, seq - seq // 4:] = 0  # padded tail: the mask bias and the pooling both matter
    m = _make(nodes, [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
                      helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
              [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, hidden])], inits, "bert_like")
    return m, {"input_ids": ids, "attention_mask": mask}
