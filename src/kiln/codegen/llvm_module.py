"""The ``llvm`` codegen entry point and :class:`LLVMModule` (type key ``"llvm"``).

IR is optimised at ``-O<opt_level>`` (default 3) for ``-mcpu`` / ``-mattr`` with llvmlite's
new pass manager and emitted as PIC object code, **one object per kernel**. Each object is
cached on disk under a key computed *before* any IR is generated: the kernel's structural
fingerprint (:func:`kiln.tir.fingerprint.structural_fingerprint`), the target string and host
triple, the LLVM version and a digest of the code generator's own source. A cached build thus
skips IR generation entirely; an uncached one generates IR kernel by kernel while worker
processes compile the previous kernels (:mod:`kiln.codegen.llvm_jobs`).

Running in-process links the objects with the Kiln crt into a (cached) private shared library
through :func:`kiln.runtime.cc.create_shared`. ``export_library`` saves one relocatable object
(``m.save("libN.o")``: the kernels' objects joined with ``cc -r``, cached too) and links it
with everything else.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import threading
from typing import Any, Sequence

import llvmlite
import llvmlite.binding as llvm

from ..runtime import cc as _cc
from ..runtime.errors import CompileError, KilnError
from ..runtime.library_module import CompiledOnDemand
from ..runtime.module import Module, PackedFunction
from ..tir.fingerprint import structural_fingerprint
from ..target.isa import isa_of
from ..tir.stmt import PrimFunc
from . import cache, llvm_jobs, llvm_worker
from .c import target_vector_bytes
from .llvm import LLVMCodeGen

__all__ = ["LLVMModule", "build_llvm", "generate_llvm_ir", "target_machine"]

#: Version of the object-cache key layout (bump when the key's parts change meaning).
_KEY_VERSION = "llvm-kernel-object/1"
#: What, besides the TIR, decides a kernel's object code: the code generator and what it calls.
_CODEGEN_SOURCES = ("codegen", "tir", "target", "runtime/dtype.py")


def _spec(target: Any) -> dict[str, Any]:
    """Triple, CPU, features and -O level of ``target`` (the compile worker's request header)."""
    return {
        "triple": target.attrs.get("mtriple") or llvm.get_process_triple(),
        "cpu": target.attrs.get("mcpu") or "",
        "features": ",".join(target.attrs.get("mattr") or []),
        "opt": max(0, min(3, int(target.attrs.get("opt_level", 3)))),
    }


def target_machine(target: Any) -> Any:
    """An llvmlite TargetMachine for a target (``-mtriple``, ``-mcpu``, ``-mattr``, ``-opt_level``)."""
    sp = _spec(target)
    try:
        return llvm_worker.make_target_machine(sp["triple"], sp["cpu"], sp["features"], sp["opt"])
    except ValueError as err:
        raise CompileError(str(err)) from None


def _codegen(target: Any, data_layout: str | None = None) -> LLVMCodeGen:
    """A fresh code generator for ``target`` (``data_layout``: reuse one already asked of LLVM)."""
    if data_layout is None:
        data_layout = str(target_machine(target).target_data)
    cg = LLVMCodeGen(_spec(target)["triple"], data_layout)
    cg.vector_bytes = target_vector_bytes(target)
    return cg


def generate_llvm_ir(funcs: Sequence[PrimFunc], target: Any) -> tuple[str, list[str]]:
    """Unoptimised LLVM IR text for ``funcs`` (one module) and the exported function names."""
    cg = _codegen(target)
    for f in funcs:
        cg.add_function(f)
    return cg.finish(), list(cg.func_names)


def _optimize(ir_text: str, target: Any) -> tuple[Any, Any]:
    """Parse, verify and optimise IR; returns the llvmlite ModuleRef and the TargetMachine."""
    tm = target_machine(target)
    try:
        return llvm_worker.optimize(ir_text, tm, _spec(target)["opt"]), tm
    except ValueError as err:
        raise CompileError(str(err)) from None


def _compile_here(ir_text: str, target: Any) -> bytes:
    sp = _spec(target)
    try:
        return llvm_worker.compile_object(ir_text, sp["triple"], sp["cpu"], sp["features"], sp["opt"])
    except ValueError as err:
        raise CompileError(str(err)) from None


def _kernel_key(fingerprint: str, target: Any) -> str:
    sp = _spec(target)
    return cache.make_key(_KEY_VERSION, fingerprint, str(target), sp["triple"],
                          ".".join(map(str, llvm.llvm_version_info)), llvmlite.__version__,
                          cache.source_digest(*_CODEGEN_SOURCES))


class LLVMModule(CompiledOnDemand, Module):
    """Kernels compiled by LLVM (type key ``"llvm"``; DSO-exportable object code).

    Parameters
    ----------
    objects : list of str
        Paths of the kernels' object files (cache entries; not modified).
    func_names : list of str
        Exported packed functions.
    target : kiln.target.Target
        The target it was generated for.
    funcs : list of PrimFunc, optional
        The kernels, kept so that IR and assembly can be shown on request.

    Notes
    -----
    ``get_source()`` / ``get_source("ll")`` return the optimised IR of all kernels as one
    module, ``get_source("asm")`` its assembly, ``get_source("ll-raw")`` the unoptimised IR;
    ``save(path)`` writes one relocatable object (``.ll`` / ``.s`` paths write IR / assembly).
    """

    type_key = "llvm"

    def __init__(self, objects: Sequence[str], func_names: Sequence[str], target: Any,
                 funcs: Sequence[PrimFunc] | None = None) -> None:
        super().__init__()
        self.objects = list(objects)
        self.func_names = list(func_names)
        self.target = target
        self.funcs = list(funcs) if funcs is not None else None
        self.options: list[str] = []  # nothing extra for the linker
        self._ir_text: str | None = None
        self._obj_path: str | None = None
        self._lib = None
        self._lock = threading.Lock()

    def isa_requirement(self) -> tuple[str, frozenset[str]]:
        """``(arch, features)`` the kernels' code may use: what a library holding them needs.

        From :func:`kiln.target.isa_of` of the target; ``export_library`` records it and
        ``load_module`` checks it (:mod:`kiln.runtime.cpu_features`).
        """
        isa = isa_of(self.target)
        return isa.arch, isa.features

    def target_triple(self) -> str:
        """The LLVM triple the kernels' object code is for (``-mtriple``, else this machine's).

        ``export_library`` links a library with the C compiler for this triple
        (:func:`kiln.runtime.cc.cc_for_modules`): a cross compiler for another machine's.
        """
        return str(_spec(self.target)["triple"])

    # ---- code --------------------------------------------------------------------
    @property
    def ir_text(self) -> str:
        """The unoptimised IR of every kernel as one module (generated on first use)."""
        if self._ir_text is None:
            if self.funcs is None:
                raise KilnError("this LLVMModule keeps no kernels, so it cannot show their IR")
            self._ir_text = generate_llvm_ir(self.funcs, self.target)[0]
        return self._ir_text

    def object_path(self) -> str:
        """Path of one relocatable object holding every kernel (made and cached on first use).

        The kernels' objects are joined with ``cc -r``: the host's compiler for the host's
        triple, the triple's cross compiler (:func:`kiln.runtime.cc.cross_cc_for_triple`) for
        another machine's. Without one (the host's linker cannot join another machine's
        objects) all kernels are compiled again as one LLVM module (cached too; for ResNet-18
        on AArch64, 26 s instead of about 1 s).
        """
        if self._obj_path is None:
            if len(self.objects) == 1:
                self._obj_path = self.objects[0]
            elif _spec(self.target)["triple"] == llvm.get_process_triple():
                self._obj_path = _join_objects(self.objects, self.target)
            else:
                try:
                    cross = _cc.cross_cc_for_triple(self.target_triple())
                except CompileError:
                    cross = None
                if cross is not None:
                    self._obj_path = _join_objects(self.objects, self.target, cross)
                else:
                    self._obj_path = self._whole_module_object()
        return self._obj_path

    def _whole_module_object(self) -> str:
        if self.funcs is None:
            raise KilnError(f"this LLVMModule keeps no kernels, so its {len(self.objects)} objects for "
                            f"{_spec(self.target)['triple']} cannot be made into one")
        fps = [structural_fingerprint(f) for f in self.funcs]
        key = None
        if all(fp is not None for fp in fps):
            key = _kernel_key("whole:" + ",".join(fp for fp in fps if fp is not None), self.target)

        def produce(out: str) -> None:
            with open(out, "wb") as f:
                f.write(_compile_here(self.ir_text, self.target))

        if key is None:  # an unfingerprintable kernel: key by the IR itself
            key = cache.make_key(_KEY_VERSION, "whole-ir", self.ir_text, str(self.target))
        return cache.cached_file(key, "o", produce, what="llvm whole-module object")

    def object_code(self) -> bytes:
        """The object file's bytes."""
        with open(self.object_path(), "rb") as f:
            return f.read()

    def get_source(self, fmt: str = "") -> str:
        """Optimised LLVM IR (``""``/``"ll"``), assembly (``"asm"``/``"s"``) or the raw IR (``"ll-raw"``)."""
        if fmt == "ll-raw":
            return self.ir_text
        if fmt not in ("", "ll", "llvm", "asm", "s"):
            raise KilnError(f"LLVMModule.get_source: unknown format {fmt!r} (use 'll', 'asm' or 'll-raw')")
        mod, tm = _optimize(self.ir_text, self.target)
        if fmt in ("asm", "s"):
            return str(tm.emit_assembly(mod))
        return str(mod)

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

                    sources = []
                    for i, p in enumerate(self.objects):
                        with open(p, "rb") as f:
                            sources.append((f"k{i}.o", f.read()))
                    path = cache.build_shared(sources, [], target=str(self.target))
                    self._lib = LibraryModule(path, exported=ElfFile(path).exported_functions())
        return self._lib

    def _get_local_function(self, name: str) -> PackedFunction | None:
        if name not in self.func_names:
            return None
        return self._library()._get_local_function(name)

    def __repr__(self) -> str:
        return f"LLVMModule(funcs={self.func_names}, target={str(self.target)!r})"


def _join_objects(objects: Sequence[str], target: Any, cc: str | None = None) -> str:
    """One relocatable object from several (``cc -r``; default :func:`kiln.runtime.cc.get_cc`),
    cached by the objects' contents."""
    contents = []
    for p in objects:
        with open(p, "rb") as f:
            contents.append(f.read())
    compiler = shlex.split(cc or _cc.get_cc())
    key = cache.make_key("llvm-joined-object/1", str(target), shlex.join(compiler), *contents)

    def produce(out: str) -> None:
        with tempfile.TemporaryDirectory(prefix="kiln_join_") as tmp:
            files = []
            for i, data in enumerate(contents):
                fp = os.path.join(tmp, f"k{i}.o")
                with open(fp, "wb") as f:
                    f.write(data)
                files.append(fp)
            cmd = [*compiler, "-r", "-nostdlib", "-o", out, *files]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise CompileError(f"joining the kernels' objects failed: {shlex.join(cmd)}\n"
                                   f"{proc.stdout.decode('utf-8', 'replace')}")

    return cache.cached_file(key, "o", produce, what="joined llvm object")


def build_llvm(funcs: Sequence[PrimFunc], target: Any) -> LLVMModule:
    """``target.build.llvm``: PrimFuncs → :class:`LLVMModule`.

    Every kernel is looked up in the object cache by its structural fingerprint first; only
    the misses have IR generated and compiled (in parallel, see :mod:`kiln.codegen.llvm_jobs`).

    Raises
    ------
    CompileError
        If two kernels have one name, or LLVM rejects a kernel.
    """
    funcs = list(funcs)
    if not funcs:  # still a valid (empty) object, so that export and linking need no special case
        ir = generate_llvm_ir([], target)[0]
        key = cache.make_key(_KEY_VERSION, "empty", str(target), _spec(target)["triple"])
        return LLVMModule([cache.store(key, "o", _compile_here(ir, target))], [], target, [])
    names: list[str] = []
    for f in funcs:
        name = f.attrs.get("global_symbol", f.name)
        if name in names:
            raise CompileError(f"LLVM codegen: two functions named {name}")
        names.append(name)
    keys: list[str | None] = []
    paths: list[str | None] = []
    for f in funcs:
        fp = structural_fingerprint(f)
        kkey = _kernel_key(fp, target) if fp is not None else None
        keys.append(kkey)
        paths.append(cache.lookup(kkey, "o", what="llvm kernel object") if kkey is not None else None)
    misses = [i for i, p in enumerate(paths) if p is None]
    if misses:
        ir_of: dict[int, str] = {}

        def generate() -> Any:
            layout = str(target_machine(target).target_data)
            for i in misses:
                cg = _codegen(target, layout)  # one module per kernel: one object per cache entry
                cg.add_function(funcs[i])
                ir = cg.finish()
                if keys[i] is None:
                    ir_of[i] = ir
                yield names[i], ir

        objs = llvm_jobs.compile_all(generate(), _spec(target), len(misses),
                                     lambda ir: _compile_here(ir, target))
        for i, obj in zip(misses, objs):
            key = keys[i] or cache.make_key(_KEY_VERSION, "ir", ir_of[i], str(target), _spec(target)["triple"],
                                            ".".join(map(str, llvm.llvm_version_info)))
            paths[i] = cache.store(key, "o", obj, what="llvm kernel object")
    return LLVMModule([p for p in paths if p is not None], names, target, funcs)
