"""Conversions to and from the low-precision storage types, as integer bit manipulation in the loop IR.

The low-precision dtypes (:data:`kiln.runtime.dtype.LOW_PRECISION_DTYPES`: the float8 variants,
``float4_e2m1fn``, ``int4``, ``uint4``, ``int2``, ``uint2``) are storage types: a kernel holds
each element in one byte (``uint8_t`` / ``i8``) and computes nothing in them. :func:`convert`
builds the expression of a conversion from any dtype to any dtype where one side is such a
type, out of integer and bit operations on the storage byte and on the bits of a float32
(``Call(REINTERPRET)``), so that every code generator runs it as it runs any other
expression; no table, no Python at run time. The ``cast`` compute
(:func:`kiln.topi.elemwise.cast`) calls it, with ONNX Cast's ``saturate`` and ``round_mode``.

Semantics (those of the ONNX reference, which uses ``ml_dtypes``; bit for bit):

* float -> float8 / float4: round to nearest, ties to even, from the float32 value (float16 and
  bfloat16 widen to it exactly; float64, integers and bool are rounded to float32 first, as
  ``ml_dtypes`` and ONNX Runtime do). ``saturate`` (ONNX Cast's default) clamps finite and
  infinite values beyond the largest finite value to it; without it they become inf
  (``float8_e5m2``) or NaN (the others). NaN stays NaN with its sign (``e4m3fn`` 0x7F,
  ``e5m2`` 0x7E); the ``fnuz`` types have one NaN (0x80) and no -0 (a negative value that
  rounds to zero is +0). ``float4_e2m1fn`` has neither inf nor NaN: it always saturates and
  maps NaN to a zero of the opposite sign, as ``ml_dtypes`` does.
* float8 / float4 -> anything: decoded exactly to float32 (every value is representable;
  NaN is the quiet NaN of the encoding's sign, the ``fnuz`` NaN is negative), then an
  ordinary Kiln cast (float -> int truncates, -> bool is ``!= 0``).
* ``float8_e8m0fnu`` (an exponent only): ONNX ``to_float8e8m0`` from the float32 value, with
  ``round_mode`` ``"up"`` (the default), ``"down"`` or ``"nearest"``; the sign is ignored,
  NaN / inf give 0xFF (NaN); ``saturate`` keeps the largest exponent instead of rounding up
  to NaN.
* int4 / uint4 / int2 / uint2: an integer source keeps its low 4 / 2 bits (wraps, as NumPy's
  integer casts do); a float source is truncated toward zero first (NaN, inf and values outside
  the int32 range give 0, as ``ml_dtypes`` does). Decoding sign-extends (int4, int2) or
  zero-extends (uint4, uint2) the value bits of the storage byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.errors import CompileError
from ..tir.dtype import is_bool, is_float, is_low_precision
from ..tir.expr import Call, PrimExpr, binary, cast, const

__all__ = ["convert", "is_lowp_conversion", "decode_float", "encode_float", "FloatFormat", "FLOAT_FORMATS",
           "INT_WIDTHS", "ROUND_MODES", "REINTERPRET"]

#: ``Call(dst, REINTERPRET, [x], text=dst)``: the bits of ``x`` read as ``dst`` (the same name as
#: :data:`kiln.topi.integer.REINTERPRET` / :data:`kiln.codegen.cstyle.REINTERPRET`).
REINTERPRET = "kiln.reinterpret"

#: The rounding modes of ONNX Cast to FLOAT8E8M0.
ROUND_MODES = ("up", "down", "nearest")


@dataclass(frozen=True)
class FloatFormat:
    """A small float format stored in the low ``1 + exp_bits + man_bits`` bits of a byte.

    ``max_code``: magnitude code of the largest finite value; ``nan_code``: the magnitude of
    NaN (the sign bit is added except for ``fnuz``); ``overflow_code``: what a finite value
    beyond the range becomes without saturation (inf or NaN); ``fnuz``: one NaN (0x80), no -0.
    """

    exp_bits: int
    man_bits: int
    bias: int
    max_code: int
    nan_code: int | None
    overflow_code: int
    fnuz: bool = False

    @property
    def sign_shift(self) -> int:
        return self.exp_bits + self.man_bits


FLOAT_FORMATS: dict[str, FloatFormat] = {
    "float8_e4m3fn": FloatFormat(4, 3, 7, max_code=0x7E, nan_code=0x7F, overflow_code=0x7F),
    "float8_e4m3fnuz": FloatFormat(4, 3, 8, max_code=0x7F, nan_code=0x80, overflow_code=0x80, fnuz=True),
    "float8_e5m2": FloatFormat(5, 2, 15, max_code=0x7B, nan_code=0x7E, overflow_code=0x7C),
    "float8_e5m2fnuz": FloatFormat(5, 2, 16, max_code=0x7F, nan_code=0x80, overflow_code=0x80, fnuz=True),
    "float4_e2m1fn": FloatFormat(2, 1, 1, max_code=0x7, nan_code=None, overflow_code=0x7),
}
#: Value bits of the small integer types (stored in the low bits of a byte).
INT_WIDTHS: dict[str, tuple[int, bool]] = {"int4": (4, True), "uint4": (4, False), "int2": (2, True),
                                           "uint2": (2, False)}
_E8M0 = "float8_e8m0fnu"

# float32's exponent bits, mantissa bits and bias (the source of every encode)
_F32 = (8, 23, 127)


def _reinterpret(v: PrimExpr, dtype: str) -> PrimExpr:
    return v if v.dtype == dtype else Call(dtype, REINTERPRET, [v], text=dtype)


def _c(v: int, dtype: str) -> PrimExpr:
    return const(v, dtype)


def _from_storage(code: PrimExpr, dtype: str) -> PrimExpr:
    """A low-precision value of ``dtype`` from its storage byte given as an integer."""
    return _reinterpret(cast(code, "uint8"), dtype)


def _mask(cond: PrimExpr, dtype: str) -> PrimExpr:
    """All ones where ``cond`` holds, else 0 (a branch-free select: the code generators keep a
    select whose operands read memory as a branch, since a lazy select may skip a load)."""
    return const(0, dtype) - cast(cond, dtype)


def _pick(cond: PrimExpr, a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """``cond ? a : b`` for integers of one dtype, without a branch (both sides are computed)."""
    m = _mask(cond, a.dtype)
    return (a & m) | (b & ~m)


# ----------------------------------------------------------------------------- decode
def decode_float(v: PrimExpr) -> PrimExpr:
    """The exact float32 value of a float8 / float4 / e8m0 value ``v``."""
    src = v.dtype
    b = cast(_reinterpret(v, "uint8"), "uint32")
    u32 = "uint32"
    if src == _E8M0:
        # 2**(b - 127): the exponent field; b = 0 is 2**-127 (the float32 subnormal 0x00400000)
        # and b = 0xFF is NaN (0x7FC00000): both add the mantissa's top bit
        top = cast(binary("or", binary("eq", b, _c(0, u32)), binary("eq", b, _c(0xFF, u32))), u32)
        return _reinterpret((b << 23) | (top << 22), "float32")
    fmt = FLOAT_FORMATS.get(src)
    if fmt is None:
        raise CompileError(f"lowp_cast: {src} is not a low-precision float type")
    m_bits, sh = fmt.man_bits, fmt.sign_shift
    mag = b & ((1 << sh) - 1)
    sign = ((b >> sh) & 1) << 31
    # |value| = significand * 2**(max(e, 1) - bias - M), both factors exact in float32 (the
    # significand has its implicit bit when e > 0, none for subnormals)
    e1 = binary("max", mag >> m_bits, _c(1, u32))
    sig = mag - ((e1 - 1) << m_bits)
    scale = _reinterpret((e1 + (127 - fmt.bias - m_bits)) << 23, "float32")
    bits = _reinterpret(binary("mul", cast(sig, "float32"), scale), u32)
    nan = 0x7FC00000
    if src == "float8_e4m3fn":  # S.1111.111 is NaN, there is no inf
        bits = _pick(binary("eq", mag, _c(0x7F, u32)), _c(nan, u32), bits)
    elif src == "float8_e5m2":  # exponent 31: inf (mantissa 0) or NaN, as in IEEE formats
        special = _c(0x7F800000, u32) | (cast(binary("gt", mag, _c(0x7C, u32)), u32) << 22)
        bits = _pick(binary("ge", mag, _c(0x7C, u32)), special, bits)
    elif fmt.fnuz:  # 0x80 (the would-be -0) is the NaN; ml_dtypes decodes it as 0xFFC00000
        bits = bits | (cast(binary("eq", b, _c(0x80, u32)), u32) * nan)
    return _reinterpret(bits | sign, "float32")


def _decode_int(v: PrimExpr) -> PrimExpr:
    """The int32 value of an int4 / uint4 / int2 / uint2 value (its low bits, sign-extended)."""
    width, signed = INT_WIDTHS[v.dtype]
    low = cast(_reinterpret(v, "uint8"), "int32") & ((1 << width) - 1)
    if signed:
        half = 1 << (width - 1)
        return (low ^ half) - half
    return low


# ----------------------------------------------------------------------------- encode
def encode_float(x: PrimExpr, dst: str, saturate: bool = True, round_mode: str = "up") -> PrimExpr:
    """Round the float32 ``x`` to the float8 / float4 type ``dst`` (see the module docstring)."""
    if x.dtype != "float32":
        raise CompileError(f"lowp_cast: encode_float takes float32, got {x.dtype}")
    if dst == _E8M0:
        return _encode_e8m0(x, saturate, round_mode)
    fmt = FLOAT_FORMATS.get(dst)
    if fmt is None:
        raise CompileError(f"lowp_cast: {dst} is not a low-precision float type")
    se, sm, sbias = _F32
    # int64 arithmetic on the bits: no intermediate sum can overflow, however the simplifier
    # reassociates it (in C a signed int32 overflow would be undefined)
    it = "int64"
    u = cast(_reinterpret(x, "int32"), it)  # sign-extended
    a = u & ((1 << (se + sm)) - 1)  # |x|'s bits
    sign = cast(binary("lt", u, _c(0, it)), it)
    m_bits = fmt.man_bits
    # Exponent (biased for dst) and significand with its implicit bit; a source subnormal has
    # exponent field 0 but the scale of exponent 1 (so e1 = max(e, 1) and no implicit bit).
    e1 = binary("max", a >> sm, _c(1, it))
    sig = a - ((e1 - 1) << sm)
    et = e1 + (fmt.bias - sbias)
    # Below dst's normal range the significand shifts right further (dst subnormals); beyond
    # sm + 2 every bit is shifted out and rounds to 0, so the shift is capped there.
    k = binary("max", 1 - et, _c(0, it))
    shift = binary("min", k + (sm - m_bits), _c(sm + 2, it))
    lsb = (sig >> shift) & 1
    rounded = (sig + (((_c(1, it) << shift) >> 1) - 1) + lsb) >> shift  # round half to even
    # (exponent - 1) << M plus the significand with its implicit bit: a carry out of the
    # mantissa raises the exponent; et - 1 + k is 0 for dst subnormals. inf and NaN (source
    # exponent all ones) come out far above every cap.
    code = ((et - 1 + k) << m_bits) + rounded
    is_nan = cast(binary("gt", a, _c(((1 << se) - 1) << sm, it)), it)
    if fmt.nan_code is None:
        # float4: no inf and no NaN, always saturating; NaN becomes a zero of the opposite sign
        mag = binary("min", code, _c(fmt.max_code, it)) * (1 - is_nan)
        out = mag | ((sign ^ is_nan) << fmt.sign_shift)
    else:
        mag = binary("min", code, _c(fmt.max_code if saturate else fmt.overflow_code, it))
        mag = binary("max", mag, is_nan * fmt.nan_code)  # every cap is below the NaN code
        if fmt.fnuz:
            # no -0: the sign only goes with a magnitude that does not round to 0, i.e.
            # |x| > 2**(-bias - M); it is absorbed by the NaN code 0x80
            tiny = (sbias - fmt.bias - m_bits) << sm
            sign = sign & cast(binary("gt", a, _c(tiny, it)), it)
        out = mag | (sign << fmt.sign_shift)
    return _from_storage(out, dst)


def _encode_e8m0(x: PrimExpr, saturate: bool, round_mode: str) -> PrimExpr:
    """ONNX ``to_float8e8m0`` of the float32 ``x`` (the exponent field, rounded by ``round_mode``)."""
    i32 = "int32"
    u = _reinterpret(x, i32)
    e = (u >> 23) & 0xFF
    if round_mode == "down":
        inc = None
    elif round_mode == "up":
        inc = cast(binary("ne", u & 0x7FFFFF, _c(0, i32)), i32)
    elif round_mode == "nearest":
        g = binary("ne", u & 0x400000, _c(0, i32))
        rest = binary("or", binary("ne", u & 0x3FFFFF, _c(0, i32)), binary("gt", e, _c(0, i32)))
        inc = cast(binary("and", g, rest), i32)
    else:
        raise CompileError(f"lowp_cast: round_mode must be one of {', '.join(ROUND_MODES)}, got {round_mode!r}")
    if inc is None:
        out = e
    elif saturate:  # exponent 0xFE does not round up to 0xFF (NaN); NaN / inf (0xFF) stay
        out = binary("min", e + inc, _c(0xFE, i32)) | (cast(binary("eq", e, _c(0xFF, i32)), i32) * 0xFF)
    else:
        out = binary("min", e + inc, _c(0xFF, i32))
    return _from_storage(out, _E8M0)


def _encode_int(v: PrimExpr, dst: str) -> PrimExpr:
    """The low bits of the int32 / int64 ``v`` as ``dst`` (int4, uint4, int2, uint2)."""
    width, _ = INT_WIDTHS[dst]
    return _from_storage(cast(v, "int32") & ((1 << width) - 1), dst)


def _float_to_int32(f: PrimExpr) -> PrimExpr:
    """Truncation toward zero; NaN, inf and values outside int32 give 0 (ml_dtypes' result)."""
    if f.dtype not in ("float32", "float64"):
        f = cast(f, "float32")
    it = "int64" if f.dtype == "float64" else "int32"
    if f.dtype == "float64":  # [INT32_MIN, INT32_MAX] holds the value itself (ml_dtypes: 2**31 - 0.5 gives 0)
        ok = binary("and", binary("le", f, const(2.0**31 - 1, f.dtype)), binary("ge", f, const(-2.0**31, f.dtype)))
    else:
        ok = binary("and", binary("lt", f, const(2.0**31, f.dtype)), binary("gt", f, const(-2.0**31, f.dtype)))
    # zero the float first (its bits), so that the conversion itself never sees an out-of-range value
    safe = _reinterpret(_reinterpret(f, it) & _mask(ok, it), f.dtype)
    return cast(safe, "int32")


# ----------------------------------------------------------------------------- any -> any
def convert(v: PrimExpr, dst: str, saturate: bool = True, round_mode: str = "up") -> PrimExpr:
    """``v`` converted to ``dst``, where ``v.dtype`` or ``dst`` (or both) is a low-precision type.

    Parameters
    ----------
    v : PrimExpr
        The value (any dtype).
    dst : str
        The destination dtype (any dtype).
    saturate : bool
        ONNX Cast's ``saturate`` (float8 destinations only): clamp out-of-range values to the
        largest finite value instead of inf / NaN.
    round_mode : str
        ONNX Cast's ``round_mode`` (``float8_e8m0fnu`` destinations only): ``"up"``, ``"down"``
        or ``"nearest"``.

    Returns
    -------
    PrimExpr
        An expression of dtype ``dst`` (integer and bit operations, reinterpretations, float
        compares and at most one float multiply).
    """
    src = v.dtype
    if src == dst:
        return v
    if not (is_low_precision(src) or is_low_precision(dst)):
        return cast(v, dst)
    # 1. the source as a wide value: int32 for the small integers, float32 for the small floats
    if src in INT_WIDTHS:
        v = _decode_int(v)
    elif is_low_precision(src):
        v = decode_float(v)
    if not is_low_precision(dst):
        if is_bool(dst):
            return binary("ne", v, const(0, v.dtype))
        return cast(v, dst)
    # 2. the wide value encoded as dst
    if dst in INT_WIDTHS:
        if is_float(v.dtype):
            return _encode_int(_float_to_int32(v), dst)
        if is_bool(v.dtype):
            v = cast(v, "int32")
        return _encode_int(v, dst)
    # float32 first: exact for float16 / bfloat16; float64 and integers round to float32 first, as
    # ONNX's reference (ml_dtypes) and ONNX Runtime do
    return encode_float(cast(v, "float32"), dst, saturate, round_mode)


def is_lowp_conversion(src: str, dst: str) -> bool:
    """Whether converting ``src`` to ``dst`` needs :func:`convert` (one side is a low-precision type)."""
    return src != dst and (is_low_precision(src) or is_low_precision(dst))

