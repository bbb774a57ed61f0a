"""The instruction-set model (``kiln.target.isa``): one source of truth for SIMD width.

Parsing of ``-mcpu`` / ``-mattr`` / ``-mtriple`` and of ``/proc/cpuinfo`` text; agreement
between the code generators (``target_vector_bytes``) and the CPU schedules for the same
target (issue 11: plain ``llvm`` used to get 4-lane code with 8-lane conv tiles); and the
assembly LLVM emits for a pinned AVX-512 CPU, inspected without running it, so the checks
mean the same on an AVX2 host.  Only the runtime check of AVX-512 code needs an AVX-512 host.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from kiln.codegen.c import target_vector_bytes
from kiln.runtime.errors import TargetError
from kiln.target import ISA, KNOWN_CPUS, Target, baseline_isa, cpu_isa, host_isa, isa_of, parse_cpuinfo
from kiln.target.isa import _host_from, _sysfs_caches
from tests.codegen.asm_support import hot_loop

F32 = "float32"


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("target,arch,vbytes,regs,yes,no", [
    ("llvm -mcpu=haswell", "x86", 32, 16, {"avx2", "fma"}, {"avx512f"}),
    ("llvm -mcpu=skylake-avx512", "x86", 64, 32, {"avx512f", "avx512bw", "avx512dq", "avx512vl"}, {"avx512vnni"}),
    ("llvm -mcpu=cascadelake", "x86", 64, 32, {"avx512vnni"}, {"avx512bf16"}),
    ("llvm -mcpu=znver3", "x86", 32, 16, {"avx2", "fma"}, {"avx512f"}),
    ("llvm -mcpu=znver4", "x86", 64, 32, {"avx512f", "avx512vl", "avx512vnni", "avx512bf16"}, set()),
    ("llvm -mcpu=icelake-server", "x86", 64, 32, {"avx512vnni", "avx512vbmi"}, set()),
    ("llvm -mcpu=x86-64-v3", "x86", 32, 16, {"avx2", "fma"}, {"avx512f"}),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "arm", 16, 32, {"neon"}, {"dotprod"}),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", "arm", 16, 32, {"neon", "dotprod"}, set()),
    ("llvm -mtriple=aarch64-linux-gnu", "arm", 16, 32, {"neon"}, {"sve"}),
    ("llvm -mtriple=riscv64-unknown-linux-gnu", "riscv", 0, 32, {"f", "d"}, {"v"}),
    ("llvm -mtriple=riscv64-unknown-linux-gnu -mattr=+v", "riscv", 16, 32, {"v", "d"}, set()),
    ("llvm -mtriple=x86_64-linux-gnu", "x86", 16, 16, {"sse2"}, {"avx"}),
])
def test_cpu_and_triple(target: str, arch: str, vbytes: int, regs: int, yes: set, no: set) -> None:
    isa = isa_of(target)
    assert (isa.arch, isa.vector_bytes, isa.vector_registers) == (arch, vbytes, regs), isa.describe()
    assert yes <= isa.features and not (no & isa.features), isa.describe()
    assert Target(target).isa == isa


def test_feature_flags_and_lanes() -> None:
    skx = isa_of("llvm -mcpu=skylake-avx512")
    assert skx.fma and skx.avx2 and skx.avx512f and skx.avx512bw and skx.avx512dq and skx.avx512vl
    assert not skx.vnni and isa_of("llvm -mcpu=cascadelake").vnni
    assert skx.lanes(F32) == 16 and skx.lanes("int8") == 64 and skx.lanes("float64") == 8
    assert skx.lanes("float16") == skx.lanes("bfloat16") == 32 and skx.lanes("bool") == 64
    a72 = isa_of("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    assert a72.neon and a72.fma and not a72.avx2 and a72.lanes(F32) == 4
    rv = isa_of("llvm -mtriple=riscv64-unknown-linux-gnu")
    assert not rv.rvv and rv.lanes(F32) == 1 and rv.lanes("int8") == 1
    assert isa_of("llvm -mtriple=riscv64-unknown-linux-gnu -mattr=+v").rvv
    assert isa_of("llvm -mcpu=haswell").min_accumulators == 10  # 5 cycles x 2 per cycle
    assert skx.has("+avx512f") and not skx.has("avx512fp16")
    with pytest.raises(TargetError, match="width"):
        skx.lanes("handle")


@pytest.mark.parametrize("target,vbytes,regs,gone", [
    ("llvm -mattr=+avx512f", 64, 32, set()),                     # implies avx2, fma
    ("llvm -mcpu=znver4 -mattr=-avx512f", 32, 16, {"avx512vnni", "avx512bw", "avx512vl"}),
    ("llvm -mcpu=skylake-avx512 -mattr=-avx2", 32, 16, {"avx512f", "avx2"}),
    ("llvm -mcpu=haswell -mattr=-avx", 16, 16, {"avx2", "fma", "avx"}),
    ("llvm -mcpu=haswell -mattr=+avx512bw", 64, 32, set()),      # bw implies f
    ("llvm -mcpu=haswell -mattr=+avx512f,-avx512f", 32, 16, {"avx512f"}),  # in order, as LLVM
    ("llvm -mcpu=haswell -mattr=-avx512f,+avx512f", 64, 32, set()),
    ("llvm -mattr=+avx2", 32, 16, {"avx512f"}),
])
def test_mattr_adds_and_removes(target: str, vbytes: int, regs: int, gone: set) -> None:
    isa = isa_of(target)
    assert (isa.vector_bytes, isa.vector_registers) == (vbytes, regs), isa.describe()
    assert not (gone & isa.features), isa.describe()


def test_default_targets() -> None:
    """``llvm`` without -mcpu is LLVM's generic CPU (SSE2 on x86-64); ``c`` is this machine."""
    plain = isa_of("llvm")
    host_arch = host_isa().arch
    assert plain == baseline_isa(host_arch) and plain.origin == "baseline"
    if host_arch == "x86":
        assert (plain.vector_bytes, plain.vector_registers, plain.fma) == (16, 16, False)
    assert isa_of("c") == host_isa() and isa_of("c -mcpu=native") == host_isa()
    assert isa_of("c -mtriple=x86_64-linux-gnu") == baseline_isa("x86")
    # unknown CPU names fall back to the baseline (plus -mattr), never to a guess
    assert isa_of("llvm -mtriple=x86_64-linux-gnu -mcpu=nosuchcpu") == baseline_isa("x86")
    assert isa_of("llvm -mtriple=x86_64-linux-gnu -mcpu=nosuchcpu -mattr=+avx2").vector_bytes == 32
    # llvm -mcpu=native is resolved by the Target to a CPU name plus the full feature list
    nat = isa_of("llvm -mcpu=native")
    assert (nat.vector_bytes, nat.vector_registers) == (host_isa().vector_bytes, host_isa().vector_registers)


