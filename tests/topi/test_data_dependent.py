"""Loop-IR kernels with data-dependent output extents (``kiln.topi.data_dependent``) and the
``kiln.tir.set_extent`` intrinsic that reports them.

The ops are built as IR graphs (static and symbolic inputs, a data-dependent op feeding
another), compiled for ``llvm`` and ``c``, exported, loaded and compared with the ops' NumPy
references at several inputs; the codegen tests check how each code generator handles the
intrinsic.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import ir, tir
from kiln.codegen.c import generate_c
from kiln.codegen.opencl import generate_opencl
from kiln.ir import get_op
from kiln.runtime.errors import CompileError

RNG = np.random.default_rng(3)


def _load(graph, target, tmp_path) -> kiln.GraphModule:
    lib = kiln.build(graph, target=target)
    path = str(tmp_path / f"dd_{target}.so")
    lib.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _outputs(m, n) -> list[np.ndarray]:
    return [m.get_output(i).numpy() for i in range(n)]


def _ref(op, xs, **attrs):
    opdef = get_op(op)
    return opdef.ref(xs, opdef.normalize_attrs(attrs))


# ----------------------------------------------------------------------------- the intrinsic
def _counting_kernel(kind="serial"):
    """out[0:count] = the positive entries of x; reports count as out's dim 0."""
    x, out = tir.Buffer("x", (8,), "float32"), tir.Buffer("out", (8,), "float32")
    cnt = tir.Buffer("cnt", (1,), "int32", scope="local")
    i = tir.Var("i", "int32")
    take = tir.seq(tir.BufferStore(out, x[i], [cnt[0]]), tir.BufferStore(cnt, cnt[0] + 1, [0]))
    loop = tir.For(i, 0, 8, kind, tir.seq(tir.IfThenElse(x[i] > 0.0, take),
                                            tir.set_extent(1, 0, cnt[0]) if kind != "serial" else None))
    body = tir.seq(tir.BufferStore(cnt, 0, [0]), loop, tir.set_extent(1, 0, cnt[0]))
    return tir.PrimFunc("count_pos", [x, out], tir.Allocate(cnt, body))


def test_set_extent_prints_and_validates():
    s = tir.set_extent(2, 1, tir.Var("n", "int32"))
    assert "kiln.set_extent(2, 1, n)" in str(s)
    with pytest.raises(CompileError, match="must be >= 0"):
        tir.set_extent(-1, 0, 3)
    x = tir.Buffer("x", (4,), "float32")
    bad = tir.PrimFunc("bad", [x], tir.set_extent(3, 0, 1))
    with pytest.raises(CompileError, match="no such parameter dim"):
        generate_c([bad])


def test_c_codegen_writes_the_dltensor_shape():
    src, _ = generate_c([_counting_kernel()])
    assert "((DLTensor*)args[1].v_handle)->shape[0] = (int64_t)(cnt[0]);" in src


def test_set_extent_inside_a_parallel_loop_is_refused():
    with pytest.raises(CompileError, match="inside a parallel loop"):
        generate_c([_counting_kernel("parallel")])
    from kiln.codegen.llvm import LLVMCodeGen

    with pytest.raises(CompileError, match="inside a parallel loop"):
        LLVMCodeGen("x86_64-unknown-linux-gnu").add_function(_counting_kernel("parallel"))


def test_llvm_codegen_passes_the_shape_array_to_the_compute_function():
    from kiln.codegen.llvm import LLVMCodeGen

    cg = LLVMCodeGen("x86_64-unknown-linux-gnu")
    cg.add_function(_counting_kernel())
    text = cg.finish()
    assert '@"count_pos_compute_"(ptr noalias %"x", ptr noalias %"out", ptr %"out_shape")' in text
    assert 'getelementptr inbounds i64, ptr %"out_shape", i64 0' in text


def test_gpu_codegen_refuses_set_extent_clearly():
    with pytest.raises(CompileError, match="data-dependent output extent.*place that op on the CPU"):
        generate_opencl([_counting_kernel()])


