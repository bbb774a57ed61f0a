"""FusePatterns: RMSNorm and tanh-GELU elementwise chains become ``rms_norm`` / ``gelu``.

Hand-built IR graphs cover the spellings PyTorch and ONNX exporters produce; near-misses
(other constants, other axes, shared intermediates) must be left alone. The rewritten graph is
checked against the NumPy reference of the original (``kiln.ir.evaluate``), and one build per
test group checks the generated kernels. Torch modules (and, when installed, tiny
``transformers`` models) go through ``kiln.frontend.from_torch`` / ONNX export.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

import kiln
from kiln.driver import optimize
from kiln.ir import Graph, evaluate
from kiln.transform import default_pipeline, fuse_patterns
from tests.frontend.torch_support import transformers_or_skip as _transformers

C1 = math.sqrt(2.0 / math.pi)
C2 = 0.044715
SHAPE = (3, 5, 16)
RNG = np.random.default_rng(0)


def f32(v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


def build_and_run(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    factory = kiln.build(graph, target="llvm")
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    for k, v in feeds.items():
        m.set_input(k, v)
    m.run()
    return [m.get_output(i).numpy() for i in range(len(graph.outputs))]


# ----------------------------------------------------------------------------- RMSNorm spellings
def _ms_eps(g: Graph, x, square: str = "mul", eps: float = 1e-6, axes=(-1,), eps_left=False):
    sq = g.add("multiply", x, x) if square == "mul" else g.add("power", x, g.add_constant(f32(2.0)))
    ms = g.add("reduce_mean", sq, axes=axes, keepdims=True)
    e = g.add_constant(f32(eps))
    return g.add("add", e, ms) if eps_left else g.add("add", ms, e)


def rms_mul_rsqrt(g, x, w):
    return g.add("multiply", g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x))), w)


def rms_pow_reciprocal(g, x, w):  # weight first, rstd first: Llama's ``weight * hidden``
    rs = g.add("reciprocal", g.add("sqrt", _ms_eps(g, x, "pow", eps_left=True)))
    return g.add("multiply", w, g.add("multiply", rs, x))


def rms_div_sqrt(g, x, w):
    return g.add("multiply", g.add("divide", x, g.add("sqrt", _ms_eps(g, x, eps=1e-5))), w)


def rms_one_over_sqrt(g, x, w):
    rs = g.add("divide", g.add_constant(f32(1.0)), g.add("sqrt", _ms_eps(g, x)))
    return g.add("multiply", x, rs)  # no weight


def rms_two_axes(g, x, w2):
    return g.add("multiply", g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x, axes=(1, 2)))), w2)


def rms_fp16_casts(g, x16, w16):
    # HF Llama: hidden.to(float32) ... weight * hidden.to(input_dtype)
    x = g.add("cast", x16, dtype="float32")
    y = g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x)))
    return g.add("multiply", w16, g.add("cast", y, dtype="float16"))


RMS_VARIANTS = {
    "mul_rsqrt": (rms_mul_rsqrt, "float32", (16,)),
    "pow_reciprocal_sqrt": (rms_pow_reciprocal, "float32", (16,)),
    "div_sqrt": (rms_div_sqrt, "float32", (16,)),
    "one_over_sqrt_no_weight": (rms_one_over_sqrt, "float32", (16,)),
    "two_trailing_axes": (rms_two_axes, "float32", (5, 16)),
    "fp16_casts": (rms_fp16_casts, "float16", (16,)),
}


def _rms_graph(name: str) -> tuple[Graph, dict[str, np.ndarray]]:
    fn, dt, wshape = RMS_VARIANTS[name]
    g = Graph(name)
    x = g.add_input("x", SHAPE, dt)
    w = g.add_constant((RNG.random(wshape) + 0.5).astype(dt))
    g.outputs = [fn(g, x, w)]
    return g, {"x": RNG.standard_normal(SHAPE).astype(dt)}


@pytest.mark.parametrize("name", list(RMS_VARIANTS))
def test_rms_norm_spellings_fuse(name):
    g, feeds = _rms_graph(name)
    h = fuse_patterns(g)
    ops = h.op_counts()
    assert ops.get("rms_norm") == 1, ops
    assert not set(ops) & {"reduce_mean", "rsqrt", "sqrt", "reciprocal", "divide", "multiply",
                           "power", "cast"}, ops
    rtol = 1e-5 if feeds["x"].dtype == np.float32 else 2e-3
    np.testing.assert_allclose(evaluate(h, feeds)[0], evaluate(g, feeds)[0], rtol=rtol,
                               atol=rtol)


# ----------------------------------------------------------------------------- GELU spellings
def _c(g, v):
    return g.add_constant(f32(v))


def gelu_canonical(g, x):
    cube = g.add("multiply", g.add("multiply", x, x), x)
    inner = g.add("multiply", _c(g, C1), g.add("add", x, g.add("multiply", _c(g, C2), cube)))
    t = g.add("tanh", inner)
    return g.add("multiply", g.add("multiply", _c(g, 0.5), x), g.add("add", _c(g, 1.0), t))


def gelu_pow_reordered(g, x):  # HF NewGELU / GPT-2 gelu_new: torch.pow(x, 3.0), x * 0.5 first
    cube = g.add("power", x, _c(g, 3.0))
    inner = g.add("multiply", g.add("add", g.add("multiply", cube, _c(g, C2)), x), _c(g, C1))
    t = g.add("tanh", inner)
    return g.add("multiply", g.add("multiply", x, _c(g, 0.5)), g.add("add", t, _c(g, 1.0)))


def gelu_factored(g, x):  # Megatron: 0.79788456 * x * (1 + 0.044715 * x * x), halved by / 2
    xx = g.add("multiply", x, x)
    inner = g.add("multiply", g.add("multiply", _c(g, 0.79788456), x),
                  g.add("add", _c(g, 1.0), g.add("multiply", _c(g, C2), xx)))
    t = g.add("tanh", inner)
    return g.add("divide", g.add("multiply", x, g.add("add", t, _c(g, 1.0))), _c(g, 2.0))


def gelu_folded(g, x):  # constants already multiplied out: c1 * x + c1 * c2 * x^3
    cube = g.add("multiply", x, g.add("multiply", x, x))
    inner = g.add("add", g.add("multiply", x, _c(g, C1)), g.add("multiply", cube, _c(g, C1 * C2)))
    t = g.add("tanh", inner)
    return g.add("multiply", x, g.add("multiply", _c(g, 0.5), g.add("add", t, _c(g, 1.0))))


GELU_VARIANTS = {"canonical": gelu_canonical, "pow_reordered": gelu_pow_reordered,
                 "factored": gelu_factored, "folded": gelu_folded}


def _gelu_graph(name: str, fn=None) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(name)
    x = g.add_input("x", SHAPE, "float32")
    g.outputs = [(fn or GELU_VARIANTS[name])(g, x)]
    return g, {"x": (3.0 * RNG.standard_normal(SHAPE)).astype(np.float32)}


@pytest.mark.parametrize("name", list(GELU_VARIANTS))
def test_gelu_tanh_spellings_fuse(name):
    g, feeds = _gelu_graph(name)
    h = fuse_patterns(g)
    assert [(n.op, n.attrs.get("approximate")) for n in h.nodes] == [("gelu", "tanh")]
    np.testing.assert_allclose(evaluate(h, feeds)[0], evaluate(g, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_all_spellings_build_and_match_reference():
    """Every variant in one graph (one compilation): the kernels match the original's
    reference within 1e-5 and are the fused ones."""
    g = Graph("all")
    feeds = {}
    outs = []
    for i, (fn, dt, wshape) in enumerate(RMS_VARIANTS.values()):
        x = g.add_input(f"r{i}", SHAPE, dt)
        feeds[f"r{i}"] = RNG.standard_normal(SHAPE).astype(dt)
        outs.append(fn(g, x, g.add_constant((RNG.random(wshape) + 0.5).astype(dt))))
    for i, fn in enumerate(GELU_VARIANTS.values()):
        x = g.add_input(f"g{i}", SHAPE, "float32")
        feeds[f"g{i}"] = (3.0 * RNG.standard_normal(SHAPE)).astype(np.float32)
        outs.append(fn(g, x))
    g.outputs = outs
    opt = optimize(g)
    ops = opt.op_counts()
    assert ops.get("rms_norm") == len(RMS_VARIANTS) and ops.get("gelu") == len(GELU_VARIANTS)
    assert "tanh" not in ops and "reduce_mean" not in ops, ops
    got = build_and_run(g, feeds)
    want = evaluate(g, feeds)
    for gv, wv, name in zip(got, want, [*RMS_VARIANTS, *GELU_VARIANTS]):
        rtol = 1e-5 if wv.dtype == np.float32 else 2e-3
        np.testing.assert_allclose(gv, wv, rtol=rtol, atol=rtol, err_msg=name)


# ----------------------------------------------------------------------------- near-misses
def _near_rms_leading_axis(g, x):
    return g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x, axes=(0,))))


def _near_rms_middle_axis(g, x):
    return g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x, axes=(1,))))


def _near_rms_other_operand(g, x):
    y = g.add("negative", x)
    return g.add("multiply", y, g.add("rsqrt", _ms_eps(g, x)))


def _near_rms_cube(g, x):
    sq = g.add("power", x, _c(g, 3.0))
    ms = g.add("reduce_mean", sq, axes=(-1,), keepdims=True)
    return g.add("multiply", x, g.add("rsqrt", g.add("add", ms, _c(g, 1e-6))))


def _near_rms_row_eps(g, x):
    sq = g.add("multiply", x, x)
    ms = g.add("reduce_mean", sq, axes=(-1,), keepdims=True)
    eps = g.add_constant(np.full(SHAPE[:-1] + (1,), 1e-6, np.float32))
    return g.add("multiply", x, g.add("rsqrt", g.add("add", ms, eps)))


def _near_rms_negative_eps(g, x):
    return g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x, eps=-1e-6)))


def _near_rms_shared_stat(g, x):
    rs = g.add("rsqrt", _ms_eps(g, x))
    return g.add("add", g.add("multiply", x, rs), rs)  # the statistic is used again


def _near_rms_sum(g, x):
    ms = g.add("reduce_sum", g.add("multiply", x, x), axes=(-1,), keepdims=True)
    return g.add("multiply", x, g.add("rsqrt", g.add("add", ms, _c(g, 1e-6))))


def _gelu_with(c_half=0.5, c1=C1, c2=C2, one=1.0, other=None, sub=False):
    def fn(g, x):
        y = x if other is None else other(g, x)
        cube = g.add("multiply", g.add("multiply", y, y), y)
        inner = g.add("multiply", _c(g, c1), g.add("add", x, g.add("multiply", _c(g, c2), cube)))
        t = g.add("tanh", inner)
        s = g.add("subtract", _c(g, one), t) if sub else g.add("add", _c(g, one), t)
        return g.add("multiply", g.add("multiply", _c(g, c_half), x), s)
    return fn


def _near_gelu_shared_tanh(g, x):
    inner = g.add("multiply", _c(g, C1), g.add("add", x, g.add("multiply", _c(g, C2), g.add(
        "multiply", g.add("multiply", x, x), x))))
    t = g.add("tanh", inner)
    y = g.add("multiply", g.add("multiply", _c(g, 0.5), x), g.add("add", _c(g, 1.0), t))
    return g.add("add", y, t)


NEAR_MISSES = {
    "rms_leading_axis": _near_rms_leading_axis,
    "rms_middle_axis": _near_rms_middle_axis,
    "rms_other_operand": _near_rms_other_operand,
    "rms_cube": _near_rms_cube,
    "rms_row_eps": _near_rms_row_eps,
    "rms_negative_eps": _near_rms_negative_eps,
    "rms_shared_statistic": _near_rms_shared_stat,
    "rms_reduce_sum": _near_rms_sum,
    "gelu_c1_0.8": _gelu_with(c1=0.8),
    "gelu_c2_0.045": _gelu_with(c2=0.045),
    "gelu_c2_float16_rounded": _gelu_with(c2=float(np.float16(C2))),
    "gelu_half_0.6": _gelu_with(c_half=0.6),
    "gelu_one_minus_tanh": _gelu_with(sub=True),
    "gelu_plus_2": _gelu_with(one=2.0),
    "gelu_cube_of_other": _gelu_with(other=lambda g, x: g.add("negative", x)),
    "gelu_shared_tanh": _near_gelu_shared_tanh,
}


@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_near_misses_are_not_rewritten(name):
    g = Graph(name)
    x = g.add_input("x", SHAPE, "float32")
    g.outputs = [NEAR_MISSES[name](g, x)]
    h = fuse_patterns(g)
    assert h is g, h.op_counts()


@pytest.mark.parametrize("shape,fused", [(("n", 16), True), ((4, "n"), False)])
def test_symbolic_dims(shape, fused):
    """Symbolic leading dims fuse; a symbolic normalised dim does not (the kernel divides by a
    static element count)."""
    g = Graph("dyn")
    g.declare_dim("n", 1, 64)
    x = g.add_input("x", shape, "float32")
    g.outputs = [rms_mul_rsqrt(g, x, g.add_constant(np.float32(2.0)))]
    h = fuse_patterns(g)
    assert ("rms_norm" in h.op_counts()) == fused, h.op_counts()
    feeds = {"x": RNG.standard_normal((5, 16) if fused else (4, 7)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(h, feeds)[0], evaluate(g, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_intermediate_graph_output_is_kept():
    """A chain whose normalised value is also a graph output fuses only up to that value."""
    g = Graph("out")
    x = g.add_input("x", SHAPE, "float32")
    y = g.add("multiply", x, g.add("rsqrt", _ms_eps(g, x)))
    g.outputs = [g.add("multiply", y, g.add_constant(np.ones(16, np.float32) * 2)), y]
    h = fuse_patterns(g)
    assert h.op_counts().get("rms_norm") == 1 and h.op_counts().get("multiply") == 1
    feeds = {"x": RNG.standard_normal(SHAPE).astype(np.float32)}
    for a, b in zip(evaluate(h, feeds), evaluate(g, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_shared_square_of_two_gelus():
    """CSE shares ``x*x`` between two GELUs of the same x (ONNX exports of ``nn.GELU`` next to
    ``gelu_new``): a function of x alone may have other consumers, and both chains fuse."""
    g = Graph("two")
    x = g.add_input("x", SHAPE, "float32")
    xx = g.add("multiply", x, x)
    outs = []
    for k in range(2):
        cube = g.add("multiply", xx, x) if k else g.add("multiply", x, xx)
        inner = g.add("multiply", _c(g, C1), g.add("add", x, g.add("multiply", _c(g, C2), cube)))
        t = g.add("tanh", inner)
        outs.append(g.add("multiply", g.add("multiply", _c(g, 0.5), x),
                          g.add("add", _c(g, 1.0), t)))
    g.outputs = [g.add("add", outs[0], outs[1])]
    h = fuse_patterns(g)
    assert h.op_counts() == {"gelu": 2, "add": 1}, h.op_counts()
    feeds = {"x": RNG.standard_normal(SHAPE).astype(np.float32)}
    np.testing.assert_allclose(evaluate(h, feeds)[0], evaluate(g, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_disable_by_name(monkeypatch):
    g, _ = _gelu_graph("canonical")
    assert "gelu" in default_pipeline()(g).op_counts()
    assert "gelu" not in default_pipeline(disabled=("FusePatterns",))(g).op_counts()
    monkeypatch.setenv("KILN_DISABLE_PASSES", "FusePatterns")
    assert "tanh" in default_pipeline()(g).op_counts()


# ----------------------------------------------------------------------------- PyTorch
def _norm_and_gelu():
    """A Llama-style RMSNorm (HF ``LlamaRMSNorm`` written out), ``nn.GELU(approximate="tanh")``
    and GPT-2's ``gelu_new`` formula; the module (seeded weights) and an input."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class LlamaStyleRMSNorm(nn.Module):
        def __init__(self, n: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.rand(n) + 0.5)
            self.eps = eps

        def forward(self, x):
            dt = x.dtype
            h = x.to(torch.float32)
            var = h.pow(2).mean(-1, keepdim=True)
            h = h * torch.rsqrt(var + self.eps)
            return self.weight * h.to(dt)

    class NormAndGelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = LlamaStyleRMSNorm(16)
            self.gelu = nn.GELU(approximate="tanh")

        def forward(self, x):
            y = self.norm(x)
            z = 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                            * (y + 0.044715 * torch.pow(y, 3.0))))
            return self.gelu(y) + z * 3.0

    torch.manual_seed(0)
    return torch, NormAndGelu().eval(), torch.randn(2, 7, 16)


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / (np.abs(want).max() or 1.0))


