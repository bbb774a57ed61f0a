"""ONNX converters: Recurrent ops (RNN, GRU, LSTM) and RoiAlign.

3-D convolution and pooling live in :mod:`kiln.frontend.volumetric` (shared with the torch
frontend); ``ops_nn`` calls them.

RNN, GRU and LSTM are unrolled over time into existing IR ops: the sequence length is static at
build time, so each step becomes a few small ``dense`` / elementwise nodes that the fuser merges.
The input projection ``X · W^T`` of every step and direction is one big ``dense`` hoisted out of
the time loop; only the recurrent ``H · R^T`` stays per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Value
from .converter import Context, onnx_op

# ----------------------------------------------------------------------------- recurrent
#: Gates per cell, in ONNX weight order (LSTM: i, o, f, c; GRU: z, r, h; RNN: i).
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
#: Activations per direction and their defaults (RNN: f; GRU: f, g; LSTM: f, g, h).
_DEFAULT_ACTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
#: Activation -> (default alpha, default beta); None where the function takes no such parameter.
_ACT_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None), "tanh": (None, None), "sigmoid": (None, None),
    "softsign": (None, None), "softplus": (None, None), "affine": (1.0, 0.0),
    "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None), "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5), "elu": (1.0, None),
}

_Act = tuple[str, float, float]


def _activations(ctx: Context, op: str, attrs: dict, num_dir: int) -> list[list[_Act]]:
    """Per direction, the cell's activations as ``(lowercase name, alpha, beta)``.

    ``activation_alpha`` / ``activation_beta`` are consumed in order by the functions that take
    the parameter, as ONNX Runtime does; a function past the end of the list gets its default.
    """
    per_dir = len(_DEFAULT_ACTS[op])
    names = [n.decode() if isinstance(n, bytes) else str(n)
             for n in attrs.get("activations", _DEFAULT_ACTS[op] * num_dir)]
    if len(names) == per_dir and num_dir == 2:
        names = names * 2
    if len(names) != per_dir * num_dir:
        raise ctx.bad(f"activations {names} must list {per_dir} function(s) per direction "
                      f"({per_dir * num_dir} for {num_dir} direction(s))")
    alphas = list(attrs.get("activation_alpha", ()))
    betas = list(attrs.get("activation_beta", ()))
    acts: list[_Act] = []
    for name in names:
        key = name.lower()
        if key not in _ACT_PARAMS:
            raise ctx.unsupported(f"activation {name!r} (supported: "
                                  f"{', '.join(sorted(_ACT_PARAMS))})")
        da, db = _ACT_PARAMS[key]
        a = float(alphas.pop(0)) if da is not None and alphas else (da or 0.0)
        b = float(betas.pop(0)) if db is not None and betas else (db or 0.0)
        acts.append((key, a, b))
    return [acts[d * per_dir:(d + 1) * per_dir] for d in range(num_dir)]


def _apply_act(ctx: Context, x: Value, act: _Act, clip: float | None) -> Value:
    """``act(x)``, with the cell clip applied to its input first when ``clip`` is set."""
    name, alpha, beta = act
    if clip is not None:
        x = ctx.emit1("clip", x, a_min=-clip, a_max=clip)

    def c(v: float) -> Value:
        return ctx.const(np.array(v), x.dtype)

    if name in ("relu", "tanh", "sigmoid", "softsign", "softplus"):
        return ctx.emit1(name, x)
    if name == "affine":
        return ctx.emit1("add", ctx.emit1("multiply", x, c(alpha)), c(beta))
    if name == "leakyrelu":
        return ctx.emit1("leaky_relu", x, alpha=alpha)
    if name == "thresholdedrelu":
        return ctx.emit1("where", ctx.emit1("greater", x, c(alpha)), x, c(0.0))
    if name == "scaledtanh":
        return ctx.emit1("multiply", ctx.emit1("tanh", ctx.emit1("multiply", x, c(beta))), c(alpha))
    if name == "hardsigmoid":
        return ctx.emit1("hard_sigmoid", x, alpha=alpha, beta=beta)
    return ctx.emit1("elu", x, alpha=alpha)


def _cols(ctx: Context, x: Value, k: int, hidden: int) -> Value:
    """Gate ``k`` of a (..., G * hidden) gate matrix (last axis)."""
    return ctx.emit1("strided_slice", x, begin=(k * hidden,), end=((k + 1) * hidden,),
                     strides=(1,), axes=(x.type.ndim - 1,))


@onnx_op("RNN", "GRU", "LSTM")
def _recurrent(ctx: Context, node: Any, ins: list, attrs: dict) -> list:
    op = node.op_type
    gates = _GATES[op]
    x, w, r = ins[0], ins[1], ins[2]
    opt = list(ins[3:]) + [None] * (8 - len(ins))
    b, seq_lens, h0 = opt[0], opt[1], opt[2]
    c0 = opt[3] if op == "LSTM" else None
    peep = opt[4] if op == "LSTM" else None
    direction = attrs.get("direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.bad(f"direction={direction!r} (expected forward, reverse or bidirectional)")
    num_dir = 2 if direction == "bidirectional" else 1
    layout = attrs.get("layout", 0)
    if layout not in (0, 1):
        raise ctx.bad(f"layout={layout} (expected 0: time-major or 1: batch-major)")
    if not x.dtype.startswith(("float", "bfloat")):
        raise ctx.unsupported(f"{x.dtype} input X (floating point is supported)")
    if x.type.ndim != 3 or w.type.ndim != 3 or r.type.ndim != 3:
        raise ctx.bad(f"X {x.shape}, W {w.shape} and R {r.shape} must all be 3-D")
    if layout == 1:
        x = ctx.emit1("transpose", x, axes=(1, 0, 2))
    steps, batch, in_size = x.shape
    if steps == 0:
        raise ctx.unsupported(f"X of shape {x.shape}: an empty sequence (no time steps)")
    hidden = int(attrs.get("hidden_size", r.shape[-1]))
    gh = gates * hidden
    expect = {"W": ((num_dir, gh, in_size), w), "R": ((num_dir, gh, hidden), r),
              "B": ((num_dir, 2 * gh), b), "P": ((num_dir, 3 * hidden), peep)}
    for what, (shape, v) in expect.items():
        if v is not None and v.shape != shape:
            raise ctx.bad(f"input {what} has shape {v.shape}, expected {shape} (hidden_size "
                          f"{hidden}, {num_dir} direction(s), input size {in_size})")
    state_shape = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
    for what, v in (("initial_h", h0), ("initial_c", c0)):
        if v is not None and v.shape != state_shape:
            raise ctx.bad(f"input {what} has shape {v.shape}, expected {state_shape}")
    if seq_lens is not None and (seq_lens.shape != (batch,) or seq_lens.dtype not in ("int32", "int64")):
        raise ctx.bad(f"sequence_lens must be an int32 vector of {batch} lengths, got "
                      f"{seq_lens.type}")
    acts = _activations(ctx, op, attrs, num_dir)
    clip = attrs.get("clip")
    clip = None if clip is None else float(clip)
    lbr = bool(attrs.get("linear_before_reset", 0)) if op == "GRU" else False
    input_forget = bool(attrs.get("input_forget", 0)) if op == "LSTM" else False
    dt = x.dtype

    def zeros(shape: tuple[int, ...]) -> Value:
        return ctx.const(np.zeros(shape), dt)

    # Hoisted input projection for every step and direction: (T * B, I) x (D * G * H, I)^T.
    xw = ctx.emit1("dense", ctx.reshape(x, (steps * batch, in_size)),
                   ctx.reshape(w, (num_dir * gh, in_size)))
    rb = None  # GRU linear_before_reset: Rb_h is applied inside r * (...), per direction
    if b is not None:
        wb = ctx.emit1("strided_slice", b, begin=(0,), end=(gh,), strides=(1,), axes=(1,))
        rball = ctx.emit1("strided_slice", b, begin=(gh,), end=(2 * gh,), strides=(1,), axes=(1,))
        if lbr:
            rb = ctx.emit1("strided_slice", rball, begin=(2 * hidden,), end=(gh,), strides=(1,),
                           axes=(1,))
            rball = ctx.emit1("concatenate", ctx.emit1("strided_slice", rball, begin=(0,),
                                                       end=(2 * hidden,), strides=(1,), axes=(1,)),
                              zeros((num_dir, hidden)), axis=1)
        xw = ctx.emit1("bias_add", xw, ctx.reshape(ctx.emit1("add", wb, rball), (num_dir * gh,)),
                       axis=1)
    xw = ctx.reshape(xw, (steps, batch, num_dir * gh))

    def per_dir(v: Value, d: int, axis: int = 0) -> Value:
        """Direction ``d`` of a (D, ...) input as (...); ``axis``: where D is."""
        s = ctx.emit1("strided_slice", v, begin=(d,), end=(d + 1,), strides=(1,), axes=(axis,))
        return ctx.reshape(s, tuple(n for i, n in enumerate(v.shape) if i != axis))

    masks: list[Value | None] = [None] * steps
    if seq_lens is not None:
        lens = ctx.try_static(seq_lens)
        if lens is not None and ((np.asarray(lens) < 0) | (np.asarray(lens) > steps)).any():
            raise ctx.bad(f"sequence_lens {np.asarray(lens).tolist()} must lie in [0, {steps}]")
        if lens is None or (np.asarray(lens) != steps).any():
            # Steps at or past a batch item's length keep its state and output zeros.
            lens2 = ctx.reshape(seq_lens, (batch, 1))
            masks = [ctx.emit1("less", ctx.const(np.array(t), seq_lens.dtype), lens2)
                     for t in range(steps)]

    ys: list[list[Value]] = []
    last_h: list[Value] = []
    last_c: list[Value] = []
    for d in range(num_dir):
        f = acts[d]
        rd = per_dir(r, d)
        state_axis = 1 if layout else 0
        h = zeros((batch, hidden)) if h0 is None else per_dir(h0, d, state_axis)
        # The cell state (LSTM only; RNN and GRU never read it).
        cst = zeros((batch, hidden)) if c0 is None else per_dir(c0, d, state_axis)
        # Peepholes (P_i, P_o, P_f), sliced once per direction rather than per step.
        peeps = None if peep is None else [_cols(ctx, per_dir(peep, d), k, hidden) for k in range(3)]
        rbd = None if rb is None else per_dir(rb, d)
        r_zr = r_h = rd
        if op == "GRU" and not lbr:
            # z and r take H · R^T directly; the candidate takes (r * H) · R_h^T
            r_zr, r_h = _rows(ctx, rd, 0, 2 * hidden), _rows(ctx, rd, 2 * hidden, gh)
        order = range(steps - 1, -1, -1) if (direction == "reverse" or d == 1) else range(steps)
        outs: list[Value | None] = [None] * steps

        def gate(xt: Value, hr: Value, k: int) -> Value:
            # Sliced before the add: the dense then has no elementwise consumer to fuse with,
            # and the step's slices, adds and activations become one injective kernel.
            return ctx.emit1("add", _cols(ctx, xt, k, hidden), _cols(ctx, hr, k, hidden))

        for t in order:
            xt = ctx.reshape(ctx.emit1("strided_slice", xw, begin=(t, d * gh), end=(t + 1, (d + 1) * gh),
                                       strides=(1, 1), axes=(0, 2)), (batch, gh))
            if op == "RNN":
                pre = ctx.emit1("add", xt, ctx.emit1("dense", h, rd))
                h_new = _apply_act(ctx, pre, f[0], clip)
                c_new = None
            elif op == "GRU":
                hr = ctx.emit1("dense", h, rd if lbr else r_zr)
                z = _apply_act(ctx, gate(xt, hr, 0), f[0], clip)
                rg = _apply_act(ctx, gate(xt, hr, 1), f[0], clip)
                if lbr:
                    rec = _cols(ctx, hr, 2, hidden)
                    if rbd is not None:
                        rec = ctx.emit1("add", rec, rbd)
                    rec = ctx.emit1("multiply", rg, rec)
                else:
                    rec = ctx.emit1("dense", ctx.emit1("multiply", rg, h), r_h)
                hh = _apply_act(ctx, ctx.emit1("add", _cols(ctx, xt, 2, hidden), rec), f[1], clip)
                # (1 - z) * hh + z * h  ==  hh + z * (h - hh)
                h_new = ctx.emit1("add", hh, ctx.emit1("multiply", z, ctx.emit1("subtract", h, hh)))
                c_new = None
            else:
                hr = ctx.emit1("dense", h, rd)
                gi, go, gf, gc = (gate(xt, hr, k) for k in range(4))
                if peeps is not None:
                    gi = ctx.emit1("add", gi, ctx.emit1("multiply", peeps[0], cst))
                    gf = ctx.emit1("add", gf, ctx.emit1("multiply", peeps[2], cst))
                i_ = _apply_act(ctx, gi, f[0], clip)
                if input_forget:
                    f_ = ctx.emit1("subtract", ctx.const(np.array(1.0), dt), i_)
                else:
                    f_ = _apply_act(ctx, gf, f[0], clip)
                c_new = ctx.emit1("add", ctx.emit1("multiply", f_, cst),
                                  ctx.emit1("multiply", i_, _apply_act(ctx, gc, f[1], clip)))
                if peeps is not None:
                    go = ctx.emit1("add", go, ctx.emit1("multiply", peeps[1], c_new))
                h_new = ctx.emit1("multiply", _apply_act(ctx, go, f[0], clip),
                                  _apply_act(ctx, c_new, f[2], None))
            m = masks[t]
            if m is None:
                h, outs[t] = h_new, h_new
                if c_new is not None:
                    cst = c_new
            else:
                outs[t] = ctx.emit1("where", m, h_new, zeros(()))
                h = ctx.emit1("where", m, h_new, h)
                if c_new is not None:
                    cst = ctx.emit1("where", m, c_new, cst)
        if seq_lens is not None and masks[0] is not None:
            # As ONNX Runtime does: an empty sequence's final state is 0, not its initial state.
            h = ctx.emit1("where", masks[0], h, zeros(()))
            if op == "LSTM":
                cst = ctx.emit1("where", masks[0], cst, zeros(()))
        ys.append([o for o in outs if o is not None])
        last_h.append(h)
        last_c.append(cst)

    def states(vals: list[Value]) -> Value:
        """(D, B, H) from per-direction (B, H) states ((B, D, H) for layout 1)."""
        axis = 1 if layout else 0
        parts = [ctx.reshape(v, (batch, 1, hidden) if layout else (1, batch, hidden)) for v in vals]
        return parts[0] if len(parts) == 1 else ctx.emit1("concatenate", *parts, axis=axis)

    want = [bool(n) for n in node.output] + [False] * 3
    y = None
    if want[0]:
        # (T, D, B, H); layout 1: (B, T, D, H).
        per_step = []
        for t in range(steps):
            parts = [ctx.reshape(ys[d][t], (1, 1, batch, hidden)) for d in range(num_dir)]
            per_step.append(parts[0] if num_dir == 1 else ctx.emit1("concatenate", *parts, axis=1))
        y = per_step[0] if steps == 1 else ctx.emit1("concatenate", *per_step, axis=0)
        if layout:
            y = ctx.emit1("transpose", y, axes=(2, 0, 1, 3))
    res: list[Value | None] = [y, states(last_h) if want[1] else None]
    if op == "LSTM":
        res.append(states(last_c) if want[2] else None)
    return res


def _rows(ctx: Context, w: Value, lo: int, hi: int) -> Value:
    """Rows ``[lo, hi)`` of a (G * H, K) weight matrix."""
    return ctx.emit1("strided_slice", w, begin=(lo,), end=(hi,), strides=(1,), axes=(0,))


# ----------------------------------------------------------------------------- RoiAlign
@onnx_op("RoiAlign")
def _roi_align(ctx: Context, node: Any, ins: list, attrs: dict) -> Value:
    from ...ir.ops.recurrent import roi_align_grid_bound, roi_grid

    x, rois, idx = ins[0], ins[1], ins[2]
    if x.type.ndim != 4:
        raise ctx.unsupported(f"input X of shape {x.shape} (only 4-D NCHW feature maps are supported)")
    mode = attrs.get("mode", "avg")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("avg", "max"):
        raise ctx.bad(f"mode={mode!r} (expected 'avg' or 'max')")
    # Opset 10 had no attribute and behaved as output_half_pixel; 16 added it, half_pixel default.
    coord = attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    coord = coord.decode() if isinstance(coord, bytes) else coord
    if coord not in ("half_pixel", "output_half_pixel"):
        raise ctx.bad(f"coordinate_transformation_mode={coord!r} (expected half_pixel or output_half_pixel)")
    oh, ow = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    if ratio < 0:
        raise ctx.bad(f"sampling_ratio={ratio} (expected >= 0)")
    if rois.type.ndim != 2 or rois.shape[-1] != 4:
        raise ctx.bad(f"rois of shape {rois.shape} (expected (num_rois, 4))")
    if rois.dtype != x.dtype:
        rois = ctx.cast(rois, x.dtype)
    grid: tuple[int, ...] = (0, 0)
    if ratio == 0:
        # The adaptive grid (ceil(roi_size / output_size) samples per bin) sets the kernel's
        # reduction extent. Only the samples inside the image need visiting, which bounds it
        # whatever the boxes; constant boxes may bound it tighter.
        grid = (roi_align_grid_bound(x.shape[2]), roi_align_grid_bound(x.shape[3]))
        boxes = ctx.try_static(rois)
        if boxes is not None and np.isfinite(np.asarray(boxes, dtype=np.float64)).all():
            b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * scale
            size_w, size_h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
            if coord == "output_half_pixel":
                size_w, size_h = np.maximum(size_w, 1.0), np.maximum(size_h, 1.0)
            # Widened by a hair: the kernel computes the sizes in the data dtype, and a size
            # just under an integer multiple here may round up there (a spare row is masked).
            grid = tuple(min(bound, max([roi_grid(0.0, float(s) * (1 + 1e-6) + 1e-6, n, 0)[1] for s in sizes] + [1]))
                         for bound, sizes, n in ((grid[0], size_h, oh), (grid[1], size_w, ow)))
    return ctx.emit1("roi_align", x, rois, idx, output_height=oh, output_width=ow, sampling_ratio=ratio,
                     max_grid=grid, spatial_scale=scale, mode=mode, half_pixel=coord == "half_pixel")
