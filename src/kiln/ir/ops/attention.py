"""IR ops: Attention-family ops (Attention, RMSNormalization, RotaryEmbedding, LinearAttention, CausalConvWithState).

Attention, RotaryEmbedding, LinearAttention, CausalConvWithState and SwiGLU are compositions of
existing ops (see ``kiln/frontend/onnx/ops_attention.py``); only the parts that deserve one fused
kernel live here:

- ``rms_norm``: root-mean-square normalisation (one statistics pass, one output pass).
"""

from __future__ import annotations

import numpy as np

from ...runtime.errors import InputError
from ..op import OpPattern, register_op
from ..types import TensorType
from ._util import Attrs, broadcast_shapes, norm_axis, require_float, same_dtype, wide


def _rms_rel(ts: list[TensorType], attrs: Attrs) -> list[TensorType]:
    data, gamma = ts
    require_float(data, "rms_norm data")
    same_dtype(ts)
    axis = norm_axis(attrs["axis"], data.ndim)
    norm_shape = data.shape[axis:]
    if broadcast_shapes(gamma.shape, norm_shape) != norm_shape:
        raise InputError(f"rms_norm gamma shape {gamma.shape} does not broadcast to the "
                         f"normalized shape {norm_shape} (data.shape[{axis}:])")
    return [data]


def _rms_ref(xs: list[np.ndarray], attrs: Attrs) -> list[np.ndarray]:
    x, gamma = (wide(v) for v in xs)
    axis = norm_axis(attrs["axis"], x.ndim)
    ms = (x * x).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = x / np.sqrt(ms + attrs["epsilon"]) * gamma
    return [y.astype(xs[0].dtype)]


register_op("rms_norm", attrs={"axis": ("int", -1), "epsilon": ("float", 1e-5)},
            type_rel=_rms_rel, pattern=OpPattern.OPAQUE, ref=_rms_ref, num_inputs=2,
            inputs=("data", "gamma"),
            doc="x / sqrt(mean(x^2 over dims axis..end) + epsilon) * gamma (gamma broadcasts to "
                "data.shape[axis:])")
