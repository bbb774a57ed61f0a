"""GPU schedules (OpenCL, CUDA): outputs spread over work-items with ``Stage.bind``.

Every fused group gets the same treatment, which is correct for any compute:

* non-output injective stages are inlined into their readers (as on the CPU); padding and
  weight-packing stages stay materialized, i.e. kernels of their own (inlining the padding
  into the convolution measured 2.2x slower on PoCL: 505 vs 232 ms for ResNet-18);
* an injective root stage: all axes fused, split by the work-group size, outer loop bound to
  ``blockIdx.x``, inner to ``threadIdx.x`` (contiguous threads touch contiguous elements,
  so global memory accesses coalesce);
* a reduction (conv2d, dense, matmul, pooling, mean, softmax's max / sum ...): the spatial
  axes are bound the same way and each work-item runs the reduction loops serially into a
  private accumulator. When the group's output is a same-shape elementwise epilogue that
  is the reduction's only reader (bias + relu after a conv), the reduction is computed at
  the epilogue's thread loop — one kernel, accumulators never leave registers — and each
  work-item computes a register tile of outputs (up to 8 channels of NCHW results, 8
  columns of 2-D ones) so each loaded input is reused from registers;
* other reductions stay root stages, i.e. separate kernels launched in order (the GPU
  code generator turns their intermediate tensors into temporaries) — softmax is three.

Work-group sizes: ``max_num_threads`` of the target (default 256) for injective stages,
:data:`REDUCE_THREADS` for reductions (fewer, heavier work-items).

Not done here (see ``docs/devices.md``): work-group (local / shared) memory tiling of conv
and dense, and parallel (tree) reductions to a scalar, which run on one work-item. PoCL, the
CPU driver the tests run on, backs local memory with ordinary memory, so little gain is
expected there (not measured); on a discrete GPU both would pay.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ...ir.op import OpPattern
from ...te.schedule import thread_axis
from ..registry import register_schedule
from ..util import prod
from .generic import prepare, readers_after_inline

__all__ = ["schedule_gpu", "bind_flat", "GPU_KINDS", "REDUCE_THREADS", "DEFAULT_THREADS"]

#: Target kinds the schedules here are registered for (plus the pseudo-kind ``gpu``).
GPU_KINDS = ["opencl", "cuda", "gpu"]
#: Work-items per work-group of reduction stages.
REDUCE_THREADS = 64
#: Work-items per work-group of injective stages when the target does not say.
DEFAULT_THREADS = 256
#: Register tile of 2-D reductions with an epilogue: columns per work-item.
TILE = 8
#: Register tile of 4-D (NCHW) reductions: channels x columns per work-item. Columns stay
#: one per work-item so that neighbouring work-items read neighbouring input pixels
#: (coalesced on GPUs; unit-stride vectors for PoCL, which vectorizes across work-items).
#: Measured on PoCL, ResNet-18 224x224, same process: 8x1 230 ms, 4x4 292 ms, 8x8 349 ms,
#: 16x1 391 ms per inference.
TILE_C, TILE_W = 8, 1
#: Work-items per work-group of register-tiled reductions.
TILED_THREADS = 32
#: Register tiles shrink until a reduction has at least this many work-items.
MIN_WORK_ITEMS = 256


def _threads(target: Any) -> int:
    attrs = getattr(target, "attrs", None) or {}
    n = attrs.get("max_num_threads") or DEFAULT_THREADS
    return max(1, int(n))


def bind_flat(st: te.Stage, axes: Sequence[te.IterVar], threads: int, total: int | None = None
              ) -> te.IterVar | None:
    """Fuse ``axes``, split by ``threads`` and bind to ``blockIdx.x`` / ``threadIdx.x``.

    ``total`` is the number of iterations of the fused loop; it defaults to the product of
    the axes' domains, which only root axes know (pass it for split / fused axes).
    Returns the ``threadIdx.x`` loop (where per-element work can be attached), or None
    when there are no axes (a scalar output runs on one work-item).
    """
    axes = list(axes)
    if not axes:
        return None
    if total is None:
        total = prod(iv.dom_extent for iv in axes)
    fused = st.fuse(*axes) if len(axes) > 1 else axes[0]
    nt = max(1, min(threads, total))
    bx, tx = st.split(fused, factor=nt)
    st.bind(bx, thread_axis("blockIdx.x"))
    st.bind(tx, thread_axis("threadIdx.x"))
    return tx


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _attach_tiled(red: te.Stage, out: te.Stage) -> None:
    """Compute ``red`` inside ``out``'s work-items, each producing a register tile.

    A work-item computes up to :data:`TILE_C` x :data:`TILE_W` outputs (channel axis x last
    axis) of 4-D NCHW results, :data:`TILE` of the last axis of 2-D ones: the reduction loops
    run outside the tile, so every loaded input is reused from registers (the tile is a
    private array with unrolled loops). Measured on PoCL (2 shared cores, ResNet-18
    224x224, same process): 423 ms per inference against 1627 ms with one output per
    work-item.
    """
    axes = list(out.op.axis)
    ext = [iv.dom_extent for iv in axes]
    tiles: dict[int, int] = {}
    if len(axes) == 4:
        tiles = {1: _largest_divisor(ext[1], TILE_C), 3: _largest_divisor(ext[3], TILE_W)}
    elif len(axes) == 2:
        tiles = {1: _largest_divisor(ext[1], TILE)}
    # small outputs: shrink the tiles until there are enough work-items to fill a device
    while tiles and prod(e // tiles.get(k, 1) for k, e in enumerate(ext)) < MIN_WORK_ITEMS \
            and max(tiles.values()) > 1:
        k = max(tiles, key=lambda j: tiles[j])
        tiles[k] = _largest_divisor(ext[k], tiles[k] // 2)
    tiles = {k: v for k, v in tiles.items() if v > 1}
    if not tiles:
        red.compute_at(out, bind_flat(out, axes, REDUCE_THREADS))
        return
    outer, inner = [], []
    for k, iv in enumerate(axes):
        if k in tiles:
            o, i = out.split(iv, factor=tiles[k])
            outer.append(o)
            inner.append(i)
        else:
            outer.append(iv)
    out.reorder(*outer, *inner)
    # One flat index: binding (batch, channel block) to blockIdx.y instead measured 1.5x
    # slower on PoCL (667 vs 437 ms, ResNet-18).
    n_outer = prod(e // tiles.get(k, 1) for k, e in enumerate(ext))
    tx = bind_flat(out, outer, TILED_THREADS, total=n_outer)
    for i in inner:
        out.unroll(i)
    red.compute_at(out, tx)
    raxes = list(red.op.axis)
    untiled = [iv for k, iv in enumerate(raxes) if k not in tiles]
    tiled = [iv for k, iv in enumerate(raxes) if k in tiles]
    red.reorder(*untiled, *red.op.reduce_axis, *tiled)
    for iv in tiled:
        red.unroll(iv)


def schedule_gpu(outs: Sequence[te.Tensor], target: Any = None) -> te.Schedule:
    """Schedule any fused group for a GPU target (see the module docstring)."""
    s = prepare(outs)
    threads = _threads(target)
    readers = readers_after_inline(s)
    handled: set[int] = set()
    for st in s.stages:
        if not isinstance(st.op, te.ComputeOp) or st.attach_type != "root" or id(st.op) in handled:
            continue
        if st.op.reduce_axis:
            rd = readers.get(id(st.op), [])
            out = rd[0] if len(rd) == 1 else None
            if (out is not None and out.is_output and not st.is_output and not out.op.reduce_axis
                    and id(out.op) not in handled and out.op.axis
                    and tuple(out.op.output(0).shape) == tuple(st.op.output(0).shape)):
                _attach_tiled(st, out)
                handled.add(id(out.op))
            else:
                bind_flat(st, st.op.axis, REDUCE_THREADS)
        else:
            bind_flat(st, st.op.axis, threads)
        handled.add(id(st.op))
    return s


for _p in (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE, OpPattern.TUPLE, OpPattern.OPAQUE,
           OpPattern.OUT_ELEMWISE_FUSABLE, OpPattern.COMM_REDUCE):
    register_schedule(_p, GPU_KINDS, schedule_gpu, override=True)
