"""Converters for ONNX control flow: ``Loop``, ``Scan`` and ``If``.

Two paths. **Known at import** (the fast path): a ``Loop`` whose iteration count is known when
the model is imported (a constant, or an input frozen by the caller / the ONNX backend) becomes
one copy of its body per iteration, with the loop-carried values threaded through and the scan
outputs concatenated; when every input of the loop is constant the copies fold away at import
(as in the function body of ``Range``). A ``Scan`` whose length (the scan axis of its inputs) is
static and at most :data:`MAX_UNROLL` is unrolled the same way. An ``If`` whose condition is
known at import is replaced by the chosen branch.

**Decided at run time**: an ``If`` whose condition, or a ``Loop`` whose trip count or condition,
is computed from the model's inputs becomes an IR ``if`` / ``loop`` node
(:mod:`kiln.ir.ops.control`) holding each branch / the body as its own IR graph. The outer
values a subgraph reads become explicit inputs of the node (constants are copied into the
subgraph instead). The executor runs the subgraph natively (``docs/executor.md``). The subgraph
may read outer values with symbolic dims: its IR graph declares the enclosing graph's symbols
(same names and ranges) and the executor hands it their values at run time; each output of an
``If`` must have the same dims in both branches, and a ``Loop``-carried value the same dims at
every iteration. Refused: outer values with data-dependent dims, and symbols declared inside
the subgraph itself (a ``NonZero`` in a branch); except that an ``If`` reading data-dependent
values one of whose branches is a constant (torchvision's ``if boxes.numel() == 0`` guard around
NonMaxSuppression) is inlined, both branches, with each output chosen at run time
(:func:`_speculated_if`). A runtime ``Loop``'s scan outputs get a
data-dependent leading dim (the iteration count, a fresh symbol ``loop_<k>`` of range
``0..bound``): the bound is the trip count ``M`` when that is known at import (and affordable),
else :data:`RUNTIME_LOOP_MAX_ITERATIONS`; storage is planned for it and the executor reports the
actual count (``docs/dynamic_shapes.md``).
A runtime ``Loop`` that grows a sequence is converted by :mod:`.ops_sequence` with the same
pieces (:func:`loop_controls`, :func:`emit_loop`): each appended element is one more scan output.
A longer ``Scan``, or one over a symbolic axis, becomes such a loop too (:func:`_scan_runtime`).
"""

from __future__ import annotations

import numpy as np

import re
from typing import Any, Callable, Sequence

from ...ir import Graph, Value
from ...ir.types import TensorType, np_dtype
from ...ir.ops.control import Subgraph
from ...runtime import sym
from ...runtime.sym import Dim
from .converter import Context, convert_nodes, onnx_dtype, onnx_op, tensor_to_array
from .ops_dynamic import _fresh_dim

#: Unrolling copies the body once per iteration; beyond this many the graph would explode.
MAX_UNROLL = 1024

#: Bound of the iteration count of a runtime Loop with scan outputs whose trip count ``M`` is
#: not known at import: its scan outputs are planned for this many rows, and a run that would
#: go past it fails naming the node and the bound (as Range's ``RANGE_MAX_LENGTH``).
RUNTIME_LOOP_MAX_ITERATIONS = 4096

#: A runtime Loop whose scan outputs would need more bytes than this at their bound is refused
#: at import (the storage is planned for the bound, whatever the actual count).
RUNTIME_LOOP_MAX_SCAN_BYTES = 1 << 30


def _body_input_type(vi) -> tuple[tuple[int, ...] | None, str | None]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return None, None
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim) \
        if tt.HasField("shape") else None
    dt = onnx_dtype(tt.elem_type) if tt.elem_type else None
    return dims, dt


def _run_subgraph(ctx: Context, node, graph, consts: dict[str, Value], bindings: dict[str, Value],
                  what: str = "body") -> list[Value]:
    """Convert one copy of ``graph`` (a Loop/Scan body, an If branch) inline; its outputs.

    Outer-scope names stay visible; the graph's initializers (``consts``, converted once by the
    caller) and ``bindings`` (its inputs) shadow them.
    """
    env = dict(ctx.env)
    env.update(consts)
    env.update(bindings)
    saved_env = ctx.env
    ctx.env = env
    try:
        convert_nodes(ctx, graph.node, env, {}, name_values=False)
    finally:
        ctx.env = saved_env
        ctx.node = node
    outs = []
    for vo in graph.output:
        if vo.name not in env:
            raise ctx.bad(f"{what} output {vo.name!r} is not computed by the {what}")
        outs.append(env[vo.name])
    return outs


