"""The PyTorch (``torch.export``) frontend: API, params, errors, op coverage, layer isolation.

Numerics are checked against torch eager. Compilation dominates test time, so the op tests put
many ops into one module and build it once (as ``tests/topi/harness.py`` batches kernels);
structure-only tests use the IR's NumPy reference interpreter (``kiln.ir.evaluate``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import kiln  # noqa: E402
from kiln.ir import evaluate  # noqa: E402
from kiln.runtime.errors import InputError, KilnError, UnsupportedOpError  # noqa: E402


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (the measure the model tests bound by 1e-4)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = float(np.abs(want).max()) or 1.0
    return float(np.abs(got.astype(np.float64) - want).max()) / scale


def run_built(graph, params, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Build with plain ``llvm`` (compiles faster than -mcpu=native) and run once."""
    factory = kiln.build(graph, target="llvm", params=params)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    for k, v in inputs.items():
        m.set_input(k, v)
    m.run()
    return [m.get_output(i).numpy() for i in range(len(graph.outputs))]


def eager(module, *xs):
    with torch.no_grad():
        out = module(*xs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in outs]


# ------------------------------------------------------------------ API
class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, image):
        y = F.relu(self.bn(self.conv(image)))
        return self.fc(y.mean(dim=(2, 3)))


def _small_net():
    torch.manual_seed(0)
    m = SmallNet().eval()
    with torch.no_grad():  # non-trivial running statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def test_from_torch_names_params_and_matches_eager():
    m = _small_net()
    x = torch.randn(2, 3, 10, 10)
    graph, params = kiln.frontend.from_torch(m, (x,))
    assert graph.input_names[0] == "image"  # the forward() parameter name
    assert set(params) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean",
                           "bn.running_var", "fc.weight", "fc.bias"}
    np.testing.assert_array_equal(params["fc.weight"], m.fc.weight.detach().numpy())
    assert graph.input_names[1:] == list(params)  # placeholders follow the runtime input
    # linear is kept whole (not decomposed to permute + addmm) and becomes one dense
    assert graph.op_counts().get("dense") == 1 and "transpose" not in graph.op_counts()
    (got,) = run_built(graph, params, {"image": x.numpy()})
    assert rel_err(got, eager(m, x)[0]) <= 1e-5


def test_from_exported_program_and_saved_archive(tmp_path):
    m = _small_net()
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    g1, p1 = kiln.frontend.from_exported_program(ep)
    path = tmp_path / "net.pt2"
    torch.export.save(ep, str(path))
    g2, p2 = kiln.frontend.from_exported_program(torch.export.load(str(path)))
    assert kiln.ir.structural_equal(g1, g2)
    assert sorted(p1) == sorted(p2)
    want = eager(m, x)[0]
    got = evaluate(g2, {"image": x.numpy()}, p2)[0]
    assert rel_err(got, want) <= 1e-5


def test_rejects_non_program_and_bad_example_inputs():
    with pytest.raises(InputError, match="ExportedProgram"):
        kiln.frontend.from_exported_program(nn.Linear(2, 2))
    with pytest.raises(InputError, match="tuple of tensors"):
        kiln.frontend.from_torch(nn.Linear(2, 2), torch.randn(1, 2))


def test_tied_weights_stay_one_param():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 6, bias=False)
            self.b = nn.Linear(6, 6, bias=False)
            self.b.weight = self.a.weight  # tied

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    torch.manual_seed(1)
    m = Tied().eval()
    x = torch.randn(3, 6)
    graph, params = kiln.frontend.from_torch(m, (x,))
    assert len(params) == 1 and next(iter(params)) in ("a.weight", "b.weight")
    weight_inputs = [v for v in graph.inputs if v.name in params]
    assert len(weight_inputs) == 1
    dense = [n for n in graph.nodes if n.op == "dense"]
    assert len(dense) == 2 and all(n.inputs[1] is weight_inputs[0] for n in dense)
    got = evaluate(graph, {"x": x.numpy()}, params)[0]
    assert rel_err(got, eager(m, x)[0]) <= 1e-5


