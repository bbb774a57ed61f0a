"""NumPy reference of conversions to and from the low-precision storage types (ONNX Cast semantics).

The oracle of the ``cast`` op's kernels for float8 / float4 / int4 / ... (``kiln.topi.lowp_cast``
builds those from integer bit manipulation; this module uses ``ml_dtypes``' own conversions
instead, as ONNX's reference implementation does), and what constant folding and
:func:`kiln.ir.evaluate` compute. Rules: see :mod:`kiln.topi.lowp_cast`.
"""

from __future__ import annotations

import numpy as np

from ...runtime.dtype import LOW_PRECISION_DTYPES, np_dtype

__all__ = ["cast_low_precision", "INT_WIDTHS"]

#: Value bits and signedness of the small integer types.
INT_WIDTHS = {"int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}
_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """ONNX ``to_float8e8m0``: the float32 exponent field, rounded by ``round_mode``."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    e = (u >> 23) & 0xFF
    if round_mode == "down":
        inc = np.zeros_like(e)
    elif round_mode == "up":
        inc = ((u & 0x7FFFFF) != 0).astype(np.int64)
    elif round_mode == "nearest":
        inc = (((u & 0x400000) != 0) & (((u & 0x3FFFFF) != 0) | (e > 0))).astype(np.int64)
    else:
        raise ValueError(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    inc = np.where(e == 0xFF, 0, inc)
    if saturate:
        inc = np.where(e == 0xFE, 0, inc)
    return (e + inc).astype(np.uint8).view(np_dtype("float8_e8m0fnu"))


def cast_low_precision(x: np.ndarray, dtype: str, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """``x`` converted to ``dtype`` where one of the two is a low-precision type."""
    src = x.dtype.name
    with np.errstate(all="ignore"):
        if src in INT_WIDTHS:
            x = x.astype(np.int32)
        elif src in LOW_PRECISION_DTYPES:
            x = x.astype(np.float32)
        if dtype not in LOW_PRECISION_DTYPES:
            if dtype == "bool":
                return x != 0
            if dtype == "bfloat16" and x.dtype.kind in "iub":
                x = x.astype(np.float32)
            return x.astype(np_dtype(dtype))
        dt = np_dtype(dtype)
        if dtype in INT_WIDTHS:
            width, signed = INT_WIDTHS[dtype]
            if x.dtype.kind == "f" or x.dtype.name in ("float16", "bfloat16"):
                f = x.astype(np.float64)
                hi = 2.0**31 - 1 if x.dtype == np.float64 else 2.0**31 - 0.5  # float32: below 2**31
                x = np.where((f <= hi) & (f > -2.0**31 - 0.5), np.trunc(np.nan_to_num(f)), 0.0)
            v = x.astype(np.int64) & ((1 << width) - 1)
            if signed:
                v = (v ^ (1 << (width - 1))) - (1 << (width - 1))
            return v.astype(dt)
        if dtype == "float8_e8m0fnu":
            return _to_e8m0(x, saturate, round_mode)
        if x.dtype != np.float64:
            x = x.astype(np.float32)
        if saturate and dtype in _FLOAT8:
            import ml_dtypes

            fi = ml_dtypes.finfo(dt)
            x = np.clip(x, float(fi.min), float(fi.max))  # NaN stays NaN
        return x.astype(dt)
