"""Data-movement kernels (channel shuffle, slices, concatenations, blocked global pools) keep
contiguous vector accesses, and compute what the ONNX reference does.

The injective schedule fuses every axis into one flat loop; for a transpose that turns every
read into a gather, so it fuses only the trailing axes that are read contiguously. A reduction
that keeps its last axis (a global pool over ``NCHW[b]c``) vectorises that axis.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.driver.build import lower
from kiln.frontend import from_onnx
from kiln.tir.expr import Load
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import BufferStore, For
from kiln.runtime import ndarray as nd
from kiln.tir.vectorize import flat_index, stride_in

from .harness import Case, build_cases

F = TensorProto.FLOAT


def _model(nodes: list, inputs: list, inits: list | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, None)], inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _shuffle_model(c: int, hw: int) -> onnx.ModelProto:
    """ShuffleNet's channel shuffle: split, relu on one half, concat, reshape-transpose-reshape."""
    x = helper.make_tensor_value_info("x", F, [1, 2 * c, hw, hw])
    nodes = [
        helper.make_node("Split", ["x"], ["a", "b"], axis=1, num_outputs=2),
        helper.make_node("Relu", ["b"], ["br"]),
        helper.make_node("Concat", ["a", "br"], ["c"], axis=1),
        helper.make_node("Reshape", ["c", "s1"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "s2"], ["y"]),
    ]
    inits = [helper.make_tensor("s1", TensorProto.INT64, [5], [1, 2, c, hw, hw]),
             helper.make_tensor("s2", TensorProto.INT64, [4], [1, 2 * c, hw, hw])]
    return _model(nodes, [x], inits)


def _vector_loops(func) -> list[For]:
    found: list[For] = []
    post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, For) and n.kind == "vectorized" else None)
    return found


def _enclosing_ranges(func) -> dict:
    ranges = {}

    def f(n):
        if isinstance(n, For) and hasattr(n.extent, "value"):
            ranges[n.loop_var] = (0, n.extent.value - 1)
    post_order_visit(func.body, f)
    return ranges


def _strides(func, loop: For) -> list:
    """Strides of every buffer access in ``loop``'s body along its variable."""
    rng = _enclosing_ranges(func)
    rng[loop.loop_var] = (0, 15)
    out = []

    def f(n):
        if isinstance(n, (Load, BufferStore)):
            out.append(stride_in(flat_index(n.buffer, n.indices), loop.loop_var, rng))
    post_order_visit(loop.body, f)
    return out


def _lower(model: onnx.ModelProto):
    mod, params = from_onnx(model)
    return lower(mod, "llvm", params)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    mod, params = from_onnx(model)
    gm = kiln.GraphModule(kiln.build(mod, target="llvm", params=params)["default"](kiln.cpu()))
    gm.set_input("x", x)
    gm.run()
    return gm.get_output(0).numpy()


@pytest.mark.parametrize("c,hw", [(116, 14), (58, 28), (12, 5)])
def test_channel_shuffle_reads_rows_contiguously(c: int, hw: int) -> None:
    lowered = _lower(_shuffle_model(c, hw))
    funcs = {f.name: f for f in lowered.funcs}
    transpose = next(f for n, f in funcs.items() if "transpose" in n)
    loops = _vector_loops(transpose)
    assert loops, str(transpose)
    # the (H, W) rows are the vector loop: every load and store moves by one element per lane
    assert all(s == 1 for loop in loops for s in _strides(transpose, loop)), str(transpose)
    concat = next(f for n, f in funcs.items() if "concatenate" in n)
    assert all(s == 1 for loop in _vector_loops(concat) for s in _strides(concat, loop)), str(concat)

    x = np.random.default_rng(0).standard_normal((1, 2 * c, hw, hw)).astype(np.float32)
    a, b = x[:, :c], np.maximum(x[:, c:], 0)
    want = np.concatenate([a, b], 1).reshape(1, 2, c, hw, hw).transpose(0, 2, 1, 3, 4).reshape(x.shape)
    np.testing.assert_array_equal(_run(_shuffle_model(c, hw), x), want)


