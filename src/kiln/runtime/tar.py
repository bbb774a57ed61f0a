"""Create, read and safely extract Kiln's uncompressed tar archives (standard library only).

Part of the runtime because ``load_module("model.tar")`` reads archives on the deployment
machine; also importable by its TVM name, :mod:`kiln.contrib.tar`.

A ``.tar`` library comes from whoever sent it, so reading one is hardened before any byte is
written to disk (see ``docs/security.md``):

* only **uncompressed** POSIX/GNU tar is accepted: the file must carry the ``ustar`` magic at
  offset 257 and is opened with mode ``"r:"``, so a small gzip/bzip2/xz "decompression bomb"
  named ``.tar`` is a :class:`~kiln.runtime.errors.FormatError`, not gigabytes on disk;
* the member headers are walked first and counted against two caps, **before** anything is
  extracted: at most :data:`DEFAULT_MAX_MEMBERS` members (``$KILN_TAR_MAX_MEMBERS``) and
  :data:`DEFAULT_MAX_BYTES` bytes in all (``$KILN_TAR_MAX_BYTES``);
* members must be regular, non-sparse files with plain names (the archive is flat): paths,
  absolute names, ``..``, names over 255 bytes, duplicates, links, devices and sparse files
  (whose declared size can exceed the archive) are rejected.
"""

from __future__ import annotations

import os
import tarfile
from typing import Iterator, Sequence

from .errors import FormatError, InputError, KilnError, KilnFileNotFoundError

__all__ = ["tar", "untar", "open_archive", "looks_like_tar", "SafeArchive", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_MEMBERS"]

#: Default cap on the summed size of an archive's members (2 GiB; a model's weights live here).
DEFAULT_MAX_BYTES = 2 << 30
#: Default cap on the number of members (a library has a handful: sources, crt, blob, manifest).
DEFAULT_MAX_MEMBERS = 1024

_USTAR_OFFSET = 257
_MAX_NAME_BYTES = 255  # NAME_MAX of common file systems
_COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


def tar(output: str | os.PathLike, files: Sequence[str | os.PathLike]) -> None:
    """Write ``files`` (flat, by base name) into the uncompressed tar archive ``output``.

    Raises
    ------
    FormatError
        If two inputs share a base name (the archive is flat).
    """
    names: set[str] = set()
    with tarfile.open(os.fspath(output), "w") as tf:
        for f in files:
            base = os.path.basename(os.fspath(f))
            if base in names:
                raise FormatError(f"tar: duplicate file name {base!r} in {output}")
            names.add(base)
            tf.add(os.fspath(f), arcname=base, recursive=False)


tar.output_format = "tar"  # type: ignore[attr-defined]


def _env_cap(var: str, default: int) -> int:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"${var}={raw!r}: expected a positive integer") from None
    if value <= 0:
        raise InputError(f"${var}={raw!r}: expected a positive integer")
    return value


def _check_magic(path: str) -> None:
    with open(path, "rb") as f:
        head = f.read(512)
    for magic, kind in _COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            raise FormatError(
                f"{path}: not a valid tar archive: it is {kind}-compressed; Kiln libraries are "
                "uncompressed tar (see docs/library_format.md)"
            )
    if len(head) < 512 or head[_USTAR_OFFSET : _USTAR_OFFSET + 5] != b"ustar":
        raise FormatError(f"{path}: not a valid tar archive (no 'ustar' header magic at offset {_USTAR_OFFSET})")


