"""Regenerate the ONNX seed files of ``tests/fuzz/corpus/onnx/`` (``test_fuzz_onnx.py``).

Run from the repository root (needs only onnx)::

    python -m tests.fuzz.make_onnx_corpus

Each seed is a
tiny valid model (a few nodes, tensors of a few elements) that Kiln imports; together they
cover the converters whose attribute / input handling the fuzz campaign found fragile: Conv,
pooling, Gemm, MatMul, Softmax (both opset semantics), Slice (attribute and input forms),
Reshape, Resize, Einsum, Pad, Loop, reductions, Split, Gather, Expand, normalizations. The
files are checked in so the harness never depends on how a future onnx version serializes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

CORPUS = Path(__file__).resolve().parent / "corpus" / "onnx"
F = TensorProto.FLOAT


def _model(name: str, nodes: list, inputs: dict, outputs: dict, inits: dict | None = None,
           opset: int = 13) -> None:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, F if isinstance(v, list) else v[1],
                                       v if isinstance(v, list) else v[0])
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, F, v) for k, v in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    save(model, str(CORPUS / f"{name}.onnx"))


def _f32(*shape: int) -> np.ndarray:
    return (np.arange(int(np.prod(shape)), dtype=np.float32) % 7 - 3).reshape(shape) / 4


def main() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    i64 = np.int64
    _model("conv_pool", [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         strides=[1, 1], kernel_shape=[3, 3], group=1),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="maxpool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("AveragePool", ["p"], ["y"], name="avgpool", kernel_shape=[1, 1],
                         pads=[0, 0, 0, 0], count_include_pad=0),
    ], {"x": [1, 2, 4, 4]}, {"y": [1, 3, 2, 2]}, {"w": _f32(3, 2, 3, 3), "b": _f32(3)})
    _model("gemm_softmax_v11", [
        helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="gemm", transB=1, alpha=0.5,
                         beta=2.0),
        helper.make_node("Softmax", ["g"], ["y"], name="softmax", axis=1),
    ], {"x": [2, 4]}, {"y": [2, 20]}, {"w": _f32(20, 4), "b": _f32(20)}, opset=11)
    _model("matmul_logsoftmax", [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("LogSoftmax", ["m"], ["y"], name="logsoftmax", axis=-1),
    ], {"x": [2, 3, 4]}, {"y": [2, 3, 5]}, {"w": _f32(4, 5)})
    _model("slice_reshape", [
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"], name="slice"),
        helper.make_node("Reshape", ["s", "shape"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[1, 0]),
        helper.make_node("Concat", ["t", "t"], ["c"], name="concat", axis=0),
        helper.make_node("Unsqueeze", ["c", "uax"], ["y"], name="unsqueeze"),
    ], {"x": [2, 6, 4]}, {"y": [1, 6, 4]},
        {"starts": np.array([0, 1], i64), "ends": np.array([6, -1], i64),
         "axes": np.array([1, 2], i64), "steps": np.array([2, 1], i64),
         "shape": np.array([-1, 3], i64), "uax": np.array([0], i64)})
    _model("slice_pad_v9", [
        helper.make_node("Slice", ["x"], ["s"], name="slice9", starts=[0, 1], ends=[2, 4],
                         axes=[0, 1]),
        helper.make_node("Pad", ["s"], ["p"], name="pad9", pads=[0, 1, 1, 0], value=1.5),
        helper.make_node("Flatten", ["p"], ["y"], name="flatten", axis=1),
    ], {"x": [3, 5]}, {"y": [3, 4]}, opset=9)
    _model("pad_reduce", [
        helper.make_node("Pad", ["x", "pads", "cv"], ["p"], name="pad", mode="constant"),
        helper.make_node("ReduceSum", ["p", "axes"], ["r"], name="reducesum", keepdims=0),
        helper.make_node("ReduceMean", ["p"], ["m"], name="reducemean", axes=[1], keepdims=1),
        helper.make_node("Add", ["r", "m"], ["y"], name="add"),
    ], {"x": [2, 3]}, {"y": [4, 4]},
        {"pads": np.array([1, 0, 1, 1], i64), "cv": np.array(0.5, np.float32),
         "axes": np.array([1], i64)})
    _model("resize_linear", [
        helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", mode="linear",
                         coordinate_transformation_mode="half_pixel"),
    ], {"x": [1, 1, 2, 3]}, {"y": [1, 1, 4, 6]},
        {"scales": np.array([1, 1, 2, 2], np.float32)})
    _model("resize_sizes_nearest", [
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize_n",
                         mode="nearest", nearest_mode="floor",
                         coordinate_transformation_mode="asymmetric"),
    ], {"x": [1, 2, 3]}, {"y": [1, 2, 5]}, {"sizes": np.array([1, 2, 5], i64)})
    _model("einsum", [
        helper.make_node("Einsum", ["a", "b"], ["y"], name="einsum", equation="bij,bjk->bik"),
    ], {"a": [2, 2, 3], "b": [2, 3, 4]}, {"y": [2, 2, 4]})
    _model("split_gather_expand", [
        helper.make_node("Split", ["x", "split"], ["s0", "s1"], name="split", axis=1),
        helper.make_node("Gather", ["s1", "idx"], ["g"], name="gather", axis=1),
        helper.make_node("Expand", ["g", "eshape"], ["e"], name="expand"),
        helper.make_node("Squeeze", ["s0", "sqax"], ["q"], name="squeeze"),
        helper.make_node("Mul", ["e", "q"], ["y"], name="mul"),
    ], {"x": [2, 3]}, {"y": [2, 2]},
        {"split": np.array([1, 2], i64), "idx": np.array([1, 0], i64),
         "eshape": np.array([2, 2], i64), "sqax": np.array([1], i64)})
    _model("norms_topk", [
        helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"], ["bn"],
                         name="batchnorm", epsilon=1e-5),
        helper.make_node("InstanceNormalization", ["bn", "s", "b"], ["inn"], name="instnorm"),
        helper.make_node("LayerNormalization", ["inn", "ls", "lb"], ["ln"], name="layernorm",
                         axis=-1),
        helper.make_node("TopK", ["ln", "k"], ["y", "yi"], name="topk", axis=-1),
    ], {"x": [1, 2, 3]}, {"y": [1, 2, 2]},
        {"s": _f32(2) + 2, "b": _f32(2), "mean": _f32(2), "var": np.ones(2, np.float32),
         "ls": np.ones(3, np.float32), "lb": np.zeros(3, np.float32), "k": np.array([2], i64)},
        opset=17)
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "one"], ["acc_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")])
    _model("loop_cast", [
        helper.make_node("Loop", ["trip", "cond", "x"], ["l"], name="loop", body=body),
        helper.make_node("Cast", ["l"], ["c"], name="cast", to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["c"], ["y"], name="cast_back", to=TensorProto.FLOAT),
    ], {"x": [2]}, {"y": [2]},
        {"trip": np.array(3, i64), "cond": np.array(True)})
    _model("convtranspose_clip", [
        helper.make_node("ConvTranspose", ["x", "w"], ["c"], name="convt", strides=[2, 2],
                         kernel_shape=[2, 2]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["k"], name="clip"),
        helper.make_node("GlobalAveragePool", ["k"], ["y"], name="gap"),
    ], {"x": [1, 1, 2, 2]}, {"y": [1, 2, 1, 1]},
        {"w": _f32(1, 2, 2, 2), "lo": np.array(-1, np.float32), "hi": np.array(1, np.float32)})


if __name__ == "__main__":
    main()
