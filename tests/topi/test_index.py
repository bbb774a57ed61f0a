"""Index, scatter and scan-like ops (kiln.ir.ops.index): every kernel against the IR op's NumPy
reference, and out-of-range values read from data as run-time errors."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.runtime import ndarray as nd
from kiln.runtime.errors import KernelError
from tests.topi.harness import Case, case_params, ints, module_builder, run_and_check, uniform

F32 = "float32"

CASES: list[Case] = [
    # ---- trilu: both triangles, diagonals inside and past the matrix, batches, ints
    Case("trilu", [((3, 5, 7), F32)]),
    Case("trilu", [((3, 5, 7), F32)], {"upper": False}, label="lower"),
    Case("trilu", [((6, 4), F32)], {"k": -2}, label="kneg"),
    Case("trilu", [((6, 4), F32)], {"upper": False, "k": 3}, label="lower-kpos"),
    Case("trilu", [((4, 5), "int32")], {"k": 9}, label="past"),
    Case("trilu", [((2, 3, 4, 5), "int64")], {"upper": False, "k": -7}, label="none"),
    # ---- scans: every exclusive / reverse combination, inner and outer axes, ints, halves
    Case("cumsum", [((4, 9), F32)], {"axis": 1}),
    Case("cumsum", [((4, 9), F32)], {"axis": 0, "exclusive": True}, label="excl"),
    Case("cumsum", [((4, 9), F32)], {"axis": -1, "reverse": True}, label="rev"),
    Case("cumsum", [((3, 5, 2), F32)], {"axis": 1, "exclusive": True, "reverse": True}, label="excl-rev"),
    Case("cumsum", [((17,), "int32")], {"exclusive": True}, label="int"),
    Case("cumsum", [((6, 7), "float16")], {"axis": 1}, label="half"),
    Case("cumprod", [((4, 9), F32, uniform(0.5, 1.5))], {"axis": 1}),
    Case("cumprod", [((4, 9), F32, uniform(0.5, 1.5))], {"axis": 0, "exclusive": True}, label="excl"),
    Case("cumprod", [((3, 5, 2), F32, uniform(0.5, 1.5))], {"axis": 1, "reverse": True}, label="rev"),
    Case("cumprod", [((9,), "int64", ints(-3, 4))], {"exclusive": True, "reverse": True}, label="int"),
    # axes longer than SCAN_BLOCK_MIN take the blocked path (a partial last block: 150 = 12 * 12 + 6)
    Case("cumsum", [((2, 150), F32)], {"axis": 1}, label="blocked"),
    Case("cumsum", [((150, 3), "int32")], {"exclusive": True, "reverse": True}, label="blocked-excl-rev"),
    Case("cumsum", [((3, 100), "float16", uniform(-0.1, 0.1))], {"axis": 1, "reverse": True}, label="blocked-half",
         rtol=1e-2, atol=1e-2),
    Case("cumprod", [((2, 130), F32, uniform(0.9, 1.1))], {"axis": -1, "exclusive": True}, label="blocked"),
    # ---- reverse_sequence: time-major and batch-major
    Case("reverse_sequence", [((5, 4, 3), F32), ((4,), "int64", ints(0, 6))]),
    Case("reverse_sequence", [((4, 6), "int32"), ((4,), "int32", ints(0, 7))],
         {"batch_axis": 0, "time_axis": 1}, label="batch-major"),
    # ---- tensor_scatter: linear with and without write indices, circular with wrap-around
    Case("tensor_scatter", [((2, 3, 8, 4), F32), ((2, 3, 3, 4), F32)], label="prefill"),
    Case("tensor_scatter", [((2, 3, 8, 4), F32), ((2, 3, 3, 4), F32), ((2,), "int64", ints(0, 6))],
         label="linear"),
    Case("tensor_scatter", [((3, 8, 2), F32), ((3, 5, 2), F32), ((3,), "int64", ints(0, 20))],
         {"axis": 1, "mode": "circular"}, label="circular"),
    # ---- det: every size the expansion handles, batched
    Case("det", [((2, 2), F32)]),
    Case("det", [((4, 3, 3), F32)]),
    Case("det", [((2, 4, 4), "float64")]),
    Case("det", [((3, 5, 5), F32)], rtol=1e-4, atol=1e-4),
    Case("det", [((2, 1, 1), "float16")]),
    # ---- scatters with a reduction: duplicates (few index values), negative indices
    Case("scatter_elements_reduce", [((4, 5), F32), ((4, 7), "int64", ints(-5, 5)), ((4, 7), F32)],
         {"axis": 1, "reduction": "add"}),
    Case("scatter_elements_reduce", [((4, 5), F32), ((3, 7), "int64", ints(-5, 5)), ((3, 7), F32)],
         {"axis": 1, "reduction": "mul"}, label="mul"),
    Case("scatter_elements_reduce", [((6, 3), F32), ((8, 2), "int32", ints(-6, 6)), ((8, 2), F32)],
         {"axis": 0, "reduction": "max"}, label="max"),
    Case("scatter_elements_reduce", [((6, 3), "int32"), ((8, 3), "int64", ints(0, 6)), ((8, 3), "int32")],
         {"axis": 0, "reduction": "min"}, label="min"),
    Case("scatter_nd_reduce", [((4, 5, 3), F32), ((6, 2), "int64", ints(-4, 4)), ((6, 3), F32)],
         {"reduction": "add"}),
    Case("scatter_nd_reduce", [((4, 5), F32), ((3, 2, 1), "int64", ints(-4, 4)), ((3, 2, 5), F32)],
         {"reduction": "mul"}, label="mul"),
    Case("scatter_nd_reduce", [((4, 5), F32), ((7, 2), "int64", ints(0, 4)), ((7,), F32)],
         {"reduction": "max"}, label="max"),
    Case("scatter_nd_reduce", [((4, 5), "int64"), ((7, 1), "int32", ints(0, 4)), ((7, 5), "int64")],
         {"reduction": "min"}, label="min"),
]

get_module = module_builder(CASES, "index")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_index(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


# ----------------------------------------------------------------------------- run-time checks
BAD_CASES: list[tuple[Case, str]] = [
    (Case("scatter_elements_reduce", [((4, 5), F32), ((4, 2), "int64"), ((4, 2), F32)],
          {"axis": 1, "reduction": "add"}, label="bad"), "scatter_elements_reduce"),
    (Case("scatter_nd_reduce", [((4, 5), F32), ((2, 1), "int64"), ((2, 5), F32)], {"reduction": "max"},
          label="bad"), "scatter_nd_reduce"),
    (Case("reverse_sequence", [((5, 4), F32), ((4,), "int64")], label="bad"), "sequence length"),
    (Case("tensor_scatter", [((2, 8, 4), F32), ((2, 3, 4), F32), ((2,), "int64")], label="bad"), "write index"),
]
get_bad_module = module_builder([c for c, _ in BAD_CASES], "index_bad")


def _inputs(case: Case, bad: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    xs = []
    for shape, dtype, *_ in case.inputs:
        if dtype.startswith("int"):
            xs.append(np.zeros(shape, dtype))
        else:
            xs.append(rng.standard_normal(shape).astype(dtype))
    idx = xs[1] if case.op != "tensor_scatter" else xs[2]
    idx.flat[-1] = bad
    return xs


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("k", range(len(BAD_CASES)))
@pytest.mark.parametrize("sign", [1, -1])
def test_out_of_range_is_an_error(target: str, k: int, sign: int) -> None:
    """An index / length / write position outside its range fails the kernel, naming the op;
    the same value just inside the range runs."""
    mod, built = get_bad_module(target)
    b = built[k]
    case, what = BAD_CASES[k]
    # the first invalid value on each side: data's axis size (or one past the last valid length / write index)
    n, low = {"scatter_elements_reduce": (5, -6), "scatter_nd_reduce": (4, -5), "reverse_sequence": (6, -1),
              "tensor_scatter": (6, -1)}[case.op]
    bad = n if sign > 0 else low
    good = n - 1 if sign > 0 else low + 1
    outs = [nd.empty(t.shape, t.dtype) for t in b.out_types]
    mod[b.name](*[nd.array(x) for x in _inputs(case, good)], *outs)
    with pytest.raises(KernelError, match=what):
        mod[b.name](*[nd.array(x) for x in _inputs(case, bad)], *outs)
