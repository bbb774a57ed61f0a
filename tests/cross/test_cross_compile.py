"""Cross compilation: libraries for AArch64 and RISC-V built here, run under qemu-user.

``kiln.build(..., target="llvm -mtriple=aarch64-linux-gnu ...").export_library("m.so")`` must
link with that machine's C compiler and give a library that machine runs correctly. This
machine cannot load such a library into Python, so each one is run from C under qemu: the
kernels alone through the packed calling convention (``graph_runner.c``, compared with
NumPy) and whole models through the C API example ``examples/c/run_model.c`` (compared with
this machine's build of the same graph). Tests that need a cross toolchain skip, naming it,
where it is not installed (``.ci/run`` installs them). See ``docs/cross_compile.md``.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import stat
import subprocess
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.runtime import cc as _cc
from kiln.runtime import cpu_features, include_path
from kiln.runtime.errors import CompileError, UnsupportedHostError
from kiln.runtime.export import load_module, open_library_elf

from . import models
from .qemu import (AARCH64, EXAMPLE_SOURCE, RUNNER_SOURCE, RV64GC, RV64GCV, TOOLCHAINS, Toolchain, assert_close,
                   build_program, elf_machine, emulator_bug, host_outputs, require, run_model, run_plan,
                   run_qemu, write_plan)

HOST_ARCH = _cc._triple_arch(platform.machine())
#: Toolchains for another architecture than this machine's (only these say anything about
#: cross compiling; on an AArch64 host the AArch64 "cross" build is a native one).
FOREIGN = [tc for tc in TOOLCHAINS if _cc._triple_arch(tc.target.split("-mtriple=")[1].split()[0]) != HOST_ARCH]
IDS = [tc.name for tc in TOOLCHAINS]


def _foreign_triple() -> str:
    return next(t for t in ("aarch64-linux-gnu", "riscv64-linux-gnu") if _cc._triple_arch(t) != HOST_ARCH)


def _fake_compiler(directory: str, name: str, machine: str) -> str:
    """A stand-in compiler that only answers ``-dumpmachine``."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\n[ \"$1\" = -dumpmachine ] && echo {machine} && exit 0\nexit 1\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


# ----------------------------------------------------------------------------- compiler choice
def test_host_triple_keeps_the_host_compiler() -> None:
    assert _cc.cross_cc_for_triple(None) is None
    assert _cc.cross_cc_for_triple(f"{platform.machine()}-unknown-linux-gnu") is None


