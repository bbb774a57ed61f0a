"""On-disk compile cache for generated code (C → .so, LLVM IR → .o, .o → .so).

An entry is keyed by a SHA-256 over everything that determines the bytes produced: the
source text, the target string, the compiler command and flags, the Kiln crt and header,
and the Kiln version.  Entries live under ``$KILN_CACHE_DIR`` (default ``~/.cache/kiln``);
``KILN_CACHE=0`` disables the cache.

Robustness: an entry is written to a temporary file and ``os.replace``-d into place (atomic
on POSIX), and a sidecar ``.mac`` is checked on every hit, so a truncated or corrupted entry
is ignored (and rebuilt) rather than loaded.

Trust: a cached ``.so`` is ``dlopen``-ed by the next build, so whoever can write the cache
can run code as its user. Hence (``docs/security.md``):

* the cache directory must be owned by the current user and not writable by group or
  others; otherwise the cache is not used for this process (a warning is logged once) and
  every build compiles afresh in a private temporary directory. A missing directory is
  created with mode ``0700``;
* the sidecar is an HMAC-SHA256 of the entry's name and content under a per-user key,
  ``<cache>/hmac.key`` (32 random bytes, created ``0600``, refused unless owned by the user
  and private), so an entry written by anyone without the key is never served.

Size: after each new entry the cache is trimmed to ``$KILN_CACHE_MAX_BYTES`` (default
:data:`DEFAULT_MAX_BYTES`, 1 GiB; ``0`` means unlimited), least recently used entries first
(a hit refreshes an entry's modification time). Removing an entry that another process has
mapped is safe on POSIX: the mapping outlives the name.

:data:`stats` counts hits and misses (tests use it to see that a rebuild did not compile);
the logger ``kiln.codegen.cache`` reports each at DEBUG level.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import shlex
import stat
import tempfile
import threading
from typing import Callable, Iterable, Sequence

from .._version import __version__
from ..runtime import cc as _cc
from ..runtime import crt_source_path, include_path

__all__ = ["cache_dir", "cache_enabled", "make_key", "cached_file", "cached_object", "lookup", "store", "build_shared",
           "stats", "source_digest", "reset_stats", "max_bytes", "DEFAULT_MAX_BYTES", "KEY_FILE"]

#: Default size cap of the cache (``$KILN_CACHE_MAX_BYTES`` overrides; ``0`` = unlimited).
DEFAULT_MAX_BYTES = 1 << 30
#: Name of the per-user HMAC key file inside the cache directory.
KEY_FILE = "hmac.key"
_MAC_EXT = ".mac"
_warned: set[str] = set()

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


def make_key(*parts: str | bytes) -> str:
    """SHA-256 hex digest of ``parts`` plus the Kiln version (parts are length-prefixed)."""
    h = hashlib.sha256()
    for p in (__version__, *parts):
        b = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


_source_digests: dict[tuple[str, ...], str] = {}


def source_digest(*parts: str) -> str:
    """SHA-256 over the source files of the named parts of the ``kiln`` package (memoised).

    ``parts`` are paths relative to the package root: sub-packages (``"codegen"``) or files
    (``"runtime/dtype.py"``). A cache key that includes it misses whenever the code that
    produces an entry changes, even within one Kiln version (a development checkout).
    """
    got = _source_digests.get(parts)
    if got is not None:
        return got
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files: list[str] = []
    for part in parts:
        p = os.path.join(root, part)
        if os.path.isdir(p):
            files.extend(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".py"))
        else:
            files.append(p)
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(os.path.relpath(f, root).encode("utf-8") + b"\0")
        with open(f, "rb") as fh:
            data = fh.read()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    got = _source_digests[parts] = h.hexdigest()
    return got


def max_bytes() -> int:
    """``$KILN_CACHE_MAX_BYTES`` (``0``: unlimited), else :data:`DEFAULT_MAX_BYTES`."""
    raw = os.environ.get("KILN_CACHE_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        return max(0, int(raw))
    except ValueError:
        _warn_once(f"bad:{raw}", "KILN_CACHE_MAX_BYTES=%r is not an integer; using %d", raw, DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES


def _warn_once(tag: str, msg: str, *args: object) -> None:
    with _lock:
        if tag in _warned:
            return
        _warned.add(tag)
    log.warning(msg, *args)


def _private_problem(st: os.stat_result, what: str) -> str | None:
    """Why a file/dir with this stat may not be trusted, or None."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{what} is owned by uid {st.st_uid}, not by the current user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"{what} is writable by group or others (mode {stat.filemode(st.st_mode)})"
    return None


