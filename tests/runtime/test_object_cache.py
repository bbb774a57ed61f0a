"""The Kiln crt / C API objects persist in the on-disk compile cache (issue 16, compile speed).

``export_library`` compiles ``kiln_crt.c`` and ``kiln_model_api.c`` into every library. The
runtime cannot import the compile cache (``kiln.codegen.cache``), so the compiler side hands it
down as a hook (``export_object_cache`` on the modules ``kiln.build`` returns, the
:data:`kiln.runtime.cc.ObjectCache` protocol). These tests check that a second fresh process
runs no C compile for them, that a tampered entry is recompiled (never linked), that
``KILN_CACHE=0`` compiles afresh, and what the key covers.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kiln.runtime as rt
from kiln.codegen import cache
from kiln.runtime import cc, elf_object

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF libraries only")

KILN_SOURCES = ("kiln_crt.c", "kiln_model_api.c")

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import kiln
    from kiln.ir import Graph

    g = Graph("g")
    g.outputs = [g.add("add", g.add_input("a", (3, 4)), g.add_input("w", (3, 4)))]
    w = np.arange(12, dtype="float32").reshape(3, 4)
    so = kiln.build(g, target="llvm", params={"w": w}).export_library(sys.argv[1])
    m = kiln.GraphModule(kiln.runtime.load_module(so)["default"](kiln.cpu()))
    m.set_input("a", np.ones((3, 4), "float32"))
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), w + 1)
    print("ok")
    """
)


@pytest.fixture
def logging_cc(tmp_path):
    """A ``$CC`` that logs each command line (one per line) and runs the real compiler."""
    real = shlex.split(cc.get_cc())
    real[0] = shutil.which(real[0]) or real[0]
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "logcc"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(log))}\nexec {shlex.join(real)} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), log


def _kiln_compiles(log: Path) -> list[str]:
    """The logged ``-c`` compiles of the crt / C API sources."""
    if not log.exists():
        return []
    return [ln for ln in log.read_text().splitlines()
            if " -c " in f" {ln} " and any(s in ln for s in KILN_SOURCES)]


def _child(tmp_path: Path, cache_dir: Path, wrapper: str, log: Path, name: str, **env: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    if log.exists():
        log.unlink()
    full = dict(os.environ, KILN_CACHE_DIR=str(cache_dir), CC=wrapper, **env)
    if "KILN_CACHE" not in env:
        full.pop("KILN_CACHE", None)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / f"{name}.so")], env=full,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    return _kiln_compiles(log)


def test_fresh_process_reuses_the_objects_and_kiln_cache_0_compiles(tmp_path, logging_cc):
    wrapper, log = logging_cc
    cache_dir = tmp_path / "cache"
    first = _child(tmp_path, cache_dir, wrapper, log, "first")
    assert len(first) == 2 and {s for s in KILN_SOURCES if any(s in ln for ln in first)} == set(KILN_SOURCES)
    second = _child(tmp_path, cache_dir, wrapper, log, "second")
    assert second == []  # a fresh process: both objects came from the cache
    off = _child(tmp_path, cache_dir, wrapper, log, "off", KILN_CACHE="0")
    assert len(off) == 2  # the cache is off: compiled afresh, in a private directory


def _counting_cache(calls: list[str]):
    def object_cache(key: str, ext: str, produce):
        def counted(path: str) -> None:
            calls.append(key)
            produce(path)

        return cache.cached_object(key, ext, counted)

    return object_cache


