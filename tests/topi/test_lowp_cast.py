"""Casts to and from the low-precision types (float8, float4, int4, ...): the kernels of the ``cast``
op (integer bit manipulation built by :mod:`kiln.topi.lowp_cast`) against ONNX's reference
(``onnx.reference``'s Cast, which converts with ``ml_dtypes``), bit for bit, on both CPU code
generators; and the IR op's NumPy reference (constant folding, ``kiln.ir.evaluate``) against the
same oracle.

Inputs cover every float16 and bfloat16 bit pattern, every storage byte of the small float types,
the rounding ties and overflow boundaries of every destination, and random float32 bit patterns.
(``python`` over every float32 bit pattern agreed too; too slow for the suite.)
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto
from onnx.reference.ops.op_cast import cast_to

from kiln import codegen, te, tir
from kiln.ir import get_op, np_dtype
from kiln.runtime import ndarray as nd
from kiln.runtime.errors import CompileError
from kiln.topi import lowp_cast
from tests.topi.harness import TARGETS, Case, lower_case, target_available

ONNX_TYPE = {
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "float8_e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
    "float8_e5m2": TensorProto.FLOAT8E5M2, "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
    "float8_e8m0fnu": TensorProto.FLOAT8E8M0, "float4_e2m1fn": TensorProto.FLOAT4E2M1,
    "int4": TensorProto.INT4, "uint4": TensorProto.UINT4, "int2": TensorProto.INT2, "uint2": TensorProto.UINT2,
    "float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE,
    "bfloat16": TensorProto.BFLOAT16, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
    "int32": TensorProto.INT32, "int64": TensorProto.INT64, "bool": TensorProto.BOOL,
}
SMALL_FLOATS = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")
SMALL_INTS = ("int4", "uint4", "int2", "uint2")
N_RANDOM = 1 << 15


def _float32_inputs() -> np.ndarray:
    """Every float16 value (as float32), the ties and overflow edges of every small float type
    (and one float32 ulp either side), specials, and random float32 bit patterns."""
    parts = [np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)]
    for name in SMALL_FLOATS:
        codes = np.arange(1 << 8 if name.startswith("float8") else 1 << 4, dtype=np.uint8)
        v = codes.view(np_dtype(name)).astype(np.float32)
        v = np.unique(v[np.isfinite(v)])
        mids = (v[:-1].astype(np.float64) + v[1:]) / 2
        edges = np.concatenate([v, mids.astype(np.float32), v * 2, v / 2])
        parts += [edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf))]
    parts.append(np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e38, -1e38, 1e-45, -1e-45, 2.0**31,
                           -2.0**31, 2.0**31 - 128, 3e9, -3e9], np.float32))
    rng = np.random.default_rng(0)
    parts.append(rng.integers(0, 1 << 32, N_RANDOM, dtype=np.uint64).astype(np.uint32).view(np.float32))
    x = np.concatenate(parts).astype(np.float32)
    return np.concatenate([x, -x])


def _inputs(src: str) -> np.ndarray:
    rng = np.random.default_rng(1)
    if src == "float32":
        return _float32_inputs()
    if src in ("float16", "bfloat16"):  # every bit pattern
        return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np_dtype(src))
    if src == "float64":
        with np.errstate(invalid="ignore"):
            x = _float32_inputs().astype(np.float64)
        # below float32's resolution: the value rounds to float32 first (as ml_dtypes does)
        return np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    if src in SMALL_FLOATS or src == "float8_e8m0fnu":  # every storage byte
        return np.arange(256 if src.startswith("float8") else 16, dtype=np.uint8).view(np_dtype(src))
    if src in SMALL_INTS:
        return np.arange(-8, 16).astype(np_dtype(src))  # wraps into every value, each several times
    if src == "bool":
        return np.array([True, False, True])
    info = np.iinfo(src)
    vals = np.concatenate([np.arange(-300, 301), rng.integers(-70000, 70000, 2000), [info.min, info.max]])
    return vals.clip(info.min, info.max).astype(src)


def _finite(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return x[np.isfinite(x.astype(np.float32))]


# (src, dst, saturate, round_mode, restrict to finite inputs)
CONVERSIONS: list[tuple[str, str, bool, str, bool]] = []
for _dst in SMALL_FLOATS:
    for _src in ("float32", "float16", "bfloat16", "float64", "int32", "uint8", "bool"):
        CONVERSIONS.append((_src, _dst, True, "up", False))
    if _dst.startswith("float8"):
        for _src in ("float32", "float16"):
            CONVERSIONS.append((_src, _dst, False, "up", False))
    for _src_dst in ("float32", "float16", "bfloat16", "float64"):
        CONVERSIONS.append((_dst, _src_dst, True, "up", False))
    CONVERSIONS += [(_dst, "int32", True, "up", True), (_dst, "bool", True, "up", False)]
for _rm in ("up", "down", "nearest"):
    for _sat in (True, False):
        CONVERSIONS.append(("float32", "float8_e8m0fnu", _sat, _rm, False))
    CONVERSIONS.append(("float16", "float8_e8m0fnu", True, _rm, False))
CONVERSIONS += [("float8_e8m0fnu", "float32", True, "up", False), ("float8_e8m0fnu", "float16", True, "up", False)]
for _dst in SMALL_INTS:
    for _src in ("float32", "float16", "float64", "int8", "int32", "int64", "uint8", "bool"):
        CONVERSIONS.append((_src, _dst, True, "up", False))
    for _src_dst in ("float32", "float16", "int8", "uint8", "int32", "int64"):
        CONVERSIONS.append((_dst, _src_dst, True, "up", False))
# between two low-precision types: through float32 / int32
for _src, _dst in (("float8_e4m3fn", "float8_e5m2"), ("float8_e5m2", "float8_e4m3fn"), ("float8_e5m2", "float4_e2m1fn"),
                   ("float8_e4m3fnuz", "float8_e4m3fn"), ("int4", "int2"), ("uint4", "int4"), ("int4", "float8_e4m3fn"),
                   ("float4_e2m1fn", "int4"), ("float8_e5m2fnuz", "uint2")):
    CONVERSIONS.append((_src, _dst, True, "up", _src.startswith("float") and _dst in SMALL_INTS))
CONVERSIONS.append(("float8_e5m2", "float8_e4m3fn", False, "up", False))


def _case(src: str, dst: str, saturate: bool, round_mode: str, finite: bool) -> tuple[Case, np.ndarray]:
    x = _inputs(src)
    if finite:
        x = _finite(x)
    attrs = {"dtype": dst, "saturate": saturate, "round_mode": round_mode}
    label = f"{dst}{'' if saturate else '-nosat'}{'' if round_mode == 'up' else '-' + round_mode}"
    return Case("cast", [(x.shape, src)], attrs, label=label), x


_CASES_AND_INPUTS = [_case(*c) for c in CONVERSIONS]
CASES: list[Case] = [c for c, _ in _CASES_AND_INPUTS]  # (tests/topi/test_registry.py counts them)
INPUTS: list[np.ndarray] = [x for _, x in _CASES_AND_INPUTS]
_IDS = [f"{c.inputs[0][1]}-{c.id}" for c in CASES]
_MODULES: dict[str, tuple] = {}


def _module(target: str):
    reason = target_available(target)
    if reason:
        pytest.skip(reason)
    if target not in _MODULES:
        built = [lower_case(c, f"lowp_{i}", target) for i, c in enumerate(CASES)]
        _MODULES[target] = (codegen.build_module([b.func for b in built], target), built)
    return _MODULES[target]


def _oracle(x: np.ndarray, dst: str, saturate: bool, round_mode: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        if dst in SMALL_INTS and x.dtype.name in SMALL_FLOATS:
            x = x.astype(np.float32)  # ml_dtypes has no direct float8 -> int4 conversion
        if x.dtype.name in SMALL_INTS and dst in SMALL_INTS + SMALL_FLOATS:
            x = x.astype(np.int32)  # nor between two of the small types
        if x.dtype == bool and dst in SMALL_INTS + SMALL_FLOATS:
            x = x.astype(np.int32)
        if x.dtype.name in SMALL_FLOATS + ("float8_e8m0fnu",) and dst == "bool":
            return x.astype(np.float32) != 0
        return np.asarray(cast_to(x, ONNX_TYPE[dst], saturate, round_mode))


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype)
    g, w = got.view(np.uint8), want.view(np.uint8)
    bad = np.nonzero(g != w)[0]
    assert not len(bad), f"{what}: {len(bad)} bytes differ, first at byte {bad[0]}: {g[bad[:8]]} vs {w[bad[:8]]}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("index", range(len(CASES)), ids=_IDS)
def test_cast_kernel_matches_onnx_reference_bit_for_bit(target, index):
    mod, built = _module(target)
    b, case, x = built[index], CASES[index], INPUTS[index]
    a = b.attrs
    out = nd.empty(x.shape, a["dtype"])
    mod[b.name](nd.array(x), out)
    _same_bits(out.numpy(), _oracle(x, a["dtype"], a["saturate"], a["round_mode"]), f"{target} {case.id}")


@pytest.mark.parametrize("index", range(len(CASES)), ids=_IDS)
def test_ir_reference_matches_onnx_reference(index):
    case, x = CASES[index], INPUTS[index]
    attrs = get_op("cast").normalize_attrs(case.attrs)
    got = get_op("cast").ref([x.copy()], attrs)[0]
    _same_bits(np.asarray(got), _oracle(x, attrs["dtype"], attrs["saturate"], attrs["round_mode"]), case.id)


def test_storage_layout_is_ml_dtypes():
    """One element per byte, the value in the low bits: what NumPy arrays of ml_dtypes hold."""
    assert np.array([-1, -8, 7], ml_dtypes.int4).view(np.uint8).tolist() == [0x0F, 0x08, 0x07]
    assert np.array([-2, 1], ml_dtypes.int2).view(np.uint8).tolist() == [0x02, 0x01]
    assert np.array([-6.0, 0.5], ml_dtypes.float4_e2m1fn).view(np.uint8).tolist() == [0x0F, 0x01]


def test_decode_ignores_the_unused_high_bits():
    # a byte from elsewhere with garbage above the value bits decodes by its value bits only
    x = te.placeholder((1,), "uint8", name="x")
    y = te.compute((1,), lambda i: lowp_cast.convert(
        tir.Call("int4", lowp_cast.REINTERPRET, [x[i]], text="int4"), "int32"), name="y")
    f = tir.lower(te.create_schedule(y.op), [x, y], "lowp_high_bits")
    mod = codegen.build_module([f], "llvm")
    out = nd.empty((1,), "int32")
    mod["lowp_high_bits"](nd.array(np.array([0xF9], np.uint8)), out)
    assert out.numpy().tolist() == [-7]


def test_plain_casts_of_low_precision_values_are_refused():
    v = tir.Var("v", "float8_e4m3fn")
    with pytest.raises(CompileError, match="lowp_cast"):
        tir.cast(v, "float32")
    with pytest.raises(CompileError, match="lowp_cast"):
        tir.cast(tir.Var("w", "float32"), "int4")
    with pytest.raises(CompileError, match="low-precision"):
        te.max_value("float8_e5m2")


@pytest.mark.parametrize("dtype,value", [("float8_e4m3fn", 1.5), ("float8_e5m2", -3.0), ("float8_e4m3fnuz", 1e6),
                                         ("float4_e2m1fn", 2.5), ("int4", -3), ("uint2", 3), ("float8_e8m0fnu", 4.0)])
def test_constants_are_encoded_at_compile_time(dtype, value):
    c = tir.const(value, dtype)
    assert c.dtype == dtype and isinstance(c, tir.Call) and c.op == lowp_cast.REINTERPRET
    want = np.asarray(value, np.float64)
    if dtype.startswith("float8") and dtype != "float8_e8m0fnu":
        fi = ml_dtypes.finfo(np_dtype(dtype))
        want = np.clip(want, float(fi.min), float(fi.max))
    assert c.args[0].value == int(want.astype(np_dtype(dtype)).reshape(1).view(np.uint8)[0])


def test_constant_casts_are_encoded_too():
    c = tir.cast(tir.const(-2.5, "float64"), "float4_e2m1fn")  # e.g. pad's fill value
    assert isinstance(c, tir.Call) and c.args[0].value == 0x0C  # -2 (ties to even): sign 8 | code 4


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("src,wrong", [("float8_e4m3fn", "uint8"), ("int4", "int8"), ("float4_e2m1fn", "uint4")])
def test_argument_checks_name_the_low_precision_type(target, src, wrong):
    mod, built = _module(target)
    i = next(k for k, c in enumerate(CASES) if c.inputs[0][1] == src)
    b, x = built[i], INPUTS[i]
    bad = nd.array(np.zeros(x.shape, np_dtype(wrong)))
    with pytest.raises(Exception, match=f"expected {src}.*got {wrong}|{src}.*{wrong}"):
        mod[b.name](bad, nd.empty(x.shape, b.attrs["dtype"]))


def test_fused_quantize_dequantize_round_trip():
    """cast(x / s) -> float8 -> float32 * s fused in one kernel: the decode of an encode."""
    from tests.topi.harness import Fused, fused_reference, lower_fused
    from kiln.ir import OpPattern

    fc = Fused("q-dq", [((64,), "float32"), ((), "float32")],
               [("divide", {}, ("i0", "i1")), ("cast", {"dtype": "float8_e4m3fn"}, ("n0",)),
                ("cast", {"dtype": "float32"}, ("n1",)), ("multiply", {}, ("n2", "i1"))],
               anchor="cast", pattern=OpPattern.ELEMWISE)
    rng = np.random.default_rng(3)
    xs = [(rng.standard_normal(64) * 300).astype(np.float32), np.array(0.5, np.float32)]
    for target in TARGETS:
        f, _ = lower_fused(fc, f"lowp_qdq_{target}", target)
        mod = codegen.build_module([f], target)
        out = nd.empty((64,), "float32")
        mod[f"lowp_qdq_{target}"](*[nd.array(x) for x in xs], out)
        want = (xs[0] / xs[1]).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * xs[1]
        np.testing.assert_array_equal(out.numpy(), want)
        np.testing.assert_array_equal(fused_reference(fc, xs), want)
