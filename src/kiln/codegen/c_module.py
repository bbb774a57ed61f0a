"""The ``c`` codegen entry point and the C source module it returns."""

from __future__ import annotations

from typing import Any, Sequence

from ..runtime.csource import CSourceModule
from ..target.isa import isa_of
from ..tir.stmt import PrimFunc
from .c import generate_c

__all__ = ["KernelCSourceModule", "build_c", "c_compile_options"]


class KernelCSourceModule(CSourceModule):
    """A :class:`kiln.runtime.CSourceModule` (type key ``"c"``) whose in-process library
    comes from the compile cache (:mod:`kiln.codegen.cache`) instead of a fresh compile.

    Exporting is unchanged: ``export_library`` saves the C code and compiles it together
    with the other modules using :attr:`options`.
    """

    def __init__(self, code: str, func_names: Sequence[str], options: Sequence[str] | None = None,
                 cc: str | None = None, target: str = "") -> None:
        super().__init__(code, func_names, options)
        self.cc = cc or None
        self.target_str = target

    def isa_requirement(self) -> tuple[str, frozenset[str]] | None:
        """``(arch, features)`` the compiled code may use (see ``LLVMModule.isa_requirement``)."""
        if not self.target_str:
            return None
        isa = isa_of(self.target_str)
        return isa.arch, isa.features

    def _library(self):  # noqa: ANN202 - LibraryModule
        if self._lib is not None:
            return self._lib
        with self._lock:
            if self._lib is None:
                from ..runtime.elf import ElfFile
                from ..runtime.library_module import LibraryModule
                from .cache import build_shared

                path = build_shared([("lib.c", self.code)], self.options, cc=self.cc, target=self.target_str)
                self._lib = LibraryModule(path, exported=ElfFile(path).exported_functions())
        return self._lib


def c_compile_options(target: Any) -> list[str]:
    """C compiler flags for a target of kind ``c`` (or a kind with the same options).

    ``-O<opt_level>``, ``-march=<mcpu>`` when given (``-march=native`` when neither ``-mcpu`` nor
    ``-mtriple`` is), ``-ffp-contract=fast`` (FMA contraction), ``-m<feat>`` / ``-mno-<feat>`` for
    ``-mattr=+feat,-feat``, ``-fno-math-errno`` (lets sqrt etc. inline and vectorize; we never
    read errno) and never ``-ffast-math``: results must stay IEEE-faithful.  ``-cflags``
    are appended last so they win.
    """
    a = target.attrs
    opts = [f"-O{int(a.get('opt_level', 3))}", "-fno-math-errno", "-ffp-contract=fast", "-Wno-unused-function"]
    mcpu = a.get("mcpu") or ""
    if mcpu:
        opts.append(f"-march={mcpu}")
    elif not a.get("mtriple"):
        # no CPU named and not cross-compiling: the kernels run here, so use the host's ISA
        # (the codegen sizes its vectors from the same host flags)
        opts.append("-march=native")
    for feat in a.get("mattr") or []:
        if feat.startswith("+"):
            opts.append(f"-m{feat[1:]}")
        elif feat.startswith("-"):
            opts.append(f"-mno-{feat[1:]}")
        else:
            opts.append(f"-m{feat}")
    opts.extend(a.get("cflags") or [])
    return opts


def build_c(funcs: Sequence[PrimFunc], target: Any, extra_options: Sequence[str] = ()) -> KernelCSourceModule:
    """``target.build.c``: PrimFuncs → :class:`KernelCSourceModule`.

    Parameters
    ----------
    funcs : list of PrimFunc
    target : kiln.target.Target
    extra_options : list of str
        Appended to :func:`c_compile_options` (used by kinds that reuse this codegen).
    """
    code, names = generate_c(funcs, target)
    opts = c_compile_options(target) + list(extra_options)
    return KernelCSourceModule(code, names, opts, cc=target.attrs.get("cc") or None, target=str(target))
