"""Element types: Kiln dtype names <-> DLPack ``DLDataType`` <-> NumPy dtypes.

Kiln names element types with short strings ("float32", "bfloat16", "bool", ...); those are
the names graph JSON, params files and error messages use. This module is the single table
that maps them to DLPack type codes and to NumPy dtypes; the compiler's dtype helpers
(:mod:`kiln.ir.types`, :mod:`kiln.tir.dtype`) and the CLI derive theirs from it. ``bfloat16`` and
the low-precision types (:data:`LOW_PRECISION_DTYPES`) come from ``ml_dtypes``, which is imported
only when a NumPy dtype for one of them is actually needed so that ``kiln.runtime`` stays
importable with NumPy alone.

Low-precision types (ONNX FLOAT8*, FLOAT4E2M1, INT4, UINT4, INT2, UINT2) are *storage* types:
Kiln holds **one element per byte**, exactly as ``ml_dtypes`` does (the value's bits in the low
bits of the byte, the high bits zero: int4 -1 is the byte 0x0F), never packed two or four per
byte as ONNX initializers and DLPack sub-byte tensors are. Their ``DLDataType`` is the DLPack
one (float8: codes 10-14 with 8 bits; float4_e2m1fn: code 17 with 4 bits; int4/int2: kDLInt
with 4/2 bits), so :func:`to_dl` bits may be smaller than the storage bits of :func:`bits`;
:func:`itemsize` is always whole bytes. Kernels only load, store and convert them (Cast,
QuantizeLinear, DequantizeLinear, data movement): they are in none of the arithmetic sets.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ._ffi import DLDataType
from .errors import InputError

__all__ = [
    "SUPPORTED",
    "DLDataTypeCode",
    "to_dl",
    "from_dl",
    "np_dtype",
    "canonical",
    "itemsize",
    "bits",
    "dl_code",
    "FLOAT_DTYPES",
    "SIGNED_DTYPES",
    "UNSIGNED_DTYPES",
    "LOW_PRECISION_DTYPES",
    "SUB_BYTE_DTYPES",
    "dl_bits",
    "STRING",
]


class DLDataTypeCode:
    """DLPack ``DLDataTypeCode`` values used by Kiln."""

    INT = 0
    UINT = 1
    FLOAT = 2
    OPAQUE_HANDLE = 3
    BFLOAT = 4
    COMPLEX = 5
    BOOL = 6
    FLOAT8_E4M3FN = 10
    FLOAT8_E4M3FNUZ = 11
    FLOAT8_E5M2 = 12
    FLOAT8_E5M2FNUZ = 13
    FLOAT8_E8M0FNU = 14
    FLOAT4_E2M1FN = 17


# name -> (code, bits) of the DLDataType; lanes are always 1 (vector dtypes are a kernel-internal
# concept). Storage is whole bytes per element: see itemsize().
_TABLE: dict[str, tuple[int, int]] = {
    "float16": (DLDataTypeCode.FLOAT, 16),
    "float32": (DLDataTypeCode.FLOAT, 32),
    "float64": (DLDataTypeCode.FLOAT, 64),
    "bfloat16": (DLDataTypeCode.BFLOAT, 16),
    "int8": (DLDataTypeCode.INT, 8),
    "int16": (DLDataTypeCode.INT, 16),
    "int32": (DLDataTypeCode.INT, 32),
    "int64": (DLDataTypeCode.INT, 64),
    "uint8": (DLDataTypeCode.UINT, 8),
    "uint16": (DLDataTypeCode.UINT, 16),
    "uint32": (DLDataTypeCode.UINT, 32),
    "uint64": (DLDataTypeCode.UINT, 64),
    # DLPack >= 0.8 spells bool as kDLBool with 8 bits (one byte per element, like NumPy).
    "bool": (DLDataTypeCode.BOOL, 8),
    # Low-precision storage types (ml_dtypes names), one element per byte; see the module docstring.
    "float8_e4m3fn": (DLDataTypeCode.FLOAT8_E4M3FN, 8),
    "float8_e4m3fnuz": (DLDataTypeCode.FLOAT8_E4M3FNUZ, 8),
    "float8_e5m2": (DLDataTypeCode.FLOAT8_E5M2, 8),
    "float8_e5m2fnuz": (DLDataTypeCode.FLOAT8_E5M2FNUZ, 8),
    "float8_e8m0fnu": (DLDataTypeCode.FLOAT8_E8M0FNU, 8),
    "float4_e2m1fn": (DLDataTypeCode.FLOAT4_E2M1FN, 4),
    "int4": (DLDataTypeCode.INT, 4),
    "uint4": (DLDataTypeCode.UINT, 4),
    "int2": (DLDataTypeCode.INT, 2),
    "uint2": (DLDataTypeCode.UINT, 2),
    # Variable-length UTF-8 text, held as a NumPy object array of ``str`` on the host only
    # (kiln.runtime.strings, docs/strings.md). DLPack has no string type: the code is a
    # placeholder for the executor's own DLTensor bookkeeping; NDArray.__dlpack__ refuses to
    # export a string tensor and from_dl never returns "string".
    "string": (DLDataTypeCode.OPAQUE_HANDLE, 64),
}

#: The dtype name of string tensors.
STRING = "string"

#: Every dtype name Kiln accepts, in a stable order (used in error messages).
SUPPORTED: tuple[str, ...] = tuple(_TABLE)

#: Floating-point dtypes (IEEE and bfloat16).
FLOAT_DTYPES: frozenset[str] = frozenset(
    k for k, (code, _) in _TABLE.items() if code in (DLDataTypeCode.FLOAT, DLDataTypeCode.BFLOAT)
)
#: Low-precision storage types (from ``ml_dtypes``): float8 variants, float4_e2m1fn, int4, uint4,
#: int2, uint2. Kernels convert them (kiln.topi.lowp_cast) but never compute in them.
LOW_PRECISION_DTYPES: frozenset[str] = frozenset({
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn",
    "int4", "uint4", "int2", "uint2",
})
#: Low-precision types narrower than a byte (DLPack bits < 8; Kiln still stores one per byte).
SUB_BYTE_DTYPES: frozenset[str] = frozenset(k for k, (_, b) in _TABLE.items() if b < 8)
#: Signed integer dtypes (int4 / int2 are low-precision storage types, not among them).
SIGNED_DTYPES: frozenset[str] = frozenset(
    k for k, (code, _) in _TABLE.items() if code == DLDataTypeCode.INT and k not in LOW_PRECISION_DTYPES
)
#: Unsigned integer dtypes (bool, uint4 and uint2 are not among them).
UNSIGNED_DTYPES: frozenset[str] = frozenset(
    k for k, (code, _) in _TABLE.items() if code == DLDataTypeCode.UINT and k not in LOW_PRECISION_DTYPES
)

_REVERSE: dict[tuple[int, int], str] = {v: k for k, v in _TABLE.items() if k != STRING}
# TVM writes bool as (kDLUInt, 1 bit) yet stores one byte per element; accept it on input so
# params files and DLPack tensors produced by TVM load as bool.
_REVERSE[(DLDataTypeCode.UINT, 1)] = "bool"


def _unsupported(dtype: Any) -> InputError:
    return InputError(f"unsupported dtype {dtype!r}; supported dtypes: {', '.join(SUPPORTED)}")


@functools.cache
def _canonical_cached(dtype: Any) -> str:
    if isinstance(dtype, str) and dtype in _TABLE:
        return dtype
    if dtype is None:  # np.dtype(None) would silently mean float64
        raise _unsupported(dtype)
    try:
        # NumPy understands aliases ("f4", "float", np.float32, np.dtype("int8"), ...) and
        # ml_dtypes' types (ml_dtypes.bfloat16, ml_dtypes.int4, ...).
        name = np.dtype(dtype).name
    except TypeError:
        raise _unsupported(dtype) from None
    if np.dtype(dtype).kind in "OU":  # NumPy holds text as object (str) or fixed-width unicode arrays
        return STRING
    if name not in _TABLE:
        raise _unsupported(dtype)
    return name


def canonical(dtype: Any) -> str:
    """Return the Kiln name of a dtype given as a name, NumPy dtype, type object or DLDataType.

    Parameters
    ----------
    dtype : str, numpy.dtype, type or DLDataType
        For example ``"float32"``, ``np.float32``, ``np.dtype("int8")``, ``"f4"``,
        ``ml_dtypes.bfloat16``, ``ml_dtypes.float8_e4m3fn`` or a ``DLDataType`` instance.

    Returns
    -------
    str
        One of :data:`SUPPORTED`.

    Raises
    ------
    InputError
        If the dtype is not one Kiln supports; the message lists the supported names.
    """
    if isinstance(dtype, DLDataType):
        return from_dl(dtype.code, dtype.bits, dtype.lanes)
    try:
        return _canonical_cached(dtype)
    except TypeError:  # unhashable input (e.g. a list) cannot be a dtype
        raise _unsupported(dtype) from None


def to_dl(dtype: Any) -> DLDataType:
    """Convert a dtype to a fresh DLPack ``DLDataType`` (lanes = 1).

    Parameters
    ----------
    dtype : str, numpy.dtype, type or DLDataType
        Anything :func:`canonical` accepts.

    Returns
    -------
    DLDataType
        A new ctypes struct (callers may store it in a ``DLTensor``).

    Raises
    ------
    InputError
        If the dtype is not supported.
    """
    code, bits = _TABLE[canonical(dtype)]
    return DLDataType(code, bits, 1)


def from_dl(code: int, bits: int, lanes: int = 1) -> str:
    """Convert a DLPack type triple to a Kiln dtype name.

    Parameters
    ----------
    code : int
        ``DLDataTypeCode`` (0 int, 1 uint, 2 float, 4 bfloat, 6 bool, 10-14 float8, 17 float4).
    bits : int
        Bits per lane.
    lanes : int, optional
        Vector lanes; only 1 is supported.

    Returns
    -------
    str
        One of :data:`SUPPORTED`.

    Raises
    ------
    InputError
        If the triple does not name a supported dtype.
    """
    name = _REVERSE.get((int(code), int(bits)))
    if name is None or int(lanes) != 1:
        raise InputError(
            f"unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes}); "
            f"supported dtypes: {', '.join(SUPPORTED)}"
        )
    return name


@functools.cache
def _np_dtype_of_name(name: str) -> np.dtype:
    if name == STRING:
        return np.dtype(object)
    if name == "bfloat16" or name in LOW_PRECISION_DTYPES:
        try:
            import ml_dtypes  # imported lazily: only bfloat16 and the low-precision types need it
        except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
            raise InputError(f"dtype {name!r} needs the 'ml_dtypes' package; pip install ml_dtypes") from None
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def np_dtype(dtype: Any) -> np.dtype:
    """Return the NumPy dtype for a Kiln dtype.

    Parameters
    ----------
    dtype : str, numpy.dtype, type or DLDataType
        Anything :func:`canonical` accepts.

    Returns
    -------
    numpy.dtype
        Native-byte-order NumPy dtype (``ml_dtypes.bfloat16`` for ``"bfloat16"``, the
        ``ml_dtypes`` type of the same name for a low-precision dtype).

    Raises
    ------
    InputError
        If the dtype is not supported.
    """
    return _np_dtype_of_name(canonical(dtype))


def itemsize(dtype: Any) -> int:
    """Bytes per element of a supported dtype (bool is one byte; so are int4, float4_e2m1fn, int2, ...)."""
    return (_TABLE[canonical(dtype)][1] + 7) // 8


def bits(dtype: Any) -> int:
    """Storage bits per element of a supported dtype (bool is stored in 8 bits, as in DLPack ≥ 0.8;
    the sub-byte types too, one element per byte): ``8 * itemsize(dtype)``."""
    return 8 * itemsize(dtype)


def dl_bits(dtype: Any) -> int:
    """The ``bits`` of the dtype's ``DLDataType`` (the element width: 4 for int4 and
    float4_e2m1fn, 2 for int2; otherwise the same as :func:`bits`)."""
    return _TABLE[canonical(dtype)][1]


def dl_code(dtype: Any) -> int:
    """The ``DLDataTypeCode`` of a supported dtype (0 int, 1 uint, 2 float, 4 bfloat, 6 bool, 10-14 float8,
    17 float4)."""
    return _TABLE[canonical(dtype)][0]