def test_cross_compiler_found_by_gnu_name(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    triple = _foreign_triple()
    arch = triple.split("-")[0]
    _fake_compiler(str(tmp_path), f"{arch}-linux-gnu-gcc", triple)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    # the vendor field of an LLVM triple is not part of the GNU toolchain's name
    assert _cc.cross_cc_for_triple(f"{arch}-unknown-linux-gnu") == f"{arch}-linux-gnu-gcc"
    assert _cc.cross_cc_for_triple(triple) == f"{arch}-linux-gnu-gcc"


def test_cc_env_used_when_it_targets_the_triple(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    triple = _foreign_triple()
    mine = _fake_compiler(str(tmp_path), "my-cross-cc", triple)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", mine)
    assert _cc.cross_cc_for_triple(triple) == mine
    # $CC for another machine is not used for this one: the error names what was looked for
    monkeypatch.setenv("CC", _fake_compiler(str(tmp_path), "other-cc", "s390x-linux-gnu"))
    with pytest.raises(CompileError, match=f"{triple.split('-')[0]}-linux-gnu-gcc"):
        _cc.cross_cc_for_triple(triple)


def test_missing_cross_compiler_is_named(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    triple = _foreign_triple()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(CompileError) as err:
        _cc.cross_cc_for_triple(triple)
    msg = str(err.value)
    assert f"{triple}-gcc" in msg and f"gcc-{triple.split('-')[0]}-linux-gnu" in msg


def test_modules_for_two_machines_are_refused() -> None:
    class M:
        def __init__(self, triple: str) -> None:
            self.triple = triple

        def target_triple(self) -> str:
            return self.triple

    with pytest.raises(CompileError, match="one machine"):
        _cc.cc_for_modules([M("aarch64-linux-gnu"), M("riscv64-linux-gnu")])
    assert _cc.cc_for_modules([M(f"{platform.machine()}-linux-gnu"), object()]) is None


def test_export_names_the_missing_cross_compiler(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building needs only LLVM; linking needs the target's gcc, and the error says which."""
    model, _, _ = models.matmul()
    graph, params = kiln.frontend.from_onnx(model)
    triple = _foreign_triple()
    factory = kiln.build(graph, target=f"llvm -mtriple={triple}", params=params)
    assert factory.get_lib().target_triple() == triple
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(CompileError, match=f"no C compiler for target triple '{triple}'"):
        factory.export_library(str(tmp_path / "m.so"))


def test_cross_kernels_are_joined_by_the_cross_compiler(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``lib0.o`` of a cross build: the kernels' objects joined by ``<triple>-gcc -r``; without
    that compiler, every kernel compiled again as one LLVM module. Both hold every kernel."""
    from kiln.codegen import llvm_module
    from kiln.runtime.elf import ElfFile

    tc = FOREIGN[0]
    require(tc)
    graph, params = kiln.frontend.from_onnx(models.conv_dense()[0])
    joined = kiln.build(graph, target=tc.target, params=params).get_lib()
    assert len(joined.objects) > 1
    compilers: list[str | None] = []
    join = llvm_module._join_objects
    monkeypatch.setattr(llvm_module, "_join_objects",
                        lambda objs, target, cc=None: compilers.append(cc) or join(objs, target, cc))
    joined.save(str(tmp_path / "joined.o"))
    assert compilers == [tc.gcc]

    def no_cross_compiler(triple: str | None) -> str | None:
        raise CompileError("none here")

    whole = kiln.build(graph, target=tc.target, params=params).get_lib()
    monkeypatch.setattr(_cc, "cross_cc_for_triple", no_cross_compiler)
    whole.save(str(tmp_path / "whole.o"))
    assert compilers == [tc.gcc]
    for obj in ("joined.o", "whole.o"):
        assert elf_machine(str(tmp_path / obj)) == tc.machine
        assert sorted(ElfFile(str(tmp_path / obj)).exported_functions()) == sorted(joined.func_names)


# ----------------------------------------------------------------------------- built and run
@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cross"))


_programs: dict[tuple[str, str], str] = {}


def _program(tc: Toolchain, source: str, workdir: str) -> str:
    key = (tc.name, source)
    if key not in _programs:
        _programs[key] = build_program(tc, source, workdir)
    return _programs[key]


def _export(tc: Toolchain, model: Any, workdir: str, name: str) -> tuple[Any, str]:
    graph, params = kiln.frontend.from_onnx(model)
    factory = kiln.build(graph, target=tc.target, params=params)
    lib = os.path.join(workdir, f"{name}_{tc.name}.so")
    factory.export_library(lib)
    assert elf_machine(lib) == tc.machine
    return factory, lib


@pytest.mark.parametrize("tc", TOOLCHAINS, ids=IDS)
def test_kernel_runs_under_qemu(tc: Toolchain, workdir: str) -> None:
    """One MatMul kernel called through the packed convention on the emulated CPU, vs NumPy."""
    require(tc)
    model, inputs, want = models.matmul()
    factory, lib = _export(tc, model, workdir, "matmul")
    d = os.path.join(workdir, f"plan_matmul_{tc.name}")
    os.makedirs(d, exist_ok=True)
    res = run_plan(tc, lib, _program(tc, RUNNER_SOURCE, workdir), write_plan(factory, inputs, d))
    np.testing.assert_allclose(res.outputs[0], want, rtol=1e-4, atol=1e-5)
    # the library records the machine it needs, so that loading it elsewhere is refused
    arch, feats = cpu_features.decode_requirement(open_library_elf(lib).section_data(cpu_features.ISA_SECTION), lib)
    expected = {"aarch64": ("arm", {"neon"}), "rv64gc": ("riscv", {"f", "d"}), "rv64gcv": ("riscv", {"f", "d", "v"})}
    assert (arch, set(feats)) == expected[tc.name]


_host_refs: dict[str, list[np.ndarray]] = {}


def _host_reference(name: str, model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    if name not in _host_refs:  # this machine's build of the same graph, run by the Python executor
        graph, params = kiln.frontend.from_onnx(model)
        _host_refs[name] = host_outputs(kiln.build(graph, target="llvm", params=params), inputs)
    return _host_refs[name]


@pytest.mark.parametrize("tc", TOOLCHAINS, ids=IDS)
@pytest.mark.parametrize("name", ["conv_dense", "bert_like"])
def test_model_runs_under_qemu_through_the_c_api(tc: Toolchain, name: str, workdir: str) -> None:
    require(tc)
    if emulator_bug(tc):
        pytest.skip(str(emulator_bug(tc)))
    model, inputs = getattr(models, name)()
    want = _host_reference(name, model, inputs)
    factory, lib = _export(tc, model, workdir, name)
    d = os.path.join(workdir, f"run_{name}_{tc.name}")
    os.makedirs(d, exist_ok=True)
    res = run_model(tc, lib, _program(tc, EXAMPLE_SOURCE, workdir), factory, inputs, d)
    assert_close(res.outputs, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tc", [AARCH64, RV64GC], ids=["aarch64", "rv64gc"])
def test_linked_params_library_runs_under_qemu(tc: Toolchain, workdir: str) -> None:
    """``link_params=True``: the weights are a C source module, compiled by the cross compiler too."""
    require(tc)
    model, inputs = models.conv_dense()
    want = _host_reference("conv_dense", model, inputs)
    graph, params = kiln.frontend.from_onnx(model)
    factory = kiln.build(graph, target=tc.target, params=params, link_params=True)
    lib = os.path.join(workdir, f"conv_dense_linked_{tc.name}.so")
    factory.export_library(lib)
    assert elf_machine(lib) == tc.machine
    d = os.path.join(workdir, f"linked_{tc.name}")
    os.makedirs(d, exist_ok=True)
    res = run_model(tc, lib, _program(tc, EXAMPLE_SOURCE, workdir), factory, inputs, d)
    assert_close(res.outputs, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tc", [AARCH64, RV64GC], ids=["aarch64", "rv64gc"])
def test_static_archive_links_into_a_program_for_the_target(tc: Toolchain, workdir: str) -> None:
    """``export_library("m.a")`` archives with the target's compiler and ``ar``; the example
    linked with it (``-DKILN_STATIC``) runs under qemu."""
    require(tc)
    model, inputs = models.conv_dense()
    want = _host_reference("conv_dense", model, inputs)
    graph, params = kiln.frontend.from_onnx(model)
    factory = kiln.build(graph, target=tc.target, params=params)
    archive = os.path.join(workdir, f"conv_dense_{tc.name}.a")
    factory.export_library(archive)
    exe = os.path.join(workdir, f"run_model_static_{tc.name}")
    cmd = [tc.gcc, "-O2", "-DKILN_STATIC", "-I", include_path(), EXAMPLE_SOURCE, archive, "-o", exe, "-lm", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert elf_machine(exe) == tc.machine
    d = os.path.join(workdir, f"static_{tc.name}")
    os.makedirs(d, exist_ok=True)
    assert_close(run_model(tc, None, exe, factory, inputs, d).outputs, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tc", FOREIGN, ids=[tc.name for tc in FOREIGN])
def test_foreign_library_is_refused_at_load(tc: Toolchain, workdir: str) -> None:
    """Before dlopen, with the library's ISA note: never a dlopen error or a crash."""
    require(tc)
    _, lib = _export(tc, models.matmul()[0], workdir, "refused")
    with pytest.raises(UnsupportedHostError, match="built for the (arm|riscv) architecture; this machine is x86"):
        load_module(lib)


def test_vector_code_needs_the_vector_extension(workdir: str) -> None:
    """The RV64GCV build really executes RVV instructions: without V the emulated CPU traps;
    with V at VLEN 128 or 256 the result is right."""
    tc = RV64GCV
    require(tc)
    model, inputs, want = models.matmul()
    factory, lib = _export(tc, model, workdir, "rvv_check")
    d = os.path.join(workdir, "plan_rvv_check")
    os.makedirs(d, exist_ok=True)
    plan = write_plan(factory, inputs, d)
    runner = _program(tc, RUNNER_SOURCE, workdir)
    proc, _ = run_qemu(tc, [runner, lib, plan.path], timeout=300, cpu=["-cpu", "rv64,v=false"])
    assert proc.returncode == -signal.SIGILL, (proc.returncode, proc.stderr)
    np.testing.assert_allclose(run_plan(tc, lib, runner, plan).outputs[0], want, rtol=1e-4, atol=1e-5)
    # fixed-length vectors sized for VLEN 128 stay correct on a CPU with wider registers
    wide = ["-cpu", "rv64,v=true,vlen=256,elen=64,vext_spec=v1.0"]
    proc, _ = run_qemu(tc, [runner, lib, plan.path], timeout=300, cpu=wide)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(plan.read_outputs()[0], want, rtol=1e-4, atol=1e-5)


def test_aarch64_kernels_use_neon(workdir: str) -> None:
    """The AArch64 build's MatMul is NEON code (``fmla`` on ``v`` registers), not scalar."""
    tc = AARCH64
    require(tc)
    objdump = "aarch64-linux-gnu-objdump"
    if shutil.which(objdump) is None:
        pytest.skip(f"{objdump} not installed (apt-get install binutils-aarch64-linux-gnu)")
    _, lib = _export(tc, models.matmul()[0], workdir, "neon_check")
    asm = subprocess.run([objdump, "-d", lib], capture_output=True, text=True, check=True).stdout
    assert any(line.split("\t")[-2:-1] == ["fmla"] and ".4s" in line for line in asm.splitlines()), \
        "no 4-lane fmla in the library"


# ----------------------------------------------------------------------------- real models (slow)
def _resnet18() -> tuple[Any, dict[str, np.ndarray]]:
    """torchvision's ResNet-18 (random weights) through torch's ONNX exporter; without torchvision,
    the same layer layout built with ``onnx.helper``."""
    import importlib.util

    import onnx

    if importlib.util.find_spec("torchvision") is not None:
        from tests.models import real_models

        path, feeds = real_models.resnet18()
        return onnx.load(path), feeds
    from tests.cuda.resnet_onnx import resnet18

    return resnet18(hw=224)


def _minilm_like() -> tuple[Any, dict[str, np.ndarray]]:
    """A BERT encoder of all-MiniLM-L6-v2's size (transformers config, random weights, torch's ONNX
    exporter, a padded attention mask); without transformers, the same shape built by hand."""
    import importlib.util

    import onnx

    if importlib.util.find_spec("transformers") is not None:
        from tests.models import real_models

        path, feeds = real_models.minilm()
        return onnx.load(path), feeds
    return models.bert_like(hidden=384, heads=12, inter=1536, layers=6, seq=128, vocab=30522)


@pytest.mark.heavy  # ~7 min on 2 cores (qemu runs ResNet-18 in 40-120 s): `pytest -m heavy`
@pytest.mark.parametrize("tc", [tc for tc in TOOLCHAINS if tc.name != "rv64gcv"], ids=lambda tc: tc.name)
@pytest.mark.parametrize("name", ["resnet18", "minilm_like"])
def test_real_model_runs_under_qemu(tc: Toolchain, name: str, workdir: str) -> None:
    """ResNet-18 (1×3×224×224) and a MiniLM-L6-sized encoder (seq 128), random weights.

    Prints the build, export and emulated run times (``pytest -s``).
    """
    import time

    require(tc)
    model, inputs = {"resnet18": _resnet18, "minilm_like": _minilm_like}[name]()
    want = _host_reference(name, model, inputs)
    t0 = time.perf_counter()
    graph, params = kiln.frontend.from_onnx(model)
    factory = kiln.build(graph, target=tc.target, params=params)
    t1 = time.perf_counter()
    lib = os.path.join(workdir, f"{name}_{tc.name}.so")
    factory.export_library(lib)
    t2 = time.perf_counter()
    assert elf_machine(lib) == tc.machine
    d = os.path.join(workdir, f"run_{name}_{tc.name}")
    os.makedirs(d, exist_ok=True)
    res = run_model(tc, lib, _program(tc, EXAMPLE_SOURCE, workdir), factory, inputs, d)
    worst = assert_close(res.outputs, want, rtol=1e-4, atol=1e-4)
    print(f"\n{name} {tc.name}: build {t1 - t0:.1f} s, export {t2 - t1:.1f} s "
          f"({os.path.getsize(lib) / 2**20:.1f} MiB), qemu run {res.wall_s:.1f} s, max |diff| {worst:.2e}")
