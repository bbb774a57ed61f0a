"""Symbolic spatial dims (H, W) of convolutions, pooling and resizes (CPU targets; OpenCL when present).

One library per model serves every image size in the declared ranges; results are compared
with onnxruntime at each size. Sizes run largest first, so the padded storage past a smaller
image's extent holds stale data from the previous run: a kernel that let its padding (conv
zero padding, max pool's ignored cells, avg pool's count) reach that data would fail.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import kiln
from kiln import ir
from kiln.runtime.errors import InputError, UnsupportedOpError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(7)
#: (h, w) per run: the upper bound first, then smaller, odd and non-square sizes.
SIZES = [(48, 48), (17, 9), (31, 48), (8, 8), (48, 23), (20, 33)]


class _Model:
    """An ONNX graph under construction: nodes, initializers, outputs."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.outputs: list = []
        self.k = 0

    def name(self, stem: str) -> str:
        self.k += 1
        return f"{stem}{self.k}"

    def const(self, arr: np.ndarray) -> str:
        n = self.name("c")
        self.inits.append(helper.make_tensor(n, TensorProto.FLOAT if arr.dtype == np.float32 else TensorProto.INT64,
                                             arr.shape, arr.flatten().tolist()))
        return n

    def weight(self, *shape: int) -> str:
        return self.const((RNG.standard_normal(shape) * 0.3).astype("float32"))

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def out(self, v: str) -> str:
        self.outputs.append(v)
        return v

    def build(self, inputs: list) -> bytes:
        g = helper.make_graph(self.nodes, "g", inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in self.outputs],
                              self.inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model.SerializeToString()


def _input(name: str = "x", c: int = 8):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, "h", "w"])


