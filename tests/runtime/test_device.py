"""Devices, the DeviceAPI registry, the CPU API, and a device plug-in written in Python alone."""

from __future__ import annotations

import ctypes
import pickle

import numpy as np
import pytest

import kiln
from kiln.runtime import DeviceError, InputError
from kiln.runtime.device import (
    ALLOC_ALIGNMENT,
    CPUDeviceAPI,
    Device,
    DeviceAPI,
    DeviceType,
    device,
    get_device_api,
    list_device_apis,
    register_device_api,
)
from kiln.runtime.dtype import SUPPORTED, np_dtype

HOSTSIM = 20  # an unused DLPack device code


# ----------------------------------------------------------------------------- Device values
def test_device_type_codes_match_dlpack():
    assert (DeviceType.CPU, DeviceType.CUDA, DeviceType.CUDA_HOST, DeviceType.OPENCL) == (1, 2, 3, 4)
    assert (DeviceType.VULKAN, DeviceType.METAL, DeviceType.ROCM, DeviceType.EXT_DEV) == (7, 8, 10, 12)


def test_device_constructors_and_str():
    assert str(kiln.cpu()) == "cpu(0)"
    assert kiln.device("cpu", 0) == kiln.cpu() == Device(1, 0)
    assert str(kiln.cuda(1)) == "cuda(1)" and kiln.cuda(1).device_type == 2
    assert str(kiln.opencl()) == "opencl(0)" and kiln.opencl().device_type == 4
    assert device("cuda:1") == kiln.cuda(1)
    assert device("opencl(2)") == kiln.opencl(2)
    assert device("llvm") == kiln.cpu() and device("gpu") == kiln.cuda() and device("CL") == kiln.opencl()
    assert device(2, 3) == kiln.cuda(3)
    assert device(kiln.cpu(0)) is not None and device(kiln.cpu(0)).name == "cpu"
    assert type(kiln.cpu().device_type) is int  # plain int, not the IntEnum


def test_device_is_immutable_hashable_picklable():
    d = kiln.cuda(1)
    with pytest.raises(AttributeError):
        d.device_id = 3
    assert {kiln.cpu(), Device(1, 0), kiln.cuda(0)} == {kiln.cpu(), kiln.cuda(0)}
    assert pickle.loads(pickle.dumps(d)) == d
    assert d != kiln.cuda(0) and d != (2, 1)


def test_unknown_device_name_lists_known_names():
    with pytest.raises(DeviceError) as e:
        kiln.device("foo")
    assert "'foo'" in str(e.value) and "cpu" in str(e.value) and "cuda" in str(e.value)


def test_invalid_device_values():
    with pytest.raises(DeviceError):
        Device(0, 0)
    with pytest.raises(DeviceError):
        Device(1, -1)
    with pytest.raises(DeviceError):
        Device("cpu")  # type: ignore[arg-type]


def test_exist_without_driver():
    assert kiln.cpu().exist is True
    # kDLCUDAManaged (13) has no registered API here; exist must answer, not raise.
    assert Device(13, 0).exist is False
    assert isinstance(kiln.cuda().exist, bool)


def test_get_device_api_error_names_device_and_registered():
    with pytest.raises(DeviceError) as e:
        get_device_api(13)
    msg = str(e.value)
    assert "13" in msg and "cpu (1)" in msg


def test_register_rejects_duplicates_and_non_apis():
    with pytest.raises(DeviceError, match="already registered"):
        register_device_api(DeviceType.CPU, CPUDeviceAPI())
    with pytest.raises(DeviceError, match="DeviceAPI instance"):
        register_device_api(21, object(), name="bogus")  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match="no built-in name"):
        register_device_api(22, CPUDeviceAPI())
    with pytest.raises(DeviceError, match="already means"):
        register_device_api(23, CPUDeviceAPI(), name="cuda")
    assert 22 not in list_device_apis() and 23 not in list_device_apis()


