"""softmax / log_softmax: the row form (exponential computed once, partial accumulators, scalar
tail) against the IR references, on the row lengths and values where it can go wrong.

Row lengths around the partial-accumulator count (16 with no target: two AVX2 vectors): 1,
shorter than it (one scalar reduction), exactly one block, blocks plus a tail, a long odd row;
values: large magnitudes, ``-inf`` masks (a fully masked row is NaN, as in the reference: 0/0),
``+inf`` and NaN entries; float16 / bfloat16; a 1-D input (no row loop); other axes (the
three-stage form).  The schedule tests check the loop structure that makes it fast.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln import nd, te, tir, topi
from kiln.ir import get_op
from kiln.topi.knobs import kernel_target
from kiln.topi.nn.norm import SOFTMAX_MAX_ROW, SOFTMAX_ROLE, softmax
from tests.topi.harness import TARGETS, Case, case_params, module_builder, run_and_check, target_available

F32 = "float32"
# the reference itself computes inf - inf for masked rows (its NaN is the expected result)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def scaled(k: float) -> Any:
    def g(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return (rng.standard_normal(shape) * k).astype(dtype)
    return g


def masked(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Normal values, a third of them ``-inf``, the first row entirely ``-inf``."""
    x = rng.standard_normal(shape).astype(dtype)
    x[rng.random(shape) < 1 / 3] = -np.inf
    x.reshape(-1, shape[-1])[0] = -np.inf
    return x


