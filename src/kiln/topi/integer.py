"""Computes: integer and bit-level ops (bitwise ops, BitShift, BitCast).

Only the bit-level ops have computes here; the quantized ONNX ops are decomposed by the
frontend into casts, integer matmul/conv2d and elementwise float math, whose kernels live
with those ops. All of these are injective, so the generic schedules fit.
"""

from __future__ import annotations

from typing import Any

from .. import te, tir
from ..tir.dtype import bits_of, is_float, is_int, is_low_precision
from .broadcast import broadcast_compute
from .elemwise import elemwise
from .registry import register_compute

__all__ = ["REINTERPRET", "bit_shift"]


def _register_bitwise(name: str) -> None:
    def f(a: Any, b: Any) -> Any:
        if name == "bitwise_and":
            return a & b
        if name == "bitwise_or":
            return a | b
        return a ^ b

    @register_compute(name)
    def _compute(attrs: dict, inputs: list, out_types: list) -> list:
        a, b = inputs
        return [broadcast_compute([a, b], f, name, out_types[0].shape if out_types else None, a.dtype)]


for _n in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _register_bitwise(_n)


@register_compute("bitwise_not")
def bitwise_not(attrs: dict, inputs: list, out_types: list) -> list:
    """``~x`` (every bit flipped)."""
    return [elemwise(inputs[0], lambda v: ~v, "bitwise_not")]


def bit_shift(x: te.Tensor, s: te.Tensor, direction: str, shape: Any = None) -> te.Tensor:
    """``x << s`` or ``x >> s`` with ONNX BitShift-28 semantics for out-of-range amounts.

    Parameters
    ----------
    x, s : te.Tensor
        Integer tensors of one dtype that broadcast together.
    direction : str
        ``"left"`` or ``"right"`` (arithmetic for signed ``x``).
    shape : sequence of int, optional
        The broadcast output shape (computed from the inputs when omitted).

    Returns
    -------
    te.Tensor
        The shifted values; an amount that is negative or at least the bit width gives 0
        (a right shift of a negative signed value gives -1).
    """
    dt = x.dtype
    nbits = bits_of(dt)
    signed = is_int(dt)
    udt = dt.replace("int", "uint") if signed else dt
    zero = te.const(0, dt)

    def f(v: Any, a: Any) -> Any:
        # The amount is read as unsigned; out of range it would be undefined behaviour in C and
        # poison in LLVM, so it is replaced by a safe one and the result selected afterwards.
        bad = a >= te.const(nbits, dt)
        if signed:
            bad = te.logical_or(bad, a < zero)
        if direction == "left":
            safe = te.if_then_else(bad, zero, a)
            # Shift the unsigned bit pattern: overflow wraps instead of being undefined.
            shifted = te.cast(te.cast(v, udt) << te.cast(safe, udt), dt)
            return te.if_then_else(bad, zero, shifted)
        if signed:
            # A shift by width - 1 fills with the sign bit: -1 for negative v, 0 otherwise.
            return v >> te.if_then_else(bad, te.const(nbits - 1, dt), a)
        return te.if_then_else(bad, zero, v >> te.if_then_else(bad, zero, a))

    return broadcast_compute([x, s], f, "bit_shift", shape, dt)


@register_compute("bit_shift")
def _bit_shift(attrs: dict, inputs: list, out_types: list) -> list:
    x, s = inputs
    return [bit_shift(x, s, attrs["direction"], out_types[0].shape if out_types else None)]


#: Intrinsic ``Call(dst, REINTERPRET, [x], text=dst)``: the bits of ``x`` read as ``dst`` (same
#: width). The LLVM and host-C code generators implement it (``kiln.codegen.cstyle.REINTERPRET``
#: is the same name); ``text`` repeats the destination dtype so that two reinterpretations of one
#: value to different dtypes never compare equal.
REINTERPRET = "kiln.reinterpret"


@register_compute("bitcast")
def bitcast(attrs: dict, inputs: list, out_types: list) -> list:
    """The bits of each element read as ``attrs["dtype"]`` (ONNX BitCast)."""
    x, dst = inputs[0], attrs["dtype"]
    lowp = is_low_precision(x.dtype) or is_low_precision(dst)  # one storage byte, read as the other type
    if not is_float(x.dtype) and not is_float(dst) and not lowp:
        # Between integer types (and bool) of one width a cast keeps the bits already.
        return [elemwise(x, lambda v: v, "bitcast", dst)]
    return [elemwise(x, lambda v: tir.Call(dst, REINTERPRET, [v], text=dst), "bitcast", dst)]
