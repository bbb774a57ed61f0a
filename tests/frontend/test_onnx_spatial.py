"""Spatial and sampling ops (GridSample, AffineGrid, LpPool, depth/space, CenterCropPad, Col2Im,
MaxUnpool) through from_onnx + the reference interpreter vs ONNX Runtime."""

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.runtime.errors import InputError, UnsupportedOpError
from tests.frontend.onnx_check import check_node, make_model, rand


def import_only(op_type, inputs, attrs, opset, const_inputs=()):
    """Import a one-node model into Kiln without running ONNX Runtime (for inputs it rejects)."""
    node = helper.make_node(op_type, list(inputs), ["out"], **attrs)
    model = make_model([node], inputs, ["out"], opset)
    return kiln.frontend.from_onnx(model, freeze={k: inputs[k] for k in const_inputs} or None)


@pytest.mark.parametrize("b", [2, 3])
def test_space_to_depth(b):
    check_node("SpaceToDepth", {"x": rand(2, 3, 2 * b, 3 * b)}, {"blocksize": b}, opset=13)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_node("DepthToSpace", {"x": rand(2, 12, 3, 4)}, {"blocksize": 2, "mode": mode}, opset=13)


def test_depth_space_bad_block():
    with pytest.raises(InputError, match="blocksize"):
        import_only("SpaceToDepth", {"x": rand(1, 2, 5, 4)}, {"blocksize": 2}, opset=13)
    with pytest.raises(UnsupportedOpError, match="mode"):
        import_only("DepthToSpace", {"x": rand(1, 8, 2, 2)}, {"blocksize": 2, "mode": "XYZ"}, opset=13)


@pytest.mark.parametrize("shape,axes", [((5, 3), None), ((4, 9), (1, 2)), ((2, 7), (-1, 1)),
                                        ((3, 8, 2), None)])
def test_center_crop_pad(shape, axes):
    x = rand(3, 6, 5) if len(shape) == 3 else rand(3, 6, 5, 2)
    if len(shape) == 2 and axes is None:
        x = rand(6, 4)
    attrs = {} if axes is None else {"axes": list(axes)}
    check_node("CenterCropPad", {"x": x, "shape": np.array(shape, dtype=np.int64)}, attrs, opset=18,
               const_inputs=("shape",))


@pytest.mark.parametrize("size,align", [((2, 3, 4, 5), 0), ((2, 3, 4, 5), 1), ((2, 3, 3, 4, 2), 0),
                                        ((2, 3, 3, 4, 2), 1), ((1, 1, 1, 3), 0)])
def test_affine_grid(size, align):
    k = len(size) - 2
    theta = rand(size[0], k, k + 1, lo=-2, hi=2)
    check_node("AffineGrid", {"theta": theta, "size": np.array(size, dtype=np.int64)},
               {"align_corners": align}, opset=20, const_inputs=("size",))


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 7, 8), {"kernel_shape": [3, 2]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "p": 3, "strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 3], "p": 1, "dilations": [2, 1]}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9), {"kernel_shape": [4], "strides": [3], "ceil_mode": 1}),
    ((1, 2, 4, 5, 6), {"kernel_shape": [2, 3, 2], "p": 4}),
])
def test_lp_pool(shape, attrs):
    check_node("LpPool", {"x": rand(*shape, lo=-2, hi=2)}, attrs, opset=18)


