"""The graph IR: SSA values, nodes and graphs.

A :class:`Graph` holds its nodes in topological order. Every node output and every graph input is
a :class:`Value`; values are compared by identity. Constants are nodes of op ``"constant"`` whose
``value`` attribute is a (read-only) NumPy array.

Dynamic graphs: a graph declares named dims with their ranges (:meth:`Graph.declare_dim`,
:attr:`Graph.dim_ranges`); inputs may have symbolic dims, and :meth:`Graph.add_node` infers the
symbolic dims of every output with the op's symbolic rule (:mod:`kiln.ir.sym_rules`). Every helper
here that builds a new graph from an old one keeps the ranges.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..runtime import sym as _sym
from ..runtime.errors import InputError, KilnError
from .op import get_op
from .types import Dim, TensorType, normalize_dtype

__all__ = ["Value", "Node", "Graph", "IRModule", "structural_equal", "rewrite", "dead_code_elimination"]


class Value:
    """An SSA value: a graph input or one output of a node.

    Attributes
    ----------
    type : TensorType
    node : Node or None
        The producer; ``None`` for graph inputs.
    index : int
        Output index within the producer (0 for inputs).
    name : str or None
        Source name (ONNX tensor name) or input name; for debugging and printing.
    """

    __slots__ = ("type", "node", "index", "name")

    def __init__(self, type: TensorType, node: "Node | None" = None, index: int = 0,
                 name: str | None = None) -> None:
        self.type = type
        self.node = node
        self.index = index
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        """Shortcut for ``type.shape`` (upper bounds; ``type.dims`` has the symbols)."""
        return self.type.shape

    @property
    def dtype(self) -> str:
        """Shortcut for ``type.dtype``."""
        return self.type.dtype

    @property
    def is_input(self) -> bool:
        """True for graph inputs / parameter placeholders."""
        return self.node is None

    @property
    def is_constant(self) -> bool:
        """True when produced by a ``constant`` node."""
        return self.node is not None and self.node.op == "constant"

    @property
    def const_value(self) -> np.ndarray | None:
        """The array of a constant value, else ``None``."""
        if self.node is not None and self.node.op == "constant":
            return self.node.attrs["value"]
        return None

    def __repr__(self) -> str:
        src = "input" if self.node is None else f"{self.node.op}[{self.index}]"
        return f"Value({self.name!r}, {self.type}, {src})"


class Node:
    """One operator call.

    Attributes
    ----------
    op : str
        Registered op name.
    inputs : list of Value
    attrs : dict
        Validated attributes, defaults filled.
    outputs : list of Value
    name : str or None
        Source node name (for errors and debugging).
    """

    __slots__ = ("op", "inputs", "attrs", "outputs", "name")

    def __init__(self, op: str, inputs: list[Value], attrs: dict[str, Any],
                 name: str | None = None) -> None:
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.outputs: list[Value] = []
        self.name = name

    @property
    def opdef(self):
        """The :class:`~kiln.ir.op.OpDef` of this node."""
        return get_op(self.op)

    def __repr__(self) -> str:
        return f"Node({self.op}, name={self.name!r})"


def _const_array(value: Any, dtype: Any = None) -> np.ndarray:
    from .types import np_dtype

    if dtype is not None:
        arr = np.asarray(value, dtype=np_dtype(normalize_dtype(dtype)))
    else:
        arr = np.asarray(value)
    normalize_dtype(arr.dtype)  # validates
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if arr.flags.writeable:
        # A read-only view, not a copy: weights can be large. Callers hand over ownership.
        arr = arr.view()
        arr.setflags(write=False)
    return arr


class Graph:
    """A dataflow graph (a.k.a. IRModule) with nodes in topological order.

    Parameters
    ----------
    name : str
        Module name.

    Attributes
    ----------
    inputs : list of Value
        Graph inputs and parameter placeholders, in order.
    outputs : list of Value
    nodes : list of Node
        Topologically ordered.
    dim_ranges : dict of str to (int, int)
        The declared symbolic dims and their ``(lo, hi)`` ranges; empty for a static graph.
    data_dims : set of str
        The symbolic dims whose value a kernel decides at run time (the count of NonZero ...),
        as opposed to those an input's shape gives.
    """

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.dim_ranges: dict[str, tuple[int, int]] = {}
        self.data_dims: set[str] = set()

    # ------------------------------------------------------------------ building
    def declare_dim(self, name: str, lo: int, hi: int, data_dependent: bool = False) -> None:
        """Declare the symbolic dim ``name`` with runtime extents ``lo..hi`` (``1 <= lo <= hi``).

        Redeclaring a dim with the same range is allowed; with another range it is an error.
        ``data_dependent`` marks a dim an op's kernel decides at run time (``0 <= lo`` then).

        Raises
        ------
        InputError
            A bad name or range, or a conflicting redeclaration.
        """
        _sym.check_name(name)
        rng = _sym.check_range(name, (lo, hi), allow_zero=data_dependent)
        old = self.dim_ranges.get(name)
        if old is not None and (old != rng or (name in self.data_dims) != data_dependent):
            raise InputError(f"dimension {name!r} is already declared with range "
                             f"{old[0]}..{old[1]}, not {rng[0]}..{rng[1]}")
        self.dim_ranges[name] = rng
        if data_dependent:
            self.data_dims.add(name)

    def copy_dims(self, other: "Graph") -> None:
        """Take ``other``'s declared dims (ranges and which are data-dependent): every pass that
        builds a new graph from an old one calls this."""
        self.dim_ranges = dict(other.dim_ranges)
        self.data_dims = set(other.data_dims)

    def add_input(self, name: str, shape: Sequence[Dim], dtype: Any = "float32") -> Value:
        """Append a graph input (or parameter placeholder) and return its value.

        Parameters
        ----------
        name : str
            Input name (unique).
        shape : sequence of int or str
            Every dim: a static extent, or a symbolic expression (``"seq"``, ``"2*seq"``) whose
            symbols are declared in :attr:`dim_ranges`; its upper bound becomes the static
            extent of the type.
        dtype : dtype-like

        Raises
        ------
        InputError
            A duplicate name, a bad dim, or a symbolic dim with an undeclared symbol.
        """
        if any(v.name == name for v in self.inputs):
            raise InputError(f"duplicate graph input name {name!r}")
        self.inputs.append(Value(self._input_type(name, shape, dtype), None, 0, name))
        return self.inputs[-1]

    def _input_type(self, name: str, shape: Sequence[Dim], dtype: Any) -> TensorType:
        shape = tuple(shape)
        if not any(isinstance(d, str) for d in shape):
            return TensorType(shape, dtype)  # type: ignore[arg-type]  # all ints here
        static: list[int] = []
        sym: list[Dim | None] = []
        for d in shape:
            if not isinstance(d, str):
                static.append(int(d))
                sym.append(None)
                continue
            try:
                c = _sym.canonical(d)
            except InputError as exc:
                raise InputError(f"input {name!r}: {exc}") from None
            missing = sorted(_sym.symbols(c) - self.dim_ranges.keys()) if isinstance(c, str) else []
            if missing:
                raise InputError(
                    f"input {name!r}: dimension {d!r} uses {', '.join(map(repr, missing))} which "
                    f"has no declared range; declare it (graph.declare_dim / dim_ranges)")
            lo, hi = _sym.bounds(c, self.dim_ranges)
            if lo < 0:
                raise InputError(f"input {name!r}: dimension {d!r} can be negative ({lo}..{hi})")
            static.append(hi)
            sym.append(c)
        return TensorType(tuple(static), dtype, tuple(sym))

    def add_node(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any] | None = None,
                 name: str | None = None, output_names: Sequence[str | None] | None = None
                 ) -> list[Value]:
        """Append a call of ``op`` and return its output values.

        Attributes are validated against the op schema and output types are inferred with the
        op's type relation.

        Raises
        ------
        InputError
            Wrong number of inputs, bad attributes or a type mismatch; the message names the node.
        """
        opdef = get_op(op)
        inputs = list(inputs)
        where = f"{op} node {name!r}" if name else f"{op} node"
        try:
            opdef.check_num_inputs(len(inputs))
            for v in inputs:
                if not isinstance(v, Value):
                    raise InputError(f"inputs must be Values, got {type(v).__name__}")
            norm = opdef.normalize_attrs(attrs)
            in_types = [v.type for v in inputs]
            out_types = opdef.type_rel(in_types, norm)
            # add_node is hot: static graphs pay one attribute test per input and two lookups.
            dynamic = norm.get("sym_shape") is not None or norm.get("sym_size") is not None
            for t in in_types:
                if t.sym is not None:
                    dynamic = True
                    break
            if dynamic:
                out_types = _sym_types(opdef, in_types, norm, out_types, self.dim_ranges)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        if opdef.num_outputs is not None and len(out_types) != opdef.num_outputs:
            raise KilnError(f"{where}: type relation returned {len(out_types)} types, "
                            f"expected {opdef.num_outputs}")
        node = Node(op, inputs, norm, name)
        names = list(output_names) if output_names is not None else []
        names += [None] * (len(out_types) - len(names))
        node.outputs = [Value(t, node, i, names[i]) for i, t in enumerate(out_types)]
        self.nodes.append(node)
        return node.outputs

    def add(self, op: str, *inputs: Value, name: str | None = None, **attrs: Any) -> Value:
        """Single-output shorthand: ``g.add("relu", x)``."""
        outs = self.add_node(op, inputs, attrs, name=name)
        if len(outs) != 1:
            raise KilnError(f"op {op!r} has {len(outs)} outputs; use add_node")
        return outs[0]

    def add_constant(self, value: Any, dtype: Any = None, name: str | None = None) -> Value:
        """Append a ``constant`` node holding ``value`` (stored read-only) and return its value."""
        arr = _const_array(value, dtype)
        return self.add_node("constant", [], {"value": arr}, name=name, output_names=[name])[0]

    # ------------------------------------------------------------------ queries
    def input(self, name: str) -> Value:
        """The graph input called ``name``."""
        for v in self.inputs:
            if v.name == name:
                return v
        raise InputError(f"graph has no input {name!r}; inputs: {[v.name for v in self.inputs]}")

    @property
    def input_names(self) -> list[str]:
        """Names of the graph inputs, in order."""
        return [v.name for v in self.inputs]  # type: ignore[misc]

    def consumers(self) -> dict[Value, list[tuple[Node, int]]]:
        """Map every used value to its ``(node, input_index)`` consumers (graph outputs excluded)."""
        res: dict[Value, list[tuple[Node, int]]] = {}
        for node in self.nodes:
            for i, v in enumerate(node.inputs):
                res.setdefault(v, []).append((node, i))
        return res

    def use_counts(self) -> dict[Value, int]:
        """Number of uses of every value, counting each graph-output slot as a use."""
        res: dict[Value, int] = {}
        for node in self.nodes:
            for v in node.inputs:
                res[v] = res.get(v, 0) + 1
        for v in self.outputs:
            res[v] = res.get(v, 0) + 1
        return res

    def op_counts(self) -> dict[str, int]:
        """``{op: number of nodes}``."""
        res: dict[str, int] = {}
        for n in self.nodes:
            res[n.op] = res.get(n.op, 0) + 1
        return res

    def constants(self) -> dict[str, np.ndarray]:
        """Arrays of all constant nodes keyed by the name the printer uses for them."""
        from .printer import constant_names

        names = constant_names(self)
        return {names[n]: n.attrs["value"] for n in self.nodes if n.op == "constant"}

    # ------------------------------------------------------------------ misc
    def copy(self) -> "Graph":
        """A copy with fresh nodes and values (constant arrays are shared; they are read-only)."""
        return rewrite(self, lambda g, node, ins: None)

    def verify(self) -> None:
        """Check topological order and that every used value is defined; raise KilnError."""
        defined = set(self.inputs)
        for node in self.nodes:
            for v in node.inputs:
                if v not in defined:
                    raise KilnError(f"{node.op} node {node.name!r} uses an undefined value {v!r}")
            defined.update(node.outputs)
        for v in self.outputs:
            if v not in defined:
                raise KilnError(f"graph output {v!r} is not defined")

    def astext(self, inline_limit: int = 16) -> str:
        """The textual form (see docs/ir.md)."""
        from .printer import astext

        return astext(self, inline_limit=inline_limit)

    def __str__(self) -> str:
        return self.astext()

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, {len(self.inputs)} inputs, {len(self.nodes)} nodes, "
                f"{len(self.outputs)} outputs)")


#: TVM-flavoured alias.
IRModule = Graph


#: Attributes giving an op symbolic output dims of its own (reshape / broadcast_to targets, a
#: resize to runtime sizes): a node with one is dynamic even when its inputs are static.
_SYM_ATTRS = ("sym_shape", "sym_size")


def _sym_types(opdef: Any, in_types: list[TensorType], attrs: dict[str, Any],
               out_types: list[TensorType], ranges: dict[str, tuple[int, int]]
               ) -> list[TensorType]:
    """``out_types`` with the symbolic dims the op's rule infers; an op without a rule raises
    rather than dropping a symbol."""
    from .sym_rules import POSITIVE_DIMS, get_sym_rule

    for key in _SYM_ATTRS:
        target = attrs.get(key)
        if target is None:
            continue
        missing = sorted(_sym.dims_symbols(target) - ranges.keys())
        if missing:
            raise InputError(f"{key} {tuple(target)} uses {', '.join(map(repr, missing))} "
                             "which has no declared range")
        if key != "sym_size":
            continue
        # a resize's size is its output's storage: no dim may outgrow it at run time (the
        # importer computes size from these bounds; an IR built by hand may not)
        static = attrs["size"]
        for d, ub in zip(target, static):
            hi = d if isinstance(d, int) else _sym.bounds(d, ranges)[1]
            if hi > ub:
                raise InputError(f"{key} {tuple(target)}: dim {d} reaches {hi}, more than the "
                                 f"{ub} of the static shape {tuple(static)}")
    rule = get_sym_rule(opdef)
    if rule is None:
        i, t = next((i, t) for i, t in enumerate(in_types) if t.sym is not None)
        dims = ", ".join(str(d) for d in t.dims) + ("," if t.ndim == 1 else "")
        raise InputError(f"op {opdef.name!r} does not support symbolic dimensions yet "
                         f"(input {i} has dims ({dims}))")
    syms = rule(in_types, attrs, out_types)
    if len(syms) != len(out_types):
        raise KilnError(f"symbolic rule of op {opdef.name!r} returned {len(syms)} results "
                        f"for {len(out_types)} outputs")
    if opdef.name in POSITIVE_DIMS:
        # a window that no longer fits the smallest input would give an empty output
        for s in syms:
            for d in s or ():
                if isinstance(d, str) and _sym.bounds(d, ranges)[0] < 1:
                    lo = ", ".join(f"{n}>={ranges[n][0]}" for n in sorted(_sym.symbols(d)))
                    raise InputError(f"output dimension {d!r} is < 1 at the low end of the "
                                     f"ranges ({lo}); raise the lower bound of the range")
    # type_rel may hand back an input type as is (sym included): the rule's answer wins.
    return [t if s == t.sym else TensorType(t.shape, t.dtype, s) for t, s in zip(out_types, syms)]


def rewrite(graph: Graph,
            visit: Callable[[Graph, Node, list[Value]], "list[Value] | Value | None"],
            name: str | None = None) -> Graph:
    """Rebuild ``graph`` node by node — the building block of most passes.

    Parameters
    ----------
    graph : Graph
        Source graph (not modified).
    visit : callable
        ``visit(new_graph, node, new_inputs)`` is called for every node in order with the
        node's inputs already mapped into the new graph. It returns the replacement output
        values (a list, or a single Value for single-output nodes), or ``None`` to copy the node
        unchanged.
    name : str, optional
        Name of the new graph (default: the old one).

    Returns
    -------
    Graph
    """
    new, vmap = _with_inputs_of(graph, name or graph.name)
    for node in graph.nodes:
        ins = [vmap[v] for v in node.inputs]
        res = visit(new, node, ins)
        if res is None:
            res = _copy_node(new, node, ins)
        elif isinstance(res, Value):
            res = [res]
        if len(res) != len(node.outputs):
            raise KilnError(f"rewrite of {node.op} node {node.name!r} returned {len(res)} values "
                            f"for {len(node.outputs)} outputs")
        for old, nv in zip(node.outputs, res):
            vmap[old] = nv
            if nv.name is None:
                nv.name = old.name
    new.outputs = [vmap[v] for v in graph.outputs]
    return new


def _with_inputs_of(graph: Graph, name: str) -> tuple[Graph, dict[Value, Value]]:
    """An empty graph with fresh copies of ``graph``'s inputs, and the old -> new value map."""
    new = Graph(name)
    new.copy_dims(graph)
    vmap: dict[Value, Value] = {}
    for v in graph.inputs:
        nv = Value(v.type, None, 0, v.name)
        new.inputs.append(nv)
        vmap[v] = nv
    return new, vmap


