"""Lowering of fused groups: FusedGroup -> TE computes -> schedule -> PrimFunc.

For every kernel group:

1. each external input becomes a ``te.placeholder`` — except *small constants*
   (:data:`INLINE_MAX_ELEMENTS` elements or fewer), which are inlined into the kernel as a
   ``te.compute`` of literals, so scalars such as the ``0.5`` of a GELU or an ``epsilon`` cost
   no argument and no memory traffic;
2. the ops' ``kiln.topi`` computes are chained in the group's order;
3. ``kiln.topi.schedule_group(anchor_op, pattern, outs, target)`` schedules the group;
4. ``kiln.tir.lower`` turns it into a :class:`~kiln.tir.PrimFunc` named
   ``kilngen_<mod_name>_fused_<op1>_<op2>...``.

Identical groups (same ops, attributes, wiring, argument / output types and inlined constant
values) are lowered **once**; every graph node of that shape calls the same function.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..ir import Node, Value
from ..runtime.errors import KilnError
from ..transform.fuse import FusedGraph, FusedGroup
from ..transform.inplace_concat import inplace_concat_groups

__all__ = ["INLINE_MAX_ELEMENTS", "LoweredCall", "LoweredModel", "lower_fused_graph",
           "is_inlinable_constant", "group_key"]

#: Constants with at most this many elements are inlined into kernels instead of becoming params.
INLINE_MAX_ELEMENTS = 4
#: Longest ``<op1>_<op2>...`` part of a function name before it is cut and hashed.
_MAX_OPS_NAME = 64


@dataclass
class LoweredCall:
    """One fused group, lowered.

    Attributes
    ----------
    group : FusedGroup
    func_name : str
        Kernel symbol (shared by identical groups) or ``"__nop"``.
    args : list of Value
        The values passed as kernel inputs, in placeholder order (inlined constants excluded).
    outputs : list of Value
    key : tuple
        The dedup key (``()`` for ``__nop``).
    """

    group: FusedGroup
    func_name: str
    args: list[Value]
    outputs: list[Value]
    key: tuple = ()


@dataclass
class LoweredModel:
    """All kernels of a model.

    Attributes
    ----------
    fused : FusedGraph
    calls : list of LoweredCall
        One per group, in execution order.
    funcs : list of PrimFunc
        Unique kernels (``len(funcs) <= number of kernel calls``).
    """

    fused: FusedGraph
    calls: list[LoweredCall]
    funcs: list[Any] = field(default_factory=list)

    def dump(self, ir: bool = True) -> str:
        """Fused groups, which function each calls, and (``ir=True``) every kernel's loop IR."""
        lines = [self.fused.dump(), "", "calls:"]
        for i, c in enumerate(self.calls):
            lines.append(f"  {i}: {c.func_name}  [{' -> '.join(c.group.ops)}]")
        if ir:
            for f in self.funcs:
                lines += ["", str(f)]
        return "\n".join(lines)

    __str__ = dump


def is_inlinable_constant(v: Value, limit: int = INLINE_MAX_ELEMENTS) -> bool:
    """Whether a value is a constant small enough to inline into a kernel."""
    return v.is_constant and v.type.size <= limit


