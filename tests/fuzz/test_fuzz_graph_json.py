"""Fuzz the graph JSON reader and executor creation: only KilnErrors, never anything else.

Seeds are real ``kiln.build`` graphs plus a hand-written two-device one
(``tests/fuzz/corpus/graph_json/``, made by ``python -m tests.fuzz.make_graph_json_corpus``).
Two kinds of mutants:

* structure-aware: the seed is parsed and 1-3 edits are applied at random places in the JSON
  tree — delete a key or item, replace a value with a wrong type / boundary number / deep
  nesting, duplicate an item, point a ``storage_id`` at another entry's storage, give an
  entry a huge shape. These pass the JSON parser and reach the validator's deeper checks.
* raw bytes: :func:`~tests.fuzz.fuzz_support.mutate` (flips, truncation, splices...), which
  exercises the decoder (not UTF-8, not JSON, bad nesting).

Whatever the reader accepts is then turned into an executor against a stub library whose
every function is a no-op, its inputs are set to zeros, and it is run once: a graph the
reader lets through must not crash the executor either. See ``docs/dev/fuzzing.md`` for
longer runs (``KILN_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Callable

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import kiln
from kiln.runtime import dtype as _dtype
from kiln.runtime.graph_executor import LINKED_PARAM_LOOKUP, GraphExecutor, GraphModule
from kiln.runtime.graph_json import load_graph_json
from kiln.runtime.module import Module

from tests.fuzz.fuzz_support import FUZZ_SETTINGS, INTERESTING_INTS, assert_only_kiln_errors, load_corpus, mutate

SEEDS = load_corpus("graph_json")
DOCS = [json.loads(s) for s in SEEDS]

#: Executors built from mutants allocate at most this much (the reader enforces it), so a
#: mutant declaring gigabytes costs a FormatError, not the CI machine's memory.
EXECUTOR_MAX_BYTES = 1 << 20


class NoOpKernels(Module):
    """A library defining every kernel name as a Python no-op (and no linked params)."""

    type_key = "fuzz_noop"

    def _get_local_function(self, name: str) -> Callable[..., None] | None:
        if name == LINKED_PARAM_LOOKUP:
            return None
        return lambda *args: None


LIB = NoOpKernels()


def _read_and_run(data: Any) -> None:
    """Read ``data``; if valid, create an executor, set every input to zeros and run it."""
    load_graph_json(data)  # the default size cap: petabyte shapes must fail here
    graph = load_graph_json(data, max_bytes=EXECUTOR_MAX_BYTES)
    m = GraphModule(GraphExecutor(graph, LIB, [kiln.cpu()]))
    shapes, dtypes = m.get_input_info()
    for name, shape in shapes.items():
        m.set_input(name, np.zeros(shape, _dtype.np_dtype(dtypes[name])))
    m.run()
    for i in range(m.get_num_outputs()):
        m.get_output(i)


# ------------------------------------------------------------------------------------------
# structure-aware mutation
#
# Hypothesis draws one integer per mutant and a seeded ``random.Random`` makes the edits:
# a draw costs far more than an edit, and 10,000 cases must fit in a minute on 2 cores.
# Runs stay deterministic (derandomize=True fixes the integers), and a failure's message
# shows the mutant itself, so nothing is lost by not shrinking the individual edits.


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


_WEIRD_SCALARS: tuple[Any, ...] = (
    None, True, False, -1, 0, 1, 2, 3, 12, -(1 << 63), 10**30, 1 << 50, float("nan"), float("inf"), -0.0, 1.5,
    "", "x", "__nop", "__copy", "null", "tvm_op", "list_int", "list_str", "list_shape", "float32", "int4",
    "bfloat16", "bool", "0", "1", "2", "-1", " 1 ", "1e3", "0x10", "\udcff", "\u00e9\u4e2d", "9" * 5000,
) + INTERESTING_INTS
_WEIRD_CONTAINERS: tuple[Any, ...] = (
    [], {}, [0, 0, 0], [0, 0], [0, 0, 0, 0], [-1, 0, 0], ["list_int", []], ["list_shape", [[1]]],
    [[1, 2], [3]], {"func_name": "__nop"}, {"num_inputs": "1", "num_outputs": "2"},
    _nested(31), _nested(40),
)


def _weird(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(_WEIRD_SCALARS)
    if roll < 0.8:
        return copy.deepcopy(rng.choice(_WEIRD_CONTAINERS))
    return [rng.choice(_WEIRD_SCALARS) for _ in range(rng.randint(0, 4))]


def _paths(doc: Any) -> list[tuple[Any, ...]]:
    """Every path (tuple of keys/indices) into ``doc``, the root ``()`` included."""
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        out.append(path)
        if isinstance(value, dict):
            stack.extend((v, path + (k,)) for k, v in value.items())
        elif isinstance(value, list) and len(path) < 12:  # not into the deep-nesting values
            stack.extend((v, path + (i,)) for i, v in enumerate(value))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _per_entry(doc: Any, key: str) -> list | None:
    attrs = doc.get("attrs") if isinstance(doc, dict) else None
    typed = attrs.get(key) if isinstance(attrs, dict) else None
    if isinstance(typed, list) and len(typed) == 2 and isinstance(typed[1], list) and typed[1]:
        return typed[1]
    return None


def _edit(doc: Any, rng: random.Random) -> Any:
    """Apply one random edit to ``doc`` (in place where possible); returns the new root."""
    kind = rng.choice(("replace", "replace", "delete", "duplicate", "storage", "shape", "int"))
    if kind == "storage" and (sids := _per_entry(doc, "storage_id")):
        # Another entry's storage: a valid reuse, or two live entries in one buffer.
        sids[rng.randrange(len(sids))] = rng.choice(sids)
        return doc
    if kind == "shape" and (shapes := _per_entry(doc, "shape")):
        dims = (0, 1, 3, 1 << 10, 1 << 20, 1 << 31, 1 << 62, 1 << 64)
        shapes[rng.randrange(len(shapes))] = [rng.choice(dims) for _ in range(rng.randint(0, 6))]
        return doc
    paths = _paths(doc)
    if kind == "int":  # nudge a number: off-by-one ids, indices and counts
        ints = [p for p in paths if p and isinstance(_get(doc, p), int)]
        if ints:
            path = rng.choice(ints)
            _get(doc, path[:-1])[path[-1]] += rng.choice((-1, 1, 2, -(1 << 32), 1 << 32))
            return doc
        kind = "replace"
    path = rng.choice(paths)
    if not path:
        return _weird(rng) if kind == "replace" else doc
    parent, key = _get(doc, path[:-1]), path[-1]
    if kind == "delete":
        del parent[key]
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    else:
        parent[key] = _weird(rng)
    return doc


def _structured_mutant(seed: int) -> Any:
    rng = random.Random(seed)
    doc = copy.deepcopy(rng.choice(DOCS))
    for _ in range(rng.randint(1, 3)):
        doc = _edit(doc, rng)
    form = rng.choice(("str", "bytes", "dict"))
    if form == "dict":
        return doc
    # Non-ASCII text unescaped (and lone surrogates as invalid UTF-8 bytes) half the time.
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.05 and "[" in text:
        # Nesting deeper than the JSON parser's own recursion limit (json.dumps cannot write
        # it): a new first item of some list.
        i = rng.choice([k for k, c in enumerate(text) if c == "["])
        depth = rng.choice((33, 999, 5000, 100_000))
        deep = "[" * depth + "]" * depth + ("" if text[i + 1] == "]" else ",")
        text = text[: i + 1] + deep + text[i + 1 :]
    return text if form == "str" else text.encode("utf-8", "surrogatepass")


structured = st.integers(0, 2**64 - 1).map(_structured_mutant)


@st.composite
def raw_bytes(draw: Callable[[Any], Any]) -> bytes:
    return mutate(draw(st.sampled_from(SEEDS)), draw, SEEDS)


# ------------------------------------------------------------------------------------------
# tests


def test_corpus_seeds_load():
    """Every seed reads; the CPU ones also run (the others need an OpenCL device)."""
    for seed in SEEDS:
        graph = load_graph_json(seed)
        if graph.device_index is None or set(graph.device_index) == {1}:
            _read_and_run(seed)


def _as_bytes(data: Any) -> bytes:
    """``data`` as bytes, for the failure message of :func:`assert_only_kiln_errors`."""
    if isinstance(data, bytes):
        return data
    if not isinstance(data, str):
        data = json.dumps(data, default=repr)
    return data.encode("utf-8", "surrogatepass")


@FUZZ_SETTINGS
@given(st.one_of(structured, raw_bytes()))
def test_fuzz_graph_json(data):
    assert_only_kiln_errors(lambda _: _read_and_run(data), _as_bytes(data))
