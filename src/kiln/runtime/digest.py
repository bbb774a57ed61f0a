"""The content digest trailer of an exported ``.so``: integrity before ``dlopen``.

``export_library`` appends 48 bytes after the ELF image it linked::

    [ SHA-256 of the image : 32 bytes ][ image size : u64 little-endian ][ b"KILNSHA1" ]

The dynamic loader maps only what the ELF program headers name, so bytes after the image
are never read by it. ``load_module`` (and ``kiln inspect``) check the trailer before
anything else: a flipped, truncated or appended byte anywhere in the file becomes a
:class:`~kiln.runtime.errors.FormatError` instead of a crash inside ``dlopen``.

This is **integrity, not authenticity**: anyone who can write the file can recompute the
digest. A library is code; trust it like an executable (``docs/security.md``).
Imports the standard library only.
"""

from __future__ import annotations

import hashlib
import os
import struct

from .errors import FormatError

__all__ = ["TRAILER_MAGIC", "TRAILER_SIZE", "append_digest", "read_trailer", "verify_digest"]

TRAILER_MAGIC = b"KILNSHA1"
_TAIL = struct.Struct("<32sQ8s")
TRAILER_SIZE = _TAIL.size  # 48


def _sha256_prefix(path: str, nbytes: int) -> bytes:
    h = hashlib.sha256()
    left = nbytes
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise FormatError(f"{path}: file shrank while its digest was computed")
            h.update(chunk)
            left -= len(chunk)
    return h.digest()


def append_digest(path: str | os.PathLike) -> None:
    """Append the trailer to the file at ``path`` (whose whole content is the image)."""
    p = os.fspath(path)
    size = os.path.getsize(p)
    digest = _sha256_prefix(p, size)
    with open(p, "ab") as f:
        f.write(_TAIL.pack(digest, size, TRAILER_MAGIC))


def read_trailer(path: str | os.PathLike) -> tuple[bytes, int] | None:
    """``(digest, image size)`` from the trailer, or ``None`` when the file has none."""
    p = os.fspath(path)
    size = os.path.getsize(p)
    if size < TRAILER_SIZE:
        return None
    with open(p, "rb") as f:
        f.seek(size - TRAILER_SIZE)
        digest, image_size, magic = _TAIL.unpack(f.read(TRAILER_SIZE))
    if magic != TRAILER_MAGIC:
        return None
    return digest, image_size


def verify_digest(path: str | os.PathLike) -> int | None:
    """Check the trailer; return the image size, or ``None`` when there is no trailer.

    Raises
    ------
    FormatError
        If the trailer's size or digest does not match the bytes before it.
    """
    p = os.fspath(path)
    tr = read_trailer(p)
    if tr is None:
        return None
    want, image_size = tr
    size = os.path.getsize(p)
    if image_size != size - TRAILER_SIZE:
        raise FormatError(
            f"{p}: damaged library: its digest trailer records a {image_size}-byte image but "
            f"{size - TRAILER_SIZE} bytes precede it (truncated or appended to?)"
        )
    if _sha256_prefix(p, image_size) != want:
        raise FormatError(f"{p}: damaged library: SHA-256 of its content does not match its digest trailer "
                          "(corrupted in transfer or on disk; re-export or copy it again)")
    return image_size
