"""3-D convolution and pooling through the PyTorch frontend vs torch eager, up to torchvision's
video ResNets (r3d_18, mc3_18, r2plus1d_18; random weights, no downloads).

The 3-D ops lower to 2-D IR ops through :mod:`kiln.frontend.volumetric` (shared with the ONNX
frontend). Small modules are checked with the IR's NumPy reference interpreter, a few also
compiled with ``kiln.build``; the models at 1x3x8x32x32 with the interpreter (r3d_18 compiled
too; mc3_18 and r2plus1d_18, about 5 s each, are ``heavy``: ``pytest -m heavy``).
Bound: max |kiln - torch| / max |torch| <= 1e-4.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
from kiln.frontend.volumetric import conv3d, conv_transpose3d, pool3d  # noqa: E402
from kiln.ir import evaluate  # noqa: E402
from kiln.runtime.errors import InputError, UnsupportedOpError  # noqa: E402
from tests.models.real_models import torchvision_models  # noqa: E402
from tests.frontend.torch_support import randomize_bn as _randomize_bn  # noqa: E402

RTOL = 1e-4
F = torch.nn.functional


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got.astype(np.float64) - want).max()) / (float(np.abs(want).max()) or 1.0)


class Fn(torch.nn.Module):
    """A module calling ``fn(x, *params)``."""

    def __init__(self, fn: Callable[..., Any], *params: Any) -> None:
        super().__init__()
        self.fn = fn
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(p, requires_grad=False)
                                          for p in params])

    def forward(self, x: Any) -> Any:
        return self.fn(x, *self.ps)


def convert(module: Any, x: Any) -> tuple[Any, dict, np.ndarray]:
    module = module.eval()
    with torch.no_grad():
        want = module(x)
    graph, params = kiln.frontend.from_torch(module, (x,))
    return graph, params, want.numpy()


def check(module: Any, x: Any, compiled: bool = False) -> Any:
    graph, params, want = convert(module, x)
    got = evaluate(graph, {graph.input_names[0]: x.numpy()}, params)[0]
    err = rel_err(got, want)
    assert err <= RTOL, f"reference interpreter: relative error {err:.3g}"
    if compiled:
        factory = kiln.build(graph, target="llvm", params=params)
        m = kiln.GraphModule(factory["default"](kiln.cpu()))
        m.set_input(graph.input_names[0], x.numpy())
        m.run()
        err = rel_err(m.get_output(0).numpy(), want)
        assert err <= RTOL, f"compiled: relative error {err:.3g}"
    return graph


def _ops(graph: Any) -> list[str]:
    return [n.op for n in graph.nodes]


# ------------------------------------------------------------------ convolution
@pytest.mark.parametrize("cin, cout, k, kw", [
    (3, 4, 3, {}),
    (3, 4, (3, 1, 1), {"padding": (1, 0, 0)}),                       # r2plus1d temporal
    (3, 5, (1, 3, 3), {"stride": (1, 2, 2), "padding": (0, 1, 1)}),  # r2plus1d spatial
    (4, 6, 3, {"stride": 2, "padding": 1, "bias": False}),
    (4, 4, (2, 3, 3), {"stride": (2, 1, 2), "padding": (1, 2, 0), "dilation": (2, 1, 2)}),
    (4, 6, 3, {"groups": 2, "padding": 1}),
    (4, 4, 3, {"groups": 4, "padding": (0, 1, 1), "stride": (1, 2, 1)}),  # depthwise
    (3, 4, 3, {"padding": "same", "dilation": 2}),
])
def test_conv3d(cin, cout, k, kw):
    torch.manual_seed(0)
    m = torch.nn.Conv3d(cin, cout, k, **kw)
    graph = check(m, torch.randn(2, cin, 7, 9, 8))
    assert "conv2d" in _ops(graph)


def test_conv3d_compiled():
    torch.manual_seed(1)
    m = torch.nn.Conv3d(4, 6, (3, 3, 3), stride=(1, 2, 2), padding=1, groups=2)
    check(m, torch.randn(1, 4, 6, 10, 10), compiled=True)


def test_conv3d_unbatched():
    torch.manual_seed(2)
    check(torch.nn.Conv3d(2, 3, 2, padding=1), torch.randn(2, 5, 6, 6))


@pytest.mark.parametrize("cin, cout, k, kw", [
    (3, 4, 3, {}),
    (4, 2, (2, 3, 3), {"stride": (2, 2, 1), "padding": (1, 0, 1), "output_padding": (1, 1, 0)}),
    (4, 6, 3, {"stride": 2, "groups": 2, "dilation": (2, 1, 1), "bias": False}),
])
def test_conv_transpose3d(cin, cout, k, kw):
    torch.manual_seed(3)
    check(torch.nn.ConvTranspose3d(cin, cout, k, **kw), torch.randn(1, cin, 4, 5, 6))


# ------------------------------------------------------------------ pooling
@pytest.mark.parametrize("kw", [
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": (1, 3, 3), "stride": (1, 2, 2), "padding": (0, 1, 1)},
    {"kernel_size": 2},
    {"kernel_size": (3, 2, 2), "stride": (2, 1, 3), "dilation": (2, 2, 1), "padding": (1, 1, 0)},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
])
def test_max_pool3d(kw):
    torch.manual_seed(4)
    graph = check(torch.nn.MaxPool3d(**kw), torch.randn(2, 3, 7, 9, 8))
    assert "max_pool2d" in _ops(graph)


@pytest.mark.parametrize("kw", [
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
    {"kernel_size": (2, 3, 2), "stride": (1, 2, 2)},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
    {"kernel_size": 2, "divisor_override": 3},
    {"kernel_size": 3, "stride": 2, "padding": 1, "divisor_override": 5},
])
def test_avg_pool3d(kw):
    torch.manual_seed(5)
    check(torch.nn.AvgPool3d(**kw), torch.randn(2, 3, 7, 9, 8))


def test_avg_pool2d_divisor_override():
    # the divisor_override handling is shared by the 1-D / 2-D / 3-D average pools
    torch.manual_seed(5)
    check(torch.nn.AvgPool2d(3, stride=2, padding=1, divisor_override=4), torch.randn(1, 3, 9, 8))


def test_pools_compiled_and_unbatched():
    torch.manual_seed(6)
    check(torch.nn.Sequential(torch.nn.MaxPool3d(3, 2, 1), torch.nn.AvgPool3d(2, ceil_mode=True)),
          torch.randn(1, 3, 8, 10, 9), compiled=True)
    check(torch.nn.MaxPool3d((1, 3, 3), (1, 2, 2)), torch.randn(3, 4, 7, 7))


@pytest.mark.parametrize("size", [1, (2, 3, 3), (3, 4, 5), (8, 1, 3), (None, 2, 2)])
def test_adaptive_avg_pool3d(size):
    torch.manual_seed(7)
    check(torch.nn.AdaptiveAvgPool3d(size), torch.randn(2, 3, 8, 9, 6))


def test_adaptive_avg_pool3d_unbatched():
    torch.manual_seed(8)
    check(torch.nn.AdaptiveAvgPool3d((2, 3, 4)), torch.randn(3, 5, 7, 9))


def test_batch_norm3d():
    torch.manual_seed(9)
    bn = torch.nn.BatchNorm3d(4)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    check(torch.nn.Sequential(torch.nn.Conv3d(3, 4, 3, padding=1, bias=False), bn,
                              torch.nn.ReLU()), torch.randn(1, 3, 4, 6, 6), compiled=True)


# ------------------------------------------------------------------ errors
def test_max_pool3d_indices_used_is_unsupported():
    m = Fn(lambda x: F.max_pool3d(x, 2, return_indices=True)[1].float())
    with pytest.raises(UnsupportedOpError, match="max_pool3d_with_indices"):
        kiln.frontend.from_torch(m, (torch.randn(1, 2, 4, 4, 4),))


def test_max_pool3d_indices_unused_is_fine():
    m = Fn(lambda x: F.max_pool3d(x, 2, return_indices=True)[0])
    check(m, torch.randn(1, 2, 4, 6, 4))


def test_avg_pool3d_divisor_override_partial_window_is_unsupported():
    m = torch.nn.AvgPool3d(2, ceil_mode=True, divisor_override=3)
    with pytest.raises(UnsupportedOpError, match="divisor_override"):
        kiln.frontend.from_torch(m, (torch.randn(1, 2, 5, 5, 5),))


def _ctx_with(*shapes: tuple[int, ...]) -> tuple[Any, list[Any]]:
    from kiln.frontend.torch.converter import Context

    ctx = Context("t")
    return ctx, [ctx.graph.add_input(f"v{i}", s, "float32") for i, s in enumerate(shapes)]


def test_shared_conv3d_weight_mismatch_is_input_error():
    # torch rejects such a call before export; the shared helper checks for the ONNX frontend.
    ctx, (x, w) = _ctx_with((1, 5, 4, 4, 4), (4, 3, 3, 3, 3))
    with pytest.raises(InputError, match=r"does not match input .* group=2"):
        conv3d(ctx, x, w, (1, 1, 1), (1, 1, 1), (0,) * 6, 2)
    ctx, (x, w) = _ctx_with((1, 3, 2, 4, 4), (4, 3, 3, 3, 3))
    with pytest.raises(InputError, match="output depth would be empty"):
        conv3d(ctx, x, w, (1, 1, 1), (1, 1, 1), (0,) * 6, 1)


def test_shared_conv_transpose3d_and_pool3d_errors():
    ctx, (x, w) = _ctx_with((1, 4, 3, 4, 4), (3, 2, 3, 3, 3))
    with pytest.raises(InputError, match="expected \\(4, C_out / group"):
        conv_transpose3d(ctx, x, w, (1, 1, 1), (1, 1, 1), (0,) * 6, (0, 0, 0), 1)
    ctx, (x,) = _ctx_with((1, 4, 4, 4))
    with pytest.raises(InputError, match="needs 5-D"):
        pool3d(ctx, "max", x, (2, 2, 2), (2, 2, 2), (1, 1, 1), (0,) * 6, False)
    with pytest.raises(ValueError, match="'max' or 'avg'"):
        pool3d(ctx, "min", x, (2, 2, 2), (2, 2, 2), (1, 1, 1), (0,) * 6, False)


# ------------------------------------------------------------------ video models
_VIDEO: dict[str, Any] = {}


def _video(name: str) -> tuple[Any, dict, Any, np.ndarray]:
    if name not in _VIDEO:
        models = torchvision_models()
        torch.manual_seed(0)
        m = getattr(models.video, name)(weights=None).eval()
        _randomize_bn(m)
        x = torch.randn(1, 3, 8, 32, 32)
        graph, params, want = convert(m, x)
        _VIDEO[name] = (graph, params, x, want)
    return _VIDEO[name]


@pytest.mark.parametrize("name", [
    "r3d_18",
    # op-wise covered by r3d_18 and the (3, 1, 1) / (1, 3, 3) cases of test_conv3d
    pytest.param("mc3_18", marks=pytest.mark.heavy),
    pytest.param("r2plus1d_18", marks=pytest.mark.heavy),
])
def test_video_model_matches_eager(name):
    graph, params, x, want = _video(name)
    got = evaluate(graph, {graph.input_names[0]: x.numpy()}, params)[0]
    err = rel_err(got, want)
    assert err <= RTOL, f"{name}: relative error {err:.3g}"


def test_r3d_18_compiled():
    graph, params, x, want = _video("r3d_18")
    factory = kiln.build(graph, target="llvm", params=params)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    m.set_input(graph.input_names[0], x.numpy())
    m.run()
    err = rel_err(m.get_output(0).numpy(), want)
    assert err <= RTOL, f"r3d_18 compiled: relative error {err:.3g}"
