"""Tensor types of the graph IR.

Kiln compiles static-shape graphs: every value has a fully known shape and a dtype named the
NumPy way (``"float32"``, ``"int64"``, ``"bool"``, ``"bfloat16"`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime import dtype as _rt
from ..runtime.dtype import np_dtype
from ..runtime.errors import InputError

__all__ = ["TensorType", "normalize_dtype", "np_dtype", "DTYPES", "FLOAT_DTYPES", "INT_DTYPES"]

#: Every dtype the IR accepts: exactly those the runtime can store (its table is the only one).
DTYPES: tuple[str, ...] = _rt.SUPPORTED
#: Floating-point dtypes, bfloat16 included.
FLOAT_DTYPES: frozenset[str] = _rt.FLOAT_DTYPES
#: Signed and unsigned integer dtypes (not bool).
INT_DTYPES: frozenset[str] = _rt.SIGNED_DTYPES | _rt.UNSIGNED_DTYPES


def normalize_dtype(dtype: Any) -> str:
    """Return the canonical IR name of ``dtype`` (a name, an alias such as ``"f4"``, a NumPy
    dtype or scalar type); the same rules as :func:`kiln.runtime.dtype.canonical`.

    Raises
    ------
    InputError
        If the dtype is not one the IR supports (``None`` included: NumPy would read it as
        float64).
    """
    return _rt.canonical(dtype)


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
