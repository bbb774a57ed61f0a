"""The global function registry and the module-loader table.

Global functions are plain Python callables stored by name (TVM's ``register_func``).
Module loaders are global functions named ``loadbinary_<type_key>`` taking the payload
bytes a module wrote with ``save_to_binary`` and returning the module.

Loaders live in modules that the runtime must not import eagerly (they may be large, or
absent on a minimal deployment). The loader of a type key nobody registered yet is found in
:data:`BUILTIN_LOADER_MODULES` (the runtime's own module types) or else in the plug-in
registry (:mod:`kiln.runtime.plugins`: CUDA, OpenCL and third-party back ends, whose
descriptors say which module registers the loader); that module is imported the first time
a loader for the key is asked for. This module names no back end.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, TypeVar

from . import plugins as _plugins
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

#: type key -> module whose import registers ``loadbinary_<type_key>``: the runtime's own
#: module types (back ends' type keys come from their plug-in descriptors).
BUILTIN_LOADER_MODULES: dict[str, str] = {
    "GraphExecutorFactory": "kiln.runtime.executor_factory",
    "IsaDispatch": "kiln.runtime.isa_dispatch",
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

    Lets code make a module type loadable without importing its module eagerly. A back end
    that also brings a device or a codegen describes all of them at once with a plug-in
    descriptor instead (:mod:`kiln.runtime.plugins`); this table is consulted first.
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
    if f is None:
        try:
            _import_loader_module(type_key)
        except _plugins.PluginError as err:  # a broken plug-in must not break loading others
            hint = f" ({err})"
        f = _FUNCS.get(name)
    if f is None:
        with _LOCK:
            registered = sorted(n[len(LOADER_PREFIX):] for n in _FUNCS if n.startswith(LOADER_PREFIX))
        lazy = sorted(k for k in _lazy_loader_keys(discover=True) if k not in registered and k != type_key)
        available = ", ".join(registered) or "none"
        if lazy:
            available += f" (importable on demand: {', '.join(lazy)})"
        errors = _plugins.discovery_errors()
        if errors:
            available += "; plug-ins that failed to load: " + "; ".join(errors.values())
        raise LoaderNotFoundError(
            f"no loader for module type {type_key!r}: global function {name!r} is not registered"
            f"{hint}; available loaders: {available}"
        )
    return f


def _import_loader_module(type_key: str) -> bool:
    """Import the module that registers the loader of ``type_key``; False if none is known.

    Raises
    ------
    kiln.runtime.plugins.PluginError
        If the module (built-in or a plug-in's) fails to import; the message names it.
    """
    modname = BUILTIN_LOADER_MODULES.get(type_key)
    if modname is not None:
        try:
            importlib.import_module(modname)
        except Exception as err:  # noqa: BLE001 - reported by the caller with the type key
            raise _plugins.PluginError(f"importing {modname} failed: {type(err).__name__}: {err}") from err
        return True
    plugin = _plugins.find_loader(type_key)
    if plugin is None:
        return False
    _plugins.import_facet(plugin, "loader", f"the loader of module type {type_key!r}")
    return True


def _lazy_loader_keys(discover: bool) -> set[str]:
    """Type keys whose loader some module registers on import (built-in or plug-in)."""
    keys = set(BUILTIN_LOADER_MODULES)
    for p in _plugins.list_plugins(discover_entry_points=discover):
        keys.update(p.loaders)
    return keys


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
    if f is None:
        try:
            _import_loader_module(type_key)
        except _plugins.PluginError:  # a broken plug-in only loses its description
            return None
        f = _FUNCS.get(name)
    return f


def list_loaders() -> list[str]:
    """Type keys that have a loader registered now or importable on demand, sorted."""
    with _LOCK:
        keys = {n[len(LOADER_PREFIX):] for n in _FUNCS if n.startswith(LOADER_PREFIX)}
    return sorted(keys | _lazy_loader_keys(discover=True))
