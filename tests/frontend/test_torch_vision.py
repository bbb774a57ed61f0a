"""torchvision classification and segmentation models through the PyTorch frontend vs torch eager.

Random weights (``weights=None``, ``torch.manual_seed``), small inputs, and non-trivial batch
norm statistics (fresh models have mean 0 / var 1, which would hide a wrong epsilon or axis).
Each model is exported and converted once per session (conversion, i.e. ``torch.export`` plus
the core-ATen decomposition, is most of the time) and checked with the IR's NumPy reference
interpreter; a few are also compiled with ``kiln.build`` and compared with the same models
imported through ONNX. The default tier keeps one model per op family (plain residual, SE +
hardswish, channel shuffle, fire modules with ceil-mode pooling, grouped conv, layer norm,
bilinear segmentation head) so the file stays around a minute on two cores; the heavier and
the op-wise redundant models, and the compiled variants of most, are ``heavy`` (about 6 minutes
on two cores; not in the default run: ``python -m pytest -m heavy tests/frontend``).
Bound: max |kiln - torch| / max |torch| <= 1e-4.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kiln  # noqa: E402
from kiln.ir import evaluate  # noqa: E402
from tests.models.real_models import torchvision_models  # noqa: E402
from tests.frontend.torch_support import randomize_bn as _randomize_bn  # noqa: E402

RTOL = 1e-4


def _torchvision_models() -> Any:
    return torchvision_models()


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got.astype(np.float64) - want).max()) / (float(np.abs(want).max()) or 1.0)


def _grouped_block(models: Any) -> Any:
    """A ResNeXt bottleneck (32 groups x 4 channels) with a projection shortcut."""
    from torchvision.models.resnet import Bottleneck

    down = torch.nn.Sequential(torch.nn.Conv2d(64, 256, 1, stride=2, bias=False),
                               torch.nn.BatchNorm2d(256))
    return Bottleneck(64, 64, stride=2, downsample=down, groups=32, base_width=4)


def _seg(name: str) -> Callable[[Any], Any]:
    def make(models: Any) -> Any:
        return getattr(models.segmentation, name)(weights=None, weights_backbone=None)
    return make


def _cls(name: str) -> Callable[[Any], Any]:
    def make(models: Any) -> Any:
        return getattr(models, name)(weights=None)
    return make


#: name -> (constructor, input shape, slow)
MODELS: dict[str, tuple[Callable[[Any], Any], tuple[int, ...], bool]] = {
    "resnet18": (_cls("resnet18"), (1, 3, 64, 64), False),
    "mobilenet_v2": (_cls("mobilenet_v2"), (1, 3, 64, 64), True),
    "mobilenet_v3_small": (_cls("mobilenet_v3_small"), (1, 3, 64, 64), False),
    "efficientnet_b0": (_cls("efficientnet_b0"), (1, 3, 64, 64), True),
    "shufflenet_v2_x0_5": (_cls("shufflenet_v2_x0_5"), (1, 3, 64, 64), False),
    "squeezenet1_0": (_cls("squeezenet1_0"), (1, 3, 64, 64), False),
    "regnet_y_400mf": (_cls("regnet_y_400mf"), (1, 3, 64, 64), True),
    "resnext_block": (_grouped_block, (1, 64, 16, 16), False),
    "convnext_tiny": (_cls("convnext_tiny"), (1, 3, 64, 64), False),
    "lraspp_mobilenet_v3_large": (_seg("lraspp_mobilenet_v3_large"), (1, 3, 64, 64), False),
    "deeplabv3_mobilenet_v3_large": (_seg("deeplabv3_mobilenet_v3_large"), (1, 3, 64, 64), True),
    "densenet121": (_cls("densenet121"), (1, 3, 64, 64), True),
    "resnext50_32x4d": (_cls("resnext50_32x4d"), (1, 3, 64, 64), True),
    "fcn_resnet50": (_seg("fcn_resnet50"), (1, 3, 64, 64), True),
    "swin_t": (_cls("swin_t"), (1, 3, 64, 64), True),  # shifted-window masks: slice_scatter
}


class Converted:
    """One model: torch eager output and the Kiln graph + params."""

    def __init__(self, name: str) -> None:
        make, shape, _ = MODELS[name]
        models = _torchvision_models()
        torch.manual_seed(0)
        self.module = make(models).eval()
        _randomize_bn(self.module)
        self.x = torch.randn(*shape)
        with torch.no_grad():
            out = self.module(self.x)
        self.want = (out["out"] if isinstance(out, dict) else out).numpy()
        self.graph, self.params = kiln.frontend.from_torch(self.module, (self.x,))
        self.input_name = self.graph.input_names[0]

    def build_and_run(self, graph: Any = None, params: Any = None) -> np.ndarray:
        graph, params = (graph, params) if graph is not None else (self.graph, self.params)
        factory = kiln.build(graph, target="llvm", params=params)
        m = kiln.GraphModule(factory["default"](kiln.cpu()))
        m.set_input(graph.input_names[0], self.x.numpy())
        m.run()
        return m.get_output(0).numpy()


_CACHE: dict[str, Converted] = {}


def converted(name: str) -> Converted:
    if name not in _CACHE:
        _CACHE[name] = Converted(name)
    return _CACHE[name]


def _params() -> list[Any]:
    return [pytest.param(name, marks=[pytest.mark.heavy] if slow else [], id=name)
            for name, (_, _, slow) in MODELS.items()]


@pytest.mark.parametrize("name", _params())
def test_model_matches_eager(name):
    c = converted(name)
    got = evaluate(c.graph, {c.input_name: c.x.numpy()}, c.params)
    assert len(got) == len(c.graph.outputs) >= 1
    err = rel_err(got[0], c.want)
    assert err <= RTOL, f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("name", [
    "mobilenet_v3_small",
    pytest.param("resnext_block", marks=pytest.mark.heavy),
    pytest.param("lraspp_mobilenet_v3_large", marks=pytest.mark.heavy),
    pytest.param("convnext_tiny", marks=pytest.mark.heavy),
    pytest.param("shufflenet_v2_x0_5", marks=pytest.mark.heavy),
    pytest.param("efficientnet_b0", marks=pytest.mark.heavy),
    pytest.param("densenet121", marks=pytest.mark.heavy),
])
def test_model_built_matches_eager(name):
    c = converted(name)
    err = rel_err(c.build_and_run(), c.want)
    assert err <= RTOL, f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("name", [
    "mobilenet_v3_small",
    pytest.param("resnet18", marks=pytest.mark.heavy),
    pytest.param("lraspp_mobilenet_v3_large", marks=pytest.mark.heavy),
])
def test_torch_and_onnx_imports_agree(name):
    """The same model through ``torch.export`` and through ``torch.onnx.export``: both built,
    same outputs (the ONNX graph differs: the exporter folds batch norm into the convs)."""
    pytest.importorskip("onnx")
    c = converted(name)
    buf = io.BytesIO()
    torch.onnx.export(c.module, (c.x,), buf, dynamo=False, input_names=["x"],
                      output_names=["y"])
    g_onnx, p_onnx = kiln.frontend.from_onnx(buf.getvalue())
    from_onnx = c.build_and_run(g_onnx, p_onnx)
    from_torch = c.build_and_run()
    assert rel_err(from_torch, from_onnx) <= RTOL
    assert rel_err(from_torch, c.want) <= RTOL


if __name__ == "__main__":  # the table in docs/frontend_torch.md: python -m tests.frontend.test_torch_vision
    for _name in MODELS:
        _c = Converted(_name)
        _ref = rel_err(evaluate(_c.graph, {_c.input_name: _c.x.numpy()}, _c.params)[0], _c.want)
        _built = rel_err(_c.build_and_run(), _c.want)
        print(f"| {_name} | {'x'.join(map(str, _c.x.shape))} | {_ref:.1e} | {_built:.1e} |", flush=True)
        _CACHE.clear()
