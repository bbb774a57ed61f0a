"""Checking and timing a compiled model against ONNX Runtime (``run --compare``, ``bench --vs``).

Owns the error measure (max absolute and relative error per output) and the ONNX Runtime
session the commands compare with. ``onnxruntime`` is optional: it is imported only when a
comparison is asked for, and its absence is a one-line error naming the flag.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..runtime.errors import InputError, KilnError
from .args import require_file

__all__ = ["compare_outputs", "require_onnxruntime", "ort_session", "ort_feed", "run_onnxruntime"]


def compare_outputs(ours: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> list[tuple[float, float]]:
    """``(max abs error, max rel error)`` per output; rel = max|a-b| / max|b| (0-safe).

    Outputs of different shapes get ``(inf, inf)``: they can never match.
    """
    res = []
    for a, b in zip(ours, ref):
        a = np.asarray(a).astype(np.float64)
        b = np.asarray(b).astype(np.float64)
        if a.shape != b.shape:
            res.append((float("inf"), float("inf")))
            continue
        if a.size == 0:
            res.append((0.0, 0.0))
            continue
        err = float(np.max(np.abs(a - b)))
        scale = float(np.max(np.abs(b)))
        res.append((err, err / scale if scale > 0 else err))
    return res


def require_onnxruntime(flag: str) -> Any:
    """The ``onnxruntime`` module.

    Raises
    ------
    KilnError
        If it is not installed; the message names ``flag`` and the install command.
    """
    try:
        import onnxruntime
    except ImportError:
        raise KilnError(f"{flag} needs onnxruntime, which is not installed: pip install onnxruntime") from None
    return onnxruntime


def ort_session(model_path: str, threads: int | None = None, flag: str = "--compare") -> Any:
    """An ONNX Runtime CPU session for ``model_path`` (``threads`` intra-op threads, if given).

    Raises
    ------
    KilnError
        If onnxruntime is missing or cannot load the model.
    """
    ort = require_onnxruntime(flag)
    require_file(model_path, "ONNX model")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own (pybind) exception types
        raise KilnError(f"onnxruntime cannot load {model_path}: {' '.join(str(err).split())}") from None


def ort_feed(sess: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The subset of ``inputs`` the ORT session takes.

    Raises
    ------
    InputError
        If the session takes an input that ``inputs`` lacks.
    """
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"the ONNX model takes inputs {missing} that the library does not have")
    return {n: inputs[n] for n in names}


def run_onnxruntime(model_path: str, inputs: Mapping[str, np.ndarray], threads: int | None = None,
                    flag: str = "--compare") -> tuple[list[str], list[np.ndarray]]:
    """Run the model once with ONNX Runtime; returns output names and arrays.

    Raises
    ------
    KilnError
        If onnxruntime is missing, cannot load the model, or rejects the inputs (its own
        exception becomes one line naming ``flag`` and the model).
    """
    sess = ort_session(model_path, threads, flag)
    feed = ort_feed(sess, inputs)
    try:
        outs = sess.run(None, feed)
    except Exception as err:  # noqa: BLE001 - ORT raises its own (pybind) exception types
        detail = " ".join(str(err).split())
        raise KilnError(f"{flag}: onnxruntime rejected the inputs for {model_path}: {type(err).__name__}: "
                        f"{detail}") from err
    return [o.name for o in sess.get_outputs()], [np.asarray(o) for o in outs]
