"""IR ops: integer and bit-level ops (bitwise ops, BitShift, BitCast).

The quantized ONNX ops (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul, QLinearConv) need no op of their own: the frontend decomposes them
into casts, integer matmul/conv2d and elementwise float math. The ops here are the bit-level
ones, which no combination of the arithmetic ops expresses.
"""

from __future__ import annotations

import numpy as np

from ...runtime.dtype import dl_bits as dtype_bits  # element bits: int4 is 4 (stored in a byte)
from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import INT_DTYPES, TensorType, np_dtype
from ._util import Attrs, broadcast_shapes, same_dtype

E, B = OpPattern.ELEMWISE, OpPattern.BROADCAST


# ----------------------------------------------------------------------------- type relations
def _require_int(t: TensorType, what: str) -> None:
    if t.dtype not in INT_DTYPES:
        raise InputError(f"{what} must be an integer tensor (int8..int64, uint8..uint64), got {t.dtype}")


def _int_binary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    dt = same_dtype(ts)
    _require_int(ts[0], "inputs")
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), dt)]


def _int_unary_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    _require_int(ts[0], "input")
    return [ts[0]]


def _bit_shift_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    if attrs["direction"] not in ("left", "right"):
        raise InputError(f"direction must be 'left' or 'right', got {attrs['direction']!r}")
    return _int_binary_rel(ts, attrs)


# ----------------------------------------------------------------------------- references
def _bitwise(fn):
    def run(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
        a, b = xs
        return [np.asarray(fn(a, b)).astype(a.dtype, copy=False)]
    return run


def _bit_shift_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, s = np.broadcast_arrays(*xs)
    nbits = x.dtype.itemsize * 8
    # The amount is read as unsigned (ONNX BitShift-28): a negative one is a huge shift.
    amount = s.astype(np.int64) if s.dtype.kind == "i" else s.astype(np.uint64)
    out_of_range = (amount < 0) | (amount >= nbits)
    safe = np.where(out_of_range, 0, amount).astype(x.dtype)
    with np.errstate(all="ignore"):
        if attrs["direction"] == "left":
            # Shift the unsigned bit pattern so that overflow wraps (what the kernels compute).
            udt = np.dtype(f"uint{nbits}")
            y = np.left_shift(x.astype(udt), safe.astype(udt)).astype(x.dtype)
            return [np.where(out_of_range, 0, y).astype(x.dtype)]
        y = np.right_shift(x, safe)
        fill = np.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
        return [np.where(out_of_range, fill, y).astype(x.dtype)]


# ----------------------------------------------------------------------------- registration
for _name, _fn, _sym in (("bitwise_and", np.bitwise_and, "&"), ("bitwise_or", np.bitwise_or, "|"),
                         ("bitwise_xor", np.bitwise_xor, "^")):
    register_op(_name, type_rel=_int_binary_rel, pattern=B, ref=_bitwise(_fn), num_inputs=2,
                doc=f"a {_sym} b on integer tensors", inputs=("lhs", "rhs"))

register_op("bitwise_not", type_rel=_int_unary_rel, pattern=E,
            ref=lambda xs, a: [np.invert(xs[0])], doc="~x on integer tensors", inputs=("data",))

register_op("bit_shift", attrs={"direction": ("str", REQUIRED)}, type_rel=_bit_shift_rel, pattern=B,
            ref=_bit_shift_ref, num_inputs=2, inputs=("data", "amount"),
            doc="x << s (direction='left') or x >> s ('right', arithmetic for signed x); a shift "
                "amount that is negative or >= the bit width gives 0 (right shift of a negative x: -1)")


# ----------------------------------------------------------------------------- bitcast
def _bitcast_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    src, dst = ts[0].dtype, attrs["dtype"]
    if dtype_bits(src) != dtype_bits(dst):
        raise InputError(f"bitcast needs dtypes of one width: {src} has {dtype_bits(src)} bits, "
                         f"{dst} has {dtype_bits(dst)}")
    return [TensorType(ts[0].shape, dst)]


def _bitcast_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    dst = np_dtype(attrs["dtype"])
    y = np.ascontiguousarray(xs[0]).view(dst)
    if attrs["dtype"] == "bool":
        y = y != 0  # a byte other than 0/1 is still true
    return [y]


register_op("bitcast", attrs={"dtype": ("dtype", REQUIRED)}, type_rel=_bitcast_rel, pattern=E,
            ref=_bitcast_ref, inputs=("data",),
            doc="reinterpret the bits of each element as dtype (same bit width)")