def _ops_model() -> bytes:
    """Every supported window op over x (1, 8, h, w), each its own output."""
    m = _Model()
    x = "x"
    # convolutions: padded, strided, dilated, asymmetric pads, grouped, depthwise, 1x1
    m.out(m.op("Relu", m.op("Conv", x, m.weight(16, 8, 3, 3), m.weight(16), pads=[1, 1, 1, 1])))
    m.out(m.op("Conv", x, m.weight(16, 8, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2]))
    m.out(m.op("Conv", x, m.weight(8, 8, 3, 3), pads=[2, 2, 2, 2], dilations=[2, 2]))
    m.out(m.op("Conv", x, m.weight(8, 8, 3, 2), pads=[0, 1, 2, 0], strides=[1, 2]))
    m.out(m.op("Conv", x, m.weight(16, 4, 3, 3), pads=[1, 1, 1, 1], group=2))
    m.out(m.op("Conv", x, m.weight(8, 1, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2], group=8))
    m.out(m.op("Conv", x, m.weight(8, 1, 3, 3), group=8))
    m.out(m.op("Conv", x, m.weight(16, 8, 1, 1), strides=[2, 2]))
    m.out(m.op("Conv", x, m.weight(16, 8, 5, 5)))
    # pools
    m.out(m.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    m.out(m.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1))
    m.out(m.op("MaxPool", x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[2, 2]))
    m.out(m.op("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1))
    m.out(m.op("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    m.out(m.op("AveragePool", x, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1))
    m.out(m.op("GlobalAveragePool", x))
    m.out(m.op("GlobalMaxPool", x))
    # resizes and the ops around them
    two = m.const(np.array([1, 1, 2, 2], "float32"))
    m.out(m.op("Resize", x, "", two, mode="nearest"))
    m.out(m.op("Resize", x, "", two, mode="linear"))
    m.out(m.op("Resize", x, "", two, mode="linear", coordinate_transformation_mode="align_corners"))
    m.out(m.op("Resize", x, "", m.const(np.array([1, 1, 0.5, 0.5], "float32")), mode="nearest"))
    m.out(m.op("ConvTranspose", x, m.weight(8, 4, 2, 2), strides=[2, 2]))
    y = m.op("Conv", x, m.weight(8, 8, 3, 3), pads=[1, 1, 1, 1])
    m.out(m.op("Concat", x, m.op("Sigmoid", y), axis=1))
    return m.build([_input()])


def _cnn_model() -> bytes:
    """A small segmentation-style CNN: stem conv + BN + ReLU, max pool, a residual block, a
    strided conv + depthwise conv concatenated with a pooled skip (both ``ceil(n / 2)`` for
    every size: ``(n-1)//2+1``), a x2 upsample, a head conv; plus a classifier (global pool,
    flatten, Gemm) as a second output."""
    m = _Model()

    def bn(v: str, c: int) -> str:
        return m.op("BatchNormalization", v, m.const((RNG.random(c) + 0.5).astype("float32")),
                    m.weight(c), m.weight(c), m.const((RNG.random(c) + 0.5).astype("float32")))

    s = m.op("Relu", bn(m.op("Conv", "x", m.weight(16, 3, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2]), 16))
    p = m.op("MaxPool", s, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    r = m.op("Relu", bn(m.op("Conv", p, m.weight(16, 16, 3, 3), pads=[1, 1, 1, 1]), 16))
    r = m.op("Relu", m.op("Add", p, bn(m.op("Conv", r, m.weight(16, 16, 3, 3), pads=[1, 1, 1, 1]), 16)))
    d = m.op("Relu", m.op("Conv", r, m.weight(32, 16, 3, 3), m.weight(32), pads=[1, 1, 1, 1], strides=[2, 2]))
    d = m.op("Relu", m.op("Conv", d, m.weight(32, 1, 3, 3), pads=[1, 1, 1, 1], group=32))
    skip = m.op("AveragePool", r, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    cat = m.op("Concat", d, skip, axis=1)
    u = m.op("Resize", cat, "", m.const(np.array([1, 1, 2, 2], "float32")), mode="nearest")
    m.out(m.op("Conv", u, m.weight(4, 48, 1, 1), m.weight(4)))
    flat = m.op("Flatten", m.op("GlobalAveragePool", d))
    m.out(m.op("Gemm", flat, m.weight(10, 32), m.weight(10), transB=1))
    return m.build([_input(c=3)])


def _check_against_ort(mod: kiln.GraphModule, model: bytes, sizes, c: int, rtol=1e-4, atol=1e-4) -> None:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for h, w in sizes:
        x = RNG.standard_normal((1, c, h, w)).astype("float32")
        mod.run(x=x)
        refs = sess.run(None, {"x": x})
        for i, ref in enumerate(refs):
            got = mod.get_output(i).numpy()
            assert got.shape == ref.shape, f"output {i} at {(h, w)}"
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"output {i} at {(h, w)}")


@pytest.mark.parametrize("target, blocked", [("llvm", True), ("c", True), ("llvm", False)])
def test_window_ops_match_onnxruntime_at_every_size(target, blocked, monkeypatch):
    if not blocked:  # the plain NCHW kernels, as a target without blocked layouts gets them
        monkeypatch.setenv("KILN_DISABLE_PASSES", "AlterConvLayout")
    model = _ops_model()
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"h": (8, 48), "w": (8, 48)})
    lib = kiln.build(graph, target=target, params=params)
    funcs = {n["attrs"]["func_name"] for n in json.loads(lib.get_graph_json())["nodes"] if n["op"] == "tvm_op"}
    assert any("conv2d_nchwc" in f for f in funcs) == blocked
    mod = kiln.GraphModule(lib["default"](kiln.cpu()))
    _check_against_ort(mod, model, SIZES, 8)


@pytest.mark.skipif(not kiln.opencl().exist, reason="no OpenCL device")
def test_window_ops_on_opencl():
    """The GPU kernels of the same ops (upper-bound grid with guards, docs/dynamic_shapes.md)."""
    model = _ops_model()
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"h": (8, 48), "w": (8, 48)})
    mod = kiln.GraphModule(kiln.build(graph, target="opencl", params=params)["default"](kiln.opencl()))
    _check_against_ort(mod, model, SIZES[:3], 8)


def test_conv1d_over_a_symbolic_length():
    w = RNG.standard_normal((6, 4, 3)).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1], strides=[2]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2], strides=[2], ceil_mode=1)]
    g = helper.make_graph(nodes, "c1", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("W", TensorProto.FLOAT, w.shape, w.flatten().tolist())])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"n": (4, 100)})
    assert graph.outputs[0].type.dims == (1, 6, "(n-1)//4+1")
    mod = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (100, 7, 33, 4):
        x = RNG.standard_normal((1, 4, n)).astype("float32")
        mod.run(x=x)
        np.testing.assert_allclose(mod.get_output(0).numpy(), sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_cnn_library_serves_every_image_size(tmp_path):
    model = _cnn_model()
    graph, params = kiln.frontend.from_onnx(model, shape={"x": (1, 3, "h", "w")},
                                            dim_ranges={"h": (16, 64), "w": (16, 64)})
    assert graph.outputs[0].type.dims == (1, 4, "2*((h-1)//4)+2", "2*((w-1)//4)+2")
    lib = kiln.build(graph, target="llvm", params=params)
    path = tmp_path / "cnn.so"
    lib.export_library(str(path))
    mod = kiln.GraphModule(kiln.runtime.load_module(str(path))["default"](kiln.cpu()))
    _check_against_ort(mod, model, [(64, 64), (17, 40), (32, 32), (16, 16), (64, 19)], 3)
    assert mod.get_output(0).shape == (1, 4, 32, 10)  # 64 x 19: 2 * ceil(ceil(19 / 2) / 2) = 10
    with pytest.raises(InputError, match=r"dim 2 \(h\) is 65, outside its range 16\.\.64"):
        mod.set_input("x", np.zeros((1, 3, 65, 32), "float32"))
    with pytest.raises(InputError, match=r"dim 3 \(w\) is 15, outside its range 16\.\.64"):
        mod.set_input("x", np.zeros((1, 3, 32, 15), "float32"))


def test_output_dims_are_window_formulas():
    g = ir.Graph("g")
    g.declare_dim("h", 8, 64)
    g.declare_dim("w", 8, 64)
    x = g.add_input("x", (1, 8, "h", "w"))
    w = g.add_constant(np.zeros((8, 8, 3, 3), "float32"))
    assert g.add("conv2d", x, w, padding=(1, 1, 1, 1)).type.dims == (1, 8, "h", "w")
    y = g.add("conv2d", x, w, strides=(2, 2), dilation=(2, 2))
    assert y.type.dims == (1, 8, "(h-5)//2+1", "(w-5)//2+1")
    assert y.type.shape == (1, 8, 30, 30)
    p = g.add("max_pool2d", x, pool_size=(2, 2), strides=(2, 2), ceil_mode=True)
    assert p.type.dims == (1, 8, "(h-1)//2+1", "(w-1)//2+1")  # ceil((h - 2) / 2) + 1
    # a window that could start in the end padding: ceil(h / 2) windows start in the input
    p = g.add("max_pool2d", x, pool_size=(1, 3), strides=(2, 2), padding=(0, 0, 0, 2), ceil_mode=True)
    assert p.type.dims == (1, 8, "(h+1)//2", "(w+1)//2")
    t = g.add("conv2d_transpose", x, g.add_constant(np.zeros((8, 4, 2, 2), "float32")), strides=(2, 2))
    assert t.type.dims == (1, 4, "2*h", "2*w")
    r = g.add("resize2d", x, size=(96, 96), scales=(1.5, 1.5))
    assert r.type.dims == (1, 8, "(3*h)//2", "(3*w)//2")


def test_refusals_name_the_dims():
    g = ir.Graph("g")
    g.declare_dim("h", 2, 64)
    x = g.add_input("x", (1, 8, "h", 16))
    with pytest.raises(InputError, match=r"conv2d.*< 1 at the low end.*h>=2"):
        g.add("conv2d", x, g.add_constant(np.zeros((8, 8, 5, 5), "float32")))
    with pytest.raises(InputError, match="resize2d.*rational scale"):
        g.add("resize2d", x, size=(45, 16), scales=(0.7071, 1.0))
    c = g.add_input("c", (1, "h", 4, 4))
    with pytest.raises(InputError, match="channels.*'h'"):
        g.add("conv2d", c, g.add_constant(np.zeros((8, 64, 1, 1), "float32")))
    m = _Model()
    m.out(m.op("Conv", "x", m.weight(8, 8, 3, 3), auto_pad="SAME_UPPER", strides=[2, 2]))
    with pytest.raises(UnsupportedOpError, match="SAME_UPPER with stride 2.*'h'"):
        kiln.frontend.from_onnx(m.build([_input()]), dim_ranges={"h": (8, 48), "w": (8, 48)})
    m = _Model()
    m.out(m.op("Resize", "x", "", "", m.op("Shape", "x"), mode="cubic"))
    with pytest.raises(UnsupportedOpError, match=r"runtime sizes \(1, 8, h, w\).*mode='cubic'"):
        kiln.frontend.from_onnx(m.build([_input()]), dim_ranges={"h": (8, 48), "w": (8, 48)})
    m = _Model()
    m.out(m.op("Resize", "x", "", "", m.op("Shape", "x"), coordinate_transformation_mode="tf_half_pixel_for_nn"))
    with pytest.raises(UnsupportedOpError, match="tf_half_pixel_for_nn"):
        kiln.frontend.from_onnx(m.build([_input()]), dim_ranges={"h": (8, 48), "w": (8, 48)})
    m = _Model()
    m.out(m.op("Resize", "x", "", "", m.const(np.array([1, 4, 32, 32], "int64"))))
    with pytest.raises(UnsupportedOpError, match="only H and W of a 4-D input"):
        kiln.frontend.from_onnx(m.build([_input()]), dim_ranges={"h": (8, 48), "w": (8, 48)})
    m = _Model()
    m.out(m.op("LpPool", "x", kernel_shape=[2, 2], strides=[2, 2]))
    with pytest.raises(UnsupportedOpError, match=r"LpPool over symbolic spatial dims \('h', 'w'\)"):
        kiln.frontend.from_onnx(m.build([_input()]), dim_ranges={"h": (8, 48), "w": (8, 48)})
    # a skip connection that only lines up for even sizes
    m = _Model()
    d = m.op("Conv", "x", m.weight(8, 8, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2])
    m.out(m.op("Concat", "x", m.op("Resize", d, "", m.const(np.array([1, 1, 2, 2], "float32"))), axis=1))
    with pytest.raises(InputError, match=r"concatenate.*'2\*\(\(h-1\)//2\)\+2'"):
        kiln.frontend.from_onnx(m.build([_input()]), dim_ranges={"h": (8, 48), "w": (8, 48)})


def _sizes_model(coord: str, mode: str) -> bytes:
    """Resizes to sizes known at run time over x (b, 8, h, w): a strided conv's output back
    to ``Shape(x)`` (added to x, so the dims must be x's), a global pool's 1x1 back to x's
    H and W (DeepLabV3's ASPP pooling branch, concatenated with x), x to a fixed 20 x 13, and
    a max pool's output back to ``Shape(x)`` then averaged over H and W."""
    m = _Model()
    d = m.op("Conv", "x", m.weight(8, 8, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2])
    up = m.op("Resize", d, "", "", m.op("Shape", "x"), mode=mode, coordinate_transformation_mode=coord)
    m.out(m.op("Add", up, "x"))
    shape = m.op("Shape", "x")
    hw = m.op("Slice", shape, m.const(np.array([2], "int64")), m.const(np.array([4], "int64")))
    bc = m.op("Slice", shape, m.const(np.array([0], "int64")), m.const(np.array([2], "int64")))
    pooled = m.op("GlobalAveragePool", "x")
    back = m.op("Resize", pooled, "", "", m.op("Concat", bc, hw, axis=0), mode=mode,
                coordinate_transformation_mode=coord)
    m.out(m.op("Concat", "x", back, axis=1))
    fixed = m.op("Concat", bc, m.const(np.array([20, 13], "int64")), axis=0)
    m.out(m.op("Resize", "x", "", "", fixed, mode=mode, coordinate_transformation_mode=coord))
    # a reduction after the resize: the resize ends its kernel (only it has the runtime size)
    pool = m.op("MaxPool", "x", kernel_shape=[2, 2], strides=[2, 2])
    again = m.op("Resize", pool, "", "", m.op("Shape", "x"), mode=mode, coordinate_transformation_mode=coord)
    m.out(m.op("ReduceMean", again, axes=[2, 3], keepdims=0))
    return m.build([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8, "h", "w"])])


