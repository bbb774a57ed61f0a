"""``kiln.codegen``: loop IR → runnable / exportable runtime modules, per target kind.

* :func:`build_module` ``(funcs, target) -> kiln.runtime.Module`` dispatches to the global
  function ``target.build.<kind>``; :func:`register_codegen` adds one (plug-ins included).
* ``c``: :func:`kiln.codegen.c_module.build_c` → a C source module (type key ``"c"``).
* ``llvm``: :func:`kiln.codegen.llvm_module.build_llvm` → an :class:`LLVMModule`
  (type key ``"llvm"``, object code via llvmlite).
* :mod:`kiln.codegen.cache`: the on-disk compile cache both use.
"""

from __future__ import annotations

from typing import Any

from .registry import PREFIX, build_module, get_codegen, list_codegens, register_codegen
from .c import generate_c
from .c_module import KernelCSourceModule, build_c, c_compile_options
from . import cache

register_codegen("c", build_c, override=True)


def _build_llvm(funcs: Any, target: Any) -> Any:
    # llvmlite is imported only when an llvm target is actually built
    from .llvm_module import build_llvm

    return build_llvm(funcs, target)


register_codegen("llvm", _build_llvm, override=True)


def __getattr__(name: str) -> Any:
    if name in ("LLVMModule", "build_llvm", "generate_llvm_ir"):
        from . import llvm_module

        return getattr(llvm_module, name)
    raise AttributeError(f"module 'kiln.codegen' has no attribute {name!r}")


__all__ = [
    "build_module", "register_codegen", "get_codegen", "list_codegens", "PREFIX", "generate_c", "build_c",
    "c_compile_options", "KernelCSourceModule", "cache", "LLVMModule", "build_llvm", "generate_llvm_ir",
]
