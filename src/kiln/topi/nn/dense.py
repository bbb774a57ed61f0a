"""Dense (``x @ W^T``) and batched matmul.

Both read their right operand through a *packed* copy: ``(ceil(N / bn), K, bn)`` panels,
zero-padded in N, with ``bn`` = :func:`dense_panel_width` of the target's instruction set
(the column count of its GEMM register tile: 8 for SSE2, 16 for AVX2 and NEON, 64 for
AVX-512; :data:`DENSE_PACK_BN` when no target is known).  A column block of
the output then reads one contiguous panel row per ``k`` — one cache line, no 4 KiB
aliasing between the rows of a wide ``B`` — and the x86 schedule builds each panel right
before the column block that uses it (``compute_at``), so the copy is one pass over the
weights done while they are in cache anyway.  The pack stages are tagged
:data:`TAG_DENSE_PACK` so schedules find them.  A dense with at most
:data:`DENSE_GEMV_MAX_M` rows (a classifier's final FC) is a memory-bound GEMV instead:
partial dot products along K (:data:`TAG_DENSE_GEMV`, :func:`gemv_lanes` per output), no packing.

The layout is decided here, in the compute, and nowhere else: the pack stage and the
anchor's ``bn`` attribute come from the same number, and the x86 schedule tiles columns by
``attrs["bn"]`` (rows by what fits beside a panel), so the two always agree.  The target
comes from the ``target`` argument or, for the registered computes (whose signature has
none), from an active :func:`kiln.topi.knobs.kernel_target`.
"""

from __future__ import annotations

from typing import Any, Sequence

from ... import te
from ...runtime.errors import TargetError
from ...target import ISA
from ..knobs import current_config, current_kernel_target, workload_key
from ..broadcast import broadcast_shape
from ..registry import register_compute
from ..util import acc_dtype, output_stage, prod

__all__ = ["dense", "matmul", "dense_panel_width", "dense_panels", "pack_dense_weight", "gemv_lanes", "TAG_DENSE",
           "TAG_DENSE_PACK", "TAG_DENSE_GEMV", "TAG_MATMUL", "DENSE_PACK_BN", "DENSE_PACK_MIN_M", "DENSE_GEMV_MAX_M"]

TAG_DENSE = "dense"
TAG_DENSE_PACK = "dense_pack"
TAG_MATMUL = "matmul"
TAG_DENSE_GEMV = "dense_gemv_part"
#: Up to this many rows dense is computed as a GEMV (partial dot products along K).
DENSE_GEMV_MAX_M = 3
#: Panel width of the packed right operand when no target is known: what
#: :func:`dense_panel_width` gives for the schedules' no-target ISA (x86-64-v3: two 8-float
#: AVX2 vectors, register tile 6 x 16).  ``tests/topi/test_isa_tiles.py`` checks the two agree.
DENSE_PACK_BN = 16
#: Kept for compatibility: packing no longer depends on the row count (the M = 1 GEMV reads
#: the weight once either way, and the panel makes its loads contiguous).
DENSE_PACK_MIN_M = 1


def _isa(target: Any) -> ISA:
    """The instruction set a dense / matmul compute lays its operands out for."""
    # imported here: the x86 schedule module imports this one (for the tags)
    from ..schedule.x86 import schedule_isa

    t = target if target is not None else current_kernel_target()
    try:
        return schedule_isa(t)
    except TargetError:
        # a GPU target has no CPU ISA; its schedules read the panels whatever their width
        return schedule_isa(None)