@onnx_op("Loop")
def _loop(ctx: Context, node, ins, attrs):
    body = attrs["body"].g
    m_v = ins[0] if len(ins) > 0 else None
    cond_v = ins[1] if len(ins) > 1 else None
    carried = list(ins[2:])
    n_carried = len(carried)
    if len(body.input) != 2 + n_carried:
        raise ctx.bad(f"body takes {len(body.input)} inputs, expected 2 + {n_carried} "
                      f"(iteration number, condition, loop-carried values)")
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0:
        raise ctx.bad(f"body has {len(body.output)} outputs, expected at least 1 + {n_carried}")
    if any(v is None for v in carried):
        raise ctx.bad("loop-carried initial values may not be omitted")
    if m_v is None and cond_v is None:
        raise ctx.unsupported("a Loop without trip count or condition runs forever")
    trip = None
    if m_v is not None:
        arr = ctx.try_static(m_v)
        if arr is None:
            return _runtime_loop(ctx, node, body, m_v, cond_v, carried, n_scan, "its trip count M")
        trip = int(np.asarray(arr).reshape(()))
    cond = True
    if cond_v is not None:
        arr = ctx.try_static(cond_v)
        if arr is None:
            return _runtime_loop(ctx, node, body, m_v, cond_v, carried, n_scan, "its condition", trip)
        cond = bool(np.asarray(arr).reshape(()))
    static_trip = trip  # None: no trip count, only the condition bounds the loop
    if trip is None:
        trip = MAX_UNROLL + 1  # bounded by the condition, which must turn false in time
    initial = list(carried)
    body_consts = {t.name: ctx.const(tensor_to_array(t)) for t in body.initializer}
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    it = 0
    while cond and it < trip:
        if it >= MAX_UNROLL:
            # the copies made so far are dead code (pruned at the end of the import)
            return _runtime_loop(ctx, node, body, m_v, cond_v, initial, n_scan,
                                 f"it runs more than {MAX_UNROLL} iterations", static_trip)
        bindings = {body.input[0].name: ctx.const(np.array(it, dtype=np.int64)),
                    body.input[1].name: ctx.const(np.array(cond))}
        bindings.update({vi.name: v for vi, v in zip(body.input[2:], carried)})
        outs = _run_subgraph(ctx, node, body, body_consts, bindings)
        c = ctx.try_static(outs[0])
        if c is None:
            return _runtime_loop(ctx, node, body, m_v, cond_v, initial, n_scan,
                                 "the body's continue condition", static_trip)
        cond = bool(np.asarray(c).reshape(()))
        for k, v in enumerate(outs[1: 1 + n_carried]):
            if v.shape != carried[k].shape or v.dtype != carried[k].dtype:
                raise ctx.unsupported(f"loop-carried value {k} changes type across iterations "
                                      f"({carried[k].type} -> {v.type})")
            carried[k] = v
        for k, v in enumerate(outs[1 + n_carried:]):
            scans[k].append(v)
        it += 1
    results: list[Value] = list(carried)
    for k, vals in enumerate(scans):
        if not vals:
            shape, dt = _body_input_type(body.output[1 + n_carried + k])
            if shape is None or dt is None or any(d < 0 for d in shape):
                raise ctx.unsupported(f"scan output {k} of a zero-iteration Loop has no static "
                                      f"type in the body")
            results.append(ctx.const(np.zeros((0,) + shape, dtype=np.dtype(dt))))
            continue
        rows = [ctx.reshape(v, (1,) + v.shape) for v in vals]
        results.append(rows[0] if len(rows) == 1 else ctx.emit1("concatenate", *rows, axis=0))
    # A loop output that is one of the inputs unchanged (zero iterations) must still be a
    # distinct value of this node.
    return [ctx.emit1("identity", v) if v in ins else v for v in results]


@onnx_op("If")
def _if(ctx: Context, node, ins, attrs):
    """``If``: inlined when the condition is known at import, else an IR ``if`` node.

    Exporters emit Ifs on shapes and attributes (AffineGrid's function body, torch's dimension
    checks): those conditions are known at import and the chosen branch is inlined. A condition
    computed from the model's inputs at run time gives an ``if`` node holding both branches as
    IR graphs (:func:`_runtime_if`).
    """
    if not ins or ins[0] is None:
        raise ctx.bad("the condition input is missing")
    arr = ctx.try_static(ins[0])
    if arr is None:
        then_b, else_b = attrs["then_branch"].g, attrs["else_branch"].g
        # values with data-dependent dims cannot cross into a nested graph (check_outer_dims);
        # a guard (one branch a constant) is still convertible by running the other branch
        # unconditionally
        if _reads_data_dependent(ctx, [then_b, else_b]) and (_is_guard(ctx, then_b) or _is_guard(ctx, else_b)):
            return _speculated_if(ctx, node, ins[0], then_b, else_b)
        return _runtime_if(ctx, node, ins[0], then_b, else_b)
    flat = np.asarray(arr).reshape(-1)
    if flat.size != 1:
        raise ctx.bad(f"the condition must hold one element, it has {flat.size}")
    branch = attrs["then_branch" if bool(flat[0]) else "else_branch"].g
    if len(branch.output) != len(node.output):
        raise ctx.bad(f"the chosen branch has {len(branch.output)} outputs, the node {len(node.output)}")
    outer = set(ctx.env.values())
    outs = _run_subgraph(ctx, node, branch, {t.name: ctx.const(tensor_to_array(t)) for t in branch.initializer},
                         {}, what="branch")
    # an output that is an outer value unchanged must still be a distinct value of this node
    return [ctx.emit1("identity", v) if v in ins or v in outer else v for v in outs]


