"""Transposes of a channel axis across a runtime width (NCHW <-> NHWC, with fused elementwise
ops), scheduled as tiles of 16 pixels x a few channels (``kiln.topi.schedule.generic.
dynamic_transpose``), against NumPy.

One library per target holds every case; it runs at sizes below the upper bounds whose width
is no multiple of the tile (16), of the tail tile (8) nor of the vector width, and at W = 1.
Before each size the inputs are NaN over their whole upper-bound storage and a run at the
upper bound leaves NaN in every output element: the valid box of each input is then
overwritten with data, so an element read from outside the valid box, or an output element
the kernel skips, shows up as a NaN or a wrong value. The scale factors are powers of two, so
a fused multiply-add rounds as NumPy's multiply then add does and the comparison is exact.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import kiln
from kiln.driver.build import lower
from kiln.ir import Graph
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Allocate, For, IfThenElse
from kiln.tir.unswitch import unswitch_loops

#: Upper bounds of the batch, H and W: 37 is no multiple of any tile or vector width.
UB = {"n": 2, "h": 5, "w": 37}
#: (n, h, w) per run; the upper bound first.
SIZES = [(2, 5, 37), (1, 3, 1), (2, 2, 17), (1, 4, 16), (1, 1, 33), (2, 3, 23), (1, 2, 8), (2, 5, 7), (1, 1, 31)]

NCHW = ("n", "c", "h", "w")
NHWC = ("n", "h", "w", "c")


def _scale(c: int) -> np.ndarray:
    """Per-channel factors, powers of two (exact products)."""
    return (2.0 ** (np.arange(c) % 5 - 2) * np.where(np.arange(c) % 2, -1, 1)).astype("float32").reshape(c, 1, 1)


#: (name, channels, input layouts, build(graph, inputs, scale) -> output, numpy reference).
#: (Not named ``CASES``: test_registry.py reads that name as a list of harness cases.)
TRANSPOSES: list[tuple[str, int, tuple[tuple[str, ...], ...], Callable, Callable]] = [
    ("nchw-nhwc", 24, (NCHW,),
     lambda g, xs, s: g.add("transpose", xs[0], axes=(0, 2, 3, 1)),
     lambda xs, s: xs[0].transpose(0, 2, 3, 1)),
    ("nhwc-nchw", 20, (NHWC,),
     lambda g, xs, s: g.add("transpose", xs[0], axes=(0, 3, 1, 2)),
     lambda xs, s: xs[0].transpose(0, 3, 1, 2)),
    # ConvNeXt's layer scale and residual: back to NCHW, scaled, added, to NHWC again
    ("nhwc-scale-add-nhwc", 12, (NHWC, NCHW),
     lambda g, xs, s: g.add("transpose", g.add("add", g.add("multiply", g.add("transpose", xs[0], axes=(0, 3, 1, 2)),
                                                           s), xs[1]), axes=(0, 2, 3, 1)),
     lambda xs, s: (xs[0].transpose(0, 3, 1, 2) * s + xs[1]).transpose(0, 2, 3, 1)),
    ("nhwc-scale-add", 8, (NHWC, NCHW),
     lambda g, xs, s: g.add("add", g.add("multiply", g.add("transpose", xs[0], axes=(0, 3, 1, 2)), s), xs[1]),
     lambda xs, s: xs[0].transpose(0, 3, 1, 2) * s + xs[1]),
    # channel counts that 4 does not divide: groups of 6 and 7 channels
    ("nchw-nhwc-6", 6, (NCHW,),
     lambda g, xs, s: g.add("transpose", xs[0], axes=(0, 2, 3, 1)),
     lambda xs, s: xs[0].transpose(0, 2, 3, 1)),
    ("nhwc-nchw-7", 7, (NHWC,),
     lambda g, xs, s: g.add("transpose", xs[0], axes=(0, 3, 1, 2)),
     lambda xs, s: xs[0].transpose(0, 3, 1, 2)),
]


def _dims(layout: tuple[str, ...], c: int, n: object, h: object, w: object) -> tuple:
    return tuple({"n": n, "c": c, "h": h, "w": w}[d] for d in layout)


def _graph(cases: list, dims: dict = UB, static: tuple[int, int, int] | None = None) -> Graph:
    """The cases as one graph; ``static`` (n, h, w) fixes every dim to that size."""
    g = Graph()
    for name, hi in dims.items():
        g.declare_dim(name, 1, hi)
    n, h, w = static or ("n", "h", "w")
    outs = []
    for k, (_, c, layouts, build, _) in enumerate(cases):
        xs = [g.add_input(f"x{k}_{j}", _dims(lay, c, n, h, w)) for j, lay in enumerate(layouts)]
        outs.append(build(g, xs, g.add_constant(_scale(c))))
    g.outputs = outs
    return g


@pytest.fixture(scope="module", params=["llvm", "c"])
def module(request: pytest.FixtureRequest) -> kiln.GraphModule:
    lib = kiln.build(_graph(TRANSPOSES), target=request.param)
    return kiln.GraphModule(lib["default"](kiln.cpu()))


def _set_inputs(m: kiln.GraphModule, make: Callable[[tuple], np.ndarray], n: int, h: int, w: int) -> list:
    xs = []
    for k, (_, c, layouts, _, _) in enumerate(TRANSPOSES):
        xs.append([make(_dims(lay, c, n, h, w)) for lay in layouts])
        for j, x in enumerate(xs[-1]):
            m.set_input(f"x{k}_{j}", x)
    return xs


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_dynamic_transpose_matches_numpy(module: kiln.GraphModule, size: tuple) -> None:
    n, h, w = size
    rng = np.random.default_rng(n * 1000 + h * 37 + w)
    # NaN in every input's whole storage and (by one run at the upper bound) every output's
    _set_inputs(module, lambda shape: np.full(shape, np.nan, "float32"), UB["n"], UB["h"], UB["w"])
    module.run()
    xs = _set_inputs(module, lambda shape: rng.standard_normal(shape).astype("float32"), n, h, w)
    module.run()
    for k, ((name, c, _, _, ref), x) in enumerate(zip(TRANSPOSES, xs)):
        want = ref(x, _scale(c))
        got = module.get_output(k).numpy()
        assert got.shape == want.shape, (name, size)
        np.testing.assert_array_equal(got, want, err_msg=f"{name}, (n, h, w)={size}")


# ----------------------------------------------------------------------------- loop structure
def _nodes(stmt: object, kind: type) -> list:
    found: list = []
    post_order_visit(stmt, lambda n: found.append(n) if isinstance(n, kind) else None)
    return found


@pytest.mark.parametrize("target", ["llvm -mcpu=skylake-avx512", "llvm -mcpu=haswell"])
@pytest.mark.parametrize("case", [TRANSPOSES[0], TRANSPOSES[1], TRANSPOSES[2]], ids=lambda c: c[0])
def test_runtime_width_gets_unguarded_full_tiles(case: tuple, target: str) -> None:
    # the runtime width is cut into w // 16 full tiles, the transposed source staged through a
    # local copy, with no per-pixel test against the width inside them and only static loops
    (func,) = lower(_graph([case], {"n": 8, "h": 64, "w": 64}), target).funcs
    assert _nodes(func.body, Allocate), "the tile's source is not staged through a local copy"
    body = unswitch_loops(func.body, func.params)
    full = [f for f in _nodes(body, For) if str(f.extent).replace(" ", "") == "w_rt//16"]
    assert len(full) == 1, "no loop over the full tiles of the runtime width"
    guards = [s for s in _nodes(full[0].body, IfThenElse) if "w_rt" in str(s.cond)]
    assert not guards, f"full tiles test the runtime width: {guards[0].cond}"
    runtime_inner = [f for f in _nodes(full[0].body, For) if "_rt" in str(f.extent)]
    assert not runtime_inner, "a loop inside the full tiles has a runtime extent"


@pytest.mark.parametrize("dims, static", [({}, (1, 28, 28)), ({"n": 4, "h": 64, "w": 4}, None)],
                         ids=["static", "narrow-upper-bound"])
def test_static_or_narrow_width_keeps_default_schedule(dims: dict, static: tuple | None) -> None:
    # static shapes, or a runtime width whose upper bound is below 8, keep the pixel-by-pixel
    # schedule (no staged copy)
    for case in TRANSPOSES[:3]:
        (func,) = lower(_graph([case], dims, static), "llvm -mcpu=skylake-avx512").funcs
        assert not _nodes(func.body, Allocate), case[0]
