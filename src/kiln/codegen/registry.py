"""The codegen registry: global functions ``target.build.<kind>(funcs, target) -> Module``."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Sequence

from ..runtime.errors import CompileError
from ..runtime.registry import get_global_func, list_global_func_names, register_func
from ..tir.stmt import PrimFunc

__all__ = ["register_codegen", "get_codegen", "list_codegens", "build_module", "PREFIX"]

PREFIX = "target.build."

Codegen = Callable[[list[PrimFunc], Any], Any]

#: Built-in codegens that register themselves when their module is first imported (they pull in
#: their dialect, and CUDA its NVRTC binding); the target kinds are declared in kiln.target.
PLUGIN_CODEGEN_MODULES: dict[str, str] = {"cuda": "kiln.codegen.cuda", "opencl": "kiln.codegen.opencl"}


def register_codegen(kind: str, fn: Codegen | None = None, override: bool = False) -> Any:
    """Register ``fn(funcs, target) -> kiln.runtime.Module`` as the codegen of ``kind``.

    Stored as the global function ``target.build.<kind>`` (usable as a decorator).
    """
    return register_func(PREFIX + kind, fn, override=override)


def list_codegens() -> list[str]:
    """Kinds with a registered codegen (built-in plug-ins included, imported or not)."""
    registered = {n[len(PREFIX):] for n in list_global_func_names() if n.startswith(PREFIX)}
    return sorted(registered | set(PLUGIN_CODEGEN_MODULES))


def get_codegen(kind: str) -> Codegen:
    """The codegen of ``kind``.

    Raises
    ------
    CompileError
        Naming the kind and the kinds that have a codegen.
    """
    fn = get_global_func(PREFIX + kind, allow_missing=True)
    if fn is None and kind in PLUGIN_CODEGEN_MODULES:
        importlib.import_module(PLUGIN_CODEGEN_MODULES[kind])
        fn = get_global_func(PREFIX + kind, allow_missing=True)
    if fn is None:
        raise CompileError(f"no code generator for target kind {kind!r} (global function "
                           f"'{PREFIX}{kind}'); available: {', '.join(list_codegens())}")
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
    return get_codegen(tgt.kind.name)(flist, tgt)
