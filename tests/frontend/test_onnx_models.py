"""Small whole models through the frontend + passes + interpreter vs ORT, and frontend errors."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln.ir import evaluate
from kiln.runtime.errors import InputError, UnsupportedOpError

from tests.frontend.onnx_check import assert_close, make_model, rand, run_ort

N = helper.make_node


def _compare(model, feeds, atol=1e-5, **kw):
    want = run_ort(model, feeds)
    mod, params = kiln.frontend.from_onnx(model, **kw)
    got = evaluate(mod, feeds, params)
    for g, w in zip(got, want):
        assert_close(g, w, 1e-4, atol)
    # Same through the standard pass pipeline (params bound, folded, simplified).
    opt = kiln.transform.default_pipeline(params, opt_level=3)(mod)
    got2 = evaluate(opt, feeds)
    for g, w in zip(got2, want):
        assert_close(g, w, 1e-4, atol)
    return mod, params, opt


def test_mlp():
    inits = {"w1": rand(16, 32, seed=1), "b1": rand(32, seed=2), "w2": rand(32, 10, seed=3),
             "b2": rand(10, seed=4)}
    nodes = [N("Gemm", ["x", "w1", "b1"], ["h"]), N("Relu", ["h"], ["r"]),
             N("MatMul", ["r", "w2"], ["m"]), N("Add", ["m", "b2"], ["a"]),
             N("Softmax", ["a"], ["y"], axis=1)]
    feeds = {"x": rand(4, 16)}
    mod, params, opt = _compare(make_model(nodes, feeds, ["y"], 13, inits), feeds)
    # b2 is tiny (<= 16 elements): it becomes a constant, not a param.
    assert set(params) == {"w1", "b1", "w2"}
    assert mod.input_names == ["x", "w1", "b1", "w2"]
    assert "transpose" not in opt.op_counts()  # folded into the weights


def _conv_bn_relu(prefix, cin, cout, x, inits, k=3, stride=1, group=1):
    inits[f"{prefix}.w"] = rand(cout, cin // group, k, k, seed=len(inits))
    for i, n in enumerate(("s", "b", "m", "v")):
        lo = 0.5 if n == "v" else -1
        inits[f"{prefix}.{n}"] = rand(cout, seed=len(inits) + i, lo=lo, hi=1.5)
    p = k // 2
    return [N("Conv", [x, f"{prefix}.w"], [f"{prefix}.c"], pads=[p] * 4, strides=[stride] * 2,
              group=group),
            N("BatchNormalization", [f"{prefix}.c", f"{prefix}.s", f"{prefix}.b", f"{prefix}.m",
                                     f"{prefix}.v"], [f"{prefix}.bn"]),
            N("Relu", [f"{prefix}.bn"], [f"{prefix}.out"])]


def test_cnn_residual():
    inits = {}
    nodes = _conv_bn_relu("c1", 3, 8, "x", inits)
    nodes += [N("MaxPool", ["c1.out"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    nodes += _conv_bn_relu("c2", 8, 8, "p", inits)
    nodes += [N("Add", ["c2.out", "p"], ["res"]), N("Relu", ["res"], ["r"]),
              N("GlobalAveragePool", ["r"], ["g"]), N("Flatten", ["g"], ["f"])]
    inits["fc.w"] = rand(5, 8, seed=99)
    inits["fc.b"] = rand(5, seed=98)
    nodes += [N("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1)]
    feeds = {"x": rand(2, 3, 8, 8)}
    mod, params, opt = _compare(make_model(nodes, feeds, ["y"], 13, inits), feeds)
    assert mod.op_counts()["batch_norm"] == 2
    assert "batch_norm" not in opt.op_counts()
    counts = opt.op_counts()
    # The layout pass may turn the convs into their blocked-layout form (conv2d_nchwc), a
    # 3x3 stride-1 one into Winograd (its output transform is the conv's last op).
    assert counts.get("conv2d", 0) + counts.get("conv2d_nchwc", 0) + counts.get("winograd_output_transform", 0) == 2


def test_depthwise_separable():
    inits = {}
    nodes = _conv_bn_relu("dw", 8, 8, "x", inits, group=8, stride=2)
    nodes += _conv_bn_relu("pw", 8, 16, "dw.out", inits, k=1)
    nodes += [N("Clip", ["pw.out", "lo", "hi"], ["y"])]
    inits["lo"] = np.array(0.0, np.float32)
    inits["hi"] = np.array(6.0, np.float32)
    feeds = {"x": rand(1, 8, 10, 10)}
    _, _, opt = _compare(make_model(nodes, feeds, ["y"], 13, inits), feeds)
    assert "batch_norm" not in opt.op_counts()


def _encoder_layer(d=16, heads=2, seq=5, ff=32):
    dh = d // heads
    inits = {n: rand(d, d, seed=i) * 0.3 for i, n in enumerate(("wq", "wk", "wv", "wo"))}
    inits.update({"bq": rand(d, seed=10), "ln1.s": rand(d, seed=11, lo=0.5, hi=1.5),
                  "ln1.b": rand(d, seed=12), "w1": rand(d, ff, seed=13) * 0.3,
                  "b1": rand(ff, seed=14), "w2": rand(ff, d, seed=15) * 0.3,
                  "ln2.s": rand(d, seed=16, lo=0.5, hi=1.5), "ln2.b": rand(d, seed=17),
                  "scale": np.array(1.0 / np.sqrt(dh), np.float32),
                  "split_shape": np.array([0, 0, heads, dh], np.int64),
                  "sqrt2": np.array(np.sqrt(2.0), np.float32),
                  "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)})
    nodes = []
    for n in ("q", "k", "v"):
        nodes.append(N("MatMul", ["x", f"w{n}"], [f"{n}0"]))
    nodes.append(N("Add", ["q0", "bq"], ["q1"]))
    nodes += [N("Reshape", ["q1", "split_shape"], ["q2"]),
              N("Reshape", ["k0", "split_shape"], ["k2"]),
              N("Reshape", ["v0", "split_shape"], ["v2"]),
              N("Transpose", ["q2"], ["q3"], perm=[0, 2, 1, 3]),
              N("Transpose", ["k2"], ["k3"], perm=[0, 2, 3, 1]),
              N("Transpose", ["v2"], ["v3"], perm=[0, 2, 1, 3]),
              N("MatMul", ["q3", "k3"], ["s0"]), N("Mul", ["s0", "scale"], ["s1"]),
              N("Add", ["s1", "mask"], ["s2"]),
              N("Softmax", ["s2"], ["p"], axis=-1), N("MatMul", ["p", "v3"], ["o0"]),
              N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              # Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain, folded statically.
              N("Shape", ["x"], ["xs"]),
              N("Gather", ["xs", "i0"], ["b"], axis=0), N("Gather", ["xs", "i1"], ["t"], axis=0),
              N("Unsqueeze", ["b", "ax0"], ["bu"]), N("Unsqueeze", ["t", "ax0"], ["tu"]),
              N("Concat", ["bu", "tu", "minus1"], ["oshape"], axis=0),
              N("Reshape", ["o1", "oshape"], ["o2"]),
              N("MatMul", ["o2", "wo"], ["o3"]), N("Add", ["o3", "x"], ["r1"]),
              N("LayerNormalization", ["r1", "ln1.s", "ln1.b"], ["h1"], axis=-1),
              N("MatMul", ["h1", "w1"], ["f0"]), N("Add", ["f0", "b1"], ["f1"]),
              # Gelu spelled with Erf (as exporters do)
              N("Div", ["f1", "sqrt2"], ["g0"]), N("Erf", ["g0"], ["g1"]),
              N("Add", ["g1", "one"], ["g2"]), N("Mul", ["f1", "g2"], ["g3"]),
              N("Mul", ["g3", "half"], ["g4"]),
              N("MatMul", ["g4", "w2"], ["f2"]), N("Add", ["f2", "h1"], ["r2"]),
              N("LayerNormalization", ["r2", "ln2.s", "ln2.b"], ["y"], axis=-1, epsilon=1e-6)]
    inits.update({"i0": np.array(0, np.int64), "i1": np.array(1, np.int64),
                  "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)})
    feeds = {"x": rand(2, seq, d), "mask": np.where(rand(2, 1, 1, seq) > 0.8, -1e4, 0.0)
             .astype(np.float32)}
    return nodes, inits, feeds


def test_transformer_encoder_layer():
    nodes, inits, feeds = _encoder_layer()
    model = make_model(nodes, feeds, ["y"], 17, inits)
    mod, params, opt = _compare(model, feeds, atol=1e-4)
    ops = mod.op_counts()
    assert "layer_norm" in ops and "softmax" in ops
    # The shape chain folded: no Shape/Gather left, the final reshape is static.
    assert "take" not in ops and "concatenate" not in ops
    assert set(params) >= {"wq", "wk", "wv", "wo", "w1", "w2"}


def test_gelu_opset20_and_bf16_cast_chain():
    nodes = [N("Gelu", ["x"], ["g"], approximate="tanh"),
             N("Cast", ["g"], ["b"], to=TensorProto.BFLOAT16),
             N("Cast", ["b"], ["y"], to=TensorProto.FLOAT)]
    feeds = {"x": rand(3, 7, lo=-3, hi=3)}
    _compare(make_model(nodes, feeds, ["y"], 20), feeds, atol=1e-2)


def test_int64_index_and_bool_mask_graph():
    nodes = [N("Gather", ["emb", "ids"], ["e"], axis=0),
             N("Greater", ["ids", "zero"], ["m"]), N("Unsqueeze", ["m", "ax"], ["mu"]),
             N("Where", ["mu", "e", "fill"], ["y"]), N("Cast", ["m"], ["mi"], to=TensorProto.INT64),
             N("ReduceSum", ["mi", "ax1"], ["cnt"], keepdims=0)]
    inits = {"emb": rand(10, 4), "zero": np.array(2, np.int64), "ax": np.array([-1], np.int64),
             "fill": np.array(0.0, np.float32), "ax1": np.array([1], np.int64)}
    feeds = {"ids": rand(2, 5, dtype="int64", lo=0, hi=9)}
    mod, _, _ = _compare(make_model(nodes, feeds, ["y", "cnt"], 13, inits), feeds)
    assert mod.outputs[1].dtype == "int64"


# ----------------------------------------------------------------------------- frontend API
def test_unsupported_ops_listed_together():
    nodes = [N("Relu", ["x"], ["a"], name="r"), N("Bernoulli", ["a"], ["b"], name="be1"),
             N("Cast", ["b"], ["c"], to=1, name="c"), N("Bernoulli", ["c"], ["d"], name="be2"),
             N("STFT", ["d", "d"], ["e"], name="st"),
             N("FusedGemm", ["e", "e"], ["y"], name="fg", domain="com.microsoft")]
    model = make_model(nodes, {"x": rand(2, 3)}, ["y"], 13)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedOpError) as ei:
        kiln.frontend.from_onnx(model)
    msg = str(ei.value)
    for s in ("Bernoulli", "be1", "be2", "STFT", "st", "com.microsoft.FusedGemm", "fg"):
        assert s in msg
    assert isinstance(ei.value, NotImplementedError)


def _dynamic_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    g = helper.make_graph([N("Relu", ["x"], ["y"])], "g", [x],
                          [helper.make_empty_tensor_value_info("y")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 10
    return m


def test_dynamic_shape_needs_override():
    with pytest.raises(InputError, match="'x'.*batch"):
        kiln.frontend.from_onnx(_dynamic_model())
    mod, _ = kiln.frontend.from_onnx(_dynamic_model(), shape={"x": (4, 3)})
    assert mod.inputs[0].shape == (4, 3)
    with pytest.raises(InputError, match="nope"):
        kiln.frontend.from_onnx(_dynamic_model(), shape={"nope": (1,)})


def test_runtime_shape_input_is_reported():
    nodes = [N("Reshape", ["x", "s"], ["y"], name="rs")]
    feeds = {"x": rand(2, 3), "s": np.array([3, 2], np.int64)}
    model = make_model(nodes, feeds, ["y"], 13)
    with pytest.raises(UnsupportedOpError, match="rs.*shape.*freeze"):
        kiln.frontend.from_onnx(model)
    mod, _ = kiln.frontend.from_onnx(model, freeze={"s": feeds["s"]})
    assert mod.input_names == ["x"]


def test_freeze_all_params_and_path(tmp_path):
    inits = {"w": rand(4, 8, seed=1)}
    model = make_model([N("MatMul", ["x", "w"], ["y"])], {"x": rand(2, 4)}, ["y"], 13, inits)
    mod, params = kiln.frontend.from_onnx(model, freeze=True)
    assert params == {} and mod.input_names == ["x"]
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    mod2, params2 = kiln.frontend.from_onnx(str(path))
    assert list(params2) == ["w"]
    from kiln.runtime.errors import KilnFileNotFoundError

    with pytest.raises(KilnFileNotFoundError):
        kiln.frontend.from_onnx(str(tmp_path / "missing.onnx"))


def test_type_error_names_node():
    nodes = [N("Add", ["a", "b"], ["y"], name="bad_add")]
    feeds = {"a": rand(2, 3), "b": rand(4, 3)}
    model = make_model(nodes, feeds, ["y"], 13)
    with pytest.raises(InputError, match="bad_add.*not broadcastable"):
        kiln.frontend.from_onnx(model)


def test_dtype_override_only_retypes_float_inputs():
    nodes = [N("Gather", ["x", "ids"], ["y"], axis=0)]
    feeds = {"x": rand(5, 3), "ids": np.array([0, 4], np.int64)}
    model = make_model(nodes, feeds, ["y"], 13)
    mod, _ = kiln.frontend.from_onnx(model, dtype="float16")
    assert [v.dtype for v in mod.inputs] == ["float16", "int64"]
    mod, _ = kiln.frontend.from_onnx(model, dtype={"ids": "int32"})
    assert [v.dtype for v in mod.inputs] == ["float32", "int32"]
