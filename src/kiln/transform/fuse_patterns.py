"""Recognise RMSNorm and tanh-GELU spelled as elementwise chains and use the fused IR ops.

PyTorch (``torch.export``) and ONNX exports of Llama- and GPT-2-style models write

* RMSNorm as ``x * rsqrt(mean(x*x, -1, keepdims) + eps) * w`` (or ``pow(x, 2)``,
  ``reciprocal(sqrt(.))``, ``1 / sqrt(.)``, ``x / sqrt(.)``, with a widening cast of ``x`` and a
  narrowing cast of the normalised value around it), and
* GELU-tanh as ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` in any association
  order (``x*x*x`` or ``pow(x, 3)``, constants folded together or distributed).

Left alone, each becomes several kernels (a reduction plus elementwise groups) that read the
row more than once; ``rms_norm`` and ``gelu(approximate="tanh")`` are one kernel each.

A chain is rewritten only when it computes exactly the fused op: every intermediate value has
a single consumer (so nothing else needs it), the constants are scalars with the expected values
(eps >= 0; GELU's 0.5, sqrt(2/pi) and 0.044715 within float32 rounding), the RMSNorm mean runs
over trailing axes with keepdims, shapes and dtypes (float) do not change along the chain.
Anything else (other constants, a mean over a leading axis, a shared intermediate) is kept.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import Graph, Node, Value, dead_code_elimination, rewrite
from ..ir.graph import _copy_node
from ..ir.ops._util import broadcast_shapes
from ..ir.types import np_dtype
from ..runtime.errors import InputError
from .pipeline import Pass

__all__ = ["fuse_patterns", "FusePatterns"]

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715
# float32 rounding of each constant (~6e-8) and of their products; far below any other spelling
_RTOL = 1e-6


def _scalar(v: Value) -> float | None:
    """The value of a one-element numeric constant, else None."""
    c = v.const_value
    if c is None or c.size != 1 or c.dtype.kind not in "fiu":
        return None
    f = float(c.reshape(()))
    return f if math.isfinite(f) else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _RTOL * abs(b)


class _Matcher:
    """Use counts and consumers of one graph, shared by both pattern matchers."""

    def __init__(self, graph: Graph) -> None:
        self.uses = graph.use_counts()
        self.consumers = graph.consumers()

    def single_use(self, v: Value) -> bool:
        return self.uses.get(v, 0) == 1

    def only_consumer(self, v: Value) -> Node | None:
        """The node consuming ``v`` when that is its only use (not a graph output)."""
        if not self.single_use(v):
            return None
        cons = self.consumers.get(v, [])
        return cons[0][0] if len(cons) == 1 else None


# ----------------------------------------------------------------------------- RMSNorm
class _RmsMatch:
    """A matched RMSNorm: ``root``'s output is ``rms_norm(x, weight or 1)``."""

    def __init__(self, root: Node, x: Value, weight: Value | None, axis: int, eps: float) -> None:
        self.root, self.x, self.weight = root, x, weight
        self.axis, self.eps = axis, eps


def _mean_of_squares(m: _Matcher, v: Value) -> tuple[Value, int] | None:
    """``(x, axis)`` when ``v = reduce_mean(x*x | pow(x, 2), trailing axes, keepdims)``."""
    n = v.node
    if n is None or n.op != "reduce_mean" or not n.attrs["keepdims"] or not m.single_use(v):
        return None
    sq = n.inputs[0]
    ndim = sq.type.ndim
    axes = sorted(a % ndim for a in n.attrs["axes"]) if ndim else []
    if not axes or axes != list(range(axes[0], ndim)):
        return None  # the fused op normalises over dims axis..end only
    p = sq.node
    if p is None or not m.single_use(sq):
        return None
    if p.op == "multiply" and p.inputs[0] is p.inputs[1]:
        return p.inputs[0], axes[0]
    if p.op == "power" and _scalar(p.inputs[1]) == 2.0:
        return p.inputs[0], axes[0]
    return None


def _stat_plus_eps(m: _Matcher, v: Value) -> tuple[Value, int, float] | None:
    """``(x, axis, eps)`` when ``v = mean(x^2) + eps`` (eps a non-negative scalar constant)."""
    n = v.node
    if n is None or n.op != "add" or not m.single_use(v):
        return None
    for a, b in (n.inputs, n.inputs[::-1]):
        eps = _scalar(b)
        if eps is not None and eps >= 0.0 and v.type == a.type:
            ms = _mean_of_squares(m, a)
            if ms is not None:
                return ms[0], ms[1], eps
    return None


def _rsqrt_of(m: _Matcher, v: Value) -> tuple[Value, int, float] | None:
    """Match ``v = rsqrt(s) | reciprocal(sqrt(s)) | 1 / sqrt(s)`` with ``s = mean(x^2) + eps``."""
    n = v.node
    if n is None or not m.single_use(v):
        return None
    if n.op == "rsqrt":
        return _stat_plus_eps(m, n.inputs[0])
    if n.op == "reciprocal":
        return _sqrt_of(m, n.inputs[0])
    if n.op == "divide" and _scalar(n.inputs[0]) == 1.0 and n.inputs[1].type == v.type:
        return _sqrt_of(m, n.inputs[1])
    return None


