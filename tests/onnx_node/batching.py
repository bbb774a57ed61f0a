"""Batched compilation of ONNX node-suite cases: many cases, one Kiln build.

Building (``from_onnx`` → ``kiln.build`` → LLVM object → shared library) dominates the node
suite's time, and much of it is paid once per *model* whatever the model's size. So the suite
merges the graphs of many cases into one ``ModelProto`` (every value, node and ``dim_param`` name
prefixed per case, ``c<k>__``), prepares and runs it once with every case's inputs, and compares
each case's slice of the outputs with that case's expected outputs (``node_cases.assert_outputs``,
the suite's own comparison and tolerances).

Invariants, so a batched pass means exactly what a single pass means:

* a case joins a batch only if the merge can express it (:func:`batch_blocker` says why not:
  several data sets, non-tensor types, subgraph attributes, model-local functions, ...);
* cases share a batch only if every node of every case resolves to the same operator schema
  version at the batch's opset as at the case's own opset (:func:`compatible_opsets`); the
  batch's opset is one that a member case uses itself;
* a batch that raises anywhere (check, import, build, load, run) is split in halves and retried,
  down to single cases, so one bad case never fails or hides the others. So is a batch that the
  backend compiled only after freezing extra inputs (its retry for the frontend's "needs a
  constant" errors), since that retry would apply to every case of the batch;
* only passes are taken from a batch. A case whose batched outputs mismatch, or whose batch could
  not be built, is run alone by its own test exactly as without batching
  (``node_cases.run_case``), so every failure is reported with today's information; a case that
  fails in its batch but passes alone raises a warning (that would be a Kiln bug in combining
  independent graphs).

Environment: ``KILN_NODE_SUITE_BATCH`` — unset or ``1``: batches of :data:`DEFAULT_BATCH_SIZE`
cases; ``0``: no batching (one build per case, the reference mode); ``N`` > 1: batches of at most
N cases.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tests.onnx_node import node_cases

__all__ = ["DEFAULT_BATCH_SIZE", "BATCH_ENV", "batch_size_from_env", "batch_blocker",
           "compatible_opsets", "plan_batches", "merge_models", "BatchRunner", "Batch", "Stats"]

#: Environment variable that sets the batch size (``0`` disables batching).
BATCH_ENV = "KILN_NODE_SUITE_BATCH"
#: Cases per batch when ``$KILN_NODE_SUITE_BATCH`` is unset or ``1``. Measured on the full suite
#: (``pytest tests/onnx_node``, 2 shared cores, load ~3): 64 → 68 s wall, 48 → 80 s, 32 → 83 s,
#: unbatched → 217 s. The price of larger batches is a longer split-and-retry when a batch fails
#: to build (about two batch builds' worth).
DEFAULT_BATCH_SIZE = 64

_DEFAULT_DOMAINS = ("", "ai.onnx")


def batch_size_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The batch size ``$KILN_NODE_SUITE_BATCH`` asks for (1 means no batching).

    Parameters
    ----------
    environ : Mapping[str, str], optional
        Environment to read; ``os.environ`` by default.

    Returns
    -------
    int
        ``1`` when batching is off (``0``), :data:`DEFAULT_BATCH_SIZE` when the variable is
        unset, empty or ``1``, else the number given.
    """
    env = os.environ if environ is None else environ
    raw = env.get(BATCH_ENV, "").strip()
    if raw in ("", "1"):
        return DEFAULT_BATCH_SIZE
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"${BATCH_ENV} must be an integer (0 = off), got {raw!r}") from None
    return max(value, 1)


# -- what can be merged -----------------------------------------------------------------------
def _default_opset(model: Any) -> int:
    for imp in model.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            return int(imp.version)
    return 1


def _other_opsets(model: Any) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((imp.domain, int(imp.version)) for imp in model.opset_import
                        if imp.domain not in _DEFAULT_DOMAINS))


def _data_input_names(model: Any, n_values: int) -> list[str] | None:
    # The data sets feed either the inputs that are not initializers or every input, as
    # KilnBackendRep accepts both; anything else is left to the single path to report.
    inits = {t.name for t in model.graph.initializer}
    every = [i.name for i in model.graph.input]
    plain = [n for n in every if n not in inits]
    if n_values == len(plain):
        return plain
    if n_values == len(every):
        return every
    return None


