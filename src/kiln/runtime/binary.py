"""Little-endian binary reading and writing: the one reader every Kiln file format uses.

Owns :class:`Reader` (bounds-checked decoding) and :class:`Writer` (the matching encoder).
Params files, the module blob, the executor-factory payload and the device-module payloads
are all sequences of the same few primitives — fixed-width integers, raw bytes, and
``u64 length + bytes`` fields — so they are read and written here, once.

Rules the reader keeps, so that a corrupt or hostile file can only ever raise
:class:`~kiln.runtime.errors.FormatError`:

* every read checks the bytes that remain before touching them;
* every count (``count``, ``u64_vector``) is checked against the bytes that remain *before*
  anything is allocated for it, so a count of 2**62 fails at once instead of exhausting memory;
* every error names the source (``where``) and the byte offset:
  ``"<where> at offset <n>: <what went wrong>"``.

This module imports only the standard library and :mod:`kiln.runtime.errors`.
"""

from __future__ import annotations

import struct
from typing import Protocol, Sequence

from .errors import FormatError, InputError

__all__ = ["Reader", "Writer", "BinaryFile"]

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")

Buffer = bytes | bytearray | memoryview


class BinaryFile(Protocol):
    """What :class:`Reader` needs of a file: sequential ``read`` and ``readinto``."""

    def read(self, n: int, /) -> bytes: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class Reader:
    """Bounds-checked little-endian reader over a byte buffer or a binary file.

    Parameters
    ----------
    source : bytes, bytearray, memoryview or binary file
        The data. A buffer is read without copying it; a file (anything with ``read`` and
        ``readinto``) is read sequentially from its current position, which lets
        :meth:`read_into` move large tensors straight from disk into their destination.
    where : str
        Names the data in every error message (``"module blob"``, ``"params file 'w.params'"``).
    size : int, optional
        Number of bytes available; required for a file, defaults to the buffer length.

    Attributes
    ----------
    pos : int
        Offset of the next byte to read.
    size : int
        Total number of bytes.
    where : str

    Examples
    --------
    >>> r = Reader(b"\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00hi", "example")
    >>> r.string("greeting")
    'hi'
    >>> r.expect_end("the greeting")
    """

    def __init__(self, source: Buffer | BinaryFile, where: str, size: int | None = None) -> None:
        self.where = where
        self.pos = 0
        self._view: memoryview | None
        self._file: BinaryFile | None
        if isinstance(source, (bytes, bytearray, memoryview)):
            self._view, self._file = memoryview(source).cast("B"), None
            self.size = self._view.nbytes if size is None else size
            if self.size > self._view.nbytes:
                raise InputError(f"Reader: size {self.size} exceeds the buffer's {self._view.nbytes} bytes")
        else:
            if size is None:
                raise InputError("Reader: a file source needs its size")
            self._view, self._file, self.size = None, source, size

    # ---- errors and bounds ---------------------------------------------------------------
    @property
    def remaining(self) -> int:
        """Bytes left after :attr:`pos`."""
        return self.size - self.pos

    def error(self, msg: str, at: int | None = None) -> FormatError:
        """A :class:`FormatError` ``"<where> at offset <at>: <msg>"`` (``at`` defaults to :attr:`pos`).

        Returned, not raised, so callers write ``raise r.error(...)`` and linters see the raise.
        """
        return FormatError(f"{self.where} at offset {self.pos if at is None else at}: {msg}")

    def need(self, n: int, what: str) -> None:
        """Raise unless ``n`` more bytes of ``what`` remain (call before allocating for them)."""
        if n > self.size - self.pos:
            raise self.error(f"truncated: expected {n} bytes of {what}, only {self.size - self.pos} left")

    # ---- raw bytes -----------------------------------------------------------------------
    def raw(self, n: int, what: str) -> bytes:
        """The next ``n`` bytes (a copy), for ``what``."""
        self.need(n, what)
        if self._view is not None:
            data = self._view[self.pos : self.pos + n].tobytes()
        else:
            assert self._file is not None
            data = self._file.read(n)
            if len(data) != n:  # the file shrank under us
                raise self.error(f"truncated: expected {n} bytes of {what}, got {len(data)}")
        self.pos += n
        return data

    def view(self, n: int, what: str) -> memoryview:
        """The next ``n`` bytes without copying (buffer sources only; a file gets a fresh copy)."""
        if self._view is None:
            return memoryview(self.raw(n, what))
        self.need(n, what)
        out = self._view[self.pos : self.pos + n]
        self.pos += n
        return out

    def read_into(self, dst: memoryview, what: str) -> None:
        """Fill ``dst`` (a writable byte view) with the next ``dst.nbytes`` bytes: one copy."""
        n = dst.nbytes
        self.need(n, what)
        if self._view is not None:
            dst[:] = self._view[self.pos : self.pos + n]
        else:
            assert self._file is not None
            got = self._file.readinto(dst)
            if got != n:
                raise self.error(f"truncated: expected {n} bytes of {what}, got {got}")
        self.pos += n

    # ---- fixed-width integers ------------------------------------------------------------
    def unpack(self, layout: struct.Struct, what: str) -> tuple[int, ...]:
        """Read one record of the given ``struct`` layout (which must be little-endian)."""
        return layout.unpack(self.raw(layout.size, what))

    def u8(self, what: str) -> int:
        """One unsigned byte."""
        return self.unpack(_U8, what)[0]

    def u16(self, what: str) -> int:
        """A little-endian ``uint16``."""
        return self.unpack(_U16, what)[0]

    def u32(self, what: str) -> int:
        """A little-endian ``uint32``."""
        return self.unpack(_U32, what)[0]

    def u64(self, what: str) -> int:
        """A little-endian ``uint64``."""
        return self.unpack(_U64, what)[0]

    def i32(self, what: str) -> int:
        """A little-endian ``int32``."""
        return self.unpack(_I32, what)[0]

    def i64(self, what: str) -> int:
        """A little-endian ``int64``."""
        return self.unpack(_I64, what)[0]

    # ---- composite fields ----------------------------------------------------------------
    def count(self, what: str, min_item_bytes: int = 1) -> int:
        """A ``u64`` item count, checked against the bytes left.

        Parameters
        ----------
        what : str
            Names the count (``"function count"``).
        min_item_bytes : int
            The fewest bytes one item can take; ``count * min_item_bytes`` must fit in what
            remains, so a corrupt count fails here rather than in a huge allocation or loop.
        """
        at = self.pos
        n = self.u64(what)
        if n * min_item_bytes > self.size - self.pos:
            raise self.error(f"{what} {n} cannot fit in the {self.size - self.pos} bytes left", at)
        return n

    def sized_bytes(self, what: str) -> bytes:
        """A ``u64`` length followed by that many bytes."""
        return self.raw(self.u64(f"length of {what}"), what)

    def string(self, what: str) -> str:
        """A ``u64`` length followed by that many bytes of UTF-8 text."""
        at = self.pos
        data = self.sized_bytes(what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.error(f"{what} is not valid UTF-8 ({err.reason} at byte {err.start})", at) from None

    def u64_vector(self, what: str) -> list[int]:
        """A ``u64`` count followed by that many ``u64`` values."""
        n = self.count(f"{what} length", 8)
        return list(self.unpack(struct.Struct(f"<{n}Q"), what))

    def expect_end(self, after: str) -> None:
        """Raise if bytes remain after the last field (``after`` names it, for the message)."""
        if self.pos != self.size:
            raise self.error(f"{self.size - self.pos} unexpected trailing bytes after {after}")


class Writer:
    """Little-endian encoder: the counterpart of :class:`Reader`, field for field.

    Examples
    --------
    >>> w = Writer()
    >>> w.string("hi")
    >>> w.getvalue()
    b'\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00hi'
    """

    def __init__(self) -> None:
        self._parts: list[bytes | memoryview] = []
        # Kept as we go so a caller can size a record (a length prefix, a section) without
        # joining what may be hundreds of megabytes of tensor data.
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        """Number of bytes written so far."""
        return self._nbytes

    def raw(self, data: Buffer) -> None:
        """Append bytes as they are (a memoryview is not copied until :meth:`getvalue`).

        A ``bytearray`` is copied now, because its owner may change it before the value is
        used; ``bytes`` and ``memoryview`` are kept by reference (a memoryview's owner must
        leave it unchanged until the writer's output has been consumed).
        """
        if isinstance(data, memoryview):
            part: bytes | memoryview = data if data.format == "B" and data.ndim == 1 else data.cast("B")
        elif isinstance(data, bytes):
            part = data
        else:
            part = bytes(data)
        self._parts.append(part)
        self._nbytes += len(part)

    def pack(self, layout: struct.Struct, *values: int) -> None:
        """Append one record of the given ``struct`` layout."""
        self._parts.append(layout.pack(*values))
        self._nbytes += layout.size

    def u8(self, v: int) -> None:
        """One unsigned byte."""
        self.pack(_U8, v)

    def u16(self, v: int) -> None:
        """A little-endian ``uint16``."""
        self.pack(_U16, v)

    def u32(self, v: int) -> None:
        """A little-endian ``uint32``."""
        self.pack(_U32, v)

    def u64(self, v: int) -> None:
        """A little-endian ``uint64``."""
        self.pack(_U64, v)

    def i32(self, v: int) -> None:
        """A little-endian ``int32``."""
        self.pack(_I32, v)

    def i64(self, v: int) -> None:
        """A little-endian ``int64``."""
        self.pack(_I64, v)

    def sized_bytes(self, data: Buffer) -> None:
        """A ``u64`` length followed by the bytes."""
        self.u64(memoryview(data).nbytes)
        self.raw(data)

    def string(self, text: str) -> None:
        """A ``u64`` length followed by the UTF-8 encoding of ``text``."""
        self.sized_bytes(text.encode("utf-8"))

    def u64_vector(self, values: Sequence[int]) -> None:
        """A ``u64`` count followed by the values as ``u64``."""
        self.u64(len(values))
        self._parts.append(struct.pack(f"<{len(values)}Q", *values))
        self._nbytes += 8 * len(values)

    def chunks(self) -> list[bytes | memoryview]:
        """The pieces written so far, uncopied (to stream a large record to a file).

        Each piece is ``bytes`` or a 1-D byte ``memoryview``; together they are
        :attr:`nbytes` long.
        """
        return list(self._parts)

    def getvalue(self) -> bytes:
        """Everything written, as one ``bytes``."""
        return b"".join(self._parts)
