"""One thread pool and one error buffer per process, shared by every library Kiln loads.

Every Kiln library carries the crt (``kiln_crt.c``) and with it a thread pool and a
thread-local error message, reached through service pointers the library defines with
working defaults (``docs/calling_convention.md``). Left alone, N libraries loaded into one
process would start N pools: N x (threads - 1) workers. So :func:`share_services`, called
by the loader right after ``dlopen`` and before any library code runs, routes them:

* the first library loaded whose crt has the shared services (it defines
  ``__KilnBackendGetNumThreads``) becomes the **owner**;
* in every library loaded after it, these service pointers are set to the owner's
  defaults:

  ================================  =================================================
  ``__KilnBackendParallelLaunch``   the owner's pool (``KilnBackendParallelLaunch``)
  ``__KilnBackendGetNumThreads``    its thread count (so ``KilnGetNumThreads``,
  ``__KilnBackendSetNumThreads``    ``KilnSetNumThreads`` of any library act on it)
  ``__KilnAPISetLastError``         its error setter: a task that fails on a pool worker
                                    records its message where the pool can forward it,
                                    and Python reads it back with the owner's
                                    ``KilnGetLastError``
  ================================  =================================================

Consequences, relied on by :class:`~kiln.runtime.library_module.LibraryModule`:

* the owner is never unloaded: its pool's workers run its code for the rest of the process
  (so one library file stays mapped after every module is gone);
* any other library starts no thread and may be unloaded once nothing refers to it;
* a library whose crt predates the shared services is routed the same way when an owner
  exists; if it is loaded first, it keeps its own pool, cannot be the owner, and is never
  unloaded either (its workers would be left running unmapped code).

A library used from C, without this loader, keeps its defaults: its own pool and errors.

This module imports only the standard library.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

__all__ = ["Routing", "share_services", "owner_path"]

#: Service pointers routed to the owner, in the order they are written.
SERVICES: tuple[str, ...] = (
    "__KilnBackendParallelLaunch",
    "__KilnBackendGetNumThreads",
    "__KilnBackendSetNumThreads",
    "__KilnAPISetLastError",
)
# Defined by every crt that can own the shared pool (older crts lack the thread-count pointers).
_OWNER_MARK = "__KilnBackendGetNumThreads"


@dataclass(frozen=True)
class Routing:
    """How one loaded library uses the process-wide services.

    Attributes
    ----------
    error_library : ctypes.CDLL or None
        The library whose ``KilnGetLastError`` reads this library's errors (the owner's
        when routed, its own otherwise).
    unloadable : bool
        True if no thread of the library's own can be running its code, so ``dlclose`` is
        safe once nothing refers to its functions or data.
    owner : bool
        True for the library whose pool every other one uses.
    """

    error_library: ctypes.CDLL | None
    unloadable: bool
    owner: bool = False


@dataclass(frozen=True)
class _Owner:
    path: str
    library: ctypes.CDLL  # kept for the process lifetime: it is never dlclosed
    defaults: dict[str, int]


_lock = threading.Lock()
_owner: _Owner | None = None


def _pointer(lib: ctypes.CDLL, name: str) -> ctypes.c_void_p | None:
    """The library's function-pointer variable ``name``, writable in place, or None."""
    try:
        return ctypes.c_void_p.in_dll(lib, name)
    except ValueError:
        return None


def share_services(lib: ctypes.CDLL, path: str) -> Routing:
    """Route a freshly opened library's crt services to the process-wide ones.

    Must run before any code of ``lib`` (a kernel or a crt service) does.

    Parameters
    ----------
    lib : ctypes.CDLL
        The library, just opened.
    path : str
        Its file (remembered when it becomes the owner, for :func:`owner_path`).

    Returns
    -------
    Routing
        Where its errors are read and whether it may be unloaded.
    """
    global _owner
    pointers = {name: p for name in SERVICES if (p := _pointer(lib, name)) is not None}
    if not pointers:  # not linked with the Kiln crt: no pool, no threads
        return Routing(error_library=None, unloadable=True)
    with _lock:
        if _owner is None:
            if _OWNER_MARK not in pointers or len(pointers) != len(SERVICES):
                return Routing(error_library=lib, unloadable=False)  # an older crt: its own pool
            _owner = _Owner(path, lib, {name: int(p.value or 0) for name, p in pointers.items()})
            return Routing(error_library=lib, unloadable=False, owner=True)
        owner = _owner
    for name, p in pointers.items():
        p.value = owner.defaults[name]
    # A second load of the owner's own file maps the same object: it stays mapped anyway
    # (the owner's reference is never released), so dropping this one is harmless.
    return Routing(error_library=owner.library, unloadable=True)


def owner_path() -> str | None:
    """File of the library whose thread pool this process uses (None before the first load)."""
    owner = _owner
    return owner.path if owner is not None else None
