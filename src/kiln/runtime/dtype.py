"""Element types: Kiln dtype names <-> DLPack ``DLDataType`` <-> NumPy dtypes.

Kiln names element types with short strings ("float32", "bfloat16", "bool", ...); those are
the names graph JSON, params files and error messages use. This module is the single table
that maps them to DLPack type codes and to NumPy dtypes; the compiler's dtype helpers
(:mod:`kiln.ir.types`, :mod:`kiln.tir.dtype`) and the CLI derive theirs from it. ``bfloat16`` comes from
``ml_dtypes``, which is imported only when a NumPy dtype for it is actually needed so that
``kiln.runtime`` stays importable with NumPy alone.
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


# name -> (code, bits); lanes are always 1 (vector dtypes are a kernel-internal concept).
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
}

#: Every dtype name Kiln accepts, in a stable order (used in error messages).
SUPPORTED: tuple[str, ...] = tuple(_TABLE)

#: Floating-point dtypes (IEEE and bfloat16).
FLOAT_DTYPES: frozenset[str] = frozenset(
    k for k, (code, _) in _TABLE.items() if code in (DLDataTypeCode.FLOAT, DLDataTypeCode.BFLOAT)
)
#: Signed integer dtypes.
SIGNED_DTYPES: frozenset[str] = frozenset(k for k, (code, _) in _TABLE.items() if code == DLDataTypeCode.INT)
#: Unsigned integer dtypes (bool is not one of them).
UNSIGNED_DTYPES: frozenset[str] = frozenset(k for k, (code, _) in _TABLE.items() if code == DLDataTypeCode.UINT)

_REVERSE: dict[tuple[int, int], str] = {v: k for k, v in _TABLE.items()}
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
        # NumPy understands aliases ("f4", "float", np.float32, np.dtype("int8"), ...) and, once
        # ml_dtypes is imported, ml_dtypes.bfloat16.
        name = np.dtype(dtype).name
    except TypeError:
        raise _unsupported(dtype) from None
    if name not in _TABLE:
        raise _unsupported(dtype)
    return name


def canonical(dtype: Any) -> str:
    """Return the Kiln name of a dtype given as a name, NumPy dtype, type object or DLDataType.

    Parameters
    ----------
    dtype : str, numpy.dtype, type or DLDataType
        For example ``"float32"``, ``np.float32``, ``np.dtype("int8")``, ``"f4"``,
        ``ml_dtypes.bfloat16`` or a ``DLDataType`` instance.

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
        ``DLDataTypeCode`` (0 int, 1 uint, 2 float, 4 bfloat, 6 bool).
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
    if name == "bfloat16":
        try:
            import ml_dtypes  # imported lazily: only bfloat16 needs it
        except ImportError:  # pragma: no cover - ml_dtypes is a declared dependency
            raise InputError("dtype 'bfloat16' needs the 'ml_dtypes' package; pip install ml_dtypes") from None
        return np.dtype(ml_dtypes.bfloat16)
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
        Native-byte-order NumPy dtype (``ml_dtypes.bfloat16`` for ``"bfloat16"``).

    Raises
    ------
    InputError
        If the dtype is not supported.
    """
    return _np_dtype_of_name(canonical(dtype))


def itemsize(dtype: Any) -> int:
    """Bytes per element of a supported dtype (bool is one byte)."""
    return _TABLE[canonical(dtype)][1] // 8


def bits(dtype: Any) -> int:
    """Storage bits per element of a supported dtype (bool is stored in 8 bits, as in DLPack ≥ 0.8)."""
    return _TABLE[canonical(dtype)][1]


def dl_code(dtype: Any) -> int:
    """The ``DLDataTypeCode`` of a supported dtype (0 int, 1 uint, 2 float, 4 bfloat, 6 bool)."""
    return _TABLE[canonical(dtype)][0]
