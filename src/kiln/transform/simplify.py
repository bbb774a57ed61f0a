"""Graph simplifications: identity removal, batch-norm folding, CSE, DCE, reshape aliasing."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node, Value, dead_code_elimination, rewrite
from ..ir.graph import _copy_node
from ..ir.ops._util import norm_axis
from ..ir.sym_rules import same_padded_layout
from ..ir.types import np_dtype
from .pipeline import Pass, Sequential

__all__ = [
    "dead_code_elimination", "remove_identity", "simplify_inference",
    "eliminate_common_subexpr", "mark_alias", "simplify",
    "DeadCodeElimination", "RemoveIdentity", "SimplifyInference", "EliminateCommonSubexpr",
    "MarkAlias", "Simplify",
]


# ----------------------------------------------------------------------------- DCE
# ----------------------------------------------------------------------------- identities
def _is_noop(node: Node) -> bool:
    op = node.op
    if node.outputs and node.inputs and node.outputs[0].type.sym != node.inputs[0].type.sym:
        return False  # e.g. a slice keeping element 0 of a symbolic axis whose bound is 1
    if op in ("identity", "dropout"):
        return True
    if op == "reshape":
        return node.attrs["newshape"] == node.inputs[0].shape
    if op == "transpose":
        return tuple(node.attrs["axes"]) == tuple(range(len(node.attrs["axes"])))
    if op in ("cast",):
        return node.attrs["dtype"] == node.inputs[0].dtype
    if op == "broadcast_to":
        return node.attrs["shape"] == node.inputs[0].shape
    if op == "strided_slice" or op == "pad" or op == "tile":
        return node.outputs[0].shape == node.inputs[0].shape and _shape_preserving(node)
    return False


def _shape_preserving(node: Node) -> bool:
    a = node.attrs
    if node.op == "strided_slice":
        return all(s == 1 for s in a["strides"])  # same shape + step 1 => full range
    if node.op == "pad":
        return all(p == (0, 0) for p in a["pad_width"])
    if node.op == "tile":
        return all(r == 1 for r in a["reps"])
    return False


def remove_identity(graph: Graph) -> Graph:
    """Remove identity / dropout and no-op reshape, transpose, cast, broadcast, slice, pad, tile.

    A no-op whose output is a graph output and whose input is a graph input or constant is kept
    (as ``identity``) so that every graph output is computed by a node.
    """
    outputs = set(graph.outputs)

    def visit(g: Graph, node: Node, ins: list[Value]):
        if not _is_noop(node):
            return None
        src = ins[0]
        if node.outputs[0] in outputs and (src.node is None or src.is_constant):
            if node.op == "identity":
                return None
            return g.add_node("identity", [src], name=node.name)
        return [src]

    return dead_code_elimination(rewrite(graph, visit))


# ----------------------------------------------------------------------------- batch norm
def _bn_consts(node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) in float64 when all BN parameters are constants."""
    vals = [v.const_value for v in node.inputs[1:]]
    if any(v is None for v in vals):
        return None
    gamma, beta, mean, var = (v.astype(np.float64) for v in vals)
    scale = gamma / np.sqrt(var + node.attrs["epsilon"])
    return scale, beta - mean * scale


def _fold_plan(graph: Graph) -> dict[int, tuple[Node, Node | None, np.ndarray, np.ndarray]]:
    """Map producer (conv/dense) node id -> (bn node, bias_add node or None, scale, shift)."""
    uses = graph.use_counts()
    plan = {}
    for node in graph.nodes:
        if node.op != "batch_norm":
            continue
        consts = _bn_consts(node)
        if consts is None:
            continue
        x = node.inputs[0]
        bias = None
        prod = x.node
        if prod is not None and prod.op == "bias_add" and uses.get(x) == 1 \
                and prod.inputs[1].is_constant:
            bias, x = prod, prod.inputs[0]
            prod = x.node
        if prod is None or prod.op not in ("conv2d", "conv2d_transpose", "dense") \
                or uses.get(x) != 1 or not prod.inputs[1].is_constant:
            continue
        ndim = x.type.ndim
        axis = norm_axis(node.attrs["axis"], ndim)
        if bias is not None and norm_axis(bias.attrs["axis"], ndim) != axis:
            continue
        if prod.op in ("conv2d", "conv2d_transpose") and axis == 1:
            pass
        elif prod.op == "dense" and axis == ndim - 1:
            pass
        else:
            continue
        plan[id(prod)] = (node, bias, *consts)
    return plan


