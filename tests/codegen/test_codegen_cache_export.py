"""Compile cache behaviour and exporting generated modules into one library."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

import kiln
from kiln import codegen, te, tir
from kiln.codegen import cache


def _func(name: str, scale: float):
    A = te.placeholder((17,), name="A")
    B = te.compute((17,), lambda i: A[i] * scale + 1.0, name="B")
    s = te.create_schedule(B)
    o, i = s[B].split(B.op.axis[0], factor=4)
    s[B].vectorize(i)
    return tir.lower(s, [A, B], name)


def _run(mod, name, scale):
    a = np.linspace(-1, 1, 17).astype("float32")
    b = np.zeros(17, "float32")
    mod[name](a, b)
    np.testing.assert_allclose(b, a * scale + 1.0, rtol=1e-6)


@pytest.mark.parametrize("kind", ["c", "llvm"])
def test_second_build_hits_cache(kind, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cache.reset_stats()
    _run(codegen.build_module([_func("cached_k", 2.0)], kind), "cached_k", 2.0)
    first = dict(cache.stats)
    assert first["misses"] >= 1 and first["hits"] == 0
    _run(codegen.build_module([_func("cached_k", 2.0)], kind), "cached_k", 2.0)
    assert cache.stats["misses"] == first["misses"]  # nothing recompiled
    assert cache.stats["hits"] >= 1
    # a different kernel or target is a different entry
    _run(codegen.build_module([_func("cached_k", 3.0)], kind), "cached_k", 3.0)
    assert cache.stats["misses"] > first["misses"]


def test_corrupted_entry_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cache.reset_stats()
    m = codegen.build_module([_func("corrupt_k", 2.0)], "c")
    # Build the entry without loading it (a mapped library must never be modified).
    src = [("lib.c", m.get_source())]
    so = cache.build_shared(src, m.options, target=m.target_str)
    with open(so, "r+b") as f:  # truncate: what a crash of a non-atomic writer would leave
        f.truncate(100)
    misses = cache.stats["misses"]
    assert cache.build_shared(src, m.options, target=m.target_str) == so
    assert cache.stats["misses"] == misses + 1 and os.path.getsize(so) > 100
    _run(m, "corrupt_k", 2.0)  # served from the rebuilt entry
    assert cache.stats["hits"] >= 1


def test_cache_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_CACHE", "0")
    _run(codegen.build_module([_func("nocache_k", 2.0)], "c"), "nocache_k", 2.0)
    assert not glob.glob(str(tmp_path / "*" / "*.so"))


def test_export_c_and_llvm_into_one_library(tmp_path):
    cmod = codegen.build_module([_func("from_c", 2.0)], "c")
    lmod = codegen.build_module([_func("from_llvm", 5.0)], "llvm")
    assert lmod.type_key == "llvm" and lmod.is_dso_exportable and cmod.type_key == "c"
    lmod.import_module(cmod)
    path = lmod.export_library(str(tmp_path / "both.so"))
    loaded = kiln.runtime.load_module(path)
    _run(loaded, "from_llvm", 5.0)
    loaded_c = loaded.get_function("from_c", query_imports=True)
    a = np.ones(17, "float32")
    b = np.zeros(17, "float32")
    loaded_c(a, b)
    np.testing.assert_allclose(b, 3.0)


def test_llvm_module_sources(tmp_path):
    m = codegen.build_module([_func("src_k", 2.0)], "llvm -mcpu=native")
    ll = m.get_source()
    assert "define" in ll and "src_k" in ll
    asm = m.get_source("asm")
    assert "src_k" in asm
    m.save(str(tmp_path / "k.o"))
    assert open(tmp_path / "k.o", "rb").read(4) == b"\x7fELF"
    assert "KilnBackendParallelLaunch" not in m.get_source("ll-raw")  # no parallel loop here


def test_c_module_source_contract():
    m = codegen.build_module([_func("csrc_k", 2.0)], "c -mcpu=native")
    src = m.get_source()
    assert "#include <kiln/c_runtime_api.h>" in src
    assert "KILN_DLL int32_t csrc_k(KilnValue* args, int32_t* type_codes, int32_t num_args" in src
    assert "-march=native" in m.options and "-O3" in m.options
    assert not any("fast-math" in o for o in m.options)
