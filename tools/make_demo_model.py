"""Generate ``src/kiln/data/demo_cnn.onnx``, the small model that ``kiln demo`` compiles.

A tiny residual image classifier (CIFAR-sized input, 10 classes) built with ``onnx.helper``::

    image[1,3,32,32]
      -> Conv 3x3 (16) -> BatchNormalization -> Relu -> MaxPool 2x2          [1,16,16,16]
      -> residual block: Conv 3x3 -> BN -> Relu -> Conv 3x3 -> BN, Add, Relu  [1,16,16,16]
      -> Conv 3x3 stride 2 (32) + bias -> Relu                               [1,32,8,8]
      -> GlobalAveragePool -> Flatten -> Gemm (10) -> Softmax                [1,10]

Weights are random but fixed by a seed (the numbers do not matter for compiling, and the
output is checked against Kiln's NumPy reference interpreter, not against labels). The file is
checked in; re-run this script only when changing the architecture:

    python tools/make_demo_model.py            # writes src/kiln/data/demo_cnn.onnx
    python tools/make_demo_model.py --check    # exits 1 if the checked-in file differs
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240501
OPSET = 17
INPUT_NAME = "image"
INPUT_SHAPE = (1, 3, 32, 32)
NUM_CLASSES = 10
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src", "kiln", "data",
                           "demo_cnn.onnx")


def build_model() -> onnx.ModelProto:
    """Build the demo model (deterministic: same seed, same bytes)."""
    rng = np.random.default_rng(SEED)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def param(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=np.float32), name))
        return name

    def conv_w(name: str, cout: int, cin: int, k: int = 3) -> str:
        std = np.sqrt(2.0 / (cin * k * k))  # He init keeps activations O(1)
        return param(name, rng.normal(0.0, std, size=(cout, cin, k, k)))

    def bn(prefix: str, x: str, c: int) -> str:
        scale = param(f"{prefix}.gamma", rng.uniform(0.5, 1.5, c))
        bias = param(f"{prefix}.beta", rng.normal(0.0, 0.1, c))
        mean = param(f"{prefix}.mean", rng.normal(0.0, 0.1, c))
        var = param(f"{prefix}.var", rng.uniform(0.5, 1.5, c))
        out = f"{prefix}.out"
        nodes.append(helper.make_node("BatchNormalization", [x, scale, bias, mean, var], [out],
                                      name=prefix, epsilon=1e-5))
        return out

    def conv(name: str, x: str, w: str, b: str | None = None, stride: int = 1) -> str:
        out = f"{name}.out"
        ins = [x, w] + ([b] if b else [])
        nodes.append(helper.make_node("Conv", ins, [out], name=name, kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1], strides=[stride, stride]))
        return out

    def relu(name: str, x: str) -> str:
        out = f"{name}.out"
        nodes.append(helper.make_node("Relu", [x], [out], name=name))
        return out

    # stem
    x = conv("stem.conv", INPUT_NAME, conv_w("stem.conv.w", 16, 3))
    x = relu("stem.relu", bn("stem.bn", x, 16))
    nodes.append(helper.make_node("MaxPool", [x], ["stem.pool.out"], name="stem.pool",
                                  kernel_shape=[2, 2], strides=[2, 2]))
    x = "stem.pool.out"
    # residual block
    y = conv("block.conv1", x, conv_w("block.conv1.w", 16, 16))
    y = relu("block.relu1", bn("block.bn1", y, 16))
    y = conv("block.conv2", y, conv_w("block.conv2.w", 16, 16))
    y = bn("block.bn2", y, 16)
    nodes.append(helper.make_node("Add", [y, x], ["block.add.out"], name="block.add"))
    x = relu("block.relu2", "block.add.out")
    # downsample
    x = conv("down.conv", x, conv_w("down.conv.w", 32, 16), param("down.conv.b", rng.normal(0, 0.05, 32)),
             stride=2)
    x = relu("down.relu", x)
    # head
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["head.gap.out"], name="head.gap"))
    nodes.append(helper.make_node("Flatten", ["head.gap.out"], ["head.flat.out"], name="head.flatten", axis=1))
    fc_w = param("head.fc.w", rng.normal(0.0, np.sqrt(1.0 / 32), (NUM_CLASSES, 32)))
    fc_b = param("head.fc.b", rng.normal(0.0, 0.05, NUM_CLASSES))
    nodes.append(helper.make_node("Gemm", ["head.flat.out", fc_w, fc_b], ["logits"], name="head.fc", transB=1))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], name="head.softmax", axis=-1))

    graph = helper.make_graph(
        nodes, "kiln_demo_cnn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [INPUT_SHAPE[0], NUM_CLASSES])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="kiln tools/make_demo_model.py", producer_version="1")
    model.ir_version = 8  # readable by every onnxruntime >= 1.10
    model.doc_string = "Kiln demo: a tiny residual CNN classifier with fixed seeded weights."
    onnx.checker.check_model(model, full_check=True)
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default=os.path.normpath(DEFAULT_OUT), help="where to write the model")
    ap.add_argument("--check", action="store_true", help="compare with the existing file instead of writing")
    args = ap.parse_args(argv)
    data = build_model().SerializeToString()
    if args.check:
        try:
            with open(args.output, "rb") as f:
                same = f.read() == data
        except FileNotFoundError:
            same = False
        print(f"{args.output}: {'up to date' if same else 'DIFFERS from the generator'}")
        return 0 if same else 1
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "wb") as f:
        f.write(data)
    print(f"wrote {args.output} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
