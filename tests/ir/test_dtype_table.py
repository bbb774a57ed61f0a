"""One dtype table: the graph IR and the loop IR answer from kiln.runtime.dtype, never their own."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.ir import types as ir_types
from kiln.runtime import dtype as rt
from kiln.runtime.errors import CompileError, InputError
from kiln.tir import dtype as tir_dtype


def test_every_layer_accepts_the_same_dtypes():
    assert set(ir_types.DTYPES) == set(tir_dtype.SUPPORTED_DTYPES) == set(rt.SUPPORTED)


@pytest.mark.parametrize("name", rt.SUPPORTED)
def test_facts_agree_with_the_runtime_table(name):
    dl = rt.to_dl(name)
    assert tir_dtype.dl_code(name) == rt.dl_code(name) == dl.code
    assert tir_dtype.dl_bits(name) == rt.dl_bits(name) == dl.bits
    # storage is whole bytes: a sub-byte type (int4, float4_e2m1fn, ...) takes one byte per element
    assert tir_dtype.bits_of(name) == rt.bits(name) == 8 * rt.itemsize(name) == 8 * max(1, -(-dl.bits // 8))
    assert ir_types.np_dtype(name) == rt.np_dtype(name)
    assert ir_types.TensorType((2, 3), name).nbytes == 6 * rt.itemsize(name)
    assert tir_dtype.is_float(name) == (name in ir_types.FLOAT_DTYPES) == (name in rt.FLOAT_DTYPES)
    assert tir_dtype.is_integer(name) == (name in ir_types.INT_DTYPES)
    assert tir_dtype.is_low_precision(name) == (name in ir_types.LOW_PRECISION_DTYPES) == (
        name in rt.LOW_PRECISION_DTYPES)
    assert tir_dtype.check_dtype(name) == ir_types.normalize_dtype(name) == name


def test_kinds_partition_the_table():
    kinds = [rt.FLOAT_DTYPES, rt.SIGNED_DTYPES, rt.UNSIGNED_DTYPES, rt.LOW_PRECISION_DTYPES, frozenset({"bool"}),
             frozenset({rt.STRING})]
    assert sorted(n for k in kinds for n in k) == sorted(rt.SUPPORTED)
    assert "bfloat16" in rt.FLOAT_DTYPES and "bool" not in rt.UNSIGNED_DTYPES


def test_aliases_normalize_like_the_runtime():
    for alias in ("f4", np.float16, np.dtype("int8"), "float", bool):
        assert ir_types.normalize_dtype(alias) == rt.canonical(alias)


def test_none_is_not_float64():
    # np.dtype(None) is float64; the graph IR used to accept None as float64 silently.
    with pytest.raises(InputError, match="unsupported dtype None"):
        ir_types.normalize_dtype(None)


def test_unknown_dtypes_are_kiln_errors():
    with pytest.raises(InputError, match="supported dtypes: float16"):
        ir_types.np_dtype("complex64")  # used to return NumPy's complex64, a dtype Kiln cannot store
    with pytest.raises(InputError):
        tir_dtype.bits_of("float128")  # used to be a bare KeyError
    with pytest.raises(CompileError, match="unsupported dtype"):
        tir_dtype.check_dtype("complex64")
    assert tir_dtype.check_dtype("int") == "int32"  # the loop IR's C-like default is kept