# ----------------------------------------------------------------------------- ops in graphs
@pytest.mark.parametrize("target", ["llvm", "c"])
def test_nonzero_compress_unique_on_symbolic_inputs(target, tmp_path):
    """Inputs with a symbolic batch: each kernel reads the runtime extents (padding never
    selected) and reports its data-dependent count."""
    g = ir.Graph("dd")
    g.declare_dim("batch", 1, 5)
    for name, hi in (("nz", 5 * 3), ("cp", 5), ("cf", 5), ("uq", 5 * 3)):
        g.declare_dim(name, 0, hi, data_dependent=True)
    x = g.add_input("x", ("batch", 3))
    c = g.add_input("c", ("batch",), "bool")
    nz = g.add_node("nonzero", [x], {"out_dim": "nz"})[0]
    cp = g.add_node("compress", [x, c], {"axis": 0, "out_dim": "cp"})[0]
    cf = g.add_node("compress", [x, c], {"axis": None, "out_dim": "cf"})[0]
    uq = g.add_node("unique", [x], {"sorted": True, "out_dim": "uq"})
    g.outputs = [nz, cp, cf, *uq]
    m = _load(g, target, tmp_path)
    for b in (3, 1, 5, 2):
        xv = RNG.integers(-2, 3, (b, 3)).astype(np.float32)
        cv = RNG.random(b) < 0.5
        m.run(x=xv, c=cv)
        got = _outputs(m, 7)
        want = [*_ref("nonzero", [xv], out_dim="nz"), *_ref("compress", [xv, cv], axis=0, out_dim="cp"),
                *_ref("compress", [xv, cv], axis=None, out_dim="cf"), *_ref("unique", [xv], sorted=True, out_dim="uq")]
        for k, (a, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(a, w, err_msg=f"output {k} at batch {b}")


def test_data_dependent_op_feeding_another(tmp_path):
    """unique(nonzero(x)[1]): the second kernel reads the first one's data-dependent extent."""
    g = ir.Graph("chain")
    g.declare_dim("nz", 0, 24, data_dependent=True)
    g.declare_dim("uq", 0, 24, data_dependent=True)
    x = g.add_input("x", (4, 6))
    nz = g.add_node("nonzero", [x], {"out_dim": "nz"})[0]
    cols = g.add("take", nz, g.add_constant(np.array(1, np.int64)), axis=0)
    y, first, inv, cnt = g.add_node("unique", [cols], {"sorted": False, "out_dim": "uq"})
    g.outputs = [cols, y, inv, cnt, first]
    m = _load(g, "llvm", tmp_path)
    for p in (0.5, 0.0, 1.0, 0.2):
        xv = (RNG.random((4, 6)) < p).astype(np.float32)
        m.run(x=xv)
        want_cols = np.nonzero(xv)[1].astype(np.int64)
        ref = _ref("unique", [want_cols], sorted=False, out_dim="uq")
        got = _outputs(m, 5)
        np.testing.assert_array_equal(got[0], want_cols)
        for a, w in zip(got[1:], [ref[0], ref[2], ref[3], ref[1]]):
            np.testing.assert_array_equal(a, w)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_unique_slices_topk_range_nms(target, tmp_path):
    g = ir.Graph("more")
    for name, hi in (("us", 6), ("tk", 7), ("rg", 32), ("nm", 2 * 10)):
        g.declare_dim(name, 0, hi, data_dependent=True)
    x = g.add_input("x", (3, 6), "int32")
    xf = g.add_input("xf", (2, 7))
    k = g.add_input("k", (1,), "int64")
    s, lim, d = (g.add_input(n, (), "int64") for n in ("s", "l", "d"))
    boxes, scores = g.add_input("boxes", (1, 10, 4)), g.add_input("scores", (1, 2, 10))
    us = g.add_node("unique", [x], {"axis": 1, "sorted": True, "out_dim": "us"})
    tk = g.add_node("topk_runtime_k", [xf, k], {"axis": 1, "largest": False, "out_dim": "tk"})
    rg = g.add_node("range_runtime", [s, lim, d], {"max_length": 32, "out_dim": "rg"})
    attrs = {"max_output_boxes_per_class": 10, "iou_threshold": 0.3, "score_threshold": 0.25, "out_dim": "nm"}
    nm = g.add_node("non_max_suppression", [boxes, scores], attrs)
    g.outputs = [*us, *tk, *rg, *nm]
    m = _load(g, target, tmp_path)
    for trial in range(3):
        xv = RNG.integers(0, 2, (3, 6)).astype(np.int32)
        xv[:, 4] = xv[:, 1]  # a repeated column
        xfv = RNG.standard_normal((2, 7)).astype(np.float32)
        kv = np.array([(3, 0, 7)[trial]], np.int64)
        rs = [np.array(v, np.int64) for v in ((0, 10, 3), (5, 5, 1), (9, -20, -1))[trial]]
        xy = RNG.random((1, 10, 2)).astype(np.float32) * 4
        bv = np.concatenate([xy, xy + 1 + RNG.random((1, 10, 2)).astype(np.float32)], -1)
        sv = RNG.random((1, 2, 10)).astype(np.float32)
        m.run(x=xv, xf=xfv, k=kv, s=rs[0], l=rs[1], d=rs[2], boxes=bv, scores=sv)
        want = [*_ref("unique", [xv], axis=1, sorted=True, out_dim="us"),
                *_ref("topk_runtime_k", [xfv, kv], axis=1, largest=False, out_dim="tk"),
                *_ref("range_runtime", rs, max_length=32, out_dim="rg"),
                *_ref("non_max_suppression", [bv, sv], **attrs)]
        for i, (a, w) in enumerate(zip(_outputs(m, len(want)), want)):
            np.testing.assert_array_equal(a, w, err_msg=f"output {i}, trial {trial}")


def test_dim_value_reads_runtime_extents():
    """dim_value: a symbolic dim expression as int64 data, from its inputs' runtime extents."""
    import kiln
    from kiln import ir
    from kiln.frontend.dims import dim_value

    g = ir.Graph("dv")
    g.declare_dim("b", 1, 6)
    g.declare_dim("s", 1, 9)
    x = g.add_input("x", ("b", "s"), "float32")
    g.add_input("y", ("s", 3), "float32")
    g.outputs = [dim_value(g, "b*s+2*s"), dim_value(g, "(s+1)//2")]
    assert [n.inputs for n in g.nodes if n.op == "dim_value"][1] == [x]  # an input carrying s
    for target in ("llvm", "c"):
        m = kiln.GraphModule(kiln.build(g, target=target)["default"](kiln.cpu()))
        for b, s in [(1, 1), (6, 9), (3, 4)]:
            m.run(x=np.zeros((b, s), "float32"), y=np.zeros((s, 3), "float32"))
            assert m.get_output(0).numpy().tolist() == [b * s + 2 * s]
            assert m.get_output(1).numpy().tolist() == [(s + 1) // 2]