def _scaled_weight(prod: Node, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    w64 = w.astype(np.float64)
    if prod.op == "conv2d" or prod.op == "dense":
        shp = (-1,) + (1,) * (w.ndim - 1)
        return (w64 * scale.reshape(shp)).astype(w.dtype)
    # conv2d_transpose: weight (C_in, C_out/g, kh, kw); output channel = grp * og + j.
    g = prod.attrs["groups"]
    cin, og = w.shape[:2]
    s = scale.reshape(g, 1, og, 1, 1)
    return (w64.reshape(g, cin // g, og, *w.shape[2:]) * s).reshape(w.shape).astype(w.dtype)


def simplify_inference(graph: Graph) -> Graph:
    """Fold ``batch_norm`` into a preceding conv2d / conv2d_transpose / dense (+ bias_add) with
    constant weights; otherwise rewrite it as ``x * scale + shift``. No batch_norm remains."""
    plan = _fold_plan(graph)
    folded_bn: set[int] = set()
    folded_bias: set[int] = set()
    for bn, bias, _, _ in plan.values():
        folded_bn.add(id(bn))
        if bias is not None:
            folded_bias.add(id(bias))

    def visit(g: Graph, node: Node, ins: list[Value]):
        if id(node) in plan:
            bn, bias, scale, shift = plan[id(node)]
            dt = node.outputs[0].dtype
            w = _scaled_weight(node, node.inputs[1].const_value, scale)
            b = shift if bias is None else bias.inputs[1].const_value.astype(np.float64) * scale \
                + shift
            wv = g.add_constant(w)
            y = g.add_node(node.op, [ins[0], wv], node.attrs, name=node.name)[0]
            axis = 1 if node.op != "dense" else y.type.ndim - 1
            return [g.add_node("bias_add", [y, g.add_constant(b.astype(np_dtype(dt)))],
                               {"axis": axis}, name=bn.name)[0]]
        if id(node) in folded_bias or id(node) in folded_bn:
            return [ins[0]]
        if node.op == "batch_norm":
            return [_bn_as_affine(g, node, ins)]
        return None

    return dead_code_elimination(rewrite(graph, visit))


def _bn_as_affine(g: Graph, node: Node, ins: list[Value]) -> Value:
    x = ins[0]
    dt = x.dtype
    axis = norm_axis(node.attrs["axis"], x.type.ndim)
    c = x.shape[axis]
    bshape = (c,) + (1,) * (x.type.ndim - axis - 1)
    consts = _bn_consts(node)
    if consts is not None:
        scale, shift = (g.add_constant(a.reshape(bshape).astype(np_dtype(dt))) for a in consts)
    else:
        gamma, beta, mean, var = ins[1:]
        eps = g.add_constant(np.array(node.attrs["epsilon"], dtype=np_dtype(dt)))
        s = g.add("multiply", gamma, g.add("rsqrt", g.add("add", var, eps)))
        sh = g.add("subtract", beta, g.add("multiply", mean, s))
        scale = g.add("reshape", s, newshape=bshape)
        shift = g.add("reshape", sh, newshape=bshape)
    y = g.add("multiply", x, scale, name=node.name)
    return g.add("add", y, shift, name=node.name)


# ----------------------------------------------------------------------------- CSE
_CSE_CONST_LIMIT = 4096


def _freeze(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return ("nd", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, float) and v != v:
        return ("nan",)
    if isinstance(v, (tuple, list)):
        return tuple(_freeze(x) for x in v)
    return (type(v).__name__, v)


def eliminate_common_subexpr(graph: Graph) -> Graph:
    """Merge nodes with the same op, inputs and attributes (small constants with equal data)."""
    seen: dict[Any, list[Value]] = {}

    def visit(g: Graph, node: Node, ins: list[Value]):
        if node.op == "constant" and node.attrs["value"].size > _CSE_CONST_LIMIT:
            return None
        key = (node.op, tuple(id(v) for v in ins),
               tuple((k, _freeze(v)) for k, v in node.attrs.items()))
        hit = seen.get(key)
        if hit is not None:
            return hit
        outs = _copy_node(g, node, ins)
        seen[key] = outs
        return outs

    return dead_code_elimination(rewrite(graph, visit))


# ----------------------------------------------------------------------------- alias marking
def mark_alias(graph: Graph) -> Graph:
    """Set ``alias=True`` on every ``reshape`` whose output may share its input's storage.

    All IR tensors are dense row-major and a reshape keeps the dtype, so aliasing is always
    legal, except when a graph output would alias a graph input or a constant (an output must
    own its buffer).
    """
    outputs = set(graph.outputs)

    def visit(g: Graph, node: Node, ins: list[Value]):
        if node.op != "reshape":
            return None
        src = ins[0]
        # with dynamic dims, only a reshape that keeps the padded layout may alias
        legal = not (node.outputs[0] in outputs and (src.node is None or src.is_constant)) \
            and same_padded_layout(src.type, node.outputs[0].type)
        if node.attrs["alias"] == legal:
            return None
        return g.add_node("reshape", ins, {**node.attrs, "alias": legal}, name=node.name)

    return rewrite(graph, visit)


def _merge_reshapes(graph: Graph) -> Graph:
    """reshape(reshape(x)) -> reshape(x)."""

    def visit(g: Graph, node: Node, ins: list[Value]):
        src = ins[0] if ins else None
        if node.op == "reshape" and src is not None and src.node is not None \
                and src.node.op == "reshape":
            attrs = node.attrs
            if attrs.get("sym_shape") is None and node.outputs[0].type.is_dynamic:
                # The merged reshape may no longer see how the inner one split a symbolic dim.
                attrs = {**attrs, "sym_shape": node.outputs[0].type.dims}
            return g.add_node("reshape", [src.node.inputs[0]], attrs, name=node.name)
        return None

    return rewrite(graph, visit)


# ----------------------------------------------------------------------------- composite
def simplify(graph: Graph) -> Graph:
    """remove_identity -> simplify_inference -> merge reshapes -> CSE -> DCE -> mark_alias."""
    graph = remove_identity(graph)
    graph = simplify_inference(graph)
    graph = _merge_reshapes(graph)
    graph = eliminate_common_subexpr(graph)
    graph = remove_identity(graph)
    return mark_alias(graph)


def DeadCodeElimination() -> Pass:  # noqa: N802
    """:func:`dead_code_elimination` (opt level 0)."""
    return Pass(dead_code_elimination, "DeadCodeElimination", 0)


def RemoveIdentity() -> Pass:  # noqa: N802
    """:func:`remove_identity` (opt level 0)."""
    return Pass(remove_identity, "RemoveIdentity", 0)


def SimplifyInference() -> Pass:  # noqa: N802
    """:func:`simplify_inference` (required: kernels do not implement batch_norm)."""
    return Pass(simplify_inference, "SimplifyInference", 0, required=True)


def EliminateCommonSubexpr() -> Pass:  # noqa: N802
    """:func:`eliminate_common_subexpr` (opt level 2)."""
    return Pass(eliminate_common_subexpr, "EliminateCommonSubexpr", 2)


def MarkAlias() -> Pass:  # noqa: N802
    """:func:`mark_alias` (opt level 0)."""
    return Pass(mark_alias, "MarkAlias", 0)


def Simplify(opt_level: int = 2) -> Pass:  # noqa: N802
    """:func:`simplify` as one pass; at ``opt_level < 2`` CSE is skipped."""
    seq = Sequential([RemoveIdentity(), SimplifyInference(), Pass(_merge_reshapes, "MergeReshapes",
                      1), EliminateCommonSubexpr(), RemoveIdentity(), MarkAlias()],
                     opt_level=opt_level, name="Simplify")
    return Pass(seq, "Simplify", 0)