@onnx_op("Scan")
def _scan(ctx: Context, node, ins, attrs):
    """``Scan``: unrolled when its length (the scan axis of its inputs) is static and at most
    :data:`MAX_UNROLL`, else a runtime loop (:func:`_scan_runtime`).

    Unrolled, each iteration takes slice ``t`` of every scan input (``take`` along its axis,
    reversed for direction 1), runs one copy of the body with the state values threaded through,
    and the per-iteration scan outputs are stacked along their axes (prepended for direction 1).
    Opset 8's batched form (axis 0 is the batch, then the sequence) is converted per batch entry;
    its ``sequence_lens`` must be absent or the full (static) length.
    """
    body = attrs["body"].g
    m = int(attrs["num_scan_inputs"])
    if ctx.opset < 9:
        seq_lens, ins = (ins[0] if ins else None), list(ins[1:])
    n = len(ins) - m
    if m < 1 or n < 0:
        raise ctx.bad(f"num_scan_inputs={m} with {len(ins)} inputs")
    if any(v is None for v in ins):
        raise ctx.bad("Scan inputs may not be omitted")
    k = len(body.output) - n
    if len(body.input) != n + m or k < 0:
        raise ctx.bad(f"body takes {len(body.input)} inputs and gives {len(body.output)} outputs; "
                      f"expected {n} + {m} inputs and at least {n} outputs")
    if ctx.opset >= 9:
        in_axes = [ctx.axis(a, len(v.shape), "scan_input_axes")
                   for a, v in zip(attrs.get("scan_input_axes", [0] * m), ins[n:])]
        in_dirs = list(attrs.get("scan_input_directions", [0] * m))
        out_axes = list(attrs.get("scan_output_axes", [0] * k))
        out_dirs = list(attrs.get("scan_output_directions", [0] * k))
        if len(in_axes) != m or len(in_dirs) != m or len(out_axes) != k or len(out_dirs) != k:
            raise ctx.bad("scan_input_axes/directions and scan_output_axes/directions need one entry "
                          "per scan input / output")
        return _scan_any(ctx, node, body, list(ins[:n]), list(ins[n:]), in_axes, in_dirs, out_axes, out_dirs)
    # opset 8: [batch, ...] states, [batch, seq, ...] scan inputs; one scan per batch entry
    dirs = list(attrs.get("directions", [0] * m))
    batch = {v.shape[0] for v in ins if len(v.shape) > 0}
    if len(batch) != 1 or any(len(v.shape) < 1 for v in ins) or any(len(v.shape) < 2 for v in ins[n:]):
        raise ctx.bad("opset-8 Scan inputs need a common batch axis 0 (and a sequence axis 1 for scan inputs)")
    nb = batch.pop()
    sym_batch = [v.type.dims[0] for v in ins if isinstance(v.type.dims[0], str)]
    if sym_batch:
        raise ctx.unsupported(f"opset-8 Scan over a symbolic batch axis {sym_batch[0]}: Kiln converts one scan "
                              "per batch entry, so the batch must be static")
    if seq_lens is not None:
        lens = ctx.try_static(seq_lens)
        full = {v.type.dims[1] for v in ins[n:]}
        if any(isinstance(d, str) for d in full):
            raise ctx.unsupported(f"sequence_lens with a symbolic sequence axis {sorted(map(str, full))}: Kiln "
                                  "cannot check at import that it is the full length; omit it")
        if lens is None or len(full) != 1 or not bool(np.all(np.asarray(lens) == full.pop())):
            raise ctx.unsupported("sequence_lens shorter than the scan inputs (ragged batches) are not converted")
    per_batch = []
    for b in range(nb):
        idx = ctx.const(np.array(b, dtype=np.int64))
        sl = [ctx.emit1("take", v, idx, axis=0) for v in ins]
        per_batch.append(_scan_any(ctx, node, body, sl[:n], sl[n:], [0] * m, dirs, [0] * k, [0] * k))
    return [ctx.emit1("concatenate", *[ctx.reshape(r[j], (1,) + r[j].shape) for r in per_batch], axis=0)
            if nb > 1 else ctx.reshape(per_batch[0][j], (1,) + per_batch[0][j].shape)
            for j in range(n + k)]


def _scan_any(ctx: Context, node, body, states: list[Value], scan_ins: list[Value], in_axes: list[int],
              in_dirs: list[int], out_axes: list[int], out_dirs: list[int]) -> list[Value]:
    """One Scan over ``scan_ins``: unrolled when its length is static and at most
    :data:`MAX_UNROLL` (the faster code), else a runtime loop (:func:`_scan_runtime`)."""
    lengths = {v.type.dims[a] for v, a in zip(scan_ins, in_axes)}
    if len(lengths) != 1:
        raise ctx.bad(f"scan inputs have different lengths along their scan axes: {sorted(map(str, lengths))}")
    length = lengths.pop()
    if isinstance(length, str) or length > MAX_UNROLL:
        return _scan_runtime(ctx, node, body, states, scan_ins, in_axes, in_dirs, out_axes, out_dirs, length)
    return _scan_unrolled(ctx, node, body, states, scan_ins, in_axes, in_dirs, out_axes, out_dirs, length)


