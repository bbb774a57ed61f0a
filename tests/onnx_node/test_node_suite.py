"""onnx's backend node test suite, run through Kiln's ONNX backend (``KilnBackend``).

One test per case in ``included_cases.INCLUDED`` (every case Kiln passed in the last
``tools/op_coverage.py`` run, so a failure here is a regression). Each case prepares the model
with ``KilnBackend.prepare``, runs every data set and compares with the suite's expected outputs
and tolerances (``Runner.assert_similar_outputs``).

Cases are compiled in batches (see ``batching.py``): the first test of a batch builds one model
holding all of its cases and records which of them matched; the others only read their verdict.
A case that did not pass in its batch is run alone by its own test, exactly as without batching,
so a failure names the case and shows the same mismatch. ``KILN_NODE_SUITE_BATCH=0`` turns
batching off (every case built alone); ``KILN_NODE_SUITE_BATCH=N`` sets the batch size.
"""

from __future__ import annotations

import pytest

from tests.onnx_node import node_cases
from tests.onnx_node.included_cases import INCLUDED, SLOW


def _params():
    for name in INCLUDED:
        marks = [pytest.mark.slow] if name in SLOW else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_node(name, node_suite_cases, request):
    if name in SLOW and not node_cases.run_slow(request.config):
        pytest.skip("slow case left out by KILN_NODE_SUITE_FAST=1 / -m \"not slow\"")
    if node_suite_cases.get(name) is None:
        pytest.skip(f"{name} is not in this onnx version's node suite")
    # (requested here, after the skips, so a run that skips every case never plans batches)
    request.getfixturevalue("node_batch_runner").check(name)


def test_every_op_has_a_default_case():
    """At least one case per measured op runs in the default (non-slow) run."""
    cases = node_cases.load_cases()
    ops = {cases[n].op for n in INCLUDED if n in cases and n not in SLOW}
    passing_ops = {cases[n].op for n in INCLUDED if n in cases}
    assert passing_ops <= ops, sorted(passing_ops - ops)
