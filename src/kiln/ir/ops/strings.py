"""IR ops on string tensors, run by the executor as host ops (``docs/strings.md``).

Each op here is OPAQUE (never fused) and is lowered to a graph-JSON node with the reserved
function ``__host``: the runtime's registry (:mod:`kiln.runtime.strings`) holds the one
implementation, which also serves as the op's NumPy reference. Generated kernels never see a
string tensor.

* ``string_concat(x, y)``: element-wise ``x + y`` with broadcasting.
* ``string_equal(x, y)``: element-wise ``x == y`` (bool) with broadcasting.
* ``regex_full_match(x; pattern)``: whether each element matches ``pattern`` (RE2 syntax,
  run by Python's ``re``; syntax the two read differently is refused).
* ``string_normalizer(x; case_change_action, is_case_sensitive, stopwords)``: ONNX
  StringNormalizer whose stopwords remove nothing from this input's shape (the frontend
  evaluates the op at import when they would; the output shape is then data-dependent).
* ``label_encoder(x; keys, values, default, keys_dtype, values_dtype)``: ai.onnx.ml
  LabelEncoder with string keys or values.
* ``cast_string(x; dtype)``: Cast from numbers (or bool) to strings or from strings to numbers.

This module must not import the compiler (topi, driver) or the runtime executor.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ...runtime import strings as _rs
from ...runtime.dtype import STRING
from ...runtime.errors import InputError
from ..op import REQUIRED, OpPattern, register_op
from ..types import TensorType
from ._util import Attrs, broadcast_shapes

__all__ = ["HOST_OPS", "host_attrs"]

#: IR op -> the runtime host op that runs it (``attrs.host_op`` of its ``__host`` node).
HOST_OPS = {
    "string_concat": "string_concat",
    "string_equal": "string_equal",
    "regex_full_match": "regex_full_match",
    "string_normalizer": "string_normalizer",
    "label_encoder": "label_encoder",
    "cast_string": "cast_string",
}


def _json_value(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_json_value(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def host_attrs(op: str, attrs: Attrs) -> dict[str, str]:
    """The graph-JSON attributes of the ``__host`` node running IR op ``op``.

    Returns
    -------
    dict
        ``{"host_op": name, "host_attrs": JSON text of the op's attributes}``.
    """
    return {
        "host_op": HOST_OPS[op],
        "host_attrs": json.dumps({k: _json_value(v) for k, v in attrs.items()}, sort_keys=True),
    }


def _strings(t: TensorType, what: str) -> None:
    if t.dtype != STRING:
        raise InputError(f"{what} must be a string tensor, got {t}")


def _run(op: str, xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    return _rs.get_host_op(HOST_OPS[op])(list(xs), json.loads(host_attrs(op, attrs)["host_attrs"]))


# ----------------------------------------------------------------------------- binary
def _binary_rel(out_dtype: str):
    def rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
        _strings(ts[0], "X")
        _strings(ts[1], "Y")
        return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), out_dtype)]

    return rel


register_op(
    "string_concat",
    type_rel=_binary_rel(STRING),
    pattern=OpPattern.OPAQUE,
    num_inputs=2,
    ref=lambda xs, a: _run("string_concat", xs, a),
    inputs=("x", "y"),
    doc="element-wise string concatenation x + y (broadcasting); a host op",
)
register_op(
    "string_equal",
    type_rel=_binary_rel("bool"),
    pattern=OpPattern.OPAQUE,
    num_inputs=2,
    ref=lambda xs, a: _run("string_equal", xs, a),
    inputs=("x", "y"),
    doc="element-wise string equality (broadcasting), bool result; a host op",
)


# ----------------------------------------------------------------------------- unary
def _regex_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    _strings(ts[0], "X")
    _rs.check_regex(attrs["pattern"])
    return [TensorType(ts[0].shape, "bool")]


register_op(
    "regex_full_match",
    attrs={"pattern": ("str", REQUIRED)},
    type_rel=_regex_rel,
    pattern=OpPattern.OPAQUE,
    ref=lambda xs, a: _run("regex_full_match", xs, a),
    inputs=("x",),
    doc="whether each string fully matches pattern (RE2 syntax common to Python's re); a host op",
)

_CASE_ACTIONS = ("NONE", "LOWER", "UPPER")


def _normalizer_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    _strings(ts[0], "X")
    if attrs["case_change_action"] not in _CASE_ACTIONS:
        raise InputError(
            f"case_change_action must be one of {', '.join(_CASE_ACTIONS)}, got {attrs['case_change_action']!r}"
        )
    if attrs["stopwords"]:
        raise InputError(
            "string_normalizer with stopwords has a data-dependent output shape; "
            "it is evaluated at import when its input is constant"
        )
    return [ts[0]]


register_op(
    "string_normalizer",
    attrs={"case_change_action": ("str", "NONE"), "is_case_sensitive": ("bool", False), "stopwords": ("any", ())},
    type_rel=_normalizer_rel,
    pattern=OpPattern.OPAQUE,
    inputs=("x",),
    ref=lambda xs, a: _run("string_normalizer", xs, a),
    doc="ONNX StringNormalizer without stopwords (case change only); a host op",
)


def _encoder_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    kd, vd = attrs["keys_dtype"], attrs["values_dtype"]
    if ts[0].dtype != kd:
        raise InputError(f"X is {ts[0]}, the keys are {kd}")
    if len(attrs["keys"]) != len(attrs["values"]):
        raise InputError(f"{len(attrs['keys'])} keys but {len(attrs['values'])} values")
    for what, vals, dt in (
        ("keys", attrs["keys"], kd),
        ("values", attrs["values"], vd),
        ("default", (attrs["default"],), vd),
    ):
        if dt == STRING and not all(isinstance(v, str) for v in vals):
            raise InputError(f"{what} must all be strings")
        if dt != STRING and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            raise InputError(f"{what} must all be numbers")
    return [TensorType(ts[0].shape, vd)]


register_op(
    "label_encoder",
    attrs={
        "keys": ("any", REQUIRED),
        "values": ("any", REQUIRED),
        "default": ("any", REQUIRED),
        "keys_dtype": ("dtype", REQUIRED),
        "values_dtype": ("dtype", REQUIRED),
    },
    type_rel=_encoder_rel,
    pattern=OpPattern.OPAQUE,
    inputs=("x",),
    ref=lambda xs, a: _run("label_encoder", xs, a),
    doc="ai.onnx.ml LabelEncoder with string keys or values: values[k] where x == keys[k], else default; a host op",
)


def _cast_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    src, dst = ts[0].dtype, attrs["dtype"]
    if (src == STRING) == (dst == STRING) and src != dst:
        raise InputError(f"cast_string converts to or from strings, not {src} to {dst}")
    return [TensorType(ts[0].shape, dst)]


register_op(
    "cast_string",
    attrs={"dtype": ("dtype", REQUIRED)},
    type_rel=_cast_rel,
    pattern=OpPattern.OPAQUE,
    inputs=("x",),
    ref=lambda xs, a: _run("cast_string", xs, a),
    doc="Cast numbers to their text or text to numbers (NumPy's formatting and parsing); a host op",
)
