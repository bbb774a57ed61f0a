"""The PyTorch frontend on transformers: whole models and the transformer ATen ops.

Models (BERT, GPT-2, ViT, T5 encoder, a Llama-style decoder, ``nn.TransformerEncoder``) are
built from ``transformers`` configs with small sizes and random, seeded weights (nothing is
downloaded), exported with ``kiln.frontend.from_torch`` and must match torch eager within a
relative error (max |kiln - torch| / max |torch|) of 1e-4. The op tests put many ops into one
module and build it once: compilation dominates test time.
"""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import kiln  # noqa: E402
from kiln.runtime.errors import UnsupportedOpError  # noqa: E402
from tests.frontend.torch_support import transformers_or_skip as _transformers

TOL = 1e-4
HIDDEN, LAYERS, HEADS, SEQ, VOCAB, FFN = 64, 2, 4, 16, 100, 128


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|."""
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = float(np.abs(want).max()) or 1.0
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) / scale


def build_and_run(graph, params, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Build with plain ``llvm`` (compiles faster than -mcpu=native), run once."""
    factory = kiln.build(graph, target="llvm", params=params)
    m = kiln.GraphModule(factory["default"](kiln.cpu()))
    for v, arr in zip(graph.inputs, inputs):
        m.set_input(v.name, arr)
    m.run()
    return [m.get_output(i).numpy() for i in range(len(graph.outputs))]


def eager(module, *xs) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*xs)
    if hasattr(out, "to_tuple"):  # a transformers ModelOutput: its tensors in order
        out = out.to_tuple()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in outs]


# ------------------------------------------------------------------ models
def _bert():
    tf = _transformers()
    cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, intermediate_size=FFN,
                        max_position_embeddings=64)
    return tf.BertModel(cfg)


def _gpt2():
    tf = _transformers()
    cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                        n_positions=64, use_cache=False, bos_token_id=0, eos_token_id=0)
    return tf.GPT2Model(cfg)


def _vit():
    tf = _transformers()
    cfg = tf.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       intermediate_size=FFN, image_size=32, patch_size=8)
    return tf.ViTModel(cfg)


def _t5():
    tf = _transformers()
    cfg = tf.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN,
                      num_layers=LAYERS, num_heads=HEADS)
    return tf.T5EncoderModel(cfg)


def _llama():
    tf = _transformers()
    # 2 key/value heads for 4 query heads: grouped-query attention, rotary embeddings, RMSNorm
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=HEADS // 2, max_position_embeddings=64,
                         use_cache=False)
    return tf.LlamaModel(cfg)


def _encoder(batch_first: bool):
    layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, FFN, dropout=0.1, batch_first=batch_first)
    # enable_nested_tensor=False: padding-free nested tensors are a training-time fast path
    return nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)


def _ids(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, SEQ), generator=gen)


