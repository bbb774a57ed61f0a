"""Dense (``x @ W^T``) and batched matmul.

``dense`` weights are ``(N, K)``: reading them along N is strided, which defeats
vectorisation over output columns.  For GEMM-sized problems the compute therefore
repacks the weight into ``(ceil(N / bn), K, bn)`` panels inside the kernel (an
``O(N K)`` copy next to ``O(M N K)`` work, tagged ``dense_pack`` so schedules keep it as
its own parallel stage); the later alter-layout pass can hoist this into the params.
"""

from __future__ import annotations

from typing import Any

from ... import te
from ..broadcast import broadcast_shape
from ..registry import register_compute
from ..util import TAG_ELEMWISE, acc_dtype, prod

__all__ = ["dense", "matmul", "TAG_DENSE", "TAG_DENSE_PACK", "TAG_MATMUL", "DENSE_PACK_BN", "DENSE_PACK_MIN_M"]

TAG_DENSE = "dense"
TAG_DENSE_PACK = "dense_pack"
TAG_MATMUL = "matmul"
#: Panel width of the packed dense weight (four 8-float AVX vectors; 16 makes gcc vectorise the wrong loop).
DENSE_PACK_BN = 32
#: Below this many rows the packing copy costs as much as the product: read W directly.
DENSE_PACK_MIN_M = 8


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
        Repack the weight into N-panels (default: when there are at least
        :data:`DENSE_PACK_MIN_M` rows and N is at least one panel wide).
    """
    nn, kk = weight.shape
    lead = tuple(data.shape[:-1])
    m = prod(lead)
    acc = acc_dtype(data.dtype)
    if pack is None:
        pack = m >= DENSE_PACK_MIN_M and nn >= DENSE_PACK_BN
    k = te.reduce_axis((0, kk), name="k")
    bn = DENSE_PACK_BN
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

    out = te.compute(lead + (nn,), body, name="dense", tag=TAG_DENSE, attrs={"packed": bool(pack), "bn": bn})
    return _finish(out, data.dtype, "dense_out")


@register_compute("dense")
def _dense(attrs: dict, inputs: list, out_types: list) -> list:
    return [dense(inputs[0], inputs[1])]


def matmul(a: te.Tensor, b: te.Tensor) -> te.Tensor:
    """Batched ``(..., M, K) x (..., K, N)`` with broadcast batch dims."""
    mm, kk = a.shape[-2:]
    nn = b.shape[-1]
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    nb = len(batch)
    acc = acc_dtype(a.dtype)
    k = te.reduce_axis((0, kk), name="k")

    def bidx(t: te.Tensor, idx: tuple[Any, ...]) -> tuple[Any, ...]:
        tb = t.shape[:-2]
        off = nb - len(tb)
        return tuple(0 if d == 1 else idx[off + q] for q, d in enumerate(tb))

    def body(*i: Any) -> Any:
        bi, m, n = i[:nb], i[nb], i[nb + 1]
        return te.sum(te.cast(a[bidx(a, bi) + (m, k)], acc) * te.cast(b[bidx(b, bi) + (k, n)], acc), axis=k)

    out = te.compute(batch + (mm, nn), body, name="matmul", tag=TAG_MATMUL)
    return _finish(out, a.dtype, "matmul_out")


@register_compute("matmul")
def _matmul(attrs: dict, inputs: list, out_types: list) -> list:
    return [matmul(inputs[0], inputs[1])]