def dense_panel_width(isa: ISA, dtype: str = "float32", n: int | None = None) -> int:
    """Width ``bn`` of the packed panels of a dense / matmul right operand.

    It is the column count of the instruction set's GEMM register tile
    (:func:`kiln.topi.schedule.x86.gemm_register_tile`): a packed kernel's column tile is one
    panel, so the panel is as wide as the tile the register file holds — SSE2 8 (6 x 8 tile),
    AVX2 16 (6 x 16), NEON 16 (6 x 16, 32 registers), AVX-512 64 (6 x 64).  With ``n`` (the
    output columns) that ``bn`` does not divide, the widest whole number of vectors (at least
    two) that divides ``n`` is taken: ConvNeXt-T's N = 96 on AVX-512 packs into two panels of
    48 (a 9 x 48 tile) instead of 64 + a guarded half-empty 64, which ran 3136 x 384 x 96 at 112
    GFLOP/s against 271 for N = 128, now 266 (Zen 5, 1 thread; ``python bench/bench_matmul.py
    --shapes 3136x384x96,3136x384x128 --variants const --threads 1``).  Without such a width
    the panel is halved while it is wider than ``n`` and more than two vectors, so a narrow N
    still packs into whole panels instead of padding to one wide one.

    Parameters
    ----------
    isa : ISA
        The target's instruction-set model.
    dtype : str
        Accumulator dtype (sets the lanes per register).
    n : int, optional
        Output columns ``N``.

    Returns
    -------
    int
    """
    from ..schedule.x86 import gemm_register_tile

    bn = gemm_register_tile(isa, dtype)[1]
    lanes = isa.lanes(dtype)
    floor = 2 * lanes
    if n is not None and n % bn:
        for width in range(bn - lanes, floor - 1, -lanes):
            if n % width == 0:
                return width
    while n is not None and bn > n and bn > floor:
        bn //= 2
    return bn


#: Fewest partial sums of a GEMV step: 16 (AVX2: two ``ymm``, the measured choice; SSE2 and
#: NEON: four 4-lane registers, see :func:`gemv_lanes`).
_GEMV_MIN_PARTIALS = 16


