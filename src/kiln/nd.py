"""``kiln.nd``: the user-facing array namespace (``kiln.nd.array``, ``kiln.nd.from_dlpack``)."""

from .runtime.ndarray import NDArray, array, empty, from_dlpack  # noqa: F401

__all__ = ["NDArray", "array", "empty", "from_dlpack"]
