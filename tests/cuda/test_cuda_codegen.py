"""The ``cuda`` target without a GPU: target kind, CUDA C generation, NVRTC → PTX."""

from __future__ import annotations

import pytest

from kiln import te
from kiln.runtime.errors import CompileError, TargetError
from kiln.target import Target
from kiln.te.schedule import thread_axis
from kiln.te.lower_schedule import lower


def _vexp(n: int = 1000, factor: int = 128, name: str = "vexp"):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: te.exp(A[i]) + B[i], name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=factor)
    s[C].bind(xo, thread_axis("blockIdx.x"))
    s[C].bind(xi, thread_axis("threadIdx.x"))
    return lower(s, [A, B, C], name=name)


def _two_stage():
    A = te.placeholder((4, 256), name="A")
    B = te.compute((4, 256), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((4, 256), lambda i, j: B[i, j] + 1.0, name="C")
    s = te.create_schedule(C.op)
    for T in (B, C):
        s[T].bind(T.op.axis[0], thread_axis("blockIdx.x"))
        s[T].bind(T.op.axis[1], thread_axis("threadIdx.x"))
    return lower(s, [A, C], name="two")


def test_target_kind() -> None:
    t = Target("cuda -arch=sm_90 -fast_math")
    assert t.kind == "cuda" and t.kind.device_type == 2
    assert t.attrs["arch"] == "sm_90" and t.attrs["fast_math"] is True
    assert t.keys == ["cuda", "gpu"]
    assert Target("cuda").attrs["arch"] == "sm_80"
    with pytest.raises(TargetError, match="no option 'mcpu'"):
        Target("cuda -mcpu=znver3")


def test_cuda_source_and_function_table() -> None:
    from kiln.codegen.cuda import function_table, generate_cuda

    src, infos = generate_cuda([_vexp(), _two_stage()])
    assert 'extern "C" __global__ void __launch_bounds__(128) vexp_kernel0(float* __restrict__ A' in src
    assert "blockIdx.x" in src and "threadIdx.x" in src and "expf(" in src
    table = {f.name: f for f in function_table(infos)}
    v = table["vexp"]
    assert [(a.dtype, a.shape) for a in v.args] == [("float32", (1000,))] * 3
    assert [(ln.kernel, ln.grid, ln.block, ln.args) for ln in v.launches] == [
        ("vexp_kernel0", (8, 1, 1), (128, 1, 1), (0, 1, 2))]
    two = table["two"]
    assert two.temps == (4096,)  # the intermediate B, passed as argument index len(args) + 0
    assert [ln.args for ln in two.launches] == [(0, 2), (2, 1)]


def test_launch_limit_is_checked() -> None:
    from kiln.codegen.cuda import build_cuda

    with pytest.raises(CompileError, match="2048 threads per block"):
        build_cuda([_vexp(4096, 2048)], "cuda")


def test_build_cuda_gives_ptx_with_an_entry_per_kernel(needs_nvrtc) -> None:
    from kiln.codegen.cuda import build_cuda
    from kiln.contrib.nvrtc import ptx_entries
    from kiln.runtime.cuda_driver import decode_payload

    mod = build_cuda([_vexp(), _two_stage()], Target("cuda -arch=sm_90"))
    assert mod.type_key == "cuda" and mod.is_binary_serializable
    ptx = mod.get_source("ptx")
    assert ".target sm_90" in ptx
    assert sorted(ptx_entries(ptx)) == ["two_kernel0", "two_kernel1", "vexp_kernel0"]
    p = decode_payload(mod.save_to_binary())
    assert p.fmt == "ptx" and p.arch == "sm_90" and p.data.decode() == ptx
    assert "__global__" in p.source


def test_nvrtc_reports_compile_errors(needs_nvrtc) -> None:
    from kiln.contrib.nvrtc import compile_cuda

    with pytest.raises(CompileError, match="undefined_thing"):
        compile_cuda('extern "C" __global__ void k(float* a) { a[0] = undefined_thing; }')
    with pytest.raises(CompileError, match="invalid -arch"):
        compile_cuda("", arch="volta")


def test_missing_nvrtc_is_a_clear_error(monkeypatch, tmp_path) -> None:
    from kiln.contrib import nvrtc

    monkeypatch.setenv("KILN_NVRTC_LIBRARY", str(tmp_path / "libnvrtc_absent.so"))
    monkeypatch.setattr(nvrtc, "_LIB", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc either
    with pytest.raises(nvrtc.NVRTCNotFoundError, match="pip install nvidia-cuda-nvrtc-cu12"):
        nvrtc.compile_cuda('extern "C" __global__ void k() {}')


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_math_intrinsic_and_special_float_compiles(needs_nvrtc, dtype) -> None:
    """Every intrinsic name the dialect emits exists in NVRTC's device math library, and
    inf/nan literals and isnan/isinf/isfinite need no <math.h> (NVRTC has none)."""
    from kiln.codegen.cuda import build_cuda
    from kiln.te import intrin

    A = te.placeholder((64,), name="A", dtype=dtype)
    B = te.placeholder((64,), name="B", dtype=dtype)
    outs = []
    for op in intrin.UNARY_FLOAT_INTRINSICS:
        outs.append(te.compute((64,), lambda i, op=op: getattr(intrin, op if op != "fabs" else "abs")(A[i]),
                               name=f"u_{op}"))
    for op in intrin.BINARY_FLOAT_INTRINSICS:
        outs.append(te.compute((64,), lambda i, op=op: getattr(intrin, op)(A[i], B[i]), name=f"b_{op}"))
    outs.append(te.compute((64,), lambda i: te.if_then_else(
        te.isnan(A[i]) | te.isinf(B[i]) | te.isfinite(A[i] * B[i]), float("inf"),
        te.maximum(A[i], float("-inf")) + float("nan")), name="special"))
    funcs = []
    for k, C in enumerate(outs):
        s = te.create_schedule(C.op)
        s[C].bind(C.op.axis[0], thread_axis("threadIdx.x"))
        funcs.append(lower(s, [A, B, C], name=f"f{k}"))
    mod = build_cuda(funcs, "cuda")
    lit = "__int_as_float(0x7f800000)" if dtype == "float32" else "__longlong_as_double(0x7ff0000000000000LL)"
    assert lit in mod.source
    if dtype == "float32":
        assert "expf(" in mod.source and "rintf(" in mod.source


def test_build_cuda_cubin(needs_nvrtc) -> None:
    from kiln.codegen.cuda import build_cuda
    from kiln.runtime.cuda_driver import decode_payload, describe_payload

    mod = build_cuda([_vexp(), _two_stage()], Target("cuda -arch=sm_90 -binary=cubin"))
    assert mod.fmt == "cubin" and mod.data[:4] == b"\x7fELF"
    for k in (b"vexp_kernel0", b"two_kernel0", b"two_kernel1"):
        assert k + b"\0" in mod.data
    p = decode_payload(mod.save_to_binary())
    assert p.fmt == "cubin" and p.data == mod.data
    assert describe_payload(mod.save_to_binary())["format"] == "cubin"
    with pytest.raises(CompileError, match="-binary must be"):
        build_cuda([_vexp()], Target("cuda -binary=fatbin"))
