"""The CUDA runtime without a GPU: payload format, missing-driver errors, and the driver
plumbing (copies, launches, temporaries) against the mock driver of ``conftest.py``."""

from __future__ import annotations


import numpy as np
import pytest

import kiln
from kiln.runtime import cuda_driver as rc
from tests.cuda.mock_support import hook_type, view
from kiln.runtime.errors import DeviceError, FormatError, InputError


def _payload() -> rc.CUDAPayload:
    funcs = [
        rc.CUDAFunction("f", (rc.CUDAArg(rc.ARG_TENSOR, "float32", (2, 3)), rc.CUDAArg(rc.ARG_INT, "int32"),
                              rc.CUDAArg(rc.ARG_TENSOR, "int64", (7,))),
                        (rc.CUDALaunch("f_kernel0", (2, 1, 1), (64, 2, 1), 0, (0, 3)),
                         rc.CUDALaunch("f_kernel1", (1, 1, 1), (32, 1, 1), 1024, (3, 1, 2))),
                        temps=(96,)),
        rc.CUDAFunction("g", (), (), ()),
    ]
    return rc.CUDAPayload("ptx", b".version 8.0\n.entry f_kernel0(\n.entry f_kernel1(", "// src", "sm_86", funcs)


def test_payload_roundtrip_and_describe() -> None:
    p = _payload()
    raw = rc.encode_payload(p)
    assert raw[:8] == rc.PAYLOAD_MAGIC
    q = rc.decode_payload(raw)
    assert (q.fmt, q.data, q.source, q.arch) == (p.fmt, p.data, p.source, p.arch)
    assert q.functions == p.functions
    d = rc.describe_payload(raw)
    assert d["format"] == "ptx" and d["arch"] == "sm_86" and d["binary_bytes"] == len(p.data)
    assert [k["name"] for k in d["kernels"]] == ["f_kernel0", "f_kernel1"]
    assert d["kernels"][0]["block"] == [64, 2, 1] and d["kernels"][1]["shared_bytes"] == 1024
    assert d["functions"][0] == {"name": "f", "num_args": 3, "launches": 2, "temp_bytes": 96}


@pytest.mark.parametrize("mutate, match", [
    (lambda b: b"XXXXXXXX" + b[8:], "magic"),
    (lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:], "version 99"),
    (lambda b: b[:-3], "truncated|trailing|implausible"),
    (lambda b: b + b"\0", "trailing"),
])
def test_payload_corruption_is_a_format_error(mutate, match) -> None:
    with pytest.raises(FormatError, match=match):
        rc.decode_payload(mutate(rc.encode_payload(_payload())))


def test_payload_rejects_out_of_range_kernel_argument() -> None:
    p = _payload()
    bad = rc.CUDAFunction("h", (rc.CUDAArg(rc.ARG_TENSOR, "float32", (1,)),),
                          (rc.CUDALaunch("h_kernel0", (1, 1, 1), (1, 1, 1), 0, (0, 5)),))
    p.functions.append(bad)
    with pytest.raises(FormatError, match="takes argument 5"):
        rc.decode_payload(rc.encode_payload(p))


def test_missing_driver_gives_clear_errors(no_cuda) -> None:
    dev = kiln.cuda()
    assert dev.exist is False  # never raises
    assert not rc.is_available()
    with pytest.raises(DeviceError, match=r"libcuda_absent\.so\.1 not found.*install the NVIDIA driver"):
        kiln.nd.empty((4,), "float32", device=dev)
    mod = rc.loadbinary_cuda(rc.encode_payload(_payload()))  # device code loads without a driver ...
    with pytest.raises(DeviceError, match=r"cannot run a cuda device module.*install the NVIDIA driver"):
        mod.require_runtime()  # ... and says what is missing when it is needed


