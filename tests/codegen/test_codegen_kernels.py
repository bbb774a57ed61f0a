"""End-to-end kernels: te → lower → c / llvm codegen → run, checked against NumPy.

Every kernel of a target is compiled into ONE module (compilation dominates test time),
built once per target by the ``mods`` fixture.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import codegen, te, tir
from kiln.runtime.errors import KernelError

TARGETS = ["c", "llvm"]
RNG = np.random.default_rng(0)


def _rand(shape, dtype="float32", lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# ----------------------------------------------------------------------------- kernels
def k_broadcast():
    A = te.placeholder((4, 5), name="A")
    B = te.placeholder((5,), name="B")
    Cc = te.placeholder((4, 1), name="Cc")
    D = te.compute((4, 5), lambda i, j: te.exp(A[i, j]) + B[j] * 2.0 - Cc[i, 0], name="D")
    s = te.create_schedule(D)
    return tir.lower(s, [A, B, Cc, D], "bcast")


def k_reduce():
    A = te.placeholder((6, 7), name="A")
    k = te.reduce_axis((0, 7), "k")
    S = te.compute((6,), lambda i: te.sum(A[i, k], axis=k), name="S")
    r = te.reduce_axis((0, 6), "r")
    M = te.compute((7,), lambda j: te.reduce_max(A[r, j], axis=r), name="M")
    s = te.create_schedule([S, M])
    return tir.lower(s, [A, S, M], "reduce_sum_max")


def k_reduce_where():
    A = te.placeholder((5, 8), name="A")
    k = te.reduce_axis((0, 8), "k")
    S = te.compute((5,), lambda i: te.sum(A[i, k], axis=k, where=A[i, k] > 0.0), name="S")
    k2 = te.reduce_axis((0, 8), "k2")
    P = te.compute((5,), lambda i: te.reduce_prod(A[i, k2] + 1.5, axis=k2), name="P")
    k3 = te.reduce_axis((0, 8), "k3")
    Mn = te.compute((5,), lambda i: te.reduce_min(A[i, k3], axis=k3), name="Mn")
    return tir.lower(te.create_schedule([S, P, Mn]), [A, S, P, Mn], "reduce_where")


def k_matmul(m=37, n=29, kk=19):
    A = te.placeholder((m, kk), name="A")
    B = te.placeholder((kk, n), name="B")
    k = te.reduce_axis((0, kk), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=8)
    jo, ji = s[C].split(j, factor=16)
    ko, ki = s[C].split(k, factor=4)
    s[C].reorder(io, jo, ko, ii, ki, ji)
    s[C].vectorize(ji)
    s[C].parallel(io)
    return tir.lower(s, [A, B, C], "matmul")


def k_matmul_acc(m=16, n=24, kk=33):
    # reduction innermost: accumulates in a local register-like buffer
    A = te.placeholder((m, kk), name="A")
    B = te.placeholder((kk, n), name="B")
    k = te.reduce_axis((0, kk), "k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    f = s[C].fuse(*C.op.axis)
    fo, fi = s[C].split(f, factor=10)
    s[C].parallel(fo)
    ko, ki = s[C].split(k, factor=8)
    s[C].unroll(ki)
    return tir.lower(s, [A, B, C], "matmul_acc")


def k_conv2d():
    N, CI, H, W, CO, KH, KW, P = 1, 3, 8, 8, 4, 3, 3, 1
    X = te.placeholder((N, CI, H, W), name="X")
    Wt = te.placeholder((CO, CI, KH, KW), name="Wt")
    pad = te.compute(
        (N, CI, H + 2 * P, W + 2 * P),
        lambda n, c, h, w: te.if_then_else(
            te.all(h >= P, h < H + P, w >= P, w < W + P), X[n, c, h - P, w - P], 0.0),
        name="pad")
    rc = te.reduce_axis((0, CI), "rc")
    rh = te.reduce_axis((0, KH), "rh")
    rw = te.reduce_axis((0, KW), "rw")
    Y = te.compute((N, CO, H, W),
                   lambda n, f, y, x: te.sum(pad[n, rc, y + rh, x + rw] * Wt[f, rc, rh, rw], axis=[rc, rh, rw]),
                   name="Y")
    R = te.compute(Y.shape, lambda *i: te.maximum(Y(*i), 0.0), name="R")
    s = te.create_schedule(R)
    s[pad].compute_inline()
    s[Y].compute_at(s[R], R.op.axis[1])
    return tir.lower(s, [X, Wt, R], "conv2d_relu")


def k_conv_pad_at():
    # padding materialised per output row with compute_at (region inference + domain guards)
    H, W = 9, 7
    X = te.placeholder((H, W), name="X")
    pad = te.compute((H + 2, W + 2), lambda h, w: te.if_then_else(
        te.all(h >= 1, h <= H, w >= 1, w <= W), X[h - 1, w - 1], 0.0), name="pad")
    rh = te.reduce_axis((0, 3), "rh")
    rw = te.reduce_axis((0, 3), "rw")
    Y = te.compute((H, W), lambda y, x: te.sum(pad[y + rh, x + rw], axis=[rh, rw]), name="Y")
    s = te.create_schedule(Y)
    yo, yi = s[Y].split(Y.op.axis[0], factor=4)
    s[pad].compute_at(s[Y], yo)
    return tir.lower(s, [X, Y], "box3x3")


def k_inline_chain():
    A = te.placeholder((3, 10), name="A")
    B = te.compute(A.shape, lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute(A.shape, lambda i, j: B[i, j] + 1.0, name="C")
    D = te.compute(A.shape, lambda i, j: te.sigmoid(C[i, j]), name="D")
    E = te.compute(A.shape, lambda i, j: te.tanh(D[i, j]) + te.sqrt(te.abs(A[i, j])), name="E")
    s = te.create_schedule(E)
    for t in (B, C, D):
        s[t].compute_inline()
    return tir.lower(s, [A, E], "inline_chain")


def k_root_temp_workspace():
    # a non-inlined intermediate bigger than the stack limit goes to workspace memory
    A = te.placeholder((128, 129), name="A")
    B = te.compute(A.shape, lambda i, j: A[i, j] * A[i, j], name="B")
    C = te.compute(A.shape, lambda i, j: B[i, j] + B[127 - i, j], name="C")
    return tir.lower(te.create_schedule(C), [A, C], "workspace_temp")


def k_nondivisible():
    A = te.placeholder((37,), name="A")
    B = te.compute((37,), lambda i: A[i] * 3.0 + 1.0, name="B")
    s = te.create_schedule(B)
    o, i = s[B].split(B.op.axis[0], factor=8)
    s[B].vectorize(i)
    s[B].parallel(o)
    A2 = te.placeholder((10, 13), name="A2")
    B2 = te.compute((10, 13), lambda i, j: A2[i, j] + 1.0, name="B2")
    s2 = te.create_schedule(B2)
    f = s2[B2].fuse(*B2.op.axis)
    fo, fi = s2[B2].split(f, nparts=3)
    return [tir.lower(s, [A, B], "split37"), tir.lower(s2, [A2, B2], "fuse_nparts")]


def k_int():
    A = te.placeholder((16,), dtype="int32", name="A")
    B = te.placeholder((16,), dtype="int32", name="B")
    Q = te.compute((16,), lambda i: te.floordiv(A[i], B[i]) + te.floormod(A[i], B[i]) * 100, name="Q")
    T = te.compute((16,), lambda i: te.truncdiv(A[i], B[i]) + te.truncmod(A[i], B[i]) * 100, name="T")
    X = te.placeholder((16,), dtype="int8", name="X")
    Y = te.compute((16,), lambda i: X[i] + X[i] * 3, name="Y")  # wraps like numpy int8
    Z = te.compute((16,), lambda i: te.if_then_else(A[i] > B[i], A[i], B[i]).astype("int64"), name="Z")
    L = te.compute((16,), lambda i: A[i] < B[i], name="L")  # bool output
    return tir.lower(te.create_schedule([Q, T, Y, Z, L]), [A, B, X, Q, T, Y, Z, L], "int_ops")


def k_half(dtype):
    A = te.placeholder((33,), dtype=dtype, name="A")
    B = te.placeholder((33,), dtype=dtype, name="B")
    C = te.compute((33,), lambda i: A[i] * B[i] + te.const(0.5, dtype), name="C")
    k = te.reduce_axis((0, 33), "k")
    S = te.compute((1,), lambda _: te.sum(A[k].astype("float32"), axis=k), name="S")
    D = te.compute((33,), lambda i: A[i].astype("float32"), name="D")
    E = te.compute((33,), lambda i: (B[i].astype("float32") * 3.0).astype(dtype), name="E")
    return tir.lower(te.create_schedule([C, S, D, E]), [A, B, C, S, D, E], f"{dtype}_ops")


def k_math():
    A = te.placeholder((64,), name="A")
    outs = {
        "erf": te.erf, "log1p_abs": lambda x: te.log1p(te.abs(x)), "floor": te.floor, "ceil": te.ceil,
        "round": te.round, "rsqrt": lambda x: te.rsqrt(te.abs(x) + 1.0), "pow": lambda x: te.pow(te.abs(x), 1.5),
        "isnan": lambda x: te.if_then_else(te.isnan(te.log(x)), 1.0, 0.0),
        "minimum": lambda x: te.minimum(x, 0.25),
    }
    ts = [te.compute((64,), lambda i, f=f: f(A[i]), name=n) for n, f in outs.items()]
    return tir.lower(te.create_schedule(ts), [A, *ts], "math_ops"), list(outs)


def k_multi_output():
    A = te.placeholder((8,), name="A")
    P, Q = te.compute((8,), lambda i: (A[i] + 1.0, A[i] * 2.0), name="PQ")
    return tir.lower(te.create_schedule([P.op]), [A, P, Q], "multi_out")


def _all_funcs():
    fs = [k_broadcast(), k_reduce(), k_reduce_where(), k_matmul(), k_matmul_acc(), k_conv2d(), k_conv_pad_at(),
          k_inline_chain(), k_root_temp_workspace(), *k_nondivisible(), k_int(), k_half("float16"),
          k_half("bfloat16"), k_math()[0], k_multi_output()]
    return fs


@pytest.fixture(scope="module", params=TARGETS)
def mod(request):
    return codegen.build_module(_all_funcs(), request.param)


# ----------------------------------------------------------------------------- checks
def test_broadcast(mod):
    a, b, c = _rand((4, 5)), _rand(5), _rand((4, 1))
    d = np.zeros((4, 5), "float32")
    mod["bcast"](a, b, c, d)
    np.testing.assert_allclose(d, np.exp(a) + b * 2 - c, rtol=1e-6, atol=1e-6)


def test_reduce(mod):
    a = _rand((6, 7))
    s, m = np.zeros(6, "float32"), np.zeros(7, "float32")
    mod["reduce_sum_max"](a, s, m)
    np.testing.assert_allclose(s, a.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m, a.max(0))


def test_reduce_where_prod_min(mod):
    a = _rand((5, 8))
    s, p, mn = (np.zeros(5, "float32") for _ in range(3))
    mod["reduce_where"](a, s, p, mn)
    np.testing.assert_allclose(s, np.where(a > 0, a, 0).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p, (a + 1.5).prod(1), rtol=1e-5)
    np.testing.assert_array_equal(mn, a.min(1))


def test_matmul_split_reorder_vectorize_parallel(mod):
    a, b = _rand((37, 19)), _rand((19, 29))
    c = np.full((37, 29), np.nan, "float32")
    mod["matmul"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_fused_unrolled(mod):
    a, b = _rand((16, 33)), _rand((33, 24))
    c = np.zeros((16, 24), "float32")
    mod["matmul_acc"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def _conv_ref(x, w, pad):
    n, ci, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, co, h, wd), "float64")
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,fc->nfhw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


def test_conv2d_padding_inline_compute_at(mod):
    x, w = _rand((1, 3, 8, 8)), _rand((4, 3, 3, 3))
    r = np.zeros((1, 4, 8, 8), "float32")
    mod["conv2d_relu"](x, w, r)
    np.testing.assert_allclose(r, np.maximum(_conv_ref(x, w, 1), 0), rtol=1e-5, atol=1e-5)


def test_padding_compute_at_region(mod):
    x = _rand((9, 7))
    y = np.zeros((9, 7), "float32")
    mod["box3x3"](x, y)
    ref = _conv_ref(x[None, None], np.ones((1, 1, 3, 3), "float32"), 1)[0, 0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_inline_chain(mod):
    a = _rand((3, 10))
    e = np.zeros((3, 10), "float32")
    mod["inline_chain"](a, e)
    ref = np.tanh(1 / (1 + np.exp(-(a * 2 + 1)))) + np.sqrt(np.abs(a))
    np.testing.assert_allclose(e, ref, rtol=1e-5, atol=1e-6)


def test_workspace_temp(mod):
    a = _rand((128, 129))
    c = np.zeros_like(a)
    mod["workspace_temp"](a, c)
    np.testing.assert_allclose(c, a * a + (a * a)[::-1], rtol=1e-6)


def test_nondivisible_split(mod):
    a = _rand(37)
    b = np.full(37, np.nan, "float32")
    mod["split37"](a, b)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-6)
    a2 = _rand((10, 13))
    b2 = np.full((10, 13), np.nan, "float32")
    mod["fuse_nparts"](a2, b2)
    np.testing.assert_allclose(b2, a2 + 1, rtol=1e-6)


def test_int_ops(mod):
    a = RNG.integers(-50, 50, 16).astype("int32")
    b = RNG.integers(1, 7, 16).astype("int32") * RNG.choice([-1, 1], 16).astype("int32")
    x = RNG.integers(-128, 127, 16).astype("int8")
    q, t = np.zeros(16, "int32"), np.zeros(16, "int32")
    y, z, lt = np.zeros(16, "int8"), np.zeros(16, "int64"), np.zeros(16, "bool")
    mod["int_ops"](a, b, x, q, t, y, z, lt)
    np.testing.assert_array_equal(q, a // b + (a % b) * 100)
    tq = np.trunc(a / b).astype("int32")
    np.testing.assert_array_equal(t, tq + (a - tq * b) * 100)
    np.testing.assert_array_equal(y, (x.astype(np.int32) * 4).astype(np.int8))
    np.testing.assert_array_equal(z, np.maximum(a, b).astype("int64"))
    np.testing.assert_array_equal(lt, a < b)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types(mod, dtype):
    npdt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    a = _rand(33).astype(npdt)
    b = _rand(33).astype(npdt)
    c, e = np.zeros(33, npdt), np.zeros(33, npdt)
    s, d = np.zeros(1, "float32"), np.zeros(33, "float32")
    # NumPy cannot export bfloat16 through DLPack: pass kiln NDArrays
    args = [kiln.nd.array(x) for x in (a, b, c, s, d, e)]
    mod[f"{dtype}_ops"](*args)
    c, s, d, e = (x.numpy() for x in args[2:])
    ref = (a.astype("float32") * b.astype("float32") + 0.5).astype(npdt)  # computed in f32, rounded once
    np.testing.assert_array_equal(c.astype("float32"), ref.astype("float32"))
    np.testing.assert_allclose(s[0], a.astype("float32").sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(d, a.astype("float32"))
    np.testing.assert_array_equal(e.astype("float32"), (b.astype("float32") * 3).astype(npdt).astype("float32"))


def test_math_intrinsics(mod):
    import math

    a = _rand(64, lo=-3, hi=3)
    a[:4] = [0.5, 1.5, 2.5, -0.5]  # ties: round half to even
    names = k_math()[1]
    outs = [np.zeros(64, "float32") for _ in names]
    mod["math_ops"](a, *outs)
    ad = a.astype("float64")
    refs = {
        "erf": np.vectorize(math.erf)(ad), "log1p_abs": np.log1p(np.abs(ad)), "floor": np.floor(a),
        "ceil": np.ceil(a), "round": np.round(a), "rsqrt": 1 / np.sqrt(np.abs(ad) + 1),
        "pow": np.abs(ad) ** 1.5, "isnan": np.isnan(np.log(np.where(a < 0, np.nan, a))).astype("float32"),
        "minimum": np.minimum(a, 0.25),
    }
    for n, o in zip(names, outs):
        np.testing.assert_allclose(o, refs[n], rtol=2e-6, atol=2e-6, err_msg=n)


def test_multi_output(mod):
    a = _rand(8)
    p, q = np.zeros(8, "float32"), np.zeros(8, "float32")
    mod["multi_out"](a, p, q)
    np.testing.assert_allclose(p, a + 1)
    np.testing.assert_allclose(q, a * 2)


def test_nan_propagation_in_max(mod):
    a = _rand((6, 7))
    a[2, 3] = np.nan
    s, m = np.zeros(6, "float32"), np.zeros(7, "float32")
    mod["reduce_sum_max"](a, s, m)
    assert np.isnan(m[3]) and np.isnan(s[2])
    np.testing.assert_array_equal(np.delete(m, 3), np.delete(a.max(0), 3))


# ----------------------------------------------------------------------------- errors
def test_wrong_shape_reports_function_and_argument(mod):
    a, b, c = _rand((4, 5)), _rand(6), _rand((4, 1))
    with pytest.raises(KernelError, match=r"bcast: argument 1 \(B\) expected shape \(5,\), got \(6,\)"):
        mod["bcast"](a, b, c, np.zeros((4, 5), "float32"))


def test_wrong_dtype_reports_function_and_argument(mod):
    a, b, c = _rand((4, 5)), _rand(5), _rand((4, 1))
    with pytest.raises(KernelError, match=r"bcast: argument 3 \(D\) expected dtype float32, got float64"):
        mod["bcast"](a, b, c, np.zeros((4, 5), "float64"))


def test_wrong_ndim_and_count(mod):
    a, b, c = _rand((4, 5)), _rand(5), _rand((4, 1))
    with pytest.raises(KernelError, match=r"bcast: argument 2 \(Cc\) expected ndim 2"):
        mod["bcast"](a, b, _rand(4), np.zeros((4, 5), "float32"))
    with pytest.raises(KernelError, match=r"bcast: expected 4 arguments"):
        mod["bcast"](a, b, c)
    with pytest.raises(KernelError, match=r"bcast: argument 0 \(A\) expected a DLTensor"):
        mod["bcast"](1, b, c, np.zeros((4, 5), "float32"))


def _raw_call(fn, arrays, strides):
    """Call a packed function with hand-made DLTensors (the runtime refuses strided views)."""
    import ctypes

    from kiln.runtime import _ffi

    keep, ts = [], []
    for a, st in zip(arrays, strides):
        t = _ffi.DLTensor()
        t.data = a.ctypes.data
        t.device = _ffi.DLDevice(1, 0)
        t.ndim = a.ndim
        t.dtype = _ffi.DLDataType(2, 32, 1)
        shp = (ctypes.c_int64 * a.ndim)(*a.shape)
        t.shape = shp
        keep.append(shp)
        if st is not None:
            sarr = (ctypes.c_int64 * a.ndim)(*st)
            t.strides = sarr
            keep.append(sarr)
        ts.append(t)
    vals = (_ffi.KilnValue * len(ts))()
    codes = (ctypes.c_int32 * len(ts))()
    for i, t in enumerate(ts):
        vals[i].v_handle = ctypes.addressof(t)
        codes[i] = 7
    rv, rc = _ffi.KilnValue(), ctypes.c_int32()
    cf = _ffi.PackedCFunc(fn.address)
    return cf(vals, codes, len(ts), ctypes.byref(rv), ctypes.byref(rc), None)


def test_strides_checked(mod):
    a, b, c = _rand((4, 5)), _rand(5), _rand((4, 1))
    d = np.zeros((4, 5), "float32")
    fn = mod["bcast"]
    # explicit compact strides are accepted (size-1 dims may have any stride)
    assert _raw_call(fn, [a, b, c, d], [(5, 1), (1,), (1, 99), None]) == 0
    np.testing.assert_allclose(d, np.exp(a) + b * 2 - c, rtol=1e-6, atol=1e-6)
    assert _raw_call(fn, [a, b, c, d], [(1, 4), None, None, None]) != 0
    assert "bcast: argument 0 (A) must be compact row-major" in mod.library().last_error()