def _scan_unrolled(ctx: Context, node, body, states: list[Value], scan_ins: list[Value], in_axes: list[int],
                   in_dirs: list[int], out_axes: list[int], out_dirs: list[int], steps: int) -> list[Value]:
    n, k = len(states), len(out_axes)
    ins = states + scan_ins
    body_consts = {t.name: ctx.const(tensor_to_array(t)) for t in body.initializer}
    scans: list[list[Value]] = [[] for _ in range(k)]
    for t in range(steps):
        bindings = {vi.name: v for vi, v in zip(body.input[:n], states)}
        for vi, v, a, d in zip(body.input[n:], scan_ins, in_axes, in_dirs):
            idx = ctx.const(np.array(steps - 1 - t if d else t, dtype=np.int64))
            bindings[vi.name] = ctx.emit1("take", v, idx, axis=a)
        outs = _run_subgraph(ctx, node, body, body_consts, bindings)
        for j, v in enumerate(outs[:n]):
            if v.shape != states[j].shape or v.dtype != states[j].dtype:
                raise ctx.unsupported(f"state {j} changes type across iterations ({states[j].type} -> {v.type})")
            states[j] = v
        for j, v in enumerate(outs[n:]):
            scans[j].append(v)
    results: list[Value] = list(states)
    for j, vals in enumerate(scans):
        if not vals:
            raise ctx.unsupported(f"scan output {j} of a zero-length Scan has no static type")
        if out_dirs[j]:
            vals = vals[::-1]
        axis = ctx.axis(out_axes[j], len(vals[0].shape) + 1, "scan_output_axes")
        rows = [ctx.reshape(v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in vals]
        results.append(rows[0] if len(rows) == 1 else ctx.emit1("concatenate", *rows, axis=axis))
    return [ctx.emit1("identity", v) if v in ins else v for v in results]


# ----------------------------------------------------------------------------- runtime control flow
def _free_names(graph) -> list[str]:
    """Outer-scope names an ONNX subgraph reads (its own nested subgraphs' included), in order."""
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    out: list[str] = []

    def use(name: str) -> None:
        if name and name not in defined and name not in out:
            out.append(name)

    for n in graph.node:
        for name in n.input:
            use(name)
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                for name in _free_names(sub):
                    use(name)
        defined.update(o for o in n.output if o)
    for vo in graph.output:
        use(vo.name)
    return out


def _captures(ctx: Context, graphs, exclude: set[str]) -> list[tuple[str, Value]]:
    """The outer values ``graphs`` read: ``(ONNX name, value)``, each once, in first-use order."""
    seen: list[str] = []
    for g in graphs:
        for name in _free_names(g):
            if name not in exclude and name not in seen and name in ctx.env:
                seen.append(name)
    out = []
    for name in seen:
        v = ctx.env[name]
        if not isinstance(v, Value):
            # a sequence / optional: subgraphs run at run time take tensors only
            raise ctx.unsupported(f"a subgraph run at run time (a runtime If / Loop) reads the sequence / "
                                  f"optional {name!r} of the outer graph; Kiln passes only tensors into such "
                                  "subgraphs (with the condition / trip count known at compile time, freeze it, "
                                  "the subgraph is inlined instead)")
        if v in ctx.sym_values:
            v = ctx.materialize(v, "it is read inside a subgraph run at run time")
        check_outer_dims(ctx, v, f"reads {name!r}")
        out.append((name, v))
    return out


def check_outer_dims(ctx: Context, v: Value, what: str) -> None:
    """Refuse a value passed into a runtime If / Loop subgraph whose dims are data dependent.

    The subgraph gets the enclosing graph's symbols from its executor at run time, but a
    data-dependent symbol (NonZero's count, a runtime Loop's iteration count) is declared with
    a range that may start at 0 and is decided by a kernel of the enclosing graph; nested graphs
    take input-bound symbols only.
    """
    data = sorted(sym.dims_symbols(v.type.dims) & set(ctx.graph.data_dims))
    if data:
        raise ctx.unsupported(f"runtime control flow passes values of static shapes only, or with symbolic dims "
                              f"given by the model's inputs, into a subgraph; the subgraph {what} of dims "
                              f"{v.type.dims}, whose dimension(s) {data} are data dependent (decided by a kernel "
                              "while the model runs)")


def _subgraph_name(node, label: str) -> str:
    base = re.sub(r"[^0-9A-Za-z_]", "_", node.name or node.op_type.lower())
    return f"{base}_{label}"


def _convert_subgraph(ctx: Context, node, graph, label: str, leading: Sequence[tuple[str, TensorType]],
                      captures: list[tuple[str, Value]],
                      outputs: Callable[[Graph, list[Any]], list[Value]] | None = None,
                      bindings: dict[str, Any] | None = None) -> Graph:
    """``graph`` (an If branch, a Loop body) as an IR graph of its own.

    Its inputs: ``leading`` (the ONNX graph's own inputs, ``(name, TensorType)``), then one per
    non-constant capture; constant captures are copied into it. ``bindings`` gives ONNX names
    import-time objects that are not IR inputs (the appended sequences of a runtime Loop,
    :mod:`.ops_sequence`). ``outputs(sub, values)``, when given, turns the ONNX graph's output
    values into the IR graph's outputs (it runs while the subgraph is the one being built). The
    outer conversion state is restored afterwards, whatever happens.
    """
    sub = Graph(_subgraph_name(node, label))
    # the enclosing graph's symbols, same names and ranges: the executor passes their values in
    sub.copy_dims(ctx.graph)
    outer_dims = set(sub.dim_ranges)
    env: dict[str, Any] = dict(bindings or {})
    for k, (name, t) in enumerate(leading):
        env[name] = sub.add_input(f"x{k}", t.dims, t.dtype)
    for name, v in captures:
        if not v.is_constant:
            env[name] = sub.add_input(f"x{len(sub.inputs)}", v.type.dims, v.dtype)
    saved = ctx.graph, ctx.env
    ctx.graph, ctx.env = sub, env
    depth = getattr(ctx, "subgraph_depth", 0)
    ctx.subgraph_depth = depth + 1  # type: ignore[attr-defined]  # read by _runtime_loop
    try:
        for name, v in captures:
            if v.is_constant:
                env[name] = ctx.const(v.const_value)
        env.update({t.name: ctx.const(tensor_to_array(t)) for t in graph.initializer})
        convert_nodes(ctx, graph.node, env, {}, name_values=True)
        outs = []
        for vo in graph.output:
            if vo.name not in env:
                raise ctx.bad(f"{label} output {vo.name!r} is not computed by the {label}")
            outs.append(env[vo.name])
        sub.outputs = outs if outputs is None else outputs(sub, outs)
    finally:
        ctx.graph, ctx.env = saved
        ctx.subgraph_depth = depth  # type: ignore[attr-defined]
        ctx.node = node
    inner = sorted(set(sub.dim_ranges) - outer_dims)
    if inner:
        # its value would be decided inside the nested executor, which the node's output types
        # (planned by the enclosing graph) cannot follow; refused rather than half supported
        raise ctx.unsupported(f"the {label} subgraph declares dimension(s) {inner} of its own (a data-dependent "
                              "op such as NonZero, or a Range with run-time bounds, inside it); a subgraph run at "
                              "run time may only use the symbolic dims of the enclosing graph")
    return sub


def _runtime_if(ctx: Context, node, cond: Value, then_b, else_b) -> list[Value]:
    """An ``if`` node running one of two IR graphs by ``cond`` at run time."""
    if cond.type.size != 1:
        raise ctx.bad(f"the condition must hold one element, it has {cond.type.size}")
    if cond.dtype != "bool":
        cond = ctx.cast(cond, "bool")
    for b, what in ((then_b, "then_branch"), (else_b, "else_branch")):
        if len(b.output) != len(node.output):
            raise ctx.bad(f"{what} has {len(b.output)} outputs, the node {len(node.output)}")
    captures = _captures(ctx, [then_b, else_b], set())
    then_g = _convert_subgraph(ctx, node, then_b, "then", [], captures)
    else_g = _convert_subgraph(ctx, node, else_b, "else", [], captures)
    for k, (a, b) in enumerate(zip(then_g.outputs, else_g.outputs)):
        if a.type != b.type:
            # types compare their canonical symbolic dims: "2*seq" and "seq*2" are the same dim
            name = node.output[k] if k < len(node.output) else str(k)
            raise ctx.unsupported(f"output {k} ({name!r}) is {a.type} in then_branch but {b.type} in else_branch; "
                                  "a runtime If needs the same dtype and the same (symbolic) shape in both branches")
    ins = [cond] + [v for _, v in captures if not v.is_constant]
    return ctx.emit("if", ins, {"then_branch": Subgraph(then_g), "else_branch": Subgraph(else_g)})


def _reads_data_dependent(ctx: Context, graphs) -> bool:
    """Whether the subgraphs read an outer value with a data-dependent dim."""
    data = set(ctx.graph.data_dims)
    for g in graphs:
        for name in _free_names(g):
            v = ctx.env.get(name)
            if isinstance(v, Value) and sym.dims_symbols(v.type.dims) & data:
                return True
    return False


def _is_guard(ctx: Context, graph) -> bool:
    """Whether an If branch reads nothing computed at run time (its outputs are import-time
    constants: the ``return torch.empty(0)`` of a ``numel() == 0`` guard)."""
    if any(a.HasField("g") or len(a.graphs) for n in graph.node for a in n.attribute):
        return False
    for name in _free_names(graph):
        v = ctx.env.get(name)
        if not (isinstance(v, Value) and v.is_constant):
            return False
    return True


def _speculated_if(ctx: Context, node, cond: Value, then_b, else_b) -> list[Value]:
    """A runtime ``If`` with data-dependent dims, one of whose branches is a guard
    (:func:`_is_guard`): both branches are inlined, and each output is chosen at run time.

    torchvision's ``batched_nms`` is ``if boxes.numel() == 0: return empty else: nms(...)`` over
    the data-dependent candidates of a detection head. The IR ``if`` node cannot take those
    (nested graphs take input-bound symbols only: :func:`check_outer_dims`), but the guard
    branch costs nothing, so the other branch runs unconditionally and its result is kept only
    when ``cond`` selects it. That branch therefore also runs on the inputs the guard excludes
    (empty candidates, for which every Kiln kernel computes an empty result); a kernel of it
    that fails at run time on such an input fails the model. Used only for Ifs that read
    data-dependent values; an If whose branch merely declares a data-dependent dim of its own
    stays refused.

    An output with the same dims in both branches is a ``where``; one whose leading dim differs
    (the empty constant against NonMaxSuppression's count) is the rows of the chosen branch,
    ``compress`` by the broadcast condition (or its negation) concatenated along axis 0, a fresh
    data-dependent dim.
    """
    if cond.type.size != 1:
        raise ctx.bad(f"the condition must hold one element, it has {cond.type.size}")
    for b, what in ((then_b, "then_branch"), (else_b, "else_branch")):
        if len(b.output) != len(node.output):
            raise ctx.bad(f"{what} has {len(b.output)} outputs, the node {len(node.output)}")
    if cond in ctx.sym_values:
        cond = ctx.materialize(cond, "it is the condition of a runtime If")
    cond = ctx.reshape(ctx.cast(cond, "bool"), ())
    branches = [_run_subgraph(ctx, node, b, {t.name: ctx.const(tensor_to_array(t)) for t in b.initializer}, {},
                              what="branch") for b in (then_b, else_b)]
    not_cond = ctx.emit1("logical_not", cond)
    outs = []
    for k, (a, b) in enumerate(zip(*branches)):
        name = node.output[k] if k < len(node.output) else str(k)
        if not (isinstance(a, Value) and isinstance(b, Value)) or a.dtype != b.dtype:
            raise ctx.unsupported(f"output {k} ({name!r}) is {a} in then_branch but {b} in else_branch; a runtime "
                                  "If over data-dependent dims chooses between two tensors of one dtype")
        da, db = ctx.dims(a), ctx.dims(b)
        if da == db:
            outs.append(ctx.emit1("where", cond, a, b))
            continue
        if len(da) != len(db) or not da or da[1:] != db[1:]:
            raise ctx.unsupported(f"output {k} ({name!r}) is {a.type} in then_branch but {b.type} in else_branch; "
                                  "a runtime If over data-dependent dims needs the same dims in both branches, "
                                  "or dims that differ in the leading one only")
        rows = [_rows_if(ctx, v, c) for v, c in ((a, cond), (b, not_cond)) if v.shape[0] > 0]
        if not rows:  # both empty: the leading dims are 0 in both branches
            outs.append(ctx.emit1("identity", a))
        else:
            outs.append(rows[0] if len(rows) == 1 else ctx.emit1("concatenate", *rows, axis=0))
    return outs


def _rows_if(ctx: Context, v: Value, cond: Value) -> Value:
    """All rows (axis 0) of ``v`` when the scalar ``cond`` holds, none otherwise: a ``compress``
    whose condition is ``cond`` broadcast to the upper bound of the rows (the kernel stops at
    their runtime extent), so the result has a data-dependent leading dim."""
    mask = ctx.emit1("broadcast_to", cond, shape=(v.shape[0],))
    d = _fresh_dim(ctx, "if", v.shape[0])
    return ctx.emit("compress", [v, mask], {"axis": 0, "out_dim": d})[0]


def _runtime_loop(ctx: Context, node, body, m_v: Value | None, cond_v: Value | None,
                  carried: list[Value], n_scan: int, why: str, trip: int | None = None) -> list[Value]:
    """A ``loop`` node: the body runs at run time while ``i < M`` and the condition holds.

    ``trip`` is ``M`` when it is known at import (the bound of the scan outputs' length).
    """
    check_scan_nesting(ctx, n_scan, why)
    if not carried and not n_scan:
        raise ctx.unsupported("a runtime Loop without loop-carried values or scan outputs computes nothing "
                              "Kiln can return")
    m_v, cond_v = loop_controls(ctx, m_v, cond_v)
    for k, v in enumerate(carried):
        check_outer_dims(ctx, v, f"carries loop-carried value {k} ({body.input[2 + k].name!r})")
    leading = [(body.input[0].name, TensorType((), "int64")), (body.input[1].name, TensorType((), "bool"))]
    leading += [(vi.name, v.type) for vi, v in zip(body.input[2:], carried)]
    captures = _captures(ctx, [body], {name for name, _ in leading})
    body_g = _convert_subgraph(ctx, node, body, "body", leading, captures)
    return emit_loop(ctx, node, body_g, m_v, cond_v, carried, captures, n_scan, why, trip)


def _scan_runtime(ctx: Context, node, body, states: list[Value], scan_ins: list[Value], in_axes: list[int],
                  in_dirs: list[int], out_axes: list[int], out_dirs: list[int], length: Dim) -> list[Value]:
    """A Scan too long to unroll, or over a symbolic axis, as a runtime ``loop`` node.

    The trip count is ``length`` (a symbolic one computed at run time by ``dim_value``); the
    states are the loop-carried values. A scan input is a captured value read whole, and row ``i``
    is taken inside the body at the iteration number (``length - 1 - i`` for direction 1). Over a
    symbolic axis the body reads instead a copy of the input at the axis's upper bound whose rows
    are already in scan order (the rows past the actual length repeat an edge row and are never
    read). The loop stacks the scan outputs along a fresh data-dependent dim: a ``take`` of its
    rows ``0 .. length - 1`` (reversed for direction 1) turns them back into a value of dim
    ``length``, the take checking at run time that the loop wrote that many rows, and a
    ``transpose`` moves the axis to ``scan_output_axes``.
    """
    import onnx

    hp, i64 = onnx.helper, onnx.TensorProto.INT64
    n, k = len(states), len(out_axes)
    why = (f"its length {length} is only known at run time" if isinstance(length, str)
           else f"it runs {length} iterations, more than the {MAX_UNROLL} Kiln unrolls")
    if k and getattr(ctx, "subgraph_depth", 0):
        raise ctx.unsupported(f"the Scan is run as a loop at run time ({why}) and has {k} scan output(s) inside a "
                              "runtime If / Loop subgraph, which may not declare data-dependent dims of its own; "
                              f"only a Scan of at most {MAX_UNROLL} static steps (unrolled) or without scan outputs "
                              "is supported there")
    for j, v in enumerate(states):
        if v.type.is_dynamic:
            raise ctx.unsupported(f"state {j} has dims {v.type.dims}; a Scan run as a loop at run time ({why}) "
                                  "needs statically shaped states")
    for j, (v, a) in enumerate(zip(scan_ins, in_axes)):
        if any(isinstance(d, str) for i, d in enumerate(v.type.dims) if i != a):
            raise ctx.unsupported(f"scan input {j} has dims {v.type.dims}; a Scan run as a loop at run time "
                                  f"({why}) allows a symbolic dim on the scan axis {a} only")
    if isinstance(length, str):
        lo, hi = sym.bounds(length, ctx.graph.dim_ranges)
        if lo < 1:
            # the body reads a copy of each scan input made by a take, which cannot read a row
            # of an empty axis
            raise ctx.unsupported(f"the Scan runs over {length}, which may be 0 (range {lo}..{hi}); a Scan run as "
                                  "a loop at run time needs a scan length of at least 1")
        trip = ctx.materialize(ctx.shape_value(np.array(length, dtype=object), "int64"), why)
        last = ctx.emit1("subtract", trip, ctx.const(np.array(1, np.int64)))
        # 0 .. length - 1 as an int64 value of dim ``length`` (as Range over a symbolic limit)
        one = ctx.const(np.ones((1,), np.int64))
        seq_ramp = ctx.emit1("cumsum", ctx.emit1("broadcast_to", one, shape=(hi,), sym_shape=(length,)),
                             axis=0, exclusive=True)
    else:
        hi = length
        trip = ctx.const(np.array(length, np.int64))
        last = ctx.const(np.array(length - 1, np.int64))
    # ONNX names private to this node: the wrapped body's iteration number, condition, and the
    # outer values holding the scan inputs (visible to the body through ctx.env while it converts)
    tag = f"__kiln_scan{getattr(ctx, 'subgraph_depth', 0)}_"  # a Scan nested in this body is one deeper
    it_name, cond_name = tag + "i", tag + "cond"
    outer: dict[str, Value] = {}
    pre: list[Any] = []
    inits: list[Any] = []
    for j, (vi, v, a, d) in enumerate(zip(body.input[n:], scan_ins, in_axes, in_dirs)):
        idx = it_name
        if isinstance(length, str):
            ramp = ctx.const(np.arange(hi, dtype=np.int64))
            rows = ctx.emit1("maximum", ctx.emit1("subtract", last, ramp), ctx.const(np.array(0, np.int64))) \
                if d else ctx.emit1("minimum", ramp, last)
            v = ctx.emit1("take", v, rows, axis=a)
        elif d:
            idx = f"{tag}row{j}"
            if not inits:
                inits.append(hp.make_tensor(tag + "last", i64, [], [length - 1]))
            pre.append(hp.make_node("Sub", [tag + "last", it_name], [idx], name=node.name))
        outer[f"{tag}in{j}"] = v
        pre.append(hp.make_node("Gather", [f"{tag}in{j}", idx], [vi.name], axis=a, name=node.name))
    wrapped = hp.make_graph(
        pre + list(body.node) + [hp.make_node("Identity", [cond_name], [tag + "cond_out"], name=node.name)],
        body.name or "scan_body",
        [hp.make_tensor_value_info(it_name, i64, []), hp.make_tensor_value_info(cond_name, onnx.TensorProto.BOOL, [])]
        + list(body.input[:n]),
        [hp.make_tensor_value_info(tag + "cond_out", onnx.TensorProto.BOOL, [])] + list(body.output),
        list(body.initializer) + inits)
    ctx.env.update(outer)
    try:
        outs = _runtime_loop(ctx, node, wrapped, trip, None, list(states), k, why, hi)
    finally:
        for name in outer:
            ctx.env.pop(name, None)
    if k and outs[n].shape[0] < hi:
        # the loop's storage fell back to a smaller bound: a run would fail past it
        row = sum(v.type.size // max(1, v.shape[0]) * np.dtype(np_dtype(v.dtype)).itemsize for v in outs[n:])
        raise ctx.unsupported(f"the Scan is run as a loop at run time ({why}); its scan outputs would need {hi} "
                              f"rows of {row} bytes, more than RUNTIME_LOOP_MAX_SCAN_BYTES = "
                              f"{RUNTIME_LOOP_MAX_SCAN_BYTES} (kiln.frontend.onnx.ops_control)")
    if isinstance(length, str):
        ramp, back = seq_ramp, ctx.emit1("subtract", last, seq_ramp)
    else:
        ramp = ctx.const(np.arange(length, dtype=np.int64))
        back = ctx.const(np.arange(length - 1, -1, -1, dtype=np.int64))
    results = list(outs[:n])
    for j, v in enumerate(outs[n:]):
        y = ctx.emit1("take", v, back if out_dirs[j] else ramp, axis=0)
        axis = ctx.axis(out_axes[j], y.type.ndim, "scan_output_axes")
        if axis:
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, y.type.ndim))
            y = ctx.emit1("transpose", y, axes=perm)
        results.append(y)
    return results


