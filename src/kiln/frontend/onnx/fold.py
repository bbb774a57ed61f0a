"""Import-time evaluation of ONNX nodes Kiln has no converter for, when their inputs are static.

Exported models often compute masks and index tables from shapes and constants with ops Kiln
does not compile (Swin-T builds its shifted-window attention mask with ``ScatterND`` on a
zero tensor whose shape comes from ``Shape``). Such a node never runs at inference time in
any useful sense: its result is a constant. So an unsupported node only blocks import when it
can depend on a runtime value; one fed by constants alone is evaluated while converting, by
ONNX's reference evaluator (``onnx.reference.ReferenceEvaluator``; onnx is a compile-time
dependency of the frontend), and its outputs become constants of the graph.

Two steps:

* :func:`blocking_nodes` (before any conversion) finds the unsupported nodes that may see a
  runtime value. "Static" here is an ONNX-level over-approximation: initializers, frozen
  inputs, ``Constant`` outputs, ``Shape`` / ``Size`` outputs (every shape is static in Kiln)
  and outputs of deterministic, subgraph-free nodes whose inputs are all static. Those
  unsupported nodes are reported together, as before, without converting anything.
* :func:`fold_node` (while converting, when such a node is reached) evaluates it. Its inputs
  are read from the converted graph, where Kiln knows every shape and has folded small
  constant subgraphs already; an input Kiln left as a runtime op (too large to fold, or
  computed from a parameter) is recomputed from its ONNX producers, all the way back to
  values Kiln holds, so the result never depends on ONNX shape inference.

Sizes are capped by :data:`PREFOLD_LIMIT` so that a constant subgraph which expands a scalar
into a huge tensor is refused with a clear error instead of being materialised.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ...ir.types import DTYPES
from ...runtime.errors import InputError, UnsupportedOpError

if TYPE_CHECKING:
    from ...ir import Value
    from .converter import Context

__all__ = ["PREFOLD_LIMIT", "MAX_FOLD_NODES", "blocking_nodes", "fold_node", "is_default_domain", "converter_key",
           "static_names", "DATA_DEPENDENT"]

#: Op types whose output *shape* depends on input values. They have converters (run-time
#: kernels with a data-dependent dim), but on static inputs evaluating them at import is better:
#: their result is a constant of a static shape, which later ops can use as such.
DATA_DEPENDENT = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression"})

#: Largest result (elements) an unsupported node, or a node recomputed to feed one, may have to
#: be evaluated at import: 2**22 (16 MiB of float32). Larger results would be embedded in the
#: library as constants; a model that needs that is better served by a converter for the op.
PREFOLD_LIMIT = 1 << 22
#: Most ONNX nodes recomputed to feed one folded node (a bound on import time, not a limit any
#: exported model comes near: Swin-T's mask needs a few dozen).
MAX_FOLD_NODES = 2000

#: Ops whose result is not a function of their inputs: never constants.
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                               "RandomUniformLike", "Bernoulli", "Multinomial"})
#: Ops whose result depends only on their input's shape, which Kiln always knows.
_SHAPE_OPS = frozenset({"Shape", "Size"})


def is_default_domain(node: Any) -> bool:
    """Whether ``node`` is in the default ONNX domain."""
    return (node.domain or "") in ("", "ai.onnx")


def converter_key(node: Any) -> str:
    """The name a converter is registered under: ``OpType``, or ``domain.OpType`` in another domain."""
    return str(node.op_type) if is_default_domain(node) else f"{node.domain}.{node.op_type}"


def _has_subgraph(node: Any) -> bool:
    import onnx

    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute)


def _foldable_kind(node: Any) -> bool:
    """Deterministic and free of subgraphs (whose bodies may read outer runtime values)."""
    return node.op_type not in _NONDETERMINISTIC and not _has_subgraph(node)


def static_names(graph: Any, static: set[str]) -> set[str]:
    """The names of ``graph``'s top scope that are static at the ONNX level (the same
    over-approximation :func:`blocking_nodes` uses): ``static``, initializers, ``Shape`` /
    ``Size`` outputs and outputs of foldable nodes whose inputs are all static."""
    local = set(static) | {t.name for t in graph.initializer}
    for node in graph.node:
        ins = [n for n in node.input if n]
        known = (is_default_domain(node) and node.op_type in _SHAPE_OPS) or all(n in local for n in ins)
        if known and _foldable_kind(node):
            local.update(n for n in node.output if n)
    return local


def blocking_nodes(graph: Any, static: set[str], supported: Mapping[str, Any]
                   ) -> list[tuple[str, str]]:
    """The unsupported nodes of ``graph`` (and its subgraphs) that may depend on runtime values.

    Parameters
    ----------
    graph : onnx.GraphProto
        The graph to scan.
    static : set of str
        Names known to be static in this scope (frozen inputs; the graph's initializers are
        added here).
    supported : mapping
        The converter table: op types of the default domain Kiln converts.

    Returns
    -------
    list of (str, str)
        ``(op key, node name)`` per blocking node, in graph order; the key is ``domain.Op``
        outside the default domain. Unnamed nodes are named ``#<index>``.
    """
    import onnx

    res: list[tuple[str, str]] = []
    counter = [0]

    def scan(g: Any, outer: set[str]) -> None:
        local = (set(outer) - {vi.name for vi in g.input}) | {t.name for t in g.initializer}
        for node in g.node:
            i = counter[0]
            counter[0] += 1
            ins = [n for n in node.input if n]
            default = is_default_domain(node)
            known = (default and node.op_type in _SHAPE_OPS) or all(n in local for n in ins)
            const = known and _foldable_kind(node)
            key = converter_key(node)
            if key not in supported and not const:
                # str(): protobuf hands back bytes for names that are not valid UTF-8
                res.append((str(key), str(node.name or f"#{i}")))
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    scan(a.g, local)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        scan(sub, local)
            if const:
                local.update(n for n in node.output if n)

    scan(graph, set(static))
    return res


def _opsets(ctx: Context) -> dict[str, int]:
    opsets = dict(getattr(ctx, "opsets", None) or {})
    opsets[""] = ctx.opset
    return opsets


def _evaluate(ctx: Context, node: Any, feeds: dict[str, np.ndarray]) -> list[Any]:
    """Outputs of one node by the ONNX reference evaluator; UnsupportedOpError if it cannot."""
    from onnx.reference import ReferenceEvaluator

    where = f"{node.op_type} node {node.name!r}"
    try:
        sess = ReferenceEvaluator(node, opsets=_opsets(ctx))
        names = set(node.input)
        outs = sess.run(None, {k: v for k, v in feeds.items() if k in names})
    except Exception as exc:  # noqa: BLE001  (the reference runtime raises anything)
        raise UnsupportedOpError(
            f"{where}: Kiln has no converter for {node.op_type} and could not evaluate it at "
            f"import although its inputs are constants ({type(exc).__name__}: {exc})") from exc
    return list(outs)


def _inferred_sizes(ctx: Context, node: Any, values: Mapping[str, np.ndarray]
                    ) -> list[int | None]:
    """Output sizes ONNX shape inference derives for ``node`` (None where it cannot)."""
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    try:
        schema = onnx.defs.get_schema(node.op_type, _opsets(ctx).get(node.domain or "", 1),
                                      node.domain or "")
        types, data = {}, {}
        for n in node.input:
            if not n:
                continue
            arr = values[n]
            types[n] = helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                     arr.shape)
            # Only small integer inputs carry shapes / counts; the rest only needs a type.
            if arr.dtype.kind in "iu" and arr.size <= 1024:
                data[n] = numpy_helper.from_array(arr, n)
        inferred = shape_inference.infer_node_outputs(schema, node, types, data)
    except Exception:  # noqa: BLE001  (no schema, or inference fails: evaluate and check after)
        return []
    sizes: list[int | None] = []
    for name in node.output:
        tt = inferred.get(name)
        dims = tt.tensor_type.shape.dim if tt is not None and tt.HasField("tensor_type") else None
        if dims is None or not all(d.HasField("dim_value") for d in dims):
            sizes.append(None)
        else:
            sizes.append(math.prod(d.dim_value for d in dims))
    return sizes


def _check_result(node: Any, k: int, arr: Any, limit: int) -> np.ndarray:
    where = f"{node.op_type} node {node.name!r}"
    arr = np.asarray(arr)
    if arr.dtype.name not in DTYPES:
        raise UnsupportedOpError(f"{where}: evaluated at import (its inputs are constants), but "
                                 f"output {k} has dtype {arr.dtype}, which Kiln does not support")
    if arr.size > limit:
        raise UnsupportedOpError(
            f"{where}: Kiln has no converter for {node.op_type}; its inputs are constants but "
            f"output {k} has {arr.size} elements, more than the {limit} Kiln evaluates at import "
            f"(kiln.frontend.onnx.fold.PREFOLD_LIMIT)")
    return arr


def fold_node(ctx: Context, node: Any, env: Mapping[str, Value],
              producers: Mapping[str, Any]) -> list[Value | None]:
    """Evaluate an unsupported node whose inputs are static; its outputs as graph constants.

    Parameters
    ----------
    ctx : Context
        The conversion state; ``ctx.env`` maps ONNX names to converted values.
    node : onnx.NodeProto
        The node (no converter exists for it).
    env : mapping of str to Value
        ONNX name -> converted value of the scope being converted (its inputs are there).
    producers : mapping of str to onnx.NodeProto
        ONNX output name -> node producing it, for the graph being converted; used to
        recompute an input Kiln keeps as a runtime op.

    Returns
    -------
    list of Value or None
        One constant per output of ``node``.

    Raises
    ------
    UnsupportedOpError
        If an input is a runtime value, a value on the way is too large, or the reference
        evaluator cannot run the node; the message names the node and the reason.
    """
    where = f"{node.op_type} node {node.name!r}"
    values: dict[str, np.ndarray] = {}
    order: list[Any] = []
    pending = [n for n in node.input if n]
    # Depth-first over the producers of inputs Kiln does not hold as constants. Iterative: a
    # hostile model's chains must not hit Python's recursion limit.
    expanded: set[int] = set()
    stack = [(n, False) for n in reversed(pending)]
    done: set[str] = set()
    seen: set[str] = set()
    while stack:
        name, post = stack.pop()
        if name in done:
            continue
        if not post:
            if name in seen:  # reached again before its producer finished: a cycle
                raise InputError(f"{where}: the graph has a cycle through {name!r}")
            seen.add(name)
        if post:
            p = producers[name]
            if id(p) not in expanded:
                expanded.add(id(p))
                order.append(p)
            done.update(o for o in p.output if o)
            continue
        v = env.get(name)
        arr = ctx.try_static(v)
        if arr is None and v is not None and v in getattr(ctx, "sym_values", {}):
            # a Shape of a tensor with symbolic dims: its content is only known at run time
            raise UnsupportedOpError(
                f"{where}: Kiln has no converter for {node.op_type}, and it cannot be evaluated "
                f"at import because {name!r} holds symbolic dims (runtime extents); pin them "
                f"with from_onnx(shape=...)")
        if arr is not None:
            values[name] = np.asarray(arr)
            done.add(name)
            continue
        p = producers.get(name)
        if p is None or p is node or not _foldable_kind(p):
            if p is None or p is node:
                src = "a graph input, only known at run time"
            else:  # random, or with a subgraph
                src = f"{p.op_type} node {p.name!r}, which Kiln does not evaluate at import"
            what = f"its input {name!r}" if name in node.input else f"it depends on {name!r}, which"
            raise UnsupportedOpError(
                f"{where}: Kiln has no converter for {node.op_type}, and it cannot be evaluated "
                f"at import because {what} comes from {src}")
        size = v.type.size if v is not None else 0
        if v is not None and size > PREFOLD_LIMIT:
            raise UnsupportedOpError(
                f"{where}: Kiln has no converter for {node.op_type}; evaluating it at import "
                f"needs {name!r} ({v.type}), larger than the {PREFOLD_LIMIT} elements Kiln "
                f"evaluates at import (kiln.frontend.onnx.fold.PREFOLD_LIMIT)")
        if len(expanded) + len(stack) > MAX_FOLD_NODES:
            raise UnsupportedOpError(
                f"{where}: Kiln has no converter for {node.op_type}; evaluating it at import "
                f"needs more than {MAX_FOLD_NODES} ONNX nodes")
        stack.append((name, True))
        for n in reversed([n for n in p.input if n]):
            if n not in done:
                stack.append((n, False))
    for p in order:
        outs = _evaluate(ctx, p, values)
        for k, (oname, arr) in enumerate(zip(p.output, outs)):
            if oname:
                values[oname] = _check_result(p, k, arr, PREFOLD_LIMIT)
    in_size = sum(values[n].size for n in node.input if n)
    limit = max(PREFOLD_LIMIT, in_size)
    # Refuse before evaluating when ONNX can tell the output is too large (an Expand-like op
    # must not allocate gigabytes just to be refused).
    for k, out_size in enumerate(_inferred_sizes(ctx, node, values)):
        if out_size is not None and out_size > limit:
            raise UnsupportedOpError(
                f"{where}: Kiln has no converter for {node.op_type}; its inputs are constants "
                f"but output {k} would have {out_size} elements, more than the {limit} Kiln "
                f"evaluates at import (kiln.frontend.onnx.fold.PREFOLD_LIMIT)")
    outs = _evaluate(ctx, node, values)
    res: list[Value | None] = []
    for k, arr in enumerate(outs):
        arr = _check_result(node, k, arr, limit)
        res.append(ctx.const(arr) if k < len(node.output) and node.output[k] else None)
    return res
