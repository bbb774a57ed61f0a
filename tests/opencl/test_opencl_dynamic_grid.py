"""GPU launches at the grid of the actual extents (``docs/dynamic_shapes.md``).

The code generator records, per launch, the run-time grid of every grid dim whose work-groups
past it provably write nothing (``kiln.codegen.gpu_source.dynamic_grid``); the launcher
evaluates it when the extents change and hands the backend the launches as made. Checked
here: the analysis on hand-written kernels (what qualifies and what keeps the upper bound),
the function table and payload (version 4 with grids, versions 2 and 3 unchanged and still
read), and on PoCL the grids actually enqueued and the results at several shapes. The mock
CUDA driver's launch records are checked in ``tests/cuda/test_cuda_dynamic.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kiln
from kiln import ir
from kiln.runtime import sym
from kiln.runtime.binary import Writer
from kiln.runtime.errors import FormatError, KilnError
from kiln.runtime.gpu_module import ARG_TENSOR, GPUArg, GPUExtent, GPUFunction, GPULaunch, GPUPayload
from kiln.tir.expr import Cast, IntImm, Var
from kiln.tir.stmt import Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt
from tests.opencl.test_opencl_dynamic import _dyn_kernel, static_inc_kernel

HAS_CL = kiln.opencl().exist
needs_cl = pytest.mark.skipif(not HAS_CL, reason="no OpenCL device (install ocl-icd-libopencl1 and pocl-opencl-icd)")

RNG = np.random.default_rng(3)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------- analysis


def _bx_kernel(*stores):
    """``for bx in blockIdx.x (8): for tx in threadIdx.x (32): <stores>`` over a runtime ``n``."""
    from kiln.codegen.gpu_source import dynamic_grid

    n = Var("n", "int32")
    bx, tx = Var("bx", "int32"), Var("tx", "int32")
    out = Buffer("out", (256,), "float32")
    body = SeqStmt([mk(bx, tx, n, out) for mk in stores])
    body = For(tx, 0, 32, "thread_binding", body, {"thread_tag": "threadIdx.x"})
    body = For(bx, 0, 8, "thread_binding", body, {"thread_tag": "blockIdx.x"})
    return dynamic_grid(body, (8, 1, 1), {n: 256}, set())


def _store(idx, cond=None, else_store=False):
    """A maker of ``out[idx] = 1``, under ``if cond`` (in its else branch with ``else_store``)."""
    def mk(bx, tx, n, out):
        st = BufferStore(out, 1.0, [idx(bx, tx)])
        if cond is None:
            return st
        c = cond(bx, tx, n)
        return IfThenElse(c, BufferStore(out, 2.0, [0]), st) if else_store else IfThenElse(c, st)
    return mk


@pytest.mark.parametrize("cond, want", [
    (lambda bx, tx, n: bx * 32 + tx < n, "(n+31)//32"),                       # a thread guard, relaxed
    (lambda bx, tx, n: bx * 32 < n, "(n+31)//32"),                            # the block-level guard
    (lambda bx, tx, n: (bx * 32 + tx) // 64 < n, "2*n"),                      # dyn_guard's floordiv, undone
    (lambda bx, tx, n: bx < n * 4, "4*n"),                                    # ... or moved to the bound
    (lambda bx, tx, n: (bx * 32 + tx + 5 < n) & (tx < 7), "(n+26)//32"),      # a constant offset, a conjunct
    (lambda bx, tx, n: bx * 32 + tx <= n - 1, "(n+31)//32"),
])
def test_guards_that_bound_the_block_index(cond, want):
    got = _bx_kernel(_store(lambda bx, tx: bx * 32 + tx, cond))
    assert got == (want, "", "")
    # the expression covers exactly the blocks in which a work-item passes the guard
    bx, tx, n = Var("bx", "int32"), Var("tx", "int32"), Var("n", "int32")
    for v in (0, 1, 31, 32, 33, 64, 200):
        busy = [b for b in range(8) for t in range(32) if _eval(cond(bx, tx, n), {bx: b, tx: t, n: v})]
        assert min(8, max(0, sym.evaluate(want, {"n": v}))) == (max(busy) + 1 if busy else 0), v


def _eval(e, env):
    from kiln.tir.simplify import Analyzer
    from kiln.tir.functor import substitute

    return Analyzer().simplify(substitute(e, {k: IntImm(v) for k, v in env.items()})).value


@pytest.mark.parametrize("stores, want", [
    ([_store(lambda bx, tx: bx * 32 + tx)], ()),                                             # unguarded
    ([_store(lambda bx, tx: bx * 32 + tx, lambda bx, tx, n: (bx * 32 + tx) % 64 < n)],       # not monotone in bx
     ("", "n", "")),
    ([_store(lambda bx, tx: bx * 32 + tx, lambda bx, tx, n: bx * 32 + tx < 200)], ()),       # a static bound
    ([_store(lambda bx, tx: bx * 32 + tx, lambda bx, tx, n: bx * 32 + tx < n, else_store=True)], ()),  # else side
    ([_store(lambda bx, tx: bx * 32 + tx, lambda bx, tx, n: bx * 32 + tx < n),               # a second, unguarded
      _store(lambda bx, tx: bx, None)], ()),                                                 # write (a block flag)
    ([_store(lambda bx, tx: bx * 32 + tx, lambda bx, tx, n: bx * 32 + tx < n),               # two different bounds
      _store(lambda bx, tx: bx * 32 + tx, lambda bx, tx, n: bx * 16 + tx < n)], ("", "n", "")),
])
def test_kernels_that_keep_the_upper_bound_grid(stores, want):
    # x keeps its size; y (of size 1) may carry a guard that empties the launch (see below)
    assert _bx_kernel(*stores) == want


def test_a_guard_without_the_block_index_can_only_empty_a_launch():
    """``tx < n`` says nothing about which of the 8 blocks work, but fails everywhere at
    ``n = 0``: the size-1 dim ``y`` carries ``n`` (clamped to 0..1), ``x`` keeps its size."""
    assert _bx_kernel(_store(lambda bx, tx: tx, lambda bx, tx, n: tx < n)) == ("", "n", "")


def _in_blocks(body_of):
    """:func:`dynamic_grid` of ``for bx in blockIdx.x (8): for tx in threadIdx.x (32):
    body_of(bx, tx, i, n, out)`` (``i``: one more int32 variable, ``out``: a global buffer)."""
    from kiln.codegen.gpu_source import dynamic_grid

    n, bx, tx, i = (Var(x, "int32") for x in ("n", "bx", "tx", "i"))
    out = Buffer("out", (256,), "float32")
    body = For(tx, 0, 32, "thread_binding", body_of(bx, tx, i, n, out), {"thread_tag": "threadIdx.x"})
    body = For(bx, 0, 8, "thread_binding", body, {"thread_tag": "blockIdx.x"})
    return dynamic_grid(body, (8, 1, 1), {n: 256}, set())


def _guarded(bx, tx, i, n, out):
    return IfThenElse(bx * 32 + i < n, BufferStore(out, 1.0, [bx * 32 + tx]))


@pytest.mark.parametrize("body_of, want", [
    # i in 0..15 needs (n+31)//32 groups, i in 10..13 (n+21)//32: different, so the grid stays
    # (it was (n+21)//32 for both, which leaves out group 1 at n = 33, where i = 0 writes)
    (lambda bx, tx, i, n, out: SeqStmt([For(i, 0, 16, "serial", _guarded(bx, tx, i, n, out)),
                                        For(i, 10, 4, "serial", _guarded(bx, tx, i, n, out))]), ()),
    # a run-time min: the range comes from the min's (i >= tx - 20 >= -20), not from the loop
    # before ((n+31)//32 left out group 1 at n = 13, where i = -20 writes)
    (lambda bx, tx, i, n, out: SeqStmt([For(i, 0, 16, "serial", Evaluate(0)),
                                        For(i, tx - 20, 4, "serial", _guarded(bx, tx, i, n, out))]),
     ("(n+51)//32", "", "")),
    # ... and there is none when the min is unbounded (a let variable)
    (lambda bx, tx, i, n, out: SeqStmt([For(i, 0, 16, "serial", Evaluate(0)), LetStmt(
        j := Var("j", "int32"), tx - 20, For(i, j, 4, "serial", _guarded(bx, tx, i, n, out)))]), ()),
    # the guard's i is the outer loop's, though an inner loop binds the same variable again
    (lambda bx, tx, i, n, out: For(i, 0, 16, "serial", IfThenElse(
        bx * 32 + i < n, For(i, 10, 4, "serial", BufferStore(out, 1.0, [bx * 32 + tx])))), ("(n+31)//32", "", "")),
], ids=["two-loops", "runtime-min", "unbounded-min", "inner-loop"])
def test_a_guard_is_read_with_the_ranges_of_the_loops_around_it(body_of, want):
    """One loop variable in several loops: each guard is read with the range of the loop it
    is in, not one left over from another loop."""
    assert _in_blocks(body_of) == want


@pytest.mark.parametrize("guard", [
    lambda bx, tx, n: Cast("uint64", bx * 32 + tx) < Cast("uint64", n - 40),      # wraps below n = 40
    lambda bx, tx, n: Cast("uint32", bx * 32 + tx) < Cast("uint32", n) - Cast("uint32", 40),
    lambda bx, tx, n: bx * 32 + Cast("int32", Cast("uint32", tx)) < n,
    lambda bx, tx, n: Cast("int64", bx * 32 + tx) < Cast("int64", Cast("uint64", n)),
], ids=["u64-compare", "u32-compare", "u32-in-lhs", "u64-in-bound"])
def test_unsigned_guards_bound_nothing(guard):
    """An unsigned comparison or cast is not the integer arithmetic the bound assumes
    (``(u64)(bx*32+tx) < (u64)(n-40)`` passes for every work-item when ``n < 40``)."""
    assert _in_blocks(lambda bx, tx, i, n, out: IfThenElse(guard(bx, tx, n),
                                                           BufferStore(out, 1.0, [bx * 32 + tx]))) == ()


def test_an_extent_is_bounded_by_its_smallest_dim():
    """``n`` sizes dims of 256 and of 64; the launcher enforces ``n <= 64``, so the guard's
    ``- n`` is at least ``-64``: the grid is ``(n+95)//32`` (with 256 it never fell below 8)."""
    from kiln.codegen.opencl import generate_opencl

    n, bx, tx = Var("n", "int32"), Var("bx", "int32"), Var("tx", "int32")
    A = Buffer("A", (256,), "float32", dyn=(n,))
    B = Buffer("B", (64,), "float32", dyn=(n,))
    body = IfThenElse(bx * 32 + tx - n < n, BufferStore(A, 1.0, [bx * 32 + tx]))
    body = For(tx, 0, 32, "thread_binding", body, {"thread_tag": "threadIdx.x"})
    body = For(bx, 0, 8, "thread_binding", body, {"thread_tag": "blockIdx.x"})
    _, (f,) = generate_opencl([PrimFunc("f", [A, B], body)])
    assert f["kernels"][0]["dyn_grid"] == ["(n+95)//32", "", ""]