def batch_blocker(case: node_cases.NodeCase) -> str | None:
    """Why ``case`` cannot share a compiled model with other cases (None: it can).

    Parameters
    ----------
    case : node_cases.NodeCase
        The case to inspect.

    Returns
    -------
    str or None
        A short reason, or None when the merge can express the case.
    """
    from onnx import AttributeProto

    if len(case.data_sets) != 1:
        return "several data sets"
    model = case.model
    graph = model.graph
    if model.functions:
        return "model-local functions"
    if len(model.training_info):
        return "training info"
    if len(graph.sparse_initializer):
        return "sparse initializer"
    for vi in list(graph.input) + list(graph.output):
        if vi.type.WhichOneof("value") != "tensor_type":
            return "non-tensor input/output type"
    for node in graph.node:
        if node.domain not in _DEFAULT_DOMAINS:
            return f"node of domain {node.domain!r}"
        for attr in node.attribute:
            if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) or attr.ref_attr_name:
                return "subgraph or referenced attribute"
    inputs, outputs = case.data_sets[0]
    # 0-d values come as NumPy scalars; lists (sequences) and None (optionals) cannot be merged
    if any(not isinstance(v, (np.ndarray, np.generic)) for v in list(inputs) + list(outputs)):
        return "non-tensor data"
    if _data_input_names(model, len(inputs)) is None:
        return "data set does not match the graph inputs"
    if len(outputs) != len(graph.output):
        return "data set does not match the graph outputs"
    out_names = [o.name for o in graph.output]
    sources = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    if len(set(out_names)) != len(out_names) or sources & set(out_names):
        return "an output is repeated or is a graph input/initializer"
    if _schema_versions(model, _default_opset(model)) is None:
        return "an op has no schema at the case's opset"
    return None


def _since_version(op_type: str, opset: int) -> int | None:
    from onnx import defs

    try:
        return int(defs.get_schema(op_type, opset, "").since_version)
    except Exception:  # noqa: BLE001 - SchemaError (not defined at that opset) means "no schema"
        return None


def _schema_versions(model: Any, opset: int) -> dict[str, int] | None:
    out: dict[str, int] = {}
    for op in {n.op_type for n in model.graph.node}:
        since = _since_version(op, opset)
        if since is None:
            return None
        out[op] = since
    return out


def compatible_opsets(case: node_cases.NodeCase, candidates: Iterable[int]) -> set[int]:
    """The default-domain opsets at which ``case``'s nodes mean what they mean at its own.

    Parameters
    ----------
    case : node_cases.NodeCase
        The case.
    candidates : Iterable[int]
        Opsets to try.

    Returns
    -------
    set[int]
        Every candidate at which each op of the case resolves to the same schema version as at
        the case's own opset (the case's own opset is always included).
    """
    model = case.model
    own = _default_opset(model)
    ref = _schema_versions(model, own)
    ok = {own}
    if ref is None:  # the frontend falls back to the newest schema: keep the exact opset
        return ok
    for opset in candidates:
        if all(_since_version(op, opset) == since for op, since in ref.items()):
            ok.add(opset)
    return ok


# -- planning -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Batch:
    """Cases compiled together: their names and the default-domain opset of the merged model."""

    names: list[str]
    opset: int
    other_opsets: tuple[tuple[str, int], ...] = ()


def plan_batches(cases: Mapping[str, node_cases.NodeCase], names: Sequence[str],
                 batch_size: int) -> tuple[list[Batch], dict[str, str]]:
    """Split ``names`` into batches of opset-compatible, mergeable cases.

    Parameters
    ----------
    cases : Mapping[str, node_cases.NodeCase]
        Every known case by name.
    names : Sequence[str]
        The cases to run (unknown names are ignored).
    batch_size : int
        Most cases per batch; ``1`` plans no batch.

    Returns
    -------
    batches : list[Batch]
        Batches of at least two cases each.
    single : dict[str, str]
        The cases that run alone, with the reason.
    """
    single: dict[str, str] = {}
    if batch_size <= 1:
        return [], {n: "batching disabled" for n in names if n in cases}
    groups: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for name in names:
        case = cases.get(name)
        if case is None:
            continue
        why = batch_blocker(case)
        if why is not None:
            single[name] = why
            continue
        groups.setdefault(_other_opsets(case.model), []).append(name)
    batches: list[Batch] = []
    for others, members in sorted(groups.items()):
        own = {n: _default_opset(cases[n].model) for n in members}
        candidates = sorted(set(own.values()))
        fits = {n: compatible_opsets(cases[n], candidates) for n in members}
        left = set(members)
        while left:
            # Greedy cover: the opset that the most remaining cases can be compiled at (newest
            # on a tie) takes them all; it is always some member's own opset.
            opset = max(candidates, key=lambda o: (sum(o in fits[n] for n in left), o))
            taken = sorted(n for n in left if opset in fits[n])
            left -= set(taken)
            # Even chunks: 33 cases at size 32 become 17 + 16, not 32 + 1.
            n_chunks = math.ceil(len(taken) / batch_size)
            small, extra = divmod(len(taken), n_chunks)
            start = 0
            for i in range(n_chunks):
                chunk = taken[start:start + small + (i < extra)]
                start += len(chunk)
                if len(chunk) == 1:
                    single[chunk[0]] = "no batch-mate at a compatible opset"
                else:
                    batches.append(Batch(chunk, opset, others))
    return batches, single


