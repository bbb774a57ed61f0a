"""AlterConvLayout: run convolution chains in the blocked NCHW[x]c layout.

Every eligible ``conv2d`` (float32, NCHW; ``groups`` 1, depthwise with multiplier 1, or grouped
with at least 8 output channels per group, blocked within each group) becomes a
``conv2d_nchwc`` on data ``NCHW[ib]c`` with its weight re-stored at build time as
``OIHW[ib]i[ob]o`` (a new constant; no kernel runs for it).  Values stay blocked through
``max_pool2d`` (as ``max_pool2d_nchwc``) and the ops that do not care about the channel
layout — elementwise unary ops, ``bias_add`` and
binary broadcasts whose other operand is blocked too, a per-channel constant (re-stored as
``(1, C/b, 1, 1, b)``) or a scalar — so a residual network is blocked from its first to
its last convolution.  A ``concatenate`` on the channel axis stays blocked too when one of
its blocked inputs' blocks divides every input's channel count: ``NCHW[b]c`` tensors joined
along ``C/b`` are the blocked concatenation (see :func:`_concat_block`).  DenseNet-121 thus
keeps its concatenations and the BatchNorm + ReLU after them blocked; measured on Zen 3:
kernels 256 → 197, ``layout_transform`` kernels 69 → 9 (calls 123 → 11), their per-node
time 5.6 → 0.7 ms of ~250 ms at 1 thread (end-to-end change within run-to-run noise).

A ``layout_transform`` back to NCHW is inserted only where a value
reaches another op (average / global pooling, reshape, graph output ...), at most once per value; the
transform into the blocked layout likewise at most once per (value, block).

Block choice, from the target's instruction set (:func:`kiln.target.isa_of`, ``L`` float32
lanes, ``R`` vector registers; no target: the schedules' x86-64-v3): the schedule's register
tile is ``xt`` output pixels × ``ob`` channels with ``xt`` dividing the output width and
``xt·v + v + 1 <= R`` for ``v = ob / L`` vectors (``x86_conv.max_x_tile``).  The *wide* block
is ``max(2L, 16)`` channels, the *narrow* one half of it; the wide block is used when the row
fits one tile or a tile of it with at least 8 accumulators divides the width.

* AVX2 (``L`` 8, ``R`` 16): 16 / 8.  ``ob = 16`` fits at most 6 pixels, so widths 7 and 14
  (ResNet's last stages, MobileNetV2's tail), which have no divisor in 4..6, get ``ob = 8``
  and tiles of 7 / 14.  Measured on Zen 3, 1 thread: 3×3 256→256 at 14×14 43 GFLOP/s with ob
  16 (tile 7, spills) vs 75 with ob 8; 64→64 at 56×56: 78 with ob 16.
* SSE2 (``L`` 4, ``R`` 16): 16 / 8 — four ``xmm`` per pixel, tiles of 2 pixels.  SSE2 has no
  broadcast load: every input value costs a shuffle, so it should feed as many vectors as
  possible.  Measured (Zen 3 VM shared with other jobs, ``KILN_NUM_THREADS=1``, ``llvm``,
  ResNet-18 built both ways in one process, median of 30 interleaved runs, two sessions):
  two-vector blocks (8 / 4) 256 and 283 ms, 16 / 8 blocks 211 and 261 ms.
* AVX-512 (``L`` 16, ``R`` 32): 32 / 16 (two ``zmm`` fit 14 pixels).  Measured on Zen 5
  (``bench/RESULTS.md``): ResNet-50's convs at 97% of the measured GEMM peak.  Channel counts
  whose divisor block falls between 16 and 32 without being a multiple of 16 (ShuffleNetV2's
  116: 29 = 16 + 8 + 4 + 1 lanes) are padded instead (:func:`_padded_block`): ShuffleNetV2
  0.62x, RegNetY-400MF 0.75x of their previous time.
* NEON (``L`` 4, ``R`` 32): 16 / 8, not measured.

``ib`` is whatever block the producer already has (any divisor of C is legal), else the wide
or the narrow block.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..ir import Graph, OpPattern, Value, get_op
from ..target import ISA
from ..topi.knobs import Workload, current_config, workload_key
from ..topi.nn.dense import dense_panel_width
from ..topi.schedule.x86 import schedule_isa
from ..topi.schedule.x86_conv import MIN_ACCUMULATORS, max_x_tile, row_x_tile, tile_vectors
from ..ir.ops.layout import convert_layout
from ..ir.ops.winograd import winograd_grid, winograd_panels, winograd_plane_rows, winograd_weight
from .pipeline import Pass
from .simplify import dead_code_elimination

__all__ = ["alter_conv_layout", "AlterConvLayout", "choose_out_block", "choose_in_block"]

#: Broadcast ops that may run on blocked operands (elementwise in every operand).
_BLOCKABLE_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum")
#: Reductions that stay blocked over the spatial axes (per channel, so per lane of a block).
_SPATIAL_REDUCE = ("reduce_mean", "reduce_sum", "reduce_max", "reduce_min")


def _largest_divisor(n: int, cap: int) -> int:
    for d in range(min(cap, n), 0, -1):
        if n % d == 0:
            return d
    return 1


#: Fewest channels of a wide block: one 64-byte cache line of float32.  On 16-byte vectors
#: that is four registers per pixel, which measured faster than two (SSE2 has no broadcast
#: load, so each input value's shuffle should feed as many vectors as possible; see the
#: module docstring).
_MIN_WIDE_BLOCK = 16


def _block_sizes(isa: ISA) -> tuple[int, int]:
    """(wide, narrow) channel blocks: ``max(2L, 16)`` and half of it."""
    wide = max(2 * isa.lanes("float32"), _MIN_WIDE_BLOCK)
    return wide, wide // 2


def choose_out_block(channels: int, out_width: int, isa: ISA | None = None, depthwise: bool = False,
                     out_height: int = 0) -> int:
    """Output-channel block of a blocked convolution (see the module docstring).

    The wide block when the whole row fits one register tile (``x86_conv.max_x_tile``), or
    a tile of ``xt`` pixels dividing ``out_width`` fits with at least
    :data:`~kiln.topi.schedule.x86_conv.MIN_ACCUMULATORS` accumulators (``xt · v`` for ``v`` vectors per pixel), or
    a tile of several rows does (``x86_conv.row_x_tile``, given ``out_height``); else the
    narrow block; else the largest divisor of ``channels`` up to the wide block.

    Parameters
    ----------
    channels : int
        Output channels ``O``.
    out_width : int
        Output width ``OW``.
    isa : ISA, optional
        The target's instruction set (default: the schedules' no-target ISA, x86-64-v3).
    depthwise : bool
        A depthwise convolution (its tile keeps one more register for the input vector).
    out_height : int
        Output height ``OH`` (0: unknown, one-row tiles only).

    Returns
    -------
    int
        AVX2: 16, 8 or a divisor up to 16; SSE2: 16, 8; AVX-512: 32, 16; NEON: 16, 8.
    """
    isa = isa if isa is not None else schedule_isa(None)
    lanes = isa.lanes("float32")
    wide, narrow = _block_sizes(isa)
    vecs = tile_vectors(wide, lanes)
    most = max_x_tile(wide, lanes, depthwise, isa.vector_registers)
    least = max(1, -(-MIN_ACCUMULATORS // vecs))
    fits = out_width <= most or any(out_width % t == 0 for t in range(least, most + 1))
    if not fits and out_height and not depthwise:  # a tile of several rows (14x14: 2 x 2)
        fits = row_x_tile(out_height, out_width, wide, lanes, isa.vector_registers) is not None
    if channels % wide == 0 and fits:
        return wide
    if channels % narrow == 0:
        return narrow
    return _largest_divisor(channels, wide)


def choose_in_block(channels: int, isa: ISA | None = None) -> int:
    """Block of a convolution input that is not blocked yet: the wide block, the narrow one,
    or a divisor of ``channels`` up to the wide block (AVX2: 16, 8; AVX-512: 32, 16)."""
    isa = isa if isa is not None else schedule_isa(None)
    wide, narrow = _block_sizes(isa)
    for b in (wide, narrow):
        if channels % b == 0:
            return b
    return _largest_divisor(channels, wide)


#: Elementwise ops that keep a padding lane finite (zero in, finite out, no blow-up), so the
#: zero weights of the next convolution cancel it. Any other op reads the value unpadded.
_PAD_SAFE_UNARY = ("relu", "clip", "sigmoid", "tanh", "hard_sigmoid", "hard_swish", "leaky_relu", "negative",
                   "abs", "gelu", "erf", "elu", "selu", "celu", "swish", "mish", "softsign")


def _padded_block(channels: int, isa: ISA, out_width: int = 0, out_height: int = 0,
                  depthwise: bool = False) -> int | None:
    """A block that pads ``channels`` up to a multiple of it, for a conv whose block would
    otherwise not be a multiple of the narrow block; None to keep that divisor block.

    Padding to the narrow block is taken when it saves vector operations per pixel and
    costs at most one channel in eight (ShuffleNetV2's 58 / 116 -> 64 / 120 on AVX2), or at
    most one in four and saves a third of them: the divisor block is cut by the codegens into
    several vectors (DeepLabV3's 21-class head: blocks of 7 are 4 + 2 + 1 lanes, nine
    operations for 21 channels against three for 24; the conv went from 195-460 to 28 us;
    on AVX-512 ShuffleNetV2's 116 channels had blocks of 29 = 16 + 8 + 4 + 1 lanes). The
    wide block is returned instead when it pads to the same count and its tile fits the
    output (:func:`choose_out_block`; ``out_width`` 0: an input block, no tile to fit).
    """
    wide, narrow = _block_sizes(isa)
    if channels % narrow == 0 or channels < 2 * narrow:
        return None
    pad = -channels % narrow
    lanes = isa.lanes("float32")
    d = _largest_divisor(channels, wide)  # what choose_out_block / choose_in_block fall back to
    ops_divisor = channels // d * tile_vectors(d, lanes)
    ops_padded = (channels + pad) // narrow * tile_vectors(narrow, lanes)
    if not (pad * 8 <= channels and ops_padded < ops_divisor
            or pad * 4 <= channels and 3 * ops_padded <= 2 * ops_divisor):
        return None
    if (channels + pad) % wide:
        return narrow
    if not out_width:
        return wide
    return choose_out_block(channels + pad, out_width, isa, depthwise, out_height)


def _conv_workload(node: Any) -> Workload:
    """The ``conv2d_layout`` workload of a conv2d node: a tuning log's key for its ``ob`` and
    ``winograd`` knobs."""
    data, weight = node.inputs
    a = node.attrs
    return workload_key("conv2d_layout", data.shape, weight.shape, a.get("strides", ()), a.get("padding", ()),
                        a.get("dilation", ()), a["groups"], data.dtype)


def _conv_plan(node: Any, data_block: int | None, isa: ISA, data_padded: bool = False,
               workload: Workload | None = None) -> tuple[int, int] | None:
    """``(ib, ob)`` for an eligible conv2d node, else None.

    A block may pad its channels (:func:`_padded_block`); ``data_padded``: the data is
    already blocked by ``data_block`` with padding lanes, so that block is the input block.
    ``workload``: the node's :func:`_conv_workload`, where the caller has it already.
    """
    data, weight = node.inputs
    if data.dtype != "float32" or weight.dtype != "float32" or len(data.shape) != 4:
        return None
    n, c, h, w = data.shape
    o, cg, kh, kw = weight.shape
    ow = node.outputs[0].shape[3]
    g = node.attrs["groups"]
    # knob: a tuning log may set the block per workload (0 = the rule of choose_out_block)
    wl = workload if workload is not None else _conv_workload(node)
    tuned_ob = int(current_config("conv2d_layout", wl, {"ob": 0})["ob"])
    if tuned_ob < 4 or o % tuned_ob:
        tuned_ob = 0
    narrow = _block_sizes(isa)[1]
    if g == 1:
        oh = node.outputs[0].shape[2]
        ob = tuned_ob or choose_out_block(o, ow, isa, out_height=oh)
        if not tuned_ob and ob % narrow:
            ob = _padded_block(o, isa, ow, oh) or ob
        if data_block and (data_padded or c % data_block == 0):
            ib = data_block
        else:
            ib = choose_in_block(c, isa)
            if ib % narrow:
                ib = _padded_block(c, isa) or ib
        # blocks below 4 lanes would run mostly scalar code: NCHW's kernel is as good there
        if ob < 4:
            return None
        return ib, ob
    if g == c and o == c and cg == 1:
        if data_block and data_block >= 4 and (data_padded or c % data_block == 0):
            b = data_block
        else:
            b = tuned_ob or choose_out_block(c, ow, isa, depthwise=True)
            if not tuned_ob and b % narrow:
                b = _padded_block(c, isa, ow, depthwise=True) or b
        return (b, b) if b >= 4 else None
    if g > 1 and o % g == 0 and cg * g == c:
        # Grouped (ResNeXt, RegNet): blocked within each group, so output block k reads only its
        # group's input blocks. Groups of fewer than 8 output channels stay in NCHW: with 4-wide
        # blocks, ResNeXt-50's 3x3 128->128 / 32 groups at 56x56 took 1.45 ms against 0.76 ms in
        # NCHW (Zen 3, 1 thread); with 8 or more, 1.8-4.1x faster than NCHW (docs/topi.md).
        og = o // g
        ob = tuned_ob if tuned_ob and og % tuned_ob == 0 else choose_out_block(og, ow, isa)
        ib = data_block if data_block and cg % data_block == 0 and not data_padded else choose_in_block(cg, isa)
        return (ib, ob) if ob >= 8 and og % ob == 0 and cg % ib == 0 and ib >= 4 else None
    return None


class _Builder:
    """Builds the new graph; tracks each old value's NCHW and blocked incarnations."""

    def __init__(self, graph: Graph) -> None:
        self.g = Graph(graph.name)
        self.g.copy_dims(graph)
        self.plain: dict[Value, Value] = {}
        self.blocked: dict[Value, tuple[Value, int]] = {}
        self.reblocked: dict[tuple[Value, int], Value] = {}
        for v in graph.inputs:
            nv = Value(v.type, None, 0, v.name)
            self.g.inputs.append(nv)
            self.plain[v] = nv

    def nchw(self, v: Value) -> Value:
        if v not in self.plain:
            bv, b = self.blocked[v]
            self.plain[v] = self.g.add("layout_transform", bv, src_layout=f"NCHW{b}c", dst_layout="NCHW",
                                       channels=v.shape[1] if self.padded(v) else 0)
        return self.plain[v]

    def block_of(self, v: Value) -> int | None:
        return self.blocked[v][1] if v in self.blocked else None

    def padded(self, v: Value) -> bool:
        """``v`` is blocked with padding lanes (its block does not divide its channels)."""
        return v in self.blocked and v.shape[1] % self.blocked[v][1] != 0

    def in_block(self, v: Value, b: int) -> Value:
        if v in self.blocked and self.blocked[v][1] == b:
            return self.blocked[v][0]
        key = (v, b)
        if key not in self.reblocked:
            pad = v.shape[1] if self.padded(v) or v.shape[1] % b else 0
            if v in self.blocked:
                bv, ob = self.blocked[v]
                self.reblocked[key] = self.g.add("layout_transform", bv, src_layout=f"NCHW{ob}c",
                                                 dst_layout=f"NCHW{b}c", channels=pad)
            else:
                self.reblocked[key] = self.g.add("layout_transform", self.nchw(v), src_layout="NCHW",
                                                 dst_layout=f"NCHW{b}c", channels=pad)
        return self.reblocked[key]

    def copy(self, node: Any) -> None:
        ins = [self.nchw(v) for v in node.inputs]
        outs = self.g.add_node(node.op, ins, node.attrs, name=node.name,
                               output_names=[v.name for v in node.outputs])
        for old, nv in zip(node.outputs, outs):
            self.plain[old] = nv


def _channel_const(v: Value, shape: tuple[int, ...]) -> np.ndarray | None:
    """A constant that broadcasts to NCHW ``shape`` along channels only, as a (C,) array."""
    arr = v.const_value
    if arr is None or arr.ndim == 0 or arr.ndim > 4:
        return None
    c = shape[1]
    full = (1,) * (4 - arr.ndim) + tuple(arr.shape)
    if full[0] != 1 or full[2] != 1 or full[3] != 1 or full[1] not in (1, c):
        return None
    return np.broadcast_to(arr.reshape(full[1]), (c,))


def _blocked_channels(ch: np.ndarray, b: int, fill: float) -> np.ndarray:
    """A per-channel (C,) array as ``(1, C/b, 1, 1, b)``, padding lanes set to ``fill``."""
    ch = np.asarray(ch).reshape(-1)
    if ch.size % b:
        ch = np.concatenate([ch, np.full(-ch.size % b, fill, ch.dtype)])
    return np.ascontiguousarray(ch.reshape(1, -1, 1, 1, b))


def _concat_block(node: Any, bld: _Builder) -> int | None:
    """The block a channel ``concatenate`` runs in, or None to keep it in NCHW.

    Concatenating ``NCHW[b]c`` tensors along their outer channel axis ``C/b`` lays the
    channels out exactly as blocking the NCHW concatenation would, provided every input's
    channel count is a multiple of ``b`` (else a block would straddle two inputs).  Only a
    concatenation fed by at least one blocked value is moved: an all-NCHW one would gain
    transforms and save none.  Among the blocks of the blocked inputs that divide every
    channel count, the one most inputs already have wins (fewest re-blocking transforms),
    then the wider one.
    """
    shape = node.outputs[0].shape
    if len(shape) != 4 or node.outputs[0].dtype != "float32" or node.attrs["axis"] not in (1, -3):
        return None
    blocks = [bld.block_of(v) for v in node.inputs]
    chans = [v.shape[1] for v in node.inputs]
    fits = {b for b in blocks if b is not None and all(c % b == 0 for c in chans)}
    if not fits:
        return None
    return max(fits, key=lambda b: (blocks.count(b), b))


#: Environment switch of the Winograd path (:func:`_winograd_conv`): ``1`` every eligible
#: conv, ``0`` none (tests of the direct kernel's blocking set it), unset or ``auto`` the
#: measured rule (:func:`_winograd_default`), which a tuning log's ``winograd`` knob of the
#: ``conv2d_layout`` workload overrides per conv (not ``0`` / ``1``).
WINOGRAD_ENV = "KILN_WINOGRAD"


def _winograd_default(isa: ISA) -> bool:
    """Whether eligible 3x3 stride-1 convs run as Winograd F(2x2, 3x3) by default on ``isa``.

    Winograd does 2.25x fewer multiplies; its GEMMs read build-time panels 16/9 the size of
    the direct conv's weight.  Measured (``conv2d`` + bias + ReLU, the kernels between the
    edge layout transforms, Zen 5, ``KILN_NUM_THREADS=1``, debug-executor profile, median of
    7 interleaved rounds; Winograd / ``conv2d_nchwc`` time;
    ``KILN_NUM_THREADS=1 python bench/bench_winograd_layers.py [--target T] [C,K,HW ...]``):

    * AVX-512 (``llvm -mcpu=native``), ``C -> K at HxW``: 64->64 56x56 0.61 (886 -> 543 us;
      0.56, 510 us, since its transformed planes are spaced: ``winograd_plane_rows``),
      128->128 28x28 0.50, 256->256 14x14 0.49, 512->512 7x7 0.67 (888 -> 598 us), 64->128
      56x56 0.55, 128->64 28x28 0.53, 128->256 28x28 0.49, 256->128 14x14 0.50, 256->512 14x14
      0.49, 512->256 7x7 0.63, 256->256 12x12 0.50, 10x10 0.50, 5x5 0.68, 512->512 4x4 0.53,
      64->64 6x6 0.47, 128->128 8x8 0.19 (the direct kernel's 8-wide tile is slow there).
    * SSE2 (``llvm``): 64->64 56x56 0.53, 256->256 14x14 0.49, 512->512 7x7 0.73, 128->256
      28x28 0.48.
    * AVX2 (``llvm -mcpu=znver3`` run on the same Zen 5): 64->64 56x56 0.49, 128->128 28x28
      0.43, 256->256 14x14 0.42, 512->512 7x7 0.65.

    No measured shape class lost, so the rule is the instruction set alone: x86 (SSE2, AVX2,
    AVX-512).  NEON was not measured and keeps ``conv2d_nchwc``.
    """
    return isa.arch == "x86" and isa.vector_bytes in (16, 32, 64)


def _winograd_conv(node: Any, bld: _Builder, ib: int, ob: int, isa: ISA, workload: Workload) -> Value | None:
    """Emit an eligible conv2d as Winograd F(2x2, 3x3) when enabled for it; None otherwise.

    Eligible: 3x3 taps, stride 1, dilation 1, ``groups`` 1, float32, a constant weight, static
    channels (the batch, H and W may be symbolic: the tiles stay a flat row count, and the
    output transform then also takes the blocked data for its runtime H and W).  The
    graph is ``winograd_input_transform`` (of the data blocked by ``ib``) -> ``winograd_matmul``
    with the weight transformed now (``(16, C, K)``, zero rows / columns for padding lanes of
    ``ib`` / ``ob``, stored as the target's GEMM panels) -> ``winograd_output_transform`` into
    blocks of ``ob`` (:mod:`kiln.ir.ops.winograd`).  With a static tile count the transformed
    data's planes get the rows :func:`~kiln.ir.ops.winograd.winograd_plane_rows` picks.
    Enabled by :data:`WINOGRAD_ENV` ``1`` / ``0``, else a tuning log's ``winograd`` knob of
    ``workload`` (the node's ``conv2d_layout`` workload), else :func:`_winograd_default`.
    """
    data, weight = node.inputs
    a = node.attrs
    warr = weight.const_value
    if (warr is None or a["groups"] != 1 or tuple(weight.shape[2:]) != (3, 3) or tuple(a["strides"]) != (1, 1)
            or tuple(a["dilation"]) != (1, 1) or data.dtype != "float32" or weight.dtype != "float32"):
        return None
    k, c = weight.shape[:2]
    oh, ow = node.outputs[0].shape[2:]
    if isinstance(data.type.dims[1], str) or isinstance(node.outputs[0].type.dims[1], str):
        return None  # the GEMMs' inner and outer sizes are the channels: compiled in
    spatial = any(isinstance(d, str) for d in data.type.dims[2:])
    env = os.environ.get(WINOGRAD_ENV, "")
    if env in ("0", "1"):
        on = env == "1"
    else:
        on = bool(current_config("conv2d_layout", workload, {"winograd": _winograd_default(isa)})["winograd"])
    if not on:
        return None
    w = np.asarray(warr)
    # padding lanes of either block get zero weights, as for conv2d_nchwc
    w = np.pad(w, [(0, -k % ob), (0, -c % ib), (0, 0), (0, 0)])
    g = bld.g
    x = bld.in_block(data, ib)
    tiles, rows = 0, 0
    if not any(isinstance(d, str) for d in data.type.dims):
        grid = winograd_grid(data.shape[2], data.shape[3], a["padding"])
        tiles = data.shape[0] * grid.tiles_h * grid.tiles_w
        rows = winograd_plane_rows(tiles, w.shape[1])
    # spaced planes (rows > tiles): the GEMMs read the first `tiles` rows; else both attrs
    # stay 0, the compact planes
    spaced = rows > tiles
    v = g.add("winograd_input_transform", x, padding=tuple(a["padding"]), plane_rows=rows if spaced else 0)
    # the GEMM operands as the packed matmul kernel's column panels, made once here
    bn = dense_panel_width(isa, "float32", w.shape[0])
    m = g.add("winograd_matmul", v, g.add_constant(winograd_panels(winograd_weight(w), bn)), units=w.shape[0],
              tiles=tiles if spaced else 0)
    if spatial:
        # M's flat rows do not say how they split into tile rows: the data's runtime H, W do
        # (oh, ow are then the upper bounds)
        return g.add("winograd_output_transform", m, x, out_height=oh, out_width=ow, block=ob,
                     padding=tuple(a["padding"]), name=node.name)
    return g.add("winograd_output_transform", m, out_height=oh, out_width=ow, block=ob, name=node.name)


def alter_conv_layout(graph: Graph, target: Any = None) -> Graph:
    """Rewrite conv2d chains into the blocked layout (see the module docstring).

    Parameters
    ----------
    graph : Graph
        A typed graph, params bound as constants (weights are re-stored at build time only
        when they are constants; otherwise a ``layout_transform`` node packs them at run time).
    target : Target or str, optional
        The CPU target the kernels are built for: its vector width sets the channel blocks
        (default: the schedules' no-target ISA, x86-64-v3 / AVX2).

    Returns
    -------
    Graph
        The equivalent graph; unchanged (a copy) when it has no eligible convolution.
    """
    if not any(n.op == "conv2d" for n in graph.nodes):
        return graph
    isa = schedule_isa(target)
    bld = _Builder(graph)
    g = bld.g
    for node in graph.nodes:
        op = node.op
        if op == "constant":
            bld.copy(node)
            continue
        if op == "conv2d":
            data, weight = node.inputs
            wl = _conv_workload(node)
            plan = _conv_plan(node, bld.block_of(data), isa, bld.padded(data), wl)
            warr = weight.const_value
            if plan is not None and warr is None and (data.shape[1] % plan[0] or weight.shape[0] % plan[1]):
                plan = None  # a weight computed at run time is never padded
            if plan is None:
                bld.copy(node)
                continue
            ib, ob = plan
            wino = _winograd_conv(node, bld, ib, ob, isa, wl)
            if wino is not None:
                bld.blocked[node.outputs[0]] = (wino, ob)
                continue
            dw = node.attrs["groups"] != 1 and weight.shape[1] == 1 and node.attrs["groups"] == data.shape[1]
            wlayout = f"OIHW1i{ob}o" if dw else f"OIHW{ib}i{ob}o"
            attrs = {k: node.attrs[k] for k in ("strides", "padding", "dilation", "groups")}
            if warr is not None:
                w = np.asarray(warr)
                # padding channels get zero weights: their output lanes are zero (bias padded with
                # zeros too), and whatever a padding input lane holds contributes nothing
                o_pad = -w.shape[0] % ob
                i_pad = 0 if dw else -data.shape[1] % ib
                if o_pad or i_pad:
                    w = np.pad(w, [(0, o_pad), (0, i_pad), (0, 0), (0, 0)])
                    if dw:
                        attrs["groups"] = w.shape[0]
                wv = g.add_constant(convert_layout(w, "OIHW", wlayout))
            else:
                wv = g.add("layout_transform", bld.nchw(weight), src_layout="OIHW", dst_layout=wlayout)
            out = g.add("conv2d_nchwc", bld.in_block(data, ib), wv, name=node.name, **attrs)
            bld.blocked[node.outputs[0]] = (out, ob)
            continue
        outs = node.outputs
        if op == "concatenate":
            b = _concat_block(node, bld)
            if b is not None:
                # a constant input is re-stored now rather than by a kernel at every run
                ins = [g.add_constant(convert_layout(np.asarray(v.const_value), "NCHW", f"NCHW{b}c"))
                       if v.const_value is not None and v not in bld.blocked else bld.in_block(v, b)
                       for v in node.inputs]
                out = g.add_node(op, ins, {"axis": 1}, name=node.name)[0]
                bld.blocked[outs[0]] = (out, b)
                continue
        if op == "max_pool2d" and node.inputs[0] in bld.blocked:
            bv, b = bld.blocked[node.inputs[0]]
            bld.blocked[outs[0]] = (g.add_node("max_pool2d_nchwc", [bv], node.attrs, name=node.name)[0], b)
            continue
        if op in _SPATIAL_REDUCE and node.inputs[0] in bld.blocked and node.attrs["keepdims"] \
                and sorted(a % 4 for a in node.attrs["axes"]) == [2, 3]:
            # a global pool (squeeze-and-excitation, the classifier's average): reduce the
            # blocked value's (H, W) and stay blocked, (1, C/b, 1, 1, b)
            bv, b = bld.blocked[node.inputs[0]]
            red = g.add_node(op, [bv], {"axes": (2, 3), "keepdims": True}, name=node.name)[0]
            bld.blocked[outs[0]] = (red, b)
            continue
        if len(outs) == 1 and len(outs[0].shape) == 4 and outs[0].dtype == "float32":
            shape = outs[0].shape
            pattern = get_op(op).pattern
            if (pattern == OpPattern.ELEMWISE and len(node.inputs) == 1 and node.inputs[0] in bld.blocked
                    and node.inputs[0].shape == shape and (op in _PAD_SAFE_UNARY or not bld.padded(node.inputs[0]))):
                bv, b = bld.blocked[node.inputs[0]]
                bld.blocked[outs[0]] = (g.add_node(op, [bv], node.attrs, name=node.name)[0], b)
                continue
            if op == "bias_add" and node.attrs["axis"] in (1, -3) and node.inputs[0] in bld.blocked:
                bias = node.inputs[1].const_value
                if bias is not None:
                    bv, b = bld.blocked[node.inputs[0]]
                    cb = g.add_constant(_blocked_channels(np.asarray(bias), b, 0))
                    bld.blocked[outs[0]] = (g.add("add", bv, cb, name=node.name), b)
                    continue
            if op in _BLOCKABLE_BINARY and any(v in bld.blocked for v in node.inputs):
                b = next(bld.blocked[v][1] for v in node.inputs if v in bld.blocked)
                new_ins: list[Value] | None = []
                # a padding lane of a computed divisor is zero: x / 0 would poison it
                divides_padding = shape[1] % b != 0 and op == "divide" and node.inputs[1].const_value is None
                for v in ([] if divides_padding else node.inputs):
                    if v.shape == shape and (v in bld.blocked or not v.is_constant):
                        new_ins.append(bld.in_block(v, b))
                        continue
                    if v.const_value is None and tuple(v.shape) == (shape[0], shape[1], 1, 1):
                        # a computed per-channel scale (squeeze-and-excitation): blocked too
                        new_ins.append(bld.in_block(v, b))
                        continue
                    arr = v.const_value
                    if arr is not None and arr.size == 1:
                        new_ins.append(g.add_constant(np.asarray(arr).reshape(())))
                        continue
                    ch = _channel_const(v, shape) if arr is not None else None
                    if ch is None:
                        new_ins = None
                        break
                    fill = 1 if op == "divide" else 0  # padding lanes stay finite
                    new_ins.append(g.add_constant(_blocked_channels(ch.astype(arr.dtype), b, fill)))
                if new_ins is not None and not divides_padding:
                    bld.blocked[outs[0]] = (g.add_node(op, new_ins, node.attrs, name=node.name)[0], b)
                    continue
        bld.copy(node)
    g.outputs = [bld.nchw(v) for v in graph.outputs]
    for old, new in zip(graph.outputs, g.outputs):
        if new.name is None:
            new.name = old.name
    return dead_code_elimination(g)


def AlterConvLayout(target: Any = None) -> Pass:  # noqa: N802 - pass constructor, TVM style
    """:func:`alter_conv_layout` for ``target`` as a pass (``opt_level`` 3; disable by name
    ``AlterConvLayout``).

    Parameters
    ----------
    target : Target or str, optional
        Sets the channel blocks from its vector width (default: x86-64-v3, AVX2).
    """
    return Pass(lambda graph: alter_conv_layout(graph, target), "AlterConvLayout", opt_level=3)
