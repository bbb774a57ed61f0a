"""Helpers shared by the op definitions."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ...runtime.errors import InputError
from ..sym_rules import broadcast_dims
from ..types import FLOAT_DTYPES, TensorType, np_dtype

Attrs = dict[str, Any]


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy (multidirectional) broadcasting of shapes; InputError if incompatible.

    The static case of :func:`kiln.ir.sym_rules.broadcast_dims` (one rule for both)."""
    try:
        return tuple(int(d) for d in broadcast_dims(*shapes))
    except InputError:
        raise InputError("shapes " + " and ".join(str(tuple(x)) for x in shapes) + " are not broadcastable") from None


def norm_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """Map a possibly negative axis into ``[0, ndim)``; InputError if out of range."""
    if not -ndim <= axis < ndim:
        raise InputError(f"{what} {axis} is out of range for a {ndim}-D tensor")
    return axis + ndim if axis < 0 else axis


def same_dtype(types: Sequence[TensorType], what: str = "inputs") -> str:
    """The common dtype of ``types``; InputError if they differ."""
    dts = {t.dtype for t in types}
    if len(dts) > 1:
        raise InputError(f"{what} must share one dtype, got " + ", ".join(t.dtype for t in types))
    return types[0].dtype


def require_float(t: TensorType, what: str = "input") -> None:
    """InputError unless ``t`` is a floating-point type."""
    if t.dtype not in FLOAT_DTYPES:
        raise InputError(f"{what} must be a floating-point tensor, got {t.dtype}")


def require_ndim(t: TensorType, ndim: int, what: str = "input") -> None:
    """InputError unless ``t`` has ``ndim`` dimensions."""
    if t.ndim != ndim:
        raise InputError(f"{what} must be {ndim}-D, got shape {t.shape}")


def wide(x: np.ndarray) -> np.ndarray:
    """Promote to the accumulation type: float64 for floats, int64/uint64 for integers."""
    k = x.dtype.kind
    if k == "f" or x.dtype.name == "bfloat16":
        return x.astype(np.float64)
    if k == "i":
        return x.astype(np.int64)
    if k == "u":
        return x.astype(np.uint64)
    if k == "b":
        return x
    return x


def to_dtype(x: Any, dtype: str | np.dtype) -> np.ndarray:
    """Cast the reference result back to the IR dtype."""
    dt = np_dtype(dtype) if isinstance(dtype, str) else dtype
    return np.asarray(x).astype(dt, copy=False)


def float_compute(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap a float-only NumPy function: half types are computed in float32 and cast back."""

    def run(x: np.ndarray) -> np.ndarray:
        dt = x.dtype
        if dt.name in ("float16", "bfloat16"):
            return fn(x.astype(np.float32)).astype(dt)
        with np.errstate(all="ignore"):
            return np.asarray(fn(x)).astype(dt, copy=False)

    return run


def conv_out_size(n: int, k: int, s: int, p0: int, p1: int, d: int, ceil: bool = False) -> int:
    """Output length of a sliding window (conv/pool) along one dimension."""
    eff = (k - 1) * d + 1
    span = n + p0 + p1 - eff
    if span < 0:
        raise InputError(f"window of size {eff} does not fit input of size {n} with padding "
                         f"({p0}, {p1})")
    if not ceil:
        return span // s + 1
    out = -(-span // s) + 1
    # A window may not start inside the end padding (ONNX / PyTorch ceil_mode rule).
    if (out - 1) * s >= n + p0:
        out -= 1
    return out
