"""Reductions, arg-reductions and top-k against the IR references."""

from __future__ import annotations

import pytest

from tests.topi.harness import Case, case_params, module_builder, positive, run_and_check, uniform, with_ties

F32 = "float32"
S = (3, 5, 19)

CASES: list[Case] = []
for op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min"):
    CASES += [
        Case(op, [(S, F32)], {"axes": (1,)}),
        Case(op, [(S, F32)], {"axes": (0, 2), "keepdims": True}, label="keep"),
        Case(op, [(S, F32)], {"axes": (-1,)}, label="last"),
    ]
CASES += [
    Case("reduce_prod", [(S, F32, uniform(0.5, 1.5))], {"axes": (2,)}),
    Case("reduce_prod", [((4, 6), "int32", lambda r, s, d: r.integers(-2, 3, s).astype(d))], {"axes": (1,)},
         label="int"),
    Case("reduce_sum", [(S, F32)], {"axes": (0, 1, 2)}, label="all"),
    Case("reduce_sum", [(S, F32)], {"axes": ()}, label="noop"),
    Case("reduce_sum", [((4, 300), "float16", uniform(0, 1))], {"axes": (1,)}, rtol=2e-3, atol=5e-2,
         label="half_acc"),
    Case("reduce_sum", [((4, 7), "int8")], {"axes": (1,)}, label="int8"),
    Case("reduce_mean", [((4, 7), "int32")], {"axes": (1,)}, label="int"),
    Case("reduce_mean", [((4, 7), "uint8")], {"axes": (0,)}, label="uint"),
    Case("reduce_mean", [((4, 33), "bfloat16", positive)], {"axes": (1,)}, label="bf16"),
    Case("reduce_max", [((4, 7), "int64")], {"axes": (0, 1), "keepdims": True}, label="int"),
    Case("reduce_min", [((4, 7), "uint8")], {"axes": (1,)}, label="uint"),
    Case("reduce_sum", [((4, 7), "bool")], {"axes": (1,)}, label="bool"),
]
for op in ("argmax", "argmin"):
    CASES += [
        Case(op, [(S, F32, with_ties)], {"axis": 1}),
        Case(op, [(S, F32, with_ties)], {"axis": -1, "keepdims": False}, label="drop"),
        Case(op, [(S, F32, with_ties)], {"axis": 0, "select_last_index": True}, label="last"),
        Case(op, [((9, 4), "int32", with_ties)], {"axis": 0}, label="int"),
    ]
CASES += [
    Case("topk", [((3, 11), F32)], {"k": 4}),
    Case("topk", [((3, 11), F32, with_ties)], {"k": 11, "largest": False}, label="ties_smallest"),
    Case("topk", [((6, 4, 5), F32, with_ties)], {"k": 2, "axis": 0}, label="axis0"),
    Case("topk", [((2, 9), "int32", with_ties)], {"k": 3}, label="int"),
]

get_module = module_builder(CASES, "rd")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_reduce(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])
