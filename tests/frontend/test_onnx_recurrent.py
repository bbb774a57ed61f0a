"""Recurrent and volumetric ops (RNN, GRU, LSTM, 3-D conv/pool, RoiAlign) vs ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from kiln.frontend import from_onnx
from kiln.ir import evaluate
from kiln.runtime.errors import InputError, UnsupportedOpError
from tests.frontend.onnx_check import assert_close, check_node, make_model, rand, run_kiln, run_ort

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _rnn_inputs(op: str, steps: int = 4, batch: int = 3, in_size: int = 5, hidden: int = 4,
                num_dir: int = 1, bias: bool = True, seq_lens: np.ndarray | None = None,
                init: bool = False, peep: bool = False, layout: int = 0, seed: int = 0) -> dict:
    g = _GATES[op]
    x_shape = (batch, steps, in_size) if layout else (steps, batch, in_size)
    st_shape = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
    ins = {"X": rand(*x_shape, seed=seed), "W": rand(num_dir, g * hidden, in_size, seed=seed + 1),
           "R": rand(num_dir, g * hidden, hidden, seed=seed + 2),
           "B": rand(num_dir, 2 * g * hidden, seed=seed + 3) if bias else None,
           "sequence_lens": seq_lens,
           "initial_h": rand(*st_shape, seed=seed + 4) if init else None}
    if op == "LSTM":
        ins["initial_c"] = rand(*st_shape, seed=seed + 5) if init else None
        ins["P"] = rand(num_dir, 3 * hidden, seed=seed + 6) if peep else None
    return ins


def _n_out(op: str) -> int:
    return 3 if op == "LSTM" else 2


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_directions(op, direction):
    nd = 2 if direction == "bidirectional" else 1
    check_node(op, _rnn_inputs(op, num_dir=nd, init=True), {"hidden_size": 4, "direction": direction},
               n_out=_n_out(op))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("const", [False, True])
def test_recurrent_sequence_lens(op, const):
    # Ragged lengths (one of them 0) in both directions: masked steps keep the state, output 0.
    lens = np.array([4, 2, 0], dtype=np.int32)
    check_node(op, _rnn_inputs(op, num_dir=2, seq_lens=lens, init=True),
               {"hidden_size": 4, "direction": "bidirectional"}, n_out=_n_out(op),
               const_inputs=("sequence_lens",) if const else ())


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_no_bias_no_state(op):
    check_node(op, _rnn_inputs(op, bias=False), {"hidden_size": 4}, n_out=_n_out(op))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_layout_batch_major(op):
    # ONNX Runtime has no batch-major (layout=1) kernel: compare against the time-major model
    # with the inputs and outputs transposed.
    ins = _rnn_inputs(op, num_dir=2, init=True, layout=1)
    attrs = {"hidden_size": 4, "direction": "bidirectional"}
    tm = dict(ins, X=ins["X"].transpose(1, 0, 2), initial_h=ins["initial_h"].transpose(1, 0, 2))
    if op == "LSTM":
        tm["initial_c"] = ins["initial_c"].transpose(1, 0, 2)
    n = _n_out(op)
    outs = [f"o{i}" for i in range(n)]

    def run(inputs, layout):
        names = [k if v is not None else "" for k, v in inputs.items()]
        while names[-1] == "":
            names.pop()
        node = helper.make_node(op, names, outs, layout=layout, **attrs)
        feeds = {k: v for k, v in inputs.items() if v is not None}
        mod, params = from_onnx(make_model([node], feeds, outs, opset=14))
        return evaluate(mod, feeds, params)

    got = run(ins, 1)
    want = run(tm, 0)
    np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-6, atol=1e-6)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w.transpose(1, 0, 2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    check_node("GRU", _rnn_inputs("GRU", num_dir=2, init=True),
               {"hidden_size": 4, "direction": "bidirectional", "linear_before_reset": lbr}, n_out=2)


def test_lstm_peepholes_clip_input_forget():
    check_node("LSTM", _rnn_inputs("LSTM", num_dir=2, init=True, peep=True),
               {"hidden_size": 4, "direction": "bidirectional", "clip": 0.7}, n_out=3)
    check_node("LSTM", _rnn_inputs("LSTM", init=True, peep=True),
               {"hidden_size": 4, "input_forget": 1}, n_out=3)


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["Relu"], [], []),
    ("RNN", ["LeakyRelu", "HardSigmoid"], [0.2, 0.3], [0.4]),
    ("GRU", ["HardSigmoid", "Softsign"], [0.25], [0.45]),
    ("GRU", ["Sigmoid", "Elu", "Sigmoid", "ThresholdedRelu"], [0.5, 0.1], []),
    ("LSTM", ["HardSigmoid", "Tanh", "Softplus"], [0.3], [0.6]),
    ("LSTM", ["Sigmoid", "ScaledTanh", "Affine"], [0.9, 0.8], [0.7, 0.1]),
])
def test_recurrent_activations(op, acts, alpha, beta):
    nd = len(acts) // {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
    attrs = {"hidden_size": 4, "activations": acts,
             "direction": "bidirectional" if nd == 2 else "forward"}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    check_node(op, _rnn_inputs(op, num_dir=nd, init=True), attrs, n_out=_n_out(op))


def test_recurrent_only_last_state():
    # Y left out (empty output name): only Y_h / Y_c are computed, no per-step outputs joined.
    ins = {k: v for k, v in _rnn_inputs("LSTM").items() if v is not None}
    node = helper.make_node("LSTM", list(ins), ["", "yh", "yc"], hidden_size=4)
    model = make_model([node], ins, ["yh", "yc"])
    want = run_ort(model, ins)
    got, mod = run_kiln(model, ins)
    for g, w in zip(got, want):
        assert_close(g, w)
    assert "concatenate" not in {n.op for n in mod.nodes}


def _one_node_model(op, ins, **attrs):
    names = [k if v is not None else "" for k, v in ins.items()]
    while names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, ["y", "yh"], name="rec", **attrs)
    return make_model([node], {k: v for k, v in ins.items() if v is not None}, ["y", "yh"])


@pytest.mark.parametrize("attrs,cls,fragment", [
    ({"hidden_size": 4, "direction": "sideways"}, InputError, "direction='sideways'"),
    ({"hidden_size": 4, "activations": ["Gelu"]}, UnsupportedOpError, "activation 'Gelu'"),
    ({"hidden_size": 4, "activations": ["Tanh", "Tanh"]}, InputError, "per direction"),
    ({"hidden_size": 5}, InputError, "input W has shape"),
])
def test_recurrent_errors(attrs, cls, fragment):
    model = _one_node_model("RNN", _rnn_inputs("RNN"), **attrs)
    with pytest.raises(cls, match=fragment) as info:
        from_onnx(model)
    assert "RNN" in str(info.value)


def test_recurrent_bad_sequence_lens():
    ins = _rnn_inputs("RNN", seq_lens=np.array([1, 9, 2], dtype=np.int32))
    with pytest.raises(InputError, match="sequence_lens"):
        from_onnx(_one_node_model("RNN", ins, hidden_size=4), freeze={"sequence_lens": ins["sequence_lens"]})


# ----------------------------------------------------------------------------- 3-D convolution
@pytest.mark.parametrize("cin,cout,attrs", [
    (3, 4, {}),
    (4, 6, {"strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0]}),
    (4, 4, {"dilations": [2, 1, 2], "pads": [2, 1, 1, 0, 1, 2]}),
    (6, 4, {"group": 2, "strides": [1, 2, 2]}),
    (4, 4, {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
    (3, 5, {"kernel_shape": [1, 3, 3], "pads": [0, 1, 1, 0, 1, 1]}),
])
def test_conv3d(cin, cout, attrs):
    g = attrs.get("group", 1)
    k = attrs.get("kernel_shape", [3, 2, 3])
    check_node("Conv", {"x": rand(2, cin, 6, 7, 8), "w": rand(cout, cin // g, *k, seed=1),
                        "b": rand(cout, seed=2)}, attrs)


def test_conv3d_is_one_conv2d():
    mod = check_node("Conv", {"x": rand(1, 2, 5, 5, 5), "w": rand(3, 2, 3, 3, 3, seed=1)})
    ops = [n.op for n in mod.nodes]
    assert ops.count("conv2d") == 1, ops


def test_conv3d_bad_weight():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="c3")
    feeds = {"x": rand(1, 4, 5, 5, 5), "w": rand(3, 3, 3, 3, 3)}
    with pytest.raises(InputError, match="c3"):
        from_onnx(make_model([node], feeds, ["y"]))


# ----------------------------------------------------------------------------- RoiAlign
def _rois(n: int, hi: float, seed: int = 3) -> np.ndarray:
    a = np.sort(np.random.default_rng(seed).uniform(-2.0, hi, size=(n, 2, 2)), axis=1)
    return np.concatenate([a[:, 0], a[:, 1]], axis=1).astype(np.float32)


@pytest.mark.parametrize("attrs", [
    {"output_height": 3, "output_width": 4, "sampling_ratio": 2},
    {"output_height": 2, "output_width": 3, "sampling_ratio": 1, "mode": "max"},
    {"output_height": 3, "output_width": 2, "sampling_ratio": 3, "spatial_scale": 0.5,
     "coordinate_transformation_mode": "output_half_pixel"},
])
def test_roi_align(attrs):
    check_node("RoiAlign", {"x": rand(2, 3, 9, 11), "rois": _rois(6, 12.0 / attrs.get("spatial_scale", 1.0)),
                            "idx": np.array([0, 1, 1, 0, 1, 0], dtype=np.int64)}, attrs)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coord", ["half_pixel", "output_half_pixel"])
def test_roi_align_adaptive_static_rois(mode, coord):
    # sampling_ratio=0: each box gets its own ceil(size / output) grid, bounded from the frozen rois.
    rois = _rois(5, 14.0, seed=4)
    mod = check_node("RoiAlign", {"x": rand(2, 3, 9, 11), "rois": rois,
                                  "idx": np.array([1, 0, 1, 1, 0], dtype=np.int64)},
                     {"output_height": 3, "output_width": 2, "mode": mode,
                      "coordinate_transformation_mode": coord}, const_inputs=("rois",))
    node = next(n for n in mod.nodes if n.op == "roi_align")
    assert min(node.attrs["max_grid"]) >= 2


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_adaptive_runtime_rois(mode):
    # Boxes computed at run time, some far larger than the image: their grids (up to 30 samples
    # per bin) exceed the kernel's bound, which only visits the samples that can be inside.
    rois = np.concatenate([_rois(3, 8.0, seed=5), np.array([[-50.0, -40.0, 60.0, 70.0],
                                                            [-30.0, 2.0, 5.0, 3.0]], np.float32)])
    check_node("RoiAlign", {"x": rand(2, 3, 7, 9), "rois": rois,
                            "idx": np.array([1, 0, 1, 0, 1], dtype=np.int64)},
               {"output_height": 3, "output_width": 2, "mode": mode})


def test_roi_align_bad_batch_index():
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="ra", sampling_ratio=2)
    feeds = {"x": rand(1, 2, 6, 6), "rois": _rois(2, 6.0), "idx": np.array([0, 3], np.int64)}
    mod, params = from_onnx(make_model([node], feeds, ["y"]))
    with pytest.raises(InputError, match="batch index 3"):
        evaluate(mod, feeds, params)
