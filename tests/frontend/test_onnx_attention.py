"""Attention-family ops (Attention, RMSNormalization, RotaryEmbedding, ...) vs ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.runtime.errors import InputError, UnsupportedOpError
from tests.frontend.onnx_check import check_node, make_model, rand, run_kiln

# ----------------------------------------------------------------------------- Attention
B, SQ, SKV, D = 2, 3, 5, 4
#: The IR reference softmax of a fully-masked row computes -inf - -inf (NaN) before the `where`
#: that zeroes the row: expected, not a failure.
MASKED_ROW_NAN = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 2)])
@pytest.mark.parametrize("attrs", [{}, {"scale": 0.3}, {"is_causal": 1}, {"softcap": 2.0}],
                         ids=["plain", "scaled", "causal", "softcap"])
def test_attention_4d(hq, hkv, attrs):
    check_node("Attention", {"q": rand(B, hq, SQ, D, seed=1), "k": rand(B, hkv, SKV, D, seed=2),
                             "v": rand(B, hkv, SKV, D + 2, seed=3)}, attrs, opset=23)


@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}], ids=["plain", "causal"])
def test_attention_3d(attrs):
    check_node("Attention", {"q": rand(B, SQ, 4 * D, seed=1), "k": rand(B, SKV, 2 * D, seed=2),
                             "v": rand(B, SKV, 2 * 3, seed=3)},
               {"q_num_heads": 4, "kv_num_heads": 2, **attrs}, opset=23)


@pytest.mark.parametrize("mask", [rand(SQ, SKV, seed=4, lo=-2, hi=0), rand(B, 1, SQ, SKV, dtype="bool", seed=5),
                                  rand(2, SQ, SKV, seed=6, lo=-1, hi=1)],
                         ids=["float2d", "bool4d", "float3d"])
@pytest.mark.parametrize("causal", [0, 1])
@MASKED_ROW_NAN
def test_attention_mask(mask, causal):
    check_node("Attention", {"q": rand(B, 2, SQ, D, seed=1), "k": rand(B, 2, SKV, D, seed=2),
                             "v": rand(B, 2, SKV, D, seed=3), "mask": mask}, {"is_causal": causal},
               opset=23)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_past_and_qk_output(mode):
    """present_key/value and every qk_matmul_output_mode, with a past cache and a causal mask."""
    check_node("Attention", {"q": rand(B, 4, SQ, D, seed=1), "k": rand(B, 2, SQ, D, seed=2),
                             "v": rand(B, 2, SQ, D, seed=3), "mask": rand(SQ, SQ + 2, seed=4, lo=-1, hi=0),
                             "past_key": rand(B, 2, 2, D, seed=5), "past_value": rand(B, 2, 2, D, seed=6)},
               # ONNX Runtime leaves the causal mask out of its mode-2 output (the spec and the
               # reference include it): no causal mask there.
               {"is_causal": int(mode != 2), "softcap": 3.0, "qk_matmul_output_mode": mode}, n_out=4,
               opset=23)


@pytest.mark.parametrize("dtype", ["bool", "float32"])
def test_attention_short_mask(dtype):
    """A mask shorter than the kv length masks the rest (ONNX Runtime rejects it; the ONNX
    reference implementation is the oracle)."""
    from onnx.reference import ReferenceEvaluator

    mask = rand(SQ, SKV - 2, dtype=dtype, seed=7)
    if dtype == "bool":
        mask[:, 0] = True
    model, feeds = _attention_model((B, 2, SQ, D), (B, 2, SKV, D), (B, 2, SKV, D), {}, mask)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = run_kiln(model, feeds)[0][0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@MASKED_ROW_NAN
def test_attention_fully_masked_rows_are_zero():
    """A query row whose bool mask allows no key gives 0, not NaN."""
    mask = np.ones((SQ, SKV), dtype=bool)
    mask[1] = False
    check_node("Attention", {"q": rand(1, 2, SQ, D, seed=1), "k": rand(1, 2, SKV, D, seed=2),
                             "v": rand(1, 2, SKV, D, seed=3), "mask": mask}, opset=23)


def test_attention_fp16():
    check_node("Attention", {"q": rand(B, 2, SQ, 8, dtype="float16", seed=1),
                             "k": rand(B, 2, SKV, 8, dtype="float16", seed=2),
                             "v": rand(B, 2, SKV, 8, dtype="float16", seed=3)},
               {"is_causal": 1}, opset=23, rtol=2e-3, atol=2e-3)


def _attention_model(q_shape, k_shape, v_shape, attrs, mask=None):
    from onnx import helper

    feeds = {"q": rand(*q_shape), "k": rand(*k_shape, seed=1), "v": rand(*v_shape, seed=2)}
    if mask is not None:
        feeds["mask"] = mask
    node = helper.make_node("Attention", list(feeds), ["y"], name="att", **attrs)
    return make_model([node], feeds, ["y"], opset=23), feeds


@pytest.mark.parametrize("shapes,attrs,err", [
    (((1, 2, 3, 4), (1, 3, 5, 4), (1, 3, 5, 4)), {}, InputError),  # 2 q heads, 3 kv heads
    (((1, 2, 3, 4), (1, 2, 5, 6), (1, 2, 5, 4)), {}, InputError),  # K head size != Q's
    (((1, 3, 8), (1, 5, 8), (1, 5, 8)), {}, InputError),  # 3-D without head counts
    (((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)), {"qk_matmul_output_mode": 7}, UnsupportedOpError),
    (((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)), {"scale": -0.5}, InputError),
    (((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)), {"mask": np.zeros((1, 1, 1, 3, 5), np.float32)}, InputError),
    (((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)), {"mask": np.zeros((3, 6), np.float32)}, InputError),
])
def test_attention_bad_input(shapes, attrs, err):
    attrs = dict(attrs)
    model, feeds = _attention_model(*shapes, attrs, attrs.pop("mask", None))
    with pytest.raises(err, match="Attention"):
        run_kiln(model, feeds)


# ----------------------------------------------------------------------------- RMSNormalization
@pytest.mark.parametrize("shape,axis,scale_shape", [((2, 3, 8), -1, (8,)), ((2, 3, 4, 5), 1, (3, 4, 5)),
                                                    ((4, 6), 0, (1, 6))])
def test_rms_normalization(shape, axis, scale_shape):
    check_node("RMSNormalization", {"x": rand(*shape, lo=-3, hi=3), "scale": rand(*scale_shape, seed=1)},
               {"axis": axis, "epsilon": 1e-3}, opset=23)


def test_rms_normalization_bad_axis():
    from onnx import helper

    feeds = {"x": rand(2, 3), "scale": rand(3, seed=1)}
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", axis=2)
    with pytest.raises(InputError, match="RMSNormalization node 'rms'.*axis"):
        run_kiln(make_model([node], feeds, ["y"], opset=23), feeds)


# ----------------------------------------------------------------------------- RotaryEmbedding
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
def test_rotary_embedding_position_ids(interleaved, rot_dim):
    half = (rot_dim or 8) // 2
    pos = np.array([[0, 3, 1], [2, 2, 5]], dtype=np.int64)
    check_node("RotaryEmbedding", {"x": rand(2, 3, 3, 8), "cos": rand(6, half, seed=1),
                                   "sin": rand(6, half, seed=2), "pos": pos},
               {"interleaved": interleaved, "rotary_embedding_dim": rot_dim}, opset=23)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_3d_no_position_ids(interleaved):
    check_node("RotaryEmbedding", {"x": rand(2, 3, 2 * 6), "cos": rand(2, 3, 3, seed=1),
                                   "sin": rand(2, 3, 3, seed=2)},
               {"interleaved": interleaved, "num_heads": 2}, opset=23)


def test_rotary_embedding_bad_cache():
    from onnx import helper

    feeds = {"x": rand(1, 2, 3, 8), "cos": rand(1, 3, 3, seed=1), "sin": rand(1, 3, 3, seed=2)}
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], name="rope")
    with pytest.raises(InputError, match="RotaryEmbedding node 'rope'.*cos_cache"):
        run_kiln(make_model([node], feeds, ["y"], opset=23), feeds)


# ----------------------------------------------------------------------------- LinearAttention
@pytest.mark.parametrize("rule,hq,decay_dim,beta_dim", [
    ("linear", 2, 0, 0), ("gated", 2, 2, 0), ("gated", 2, 2 * 4, 0), ("delta", 2, 0, 2),
    ("gated_delta", 4, 2 * 4, 1), ("gated_delta", 2, 2, 2),
])
def test_linear_attention(rule, hq, decay_dim, beta_dim):
    t, hkv, dk, dv = 3, 2, 4, 3
    ins = {"q": rand(B, t, hq * dk, seed=1), "k": rand(B, t, hkv * dk, seed=2, lo=-0.5, hi=0.5),
           "v": rand(B, t, hkv * dv, seed=3), "past": rand(B, hkv, dk, dv, seed=4),
           "decay": rand(B, t, decay_dim, seed=5, lo=-1, hi=0) if decay_dim else None,
           "beta": rand(B, t, beta_dim, seed=6, lo=0, hi=1) if beta_dim else None}
    check_node("LinearAttention", ins, {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv},
               n_out=2, opset=27)


def test_linear_attention_missing_decay():
    from onnx import helper

    feeds = {"q": rand(1, 2, 4), "k": rand(1, 2, 4, seed=1), "v": rand(1, 2, 4, seed=2)}
    node = helper.make_node("LinearAttention", list(feeds), ["y"], name="la", q_num_heads=1, kv_num_heads=1,
                            update_rule="gated")
    with pytest.raises(InputError, match="LinearAttention node 'la'.*decay"):
        run_kiln(make_model([node], feeds, ["y"], opset=27), feeds)


# ----------------------------------------------------------------------------- CausalConvWithState
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("act", ["none", "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state(kernel, act, with_state):
    ins = {"x": rand(2, 3, 5), "w": rand(3, 1, kernel, seed=1), "b": rand(3, seed=2),
           "past": rand(2, 3, kernel - 1, seed=3) if with_state else None}
    check_node("CausalConvWithState", ins, {"activation": act}, n_out=2, opset=27)


# ----------------------------------------------------------------------------- SwiGLU
@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu(alpha):
    """ONNX Runtime has no SwiGLU kernel yet: the ONNX reference implementation is the oracle."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    feeds = {"a": rand(3, 8, lo=-4, hi=4), "b": rand(3, 8, seed=1)}
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], name="swiglu", alpha=alpha)
    model = make_model([node], feeds, ["y"], opset=28)
    np.testing.assert_allclose(run_kiln(model, feeds)[0][0], ReferenceEvaluator(model).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-6)
