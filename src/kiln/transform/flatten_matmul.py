"""FlattenMatmul: run a product with shared weights over leading dims as one 2-D dense.

Owns the graph rewrite ``A[..., K] x W -> reshape(dense(reshape(A, [M, K]), W), [..., N])``
for products whose right operand is the same matrix for every leading index. Imports only
``kiln.ir`` and this package's pipeline; it must never import topi, codegen or the driver
(layering: passes sit below kernels).

Why at graph level
------------------
The ``dense`` and ``matmul`` kernels treat every leading dimension but the last row axis as
a *batch* axis: the register tile runs over the last two output axes and the packed weight
panel is rebuilt per (batch, column block). ``[197, 1, 768] x [768, 2304]`` (an
``nn.MultiheadAttention`` in-projection, sequence first) is then 197 one-row products that
each repack the whole weight, an order of magnitude slower than the same rows as
``[197, 768]``.
Leading dims of a shared-weight product are rows, not batches, and row-major tensors make
the flattening reshapes free (aliases), so the rewrite is exact and costs nothing.

Rewrites
--------
* ``dense(A, W)`` with ``A.ndim > 2`` -> ``dense(reshape(A, [M, K]), W)``.
* ``matmul(A, B)`` with ``A.ndim >= 2`` and ``B`` the same ``K x N`` matrix for every batch
  index -- all of B's batch dims are 1 (broadcast), or B is a constant whose batch slices
  are all equal and A alone sets the output's batch shape -- becomes a 2-D dense with the
  constant weight transposed to ``(N, K)`` (the layout the dense kernels want), or a 2-D
  matmul when B is not constant. A plain 2-D ``matmul`` is left as it is.
* Such a ``matmul`` with a constant B whose rows cannot be merged for free (a dynamic graph,
  below) becomes ``dense(A, W.T)`` on the N-D ``A``, without flattening: the dense of a
  constant MatMul weight that the ONNX frontend makes when B is not yet a constant there
  (``Identity(W)``, as PyTorch exports layers that share one weight), so that
  ``PackDenseWeights`` stores its weight as panels instead of the kernel repacking it per call.
* The reshape back to ``[..., N]`` is sunk through the elementwise epilogue that follows
  (bias, activation, GELU's fan-out, residual add), rewriting each op on the 2-D rows, so
  that fusion still puts the epilogue into the dense kernel: an ``OUT_ELEMWISE_FUSABLE``
  anchor only absorbs elementwise consumers of its own output shape, and a reshape between
  them would stop it. An operand of such an op is flattened too when it broadcasts along
  whole rows (its leading dims all 1, e.g. a bias ``[N]``) or has the output's leading
  dims (a residual); otherwise the sinking stops and the reshape is materialized there.

Every reshape made here is created with ``alias=True``: its source is a node output or a
graph input that is not itself a graph output, which is exactly when
:func:`~kiln.transform.simplify.mark_alias` allows aliasing, so it runs after ``Simplify``
and still yields ``__nop`` reshapes.

Dynamic graphs: the rows are the (symbolic) product of the leading dims, e.g. ``batch*seq``;
every reshape made here carries its symbolic target (``sym_shape``) so the reshape back to
``[batch, seq, N]`` is exact, and shapes are compared by their dims (symbols included), not
only by their upper bounds. Where merging the leading dims would move data (a symbolic dim
inside them, :func:`_rows_free`), nothing is flattened: a shared constant weight still turns a
``matmul`` into an N-D ``dense``, whose kernel bounds each leading dim.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..ir import Graph, Node, OpPattern, TensorType, Value, dead_code_elimination, get_op, rewrite
from ..ir.sym_rules import same_padded_layout
from ..ir.ops._util import norm_axis
from ..runtime import sym
from ..runtime.sym import Dim
from .pipeline import Pass

__all__ = ["flatten_matmul", "FlattenMatmul"]

#: Binary/ternary ops with NumPy broadcasting and no shape-dependent attributes; with the
#: ELEMWISE ops (one input, attributes independent of the shape) these are what the reshape
#: back may be sunk through. ``prelu`` and ``batch_norm`` are left out on purpose: their
#: second operand is aligned to a channel axis, not broadcast NumPy-style.
_BROADCAST_OPS = frozenset({
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "mod",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_and", "logical_or", "logical_xor", "where",
})


def _prod(dims: Sequence[Dim]) -> Dim:
    p: Dim = 1
    for d in dims:
        p = sym.mul(p, d)
    return p


def _reshape(g: Graph, v: Value, shape: Sequence[int], dims: Sequence[Dim] | None = None) -> Value:
    """A free reshape of ``v`` (constants are reshaped in place, others alias their input);
    ``dims`` is the symbolic target of a dynamic value (default: ``shape``)."""
    shape = tuple(int(d) for d in shape)
    dims = shape if dims is None else tuple(dims)
    if v.shape == shape and v.type.dims == dims:
        return v
    arr = v.const_value
    if arr is not None:
        return g.add_constant(np.ascontiguousarray(arr).reshape(shape))
    if any(isinstance(d, str) for d in dims):
        return g.add("reshape", v, newshape=shape, alias=True, sym_shape=dims)
    return g.add("reshape", v, newshape=shape, alias=True)


def _shared_matrix(a: Value, b: Value) -> np.ndarray | Value | None:
    """B's single ``K x N`` matrix when every batch index of ``matmul(a, b)`` uses it.

    Returns the array for a constant ``b``, ``b`` itself when only its shape shows the
    sharing (all batch dims 1), or ``None`` when the batches differ (a real batched product).
    """
    batch_b = b.shape[:-2]
    arr = b.const_value
    if all(d == 1 for d in batch_b):
        return arr if arr is not None else b
    if arr is None:
        return None
    # B has real batch dims: sharing needs equal slices, and A alone must give the output's
    # batch shape (otherwise the result would be A's rows repeated, which a dense cannot
    # express without an extra broadcast)
    batch_a = a.shape[:-2]
    if len(batch_b) > len(batch_a):
        return None
    for da, db in zip(batch_a[len(batch_a) - len(batch_b):], batch_b):
        if db != 1 and da != db:
            return None
    flat = arr.reshape((-1,) + arr.shape[-2:])
    if not np.array_equal(flat, np.broadcast_to(flat[:1], flat.shape)):
        return None
    return flat[0]


def _flat_operand(g: Graph, v: Value, out_shape: tuple[int, ...], rows: int,
                  out_dims: tuple[Dim, ...] | None = None) -> Value | None:
    """``v`` as an operand of the 2-D ``(rows, N)`` version of an op with output ``out_shape``.

    ``None`` when ``v``'s broadcast does not survive merging the leading dims.
    """
    nd = len(out_shape)
    out_dims = out_shape if out_dims is None else out_dims
    if v.type.ndim == 0:
        return v
    if v.type.ndim > nd:
        return None
    padded = (1,) * (nd - v.type.ndim) + v.type.dims
    lead, last = padded[:-1], padded[-1]
    if isinstance(last, str):
        return None
    if all(d == 1 for d in lead):
        # broadcast along whole rows (a bias): keep it 1-D so it broadcasts over the rows
        return _reshape(g, v, (last,))
    if lead == out_dims[:-1]:
        return _reshape(g, v, (rows, last), (_prod(lead), last))
    return None


def _rows_free(v: Value) -> bool:
    """Whether merging ``v``'s leading dims into rows is a free alias. In the padded layout of
    a dynamic graph it is not when a symbolic dim sits inside the leading dims (``[batch, seq,
    K]``: row ``b*seq + s`` is not where the data of ``(b, s)`` is); such products keep their
    leading dims, which the kernels bound one by one."""
    t = v.type
    if t.sym is None:
        return True
    rows = TensorType((math.prod(t.shape[:-1]), t.shape[-1]), t.dtype,
                      (_prod(t.dims[:-1]), t.dims[-1]))
    return same_padded_layout(t, rows)


def _nd_dense(g: Graph, node: Node, a: Value, mat: np.ndarray | Value, kk: int,
              nn: int) -> list[Value] | None:
    """``matmul(a, B)`` whose rows are not free (:func:`_rows_free`) as ``dense(a, W.T)`` on
    ``a`` as it is, when ``W`` is B's shared matrix and a constant.

    ``dense`` takes data of any rank with a static last dim ``K`` (its type relation and
    symbolic rule) and gives ``a``'s leading dims, symbols included, followed by ``N``; that
    is the matmul's output exactly when B adds no leading dims of its own (B of higher rank
    than ``a``, all its batch dims 1, prepends ones a dense cannot produce). The product
    keeps its leading dims as the frontend's dense for a constant MatMul weight does, and
    ``PackDenseWeights`` can then store the weight as panels: a matmul would repack it on
    every call. A non-constant shared B stays a matmul (a dense would only add a transpose).
    """
    out = node.outputs[0]
    if not isinstance(mat, np.ndarray) or a.type.dims[:-1] + (nn,) != out.type.dims:
        return None
    w = g.add_constant(np.ascontiguousarray(mat.reshape(kk, nn).T))
    return [g.add("dense", a, w, name=node.name)]


class _Flattener:
    """The rewrite's state: which new-graph values are reshapes of a 2-D row-flat value."""

    def __init__(self) -> None:
        # new 3-D+ value -> (its 2-D source, the rows count)
        self.flat: dict[Value, tuple[Value, int]] = {}

    def _rows(self, g: Graph, v: Value, rows: int) -> Value:
        """``v`` as ``(rows, K)``: the flat value it was reshaped from (a chain dense -> act ->
        dense stays 2-D throughout) or a new free reshape."""
        src = self.flat.get(v)
        dims = (_prod(v.type.dims[:-1]), v.type.dims[-1])
        if src is not None and src[0].shape == (rows, v.shape[-1]) and src[0].type.dims == dims:
            return src[0]
        return _reshape(g, v, (rows, v.shape[-1]), dims)

    def _finish(self, g: Graph, y2: Value, out: Value, rows: int) -> Value:
        y = _reshape(g, y2, out.shape, out.type.dims)
        self.flat[y] = (y2, rows)
        return y

    def visit(self, g: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        if node.op == "dense":
            return self._dense(g, node, ins)
        if node.op == "matmul":
            return self._matmul(g, node, ins)
        return self._epilogue(g, node, ins)

    def _dense(self, g: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        data, weight = ins
        if data.type.ndim <= 2 or not _rows_free(data):
            return None
        rows = math.prod(data.shape[:-1])
        y2 = g.add("dense", self._rows(g, data, rows), weight, name=node.name)
        return [self._finish(g, y2, node.outputs[0], rows)]

    def _matmul(self, g: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        a, b = ins
        if a.type.ndim < 2 or b.type.ndim < 2 or (a.type.ndim == 2 and b.type.ndim == 2):
            return None
        mat = _shared_matrix(a, b)
        if mat is None:
            return None
        kk, nn = b.shape[-2:]
        if not _rows_free(a):
            return _nd_dense(g, node, a, mat, kk, nn)
        rows = math.prod(a.shape[:-1])
        a2 = self._rows(g, a, rows)
        if isinstance(mat, np.ndarray):
            # a constant weight: dense wants it as (N, K); transposing here is a one-time copy
            w = g.add_constant(np.ascontiguousarray(mat.reshape(kk, nn).T))
            y2 = g.add("dense", a2, w, name=node.name)
        else:
            y2 = g.add("matmul", a2, _reshape(g, mat, (kk, nn)), name=node.name)
        return [self._finish(g, y2, node.outputs[0], rows)]

    def _epilogue(self, g: Graph, node: Node, ins: list[Value]) -> list[Value] | None:
        src = next((self.flat[v] for v in ins if v in self.flat), None)
        if src is None or len(node.outputs) != 1:
            return None
        out_shape = node.outputs[0].shape
        out_dims = node.outputs[0].type.dims
        flat2, rows = src
        if len(out_shape) < 2 or math.prod(out_shape[:-1]) != rows \
                or flat2.type.dims[0] != _prod(out_dims[:-1]):
            return None
        pattern = get_op(node.op).pattern
        attrs = dict(node.attrs)
        if node.op == "bias_add":
            if norm_axis(attrs["axis"], len(out_shape)) != len(out_shape) - 1:
                return None
            attrs["axis"] = 1
        elif not (pattern == OpPattern.ELEMWISE or node.op in _BROADCAST_OPS):
            return None
        new_ins = []
        for v in ins:
            if v in self.flat and v.shape == out_shape and v.type.dims == out_dims:
                new_ins.append(self.flat[v][0])
                continue
            fv = _flat_operand(g, v, out_shape, rows, out_dims)
            if fv is None:
                return None
            new_ins.append(fv)
        y2 = g.add_node(node.op, new_ins, attrs, name=node.name)[0]
        if y2.shape != (rows, out_shape[-1]) or y2.type.dims != (flat2.type.dims[0], out_dims[-1]):
            # every operand broadcast away the rows (cannot happen with a flat input, but the
            # 2-D op must have the 2-D output shape for the reshape back to be exact)
            return None
        return [self._finish(g, y2, node.outputs[0], rows)]


def flatten_matmul(graph: Graph) -> Graph:
    """Rewrite dense / shared-weight matmul over leading dims as one 2-D dense (see module doc).

    Parameters
    ----------
    graph : Graph
        Typed graph; not modified.

    Returns
    -------
    Graph
        The rewritten graph (the input itself is never returned mutated); values computed
        are identical up to floating-point summation order of the kernels.
    """
    return dead_code_elimination(rewrite(graph, _Flattener().visit))


def FlattenMatmul() -> Pass:  # noqa: N802 - pass constructors are named like classes
    """:func:`flatten_matmul` as a pass (opt level 1)."""
    return Pass(flatten_matmul, "FlattenMatmul", 1)
