"""Shared machinery of the topi tests: build many kernels into one module per target, run them
against the IR op's NumPy reference.

A :class:`Case` names an IR op, its input specs and attributes.  :func:`build_cases` turns a
list of cases into PrimFuncs (compute → ``schedule_group`` → ``tir.lower``) and compiles all
of them into one module per target, because compilation dominates test time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from kiln import codegen, te, tir, topi
from kiln.ir import TensorType, get_op, np_dtype
from kiln.runtime import ndarray as nd

TARGETS = ("c", "llvm")

Gen = Callable[[np.random.Generator, tuple[int, ...], str], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard-normal floats / small signed ints / random bools."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype.startswith("int"):
        return rng.integers(-20, 20, size=shape).astype(dtype)
    if dtype.startswith("uint"):
        return rng.integers(0, 40, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(np_dtype(dtype))


def positive(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Values in [0.1, 3)."""
    if dtype.startswith(("int", "uint")):
        return rng.integers(1, 9, size=shape).astype(dtype)
    return (rng.random(shape) * 2.9 + 0.1).astype(np_dtype(dtype))


def uniform(lo: float, hi: float) -> Gen:
    """Floats uniform in [lo, hi)."""
    def g(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return (rng.random(shape) * (hi - lo) + lo).astype(np_dtype(dtype))
    return g


def ints(lo: int, hi: int) -> Gen:
    """Integers in [lo, hi)."""
    def g(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return rng.integers(lo, hi, size=shape).astype(dtype)
    return g


def with_ties(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Few distinct values, so arg-reductions and top-k see ties."""
    return rng.integers(-3, 4, size=shape).astype(np_dtype(dtype))


@dataclass
class Case:
    """One kernel: ``op`` applied to inputs ``(shape, dtype, generator)`` with ``attrs``."""

    op: str
    inputs: Sequence[tuple[tuple[int, ...], str] | tuple[tuple[int, ...], str, Gen]]
    attrs: dict[str, Any] = field(default_factory=dict)
    rtol: float | None = None
    atol: float | None = None
    label: str = ""

    @property
    def id(self) -> str:
        shp = "x".join("_".join(str(d) for d in spec[0]) or "s" for spec in self.inputs)
        dt = self.inputs[0][1]
        return f"{self.op}-{dt}-{shp}" + (f"-{self.label}" if self.label else "")


@dataclass
class Built:
    """A lowered case: its function name, inputs, normalised attrs and output types."""

    case: Case
    name: str
    func: tir.PrimFunc
    attrs: dict[str, Any]
    out_types: list[TensorType]


def lower_case(case: Case, name: str, target: str) -> Built:
    """compute → schedule_group → lower."""
    od = get_op(case.op)
    attrs = od.normalize_attrs(case.attrs)
    in_types = [TensorType(spec[0], spec[1]) for spec in case.inputs]
    out_types = od.type_rel(in_types, attrs)
    ph = [te.placeholder(t.shape, t.dtype, name=f"in{i}") for i, t in enumerate(in_types)]
    outs = topi.get_compute(case.op)(attrs, ph, out_types)
    assert len(outs) == len(out_types), case.id
    for o, t in zip(outs, out_types):
        assert tuple(o.shape) == t.shape and o.dtype == t.dtype, (case.id, o, t)
    s = topi.schedule_group(case.op, od.pattern, outs, target)
    return Built(case, name, tir.lower(s, ph + list(outs), name), attrs, out_types)


def build_cases(cases: Sequence[Case], target: str, prefix: str) -> tuple[Any, list[Built]]:
    """Lower every case and compile them into one module."""
    built = [lower_case(c, f"{prefix}_{i}", target) for i, c in enumerate(cases)]
    mod = codegen.build_module([b.func for b in built], target)
    return mod, built


def target_available(target: str) -> str | None:
    """None if ``target`` can be built here, else the reason it cannot."""
    if target == "llvm":
        try:
            import llvmlite  # noqa: F401
            from kiln.codegen import llvm_module  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            return f"llvm codegen unavailable: {exc}"
    return None


def module_builder(cases: list[Case], prefix: str) -> Callable[[str], tuple[Any, list[Built]]]:
    """A memoised ``target -> (module, built cases)`` builder for one test module."""
    cache: dict[str, tuple[Any, list[Built]]] = {}

    def get(target: str) -> tuple[Any, list[Built]]:
        reason = target_available(target)
        if reason:
            pytest.skip(reason)
        if target not in cache:
            cache[target] = build_cases(cases, target, prefix)
        return cache[target]

    return get


def case_params(cases: list[Case]) -> list[Any]:
    """``pytest.param((target, index), id=...)`` for every case on every target."""
    return [pytest.param(t, i, id=f"{t}-{c.id}") for t in TARGETS for i, c in enumerate(cases)]


def make_inputs(case: Case, seed: int) -> list[np.ndarray]:
    """Random inputs of a case (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    arrs = []
    for spec in case.inputs:
        shape, dtype = tuple(spec[0]), spec[1]
        gen = spec[2] if len(spec) > 2 else normal
        arrs.append(np.array(gen(rng, shape, dtype), order="C"))  # (ascontiguousarray makes 0-d 1-d)
    return arrs


def default_tol(dtype: str) -> tuple[float, float]:
    """(rtol, atol) by dtype: exact for ints/bools."""
    if dtype == "float32":
        return 1e-4, 1e-5
    if dtype == "float64":
        return 1e-9, 1e-12
    if dtype == "float16":
        return 2e-3, 2e-3
    if dtype == "bfloat16":
        return 1.6e-2, 1.6e-2
    return 0.0, 0.0


def run_and_check(mod: Any, b: Built, seed: int = 0) -> None:
    """Run kernel ``b.name`` on random inputs and compare every output with the op's ref."""
    case = b.case
    xs = make_inputs(case, seed)
    ref = get_op(case.op).ref([x.copy() for x in xs], b.attrs)
    outs = [nd.empty(t.shape, t.dtype) for t in b.out_types]
    mod[b.name](*[nd.array(x) for x in xs], *outs)
    for k, (o, r, t) in enumerate(zip(outs, ref, b.out_types)):
        got = o.numpy()
        r = np.asarray(r)
        assert got.shape == r.shape, f"{case.id} output {k}: shape {got.shape} vs {r.shape}"
        rtol, atol = default_tol(t.dtype)
        rtol = case.rtol if case.rtol is not None else rtol
        atol = case.atol if case.atol is not None else atol
        if t.dtype in ("float16", "bfloat16", "float32", "float64"):
            np.testing.assert_allclose(got.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol,
                                       equal_nan=True, err_msg=f"{case.id} output {k}")
        else:
            np.testing.assert_array_equal(got, r, err_msg=f"{case.id} output {k}")


# ----------------------------------------------------------------------------- fused groups
@dataclass
class Fused:
    """A fused group: graph ``inputs`` and ``nodes`` ``(op, attrs, refs)`` where a ref is
    ``"iK"`` (graph input K) or ``"nK"`` (output 0 of node K); the last node is the output."""

    label: str
    inputs: Sequence[tuple[tuple[int, ...], str] | tuple[tuple[int, ...], str, Gen]]
    nodes: Sequence[tuple[str, dict[str, Any], Sequence[str]]]
    anchor: str
    pattern: Any
    rtol: float = 1e-4
    atol: float = 1e-5

    @property
    def id(self) -> str:
        return self.label


def _resolve(ref: str, ins: list[Any], vals: list[Any]) -> Any:
    return ins[int(ref[1:])] if ref[0] == "i" else vals[int(ref[1:])]


def lower_fused(fc: Fused, name: str, target: str) -> tuple[tir.PrimFunc, Any]:
    """All node computes chained on placeholders, scheduled as one group; returns (func, schedule)."""
    ph = [te.placeholder(spec[0], spec[1], name=f"in{i}") for i, spec in enumerate(fc.inputs)]
    vals: list[Any] = []
    for op, attrs, refs in fc.nodes:
        od = get_op(op)
        a = od.normalize_attrs(attrs)
        xs = [_resolve(r, ph, vals) for r in refs]
        ots = od.type_rel([TensorType(x.shape, x.dtype) for x in xs], a)
        vals.append(topi.get_compute(op)(a, xs, ots)[0])
    out = vals[-1]
    s = topi.schedule_group(fc.anchor, fc.pattern, [out], target)
    return tir.lower(s, ph + [out], name), s


def fused_reference(fc: Fused, xs: list[np.ndarray]) -> np.ndarray:
    """The group evaluated node by node with the ops' NumPy references."""
    vals: list[Any] = []
    for op, attrs, refs in fc.nodes:
        od = get_op(op)
        vals.append(od.ref([_resolve(r, xs, vals) for r in refs], od.normalize_attrs(attrs))[0])
    return vals[-1]
