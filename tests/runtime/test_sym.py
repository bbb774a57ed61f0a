"""Symbolic dimension expressions (kiln.runtime.sym): canonical forms, evaluation, bounds."""

import pytest

from kiln.runtime import sym
from kiln.runtime.errors import InputError


@pytest.mark.parametrize("a, b", [
    ("seq*batch", "batch*seq"),
    ("batch*seq+seq-seq", "batch*seq"),
    ("2*(s+1)", "2*s+2"),
    ("(2*s)//2", "s"),
    ("s*s", "s * s"),
    ("(s+1)//2*b", "b*((s+1)//2)"),
    ("(2*s-1)//2+1", "s"),  # floor((2q + r) / 2) == q + floor(r / 2)
    ("((s-1)//2)//2", "(s-1)//4"),  # two strided windows, one floor
    ("((s-1)//2-1)//2+1", "(s-3)//4+1"),  # floor((floor(x / k) + r) / c) == floor((x + r*k) / (k*c))
])
def test_equal_expressions_have_one_canonical_form(a, b):
    assert sym.canonical(a) == sym.canonical(b)
    assert sym.canonical(sym.canonical(a)) == sym.canonical(a)  # a fixed point


def test_constants_fold_to_ints():
    assert sym.canonical("3") == 3
    assert sym.canonical("s-s+4") == 4
    assert sym.sub("s", "s") == 0
    assert sym.canonical(7) == 7


def test_arithmetic_helpers():
    assert sym.mul("b", "s") == "b*s"
    assert sym.mul("s", 384) == "384*s"
    assert sym.add("s", "s") == "2*s"
    assert sym.floordiv("2*s", 2) == "s"
    assert sym.floordiv("s+1", 2) == "(s+1)//2"


@pytest.mark.parametrize("expr, env, value", [
    ("b*s", {"b": 3, "s": 7}, 21),
    ("(s+1)//2", {"s": 4}, 2),
    ("2*s-1", {"s": 5}, 9),
    ("((a+1)//2)*((b+1)//2)", {"a": 3, "b": 5}, 6),
])
def test_evaluate(expr, env, value):
    assert sym.evaluate(expr, env) == value
    assert sym.evaluate(sym.canonical(expr), env) == value


def test_bounds_and_symbols():
    ranges = {"b": (1, 8), "s": (1, 256)}
    assert sym.bounds("b*s", ranges) == (1, 2048)
    assert sym.bounds("s-1", ranges) == (0, 255)
    assert sym.bounds("(s+1)//2", ranges) == (1, 128)
    assert sym.symbols("(s+1)//2*b") == {"b", "s"}
    with pytest.raises(InputError, match="'q' has no declared range"):
        sym.bounds("q", ranges)


def test_shape_function_evaluates_many_shapes_at_once():
    fn = sym.shape_function([(1, "s", 384), ("b*s", "(s+1)//2"), ()])
    assert fn({"b": 2, "s": 5}) == [(1, 5, 384), (10, 3), ()]


@pytest.mark.parametrize("bad", ["", "s+", "s/2", "s//t", "2s", "__import__('os')", "s;x", "(s"])
def test_malformed_expressions_are_input_errors(bad):
    with pytest.raises(InputError, match="symbolic dimension|dimension"):
        sym.canonical(bad)


def test_missing_symbol_value_is_named():
    with pytest.raises(InputError, match="'seq' has no value"):
        sym.evaluate("seq", {})


@pytest.mark.parametrize("text, out", [("seq=1..512", ("seq", (1, 512))), ("b=16", ("b", (1, 16))),
                                       ("n = 2..4", ("n", (2, 4)))])
def test_parse_range(text, out):
    assert sym.parse_range(text) == out


@pytest.mark.parametrize("bad", ["seq", "seq=0..4", "seq=5..4", "seq=a..b", "1x=1..2"])
def test_bad_ranges(bad):
    with pytest.raises(InputError):
        sym.parse_range(bad)


def test_expand_builds_the_value_from_any_arithmetic_objects():
    class E:  # records the operations, as a code generator's expressions would
        def __init__(self, t): self.t = t
        def __add__(self, o): return E(f"({self.t}+{o.t if isinstance(o, E) else o})")
        def __radd__(self, o): return E(f"({o}+{self.t})")
        def __mul__(self, o): return E(f"({self.t}*{o.t if isinstance(o, E) else o})")
        def __rmul__(self, o): return E(f"({o}*{self.t})")
        def __floordiv__(self, o): return E(f"({self.t}//{o})")
    assert sym.expand("b*s", {"b": E("B"), "s": E("S")}).t == "(B*S)"
    assert sym.expand("2*s+1", {"s": E("S")}).t in ("((2*S)+1)", "(1+(2*S))")
    assert sym.expand("b*s+2*s+1", {"b": 3, "s": 5}) == sym.evaluate("b*s+2*s+1", {"b": 3, "s": 5}) == 26


def test_dims_symbols() -> None:
    assert sym.dims_symbols((1, "batch", sym.canonical("(h+1)//2*w"), 3)) == {"batch", "h", "w"}
    assert sym.dims_symbols((4, 5)) == frozenset()
