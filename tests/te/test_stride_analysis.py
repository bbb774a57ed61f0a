"""The vectorizer's stride analysis: the affine fast path agrees with the simplifier.

``stride_in`` reads the coefficient of the lane variable straight off an index that is visibly
affine in it, and falls back to simplifying ``flat(v + 1) - flat(v)`` otherwise. Both must give
the same answer; ``Buffer.flat_sum`` must be the row-major offset.
"""

from __future__ import annotations

import itertools
import random

from kiln.tir.expr import IntImm, Var, cast
from kiln.tir.functor import substitute
from kiln.tir.simplify import simplify
from kiln.tir.stmt import Buffer
from kiln.tir.vectorize import flat_index, stride_in


def _slow_stride(flat, v, ranges=None):
    d = simplify(substitute(flat, {v: v + 1}) - flat, ranges)
    return d.value if isinstance(d, IntImm) else None


def _random_index(rng: random.Random, vs: list[Var], depth: int):
    """An integer expression over ``vs``: sums, differences, constant products, and sometimes a
    quotient / remainder / product of variables (not affine: the simplifier decides)."""
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(vs) if rng.random() < 0.7 else IntImm(rng.randint(-5, 9))
    a = _random_index(rng, vs, depth - 1)
    b = _random_index(rng, vs, depth - 1)
    op = rng.choice(["add", "add", "sub", "mulc", "mulc", "div", "mod", "mulv"])
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mulc":
        return a * rng.randint(-3, 17)
    if op == "div":
        return a // rng.randint(1, 7)
    if op == "mod":
        return a % rng.randint(1, 7)
    return a * b


def test_fast_path_matches_simplifier_on_random_indices() -> None:
    rng = random.Random(7)
    vs = [Var("x", "int32"), Var("y", "int32"), Var("z", "int32")]
    ranges = {v: (0, 63) for v in vs}
    checked = affine = 0
    for _ in range(400):
        e = _random_index(rng, vs, 4)
        for v in vs:
            want = _slow_stride(e, v, ranges)
            assert stride_in(e, v, ranges) == want, (str(e), v.name)
            checked += 1
            affine += want is not None
    assert checked == 1200 and 0 < affine < checked  # both kinds of index were exercised


def test_widening_cast_keeps_the_coefficient() -> None:
    x, y = Var("x", "int32"), Var("y", "int32")
    e = cast(x * 3 + y, "int64") * 16 + cast(y, "int64")
    assert stride_in(e, x) == 48
    assert stride_in(e, y) == 17
    assert stride_in(e, Var("w", "int32")) == 0


def test_flat_sum_is_the_row_major_offset() -> None:
    buf = Buffer("B", (3, 5, 7, 4), "float32")
    i, j = Var("i", "int32"), Var("j", "int32")
    idx = [i // 5, i % 5, IntImm(2), j]
    flat = flat_index(buf, idx)
    for iv, jv in itertools.product(range(15), range(4)):
        got = simplify(substitute(flat, {i: IntImm(iv), j: IntImm(jv)}))
        assert got.value == ((iv // 5) * 5 * 7 * 4 + (iv % 5) * 7 * 4 + 2 * 4 + jv)
    assert stride_in(flat, j) == 1
