"""Recurrent and volumetric ops: every kernel of the group against the IR op's NumPy reference.

RNN / GRU / LSTM and 3-D convolution lower onto existing kernels (tested with them and in
``tests/frontend/test_onnx_recurrent.py``); ``roi_align`` has its own compute.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.runtime import ndarray as nd
from kiln.runtime.errors import KilnError
from tests.topi.harness import Case, case_params, ints, make_inputs, module_builder, run_and_check

F32 = "float32"


def _boxes(lo: float, hi: float):
    """(R, 4) boxes (x1, y1, x2, y2) with corners in [lo, hi); a few run past the image."""
    def g(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        a = rng.uniform(lo, hi, size=(shape[0], 2, 2))
        a.sort(axis=1)  # per coordinate: the smaller one is the top-left corner
        return np.concatenate([a[:, 0], a[:, 1]], axis=1).astype(dtype)
    return g


_X = ((2, 3, 10, 12), F32)
_R = ((5, 4), F32, _boxes(-3.0, 14.0))
_B = ((5,), "int64", ints(0, 2))

CASES: list[Case] = [
    Case("roi_align", [_X, _R, _B], {"output_height": 3, "output_width": 4, "sampling_ratio": 2}),
    Case("roi_align", [_X, _R, _B], {"output_height": 3, "output_width": 4, "sampling_ratio": 2, "mode": "max"},
         label="max"),
    Case("roi_align", [_X, ((5, 4), F32, _boxes(-3.0, 28.0)), _B],
         {"output_height": 2, "output_width": 2, "sampling_ratio": 3, "spatial_scale": 0.5, "half_pixel": False},
         label="scale"),
    # adaptive grids (sampling_ratio 0: ceil(roi_size / out) samples per bin), for boxes up to
    # 10x the image larger than the bound 2 * size + 7: only the samples that can be inside
    # the image are visited
    Case("roi_align", [_X, ((5, 4), F32, _boxes(-60.0, 70.0)), ((5,), "int32", ints(0, 2))],
         {"output_height": 2, "output_width": 3, "sampling_ratio": 0, "max_grid": (27, 31)}, label="big"),
    Case("roi_align", [_X, ((5, 4), F32, _boxes(-60.0, 70.0)), _B],
         {"output_height": 2, "output_width": 3, "sampling_ratio": 0, "max_grid": (27, 31), "mode": "max"},
         label="big-max"),
    Case("roi_align", [((1, 2, 6, 5), "float64"), ((3, 4), "float64", _boxes(-1.0, 7.0)), ((3,), "int64", ints(0, 1))],
         {"output_height": 2, "output_width": 3, "sampling_ratio": 1}, label="f64"),
]

get_module = module_builder(CASES, "rec")


@pytest.mark.parametrize("target,idx", case_params(CASES))
def test_recurrent(target: str, idx: int) -> None:
    mod, built = get_module(target)
    run_and_check(mod, built[idx])


def test_roi_align_bad_batch_index_fails_in_kernel() -> None:
    # batch_indices come from data: an out-of-range one is a run-time error naming the op.
    mod, built = get_module("c")
    b = built[0]
    x, rois, idx = make_inputs(b.case, 0)
    idx[2] = 7  # only 2 images
    out = nd.empty(b.out_types[0].shape, b.out_types[0].dtype)
    with pytest.raises(KilnError, match="roi_align"):
        mod[b.name](nd.array(x), nd.array(rois), nd.array(idx), out)