@pytest.mark.parametrize("coord, mode", [("half_pixel", "linear"), ("pytorch_half_pixel", "linear"),
                                         ("align_corners", "linear"), ("asymmetric", "nearest"),
                                         ("half_pixel", "nearest")])
def test_resize_to_runtime_sizes_matches_onnxruntime(coord, mode):
    """ONNX ``sizes`` computed from shapes (segmentation heads, U-Net skips): the output takes
    the runtime sizes and each axis's scale is ``out / in`` at run time, at every size."""
    model = _sizes_model(coord, mode)
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"b": (1, 3), "h": (8, 48), "w": (8, 48)})
    outs = graph.outputs
    assert [str(d) for d in outs[0].type.dims] == ["b", "8", "h", "w"]
    assert [str(d) for d in outs[2].type.dims] == ["b", "8", "20", "13"]
    mod = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for b, h, w in [(1, 48, 48), (2, 17, 9), (3, 8, 31), (1, 13, 13)]:
        x = RNG.standard_normal((b, 8, h, w)).astype("float32")
        mod.run(x=x)
        for i, ref in enumerate(sess.run(None, {"x": x})):
            got = mod.get_output(i).numpy()
            assert got.shape == ref.shape, f"output {i} at {(b, h, w)}"
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"output {i} at {(b, h, w)}")
    # the reference interpreter reads the sizes at the actual dims too
    x = RNG.standard_normal((2, 8, 17, 9)).astype("float32")
    for got, ref in zip(ir.evaluate(graph, {"x": x}, params), sess.run(None, {"x": x})):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_resize_to_runtime_sizes_ir_rule():
    g = ir.Graph("g")
    g.declare_dim("h", 2, 64)
    x = g.add_input("x", (1, 8, 4, 4))
    y = g.add("resize2d", x, size=(128, 64), scales=(32.0, 16.0), method="linear", sym_size=("2*h", "h"))
    assert [str(d) for d in y.type.dims] == ["1", "8", "2*h", "h"] and y.shape == (1, 8, 128, 64)
    with pytest.raises(InputError, match="sym_size.*'k'.*no declared range"):
        g.add("resize2d", x, size=(8, 8), scales=(2.0, 2.0), sym_size=("k", 8))
    with pytest.raises(InputError, match=r"sym_size.*dim 2\*h reaches 128, more than the 64"):
        g.add("resize2d", x, size=(64, 64), scales=(16.0, 16.0), sym_size=("2*h", "h"))


