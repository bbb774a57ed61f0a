"""NCHW <-> NCHW[x]c ``layout_transform`` over a runtime batch, H and W, against NumPy.

One library per target holds every case; it runs at sizes below the upper bounds whose width
is no multiple of the tiles (16, 8) nor of the vector width, and at W = 1. Before each size the
inputs are NaN over their whole upper-bound storage and a run at the upper bound leaves NaN in
every output element: the valid box of each input is then overwritten with data (a padded
block's lanes past ``channels`` stay NaN), so an element read from outside the valid box, or
an output element the kernel skips, shows up as a NaN or a wrong value.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.driver.build import lower
from kiln.ir import Graph
from kiln.ir.ops.layout import convert_layout
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Allocate, For, IfThenElse
from kiln.tir.unswitch import unswitch_loops

#: Upper bounds of the batch, H and W: 37 is no multiple of any tile or vector width.
UB = {"n": 2, "h": 37, "w": 37}
#: (n, h, w) per run; the upper bound first.
SIZES = [(2, 37, 37), (1, 5, 1), (2, 3, 17), (1, 9, 16), (1, 1, 33), (2, 4, 23), (1, 2, 8), (1, 37, 7), (2, 6, 31)]
#: (src, dst, dims between the batch and H / after W, channels): NCHW -> blocked (a padded
#: block too) and back (a padded source block, and 8c, which keeps the static-width schedule).
#: (Not named ``CASES``: test_registry.py reads that name as a list of harness cases.)
TRANSFORMS = [
    ("NCHW", "NCHW16c", (32,), (), 0),
    ("NCHW", "NCHW8c", (24,), (), 0),
    ("NCHW", "NCHW32c", (58,), (), 58),
    ("NCHW16c", "NCHW", (2,), (16,), 0),
    ("NCHW32c", "NCHW", (2,), (32,), 58),
    ("NCHW32c", "NCHW", (1,), (32,), 0),
    ("NCHW8c", "NCHW", (3,), (8,), 0),
]


def _graph(cases: list, dims: dict = UB, static_hw: int = 0) -> Graph:
    """The cases as one graph; ``static_hw`` (0: none) fixes H and W to that extent."""
    g = Graph()
    for name, hi in dims.items():
        g.declare_dim(name, 1, hi)
    hw = (static_hw, static_hw) if static_hw else ("h", "w")
    outs = []
    for k, (src, dst, mid, last, channels) in enumerate(cases):
        x = g.add_input(f"x{k}", ("n", *mid, *hw, *last))
        outs.append(g.add("layout_transform", x, src_layout=src, dst_layout=dst, channels=channels))
    g.outputs = outs
    return g


def _data(rng: np.random.Generator, case: tuple, n: int, h: int, w: int) -> np.ndarray:
    src, _, mid, last, channels = case
    if not (channels and last):
        return rng.standard_normal((n, *mid, h, w, *last)).astype("float32")
    # a padded source block: its lanes past the channels are never read (NaN here)
    x = convert_layout(rng.standard_normal((n, channels, h, w)).astype("float32"), "NCHW", src, channels)
    x[:, -1, :, :, channels % last[0]:] = np.nan
    return x


@pytest.fixture(scope="module", params=["llvm", "c"])
def module(request: pytest.FixtureRequest) -> kiln.GraphModule:
    lib = kiln.build(_graph(TRANSFORMS), target=request.param)
    return kiln.GraphModule(lib["default"](kiln.cpu()))


def _poison(m: kiln.GraphModule) -> None:
    """NaN in every input's whole storage and (by one run at the upper bound) every output's."""
    n, h, w = UB["n"], UB["h"], UB["w"]
    for k, (_, _, mid, last, _) in enumerate(TRANSFORMS):
        m.set_input(f"x{k}", np.full((n, *mid, h, w, *last), np.nan, "float32"))
    m.run()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_dynamic_layout_transform_matches_numpy(module: kiln.GraphModule, size: tuple) -> None:
    n, h, w = size
    rng = np.random.default_rng(n * 1000 + h * 37 + w)
    _poison(module)
    xs = [_data(rng, case, n, h, w) for case in TRANSFORMS]
    for k, x in enumerate(xs):
        module.set_input(f"x{k}", x)
    module.run()
    for k, ((src, dst, _, _, channels), x) in enumerate(zip(TRANSFORMS, xs)):
        want = convert_layout(x, src, dst, channels)
        got = module.get_output(k).numpy()
        assert got.shape == want.shape, (src, dst, size)
        np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dst}, channels={channels}, (n, h, w)={size}")


# ----------------------------------------------------------------------------- loop structure
def _nodes(stmt: object, kind: type) -> list:
    found: list = []
    post_order_visit(stmt, lambda n: found.append(n) if isinstance(n, kind) else None)
    return found


def _mentions(node: object, name: str) -> bool:
    return name in str(node)


@pytest.mark.parametrize("target", ["llvm -mcpu=skylake-avx512", "llvm -mcpu=haswell"])
@pytest.mark.parametrize("case", [TRANSFORMS[2], TRANSFORMS[4]], ids=["NCHW-NCHW32c", "NCHW32c-NCHW"])
def test_runtime_width_gets_unguarded_full_tiles(case: tuple, target: str) -> None:
    # the runtime width is cut into w // 16 full tiles, staged through a local copy, with no
    # per-pixel test against the width inside them; the tail tiles have static widths
    dims = {"n": 8, "h": 32, "w": 32}
    (func,) = lower(_graph([case], dims), target).funcs
    assert _nodes(func.body, Allocate), "the tile's source is not staged through a local copy"
    body = unswitch_loops(func.body, func.params)
    full = [f for f in _nodes(body, For) if str(f.extent).replace(" ", "") == "w_rt//16"]
    assert len(full) == 1, "no loop over the full tiles of the runtime width"
    guards = [s for s in _nodes(full[0].body, IfThenElse) if _mentions(s.cond, "w_rt")]
    assert not guards, f"full tiles test the runtime width: {guards[0].cond}"
    runtime_inner = [f for f in _nodes(full[0].body, For) if _mentions(f.extent, "_rt")]
    assert not runtime_inner, "a loop inside the full tiles has a runtime extent"


@pytest.mark.parametrize("dims, static_hw", [({"n": 4}, 28), ({"n": 4, "h": 16, "w": 16}, 0)],
                         ids=["static-width", "narrow-upper-bound"])
def test_static_or_narrow_width_keeps_plain_tiles(dims: dict, static_hw: int) -> None:
    # a static width, or a runtime one of at most 31, keeps the plain tiles of _transpose_copy
    for case in (TRANSFORMS[2], TRANSFORMS[4]):
        (func,) = lower(_graph([case], dims, static_hw), "llvm -mcpu=skylake-avx512").funcs
        assert not _nodes(func.body, Allocate), case