# ----------------------------------------------------------------------------- CPU API
def test_cpu_api_alloc_aligned_copy_free():
    api = get_device_api(kiln.cpu())
    assert api.host_visible is True
    dev = kiln.cpu()
    before = api._live_allocations()
    ptrs = [api.alloc_data_space(dev, n, 16) for n in (0, 1, 3, 64, 1000)]
    assert all(p % ALLOC_ALIGNMENT == 0 and p != 0 for p in ptrs)
    assert len(set(ptrs)) == len(ptrs)
    src = (ctypes.c_uint8 * 8)(*range(1, 9))
    api.copy_data_from_to(ctypes.addressof(src), 2, ptrs[3], 4, 5, dev, dev)
    assert ctypes.string_at(ptrs[3] + 4, 5) == bytes([3, 4, 5, 6, 7])
    for p in ptrs:
        api.free_data_space(dev, p)
    assert api._live_allocations() == before
    with pytest.raises(DeviceError, match="unknown pointer"):
        api.free_data_space(dev, ptrs[0])


def test_cpu_api_workspace_streams_attrs():
    api = get_device_api(1)
    dev = kiln.cpu()
    ws = api.alloc_workspace(dev, 256)
    assert ws % 64 == 0
    ctypes.memset(ws, 7, 256)  # must be writable host memory
    api.free_workspace(dev, ws)
    s = api.create_stream(dev)
    api.set_stream(dev, s)
    api.stream_sync(dev, s)
    api.free_stream(dev, s)
    dev.sync()
    assert api.get_attr(dev, "exist") is True
    assert dev.get_attr(0) is True  # TVM's integer kExist
    assert dev.multi_processor_count >= 1
    assert isinstance(dev.device_name, str) and dev.device_name
    assert dev.get_attr("warp_size") is None


# ----------------------------------------------------------------------------- plug-in device
class HostSimAPI(DeviceAPI):
    """A device implemented entirely in Python: memory is bytearrays it tracks itself, and
    pointers are fake handles (not addresses), so any code path that wrongly treated them as
    host memory would fail. host_visible is False to force the copy_data_from_to path."""

    host_visible = False

    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self._next = 0x1000
        self.copies = 0
        self.syncs = 0

    def get_attr(self, dev, kind):
        return {"exist": True, "device_name": "hostsim"}.get(kind)

    def alloc_data_space(self, dev, nbytes, alignment, dtype=None):
        handle, self._next = self._next, self._next + 0x1000
        self.mem[handle] = bytearray(nbytes)
        return handle

    def free_data_space(self, dev, ptr):
        del self.mem[ptr]

    def copy_data_from_to(self, src_ptr, src_offset, dst_ptr, dst_offset, nbytes, src_dev, dst_dev, stream=None):
        self.copies += 1
        src_sim, dst_sim = src_dev.device_type == HOSTSIM, dst_dev.device_type == HOSTSIM
        if src_sim and dst_sim:
            self.mem[dst_ptr][dst_offset : dst_offset + nbytes] = self.mem[src_ptr][src_offset : src_offset + nbytes]
        elif src_sim:
            chunk = (ctypes.c_char * nbytes).from_buffer(self.mem[src_ptr], src_offset)
            ctypes.memmove(dst_ptr + dst_offset, chunk, nbytes)
        elif dst_sim:
            self.mem[dst_ptr][dst_offset : dst_offset + nbytes] = ctypes.string_at(src_ptr + src_offset, nbytes)
        else:
            raise DeviceError("hostsim asked to copy between two other devices")

    def stream_sync(self, dev, stream):
        self.syncs += 1


@pytest.fixture(scope="module")
def hostsim():
    api = HostSimAPI()
    register_device_api(HOSTSIM, api, name="hostsim", override=True)
    return api, kiln.device("hostsim", 0)


def test_plugin_registration(hostsim):
    api, dev = hostsim
    assert dev == Device(HOSTSIM, 0) and str(dev) == "hostsim(0)"
    assert get_device_api(dev) is api and list_device_apis()[HOSTSIM] == "hostsim"
    assert dev.exist is True and dev.host_visible is False
    assert dev.device_name == "hostsim"


