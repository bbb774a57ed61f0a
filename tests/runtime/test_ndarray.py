"""NDArray on the CPU, and the dtype table."""

from __future__ import annotations

import ctypes
import gc
import time

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.runtime import InputError
from kiln.runtime import dtype as dt
from kiln.runtime._ffi import DLDataType, DLTensor
from kiln.runtime.device import get_device_api
from kiln.runtime.ndarray import NDArray


def _sample(dtype: str, shape=(4, 7)) -> np.ndarray:
    rng = np.random.default_rng(42)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "string":  # text of varying length, as an object array of str
        return np.asarray((rng.standard_normal(shape) * 50).astype(str), dtype=object)
    if dtype == "float8_e8m0fnu":  # powers of two only: a negative value would be NaN (never equal to itself)
        return np.abs(rng.standard_normal(shape) * 50).astype(dt.np_dtype(dtype))
    return (rng.standard_normal(shape) * 50).astype(dt.np_dtype(dtype))


# ----------------------------------------------------------------------------- dtype table
_EXPECTED_DL = {
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64), "bfloat16": (4, 16),
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "bool": (6, 8),
}  # fmt: skip


@pytest.mark.parametrize("name", list(_EXPECTED_DL))
def test_dtype_table(name):
    code, bits = _EXPECTED_DL[name]
    d = dt.to_dl(name)
    assert isinstance(d, DLDataType) and (d.code, d.bits, d.lanes) == (code, bits, 1)
    assert dt.from_dl(code, bits, 1) == name
    assert dt.canonical(dt.np_dtype(name)) == name
    assert dt.itemsize(name) == dt.np_dtype(name).itemsize == bits // 8
    assert dt.canonical(d) == name


def test_dtype_accepts_numpy_inputs_and_aliases():
    assert dt.canonical(np.float32) == "float32"
    assert dt.canonical(np.dtype("int8")) == "int8"
    assert dt.canonical("f4") == "float32"
    assert dt.canonical(bool) == "bool"
    assert dt.canonical(ml_dtypes.bfloat16) == "bfloat16"
    assert dt.np_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert dt.from_dl(1, 1, 1) == "bool"  # TVM's spelling of bool


@pytest.mark.parametrize("bad", ["float8", "complex64", np.complex128, None, [1], "nope"])
def test_dtype_errors_name_the_dtype_and_list_supported(bad):
    with pytest.raises(InputError) as e:
        dt.to_dl(bad)
    assert repr(bad) in str(e.value) and "float32" in str(e.value) and "bfloat16" in str(e.value)


def test_from_dl_errors():
    with pytest.raises(InputError, match="code=5"):
        dt.from_dl(5, 64, 1)
    with pytest.raises(InputError, match="lanes=4"):
        dt.from_dl(2, 32, 4)


# ----------------------------------------------------------------------------- basics
@pytest.mark.parametrize("dtype", dt.SUPPORTED)
def test_round_trip_every_dtype(dtype):
    x = _sample(dtype)
    a = kiln.nd.array(x)
    assert a.dtype == dtype and a.shape == x.shape and a.device == kiln.cpu()
    assert a.ndim == 2 and a.size == x.size and a.nbytes == x.nbytes
    y = a.numpy()
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(y, x)


def test_handle_describes_the_array():
    a = kiln.nd.array(np.arange(12, dtype="int16").reshape(3, 4))
    h = a.handle
    assert isinstance(h, DLTensor)
    assert (h.device.device_type, h.device.device_id) == (1, 0)
    assert h.ndim == 2 and [h.shape[0], h.shape[1]] == [3, 4]
    assert (h.dtype.code, h.dtype.bits, h.dtype.lanes) == (0, 16, 1)
    assert not h.strides and h.byte_offset == 0
    assert h.data == a.data_ptr
    assert a._dltensor_ptr() == ctypes.addressof(h)
    # the DLTensor is readable through its address as a kernel would see it
    t = DLTensor.from_address(a._dltensor_ptr())
    assert ctypes.cast(t.data, ctypes.POINTER(ctypes.c_int16))[5] == 5


@pytest.mark.parametrize("shape", [(1,), (3,), (17, 3), (5, 1, 9), (1000,)])
@pytest.mark.parametrize("dtype", ["int8", "float16", "float64", "bool"])
def test_memory_is_64_byte_aligned(shape, dtype):
    arrays = [kiln.nd.empty(shape, dtype) for _ in range(3)]
    assert all(a.data_ptr % 64 == 0 and a.is_aligned for a in arrays)


def test_zero_d_and_empty_arrays():
    s = kiln.nd.array(np.float32(3.5))
    assert s.shape == () and s.ndim == 0 and s.size == 1 and s.nbytes == 4
    assert s.numpy().shape == () and s.numpy() == np.float32(3.5)
    assert s.handle.ndim == 0
    e = kiln.nd.empty((2, 0, 3), "int64")
    assert e.size == 0 and e.nbytes == 0 and e.data_ptr != 0
    assert e.numpy().shape == (2, 0, 3)
    e.copyfrom(np.zeros((2, 0, 3), "int64"))
    assert e.copyto(kiln.cpu()).shape == (2, 0, 3)
    assert kiln.nd.empty(5).shape == (5,) and kiln.nd.empty(np.int64(2)).shape == (2,)


def test_empty_rejects_bad_shape_and_dtype():
    with pytest.raises(InputError, match="shape"):
        kiln.nd.empty((2, -1))
    with pytest.raises(InputError, match="shape"):
        kiln.nd.empty((2.5,))
    with pytest.raises(InputError, match="supported"):
        kiln.nd.empty((2,), "complex64")
    with pytest.raises(InputError, match="supported"):
        kiln.nd.array(np.zeros(2, np.complex64))


