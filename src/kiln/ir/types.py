"""Tensor types of the graph IR.

Kiln compiles static-shape graphs: every value has a fully known shape and a dtype named the
NumPy way (``"float32"``, ``"int64"``, ``"bool"``, ``"bfloat16"`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime.errors import InputError

__all__ = ["TensorType", "normalize_dtype", "np_dtype", "DTYPES", "FLOAT_DTYPES", "INT_DTYPES"]

#: Every dtype the IR accepts.
DTYPES: tuple[str, ...] = (
    "float16", "bfloat16", "float32", "float64",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "bool",
)
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})

_NP_CACHE: dict[str, np.dtype] = {}


def np_dtype(name: str) -> np.dtype:
    """Return the NumPy dtype for an IR dtype name (``bfloat16`` comes from ml_dtypes)."""
    dt = _NP_CACHE.get(name)
    if dt is None:
        if name == "bfloat16":
            import ml_dtypes

            dt = np.dtype(ml_dtypes.bfloat16)
        else:
            dt = np.dtype(name)
        _NP_CACHE[name] = dt
    return dt


def normalize_dtype(dtype: Any) -> str:
    """Return the canonical IR name of ``dtype`` (a string, NumPy dtype or scalar type).

    Raises
    ------
    InputError
        If the dtype is not one the IR supports.
    """
    if isinstance(dtype, str):
        name = dtype
        if name not in DTYPES:
            try:
                name = np.dtype(name).name
            except TypeError:
                pass
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError as exc:
            raise InputError(f"not a dtype: {dtype!r}") from exc
    if name not in DTYPES:
        raise InputError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    return name


@dataclass(frozen=True, slots=True)
class TensorType:
    """The static type of a tensor value.

    Parameters
    ----------
    shape : tuple of int
        Every dimension, all known (a scalar has ``()``).
    dtype : str
        IR dtype name, see :data:`DTYPES`.
    """

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise InputError(f"negative dimension in shape {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Size of the tensor in bytes."""
        return self.size * np_dtype(self.dtype).itemsize

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"

    __repr__ = __str__
