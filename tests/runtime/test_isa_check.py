"""A library records the CPU features its code may use; loading it where they are missing fails cleanly.

A library built for features the host lacks would die with SIGILL on its first kernel call.
``export_library`` writes the requirement into the ``.kiln_isa`` section (or the ``.tar``
manifest) and ``load_module`` checks it before ``dlopen``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

import kiln.runtime as rt
from kiln import codegen, te, tir
from kiln.runtime import cpu_features
from kiln.runtime.elf import read_section
from kiln.runtime.errors import FormatError, UnsupportedHostError
from kiln.target import isa_of


def _module(target: str):
    a = te.placeholder((37,), name="A", dtype="float32")
    b = te.compute((37,), lambda i: a[i] * 2.0 + 1.0, name="B")
    s = te.create_schedule(b)
    _o, i = s[b].split(b.op.axis[0], factor=8)
    s[b].vectorize(i)
    return codegen.build_module([tir.lower(s, [a, b], "axpb")], target)


def _export(tmp_path, target: str, name: str = "lib.so") -> str:
    path = str(tmp_path / name)
    _module(target).export_library(path)
    return path


def _note(path: str) -> tuple[str, list[str]]:
    data = read_section(path, cpu_features.ISA_SECTION)
    assert data is not None, "the library carries no ISA requirement"
    return cpu_features.decode_requirement(data, path)


def _pretend_host(monkeypatch, arch: str, features) -> None:
    monkeypatch.setattr(cpu_features, "host_cpu", lambda: (arch, None if features is None else frozenset(features)))


def test_library_records_what_its_target_needs(tmp_path):
    arch, feats = _note(_export(tmp_path, "llvm -mcpu=haswell"))
    assert arch == "x86"
    assert {"avx2", "fma", "avx", "sse4.2"} <= set(feats)
    assert not any(f.startswith("avx512") for f in feats)
    _, base = _note(_export(tmp_path, "llvm", "base.so"))  # the x86-64 baseline: SSE2
    assert set(base) == {"sse", "sse2"}


def test_missing_feature_is_refused_before_dlopen(tmp_path, monkeypatch):
    path = _export(tmp_path, "llvm -mcpu=haswell")
    _pretend_host(monkeypatch, "x86", {"sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "avx"})
    opened = []
    monkeypatch.setattr("kiln.runtime.library_module._dlopen", lambda p: opened.append(p))
    with pytest.raises(UnsupportedHostError) as err:
        rt.load_module(path)
    msg = str(err.value)
    assert "avx2" in msg and "fma" in msg and path in msg
    assert "avx," not in msg.split("lacks:")[1].split("(")[0]  # only what is missing is listed as missing
    assert opened == []


def test_present_features_load_and_run(tmp_path, monkeypatch):
    path = _export(tmp_path, "llvm")
    _pretend_host(monkeypatch, "x86", {"sse", "sse2"})
    mod = rt.load_module(path)
    a = np.arange(37, dtype="float32")
    b = np.zeros(37, "float32")
    mod["axpb"](a, b)
    np.testing.assert_allclose(b, a * 2 + 1)


def test_other_architecture_is_named(tmp_path, monkeypatch):
    path = _export(tmp_path, "llvm")
    _pretend_host(monkeypatch, "arm", {"neon"})
    with pytest.raises(UnsupportedHostError, match="built for the x86 architecture; this machine is arm"):
        rt.load_module(path)


def test_unknown_host_features_do_not_block(tmp_path, monkeypatch):
    # no readable /proc/cpuinfo (or no feature line, as under some emulators): load as before
    path = _export(tmp_path, "llvm")
    _pretend_host(monkeypatch, "x86", None)
    assert rt.load_module(path) is not None


def test_tar_manifest_carries_the_requirement(tmp_path, monkeypatch):
    path = str(tmp_path / "lib.tar")
    _module("llvm -mcpu=haswell").export_library(path)
    with tarfile.open(path) as tf:
        man = json.load(tf.extractfile("kiln_manifest.json"))  # type: ignore[arg-type]
    assert {"avx2", "fma"} <= set(man["isa"]["features"])
    _pretend_host(monkeypatch, "x86", {"sse", "sse2"})
    monkeypatch.setattr("kiln.runtime.export._link_shared", lambda *a, **k: pytest.fail("compiled before checking"))
    with pytest.raises(UnsupportedHostError, match="avx2"):
        rt.load_module(path)


def test_corrupt_requirement_is_a_format_error():
    with pytest.raises(FormatError, match="not valid UTF-8 JSON"):
        cpu_features.decode_requirement(b"\xff\xfe", "x.so")
    with pytest.raises(FormatError, match="version 9"):
        cpu_features.decode_requirement(b'{"format": "kiln-isa", "version": 9, "arch": "x86", "features": []}', "x.so")
    with pytest.raises(FormatError, match="list of string"):
        cpu_features.decode_requirement(b'{"format": "kiln-isa", "version": 1, "arch": "x86", "features": 3}', "x.so")


def test_cpuinfo_spellings_become_llvm_names():
    text = "processor : 0\nflags : fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 abm avx512_vnni\n"
    arch, feats = cpu_features.parse_cpuinfo_flags(text, "x86_64")
    assert arch == "x86"
    assert {"sse3", "sse4.1", "sse4.2", "bmi", "lzcnt", "avx512vnni"} <= feats
    assert cpu_features.parse_cpuinfo_flags("processor : 0\nvendor : qemu\n", "aarch64") == ("arm", None)


def _lacking_cpu() -> str | None:
    """An x86 CPU of the table whose features this host lacks (None: the host has them all)."""
    arch, host = cpu_features.host_cpu()
    if arch != "x86" or host is None:
        return None
    for cpu in ("haswell", "skylake-avx512", "sapphirerapids"):
        need = isa_of(f"llvm -mcpu={cpu}").features & cpu_features.CHECKED["x86"]
        if not need <= host:
            return cpu
    return None


def test_real_host_never_sigills(tmp_path):
    # The end-to-end claim on this very machine, in a child process: a library for a CPU this
    # host cannot run fails to load with the error, instead of killing the process.
    cpu = _lacking_cpu()
    if cpu is None:
        pytest.skip("this host runs every CPU of the list (haswell, skylake-avx512, sapphirerapids)")
    path = _export(tmp_path, f"llvm -mcpu={cpu}")
    code = textwrap.dedent(f"""
        import numpy as np, kiln.runtime as rt
        from kiln.runtime.errors import UnsupportedHostError
        try:
            m = rt.load_module({path!r})
        except UnsupportedHostError as e:
            print("REFUSED", e)
        else:
            m["axpb"](np.zeros(37, "float32"), np.zeros(37, "float32"))
            print("RAN")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("REFUSED"), proc.stdout


def test_inspect_shows_the_requirement(tmp_path, monkeypatch, capsys):
    from kiln.cli import main

    path = _export(tmp_path, "llvm -mcpu=haswell")
    _pretend_host(monkeypatch, "x86", {"sse", "sse2", "avx"})
    assert main(["inspect", path]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("cpu requirement:")]
    assert len(line) == 1 and "avx2" in line[0] and "this machine lacks" in line[0] and "fma" in line[0]
