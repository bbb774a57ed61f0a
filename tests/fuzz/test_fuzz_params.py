"""Fuzz the params loader: corrupt params bytes raise a KilnError, never anything else.

Seeds are real ``save_param_dict`` outputs (``tests/fuzz/corpus/params/``, made by
``python -m tests.fuzz.make_corpus``); see ``docs/dev/fuzzing.md`` for longer runs.
"""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings

from kiln.runtime import load_param_dict, load_param_dict_from_file, save_param_dict
from kiln.runtime.errors import FormatError
from kiln.runtime.params import PARAMS_LIST_MAGIC, TENSOR_MAGIC

from tests.fuzz.fuzz_support import (
    FUZZ_EXAMPLES,
    FUZZ_SETTINGS,
    assert_only_kiln_errors,
    load_corpus,
    mutated,
    peak_traced_bytes,
)

SEEDS = load_corpus("params")


def _load_and_roundtrip(data: bytes) -> None:
    """Load ``data``; whatever loads must save and load back to the same tensors."""
    params = load_param_dict(data)
    again = load_param_dict(save_param_dict(params))
    assert list(again) == list(params)
    for name, arr in params.items():
        assert again[name].dtype == arr.dtype and again[name].shape == arr.shape
        assert again[name].numpy().tobytes() == arr.numpy().tobytes()


def test_corpus_seeds_load():
    """The seeds are valid files: a harness starting from broken seeds fuzzes only the magic check."""
    for seed in SEEDS:
        _load_and_roundtrip(seed)


@FUZZ_SETTINGS
@given(mutated(SEEDS))
def test_fuzz_load_param_dict(data):
    assert_only_kiln_errors(_load_and_roundtrip, data)


@settings(FUZZ_SETTINGS, max_examples=max(FUZZ_EXAMPLES // 20, 1))
@given(mutated(SEEDS))
def test_fuzz_load_param_dict_from_file(data):
    # The file path reads through a real file object (readinto), a different code path.
    fd, path = tempfile.mkstemp(suffix=".params")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        assert_only_kiln_errors(load_param_dict_from_file, path)
    finally:
        os.unlink(path)


# ---------------------------------------------------------------------------------------
# hostile sizes: fail fast, allocate nothing the input cannot justify
# ---------------------------------------------------------------------------------------
def _u64(*v: int) -> bytes:
    return struct.pack(f"<{len(v)}Q", *v)


def _tensor(shape: tuple[int, ...], nbytes: int, code: int = 2, bits: int = 32, data: bytes = b"") -> bytes:
    head = struct.pack("<QQiiiBBH", TENSOR_MAGIC, 0, 1, 0, len(shape), code, bits, 1)
    return head + struct.pack(f"<{len(shape)}q", *shape) + struct.pack("<q", nbytes) + data


def _file(names: list[bytes], tensors: list[bytes]) -> bytes:
    out = _u64(PARAMS_LIST_MAGIC, 0, len(names))
    for n in names:
        out += _u64(len(n)) + n
    return out + _u64(len(tensors)) + b"".join(tensors)


HOSTILE = {
    "2**60 names in 100 bytes": (_u64(PARAMS_LIST_MAGIC, 0, 1 << 60) + bytes(76))[:100],
    "max u64 name count": _u64(PARAMS_LIST_MAGIC, 0, 2**64 - 1) + bytes(64),
    "name of 2**60 bytes": _u64(PARAMS_LIST_MAGIC, 0, 1, 1 << 60) + b"x" * 64,
    "tensor count 2**63": _u64(PARAMS_LIST_MAGIC, 0, 1, 1) + b"a" + _u64(1 << 63),
    "petabyte tensor": _file([b"w"], [_tensor((1 << 48,), 1 << 50)]),
    "2**62 x 0 empty tensor": _file([b"w"], [_tensor((0, 1 << 62), 0)]),
    "max dims with a zero": _file([b"w"], [_tensor((2**63 - 1, 0, 2**63 - 1), 0)]),
    "negative nbytes": _file([b"w"], [_tensor((2,), -8)]),
    "nbytes wraps to shape": _file([b"w"], [_tensor((1 << 62, 4), 0)]),
    "64 dims of 2**32": _file([b"w"], [_tensor((1 << 32,) * 64, 0)]),
}


@pytest.mark.parametrize("data", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_sizes_fail_fast_without_allocating(data):
    peak = peak_traced_bytes(lambda: pytest.raises(FormatError, load_param_dict, data))
    # Parsing a ~100-byte header legitimately needs a few KiB (exception text, tuples); a
    # loader that trusted a declared size would allocate gigabytes or raise MemoryError.
    assert peak < 64 * 1024, f"peak {peak} bytes while rejecting a {len(data)}-byte input"


@settings(FUZZ_SETTINGS, max_examples=max(FUZZ_EXAMPLES // 20, 1))
@given(mutated(SEEDS))
def test_fuzz_allocation_bounded_by_input(data):
    # Whatever a mutated file declares, loading it may allocate at most about its own size
    # (tensor data is copied once, into the result) plus a fixed overhead.
    peak = peak_traced_bytes(assert_only_kiln_errors, load_param_dict, data)
    assert peak < 2 * len(data) + 256 * 1024, f"peak {peak} bytes for a {len(data)}-byte input"


def test_zero_size_tensor_with_huge_dims_is_a_format_error():
    # Found by this harness: numpy refuses shapes whose non-zero dims overflow, even when a
    # zero dim makes the tensor empty; the loader must reject them as corrupt, not leak a
    # numpy ValueError.
    data = save_param_dict({"a": np.zeros((0, 4), "float32")})
    at = data.find(struct.pack("<qq", 0, 4))
    bad = data[:at] + struct.pack("<qq", 0, 1 << 62) + data[at + 16 :]
    with pytest.raises(FormatError, match="too large"):
        load_param_dict(bad)
