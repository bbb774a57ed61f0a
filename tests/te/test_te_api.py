"""Tensor expressions, schedules and lowering (no compilation)."""

from __future__ import annotations

import pytest

from kiln import te, tir
from kiln.runtime.errors import CompileError


def test_constant_folding_and_identities():
    x = te.var("x")
    assert (x * 1) is x and (x + 0) is x and (0 + x) is x
    assert isinstance(x * 0, te.IntImm) and (x * 0).value == 0
    c = te.const(3) * 4 + 2
    assert isinstance(c, te.IntImm) and c.value == 14
    assert (te.const(7) // 2).value == 3 and (te.const(-7) // 2).value == -4 and (te.const(-7) % 2).value == 1
    assert te.truncdiv(-7, te.const(2)).value == -3 and te.truncmod(-7, te.const(2)).value == -1
    f = te.const(1.5) * 2.0
    assert isinstance(f, te.FloatImm) and f.value == 3.0 and f.dtype == "float32"


def test_dtype_promotion_and_cast():
    i = te.var("i")
    e = i * 2.5
    assert e.dtype == "float32"
    h = te.placeholder((2,), dtype="float16", name="h")
    assert (h[0] + 1.0).dtype == "float16"
    assert (h[0].astype("float32") + h[0]).dtype == "float32"
    assert te.cast(te.const(3.7), "int32").value == 3
    assert te.cast(te.const(1e9), "int8").dtype == "int8"
    with pytest.raises(CompileError, match="ambiguous '/'"):
        i / 2
    with pytest.raises(CompileError, match="floating-point"):
        te.exp(i)


def test_comparisons_keep_hashing():
    A = te.placeholder((3,), name="A")
    x = A[0]
    d = {x: 1}
    assert d[x] == 1 and x == x and not (x == A[0])  # identity equality
    assert (x < 1.0).dtype == "bool" and te.equal(x, 1.0).dtype == "bool"
    assert te.not_equal(x, 1.0).op == "ne"
    with pytest.raises(CompileError, match="Python bool"):
        bool(x < 1.0)
    assert te.all().value == 1 and te.any().value == 0
    assert te.all(x > 0.0, x < 1.0).op == "and" and te.any(x > 0.0, x < 1.0).op == "or"
    assert te.logical_not(te.logical_not(x > 0.0)).op == "gt"


def test_tensor_api():
    A = te.placeholder((4, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="B", tag="reduce", attrs={"x": 1})
    assert B.shape == (4,) and B.dtype == "float32" and B.op.name == "B" and B.op.tag == "reduce"
    assert B.op.input_tensors == [A] and [iv.name for iv in B.op.axis] == ["i"]
    assert B.op.reduce_axis == [k] and B.op.attrs == {"x": 1}
    C = te.compute((4, 5), lambda *idx: A(*idx) + 1.0, name="C")
    assert [iv.name for iv in C.op.axis] == ["i0", "i1"]
    with pytest.raises(CompileError, match="whole compute body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) * 2.0)
    with pytest.raises(CompileError, match="indexed with 1"):
        A[0]
    with pytest.raises(CompileError, match="static integers"):
        te.placeholder((te.var("n"),))


def test_simplifier_and_guards():
    i, j = te.var("i"), te.var("j")
    assert str(tir.simplify((i * 4 + j) - i * 4)) == "j"
    r = tir.simplify(te.floordiv(i * 8 + j, 8), {j: (0, 7)})
    assert r is i
    assert tir.simplify(te.floormod(i * 8 + j, 8), {j: (0, 7)}) is j
    assert tir.simplify(i < 10, {i: (0, 9)}).value == 1
    assert tir.simplify(te.min_value("int32") < i).dtype == "bool"


def test_lower_split_guard_becomes_loop_extent():
    A = te.placeholder((10,), name="A")
    B = te.compute((10,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B)
    o, i = s[B].split(B.op.axis[0], factor=4)
    s[B].vectorize(i)
    text = str(tir.lower(s, [A, B], "f"))
    assert "min(4, 10 - i_outer * 4)" in text and "# vectorized" in text and "if " not in text


def test_schedule_primitive_errors():
    A = te.placeholder((8, 8), name="A")
    B = te.compute((8, 8), lambda i, j: A[i, j] * 2.0, name="B")
    s = te.create_schedule(B)
    i, j = B.op.axis
    o, inner = s[B].split(i, factor=2)
    with pytest.raises(CompileError, match="not a current loop axis"):
        s[B].split(i, factor=2)
    with pytest.raises(CompileError, match="adjacent"):
        s[B].fuse(o, j)
    with pytest.raises(CompileError, match="exactly one"):
        s[B].split(j)
    with pytest.raises(CompileError, match="placeholder"):
        s[A].split(A.op.axis[0] if A.op.axis else i, 2)
    k = te.reduce_axis((0, 8), "k")
    C = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="C")
    s2 = te.create_schedule(C)
    with pytest.raises(CompileError, match="reduction"):
        s2[C].compute_inline()
    with pytest.raises(CompileError, match="reduction axis"):
        s2[C].parallel(k)


def test_lower_arg_errors():
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((4,), lambda i: B[i] + 1.0, name="C")
    s = te.create_schedule(C)
    with pytest.raises(CompileError, match="input A is used but not listed"):
        tir.lower(s, [C], "f")
    with pytest.raises(CompileError, match="output C must be listed"):
        tir.lower(s, [A], "f")
    s[B].compute_inline()
    with pytest.raises(CompileError, match="cannot be compute_inline"):
        tir.lower(s, [A, B, C], "f")
    with pytest.raises(CompileError, match="valid C identifier"):
        tir.lower(te.create_schedule(C), [A, C], "bad name")


def test_inline_and_compute_at_structure():
    A = te.placeholder((16, 16), name="A")
    B = te.compute(A.shape, lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute(A.shape, lambda i, j: B[i, j] * 2.0, name="C")
    D = te.compute(A.shape, lambda i, j: C[i, j] - 3.0, name="D")
    s = te.create_schedule(D)
    s[B].compute_inline()
    s[C].compute_at(s[D], D.op.axis[0])
    text = str(tir.lower(s, [A, D], "f"))
    # C is computed one row at a time inside D's i loop, into a 16-element buffer
    assert 'C = allocate([1, 16], "float32"' in text
    assert "B[" not in text and "A[i, " in text
    te.inline_injective(s)
    assert s[C].attach_type == "inline"

