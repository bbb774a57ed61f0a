"""The node suite's batching (``batching.py``) is honest: batching never changes a case's verdict.

Small cases are built here (the real suite data is never touched): a wrong expected output in one
case of a batch fails exactly that case, with the unbatched suite's error; a case that breaks the
build of its batch fails alone while its batch-mates still pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.onnx_node import batching, node_cases


def _case(name: str, nodes: list[Any], inputs: list[tuple[str, np.ndarray]],
          outputs: list[tuple[str, np.ndarray]], opset: int = 13,
          initializers: list[Any] | None = None) -> node_cases.NodeCase:
    """A NodeCase of a small graph, with one data set ``(inputs, outputs)``."""
    def vi(n: str, a: np.ndarray, dims: list[Any] | None = None) -> Any:
        elem = helper.np_dtype_to_tensor_dtype(a.dtype)
        return helper.make_tensor_value_info(n, elem, list(a.shape) if dims is None else dims)

    graph = helper.make_graph(nodes, name, [vi(n, a) for n, a in inputs],
                              [vi(n, a) for n, a in outputs], initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return node_cases.NodeCase(
        name=name, op=nodes[0].op_type, expanded=False, model_bytes=model.SerializeToString(),
        data_sets=[([a for _, a in inputs], [a for _, a in outputs])], rtol=1e-3, atol=1e-7)


def _cases(wrong: str | None = None) -> dict[str, node_cases.NodeCase]:
    """Four opset-13 cases; ``wrong`` names the one whose expected output is off by one."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype("float32")
    y = rng.standard_normal((2, 3)).astype("float32")
    out = {
        "case_abs": _case("case_abs", [helper.make_node("Abs", ["x"], ["y"])],
                          [("x", x)], [("y", np.abs(x))]),
        "case_add": _case("case_add", [helper.make_node("Add", ["x", "y"], ["z"])],
                          [("x", x), ("y", y)], [("z", x + y)]),
        "case_neg_init": _case(
            "case_neg_init", [helper.make_node("Mul", ["x", "w"], ["y"])], [("x", x)],
            [("y", x * 2)], initializers=[helper.make_tensor("w", TensorProto.FLOAT, [], [2.0])]),
        "case_two_out": _case("case_two_out", [helper.make_node("Neg", ["x"], ["y"]),
                                               helper.make_node("Exp", ["x"], ["e"])],
                              [("x", x)], [("y", -x), ("e", np.exp(x))]),
    }
    if wrong is not None:
        _, expected = out[wrong].data_sets[0]
        expected[-1] = expected[-1] + 1.0
    return out


class _CountingSingles:
    """``run_single`` that records which cases ran alone."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def __call__(self, case: node_cases.NodeCase, backend: Any) -> None:
        self.ran.append(case.name)
        node_cases.run_case(case, backend)


# -- no compiler needed -------------------------------------------------------------------
def test_batch_size_from_env():
    assert batching.batch_size_from_env({}) == batching.DEFAULT_BATCH_SIZE
    assert batching.batch_size_from_env({batching.BATCH_ENV: "1"}) == batching.DEFAULT_BATCH_SIZE
    assert batching.batch_size_from_env({batching.BATCH_ENV: "0"}) == 1
    assert batching.batch_size_from_env({batching.BATCH_ENV: "8"}) == 8
    with pytest.raises(ValueError, match=batching.BATCH_ENV):
        batching.batch_size_from_env({batching.BATCH_ENV: "many"})


def test_merge_prefixes_every_name_and_checks():
    cases = _cases()
    dyn = cases["case_abs"].model
    dyn.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    cases["case_abs"].model_bytes = dyn.SerializeToString()
    model, slots = batching.merge_models(list(cases.values()), 13)
    onnx.checker.check_model(model)
    assert [s.name for s in slots] == list(cases)
    assert slots[2].inputs == ["c2__x"]  # the initializer "w" is not a data input
    assert [(s.first_output, s.num_outputs) for s in slots] == [(0, 1), (1, 1), (2, 1), (3, 2)]
    assert [o.name for o in model.graph.output] == ["c0__y", "c1__z", "c2__y", "c3__y", "c3__e"]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "c0__n"
    assert [t.name for t in model.graph.initializer] == ["c2__w"]


def test_blockers_and_opset_compatibility():
    cases = _cases()
    multi = cases["case_abs"]
    multi.data_sets = multi.data_sets * 2
    assert batching.batch_blocker(multi) == "several data sets"
    seq = cases["case_add"]
    seq.data_sets = [([[np.zeros(2)], np.zeros(2)], seq.data_sets[0][1])]
    assert batching.batch_blocker(seq) == "non-tensor data"
    assert batching.batch_blocker(cases["case_two_out"]) is None
    # Abs is unchanged from opset 13 on; Relu changed at 14 (so opset 13 and 14 differ)
    abs13 = _case("a", [helper.make_node("Abs", ["x"], ["y"])], [("x", np.ones(2, "float32"))],
                  [("y", np.ones(2, "float32"))])
    relu13 = _case("r", [helper.make_node("Relu", ["x"], ["y"])], [("x", np.ones(2, "float32"))],
                   [("y", np.ones(2, "float32"))])
    assert batching.compatible_opsets(abs13, [13, 14, 18]) == {13, 14, 18}
    assert batching.compatible_opsets(relu13, [13, 14, 18]) == {13}


def test_plan_groups_by_compatible_opset_and_splits_evenly():
    x = np.ones(2, "float32")
    cases = {}
    for i in range(5):
        cases[f"abs{i}"] = _case(f"abs{i}", [helper.make_node("Abs", ["x"], ["y"])], [("x", x)],
                                 [("y", x)], opset=13 if i % 2 else 18)
    cases["relu13"] = _case("relu13", [helper.make_node("Relu", ["x"], ["y"])], [("x", x)],
                            [("y", x)], opset=13)
    cases["multi"] = _case("multi", [helper.make_node("Abs", ["x"], ["y"])], [("x", x)], [("y", x)])
    cases["multi"].data_sets *= 2
    batches, single = batching.plan_batches(cases, list(cases) + ["not_a_case"], 4)
    # opset 13 holds all six (Abs reads the same at 13 and 18; Relu only at 13): 3 + 3
    assert [(b.opset, len(b.names)) for b in batches] == [(13, 3), (13, 3)]
    assert single == {"multi": "several data sets"}
    assert batching.plan_batches(cases, list(cases), 1) == ([], {n: "batching disabled" for n in cases})


class _ReferenceBackend:
    """A stand-in backend that runs models with onnx's reference evaluator (no compiler), and
    can pretend that it had to freeze an extra input, as KilnBackend's retry does."""

    def __init__(self, freeze_more: bool = False) -> None:
        self.freeze_more = freeze_more
        self.prepared: list[int] = []  # number of graph outputs of each prepared model

    def prepare(self, model: Any, device: str = "CPU") -> Any:
        from onnx.reference import ReferenceEvaluator

        self.prepared.append(len(model.graph.output))
        evaluator = ReferenceEvaluator(model)
        inits = {t.name for t in model.graph.initializer}
        inputs = [i.name for i in model.graph.input if i.name not in inits]
        freeze_more = self.freeze_more

        class Rep:
            freeze_names: list[str] = []
            last_frozen: list[str] = []

            def run(self, feeds: Any) -> list[Any]:
                if not isinstance(feeds, dict):
                    feeds = dict(zip(inputs, feeds))
                self.last_frozen = [next(iter(feeds))] if freeze_more else []
                return list(evaluator.run(None, feeds))

        return Rep()


