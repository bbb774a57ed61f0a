"""ONNX backend *node* test cases, for Kiln's node-suite tests and ``tools/op_coverage.py``.

onnx >= 1.16 no longer ships the node cases as ``data/node/*/model.onnx`` files; it generates them
in memory when ``onnx.backend.test.case.node`` is imported (``load_model_tests(kind="node")``),
which takes ~15-45 s (the pooling references are pure Python). We generate every case of the
installed onnx's node suite once and cache them as one pickle per onnx version:

    $KILN_ONNX_NODE_CACHE  or  $KILN_CACHE_DIR/onnx_node  or  ~/.cache/kiln/onnx_node

A case's op is its single node's op type (``domain.OpType`` outside the default domain);
``*_expanded`` cases (the op's function body) count for the base case's op.

Outputs are compared exactly as the suite does (``Runner.assert_similar_outputs``, per-case
rtol/atol; 1e-3 / 1e-7 by default).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import tempfile
import warnings
from typing import Any

import numpy as np

# The ops of the first coverage goal (kept for reference; the suite and the report now cover
# every case of the installed onnx's node suite).
OPS: tuple[str, ...] = (
    "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization",
    "LayerNormalization", "Relu", "LeakyRelu", "PRelu", "Elu", "Clip", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Gelu", "Erf", "Softmax", "LogSoftmax", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Log",
    "Neg", "Abs", "Reciprocal", "Min", "Max", "Sum", "Mean", "ReduceMean", "ReduceSum",
    "ReduceMax", "ReduceMin", "ReduceProd", "Reshape", "Transpose", "Concat", "Split", "Slice",
    "Gather", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Tile", "Pad", "Shape", "Size", "Cast",
    "Constant", "ConstantOfShape", "Identity", "Dropout", "Where", "Equal", "Less", "Greater",
    "Not", "And", "Or", "IsNaN", "Range", "Resize", "ArgMax", "TopK", "LRN", "Einsum",
)

_CACHE_FORMAT = 2  # 2: every case of the suite (1 held only the cases of OPS)
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclasses.dataclass
class NodeCase:
    name: str
    op: str  # the op under test (the single node's op type; for *_expanded cases, the base op)
    expanded: bool  # the model is the op's function body (several nodes of other ops)
    model_bytes: bytes
    data_sets: list[tuple[list[Any], list[Any]]]  # [(inputs, expected outputs)], NumPy values
    rtol: float
    atol: float

    @property
    def model(self):
        import onnx

        return onnx.load_from_string(self.model_bytes)


def cache_path() -> str:
    import onnx

    base = os.environ.get("KILN_ONNX_NODE_CACHE")
    if not base:
        root = os.environ.get("KILN_CACHE_DIR") or os.path.join(
            os.path.expanduser("~"), ".cache", "kiln")
        base = os.path.join(root, "onnx_node")
    return os.path.join(base, f"node_cases-onnx{onnx.__version__}-v{_CACHE_FORMAT}.pkl")


def case_op(model: Any) -> str:
    """The op a (non-expanded) case tests: its node's op type, ``domain.OpType`` outside the
    default domain, ``+``-joined op types for a case of several nodes (none in onnx 1.23)."""
    ops = []
    for node in model.graph.node:
        name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if name not in ops:
            ops.append(name)
    return "+".join(ops) or "?"


def _generate() -> dict[str, NodeCase]:
    from onnx.backend.test.loader import load_model_tests
    from onnx.backend.test.runner import _normalize_tensor

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        tests = load_model_tests(kind="node")
    base_op: dict[str, str] = {}
    for t in tests:
        if not _EXPANDED.search(t.name):
            base_op[t.name] = case_op(t.model)
    out: dict[str, NodeCase] = {}
    for t in tests:
        expanded = bool(_EXPANDED.search(t.name))
        # an expanded case whose base case is missing keeps its own (multi-node) description
        op = base_op.get(_EXPANDED.sub("", t.name)) if expanded else base_op.get(t.name)
        if op is None:
            op = case_op(t.model)

        def norm(v):
            return [_normalize_tensor(x) if not isinstance(x, (list, tuple)) and x is not None
                    else x for x in v]

        out[t.name] = NodeCase(
            name=t.name, op=op, expanded=expanded, model_bytes=t.model.SerializeToString(),
            data_sets=[(norm(i), norm(o)) for i, o in t.data_sets],
            rtol=float(t.rtol), atol=float(t.atol))
    return out


_CASES: dict[str, NodeCase] | None = None


def load_cases() -> dict[str, NodeCase]:
    """Every node case of the installed onnx's suite, by name (generated once, then cached on disk)."""
    global _CASES
    if _CASES is not None:
        return _CASES
    path = cache_path()
    try:
        with open(path, "rb") as f:
            _CASES = pickle.load(f)
        return _CASES
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):  # missing or stale cache
        pass
    cases = _generate()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(cases, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # atomic: parallel workers never read half a file
    except OSError:
        pass
    _CASES = cases
    return cases


def assert_outputs(case: NodeCase, ref_outputs: list[Any], outputs: list[Any]) -> None:
    """The suite's own comparison (shape, dtype, then allclose with the case's rtol/atol)."""
    from onnx.backend.test.runner import Runner

    Runner.assert_similar_outputs(ref_outputs, list(outputs), rtol=case.rtol, atol=case.atol,
                                  model_dir=case.name)


def run_slow(config) -> bool:
    """Whether slow node cases run: yes by default (CI runs the whole included list); a quick
    local run can leave them out with ``KILN_NODE_SUITE_FAST=1`` or ``-m "not slow"``."""
    if os.environ.get("KILN_NODE_SUITE_FAST", "") not in ("", "0"):
        return False
    expr = (config.getoption("markexpr", "") or "").replace(" ", "")
    return "notslow" not in expr


def run_case(case: NodeCase, backend) -> None:
    """Prepare ``case`` with ``backend`` (an onnx Backend class) and check every data set."""
    rep = backend.prepare(case.model, "CPU")
    for inputs, ref_outputs in case.data_sets:
        outputs = rep.run(inputs)
        assert_outputs(case, ref_outputs, outputs)


def run_case_isolated(name: str, timeout: float) -> tuple[bool, str]:
    """Run case ``name`` in a fresh Python process (for cases that crash or hang Kiln).

    Parameters
    ----------
    name : str
        A case of :func:`load_cases` (the child reads the same on-disk cache).
    timeout : float
        Seconds before the child is killed; a killed child counts as a failure.

    Returns
    -------
    passed : bool
        Whether the case passed.
    why : str
        For a failure: the child's last output lines, its exit code or the time limit.
    """
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.onnx_node.node_cases", name], cwd=root,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
    return proc.returncode == 0, f"exit code {proc.returncode}: {tail[-400:]}"


def _main(argv: list[str]) -> int:
    """``python -m tests.onnx_node.node_cases CASE``: exit 0 when Kiln passes CASE, else 1."""
    from kiln.frontend.onnx_backend import KilnBackend

    case = load_cases()[argv[0]]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_case(case, KilnBackend)
    except Exception as err:  # noqa: BLE001 - any failure is the verdict, reported to the parent
        print(f"FAIL {case.name}: {type(err).__name__}: {err}")
        return 1
    print(f"PASS {case.name}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
