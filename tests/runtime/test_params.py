"""Params format: exact bytes, round trips, and rejection of every kind of corrupt input."""

from __future__ import annotations

import pathlib
import struct

import numpy as np
import pytest

import kiln
from kiln.runtime import FormatError, InputError, KilnFileNotFoundError
from kiln.runtime.dtype import SUPPORTED, np_dtype
from kiln.runtime.params import (
    PARAMS_LIST_MAGIC,
    TENSOR_MAGIC,
    load_param_dict,
    load_param_dict_from_file,
    save_param_dict,
    save_param_dict_to_file,
)

# {"x": float32 [1.0, 2.0]}, byte by byte, exactly as docs/params_format.md shows it.
TINY = bytes.fromhex(
    "B79C04054F8DE5F7"  # list magic 0xF7E58D4F05049CB7 (u64 LE)
    "0000000000000000"  # reserved
    "0100000000000000"  # 1 name
    "0100000000000000" "78"  # len 1, "x"
    "0100000000000000"  # 1 tensor
    "3FA1B496F0405EDD"  # tensor magic 0xDD5E40F096B4A13F
    "0000000000000000"  # reserved
    "01000000" "00000000"  # DLDevice: type 1 (CPU), id 0
    "01000000"  # ndim 1
    "02" "20" "0100"  # DLDataType: float, 32 bits, 1 lane
    "0200000000000000"  # shape[0] = 2
    "0800000000000000"  # nbytes 8
    "0000803F00000040"  # 1.0f, 2.0f
)  # fmt: skip
TENSOR_AT = 41  # offset of the tensor record in TINY


def _sample(dtype: str, shape) -> np.ndarray:
    rng = np.random.default_rng(7)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "string":  # text of varying length, as an object array of str
        return np.asarray((rng.standard_normal(shape) * 100).astype(str), dtype=object)
    if dtype == "float8_e8m0fnu":  # powers of two only: a negative value would be NaN (never equal to itself)
        return np.abs(rng.standard_normal(shape) * 100).astype(np_dtype(dtype))
    return (rng.standard_normal(shape) * 100).astype(np_dtype(dtype))


def test_magics():
    assert PARAMS_LIST_MAGIC == 0xF7E58D4F05049CB7 and TENSOR_MAGIC == 0xDD5E40F096B4A13F


def test_tiny_dict_bytes_exact():
    assert save_param_dict({"x": np.array([1.0, 2.0], "float32")}) == TINY
    assert save_param_dict({"x": kiln.nd.array(np.array([1.0, 2.0], "float32"))}) == TINY
    out = load_param_dict(TINY)
    assert list(out) == ["x"] and out["x"].dtype == "float32" and out["x"].numpy().tolist() == [1.0, 2.0]


def test_header_fields_in_order():
    x = np.arange(6, dtype="int16").reshape(2, 3)
    blob = save_param_dict({"ab": x, "c": np.zeros((), "bool")})
    assert struct.unpack_from("<QQ", blob, 0) == (PARAMS_LIST_MAGIC, 0)
    assert struct.unpack_from("<QQ2sQ1sQ", blob, 16) == (2, 2, b"ab", 1, b"c", 2)
    off = 16 + 8 + 10 + 9 + 8
    head = struct.unpack_from("<QQiiiBBH", blob, off)
    assert head == (TENSOR_MAGIC, 0, 1, 0, 2, 0, 16, 1)
    off += 32
    assert struct.unpack_from("<qqq", blob, off) == (2, 3, 12)
    off += 24
    assert blob[off : off + 12] == x.tobytes()
    off += 12
    # the 0-d bool: ndim 0, kDLBool(6) with 8 bits, no shape entries, nbytes 1
    assert struct.unpack_from("<QQiiiBBH", blob, off) == (TENSOR_MAGIC, 0, 1, 0, 0, 6, 8, 1)
    assert struct.unpack_from("<q", blob, off + 32) == (1,)
    assert blob[off + 40 :] == b"\x00" and len(blob) == off + 41


@pytest.mark.parametrize("dtype", SUPPORTED)
def test_round_trip_every_dtype(dtype):
    d = {"a": _sample(dtype, (3, 4)), "scalar": _sample(dtype, ()), "empty": _sample(dtype, (0, 2))}
    out = load_param_dict(save_param_dict(d))
    assert list(out) == ["a", "scalar", "empty"]
    for k, v in d.items():
        assert out[k].dtype == dtype and out[k].shape == v.shape and out[k].device == kiln.cpu()
        np.testing.assert_array_equal(out[k].numpy(), v)


def test_loaded_arrays_are_aligned_and_independent():
    blob = bytearray(save_param_dict({"w": np.arange(1000, dtype="float32"), "b": np.ones(3, "int8")}))
    out = load_param_dict(blob)
    assert all(v.is_aligned for v in out.values())
    blob[:] = bytes(len(blob))  # loaded arrays must not alias the input buffer
    assert out["w"].numpy()[999] == 999


def test_unicode_names_and_insertion_order():
    d = {"zeta": np.ones(1, "uint8"), "épsilon/权重": np.zeros(2, "uint64"), "a": np.ones(1, "float16")}
    out = load_param_dict(memoryview(save_param_dict(d)))
    assert list(out) == list(d)


