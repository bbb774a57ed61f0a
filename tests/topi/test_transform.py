"""Data-movement ops (injective) against the IR references."""

from __future__ import annotations

import pytest

from tests.topi.harness import Case, case_params, ints, module_builder, run_and_check

F32 = "float32"

CASES: list[Case] = [
    Case("reshape", [((3, 4, 10), F32)], {"newshape": (12, 5, 2)}),
    Case("reshape", [((7, 3), "int64")], {"newshape": (21,)}, label="flat"),
    Case("reshape", [((1, 6, 1, 5), F32)], {"newshape": (6, 5)}, label="squeeze"),
    Case("reshape", [((6, 5), "bool")], {"newshape": (6, 1, 5, 1)}, label="expand"),
    Case("transpose", [((3, 4, 5), F32)], {"axes": (2, 0, 1)}),
    Case("transpose", [((2, 3, 5, 7), "int8")], {"axes": (0, 2, 3, 1)}, label="nhwc"),
    Case("transpose", [((33, 17), F32)], {"axes": (1, 0)}, label="2d"),
    Case("concatenate", [((2, 3, 5), F32), ((2, 4, 5), F32), ((2, 1, 5), F32)], {"axis": 1}),
    Case("concatenate", [((3, 5), "int32"), ((3, 7), "int32")], {"axis": -1}, label="last"),
    Case("concatenate", [((3, 5), F32)], {"axis": 0}, label="single"),
    Case("split", [((2, 9, 5), F32)], {"sections": (2, 3, 4), "axis": 1}),
    Case("split", [((10, 3), "int64")], {"sections": (5, 5), "axis": 0}, label="even"),
    Case("split", [((4, 17), F32)], {"sections": (16, 1), "axis": -1}, label="last"),
    Case("strided_slice", [((10, 11, 12), F32)],
         {"begin": (1, -8, 0), "end": (9, 100, -1), "strides": (2, 1, 3), "axes": (0, 1, 2)}),
    Case("strided_slice", [((10, 11), F32)], {"begin": (-1,), "end": (-100,), "strides": (-2,), "axes": (1,)},
         label="neg"),
    Case("strided_slice", [((6, 7), "int32")], {"begin": (2,), "end": (5,), "strides": (1,), "axes": (0,)},
         label="rows"),
    Case("take", [((5, 7, 3), F32), ((4,), "int64", ints(-7, 7))], {"axis": 1}),
    Case("take", [((9, 4), F32), ((2, 3), "int32", ints(-9, 9))], {"axis": 0}, label="2didx"),
    Case("take", [((9,), "int64"), ((), "int64", ints(-9, 9))], {"axis": 0}, label="scalar"),
    Case("gather_elements", [((4, 6), F32), ((4, 3), "int64", ints(-6, 6))], {"axis": 1}),
    Case("gather_elements", [((4, 5, 3), F32), ((2, 5, 3), "int32", ints(-4, 4))], {"axis": 0}, label="ax0"),
    Case("broadcast_to", [((3, 1, 5), F32)], {"shape": (2, 3, 4, 5)}),
    Case("broadcast_to", [((), "int32")], {"shape": (3, 2)}, label="scalar"),
    Case("tile", [((2, 3, 5), F32)], {"reps": (2, 1, 3)}),
    Case("tile", [((3,), "bool")], {"reps": (4,)}, label="bool"),
    Case("pad", [((3, 5, 7), F32)], {"pad_width": ((1, 2), (0, 0), (3, 1)), "value": 1.5}),
    Case("pad", [((3, 5, 7), "int32")], {"pad_width": ((1, 2), (0, 3), (2, 1)), "value": -2.7}, label="int"),
    Case("pad", [((4, 6), F32)], {"pad_width": ((3, 2), (5, 1)), "mode": "reflect"}, label="reflect"),
    Case("pad", [((4, 6), F32)], {"pad_width": ((3, 2), (5, 7)), "mode": "edge"}, label="edge"),
    Case("pad", [((4, 6), "int64")], {"pad_width": ((5, 2), (1, 9)), "mode": "wrap"}, label="wrap"),
]

get_module = module_builder(CASES, "tr")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_transform(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


def test_concatenate_of_many_inputs() -> None:
    """600 inputs (an unrolled 600-step Scan's rows): the selects nest as a balanced tree, so
    lowering and codegen stay far from Python's recursion limit (a chain of 600 did not)."""
    from tests.topi.harness import build_cases

    case = Case("concatenate", [((1 + k % 2, 3), F32) for k in range(600)], {"axis": 0})
    mod, (built,) = build_cases([case], "llvm", "many")
    run_and_check(mod, built)
