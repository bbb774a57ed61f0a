"""Create and safely extract tar archives (standard library only)."""

from __future__ import annotations

import os
import tarfile
from typing import Sequence

from ..runtime.errors import FormatError, KilnFileNotFoundError

__all__ = ["tar", "untar"]


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


def untar(path: str | os.PathLike, directory: str | os.PathLike) -> list[str]:
    """Extract regular files of ``path`` into ``directory``.

    Absolute member names, ``..`` components, links and device files are rejected, so a
    hostile archive cannot write outside ``directory``.

    Returns
    -------
    list of str
        The member names extracted.

    Raises
    ------
    KilnFileNotFoundError
        If ``path`` does not exist.
    FormatError
        If the file is not a readable tar archive or holds an unsafe member.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise KilnFileNotFoundError(f"no such file: {path}")
    dest = os.path.realpath(os.fspath(directory))
    extracted: list[str] = []
    try:
        with tarfile.open(path, "r:*") as tf:
            members = tf.getmembers()
            for m in members:
                name = m.name
                parts = name.replace("\\", "/").split("/")
                if os.path.isabs(name) or name.startswith("/") or ".." in parts:
                    raise FormatError(f"{path}: unsafe member name {name!r} in tar archive")
                if m.isdir():
                    continue
                if not m.isfile():
                    raise FormatError(f"{path}: member {name!r} is not a regular file")
                target = os.path.realpath(os.path.join(dest, name))
                if not target.startswith(dest + os.sep):
                    raise FormatError(f"{path}: member {name!r} escapes the extraction directory")
            for m in members:
                if m.isdir():
                    continue
                target = os.path.join(dest, m.name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tf.extractfile(m)
                if src is None:
                    raise FormatError(f"{path}: cannot read member {m.name!r}")
                with src, open(target, "wb") as out:
                    while True:
                        chunk = src.read(1 << 20)
                        if not chunk:
                            break
                        out.write(chunk)
                extracted.append(m.name)
    except (tarfile.TarError, EOFError, OSError) as err:
        if isinstance(err, FileNotFoundError) and not os.path.exists(path):
            raise KilnFileNotFoundError(f"no such file: {path}") from err
        raise FormatError(f"{path}: not a valid tar archive ({err})") from err
    return extracted
