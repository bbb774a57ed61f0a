"""Dynamic dimensions in the padded layout: te → lower → C / LLVM → run on max-shape storage.

Every argument is a NumPy array of the static (maximum) shape; the DLTensor handed to the
kernel carries the actual shape.  Only the valid box ``[0:a0, 0:a1, ...]`` of an output is
compared with NumPy; the inputs' padding holds NaN so that any leak shows up.
All kernels of a target are compiled into one module (compilation dominates test time).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kiln import codegen, te, tir, topi
from kiln.codegen.c import generate_c
from kiln.runtime import _ffi
from kiln.runtime.errors import CompileError

TARGETS = ["c", "llvm"]
RNG = np.random.default_rng(0)
DL_CODES = {"float32": (2, 32), "int32": (0, 32)}


# ----------------------------------------------------------------------------- helpers
def _call(fn, arrays, shapes, strides=None):
    """Call packed ``fn`` with DLTensors over ``arrays`` (max-shape storage) claiming ``shapes``.

    Returns the kernel's return code (0 on success).
    """
    keep, ts = [], []
    for k, (a, shp) in enumerate(zip(arrays, shapes)):
        t = _ffi.DLTensor()
        t.data = a.ctypes.data
        t.device = _ffi.DLDevice(1, 0)
        t.ndim = a.ndim
        t.dtype = _ffi.DLDataType(*DL_CODES[str(a.dtype)], 1)
        s = (ctypes.c_int64 * a.ndim)(*shp)
        t.shape = s
        keep.append(s)
        if strides is not None and strides[k] is not None:
            st = (ctypes.c_int64 * a.ndim)(*strides[k])
            t.strides = st
            keep.append(st)
        ts.append(t)
    vals = (_ffi.KilnValue * len(ts))()
    codes = (ctypes.c_int32 * len(ts))()
    for i, t in enumerate(ts):
        vals[i].v_handle = ctypes.addressof(t)
        codes[i] = 7
    rv, rc = _ffi.KilnValue(), ctypes.c_int32()
    return _ffi.PackedCFunc(fn.address)(vals, codes, len(ts), ctypes.byref(rv), ctypes.byref(rc), None)


def _padded(shape, valid, lo=-1.0, hi=1.0):
    """A max-shape float32 array: random in the valid box, NaN elsewhere."""
    a = np.full(shape, np.nan, "float32")
    box = tuple(slice(0, v) for v in valid)
    a[box] = RNG.uniform(lo, hi, size=valid).astype("float32")
    return a


def _box(a, valid):
    return a[tuple(slice(0, v) for v in valid)]


# ----------------------------------------------------------------------------- kernels
N, M, K = te.var("n"), te.var("m"), te.var("k")


def k_bcast_add():
    """Broadcast add with a [1]-extent axis: C[n, m] = A[n, m] + B[0, m] (injective schedule)."""
    A = te.placeholder((64, 37), name="A", dyn=(N, M))
    B = te.placeholder((1, 37), name="B", dyn=(None, M))
    C = te.compute((64, 37), lambda i, j: A[i, j] + B[0, j], name="C")
    return tir.lower(topi.schedule_injective([C]), [A, B, C], "dyn_bcast_add")


def k_fused4d():
    """4-D elementwise with a dynamic batch: the injective schedule fuses the outer axes."""
    A = te.placeholder((9, 3, 4, 5), name="A", dyn=(N, None, None, None))
    C = te.compute(A.shape, lambda a, b, c, d: te.exp(A[a, b, c, d]) * 2.0, name="C")
    s = te.create_schedule(C)
    f = s[C].fuse(*C.op.axis)
    fo, fi = s[C].split(f, factor=8)
    s[C].vectorize(fi)
    s[C].parallel(fo)
    return tir.lower(s, [A, C], "dyn_fused4d")


def k_sum_last():
    """Row sum over a dynamic last axis (generic reduce schedule)."""
    A = te.placeholder((20, 50), name="A", dyn=(N, M))
    r = te.reduce_axis((0, 50), "r")
    S = te.compute((20,), lambda i: te.sum(A[i, r], axis=r), name="S")
    return tir.lower(topi.schedule_reduce([S]), [A, S], "dyn_sum_last")


def k_softmax():
    """Row softmax over a dynamic last axis, hand-written, generic reduce schedule."""
    A = te.placeholder((6, 40), name="A", dyn=(N, M))
    r1 = te.reduce_axis((0, 40), "r1")
    mx = te.compute((6,), lambda i: te.reduce_max(A[i, r1], axis=r1), name="mx")
    e = te.compute((6, 40), lambda i, j: te.exp(A[i, j] - mx[i]), name="e")
    r2 = te.reduce_axis((0, 40), "r2")
    sm = te.compute((6,), lambda i: te.sum(e[i, r2], axis=r2), name="sm")
    out = te.compute((6, 40), lambda i, j: e[i, j] / sm[i], name="out")
    return tir.lower(topi.schedule_reduce([out]), [A, out], "dyn_softmax")


def k_matmul_vec():
    """C[m, n] = sum_k A[m, k] B[k, n] with dynamic M and K: split, vectorize, parallel."""
    A = te.placeholder((33, 21), name="A", dyn=(M, K))
    B = te.placeholder((21, 40), name="B", dyn=(K, None))
    k = te.reduce_axis((0, 21), "kk")
    C = te.compute((33, 40), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=4)
    jo, ji = s[C].split(j, factor=8)
    ko, ki = s[C].split(k, factor=4)
    s[C].reorder(io, jo, ko, ii, ki, ji)
    s[C].vectorize(ji)
    s[C].parallel(io)
    return tir.lower(s, [A, B, C], "dyn_matmul_vec")


def k_dense(dyn_k):
    """topi dense (packed weight panels) + x86 schedule with dynamic M (and K)."""
    from kiln.topi.nn.dense import dense

    kdim = K if dyn_k else None
    X = te.placeholder((24, 32), name="X", dyn=(M, kdim))
    W = te.placeholder((48, 32), name="W", dyn=(None, kdim))
    out = dense(X, W)
    s = topi.schedule_dense([out])
    return tir.lower(s, [X, W, out], "dyn_dense_k" if dyn_k else "dyn_dense")


def k_vec_split():
    """Vectorized split over a dynamic innermost axis (a non-divisible max extent)."""
    A = te.placeholder((70,), name="A", dyn=(N,))
    C = te.compute((70,), lambda i: A[i] * 3.0 + 1.0, name="C")
    s = te.create_schedule(C)
    o, i = s[C].split(C.op.axis[0], factor=16)
    s[C].vectorize(i)
    s[C].parallel(o)
    return tir.lower(s, [A, C], "dyn_vec_split")


def _funcs():
    return [k_bcast_add(), k_fused4d(), k_sum_last(), k_softmax(), k_matmul_vec(), k_dense(False), k_dense(True),
            k_vec_split()]


@pytest.fixture(scope="module", params=TARGETS)
def mod(request):
    return codegen.build_module(_funcs(), request.param)


# ----------------------------------------------------------------------------- run checks
@pytest.mark.parametrize("n,m", [(1, 1), (5, 17), (64, 37), (64, 1), (1, 37), (0, 3)])
def test_bcast_add(mod, n, m):
    a, b = _padded((64, 37), (n, m)), _padded((1, 37), (1, m))
    c = np.full((64, 37), -7.0, "float32")
    assert _call(mod["dyn_bcast_add"], [a, b, c], [(n, m), (1, m), (n, m)]) == 0
    np.testing.assert_allclose(_box(c, (n, m)), _box(a, (n, m)) + _box(b, (1, m)), rtol=1e-6)
    # nothing outside the valid box is written by this (root, injective) kernel
    assert (c[n:, :] == -7.0).all() and (c[:, m:] == -7.0).all()


@pytest.mark.parametrize("n", [1, 4, 9])
def test_fused_dynamic_batch(mod, n):
    a = _padded((9, 3, 4, 5), (n, 3, 4, 5))
    c = np.full(a.shape, -7.0, "float32")
    assert _call(mod["dyn_fused4d"], [a, c], [(n, 3, 4, 5)] * 2) == 0
    np.testing.assert_allclose(c[:n], np.exp(a[:n]) * 2, rtol=1e-5)
    assert (c[n:] == -7.0).all()


@pytest.mark.parametrize("n,m", [(1, 1), (7, 13), (20, 50), (3, 49)])
def test_sum_last(mod, n, m):
    a = _padded((20, 50), (n, m))
    s = np.zeros(20, "float32")
    assert _call(mod["dyn_sum_last"], [a, s], [(n, m), (n,)]) == 0
    np.testing.assert_allclose(s[:n], _box(a, (n, m)).sum(1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,m", [(1, 1), (3, 9), (6, 40), (2, 33)])
def test_softmax(mod, n, m):
    a = _padded((6, 40), (n, m), -3, 3)
    o = np.zeros((6, 40), "float32")
    assert _call(mod["dyn_softmax"], [a, o], [(n, m)] * 2) == 0
    x = _box(a, (n, m))
    ref = np.exp(x - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    got = _box(o, (n, m))
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m,k", [(1, 1), (5, 7), (33, 21), (32, 20), (17, 1)])
def test_matmul(mod, m, k):
    a, b = _padded((33, 21), (m, k)), _padded((21, 40), (k, 40))
    c = np.zeros((33, 40), "float32")
    assert _call(mod["dyn_matmul_vec"], [a, b, c], [(m, k), (k, 40), (m, 40)]) == 0
    np.testing.assert_allclose(c[:m], _box(a, (m, k)) @ _box(b, (k, 40)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k", [(1, 32), (4, 5), (24, 32), (13, 1)])
def test_dense(mod, m, k):
    x, w = _padded((24, 32), (m, k)), _padded((48, 32), (48, k))
    o = np.zeros((24, 48), "float32")
    assert _call(mod["dyn_dense_k"], [x, w, o], [(m, k), (48, k), (m, 48)]) == 0
    np.testing.assert_allclose(o[:m], _box(x, (m, k)) @ _box(w, (48, k)).T, rtol=1e-5, atol=1e-5)
    # dynamic M only: K is static and read whole
    x, w = _padded((24, 32), (m, 32)), _padded((48, 32), (48, 32))
    o = np.zeros((24, 48), "float32")
    assert _call(mod["dyn_dense"], [x, w, o], [(m, 32), (48, 32), (m, 48)]) == 0
    np.testing.assert_allclose(o[:m], x[:m] @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 70])
def test_vec_split(mod, n):
    a = _padded((70,), (n,))
    c = np.full(70, -7.0, "float32")
    assert _call(mod["dyn_vec_split"], [a, c], [(n,), (n,)]) == 0
    np.testing.assert_allclose(c[:n], a[:n] * 3 + 1, rtol=1e-5, atol=1e-6)
    assert (c[n:] == -7.0).all()


# ----------------------------------------------------------------------------- argument errors
def test_out_of_range_extent_is_an_error(mod):
    a, b, c = (np.zeros(s, "float32") for s in ((64, 37), (1, 37), (64, 37)))
    fn = mod["dyn_bcast_add"]
    assert _call(fn, [a, b, c], [(65, 3), (1, 3), (65, 3)]) != 0
    msg = mod.library().last_error()
    assert "dyn_bcast_add: argument 0 (A) expected shape (<=64, <=37), got (65, 3)" in msg
    assert _call(fn, [a, b, c], [(-1, 3), (1, 3), (-1, 3)]) != 0
    # a static dim still must match exactly
    assert _call(fn, [a, b, c], [(4, 3), (2, 3), (4, 3)]) != 0
    assert "argument 1 (B) expected shape (1, <=37), got (2, 3)" in mod.library().last_error()


def test_same_var_must_agree(mod):
    a, b, c = (np.zeros(s, "float32") for s in ((64, 37), (1, 37), (64, 37)))
    assert _call(mod["dyn_bcast_add"], [a, b, c], [(4, 3), (1, 5), (4, 3)]) != 0
    assert "argument 1 (B) dim 1 is 5 but argument 0 (A) dim 1 is 3" in mod.library().last_error()


def test_strides_of_max_shape_accepted(mod):
    a, b = _padded((64, 37), (3, 5)), _padded((1, 37), (1, 5))
    c = np.zeros((64, 37), "float32")
    fn = mod["dyn_bcast_add"]
    assert _call(fn, [a, b, c], [(3, 5), (1, 5), (3, 5)], [(37, 1), (37, 1), None]) == 0
    np.testing.assert_allclose(c[:3, :5], a[:3, :5] + b[:, :5], rtol=1e-6)
    # strides of the actual shape are not the padded layout
    assert _call(fn, [a, b, c], [(3, 5), (1, 5), (3, 5)], [(5, 1), None, None]) != 0
    assert "must be compact row-major" in mod.library().last_error()


# ----------------------------------------------------------------------------- lowering
def test_loops_are_clamped_to_the_runtime_extent():
    text = str(k_bcast_add())
    assert "in range(n):" in text
    assert "in range((m + 15) // 16):" in text
    assert "min(16, m - " in text
    # a fused dynamic batch: the guard floordiv(fused, 60) < n became the loop bound
    text = str(k_fused4d())
    assert "range((n * 60 + 7) // 8):  # parallel" in text
    assert "if " not in text
    # the reduction stops at the runtime extent
    text = str(k_sum_last())
    assert "in range(m):" in text and "in range(n):" in text


def test_buffers_carry_dyn():
    f = k_bcast_add()
    assert [b.dyn for b in f.params] == [(N, M), (None, M), (N, M)]
    assert f.dyn_vars == [N, M]
    assert [b.check_shape for b in f.params] == [(-65, -38), (1, -38), (-65, -38)]


def test_explicit_output_dyn_wins():
    A = te.placeholder((8, 6), name="A", dyn=(N, None))
    C = te.compute((8, 6), lambda i, j: A[i, j] * 2.0, name="C")
    # declaring the output static while it reads a dynamic axis cannot be bounded
    te.set_dyn(C, (None, None))
    with pytest.raises(CompileError, match=r"index i along dynamic axis 0 .* of A cannot be bounded"):
        tir.lower(te.create_schedule(C), [A, C], "f")
    # an output that is dynamic although its input is static: the loop follows the output
    B = te.placeholder((8, 6), name="B")
    D = te.compute((8, 6), lambda i, j: B[i, j] + 1.0, name="D")
    te.set_dyn(D, (None, M))
    f = tir.lower(te.create_schedule(D), [B, D], "g")
    assert f.params[1].dyn == (None, M) and "range(m)" in str(f)


@pytest.mark.parametrize("fcompute", [
    lambda A: (lambda i: A[i + 1]),
    lambda A: (lambda i: A[te.floordiv(i, 2)]),
    lambda A: (lambda i: A[7 - i]),
])
def test_unbounded_reads_are_compile_errors(fcompute):
    A = te.placeholder((8,), name="A", dyn=(N,))
    C = te.compute((8,), fcompute(A), name="C")
    with pytest.raises(CompileError, match=r"along dynamic axis 0 \(runtime extent n, at most 8\) of A cannot be"):
        tir.lower(te.create_schedule(C), [A, C], "f")


def test_axis_of_other_extent_is_a_compile_error():
    A = te.placeholder((8,), name="A", dyn=(N,))
    C = te.compute((4,), lambda i: A[i], name="C")  # a slice of a dynamic axis
    with pytest.raises(CompileError, match="cannot be bounded"):
        tir.lower(te.create_schedule(C), [A, C], "f")


def test_conflicting_extents_are_a_compile_error():
    A = te.placeholder((8,), name="A", dyn=(N,))
    B = te.placeholder((8,), name="B", dyn=(M,))
    C = te.compute((8,), lambda i: A[i] + B[i], name="C")
    with pytest.raises(CompileError, match="one axis needs one symbolic extent"):
        tir.lower(te.create_schedule(C), [A, B, C], "f")


def test_inlined_and_compute_at_stages():
    """An inlined producer and a compute_at'ed reduction keep the valid-box semantics."""
    A = te.placeholder((10, 12), name="A", dyn=(N, M))
    B = te.compute((10, 12), lambda i, j: A[i, j] * 2.0, name="B")
    r = te.reduce_axis((0, 12), "r")
    S = te.compute((10,), lambda i: te.sum(B[i, r], axis=r), name="S")
    C = te.compute((10, 12), lambda i, j: B[i, j] - S[i], name="C")
    s = te.create_schedule(C)
    s[B].compute_inline()
    s[S].compute_at(s[C], C.op.axis[0])
    f = tir.lower(s, [A, C], "inl_at")
    assert f.params[1].dyn == (N, M)
    for target in TARGETS:
        fn = codegen.build_module([f], target)["inl_at"]
        for n, m in [(1, 1), (4, 7), (10, 12)]:
            a = _padded((10, 12), (n, m))
            c = np.zeros((10, 12), "float32")
            assert _call(fn, [a, c], [(n, m)] * 2) == 0
            x = _box(a, (n, m)) * 2
            np.testing.assert_allclose(_box(c, (n, m)), x - x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- static kernels, GPU
def test_all_static_dyn_is_a_static_kernel():
    """``dyn=(None, None)`` is a static placeholder: the generated C is that of the static kernel."""
    def build(dyn):
        A = te.placeholder((4, 5), name="A", dyn=dyn)
        B = te.placeholder((5,), name="B")
        D = te.compute((4, 5), lambda i, j: te.exp(A[i, j]) + B[j], name="D")
        return tir.lower(topi.schedule_injective([D]), [A, B, D], "bcast")

    f = build((None, None))
    assert all(b.dyn is None for b in f.params) and f.dyn_vars == []
    assert generate_c([f])[0] == generate_c([build(None)])[0]
    assert "shape[" not in generate_c([f])[0].split("KILN_DLL int32_t bcast(")[1]


def test_gpu_codegen_passes_dynamic_extents_to_kernels():
    from kiln.codegen.opencl import generate_opencl

    A = te.placeholder((64,), name="A", dyn=(N,))
    C = te.compute((64,), lambda i: A[i] + 1.0, name="C")
    s = te.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    f = tir.lower(s, [A, C], "gpu_dyn")
    src, meta = generate_opencl([f])
    # the extent is a kernel parameter the launcher fills; the launch stays the upper bound
    assert f"const int {N.name}" in src.split("gpu_dyn_kernel0(")[1].split(")")[0]
    assert meta[0]["extents"] == [{"name": N.name, "dtype": "int32", "dims": [[0, 0], [1, 0]]}]
    assert meta[0]["kernels"][0]["args"][-1] == ["extent", 0] and meta[0]["kernels"][0]["grid"] == [2, 1, 1]