# strings live on the host only (tests/runtime/test_string_tensors.py checks the refusal)
@pytest.mark.parametrize("dtype", [d for d in SUPPORTED if d != "string"])
def test_plugin_round_trip_every_dtype(hostsim, dtype):
    api, dev = hostsim
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5)) * 10)
    x = (np.abs(x) if dtype == "float8_e8m0fnu" else x).astype(np_dtype(dtype))  # e8m0: no negatives (NaN)
    copies = api.copies
    a = kiln.nd.array(x, device=dev)
    assert a.device == dev and a.dtype == dtype and a.shape == (3, 5)
    assert a.handle.data in api.mem  # the DLTensor holds the plug-in's handle
    np.testing.assert_array_equal(a.numpy(), x)
    b = a.copyto(kiln.cpu())
    assert b.device == kiln.cpu()
    np.testing.assert_array_equal(b.numpy(), x)
    assert api.copies >= copies + 3  # in, out, and to cpu all went through the plug-in


def test_plugin_copies_views_and_frees(hostsim):
    api, dev = hostsim
    live = len(api.mem)
    x = np.arange(24, dtype="float32").reshape(4, 6)
    a = kiln.nd.array(x, device=dev)
    assert api.syncs > 0  # host->device copy of a temporary was synchronized
    # device -> device (same plug-in)
    b = a.copyto(dev)
    np.testing.assert_array_equal(b.numpy(), x)
    # non-contiguous host source goes through a contiguous staging copy
    strided = np.arange(48, dtype="float32").reshape(4, 12)[:, ::2]
    assert not strided.flags.c_contiguous
    b.copyfrom(strided)
    np.testing.assert_array_equal(b.numpy(), strided)
    b.copyfrom(np.asfortranarray(x * 2))
    np.testing.assert_array_equal(b.numpy(), x * 2)
    # a view on a non-host device uses DLTensor.byte_offset, not pointer arithmetic
    v = a._create_view((2, 3), byte_offset=4 * 6)
    assert v.handle.data == a.handle.data and v.handle.byte_offset == 24
    np.testing.assert_array_equal(v.numpy(), x.reshape(-1)[6:12].reshape(2, 3))
    v.copyfrom(np.full((2, 3), -1, "float32"))
    assert (a.numpy().reshape(-1)[6:12] == -1).all()
    # host NDArray -> plug-in NDArray and back into an existing host array
    c = kiln.nd.array(np.ones((4, 6), "float32"))
    c.copyto(b)
    np.testing.assert_array_equal(b.numpy(), np.ones((4, 6)))
    host = kiln.nd.empty((4, 6), "float32")
    b.copyto(host)
    np.testing.assert_array_equal(host.numpy(), np.ones((4, 6)))
    assert a.__dlpack_device__() == (HOSTSIM, 0)
    assert "hostsim(0)" in repr(a)
    assert len(api.mem) == live + 2
    del a, b, v
    assert len(api.mem) == live  # allocations (view included) released


def test_plugin_empty_and_scalar(hostsim):
    api, dev = hostsim
    e = kiln.nd.empty((0, 3), "int32", dev)
    assert e.numpy().shape == (0, 3)
    s = kiln.nd.array(np.float64(2.5), device=dev)
    assert s.shape == () and s.numpy() == 2.5


def test_plugin_mismatch_errors(hostsim):
    _, dev = hostsim
    a = kiln.nd.empty((2, 2), "float32", dev)
    with pytest.raises(InputError, match="dtype"):
        a.copyfrom(np.zeros((2, 2), "float64"))
    with pytest.raises(InputError, match="shape"):
        a.copyto(kiln.nd.empty((4,), "float32"))


def test_plugin_returning_bad_pointer_is_reported():
    class BadAlloc(HostSimAPI):
        def alloc_data_space(self, dev, nbytes, alignment, dtype=None):
            return None

    register_device_api(24, BadAlloc(), name="badalloc", override=True)
    with pytest.raises(DeviceError, match="BadAlloc.alloc_data_space returned None"):
        kiln.nd.empty((4,), "float32", "badalloc")
