"""C source modules (type key ``"c"``): C code that is compiled into the exported library.

A C source module is also runnable in-process: the first :meth:`CSourceModule.get_function`
compiles the code, together with the Kiln crt, into a private temporary shared library and
serves functions from it. That needs a C compiler; loading an *exported* library does not.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from typing import Sequence

from . import cc
from .errors import InputError, KilnError
from .library_module import CompiledOnDemand
from .module import Module, PackedFunction

__all__ = ["CSourceModule", "csource_module"]


class CSourceModule(CompiledOnDemand, Module):
    """C source code exporting packed functions.

    Parameters
    ----------
    code : str
        C source; it should ``#include <kiln/c_runtime_api.h>``.
    func_names : list of str
        The packed functions the code defines (only these are served by ``get_function``).
    options : list of str, optional
        Extra compiler flags for this code (used in-process and when exported).
    """

    type_key = "c"

    def __init__(self, code: str, func_names: Sequence[str], options: Sequence[str] | None = None) -> None:
        super().__init__()
        if not isinstance(code, str):
            raise InputError(f"csource_module: code must be a str, got {type(code).__name__}")
        if isinstance(func_names, str):
            func_names = [func_names]
        self.code = code
        self.func_names: list[str] = [str(n) for n in func_names]
        self.options: list[str] = list(options or [])
        self._lib = None
        self._lock = threading.Lock()

    @property
    def is_dso_exportable(self) -> bool:
        return True

    def get_source(self, fmt: str = "") -> str:
        """The C code (``fmt`` may be ``""``, ``"c"`` or ``"cc"``)."""
        return self.code

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Write the C code to ``path``."""
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(self.code)

    def list_functions(self) -> list[str]:
        """Names of the packed functions this module defines."""
        return list(self.func_names)

    def _library(self):  # -> LibraryModule
        if self._lib is not None:
            return self._lib
        with self._lock:
            if self._lib is None:
                from . import crt_source_path
                from .elf import ElfFile
                from .library_module import LibraryModule

                tmp = tempfile.mkdtemp(prefix="kiln_csrc_")
                try:
                    src = os.path.join(tmp, "lib.c")
                    self.save(src)
                    out = os.path.join(tmp, "lib.so")
                    cc.create_shared(out, [src, crt_source_path()], options=self.options)
                    lib = LibraryModule(out, exported=ElfFile(out).exported_functions())
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                # The mapping survives unlinking; remove the directory when the library goes.
                weakref.finalize(lib, shutil.rmtree, tmp, True)
                self._lib = lib
        return self._lib

    def _get_local_function(self, name: str) -> PackedFunction | None:
        if name not in self.func_names:
            return None
        f = self._library()._get_local_function(name)
        if f is None:
            raise KilnError(f"C source module lists {name!r} in func_names but the compiled code does not export it")
        return f

    def __repr__(self) -> str:
        return f"CSourceModule(funcs={self.func_names}, {len(self.code)} chars, imports={len(self._import_list())})"


def csource_module(code: str, func_names: Sequence[str], options: Sequence[str] | None = None) -> CSourceModule:
    """Create a C source module (TVM's ``csource_module_create``).

    Parameters
    ----------
    code : str
        C source defining packed functions.
    func_names : list of str
        The functions it defines.
    options : list of str, optional
        Extra compiler flags.

    Returns
    -------
    CSourceModule
    """
    return CSourceModule(code, func_names, options)