def test_elementwise_keeps_one_flat_loop() -> None:
    """An elementwise op on a short last axis still runs as one flat vector loop (no row tails)."""
    x = helper.make_tensor_value_info("x", F, [1, 232, 14, 14])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x])
    (func,) = _lower(model).funcs
    loops = _vector_loops(func)
    assert len(loops) == 1 and all(s == 1 for s in _strides(func, loops[0])), str(func)
    fors = []
    post_order_visit(func.body, lambda n: fors.append(n) if isinstance(n, For) else None)
    assert len(fors) == 2, str(func)  # parallel outer x vector inner, over all 232*14*14 elements


@pytest.mark.parametrize("block", [8, 16])
def test_blocked_global_pool_vectorises_the_block(block: int) -> None:
    """``mean over (h, w)`` of ``[1, C/b, H, W, b]``: the block is the vector of accumulators."""
    shape = (1, 3, 7, 9, block)
    (built,) = build_cases([Case("reduce_mean", [(shape, "float32")], {"axes": (2, 3), "keepdims": True})],
                           "llvm", "pool")[1]
    func = built.func
    loops = _vector_loops(func)
    assert loops and all(lp.extent.value == block for lp in loops), str(func)
    assert all(s == 1 for lp in loops for s in _strides(func, lp)), str(func)
    mod, (b,) = build_cases([built.case], "llvm", "pool")
    data = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    out = nd.empty((1, 3, 1, 1, block), "float32")
    mod[b.name](nd.array(data), out)
    np.testing.assert_allclose(out.numpy(), data.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_padded_pool_window_guard_leaves_the_vector_loop() -> None:
    """``max_pool2d_nchwc`` with padding guards each window tap with a condition the same for
    every lane of the channel block: unswitching hoists it out of the vector loop, which the
    codegens then vectorise (it ran as a scalar loop: ResNet-18's stem pool took 1.28 ms)."""
    from kiln.tir.unswitch import unswitch_loops
    from kiln.tir.vectorize import plan_vector_loop

    case = Case("max_pool2d_nchwc", [((1, 2, 11, 11, 16), "float32")],
                {"pool_size": (3, 3), "strides": (2, 2), "padding": (1, 1, 1, 1)})
    mod, (b,) = build_cases([case], "llvm", "pool2")
    body = unswitch_loops(b.func.body, b.func.params)
    loops: list = []
    post_order_visit(body, lambda x: loops.append(x) if isinstance(x, For) and x.kind == "vectorized" else None)
    assert loops and all(plan_vector_loop(lp, 32) is not None for lp in loops), str(b.func)
    data = np.random.default_rng(3).standard_normal((1, 2, 11, 11, 16)).astype(np.float32)
    out = nd.empty((1, 2, 6, 6, 16), "float32")
    mod[b.name](nd.array(data), out)
    padded = np.pad(data, [(0, 0), (0, 0), (1, 1), (1, 1), (0, 0)], constant_values=-np.inf)
    want = np.stack([np.stack([padded[:, :, 2 * y:2 * y + 3, 2 * x:2 * x + 3].max(axis=(2, 3)) for x in range(6)], 2)
                     for y in range(6)], 2)
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("src,dst,shape", [("NCHW32c", "NCHW", (1, 4, 56, 56, 32)),
                                           ("NCHW", "NCHW16c", (1, 128, 28, 28)),
                                           # blocked -> blocked: the path the fix is in
                                           ("NCHW16c", "NCHW8c", (1, 8, 56, 56, 16)),
                                           ("NCHW8c", "NCHW32c", (1, 8, 28, 28, 8))])
def test_layout_transform_outer_loop_is_parallel(src: str, dst: str, shape: tuple) -> None:
    """A blocked copy parallelises its fused outer loops (their extent was read from the fused
    IterVar before it had one, so every layout transform ran on one thread)."""
    from kiln.ir import Graph

    g = Graph()
    x = g.add_input("x", shape)
    g.outputs = [g.add("layout_transform", x, src_layout=src, dst_layout=dst)]
    (func,) = lower(g, "llvm").funcs
    kinds: list[str] = []
    post_order_visit(func.body, lambda n: kinds.append(n.kind) if isinstance(n, For) else None)
    assert "parallel" in kinds, kinds
