"""Integer and bit-level ops: every kernel against the IR op's NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir import np_dtype
from tests.topi.harness import Case, case_params, module_builder, normal, run_and_check


def _full_range(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Any bit pattern of the dtype (sign bits and the extremes included)."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _shift_amounts(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Amounts in range, at the width, past it and (signed dtypes) negative."""
    nbits = np.dtype(dtype).itemsize * 8
    lo = -nbits - 3 if np.dtype(dtype).kind == "i" else 0
    hi = min(nbits + 4, int(np.iinfo(dtype).max))
    return rng.integers(lo, hi, size=shape).astype(dtype)


S = (3, 7, 19)  # odd sizes: vector tails

CASES: list[Case] = []
for _dt in ("int8", "uint8", "int16", "int32", "uint32", "int64", "uint64"):
    for _op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        CASES.append(Case(_op, [(S, _dt, _full_range), ((7, 1), _dt, _full_range)]))
    CASES.append(Case("bitwise_not", [(S, _dt, _full_range)]))
    for _d in ("left", "right"):
        CASES.append(Case("bit_shift", [(S, _dt, _full_range), (S, _dt, _shift_amounts)], {"direction": _d}))
CASES += [
    Case("bit_shift", [((4, 9), "uint16", _full_range), ((9,), "uint16", _shift_amounts)], {"direction": "left"},
         label="bcast"),
    Case("bit_shift", [((), "int32", _full_range), ((), "int32", _shift_amounts)], {"direction": "right"},
         label="scalar"),
]



def _any_float_bits(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Floats from random bit patterns (NaN excluded: its payload need not survive a round trip)."""
    udt = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(np_dtype(dtype)).itemsize]
    x = rng.integers(0, np.iinfo(udt).max, size=shape, dtype=udt, endpoint=True).view(np_dtype(dtype))
    with np.errstate(invalid="ignore"):
        nan = np.isnan(x.astype(np.float64))
    return np.where(nan, np.zeros((), x.dtype), x).astype(np_dtype(dtype))


for _src, _dst in (("float32", "int32"), ("float32", "uint32"), ("int32", "float32"), ("uint32", "float32"),
                   ("float64", "int64"), ("int64", "float64"), ("uint64", "float64"), ("float16", "int16"),
                   ("uint16", "float16"), ("bfloat16", "uint16"), ("int16", "bfloat16"), ("int8", "uint8"),
                   ("uint16", "int16"), ("bool", "uint8"), ("uint8", "bool"), ("float16", "bfloat16")):
    _gen = _any_float_bits if "float" in _src else _full_range if _src != "bool" else normal
    CASES.append(Case("bitcast", [(S, _src, _gen)], {"dtype": _dst}, label=_dst))

get_module = module_builder(CASES, "integer")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_integer(target: str, idx: int) -> None:
    mod, built = get_module(target)
    for seed in range(3):
        run_and_check(mod, built[idx], seed)
