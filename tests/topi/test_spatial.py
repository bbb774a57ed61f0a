"""Spatial sampling ops (grid_sample): every kernel against the IR op's NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir import np_dtype
from tests.topi.harness import Case, case_params, module_builder, run_and_check, uniform

F32 = "float32"


def grid_with_ties(lo: float, hi: float):
    """Uniform grid values, a quarter of them on exact pixel centres and half-pixel edges."""
    def g(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        v = rng.random(shape) * (hi - lo) + lo
        ticks = rng.integers(-8, 9, size=shape) / 8.0
        return np.where(rng.random(shape) < 0.25, ticks, v).astype(np_dtype(dtype))
    return g


CASES: list[Case] = []
# every mode x padding pair; align_corners alternates (both settings meet every mode and padding)
for k, (mode, pad) in enumerate((m, p) for m in ("linear", "nearest", "cubic")
                                for p in ("zeros", "border", "reflection")):
    align = bool(k % 2)
    CASES.append(Case("grid_sample", [((2, 3, 5, 6), F32), ((2, 4, 7, 2), F32, grid_with_ties(-1.6, 1.6))],
                      {"mode": mode, "padding_mode": pad, "align_corners": align},
                      label=f"{mode}-{pad}-{int(align)}"))
CASES += [
    # volumetric (5-D) data
    Case("grid_sample", [((1, 2, 3, 4, 5), F32), ((1, 2, 3, 4, 3), F32, uniform(-1.3, 1.3))],
         {"mode": "linear", "padding_mode": "zeros"}, label="3d-linear"),
    Case("grid_sample", [((1, 2, 3, 4, 5), F32), ((1, 2, 3, 4, 3), F32, uniform(-1.3, 1.3))],
         {"mode": "nearest", "padding_mode": "reflection", "align_corners": True}, label="3d-nearest"),
    # far outside the input: many reflections, and border clamping
    Case("grid_sample", [((1, 2, 4, 3), F32), ((1, 3, 5, 2), F32, uniform(-9, 9))],
         {"mode": "linear", "padding_mode": "reflection", "align_corners": True}, label="far-reflect"),
    # nearest is a gather: exact for integer data
    Case("grid_sample", [((2, 2, 4, 5), "int32"), ((2, 3, 3, 2), F32, uniform(-1.2, 1.2))],
         {"mode": "nearest"}, label="int"),
    Case("grid_sample", [((1, 2, 4, 5), "float64"), ((1, 3, 3, 2), "float64", uniform(-1.2, 1.2))],
         {"mode": "cubic", "padding_mode": "border"}, label="f64"),
    Case("grid_sample", [((2, 3, 7), F32), ((2, 5, 1), F32, uniform(-1.2, 1.2))], {"mode": "linear"}, label="1d"),
]

get_module = module_builder(CASES, "spatial")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_spatial(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])
