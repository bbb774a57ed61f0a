"""AlterConvLayout keeps channel concatenations (and the per-channel BatchNorm + ReLU after
them) in the blocked NCHW[x]c layout when every input's channel count is a multiple of the
block, falls back to NCHW otherwise, and the built model computes what the NCHW graph does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.ir import Graph, evaluate
from kiln.transform import alter_conv_layout

F32 = "float32"


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.3) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(F32)


def _transforms(g: Graph) -> list[tuple[str, str]]:
    return [(n.attrs["src_layout"], n.attrs["dst_layout"]) for n in g.nodes if n.op == "layout_transform"]


def _concat_ranks(g: Graph) -> list[int]:
    return [len(n.outputs[0].shape) for n in g.nodes if n.op == "concatenate"]


def _build_run(g: Graph, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    lib = kiln.build(g, target="llvm")
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(**inputs)
    gm.run()
    return [gm.get_output(i).numpy() for i in range(gm.get_num_outputs())]


def _concat_bn_net(rng: np.random.Generator, ca: int, cb: int) -> Graph:
    """Two convs of one input (``ca`` / ``cb`` output channels), concatenated, then a
    BatchNorm-like per-channel multiply / add (one ``(1, C, 1, 1)``, one ``(C, 1, 1)``
    constant), a scalar multiply, ReLU and a 1x1 conv."""
    g = Graph()
    x = g.add_input("x", (1, 16, 8, 8))
    a = g.add("conv2d", x, g.add_constant(_rand(rng, ca, 16, 3, 3)), padding=(1, 1, 1, 1))
    b = g.add("conv2d", x, g.add_constant(_rand(rng, cb, 16, 1, 1)))
    c = ca + cb
    y = g.add("concatenate", a, b, axis=1)
    y = g.add("multiply", y, g.add_constant(_rand(rng, 1, c, 1, 1, scale=1.0)))
    y = g.add("add", y, g.add_constant(_rand(rng, c, 1, 1)))
    y = g.add("multiply", y, g.add_constant(np.array(0.5, F32)))
    y = g.add("relu", y)
    g.outputs = [g.add("conv2d", y, g.add_constant(_rand(rng, 16, c, 1, 1)))]
    return g


def test_concat_of_two_convs_stays_blocked() -> None:
    """16 + 32 channels, both convs in 16-channel blocks: no transform between the convs."""
    rng = np.random.default_rng(0)
    g = _concat_bn_net(rng, 16, 32)
    new = alter_conv_layout(g)
    assert _transforms(new) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")], _transforms(new)
    assert _concat_ranks(new) == [5]
    # the per-channel constants were re-stored blocked at build time
    for n in new.nodes:
        if n.op in ("multiply", "add"):
            assert len(n.outputs[0].shape) == 5
    x = _rand(rng, 1, 16, 8, 8, scale=1.0)
    want = evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(evaluate(new, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_build_run(g, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_concat_of_mixed_blocks_uses_a_common_block() -> None:
    """24 channels get 8-channel blocks, 32 get 16: the concatenation runs in blocks of 8
    (the only block dividing both), re-blocking the 16-channel input once."""
    rng = np.random.default_rng(1)
    g = _concat_bn_net(rng, 24, 32)
    new = alter_conv_layout(g)
    assert _concat_ranks(new) == [5]
    assert _transforms(new) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW8c"), ("NCHW16c", "NCHW")], _transforms(new)
    x = _rand(rng, 1, 16, 8, 8, scale=1.0)
    want = evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(evaluate(new, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_build_run(g, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_concat_of_non_multiple_channels_falls_back_to_nchw() -> None:
    """16 + 12 channels (blocks 16 and 12): no block divides both, so the concatenation and
    the ops after it stay NCHW and the values are unchanged."""
    rng = np.random.default_rng(2)
    g = _concat_bn_net(rng, 16, 12)
    new = alter_conv_layout(g)
    assert _concat_ranks(new) == [4]
    assert ("NCHW16c", "NCHW") in _transforms(new) and ("NCHW12c", "NCHW") in _transforms(new)
    x = _rand(rng, 1, 16, 8, 8, scale=1.0)
    want = evaluate(g, {"x": x})[0]
    np.testing.assert_allclose(evaluate(new, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_build_run(g, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_concat_not_on_channels_and_all_nchw_inputs_stay_nchw() -> None:
    """A concatenation along the width, and one of graph inputs only, are left alone."""
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", (1, 16, 8, 8))
    a = g.add("conv2d", x, g.add_constant(_rand(rng, 16, 16, 1, 1)))
    w = g.add("concatenate", a, a, axis=3)
    p = g.add("concatenate", x, g.add_input("x2", (1, 16, 8, 8)), axis=1)
    g.outputs = [w, p]
    new = alter_conv_layout(g)
    assert _concat_ranks(new) == [4, 4]
    inputs = {"x": _rand(rng, 1, 16, 8, 8), "x2": _rand(rng, 1, 16, 8, 8)}
    for got, want in zip(evaluate(new, inputs), evaluate(g, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_constant_concat_input_is_restored_at_build_time() -> None:
    """A constant joined to a blocked conv output is re-stored blocked as a new constant."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", (1, 16, 8, 8))
    a = g.add("conv2d", x, g.add_constant(_rand(rng, 16, 16, 1, 1)))
    y = g.add("concatenate", a, g.add_constant(_rand(rng, 1, 16, 8, 8)), axis=1)
    g.outputs = [g.add("relu", y)]
    new = alter_conv_layout(g)
    assert _concat_ranks(new) == [5]
    assert _transforms(new) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")], _transforms(new)
    xv = _rand(rng, 1, 16, 8, 8, scale=1.0)
    np.testing.assert_allclose(evaluate(new, {"x": xv})[0], evaluate(g, {"x": xv})[0], rtol=1e-5, atol=1e-5)


