"""NN ops (conv, dense/matmul, pooling, normalisation, softmax, resize) against the IR references."""

from __future__ import annotations

import pytest

from tests.topi.harness import Case, case_params, module_builder, positive, run_and_check

F32 = "float32"

CASES: list[Case] = [
    # ---- conv2d: padding (asymmetric), stride, dilation, groups, depthwise, odd sizes
    Case("conv2d", [((1, 3, 11, 13), F32), ((5, 3, 3, 3), F32)], {"padding": (1, 1, 1, 1)}),
    Case("conv2d", [((2, 4, 9, 21), F32), ((6, 4, 3, 2), F32)],
         {"padding": (0, 1, 2, 0), "strides": (2, 1)}, label="asym_stride"),
    Case("conv2d", [((1, 3, 12, 12), F32), ((4, 3, 3, 3), F32)],
         {"padding": (2, 2, 2, 2), "dilation": (2, 2)}, label="dilated"),
    Case("conv2d", [((1, 6, 7, 9), F32), ((9, 2, 3, 3), F32)], {"padding": (1, 1, 1, 1), "groups": 3},
         label="grouped"),
    Case("conv2d", [((1, 5, 10, 17), F32), ((5, 1, 3, 3), F32)], {"padding": (1, 1, 1, 1), "groups": 5},
         label="depthwise"),
    Case("conv2d", [((1, 3, 8, 8), F32), ((6, 1, 3, 3), F32)], {"strides": (2, 2), "groups": 3},
         label="dw_mult2"),
    Case("conv2d", [((1, 7, 5, 37), F32), ((3, 7, 1, 1), F32)], label="1x1"),
    Case("conv2d", [((1, 3, 6, 6), "float16"), ((2, 3, 3, 3), "float16")], {"padding": (1, 1, 1, 1)},
         rtol=5e-3, atol=5e-3, label="half"),
    Case("conv2d_transpose", [((1, 3, 5, 6), F32), ((3, 4, 3, 3), F32)],
         {"strides": (2, 2), "padding": (1, 1, 1, 1), "output_padding": (1, 0)}),
    Case("conv2d_transpose", [((2, 4, 4, 5), F32), ((4, 2, 2, 3), F32)], {"groups": 2, "dilation": (2, 1)},
         label="grouped"),
    # ---- dense / matmul (packed and unpacked dense; tails in both tile dims)
    Case("dense", [((37, 45), F32), ((29, 45), F32)]),
    Case("dense", [((3, 45), F32), ((29, 45), F32)], label="gemv"),
    Case("dense", [((2, 9, 20), F32), ((70, 20), F32)], label="3d"),
    Case("dense", [((17,), F32), ((5, 17), F32)], label="1d"),
    Case("dense", [((9, 16), "bfloat16"), ((33, 16), "bfloat16")], label="bf16"),
    Case("matmul", [((2, 37, 45), F32), ((45, 29), F32)]),
    Case("matmul", [((3, 1, 5, 7), F32), ((4, 7, 9), F32)], label="bcast"),
    Case("matmul", [((33, 8), "int32"), ((8, 35), "int32")], label="int"),
    # ---- pooling
    Case("max_pool2d", [((1, 3, 11, 13), F32)], {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}),
    Case("max_pool2d", [((2, 2, 10, 10), F32)], {"pool_size": (3, 2), "strides": (2, 3), "ceil_mode": True},
         label="ceil"),
    Case("max_pool2d", [((1, 2, 9, 9), F32)], {"pool_size": (2, 2), "dilation": (2, 2), "padding": (1, 0, 0, 1)},
         label="dilated"),
    Case("max_pool2d", [((1, 2, 9, 9), "int8")], {"pool_size": (2, 2), "padding": (1, 1, 1, 1)}, label="int8"),
    Case("avg_pool2d", [((1, 3, 11, 13), F32)], {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)}),
    Case("avg_pool2d", [((1, 3, 11, 13), F32)], {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1),
                                                "count_include_pad": True}, label="incl_pad"),
    Case("avg_pool2d", [((2, 2, 10, 10), F32)], {"pool_size": (3, 3), "strides": (2, 2), "ceil_mode": True,
                                                "padding": (1, 1, 0, 0), "count_include_pad": True},
         label="ceil_incl"),
    Case("avg_pool2d", [((1, 2, 9, 9), F32)], {"pool_size": (3, 2), "dilation": (2, 3), "padding": (2, 1, 2, 1)},
         label="dilated"),
    Case("avg_pool2d", [((1, 4, 7, 7), F32)], {"pool_size": (7, 7)}, label="global"),
    Case("avg_pool2d", [((1, 2, 6, 6), "int32")], {"pool_size": (2, 2), "strides": (2, 2)}, label="int"),
    # ---- normalisation / softmax
    Case("batch_norm", [((2, 5, 3, 7), F32), ((5,), F32), ((5,), F32), ((5,), F32), ((5,), F32, positive)],
         {"epsilon": 1e-3}),
    Case("batch_norm", [((4, 9), F32), ((9,), F32), ((9,), F32), ((9,), F32), ((9,), F32, positive)],
         {"axis": -1}, label="last"),
    Case("instance_norm", [((2, 3, 5, 7), F32), ((3,), F32), ((3,), F32)]),
    Case("instance_norm", [((2, 3, 19), F32), ((3,), F32), ((3,), F32)], {"epsilon": 1e-2}, label="1d"),
    Case("layer_norm", [((3, 5, 19), F32), ((19,), F32), ((19,), F32)]),
    Case("layer_norm", [((3, 5, 7), F32), ((5, 7), F32), ((1, 7), F32)], {"axis": 1}, label="2axes"),
    Case("layer_norm", [((4, 33), "float16"), ((33,), "float16"), ((33,), "float16")], label="half"),
    Case("softmax", [((3, 5, 19), F32)]),
    Case("softmax", [((3, 5, 19), F32)], {"axis": 1}, label="axis1"),
    Case("softmax", [((2, 7), F32, lambda r, s, d: (r.standard_normal(s) * 50).astype(d))], label="large"),
    Case("log_softmax", [((3, 5, 19), F32)]),
    Case("log_softmax", [((6, 4), F32)], {"axis": 0}, label="axis0"),
    Case("lrn", [((2, 7, 3, 5), F32)], {"size": 3}),
    Case("lrn", [((2, 6, 3, 5), F32)], {"size": 4, "alpha": 1e-2, "beta": 0.5, "bias": 2.0}, label="even"),
    # ---- resize
    Case("resize2d", [((1, 2, 5, 7), F32)], {"size": (10, 13), "scales": (2.0, 13 / 7)}),
    Case("resize2d", [((1, 2, 6, 7), F32)], {"size": (4, 3), "scales": (4 / 6, 3 / 7), "nearest_mode": "floor",
                                             "coordinate_transformation_mode": "asymmetric"}, label="down_floor"),
    Case("resize2d", [((1, 2, 5, 7), "int32")], {"size": (9, 11), "scales": (9 / 5, 11 / 7),
                                                 "nearest_mode": "round_prefer_ceil",
                                                 "coordinate_transformation_mode": "align_corners"},
         label="align_ceil"),
    Case("resize2d", [((1, 2, 5, 7), F32)], {"size": (8, 12), "scales": (1.6, 12 / 7), "nearest_mode": "ceil",
                                             "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
         label="tf_ceil"),
    Case("resize2d", [((2, 2, 5, 7), F32)], {"size": (10, 9), "scales": (2.0, 9 / 7), "method": "linear"},
         label="linear"),
    Case("resize2d", [((1, 2, 5, 7), F32)], {"size": (8, 11), "scales": (1.6, 11 / 7), "method": "linear",
                                             "coordinate_transformation_mode": "align_corners"},
         label="linear_ac"),
    Case("resize2d", [((1, 1, 5, 7), F32)], {"size": (3, 4), "scales": (0.6, 4 / 7), "method": "linear",
                                             "coordinate_transformation_mode": "pytorch_half_pixel"},
         label="linear_pt"),
    Case("resize2d", [((1, 1, 5, 7), F32)], {"size": (7, 9), "scales": (1.4, 9 / 7), "method": "linear",
                                             "coordinate_transformation_mode": "half_pixel_symmetric"},
         label="linear_sym"),
]

get_module = module_builder(CASES, "nn")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_nn(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])