def test_array_conversions():
    a = kiln.nd.array([[1, 2], [3, 4]], dtype="float32")
    assert a.dtype == "float32" and a.numpy().tolist() == [[1, 2], [3, 4]]
    b = kiln.nd.array(a)  # copies
    b.copyfrom(np.zeros((2, 2), "float32"))
    assert a.numpy().sum() == 10
    c = kiln.nd.array(a, dtype="int32")
    assert c.dtype == "int32" and c.numpy().tolist() == [[1, 2], [3, 4]]
    d = kiln.nd.array(np.ones(3, ">f4"))  # big-endian input is converted, values kept
    assert d.dtype == "float32" and d.numpy().tolist() == [1, 1, 1]
    assert kiln.nd.array(np.ones(2), device="cpu").device == kiln.cpu()


def test_non_contiguous_inputs():
    base = np.arange(60, dtype="float32").reshape(6, 10)
    for x in (base[:, ::3], base.T, base[::-1], base[1:5, 2:7]):
        assert not x.flags.c_contiguous
        np.testing.assert_array_equal(kiln.nd.array(x).numpy(), x)
        a = kiln.nd.empty(x.shape, "float32")
        a.copyfrom(x)
        np.testing.assert_array_equal(a.numpy(), x)


def test_numpy_view_shares_memory_and_keeps_array_alive():
    a = kiln.nd.array(np.zeros(4, "int32"))
    v = a.numpy(copy=False)
    v[2] = 7
    assert a.numpy()[2] == 7
    assert np.asarray(a)[2] == 7
    ptr = a.data_ptr
    del a
    gc.collect()
    v[3] = 9  # memory must still be valid: the view owns a reference to the NDArray
    assert v.ctypes.data == ptr and v.tolist() == [0, 0, 7, 9]


def test_copyfrom_copyto_checks():
    a = kiln.nd.empty((2, 3), "float32")
    with pytest.raises(InputError, match="shape"):
        a.copyfrom(np.zeros((3, 2), "float32"))
    with pytest.raises(InputError, match="dtype"):
        a.copyfrom(np.zeros((2, 3), "float64"))
    with pytest.raises(InputError):
        a.copyfrom(kiln.nd.empty((2, 3), "int32"))
    with pytest.raises(InputError):
        a.copyto(kiln.nd.empty((6,), "float32"))
    with pytest.raises(InputError, match="Device or an NDArray"):
        a.copyto(42)  # type: ignore[arg-type]
    assert a.copyfrom([[1, 2, 3], [4, 5, 6]]) is a  # lists convert to the array's dtype
    b = kiln.nd.empty((2, 3), "float32")
    assert a.copyto(b) is b and b.numpy().tolist() == [[1, 2, 3], [4, 5, 6]]
    c = kiln.nd.empty((2, 3), "float32").copyfrom(b)
    assert c.numpy()[1, 2] == 6
    d = a.copyto(kiln.cpu())
    assert d is not a and d.data_ptr != a.data_ptr and d.numpy()[0, 0] == 1


def test_views():
    base = kiln.nd.array(np.arange(16, dtype="float32"))
    v = base._create_view((2, 3), byte_offset=8)
    assert v.shape == (2, 3) and v.data_ptr == base.data_ptr + 8
    assert v.handle.byte_offset == 0  # host views fold the offset into data
    np.testing.assert_array_equal(v.numpy(), np.arange(2, 8).reshape(2, 3))
    v.copyfrom(np.zeros((2, 3), "float32"))
    assert base.numpy()[:9].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 8]
    bits = base._create_view((16,), dtype="int32")  # reinterpretation, not conversion
    assert bits.numpy()[8] == np.float32(8).view(np.int32)
    raw = base._create_view((64,), "uint8")
    assert raw.nbytes == base.nbytes
    with pytest.raises(InputError, match="does not fit"):
        base._create_view((17,))
    with pytest.raises(InputError, match="does not fit"):
        base._create_view((16,), byte_offset=4)
    with pytest.raises(InputError):
        base._create_view((1,), byte_offset=-4)
    api = get_device_api(1)
    live = api._live_allocations()
    del base, bits, raw
    gc.collect()
    assert api._live_allocations() == live  # ``v`` still holds the allocation
    assert v.numpy().sum() == 0
    del v
    gc.collect()
    assert api._live_allocations() == live - 1


def test_memory_is_released():
    api = get_device_api(1)
    gc.collect()
    live = api._live_allocations()
    arrays = [kiln.nd.empty((8, 8)) for _ in range(10)]
    assert api._live_allocations() == live + 10
    del arrays
    gc.collect()
    assert api._live_allocations() == live


def test_repr_is_informative():
    r = repr(kiln.nd.array(np.arange(3, dtype="int8")))
    assert "shape=(3,)" in r and "int8" in r and "cpu(0)" in r and "[0 1 2]" in r
    assert len(repr(kiln.nd.empty((1000, 1000), "uint8"))) < 1000  # large arrays are summarized


def test_creation_is_cheap():
    t = time.perf_counter()
    arrays = [kiln.nd.empty((64, 64), "float32") for _ in range(1000)]
    views = [a._create_view((4096,)) for a in arrays]
    elapsed = time.perf_counter() - t
    assert len(views) == 1000 and elapsed < 1.0, f"2000 NDArrays took {elapsed:.3f}s"


def test_len():
    assert len(kiln.nd.empty((5, 2))) == 5
    with pytest.raises(TypeError):
        len(kiln.nd.empty(()))
    assert isinstance(kiln.nd.empty(()), NDArray)