def _dense_block_onnx(rng: np.random.Generator, growth: int, layers: int = 3) -> onnx.ModelProto:
    """A DenseNet-style block: stem conv, then ``layers`` times BatchNorm → ReLU → 1x1 conv →
    BatchNorm → ReLU → 3x3 conv of ``growth`` channels, concatenated with all earlier
    features; final BatchNorm → ReLU → global average pool."""
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []

    def const(name: str, arr: np.ndarray) -> str:
        inits[name] = arr
        return name

    def bn_relu(src: str, c: int, tag: str) -> str:
        ins = [src, const(f"{tag}_g", (rng.random(c) + 0.5).astype(F32)), const(f"{tag}_b", _rand(rng, c)),
               const(f"{tag}_m", _rand(rng, c)), const(f"{tag}_v", (rng.random(c) + 0.5).astype(F32))]
        nodes.append(helper.make_node("BatchNormalization", ins, [f"{tag}_bn"]))
        nodes.append(helper.make_node("Relu", [f"{tag}_bn"], [f"{tag}_r"]))
        return f"{tag}_r"

    def conv(src: str, cin: int, cout: int, k: int, tag: str) -> str:
        w = const(f"{tag}_w", _rand(rng, cout, cin, k, k, scale=(2.0 / (cin * k * k)) ** 0.5))
        nodes.append(helper.make_node("Conv", [src, w], [tag], pads=[k // 2] * 4))
        return tag

    feats = [conv("x", 3, 32, 3, "stem")]
    c = 32
    for i in range(layers):
        cat = feats[0]
        if len(feats) > 1:
            cat = f"cat{i}"
            nodes.append(helper.make_node("Concat", feats, [cat], axis=1))
        y = conv(bn_relu(cat, c, f"l{i}a"), c, 4 * growth, 1, f"l{i}c1")
        feats.append(conv(bn_relu(y, 4 * growth, f"l{i}b"), 4 * growth, growth, 3, f"l{i}c3"))
        c += growth
    nodes.append(helper.make_node("Concat", feats, ["cat_out"], axis=1))
    nodes.append(helper.make_node("GlobalAveragePool", [bn_relu("cat_out", c, "fin")], ["out"]))
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                             (1, 3, 12, 12))],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("growth,blocked", [(16, True), (6, False)])
def test_dense_block_matches_onnxruntime(growth: int, blocked: bool) -> None:
    """Growth 16: every concatenation is blocked and the only activation transforms are the
    stem's input and the pool's; growth 6 (channels 38, 44 ...): concatenations fall back."""
    rng = np.random.default_rng(4)
    model = _dense_block_onnx(rng, growth)
    mod, params = kiln.frontend.from_onnx(model)
    opt = kiln.transform.default_pipeline(params, opt_level=3)(mod)
    assert _concat_ranks(opt) == [5 if blocked else 4] * 3
    if blocked:
        acts = [t for t in _transforms(opt) if not t[0].startswith("OIHW")]
        assert len(acts) == 2, acts
    x = rng.standard_normal((1, 3, 12, 12)).astype(F32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    lib = kiln.build(mod, target="llvm", params=params)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input(x=x)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-5)
