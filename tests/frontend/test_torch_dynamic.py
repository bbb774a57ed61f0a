"""The PyTorch frontend with dynamic shapes (``torch.export.Dim``).

Each model is exported once with symbolic dims, built once for ``llvm``, saved, loaded and run
at several shapes inside the declared ranges, against torch eager. Models are tiny and seeded
(random weights, nothing downloaded) so the whole file stays fast.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
Dim = torch.export.Dim

import kiln  # noqa: E402
from kiln.frontend.torch import from_exported_program, from_torch  # noqa: E402
from kiln.runtime.errors import InputError, UnsupportedOpError  # noqa: E402


def _load(graph, params, tmp_path) -> kiln.GraphModule:
    """Build once, export, load: the module every shape runs on."""
    lib = kiln.build(graph, target="llvm", params=params)
    path = os.path.join(str(tmp_path), "model.so")
    lib.export_library(path)
    return kiln.GraphModule(kiln.runtime.load_module(path)["default"](kiln.cpu()))


def _check(mod: kiln.GraphModule, model, inputs: dict[str, torch.Tensor]) -> None:
    mod.run(**{k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = model(*inputs.values())
    if hasattr(want, "to_tuple"):
        want = want.to_tuple()
    want = want if isinstance(want, (tuple, list)) else (want,)
    for i, w in enumerate(want):
        got = mod.get_output(i).numpy()
        assert got.shape == tuple(w.shape)
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ models
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x):
        b = x.size(0)
        y = self.net(x)
        # size arithmetic on the batch: reshape to 2*b, a factory and a divide by the batch
        return y.reshape(b * 2, 4), y.new_ones(b + 1, 2), x.sum(0) / b


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def _transformers():
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a torchvision built for another torch: mark it absent
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules["torchvision"] = None  # type: ignore[assignment]
    return pytest.importorskip("transformers")


class Bert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        tf = _transformers()
        cfg = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64,
                            max_position_embeddings=64)
        self.bert = tf.BertModel(cfg, add_pooling_layer=False)

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _batchnorm_stats(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)


# ------------------------------------------------------------------ tests
def test_mlp_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    batch = Dim("batch", min=1, max=16)
    graph, params = from_torch(model, (torch.randn(4, 16),), dynamic_shapes={"x": {0: batch}})
    assert graph.dim_ranges == {"batch": (1, 16)}
    assert graph.inputs[0].type.dims == ("batch", 16)
    assert graph.outputs[0].type.dims == ("2*batch", 4)
    mod = _load(graph, params, tmp_path)
    for b in (1, 5, 16):
        _check(mod, model, {"x": torch.randn(b, 16)})


def test_cnn_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    model = CNN().eval()
    _batchnorm_stats(model)
    batch = Dim("n", max=8)
    graph, params = from_torch(model, (torch.randn(2, 3, 16, 16),),
                               dynamic_shapes={"x": {0: batch}})
    assert graph.dim_ranges == {"n": (1, 8)}  # torch's min 0 is raised to 1
    assert graph.outputs[0].type.dims == ("n", 10)
    mod = _load(graph, params, tmp_path)
    for b in (1, 3, 8):
        _check(mod, model, {"x": torch.randn(b, 3, 16, 16)})


def test_bert_dynamic_batch_and_seq(tmp_path):
    torch.manual_seed(0)
    model = Bert().eval()
    batch, seq = Dim("batch", max=4), Dim("seq", max=32)
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    ep = torch.export.export(model, (ids, mask), dynamic_shapes={
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    graph, params = from_exported_program(ep)
    assert graph.dim_ranges == {"batch": (1, 4), "seq": (1, 32)}
    assert graph.outputs[0].type.dims == ("batch", "seq", 32)
    mod = _load(graph, params, tmp_path)
    gen = torch.Generator().manual_seed(2)
    for b, s in ((1, 1), (2, 7), (3, 20), (4, 32)):
        ids = torch.randint(0, 100, (b, s), generator=gen)
        mask = torch.ones(b, s, dtype=torch.int64)
        mask[0, s // 2 + 1:] = 0  # padding in the first row
        _check(mod, model, {"input_ids": ids, "attention_mask": mask})
    # out of range at run time: an InputError naming the dim, nothing computed
    with pytest.raises(InputError, match="seq"):
        mod.run(input_ids=np.zeros((1, 33), np.int64), attention_mask=np.ones((1, 33), np.int64))


def test_unbounded_dim_needs_max():
    model = MLP().eval()
    x = torch.randn(4, 16)
    with pytest.raises(InputError, match=r"no upper bound.*max="):
        from_torch(model, (x,), dynamic_shapes={"x": {0: Dim("batch")}})
    # dim_ranges gives the bound instead
    graph, _ = from_torch(model, (x,), dynamic_shapes={"x": {0: Dim("batch")}},
                          dim_ranges={"batch": (1, 32)})
    assert graph.dim_ranges == {"batch": (1, 32)}
    with pytest.raises(InputError, match="does not have"):
        from_torch(model, (x,), dynamic_shapes={"x": {0: Dim("batch", max=8)}},
                   dim_ranges={"other": (1, 4)})
    with pytest.raises(InputError, match="outside"):
        from_torch(model, (x,), dynamic_shapes={"x": {0: Dim("batch", max=8)}},
                   dim_ranges={"batch": (1, 64)})


def test_out_of_range_input(tmp_path):
    torch.manual_seed(0)
    model = MLP().eval()
    graph, params = from_torch(model, (torch.randn(4, 16),),
                               dynamic_shapes={"x": {0: Dim("batch", min=2, max=8)}})
    mod = _load(graph, params, tmp_path)
    _check(mod, model, {"x": torch.randn(2, 16)})
    for bad in (1, 9):
        with pytest.raises(InputError, match="batch"):
            mod.run(x=np.zeros((bad, 16), np.float32))


def test_loaded_program_uses_symbol_names(tmp_path):
    """A program saved and loaded has lost the Dim names: torch's symbol names are used."""
    model = MLP().eval()
    ep = torch.export.export(model, (torch.randn(4, 16),),
                             dynamic_shapes={"x": {0: Dim("batch", max=8)}})
    path = os.path.join(str(tmp_path), "mlp.pt2")
    torch.export.save(ep, path)
    graph, _ = from_exported_program(torch.export.load(path))
    (name,) = graph.dim_ranges
    assert graph.dim_ranges[name] == (1, 8)
    assert graph.inputs[0].type.dims == (name, 16)


def test_unsupported_symbolic_op_names_node():
    class Tail(nn.Module):
        def forward(self, x):
            return x[:, 1:]  # a slice of the symbolic dim that does not start at 0

    with pytest.raises(UnsupportedOpError, match="FX node 'slice"):
        from_torch(Tail(), (torch.randn(2, 6),), dynamic_shapes={"x": {1: Dim("seq", min=3, max=16)}})
