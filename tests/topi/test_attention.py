"""Attention-family kernels (rms_norm): every kernel against the IR op's NumPy reference."""

from __future__ import annotations

import pytest

from tests.topi.harness import Case, case_params, module_builder, run_and_check

F32 = "float32"

CASES: list[Case] = [
    Case("rms_norm", [((3, 5, 19), F32), ((19,), F32)]),
    Case("rms_norm", [((3, 5, 7), F32), ((5, 1), F32)], {"axis": 1, "epsilon": 0.1}, label="2axes"),
    Case("rms_norm", [((2, 3, 4, 5), F32), ((2, 3, 4, 5), F32)], {"axis": 0}, label="all"),
    Case("rms_norm", [((4, 33), "float16"), ((33,), "float16")], label="half"),
    Case("rms_norm", [((4, 33), "bfloat16"), ((), "bfloat16")], label="bf16_scalar_gamma"),
]

get_module = module_builder(CASES, "attn")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_attention_kernels(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])
