"""The simplifier folds quotient/remainder pairs that flattening fused loops produces.

``m*(x // m) + x % m`` is ``x`` and ``m*((x // m) % n) + x % m`` is ``x % (m*n)``: with these
folds the row-major offset of a fused loop's indices is linear in the loop variable again, which
is what lets a vectorized slice or concatenation use contiguous loads.
"""

from __future__ import annotations

import itertools

from kiln.tir.expr import IntImm, Var
from kiln.tir.functor import substitute
from kiln.tir.simplify import simplify
from kiln.tir.vectorize import stride_in


def _value(e, env: dict) -> int:
    r = simplify(substitute(e, {v: IntImm(x) for v, x in env.items()}))
    assert isinstance(r, IntImm), r
    return r.value


def _same_everywhere(a, b, o: Var, i: Var) -> None:
    for ov, iv in itertools.product(range(0, 40, 3), range(16)):
        env = {o: ov, i: iv}
        assert _value(a, env) == _value(b, env), env


def test_flattened_fused_index_is_the_fused_variable() -> None:
    o, i = Var("o", "int32"), Var("i", "int32")
    x = o * 16 + i
    flat = (x // 196) * 196 + (x // 14 % 14) * 14 + x % 14
    got = simplify(flat)
    assert str(got) == str(simplify(x))
    _same_everywhere(flat, got, o, i)
    # a slice starting at channel 116: the offset is the fused variable plus a constant
    sliced = simplify((x // 196 + 116) * 196 + (x // 14 % 14) * 14 + x % 14)
    assert str(sliced) == str(simplify(x + 116 * 196))


def test_two_level_fold_and_scaled_coefficients() -> None:
    o, i = Var("o", "int32"), Var("i", "int32")
    x = o * 16 + i
    e = (x // 14 % 14) * 28 + (x % 14) * 2  # both scaled by 2: 2 * (x % 196)
    got = simplify(e)
    assert "// 14" not in str(got) and "% 196" in str(got)
    _same_everywhere(e, got, o, i)


def test_unmatched_coefficients_are_not_folded() -> None:
    o, i = Var("o", "int32"), Var("i", "int32")
    x = o * 16 + i
    e = (x // 14) * 13 + x % 14  # 13 != 14: not the quotient/remainder identity
    got = simplify(e)
    assert "// 14" in str(got)
    _same_everywhere(e, got, o, i)


def test_stride_of_a_flattened_offset_is_one() -> None:
    o, i = Var("o", "int32"), Var("i", "int32")
    x = o * 16 + i
    flat = (x // 196) * 196 + (x // 14 % 14) * 14 + x % 14
    assert stride_in(flat, i, {o: (0, 100), i: (0, 15)}) == 1
