"""The codegen registry: global functions ``target.build.<kind>(funcs, target) -> Module``.

``c`` and ``llvm`` are registered by ``kiln.codegen`` itself. Every other kind's codegen is a
plug-in (:mod:`kiln.runtime.plugins`; CUDA and OpenCL are described there like third-party
back ends): its module registers ``target.build.<kind>`` when imported, which happens the
first time a build asks for the kind, so ``list_codegens()`` names it without importing it
(or its dialect, or NVRTC). This module names no back end; the target kinds themselves are
declared in :mod:`kiln.target`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..runtime import plugins as _plugins
from ..runtime.errors import CompileError
from ..runtime.registry import get_global_func, list_global_func_names, register_func
from ..tir.stmt import PrimFunc

__all__ = ["register_codegen", "get_codegen", "list_codegens", "build_module", "PREFIX"]

PREFIX = "target.build."

Codegen = Callable[[list[PrimFunc], Any], Any]


def register_codegen(kind: str, fn: Codegen | None = None, override: bool = False) -> Any:
    """Register ``fn(funcs, target) -> kiln.runtime.Module`` as the codegen of ``kind``.

    Stored as the global function ``target.build.<kind>`` (usable as a decorator).
    """
    return register_func(PREFIX + kind, fn, override=override)


def list_codegens() -> list[str]:
    """Kinds with a codegen: registered ones and the plug-ins' (imported or not).

    Returns
    -------
    list of str
        Sorted kind names. Installed plug-ins' entry points are read (once per process), their
        codegen modules are not imported.
    """
    registered = {n[len(PREFIX):] for n in list_global_func_names() if n.startswith(PREFIX)}
    for p in _plugins.list_plugins():
        registered.update(p.codegens)
    return sorted(registered)


def get_codegen(kind: str) -> Codegen:
    """The codegen of ``kind``, importing the plug-in that declares it on first use.

    Raises
    ------
    CompileError
        Naming the kind and the kinds that have a codegen, or the plug-in whose codegen
        module failed to import (its :class:`~kiln.runtime.plugins.PluginError` chained).
    """
    fn = get_global_func(PREFIX + kind, allow_missing=True)
    if fn is None:
        plugin = _plugins.find_codegen(kind)
        if plugin is not None:
            try:
                _plugins.import_facet(plugin, "codegen", f"the code generator of target kind {kind!r}",
                                      registered=lambda: get_global_func(PREFIX + kind, allow_missing=True) is not None)
            except _plugins.PluginError as err:
                raise CompileError(f"no code generator for target kind {kind!r}: {err}") from err
            fn = get_global_func(PREFIX + kind, allow_missing=True)
    if fn is None:
        failed = _plugins.discovery_errors()
        extra = ("; plug-ins that failed to load: " + "; ".join(failed.values())) if failed else ""
        raise CompileError(f"no code generator for target kind {kind!r} (global function "
                           f"'{PREFIX}{kind}'); available: {', '.join(list_codegens())}{extra}")
    return fn


def build_module(funcs: PrimFunc | Sequence[PrimFunc] | dict[str, PrimFunc], target: Any) -> Any:
    """Compile PrimFuncs for ``target`` into one runtime module.

    Parameters
    ----------
    funcs : PrimFunc, list of PrimFunc, or dict name -> PrimFunc
        The kernels; each becomes an exported packed function named after the PrimFunc.
    target : str, dict or kiln.target.Target
        E.g. ``"llvm -mcpu=native"`` or ``"c"``.

    Returns
    -------
    kiln.runtime.Module
        ``mod[name](*arrays)`` runs a kernel; ``mod.export_library(path)`` links it.
    """
    from ..target import Target

    tgt = target if isinstance(target, Target) else Target(target)
    if isinstance(funcs, PrimFunc):
        flist = [funcs]
    elif isinstance(funcs, dict):
        flist = list(funcs.values())
    else:
        flist = list(funcs)
    for f in flist:
        if not isinstance(f, PrimFunc):
            raise CompileError(f"build_module expects PrimFuncs, got {type(f).__name__}")
    if not flist:
        raise CompileError("build_module: no functions to build")
    mod = get_codegen(tgt.kind.name)(flist, tgt)
    # export_library keeps the crt / C API objects in the on-disk compile cache through this
    # hook (the runtime cannot import the cache itself: docs/kernels.md, "Compile cache").
    from .cache import cached_object

    try:
        mod.export_object_cache = cached_object
    except AttributeError:  # a plug-in module type with fixed attributes: per-process objects only
        pass
    return mod
