"""Kernels in work-group (shared) memory, written with the schedule API, shared by the OpenCL and
CUDA tests (the GPU source generator is common to both): a tiled matmul and a tree reduction."""

from __future__ import annotations

from kiln import te, tir
from kiln.te.schedule import thread_axis
from kiln.topi.schedule import gpu


def shared_matmul(m: int, n: int, k: int, bm: int = 16, r: int = 2, ks: int = 8, a_scope: str = "shared"
                  ) -> tir.PrimFunc:
    """``C = A @ B`` with A and B tiles staged in work-group memory per K-step (with
    ``a_scope="local"``, each work-item copies its own rows of A into private memory)."""
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    kv = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, kv] * B[kv, j], axis=kv), name="C")
    s = te.create_schedule(C)
    i, j = C.op.axis
    by, ii = s[C].split(i, factor=bm * r)
    bx, jj = s[C].split(j, factor=bm * r)
    ty, yi = s[C].split(ii, factor=r)
    tx, xi = s[C].split(jj, factor=r)
    ko, ki = s[C].split(kv, factor=ks)
    s[C].reorder(by, bx, ty, tx, ko, ki, yi, xi)
    t = s[C].fuse(ty, tx)
    s[C].bind(by, thread_axis("blockIdx.y"))
    s[C].bind(bx, thread_axis("blockIdx.x"))
    s[C].bind(t, thread_axis("threadIdx.x"))
    for T, scope in ((A, a_scope), (B, "shared")):
        c = s.cache_read(T, scope, [C])
        s[c].compute_at(s[C], ko)
        if scope == "local":
            continue
        f = s[c].fuse(*s[c].op.axis)
        _, ti = s[c].split(f, factor=bm * bm)
        s[c].bind(ti, thread_axis("threadIdx.x"))
    return tir.lower(s, [A, B, C], name="mm")


def tree_reduce(rows: int | None, k: int, kind: str, threads: int = 64) -> tir.PrimFunc:
    """Per-row (or, with ``rows=None``, whole-array) sum / max as a work-group tree reduction."""
    red = te.sum if kind == "sum" else te.reduce_max
    if rows is None:
        A = te.placeholder((k,), name="A")
        kv = te.reduce_axis((0, k), name="k")
        C = te.compute((1,), lambda i: red(A[kv], axis=kv), name="C")
    else:
        A = te.placeholder((rows, k), name="A")
        kv = te.reduce_axis((0, k), name="k")
        C = te.compute((rows,), lambda i: red(A[i, kv], axis=kv), name="C")
    s = te.create_schedule(C)
    gpu.schedule_tree_reduce(s[C], threads)
    return tir.lower(s, [A, C], name="red")
