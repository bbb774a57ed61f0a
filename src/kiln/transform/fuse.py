"""FuseOps: partition a graph into fused kernel groups by operator pattern.

The result is not a new :class:`~kiln.ir.Graph` but a :class:`FusedGraph` — the original graph
plus an ordered list of :class:`FusedGroup` s — because a fused group is exactly what the
driver lowers into one kernel (``kiln.driver.lower_graph``).

Rules (TVM's, in the simplified "post-dominator by single-output groups" form)
-------------------------------------------------------------------------------
Nodes are visited in *reverse* topological order. Every node is the root (output) of a new
group unless it can join the group that holds **all** of its consumers:

* the value(s) it produces are not graph outputs and every consumer is in one group ``G``
  (so fusing never duplicates work and never crosses a value used outside the group);
* ``G`` has fewer than ``max_group_size`` nodes;
* the patterns combine:

  ==============================  ===========================================  ============
  group so far (``G.pattern``)    joining producer                             new pattern
  ==============================  ===========================================  ============
  ELEMWISE / BROADCAST            ELEMWISE / BROADCAST / INJECTIVE             max
  INJECTIVE                       ELEMWISE / BROADCAST / INJECTIVE             INJECTIVE
  ELEMWISE / BROADCAST            OUT_ELEMWISE_FUSABLE (conv, dense, pool...)  anchor, same
                                                                               output shape
  ELEMWISE / BROADCAST            COMM_REDUCE                                  anchor, same
                                                                               output shape
  COMM_REDUCE                     a whole ELEMWISE..INJECTIVE group (phase 2)  COMM_REDUCE
  OUT_ELEMWISE_FUSABLE            nothing (its inputs stay kernel arguments)
  anything                        OPAQUE: never fused
  ==============================  ===========================================  ============

  i.e. an anchor absorbs its elementwise epilogue (bias, activation, residual add), injective
  chains fuse, a reduction absorbs its elementwise epilogue. In a second phase, a group that
  is still purely elementwise/injective fuses into the reduction that consumes all of it
  (square -> mean); doing this in the first phase would let a reduction steal the epilogue of
  the conv feeding it (conv -> bias -> relu -> global-avg-pool). The "same output shape"
  condition keeps an epilogue from broadcasting the anchor's result to a bigger tensor,
  which anchor schedules do not tile for.
* an op whose output has a symbolic dim none of its inputs has joins only a group whose output
  has it too (a kernel reads every runtime extent from an argument, :func:`_introduces_dims`);
* ``reshape`` nodes with ``alias=True`` (set by Simplify) and ``OPAQUE`` ops stand alone; an
  aliasing reshape becomes a ``__nop`` group (no kernel, shares its input's memory).
* ``constant`` nodes belong to no group: they are external inputs of the groups using them
  (the driver inlines small ones and turns the rest into params).

Because a non-root node only joins when *all* its consumers are in the group, every group has
exactly one output node (the root) and the groups, ordered by their root's position, are in
topological order (a cycle between groups would need a path leaving a group through a
non-root node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ..ir import Graph, Node, OpPattern, Value, get_op
from ..ir.sym_rules import same_padded_layout

__all__ = ["FusedGroup", "FusedGraph", "fuse_ops", "FuseOps", "is_alias_reshape"]

#: Default cap on the number of ops in one fused group (keeps kernels and compile time sane).
MAX_GROUP_SIZE = 64

_EB = (OpPattern.ELEMWISE, OpPattern.BROADCAST)
_EBI = (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE)


@dataclass(eq=False)
class FusedGroup:
    """One fused group: the ops of one kernel (or one ``__nop`` alias).

    Attributes
    ----------
    nodes : list of Node
        The group's ops in topological order (the last one is the root).
    inputs : list of Value
        External values read by the group, in first-use order: graph inputs, constants and
        outputs of other groups.
    outputs : list of Value
        Values the group produces for the outside (the root's outputs).
    anchor : Node
        The op whose schedule is used for the whole group (conv2d for conv+bias+relu).
    pattern : OpPattern
        The group's combined pattern (the anchor's).
    is_nop : bool
        True for an aliasing reshape: no kernel, the output shares the input's storage.
    """

    nodes: list[Node]
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    anchor: Node | None = None
    pattern: OpPattern = OpPattern.ELEMWISE
    is_nop: bool = False

    @property
    def root(self) -> Node:
        """The group's output node."""
        return self.nodes[-1]

    @property
    def ops(self) -> list[str]:
        """Op names of the group's nodes, in order."""
        return [n.op for n in self.nodes]

    def __repr__(self) -> str:
        kind = "__nop" if self.is_nop else self.pattern.name
        return f"FusedGroup({'+'.join(self.ops)}, {kind}, anchor={self.anchor.op if self.anchor else None})"