def check_scan_nesting(ctx: Context, n_scan: int, why: str) -> None:
    """Refuse a runtime loop with scan outputs inside a runtime If / Loop subgraph."""
    if n_scan and getattr(ctx, "subgraph_depth", 0):
        raise ctx.unsupported(f"the Loop is decided at run time ({why}) and has {n_scan} scan output(s), whose "
                              "length is only known at run time, inside a runtime If / Loop subgraph; a nested "
                              "subgraph has static shapes or the enclosing graph's symbolic dims only, no "
                              "data-dependent dims of its own (a runtime Loop with scan outputs is supported in "
                              "the main graph only)")


def loop_controls(ctx: Context, m_v: Value | None, cond_v: Value | None) -> tuple[Value, Value]:
    """The ``loop`` node's trip count (int64 scalar) and condition (bool scalar); an omitted one
    never stops the loop."""
    if m_v is None:
        m_v = ctx.const(np.array(np.iinfo(np.int64).max, dtype=np.int64))
    if cond_v is None:
        cond_v = ctx.const(np.array(True))
    for v, what in ((m_v, "trip count M"), (cond_v, "condition")):
        if v.type.size != 1:
            raise ctx.bad(f"the {what} must hold one element, it has {v.type.size}")
    m_v = ctx.reshape(ctx.cast(m_v, "int64") if m_v.dtype != "int64" else m_v, ())
    cond_v = ctx.reshape(ctx.cast(cond_v, "bool") if cond_v.dtype != "bool" else cond_v, ())
    return m_v, cond_v