MODELS = {
    "bert": (_bert, _ids),
    "gpt2": (_gpt2, _ids),
    "vit": (_vit, lambda g: torch.randn(1, 3, 32, 32, generator=g)),
    "t5_encoder": (_t5, _ids),
    "llama": (_llama, _ids),
    "encoder_seq_first": (lambda: _encoder(False), lambda g: torch.randn(SEQ, 2, HIDDEN, generator=g)),
    "encoder_batch_first": (lambda: _encoder(True), lambda g: torch.randn(2, SEQ, HIDDEN, generator=g)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_eager(name):
    make, make_input = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    x = make_input(torch.Generator().manual_seed(1))
    graph, params = kiln.frontend.from_torch(model, (x,))
    ops = {n.op for n in graph.nodes}
    # the fused ops are kept whole: attention is matmul + softmax, never exp / sum / divide
    assert "softmax" in ops and not ops & {"exp", "reduce_sum", "divide"}, sorted(ops)
    got = build_and_run(graph, params, [x.numpy()])
    want = eager(model, x)
    assert rel_err(got[0], want[0]) <= TOL


class WithPadding(nn.Module):
    """A model called with ``attention_mask``: the mask is a runtime input."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)[0]


def test_padding_mask_is_a_runtime_input():
    torch.manual_seed(0)
    model = WithPadding(_gpt2()).eval()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, SEQ - 5:] = 0  # the second sequence is padded
    graph, params = kiln.frontend.from_torch(model, (ids, mask))
    ops = [n.op for n in graph.nodes]
    # one mask conversion shared by both layers
    assert ops.count("where") == 1 and ops.count("softmax") == LAYERS, ops
    got = build_and_run(graph, params, [ids.numpy(), mask.numpy()])
    assert rel_err(got[0], eager(model, ids, mask)[0]) <= TOL


# ------------------------------------------------------------------ ops
class TransformerOps(nn.Module):
    """The transformer ATen ops on runtime inputs, with variants (masks, scale, GQA)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.ln = nn.LayerNorm(8)
        self.ln_plain = nn.LayerNorm(8, elementwise_affine=False)
        self.rms_w = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x, q, k, ids, mask):
        # x (2, 5, 8) float, q (2, 4, 6, 8), k (2, 2, 7, 8), ids (2, 5) int64, mask (6, 7) bool
        outs = [
            torch.softmax(x, dim=1),
            torch.log_softmax(x, dim=-1),
            self.ln(x),
            self.ln_plain(x),
            *torch.native_layer_norm(x, (5, 8), None, None, 1e-3)[1:],  # statistics: mean, rstd
            F.rms_norm(x, (8,), self.rms_w, 1e-6),
            torch.ops.aten._fused_rms_norm(x, [8], self.rms_w, 1e-6)[0],
            F.rms_norm(x, (5, 8)),  # default epsilon, no weight
            self.emb(ids),
        ]
        kv = torch.repeat_interleave(k, 2, dim=1)
        outs += [
            F.scaled_dot_product_attention(q, kv, kv),
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True, scale=0.3),
            # a runtime boolean mask with a row that may attend to nothing (torch: zeros)
            F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask),
            F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask.float() * -2.0),
            F.scaled_dot_product_attention(q, k, k, enable_gqa=True),
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kv, kv)[0],
            torch.ops.aten._scaled_dot_product_attention_math(q, kv, kv, is_causal=True)[0],
        ]
        dead = torch.arange(5)[None, :, None] == 2  # row 2 of every batch: all -inf
        outs.append(torch.ops.aten._safe_softmax(x.masked_fill(dead, float("-inf")), -1))
        t = x[0, :, :5]
        outs += [
            torch.triu(t, 1), torch.tril(t, -1),
            torch.where(x > 0, x, 0.5), torch.where(x > 0, -1.0, x),
            x.masked_fill(x < -0.5, -7.0),
            torch.full_like(x, 3.0) + x, torch.zeros_like(x) + torch.ones_like(x) * x,
            x + torch.arange(8, dtype=torch.float32),
            x[:, torch.tensor([4, 0, -1])],  # a constant index on dim 1
            x[ids[:, :3] % 2, 1],  # runtime indices on adjacent dims 0 and 1
            x[ids[0, :4] % 2, :, ids[1, :4] % 8 - 8],  # on dims 0 and 2 (result dim first), negative
            torch.index_select(x, 2, ids[0] % 8),
            torch.gather(x, 2, ids[:, :, None].expand(2, 5, 3) % 8),
            torch.cumsum(x, dim=1), torch.cumsum(ids, dim=1),
            torch.baddbmm(x[:, :, :5], x, x.transpose(1, 2), beta=0.5, alpha=2.0),
            mask.any(dim=-1), mask.all(dim=0, keepdim=True), mask.any(), mask.all(),
            torch.any(mask, dim=(0, 1)),
            (x > 0) & (x < 0.5), (x > 0.5) | (x < -0.5),
            torch.where(x > 0, x, x * 2), torch.where(mask, 1.0, 0.0),
            x.masked_fill(x < 0, x.mean()),
            torch.full((2, 5, 8), 2.5) * x, x + torch.arange(2, 10), x.new_ones(8) + x,
        ]
        return tuple(outs)


def test_transformer_ops_match_eager():
    torch.manual_seed(0)
    m = TransformerOps().eval()
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(6, 7, generator=g) > 0.4
    mask[3] = False  # a query row that may attend to nothing
    xs = (torch.randn(2, 5, 8, generator=g), torch.randn(2, 4, 6, 8, generator=g),
          torch.randn(2, 2, 7, 8, generator=g), torch.randint(0, 20, (2, 5), generator=g), mask)
    graph, params = kiln.frontend.from_torch(m, xs)
    got = build_and_run(graph, params, [x.numpy() for x in xs])
    want = eager(m, *xs)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        if b.dtype == bool or b.dtype.kind in "iu":
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}")
        else:
            assert rel_err(a, b) <= TOL, f"output {i}: relative error {rel_err(a, b):.3g}"


class StaticMasks(nn.Module):
    """Masks built from sizes only, as transformers builds them: all folded at import."""

    def forward(self, q):
        n = q.shape[-2]
        pos = torch.arange(n)
        causal = pos[None, :] <= pos[:, None]
        pad = torch.ones(n, n, dtype=torch.bool).triu(3).logical_not()
        bias = torch.zeros(n, n).masked_fill((causal & pad).logical_not(), float("-inf"))
        return F.scaled_dot_product_attention(q, q, q, attn_mask=bias)


def test_static_masks_fold_to_one_constant_bias():
    q = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(3))
    graph, params = kiln.frontend.from_torch(StaticMasks().eval(), (q,))
    ops = sorted(n.op for n in graph.nodes if n.op != "constant")
    # q * scale, q @ k^T, + bias, softmax, @ v: no comparison, where or arange at run time
    assert ops == ["add", "matmul", "matmul", "multiply", "softmax", "transpose"]
    got = build_and_run(graph, params, [q.numpy()])
    assert rel_err(got[0], eager(StaticMasks(), q)[0]) <= TOL


class AttentionDropout(nn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


def test_attention_dropout_is_refused_naming_the_node():
    q = torch.randn(1, 2, 4, 4)
    with pytest.raises(UnsupportedOpError, match=r"FX node .*scaled_dot_product_attention.*dropout_p"):
        kiln.frontend.from_torch(AttentionDropout(), (q,))
