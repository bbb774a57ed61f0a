"""Converter for ONNX ``Loop`` with a compile-time trip count: the body is unrolled.

Kiln compiles static graphs, so a loop whose iteration count is known when the model is
imported (a constant, or an input frozen by the caller / the ONNX backend) becomes one copy of
its body per iteration, with the loop-carried values threaded through and the scan outputs
concatenated. When every input of the loop is constant the copies fold away at import (as in
the function body of ``Range``). Loops whose count or continue-condition is only known at run
time are rejected with an UnsupportedOpError.
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
    outer_node = node
    body_consts = {t.name: ctx.const(tensor_to_array(t)) for t in body.initializer}
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    it = 0
    while cond and it < trip:
        if it >= MAX_UNROLL:
            raise ctx.unsupported(f"Loop runs more than {MAX_UNROLL} iterations (Kiln unrolls "
                                  f"loops at compile time)")
        env = dict(ctx.env)  # outer-scope names stay visible; body names shadow them
        env.update(body_consts)
        env[body.input[0].name] = ctx.const(np.array(it, dtype=np.int64))
        env[body.input[1].name] = ctx.const(np.array(cond))
        for vi, v in zip(body.input[2:], carried):
            env[vi.name] = v
        saved_env = ctx.env
        ctx.env = env
        try:
            convert_nodes(ctx, body.node, env, {}, name_values=False)
        finally:
            ctx.env = saved_env
            ctx.node = outer_node
        outs = []
        for vo in body.output:
            if vo.name not in env:
                raise ctx.bad(f"body output {vo.name!r} is not computed by the body")
            outs.append(env[vo.name])
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