def _check_torch_built(graph, params, x: np.ndarray, want: np.ndarray) -> None:
    opt = optimize(graph, params)
    ops = opt.op_counts()
    assert ops.get("rms_norm") == 1 and ops.get("gelu") == 2, ops
    assert not set(ops) & {"tanh", "reduce_mean", "rsqrt", "sqrt", "power"}, ops
    factory = kiln.build(graph, target="llvm", params=params)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input(graph.inputs[0].name, x)
    m.run()
    assert _rel_err(m.get_output(0).numpy(), want) <= 1e-4


def test_torch_module_fuses_and_matches_eager():
    torch, mod, x = _norm_and_gelu()
    graph, params = kiln.frontend.from_torch(mod, (x,))
    with torch.no_grad():
        want = mod(x).numpy()
    _check_torch_built(graph, params, x.numpy(), want)


def test_onnx_export_fuses_and_matches_eager():
    pytest.importorskip("onnx")
    torch, mod, x = _norm_and_gelu()
    buf = io.BytesIO()
    # opset 17: Gelu is not an ONNX op yet, so nn.GELU exports as its tanh formula too
    torch.onnx.export(mod, (x,), buf, dynamo=False, opset_version=17, input_names=["x"])
    graph, params = kiln.frontend.from_onnx(buf.getvalue())
    with torch.no_grad():
        want = mod(x).numpy()
    _check_torch_built(graph, params, x.numpy(), want)


# ----------------------------------------------------------------------------- transformers
def _tiny(name: str):
    tf = _transformers()
    if name == "llama":
        return tf.LlamaModel(tf.LlamaConfig(
            vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            use_cache=False))
    return tf.GPT2Model(tf.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=32, use_cache=False, bos_token_id=0,
                                      eos_token_id=0, activation_function="gelu_new"))


@pytest.mark.parametrize("name,op,count", [("llama", "rms_norm", 5), ("gpt2", "gelu", 2)])
def test_tiny_transformers_fuse_and_match_eager(name, op, count):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = _tiny(name).eval()
    ids = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(1))
    graph, params = kiln.frontend.from_torch(model, (ids,))
    ops = optimize(graph, params).op_counts()
    assert ops.get(op) == count and "tanh" not in ops and "reduce_mean" not in ops, ops
    factory = kiln.build(graph, target="llvm", params=params)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input(graph.inputs[0].name, ids.numpy())
    m.run()
    with torch.no_grad():
        want = model(ids)[0].numpy()
    assert _rel_err(m.get_output(0).numpy(), want) <= 1e-4
