"""Helpers for tests that launch kernels on the mock CUDA driver (``mock_libcuda.c``)."""

from __future__ import annotations

import ctypes

import numpy as np


def hook_type():
    """The ctypes type of the mock driver's launch hook: kernel name, grid, block, parameters."""
    return ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p))


def view(params, i: int, n: int) -> np.ndarray:
    """The float32 array kernel parameter ``i`` points at (mock device memory is host memory)."""
    addr = ctypes.cast(params[i], ctypes.POINTER(ctypes.c_uint64))[0]
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(addr))
