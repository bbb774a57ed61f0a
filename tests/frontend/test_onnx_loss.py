"""Losses and normalizations (issue 12) against ONNX Runtime: SoftmaxCrossEntropyLoss,
NegativeLogLikelihoodLoss, Hardmax, LpNormalization, MeanVarianceNormalization and
GroupNormalization. ``check_node`` runs the imported graph with the IR reference; a few models
are also compiled end to end, so the kernels the decompositions produce are checked too."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import kiln
from kiln.runtime.errors import InputError, KernelError
from tests.frontend.onnx_check import check_node, make_model, rand, run_ort

pytest.importorskip("onnxruntime")


def _targets(n: int, c: int, *spatial: int, seed: int = 0, ignore: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = rng.integers(0, c, size=(n, *spatial)).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore  # every third target is ignored
    return t


LOSS_CASES = [
    # (spatial dims, reduction, with weight, ignore_index)
    ((), "mean", False, None),
    ((), "sum", True, None),
    ((), "none", True, 2),
    ((4,), "mean", True, 1),
    ((4,), "mean", False, 3),
    ((3, 2), "none", False, None),
    ((3, 2), "sum", False, -1),
    ((2, 2), "mean", True, -7),
]


@pytest.mark.parametrize("spatial,reduction,weighted,ignore", LOSS_CASES)
def test_negative_log_likelihood_loss(spatial, reduction, weighted, ignore) -> None:
    n, c = 3, 5
    ins = {"x": rand(n, c, *spatial, lo=-3, hi=0), "t": _targets(n, c, *spatial, ignore=ignore)}
    if weighted:
        ins["w"] = rand(c, seed=3, lo=0.2, hi=2)
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    check_node("NegativeLogLikelihoodLoss", ins, attrs, opset=22)


@pytest.mark.parametrize("spatial,reduction,weighted,ignore", LOSS_CASES)
@pytest.mark.parametrize("n_out", [1, 2])
def test_softmax_cross_entropy_loss(spatial, reduction, weighted, ignore, n_out) -> None:
    n, c = 3, 5
    ins = {"x": rand(n, c, *spatial, lo=-4, hi=4), "t": _targets(n, c, *spatial, seed=1, ignore=ignore)}
    if weighted:
        ins["w"] = rand(c, seed=3, lo=0.2, hi=2)
    attrs = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    check_node("SoftmaxCrossEntropyLoss", ins, attrs, n_out=n_out, opset=13)


def test_sce_int32_targets_and_float64() -> None:
    ins = {"x": rand(4, 6, lo=-4, hi=4).astype(np.float64), "t": _targets(4, 6, seed=5).astype(np.int32)}
    check_node("SoftmaxCrossEntropyLoss", ins, {"reduction": "sum"}, n_out=2, opset=13)


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_loss_out_of_range_target_is_a_kernel_error(reduction: str) -> None:
    feeds = {"x": rand(2, 4), "t": np.array([1, 9], np.int64)}
    model = make_model([helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["y"], reduction=reduction)],
                       feeds, ["y"], opset=13)
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target="llvm", params=params)["default"](kiln.cpu()))
    with pytest.raises(KernelError):
        m.run(**feeds)


@pytest.mark.parametrize("attrs,err", [
    ({"reduction": "avg"}, "reduction must be 'none', 'sum' or 'mean'"),
])
def test_loss_bad_attributes(attrs, err) -> None:
    feeds = {"x": rand(2, 4), "t": np.array([1, 2], np.int64)}
    model = make_model([helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], **attrs)],
                       feeds, ["y"], opset=22)
    with pytest.raises(InputError, match=err):
        kiln.frontend.from_onnx(model)


def test_loss_bad_target_shape() -> None:
    feeds = {"x": rand(2, 4, 3), "t": np.array([1, 2], np.int64)}
    model = make_model([helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"])], feeds, ["y"], opset=22)
    with pytest.raises(InputError, match=r"target must be an int32/int64 tensor of shape \(2, 3\)"):
        kiln.frontend.from_onnx(model)


@pytest.mark.parametrize("shape,axis,opset", [
    ((4, 6), None, 13), ((3, 4, 5), 0, 13), ((3, 4, 5), 1, 13), ((3, 4, 5), -1, 13),
    ((3, 4, 5), 1, 11), ((3, 4, 5), None, 11), ((2, 3, 4), 0, 11),
])
def test_hardmax(shape, axis, opset) -> None:
    x = rand(*shape, lo=-3, hi=3)
    x.reshape(-1)[1] = x.reshape(-1)[0] = 5.0  # a tie: the first index wins
    check_node("Hardmax", {"x": x}, {} if axis is None else {"axis": axis}, opset=opset)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_lp_normalization(p: int, axis: int) -> None:
    x = rand(3, 4, 5, lo=-2, hi=2)
    x[1, :, :] = 0.0  # zero-norm slices along some axes
    check_node("LpNormalization", {"x": x}, {"p": p, "axis": axis}, opset=22)


def test_lp_normalization_bad_p() -> None:
    feeds = {"x": rand(3, 4)}
    model = make_model([helper.make_node("LpNormalization", ["x"], ["y"], p=3)], feeds, ["y"], opset=22)
    with pytest.raises(InputError, match="p must be 1 or 2, got 3"):
        kiln.frontend.from_onnx(model)


@pytest.mark.parametrize("axes", [None, (0, 2, 3), (2, 3), (1,), (-1, 0)])
def test_mean_variance_normalization(axes) -> None:
    check_node("MeanVarianceNormalization", {"x": rand(2, 3, 4, 5, lo=-3, hi=3)},
               {} if axes is None else {"axes": list(axes)}, opset=13)


@pytest.mark.parametrize("shape,groups,opset", [
    ((2, 6, 3, 4), 3, 21), ((2, 6, 3, 4), 6, 21), ((3, 4, 5), 1, 21), ((2, 8), 4, 21), ((2, 6, 3, 4), 2, 18),
])
def test_group_normalization(shape, groups, opset) -> None:
    c = shape[1]
    per = c if opset >= 21 else groups
    ins = {"x": rand(*shape, lo=-3, hi=3), "scale": rand(per, seed=1, lo=0.5, hi=2), "bias": rand(per, seed=2)}
    check_node("GroupNormalization", ins, {"num_groups": groups, "epsilon": 1e-3}, opset=opset, atol=1e-4)


def test_group_normalization_groups_must_divide_channels() -> None:
    feeds = {"x": rand(2, 6, 3), "scale": rand(6), "bias": rand(6)}
    model = make_model([helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=4)],
                       feeds, ["y"], opset=21)
    with pytest.raises(InputError, match="num_groups=4 must be positive and divide the 6 channels"):
        kiln.frontend.from_onnx(model)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_compiled_losses_and_norms_match_onnxruntime(target: str) -> None:
    # One model through every decomposition, compiled into kernels.
    nodes = [
        helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t", "w"], ["loss", "logp"], reduction="mean",
                         ignore_index=1),
        helper.make_node("NegativeLogLikelihoodLoss", ["logp", "t"], ["nll"], reduction="none"),
        helper.make_node("Hardmax", ["x"], ["hm"], axis=1),
        helper.make_node("LpNormalization", ["x"], ["lp"], axis=1, p=2),
        helper.make_node("MeanVarianceNormalization", ["x"], ["mvn"], axes=[0, 2, 3]),
        helper.make_node("GroupNormalization", ["x", "gs", "gb"], ["gn"], num_groups=2),
    ]
    feeds = {"x": rand(2, 4, 3, 5, lo=-3, hi=3), "t": _targets(2, 4, 3, 5, seed=2, ignore=1),
             "w": rand(4, seed=3, lo=0.5, hi=2), "gs": rand(4, seed=4), "gb": rand(4, seed=5)}
    outs = ["loss", "logp", "nll", "hm", "lp", "mvn", "gn"]
    model = make_model(nodes, feeds, outs, opset=21)
    mod, params = kiln.frontend.from_onnx(model)
    m = kiln.GraphModule(kiln.build(mod, target=target, params=params)["default"](kiln.cpu()))
    m.run(**feeds)
    for i, (name, want) in enumerate(zip(outs, run_ort(model, feeds))):
        np.testing.assert_allclose(m.get_output(i).numpy(), want, rtol=1e-4, atol=1e-5, err_msg=name)