@dataclass(eq=False)
class FusedGraph:
    """A graph partitioned into fused groups.

    Attributes
    ----------
    graph : Graph
        The (typed, simplified) graph that was partitioned; groups reference its nodes.
    groups : list of FusedGroup
        In a valid execution order.
    """

    graph: Graph
    groups: list[FusedGroup]

    def group_of(self) -> dict[Node, FusedGroup]:
        """Map every grouped node to its group."""
        return {n: g for g in self.groups for n in g.nodes}

    def dump(self) -> str:
        """A readable listing: one line per group with its ops, anchor, inputs and output types."""
        names: dict[Value, str] = {}
        for v in self.graph.inputs:
            names[v] = f"%{v.name}"
        for n in self.graph.nodes:
            if n.op == "constant":
                v = n.outputs[0]
                names[v] = f"$const{len([k for k in names if k.is_constant])}{list(v.shape)}"
        lines = [f"fused graph {self.graph.name!r}: {len(self.groups)} groups"]
        for gi, g in enumerate(self.groups):
            for j, o in enumerate(g.outputs):
                names[o] = f"%g{gi}" + (f".{j}" if len(g.outputs) > 1 else "")
        for gi, g in enumerate(self.groups):
            ins = ", ".join(names.get(v, "?") for v in g.inputs)
            outs = ", ".join(str(o.type) for o in g.outputs)
            kind = "__nop" if g.is_nop else f"{g.pattern.name} anchor={g.anchor.op if g.anchor else '-'}"
            lines.append(f"  %g{gi} = [{' -> '.join(g.ops)}] ({kind}) ({ins}) -> {outs}")
        heads = ", ".join(names.get(v, "?") for v in self.graph.outputs)
        lines.append(f"  return {heads}")
        return "\n".join(lines)

    __str__ = dump


def is_alias_reshape(node: Node) -> bool:
    """Whether ``node`` is a reshape the IR marked as a storage alias (emitted as ``__nop``)."""
    return node.op == "reshape" and bool(node.attrs.get("alias", False))


def _pattern(node: Node) -> OpPattern:
    return OpPattern(get_op(node.op).pattern)


class _Group:
    """Mutable group state during partitioning (nodes collected root first)."""

    __slots__ = ("nodes", "pattern", "anchor", "closed")

    def __init__(self, root: Node, pattern: OpPattern, closed: bool) -> None:
        self.nodes: list[Node] = [root]
        self.pattern = pattern
        # The anchor op starts as the root; an OUT_ELEMWISE_FUSABLE/COMM_REDUCE producer takes
        # over when it joins.
        self.anchor = root
        self.closed = closed  # OPAQUE / __nop: nothing may join


def _combine(g: _Group, node: Node, pat: OpPattern) -> OpPattern | None:
    """The group pattern after ``node`` (pattern ``pat``) joins ``g``, or None if it may not."""
    gp = g.pattern
    if gp in _EB:
        if pat in _EBI:
            return max(gp, pat)
        if pat in (OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.COMM_REDUCE):
            # Anchor + elementwise epilogue: the epilogue must not change the output shape.
            root = g.nodes[0]
            if len(node.outputs) == 1 and len(root.outputs) == 1 and \
                    root.outputs[0].shape == node.outputs[0].shape:
                return pat
        return None
    if gp == OpPattern.INJECTIVE:
        return gp if pat in _EBI else None
    # COMM_REDUCE takes its injective producers only in phase 2 (see fuse_ops): taking them
    # here would let a reduction steal the epilogue of a conv/dense feeding it.
    return None  # OUT_ELEMWISE_FUSABLE takes no producers; OPAQUE / TUPLE take nothing


