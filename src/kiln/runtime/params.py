"""Params files: a binary dict of named tensors, byte-compatible with TVM's ``save_param_dict``.

Layout (all little-endian; see ``docs/params_format.md``)::

    u64 0xF7E58D4F05049CB7          list magic
    u64 0                           reserved
    u64 n, then n x (u64 len, utf-8 bytes)   names
    u64 n                           tensor count (must equal the name count)
    n x tensor:
        u64 0xDD5E40F096B4A13F      tensor magic
        u64 0                       reserved
        i32 device_type (1 = CPU), i32 device_id (0)
        i32 ndim
        u8 code, u8 bits, u16 lanes (DLDataType)
        i64 shape[ndim]
        i64 nbytes
        nbytes raw bytes

Loading never trusts a length before checking it against the bytes that remain, so corrupt
input raises :class:`FormatError` (with the offset and what was expected) instead of
allocating absurd amounts of memory or crashing. Tensor data is read straight into the
destination NDArray's aligned memory: one copy per tensor.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from typing import Any, Iterator, Mapping

import numpy as np

from . import dtype as _dt
from .errors import FormatError, InputError, KilnFileNotFoundError
from .ndarray import NDArray, empty

__all__ = [
    "PARAMS_LIST_MAGIC",
    "TENSOR_MAGIC",
    "save_param_dict",
    "load_param_dict",
    "save_param_dict_to_file",
    "load_param_dict_from_file",
]

#: First u64 of a params file.
PARAMS_LIST_MAGIC = 0xF7E58D4F05049CB7
#: First u64 of every tensor record.
TENSOR_MAGIC = 0xDD5E40F096B4A13F

_U64 = struct.Struct("<Q")
# tensor magic, reserved, device type, device id, ndim, dtype code, bits, lanes
_TENSOR_HEAD = struct.Struct("<QQiiiBBH")
_MAX_NDIM = 64  # far above any real tensor; guards against reading garbage as a shape


# --------------------------------------------------------------------------- saving
def _as_host_array(name: Any, value: Any) -> tuple[np.ndarray, str]:
    if not isinstance(name, str):
        raise InputError(f"param names must be str, got {type(name).__name__} ({name!r})")
    if isinstance(value, NDArray):
        arr, dt = value.numpy(copy=False), value.dtype
    elif isinstance(value, (np.ndarray, np.generic)):  # np.generic: NumPy scalars are 0-d
        arr, dt = np.asarray(value), _dt.canonical(value.dtype)
    else:
        raise InputError(f"param {name!r} must be an NDArray or numpy.ndarray, got {type(value).__name__}")
    # Native -> little-endian only matters on big-endian hosts or for '>f4'-style arrays.
    # (np.asarray with order="C", not ascontiguousarray, which turns 0-d arrays into 1-d.)
    arr = np.asarray(arr, dtype=_dt.np_dtype(dt).newbyteorder("<"), order="C")
    return arr, dt


def _iter_chunks(params: Mapping[str, Any]) -> Iterator[bytes | memoryview]:
    """Yield the serialized file piece by piece (tensor data as zero-copy memoryviews)."""
    if not isinstance(params, Mapping):
        raise InputError(f"save_param_dict expects a dict of name -> array, got {type(params).__name__}")
    items = [(k, *_as_host_array(k, v)) for k, v in params.items()]  # validate before writing
    yield _U64.pack(PARAMS_LIST_MAGIC) + _U64.pack(0) + _U64.pack(len(items))
    for name, _, _ in items:
        raw = name.encode("utf-8")
        yield _U64.pack(len(raw)) + raw
    yield _U64.pack(len(items))
    for _, arr, dt in items:
        dl = _dt.to_dl(dt)
        head = _TENSOR_HEAD.pack(TENSOR_MAGIC, 0, 1, 0, arr.ndim, dl.code, dl.bits, dl.lanes)
        shape = struct.pack(f"<{arr.ndim}q", *arr.shape)
        yield head + shape + struct.pack("<q", arr.nbytes)
        if arr.nbytes:
            yield memoryview(arr.reshape(-1).view(np.uint8))


def save_param_dict(params: Mapping[str, NDArray | np.ndarray]) -> bytes:
    """Serialize a dict of named tensors to the params format.

    Parameters
    ----------
    params : dict of str to NDArray or numpy.ndarray
        Tensors on any device (copied to host); insertion order is kept.

    Returns
    -------
    bytes
        The serialized dict, loadable by :func:`load_param_dict` and by TVM.

    Raises
    ------
    InputError
        For non-str names, non-array values or unsupported dtypes.
    """
    return b"".join(_iter_chunks(params))


def save_param_dict_to_file(params: Mapping[str, NDArray | np.ndarray], path: str | os.PathLike) -> None:
    """Write :func:`save_param_dict` output to ``path`` without building it in memory first."""
    chunks = _iter_chunks(params)
    first = next(chunks)  # validates every value before the file is created
    with open(path, "wb") as f:
        f.write(first)
        for chunk in chunks:
            f.write(chunk)


# --------------------------------------------------------------------------- loading
class _Reader:
    """Bounds-checked little-endian reader over a binary stream of known size."""

    def __init__(self, stream: Any, size: int, source: str) -> None:
        self.f, self.size, self.pos, self.source = stream, size, 0, source

    def fail(self, msg: str, at: int | None = None) -> FormatError:
        return FormatError(f"invalid params data ({self.source}) at offset {self.pos if at is None else at}: {msg}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated: expected {n} bytes of {what}, only {self.size - self.pos} left")

    def read(self, n: int, what: str) -> bytes:
        self.need(n, what)
        data = self.f.read(n)
        if len(data) != n:  # the stream shrank under us
            raise self.fail(f"truncated: expected {n} bytes of {what}, got {len(data)}")
        self.pos += n
        return data

    def u64(self, what: str) -> int:
        return _U64.unpack(self.read(8, what))[0]

    def read_into(self, dst: memoryview, what: str) -> None:
        n = dst.nbytes
        self.need(n, what)
        got = self.f.readinto(dst)
        if got != n:
            raise self.fail(f"truncated: expected {n} bytes of {what}, got {got}")
        self.pos += n


class _MemStream:
    """Minimal ``read``/``readinto`` over a memoryview, so tensor bytes are copied exactly once:
    from the caller's buffer straight into the aligned NDArray (no BytesIO copy of the input)."""

    def __init__(self, view: memoryview) -> None:
        self.view, self.pos = view, 0

    def read(self, n: int) -> bytes:
        out = self.view[self.pos : self.pos + n].tobytes()
        self.pos += len(out)
        return out

    def readinto(self, dst: memoryview) -> int:
        n = min(dst.nbytes, len(self.view) - self.pos)
        dst[:n] = self.view[self.pos : self.pos + n]
        self.pos += n
        return n