def test_memoised_and_device_targets_refused() -> None:
    assert isa_of("llvm -mcpu=haswell") is isa_of(Target("llvm -mcpu=haswell"))
    assert isa_of({"kind": "llvm", "mcpu": "haswell"}) is isa_of("llvm -mcpu=haswell")
    hash(isa_of("llvm"))
    with pytest.raises(TargetError, match="device target"):
        isa_of("cuda")
    with pytest.raises(TargetError, match="no ISA model"):
        cpu_isa("nosuchcpu")


def test_every_table_cpu_is_consistent() -> None:
    for name in KNOWN_CPUS:
        isa = cpu_isa(name)
        assert isa.arch in ("x86", "arm", "riscv") and isa.vector_registers >= 16
        assert isa.l1d_bytes >= 16 * 1024 and isa.l2_bytes >= isa.l1d_bytes
        assert 1 <= isa.fma_latency <= 10 and 1 <= isa.fma_per_cycle <= 4
        if isa.avx512f:
            assert (isa.vector_bytes, isa.vector_registers) == (64, 32), name


# ----------------------------------------------------------------------------- host
_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Gold 6230
flags\t\t: sse sse2 pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni
"""
_GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
"""
_RISCV = "processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdcv_zicsr_zifencei\nmmu\t\t: sv39\n"


def test_parse_cpuinfo() -> None:
    arch, feats = parse_cpuinfo(_XEON, "x86_64")
    assert arch == "x86" and {"avx512f", "avx512vnni", "sse4.2", "sse3", "avx2"} <= feats
    arch, feats = parse_cpuinfo(_GRAVITON, "aarch64")
    assert arch == "arm" and {"neon", "dotprod", "fullfp16"} <= feats
    arch, feats = parse_cpuinfo(_RISCV, "riscv64")
    assert arch == "riscv" and {"f", "d", "v"} <= feats

    xeon = _host_from(_XEON, "x86_64", (32 * 1024, 1024 * 1024))
    assert (xeon.vector_bytes, xeon.vector_registers, xeon.l2_bytes, xeon.origin) == (64, 32, 1 << 20, "host")
    grav = _host_from(_GRAVITON, "aarch64", (0, 0))
    assert (grav.arch, grav.vector_bytes, grav.vector_registers) == ("arm", 16, 32) and grav.vnni
    assert _host_from(_RISCV, "riscv64", (0, 0)).rvv
    # unreadable /proc/cpuinfo: the architecture's baseline, which runs everywhere
    assert _host_from(None, "x86_64", (0, 0)) == baseline_isa("x86")
    assert _sysfs_caches("/nonexistent") == (0, 0)