def test_static_and_dynamic_metadata():
    from kiln.codegen.opencl import build_opencl, generate_opencl

    _, (f,) = generate_opencl([_dyn_kernel()])
    assert f["kernels"][0]["dyn_grid"] == ["(n+31)//32", "", ""]
    static = build_opencl([static_inc_kernel()])
    assert static.functions["inc"].launches[0].dyn_grid == ()
    assert "dyn_grid" not in static.functions["inc"].to_dict()["kernels"][0]
    mod = build_opencl([_dyn_kernel()])
    fn = mod.functions["twice"]
    assert GPUFunction.from_dict(fn.to_dict()) == fn  # the codegen dict round-trips
    assert mod.describe_payload(mod.save_to_binary())["kernels"][0]["dyn_grid"] == ["(n+31)//32", "", ""]


# ---------------------------------------------------------------------------------- payload


def _table(dyn_grid=()):
    return GPUFunction("f", (GPUArg(ARG_TENSOR, "float32", (64,), "x"),),
                       (GPULaunch("k", (4, 1, 1), (16, 1, 1), 0, (0, 1), dyn_grid),),
                       extents=(GPUExtent("n", "int32", ((0, 0),)),))


def _v3_bytes(f: GPUFunction) -> bytes:
    """A version-3 payload written field by field from the documented layout, as the Kilns
    before run-time grids wrote it (docs/devices.md)."""
    from kiln.runtime.opencl_driver import OpenCLModule

    w = Writer()
    w.raw(OpenCLModule.payload_magic)
    w.u32(3)
    for text in ("cl", ""):
        w.string(text)
    w.sized_bytes(b"")
    w.string("__kernel void k() {}")
    w.u64(1)
    w.string(f.name)
    w.u64(1)
    w.u8(ARG_TENSOR)
    for text in ("x", "float32"):
        w.string(text)
    w.u64(1)
    w.i64(64)
    w.u64(0)  # temporaries
    w.u64(1)  # extents
    for text in ("n", "int32"):
        w.string(text)
    w.u64(1)
    w.u32(0)
    w.u32(0)
    w.u64(1)  # launches
    w.string("k")
    for v in (4, 1, 1, 16, 1, 1, 0):
        w.u32(v)
    w.u64(2)
    w.u32(0)
    w.u32(1)
    return w.getvalue()


