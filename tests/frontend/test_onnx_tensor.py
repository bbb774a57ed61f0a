"""Shape / data-movement / reduction ops through from_onnx + interpreter vs ORT."""

import numpy as np
import pytest

from tests.frontend.onnx_check import check_node, rand

I64 = np.int64


@pytest.mark.parametrize("shape,allowzero", [((4, 6), 0), ((-1, 3), 0), ((0, -1), 0),
                                             ((2, 0, 4), 0), ((24,), 1), ((2, 3, 4), 1)])
def test_reshape(shape, allowzero):
    check_node("Reshape", {"x": rand(2, 3, 4), "s": np.array(shape, I64)},
               {"allowzero": allowzero} if allowzero else {}, opset=14, const_inputs=["s"])


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_flatten(axis):
    check_node("Flatten", {"x": rand(2, 3, 4)}, {"axis": axis}, opset=13)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze(opset):
    x = rand(1, 3, 1, 4)
    if opset < 13:
        check_node("Squeeze", {"x": x}, {"axes": [0, -2]}, opset=opset)
        check_node("Unsqueeze", {"x": rand(3, 4)}, {"axes": [0, -1]}, opset=opset)
    else:
        check_node("Squeeze", {"x": x, "a": np.array([0, -2], I64)}, opset=opset,
                   const_inputs=["a"])
        check_node("Unsqueeze", {"x": rand(3, 4), "a": np.array([0, 3], I64)}, opset=opset,
                   const_inputs=["a"])
    check_node("Squeeze", {"x": x}, opset=opset)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    check_node("Transpose", {"x": rand(2, 3, 4)}, {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shp = [2, 3, 4]
    a = rand(*shp)
    shp[axis] = 1
    b = rand(*shp, seed=1)
    check_node("Concat", {"a": a, "b": b, "c": a}, {"axis": axis})


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split(opset):
    x = rand(2, 6, 3)
    if opset < 18:
        check_node("Split", {"x": x}, {"axis": 1}, n_out=3, opset=opset)
    if opset < 13:
        check_node("Split", {"x": x}, {"axis": 1, "split": [1, 2, 3]}, n_out=3, opset=opset)
    else:
        check_node("Split", {"x": x, "s": np.array([1, 5], I64)}, {"axis": -2}, n_out=2,
                   opset=opset, const_inputs=["s"])
    if opset >= 18:
        check_node("Split", {"x": rand(7, 2)}, {"num_outputs": 3}, n_out=3, opset=opset)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 1], [2, 3], None, None),
    ([1], [-1], [1], None),
    ([-1], [-1000], [2], [-1]),
    ([0, 0], [10, 10], [1, 2], [2, 3]),
    ([3, 2], [0, -100], [1, 2], [-1, -2]),
    ([100], [200], [0], None),
    ([-9999], [9999], [-1], [1]),
])
def test_slice(starts, ends, axes, steps):
    ins = {"x": rand(3, 5, 6), "s": np.array(starts, I64), "e": np.array(ends, I64)}
    const = ["s", "e"]
    if axes is not None:
        ins["a"] = np.array(axes, I64)
        const.append("a")
    if steps is not None:
        if axes is None:
            ins["a"] = None
        ins["st"] = np.array(steps, I64)
        const.append("st")
    check_node("Slice", ins, opset=13, const_inputs=const)


def test_slice_opset1():
    check_node("Slice", {"x": rand(3, 5)}, {"starts": [1, 0], "ends": [3, -1]}, opset=9)


@pytest.mark.parametrize("axis,idx", [(0, [0, 2, -1]), (1, [[0, 1], [3, -4]]), (2, 1),
                                      (-1, [3, 0])])
def test_gather(axis, idx):
    check_node("Gather", {"x": rand(3, 4, 5), "i": np.array(idx, I64)}, {"axis": axis})
    check_node("Gather", {"x": rand(3, 4, 5), "i": np.array(idx, np.int32)}, {"axis": axis})


def test_gather_elements():
    idx = np.array([[0, 2, 1], [-1, 0, 0]], I64)
    check_node("GatherElements", {"x": rand(2, 3), "i": idx}, {"axis": 1})
    check_node("GatherElements", {"x": rand(3, 3), "i": np.array([[1, 2, 0]], I64)}, {"axis": 0})


@pytest.mark.parametrize("xs,shape", [((3, 1), (2, 1, 6)), ((3, 4), (4,)), ((1,), (2, 3)),
                                      ((2, 3), (1, 1))])
def test_expand(xs, shape):
    check_node("Expand", {"x": rand(*xs), "s": np.array(shape, I64)}, const_inputs=["s"])


def test_tile():
    check_node("Tile", {"x": rand(2, 3), "r": np.array([2, 3], I64)}, const_inputs=["r"])
    check_node("Tile", {"x": rand(2, 3, dtype="int64", hi=9), "r": np.array([1, 2], I64)},
               const_inputs=["r"])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = rand(2, 3, 4)
    pads = np.array([0, 1, 2, 1, 2, 3], I64)
    ins = {"x": x, "p": pads}
    const = ["p"]
    if mode == "constant":
        ins["v"] = np.array(1.5, np.float32)
        const.append("v")
    check_node("Pad", ins, {"mode": mode}, opset=19, const_inputs=const)


