"""LLVM kernels: structural cache keys (looked up before IR generation) and parallel compile workers."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kiln import codegen, te, tir
from kiln.codegen import cache, llvm_jobs
from kiln.codegen import llvm as llvm_codegen
from kiln.runtime.errors import CompileError
from kiln.tir.fingerprint import structural_fingerprint


def _func(name: str, scale: float, n: int = 17, dtype: str = "float32"):
    A = te.placeholder((n,), name="A", dtype=dtype)
    B = te.compute((n,), lambda i: A[i] * scale + 1.0, name="B")
    s = te.create_schedule(B)
    _o, i = s[B].split(B.op.axis[0], factor=4)
    s[B].vectorize(i)
    return tir.lower(s, [A, B], name)


def _funcs(k: int) -> list:
    return [_func(f"kern_{j}", 1.0 + j) for j in range(k)]


def _check(mod, k: int) -> None:
    a = np.linspace(-1, 1, 17).astype("float32")
    for j in range(k):
        b = np.zeros(17, "float32")
        mod[f"kern_{j}"](a, b)
        np.testing.assert_allclose(b, a * (1.0 + j) + 1.0, rtol=1e-6)


# ----------------------------------------------------------------------------- fingerprints
def test_fingerprint_is_stable_across_independent_lowerings():
    assert structural_fingerprint(_func("f", 2.0)) == structural_fingerprint(_func("f", 2.0))


@pytest.mark.parametrize("other", [
    dict(name="g"),              # the exported symbol
    dict(scale=2.0000001),       # a constant, to the last bit
    dict(n=18),                  # a shape / loop extent
    dict(dtype="float64"),       # a dtype
])
def test_fingerprint_sees_every_difference(other):
    base = dict(name="f", scale=2.0, n=17, dtype="float32")
    assert structural_fingerprint(_func(**base)) != structural_fingerprint(_func(**{**base, **other}))


def test_fingerprint_distinguishes_variable_identity():
    # x + x and x + y (y named like x) print alike; they must not share a cache entry
    x, y = tir.Var("x", "int32"), tir.Var("x", "int32")
    buf = tir.Buffer("out", (1,), "int32")
    same = tir.PrimFunc("f", [buf], tir.BufferStore(buf, x + x, [tir.IntImm(0)]))
    diff = tir.PrimFunc("f", [buf], tir.BufferStore(buf, x + y, [tir.IntImm(0)]))
    assert structural_fingerprint(same) != structural_fingerprint(diff)


def test_fingerprint_refuses_unknown_values():
    f = _func("f", 2.0)
    f.attrs["opaque"] = object()  # not serialisable faithfully: key by the generated code instead
    assert structural_fingerprint(f) is None


# ----------------------------------------------------------------------------- cache before IR
def test_cached_rebuild_generates_no_ir(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cache.reset_stats()
    _check(codegen.build_module(_funcs(3), "llvm"), 3)
    assert cache.stats["misses"] >= 3 and cache.stats["hits"] == 0

    def no_ir(self, f):
        raise AssertionError(f"IR generated for {f.name} although its object is cached")

    monkeypatch.setattr(llvm_codegen.LLVMCodeGen, "add_function", no_ir)
    cache.reset_stats()
    mod = codegen.build_module(_funcs(3), "llvm")
    assert cache.stats["hits"] >= 3 and cache.stats["misses"] == 0
    _check(mod, 3)


def test_one_changed_kernel_recompiles_only_itself(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    codegen.build_module(_funcs(3), "llvm")
    cache.reset_stats()
    funcs = _funcs(2) + [_func("kern_2", 7.0)]
    mod = codegen.build_module(funcs, "llvm")
    assert cache.stats["misses"] == 1
    b = np.zeros(17, "float32")
    a = np.ones(17, "float32")
    mod["kern_2"](a, b)
    np.testing.assert_allclose(b, 8.0)


def test_unfingerprintable_kernel_still_builds_and_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    funcs = _funcs(2)
    funcs[1].attrs["opaque"] = object()
    cache.reset_stats()
    _check(codegen.build_module(funcs, "llvm"), 2)
    assert cache.stats["misses"] >= 2


def test_ir_and_assembly_still_available_from_a_cached_module(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    codegen.build_module(_funcs(2), "llvm")
    mod = codegen.build_module(_funcs(2), "llvm")  # every object from the cache
    assert "define" in mod.get_source("ll-raw") and "kern_1" in mod.get_source("ll")
    assert "kern_0" in mod.get_source("asm")


# ----------------------------------------------------------------------------- compile workers
def test_parallel_and_serial_compiles_give_the_same_objects(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE", "0")
    monkeypatch.setenv("KILN_COMPILE_JOBS", "1")
    serial = codegen.build_module(_funcs(4), "llvm")
    monkeypatch.setenv("KILN_COMPILE_JOBS", "2")
    parallel = codegen.build_module(_funcs(4), "llvm")
    for p, q in zip(serial.objects, parallel.objects):
        with open(p, "rb") as f, open(q, "rb") as g:
            assert f.read() == g.read()
    _check(parallel, 4)


def test_exported_library_of_many_kernel_objects_runs(monkeypatch, tmp_path):
    import kiln.runtime

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    mod = codegen.build_module(_funcs(3), "llvm")
    assert len(mod.objects) == 3
    so = tmp_path / "k.so"
    mod.export_library(str(so))
    _check(kiln.runtime.load_module(str(so)), 3)


def test_dead_worker_is_a_compile_error_naming_the_kernel(monkeypatch):
    monkeypatch.setenv("KILN_CACHE", "0")
    monkeypatch.setenv("KILN_COMPILE_JOBS", "2")
    llvm_jobs.shutdown_workers()
    monkeypatch.setattr(llvm_jobs, "_worker_command",
                        lambda: [sys.executable, "-c", "import sys; sys.stderr.write('worker crashed'); sys.exit(3)"])
    try:
        with pytest.raises(CompileError, match=r"worker died while compiling kern_\d.*worker crashed"):
            codegen.build_module(_funcs(2), "llvm")
    finally:
        llvm_jobs.shutdown_workers()  # the next parallel compile starts real workers


def test_worker_reports_bad_ir_as_compile_error(monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_JOBS", "2")
    spec = {"triple": "x86_64-unknown-linux-gnu", "cpu": "", "features": "", "opt": 2}
    with pytest.raises(CompileError, match="LLVM could not compile bad_kernel: .*invalid IR"):
        llvm_jobs.compile_all(iter([("good", "define void @f() {\n  ret void\n}\n"), ("bad_kernel", "garbage")]),
                              spec, 2, lambda ir: b"")


def test_bad_job_count_is_named(monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_JOBS", "many")
    with pytest.raises(CompileError, match="KILN_COMPILE_JOBS"):
        llvm_jobs.compile_jobs()


def test_cross_target_module_saves_one_object_for_that_machine(monkeypatch, tmp_path):
    """The host's `cc -r` cannot join AArch64 objects: a cross module is compiled whole instead."""
    from kiln.runtime.elf import ElfFile

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    mod = codegen.build_module(_funcs(2), "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    assert len(mod.objects) == 2
    out = tmp_path / "k.o"
    mod.save(str(out))
    data = out.read_bytes()
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 183  # EM_AARCH64
    assert ElfFile(str(out)).exported_functions() == ["kern_0", "kern_1"]