def test_buffers_and_lifted_constants():
    class Consts(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.linspace(0.5, 2.0, 4), persistent=False)
            self.register_buffer("steps", torch.tensor([3], dtype=torch.int64))

        def forward(self, x):
            offset = torch.tensor([1.0, -1.0, 2.0, 0.5])  # a lifted tensor constant
            return x * self.scale + offset + self.steps

    m = Consts().eval()
    x = torch.randn(2, 4)
    graph, params = kiln.frontend.from_torch(m, (x,))
    assert set(params) == {"scale"}  # float buffer (non-persistent) -> param by FQN
    got = evaluate(graph, {"x": x.numpy()}, params)[0]
    assert rel_err(got, eager(m, x)[0]) <= 1e-6


def test_multiple_inputs_and_outputs():
    class Two(nn.Module):
        def forward(self, left, right):
            s = left + right
            return s * 2, torch.cat([left, right], dim=1).amax(dim=1)

    m = Two()
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    graph, params = kiln.frontend.from_torch(m, (a, b))
    assert graph.input_names == ["left", "right"] and not params
    got = evaluate(graph, {"left": a.numpy(), "right": b.numpy()}, params)
    for g, w in zip(got, eager(m, a, b)):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_inplace_slice_writes_functionalized():
    """In-place writes into slices become slice_scatter / select_scatter / copy after the
    decomposition (swin's attention mask is built this way)."""

    class Writes(nn.Module):
        def forward(self, x, z):
            y = x.clone()
            y[:, 1:3] = z
            y[:, 0] = 0.5
            y[..., ::2] = y[..., ::2] * 2
            mask = torch.zeros(4, 6)
            mask[1:, 2:4] = 1.0  # constant: folded at import
            return y + mask

    x, z = torch.randn(2, 4, 6), torch.randn(2, 2, 6)
    graph, params = kiln.frontend.from_torch(Writes(), (x, z))
    got = evaluate(graph, {"x": x.numpy(), "z": z.numpy()}, params)[0]
    np.testing.assert_allclose(got, eager(Writes(), x, z)[0], rtol=1e-6)


def test_type_promotion_follows_torch():
    class Mixed(nn.Module):
        def forward(self, x, n):  # x float32, n int64
            ratio = n / 4  # int / int -> float32
            floor = torch.div(n, 3, rounding_mode="floor")  # stays int64
            close = (n < x).to(torch.float32) + (n == 2)  # int vs float compare; bool + float
            return x * ratio + close, floor, (x * 10).to(torch.int32)

    x = torch.randn(2, 5)
    n = torch.tensor([[-7, -3, 0, 2, 5], [1, 2, 3, 4, 9]])
    graph, params = kiln.frontend.from_torch(Mixed(), (x, n))
    got = evaluate(graph, {"x": x.numpy(), "n": n.numpy()}, params)
    for g, w in zip(got, eager(Mixed(), x, n)):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


# ------------------------------------------------------------------ errors
class Unsupported(nn.Module):
    def forward(self, x):
        return torch.lgamma(x) + torch.digamma(x) + torch.lgamma(x * 2)