def _sqrt_of(m: _Matcher, v: Value) -> tuple[Value, int, float] | None:
    n = v.node
    if n is None or n.op != "sqrt" or not m.single_use(v):
        return None
    return _stat_plus_eps(m, n.inputs[0])


def _rms_core(m: _Matcher, node: Node) -> tuple[Value, int, float] | None:
    """``(x, axis, eps)`` when ``node`` computes ``x / sqrt(mean(x^2) + eps)``."""
    out = node.outputs[0]
    if out.dtype not in _FLOATS:
        return None
    if node.op == "multiply":
        for a, b in (node.inputs, node.inputs[::-1]):
            r = _rsqrt_of(m, b)
            if r is not None and r[0] is a and a.type == out.type:
                return r
    elif node.op == "divide":
        a, b = node.inputs
        r = _sqrt_of(m, b)
        if r is not None and r[0] is a and a.type == out.type:
            return r
    return None


def _gamma_ok(w: Value, x: Value, axis: int) -> bool:
    norm_shape = x.shape[axis:]
    try:
        return (w.dtype == x.dtype and not w.type.is_dynamic
                and broadcast_shapes(w.shape, norm_shape) == norm_shape)
    except InputError:
        return False


def _match_rms(m: _Matcher, node: Node) -> _RmsMatch | None:
    core = _rms_core(m, node)
    if core is None:
        return None
    x, axis, eps = core
    if not all(isinstance(d, int) for d in x.type.dims[axis:]):
        return None  # the kernel divides by the normalised element count, a static number
    root, out = node, node.outputs[0]
    # Llama: ``weight * hidden.to(input_dtype)`` after computing the statistics in float32.
    nxt = m.only_consumer(out)
    if nxt is not None and nxt.op == "cast" and nxt.attrs["dtype"] in _FLOATS:
        src = x.node
        if src is not None and src.op == "cast" and src.inputs[0].dtype == nxt.attrs["dtype"] \
                and np.dtype(np_dtype(src.inputs[0].dtype)).itemsize \
                <= np.dtype(np_dtype(x.dtype)).itemsize:
            # widen -> normalise -> narrow back: rms_norm accumulates half inputs in float32
            x = src.inputs[0]
            root, out = nxt, nxt.outputs[0]
            nxt = m.only_consumer(out)
    if nxt is not None and nxt.op == "multiply":
        a, b = nxt.inputs
        w = b if a is out else a
        if w is not out and _gamma_ok(w, x, axis) and nxt.outputs[0].type == out.type:
            return _RmsMatch(nxt, x, w, axis, eps)
    return _RmsMatch(root, x, None, axis, eps)


# ----------------------------------------------------------------------------- GELU (tanh)
# A polynomial in x and t = tanh(u): {(power of x, power of t): coefficient}.
_Poly = dict[tuple[int, int], float]
_MAX_DEGREE = 4


def _poly_mul(p: _Poly, q: _Poly) -> _Poly | None:
    r: _Poly = {}
    for (a1, b1), c1 in p.items():
        for (a2, b2), c2 in q.items():
            k = (a1 + a2, b1 + b2)
            if k[0] > _MAX_DEGREE or k[1] > 1:
                return None
            r[k] = r.get(k, 0.0) + c1 * c2
    return r


def _poly_add(p: _Poly, q: _Poly, sign: float = 1.0) -> _Poly:
    r = dict(p)
    for k, c in q.items():
        r[k] = r.get(k, 0.0) + sign * c
    return r


_ARITH = ("add", "subtract", "multiply", "divide", "power", "negative")
# nodes one polynomial may span: GELU-tanh needs ~10; bounds the walk up a residual stream
_BUDGET = 32


def _is_arith(v: Value) -> bool:
    return v.node is not None and v.node.op in _ARITH and v.dtype in _FLOATS


def _leaves(m: _Matcher, v: Value, out: list[Value], root: bool = True) -> None:
    """Non-constant leaves of the single-consumer arithmetic tree under ``v`` (x candidates)."""
    if _scalar(v) is not None or len(out) > 4:
        return
    if _is_arith(v) and (root or m.single_use(v)):
        assert v.node is not None
        for a in v.node.inputs:
            _leaves(m, a, out, False)
    elif v not in out:
        out.append(v)


