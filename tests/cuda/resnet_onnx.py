"""ResNet-18 / ResNet-50 (torchvision layer layout) as ONNX, built with ``onnx.helper`` (no torch).

Weights are random with a fixed seed and batch-norm statistics are randomized, so numerical
agreement tests exercise every parameter. ``hw`` sets the input resolution: the graph (layers,
fused groups, kernels) is the same at 64x64 as at 224x224, only the shapes shrink.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, seed: int) -> None:
        self.r = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        w = self.name("conv_w")
        fan_in = cin * k * k
        self.inits[w] = (self.r.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        y = self.name("conv")
        self.nodes.append(helper.make_node("Conv", [x, w], [y], kernel_shape=[k, k], strides=[stride, stride],
                                           pads=[k // 2] * 4))
        names = [self.name(p) for p in ("bn_scale", "bn_bias", "bn_mean", "bn_var")]
        self.inits[names[0]] = self.r.uniform(0.5, 1.5, cout).astype(np.float32)
        self.inits[names[1]] = (self.r.standard_normal(cout) * 0.1).astype(np.float32)
        self.inits[names[2]] = (self.r.standard_normal(cout) * 0.1).astype(np.float32)
        self.inits[names[3]] = self.r.uniform(0.5, 1.5, cout).astype(np.float32)
        z = self.name("bn")
        self.nodes.append(helper.make_node("BatchNormalization", [y, *names], [z], epsilon=1e-5))
        if not relu:
            return z
        a = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [z], [a]))
        return a

    def add_relu(self, a: str, b: str) -> str:
        s, o = self.name("add"), self.name("relu")
        self.nodes.append(helper.make_node("Add", [a, b], [s]))
        self.nodes.append(helper.make_node("Relu", [s], [o]))
        return o


def _resnet(blocks: list[int], bottleneck: bool, hw: int, seed: int, classes: int) -> tuple[onnx.ModelProto, dict]:
    b = _Builder(seed)
    x = b.conv_bn("data", 3, 64, 7, 2, True)
    p = b.name("pool")
    b.nodes.append(helper.make_node("MaxPool", [x], [p], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = p, 64
    for stage, n in enumerate(blocks):
        width = 64 * 2**stage
        cout = width * 4 if bottleneck else width
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            if bottleneck:
                y = b.conv_bn(x, cin, width, 1, 1, True)
                y = b.conv_bn(y, width, width, 3, stride, True)
                y = b.conv_bn(y, width, cout, 1, 1, False)
            else:
                y = b.conv_bn(x, cin, width, 3, stride, True)
                y = b.conv_bn(y, width, width, 3, 1, False)
            sc = b.conv_bn(x, cin, cout, 1, stride, False) if (stride != 1 or cin != cout) else x
            x, cin = b.add_relu(y, sc), cout
    g, f = b.name("gap"), b.name("flat")
    b.nodes.append(helper.make_node("GlobalAveragePool", [x], [g]))
    b.nodes.append(helper.make_node("Flatten", [g], [f], axis=1))
    b.inits["fc_w"] = (b.r.standard_normal((classes, cin)) / np.sqrt(cin)).astype(np.float32)
    b.inits["fc_b"] = (b.r.standard_normal(classes) * 0.01).astype(np.float32)
    b.nodes.append(helper.make_node("Gemm", [f, "fc_w", "fc_b"], ["output"], transB=1))
    graph = helper.make_graph(
        b.nodes, "resnet", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, classes])],
        initializer=[numpy_helper.from_array(v, k) for k, v in b.inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"data": np.random.default_rng(seed + 100).standard_normal((1, 3, hw, hw)).astype(np.float32)}
    return model, feeds


def resnet18(hw: int = 224, seed: int = 0, classes: int = 1000) -> tuple[onnx.ModelProto, dict]:
    """ResNet-18 (BasicBlock x [2, 2, 2, 2]) and a seeded input."""
    return _resnet([2, 2, 2, 2], False, hw, seed, classes)


def resnet50(hw: int = 224, seed: int = 0, classes: int = 1000) -> tuple[onnx.ModelProto, dict]:
    """ResNet-50 (Bottleneck x [3, 4, 6, 3]) and a seeded input."""
    return _resnet([3, 4, 6, 3], True, hw, seed, classes)