def _trusted_root() -> str | None:
    """The cache directory if this user alone can write it (created 0700 if missing), else None."""
    root = cache_dir()
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        st = os.stat(root)
    except OSError as err:
        _warn_once(root, "compile cache %s is not usable (%s); compiling without it", root, err)
        return None
    problem = _private_problem(st, f"compile cache directory {root}")
    if problem is not None:
        _warn_once(root, "%s: anyone who can write it could make Kiln load their code; compiling "
                   "without the cache (fix with: chmod 700 %s, or set KILN_CACHE_DIR)", problem, root)
        return None
    return root


def _create_key(path: str) -> None:
    """Write a new random key to ``path`` unless one exists, never showing a partial file.

    The key is written to a private temporary file and hard-linked into place: a thread or
    process that finds ``path`` reads all 32 bytes (an empty file being filled would make it
    fall back to compiling without the cache, and the entries it wrote would be lost).
    """
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another writer was first: its key is the key
    finally:
        os.unlink(tmp)


def _hmac_key(root: str) -> bytes | None:
    """The per-user key of the cache at ``root`` (created 0600 on first use)."""
    path = os.path.join(root, KEY_FILE)
    if not os.path.exists(path):
        try:
            _create_key(path)
        except OSError as err:
            _warn_once(path, "compile cache key %s cannot be created (%s); compiling without the cache", path, err)
            return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            problem = _private_problem(os.fstat(f.fileno()), f"compile cache key {path}")
            if problem is None and os.fstat(f.fileno()).st_mode & 0o077:
                problem = f"compile cache key {path} is readable by group or others"
            key = f.read(64)
    except OSError as err:
        problem, key = f"compile cache key {path} cannot be read ({err})", b""
    if problem is None and len(key) != 32:
        problem = f"compile cache key {path} is {len(key)} bytes, expected 32"
    if problem is not None:
        _warn_once(path, "%s; compiling without the cache", problem)
        return None
    return key


def _mac_file(key: bytes, path: str) -> str:
    """HMAC-SHA256 of the entry's base name and content (so entries cannot be swapped)."""
    h = hmac.new(key, os.path.basename(path).encode("utf-8") + b"\0", hashlib.sha256)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _valid(key: bytes, path: str) -> bool:
    try:
        with open(path + _MAC_EXT, encoding="ascii") as f:
            want = f.read().strip()
        return bool(want) and hmac.compare_digest(_mac_file(key, path), want)
    except (OSError, UnicodeDecodeError):
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


def _entry_path(key: str, ext: str) -> tuple[str, bytes] | None:
    """``(path, secret)`` of entry ``key`` in a trusted cache, or None when the cache is off."""
    root = _trusted_root() if cache_enabled() else None
    secret = _hmac_key(root) if root is not None else None
    if root is None or secret is None:
        return None
    return os.path.join(root, key[:2], f"{key}.{ext}"), secret


def lookup(key: str, ext: str, what: str = "entry") -> str | None:
    """Path of a valid entry ``key`` (counted as a hit), or None (nothing is counted).

    Used where the caller produces several entries together on a miss (see :func:`store`).
    """
    where = _entry_path(key, ext)
    if where is None:
        return None
    path, secret = where
    if os.path.exists(path) and _valid(secret, path):
        _touch(path)
        with _lock:
            stats["hits"] += 1
        log.debug("cache hit %s: %s", what, path)
        return path
    return None


def store(key: str, ext: str, data: bytes, what: str = "entry") -> str:
    """Write ``data`` as entry ``key`` (counted as a miss) and return its path.

    When the cache is disabled or unusable the bytes go to a fresh temporary file instead.
    """

    def produce(out: str) -> None:
        with open(out, "wb") as f:
            f.write(data)

    where = _entry_path(key, ext)
    if where is None:
        return _uncached(ext, produce)
    return _produce_entry(key, ext, where, produce, what)


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
    hit = lookup(key, ext, what)
    if hit is not None:
        return hit
    where = _entry_path(key, ext)
    if where is None:
        return _uncached(ext, produce)
    return _produce_entry(key, ext, where, produce, what)


def cached_object(key: str, ext: str, produce: Callable[[str], None]) -> str | None:
    """The runtime's persistent object cache (:data:`kiln.runtime.cc.ObjectCache`).

    ``export_library`` asks it for the objects of the Kiln crt and C API driver
    (:func:`kiln.runtime.cc.compile_object_cached` computes ``key``), so a fresh process
    does not run the C compiler for them. Same trust rules as every entry: a hit is served
    only if its HMAC verifies, anything else is rebuilt with ``produce``. ``None`` when the
    cache is disabled (``KILN_CACHE=0``) or not trusted: the runtime then compiles into its
    own private directory (no stray temporary entry is left behind).
    """
    if _entry_path(key, ext) is None:
        return None
    return cached_file(key, ext, produce, what="runtime object")


