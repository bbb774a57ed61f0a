"""Hand-made ``.tar`` archives for the loader tests (runtime, tar safety, ``kiln inspect``)."""

from __future__ import annotations

import io
import os
import tarfile


def write_tar(path: str | os.PathLike, members: dict[str, bytes]) -> str:
    """Write an uncompressed tar holding ``members`` (name -> bytes) and return its path."""
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def read_members(path: str | os.PathLike) -> dict[str, bytes]:
    """Every member of an uncompressed tar as name -> bytes."""
    with tarfile.open(path, "r:") as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
