"""A device driver library opened on first use, once per process: :class:`LazyLibrary`.

Owns the one pattern every ctypes device backend needs (``libcuda.so.1``, ``libOpenCL.so.1``,
plug-ins): importing the backend opens nothing, the first call that needs the driver opens it
under a lock, and a missing library is a :class:`~kiln.runtime.errors.DeviceError` naming it
and what to install, raised again (without retrying ``dlopen``) until :meth:`LazyLibrary.reset`.
Imports ctypes and the standard library only.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, Generic, TypeVar

from .errors import DeviceError

__all__ = ["LazyLibrary"]

T = TypeVar("T")


class LazyLibrary(Generic[T]):
    """A shared library opened on first :meth:`get` and wrapped with typed entry points.

    Parameters
    ----------
    what : str
        What the library is, for the error message (``"CUDA driver library"``).
    name : callable
        Returns the name or path to open; asked at each opening attempt, so it may read an
        environment variable (``KILN_CUDA_LIBRARY``).
    wrap : callable
        ``wrap(cdll, name)`` makes the object :meth:`get` returns (binds signatures, finds
        devices); a :class:`DeviceError` it raises is passed on and not remembered.
    install_hint : str
        Appended to the "not found" message: what to install.
    """

    def __init__(self, what: str, name: Callable[[], str], wrap: Callable[[ctypes.CDLL, str], T],
                 install_hint: str) -> None:
        self._what, self._name, self._wrap, self._hint = what, name, wrap, install_hint
        self._value: T | None = None
        self._error: DeviceError | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """The wrapped library, opened now if it is not yet.

        Raises
        ------
        DeviceError
            When the library cannot be opened, naming it and what to install.
        """
        value = self._value
        if value is not None:
            return value
        with self._lock:
            if self._value is None:
                if self._error is not None:
                    raise self._error
                name = self._name()
                try:
                    lib = ctypes.CDLL(name)
                except OSError as err:
                    self._error = DeviceError(f"{self._what} {name} not found ({err}); {self._hint}")
                    raise self._error from None
                self._value = self._wrap(lib, name)
            return self._value

    def opened(self) -> T | None:
        """The wrapped library if it is open, else None (never opens it: safe from finalizers)."""
        return self._value

    def reset(self) -> None:
        """Forget the library and any opening error (tests that switch the library call this)."""
        with self._lock:
            self._value, self._error = None, None
