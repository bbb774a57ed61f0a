"""On-disk compile cache for generated code (C → .so, LLVM IR → .o, .o → .so).

An entry is keyed by a SHA-256 over everything that determines the bytes produced: the
source text, the target string, the compiler command and flags, the Kiln crt and header,
and the Kiln version.  Entries live under ``$KILN_CACHE_DIR`` (default ``~/.cache/kiln``);
``KILN_CACHE=0`` disables the cache.

Robustness: an entry is written to a temporary file and ``os.replace``-d into place (atomic
on POSIX), and a sidecar ``.sha256`` of its content is checked on every hit, so a truncated
or corrupted entry is ignored (and rebuilt) rather than loaded.

:data:`stats` counts hits and misses (tests use it to see that a rebuild did not compile);
the logger ``kiln.codegen.cache`` reports each at DEBUG level.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import tempfile
import threading
from typing import Callable, Iterable, Sequence

__all__ = ["cache_dir", "cache_enabled", "make_key", "cached_file", "build_shared", "stats", "reset_stats"]

log = logging.getLogger("kiln.codegen.cache")

#: ``{"hits": int, "misses": int}`` since process start (or :func:`reset_stats`).
stats: dict[str, int] = {"hits": 0, "misses": 0}
_lock = threading.Lock()


def reset_stats() -> None:
    """Zero the hit / miss counters."""
    with _lock:
        stats["hits"] = 0
        stats["misses"] = 0


def cache_enabled() -> bool:
    """False when ``KILN_CACHE`` is ``0`` / ``false`` / ``off``."""
    return os.environ.get("KILN_CACHE", "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> str:
    """``$KILN_CACHE_DIR`` or ``~/.cache/kiln`` (created on demand)."""
    d = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    return os.path.abspath(d)


def _kiln_version() -> str:
    from .. import __version__

    return __version__


def make_key(*parts: str | bytes) -> str:
    """SHA-256 hex digest of ``parts`` plus the Kiln version (parts are length-prefixed)."""
    h = hashlib.sha256()
    for p in (_kiln_version(), *parts):
        b = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _digest_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _valid(path: str) -> bool:
    try:
        with open(path + ".sha256", "r", encoding="ascii") as f:
            want = f.read().strip()
        return bool(want) and _digest_file(path) == want
    except OSError:
        return False


def _atomic_write_text(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp_")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        _silent_remove(tmp)
        raise


def _silent_remove(p: str) -> None:
    try:
        os.remove(p)
    except OSError:
        pass


def cached_file(key: str, ext: str, produce: Callable[[str], None], what: str = "entry") -> str:
    """Path of the cache entry ``key``, calling ``produce(tmp_path)`` to build it on a miss.

    Parameters
    ----------
    key : str
        From :func:`make_key`.
    ext : str
        File extension of the entry (``"so"``, ``"o"``).
    produce : callable
        Writes the entry's content to the path it is given.
    what : str
        Description for the log.

    Returns
    -------
    str
        Absolute path of a valid entry.  When the cache is disabled or its directory is not
        writable, the entry is built in a fresh temporary directory instead.
    """
    if not cache_enabled():
        return _uncached(ext, produce)
    d = os.path.join(cache_dir(), key[:2])
    path = os.path.join(d, f"{key}.{ext}")
    if os.path.exists(path) and _valid(path):
        with _lock:
            stats["hits"] += 1
        log.debug("cache hit %s: %s", what, path)
        return path
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp_", suffix=f".{ext}")
        os.close(fd)
    except OSError as err:
        log.warning("compile cache %s is not usable (%s); compiling without it", d, err)
        return _uncached(ext, produce)
    try:
        produce(tmp)
        digest = _digest_file(tmp)
        os.replace(tmp, path)  # entry first, then its checksum: a reader never validates a partial file
        _atomic_write_text(path + ".sha256", digest + "\n")
    except BaseException:
        _silent_remove(tmp)
        raise
    with _lock:
        stats["misses"] += 1
    log.debug("cache miss %s: built %s", what, path)
    return path


def _uncached(ext: str, produce: Callable[[str], None]) -> str:
    d = tempfile.mkdtemp(prefix="kiln_nocache_")
    path = os.path.join(d, f"entry.{ext}")
    produce(path)
    with _lock:
        stats["misses"] += 1
    return path


def _file_text(path: str) -> str:
    with open(path, "r", encoding="utf-8") as f:
        return f.read()


def _runtime_fingerprint() -> str:
    """The crt and header go into every library; a change to either must miss."""
    from ..runtime import crt_source_path, include_path

    return _file_text(crt_source_path()) + _file_text(os.path.join(include_path(), "kiln", "c_runtime_api.h"))


def build_shared(sources: Sequence[tuple[str, str | bytes]], options: Iterable[str] = (), cc: str | None = None,
                 target: str = "") -> str:
    """A cached shared library built from generated sources / objects plus the Kiln crt.

    Parameters
    ----------
    sources : list of (file name, content)
        E.g. ``[("lib.c", code)]`` or ``[("lib.o", object_bytes)]``; written to a scratch
        directory and passed to :func:`kiln.contrib.cc.create_shared`.
    options : list of str
        Compiler flags.
    cc : str, optional
        Compiler command (default :func:`kiln.contrib.cc.get_cc`).
    target : str
        The target string (part of the key).

    Returns
    -------
    str
        Path of the ``.so`` (do not modify or delete it: it is shared by later builds).
    """
    from ..contrib import cc as _cc
    from ..runtime import crt_source_path

    opts = list(options)
    compiler = cc or _cc.get_cc()
    parts: list[str | bytes] = ["shared", target, compiler, shlex.join(opts), " ".join(_cc.DEFAULT_OPTIONS),
                                _runtime_fingerprint()]
    for name, content in sources:
        parts += [name, content]
    key = make_key(*parts)

    def produce(out: str) -> None:
        with tempfile.TemporaryDirectory(prefix="kiln_build_") as tmp:
            files = []
            for name, content in sources:
                p = os.path.join(tmp, name)
                with open(p, "wb") as f:
                    f.write(content.encode("utf-8") if isinstance(content, str) else content)
                files.append(p)
            _cc.create_shared(out, files + [crt_source_path()], options=opts, cc=cc)

    return cached_file(key, "so", produce, what="shared library")