def _unpool_indices(x_shape, out_hw, kernel, stride, seed):
    """A valid MaxPool Indices tensor: one flat (N, C, H, W) position inside each window."""
    rng = np.random.default_rng(seed)
    n, c, h, w = x_shape
    oh, ow = out_hw
    idx = np.zeros(x_shape, dtype=np.int64)
    for i in np.ndindex(*x_shape):
        y = i[2] * stride[0] + rng.integers(0, kernel[0])
        xx = i[3] * stride[1] + rng.integers(0, kernel[1])
        idx[i] = ((i[0] * c + i[1]) * oh + min(y, oh - 1)) * ow + min(xx, ow - 1)
    return idx


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool(with_shape):
    x = rand(2, 3, 3, 2)
    out = (2, 3, 7, 5) if with_shape else (2, 3, 6, 4)
    idx = _unpool_indices(x.shape, out[2:], (2, 2), (2, 2), seed=4)
    inputs = {"x": x, "i": idx}
    if with_shape:
        inputs["shape"] = np.array(out, dtype=np.int64)
    check_node("MaxUnpool", inputs, {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11,
               const_inputs=("shape",) if with_shape else ())


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample(mode, pad, align):
    grid = rand(2, 4, 5, 2, lo=-1.4, hi=1.4, seed=3)
    grid[0, 0, :, 0] = np.linspace(-1, 1, 5)  # exact corners and centres
    check_node("GridSample", {"x": rand(2, 3, 4, 6), "grid": grid},
               {"mode": mode, "padding_mode": pad, "align_corners": align}, opset=20)


def test_grid_sample_opset16_names():
    check_node("GridSample", {"x": rand(1, 2, 4, 5), "grid": rand(1, 3, 3, 2, lo=-1.2, hi=1.2)},
               {"mode": "bicubic"}, opset=16)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_volumetric(mode):
    check_node("GridSample", {"x": rand(1, 2, 3, 4, 5), "grid": rand(1, 2, 3, 2, 3, lo=-1.2, hi=1.2)},
               {"mode": mode, "padding_mode": "border"}, opset=20)


def test_grid_sample_bad_mode():
    with pytest.raises(UnsupportedOpError, match="mode"):
        import_only("GridSample", {"x": rand(1, 2, 4, 5), "grid": rand(1, 3, 3, 2)}, {"mode": "area"}, opset=20)
    with pytest.raises(UnsupportedOpError, match="volumetric"):
        import_only("GridSample", {"x": rand(1, 2, 3, 4, 5), "grid": rand(1, 2, 2, 2, 3)}, {"mode": "cubic"},
                    opset=20)


@pytest.mark.parametrize("image,block,attrs", [
    ((5, 5), (1, 5), {}),
    ((5, 6), (2, 3), {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
    ((6, 4), (3, 2), {"dilations": [2, 1]}),
])
def test_col2im(image, block, attrs):
    m = len(image)
    dil = attrs.get("dilations", [1] * m)
    st = attrs.get("strides", [1] * m)
    pads = attrs.get("pads", [0] * 2 * m)
    nb = [(image[i] + pads[i] + pads[i + m] - dil[i] * (block[i] - 1) - 1) // st[i] + 1 for i in range(m)]
    x = rand(2, 3 * int(np.prod(block)), int(np.prod(nb)))
    check_node("Col2Im", {"x": x, "image": np.array(image, dtype=np.int64), "block": np.array(block, dtype=np.int64)},
               attrs, opset=18, const_inputs=("image", "block"))


def test_col2im_bad_blocks():
    x = rand(1, 4, 7)
    with pytest.raises(InputError, match="blocks"):
        import_only("Col2Im", {"x": x, "image": np.array([3, 3], dtype=np.int64),
                               "block": np.array([2, 2], dtype=np.int64)},
                    {}, opset=18, const_inputs=("image", "block"))


def test_lp_pool_bad_p():
    with pytest.raises(InputError, match="p must be positive"):
        import_only("LpPool", {"x": rand(1, 2, 4, 4)}, {"kernel_shape": [2, 2], "p": 0}, opset=18)


@pytest.mark.parametrize("attrs,og,with_mask", [
    ({}, 1, False),
    ({"pads": [1, 0, 1, 2], "strides": [2, 1], "dilations": [1, 2]}, 1, True),
    ({"group": 2, "offset_group": 2}, 2, True),
])
def test_deform_conv(attrs, og, with_mask):
    x = rand(2, 4, 6, 7)
    g = attrs.get("group", 1)
    w = rand(6, 4 // g, 3, 2, seed=1)
    st, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    oh = (6 + pads[0] + pads[2] - dil[0] * 2 - 1) // st[0] + 1
    ow = (7 + pads[1] + pads[3] - dil[1] * 1 - 1) // st[1] + 1
    inputs = {"x": x, "w": w, "offset": rand(2, og * 6 * 2, oh, ow, lo=-2.5, hi=2.5, seed=2),
              "b": rand(6, seed=3)}
    if with_mask:
        inputs["mask"] = rand(2, og * 6, oh, ow, lo=0, hi=1, seed=4)
    check_node("DeformConv", inputs, attrs, opset=19)