def test_tampered_entry_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    monkeypatch.setattr(cc, "_object_cache", {})  # start from nothing known to this process
    calls: list[str] = []
    oc = _counting_cache(calls)
    opts = ["-DKILN_OBJECT_CACHE_TEST=1"]
    obj = cc.compile_object_cached(rt.crt_source_path(), opts, object_cache=oc)
    assert len(calls) == 1
    good = Path(obj).read_bytes()
    entries = list((tmp_path / "cache").glob("*/*.o"))
    assert len(entries) == 1 and entries[0].read_bytes() == good
    assert not entries[0].samefile(obj)  # the process links a private copy

    monkeypatch.setattr(cc, "_object_cache", {})  # as a fresh process would
    assert Path(cc.compile_object_cached(rt.crt_source_path(), opts, object_cache=oc)).read_bytes() == good
    assert len(calls) == 1  # a hit

    # Tampered (same size, one byte changed: the MAC no longer verifies), then foreign (an
    # entry written without the per-user key, with a made-up MAC): recompiled both times.
    for tamper in ("flip", "foreign"):
        entry = entries[0]
        data = bytearray(entry.read_bytes())
        if tamper == "flip":
            data[len(data) // 2] ^= 0xFF
            entry.write_bytes(bytes(data))
        else:
            entry.write_bytes(b"\x7fELF" + b"\0" * 60)
            Path(str(entry) + ".mac").write_text("0" * 64 + "\n")
        monkeypatch.setattr(cc, "_object_cache", {})
        n = len(calls)
        obj = cc.compile_object_cached(rt.crt_source_path(), opts, object_cache=oc)
        assert len(calls) == n + 1, tamper
        assert Path(obj).read_bytes() == good and entry.read_bytes() == good
        assert elf_object.read_object_header(obj) is not None


def test_disabled_cache_compiles_privately(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KILN_CACHE", "0")
    monkeypatch.setattr(cc, "_object_cache", {})
    calls: list[str] = []
    obj = cc.compile_object_cached(rt.crt_source_path(), ["-DKILN_OBJECT_CACHE_TEST=2"],
                                   object_cache=_counting_cache(calls))
    assert os.path.isfile(obj) and calls == []  # the hook declined: the runtime compiled itself
    assert not list((tmp_path / "cache").glob("*/*.o"))


def test_key_covers_source_flags_compiler_and_headers(tmp_path, monkeypatch):
    compiler = shlex.split(cc.get_cc())
    inc = rt.include_path()
    flags = ["-O2", "-fPIC", "-std=gnu11", "-I", inc]
    src = rt.crt_source_path()
    content = Path(src).read_bytes()
    base = cc.object_cache_key(compiler, flags, src, content)
    assert base is not None and len(base) == 64
    assert cc.object_cache_key(compiler, flags, src, content) == base  # stable
    assert cc.object_cache_key(compiler, flags, src, content + b"\n") != base  # source content
    assert cc.object_cache_key(compiler, [*flags, "-O3"], src, content) != base  # flags
    assert cc.object_cache_key(compiler, [*flags, "-DX=1"], src, content) != base
    assert cc.object_cache_key(compiler, flags, src + ".copy.c", content) != base  # path
    monkeypatch.setitem(cc._version_cache, tuple(compiler), "cc (Made Up) 0.1")
    assert cc.object_cache_key(compiler, flags, src, content) != base  # compiler version
    monkeypatch.delitem(cc._version_cache, tuple(compiler))
    monkeypatch.setitem(cc._header_digests, inc, "0" * 64)
    assert cc.object_cache_key(compiler, flags, src, content) != base  # a Kiln header changed
    monkeypatch.delitem(cc._header_digests, inc)
    assert cc.object_cache_key(compiler, flags, src, content) == base
    # Not persisted: flags that read files the key cannot see, or a compiler without a version.
    assert cc.object_cache_key(compiler, [*flags, "-I", str(tmp_path)], src, content) is None
    assert cc.object_cache_key(compiler, [*flags, "-include", "x.h"], src, content) is None
    assert cc.object_cache_key([str(tmp_path / "no-such-cc")], flags, src, content) is None


def test_header_digest_follows_the_include_directory(tmp_path):
    d = tmp_path / "inc" / "kiln"
    d.mkdir(parents=True)
    (d / "a.h").write_text("#define A 1\n")
    one = cc._headers_digest(str(tmp_path / "inc"))
    (d / "a.h").write_text("#define A 2\n")
    cc._header_digests.pop(str(tmp_path / "inc"))
    assert cc._headers_digest(str(tmp_path / "inc")) != one


def _tiny_graph():
    import numpy as np

    from kiln.ir import Graph

    g = Graph("g")
    g.outputs = [g.add("add", g.add_input("a", (3, 4)), g.add_input("w", (3, 4)))]
    return g, {"w": np.arange(12, dtype="float32").reshape(3, 4)}


def test_build_compiles_them_before_export_asks(tmp_path, monkeypatch):
    """``kiln.build`` starts the crt / C API compiles in the background; the export then finds
    both in the cache (the same keys: same compiler, flags and sources)."""
    import numpy as np

    import kiln
    from kiln.runtime import export

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    monkeypatch.setattr(cc, "_object_cache", {})
    calls: list[str] = []
    waits = []
    real = export.prepare_export_objects

    def spy(object_cache, *args, **kwargs):
        assert object_cache is cache.cached_object
        waits.append(real(_counting_cache(calls), *args, **kwargs))
        return waits[-1]

    monkeypatch.setattr(export, "prepare_export_objects", spy)
    g, params = _tiny_graph()
    factory = kiln.build(g, target="llvm", params=params)
    assert len(waits) == 1
    waits[0]()
    assert len(calls) == 2  # crt and C API driver, compiled while the build ran
    monkeypatch.setattr(cc, "_object_cache", {})  # the export must find them in the cache itself
    so = factory.export_library(str(tmp_path / "m.so"), object_cache=_counting_cache(calls))
    assert len(calls) == 2  # no compile of either at export time
    m = kiln.GraphModule(kiln.runtime.load_module(so)["default"](kiln.cpu()))
    m.run(a=np.ones((3, 4), "float32"))
    np.testing.assert_allclose(m.get_output(0).numpy(), params["w"] + 1)

    # Nothing is started for code for another machine, or with the cache off.
    kiln.build(g, target="llvm -mtriple=aarch64-linux-gnu", params=params)
    monkeypatch.setenv("KILN_CACHE", "0")
    kiln.build(g, target="llvm", params=params)
    assert len(waits) == 1
