"""The fast paths of convolutions over a runtime image width (docs/dynamic_shapes.md).

A blocked conv tiles an output row by ``t`` pixels chosen for the upper-bound width.  With a
runtime width ``W`` the tile loop is partitioned (:func:`kiln.tir.unswitch.partition_tail_tiles`):
``W // t`` full tiles without guards, then the remainder as unguarded tiles of 8 pixels and
one tile of exactly the 1 .. 7 pixels left; a depthwise conv's full tiles run without their
per-tap bounds checks when the whole window is inside the image.  Every width from 1 to the
upper bound is run here (so every remainder of every tile size the targets pick, widths below
one tile and W = 1), largest first, so that stale data past a smaller image would show, and
compared with a NumPy reference; the structural tests make sure the fast paths exist and that
static kernels do not change.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.tir.expr import BinaryOp, IntImm, Select, Var
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import BufferStore, For, IfThenElse, LetStmt
from kiln.tir.unswitch import extent_bounds, partition_tail_tiles, unswitch_loops

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(11)
#: upper bound of H and W
HI = 40
#: (name, out channels, in channels per group, kernel, stride, dilation, pad, group)
CONVS = [
    ("plain", 32, 16, 3, 1, 1, 1, 1),
    ("strided", 32, 16, 3, 2, 1, 1, 1),
    ("dilated", 16, 16, 3, 1, 2, 2, 1),
    ("pointwise", 32, 16, 1, 1, 1, 0, 1),
    ("depthwise", 16, 1, 3, 1, 1, 1, 16),
    ("depthwise_strided", 16, 1, 3, 2, 1, 1, 16),
    ("depthwise_dilated", 16, 1, 3, 1, 2, 2, 16),
]


def _model() -> tuple[bytes, dict[str, np.ndarray]]:
    """x (1, 16, h, w) -> each conv of :data:`CONVS` + ReLU, one output each."""
    nodes, inits, outs, weights = [], [], [], {}
    for name, co, ci, k, s, d, p, g in CONVS:
        w = (RNG.standard_normal((co, ci, k, k)) * 0.3).astype("float32")
        weights[name] = w
        inits.append(helper.make_tensor(f"w_{name}", TensorProto.FLOAT, w.shape, w.flatten().tolist()))
        nodes.append(helper.make_node("Conv", ["x", f"w_{name}"], [f"c_{name}"], pads=[p] * 4, strides=[s, s],
                                      dilations=[d, d], group=g))
        nodes.append(helper.make_node("Relu", [f"c_{name}"], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, "h", "w"])],
                          outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), weights


def _conv_ref(x: np.ndarray, w: np.ndarray, stride: int, dil: int, pad: int, group: int) -> np.ndarray:
    """Direct NCHW convolution + ReLU in float64."""
    n, c, h, wd = x.shape
    co, cig, k, _ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (k - 1) - 1) // stride + 1
    out = np.zeros((n, co, oh, ow))
    cog = co // group
    for gi in range(group):
        xs = xp[:, gi * cig:(gi + 1) * cig]
        ws = w[gi * cog:(gi + 1) * cog].astype(np.float64)
        for ky in range(k):
            for kx in range(k):
                win = xs[:, :, ky * dil:ky * dil + stride * (oh - 1) + 1:stride,
                         kx * dil:kx * dil + stride * (ow - 1) + 1:stride]
                out[:, gi * cog:(gi + 1) * cog] += np.einsum("nchw,oc->nohw", win, ws[:, :, ky, kx])
    return np.maximum(out, 0.0)


def _build():
    model, weights = _model()
    graph, params = kiln.frontend.from_onnx(model, dim_ranges={"h": (1, HI), "w": (1, HI)})
    return graph, params, weights


# the upper bound first, then every width below it: each remainder of each tile size
_WIDTHS = [HI] + list(range(HI - 1, 0, -1))


@pytest.mark.parametrize("target", ["llvm", "c", "llvm -mcpu=native"])
def test_every_width_matches_numpy(target):
    graph, params, weights = _build()
    lib = kiln.build(graph, target=target, params=params)
    mod = kiln.GraphModule(lib["default"](kiln.cpu()))
    for w in _WIDTHS:
        h = 1 + (7 * w) % HI  # heights vary with the width (border rows, one row, the bound)
        x = RNG.standard_normal((1, 16, h, w)).astype("float32")
        mod.run(x=x)
        for i, (name, _, _, _, s, d, p, g) in enumerate(CONVS):
            ref = _conv_ref(x, weights[name], s, d, p, g)
            got = mod.get_output(i).numpy()
            assert got.shape == ref.shape, f"{name} at {h}x{w}"
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"{target}: {name} at {h}x{w}")


def _conv_funcs(graph, params, target: str) -> list:
    return [f for f in kiln.driver.lower(graph, target, params=params).funcs if "conv2d_nchwc" in f.name]


def _full_tile_loops(body) -> list[For]:
    """Serial loops over ``n // t`` tiles of a runtime extent ``n`` (a variable the kernel does
    not bind itself): the partitioned tile loops."""
    found: list[For] = []
    bound: set = set()

    def visit(n) -> None:
        if isinstance(n, (For, LetStmt)):
            bound.add(n.loop_var if isinstance(n, For) else n.var)
        e = getattr(n, "extent", None)
        if (isinstance(n, For) and n.kind == "serial" and isinstance(e, BinaryOp) and e.op == "floordiv"
                and isinstance(e.a, Var) and isinstance(e.b, IntImm)):
            found.append(n)

    post_order_visit(body, visit)
    return [lp for lp in found if lp.extent.a not in bound]


def _count(node, kind) -> int:
    hits = [0]

    def visit(n) -> None:
        hits[0] += isinstance(n, kind)

    post_order_visit(node, visit)
    return hits[0]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_dynamic_conv_has_unguarded_full_tiles(target, monkeypatch):
    """Every dynamic conv kernel has a loop over ``w // t`` full tiles that stores its output
    with no guard; a depthwise one also an interior path without bounds checks."""
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # the plain 3x3 conv stays direct (its tiles)
    graph, params, _ = _build()
    funcs = _conv_funcs(graph, params, target)
    assert len(funcs) == len(CONVS)
    for f in funcs:
        body = unswitch_loops(f.body, f.params)  # what the code generators compile
        loops = _full_tile_loops(body)
        assert loops, f"{f.name}: no full-tile loop\n{f}"
        for lp in loops:
            stores = _count(lp.body, BufferStore)
            assert stores
            if _count(lp.body, Select) == 0:
                assert _count(lp.body, IfThenElse) == 0, f"{f.name}: guarded full tiles\n{lp}"
            else:  # depthwise: an interior version without the tap checks
                top = lp.body
                assert isinstance(top, IfThenElse) and top.else_case is not None, f"{f.name}\n{lp}"
                assert _count(top.then_case, Select) == 0, f"{f.name}: interior tiles check their taps"
                assert _count(top.then_case, IfThenElse) == 0, f"{f.name}: guarded interior tiles"


def test_static_kernels_do_not_change(monkeypatch):
    """The partition only applies to runtime trip counts: a static conv's loops are untouched,
    while the same convs over a runtime width are rewritten (so the comparison can fail)."""
    monkeypatch.setenv("KILN_WINOGRAD", "0")  # every conv of CONVS a direct conv2d_nchwc kernel
    model, _ = _model()
    graph, params = kiln.frontend.from_onnx(model, shape={"x": (1, 16, 37, 37)})
    static = _conv_funcs(graph, params, "llvm -mcpu=native")
    assert len(static) == len(CONVS)
    for f in static:
        assert str(f.with_body(partition_tail_tiles(f.body, extent_bounds(f.params)))) == str(f), f.name
    graph, params, _ = _build()
    dynamic = _conv_funcs(graph, params, "llvm -mcpu=native")
    assert len(dynamic) == len(CONVS)
    for f in dynamic:
        assert _full_tile_loops(partition_tail_tiles(f.body, extent_bounds(f.params))), f"{f.name}: not partitioned"