def test_payload_versions():
    from kiln.runtime.opencl_driver import OpenCLModule

    old = _v3_bytes(_table())
    assert OpenCLModule.load_binary(old).functions["f"] == _table()  # an old version-3 payload loads
    # without a run-time grid the writer stays at version 3, byte for byte
    assert OpenCLModule.encode_payload(GPUPayload("cl", b"", "__kernel void k() {}", "", [_table()])) == old
    f = _table(("(n+15)//16", "", ""))
    raw = OpenCLModule.encode_payload(GPUPayload("cl", b"", "__kernel void k() {}", "", [f]))
    assert int.from_bytes(raw[8:12], "little") == 4
    assert len(raw) == len(old) + 3 * 8 + len("(n+15)//16")  # three strings per launch, nothing else
    assert OpenCLModule.load_binary(raw).functions["f"] == f
    # a static launch in a version-4 table reads back without grids
    two = dataclasses.replace(f, launches=(*f.launches, GPULaunch("k", (1, 1, 1), (1, 1, 1), 0, (0,))))
    raw = OpenCLModule.encode_payload(GPUPayload("cl", b"", "", "", [two]))
    assert OpenCLModule.load_binary(raw).functions["f"] == two


@pytest.mark.parametrize("dyn_grid, match", [
    (("(m+15)//16", "", ""), r"names \['m'\], which are not runtime extents"),
    (("n+", "", ""), "run-time grid"),
])
def test_bad_grid_expressions_are_format_errors(dyn_grid, match):
    from kiln.runtime.opencl_driver import OpenCLModule

    raw = OpenCLModule.encode_payload(GPUPayload("cl", b"", "", "", [_table(dyn_grid)]))
    with pytest.raises(FormatError, match=match):
        OpenCLModule.load_binary(raw)
    d = _table().to_dict()
    d["kernels"][0]["dyn_grid"] = ["n", ""]
    with pytest.raises(FormatError, match="expected 3 expressions"):
        GPUFunction.from_dict(d)
    with pytest.raises(KilnError, match="a run-time grid has 3 expressions"):  # never written
        OpenCLModule.encode_payload(GPUPayload("cl", b"", "", "", [_table(("n", ""))]))