def looks_like_tar(path: str | os.PathLike) -> bool:
    """Whether the file starts with an uncompressed tar header (``ustar`` magic); never raises."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return len(head) == 512 and head[_USTAR_OFFSET : _USTAR_OFFSET + 5] == b"ustar"


def _check_member(path: str, m: tarfile.TarInfo) -> None:
    name = m.name
    if m.isdir() and name.rstrip("/") in ("", "."):
        return
    # Kiln archives are flat: a member is a plain file name (no directories, no "..").
    if (not name or "/" in name or "\\" in name or "\0" in name or name in (".", "..")
            or len(name.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES):
        raise FormatError(f"{path}: unsafe member name {name!r} in tar archive "
                          f"(expected a plain file name of at most {_MAX_NAME_BYTES} bytes)")
    if m.isdir():
        return
    if not m.isfile():
        raise FormatError(f"{path}: member {name!r} is not a regular file")
    if m.issparse():
        raise FormatError(f"{path}: member {name!r} is a sparse file (not allowed in a Kiln archive)")


class SafeArchive:
    """An open, validated archive: :attr:`members` are its regular files, in archive order.

    Use :func:`open_archive`; read members with :meth:`read` or :meth:`extract_to`.
    """

    def __init__(self, path: str, tf: tarfile.TarFile, members: list[tarfile.TarInfo]) -> None:
        self.path = path
        self._tf = tf
        self.members = members
        self._by_name = {m.name: m for m in members}

    def names(self) -> list[str]:
        """Member names (regular files only)."""
        return [m.name for m in self.members]

    def size_of(self, name: str) -> int | None:
        """Size in bytes of member ``name``, or ``None`` when absent."""
        m = self._by_name.get(name)
        return None if m is None else int(m.size)

    def read(self, name: str) -> bytes:
        """Content of member ``name``; FormatError if absent or unreadable."""
        m = self._by_name.get(name)
        fh = self._tf.extractfile(m) if m is not None else None
        if m is None or fh is None:
            raise FormatError(f"{self.path}: archive has no member {name!r}")
        with fh:
            data = fh.read()
        if len(data) != m.size:
            raise FormatError(f"{self.path}: member {name!r} is truncated ({len(data)} of {m.size} bytes)")
        return data

    def extract_to(self, directory: str) -> list[str]:
        """Write every member into ``directory`` (which must exist); returns the names.

        Names are plain file names (checked when the archive was opened), so every file
        lands directly in ``directory``.
        """
        dest = os.path.realpath(directory)
        out = []
        for m in self.members:
            target = os.path.join(dest, m.name)
            src = self._tf.extractfile(m)
            if src is None:
                raise FormatError(f"{self.path}: cannot read member {m.name!r}")
            written = 0
            # O_EXCL | O_NOFOLLOW: never overwrite an existing file or write through a link.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with src, os.fdopen(fd, "wb") as dst:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    written += len(chunk)
                    dst.write(chunk)
            if written != m.size:
                raise FormatError(f"{self.path}: member {m.name!r} is truncated ({written} of {m.size} bytes)")
            out.append(m.name)
        return out


class _Opened:
    def __init__(self, path: str) -> None:
        self.path = path
        self._tf: tarfile.TarFile | None = None

    def __enter__(self) -> SafeArchive:
        path = self.path
        if not os.path.exists(path):
            raise KilnFileNotFoundError(f"no such file: {path}")
        max_members = _env_cap("KILN_TAR_MAX_MEMBERS", DEFAULT_MAX_MEMBERS)
        max_bytes = _env_cap("KILN_TAR_MAX_BYTES", DEFAULT_MAX_BYTES)
        try:
            _check_magic(path)
            file_size = os.path.getsize(path)
            self._tf = tf = tarfile.open(path, "r:")
            members: list[tarfile.TarInfo] = []
            seen: set[str] = set()
            count = total = 0
            # Walk the headers one by one so the caps stop a hostile archive early.
            for m in _iter_headers(tf):
                count += 1
                if count > max_members:
                    raise FormatError(f"{path}: more than {max_members} members in the archive "
                                      "(limit $KILN_TAR_MAX_MEMBERS)")
                _check_member(path, m)
                if m.isdir():
                    continue
                if m.offset_data + m.size > file_size:  # uncompressed: data lies in the file
                    raise FormatError(f"{path}: member {m.name!r} declares {m.size} bytes, past the end "
                                      f"of the archive ({file_size} bytes): truncated or corrupt")
                total += m.size
                if total > max_bytes:
                    raise FormatError(f"{path}: members add up to more than {max_bytes} bytes "
                                      "(limit $KILN_TAR_MAX_BYTES)")
                if m.name in seen:
                    raise FormatError(f"{path}: member {m.name!r} appears twice in the archive")
                seen.add(m.name)
                members.append(m)
        except KilnError:
            self.__exit__()
            raise
        # tarfile reports some malformed headers as ValueError / OverflowError (a huge size field)
        except (tarfile.TarError, EOFError, OSError, ValueError, OverflowError) as err:
            self.__exit__()
            if isinstance(err, FileNotFoundError) and not os.path.exists(path):
                raise KilnFileNotFoundError(f"no such file: {path}") from err
            raise FormatError(f"{path}: not a valid tar archive ({err})") from err
        except BaseException:
            self.__exit__()
            raise
        return SafeArchive(path, tf, members)

    def __exit__(self, *exc: object) -> None:
        if self._tf is not None:
            self._tf.close()
            self._tf = None


def _iter_headers(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while True:
        m = tf.next()
        if m is None:
            return
        yield m


def open_archive(path: str | os.PathLike) -> _Opened:
    """Open an uncompressed tar for reading, checking magic, caps and member names first.

    Use as ``with open_archive(p) as arch: data = arch.read("kiln_manifest.json")``. Errors
    while reading members inside the block are the caller's to convert (``tarfile.TarError``,
    ``OSError``).

    Raises
    ------
    KilnFileNotFoundError
        If ``path`` does not exist.
    FormatError
        If the file is compressed, not a tar, over a cap, or holds an unsafe member.
    """
    return _Opened(os.fspath(path))


def untar(path: str | os.PathLike, directory: str | os.PathLike) -> list[str]:
    """Extract the regular files of ``path`` into ``directory`` (see the module docstring).

    Returns
    -------
    list of str
        The member names extracted.

    Raises
    ------
    KilnFileNotFoundError
        If ``path`` does not exist.
    FormatError
        If the file is not an uncompressed tar archive, exceeds a cap or holds an unsafe member.
    """
    path = os.fspath(path)
    with open_archive(path) as arch:
        try:
            return arch.extract_to(os.fspath(directory))
        except KilnError:
            raise
        except (tarfile.TarError, EOFError, ValueError, OverflowError) as err:
            raise FormatError(f"{path}: not a valid tar archive ({err})") from err
