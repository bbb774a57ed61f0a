"""PruneConvTaps: conv2d taps that read only padding are sliced out of the weight."""

import importlib
import itertools

import numpy as np
import pytest

import kiln
from kiln import ir, transform
from kiln.ir import Graph
from kiln.transform.prune_conv_taps import live_taps, prune_conv_taps

RNG = np.random.default_rng(0)
# the module (its name is shadowed in kiln.transform by the function of the same name)
prune_mod = importlib.import_module("kiln.transform.prune_conv_taps")


def r(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype("float32")


def np_conv(x, w, strides, padding, dilation, groups):
    """Direct NumPy conv2d (NCHW, OIHW, padding top/left/bottom/right), written independently
    of the op reference: one output pixel at a time."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilation, padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // og
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(oh):
            for j in range(ow):
                win = xs[:, :, i * sh: i * sh + (kh - 1) * dh + 1: dh,
                         j * sw: j * sw + (kw - 1) * dw + 1: dw]
                out[:, oc, i, j] = np.einsum("nchw,chw->n", win, w[oc])
    return out.astype(np.float32)


def _conv_graph(xshape, w, const=True, **attrs):
    g = Graph()
    x = g.add_input("x", xshape)
    wv = g.add_constant(w) if const else g.add_input("w", w.shape)
    g.outputs = [g.add("conv2d", x, wv, **attrs)]
    return g


def _convs(g):
    return [n for n in g.nodes if n.op == "conv2d"]


def _check(xshape, wshape, expect_kernel, pieces=1, **attrs):
    """Rewrite, compare against the direct NumPy conv, check the pruned kernel size (one
    conv) or the number of band pieces."""
    x, w = r(*xshape), r(*wshape)
    attrs.setdefault("strides", (1, 1))
    attrs.setdefault("dilation", (1, 1))
    attrs.setdefault("padding", (0, 0, 0, 0))
    attrs.setdefault("groups", 1)
    g = _conv_graph(xshape, w, **attrs)
    h = prune_conv_taps(g)
    convs = _convs(h)
    assert pieces is None or len(convs) == pieces
    if pieces == 1:
        assert convs[0].inputs[1].shape[2:] == expect_kernel
        if expect_kernel == (1, 1):
            assert convs[0].attrs["dilation"] == (1, 1)
    (got,) = ir.evaluate(h, {"x": x})
    want = np_conv(x, w, attrs["strides"], attrs["padding"], attrs["dilation"], attrs["groups"])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return h


def _taps_work(h):
    """Multiply-adds per (output channel, input channel) summed over the graph's convs."""
    return sum(int(np.prod(n.outputs[0].shape[2:])) * int(np.prod(n.inputs[1].shape[2:]))
               for n in _convs(h))


@pytest.mark.parametrize("dil", [24, 36])
def test_aspp_branches_become_1x1(dil):
    """DeepLabV3 ASPP on a 14x14 map: dilation >= 14 leaves only the centre tap."""
    h = _check((1, 8, 14, 14), (4, 8, 3, 3), (1, 1), dilation=(dil, dil), padding=(dil,) * 4)
    assert _convs(h)[0].attrs["padding"] == (0, 0, 0, 0)


def test_aspp_dilation_12_is_split_into_bands():
    """Dilation 12 on 14 rows: the outer taps reach rows 0-1 for output rows 12-13 (and
    12-13 for 0-1), so no tap is dead as a whole; the output splits into 3 x 3 bands, each
    computed with only the taps it reads, the centre band as a 1x1 conv."""
    h = _check((1, 8, 14, 14), (4, 8, 3, 3), None, pieces=9, dilation=(12, 12),
               padding=(12,) * 4)
    assert all(n.attrs["padding"] == (0, 0, 0, 0) for n in _convs(h))
    kernels = sorted(n.inputs[1].shape[2:] for n in _convs(h))
    assert kernels.count((1, 1)) == 1 and kernels.count((2, 2)) == 4
    assert _taps_work(h) == (2 * 2 + 10 + 2 * 2) ** 2  # was 14 * 14 * 9
    assert h.op_counts()["concatenate"] == 4


@pytest.mark.parametrize("stride,groups", [(2, 1), (3, 1), (1, 2), (1, 8), (2, 8)])
def test_bands_strided_and_grouped(stride, groups):
    h = _check((1, 8, 14, 14), (8, 8 // groups, 3, 3), None, pieces=None, strides=(stride, stride),
               dilation=(12, 12), padding=(12,) * 4, groups=groups)
    assert len(_convs(h)) > 1


def test_bands_on_one_axis():
    # rows are atrous, columns are a plain 3-tap conv that keeps its padding
    h = _check((1, 4, 14, 9), (4, 4, 3, 3), None, pieces=3, dilation=(12, 1),
               padding=(12, 1, 12, 1))
    assert all(n.attrs["padding"][1::2] == (1, 1) for n in _convs(h))


def test_partial_5x5_keeps_the_live_3x3(monkeypatch):
    # taps at offsets -16, -8, 0, 8, 16 on 14 rows: the outer two only read padding (the
    # band split, which would also pay here, is turned off to see the slice alone)
    monkeypatch.setattr(prune_mod, "BAND_MAX_PIECES", 1)
    h = _check((1, 3, 14, 14), (2, 3, 5, 5), (3, 3), dilation=(8, 8), padding=(16,) * 4)
    (conv,) = _convs(h)
    assert conv.attrs["dilation"] == (8, 8) and conv.attrs["padding"] == (8, 8, 8, 8)


def test_one_axis_only():
    # 14 rows with dilation 20 -> rows collapse; 40 columns -> every column tap is live
    h = _check((1, 3, 14, 40), (2, 3, 3, 3), (1, 3), dilation=(20, 20), padding=(20,) * 4)
    (conv,) = _convs(h)
    assert conv.attrs["dilation"] == (1, 20) and conv.attrs["padding"] == (0, 20, 0, 20)


def test_asymmetric_padding():
    # rows: top 9 kills tap 0 only; columns: right 12 kills tap 2 only
    h = _check((1, 2, 6, 6), (3, 2, 3, 3), (2, 2), dilation=(7, 7), padding=(9, 2, 5, 12))
    assert _convs(h)[0].attrs["padding"] == (2, 2, 5, 5)


@pytest.mark.parametrize("stride", [2, 3])
def test_strided(stride):
    _check((1, 4, 14, 14), (4, 4, 3, 3), (1, 1), strides=(stride, stride), dilation=(24, 24),
           padding=(24,) * 4)


@pytest.mark.parametrize("groups,cin,cout", [(2, 8, 4), (8, 8, 8)])
def test_grouped_and_depthwise(groups, cin, cout):
    _check((1, cin, 14, 14), (cout, cin // groups, 3, 3), (1, 1), dilation=(24, 24),
           padding=(24,) * 4, groups=groups)


def test_dilation_6_on_14_is_unchanged():
    x = r(1, 3, 14, 14)
    g = _conv_graph(x.shape, r(2, 3, 3, 3), dilation=(6, 6), padding=(6,) * 4)
    h = prune_conv_taps(g)
    assert _convs(h)[0].inputs[1].shape == (2, 3, 3, 3)


def test_non_constant_weight_is_unchanged():
    g = _conv_graph((1, 3, 14, 14), r(2, 3, 3, 3), const=False, dilation=(24, 24),
                    padding=(24,) * 4)
    h = prune_conv_taps(g)
    assert _convs(h)[0].inputs[1].shape == (2, 3, 3, 3)


def test_negative_padding_case_is_rejected():
    # one output row (stride 5 on 5 rows) whose live tap is the last one, reading row 3: the
    # pruned kernel would need top padding -3 (a crop), so the conv is left as it is
    x, w = r(1, 1, 5, 1), r(1, 1, 3, 1)
    attrs = {"strides": (5, 1), "dilation": (5, 1), "padding": (7, 0, 0, 0)}
    assert live_taps(5, 3, 5, 5, 7, 1) == (2, 2)
    g = _conv_graph(x.shape, w, **attrs)
    h = prune_conv_taps(g)
    assert _convs(h)[0].inputs[1].shape == w.shape
    (got,) = ir.evaluate(h, {"x": x})
    np.testing.assert_allclose(got, np_conv(x, w, attrs["strides"], attrs["padding"],
                                            attrs["dilation"], 1), rtol=1e-5, atol=1e-5)


def test_exhaustive_small_geometries():
    """Every small 1-axis geometry: the rewritten graph equals the original one."""
    count = 0
    for n, k, s, d, p0, p1 in itertools.product(range(1, 6), range(1, 4), (1, 2, 3), (1, 2, 4, 7),
                                                 range(0, 8, 2), range(0, 8, 3)):
        if n + p0 + p1 < (k - 1) * d + 1:
            continue
        x, w = r(1, 2, n, 2), r(2, 2, k, 1)
        g = _conv_graph(x.shape, w, strides=(s, 1), dilation=(d, 1), padding=(p0, 0, p1, 0))
        h = prune_conv_taps(g)
        (a,), (b,) = ir.evaluate(g, {"x": x}), ir.evaluate(h, {"x": x})
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5,
                                   err_msg=f"n={n} k={k} s={s} d={d} pads=({p0}, {p1})")
        count += _taps_work(h) < _taps_work(g)
    assert count > 50  # the sweep does exercise the rewrite


def test_random_2d_geometries():
    """Random 2-D geometries with strides, groups and asymmetric padding: the rewritten graph
    equals the direct NumPy conv."""
    rng = np.random.default_rng(1)
    changed = 0
    for _ in range(300):
        h, w = rng.integers(1, 9, size=2)
        kh, kw = rng.integers(1, 4, size=2)
        s = tuple(int(v) for v in rng.integers(1, 3, size=2))
        d = tuple(int(v) for v in rng.choice([1, 2, 3, 5, 8], size=2))
        pad = tuple(int(v) for v in rng.integers(0, 9, size=4))
        groups = int(rng.choice([1, 2]))
        if h + pad[0] + pad[2] < (kh - 1) * d[0] + 1 or w + pad[1] + pad[3] < (kw - 1) * d[1] + 1:
            continue
        x, wt = r(1, 2, h, w), r(2, 2 // groups, kh, kw)
        g = _conv_graph(x.shape, wt, strides=s, dilation=d, padding=pad, groups=groups)
        hh = prune_conv_taps(g)
        (got,) = ir.evaluate(hh, {"x": x})
        np.testing.assert_allclose(got, np_conv(x, wt, s, pad, d, groups), rtol=1e-4, atol=1e-4,
                                   err_msg=f"{(h, w)} k={(kh, kw)} s={s} d={d} pad={pad} g={groups}")
        changed += _taps_work(hh) < _taps_work(g)
    assert changed > 30


def _dyn_conv_graph(lo, hi, w, **attrs):
    g = Graph()
    g.declare_dim("h", lo, hi)
    x = g.add_input("x", (1, w.shape[1] * attrs.get("groups", 1), "h", 6))
    g.outputs = [g.add("conv2d", x, g.add_constant(w), **attrs)]
    return g


@pytest.mark.parametrize("dil", [24, 36])
def test_symbolic_map_prunes_the_taps_dead_at_the_upper_bound(dil):
    """DeepLabV3's ASPP with a dynamic image size: a feature map of at most 16 rows leaves
    only the centre row tap at dilation 24 / 36, for every size; the output keeps its
    symbolic dims and the values match at every runtime size."""
    w = r(4, 8, 3, 3)
    g = _dyn_conv_graph(4, 16, w, dilation=(dil, 1), padding=(dil, 1, dil, 1))
    h = prune_conv_taps(g)
    (conv,) = _convs(h)
    assert conv.inputs[1].shape[2:] == (1, 3) and conv.attrs["padding"] == (0, 1, 0, 1)
    assert h.outputs[0].type.dims == g.outputs[0].type.dims
    for n in (4, 9, 16):
        x = r(1, 8, n, 6)
        (got,) = ir.evaluate(h, {"x": x})
        np.testing.assert_allclose(got, np_conv(x, w, (1, 1), (dil, 1, dil, 1), (dil, 1), 1), rtol=1e-4, atol=1e-4)


def test_symbolic_map_keeps_taps_live_at_some_size_and_never_splits_bands():
    """Dilation 12 over 4..16 rows: every tap reads data at 16 rows, so nothing is pruned,
    and the bands (which depend on the size) are not used for a symbolic map."""
    g = _dyn_conv_graph(4, 16, r(4, 8, 3, 3), dilation=(12, 1), padding=(12, 1, 12, 1))
    assert len(_convs(prune_conv_taps(g))) == 1 and _taps_work(prune_conv_taps(g)) == _taps_work(g)


def test_symbolic_random_geometries_match_at_every_size():
    """Random 1-axis geometries over a symbolic extent: whenever the rewrite applies, the
    pruned graph equals the direct conv at every runtime size in range (strides included,
    where the output-size formula must agree at every size, not only at the bound)."""
    rng = np.random.default_rng(3)
    changed = 0
    for _ in range(150):
        lo, hi = sorted(int(v) for v in rng.integers(1, 8, size=2))
        k, s, d = int(rng.integers(2, 4)), int(rng.integers(1, 4)), int(rng.choice([2, 4, 7, 9, 12]))
        p0, p1 = (int(v) for v in rng.integers(0, 16, size=2))
        if lo + p0 + p1 < (k - 1) * d + 1:
            continue
        w = r(2, 2, k, 1)
        attrs = dict(strides=(s, 1), dilation=(d, 1), padding=(p0, 0, p1, 0))
        g = _dyn_conv_graph(lo, hi, w, **attrs)
        hh = prune_conv_taps(g)
        assert hh.outputs[0].type.dims == g.outputs[0].type.dims
        for n in range(lo, hi + 1):
            x = r(1, 2, n, 6)
            (got,) = ir.evaluate(hh, {"x": x})
            np.testing.assert_allclose(got, np_conv(x, w, (s, 1), (p0, 0, p1, 0), (d, 1), 1), rtol=1e-4,
                                       atol=1e-4, err_msg=f"n={n} in {lo}..{hi} k={k} s={s} d={d} pads={(p0, p1)}")
        changed += _taps_work(hh) < _taps_work(g)
    assert changed > 10


@pytest.mark.parametrize("dil,stride,groups", [(36, 1, 1), (12, 1, 1), (12, 2, 2)])
def test_matches_onnxruntime(dil, stride, groups):
    """Compiled (llvm, through AlterConvLayout) against ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    x, w = r(1, 8, 14, 14), r(8, 8 // groups, 3, 3)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], dilations=[dil, dil], pads=[dil] * 4,
                            kernel_shape=[3, 3], strides=[stride, stride], group=groups)
    out = (14 - 1) // stride + 1
    graph = helper.make_graph([node], "aspp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, (1, 8, out, out))],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"X": x})
    mod, params = kiln.frontend.from_onnx(model, shape={"X": x.shape})
    lib = kiln.build(mod, target="llvm", params=params)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.run(X=x)
    np.testing.assert_allclose(gm.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)


def test_pass_is_in_the_default_pipeline():
    h = transform.default_pipeline(opt_level=3)(
        _conv_graph((1, 8, 14, 14), r(4, 8, 3, 3), dilation=(24, 24), padding=(24,) * 4))
    names = [p.name for p in transform.default_pipeline(opt_level=3).passes]
    assert names.index("PruneConvTaps") < names.index("AlterConvLayout")
    weights = [n.inputs[1].shape for n in h.nodes if n.op.startswith("conv2d")]
    assert all(s[2:4] == (1, 1) for s in weights), weights
