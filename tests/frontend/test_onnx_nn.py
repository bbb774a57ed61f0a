"""NN ops through from_onnx + the reference interpreter vs ORT."""

import numpy as np
import pytest

from tests.frontend.onnx_check import check_node, rand


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 1, 1, 1]},
    {"strides": [2, 2], "pads": [1, 0, 2, 1]},
    {"dilations": [2, 2], "pads": [2, 2, 2, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"auto_pad": "VALID", "strides": [2, 1]},
])
def test_conv2d(attrs):
    check_node("Conv", {"x": rand(1, 4, 9, 8), "w": rand(6, 4, 3, 3, seed=1),
                        "b": rand(6, seed=2)}, attrs)


def test_conv2d_groups_and_depthwise():
    check_node("Conv", {"x": rand(2, 6, 7, 7), "w": rand(9, 2, 3, 3, seed=1)},
               {"group": 3, "pads": [1, 1, 1, 1]})
    check_node("Conv", {"x": rand(1, 8, 6, 6), "w": rand(8, 1, 3, 3, seed=1),
                        "b": rand(8, seed=3)}, {"group": 8, "pads": [1, 1, 1, 1],
                                                "strides": [2, 2]})
    check_node("Conv", {"x": rand(1, 8, 5, 5), "w": rand(4, 8, 1, 1, seed=1)})


@pytest.mark.parametrize("attrs", [{}, {"pads": [2, 1], "strides": [2]}, {"dilations": [2]},
                                   {"auto_pad": "SAME_UPPER"}, {"group": 2}])
def test_conv1d(attrs):
    check_node("Conv", {"x": rand(2, 4, 11), "w": rand(6, 4 // attrs.get("group", 1), 3, seed=1),
                        "b": rand(6, seed=2)}, attrs)


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 2]},
    {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    {"strides": [2, 3], "dilations": [2, 1], "pads": [0, 1, 1, 0]},
    {"strides": [2, 2], "output_shape": [9, 10]},
    {"strides": [2, 2], "output_shape": [9, 10], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"group": 2, "strides": [2, 2]},
])
def test_conv_transpose(attrs):
    check_node("ConvTranspose", {"x": rand(1, 4, 4, 5), "w": rand(4, 3, 3, 3, seed=1),
                                 "b": rand(3 * attrs.get("group", 1), seed=2)}, attrs)


def test_conv_transpose_1d():
    check_node("ConvTranspose", {"x": rand(1, 2, 5), "w": rand(2, 3, 3, seed=1)},
               {"strides": [2]})


@pytest.mark.parametrize("attrs,shapes", [
    ({}, ((3, 4), (4, 5), (5,))),
    ({"transA": 1}, ((4, 3), (4, 5), (1, 5))),
    ({"transB": 1, "alpha": 0.5, "beta": 2.0}, ((3, 4), (5, 4), (3, 5))),
    ({"transA": 1, "transB": 1}, ((4, 3), (5, 4), (3, 1))),
    ({}, ((3, 4), (4, 5), None)),
    ({"beta": 0.0}, ((3, 4), (4, 5), ())),
])
def test_gemm(attrs, shapes):
    ins = {"a": rand(*shapes[0]), "b": rand(*shapes[1], seed=1)}
    ins["c"] = None if shapes[2] is None else rand(*shapes[2], seed=2)
    check_node("Gemm", ins, attrs)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                   ((1, 3, 4), (2, 4, 5)), ((4,), (4, 5)), ((2, 3, 4), (4,)),
                                   ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(sa, sb):
    check_node("MatMul", {"a": rand(*sa), "b": rand(*sb, seed=1)})


def test_matmul_weight_uses_dense():
    mod = check_node("MatMul", {"a": rand(2, 3, 4), "w": rand(4, 5, seed=1)}, const_inputs=["w"])
    assert "dense" in mod.op_counts()


def test_matmul_int():
    check_node("MatMul", {"a": rand(3, 4, dtype="int32", lo=-5, hi=5),
                          "b": rand(4, 2, dtype="int32", seed=2, lo=-5, hi=5)})


def test_batchnorm():
    c = 3
    ins = {"x": rand(2, c, 4, 4), "s": rand(c, seed=1), "b": rand(c, seed=2),
           "m": rand(c, seed=3), "v": rand(c, seed=4, lo=0.5, hi=2)}
    check_node("BatchNormalization", ins, {"epsilon": 1e-3}, opset=15)
    ins["x"] = rand(5, c)
    check_node("BatchNormalization", ins, opset=9)