def _keeps_anchor_epilogue(node: Node, pat: OpPattern, g: _Group, consumers: dict[Value, list[Node]],
                           outputs: set[Value]) -> bool:
    """``node`` should stay out of ``g`` to be the epilogue of the conv / dense it follows.

    An elementwise op after an anchor (conv -> bias -> relu) joining a group the anchor cannot
    join — an injective one (concat, transpose) or one whose result is bigger (a
    squeeze-and-excitation scale broadcast over the feature map) — would leave the anchor
    without its epilogue: the group then runs the epilogue once per element of *its* output
    (the sigmoid of a [1, C, 1, 1] scale once per pixel) and the anchor's raw result makes an
    extra trip through memory. Kept out, the chain becomes the anchor's epilogue instead.
    """
    if pat not in _EB or len(node.outputs) != 1:
        return False
    shape = node.outputs[0].shape
    root = g.nodes[0]
    if g.pattern != OpPattern.INJECTIVE and len(root.outputs) == 1 and root.outputs[0].shape == shape:
        return False
    n = node
    for _ in range(MAX_GROUP_SIZE):
        step = None
        for v in n.inputs:
            p = v.node
            if p is None or p.op == "constant" or v.shape != shape or v in outputs \
                    or len(consumers.get(v, [])) != 1 or len(p.outputs) != 1:
                continue
            pp = _pattern(p)
            if pp == OpPattern.OUT_ELEMWISE_FUSABLE:
                return True
            if pp in _EB and step is None:
                step = p
        if step is None:
            return False
        n = step
    return False


def _sym_dims(values: list[Value]) -> set[str]:
    return {d for v in values for d in (v.type.sym or ()) if isinstance(d, str)}


def _introduces_dims(node: Node, root: Node) -> bool:
    """Whether ``node`` inside the group of ``root`` would leave a kernel without an extent.

    A kernel knows a symbolic dim's runtime extent only from an argument that has it. An op
    whose output has a dim none of its inputs has (a resize to runtime sizes, a broadcast of a
    constant to a data-dependent count) is its own extent's only carrier, so it may sit inside
    a group only when the group's output has that dim too; else (a resize followed by a mean
    over H and W) it ends its own group. Its inputs carry their dims by the same rule, down to
    the group's arguments.
    """
    dims = _sym_dims(node.outputs)
    return bool(dims) and not dims <= _sym_dims(node.inputs) | _sym_dims(root.outputs)


def _live_nodes(graph: Graph) -> set[Node]:
    """Nodes that (transitively) feed a graph output; the rest are dead and not compiled."""
    live: set[Node] = set()
    stack = [v.node for v in graph.outputs if v.node is not None]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(v.node for v in n.inputs if v.node is not None and v.node not in live)
    return live