def _freeze(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return ("nd", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, float):
        return ("f", repr(x))  # repr: NaN compares equal to itself as a string
    if isinstance(x, (tuple, list)):
        return tuple(_freeze(y) for y in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    return x


def group_key(group: FusedGroup, args: Sequence[Value], inlined: Sequence[Value],
              shape_of: Callable[[Value], tuple[int, ...]] | None = None) -> tuple:
    """Structural key of a group: equal keys lower to the same kernel.

    ``shape_of`` (default: the values' shapes) lets a caller leave a dim out of the key.
    """
    shp = shape_of or (lambda v: v.shape)
    tok: dict[Value, Any] = {}
    for k, v in enumerate(args):
        tok[v] = ("arg", k, v.dtype, shp(v), v.type.sym)
    for v in inlined:
        tok[v] = ("const", v.dtype, shp(v), np.ascontiguousarray(v.const_value).tobytes())
    parts: list[Any] = []
    for j, n in enumerate(group.nodes):
        parts.append((n.op, _freeze(n.attrs), tuple(tok[v] for v in n.inputs),
                      tuple((o.dtype, shp(o), o.type.sym) for o in n.outputs)))
        for i, o in enumerate(n.outputs):
            tok[o] = ("node", j, i)
    anchor = group.nodes.index(group.anchor) if group.anchor in group.nodes else -1
    return (tuple(parts), tuple(tok[o] for o in group.outputs), anchor, int(group.pattern))


def _sanitize(s: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", s)


def _func_name(mod_name: str, group: FusedGroup) -> str:
    ops = "_".join(_sanitize(o) for o in group.ops)
    if len(ops) > _MAX_OPS_NAME:
        # Keep the head (it names the anchor's neighbourhood) and make the rest a short hash.
        digest = hashlib.sha1(ops.encode()).hexdigest()[:8]
        ops = ops[:_MAX_OPS_NAME].rstrip("_") + "_" + digest
    return f"kilngen_{_sanitize(mod_name)}_fused_{ops}"


def _const_tensor(v: Value, name: str) -> Any:
    """A ``te.compute`` producing the literal values of a small constant."""
    from .. import te

    arr = np.ascontiguousarray(v.const_value)
    dt = v.dtype
    flat = arr.reshape(-1)

    def lit(x: Any) -> Any:
        if dt == "bool":
            return te.const(bool(x), dt)
        if np.issubdtype(np.asarray(x).dtype, np.integer):
            return te.const(int(x), dt)
        return te.const(float(x), dt)

    shape = tuple(v.shape)
    if flat.size == 0 or bool(np.all(flat == flat[0])):
        # an empty constant has no element to read: any literal of its dtype stands for it
        value = lit(flat[0] if flat.size else 0)
        return te.compute(shape, lambda *idx: value, name=name, tag="elemwise")

    strides = [int(np.prod(shape[k + 1:], dtype=np.int64)) for k in range(len(shape))]

    def body(*idx: Any) -> Any:
        lin = None
        for i, s in zip(idx, strides):
            term = i * s if s != 1 else i
            lin = term if lin is None else lin + term
        expr = lit(flat[-1])
        for k in range(flat.size - 2, -1, -1):
            expr = te.if_then_else(te.equal(lin, k), lit(flat[k]), expr)
        return expr

    return te.compute(shape, body, name=name, tag="injective")


class _DimVars:
    """One ``tir.Var`` per symbolic dim of a kernel: the runtime extent its code reads from
    the argument DLTensors (``docs/dynamic_shapes.md``)."""

    def __init__(self) -> None:
        self.vars: dict[str, Any] = {}

    def dyn(self, v: Value) -> tuple[Any, ...] | None:
        """``v``'s dyn tuple (a Var per symbolic dim, one Var per distinct expression)."""
        if v.type.sym is None:
            return None
        # sym entries are None (static) or canonical strings
        return tuple(self.var(d) if isinstance(d, str) else None for d in v.type.sym)

    def var(self, d: str) -> Any:
        """The Var of the canonical symbolic dim ``d`` (made on first use)."""
        from .. import tir

        var = self.vars.get(d)
        if var is None:
            base = _sanitize(d) if re.fullmatch(r"[A-Za-z_]\w*", d) else f"dim{len(self.vars)}"
            var = self.vars[d] = tir.Var(f"{base}_rt", "int32")
        return var


#: Name of the runtime extent of a shape-generic kernel's varying axis.
_GENERIC_DIM = "extent"


def _generic_axis(group: FusedGroup, inlined: Sequence[Value]) -> tuple[int, int] | None:
    """``(axis, extent)`` when ``group`` can be lowered as a shape-generic kernel, else None.

    Such a group is elementwise / broadcast ops only, static, one rank throughout, and every
    value is 1 on the axes before the output's first non-unit axis and either the output's
    extent or 1 on it. Its kernel then works for any extent of that axis with no change of
    strides (the axes before it are 1), so groups that differ only there (DenseNet's
    BatchNorm + ReLU before each layer, one per channel count) can share one kernel that reads
    the extent from its arguments, as a dynamic-shape kernel does.
    """
    from ..ir.op import OpPattern, get_op

    if group.is_nop or any(get_op(n.op).pattern > OpPattern.BROADCAST for n in group.nodes):
        return None
    out = group.outputs[0]
    vals = list(group.inputs) + [o for n in group.nodes for o in n.outputs]
    rank = len(out.shape)
    ax = next((i for i, d in enumerate(out.shape) if d != 1), None)
    if ax is None or any(len(v.shape) != rank or v.type.sym is not None for v in vals):
        return None
    ext = out.shape[ax]
    if any(any(d != 1 for d in v.shape[:ax]) or v.shape[ax] not in (1, ext) for v in vals):
        return None
    if any(v.shape[ax] != 1 for v in inlined):  # a literal table cannot change its length
        return None
    return ax, ext


def _lower_generic(group: FusedGroup, name: str, args: Sequence[Value], inlined: Sequence[Value],
                   axis: int, extent: int, upper: int, target: Any) -> Any:
    """Lower ``group`` with its ``axis`` extent as a runtime value in ``1..upper``.

    The group is rebuilt in a graph of its own whose inputs carry the symbolic dim, so shape
    inference gives every value its symbolic type and the dynamic-shape lowering does the rest.
    """
    from ..ir import Graph

    twin = Graph(f"{name}_generic")
    twin.declare_dim(_GENERIC_DIM, 1, upper)
    vmap: dict[Value, Value] = {}
    for k, v in enumerate(args):
        dims: list[Any] = list(v.shape)
        if dims[axis] == extent:
            dims[axis] = _GENERIC_DIM
        vmap[v] = twin.add_input(f"p{k}", tuple(dims), v.dtype)
    for v in inlined:
        vmap[v] = twin.add_constant(v.const_value)
    nodes: list[Node] = []
    for n in group.nodes:
        outs = twin.add_node(n.op, [vmap[v] for v in n.inputs], dict(n.attrs))
        for o, t in zip(n.outputs, outs):
            vmap[o] = t
        node = outs[0].node
        assert node is not None  # add_node's outputs are its node's
        nodes.append(node)
    for o in group.outputs:
        t = vmap[o]
        want = tuple(upper if k == axis and d == extent else d for k, d in enumerate(o.shape))
        if t.shape != want or t.dtype != o.dtype:
            raise KilnError(f"{name}: the shape-generic form of {o.type} came out as {t.type}")
    anchor = nodes[group.nodes.index(group.anchor)] if group.anchor in group.nodes else None
    twin_group = FusedGroup(nodes, [vmap[v] for v in group.inputs], [vmap[o] for o in group.outputs], anchor,
                            group.pattern)
    return _lower_group(twin_group, name, [vmap[v] for v in args], [vmap[v] for v in inlined], target)


def _check_nop_layout(group: FusedGroup) -> None:
    """An aliasing reshape of a dynamic tensor is only valid where the padded layouts agree.

    Storage is laid out for the upper-bound shape, the data in the sub-box of the actual
    shape; a reshape that moves a symbolic dim relative to static ones would need a copy.
    """
    from ..ir.sym_rules import same_padded_layout

    src, dst = group.inputs[0].type, group.outputs[0].type
    if same_padded_layout(src, dst):
        return
    raise KilnError(
        f"reshape {src} -> {dst}: with dynamic dimensions this reshape would move data in the padded "
        "layout (a symbolic dim changes position relative to static dims); not supported yet"
    )


def _moving_reshape(group: FusedGroup) -> Any:
    """The reshape node of a single-reshape kernel group of a dynamic tensor: one that moves
    data in the padded layout, or one that must copy although the layouts agree (a graph
    output reshaping a graph input); either way its reads use the runtime extents."""
    if len(group.nodes) != 1 or group.nodes[0].op != "reshape" or len(group.inputs) != 1:
        return None
    n = group.nodes[0]
    return n if n.inputs[0].type.is_dynamic or n.outputs[0].type.is_dynamic else None


def _control_func(group: FusedGroup) -> str | None:
    """The reserved function (``__if``, ``__loop``) of a control-flow group, else None."""
    from ..ir.ops.control import CONTROL_OPS

    if len(group.nodes) != 1:
        return None
    return CONTROL_OPS.get(group.nodes[0].op)


def _host_ops() -> dict[str, str]:
    """IR ops the executor runs as ``__host`` nodes (string ops)."""
    from ..ir.ops.strings import HOST_OPS

    return HOST_OPS


def _prim_kernel(group: FusedGroup, target: Any) -> Any:
    """The loop-IR kernel of a single-op group whose op has one for ``target`` (else None: the
    group is lowered from the op's compute, as any group)."""
    from .. import topi

    if len(group.nodes) != 1:
        return None
    return topi.get_prim_kernel(group.nodes[0].op, target)


def _lower_prim(group: FusedGroup, fn: Any, name: str, args: Sequence[Value], target: Any) -> Any:
    """A group of one op with a loop-IR kernel: buffers in, PrimFunc out.

    A data-dependent dim the kernel decides is dynamic in its output buffer too: the argument
    check then accepts whatever extent the previous run left in the DLTensor (0..upper bound);
    the kernel never reads that Var, it reports the new extent (``tir.set_extent``).
    """
    from .. import tir

    node = group.nodes[0]
    dims = _DimVars()
    bufs = [tir.Buffer(f"p{k}", v.shape, v.dtype, dyn=dims.dyn(v)) for k, v in enumerate(args)]
    outs = [tir.Buffer(f"out{k}", o.shape, o.dtype, dyn=dims.dyn(o)) for k, o in enumerate(group.outputs)]
    try:
        with _kernel_target(target):
            return fn(dict(node.attrs), bufs, outs, name, target)
    except KilnError:
        raise
    except Exception as exc:
        raise KilnError(f"{name}: loop-IR kernel of {node.op} node {node.name!r} failed: {exc}") from exc


def _check_no_strings(group: FusedGroup) -> None:
    """Refuse a kernel (or in-place concat) on string tensors: only host ops and aliases read text.

    A string entry is a host object array, not bytes of its storage: a kernel would read
    nothing and write nowhere (docs/strings.md).
    """
    from ..ir.ops.control import CONTROL_OPS
    from ..runtime.errors import UnsupportedOpError

    if len(group.nodes) == 1 and (group.nodes[0].op in _host_ops() or group.nodes[0].op in CONTROL_OPS):
        return
    for n in group.nodes:
        if any(v.dtype == "string" for v in list(n.inputs) + list(n.outputs)):
            raise UnsupportedOpError(
                f"{n.op} node {n.name!r} on string tensors: Kiln runs string tensors through its string "
                f"host ops and reshapes only ({', '.join(sorted(_host_ops()))}; docs/strings.md)")


def _on_cpu(target: Any) -> bool:
    from ..target import Target

    return (target if isinstance(target, Target) else Target(target)).kind.device_type == 1


def _kernel_target(target: Any) -> Any:
    from .. import topi

    return topi.knobs.kernel_target(target)


def _lower_group(group: FusedGroup, name: str, args: Sequence[Value], inlined: Sequence[Value],
                 target: Any) -> Any:
    from .. import te, tir, topi

    env: dict[Value, Any] = {}
    placeholders = []
    dims = _DimVars()
    for k, v in enumerate(args):
        t = te.placeholder(v.shape, v.dtype, name=f"p{k}", dyn=dims.dyn(v))
        env[v] = t
        placeholders.append(t)
    for k, v in enumerate(inlined):
        env[v] = _const_tensor(v, f"c{k}")
    moving = _moving_reshape(group)
    if moving is not None:
        # the one op of its group (fuse keeps it alone): index arithmetic on runtime extents
        x, o = placeholders[0], group.outputs[0]
        odyn = dims.dyn(o) or (None,) * len(o.shape)
        in_ext = [d if d is not None else s for d, s in zip(x.dyn or (None,) * len(x.shape), x.shape)]
        out_ext = [d if d is not None else s for d, s in zip(odyn, o.shape)]
        t = te.set_dyn(topi.transform.reshape_padded(x, o.shape, in_ext, out_ext), odyn)
        sched = topi.schedule_group("reshape", group.pattern, [t], target)
        return tir.lower(sched, placeholders + [t], name=name)
    for n in group.nodes:
        fcompute = topi.get_compute(n.op)
        try:
            # computes that choose a data layout (dense's packed panels) size it for this target;
            # a resize to runtime sizes reads its output's runtime extents
            with topi.knobs.kernel_target(target), topi.knobs.kernel_dims(dims.var):
                outs = fcompute(n.attrs, [env[v] for v in n.inputs], [o.type for o in n.outputs])
        except Exception as exc:
            raise KilnError(f"{name}: compute of {n.op} node {n.name!r} failed: {exc}") from exc
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        if len(outs) != len(n.outputs):
            raise KilnError(f"{name}: compute of {n.op} returned {len(outs)} tensors for "
                            f"{len(n.outputs)} outputs")
        for o, t in zip(n.outputs, outs):
            if tuple(t.shape) != tuple(o.shape) or t.dtype != o.dtype:
                raise KilnError(f"{name}: compute of {n.op} gave {tuple(t.shape)} {t.dtype}, "
                                f"IR says {o.type}")
            dyn = dims.dyn(o)
            if dyn is not None and isinstance(t.op, te.ComputeOp):
                # the IR's symbolic shape is the truth; later computes of the group read it
                # (e.g. softmax picks its unblocked form over a dynamic row)
                te.set_dyn(t, dyn)
            env[o] = t
    outs = []
    for o in group.outputs:
        t = env[o]
        # A kernel must write its outputs: an output that is just an input (e.g. a cast to
        # the same dtype) gets a copy stage.
        if not isinstance(t.op, te.ComputeOp):
            src = t
            t = te.compute(tuple(src.shape), lambda *i, src=src: src(*i), name="copy",
                           tag="elemwise")
        dyn = dims.dyn(o)
        if dyn is not None:
            te.set_dyn(t, dyn)  # the graph's symbolic shape is authoritative for outputs
        outs.append(t)
    sched = topi.schedule_group(group.anchor.op if group.anchor else None, group.pattern, outs,
                                target)
    return tir.lower(sched, placeholders + outs, name=name)


def _shape_generic_groups(fused: FusedGraph, skip: set[int], inline_limit: int,
                          target: Any) -> dict[int, tuple[int, int, tuple, int]]:
    """Groups to lower as shape-generic kernels: ``index -> (axis, extent, key, upper bound)``.

    Only groups whose key (the axis's extent left out) is shared by groups of at least two
    different extents: a kernel nobody else would call stays specialised to its shape.
    """
    if fused.graph.dim_ranges:
        return {}
    found: dict[int, tuple[int, int, tuple]] = {}
    extents: dict[tuple, set[int]] = {}
    for gi, g in enumerate(fused.groups):
        if gi in skip or g.is_nop or _control_func(g) is not None or _prim_kernel(g, target) is not None:
            continue
        inlined = [v for v in g.inputs if is_inlinable_constant(v, inline_limit)]
        ga = _generic_axis(g, inlined)
        if ga is None:
            continue
        ax, ext = ga

        def shape_of(v: Value, ax: int = ax, ext: int = ext) -> tuple[int, ...]:
            return tuple(-1 if k == ax and d == ext else d for k, d in enumerate(v.shape))

        key = (ax, group_key(g, [v for v in g.inputs if v not in inlined], inlined, shape_of))
        found[gi] = (ax, ext, key)
        extents.setdefault(key, set()).add(ext)
    return {gi: (ax, ext, key, max(extents[key])) for gi, (ax, ext, key) in found.items() if len(extents[key]) > 1}


def lower_fused_graph(fused: FusedGraph, target: Any, mod_name: str = "default",
                      inline_limit: int = INLINE_MAX_ELEMENTS,
                      on_kernel: Callable[[int, int, str], None] | None = None,
                      whole_graph: bool = True) -> LoweredModel:
    """Lower every group of ``fused`` for ``target``.

    Parameters
    ----------
    fused : FusedGraph
        From :func:`kiln.transform.fuse.fuse_ops`.
    target : Target
    mod_name : str
        Goes into the function names (``kilngen_<mod_name>_fused_...``).
    inline_limit : int
        Constants with at most this many elements are inlined.
    on_kernel : callable, optional
        ``on_kernel(i, n, func_name)`` after each group is lowered (``i`` of ``n`` groups);
        drives progress displays.
    whole_graph : bool
        ``fused`` is a whole graph (not one device's share of it, nor the few groups a tuner
        lowers), so graph-wide decisions may be made (CPU targets only): concatenations
        written in place where :mod:`kiln.transform.inplace_concat` allows it (a ``__concat``
        call, no kernel), and shape-generic kernels shared by groups that differ only in one
        extent.

    Returns
    -------
    LoweredModel
    """
    calls: list[LoweredCall] = []
    total = len(fused.groups)
    funcs: list[Any] = []
    by_key: dict[tuple, str] = {}
    used: set[str] = set()
    graph_wide = whole_graph and _on_cpu(target)
    in_place = inplace_concat_groups(fused) if graph_wide else set()
    generic = _shape_generic_groups(fused, in_place, inline_limit, target) if graph_wide else {}
    for gi, g in enumerate(fused.groups):
        if g.is_nop:
            _check_nop_layout(g)
            calls.append(LoweredCall(g, "__nop", list(g.inputs), list(g.outputs)))
            continue
        _check_no_strings(g)
        if gi in in_place:
            # its inputs are written straight into its output: nothing to run
            calls.append(LoweredCall(g, "__concat", list(g.nodes[0].inputs), list(g.outputs)))
            continue
        control = _control_func(g)
        if control is not None:
            # run by the executor, which reads its inputs by position (repeats included); the
            # driver compiles its subgraphs (kiln.driver.build)
            calls.append(LoweredCall(g, control, list(g.nodes[0].inputs), list(g.outputs)))
            continue
        if len(g.nodes) == 1 and g.nodes[0].op in _host_ops():
            # string ops: a Python function of the runtime (kiln.runtime.strings), no kernel
            calls.append(LoweredCall(g, "__host", list(g.nodes[0].inputs), list(g.outputs)))
            continue
        prim = _prim_kernel(g, target)
        # a loop-IR kernel takes every input as an argument (no compute to inline into), one per
        # input of its node: a value read twice (Compress(b, b), equal constants merged by CSE)
        # is passed twice, as the kernel unpacks its arguments by position
        inlined = [] if prim else [v for v in g.inputs if is_inlinable_constant(v, inline_limit)]
        args = list(g.nodes[0].inputs) if prim else [v for v in g.inputs if v not in inlined]
        gen = generic.get(gi)
        key = group_key(g, args, inlined) if gen is None else ("generic", gen[2], gen[3])
        name = by_key.get(key)
        if name is None:
            base = _func_name(mod_name, g)
            name, k = base, 0
            while name in used:
                k += 1
                name = f"{base}_{k}"
            used.add(name)
            by_key[key] = name
            if prim is not None:
                funcs.append(_lower_prim(g, prim, name, args, target))
            elif gen is not None:
                funcs.append(_lower_generic(g, name, args, inlined, gen[0], gen[1], gen[3], target))
            else:
                funcs.append(_lower_group(g, name, args, inlined, target))
        calls.append(LoweredCall(g, name, args, list(g.outputs), key))
        if on_kernel is not None:
            on_kernel(gi + 1, total, name)
    return LoweredModel(fused, calls, funcs)
