"""Kiln's exception hierarchy.

Every user mistake (bad model, wrong input, corrupt file, missing loader, unknown device)
raises a subclass of :class:`KilnError` whose message names the offending thing and what
was expected. Each class also derives from the closest builtin so that generic handlers
(``except ValueError``) keep working.
"""

from __future__ import annotations

__all__ = [
    "KilnError",
    "FormatError",
    "KilnFileNotFoundError",
    "LoaderNotFoundError",
    "FunctionNotFoundError",
    "DeviceError",
    "InputError",
    "KernelError",
    "CompileError",
    "UnsupportedOpError",
    "TargetError",
    "UnsupportedHostError",
]


class KilnError(Exception):
    """Base class of every error Kiln raises on purpose."""


class FormatError(KilnError, ValueError):
    """A file or byte string does not follow the documented format (truncated, bad magic, ...)."""


class KilnFileNotFoundError(KilnError, FileNotFoundError):
    """A path given to Kiln does not exist."""


class LoaderNotFoundError(KilnError, LookupError):
    """No ``loadbinary_<type_key>`` loader is registered for a module found in a library."""


class FunctionNotFoundError(KilnError, LookupError):
    """A module (and, when asked, its imports) has no function of the requested name."""


class DeviceError(KilnError, RuntimeError):
    """A device is unknown, absent, or its runtime is not installed."""


class InputError(KilnError, ValueError):
    """A user-supplied value has the wrong name, shape, dtype, device or index."""


class KernelError(KilnError, RuntimeError):
    """A compiled kernel reported a failure at run time."""


class CompileError(KilnError, RuntimeError):
    """The system C compiler or a code generator failed."""


class UnsupportedOpError(KilnError, NotImplementedError):
    """A model uses operators Kiln does not support; the message lists all of them."""


class TargetError(KilnError, ValueError):
    """A target string or dict is malformed or names an unknown kind/option."""


class UnsupportedHostError(KilnError, RuntimeError):
    """A library needs CPU features (or an architecture) this machine does not have."""