def _produce_entry(key: str, ext: str, where: tuple[str, bytes], produce: Callable[[str], None],
                   what: str) -> str:
    path, secret = where
    d = os.path.dirname(path)
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp_", suffix=f".{ext}")
        os.close(fd)
    except OSError as err:
        log.warning("compile cache %s is not usable (%s); compiling without it", d, err)
        return _uncached(ext, produce)
    try:
        produce(tmp)
        os.replace(tmp, path)  # entry first, then its MAC: a reader never validates a partial file
        _atomic_write_text(path + _MAC_EXT, _mac_file(secret, path) + "\n")
    except BaseException:
        _silent_remove(tmp)
        raise
    with _lock:
        stats["misses"] += 1
    log.debug("cache miss %s: built %s", what, path)
    _account(os.path.dirname(d), path, max_bytes())
    return path


#: Per cache root: the bytes this process believes the cache holds, and the stores since the
#: last full scan. A full scan stats every entry, so scanning on every store made a build of N
#: kernels O(N * cache size); now a process scans once, adds what it stores, and scans again
#: only when its estimate passes the cap (or every ``_RESCAN_EVERY`` stores, to notice what
#: other processes added). The cap is therefore soft by at most what other processes stored
#: since this one's last scan.
_estimate: dict[str, list[int]] = {}
_RESCAN_EVERY = 512


def _account(root: str, path: str, cap: int) -> None:
    if cap <= 0:
        return
    try:
        added = os.path.getsize(path) + os.path.getsize(path + _MAC_EXT)
    except OSError:
        added = 0
    with _lock:
        est = _estimate.get(root)
        if est is not None:
            est[0] += added
            est[1] += 1
            if est[0] <= cap and est[1] < _RESCAN_EVERY:
                return
    total = _evict(root, cap, keep=path)
    with _lock:
        _estimate[root] = [total, 0]


def _touch(path: str) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _evict(root: str, cap: int, keep: str) -> int:
    """Remove least recently used entries (and their MACs) until the cache is within ``cap``.

    Returns the cache's size in bytes afterwards (as far as the scan saw it).
    """
    if cap <= 0:
        return 0
    entries: list[tuple[float, int, str]] = []
    total = 0
    try:
        subdirs = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False) and len(e.name) == 2]
    except OSError:
        return 0
    for sub in subdirs:
        try:
            files = list(os.scandir(sub))
        except OSError:
            continue
        sizes = {f.path: f.stat(follow_symlinks=False) for f in files if f.is_file(follow_symlinks=False)}
        for p, st in sizes.items():
            total += st.st_size
            if p.endswith(_MAC_EXT) or os.path.basename(p).startswith(".tmp_"):
                continue
            mac = sizes.get(p + _MAC_EXT)
            entries.append((st.st_mtime, st.st_size + (mac.st_size if mac else 0), p))
    if total <= cap:
        return total
    for _mtime, size, p in sorted(entries):
        if total <= cap:
            break
        if p == keep:
            continue
        _silent_remove(p + _MAC_EXT)  # the MAC first: a half-removed entry is never served
        _silent_remove(p)
        total -= size
        log.debug("cache evict %s (%d bytes)", p, size)
    return total


def _uncached(ext: str, produce: Callable[[str], None]) -> str:
    d = tempfile.mkdtemp(prefix="kiln_nocache_")
    path = os.path.join(d, f"entry.{ext}")
    produce(path)
    with _lock:
        stats["misses"] += 1
    return path


def _file_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _runtime_fingerprint() -> str:
    """The crt and header go into every library; a change to either must miss."""
    return _file_text(crt_source_path()) + _file_text(os.path.join(include_path(), "kiln", "c_runtime_api.h"))


def build_shared(sources: Sequence[tuple[str, str | bytes]], options: Iterable[str] = (), cc: str | None = None,
                 target: str = "") -> str:
    """A cached shared library built from generated sources / objects plus the Kiln crt.

    Parameters
    ----------
    sources : list of (file name, content)
        E.g. ``[("lib.c", code)]`` or ``[("lib.o", object_bytes)]``; written to a scratch
        directory and passed to :func:`kiln.runtime.cc.create_shared`.
    options : list of str
        Compiler flags.
    cc : str, optional
        Compiler command (default :func:`kiln.runtime.cc.get_cc`).
    target : str
        The target string (part of the key).

    Returns
    -------
    str
        Path of the ``.so`` (do not modify or delete it: it is shared by later builds).
    """

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