def test_ptx_isa_for_driver() -> None:
    assert rc.ptx_isa_for_driver(12040) == (8, 4)
    assert rc.ptx_isa_for_driver(12060) == (8, 5)
    assert rc.ptx_isa_for_driver(12090) == (8, 8)
    assert rc.ptx_isa_for_driver(11080) == (7, 8)
    assert rc.ptx_isa_for_driver(10020) is None


# ------------------------------------------------------------------ mock driver
def test_mock_device_attributes_and_copies(mock_cuda) -> None:
    dev = kiln.cuda(0)
    assert dev.exist and not kiln.cuda(1).exist
    assert dev.device_name == "Kiln Mock GPU 0"
    assert dev.get_attr("compute_version") == "9.0"
    assert dev.max_threads_per_block == 1024 and dev.warp_size == 32
    assert dev.get_attr("max_thread_dimensions") == [1024, 1024, 64]
    before = mock_cuda.mock_live_allocs()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = kiln.nd.array(x, device=dev)
    assert not a.device.host_visible
    b = kiln.nd.empty(x.shape, "float32", device=dev)
    b.copyfrom(a)  # device -> device
    np.testing.assert_array_equal(b.numpy(), x)
    np.testing.assert_array_equal(b.copyto(kiln.cpu()).numpy(), x)
    assert mock_cuda.mock_live_allocs() == before + 2
    del a, b
    assert mock_cuda.mock_live_allocs() == before


def test_mock_no_device(mock_cuda, monkeypatch) -> None:
    monkeypatch.setenv("KILN_MOCK_CUDA_DEVICES", "0")
    rc._reset_driver()
    assert not kiln.cuda().exist
    with pytest.raises(DeviceError, match="no CUDA device found"):
        kiln.nd.empty((1,), "float32", device=kiln.cuda())


def test_mock_launch_passes_the_right_pointers(mock_cuda) -> None:
    """A module's function launches its kernels with the arguments in order; the hook emulates
    the kernels on the host from the very pointers the runtime passed."""
    funcs = [rc.CUDAFunction(
        "two", (rc.CUDAArg(rc.ARG_TENSOR, "float32", (4, 256)), rc.CUDAArg(rc.ARG_TENSOR, "float32", (4, 256))),
        (rc.CUDALaunch("two_kernel0", (4, 1, 1), (256, 1, 1), 0, (0, 2)),
         rc.CUDALaunch("two_kernel1", (4, 1, 1), (256, 1, 1), 0, (2, 1))), temps=(4096,))]
    ptx = ".version 8.8\n.target sm_80\n.visible .entry two_kernel0(\n)\n.visible .entry two_kernel1(\n)\n"
    mod = rc.loadbinary_cuda(rc.encode_payload(rc.CUDAPayload("ptx", ptx.encode(), "", "sm_80", funcs)))
    seen = []

    @hook_type()
    def hook(name, gx, gy, gz, bx, by, bz, shared, params):
        seen.append((name.decode(), gx * bx))
        if name == b"two_kernel0":  # temp = A * 2
            view(params, 1, 1024)[:] = view(params, 0, 1024) * 2
        else:  # C = temp + 1
            view(params, 1, 1024)[:] = view(params, 0, 1024) + 1

    mock_cuda.mock_set_launch_hook(hook)
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    a = kiln.nd.array(x, device=kiln.cuda())
    c = kiln.nd.empty((4, 256), "float32", device=kiln.cuda())
    mod["two"](a, c)  # the .version 8.8 PTX was re-stamped to the mock driver's 8.4
    np.testing.assert_array_equal(c.numpy(), x * 2 + 1)
    assert seen == [("two_kernel0", 1024), ("two_kernel1", 1024)]
    with pytest.raises(InputError, match=r"argument 1 is float32\[4, 255\], expected float32\[4, 256\]"):
        mod["two"](a, kiln.nd.empty((4, 255), "float32", device=kiln.cuda()))
    with pytest.raises(InputError, match="is on cpu"):
        mod["two"](a, kiln.nd.empty((4, 256), "float32"))


