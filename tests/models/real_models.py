"""Real model architectures with random weights, exported to ONNX for tests (no downloads).

``resnet18()`` is torchvision's ResNet-18 (``weights=None``), ``minilm()`` a BERT encoder with
all-MiniLM-L6-v2's dimensions (6 layers, hidden 384, 12 heads, intermediate 1536, vocabulary
30522) built from a ``transformers`` config. Weights come from fixed seeds; exports are cached
per process. Each returns ``(path to the .onnx, feeds)``; the test skips when torch,
torchvision or transformers is missing.
"""

from __future__ import annotations

import functools
import os
import tempfile
import warnings

import numpy as np
import pytest


@functools.cache
def _dir() -> str:
    return tempfile.mkdtemp(prefix="kiln_real_models_")


def torchvision_models():
    """``torchvision.models``, also with a CPU torch wheel that lacks torchvision's C++ ops.

    Importing torchvision registers fake kernels for its compiled ops (``torchvision::nms``);
    when those ops are missing the import fails ("operator torchvision::nms does not exist"),
    although the model definitions never use them. Then the registering module is replaced by
    an empty one and the import retried. Skips the test when torchvision is not installed.
    """
    import sys
    import types

    pytest.importorskip("torch")
    try:
        import torchvision.models as tv_models
    except (ImportError, RuntimeError, AttributeError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        try:
            import torchvision.models as tv_models
        except ImportError:
            pytest.skip("torchvision is not installed")
    return tv_models


def _import_torchvision_if_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        torchvision_models()


@functools.cache
def resnet18() -> tuple[str, dict[str, np.ndarray]]:
    torch = pytest.importorskip("torch")
    tv_models = torchvision_models()
    torch.manual_seed(0)
    model = tv_models.resnet18(weights=None).eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32")
    path = os.path.join(_dir(), "resnet18.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(x),), path, input_names=["data"], output_names=["logits"],
                          opset_version=17, dynamo=False)
    return path, {"data": x}


@functools.cache
def resnet18_dynamic() -> str:
    """torchvision's ResNet-18 exported with a dynamic batch (``dim_param`` ``batch``)."""
    torch = pytest.importorskip("torch")
    tv_models = torchvision_models()
    torch.manual_seed(0)
    model = tv_models.resnet18(weights=None).eval()
    path = os.path.join(_dir(), "resnet18_dynamic.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 3, 224, 224),), path, input_names=["data"], output_names=["logits"],
                          opset_version=17, dynamo=False, dynamic_axes={"data": {0: "batch"}, "logits": {0: "batch"}})
    return path


@functools.cache
def _minilm_module():
    """The random-weight MiniLM-sized BERT encoder (``input_ids, attention_mask -> hidden``)."""
    torch = pytest.importorskip("torch")
    _import_torchvision_if_installed()  # transformers imports it: make that import work first
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536, max_position_embeddings=512)
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):  # keyword arguments and a plain tensor out, for the exporter
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Encoder().eval()


def minilm_feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids and an attention mask whose rows end in padding of different lengths."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30522, (batch, seq)).astype("int64")
    mask = np.ones((batch, seq), dtype="int64")
    for b in range(batch):
        mask[b, max(1, seq * 3 // 4 - b):] = 0  # padding at the end, as a batch of unequal sentences has
    return {"input_ids": ids, "attention_mask": mask}


def _export_minilm(path: str, feeds: dict[str, np.ndarray], dynamic_axes: dict | None = None) -> None:
    module = _minilm_module()  # skips the test without torch / transformers
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.from_numpy(v) for v in feeds.values()), path,
                          input_names=list(feeds), output_names=["last_hidden_state"], opset_version=17,
                          dynamo=False, dynamic_axes=dynamic_axes)


@functools.cache
def minilm(seq: int = 128) -> tuple[str, dict[str, np.ndarray]]:
    feeds = minilm_feeds(1, seq)
    path = os.path.join(_dir(), f"minilm_{seq}.onnx")
    _export_minilm(path, feeds)
    return path, feeds


@functools.cache
def minilm_dynamic() -> str:
    """The same encoder exported with dynamic ``batch`` and ``seq`` (``dim_param`` s)."""
    path = os.path.join(_dir(), "minilm_dynamic.onnx")
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"}}
    _export_minilm(path, minilm_feeds(2, 16), axes)
    return path