def test_instance_norm():
    check_node("InstanceNormalization", {"x": rand(2, 3, 5, 4), "s": rand(3, seed=1),
                                         "b": rand(3, seed=2)}, {"epsilon": 1e-3})
    check_node("InstanceNormalization", {"x": rand(2, 3, 7), "s": rand(3, seed=1),
                                         "b": rand(3, seed=2)})


@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_norm(axis):
    x = rand(2, 3, 8)
    shape = x.shape[axis:]
    check_node("LayerNormalization", {"x": x, "s": rand(*shape, seed=1), "b": rand(*shape, seed=2)},
               {"axis": axis})
    check_node("LayerNormalization", {"x": x, "s": rand(*shape, seed=1)}, {"axis": axis,
                                                                         "epsilon": 1e-3})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, None), (11, 0), (11, 2), (11, -1), (13, None),
                                        (13, 1), (13, 0)])
def test_softmax(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    check_node(op, {"x": rand(2, 3, 4, lo=-3, hi=3)}, attrs, opset=opset)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool2d(op, attrs):
    attrs = dict(attrs)
    if op == "AveragePool" and "dilations" in attrs:
        opset = 19
    else:
        opset = 17
    check_node(op, {"x": rand(1, 2, 7, 8)}, attrs, opset=opset)
    if op == "AveragePool":
        check_node(op, {"x": rand(1, 2, 7, 8)}, {**attrs, "count_include_pad": 1}, opset=opset)


def test_pool1d_and_int_maxpool():
    check_node("MaxPool", {"x": rand(1, 3, 9)}, {"kernel_shape": [3], "strides": [2]})
    check_node("AveragePool", {"x": rand(1, 3, 9)}, {"kernel_shape": [3], "pads": [1, 1]})
    check_node("MaxPool", {"x": rand(1, 2, 5, 5, dtype="int8", lo=-100, hi=100)},
               {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}, opset=12)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    check_node(op, {"x": rand(2, 3, 5, 4)})
    check_node(op, {"x": rand(2, 3, 5)})


def test_lrn():
    check_node("LRN", {"x": rand(2, 7, 3, 3)}, {"size": 3})
    check_node("LRN", {"x": rand(2, 7, 3, 3, lo=0, hi=3)},
               {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0})


COORD = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_half_pixel_for_nn", "half_pixel_symmetric"]


@pytest.mark.parametrize("coord", COORD)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
def test_resize_nearest(coord, nearest_mode):
    x = rand(1, 2, 4, 5)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord,
             "nearest_mode": nearest_mode}
    scales = np.array([1, 1, 2.0, 1.5], np.float32)
    check_node("Resize", {"x": x, "roi": None, "scales": scales}, attrs, opset=19,
               const_inputs=["scales"])
    sizes = np.array([1, 2, 3, 7], np.int64)
    check_node("Resize", {"x": x, "roi": None, "scales": None, "sizes": sizes}, attrs, opset=19,
               const_inputs=["sizes"])


@pytest.mark.parametrize("coord", [c for c in COORD if c != "tf_half_pixel_for_nn"])
def test_resize_linear(coord):
    x = rand(1, 2, 4, 5)
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    check_node("Resize", {"x": x, "roi": None, "scales": np.array([1, 1, 2.0, 0.6], np.float32)},
               attrs, opset=19, const_inputs=["scales"])
    check_node("Resize", {"x": x, "roi": None, "scales": None,
                          "sizes": np.array([1, 2, 7, 3], np.int64)}, attrs, opset=19,
               const_inputs=["sizes"])


def test_resize_opset11_and_axes():
    x = rand(1, 2, 4, 5)
    check_node("Resize", {"x": x, "roi": np.zeros(0, np.float32),
                          "scales": np.array([1, 1, 2.0, 2.0], np.float32)},
               {"mode": "nearest"}, opset=11, const_inputs=["roi", "scales"])
    check_node("Resize", {"x": x, "roi": None, "scales": None,
                          "sizes": np.array([8, 8], np.int64)},
               {"mode": "linear", "axes": [2, 3]}, opset=19, const_inputs=["sizes"])
    check_node("Resize", {"x": x, "roi": None, "scales": None,
                          "sizes": np.array([8, 8], np.int64)},
               {"mode": "nearest", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
               opset=19, const_inputs=["sizes"])


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("ijk->ik", [(2, 3, 4)]),
])
def test_einsum(eq, shapes):
    ins = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    check_node("Einsum", ins, {"equation": eq}, opset=12)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_opset9(mode):
    scales = np.array([1, 1, 2.0, 3.0], np.float32)
    check_node("Upsample", {"x": rand(1, 2, 3, 4), "s": scales}, {"mode": mode}, opset=9,
               const_inputs=["s"])
    check_node("Resize", {"x": rand(1, 2, 3, 4), "s": scales}, {"mode": mode}, opset=10,
               const_inputs=["s"])