def _load_grid(dyn_grid):
    from kiln.runtime.opencl_driver import OpenCLModule

    return OpenCLModule.load_binary(OpenCLModule.encode_payload(GPUPayload("cl", b"", "", "", [_table(dyn_grid)])))


_DEEP = "n" + "//2*3" * 100  # 501 characters, 100 nested floor divisions: too deep for Python's parser
_WHERE = r"launch 0 \(kernel 'k'\) of 'f', grid dim y: "


@pytest.mark.parametrize("expr, match", [
    ("+".join(["n"] * 200), "399 characters, more than the 256"),
    (_DEEP, "501 characters"),
], ids=["long", "deep"])
def test_long_grid_expressions_are_format_errors_at_load(expr, match):
    """Each expression is capped in length (parsing and compiling cost grow with it), so a
    payload with a long one fails ``load_binary``, not the first ``get_function``."""
    with pytest.raises(FormatError, match=_WHERE + match):
        _load_grid(("", expr, ""))
    assert _load_grid(("", "n" + "//2*3" * 40, "")).functions["f"].launches[0].dyn_grid[1]  # 201 characters


@pytest.mark.parametrize("expr, match", [(_DEEP, "SyntaxError.*nested"), ("n" + "//2*3" * 2000, "RecursionError")],
                         ids=["too-many-parentheses", "too-deep"])