def emit_loop(ctx: Context, node, body_g: Graph, m_v: Value, cond_v: Value, carried: list[Value],
              captures: list[tuple[str, Value]], n_scan: int, why: str, trip: int | None) -> list[Value]:
    """The ``loop`` node running ``body_g`` (outputs: cond, ``carried``'s next values, ``n_scan``
    scan values); its outputs."""
    outs = body_g.outputs
    if outs[0].type.size != 1 or outs[0].dtype != "bool":
        raise ctx.bad(f"the body's condition output must be a one-element bool, got {outs[0].type}")
    for k, (o, v) in enumerate(zip(outs[1:], carried)):
        if o.type != v.type:
            raise ctx.unsupported(f"loop-carried value {k} changes type across iterations ({v.type} -> {o.type}); "
                                  "a runtime Loop needs the same dtype and (symbolic) shape at every iteration")
    ins = [m_v, cond_v] + list(carried) + [v for _, v in captures if not v.is_constant]
    attrs: dict[str, Any] = {"body": Subgraph(body_g), "num_carried": len(carried)}
    if n_scan:
        attrs.update(_scan_attrs(ctx, node, outs[1 + len(carried):], trip, why))
    return ctx.emit("loop", ins, attrs)


def _scan_attrs(ctx: Context, node, scans: list[Value], trip: int | None, why: str) -> dict[str, Any]:
    """``num_scan``, ``out_dim``, ``max_iterations`` of a runtime loop with scan outputs.

    The iteration count is a fresh data-dependent symbol: its bound is the trip count known at
    import, else (or when that one would need more than :data:`RUNTIME_LOOP_MAX_SCAN_BYTES`)
    :data:`RUNTIME_LOOP_MAX_ITERATIONS`.
    """
    for k, v in enumerate(scans):
        # rows are stacked in the padded layout: a symbolic dim of the enclosing graph composes,
        # one decided inside the body (refused with the body's own symbols) would not
        check_outer_dims(ctx, v, f"stacks scan output {k}")
    row = sum(v.type.size * np.dtype(np_dtype(v.dtype)).itemsize for v in scans)
    if trip is not None and max(0, trip) * row <= RUNTIME_LOOP_MAX_SCAN_BYTES:
        hi = max(0, trip)
    else:
        # no M, or one too large to plan for (exporters write INT64_MAX and let the condition
        # stop the loop): the default bound, checked at run time
        hi = RUNTIME_LOOP_MAX_ITERATIONS if trip is None else min(trip, RUNTIME_LOOP_MAX_ITERATIONS)
        if hi * row > RUNTIME_LOOP_MAX_SCAN_BYTES:
            raise ctx.unsupported(
                f"the Loop is decided at run time ({why}); its scan outputs would be planned for "
                f"RUNTIME_LOOP_MAX_ITERATIONS = {RUNTIME_LOOP_MAX_ITERATIONS} iterations of {row} bytes, more than "
                f"RUNTIME_LOOP_MAX_SCAN_BYTES = {RUNTIME_LOOP_MAX_SCAN_BYTES} (kiln.frontend.onnx.ops_control)")
    return {"num_scan": len(scans), "out_dim": _fresh_dim(ctx, "loop", hi), "max_iterations": hi}