def fuse_ops(graph: Graph, opt_level: int = 3, max_group_size: int = MAX_GROUP_SIZE) -> FusedGraph:
    """Partition ``graph`` into fused groups.

    Parameters
    ----------
    graph : Graph
        A typed graph (after InferType / Simplify / FoldConstant). Not modified.
    opt_level : int
        ``0`` puts every op in its own group (aliasing reshapes still become ``__nop``);
        ``>= 1`` fuses by pattern.
    max_group_size : int
        Largest number of ops in one group.

    Returns
    -------
    FusedGraph
        Groups in execution order; dead nodes (not feeding an output) are dropped.
    """
    live = _live_nodes(graph)
    order = [n for n in graph.nodes if n in live and n.op != "constant"]
    pos = {n: i for i, n in enumerate(order)}
    consumers: dict[Value, list[Node]] = {}
    for n in order:
        for v in n.inputs:
            consumers.setdefault(v, []).append(n)
    outputs = set(graph.outputs)

    group_of: dict[Node, _Group] = {}
    groups: list[_Group] = []
    for node in reversed(order):
        pat = _pattern(node)
        alias = is_alias_reshape(node)
        # a reshape that moves data in the padded layout of dynamic dims is a kernel of its own
        # (its runtime extents come from its own input and output)
        moving = node.op == "reshape" and not alias and not same_padded_layout(node.inputs[0].type,
                                                                              node.outputs[0].type)
        target: _Group | None = None
        if opt_level >= 1 and not alias and not moving and pat not in (OpPattern.OPAQUE, OpPattern.TUPLE):
            cons_groups = set()
            ok = True
            for v in node.outputs:
                if v in outputs:
                    ok = False
                    break
                for c in consumers.get(v, []):
                    cons_groups.add(id(group_of[c]))
                    target = group_of[c]
            if ok and len(cons_groups) == 1 and target is not None and not target.closed \
                    and len(target.nodes) < max_group_size and not _introduces_dims(node, target.nodes[0]):
                newpat = _combine(target, node, pat)
                if newpat is not None and _keeps_anchor_epilogue(node, pat, target, consumers, outputs):
                    newpat = None
                if newpat is not None:
                    if pat in (OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.COMM_REDUCE):
                        target.anchor = node
                    target.pattern = newpat
                    target.nodes.append(node)
                    group_of[node] = target
                    continue
        g = _Group(node, pat, closed=alias or moving or pat in (OpPattern.OPAQUE, OpPattern.TUPLE))
        groups.append(g)
        group_of[node] = g

    if opt_level >= 1:
        # Phase 2: a group that is still purely injective fuses into the reduction consuming
        # it (e.g. square -> mean), when that reduction group holds all of its consumers.
        for g in sorted(groups, key=lambda g: -pos[g.nodes[0]]):
            if g.closed or g.pattern not in _EBI:
                continue
            root = g.nodes[0]
            if any(v in outputs for v in root.outputs):
                continue
            targets = {id(group_of[c]): group_of[c] for v in root.outputs
                       for c in consumers.get(v, [])}
            if len(targets) != 1:
                continue
            (r,) = targets.values()
            if r.pattern != OpPattern.COMM_REDUCE or len(r.nodes) + len(g.nodes) > max_group_size \
                    or any(_introduces_dims(n, r.nodes[0]) for n in g.nodes):
                continue
            r.nodes.extend(g.nodes)
            for n in g.nodes:
                group_of[n] = r
            g.nodes = []
        groups = [g for g in groups if g.nodes]

    result: list[FusedGroup] = []
    for g in sorted(groups, key=lambda g: pos[g.nodes[0]]):
        nodes = sorted(g.nodes, key=lambda n: pos[n])
        inside = set(nodes)
        ins: list[Value] = []
        seen: set[Value] = set()
        for n in nodes:
            for v in n.inputs:
                if (v.node is None or v.node not in inside) and v not in seen:
                    seen.add(v)
                    ins.append(v)
        root = nodes[-1]
        fg = FusedGroup(nodes=nodes, inputs=ins, outputs=list(root.outputs), anchor=g.anchor,
                        pattern=g.pattern, is_nop=is_alias_reshape(root) and len(nodes) == 1)
        result.append(fg)
    return FusedGraph(graph, result)


class FuseOps:
    """Pass object form of :func:`fuse_ops` (``FuseOps(opt_level=3)(graph) -> FusedGraph``).

    Parameters
    ----------
    opt_level : int
        See :func:`fuse_ops`.
    max_group_size : int
        See :func:`fuse_ops`.
    """

    def __init__(self, opt_level: int = 3, max_group_size: int = MAX_GROUP_SIZE) -> None:
        self.opt_level = opt_level
        self.max_group_size = max_group_size

    def __call__(self, graph: Graph) -> FusedGraph:
        return fuse_ops(graph, self.opt_level, self.max_group_size)