class _PolyReader:
    """Read the arithmetic tree under a value as a polynomial in ``x`` and ``tanh_out``.

    Intermediates that are functions of ``x`` alone may have other consumers (CSE shares
    ``x*x`` between two GELUs of the same ``x``): they stay for those and the fused op
    recomputes from ``x``. Intermediates involving ``tanh_out`` must not, or the fused op would
    not replace the tanh.
    """

    def __init__(self, m: _Matcher, x: Value, tanh_out: Value | None) -> None:
        self.m, self.x, self.tanh_out = m, x, tanh_out
        self.budget = _BUDGET

    def read(self, v: Value, root: bool = False) -> _Poly | None:
        if v is self.x:
            return {(1, 0): 1.0}
        if v is self.tanh_out:
            return {(0, 1): 1.0}
        c = _scalar(v)
        if c is not None:
            return {(0, 0): c}
        self.budget -= 1
        if not _is_arith(v) or self.budget < 0:
            return None
        p = self._read_node(v)
        if p is not None and not root and not self.m.single_use(v) \
                and any(b for _, b in p):
            return None
        return p

    def _read_node(self, v: Value) -> _Poly | None:
        n = v.node
        assert n is not None
        if n.op == "negative":
            p = self.read(n.inputs[0])
            return None if p is None else {k: -c for k, c in p.items()}
        if n.op == "power":
            e = _scalar(n.inputs[1])
            p = self.read(n.inputs[0])
            if p is None or e is None or e not in (2.0, 3.0):
                return None
            r: _Poly | None = p
            for _ in range(int(e) - 1):
                r = None if r is None else _poly_mul(r, p)
            return r
        if n.op == "divide":
            d = _scalar(n.inputs[1])
            p = self.read(n.inputs[0])
            if p is None or d is None or d == 0.0:
                return None
            return {k: c / d for k, c in p.items()}
        p = self.read(n.inputs[0])
        q = None if p is None else self.read(n.inputs[1])
        if p is None or q is None:
            return None
        if n.op == "multiply":
            return _poly_mul(p, q)
        return _poly_add(p, q, 1.0 if n.op == "add" else -1.0)


def _poly_is(p: _Poly, want: _Poly) -> bool:
    terms = {k: c for k, c in p.items() if c != 0.0}
    return terms.keys() == want.keys() and all(_close(terms[k], c) for k, c in want.items())


def _match_gelu(m: _Matcher, tanh: Node) -> tuple[Node, Value] | None:
    """``(root, x)`` when the chain around ``tanh`` computes GELU-tanh of ``x``."""
    u, t = tanh.inputs[0], tanh.outputs[0]
    if t.dtype not in _FLOATS or not m.single_use(u):
        return None
    inner_want = {(1, 0): _SQRT_2_OVER_PI, (3, 0): _SQRT_2_OVER_PI * _GELU_CUBIC}
    cands: list[Value] = []
    _leaves(m, u, cands)
    for x in cands:
        pu = _PolyReader(m, x, None).read(u, root=True)
        if x.type == t.type and pu is not None and _poly_is(pu, inner_want):
            break
    else:
        return None
    want = {(1, 0): 0.5, (1, 1): 0.5}
    cur = t
    for _ in range(8):  # 0.5 * x * (1 + t) is at most a few nodes above tanh
        node = m.only_consumer(cur)
        if node is None or node.op not in ("add", "subtract", "multiply", "divide"):
            return None
        cur = node.outputs[0]
        p = _PolyReader(m, x, t).read(cur, root=True)
        if p is not None and _poly_is(p, want) and cur.type == x.type:
            return node, x
    return None


# ----------------------------------------------------------------------------- the pass
def fuse_patterns(graph: Graph) -> Graph:
    """Replace RMSNorm and tanh-GELU elementwise chains by ``rms_norm`` / ``gelu``.

    Parameters
    ----------
    graph : Graph
        A typed graph (after ``InferType`` / ``Simplify``). Not modified.

    Returns
    -------
    Graph
        The rewritten graph (``graph`` itself when nothing matched); the replaced chains'
        intermediate nodes are removed.
    """
    m = _Matcher(graph)
    plan: dict[int, Any] = {}
    for node in graph.nodes:
        if node.op == "tanh":
            g = _match_gelu(m, node)
            if g is not None and id(g[0]) not in plan:
                plan[id(g[0])] = g
        elif node.op in ("multiply", "divide"):
            r = _match_rms(m, node)
            if r is not None and id(r.root) not in plan:
                plan[id(r.root)] = r
    if not plan:
        return graph

    vmap: dict[Value, Value] = {}

    def visit(g: Graph, node: Node, ins: list[Value]) -> list[Value]:
        for old, new in zip(node.inputs, ins):
            vmap[old] = new
        hit = plan.get(id(node))
        if hit is None:
            return _copy_node(g, node, ins)
        if isinstance(hit, _RmsMatch):
            x = vmap[hit.x]
            w = vmap[hit.weight] if hit.weight is not None else \
                g.add_constant(np.array(1.0, dtype=np_dtype(x.dtype)))
            y = g.add("rms_norm", x, w, axis=hit.axis - x.type.ndim, epsilon=hit.eps,
                      name=node.name)
            return [y]
        return [g.add("gelu", vmap[hit[1]], approximate="tanh", name=node.name)]

    return dead_code_elimination(rewrite(graph, visit))


def FusePatterns() -> Pass:  # noqa: N802
    """:func:`fuse_patterns` (opt level 1; disable with ``KILN_DISABLE_PASSES=FusePatterns``)."""
    return Pass(fuse_patterns, "FusePatterns", 1)