def test_grid_expressions_are_compiled_at_load(monkeypatch, expr, match):
    """What the cap keeps out: expressions the launcher could not compile."""
    from kiln.runtime import gpu_module

    monkeypatch.setattr(gpu_module, "MAX_GRID_EXPRESSION", 10**6, raising=False)
    with pytest.raises(FormatError, match=_WHERE + "bad run-time grid expression .*" + match):
        _load_grid(("", expr, ""))


def test_an_all_empty_run_time_grid_is_no_run_time_grid():
    from kiln.runtime.gpu_module import payload_version
    from kiln.runtime.opencl_driver import OpenCLModule

    d = _table().to_dict()
    d["kernels"][0]["dyn_grid"] = ["", "", ""]
    f = GPUFunction.from_dict(d)
    assert f == _table() and GPUFunction.from_dict(f.to_dict()) == f
    assert payload_version([_table(("", "", ""))]) == 3  # no version 4 for three empty strings
    raw = OpenCLModule.encode_payload(GPUPayload("cl", b"", "__kernel void k() {}", "", [_table(("", "", ""))]))
    assert raw == _v3_bytes(_table())


# ---------------------------------------------------------------------------------- PoCL


def _opencl_module_of(lib):
    return next(m for m in lib.walk() if m.type_key == "opencl")


def _check_grids(mod, env):
    """Every launch was enqueued with its run-time grid (the plan's global sizes), and the
    launches without one at the upper bound; returns ``{kernel: grid}`` of this run."""
    seen = {}
    for name, la in mod._launchers.items():
        f = mod.functions[name]
        plan = {ln.kernel: (tuple(glob), tuple(loc)) for _, _, glob, loc, ln in la._last[1]}
        for ln, grid in zip(f.launches, la.grids):
            want = ln.grid
            if ln.dyn_grid:
                want = tuple(min(g, max(0, sym.evaluate(e, env))) if e else g for e, g in zip(ln.dyn_grid, ln.grid))
            if 0 in want:
                want = (0, 0, 0)
            assert grid == want, (ln.kernel, grid, want)
            if grid != (0, 0, 0):
                assert plan[ln.kernel] == (tuple(g * b for g, b in zip(grid, ln.block)), ln.block)
            else:
                assert ln.kernel not in plan
            seen[ln.kernel] = grid
    return seen