def _read_tensor(r: _Reader, index: int, name: str) -> NDArray:
    start = r.pos
    what = f"tensor #{index} ({name!r})"
    magic, _reserved, dev_type, dev_id, ndim, code, bits, lanes = _TENSOR_HEAD.unpack(
        r.read(_TENSOR_HEAD.size, f"{what} header")
    )
    if magic != TENSOR_MAGIC:
        raise r.fail(f"{what}: bad tensor magic 0x{magic:016X}, expected 0x{TENSOR_MAGIC:016X}", start)
    if dev_type != 1:
        raise r.fail(f"{what}: device type {dev_type} (id {dev_id}); params are always stored as CPU (1)", start)
    if not 0 <= ndim <= _MAX_NDIM:
        raise r.fail(f"{what}: ndim {ndim} out of range 0..{_MAX_NDIM}", start)
    try:
        dt = _dt.from_dl(code, bits, lanes)
    except InputError:
        raise r.fail(
            f"{what}: unknown dtype (code={code}, bits={bits}, lanes={lanes}); "
            f"supported: {', '.join(_dt.SUPPORTED)}",
            start,
        ) from None
    shape_at = r.pos
    shape = struct.unpack(f"<{ndim}q", r.read(8 * ndim, f"{what} shape"))
    if any(d < 0 for d in shape):
        raise r.fail(f"{what}: negative dimension in shape {shape}", shape_at)
    # NumPy, and so every host view of an NDArray, refuses a shape whose non-zero dims span
    # more than sys.maxsize bytes even when a zero dim makes the tensor empty: no real file
    # holds one, so it is corrupt (and must not become an NDArray that fails on first use).
    extent = math.prod(d for d in shape if d) * _dt.itemsize(dt)
    if extent > sys.maxsize:
        raise r.fail(f"{what}: shape {shape} of {dt} is too large to address (over {sys.maxsize} bytes)", shape_at)
    nbytes_at = r.pos
    (nbytes,) = struct.unpack("<q", r.read(8, f"{what} nbytes"))
    expected = math.prod(shape) * _dt.itemsize(dt)
    if nbytes != expected:
        raise r.fail(f"{what}: nbytes is {nbytes} but shape {shape} of {dt} needs {expected}", nbytes_at)
    r.need(nbytes, f"{what} data")  # before allocating: never trust a size we cannot back
    out = empty(shape, dt)
    if nbytes:
        dst = out.numpy(copy=False).reshape(-1).view(np.uint8)
        r.read_into(memoryview(dst), f"{what} data")
        if sys.byteorder != "little":  # pragma: no cover - the file is little-endian
            dst.view(_dt.np_dtype(dt)).byteswap(inplace=True)
    return out