# ----------------------------------------------------------------------------- coverage additions
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_layer_norm_mean_and_inv_std_dev(axis):
    x = rand(2, 3, 5, lo=-2, hi=3)
    shape = x.shape[axis:]
    check_node("LayerNormalization", {"x": x, "s": rand(*shape, seed=1),
                                      "b": rand(*shape, seed=2)},
               {"axis": axis, "epsilon": 1e-2}, n_out=3)


def test_layer_norm_mean_only_and_float16():
    x = rand(3, 4, lo=0, hi=5)
    mod = check_node("LayerNormalization", {"x": x, "s": rand(4, seed=1)}, n_out=2)
    assert [v.shape for v in mod.outputs] == [(3, 4), (3, 1)]
    # Mean / InvStdDev come in the stash type (float32) for float16 data.
    x16 = x.astype(np.float16)
    check_node("LayerNormalization", {"x": x16, "s": rand(4, seed=1).astype(np.float16)},
               n_out=3, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2, 2]},
    {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0]},
    {"kernel_shape": [2, 3, 2], "strides": [2, 2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2, 2], "dilations": [2, 1, 2], "pads": [1, 1, 0, 0, 1, 1]},
    {"kernel_shape": [3, 3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2, 2]},
])
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool3d(op, attrs):
    x = rand(2, 3, 5, 6, 7)
    check_node(op, {"x": x}, attrs, opset=19)
    if op == "AveragePool":
        check_node(op, {"x": x}, {**attrs, "count_include_pad": 1}, opset=19)


def test_pool3d_is_two_pool2d_kernels():
    mod = check_node("MaxPool", {"x": rand(1, 2, 4, 4, 4)}, {"kernel_shape": [2, 2, 2]})
    assert [n.op for n in mod.nodes if n.op.endswith("pool2d")] == ["max_pool2d", "max_pool2d"]


def test_batchnorm_training_mode():
    x = rand(4, 3, 5, 2, lo=-2, hi=2)
    ins = {"x": x, "s": rand(3, seed=1), "b": rand(3, seed=2), "m": rand(3, seed=3),
           "v": rand(3, seed=4, lo=0.5, hi=2)}
    check_node("BatchNormalization", ins, {"training_mode": 1, "momentum": 0.8,
                                           "epsilon": 1e-3}, n_out=3, opset=15)
    check_node("BatchNormalization", {**ins, "x": rand(6, 3, lo=-1, hi=4)},
               {"training_mode": 1}, n_out=3, opset=15)


def test_dropout_training_with_zero_ratio_is_identity():
    x = rand(3, 4)
    ins = {"x": x, "r": np.array(0.0, np.float32), "t": np.array(True)}
    check_node("Dropout", ins, n_out=2, opset=13, const_inputs=["r", "t"])


def test_dropout_training_with_nonzero_ratio_is_unsupported():
    import kiln
    from tests.frontend.onnx_check import make_model
    from onnx import helper

    from kiln.runtime.errors import UnsupportedOpError

    node = helper.make_node("Dropout", ["x", "r", "t"], ["y"])
    model = make_model([node], {"x": rand(3, 4), "r": np.array(0.5, np.float32),
                                "t": np.array(True)}, ["y"], opset=13)
    with pytest.raises(UnsupportedOpError, match="ratio=0.5"):
        kiln.frontend.from_onnx(model, freeze={"r": np.array(0.5, np.float32),
                                               "t": np.array(True)})


@pytest.mark.parametrize("attrs", [
    {"strides": [3, 2], "output_shape": [10, 8]},
    {"strides": [2, 2], "output_shape": [10, 12]},
    {"strides": [2, 2], "output_shape": [8, 9], "pads": [0, 0, 0, 0]},
])
def test_conv_transpose_output_shape_larger_than_full(attrs):
    check_node("ConvTranspose", {"x": rand(1, 2, 4, 5), "w": rand(2, 3, 3, 3, seed=1)}, attrs)


