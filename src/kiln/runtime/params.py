"""Params files: a binary dict of named tensors, byte-compatible with TVM's ``save_param_dict``.

Layout (all little-endian; see ``docs/params_format.md``)::

    u64 0xF7E58D4F05049CB7          list magic
    u64 version                     0 (1 when a string tensor follows)
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

String tensors (dtype ``"string"``) use a record of their own (magic
``STRING_TENSOR_MAGIC``, the same header with DLDataType (3, 64, 1), then ``i64 nbytes`` and per
element a ``u64`` length and that many UTF-8 bytes); a file holding one says so with format
version 1 in the list header's second ``u64``. Files without strings are version 0, byte for
byte what they always were (and what TVM reads).

Loading never trusts a length before checking it against the bytes that remain, so corrupt
input raises :class:`FormatError` (with the offset and what was expected) instead of
allocating absurd amounts of memory or crashing (all reading goes through
:class:`kiln.runtime.binary.Reader`). Tensor data is read straight into the
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
from .binary import Reader, Writer
from .errors import InputError, KilnFileNotFoundError
from .ndarray import NDArray, empty

__all__ = [
    "PARAMS_LIST_MAGIC",
    "TENSOR_MAGIC",
    "STRING_TENSOR_MAGIC",
    "FORMAT_VERSION",
    "save_param_dict",
    "save_param_dict_chunks",
    "load_param_dict",
    "save_param_dict_to_file",
    "load_param_dict_from_file",
]

#: First u64 of a params file.
PARAMS_LIST_MAGIC = 0xF7E58D4F05049CB7
#: First u64 of every tensor record.
TENSOR_MAGIC = 0xDD5E40F096B4A13F
#: First u64 of a string tensor record (format version 1).
STRING_TENSOR_MAGIC = 0xDD5E40F096B4A140
#: Highest format version this reader understands (the list header's second u64): 0 = numeric
#: tensors only (TVM's format), 1 = string tensor records too.
FORMAT_VERSION = 1

# tensor magic, reserved, device type, device id, ndim, dtype code, bits, lanes
_TENSOR_HEAD = struct.Struct("<QQiiiBBH")
_MAX_NDIM = 64  # far above any real tensor; guards against reading garbage as a shape


# --------------------------------------------------------------------------- saving
def _as_host_array(name: Any, value: Any) -> tuple[np.ndarray, str]:
    if not isinstance(name, str):
        raise InputError(f"param names must be str, got {type(name).__name__} ({name!r})")
    if isinstance(value, NDArray) and value.dtype == _dt.STRING:
        return value.numpy(), _dt.STRING
    if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
        from .strings import to_string_array

        return to_string_array(value, f"param {name!r}"), _dt.STRING
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
    w = Writer()
    w.u64(PARAMS_LIST_MAGIC)
    # version 0 unless a string record needs 1: numeric-only files stay readable by TVM
    w.u64(1 if any(dt == _dt.STRING for _, _, dt in items) else 0)
    w.u64(len(items))
    for name, _, _ in items:
        w.string(name)
    w.u64(len(items))
    yield w.getvalue()
    for name, arr, dt in items:
        if dt == _dt.STRING:
            yield _string_record(name, arr)
            continue
        dl = _dt.to_dl(dt)
        w = Writer()
        w.pack(_TENSOR_HEAD, TENSOR_MAGIC, 0, 1, 0, arr.ndim, dl.code, dl.bits, dl.lanes)
        for d in arr.shape:
            w.i64(d)
        w.i64(arr.nbytes)
        yield w.getvalue()
        if arr.nbytes:
            yield memoryview(arr.reshape(-1).view(np.uint8))


def _string_record(name: str, arr: np.ndarray) -> bytes:
    dl = _dt.to_dl(_dt.STRING)
    body = Writer()
    for i, text in enumerate(arr.reshape(-1)):
        try:
            body.string(text)
        except UnicodeEncodeError as err:
            raise InputError(f"param {name!r}: element {i} cannot be encoded as UTF-8 ({err.reason})") from None
    w = Writer()
    w.pack(_TENSOR_HEAD, STRING_TENSOR_MAGIC, 0, 1, 0, arr.ndim, dl.code, dl.bits, dl.lanes)
    for d in arr.shape:
        w.i64(d)
    w.i64(body.nbytes)
    return w.getvalue() + body.getvalue()


def _read_string_tensor(r: Reader, what: str, start: int, ndim: int, code: int, bits: int, lanes: int) -> NDArray:
    dl = _dt.to_dl(_dt.STRING)
    if (code, bits, lanes) != (dl.code, dl.bits, dl.lanes):
        raise r.error(f"{what}: a string record must have DLDataType ({dl.code}, {dl.bits}, {dl.lanes}), "
                      f"got ({code}, {bits}, {lanes})", start)
    shape_at = r.pos
    shape = r.unpack(struct.Struct(f"<{ndim}q"), f"{what} shape")
    if any(d < 0 for d in shape):
        raise r.error(f"{what}: negative dimension in shape {shape}", shape_at)
    nbytes_at = r.pos
    nbytes = r.i64(f"{what} nbytes")
    n = math.prod(shape)
    if nbytes < 0 or n > nbytes // 8:  # every element takes at least its 8-byte length
        raise r.error(f"{what}: nbytes {nbytes} cannot hold {n} strings of shape {shape}", nbytes_at)
    r.need(nbytes, f"{what} data")
    begin = r.pos
    objs = np.empty(n, dtype=object)
    for i in range(n):
        objs[i] = r.string(f"{what} element {i}")
    if r.pos - begin != nbytes:
        raise r.error(f"{what}: nbytes is {nbytes} but its strings take {r.pos - begin}", nbytes_at)
    out = empty(shape, _dt.STRING)
    out.copyfrom(objs.reshape(shape))
    return out


def save_param_dict_chunks(params: Mapping[str, NDArray | np.ndarray]) -> list[bytes | memoryview]:
    """Serialize a dict of named tensors as a list of buffers, without joining them.

    The concatenation of the buffers is exactly :func:`save_param_dict`'s output. Tensor
    data is not copied: each tensor contributes a byte ``memoryview`` of its host memory,
    so writing a model's weights into a file or a library section costs one copy (the
    write) instead of three (join, length prefix, section assembly).

    Parameters
    ----------
    params : dict of str to NDArray or numpy.ndarray
        As for :func:`save_param_dict`. The arrays must not be modified until the
        returned buffers have been consumed.

    Returns
    -------
    list of bytes or memoryview
        1-D byte buffers, in file order.

    Raises
    ------
    InputError
        For non-str names, non-array values or unsupported dtypes.
    """
    return list(_iter_chunks(params))


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
def _where(source: str) -> str:
    return f"invalid params data ({source})"


def _read_tensor(r: Reader, index: int, name: str, version: int = 0) -> NDArray:
    start = r.pos
    what = f"tensor #{index} ({name!r})"
    magic, _reserved, dev_type, dev_id, ndim, code, bits, lanes = r.unpack(_TENSOR_HEAD, f"{what} header")
    if magic == STRING_TENSOR_MAGIC and version >= 1 and dev_type == 1 and 0 <= ndim <= _MAX_NDIM:
        return _read_string_tensor(r, what, start, ndim, code, bits, lanes)
    if magic != TENSOR_MAGIC:
        raise r.error(f"{what}: bad tensor magic 0x{magic:016X}, expected 0x{TENSOR_MAGIC:016X}", start)
    if dev_type != 1:
        raise r.error(f"{what}: device type {dev_type} (id {dev_id}); params are always stored as CPU (1)", start)
    if not 0 <= ndim <= _MAX_NDIM:
        raise r.error(f"{what}: ndim {ndim} out of range 0..{_MAX_NDIM}", start)
    try:
        dt = _dt.from_dl(code, bits, lanes)
    except InputError:
        raise r.error(
            f"{what}: unknown dtype (code={code}, bits={bits}, lanes={lanes}); "
            f"supported: {', '.join(_dt.SUPPORTED)}",
            start,
        ) from None
    shape_at = r.pos
    shape = r.unpack(struct.Struct(f"<{ndim}q"), f"{what} shape")
    if any(d < 0 for d in shape):
        raise r.error(f"{what}: negative dimension in shape {shape}", shape_at)
    # NumPy, and so every host view of an NDArray, refuses a shape whose non-zero dims span
    # more than sys.maxsize bytes even when a zero dim makes the tensor empty: no real file
    # holds one, so it is corrupt (and must not become an NDArray that fails on first use).
    extent = math.prod(d for d in shape if d) * _dt.itemsize(dt)
    if extent > sys.maxsize:
        raise r.error(f"{what}: shape {shape} of {dt} is too large to address (over {sys.maxsize} bytes)", shape_at)
    nbytes_at = r.pos
    nbytes = r.i64(f"{what} nbytes")
    expected = math.prod(shape) * _dt.itemsize(dt)
    if nbytes != expected:
        raise r.error(f"{what}: nbytes is {nbytes} but shape {shape} of {dt} needs {expected}", nbytes_at)
    r.need(nbytes, f"{what} data")  # before allocating: never trust a size we cannot back
    out = empty(shape, dt)
    if nbytes:
        dst = out.numpy(copy=False).reshape(-1).view(np.uint8)
        r.read_into(memoryview(dst), f"{what} data")
        if sys.byteorder != "little":  # pragma: no cover - the file is little-endian
            dst.view(_dt.np_dtype(dt)).byteswap(inplace=True)
    return out


def _load(r: Reader) -> dict[str, NDArray]:
    magic = r.u64("list magic")
    if magic != PARAMS_LIST_MAGIC:
        raise r.error(f"bad magic 0x{magic:016X}, expected params list magic 0x{PARAMS_LIST_MAGIC:016X}", 0)
    at = r.pos
    version = r.u64("format version")  # 0: TVM's format; 1: string tensor records may follow
    if version > FORMAT_VERSION:
        raise r.error(f"params format version {version} is newer than this reader's {FORMAT_VERSION}; "
                      "load it with a newer Kiln", at)
    n_names = r.count("name count", 8)  # every name takes at least its 8-byte length
    names = [r.string(f"name #{i}") for i in range(n_names)]
    at = r.pos
    n_tensors = r.u64("tensor count")
    if n_tensors != n_names:
        raise r.error(f"{n_names} names but {n_tensors} tensors; the counts must match", at)
    result: dict[str, NDArray] = {}
    for i, name in enumerate(names):
        if name in result:
            raise r.error(f"duplicate param name {name!r}")
        result[name] = _read_tensor(r, i, name, version)
    r.expect_end("the last tensor")
    return result


def load_param_dict(
    data: bytes | bytearray | memoryview | str | os.PathLike, *, where: str | None = None
) -> dict[str, NDArray]:
    """Load a params dict from bytes or from a file path.

    Parameters
    ----------
    data : bytes, bytearray, memoryview, str or os.PathLike
        Serialized params, or the path of a params file (a ``str`` is always a path).
    where : str, optional
        Names the data in error messages (default: ``"bytes"`` or the path), e.g. the file
        and section that embeds the params.

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
        return load_param_dict_from_file(data, where=where)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return _load(Reader(data, _where(where or "bytes")))
    raise InputError(f"load_param_dict expects bytes or a path, got {type(data).__name__}")


def load_param_dict_from_file(path: str | os.PathLike, *, where: str | None = None) -> dict[str, NDArray]:
    """Load a params file written by :func:`save_param_dict_to_file` (or TVM).

    Tensor bytes are read from the file directly into aligned NDArray memory, so big weights
    are neither read into an intermediate buffer nor copied twice.

    Parameters
    ----------
    path : str or os.PathLike
    where : str, optional
        Names the file in error messages (default: the path).

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
        return _load(Reader(f, _where(where or os.fspath(path)), size))