def test_host_matches_proc_cpuinfo() -> None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    isa = host_isa()
    flags = set(re.findall(r"\S+", next((ln.split(":", 1)[1] for ln in text.splitlines()
                                         if ln.startswith(("flags", "Features"))), "")))
    if isa.arch == "x86":
        assert isa.avx512f == ("avx512f" in flags) and isa.avx2 == ("avx2" in flags)
        assert isa.vector_bytes == (64 if "avx512f" in flags else 32 if "avx" in flags else 16)


def test_target_layer_needs_no_llvm() -> None:
    """The model is pure Python: deriving it never loads llvmlite (target sits below codegen)."""
    code = ("import sys, kiln.target as t; t.isa_of('c'); t.isa_of('llvm -mcpu=skylake-avx512'); "
            "t.isa_of('llvm'); assert 'llvmlite' not in sys.modules, 'llvmlite imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- agreement
AGREE = ["llvm", "llvm -mcpu=haswell", "llvm -mcpu=skylake-avx512", "llvm -mcpu=znver4 -mattr=-avx512f",
         "llvm -mattr=+avx512f", "c", "llvm -mcpu=native", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"]


@pytest.mark.parametrize("target", AGREE)
def test_codegen_and_schedules_agree(target: str) -> None:
    """The bug of issue 11: the codegen's vector width and the schedules' lanes are one fact."""
    from kiln.topi.schedule.x86 import gemm_register_tile, schedule_isa, vector_lanes

    isa = isa_of(target)
    assert target_vector_bytes(Target(target)) == isa.vector_bytes
    assert vector_lanes(Target(target)) == vector_lanes(target) == isa.lanes(F32) == max(1, isa.vector_bytes // 4)
    assert schedule_isa(target) is isa
    mt, nt = gemm_register_tile(isa)
    nv = nt // isa.lanes(F32)
    assert nt % isa.lanes(F32) == 0 and mt * nv + nv + 1 <= isa.vector_registers


def test_default_llvm_lanes() -> None:
    from kiln.topi.schedule.x86 import vector_lanes

    want = {"llvm": 4, "llvm -mcpu=haswell": 8, "llvm -mcpu=skylake-avx512": 16}
    for t, lanes in want.items():
        assert vector_lanes(t) == lanes and target_vector_bytes(Target(t)) == 4 * lanes, t


def test_register_tiles_follow_the_register_file() -> None:
    from kiln.topi.schedule.x86 import gemm_register_tile
    from kiln.topi.schedule.x86_conv import max_x_tile

    assert gemm_register_tile(isa_of("llvm")) == (6, 8)                      # 16 xmm
    assert gemm_register_tile(isa_of("llvm -mcpu=haswell")) == (6, 16)       # 16 ymm: 12 + 2 + 1
    assert gemm_register_tile(isa_of("llvm -mcpu=skylake-avx512")) == (6, 64)  # 32 zmm: 24 + 4 + 1
    assert gemm_register_tile(isa_of("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")) == (6, 16)
    assert gemm_register_tile(isa_of("llvm -mcpu=haswell"), nt=16) == (6, 16)
    assert gemm_register_tile(isa_of("llvm -mcpu=skylake-avx512"), nt=16)[0] > 6
    # blocked conv: ob = 16 is two ymm (6 pixels fit 16 registers) but one zmm
    assert max_x_tile(16, 8, False, 16) == 6 and max_x_tile(8, 8, False, 16) == 14
    assert max_x_tile(16, 16, False, 32) == 14 and max_x_tile(16, 4, False, 16) == 2
    assert max_x_tile(16, 8, True, 16) == 6


@pytest.mark.parametrize("target,ob,ow,tile", [
    ("llvm -mcpu=haswell", 16, 56, 4), ("llvm -mcpu=haswell", 8, 14, 14),
    ("llvm", 16, 56, 2), ("llvm -mcpu=skylake-avx512", 16, 56, 14), ("llvm -mcpu=skylake-avx512", 32, 28, 14),
])
def test_conv_schedule_tile_per_target(target: str, ob: int, ow: int, tile: int) -> None:
    from kiln import te, topi
    from kiln.ir import OpPattern, get_op

    d = te.placeholder((1, 2, ow, ow, 8), F32, name="d")
    w = te.placeholder((2, 2, 3, 3, 8, ob), F32, name="w")
    out = topi.get_compute("conv2d_nchwc")(get_op("conv2d_nchwc").normalize_attrs({"padding": (1, 1, 1, 1)}),
                                           [d, w], [])[0]
    s = topi.schedule_group("conv2d_nchwc", OpPattern.OUT_ELEMWISE_FUSABLE, [out], target)
    # the x split (a row split may come too: the L2 budget is half the model's L2)
    (split,) = [r for r in s[out].relations if isinstance(r, te.schedule.Split) and r.parent is out.op.axis[3]]
    assert split.factor == tile


# ----------------------------------------------------------------------------- assembly
def _gemm_module(m: int, k: int, n: int, target: str, kind: str = "dense", pack: bool | None = None):
    """dense (``B`` is ``(N, K)``, packed into 16-wide panels by default) or matmul (``B`` is
    ``(K, N)``; ``pack=False`` reads its rows directly), scheduled as a build would."""
    from kiln import codegen, te, tir, topi
    from kiln.ir import OpPattern
    from kiln.topi.nn.dense import dense, matmul

    A = te.placeholder((m, k), F32, name="A")
    B = te.placeholder((n, k) if kind == "dense" else (k, n), F32, name="B")
    C = dense(A, B, pack=pack) if kind == "dense" else matmul(A, B, pack=pack)
    s = topi.schedule_group(kind, OpPattern.OUT_ELEMWISE_FUSABLE, [C], target)
    return codegen.build_module([tir.lower(s, [A, B, C], "gemm")], target)


@pytest.mark.parametrize("kind,fmas", [("matmul", 24), ("dense", 12)])
def test_avx512_gemm_is_zmm_fma_without_spills(kind: str, fmas: int) -> None:
    """-mcpu=skylake-avx512 (compiled, never run).  Unpacked matmul: the 6 x 64 tile is 24 zmm
    FMAs per k step (24 accumulators + 4 B vectors + 1 broadcast of the 32 registers); packed
    dense (16-wide panels, one zmm): 12 rows.  Neither touches the stack inside the loop."""
    asm = _gemm_module(60, 64, 128, "llvm -mcpu=skylake-avx512", kind, pack=False if kind == "matmul" else None
                       ).get_source("asm")
    hot = hot_loop(asm, "vfmadd")
    zmm_fma = [ln for ln in hot.splitlines() if "vfmadd" in ln and "%zmm" in ln]
    assert len(zmm_fma) >= fmas, hot
    assert "(%rsp)" not in hot and "(%rbp)" not in hot, hot


def test_plain_llvm_is_sse2() -> None:
    """What the model says plain ``llvm`` is, LLVM emits: xmm only, no FMA instruction."""
    asm = _gemm_module(30, 64, 64, "llvm").get_source("asm")
    assert "mulps" in asm and "%ymm" not in asm and "%zmm" not in asm and "vfmadd" not in asm
    hot = hot_loop(asm, "mulps")
    assert "(%rsp)" not in hot, hot


def test_aarch64_gemm_is_neon_fmla() -> None:
    try:
        asm = _gemm_module(30, 64, 64, "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72").get_source("asm")
    except Exception as err:  # noqa: BLE001 - an LLVM built without the AArch64 backend
        pytest.skip(f"no AArch64 LLVM backend: {err}")
    assert re.search(r"fmla\s+v\d+\.4s", asm), asm[:2000]


@pytest.mark.skipif(not host_isa().avx512f, reason="host lacks avx512f: AVX-512 code is only compiled here")
def test_avx512_gemm_runs() -> None:
    import kiln

    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 70)).astype(F32)
    b = rng.standard_normal((100, 70)).astype(F32)
    for pack in (False, None):
        for kind in ("dense", "matmul"):
            mod = _gemm_module(37, 70, 100, "llvm -mcpu=skylake-avx512", kind, pack)
            bk = b if kind == "dense" else np.ascontiguousarray(b.T)
            out = kiln.nd.empty((37, 100), F32)
            mod["gemm"](kiln.nd.array(a), kiln.nd.array(bk), out)
            np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=2e-5, atol=2e-4, err_msg=f"{kind} pack={pack}")


def test_isa_is_frozen() -> None:
    isa = isa_of("llvm -mcpu=haswell")
    with pytest.raises(AttributeError):
        isa.vector_bytes = 64  # type: ignore[misc]
    assert isinstance(isa, ISA)