def _load_stream(stream: Any, size: int, source: str) -> dict[str, NDArray]:
    r = _Reader(stream, size, source)
    magic = r.u64("list magic")
    if magic != PARAMS_LIST_MAGIC:
        raise r.fail(f"bad magic 0x{magic:016X}, expected params list magic 0x{PARAMS_LIST_MAGIC:016X}", 0)
    r.u64("reserved field")  # written as 0, ignored on read (room for future versions)
    count_at = r.pos
    n_names = r.u64("name count")
    if n_names * 8 > r.size - r.pos:  # every name takes at least its 8-byte length
        raise r.fail(f"name count {n_names} cannot fit in the {r.size - r.pos} bytes left", count_at)
    names: list[str] = []
    for i in range(n_names):
        at = r.pos
        length = r.u64(f"length of name #{i}")
        raw = r.read(length, f"name #{i}")
        try:
            names.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise r.fail(f"name #{i} is not valid UTF-8", at) from None
    at = r.pos
    n_tensors = r.u64("tensor count")
    if n_tensors != n_names:
        raise r.fail(f"{n_names} names but {n_tensors} tensors; the counts must match", at)
    result: dict[str, NDArray] = {}
    for i, name in enumerate(names):
        if name in result:
            raise r.fail(f"duplicate param name {name!r}")
        result[name] = _read_tensor(r, i, name)
    if r.pos != r.size:
        raise r.fail(f"{r.size - r.pos} unexpected trailing bytes after the last tensor")
    return result


def load_param_dict(data: bytes | bytearray | memoryview | str | os.PathLike) -> dict[str, NDArray]:
    """Load a params dict from bytes or from a file path.

    Parameters
    ----------
    data : bytes, bytearray, memoryview, str or os.PathLike
        Serialized params, or the path of a params file (a ``str`` is always a path).

    Returns
    -------
    dict of str to NDArray
        CPU arrays (64-byte aligned), in file order.

    Raises
    ------
    FormatError
        If the data is truncated, has a wrong magic, mismatched counts, an ``nbytes`` that
        does not match shape x dtype, an unknown dtype, or trailing bytes.
    KilnFileNotFoundError
        If a path does not exist.
    """
    if isinstance(data, (str, os.PathLike)):
        return load_param_dict_from_file(data)
    if isinstance(data, (bytes, bytearray, memoryview)):
        view = memoryview(data).cast("B")
        return _load_stream(_MemStream(view), view.nbytes, "bytes")
    raise InputError(f"load_param_dict expects bytes or a path, got {type(data).__name__}")


def load_param_dict_from_file(path: str | os.PathLike) -> dict[str, NDArray]:
    """Load a params file written by :func:`save_param_dict_to_file` (or TVM).

    Tensor bytes are read from the file directly into aligned NDArray memory, so big weights
    are neither read into an intermediate buffer nor copied twice.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    dict of str to NDArray

    Raises
    ------
    KilnFileNotFoundError
        If the file does not exist.
    FormatError
        As :func:`load_param_dict`.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise KilnFileNotFoundError(f"params file not found: {os.fspath(path)!r}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        return _load_stream(f, size, os.fspath(path))