def test_pad_variants():
    x = rand(2, 3, 4)
    check_node("Pad", {"x": x}, {"pads": [0, 1, 0, 1, 0, 2], "value": 2.0}, opset=10)
    check_node("Pad", {"x": x, "p": np.array([1, -1, 2, 0, -1, 1], I64)}, opset=13,
               const_inputs=["p"])
    check_node("Pad", {"x": x, "p": np.array([1, 2, 1, 2], I64), "v": None,
                       "a": np.array([0, -1], I64)}, opset=18, const_inputs=["p", "a"])


def test_shape_size_constants():
    mod = check_node("Shape", {"x": rand(2, 3, 4)})
    assert mod.op_counts() == {"constant": 1}
    check_node("Shape", {"x": rand(2, 3, 4)}, {"start": 1, "end": -1}, opset=15)
    check_node("Size", {"x": rand(2, 3, 4)})


def test_constant_of_shape_and_range():
    from onnx import helper, TensorProto

    check_node("ConstantOfShape", {"s": np.array([2, 3], I64)}, const_inputs=["s"])
    val = helper.make_tensor("v", TensorProto.INT32, [1], [7])
    check_node("ConstantOfShape", {"s": np.array([4], I64)}, {"value": val}, const_inputs=["s"])
    for args in [(0, 10, 3), (10, 2, -2), (0.5, 2.0, 0.4)]:
        dt = np.float32 if isinstance(args[0], float) else np.int64
        ins = {k: np.array(v, dt) for k, v in zip(("a", "b", "c"), args)}
        check_node("Range", ins, const_inputs=["a", "b", "c"])


def test_constant_variants():
    from onnx import numpy_helper

    check_node("Constant", {}, {"value": numpy_helper.from_array(rand(2, 3), "v")})
    check_node("Constant", {}, {"value_floats": [1.0, 2.5]})
    check_node("Constant", {}, {"value_int": 3})


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_dropout_identity(opset):
    mod = check_node("Dropout", {"x": rand(3, 4)}, opset=opset)
    assert "dropout" in mod.op_counts()


# ----------------------------------------------------------------------------- reductions
RED = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
       "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", RED)
@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 1), (None, 0)])
def test_reduce(op, opset, axes, keepdims):
    x = rand(2, 3, 4, lo=0.1, hi=1.5)
    attrs = {"keepdims": keepdims}
    ins = {"x": x}
    const = []
    input_axes = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if axes is not None:
        if input_axes:
            ins["a"] = np.array(axes, I64)
            const = ["a"]
        else:
            attrs["axes"] = axes
    check_node(op, ins, attrs, opset=opset, const_inputs=const)


def test_reduce_noop_and_sum13():
    x = rand(2, 3)
    check_node("ReduceSum", {"x": x, "a": np.array([1], I64)}, opset=13, const_inputs=["a"])
    check_node("ReduceSum", {"x": x}, {"noop_with_empty_axes": 1}, opset=13)
    check_node("ReduceMean", {"x": x}, {"noop_with_empty_axes": 1}, opset=18)
    check_node("ReduceLogSum", {"x": rand(2, 3, lo=0.1, hi=2)}, {"axes": [1]}, opset=13)
    check_node("ReduceSum", {"x": rand(2, 3, dtype="int64", hi=9)}, {"axes": [0]}, opset=11)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1, "keepdims": 0}, {"axis": -1},
                                   {"axis": 0, "select_last_index": 1}])
def test_arg(op, attrs):
    x = rand(3, 4, dtype="int64", lo=0, hi=3).astype(np.float32)  # ties
    check_node(op, {"x": x}, attrs, opset=13)


@pytest.mark.parametrize("attrs", [{}, {"axis": 0}, {"largest": 0}, {"axis": 1, "largest": 0}])
def test_topk(attrs):
    x = rand(4, 6, dtype="int64", lo=0, hi=4).astype(np.float32)  # ties
    check_node("TopK", {"x": x, "k": np.array([3], I64)}, attrs, n_out=2, opset=11,
               const_inputs=["k"])
    check_node("TopK", {"x": rand(4, 6), "k": np.array([2], I64)}, attrs, n_out=2, opset=11,
               const_inputs=["k"])


def test_small_initializer_constant_keeps_its_name():
    import kiln
    from onnx import helper

    from tests.frontend.onnx_check import make_model

    node = helper.make_node("Add", ["x", "bias_init"], ["y"])
    model = make_model([node], {"x": rand(2, 3)}, ["y"],
                       initializers={"bias_init": np.arange(3, dtype=np.float32)})
    graph, params = kiln.frontend.from_onnx(model)
    assert params == {}
    names = [v.name for n in graph.nodes if n.op == "constant" for v in n.outputs]
    assert "bias_init" in names
    from kiln.ir.printer import astext

    assert "# bias_init" in astext(graph, show_names=True)
