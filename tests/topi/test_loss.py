"""Kernels behind the loss and normalization converters (kiln/frontend/onnx/ops_loss.py).

SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss, Hardmax, LpNormalization,
MeanVarianceNormalization and GroupNormalization decompose into existing IR ops, so this module
runs those ops' kernels in exactly the configurations the converters emit (class axis 1 of N-D
scores, class-index gathers, grouped instance norm, keepdims arg-reductions) against the IR
references. tests/frontend/test_onnx_loss.py checks the decompositions against ONNX Runtime.
"""

from __future__ import annotations

import pytest

from tests.topi.harness import Case, case_params, ints, module_builder, run_and_check, uniform

F32 = "float32"

CASES: list[Case] = [
    # ---- SoftmaxCrossEntropyLoss: log_softmax over the class axis 1 of (N, C, d1, d2)
    Case("log_softmax", [((3, 5, 4, 7), F32, uniform(-6, 6))], {"axis": 1}, label="class-axis"),
    Case("log_softmax", [((3, 5), "float64", uniform(-6, 6))], {"axis": 1}, label="nc-f64"),
    # ---- NegativeLogLikelihoodLoss: the target's class read along axis 1, weights by class
    Case("gather_elements", [((3, 5, 4, 7), F32), ((3, 1, 4, 7), "int64", ints(0, 5))], {"axis": 1},
         label="nll-pick"),
    Case("gather_elements", [((3, 5), F32), ((3, 1), "int32", ints(-5, 5))], {"axis": 1}, label="nll-pick-nc"),
    Case("take", [((5,), F32, uniform(0.1, 2)), ((3, 4, 7), "int64", ints(0, 5))], {"axis": 0},
         label="class-weight"),
    Case("where", [((3, 4, 7), "bool"), ((3, 4, 7), "int64", ints(0, 5)), ((), "int64", ints(0, 1))],
         label="ignore-index"),
    Case("reduce_sum", [((3, 4, 7), F32)], {"axes": (0, 1, 2)}, label="loss-sum"),
    Case("reduce_mean", [((3, 4, 7), F32)], {"axes": (0, 1, 2)}, label="loss-mean"),
    # ---- Hardmax: keepdims argmax compared with the positions along the axis
    Case("argmax", [((3, 4, 5), F32)], {"axis": 1, "keepdims": True}, label="hardmax"),
    Case("equal", [((3, 1, 5), "int64", ints(0, 4)), ((1, 4, 1), "int64", ints(0, 4))], label="hardmax-onehot"),
    # ---- LpNormalization / MeanVarianceNormalization: keepdims reductions over inner and outer axes
    Case("reduce_sum", [((3, 4, 5), F32)], {"axes": (1,), "keepdims": True}, label="lp-norm"),
    Case("reduce_mean", [((2, 3, 4, 5), F32)], {"axes": (0, 2, 3), "keepdims": True}, label="mvn"),
    # ---- GroupNormalization: instance_norm over (N, groups, channels-per-group * pixels)
    Case("instance_norm", [((2, 3, 24), F32, uniform(-3, 3)), ((3,), F32), ((3,), F32)], {"epsilon": 1e-5},
         label="groups"),
    Case("instance_norm", [((2, 1, 40), F32, uniform(-3, 3)), ((1,), F32), ((1,), F32)], {"epsilon": 1e-2},
         label="one-group"),
]

get_module = module_builder(CASES, "loss")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_loss(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])
