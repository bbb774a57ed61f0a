"""The ``llvm`` codegen entry point and :class:`LLVMModule` (type key ``"llvm"``).

IR is optimised at ``-O<opt_level>`` (default 3) for ``-mcpu`` / ``-mattr`` with llvmlite's
new pass manager and emitted as a PIC object file.  The object is cached on disk (key: IR
text, target string, LLVM version, Kiln version); running in-process links it with the Kiln
crt into a (cached) private shared library through :func:`kiln.runtime.cc.create_shared`.
``export_library`` saves the object (``m.save("libN.o")``) and links it with everything else.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Sequence

import llvmlite.binding as llvm

from ..runtime.errors import CompileError, KilnError
from ..runtime.library_module import CompiledOnDemand
from ..runtime.module import Module, PackedFunction
from ..tir.stmt import PrimFunc
from . import cache
from .c import target_vector_bytes
from .llvm import LLVMCodeGen

__all__ = ["LLVMModule", "build_llvm", "generate_llvm_ir", "target_machine"]

_LOCK = threading.RLock()
_INIT = {"native": False, "all": False}


def _init(all_targets: bool) -> None:
    with _LOCK:
        if not _INIT["native"]:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _INIT["native"] = True
        if all_targets and not _INIT["all"]:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _INIT["all"] = True


def target_machine(target: Any) -> Any:
    """An llvmlite TargetMachine for a target (``-mtriple``, ``-mcpu``, ``-mattr``, ``-opt_level``)."""
    triple = target.attrs.get("mtriple") or llvm.get_process_triple()
    _init(triple != llvm.get_process_triple())
    try:
        t = llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise CompileError(f"LLVM cannot target {triple!r}: {err}") from None
    cpu = target.attrs.get("mcpu") or ""
    feats = ",".join(target.attrs.get("mattr") or [])
    opt = max(0, min(3, int(target.attrs.get("opt_level", 3))))
    return t.create_target_machine(cpu=cpu, features=feats, opt=opt, reloc="pic", codemodel="default")


def generate_llvm_ir(funcs: Sequence[PrimFunc], target: Any) -> tuple[str, list[str]]:
    """Unoptimised LLVM IR text for ``funcs`` and the exported function names."""
    tm = target_machine(target)
    triple = target.attrs.get("mtriple") or llvm.get_process_triple()
    cg = LLVMCodeGen(triple, str(tm.target_data))
    cg.vector_bytes = target_vector_bytes(target)
    for f in funcs:
        cg.add_function(f)
    return cg.finish(), list(cg.func_names)


def _optimize(ir_text: str, target: Any) -> Any:
    """Parse, verify and optimise IR; returns the llvmlite ModuleRef."""
    with _LOCK:
        tm = target_machine(target)
        try:
            mod = llvm.parse_assembly(ir_text)
            mod.verify()
        except RuntimeError as err:
            raise CompileError(f"LLVM codegen produced invalid IR: {err}") from None
        opt = max(0, min(3, int(target.attrs.get("opt_level", 3))))
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pto.loop_vectorization = opt >= 2
        pto.slp_vectorization = opt >= 2
        pto.loop_unrolling = opt >= 2
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod, tm


class LLVMModule(CompiledOnDemand, Module):
    """Kernels compiled by LLVM (type key ``"llvm"``; DSO-exportable object code).

    Parameters
    ----------
    ir_text : str
        The unoptimised LLVM IR.
    func_names : list of str
        Exported packed functions.
    target : kiln.target.Target
        The target it was generated for.

    Notes
    -----
    ``get_source()`` / ``get_source("ll")`` return the optimised IR, ``get_source("asm")``
    the assembly; ``save(path)`` writes the object file (``.ll`` / ``.s`` paths write IR /
    assembly instead).
    """

    type_key = "llvm"

    def __init__(self, ir_text: str, func_names: Sequence[str], target: Any) -> None:
        super().__init__()
        self.ir_text = ir_text
        self.func_names = list(func_names)
        self.target = target
        self.options: list[str] = []  # nothing extra for the linker
        self._obj_path: str | None = None
        self._lib = None
        self._lock = threading.Lock()

    # ---- code --------------------------------------------------------------------
    def object_path(self) -> str:
        """Path of the (cached) object file, compiling on first use."""
        if self._obj_path is None:
            key = cache.make_key("llvm-object", self.ir_text, str(self.target),
                                 ".".join(map(str, llvm.llvm_version_info)))

            def produce(out: str) -> None:
                mod, tm = _optimize(self.ir_text, self.target)
                with open(out, "wb") as f:
                    f.write(tm.emit_object(mod))

            self._obj_path = cache.cached_file(key, "o", produce, what="llvm object")
        return self._obj_path

    def object_code(self) -> bytes:
        """The object file's bytes."""
        with open(self.object_path(), "rb") as f:
            return f.read()

    def get_source(self, fmt: str = "") -> str:
        """Optimised LLVM IR (``""``/``"ll"``), assembly (``"asm"``/``"s"``) or the raw IR (``"ll-raw"``)."""
        if fmt == "ll-raw":
            return self.ir_text
        mod, tm = _optimize(self.ir_text, self.target)
        if fmt in ("asm", "s"):
            return tm.emit_assembly(mod)
        if fmt in ("", "ll", "llvm"):
            return str(mod)
        raise KilnError(f"LLVMModule.get_source: unknown format {fmt!r} (use 'll', 'asm' or 'll-raw')")

    def save(self, path: str | os.PathLike, fmt: str = "") -> None:
        """Write the object file (or IR for ``.ll``, assembly for ``.s``)."""
        p = os.fspath(path)
        kind = fmt or os.path.splitext(p)[1].lstrip(".")
        if kind in ("ll", "s", "asm"):
            with open(p, "w", encoding="utf-8") as f:
                f.write(self.get_source("asm" if kind in ("s", "asm") else "ll"))
            return
        with open(p, "wb") as f:
            f.write(self.object_code())

    @property
    def is_dso_exportable(self) -> bool:
        return True

    def list_functions(self) -> list[str]:
        """Names of the packed functions this module defines."""
        return list(self.func_names)

    # ---- in-process execution --------------------------------------------------
    def _library(self):  # noqa: ANN202 - LibraryModule
        if self._lib is None:
            with self._lock:
                if self._lib is None:
                    from ..runtime.elf import ElfFile
                    from ..runtime.library_module import LibraryModule

                    path = cache.build_shared([("lib.o", self.object_code())], [], target=str(self.target))
                    self._lib = LibraryModule(path, exported=ElfFile(path).exported_functions())
        return self._lib

    def _get_local_function(self, name: str) -> PackedFunction | None:
        if name not in self.func_names:
            return None
        return self._library()._get_local_function(name)

    def __repr__(self) -> str:
        return f"LLVMModule(funcs={self.func_names}, target={str(self.target)!r})"


def build_llvm(funcs: Sequence[PrimFunc], target: Any) -> LLVMModule:
    """``target.build.llvm``: PrimFuncs → :class:`LLVMModule`."""
    ir_text, names = generate_llvm_ir(funcs, target)
    return LLVMModule(ir_text, names, target)