# -- merging ------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Slot:
    """Where one case lives in a merged model."""

    name: str
    inputs: list[str]  # merged names of the values its data set feeds, in data-set order
    first_output: int
    num_outputs: int


def _prefixed_graph(graph: Any, prefix: str) -> Any:
    """A copy of ``graph`` with every value, node and dim_param name prefixed."""
    g = type(graph)()
    g.CopyFrom(graph)

    def ren(name: str) -> str:
        return prefix + name if name else name  # "" marks an omitted optional operand

    def ren_type(tp: Any) -> None:
        if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.HasField("shape"):
            for dim in tp.tensor_type.shape.dim:
                if dim.HasField("dim_param"):
                    dim.dim_param = ren(dim.dim_param)

    for vi in list(g.input) + list(g.output) + list(g.value_info):
        vi.name = ren(vi.name)
        ren_type(vi.type)
    for init in g.initializer:
        init.name = ren(init.name)
    for node in g.node:
        node.name = ren(node.name)
        node.input[:] = [ren(x) for x in node.input]
        node.output[:] = [ren(x) for x in node.output]
    return g


def merge_models(cases: Sequence[node_cases.NodeCase], opset: int,
                 other_opsets: Sequence[tuple[str, int]] = ()) -> tuple[Any, list[_Slot]]:
    """One model that computes every case of ``cases`` side by side.

    Parameters
    ----------
    cases : Sequence[node_cases.NodeCase]
        Mergeable cases (see :func:`batch_blocker`) that are all valid at ``opset``.
    opset : int
        Default-domain opset of the merged model.
    other_opsets : Sequence[tuple[str, int]]
        Imports of other domains, shared by every case.

    Returns
    -------
    model : onnx.ModelProto
        The merged model; case ``k``'s names carry the prefix ``c<k>__``.
    slots : list
        Per case: the merged names of its data inputs and the range of its outputs.
    """
    from onnx import helper

    graph = helper.make_graph([], "kiln_node_batch", [], [])
    slots: list[_Slot] = []
    ir_version = 3
    for k, case in enumerate(cases):
        model = case.model
        ir_version = max(ir_version, int(model.ir_version))
        prefix = f"c{k}__"
        names = _data_input_names(model, len(case.data_sets[0][0]))
        if names is None:
            raise ValueError(f"{case.name}: data set does not match the graph inputs")
        g = _prefixed_graph(model.graph, prefix)
        slots.append(_Slot(case.name, [prefix + n for n in names], len(graph.output),
                           len(g.output)))
        graph.input.extend(g.input)
        graph.output.extend(g.output)
        graph.initializer.extend(g.initializer)
        graph.value_info.extend(g.value_info)
        graph.node.extend(g.node)
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in other_opsets]
    merged = helper.make_model(graph, opset_imports=imports, producer_name="kiln-node-batch")
    merged.ir_version = ir_version
    return merged, slots


# -- running ------------------------------------------------------------------------------------
class _FrozeMore(RuntimeError):
    """A batch compiled only after the backend froze extra inputs (see ``_run_merged``)."""


@dataclasses.dataclass
class Stats:
    """What the runner did (reported at the end of the session)."""

    batches_planned: int = 0
    cases_planned: int = 0
    builds: int = 0  # merged models built, run and accepted
    build_seconds: list[float] = dataclasses.field(default_factory=list)  # per merged build
    refrozen: int = 0  # merged builds rejected: they needed the backend's freeze-more retry
    failed_builds: list[str] = dataclasses.field(default_factory=list)  # "n cases: error"
    passed_in_batch: int = 0
    single: dict[str, str] = dataclasses.field(default_factory=dict)  # case -> why alone
    batch_only_failures: list[str] = dataclasses.field(default_factory=list)