@pytest.mark.parametrize("eq,shapes", [
    ("...ii->...i", [(3, 5, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("iji->j", [(3, 2, 3)]),
    ("bii,bij->bj", [(2, 3, 3), (2, 3, 4)]),
])
def test_einsum_diagonal(eq, shapes):
    ins = {f"x{i}": rand(*s, seed=i) for i, s in enumerate(shapes)}
    check_node("Einsum", ins, {"equation": eq}, opset=12)


def test_einsum_diagonal_keeps_inf_off_diagonal_out():
    x = np.eye(3, dtype=np.float32) * 2
    x[0, 1] = np.inf
    check_node("Einsum", {"x": x}, {"equation": "ii->i"}, opset=12)


RESIZE_FLOAT = [
    ({"mode": "cubic"}, [1, 1, 0.8, 0.8]),
    ({"mode": "cubic"}, [1, 1, 2.0, 1.5]),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, [1, 1, 0.8, 2.0]),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2.0, 2.0]),
    ({"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 1.5, 2.0]),
    ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 0.5, 3]),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.6, 0.5]),
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.6, 0.75]),
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.3, 2.0]),
    # 20-tap filter: wider than MAX_GATHER_TAPS, resized by a matmul with the dense matrix
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.2, 0.5]),
    ({"mode": "nearest"}, [1, 2.0, 1.0, 1.5]),
]


@pytest.mark.parametrize("attrs,scales", RESIZE_FLOAT)
def test_resize_cubic_antialias_and_any_axis(attrs, scales):
    x = rand(1, 2, 11, 8, lo=-3, hi=3)
    check_node("Resize", {"x": x, "roi": None, "scales": np.array(scales, np.float32)}, attrs,
               opset=19, const_inputs=["scales"], rtol=1e-4, atol=1e-4)


def test_resize_cubic_sizes_and_5d():
    check_node("Resize", {"x": rand(1, 1, 4, 4), "roi": None, "scales": None,
                          "sizes": np.array([1, 1, 9, 10], np.int64)}, {"mode": "cubic"},
               opset=19, const_inputs=["sizes"], atol=1e-4)
    check_node("Resize", {"x": rand(1, 2, 3, 4, 5), "roi": None,
                          "scales": np.array([1, 1, 2.0, 0.5, 1.6], np.float32)},
               {"mode": "linear"}, opset=19, const_inputs=["scales"], atol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
def test_resize_tf_crop_and_resize(mode):
    x = rand(1, 2, 5, 6)
    roi = np.array([0, 0, 0.2, 0.4, 1, 1, 0.7, 1.3], np.float32)  # W end beyond the input
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": 7.0}
    check_node("Resize", {"x": x, "roi": roi, "scales": None,
                          "sizes": np.array([1, 2, 4, 5], np.int64)}, attrs, opset=19,
               const_inputs=["roi", "sizes"], atol=1e-4)
    check_node("Resize", {"x": x, "roi": np.array([0.6, 0.1, 0.2, 0.9], np.float32),
                          "scales": None, "sizes": np.array([3, 4], np.int64)},
               {**attrs, "axes": [3, 2]}, opset=19, const_inputs=["roi", "sizes"], atol=1e-4)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "storage_order": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 2], "storage_order": 1},
])
def test_maxpool_indices(attrs):
    x = rand(2, 3, 7, 6, lo=-5, hi=5)
    check_node("MaxPool", {"x": x}, attrs, n_out=2, opset=12)
    check_node("MaxPool", {"x": rand(2, 3, 7, 6, dtype="int8", lo=-100, hi=100)}, attrs,
               n_out=2, opset=12)


def test_maxpool_indices_1d():
    check_node("MaxPool", {"x": rand(2, 3, 9)}, {"kernel_shape": [3], "strides": [2],
                                                  "pads": [1, 1]}, n_out=2, opset=12)


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 1, 2]},
    {"strides": [3, 2, 1], "pads": [1, 0, 1, 2, 1, 0], "output_padding": [1, 1, 0]},
    {"strides": [2, 2, 2], "dilations": [2, 1, 2]},
    {"strides": [2, 2, 1], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 1, 1], "output_shape": [8, 5, 6]},
    {"group": 2, "strides": [2, 2, 2]},
])
def test_conv_transpose_3d(attrs):
    g = attrs.get("group", 1)
    check_node("ConvTranspose", {"x": rand(2, 4, 3, 4, 5), "w": rand(4, 3, 3, 2, 3, seed=1),
                                 "b": rand(3 * g, seed=2)}, attrs)


def test_resize_gathers_taps_or_uses_matmul_for_wide_filters():
    def ops(scales, attrs):
        mod = check_node("Resize", {"x": rand(1, 1, 12, 12), "roi": None,
                                    "scales": np.array(scales, np.float32)}, attrs, opset=19,
                         const_inputs=["scales"], atol=1e-4)
        return {n.op for n in mod.nodes}

    assert "matmul" not in ops([1, 1, 2.0, 2.0], {"mode": "cubic"})
    assert "matmul" in ops([1, 1, 0.2, 1.0], {"mode": "cubic", "antialias": 1})
