"""ResNet-18 as an ONNX file written with ``onnx.helper`` alone (no PyTorch needed).

The torchvision layer structure (7x7/2 stem, max pool, four stages of two basic blocks,
1x1/2 projection shortcuts, global average pool, 1000-way Gemm) with seeded random weights
and BatchNorm folded the way an exporter leaves it (Conv + BatchNormalization + Relu nodes).
It exists so that machines without torch (CI, a fresh box) can run the soak and other
whole-model benchmarks on a real architecture; ``bench/models.py`` is the torch export used
by the speed tables.

Usage::

    python bench/resnet_onnx.py OUT.onnx [--hw 224]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def resnet18(hw: int = 224, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 for a ``(1, 3, hw, hw)`` float32 input named ``data``; output ``logits``."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def conv_bn(x: str, name: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        fan_in = cin * k * k
        w = const(f"{name}.w", rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / fan_in))
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}.conv"], name=f"{name}.conv",
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4))
        bn = [const(f"{name}.{p}", v) for p, v in (
            ("gamma", rng.uniform(0.5, 1.5, cout)), ("beta", rng.normal(0, 0.1, cout)),
            ("mean", rng.normal(0, 0.1, cout)), ("var", rng.uniform(0.5, 1.5, cout)))]
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn], [f"{name}.bn"],
                                      name=f"{name}.bn"))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    x = conv_bn("data", "stem", 3, 64, 7, 2, True)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], name="pool", kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}.{block}"
            y = conv_bn(x, f"{name}.a", cin, cout, 3, stride, True)
            y = conv_bn(y, f"{name}.b", cout, cout, 3, 1, False)
            short = conv_bn(x, f"{name}.down", cin, cout, 1, stride, False) if stride != 1 or cin != cout else x
            nodes.append(helper.make_node("Add", [y, short], [f"{name}.add"], name=f"{name}.add"))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}.out"))
            x, cin = f"{name}.out", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flat", axis=1))
    fc_w = const("fc.w", rng.standard_normal((1000, 512)) / np.sqrt(512))
    fc_b = const("fc.b", rng.normal(0, 0.01, 1000))
    nodes.append(helper.make_node("Gemm", ["flat", fc_w, fc_b], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "resnet18",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output .onnx path")
    ap.add_argument("--hw", type=int, default=224, help="input height and width (default 224)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    onnx.save(resnet18(args.hw, args.seed), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