class BatchRunner:
    """Runs node cases in batches on demand and remembers each case's batched verdict.

    Parameters
    ----------
    cases : Mapping[str, node_cases.NodeCase]
        Every known case by name.
    names : Sequence[str]
        The cases this session runs, in run order (only these are built).
    backend : type
        The ONNX backend class (``KilnBackend``).
    batch_size : int, optional
        Most cases per batch; default from ``$KILN_NODE_SUITE_BATCH``.
    run_single : callable, optional
        ``run_single(case, backend)`` runs one case alone and raises on failure;
        ``node_cases.run_case`` by default.
    """

    def __init__(self, cases: Mapping[str, node_cases.NodeCase], names: Sequence[str],
                 backend: Any, batch_size: int | None = None,
                 run_single: Callable[[node_cases.NodeCase, Any], None] | None = None) -> None:
        self.cases = cases
        self.backend = backend
        self.batch_size = batch_size_from_env() if batch_size is None else batch_size
        self.run_single = run_single or node_cases.run_case
        batches, single = plan_batches(cases, names, self.batch_size)
        self.stats = Stats(len(batches), sum(len(b.names) for b in batches), single=dict(single))
        self._batch_of: dict[str, Batch] = {n: b for b in batches for n in b.names}
        self._passed: set[str] = set()  # cases whose batched outputs matched
        self._mismatched: dict[str, str] = {}  # case -> batched mismatch message
        self._done: set[int] = set()  # ids of batches already run

    @property
    def batches(self) -> list[Batch]:
        """The planned batches, in plan order."""
        seen: dict[int, Batch] = {}
        for b in self._batch_of.values():
            seen.setdefault(id(b), b)
        return list(seen.values())

    def check(self, name: str) -> None:
        """Assert that case ``name`` passes: from its batch if it passed there, else alone.

        Parameters
        ----------
        name : str
            A case name of ``cases``.

        Raises
        ------
        AssertionError or Exception
            Whatever running the case alone raises (the unbatched suite's failure).
        """
        batch = self._batch_of.get(name)
        if batch is not None and id(batch) not in self._done:
            self._done.add(id(batch))
            self._run_group(batch.names, batch)
        if name in self._passed:
            return
        # Alone, exactly as the unbatched suite runs it: failures carry the same information.
        self.run_single(self.cases[name], self.backend)
        if name in self._mismatched:
            msg = (f"{name} passes alone but failed in its batch: "
                   f"{self._mismatched[name][:400]}")
            self.stats.batch_only_failures.append(name)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)

    def _run_group(self, names: list[str], batch: Batch) -> None:
        if len(names) == 1:
            self.stats.single.setdefault(names[0], "its batch failed to build or run")
            return
        try:
            self._run_merged(names, batch)
        except Exception as exc:  # noqa: BLE001 - any failure: split, so one case cannot hide others
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            self.stats.failed_builds.append(f"{len(names)} cases ({names[0]}..): "
                                            f"{type(exc).__name__}: {first[:200]}")
            half = len(names) // 2
            self._run_group(names[:half], batch)
            self._run_group(names[half:], batch)

    def _run_merged(self, names: list[str], batch: Batch) -> None:
        members = [self.cases[n] for n in names]
        model, slots = merge_models(members, batch.opset, batch.other_opsets)
        rep = self.backend.prepare(model, "CPU")
        feeds: dict[str, Any] = {}
        for case, slot in zip(members, slots):
            feeds.update(zip(slot.inputs, case.data_sets[0][0]))
        start = time.perf_counter()
        outputs = list(rep.run(feeds))
        self.stats.build_seconds.append(time.perf_counter() - start)
        if set(rep.last_frozen) - set(rep.freeze_names):
            # The backend retried with every non-float input of the *whole batch* frozen, which
            # may hide a case that fails alone: treat it as a failed batch (split it).
            self.stats.refrozen += 1
            raise _FrozeMore(f"the batch needed extra frozen inputs {sorted(rep.last_frozen)}")
        del rep  # free the compiled module before the next batch builds
        self.stats.builds += 1
        for case, slot in zip(members, slots):
            got = outputs[slot.first_output:slot.first_output + slot.num_outputs]
            try:
                node_cases.assert_outputs(case, case.data_sets[0][1], got)
            except Exception as exc:  # noqa: BLE001 - any mismatch: the case is rerun alone
                self._mismatched[case.name] = f"{type(exc).__name__}: {exc}"
                self.stats.single[case.name] = "mismatch in its batch"
            else:
                self._passed.add(case.name)
                self.stats.passed_in_batch += 1

    def summary(self) -> list[str]:
        """Lines describing what was batched, for the end-of-session report."""
        s = self.stats
        why: dict[str, int] = {}
        for reason in s.single.values():
            why[reason] = why.get(reason, 0) + 1
        lines = [f"node-suite batching: batch size {self.batch_size}, {s.batches_planned} batches "
                 f"planned ({s.cases_planned} cases), {s.builds} merged builds, "
                 f"{s.passed_in_batch} cases passed in a batch, {len(s.single)} ran alone"]
        if s.build_seconds:
            lines.append(f"  merged builds: {sum(s.build_seconds):.1f} s in all, slowest "
                         f"{max(s.build_seconds):.1f} s; {s.refrozen} rejected for freezing extra inputs")
        lines += [f"  alone: {n} x {r}" for r, n in sorted(why.items(), key=lambda kv: -kv[1])]
        lines += [f"  failed batch: {f}" for f in s.failed_builds]
        if s.batch_only_failures:
            lines.append(f"  failed only in a batch: {', '.join(s.batch_only_failures)}")
        return lines
