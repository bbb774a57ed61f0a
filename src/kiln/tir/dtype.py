"""Scalar data types of the loop IR, spelled as strings ("float32", "int64", "bool", ...).

Kiln uses plain strings for dtypes everywhere in the compiler (the same names NumPy and
:mod:`kiln.runtime.dtype` use) so that a dtype can be printed, hashed and compared without
ceremony.  This module answers the few questions the IR asks about them.
"""

from __future__ import annotations

from ..runtime import dtype as _rt
from ..runtime.errors import CompileError

__all__ = [
    "SUPPORTED_DTYPES",
    "check_dtype",
    "is_float",
    "is_int",
    "is_uint",
    "is_integer",
    "is_bool",
    "bits_of",
    "dl_bits",
    "dl_code",
    "is_low_precision",
    "min_value",
    "max_value",
]

# The loop IR accepts exactly the dtypes the runtime can store; facts about them come from
# the runtime's table (one table, see kiln.runtime.dtype).
SUPPORTED_DTYPES: tuple[str, ...] = _rt.SUPPORTED
_KNOWN = frozenset(SUPPORTED_DTYPES)


def check_dtype(dtype: object) -> str:
    """Normalise a dtype (string, NumPy dtype or type) to its canonical name.

    Raises
    ------
    CompileError
        If the dtype is not one the code generators support.
    """
    if dtype == "handle":
        return "handle"
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or getattr(dtype, "__name__", str(dtype))
    if name == "float":
        name = "float32"
    elif name == "int":
        name = "int32"
    if name not in _KNOWN:
        raise CompileError(f"unsupported dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    return name


def is_float(dtype: str) -> bool:
    """True for every floating-point dtype, including float16 and bfloat16."""
    return dtype in _rt.FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    """True for signed integer dtypes."""
    return dtype in _rt.SIGNED_DTYPES


def is_uint(dtype: str) -> bool:
    """True for unsigned integer dtypes."""
    return dtype in _rt.UNSIGNED_DTYPES


def is_integer(dtype: str) -> bool:
    """True for signed or unsigned integer dtypes (not bool)."""
    return is_int(dtype) or is_uint(dtype)


def is_bool(dtype: str) -> bool:
    """True for the boolean dtype."""
    return dtype == "bool"


def is_low_precision(dtype: str) -> bool:
    """True for the low-precision storage types (float8 variants, float4_e2m1fn, int4, uint4,
    int2, uint2): a kernel loads, stores, selects and reinterprets them as their storage byte
    (``Call(REINTERPRET)`` to / from ``uint8``) but computes nothing in them; conversions are
    built by :mod:`kiln.topi.lowp_cast`."""
    return dtype in _rt.LOW_PRECISION_DTYPES


def bits_of(dtype: str) -> int:
    """Storage width in bits (bool is stored as one byte, like DLPack; so is each element of a
    sub-byte type such as int4)."""
    if dtype == "handle":
        return 64
    return _rt.bits(dtype)


def dl_bits(dtype: str) -> int:
    """The ``bits`` of the dtype's DLPack ``DLDataType`` (what a kernel's argument check
    compares): :func:`bits_of` except for the sub-byte types (int4: 4)."""
    return _rt.dl_bits(dtype)


def dl_code(dtype: str) -> int:
    """DLPack type code of ``dtype`` (0 int, 1 uint, 2 float, 4 bfloat, 6 bool, 10-14 float8, 17 float4)."""
    return _rt.dl_code(dtype)


def min_value(dtype: str) -> float | int:
    """Smallest value of ``dtype`` (``-inf`` for floats); the identity of ``max`` reductions."""
    if is_low_precision(dtype):
        raise CompileError(f"min_value: {dtype} is a low-precision storage type; kernels compute nothing in it")
    if is_float(dtype):
        return float("-inf")
    if is_bool(dtype):
        return 0
    b = bits_of(dtype)
    return 0 if is_uint(dtype) else -(1 << (b - 1))


def max_value(dtype: str) -> float | int:
    """Largest value of ``dtype`` (``inf`` for floats); the identity of ``min`` reductions."""
    if is_low_precision(dtype):
        raise CompileError(f"max_value: {dtype} is a low-precision storage type; kernels compute nothing in it")
    if is_float(dtype):
        return float("inf")
    if is_bool(dtype):
        return 1
    b = bits_of(dtype)
    return (1 << b) - 1 if is_uint(dtype) else (1 << (b - 1)) - 1
