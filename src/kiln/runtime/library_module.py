"""A loaded shared library as a runtime module (type key ``"library"``).

Lifetime: a library is opened with ``dlopen`` when its :class:`LibraryModule` is created,
its crt services are routed to the process-wide thread pool and error buffer
(:mod:`~kiln.runtime.shared_crt`), and it is closed with ``dlclose`` when the module is
garbage collected. Everything that can reach its code or data holds the module: a
:class:`~kiln.runtime.module.PackedFunction` its ``module``, an executor its kernels and
``KilnRunSequence`` owner, the module tree its imports. The library that owns the shared
pool is never closed.
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
import weakref
from typing import Any, Callable

from . import _ffi, shared_crt
from .errors import FormatError, KilnError, KilnFileNotFoundError
from .model_api import API_FUNCTIONS
from .module import Module, PackedFunction

__all__ = ["LibraryModule", "CompiledOnDemand", "CRT_FUNCTIONS"]

#: Functions the Kiln crt exports into every library, and the model C API
#: (``kiln/kiln_model.h``) that every model library exports; they are services, not packed
#: kernels, so ``get_function`` never hands them out (calling them packed would crash).
CRT_FUNCTIONS: frozenset[str] = frozenset(
    {"KilnRunSequence", "KilnGetLastError", "KilnSetNumThreads", "KilnGetNumThreads", "KilnABIVersion"}
) | API_FUNCTIONS

# Symbols that are never packed functions even though ELF says FUNC.
_NEVER_KERNELS = frozenset({"_init", "_fini"})


class LibraryModule(Module):
    """A shared library opened with ``dlopen(RTLD_NOW | RTLD_LOCAL)``.

    Parameters
    ----------
    path : str
        Path of the ``.so``.
    exported : iterable of str, optional
        The library's exported function names (from its ELF symbol table). When given,
        only these are handed out by :meth:`get_function`, which guards against calling a
        data symbol or a crt service with the packed signature.
    keepalive : object, optional
        Kept as long as the module lives (e.g. a finalizer that removes a temp directory).

    Raises
    ------
    KilnFileNotFoundError
        If ``path`` does not exist.
    FormatError
        If the system loader cannot open it (not a shared library, wrong machine,
        a missing dependency, corrupt dynamic section, ...).

    Notes
    -----
    A loaded library cannot be compiled into another one: ``is_dso_exportable`` is false,
    and exporting a tree that contains it raises; copy the original file instead.

    The library is closed (``dlclose``) when this module is garbage collected, unless it
    owns the process-wide thread pool (see :mod:`~kiln.runtime.shared_crt`). Its thread
    count and last error are the process-wide ones.
    """

    type_key = "library"

    def __init__(self, path: str | os.PathLike, exported: Any = None, keepalive: Any = None) -> None:
        super().__init__()
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.exists(self.path):
            raise KilnFileNotFoundError(f"no such file: {self.path}")
        self._lib = _dlopen(self.path)
        routing = shared_crt.share_services(self._lib, self.path)
        if routing.unloadable:
            # The callback holds the handle, not self; it runs once self is collected.
            weakref.finalize(self, _dlclose, self._lib._handle)
        self._exported: frozenset[str] | None = frozenset(exported) if exported is not None else None
        self._keepalive = keepalive
        self._funcs: dict[str, PackedFunction] = {}
        self._get_last_error = (
            _function(routing.error_library, "KilnGetLastError", ctypes.c_char_p, [])
            if routing.error_library is not None
            else None
        )
        self._run_seq = self._service(
            "KilnRunSequence", ctypes.c_int32, [ctypes.POINTER(_ffi.KilnOpCall), ctypes.c_int32]
        )
        self._set_threads = self._service("KilnSetNumThreads", None, [ctypes.c_int32])
        self._get_threads = self._service("KilnGetNumThreads", ctypes.c_int32, [])

    def _service(self, name: str, restype: Any, argtypes: list[Any]) -> Any:
        return _function(self._lib, name, restype, argtypes)

    # ---- symbols -------------------------------------------------------------------
    def native_address(self, symbol: str) -> int | None:
        """Address of any exported symbol (function or data), or ``None`` if absent."""
        try:
            return ctypes.cast(self._lib[symbol], ctypes.c_void_p).value
        except AttributeError:
            return None

    def list_functions(self) -> list[str] | None:
        """Kernel names this library exports (``None`` when unknown, i.e. not ELF-inspected)."""
        if self._exported is None:
            return None
        return sorted(n for n in self._exported if n not in CRT_FUNCTIONS and n not in _NEVER_KERNELS)

    def _get_local_function(self, name: str) -> PackedFunction | None:
        f = self._funcs.get(name)
        if f is not None:
            return f
        if name in CRT_FUNCTIONS or name in _NEVER_KERNELS:
            return None
        if self._exported is not None and name not in self._exported:
            return None
        addr = self.native_address(name)
        if addr is None:
            return None
        f = PackedFunction(name, address=addr, module=self, last_error=self.last_error)
        self._funcs[name] = f
        return f

    # ---- crt services ----------------------------------------------------------------
    def _require(self, fn: Any, name: str) -> Any:
        if fn is None:
            raise KilnError(f"{self.path}: library has no {name} (it was not linked with the Kiln crt)")
        return fn

    def last_error(self) -> str:
        """Error message recorded by the last failing call on this thread (``""`` if none)."""
        if self._get_last_error is None:
            return ""
        msg = self._get_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def run_sequence(self, calls: Any, n: int) -> int:
        """Run ``calls[0..n)`` (a ctypes array of ``KilnOpCall``) natively.

        Returns
        -------
        int
            -1 on success, else the index of the failing call.
        """
        return self._require(self._run_seq, "KilnRunSequence")(calls, n)

    @property
    def run_sequence_cfunc(self) -> Callable[..., int]:
        """The raw ctypes ``KilnRunSequence`` (for callers that want to skip one Python frame)."""
        return self._require(self._run_seq, "KilnRunSequence")

    def set_num_threads(self, n: int) -> None:
        """Thread count of parallel loops (0: ``$KILN_NUM_THREADS`` or all cores).

        The thread pool is shared by every library loaded in this process, so this sets
        the count for all of them.
        """
        self._require(self._set_threads, "KilnSetNumThreads")(int(n))

    def get_num_threads(self) -> int:
        """Thread count of parallel loops (of the process-wide pool)."""
        return int(self._require(self._get_threads, "KilnGetNumThreads")())

    # ---- module protocol -----------------------------------------------------------------
    @property
    def is_dso_exportable(self) -> bool:
        return False

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        raise KilnError(
            f"a loaded library cannot be saved or re-exported; copy {self.path} instead "
            "or export the original (unloaded) modules"
        )

    def __repr__(self) -> str:
        return f"LibraryModule({self.path!r}, imports={len(self._import_list())})"


def _dlopen(path: str) -> ctypes.CDLL:
    """``dlopen(path, RTLD_NOW | RTLD_LOCAL)``; any failure is a :class:`FormatError`."""
    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except UnicodeDecodeError as err:
        # ctypes decodes dlerror() as UTF-8; a corrupt library can make the message (which
        # quotes names from its dynamic section) undecodable.
        raise FormatError(
            f"{path}: cannot load as a shared library (the system loader's message is not "
            f"valid UTF-8: {err.object[:200]!r})"
        ) from err
    except (OSError, ValueError) as err:
        raise FormatError(f"{path}: cannot load as a shared library: {err}") from err


def _dlclose(handle: int) -> None:
    """Unmap a library opened by :func:`_dlopen` (a no-op where ctypes has no ``dlclose``)."""
    close = getattr(_ctypes, "dlclose", None)
    if close is not None:
        try:
            close(handle)
        except OSError:  # nothing to do about it in a finalizer; the library stays mapped
            pass


def _function(lib: ctypes.CDLL, name: str, restype: Any, argtypes: list[Any]) -> Any:
    """The C function ``name`` of ``lib`` with its signature set, or None if absent."""
    try:
        f = lib[name]
    except AttributeError:
        return None
    f.restype = restype
    f.argtypes = argtypes
    return f


class CompiledOnDemand:
    """Library services of a module that compiles itself into a :class:`LibraryModule` on
    first use (C source modules, LLVM modules), so executors treat it like a loaded library.

    The class using it provides ``_library()`` (compile/link once, return the
    ``LibraryModule``) and the attribute ``_lib`` (None until then).
    """

    _lib: "LibraryModule | None"

    def _library(self) -> "LibraryModule":  # pragma: no cover - provided by the module class
        raise NotImplementedError

    def library(self) -> "LibraryModule":
        """The in-process library (compiled and linked on first call; needs a C compiler)."""
        return self._library()

    def native_address(self, symbol: str) -> int | None:
        """Address of ``symbol`` in the in-process library."""
        return self._library().native_address(symbol)

    def run_sequence(self, calls: Any, n: int) -> int:
        """``KilnRunSequence`` of the in-process library (see :class:`LibraryModule`)."""
        return self._library().run_sequence(calls, n)

    @property
    def run_sequence_cfunc(self) -> Any:
        """The raw ctypes ``KilnRunSequence`` of the in-process library."""
        return self._library().run_sequence_cfunc

    def last_error(self) -> str:
        """Last error recorded by this module's kernels on this thread."""
        return self._library().last_error() if self._lib is not None else ""

    def set_num_threads(self, n: int) -> None:
        """Thread count of this module's parallel loops."""
        self._library().set_num_threads(n)