class _GptStyle(nn.Module):
    """GPT-2's Conv1D (an (in, out) weight through addmm), tanh-GELU's x**3, masks as bool tensors."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 12) * 0.3)   # (in, out)
        self.b = nn.Parameter(torch.randn(12) * 0.1)

    def forward(self, x, keep):
        h = torch.addmm(self.b, x, self.w)
        h = 0.5 * h * (1 + torch.tanh(0.79788456 * (h + 0.044715 * torch.pow(h, 3))))
        mask = ~(keep > 0) & (x.sum(-1, keepdim=True) < 100) | (keep > 5)
        return h.masked_fill(mask, 0.0).clamp_min(-0.05).clamp_max(2.0)


def test_conv1d_weight_gelu_power_and_bool_masks():
    torch.manual_seed(1)
    model = _GptStyle().eval()
    x, keep = torch.randn(4, 8), torch.randint(-3, 8, (4, 1)).float()
    graph, params = kiln.frontend.from_torch(model, (x, keep))
    ops = graph.op_counts()
    # the (in, out) weight becomes one dense (its transpose folds at build), x**3 two multiplies
    assert ops.get("dense") == 1 and "matmul" not in ops and "power" not in ops, ops
    assert "logical_not" in ops and "bitwise_not" not in ops, ops
    got = run_built(graph, params, {"x": x.numpy(), "keep": keep.numpy()})[0]
    assert rel_err(got, eager(model, x, keep)[0]) <= 1e-5


def test_unsupported_ops_listed_together_before_converting():
    x = torch.rand(4) + 0.5
    with pytest.raises(UnsupportedOpError) as info:
        kiln.frontend.from_torch(Unsupported(), (x,))
    msg = str(info.value)
    assert "2 ATen op(s)" in msg
    assert "aten.lgamma.default" in msg and "aten.digamma.default" in msg
    assert "lgamma_1" in msg  # the FX nodes calling it are named


def test_unsupported_variant_names_fx_node():
    # a supported op (avg_pool2d) in a variant Kiln does not convert
    m = nn.AvgPool2d(2, ceil_mode=True, divisor_override=3).eval()
    with pytest.raises(UnsupportedOpError, match=r"FX node 'avg_pool2d.*divisor_override"):
        kiln.frontend.from_torch(m, (torch.randn(1, 2, 5, 5),))


def test_unbounded_dynamic_dim_asks_for_a_maximum():
    # dynamic shapes are supported (tests/frontend/test_torch_dynamic.py); a Dim without max is not
    m = nn.Linear(4, 2)
    x = torch.randn(3, 4)
    batch = torch.export.Dim("batch")
    with pytest.raises(InputError, match="max"):
        kiln.frontend.from_torch(m, (x,), dynamic_shapes={"input": {0: batch}})


def test_duplicate_registration_rejected():
    from kiln.frontend.torch import aten_op, supported_ops

    assert "aten.convolution.default" in supported_ops()
    with pytest.raises(KilnError, match="already has a converter"):
        aten_op("aten.convolution.default")(lambda ctx, node, args: None)
    with pytest.raises(KilnError, match="aten.<op>.<overload>"):
        aten_op("conv2d")(lambda ctx, node, args: None)
    assert "aten.convolution.default" in supported_ops()


def test_import_kiln_does_not_import_torch():
    code = textwrap.dedent("""
        import sys
        import kiln, kiln.frontend, kiln.frontend.torch
        kiln.frontend.from_torch  # the names resolve without torch
        from kiln.frontend.torch import ops_core, ops_vision
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ op coverage
class ManyOps(nn.Module):
    """Elementwise, activation, shape and reduction ops in one module (one build)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, y):  # x: (2, 4, 8), y: (2, 4, 8)
        outs = [
            F.hardswish(x), F.hardsigmoid(x), F.silu(x), F.gelu(x), F.gelu(x, approximate="tanh"),
            F.relu6(x * 4), F.hardtanh(x, -0.5, 0.5), torch.clamp(x, min=-0.2),
            F.leaky_relu(x, 0.1), F.elu(x), F.softplus(x, beta=2.0), torch.sigmoid(x),
            torch.tanh(x), torch.exp(x.clamp(max=3)), torch.log1p(x.abs()), torch.rsqrt(y.abs() + 1),
            x.pow(2), x.abs().pow(1.5), torch.maximum(x, y), torch.minimum(x, y), 2.5 - x,
            torch.div(x, y.abs() + 1, rounding_mode="floor"), x / 3, torch.floor(x * 3),
            (x > y).float(), (x <= 0.1).to(torch.float32),
            torch.erf(x), torch.remainder(x * 5, 3.0),
        ]
        z = torch.stack(outs, dim=1)  # (2, N, 4, 8)
        z = z.permute(0, 2, 1, 3).reshape(2, 4, -1)[..., 1::3]
        a, b = torch.chunk(self.lin(x), 2, dim=-1)
        c = torch.cat([a.transpose(1, 2), b.transpose(1, 2)], dim=1)  # (2, 8, 4)
        s = torch.split(c, [3, 5], dim=1)[1].flatten(1)  # (2, 20)
        sel = x[:, 2, :].unsqueeze(1).expand(2, 3, 8).contiguous()
        m = torch.bmm(sel, y.transpose(1, 2))  # (2, 3, 4)
        red = torch.cat([x.sum(dim=-1), x.mean(dim=1, keepdim=True).squeeze(1)[:, :4],
                         x.amax(dim=(1, 2)).unsqueeze(-1), x.var(dim=-1)], dim=-1)
        return z, s, m, red, torch.matmul(x, y.transpose(-1, -2)) @ torch.ones(4)


class VisionOps(nn.Module):
    """Convolution variants, pooling, resize and pad in one module (one build)."""

    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.depthwise = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.up_grouped = nn.ConvTranspose2d(8, 8, 2, stride=2, groups=2)
        self.conv1d = nn.Conv1d(8, 4, 3, padding=1)
        self.bn1d = nn.BatchNorm1d(4)

    def forward(self, x):  # (1, 8, 12, 12)
        g = self.grouped(x)
        d = self.depthwise(x)  # (1, 8, 6, 6)
        outs = [
            self.up(d), self.up_grouped(d)[:, :4],
            F.interpolate(d, scale_factor=2, mode="nearest")[:, :4],
            F.interpolate(d, size=(12, 12), mode="bilinear", align_corners=False)[:, :4],
            F.interpolate(d, size=(12, 12), mode="bilinear", align_corners=True)[:, 4:],
            F.interpolate(g, size=(12, 12), mode="nearest-exact")[:, :4],
        ]
        up = torch.cat(outs, dim=1)  # (1, 24, 12, 12)
        pools = torch.cat([
            F.max_pool2d(g, 3, stride=2, padding=1), F.avg_pool2d(g, 3, 2, 1),
            F.avg_pool2d(g, 3, 2, 1, ceil_mode=True, count_include_pad=False)[..., :6, :6],
            F.adaptive_avg_pool2d(g, (6, 6)), F.adaptive_max_pool2d(g, 6),
        ], dim=1)  # (1, 40, 6, 6)
        adaptive = F.adaptive_avg_pool2d(g, (5, 7))  # overlapping bins
        padded = torch.cat([F.pad(d, (1, 2, 0, 1)), F.pad(d, (1, 2, 0, 1), mode="reflect"),
                            F.pad(d, (1, 2, 0, 1), mode="replicate")], dim=1)
        seq = self.bn1d(self.conv1d(x.flatten(2)))  # (1, 4, 144)
        seq = F.max_pool1d(seq, 2) + F.avg_pool1d(seq, 2)
        return up, pools, adaptive, padded, seq


def _randomize_bn(m: nn.Module) -> None:
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)


@pytest.mark.parametrize("make, shapes", [
    (ManyOps, [(2, 4, 8), (2, 4, 8)]),
    (VisionOps, [(1, 8, 12, 12)]),
], ids=["core", "vision"])
def test_ops_match_eager_when_built(make, shapes):
    torch.manual_seed(2)
    m = make().eval()
    _randomize_bn(m)
    xs = [torch.randn(*s) for s in shapes]
    graph, params = kiln.frontend.from_torch(m, tuple(xs))
    got = run_built(graph, params, dict(zip(graph.input_names, (x.numpy() for x in xs))))
    want = eager(m, *xs)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel_err(g, w) <= 1e-5, f"output {i}"


# ------------------------------------------------------------------ CLI
def test_cli_inspect_and_build_pt2(tmp_path, capsys):
    import json

    from kiln.cli import main

    m = _small_net()
    x = torch.randn(1, 3, 8, 8)
    path = str(tmp_path / "net.pt2")
    torch.export.save(torch.export.export(m, (x,)), path)

    assert main(["inspect", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "pt2"
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": [1, 3, 8, 8]}]
    assert info["unsupported_ops"] == [] and info["conversion"]["errors"] == []
    assert info["op_counts"]["aten.linear.default"] == 1  # kept whole, not decomposed

    # the shapes come from the program: --input-shape is refused, not ignored
    assert main(["inspect", path, "--input-shape", "image:1,3,16,16"]) == 1
    assert "--input-shape does not apply" in capsys.readouterr().err
    assert main(["build", path, "-o", str(tmp_path / "x.so"), "-q", "--input-shape",
                 "image:1,3,16,16"]) == 1
    assert "--input-shape does not apply" in capsys.readouterr().err

    out = str(tmp_path / "net.so")
    assert main(["build", path, "-o", out, "-q", "--target", "llvm"]) == 0
    capsys.readouterr()
    lib = kiln.runtime.load_module(out)
    gm = kiln.GraphModule(lib["default"](kiln.cpu()))
    gm.set_input("image", x.numpy())
    gm.run()
    assert rel_err(gm.get_output(0).numpy(), eager(m, x)[0]) <= 1e-5


def test_cli_inspect_lists_unsupported_pt2(tmp_path, capsys):
    from kiln.cli import main

    path = str(tmp_path / "bad.pt2")
    torch.export.save(torch.export.export(Unsupported(), (torch.rand(4) + 0.5,)), path)
    assert main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert "UNSUPPORTED ops: aten.digamma.default, aten.lgamma.default" in text