def specials(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Row 0: one ``+inf``; row 1: one NaN in the tail; row 2: float32 extremes; rest normal."""
    x = rng.standard_normal(shape).astype(dtype)
    x[0, 3] = np.inf
    x[1, -1] = np.nan
    x[2, 0], x[2, 1] = np.finfo(np.float32).max, -np.finfo(np.float32).max
    return x


CASES: list[Case] = [
    Case("softmax", [((4, 37), F32)], label="blocks_tail"),
    Case("softmax", [((3, 2, 48), F32)], label="blocks"),
    Case("softmax", [((5, 16), F32)], label="one_block"),
    Case("softmax", [((6, 7), F32)], label="short"),
    Case("softmax", [((5, 1), F32)], label="len1"),
    Case("softmax", [((2, 1001), F32)], label="long_odd"),
    Case("softmax", [((37,), F32)], label="1d"),
    Case("softmax", [((3, 37), F32, scaled(1e4))], label="huge"),
    Case("softmax", [((4, 41), F32, masked)], label="neg_inf_mask"),
    Case("softmax", [((3, 21), F32, specials)], label="inf_nan"),
    Case("softmax", [((2, 3, 37), "float16")], label="half"),
    Case("softmax", [((2, 3, 37), "bfloat16")], label="bf16"),
    Case("softmax", [((2, 37, 5), F32)], {"axis": 1}, label="axis1"),
    Case("log_softmax", [((4, 37), F32)], label="blocks_tail"),
    Case("log_softmax", [((5, 1), F32)], label="len1"),
    Case("log_softmax", [((6, 7), F32)], label="short"),
    Case("log_softmax", [((4, 41), F32, masked)], label="neg_inf_mask"),
    Case("log_softmax", [((3, 37), F32, scaled(1e4))], label="huge"),
    Case("log_softmax", [((2, 3, 37), "float16")], label="half"),
    Case("log_softmax", [((3, 19, 4), F32)], {"axis": 1}, label="axis1"),
]

get_module = module_builder(CASES, "softmax")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_softmax(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


@pytest.mark.parametrize("target", TARGETS)
def test_masked_entries_are_exact_zeros(target: str) -> None:
    """The attention-mask contract: masked (-inf) and far-below-max (-100, whose exp is
    subnormal) entries give exactly 0, not a tiny number; NaN only in the fully masked row,
    where the reference has it (0 / 0)."""
    if target_available(target):
        pytest.skip(target_available(target))
    mod, built = get_module(target)
    (b,) = [b for b in built if b.case.op == "softmax" and b.case.label == "neg_inf_mask"]
    x = masked(np.random.default_rng(3), (4, 41), F32)
    x[1, 2], x[2, 40] = -100.0, -1e30  # 40: in the scalar tail
    ref = get_op("softmax").ref([x], {"axis": -1})[0]
    assert np.isnan(ref[0]).all() and not np.isnan(ref[1:]).any()
    out = nd.empty(x.shape, F32)
    mod[b.name](nd.array(x), out)
    y = out.numpy()
    assert np.isnan(y[0]).all() and not np.isnan(y[1:]).any()
    assert (y[1:][np.isneginf(x[1:])] == 0).all() and y[1, 2] == 0 and y[2, 40] == 0
    np.testing.assert_allclose(y[1:].sum(axis=-1), 1.0, rtol=1e-5)


def _roles(y: te.Tensor) -> dict[str, te.Operation]:
    s = te.create_schedule(y.op)
    return {st.op.attrs[SOFTMAX_ROLE]: st.op for st in s.stages
            if isinstance(st.op, te.ComputeOp) and st.op.attrs and SOFTMAX_ROLE in st.op.attrs}


def test_row_form_stages() -> None:
    x = te.placeholder((8, 37), name="x")
    roles = _roles(softmax(x, -1, lanes=16))
    assert {"max_part", "max_tail", "exp", "sum_part", "sum_tail", "row"} <= set(roles)
    assert roles["max_part"].output(0).shape[-1] == 16
    # no tail stage when the row is whole blocks; a single reduction for a short row
    assert "max_tail" not in _roles(softmax(te.placeholder((8, 32), name="x"), -1, lanes=16))
    assert "max_part" not in _roles(softmax(te.placeholder((8, 7), name="x"), -1, lanes=16))
    # the three-stage form: another axis, a row too long for the stack scratch, a device target
    assert not _roles(softmax(x, 0, lanes=16))
    assert not _roles(softmax(te.placeholder((2, SOFTMAX_MAX_ROW + 1), name="x"), -1, lanes=16))
    assert not _roles(softmax(x, -1, lanes=None))


def test_lanes_follow_the_kernel_target() -> None:
    x = te.placeholder((4, 100), name="x")
    for target, lanes in (("llvm -mcpu=x86-64-v3", 16), ("llvm -mcpu=skylake-avx512", 32), ("llvm", 8)):
        with kernel_target(target):
            assert _roles(softmax(x, -1))["max_part"].output(0).shape[-1] == lanes, target


def test_device_target_keeps_three_stages() -> None:
    pytest.importorskip("kiln.target")
    with kernel_target("opencl"):
        assert not _roles(softmax(te.placeholder((4, 100), name="x"), -1))


def test_schedule_one_parallel_row_loop() -> None:
    """Every stage is computed inside the one parallel row loop: the row is read from memory
    once and the exponentials live in a row of scratch, not a tensor-sized temporary."""
    x = te.placeholder((1, 8, 128, 197), name="x")
    y = softmax(x, -1, lanes=16)
    s = topi.schedule_group("softmax", "opaque", [y], "llvm -mcpu=x86-64-v3")
    text = str(tir.lower(s, [x, y], "sm"))
    assert text.count("# parallel") == 1
    assert text.count("exp(") == 1  # computed once per element
    assert "softmax_exp = allocate([1, 1, 1, 208]" in text  # one padded row
    assert "1.0f / " in text and text.index("1.0f / ") < text.rindex("softmax[")  # a reciprocal per row


def test_schedule_1d_keeps_row_stages() -> None:
    """A 1-D input is one row: the stages stay root nests rather than being inlined (which
    would repeat the max tree and the exp for every element)."""
    x = te.placeholder((37,), name="x")
    y = softmax(x, -1, lanes=16)
    s = topi.schedule_group("softmax", "opaque", [y], "llvm -mcpu=x86-64-v3")
    text = str(tir.lower(s, [x, y], "sm1"))
    assert text.count("exp(") == 1 and "# parallel" not in text


def _dynamic_rows(n_max: int) -> tuple[te.Tensor, te.Tensor, tir.Var]:
    s = tir.Var("s", "int32")
    x = te.placeholder((1, 4, n_max, n_max), name="x", dyn=(None, None, s, s))
    return x, softmax(x, -1, lanes=16), s


def test_dynamic_row_keeps_the_row_form() -> None:
    """A row of runtime length (``(1, heads, seq, seq)`` attention scores) keeps the blocked
    partials: the whole blocks inside the row are reduced (the reduction's condition on the
    runtime length becomes the block loop's bound), the tail after the last whole block
    element by element; a row past the runtime
    extent computes nothing, not even its statistics; the scratch row of exponentials stops at
    the runtime length."""
    x, y, s = _dynamic_rows(64)
    assert {"max_part", "max_tail", "exp", "sum_part", "sum_tail"} <= set(_roles(y))
    sch = topi.schedule_group("softmax", "opaque", [y], "llvm -mcpu=x86-64-v3")
    text = str(tir.lower(sch, [x, y], "smd"))
    assert "for kb in range(s // 16):" in text  # the whole blocks, no condition per block
    assert "s // 16 * 16 + kt < s" in text  # the tail
    row_guard = text.index("% 64 < s:")
    assert row_guard < text.index("softmax_max_max_part = allocate")  # the whole row body is skipped
    assert "for i3_outer_1 in range((s + 15) // 16):" in text  # exponentials up to the runtime length


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_dynamic_row_lengths(target: str) -> None:
    """Every row length from 1 to past two blocks, and the upper bound, with masked entries,
    through one kernel, against NumPy; the storage outside the valid box holds NaN, which must
    not reach the output."""
    from kiln import codegen
    from tests.te.test_dynamic_extent import _call

    x, y, s = _dynamic_rows(40)
    sch = topi.schedule_group("softmax", "opaque", [y], target)
    fn = codegen.build_module([tir.lower(sch, [x, y], "smd")], target)["smd"]
    rng = np.random.default_rng(5)
    for n in list(range(1, 36)) + [40]:
        xv = (rng.standard_normal((1, 4, n, n)) * 4).astype(F32)
        xv[rng.random(xv.shape) < 0.2] = -np.inf
        xv[..., 0] = 0.0  # no fully masked row
        z = np.exp(xv - xv.max(-1, keepdims=True))
        ref = z / z.sum(-1, keepdims=True)
        xa = np.full((1, 4, 40, 40), np.nan, F32)
        xa[:, :, :n, :n] = xv
        out = np.full((1, 4, 40, 40), -7.0, F32)
        assert _call(fn, [xa, out], [(1, 4, n, n)] * 2) == 0
        np.testing.assert_allclose(out[:, :, :n, :n], ref, rtol=3e-6, atol=1e-7, err_msg=f"row length {n}")
        assert (out[:, :, n:, :] == -7.0).all()  # rows past the runtime extent: nothing written
