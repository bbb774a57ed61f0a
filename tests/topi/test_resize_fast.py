"""The separable bilinear ``resize2d`` (horizontal pass per input row, then contiguous
vertical lerps; :func:`kiln.topi.resize._separable_linear` and its CPU schedule
:mod:`kiln.topi.schedule.x86_resize`) against float64 references, and proof that the DeepLabV3
upsample takes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import kiln
from kiln.driver.build import lower
from kiln.ir import Graph, evaluate
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Allocate, BufferStore, For, ForKind
from kiln.tir.vectorize import plan_vector_loop
from tests.topi.harness import Case, case_params, module_builder, run_and_check

F32 = "float32"


def _lin(shape: tuple[int, ...], size: tuple[int, int], mode: str = "half_pixel", dtype: str = F32,
         label: str = "", **kw: Any) -> Case:
    h, w = shape[2:]
    attrs = {"size": size, "scales": (size[0] / h, size[1] / w), "method": "linear",
             "coordinate_transformation_mode": mode}
    return Case("resize2d", [(shape, dtype)], attrs, label=label or f"{mode}-{size[0]}x{size[1]}", **kw)


# Channel counts of 8 and more run the horizontal pass per channel inside the parallel loop,
# fewer as one root stage; a whole width factor with half_pixel-like or asymmetric modes takes
# the phase (gather-free) horizontal pass, the other cases the gathered one: all four appear.
CASES: list[Case] = [
    _lin((1, 21, 14, 14), (224, 224), label="deeplab"),  # x16, phase
    _lin((1, 8, 7, 9), (14, 18), label="x2_odd"),
    _lin((2, 3, 5, 3), (20, 12), label="x4"),
    _lin((1, 2, 3, 5), (24, 40), label="x8"),
    _lin((1, 8, 2, 3), (64, 96), label="x32"),
    _lin((1, 21, 14, 14), (33, 33), label="14to33"),
    _lin((2, 5, 5, 7), (9, 17)),
    _lin((1, 3, 7, 9), (13, 17), "align_corners"),
    _lin((2, 5, 7, 9), (14, 18), "align_corners"),
    _lin((2, 5, 5, 7), (10, 21), "asymmetric"),  # x3 in W
    _lin((1, 2, 5, 7), (15, 35), "asymmetric"),
    _lin((1, 2, 5, 7), (10, 13), "pytorch_half_pixel"),
    _lin((1, 9, 5, 7), (10, 14), "pytorch_half_pixel"),
    _lin((1, 9, 3, 4), (6, 1), "pytorch_half_pixel", label="pt_one_column"),
    _lin((1, 2, 5, 7), (11, 9), "half_pixel_symmetric"),
    _lin((1, 8, 3, 4), (9, 12), "half_pixel_symmetric"),
    _lin((1, 2, 4, 20), (9, 7), label="wider_to_narrower"),  # upscale in H, downscale in W
    _lin((1, 10, 6, 5), (6, 11), label="same_height"),
    _lin((1, 2, 1, 1), (3, 4), label="one_pixel"),
    _lin((1, 9, 4, 1), (12, 5), label="one_column"),
    _lin((1, 9, 5, 7), (15, 21), dtype="float64", label="f64"),
    _lin((1, 9, 5, 7), (16, 19), "align_corners", dtype="float64", label="f64_ac"),
    _lin((1, 2, 5, 6), (10, 12), dtype="float16", label="f16"),
    _lin((1, 8, 3, 150), (6, 300), label="long_rows"),  # rows longer than one vectorised loop
    # downscales in H keep the fused form: still right
    _lin((1, 9, 12, 10), (5, 20), label="down_h"),
]

get_module = module_builder(CASES, "resize_fast")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_resize_linear_matches_float64_reference(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


def _graph(shape: tuple[int, ...], size: tuple[int, int], mode: str = "half_pixel") -> Graph:
    g = Graph()
    x = g.add_input("x", shape)
    g.outputs = [g.add("resize2d", x, size=size, scales=(size[0] / shape[2], size[1] / shape[3]),
                       method="linear", coordinate_transformation_mode=mode)]
    return g


def _walk(node: Any, kind: type) -> list[Any]:
    found: list[Any] = []
    post_order_visit(node, lambda n: found.append(n) if isinstance(n, kind) else None)
    return found


def test_deeplab_upsample_takes_the_separable_path() -> None:
    """[1, 21, 14, 14] -> 224 x 224: per channel (parallel loop) a 14 x 224 row buffer, and both
    passes are explicit SIMD (contiguous or broadcast reads; a gather would refuse a plan)."""
    (func,) = lower(_graph((1, 21, 14, 14), (224, 224)), "llvm").funcs
    (par,) = [f for f in _walk(func.body, For) if f.kind == ForKind.PARALLEL]
    assert par.extent.value == 21
    (rows,) = [a for a in _walk(par.body, Allocate) if a.buffer.name.startswith("resize2d_rows")]
    assert tuple(rows.buffer.shape[-2:]) == (14, 224)
    # both passes' vectorised loops (the output's and the row buffer's) plan as explicit SIMD
    for buf in (func.params[-1], rows.buffer):
        vec = [f for f in _walk(par.body, For) if f.kind == ForKind.VECTORIZED
               and any(s.buffer is buf for s in _walk(f.body, BufferStore))]
        assert vec and all(plan_vector_loop(f, 64) is not None for f in vec), buf.name


def test_a_downscale_keeps_the_fused_form() -> None:
    (func,) = lower(_graph((1, 21, 28, 28), (14, 14)), "llvm").funcs
    assert not [a for a in _walk(func.body, Allocate) if a.buffer.name.startswith("resize2d_rows")]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_fused_producer_and_consumer(target: str) -> None:
    """relu -> resize (the relu is inlined into the horizontal pass) and resize -> sigmoid (the
    group's anchor is the sigmoid, so the generic schedule runs the separable stages)."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", (1, 12, 7, 6))
    r = g.add("resize2d", g.add("relu", x), size=(28, 24), scales=(4.0, 4.0), method="linear")
    g.outputs = [g.add("sigmoid", r)]
    xv = rng.standard_normal((1, 12, 7, 6)).astype(np.float32)
    (want,) = evaluate(g, {"x": xv})
    gm = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
    gm.set_input("x", xv)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-5, atol=1e-6)


def test_deeplab_upsample_matches_onnxruntime() -> None:
    """torchvision's F.interpolate(bilinear, align_corners=False) export, against ORT."""
    from onnx import helper

    from tests.frontend.onnx_check import make_model, run_ort

    xv = np.random.default_rng(7).standard_normal((1, 21, 14, 14)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear",
                            coordinate_transformation_mode="half_pixel")
    model = make_model([node], {"x": xv}, ["y"], opset=19,
                       initializers={"scales": np.array([1, 1, 16, 16], np.float32)})
    (want,) = run_ort(model, {"x": xv})
    mod, params = kiln.frontend.from_onnx(model)
    gm = kiln.GraphModule(kiln.build(mod, target="llvm", params=params)["default"](kiln.cpu()))
    gm.set_input("x", xv)
    gm.run()
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-5, atol=2e-6)