def test_file_round_trip_large_weight(tmp_path: pathlib.Path):
    w = np.random.default_rng(0).standard_normal((512, 1024)).astype("float32")  # 2 MiB
    d = {"w": w, "b": kiln.nd.array(np.arange(4, dtype="int64"))}
    p = tmp_path / "model.params"
    save_param_dict_to_file(d, p)
    assert p.read_bytes() == save_param_dict(d)
    for src in (p, str(p)):
        out = load_param_dict_from_file(src) if src is p else load_param_dict(src)
        np.testing.assert_array_equal(out["w"].numpy(), w)
        assert out["w"].is_aligned and out["b"].numpy().tolist() == [0, 1, 2, 3]


def test_big_endian_and_non_contiguous_values_are_normalized():
    x = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    out = load_param_dict(save_param_dict({"x": x}))
    assert out["x"].dtype == "int32" and out["x"].numpy().tolist() == x.tolist()


def test_tvm_style_bool_loads():
    blob = bytearray(save_param_dict({"m": np.array([True, False, True])}))
    # name "m" has the same length as "x", so the dtype sits where it does in TINY
    blob[TENSOR_AT + 28 : TENSOR_AT + 30] = bytes([1, 1])  # (kDLUInt, 1 bit): how TVM writes bool
    out = load_param_dict(bytes(blob))
    assert out["m"].dtype == "bool" and out["m"].numpy().tolist() == [True, False, True]


def test_save_rejects_bad_input():
    with pytest.raises(InputError, match="names must be str"):
        save_param_dict({1: np.ones(1)})  # type: ignore[dict-item]
    with pytest.raises(InputError, match="NDArray or numpy.ndarray"):
        save_param_dict({"a": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(InputError, match="supported"):
        save_param_dict({"a": np.ones(1, np.complex64)})
    with pytest.raises(InputError, match="dict"):
        save_param_dict([("a", np.ones(1))])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- corrupt input
def _patch(data: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def test_every_truncation_raises_format_error():
    blob = save_param_dict({"x": np.array([1.0, 2.0], "float32"), "y": np.zeros((), "int8")})
    for cut in range(len(blob)):
        with pytest.raises(FormatError, match="truncated|cannot fit"):
            load_param_dict(blob[:cut])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: _patch(b, 0, "<Q", 0x1234), r"bad magic 0x0000000000001234.*F7E58D4F05049CB7"),
        (lambda b: _patch(b, TENSOR_AT, "<Q", 0), r"offset 41: .*bad tensor magic"),
        (lambda b: _patch(b, 33, "<Q", 2), r"1 names but 2 tensors"),
        (lambda b: _patch(b, TENSOR_AT + 40, "<q", 12), r"nbytes is 12 but shape \(2,\) of float32 needs 8"),
        (lambda b: _patch(b, TENSOR_AT + 28, "<B", 5), r"unknown dtype \(code=5, bits=32, lanes=1\)"),
        (lambda b: _patch(b, TENSOR_AT + 30, "<H", 4), r"unknown dtype .*lanes=4"),
        (lambda b: _patch(b, TENSOR_AT + 16, "<i", 2), r"device type 2"),
        (lambda b: _patch(b, TENSOR_AT + 24, "<i", -1), r"ndim -1 out of range"),
        (lambda b: _patch(b, TENSOR_AT + 24, "<i", 1 << 30), r"ndim \d+ out of range"),
        (lambda b: _patch(b, TENSOR_AT + 32, "<q", -2), r"negative dimension"),
        (lambda b: _patch(b, 16, "<Q", 1 << 62), r"name count .* cannot fit"),
        (lambda b: _patch(b, 24, "<Q", 1 << 40), r"truncated: expected \d+ bytes of name #0"),
        (lambda b: _patch(b, 32, "<B", 0xFF), r"not valid UTF-8"),
        (lambda b: b + b"\x00", r"1 unexpected trailing bytes"),
        (lambda b: b"", r"truncated: expected 8 bytes of list magic"),
    ],
)
def test_corrupt_input_raises_format_error(mutate, message):
    with pytest.raises(FormatError, match=message) as e:
        load_param_dict(mutate(TINY))
    assert "offset" in str(e.value)


def test_huge_declared_tensor_is_rejected_before_allocating():
    bad = _patch(_patch(TINY, TENSOR_AT + 32, "<q", 1 << 40), TENSOR_AT + 40, "<q", 4 << 40)
    with pytest.raises(FormatError, match="truncated: expected 4398046511104 bytes"):
        load_param_dict(bad)


def test_duplicate_names_rejected():
    blob = save_param_dict({"a": np.ones(1, "int8"), "b": np.ones(1, "int8")})
    blob = blob.replace(b"\x01\x00\x00\x00\x00\x00\x00\x00b", b"\x01\x00\x00\x00\x00\x00\x00\x00a", 1)
    with pytest.raises(FormatError, match="duplicate param name 'a'"):
        load_param_dict(blob)


def test_bad_sources():
    with pytest.raises(KilnFileNotFoundError, match="no_such.params"):
        load_param_dict("/nonexistent/no_such.params")
    with pytest.raises(InputError, match="bytes or a path"):
        load_param_dict(12)  # type: ignore[arg-type]
    assert isinstance(FormatError("x"), ValueError)  # generic handlers keep working