def test_merged_model_computes_every_case():
    backend = _ReferenceBackend()
    cases = _cases(wrong="case_add")
    runner = batching.BatchRunner(cases, list(cases), backend, batch_size=8,
                                  run_single=_CountingSingles())
    for name in ("case_abs", "case_neg_init", "case_two_out"):
        runner.check(name)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        runner.check("case_add")
    assert backend.prepared == [5, 1]  # the merged model (5 outputs), then case_add alone


def test_batch_that_needed_extra_frozen_inputs_is_not_trusted():
    backend = _ReferenceBackend(freeze_more=True)
    cases = _cases()
    singles = _CountingSingles()
    runner = batching.BatchRunner(cases, list(cases), backend, batch_size=8, run_single=singles)
    for name in cases:
        runner.check(name)
    # [4] rejected -> [2] + [2] rejected -> every case alone
    assert runner.stats.refrozen == 3 and runner.stats.builds == 0
    assert singles.ran == list(cases)


# -- compiles -----------------------------------------------------------------------------
def test_wrong_expected_output_fails_only_that_case():
    from kiln.frontend.onnx_backend import KilnBackend

    cases = _cases(wrong="case_two_out")
    singles = _CountingSingles()
    runner = batching.BatchRunner(cases, list(cases), KilnBackend, batch_size=8, run_single=singles)
    assert [len(b.names) for b in runner.batches] == [4]
    verdicts: dict[str, str] = {}
    for name in cases:
        try:
            runner.check(name)
            verdicts[name] = "pass"
        except AssertionError as exc:
            verdicts[name] = str(exc)
    assert runner.stats.builds == 1  # one merged build served all four
    assert singles.ran == ["case_two_out"]  # the mismatch was rerun alone, nothing else
    assert {n for n, v in verdicts.items() if v != "pass"} == {"case_two_out"}
    # the same error as the unbatched suite: the second output (index 1, "e") is off
    assert "Not equal to tolerance" in verdicts["case_two_out"]
    with pytest.raises(AssertionError) as alone:
        node_cases.run_case(cases["case_two_out"], KilnBackend)
    assert str(alone.value) == verdicts["case_two_out"]


def test_case_that_breaks_its_batch_fails_alone():
    from kiln.frontend.onnx_backend import KilnBackend
    from kiln.runtime.errors import UnsupportedOpError

    class _Refusing(KilnBackend):
        """Kiln's backend, refusing models with a node named ``*refuse_me`` as an unsupported op
        would (any real op may be supported some day; this case must keep failing)."""

        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            if any(n.name.endswith("refuse_me") for n in model.graph.node):
                raise UnsupportedOpError("the model uses 1 unsupported ONNX op type(s): refuse_me")
            return super().prepare(model, device, **kwargs)

    cases = _cases()
    x = np.eye(2, dtype="float32")
    # the merged model fails to import, so the batch is split
    cases["case_zz_det"] = _case("case_zz_det", [helper.make_node("Neg", ["x"], ["y"], name="refuse_me")],
                                 [("x", x)], [("y", -x)])
    singles = _CountingSingles()
    runner = batching.BatchRunner(cases, list(cases), _Refusing, batch_size=8, run_single=singles)
    failed = []
    for name in cases:
        try:
            runner.check(name)
        except Exception as exc:  # noqa: BLE001 - whatever the single path raises
            failed.append((name, type(exc).__name__))
    assert failed == [("case_zz_det", "UnsupportedOpError")]
    # halving: 5 cases (fail) -> [abs, add] (built) + [neg_init, two_out, zz_det] (fail)
    # -> [neg_init] alone + [two_out, zz_det] (fail) -> each alone
    assert runner.stats.builds == 1 and len(runner.stats.failed_builds) == 3
    assert runner.stats.passed_in_batch == 2
    assert singles.ran == ["case_neg_init", "case_two_out", "case_zz_det"]
