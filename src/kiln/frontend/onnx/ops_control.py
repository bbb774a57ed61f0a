"""Converters for ONNX control flow whose shape is known at import: ``Loop``, ``Scan`` and ``If``.

Kiln compiles static graphs. A ``Loop`` whose iteration count is known when the model is
imported (a constant, or an input frozen by the caller / the ONNX backend) becomes one copy of
its body per iteration, with the loop-carried values threaded through and the scan outputs
concatenated; when every input of the loop is constant the copies fold away at import (as in
the function body of ``Range``). Loops whose count or continue-condition is only known at run
time are rejected with an UnsupportedOpError. A ``Scan`` always has a static length (the scan
axis of its inputs), so it is unrolled the same way. An ``If`` whose condition is known at
import is replaced by the chosen branch; a runtime condition needs runtime control flow, which
Kiln does not have yet.
"""

from __future__ import annotations

import numpy as np

from ...ir import Value
from .converter import Context, convert_nodes, onnx_dtype, onnx_op, tensor_to_array

#: Unrolling copies the body once per iteration; beyond this many the graph would explode.
MAX_UNROLL = 1024


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
            raise ctx.unsupported("the trip count M must be a constant (Kiln unrolls loops at "
                                  "compile time); it is computed at run time")
        trip = int(np.asarray(arr).reshape(()))
    cond = True
    if cond_v is not None:
        arr = ctx.try_static(cond_v)
        if arr is None:
            raise ctx.unsupported("the loop condition must be a constant (Kiln unrolls loops at "
                                  "compile time); it is computed at run time")
        cond = bool(np.asarray(arr).reshape(()))
    if trip is None:
        trip = MAX_UNROLL + 1  # bounded by the condition, which must turn false in time
    body_consts = {t.name: ctx.const(tensor_to_array(t)) for t in body.initializer}
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    it = 0
    while cond and it < trip:
        if it >= MAX_UNROLL:
            raise ctx.unsupported(f"Loop runs more than {MAX_UNROLL} iterations (Kiln unrolls "
                                  f"loops at compile time)")
        bindings = {body.input[0].name: ctx.const(np.array(it, dtype=np.int64)),
                    body.input[1].name: ctx.const(np.array(cond))}
        bindings.update({vi.name: v for vi, v in zip(body.input[2:], carried)})
        outs = _run_subgraph(ctx, node, body, body_consts, bindings)
        c = ctx.try_static(outs[0])
        if c is None:
            raise ctx.unsupported("the body's continue condition must be a constant (Kiln "
                                  "unrolls loops at compile time); it is computed at run time")
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
    """``If`` whose condition is known when the model is imported: the chosen branch is inlined.

    Exporters emit such Ifs on shapes and attributes (AffineGrid's function body, torch's
    dimension checks). A condition computed from the model's inputs at run time needs runtime
    control flow, which Kiln does not have yet: that is an UnsupportedOpError naming the node.
    """
    arr = ctx.try_static(ins[0]) if ins and ins[0] is not None else None
    if arr is None:
        raise ctx.unsupported("its condition is computed from the model's inputs at run time; Kiln "
                              "compiles an If only when the condition is known at import (runtime "
                              "control flow is not supported yet)")
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
    """``Scan``, unrolled: its length is the scan axis of its inputs, static in Kiln.

    Each iteration takes slice ``t`` of every scan input (``take`` along its axis, reversed for
    direction 1), runs one copy of the body with the state values threaded through, and the
    per-iteration scan outputs are stacked along their axes (prepended for direction 1). Opset 8's
    batched form (axis 0 is the batch, then the sequence) is unrolled per batch entry too; its
    ``sequence_lens`` must be absent or the full length.
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
        return _scan_unrolled(ctx, node, body, list(ins[:n]), list(ins[n:]), in_axes, in_dirs, out_axes, out_dirs)
    # opset 8: [batch, ...] states, [batch, seq, ...] scan inputs; one unrolled scan per batch entry
    dirs = list(attrs.get("directions", [0] * m))
    batch = {v.shape[0] for v in ins if len(v.shape) > 0}
    if len(batch) != 1 or any(len(v.shape) < 1 for v in ins) or any(len(v.shape) < 2 for v in ins[n:]):
        raise ctx.bad("opset-8 Scan inputs need a common batch axis 0 (and a sequence axis 1 for scan inputs)")
    nb = batch.pop()
    if seq_lens is not None:
        lens = ctx.try_static(seq_lens)
        full = {v.shape[1] for v in ins[n:]}
        if lens is None or len(full) != 1 or not bool(np.all(np.asarray(lens) == full.pop())):
            raise ctx.unsupported("sequence_lens shorter than the scan inputs (ragged batches) are not converted")
    per_batch = []
    for b in range(nb):
        idx = ctx.const(np.array(b, dtype=np.int64))
        sl = [ctx.emit1("take", v, idx, axis=0) for v in ins]
        per_batch.append(_scan_unrolled(ctx, node, body, sl[:n], sl[n:], [0] * m, dirs, [0] * k, [0] * k))
    return [ctx.emit1("concatenate", *[ctx.reshape(r[j], (1,) + r[j].shape) for r in per_batch], axis=0)
            if nb > 1 else ctx.reshape(per_batch[0][j], (1,) + per_batch[0][j].shape)
            for j in range(n + k)]


def _scan_unrolled(ctx: Context, node, body, states: list[Value], scan_ins: list[Value], in_axes: list[int],
                   in_dirs: list[int], out_axes: list[int], out_dirs: list[int]) -> list[Value]:
    n, k = len(states), len(out_axes)
    ins = states + scan_ins
    lengths = {v.shape[a] for v, a in zip(scan_ins, in_axes)}
    if len(lengths) != 1:
        raise ctx.bad(f"scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    steps = lengths.pop()
    if steps > MAX_UNROLL:
        raise ctx.unsupported(f"Scan runs {steps} iterations, more than the {MAX_UNROLL} Kiln unrolls")
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