def test_mock_runs_a_built_kernel(mock_cuda, needs_nvrtc) -> None:
    """The real codegen output (PTX entry names, argument order, launch size) drives the launch."""
    from kiln import te
    from kiln.codegen.cuda import build_cuda
    from kiln.te.schedule import thread_axis
    from kiln.te.lower_schedule import lower

    A = te.placeholder((1000,), name="A")
    B = te.placeholder((1000,), name="B")
    C = te.compute((1000,), lambda i: A[i] - B[i], name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=128)
    s[C].bind(xo, thread_axis("blockIdx.x"))
    s[C].bind(xi, thread_axis("threadIdx.x"))
    built = build_cuda([lower(s, [A, B, C], name="vsub")], "cuda")
    mod = rc.loadbinary_cuda(built.save_to_binary())

    @hook_type()
    def hook(name, gx, gy, gz, bx, by, bz, shared, params):
        assert (gx, bx) == (8, 128)
        view(params, 2, 1000)[:] = view(params, 0, 1000) - view(params, 1, 1000)

    mock_cuda.mock_set_launch_hook(hook)
    launches = mock_cuda.mock_launch_count()
    r = np.random.default_rng(1)
    x, y = r.standard_normal(1000).astype(np.float32), r.standard_normal(1000).astype(np.float32)
    out = kiln.nd.empty((1000,), "float32", device=kiln.cuda())
    mod["vsub"](kiln.nd.array(x, device=kiln.cuda()), kiln.nd.array(y, device=kiln.cuda()), out)
    np.testing.assert_array_equal(out.numpy(), x - y)
    assert mock_cuda.mock_launch_count() == launches + 1


def test_import_is_lazy_and_keeps_the_runtime_isolated() -> None:
    """Importing the CUDA runtime opens no driver and imports no compiler module, and
    ``kiln.runtime.cuda`` stays the device constructor after it is imported."""
    import subprocess
    import sys

    code = (
        "import sys, kiln, kiln.runtime as rt\n"
        "import kiln.runtime.cuda_driver\n"
        "from kiln.runtime import cuda_api as c\n"
        "assert c.opened_driver() is None\n"
        "assert str(rt.cuda(1)) == 'cuda(1)' and str(kiln.cuda()) == 'cuda(0)'\n"
        "bad = [m for m in sys.modules\n"
        "       if m.startswith(('kiln.codegen', 'kiln.target', 'kiln.tir', 'llvmlite', 'onnx'))]\n"
        "assert not bad, bad\n"
        "print('LAZY OK')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "LAZY OK" in r.stdout, r.stdout + r.stderr


def test_mock_zero_dim_tensor_argument_is_shape_checked(mock_cuda) -> None:
    """A 0-d tensor parameter (e.g. a full reduction's output) rejects a tensor of another
    shape instead of launching on it (the kernel would touch one element of it)."""
    funcs = [rc.CUDAFunction("red", (rc.CUDAArg(rc.ARG_TENSOR, "float32", (8,)), rc.CUDAArg(rc.ARG_TENSOR, "float32")),
                             (rc.CUDALaunch("red_kernel0", (1, 1, 1), (8, 1, 1), 0, (0, 1)),))]
    ptx = ".version 8.0\n.target sm_80\n.visible .entry red_kernel0(\n)\n"
    mod = rc.loadbinary_cuda(rc.encode_payload(rc.CUDAPayload("ptx", ptx.encode(), "", "sm_80", funcs)))
    x = kiln.nd.empty((8,), "float32", device=kiln.cuda())
    mod["red"](x, kiln.nd.empty((), "float32", device=kiln.cuda()))
    with pytest.raises(InputError, match=r"argument 1 is float32\[4\], expected float32\[\]"):
        mod["red"](x, kiln.nd.empty((4,), "float32", device=kiln.cuda()))
