"""Tensor types of the graph IR.

Every value has a static **upper-bound shape** (ints: what memory planning, layout passes and
kernels' index math use) and a dtype named the NumPy way (``"float32"``, ``"int64"``, ``"bool"``,
``"bfloat16"`` ...). A value of a dynamic graph also carries, per dim, an optional symbolic
expression for its actual runtime extent (:mod:`kiln.runtime.sym`); the upper bound of such a dim
is the expression's maximum over the graph's declared dim ranges. A fully static type has
``sym is None`` so it equals and hashes like it always did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime import dtype as _rt
from ..runtime.dtype import np_dtype
from ..runtime import sym as _sym
from ..runtime.errors import InputError
from ..runtime.sym import Dim

__all__ = ["TensorType", "Dim", "normalize_dtype", "np_dtype", "DTYPES", "FLOAT_DTYPES", "INT_DTYPES",
           "LOW_PRECISION_DTYPES"]

#: Every dtype the IR accepts: exactly those the runtime can store (its table is the only one).
DTYPES: tuple[str, ...] = _rt.SUPPORTED
#: Floating-point dtypes, bfloat16 included.
FLOAT_DTYPES: frozenset[str] = _rt.FLOAT_DTYPES
#: Signed and unsigned integer dtypes (not bool, not the 4- and 2-bit ones).
INT_DTYPES: frozenset[str] = _rt.SIGNED_DTYPES | _rt.UNSIGNED_DTYPES
#: Low-precision storage types (float8 variants, float4_e2m1fn, int4, uint4, int2, uint2): values of
#: these types are only converted (cast, QuantizeLinear, DequantizeLinear) and moved, never computed in.
LOW_PRECISION_DTYPES: frozenset[str] = _rt.LOW_PRECISION_DTYPES


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
        Every dimension's static extent, or its upper bound for a symbolic dim (a scalar has
        ``()``).
    dtype : str
        IR dtype name, see :data:`DTYPES`.
    sym : tuple of (str or None), optional
        Per dim, the canonical symbolic expression of its runtime extent, or ``None`` for a
        static dim. ``None`` as a whole (the default) when every dim is static; a tuple of all
        ``None`` and constant expressions (``"3"``) are canonicalised to static.

    Raises
    ------
    InputError
        A negative dim, a bad dtype, a bad symbolic expression, ``sym`` of another rank than
        ``shape``, or a constant expression that disagrees with ``shape``.
    """

    shape: tuple[int, ...]
    dtype: str
    sym: tuple[Dim | None, ...] | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise InputError(f"negative dimension in shape {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if self.sym is not None:
            object.__setattr__(self, "sym", _canonical_sym(self.sym, shape))

    @property
    def dims(self) -> tuple[Dim, ...]:
        """Every dim: the ``int`` extent of a static dim, the expression of a symbolic one."""
        if self.sym is None:
            return self.shape
        return tuple(d if s is None else s for d, s in zip(self.shape, self.sym))

    @property
    def is_dynamic(self) -> bool:
        """Whether some dim is symbolic."""
        return self.sym is not None

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
        dims = ", ".join(str(d) for d in self.dims)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"

    __repr__ = __str__


def _canonical_sym(sym: Any, shape: tuple[int, ...]) -> tuple[Dim | None, ...] | None:
    sym = tuple(sym)
    if len(sym) != len(shape):
        raise InputError(f"symbolic dims {sym} do not match the rank of shape {shape}")
    out: list[Dim | None] = []
    for d, s in zip(shape, sym):
        if s is None:
            out.append(None)
            continue
        c = _sym.canonical(s)
        if isinstance(c, int):
            # A constant expression is a static dim; it must be the static extent.
            if c != d:
                raise InputError(f"dimension {s!r} is the constant {c} but the shape {shape} has {d}")
            out.append(None)
        else:
            out.append(c)
    return tuple(out) if any(s is not None for s in out) else None