@needs_cl
def test_transformer_like_graph_at_the_grid_of_the_actual_shape(tmp_path):
    """Elementwise, softmax and a dense layer over ``(batch, seq, 64)``: only the batch grid dim
    can shrink in the padded layout; with ``batch`` static the sequence shrinks it. (64: the
    fused index of the elementwise kernel then covers whole rows, so the lowering's guard is
    ``index < batch * 2560`` / ``index < seq * 64``, not ``index // C % 40 < seq``, which
    bounds no work-group.)"""
    for batch_dyn in (True, False):
        g = ir.Graph("blk")
        if batch_dyn:
            g.declare_dim("batch", 1, 3)
        g.declare_dim("seq", 1, 40)
        x = g.add_input("x", ("batch" if batch_dyn else 1, "seq", 64))
        w = g.add_constant((RNG.standard_normal((32, 64)) * 0.2).astype("float32"))
        bias = g.add_constant(RNG.standard_normal(64).astype("float32"))
        sm = g.add("softmax", g.add("relu", g.add("add", x, bias)), axis=-1)
        g.outputs = [g.add("dense", sm, w)]
        path = str(tmp_path / f"blk{batch_dyn}.so")
        kiln.build(g, target="opencl").export_library(path)
        lib = kiln.runtime.load_module(path)  # through the version-4 payload
        mod = _opencl_module_of(lib)
        launches = [ln for f in mod.functions.values() for ln in f.launches]
        relu = next(ln for ln in launches if "relu" in ln.kernel)
        assert relu.dyn_grid and relu.block[1:] == (1, 1)
        m = kiln.GraphModule(lib["default"](kiln.opencl()))
        shapes = [(3, 40), (1, 1), (2, 17), (3, 40), (1, 8)] if batch_dyn else [(1, 40), (1, 1), (1, 23), (1, 40)]
        for b, s in shapes:
            xv = RNG.standard_normal((b, s, 64)).astype("float32")
            m.run(x=xv)
            h = np.maximum(xv + bias.const_value, 0)
            e = np.exp(h - h.max(-1, keepdims=True))
            want = (e / e.sum(-1, keepdims=True)) @ w.const_value.T
            np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-4, atol=1e-5)
            env = {"batch_rt": b, "seq_rt": s}
            grids = _check_grids(mod, env)
            # one work-item per element of the valid rows (the padded seq counts when batch is dynamic)
            rows = b * 40 if batch_dyn else s
            assert grids[relu.kernel][0] == _ceil(rows * 64, relu.block[0])
            if (b, s) in ((3, 40), (1, 40)):
                assert all(grids[ln.kernel] == ln.grid for ln in launches)  # the upper bound: every group
            else:
                assert grids[relu.kernel][0] < relu.grid[0]


def _conv_ref(x, w):
    """3x3 convolution, padding 1, stride 1 (NCHW / OIHW), in float64."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


@needs_cl
def test_conv_with_symbolic_height_and_width():
    g = ir.Graph("cv")
    g.declare_dim("h", 2, 24)
    g.declare_dim("w", 2, 24)
    x = g.add_input("x", (1, 3, "h", "w"))
    wt = g.add_constant((RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype("float32"))
    g.outputs = [g.add("relu", g.add("conv2d", x, wt, padding=(1, 1, 1, 1)))]
    lib = kiln.build(g, target="opencl")
    mod = _opencl_module_of(lib)
    launches = [ln for f in mod.functions.values() for ln in f.launches]
    assert any(ln.dyn_grid for ln in launches)
    m = kiln.GraphModule(lib["default"](kiln.opencl()))
    for h, w in [(24, 24), (2, 2), (5, 17), (24, 3), (2, 24)]:
        xv = RNG.standard_normal((1, 3, h, w)).astype("float32")
        m.run(x=xv)
        np.testing.assert_allclose(m.get_output(0).numpy(), np.maximum(_conv_ref(xv, wt.const_value), 0),
                                   rtol=1e-4, atol=1e-4)
        grids = _check_grids(mod, {"h_rt": h, "w_rt": w})
        if (h, w) == (24, 24):
            assert all(grids[ln.kernel] == ln.grid for ln in launches)
        elif h < 24:
            assert any(grids[ln.kernel][0] * grids[ln.kernel][1] < ln.grid[0] * ln.grid[1] for ln in launches)
