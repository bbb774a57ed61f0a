"""DLPack exchange in both directions: zero-copy, ownership, capsule rules."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kiln
from kiln.runtime import InputError
from kiln.runtime import dlpack as kdl
from kiln.runtime.dtype import LOW_PRECISION_DTYPES, SUPPORTED, np_dtype

# NumPy cannot exchange bfloat16 and the low-precision types (ml_dtypes types) over DLPack.
# DLPack has no string type (test_string_tensors.py checks the refusal)
NUMPY_DTYPES = [d for d in SUPPORTED if d not in ("bfloat16", "string") and d not in LOW_PRECISION_DTYPES]


def _collect_exports() -> int:
    gc.collect()
    return kdl._live_exports()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_consumes_kiln_zero_copy(dtype):
    x = np.arange(12).reshape(3, 4).astype(np_dtype(dtype))
    a = kiln.nd.array(x)
    y = np.from_dlpack(a)
    assert y.dtype == x.dtype and y.shape == (3, 4)
    assert y.ctypes.data == a.data_ptr
    np.testing.assert_array_equal(y, x)


def test_kiln_to_numpy_mutation_visible_both_ways():
    baseline = _collect_exports()
    a = kiln.nd.array(np.zeros((2, 3), "float32"))
    y = np.from_dlpack(a)  # NumPy asks for DLPack 1.x and gets a writable versioned capsule
    assert y.flags.writeable
    y[1, 2] = 5
    assert a.numpy()[1, 2] == 5
    a.copyfrom(np.full((2, 3), 3, "float32"))
    assert y.sum() == 18
    assert kdl._live_exports() == baseline + 1
    del a
    gc.collect()
    assert y.sum() == 18  # the export keeps the NDArray alive
    del y
    assert _collect_exports() == baseline  # deleter ran when NumPy let go


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_kiln_consumes_numpy_zero_copy(dtype):
    x = np.arange(10).astype(np_dtype(dtype))
    a = kiln.nd.from_dlpack(x)
    assert a.dtype == dtype and a.shape == (10,) and a.device == kiln.cpu()
    assert a.data_ptr == x.ctypes.data
    np.testing.assert_array_equal(a.numpy(), x)


def test_numpy_to_kiln_mutation_visible_both_ways():
    x = np.zeros(6, "int32")
    a = kiln.nd.from_dlpack(x)
    x[4] = 11
    assert a.numpy()[4] == 11
    a.copyfrom(np.arange(6, dtype="int32"))
    assert x.tolist() == [0, 1, 2, 3, 4, 5]


def test_from_dlpack_keeps_producer_alive_then_releases_it():
    x = np.arange(1000, dtype="float64")
    ref = weakref.ref(x)
    a = kiln.nd.from_dlpack(x)
    del x
    gc.collect()
    assert ref() is not None
    v = a._create_view((10,), byte_offset=80)
    del a
    gc.collect()
    assert ref() is not None and v.numpy().tolist() == list(range(10, 20))
    del v
    gc.collect()
    assert ref() is None  # deleter called once the last NDArray (the view) died


def test_raw_capsule_consumed_once():
    baseline = _collect_exports()
    a = kiln.nd.array(np.arange(4, dtype="float32"))
    cap = a.__dlpack__()
    assert "dltensor" in repr(cap) and "versioned" not in repr(cap)
    b = kiln.nd.from_dlpack(cap)
    assert b.data_ptr == a.data_ptr and "used_dltensor" in repr(cap)
    with pytest.raises(InputError, match="already consumed"):
        kiln.nd.from_dlpack(cap)
    del cap
    gc.collect()
    assert kdl._live_exports() == baseline + 1  # consumer (b) still owns it
    del a
    gc.collect()
    assert b.numpy().tolist() == [0, 1, 2, 3]
    del b
    assert _collect_exports() == baseline


def test_unconsumed_capsules_release_on_destruction():
    baseline = _collect_exports()
    a = kiln.nd.array(np.ones(3, "float32"))
    for kw in ({}, {"max_version": (1, 0)}):
        cap = a.__dlpack__(**kw)
        assert kdl._live_exports() == baseline + 1
        del cap
        assert _collect_exports() == baseline


def test_versioned_capsule_and_copy_flags():
    a = kiln.nd.array(np.arange(3, dtype="int64"))
    assert "dltensor_versioned" in repr(a.__dlpack__(max_version=(1, 2)))
    assert a.__dlpack_device__() == (1, 0)
    with pytest.raises(InputError, match="versioned"):
        kiln.nd.from_dlpack(a.__dlpack__(max_version=(1, 0)))
    c = kiln.nd.from_dlpack(a.__dlpack__(copy=True))
    assert c.data_ptr != a.data_ptr and c.numpy().tolist() == [0, 1, 2]
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(20, 0), copy=False)


def test_bfloat16_between_kiln_arrays():
    x = np.array([1.5, -2.0, 3.25], dtype=np_dtype("bfloat16"))
    a = kiln.nd.array(x)
    b = kiln.nd.from_dlpack(a.__dlpack__())
    assert b.dtype == "bfloat16" and b.data_ptr == a.data_ptr
    np.testing.assert_array_equal(b.numpy(), x)


def test_zero_d_and_empty_over_dlpack():
    s = np.array(2.5, dtype="float32")
    a = kiln.nd.from_dlpack(s)
    assert a.shape == () and a.numpy() == 2.5
    assert np.from_dlpack(kiln.nd.array(np.float64(7))).item() == 7
    e = kiln.nd.from_dlpack(np.zeros((0, 5), "int8"))
    assert e.shape == (0, 5) and e.numpy().shape == (0, 5)
    assert np.from_dlpack(kiln.nd.empty((3, 0), "uint16")).shape == (3, 0)


def test_non_contiguous_rejected_size_one_strides_accepted():
    base = np.arange(40, dtype="float32").reshape(4, 10)
    with pytest.raises(InputError, match="contiguous"):
        kiln.nd.from_dlpack(base[:, ::2])
    with pytest.raises(InputError, match="contiguous"):
        kiln.nd.from_dlpack(base.T)
    one_row = base[1::4]  # shape (1, 10), row stride 4 rows: size-1 dims may have any stride
    a = kiln.nd.from_dlpack(one_row)
    assert a.shape == (1, 10) and a.numpy()[0, 0] == 10


def test_unaligned_import_is_recorded():
    buf = kiln.nd.empty((16,), "float32")
    window = buf.numpy(copy=False)[1:5]
    a = kiln.nd.from_dlpack(window)
    assert a.data_ptr == buf.data_ptr + 4 and a.is_aligned is False
    assert kiln.nd.from_dlpack(buf.numpy(copy=False)).is_aligned is True


def test_from_dlpack_rejects_non_producers_and_bad_dtypes():
    with pytest.raises(InputError, match="__dlpack__"):
        kiln.nd.from_dlpack([1, 2, 3])
    with pytest.raises(InputError, match="code=5"):
        kiln.nd.from_dlpack(np.zeros(2, np.complex64))


def test_array_accepts_dlpack_producers():
    class Producer:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, **kw):
            return self.x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    x = np.arange(5, dtype="int16")
    a = kiln.nd.array(Producer(x))  # copies
    assert a.numpy().tolist() == [0, 1, 2, 3, 4] and a.data_ptr != x.ctypes.data
    assert kiln.nd.from_dlpack(Producer(x)).data_ptr == x.ctypes.data


def test_torch_zero_copy_both_ways():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32)
    a = kiln.nd.from_dlpack(t)
    t[0] = 42
    assert a.numpy()[0] == 42
    back = torch.from_dlpack(a)
    back[1] = -1
    assert t[1].item() == -1
    with pytest.raises(InputError, match="contiguous"):
        kiln.nd.from_dlpack(t.reshape(2, 3).t())