def test_atrous_conv_skips_the_rows_of_padding_at_the_runtime_height():
    """DeepLabV3's dilation-12 ASPP branch over a feature map of 4..16 rows: which kernel
    rows read data depends on the runtime height, so the kernel tests it once per row and
    kernel row (outside the column taps and channels) and skips the rest; the values match
    ONNX Runtime at heights where every, some and only the centre kernel row read data."""
    m = _Model()
    m.out(m.op("Conv", "x", m.weight(32, 32, 3, 3), m.weight(32), dilations=[12, 12], pads=[12, 12, 12, 12]))
    model = m.build([_input(c=32)])
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"h": (4, 16), "w": (4, 16)})
    lib = kiln.build(graph, target="c", params=params)
    src = lib.get_lib().get_source()
    # the row test sits between the kernel-row loop and the kernel-column loop
    assert re.search(r"for \(int32_t ry = 0; ry < 3; \+\+ry\) \{\s*if \(.*ry \* 12.*h_rt.*\{\s*"
                     r"for \(int32_t rx = 0; rx < 3; \+\+rx\)", src), "row test not hoisted"
    mod = kiln.GraphModule(lib["default"](kiln.cpu()))
    _check_against_ort(mod, model, [(16, 16), (14, 5), (13, 16), (12, 12), (7, 9), (4, 4)], 32)


def test_torch_export_with_dynamic_image_size():
    torch = pytest.importorskip("torch")
    from kiln.frontend.torch import from_exported_program

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, stride=2)
            self.pool = torch.nn.MaxPool2d(2)

        def forward(self, x):
            return self.pool(torch.relu(self.conv(x)))

    net = Net().eval()
    dims = {"x": {2: torch.export.Dim("h", min=16, max=64), 3: torch.export.Dim("w", min=16, max=64)}}
    ep = torch.export.export(net, (torch.randn(1, 3, 32, 32),), dynamic_shapes=dims)
    graph, params = from_exported_program(ep)
    assert graph.outputs[0].type.dims == (1, 8, "(h-3)//4+1", "(w-3)//4+1")
    mod = kiln.GraphModule(kiln.build(graph, target="llvm", params=params)["default"](kiln.cpu()))
    for h, w in [(64, 64), (17, 30), (16, 63)]:
        x = torch.randn(1, 3, h, w)
        mod.run(x=x.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(mod.get_output(0).numpy(), net(x).numpy(), rtol=1e-5, atol=1e-5)
