"""Dense (``x @ W^T``) and batched matmul.

Both read their right operand through a *packed* copy: ``(ceil(N / bn), K, bn)`` panels
(``bn`` = :data:`DENSE_PACK_BN`, two AVX2 vectors), zero-padded in N.  A column block of
the output then reads one contiguous panel row per ``k`` — one cache line, no 4 KiB
aliasing between the rows of a wide ``B`` — and the x86 schedule builds each panel right
before the column block that uses it (``compute_at``), so the copy is one pass over the
weights done while they are in cache anyway.  The pack stages are tagged
:data:`TAG_DENSE_PACK` so schedules find them.  A dense with at most
:data:`DENSE_GEMV_MAX_M` rows (a classifier's final FC) is a memory-bound GEMV instead:
partial dot products along K (:data:`TAG_DENSE_GEMV`), no packing.
"""

from __future__ import annotations

from typing import Any

from ... import te
from ..knobs import current_config, workload_key
from ..broadcast import broadcast_shape
from ..registry import register_compute
from ..util import TAG_ELEMWISE, acc_dtype, prod

__all__ = ["dense", "matmul", "TAG_DENSE", "TAG_DENSE_PACK", "TAG_DENSE_GEMV", "TAG_MATMUL", "DENSE_PACK_BN",
           "DENSE_PACK_MIN_M", "DENSE_GEMV_MAX_M"]

TAG_DENSE = "dense"
TAG_DENSE_PACK = "dense_pack"
TAG_MATMUL = "matmul"
TAG_DENSE_GEMV = "dense_gemv_part"
#: Up to this many rows dense is computed as a GEMV (partial dot products along K).
DENSE_GEMV_MAX_M = 3
#: Panel width of the packed right operand: two 8-float AVX2 vectors (register tile 6 x 16).
DENSE_PACK_BN = 16
#: Kept for compatibility: packing no longer depends on the row count (the M = 1 GEMV reads
#: the weight once either way, and the panel makes its loads contiguous).
DENSE_PACK_MIN_M = 1


def _finish(out: te.Tensor, dtype: str, name: str) -> te.Tensor:
    # Always a separate (elementwise) output stage, even without a dtype change: the
    # reduction then accumulates into a small local tile attached to this stage's loops
    # (what TVM's cache_write gives), and a fused epilogue simply replaces it.
    return te.compute(out.shape, lambda *i: te.cast(out[i], dtype), name=name, tag=TAG_ELEMWISE)


def dense(data: te.Tensor, weight: te.Tensor, pack: bool | None = None) -> te.Tensor:
    """``out[..., n] = sum_k data[..., k] * weight[n, k]``.

    Parameters
    ----------
    data : te.Tensor
        ``(..., K)``.
    weight : te.Tensor
        ``(N, K)``.
    pack : bool, optional
        Repack the weight into N-panels (default: when N is at least one panel wide).
    """
    nn, kk = weight.shape
    lead = tuple(data.shape[:-1])
    m = prod(lead)
    acc = acc_dtype(data.dtype)
    if pack is None:
        pack = m > DENSE_GEMV_MAX_M and nn >= DENSE_PACK_BN
    lanes = 16 if kk % 16 == 0 else 8 if kk % 8 == 0 else 0
    if m <= DENSE_GEMV_MAX_M and lanes and kk >= 2 * lanes and not pack:
        return _finish(_dense_gemv(data, weight, lanes), data.dtype, "dense_out")
    k = te.reduce_axis((0, kk), name="k")
    wl = workload_key("dense", data.shape, weight.shape, data.dtype)
    # the panel width is the schedule's column tile knob ``nt`` (a packed kernel's column
    # tile is one panel); whether to pack at all stays a fixed rule
    bn = int(current_config("dense", wl, {"nt": DENSE_PACK_BN})["nt"]) if pack else DENSE_PACK_BN
    if pack:
        npan = -(-nn // bn)
        wp = te.compute((npan, kk, bn),
                        lambda no, kv, ni: te.if_then_else(no * bn + ni < nn, weight[no * bn + ni, kv],
                                                           te.const(0, weight.dtype)) if nn % bn
                        else weight[no * bn + ni, kv],
                        name="dense_wpack", tag=TAG_DENSE_PACK)

        def body(*i: Any) -> Any:
            j = i[-1]
            return te.sum(te.cast(data[tuple(i[:-1]) + (k,)], acc)
                          * te.cast(wp[te.floordiv(j, bn), k, te.floormod(j, bn)], acc), axis=k)
    else:
        def body(*i: Any) -> Any:
            return te.sum(te.cast(data[tuple(i[:-1]) + (k,)], acc) * te.cast(weight[i[-1], k], acc), axis=k)

    out = te.compute(lead + (nn,), body, name="dense", tag=TAG_DENSE,
                     attrs={"packed": bool(pack), "bn": bn, "workload": wl})
    return _finish(out, data.dtype, "dense_out")


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
    return [dense(inputs[0], inputs[1])]


def matmul(a: te.Tensor, b: te.Tensor, pack: bool | None = None) -> te.Tensor:
    """Batched ``(..., M, K) x (..., K, N)`` with broadcast batch dims.

    Parameters
    ----------
    a, b : te.Tensor
    pack : bool, optional
        Read ``b`` through ``(..., ceil(N / bn), K, bn)`` panels (default: when N is at least
        one panel wide and there are more than :data:`DENSE_GEMV_MAX_M` rows).
    """
    mm, kk = a.shape[-2:]
    nn = b.shape[-1]
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    nb = len(batch)
    acc = acc_dtype(a.dtype)
    k = te.reduce_axis((0, kk), name="k")
    bn = DENSE_PACK_BN
    if pack is None:
        # a few rows read each B row once anyway: no pack (it would double the traffic)
        pack = nn >= bn and mm > DENSE_GEMV_MAX_M
    wl = workload_key("matmul", a.shape, b.shape, a.dtype)
    if pack:
        bn = int(current_config("matmul", wl, {"nt": DENSE_PACK_BN})["nt"])

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
    return _finish(out, a.dtype, "matmul_out")


@register_compute("matmul")
def _matmul(attrs: dict, inputs: list, out_types: list) -> list:
    return [matmul(inputs[0], inputs[1])]