def gemv_lanes(isa: ISA, dtype: str, k: int) -> int:
    """Partial sums per output of a few-row dense (:data:`TAG_DENSE_GEMV`); 0 = no GEMV form.

    Two vectors of ``dtype`` (two independent accumulator chains), and at least
    :data:`_GEMV_MIN_PARTIALS`: the product is memory-bound, and a narrower step keeps fewer
    weight loads in flight.  float32: AVX2 16 (2 ``ymm``), SSE2 / NEON 16 (4 registers),
    AVX-512 32 (2 ``zmm``).  Half of that when ``k`` is no multiple of it (but at least one
    vector); the reduction length must be a multiple of the result.

    Measured (Zen 3, 1 thread, ``llvm`` = SSE2, GFLOP/s, median of 7 interleaved rounds): 1×2048
    @ 2048×1000: 14.2 with 8 partial sums, 16.6 with 16, 15.6 with 32; 1×512 @ 512×2048,
    1×2048 @ 2048×2048, 1×4096 @ 4096×4096 within noise of each other.
    """
    lanes = isa.lanes(dtype)
    want = max(2 * lanes, _GEMV_MIN_PARTIALS)
    for cand in (want, want // 2):
        if cand >= max(2, lanes) and k % cand == 0:
            return cand
    return 0


def dense_panels(data_shape: Sequence[int], weight_shape: Sequence[int], dtype: str, target: Any = None) -> int:
    """Width ``bn`` of the panels a dense of these shapes reads its weight ``(N, K)`` through,
    or 0 when it reads the weight as it is (a few-row GEMV, or ``N`` narrower than a panel).

    The panel width is the schedule's column tile knob ``nt`` (a tuning log may set it per
    workload); whether to pack at all is a fixed rule. Both the compute (which packs per call)
    and :class:`kiln.transform.PackDenseWeights` (which packs a constant weight at build
    time, :func:`pack_dense_weight`) ask this function, so they always agree.
    """
    nn = int(weight_shape[0])
    acc = acc_dtype(dtype)
    default_bn = dense_panel_width(_isa(target), acc, nn)
    if not (prod(data_shape[:-1]) > DENSE_GEMV_MAX_M and nn >= default_bn):
        return 0
    wl = workload_key("dense", tuple(data_shape), tuple(weight_shape), dtype)
    return int(current_config("dense", wl, {"nt": default_bn})["nt"])


def pack_dense_weight(weight: Any, bn: int) -> Any:
    """NumPy: a dense weight ``(N, K)`` as ``(ceil(N / bn), K, bn)`` panels, zero-padded in N."""
    import numpy as np

    w = np.asarray(weight)
    n, k = w.shape
    w = np.pad(w, [(0, -n % bn), (0, 0)])
    return np.ascontiguousarray(w.reshape(-1, bn, k).transpose(0, 2, 1))


def dense(data: te.Tensor, weight: te.Tensor, pack: bool | None = None, target: Any = None,
          units: int = 0) -> te.Tensor:
    """``out[..., n] = sum_k data[..., k] * weight[n, k]``.

    Parameters
    ----------
    data : te.Tensor
        ``(..., K)``.
    weight : te.Tensor
        ``(N, K)``, or with ``units = N`` the panels :func:`pack_dense_weight` made at build time
        ``(ceil(N / bn), K, bn)``: the kernel then reads them directly (no pack stage).
    pack : bool, optional
        Repack the weight into N-panels (default: :func:`dense_panels`).
    target : Target or str, optional
        The CPU target whose instruction set sizes the panels and the GEMV lanes (default:
        :func:`kiln.topi.knobs.current_kernel_target`, else the schedules' no-target ISA).
    units : int
        ``N`` of a weight packed at build time; 0 for a plain ``(N, K)`` weight.
    """
    lead = tuple(data.shape[:-1])
    acc = acc_dtype(data.dtype)
    if units:
        # panels made at build time: the kernel reads them as a pack stage's output
        nn, (_, kk, bn) = units, weight.shape
        pack = True
        wp: Any = weight
        # the workload of the unpacked shapes: what the tuner logged and the pass packed for
        wl = workload_key("dense", data.shape, (nn, kk), data.dtype)
    else:
        nn, kk = weight.shape
        isa = _isa(target)
        panels = dense_panels(data.shape, weight.shape, data.dtype, target)
        if pack is None:
            pack = panels > 0
        lanes = gemv_lanes(isa, acc, int(kk))
        if prod(lead) <= DENSE_GEMV_MAX_M and lanes and kk >= 2 * lanes and not pack:
            return output_stage(_dense_gemv(data, weight, lanes), data.dtype, "dense_out")
        wl = workload_key("dense", data.shape, weight.shape, data.dtype)
        default_bn = dense_panel_width(isa, acc, int(nn))
        bn = (panels or int(current_config("dense", wl, {"nt": default_bn})["nt"])) if pack else default_bn
        if pack:
            wp = te.compute((-(-nn // bn), kk, bn),
                            lambda no, kv, ni: te.if_then_else(no * bn + ni < nn, weight[no * bn + ni, kv],
                                                               te.const(0, weight.dtype)) if nn % bn
                            else weight[no * bn + ni, kv],
                            name="dense_wpack", tag=TAG_DENSE_PACK)
    k = te.reduce_axis((0, kk), name="k")
    if pack:
        def body(*i: Any) -> Any:
            j = i[-1]
            return te.sum(te.cast(data[tuple(i[:-1]) + (k,)], acc)
                          * te.cast(wp[te.floordiv(j, bn), k, te.floormod(j, bn)], acc), axis=k)
    else:
        def body(*i: Any) -> Any:
            return te.sum(te.cast(data[tuple(i[:-1]) + (k,)], acc) * te.cast(weight[i[-1], k], acc), axis=k)

    out = te.compute(lead + (nn,), body, name="dense", tag=TAG_DENSE,
                     attrs={"packed": bool(pack), "bn": bn, "workload": wl})
    return output_stage(out, data.dtype, "dense_out")


def _dense_gemv(data: te.Tensor, weight: te.Tensor, lanes: int) -> te.Tensor:
    """Few-row dense as ``lanes`` interleaved partial dot products per output, then their sum.

    ``part[..., n, l] = sum_ko data[..., ko*L + l] * weight[n, ko*L + l]`` reads a weight
    row contiguously (one vector per ``ko``), so the memory-bound GEMV streams the weight
    once at full speed instead of packing it (the pack would cost as much as the product).
    """
    nn, kk = weight.shape
    lead = tuple(data.shape[:-1])
    acc = acc_dtype(data.dtype)
    ko = te.reduce_axis((0, kk // lanes), name="ko")

    def pbody(*i: Any) -> Any:
        n, lane = i[-2], i[-1]
        kv = ko * lanes + lane
        return te.sum(te.cast(data[tuple(i[:-2]) + (kv,)], acc) * te.cast(weight[n, kv], acc), axis=ko)

    part = te.compute(lead + (nn, lanes), pbody, name="dense_part", tag=TAG_DENSE_GEMV)
    lr = te.reduce_axis((0, lanes), name="lr")
    return te.compute(lead + (nn,), lambda *i: te.sum(part[tuple(i) + (lr,)], axis=lr), name="dense", tag=TAG_DENSE,
                      attrs={"packed": False, "gemv": True, "lanes": lanes,
                             "workload": workload_key("dense", data.shape, weight.shape, data.dtype)})


@register_compute("dense")
def _dense(attrs: dict, inputs: list, out_types: list) -> list:
    return [dense(inputs[0], inputs[1], units=int(attrs.get("units", 0)))]


def matmul(a: te.Tensor, b: te.Tensor, pack: bool | None = None, target: Any = None) -> te.Tensor:
    """Batched ``(..., M, K) x (..., K, N)`` with broadcast batch dims.

    Parameters
    ----------
    a, b : te.Tensor
    pack : bool, optional
        Read ``b`` through ``(..., ceil(N / bn), K, bn)`` panels (default: when N is at least
        one panel wide and there are more than :data:`DENSE_GEMV_MAX_M` rows).
    target : Target or str, optional
        As for :func:`dense`: the instruction set that sizes the panels.
    """
    mm, kk = a.shape[-2:]
    nn = b.shape[-1]
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    nb = len(batch)
    acc = acc_dtype(a.dtype)
    k = te.reduce_axis((0, kk), name="k")
    bn = dense_panel_width(_isa(target), acc, int(nn))
    if pack is None:
        # a few rows read each B row once anyway: no pack (it would double the traffic)
        pack = nn >= bn and mm > DENSE_GEMV_MAX_M
    # a dynamic column count (attention's scores = Q x K^T over a dynamic sequence): the
    # panels read column ``panel * bn + lane`` only below the runtime extent, zeros past it
    ncols = b.dyn[-1] if b.dyn is not None and b.dyn[-1] is not None else None
    wl = workload_key("matmul", a.shape, b.shape, a.dtype)
    if pack:
        bn = int(current_config("matmul", wl, {"nt": bn})["nt"])

    def bidx(t: te.Tensor, idx: tuple[Any, ...]) -> tuple[Any, ...]:
        tb = t.shape[:-2]
        off = nb - len(tb)
        return tuple(0 if d == 1 else idx[off + q] for q, d in enumerate(tb))

    if pack:
        npan = -(-nn // bn)
        bb = tuple(b.shape[:-2])

        def pbody(*i: Any) -> Any:
            lead, no, kv, ni = i[:-3], i[-3], i[-2], i[-1]
            v = b[tuple(lead) + (kv, no * bn + ni)]
            if ncols is not None:
                return te.if_then_else(no * bn + ni < ncols, v, te.const(0, b.dtype))
            if nn % bn:
                return te.if_then_else(no * bn + ni < nn, v, te.const(0, b.dtype))
            return v

        bp = te.compute(bb + (npan, kk, bn), pbody, name="matmul_bpack", tag=TAG_DENSE_PACK)

        def body(*i: Any) -> Any:
            bi, m, n = i[:nb], i[nb], i[nb + 1]
            return te.sum(te.cast(a[bidx(a, bi) + (m, k)], acc)
                          * te.cast(bp[bidx(b, bi) + (te.floordiv(n, bn), k, te.floormod(n, bn))], acc), axis=k)
    else:
        def body(*i: Any) -> Any:
            bi, m, n = i[:nb], i[nb], i[nb + 1]
            return te.sum(te.cast(a[bidx(a, bi) + (m, k)], acc) * te.cast(b[bidx(b, bi) + (k, n)], acc), axis=k)

    out = te.compute(batch + (mm, nn), body, name="matmul", tag=TAG_MATMUL,
                     attrs={"packed": bool(pack), "bn": bn, "workload": wl})
    return output_stage(out, a.dtype, "matmul_out")


@register_compute("matmul")
def _matmul(attrs: dict, inputs: list, out_types: list) -> list:
    return [matmul(inputs[0], inputs[1])]
