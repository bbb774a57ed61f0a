"""The global function registry and the module-loader table.

Global functions are plain Python callables stored by name (TVM's ``register_func``).
Module loaders are global functions named ``loadbinary_<type_key>`` taking the payload
bytes a module wrote with ``save_to_binary`` and returning the module.

Loaders of Kiln's own module types live in modules that the runtime must not import
eagerly (they may be large or absent on a minimal deployment); :data:`BUILTIN_LOADER_MODULES`
maps a type key to the module that registers its loader, imported the first time a loader
for that key is asked for.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, TypeVar

from .errors import FunctionNotFoundError, KilnError, LoaderNotFoundError

__all__ = [
    "register_func",
    "get_global_func",
    "list_global_func_names",
    "remove_global_func",
    "register_loader",
    "get_loader",
    "list_loaders",
    "register_builtin_loader_module",
    "BUILTIN_LOADER_MODULES",
    "LOADER_PREFIX",
    "register_payload_describer",
    "get_payload_describer",
    "DESCRIBE_PREFIX",
]

F = TypeVar("F", bound=Callable[..., Any])

LOADER_PREFIX = "loadbinary_"

#: type key -> module whose import registers ``loadbinary_<type_key>``.
BUILTIN_LOADER_MODULES: dict[str, str] = {
    "GraphExecutorFactory": "kiln.runtime.executor_factory",
    "cuda": "kiln.runtime.cuda_driver",
    "opencl": "kiln.runtime.opencl_driver",
}

_FUNCS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.RLock()


def register_func(name: str, f: Callable[..., Any] | None = None, override: bool = False) -> Any:
    """Register a global function under ``name``.

    Parameters
    ----------
    name : str
        Global name, e.g. ``"target.build.c"`` or ``"loadbinary_c"``.
    f : callable, optional
        The function. When omitted, returns a decorator.
    override : bool
        Replace an existing registration instead of raising.

    Returns
    -------
    callable
        ``f`` itself (or the decorator).

    Raises
    ------
    KilnError
        If ``name`` is taken and ``override`` is false.
    """
    if not isinstance(name, str) or not name:
        raise KilnError(f"register_func: name must be a non-empty string, got {name!r}")

    def do_register(func: F) -> F:
        if not callable(func):
            raise KilnError(f"register_func({name!r}): {func!r} is not callable")
        with _LOCK:
            if name in _FUNCS and not override and _FUNCS[name] is not func:
                raise KilnError(f"global function {name!r} is already registered (pass override=True)")
            _FUNCS[name] = func
        return func

    if f is None:
        return do_register
    return do_register(f)


def get_global_func(name: str, allow_missing: bool = False) -> Callable[..., Any] | None:
    """Look up a global function.

    Raises
    ------
    FunctionNotFoundError
        If missing and ``allow_missing`` is false.
    """
    f = _FUNCS.get(name)
    if f is None and not allow_missing:
        raise FunctionNotFoundError(f"global function {name!r} is not registered")
    return f


def list_global_func_names() -> list[str]:
    """Names of all registered global functions, sorted."""
    with _LOCK:
        return sorted(_FUNCS)


def remove_global_func(name: str) -> None:
    """Unregister ``name`` (no error if absent). Mostly for tests."""
    with _LOCK:
        _FUNCS.pop(name, None)


def register_loader(type_key: str, fn: Callable[[bytes], Any] | None = None, override: bool = False) -> Any:
    """Register the loader of modules of ``type_key`` (as ``loadbinary_<type_key>``).

    Parameters
    ----------
    type_key : str
        The module type key the loader handles.
    fn : callable, optional
        ``fn(payload: bytes) -> Module``. When omitted, returns a decorator.
    override : bool
        Replace an existing loader.
    """
    return register_func(LOADER_PREFIX + type_key, fn, override=override)


def register_builtin_loader_module(type_key: str, module_name: str) -> None:
    """Tell the runtime which module to import to get the loader of ``type_key``.

    Lets a plug-in make its module type loadable without importing the plug-in eagerly.
    """
    with _LOCK:
        BUILTIN_LOADER_MODULES[type_key] = module_name


def get_loader(type_key: str) -> Callable[[bytes], Any]:
    """Return the loader of ``type_key``, importing its built-in module if needed.

    Raises
    ------
    LoaderNotFoundError
        Naming the missing ``loadbinary_<type_key>`` and the loaders that exist.
    """
    name = LOADER_PREFIX + type_key
    f = _FUNCS.get(name)
    hint = ""
    if f is None and type_key in BUILTIN_LOADER_MODULES:
        modname = BUILTIN_LOADER_MODULES[type_key]
        try:
            importlib.import_module(modname)
        except Exception as err:  # noqa: BLE001 - a broken plug-in must not break loading others
            hint = f" (importing {modname} failed: {type(err).__name__}: {err})"
        f = _FUNCS.get(name)
    if f is None:
        with _LOCK:
            registered = sorted(n[len(LOADER_PREFIX):] for n in _FUNCS if n.startswith(LOADER_PREFIX))
            lazy = sorted(k for k in BUILTIN_LOADER_MODULES if k not in registered and k != type_key)
        available = ", ".join(registered) or "none"
        if lazy:
            available += f" (importable on demand: {', '.join(lazy)})"
        raise LoaderNotFoundError(
            f"no loader for module type {type_key!r}: global function {name!r} is not registered"
            f"{hint}; available loaders: {available}"
        )
    return f


DESCRIBE_PREFIX = "runtime.module.describe_"


def register_payload_describer(type_key: str, fn: Callable[[bytes], dict] | None = None,
                               override: bool = False) -> Any:
    """Register ``fn(payload) -> dict`` summarizing a module payload of ``type_key``.

    ``kiln inspect`` calls it on the bytes a module wrote with ``save_to_binary`` to list a
    device module's kernels and binary sizes. It must only parse bytes: no library code, no
    device runtime. Stored as the global function ``runtime.module.describe_<type_key>``.
    """
    return register_func(DESCRIBE_PREFIX + type_key, fn, override=override)


def get_payload_describer(type_key: str) -> Callable[[bytes], dict] | None:
    """The payload describer of ``type_key`` (importing its built-in module), or None."""
    name = DESCRIBE_PREFIX + type_key
    f = _FUNCS.get(name)
    if f is None and type_key in BUILTIN_LOADER_MODULES:
        try:
            importlib.import_module(BUILTIN_LOADER_MODULES[type_key])
        except Exception:  # noqa: BLE001 - a broken plug-in only loses its description
            return None
        f = _FUNCS.get(name)
    return f


def list_loaders() -> list[str]:
    """Type keys that have a loader registered now or importable on demand, sorted."""
    with _LOCK:
        keys = {n[len(LOADER_PREFIX):] for n in _FUNCS if n.startswith(LOADER_PREFIX)}
        keys |= set(BUILTIN_LOADER_MODULES)
    return sorted(keys)
