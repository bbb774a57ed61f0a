"""Fused groups as the build driver forms them: anchor + epilogue, elementwise chains,
injective producers feeding a reduction.  Checks numerics and the schedule's structure
(injective intermediates inlined, anchor attached to the output loops)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.topi.harness import TARGETS, Fused, fused_reference, lower_fused, make_inputs, positive, target_available
from kiln import codegen, te
from kiln.ir import OpPattern, TensorType
from kiln.runtime import ndarray as nd
from kiln.topi.util import is_injective_stage

F32 = "float32"
FUSABLE, INJ, RED = OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.INJECTIVE, OpPattern.COMM_REDUCE

GROUPS: list[Fused] = [
    Fused("conv_bias_relu_add", [((1, 6, 9, 13), F32), ((10, 6, 3, 3), F32), ((10,), F32), ((1, 10, 9, 13), F32)],
          [("conv2d", {"padding": (1, 1, 1, 1)}, ["i0", "i1"]), ("bias_add", {"axis": 1}, ["n0", "i2"]),
           ("relu", {}, ["n1"]), ("add", {}, ["n2", "i3"])], "conv2d", FUSABLE),
    Fused("dwconv_bias_clip", [((1, 8, 10, 19), F32), ((8, 1, 3, 3), F32), ((8,), F32)],
          [("conv2d", {"padding": (1, 1, 1, 1), "groups": 8, "strides": (2, 2)}, ["i0", "i1"]),
           ("bias_add", {}, ["n0", "i2"]), ("clip", {"a_min": 0.0, "a_max": 6.0}, ["n1"])], "conv2d", FUSABLE),
    Fused("dense_bias_gelu", [((19, 40), F32), ((37, 40), F32), ((37,), F32)],
          [("dense", {}, ["i0", "i1"]), ("bias_add", {"axis": -1}, ["n0", "i2"]), ("gelu", {}, ["n1"])],
          "dense", FUSABLE),
    Fused("matmul_add", [((2, 9, 12), F32), ((12, 35), F32), ((35,), F32)],
          [("matmul", {}, ["i0", "i1"]), ("add", {}, ["n0", "i2"])], "matmul", FUSABLE),
    Fused("elemwise_chain4", [((3, 7, 19), F32), ((7, 19), F32), ((19,), F32), ((3, 1, 1), F32)],
          [("add", {}, ["i0", "i1"]), ("multiply", {}, ["n0", "i2"]), ("tanh", {}, ["n1"]),
           ("subtract", {}, ["n2", "i3"])], "add", OpPattern.BROADCAST),
    Fused("transpose_mul_reduce", [((5, 6, 7), F32), ((7, 1, 6), F32)],
          [("transpose", {"axes": (2, 0, 1)}, ["i0"]), ("multiply", {}, ["n0", "i1"]),
           ("reduce_sum", {"axes": (0, 2)}, ["n1"])], "reduce_sum", RED),
    Fused("exp_reduce_mean_sqrt", [((4, 9, 11), F32)],
          [("exp", {}, ["i0"]), ("reduce_mean", {"axes": (2,), "keepdims": True}, ["n0"]), ("sqrt", {}, ["n1"])],
          "reduce_mean", RED),
    Fused("maxpool_relu", [((1, 3, 11, 11), F32)],
          [("max_pool2d", {"pool_size": (3, 3), "strides": (2, 2)}, ["i0"]), ("relu", {}, ["n0"])],
          "max_pool2d", FUSABLE),
    Fused("avgpool_mul", [((1, 3, 11, 11), F32), ((3, 1, 1), F32, positive)],
          [("avg_pool2d", {"pool_size": (2, 2), "strides": (2, 2), "ceil_mode": True}, ["i0"]),
           ("multiply", {}, ["n0", "i1"])], "avg_pool2d", FUSABLE),
]

_CACHE: dict[str, tuple[Any, list[Any]]] = {}


def _module(target: str) -> tuple[Any, list[Any]]:
    reason = target_available(target)
    if reason:
        pytest.skip(reason)
    if target not in _CACHE:
        lowered = [lower_fused(g, f"fz_{i}", target) for i, g in enumerate(GROUPS)]
        _CACHE[target] = (codegen.build_module([f for f, _ in lowered], target), [s for _, s in lowered])
    return _CACHE[target]


@pytest.mark.parametrize("target,idx", [pytest.param(t, i, id=f"{t}-{g.id}") for t in TARGETS
                                        for i, g in enumerate(GROUPS)])
def test_fused_group(target: str, idx: int) -> None:
    mod, _ = _module(target)
    g = GROUPS[idx]
    xs = make_inputs(g, 1)  # type: ignore[arg-type]
    ref = fused_reference(g, [x.copy() for x in xs])
    out = nd.empty(ref.shape, str(ref.dtype))
    mod[f"fz_{idx}"](*[nd.array(x) for x in xs], out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=g.rtol, atol=g.atol, err_msg=g.id)


@pytest.mark.parametrize("idx", range(len(GROUPS)), ids=[g.id for g in GROUPS])
def test_fused_schedule_structure(idx: int) -> None:
    """Non-output injective stages are inlined; conv/dense/matmul accumulate inside the output loops."""
    g = GROUPS[idx]
    _, s = lower_fused(g, f"chk_{idx}", "c")
    for st in s.stages:
        if isinstance(st.op, te.ComputeOp) and not st.is_output and is_injective_stage(st.op):
            assert st.attach_type == "inline", (g.id, st)
    if g.anchor in ("conv2d", "dense", "matmul"):
        anchors = [st for st in s.stages if st.op.reduce_axis]
        assert anchors and all(st.attach_type == "scope" for st in anchors), (g.id, s)


_ = TensorType