def _copy_node(g: Graph, node: Node, ins: list[Value]) -> list[Value]:
    # Attributes are already canonical and types are unchanged when the inputs keep their
    # types, so skip re-validation for speed.
    same = all(a.type == b.type for a, b in zip(ins, node.inputs))
    if not same:
        return g.add_node(node.op, ins, node.attrs, name=node.name,
                          output_names=[v.name for v in node.outputs])
    n = Node(node.op, ins, dict(node.attrs), node.name)
    n.outputs = [Value(v.type, n, v.index, v.name) for v in node.outputs]
    g.nodes.append(n)
    return n.outputs


def dead_code_elimination(graph: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output. Graph inputs are kept.

    A graph utility rather than a pass: the frontend prunes what it built with it, and the
    passes (:mod:`kiln.transform`) run it after every rewrite.
    """
    live: set[int] = set()
    needed: set[Value] = set(graph.outputs)
    for node in reversed(graph.nodes):
        if any(v in needed for v in node.outputs):
            live.add(id(node))
            needed.update(node.inputs)
    new, vmap = _with_inputs_of(graph, graph.name)
    for node in graph.nodes:
        if id(node) in live:
            for a, b in zip(node.outputs, _copy_node(new, node, [vmap[x] for x in node.inputs])):
                vmap[a] = b
    new.outputs = [vmap[v] for v in graph.outputs]
    return new


# ---------------------------------------------------------------------- equality
def _post_order(graph: Graph) -> list[Node]:
    """Nodes reachable from the outputs in a canonical post-order (iterative DFS)."""
    seen: set[int] = set()
    order: list[Node] = []
    for out in graph.outputs:
        if out.node is None or id(out.node) in seen:
            continue
        stack: list[tuple[Node, int]] = [(out.node, 0)]
        seen.add(id(out.node))
        while stack:
            node, i = stack.pop()
            if i < len(node.inputs):
                stack.append((node, i + 1))
                p = node.inputs[i].node
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    stack.append((p, 0))
            else:
                order.append(node)
    return order


def _attr_equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
            a, b, equal_nan=a.dtype.kind in "fc" or a.dtype.name == "bfloat16")
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_attr_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def structural_equal(a: Graph, b: Graph, map_free_vars: bool = False) -> bool:
    """Whether two graphs compute the same dataflow with equal ops, attributes and types.

    Inputs are matched by position and must agree in name (unless ``map_free_vars``) and type.
    Node order, node names and value names do not matter; nodes not reachable from the outputs
    are ignored.
    """
    if len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
        return False
    if a.dim_ranges != b.dim_ranges or a.data_dims != b.data_dims:
        return False
    vmap: dict[Value, Value] = {}
    for x, y in zip(a.inputs, b.inputs):
        if x.type != y.type or (not map_free_vars and x.name != y.name):
            return False
        vmap[x] = y
    oa, ob = _post_order(a), _post_order(b)
    if len(oa) != len(ob):
        return False
    for na, nb in zip(oa, ob):
        if na.op != nb.op or len(na.inputs) != len(nb.inputs) or len(na.outputs) != len(nb.outputs):
            return False
        if any(vmap.get(x) is not y for x, y in zip(na.inputs, nb.inputs)):
            return False
        if na.attrs.keys() != nb.attrs.keys():
            return False
        if not all(_attr_equal(na.attrs[k], nb.attrs[k]) for k in na.attrs):
            return False
        for x, y in zip(na.outputs, nb.outputs):
            if x.type != y.type:
                return False
            vmap[x] = y
    return all(vmap.get(x) is y for x, y in zip(a.outputs, b.outputs))


