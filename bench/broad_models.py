"""The broad benchmark set: model families nobody tuned Kiln for, from torchvision and transformers.

``bench/models.py`` holds the four models the kernels were tuned on; this file adds the families
the CPU-performance work is judged on: MobileNetV3, EfficientNet-B0, ShuffleNetV2, ResNeXt-50,
RegNetY-400MF, ConvNeXt-T, DeepLabV3 (MobileNetV3 backbone), ViT-B/16, a seq-first
``nn.TransformerEncoder`` and a GPT-2-style decoder. Weights are random (seeded; speed and
agreement do not depend on trained values), inputs batch 1. Models whose two ONNX exporters
produce different graphs are also exported with the dynamo exporter as ``<name>.dynamo``.

torchvision's model definitions need none of its compiled ops; the PyPI wheel's compiled ops may
fail to load next to the CPU torch wheel, so :func:`torchvision_models` imports it without the
module that registers them — a work-around kept here, not in Kiln.

Usage: ``python bench/run_models.py --models broad`` (see ``run_models.py``), or
``python bench/broad_models.py OUT_DIR`` to export them all.
"""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

def torchvision_models() -> Any:
    """``torchvision.models``, importable even where its compiled ops do not load (see above).

    Importing torchvision registers fake kernels for its compiled ops; when those are missing
    the import fails although no model uses them, so the registering module is replaced by an
    empty one and the import retried (the same work-around as ``tests/models/real_models.py``).
    """
    try:
        import torchvision.models as tv
    except (ImportError, RuntimeError, AttributeError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision.models as tv
    return tv


class _FirstOutput(nn.Module):
    """A segmentation model's ``{"out": ...}`` / a transformer's output object, as one tensor."""

    def __init__(self, inner: nn.Module, pick: Callable[[Any], torch.Tensor]) -> None:
        super().__init__()
        self.inner = inner
        self.pick = pick

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.pick(self.inner(*args))


def _lively(model: nn.Module) -> nn.Module:
    """Fresh-model statistics made non-trivial, so outputs are O(1) and the correctness check means
    something: random BatchNorm statistics (as ``models.py`` does) and a random classifier where
    torchvision initialises it to zero (ViT's head). Fresh BN statistics let MobileNetV3 /
    EfficientNet activations decay towards subnormal values (outputs ~1e-16), which would also
    time subnormal arithmetic instead of the model."""
    from models import _randomize_bn  # bench/models.py

    _randomize_bn(model, 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                m.weight.normal_(0.0, 0.02)
    return model.eval()


def _tv(name: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return _lively(getattr(torchvision_models(), name)(weights=None, **kw))

    return build


def _deeplab() -> nn.Module:
    torch.manual_seed(0)
    seg = torchvision_models().segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                          aux_loss=False)
    return _FirstOutput(_lively(seg), lambda out: out["out"]).eval()


def _transformer_encoder() -> nn.Module:
    # seq-first (batch_first=False): the layout nn.MultiheadAttention uses inside in any case
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, dim_feedforward=1024, dropout=0.0)
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).eval()


def _gpt2() -> nn.Module:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        torchvision_models()  # transformers imports torchvision: make that import work first
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=256, vocab_size=50257)
    model = transformers.GPT2Model(cfg).eval()
    return _FirstOutput(model, lambda out: out.last_hidden_state).eval()


def broad_specs() -> dict[str, dict]:
    """name -> {build, inputs, dynamo}: ``dynamo`` says the dynamo exporter's graph is benchmarked too."""
    rng = np.random.default_rng(0)
    img = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    seq = rng.standard_normal((64, 1, 256)).astype(np.float32)
    tokens = rng.integers(0, 50257, size=(1, 128)).astype(np.int64)
    vision = {
        "mobilenetv3": _tv("mobilenet_v3_large"),
        "efficientnet_b0": _tv("efficientnet_b0"),
        "shufflenetv2": _tv("shufflenet_v2_x1_0"),
        "resnext50": _tv("resnext50_32x4d"),
        "regnety_400mf": _tv("regnet_y_400mf"),
        "convnext_t": _tv("convnext_tiny"),
        "vit_b16": _tv("vit_b_16"),
    }
    specs: dict[str, dict] = {k: {"build": b, "inputs": {"data": img}, "dynamo": k in ("convnext_t", "vit_b16")}
                              for k, b in vision.items()}
    specs["deeplabv3"] = {"build": _deeplab, "inputs": {"data": img}, "dynamo": False}
    specs["transformer_encoder"] = {"build": _transformer_encoder, "inputs": {"src": seq}, "dynamo": True}
    specs["gpt2_6l"] = {"build": _gpt2, "inputs": {"input_ids": tokens}, "dynamo": False}
    return specs


def names() -> list[str]:
    """Every broad model, and ``<name>.dynamo`` for those exported both ways."""
    out = []
    for k, spec in broad_specs().items():
        out.append(k)
        if spec["dynamo"]:
            out.append(f"{k}.dynamo")
    return out


def export(name: str, out_dir: str | Path, force: bool = False) -> Path:
    """Export ``name`` (``<model>`` or ``<model>.dynamo``) to ``out_dir/<name>.onnx`` (cached)."""
    base, _, exporter = name.partition(".")
    out = Path(out_dir) / f"{name}.onnx"
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = broad_specs()[base]
    model = spec["build"]()
    args = tuple(torch.from_numpy(v) for v in spec["inputs"].values())
    # not under no_grad: there nn.TransformerEncoder takes its fused fast path
    # (aten::_native_multi_head_attention), which the TorchScript exporter cannot export
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(out), input_names=list(spec["inputs"]), output_names=["output"],
                          opset_version=18 if exporter == "dynamo" else 17, dynamo=exporter == "dynamo",
                          **({"external_data": False} if exporter == "dynamo" else {}))
    return out


def inputs(name: str) -> dict[str, np.ndarray]:
    """The fixed inputs of ``name``."""
    return broad_specs()[name.partition(".")[0]]["inputs"]


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "bench/out"
    for n in names():
        print(n, export(n, out_dir, force="--force" in sys.argv), flush=True)
