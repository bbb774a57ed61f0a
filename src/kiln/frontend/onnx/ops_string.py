"""Converters for ONNX string ops and string variants of other ops (``docs/strings.md``).

String ops become the host ops of :mod:`kiln.ir.ops.strings` (run by the executor, never
compiled). Ops whose output *shape* depends on the string data (StringSplit, StringNormalizer
with stopwords) need their input at compile time, like ``TopK``'s ``k``: they are evaluated at
import on a constant input, and ask for a constant (``from_onnx(freeze=...)``) otherwise.
LabelEncoder with numeric keys and values compiles to generated kernels.

Must be imported after :mod:`.ops_math` (it wraps the ``Equal``, ``Cast`` and ``CastLike``
converters).
"""

from __future__ import annotations

import numpy as np

from ...runtime import strings as _rs
from ...runtime.dtype import STRING
from ...runtime.errors import UnsupportedOpError
from .converter import _CONVERTERS, Context, onnx_op


@onnx_op("StringConcat")
def _string_concat(ctx: Context, node, ins, attrs):
    return ctx.emit1("string_concat", ins[0], ins[1])


@onnx_op("RegexFullMatch")
def _regex_full_match(ctx: Context, node, ins, attrs):
    return ctx.emit1("regex_full_match", ins[0], pattern=str(attrs.get("pattern", "")))


@onnx_op("StringSplit")
def _string_split(ctx: Context, node, ins, attrs):
    """Evaluated at import: the output width is the most substrings of any element."""
    x = ctx.static(ins[0], "X")
    maxsplit = attrs.get("maxsplit")
    y, z = _rs.split_strings(x, str(attrs.get("delimiter", "")), None if maxsplit is None else int(maxsplit))
    return [ctx.const(y), ctx.const(z)]


# Languages whose case mapping differs from Unicode's default one (dotted / dotless i, ...):
# Python's str.lower / str.upper implement the default mapping only.
_SPECIAL_CASE_LANGS = ("tr", "az", "lt")


@onnx_op("StringNormalizer")
def _string_normalizer(ctx: Context, node, ins, attrs):
    action = str(attrs.get("case_change_action", "NONE"))
    sensitive = bool(attrs.get("is_case_sensitive", 0))
    stop = [str(s) for s in attrs.get("stopwords", [])]
    locale = str(attrs.get("locale", ""))
    if locale.replace("-", "_").split("_")[0].lower() in _SPECIAL_CASE_LANGS:
        raise ctx.unsupported(
            f"locale {locale!r} has its own case mapping; Kiln implements Unicode's default case mapping only"
        )
    x = ins[0]
    if x.dtype != STRING:
        raise ctx.bad(f"X must be a string tensor, got {x.type}")
    if len(x.shape) not in (1, 2) or (len(x.shape) == 2 and x.shape[0] != 1):
        raise ctx.bad(f"X must have shape [C] or [1, C], got {list(x.shape)}")
    if stop:
        # removing stopwords changes the output's shape with the data
        arr = ctx.static(x, "X")
        return ctx.const(_rs.normalize_strings(arr, action, sensitive, stop))
    return ctx.emit1("string_normalizer", x, case_change_action=action, is_case_sensitive=sensitive)


_numeric_equal = _CONVERTERS["Equal"]


@onnx_op("Equal")
def _equal(ctx: Context, node, ins, attrs):
    """String operands: a host op; numbers: the existing converter (generated kernels)."""
    if any(v is not None and v.dtype == STRING for v in ins):
        return ctx.emit1("string_equal", ins[0], ins[1])
    return _numeric_equal(ctx, node, ins, attrs)


def _encoder_side(attrs, side: str, what: str):
    """(values as a list, IR dtype) of LabelEncoder's keys or values."""
    t = attrs.get(f"{side}_tensor")
    if t is not None:  # the converter hands tensor attributes over as arrays
        arr = np.asarray(t).reshape(-1)
        if arr.dtype == object:
            return [str(s) for s in arr], STRING
        return arr.tolist(), arr.dtype.name
    for suffix, dt in (("strings", STRING), ("int64s", "int64"), ("floats", "float32")):
        v = attrs.get(f"{side}_{suffix}")
        if v is not None and len(v) > 0:
            vals = (
                [str(s) for s in v] if dt == STRING else [int(s) for s in v] if dt == "int64" else [float(s) for s in v]
            )
            return vals, dt
    raise UnsupportedOpError(f"LabelEncoder needs {what}")


def _encoder_default(attrs, dt: str):
    t = attrs.get("default_tensor")
    if t is not None:
        first = np.asarray(t).reshape(-1)[0]
        return str(first) if dt == STRING else first.item()
    if dt == STRING:
        return str(attrs.get("default_string", "_Unused"))
    if dt == "int64":
        return int(attrs.get("default_int64", -1))
    return float(attrs.get("default_float", -0.0))


@onnx_op("ai.onnx.ml.LabelEncoder")
def _label_encoder(ctx: Context, node, ins, attrs):
    """String keys or values: a host op; numbers to numbers: ``where(x == k, v, ...)`` kernels."""
    x = ins[0]
    keys, kd = _encoder_side(attrs, "keys", "keys (keys_strings / keys_int64s / keys_floats / keys_tensor)")
    values, vd = _encoder_side(attrs, "values", "values (values_* or values_tensor)")
    if len(keys) != len(values):
        raise ctx.bad(f"{len(keys)} keys but {len(values)} values")
    if x.dtype != kd and not (kd != STRING and x.dtype != STRING):
        raise ctx.bad(f"X is {x.type} but the keys are {kd}")
    default = _encoder_default(attrs, vd)
    if kd == STRING or vd == STRING:
        if x.dtype != kd:
            raise ctx.bad(f"X is {x.type} but the keys are {kd}")
        return ctx.emit1(
            "label_encoder", x, keys=tuple(keys), values=tuple(values), default=default, keys_dtype=kd, values_dtype=vd
        )
    # numbers -> numbers: a chain of selects, last key first so the first of repeated keys wins
    out = ctx.const(np.full(x.shape, default, dtype=np.dtype(vd)))
    kdt = np.dtype(x.dtype)
    for k, v in reversed(list(zip(keys, values))):
        key = np.asarray(k, dtype=kdt)
        hit = ctx.emit1("isnan", x) if np.isnan(key).any() else ctx.emit1("equal", x, ctx.const(key))
        out = ctx.emit1("where", hit, ctx.const(np.asarray(v, dtype=np.dtype(vd))), out)
    return out


_numeric_cast, _numeric_cast_like = _CONVERTERS["Cast"], _CONVERTERS["CastLike"]


def _cast_to(ctx: Context, x, dtype: str):
    if dtype == STRING and x.dtype == STRING:
        return x
    return ctx.emit1("cast_string", x, dtype=dtype)


@onnx_op("Cast")
def _cast(ctx: Context, node, ins, attrs):
    """To or from strings: a host op; numbers: the existing converter."""
    from .converter import onnx_dtype

    to = onnx_dtype(attrs["to"])
    if to == STRING or ins[0].dtype == STRING:
        return _cast_to(ctx, ins[0], to)
    return _numeric_cast(ctx, node, ins, attrs)


@onnx_op("CastLike")
def _cast_like(ctx: Context, node, ins, attrs):
    if ins[1].dtype == STRING or ins[0].dtype == STRING:
        return _cast_to(ctx, ins[0], ins[1].dtype)
    return _numeric_cast_like(ctx, node, ins, attrs)
