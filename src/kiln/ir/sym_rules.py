"""Symbolic shape rules: the symbolic dims of every built-in op's outputs.

A value of a dynamic graph has a static upper-bound shape (``TensorType.shape``, computed by the
op's ``type_rel`` as always) and, per dim, an optional symbolic expression for its runtime
extent (``TensorType.sym``, see :mod:`kiln.runtime.sym`). :meth:`kiln.ir.Graph.add_node` calls
the op's rule only when some input is dynamic, so static graphs never reach this module.

A rule is ``rule(input_types, attrs, output_types) -> list`` returning, per output, a tuple of
dims (an ``int`` or ``None`` for a static dim, a canonical string for a symbolic one) or
``None`` for a fully static output. ``output_types`` are the upper-bound types already inferred
(and validated) by ``type_rel``; a rule adds the symbols and rejects what the padded layout cannot
express with an :class:`~kiln.runtime.errors.InputError` naming the dims (``add_node`` prefixes
the op and node). An op without a rule rejects symbolic inputs — a symbol is never dropped.

The rules of the built-in ops live in :data:`RULES` (one table, one place); an op registered
elsewhere gives its own with ``register_op(..., sym_rel=...)``, which takes precedence.

Conventions the rules share:

* Broadcasting: a static 1 broadcasts; two symbolic dims must be the same canonical expression;
  a symbolic dim against a static dim other than 1 is an error (the runtime extent may differ).
* Sliding-window ops (convolution, pooling, resize) accept symbolic batch and spatial dims;
  their output dims are the window formulas over the input's expressions
  (``(h + 2*p - d*(k-1) - 1)//s + 1``, :func:`window_dim`). Channels stay static.
  ``grid_sample`` and ``roi_align`` accept a symbolic *batch* (axis 0) only.
* Padded layout: a tensor is stored at its upper bound, the real data at the start of every
  dim. So ops that index a symbolic axis from its end (negative slice starts, reversals,
  padding after it, splitting it) are rejected.

This module imports only the IR types, the op helpers and :mod:`kiln.runtime.sym`.
"""

from __future__ import annotations

import math

from fractions import Fraction
from typing import Any, Callable, Sequence

from ..runtime import sym
from ..runtime.errors import InputError, KilnError, UnsupportedOpError
from ..runtime.sym import Dim
from .types import TensorType

__all__ = ["RULES", "POSITIVE_DIMS", "get_sym_rule", "sym_rule", "broadcast_dims", "format_dims",
           "padded_layout_key", "same_padded_layout", "window_dim", "scale_fraction"]

Attrs = dict[str, Any]
SymOut = tuple[Dim | None, ...] | None
Rule = Callable[[list[TensorType], Attrs, list[TensorType]], list[SymOut]]

#: Built-in rules keyed by op name.
RULES: dict[str, Rule] = {}


def get_sym_rule(opdef: Any) -> Rule | None:
    """The symbolic rule of ``opdef``: its own ``sym_rel``, else the built-in one, else None."""
    return opdef.sym_rel or RULES.get(opdef.name)


def sym_rule(*names: str) -> Callable[[Rule], Rule]:
    """Decorator: register a rule in :data:`RULES` for every op in ``names``."""
    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn
    return deco


# ---------------------------------------------------------------------- helpers
def padded_layout_key(t: TensorType) -> tuple:
    """Equal keys <=> the same bytes hold the same elements in both types' padded layouts.

    Storage is laid out for the upper-bound shape and the data sits in the sub-box of the
    actual shape. A dim's stride is the product of the upper bounds after it, so a reshape
    that only re-factors runs of static dims (``(b, 232, h, w)`` <-> ``(b, 2, 116, h, w)``, a
    channel shuffle) keeps every element where it was: the key is the sequence of symbolic
    dims with the product of each static run between them (a dim ``c*s`` counts as ``(s, c)``,
    :func:`_scaled_symbol`). A type whose single non-unit leading dim is symbolic is compact
    whatever the runtime size (a batch, or the sequence of a batch-1 model), so there only its
    total symbolic size matters.
    """
    dims = list(t.dims)
    last = max((i for i, d in enumerate(dims) if isinstance(d, str)), default=-1)
    if last < 0:
        return ("static", math.prod(int(d) for d in dims))
    lead = [d for d in dims[:last + 1] if d != 1]
    if len(lead) == 1:
        return ("compact", sym.mul(lead[0], math.prod(int(d) for d in dims[last + 1:])))
    runs: list[Dim] = []
    run = 1
    for d in dims:
        for part in _scaled_symbol(d):
            if isinstance(part, str):
                runs += ([run] if run != 1 else []) + [part]
                run = 1
            else:
                run *= int(part)
    return ("padded", tuple(runs + ([run] if run != 1 else [])))


def _scaled_symbol(d: Dim) -> tuple[Dim, ...]:
    """A dim ``c*s`` (a constant times one symbol) as the dims ``(s, c)``, which address the
    same positions in the same order (``j = a*c + h``, ``a < s``); any other dim as itself.

    So ``(seq, 12*batch, 64)``, the heads of an attention split off a sequence-first
    ``(seq, batch, 768)``, has the padded layout of ``(seq, batch, 768)``.
    """
    if not isinstance(d, str):
        return (d,)
    names = sym.symbols(d)
    if len(names) != 1:
        return (d,)
    (s,) = names
    c = sym.evaluate(d, {s: 1})
    if c > 1 and sym.mul(c, s) == d:
        return (s, c)
    return (d,)


def same_padded_layout(a: TensorType, b: TensorType) -> bool:
    """Whether a reshape from ``a`` to ``b`` moves no data in the padded layout (is free)."""
    if a.sym is None and b.sym is None:
        return True
    return padded_layout_key(a) == padded_layout_key(b)


def format_dims(dims: Sequence[Dim]) -> str:
    """``(batch, 3, 224)``: dims the way :class:`TensorType` prints them."""
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _sym(dims: Sequence[Dim], out: TensorType) -> SymOut:
    """A rule's result for ``out`` from its dims (ints where static)."""
    res: list[Dim | None] = []
    for d, ub in zip(dims, out.shape):
        if isinstance(d, str):
            res.append(d)
        else:
            if d != ub:
                raise KilnError(f"symbolic rule computed static dim {d} where the type relation "
                                f"gives {ub} (shape {out.shape})")
            res.append(None)
    return tuple(res) if any(r is not None for r in res) else None


def _static_only(t: TensorType, axes: Sequence[int], what: str,
                 allowed: str = "only a symbolic batch") -> None:
    for a in axes:
        if isinstance(t.dims[a], str):
            raise InputError(f"{what}: symbolic dimension {t.dims[a]!r} on axis {a} of "
                             f"{format_dims(t.dims)} is not supported ({allowed})")


def _all_static(t: TensorType, what: str) -> None:
    if t.sym is not None:
        raise InputError(f"{what} must be static, got dims {format_dims(t.dims)}")


def _same_dim(a: Dim, b: Dim, what: str) -> None:
    if a != b:
        raise InputError(f"{what}: dimension {a!r} does not match {b!r}")


def _norm(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def broadcast_dims(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy broadcasting of shapes whose dims may be symbolic.

    Raises
    ------
    InputError
        Two different symbolic dims, or a symbolic dim against a static dim other than 1,
        meet on one axis.
    """
    ndim = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * ndim
    for s in shapes:
        off = ndim - len(s)
        for i, d in enumerate(s):
            cur = out[off + i]
            if cur == d or d == 1:
                continue
            if cur == 1:
                out[off + i] = d
            else:
                raise InputError(f"cannot broadcast dimension {cur!r} against {d!r} (shapes "
                                 + " and ".join(format_dims(x) for x in shapes) + ")")
    return tuple(out)


# ---------------------------------------------------------------------- same shape
def _first(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    return [ts[0].sym for _ in outs]


sym_rule(
    # unary math and activations (elemwise.py, integer.py)
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf",
    "exp", "floor", "log", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh",
    "softplus", "softsign", "sqrt", "tan", "tanh", "negative", "relu", "leaky_relu", "elu",
    "selu", "celu", "gelu", "swish", "mish", "hard_sigmoid", "hard_swish", "shrink",
    "thresholded_relu", "clip", "identity", "dropout", "logical_not", "isnan", "isinf", "cast",
    "bitcast", "bitwise_not",
    # same-shape ops along any axis: the kernels see the runtime extent of a symbolic axis
    "softmax", "log_softmax", "lrn", "cumsum", "cumprod", "trilu",
)(_first)


# ---------------------------------------------------------------------- broadcasting
@sym_rule("add", "subtract", "multiply", "divide", "maximum", "minimum", "mod", "power",
          "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
          "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
          "bitwise_xor", "bit_shift", "where", "prelu")
def _broadcast(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    return [_sym(broadcast_dims(*(t.dims for t in ts)), outs[0])]


@sym_rule("bias_add")
def _bias_add(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, bias = ts
    axis = _norm(attrs["axis"], data.ndim)
    _same_dim(bias.dims[0], data.dims[axis], f"bias_add: bias against data axis {axis}")
    return [data.sym]


@sym_rule("broadcast_to")
def _broadcast_to(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data = ts[0]
    target: tuple[Dim, ...] = attrs.get("sym_shape") or outs[0].shape
    if len(target) != outs[0].ndim:
        raise InputError(f"broadcast_to: sym_shape {format_dims(target)} must have "
                         f"{outs[0].ndim} dims like shape {outs[0].shape}")
    dims = list(target)
    off = len(target) - data.ndim
    for i, d in enumerate(data.dims):
        t = target[off + i]
        if isinstance(d, str) and not isinstance(t, str):
            # A static target dim equal to the upper bound stands for "this symbolic dim".
            t = dims[off + i] = d
        if d != 1 and d != t:
            raise InputError(f"broadcast_to: cannot broadcast dimension {d!r} to {t!r}")
    return [_sym(dims, outs[0])]


# ---------------------------------------------------------------------- shape ops
@sym_rule("transpose")
def _transpose(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    d = ts[0].dims
    return [_sym([d[_norm(a, len(d))] for a in attrs["axes"]], outs[0])]


@sym_rule("concatenate")
def _concat(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    first = ts[0].dims
    axis = _norm(attrs["axis"], len(first))
    total: Dim = 0
    for k, t in enumerate(ts):
        for i, (a, b) in enumerate(zip(t.dims, first)):
            if i != axis:
                _same_dim(a, b, f"concatenate: axis {i} of input {k} against input 0")
        total = sym.add(total, t.dims[axis])
    return [_sym(first[:axis] + (total,) + first[axis + 1:], outs[0])]


@sym_rule("split")
def _split(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    d = ts[0].dims
    axis = _norm(attrs["axis"], len(d))
    if isinstance(d[axis], str) and len(attrs["sections"]) > 1:
        raise InputError(f"split: splitting symbolic dimension {d[axis]!r} (axis {axis} of "
                         f"{format_dims(d)}) into static sections {attrs['sections']} is not "
                         "supported")
    return [_sym(d[:axis] + (o.shape[axis],) + d[axis + 1:], o) if not isinstance(d[axis], str)
            else ts[0].sym for o in outs]


@sym_rule("strided_slice")
def _slice(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data = ts[0]
    dims: list[Dim] = list(outs[0].shape)
    sliced = {}
    for b, e, s, a in zip(attrs["begin"], attrs["end"], attrs["strides"], attrs["axes"]):
        sliced[_norm(a, data.ndim)] = (b, e, s)
    for i, d in enumerate(data.dims):
        if not isinstance(d, str):
            continue
        if i not in sliced:
            dims[i] = d
            continue
        b, e, s = sliced[i]
        ub = data.shape[i]
        if s == 1 and b == 0 and e >= ub:
            dims[i] = d  # the whole axis, e.g. x[:, :INT_MAX]
        elif s == 1 and 0 <= b < e <= 1:
            pass  # element 0 exists at every runtime extent (ranges start at >= 1)
        else:
            raise InputError(f"strided_slice: slicing symbolic dimension {d!r} (axis {i}) with "
                             f"begin={b}, end={e}, step={s} is not supported; only the whole axis "
                             "(begin 0, end >= its bound, step 1) or its first element")
    return [_sym(dims, outs[0])]


@sym_rule("tile")
def _tile(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    return [_sym([sym.mul(d, r) for d, r in zip(ts[0].dims, attrs["reps"])], outs[0])]


@sym_rule("pad")
def _pad(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    dims: list[Dim] = list(outs[0].shape)
    for i, (d, (a, b)) in enumerate(zip(ts[0].dims, attrs["pad_width"])):
        if isinstance(d, str):
            if a or b:
                raise InputError(f"pad: padding symbolic dimension {d!r} (axis {i}) by {(a, b)} "
                                 "is not supported")
            dims[i] = d
    return [_sym(dims, outs[0])]


def _reshape_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Split two shapes of one size into runs of dims with equal products (minimal runs).

    Size-1 dims at the end join the last run. Raises InputError when the runs are not
    well defined (a zero dim).
    """
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    n, m = len(src), len(dst)
    if 0 in src or 0 in dst:
        raise InputError("cannot infer symbolic dims of a reshape of an empty tensor")
    while i < n and j < m:
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi *= src[i]
                gi.append(i)
                i += 1
            else:
                pj *= dst[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    rest_i, rest_j = list(range(i, n)), list(range(j, m))
    if groups:
        groups[-1][0].extend(rest_i)
        groups[-1][1].extend(rest_j)
    elif rest_i or rest_j:
        groups.append((rest_i, rest_j))
    return groups


def _product(dims: Sequence[Dim]) -> Dim:
    p: Dim = 1
    for d in dims:
        p = sym.mul(p, d)
    return p


@sym_rule("reshape")
def _reshape(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, out = ts[0], outs[0]
    src = data.dims
    target = attrs.get("sym_shape")
    if target is not None:
        if len(target) != out.ndim or any(isinstance(t, int) and t != ub
                                          for t, ub in zip(target, out.shape)):
            raise InputError(f"reshape: sym_shape {format_dims(target)} does not match newshape "
                             f"{out.shape}")
        dims = list(target)
    else:
        dims = list[Dim](out.shape)
        for gi, gj in _reshape_groups(data.shape, out.shape):
            p = _product([src[k] for k in gi])
            if not isinstance(p, str):
                continue
            big = [k for k in gj if out.shape[k] != 1]
            if len(big) != 1:
                raise InputError(
                    f"reshape: splitting {format_dims([src[k] for k in gi])} into "
                    f"{format_dims([out.shape[k] for k in gj])} is ambiguous with symbolic "
                    f"dims; give the symbolic target as the sym_shape attribute "
                    f"(input {format_dims(src)}, newshape {out.shape})")
            dims[big[0]] = p
    if _product(src) != _product(dims):
        raise InputError(f"reshape: {format_dims(src)} has {_product(src)} elements but the "
                         f"target {format_dims(dims)} has {_product(dims)}")
    return [_sym(dims, out)]


# ---------------------------------------------------------------------- reductions
@sym_rule("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod")
def _reduce(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    d = ts[0].dims
    axes = {_norm(a, len(d)) for a in attrs["axes"]}
    if attrs["keepdims"]:
        return [_sym([1 if i in axes else x for i, x in enumerate(d)], outs[0])]
    return [_sym([x for i, x in enumerate(d) if i not in axes], outs[0])]


@sym_rule("argmax", "argmin")
def _arg(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    return _reduce(ts, {"axes": (attrs["axis"],), "keepdims": attrs["keepdims"]}, outs)


@sym_rule("topk")
def _topk(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    d = ts[0].dims
    axis = _norm(attrs["axis"], len(d))
    if isinstance(d[axis], str):
        raise InputError(f"topk: a static k={attrs['k']} along symbolic dimension {d[axis]!r} "
                         f"(axis {axis}) is not supported")
    return [ts[0].sym, ts[0].sym]


@sym_rule("det")
def _det(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    d = ts[0].dims
    _same_dim(d[-2], d[-1], "det: square matrices")
    return [_sym(d[:-2], outs[0])]


# ---------------------------------------------------------------------- normalisation
@sym_rule("layer_norm", "rms_norm")
def _layer_norm(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data = ts[0]
    axis = _norm(attrs["axis"], data.ndim)
    for t in ts[1:]:
        broadcast_dims(t.dims, data.dims[axis:])
    return [data.sym]


@sym_rule("batch_norm", "instance_norm")
def _channel_norm(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data = ts[0]
    axis = _norm(attrs.get("axis", 1), data.ndim)
    for t in ts[1:]:
        _same_dim(t.dims[0], data.dims[axis], f"parameters against data axis {axis}")
    return [data.sym]


# ---------------------------------------------------------------------- contractions
@sym_rule("dense")
def _dense(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, weight = ts
    _same_dim(data.dims[-1], weight.dims[1], "dense: reduction dim of data against weight")
    return [_sym(data.dims[:-1] + (attrs.get("units") or weight.dims[0],), outs[0])]


@sym_rule("matmul")
def _matmul(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    a, b = (t.dims for t in ts)
    _same_dim(a[-1], b[-2], "matmul: reduction dim")
    return [_sym(broadcast_dims(a[:-2], b[:-2]) + (a[-2], b[-1]), outs[0])]


# ---------------------------------------------------------------------- sliding windows
#: Ops whose symbolic output dims must stay >= 1 over the symbols' ranges: the graph checks
#: it (:meth:`kiln.ir.Graph.add_node` knows the ranges, the rules do not).
POSITIVE_DIMS = ("conv2d", "conv2d_transpose", "conv2d_nchwc", "max_pool2d", "avg_pool2d",
                 "max_pool2d_nchwc", "resize2d")


def window_dim(n: Dim, k: int, s: int, p0: int, p1: int, d: int, ceil: bool = False) -> Dim:
    """Output length of a sliding window along a dim of length ``n`` (maybe symbolic).

    The static rule is :func:`kiln.ir.ops._util.conv_out_size`. In ceil_mode it is
    ``A = ceil((n + p0 + p1 - eff) / s) + 1`` less one when the last window would start in the
    end padding, that is ``min(A, B)`` with ``B = ceil((n + p0) / s)``, the windows starting
    before the end of the input. The numerators of ``A`` and ``B`` (over ``s``) differ by
    ``p1 + s - eff``, less than ``s`` since padding is smaller than the window, so ``A <= B``
    for every ``n`` when that is <= 0, else ``A >= B``: one floor division either way.

    Parameters
    ----------
    n : int or str
        Input length (a canonical symbolic dim or an int).
    k, s, d : int
        Window size, stride, dilation.
    p0, p1 : int
        Padding before and after.
    ceil : bool
        ceil_mode (pools).

    Returns
    -------
    int or str
        The output length; symbolic when ``n`` is.
    """
    eff = (k - 1) * d + 1
    if not isinstance(n, str):
        from .ops._util import conv_out_size

        return conv_out_size(n, k, s, p0, p1, d, ceil)
    if not ceil:
        return sym.add(sym.floordiv(sym.add(n, p0 + p1 - eff), s), 1)
    if p1 + s - eff <= 0:
        return sym.add(sym.floordiv(sym.add(n, p0 + p1 - eff + s - 1), s), 1)
    return sym.floordiv(sym.add(n, p0 + s - 1), s)


@sym_rule("conv2d", "conv2d_nchwc")
def _conv(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, weight = ts
    _all_static(weight, "conv weight")
    _static_only(data, [1] + list(range(4, data.ndim)), "conv data channels",
                 "symbolic batch and spatial dims only")
    kh, kw = weight.shape[2:4]
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh = window_dim(data.dims[2], kh, sh, pt, pb, dh)
    ow = window_dim(data.dims[3], kw, sw, pl, pr, dw)
    return [_sym((data.dims[0], outs[0].shape[1], oh, ow) + outs[0].shape[4:], outs[0])]


@sym_rule("conv2d_transpose")
def _conv_transpose(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, weight = ts
    _all_static(weight, "conv weight")
    _static_only(data, [1], "conv data channels",
                 "symbolic batch and spatial dims only")
    dims: list[Dim] = [data.dims[0], outs[0].shape[1]]
    for a, n in enumerate(data.dims[2:4]):
        k, s, d, op_ = (weight.shape[2 + a], attrs["strides"][a], attrs["dilation"][a],
                        attrs["output_padding"][a])
        p = attrs["padding"][a] + attrs["padding"][a + 2]
        # s * (n - 1) + output_padding + (k - 1) * d + 1 - pads
        dims.append(sym.add(sym.mul(n, s), op_ + (k - 1) * d + 1 - p - s))
    return [_sym(dims, outs[0])]


@sym_rule("max_pool2d", "avg_pool2d", "max_pool2d_nchwc")
def _pool(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data = ts[0]
    _static_only(data, [1] + list(range(4, data.ndim)), "pooling data channels",
                 "symbolic batch and spatial dims only")
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    ceil = bool(attrs["ceil_mode"])
    oh = window_dim(data.dims[2], kh, sh, pt, pb, dh, ceil)
    ow = window_dim(data.dims[3], kw, sw, pl, pr, dw, ceil)
    return [_sym((data.dims[0], outs[0].shape[1], oh, ow) + outs[0].shape[4:], outs[0])]


def scale_fraction(scale: float) -> tuple[int, int] | None:
    """``(p, q)`` with ``scale == p / q`` (to 1e-9, q <= 64), or None: how a resize by
    ``scale`` sizes a symbolic dim, ``floor(n * scale) == (p * n) // q``."""

    f = Fraction(scale).limit_denominator(64)
    if abs(float(f) - scale) > 1e-9 * max(1.0, scale):
        return None
    return f.numerator, f.denominator


@sym_rule("resize2d")
def _resize(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data = ts[0]
    _static_only(data, [1], "resize data channels",
                 "symbolic batch and spatial dims only")
    dims: list[Dim] = [data.dims[0], outs[0].shape[1]]
    target = attrs.get("sym_size")
    if target is not None:
        # a resize to runtime sizes: the output dims are given, the scales follow at run time
        if len(target) != 2:
            raise InputError(f"resize2d: sym_size {format_dims(target)} must give (out_h, out_w)")
        for d, ub in zip(target, outs[0].shape[2:]):
            bound = d if isinstance(d, int) else None
            if bound is not None and bound != ub:
                raise InputError(f"resize2d: sym_size {format_dims(target)} does not match size "
                                 f"{outs[0].shape[2:]}")
        return [_sym(dims + [sym.canonical(d) for d in target], outs[0])]
    for a, n in enumerate(data.dims[2:4]):
        if not isinstance(n, str):
            dims.append(outs[0].shape[2 + a])
            continue
        scale = float(attrs["scales"][a])
        pq = scale_fraction(scale)
        size = attrs["size"][a]
        if pq is None or size != (pq[0] * data.shape[2 + a]) // pq[1]:
            raise InputError(f"resize2d: symbolic dimension {n!r} (axis {2 + a}) must be resized by "
                             f"a rational scale (p/q, q <= 64) giving size floor(n * scale); got scale "
                             f"{scale} and size {size} at the upper bound {data.shape[2 + a]} (a fixed "
                             "output size for a symbolic input is not supported)")
        dims.append(sym.floordiv(sym.mul(n, pq[0]), pq[1]))
    return [_sym(dims, outs[0])]


@sym_rule("layout_transform")
def _layout_transform(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    from .ops.layout import parse_layout

    data = ts[0]
    src = parse_layout(attrs["src_layout"])
    dst = parse_layout(attrs["dst_layout"])
    dims: list[Dim] = list(outs[0].shape)
    for i, (letter, fac) in enumerate(src):
        d = data.dims[i]
        if not isinstance(d, str):
            continue
        blocked = fac or any(f and a.upper() == letter for a, f in src + dst)
        if blocked:
            raise InputError(f"layout_transform: symbolic dimension {d!r} on blocked axis "
                             f"{letter!r} ({attrs['src_layout']} -> {attrs['dst_layout']}) is "
                             "not supported")
        dims[[a for a, _ in dst].index(letter)] = d
    return [_sym(dims, outs[0])]


def _winograd_grid(x: TensorType, pad: Sequence[int]) -> tuple[Dim, Dim, Dim]:
    """``(OH, OW, T)`` of the Winograd conv of blocked data ``x``: the output size and the flat
    tile count ``N * ceil(OH / 2) * ceil(OW / 2)``, symbolic where ``x``'s dims are."""
    _static_only(x, (1, 4), "a Winograd convolution's data", "only a symbolic batch, height or width")
    pt, pl, pb, pr = (int(p) for p in pad)
    oh, ow = sym.add(x.dims[2], pt + pb - 2), sym.add(x.dims[3], pl + pr - 2)
    tiles = sym.mul(sym.floordiv(sym.add(oh, 1), 2), sym.floordiv(sym.add(ow, 1), 2))
    return oh, ow, sym.mul(x.dims[0], tiles)


@sym_rule("winograd_input_transform")
def _winograd_in(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    # the tiles are row-major over (n, ty, tx) at the runtime TH, TW: the valid rows are a
    # prefix whatever is symbolic
    tiles = _winograd_grid(ts[0], attrs["padding"])[2]
    if not isinstance(tiles, str):
        return [_sym(outs[0].shape, outs[0])]  # static, planes padded to plane_rows or not
    if attrs["plane_rows"]:
        # spacing rows after a runtime row count would move with it: planes stay compact
        raise InputError(f"winograd_input_transform: plane_rows needs a static tile count, got {tiles!r}")
    return [_sym((16, tiles, outs[0].shape[2]), outs[0])]


@sym_rule("winograd_matmul")
def _winograd_mm(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    v, u = ts
    _static_only(v, (0, 2), "winograd_matmul's V", "only a symbolic tile count")
    _all_static(u, "winograd_matmul's weight panels")
    if attrs["tiles"]:
        # the first rows of padded planes: only of a static tile count (winograd_input_transform)
        _static_only(v, (1,), "winograd_matmul's V with tiles set", "no symbolic tile count")
        return [_sym(outs[0].shape, outs[0])]
    return [_sym((16, v.dims[1], outs[0].shape[2]), outs[0])]


@sym_rule("winograd_output_transform")
def _winograd_out(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    m = ts[0]
    _static_only(m, (0, 2), "winograd_output_transform's M", "only a symbolic tile count")
    tiles = m.dims[1]
    if len(ts) == 2:
        # symbolic H / W: the output is the data's window, the tiles must be its tiles
        oh, ow, want = _winograd_grid(ts[1], attrs["padding"])
        if want != tiles:
            raise InputError(f"winograd_output_transform: M has {tiles!r} tiles, the data {want!r}")
        return [_sym((ts[1].dims[0],) + outs[0].shape[1:2] + (oh, ow) + outs[0].shape[4:], outs[0])]
    # no data: H and W are static, so the tiles per image are compiled in
    per_image = m.shape[1] // outs[0].shape[0]
    batch = sym.floordiv(tiles, per_image)
    if sym.mul(batch, per_image) != tiles:
        raise InputError(f"winograd_output_transform: {tiles!r} tiles are no whole number of images of "
                         f"{per_image} tiles")
    return [_sym((batch,) + outs[0].shape[1:], outs[0])]


@sym_rule("grid_sample")
def _grid_sample(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, grid = ts
    _static_only(data, range(1, data.ndim), "grid_sample data")
    _same_dim(grid.dims[0], data.dims[0], "grid_sample: batch of grid against data")
    return [_sym(data.dims[:2] + grid.dims[1:-1], outs[0])]


@sym_rule("roi_align")
def _roi_align(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, rois, idx = ts
    _static_only(data, range(1, data.ndim), "roi_align data")
    _same_dim(idx.dims[0], rois.dims[0], "roi_align: batch_indices against rois")
    return [_sym((rois.dims[0],) + outs[0].shape[1:], outs[0])]


# ---------------------------------------------------------------------- indexing
@sym_rule("take")
def _take(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, idx = ts
    axis = _norm(attrs["axis"], data.ndim)
    # Indices along a symbolic axis are checked against its runtime extent, and a negative
    # one counts from that extent (topi.transform.take), as on a static axis.
    return [_sym(data.dims[:axis] + idx.dims + data.dims[axis + 1:], outs[0])]


@sym_rule("gather_elements")
def _gather_elements(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    return [ts[1].sym]


@sym_rule("gather_nd")
def _gather_nd(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    data, idx = ts
    b = attrs["batch_dims"]
    if isinstance(idx.dims[-1], str):
        raise InputError(f"gather_nd: the index depth (last dim of indices {format_dims(idx.dims)}) "
                         "must be static")
    for i in range(b):
        _same_dim(idx.dims[i], data.dims[i], f"gather_nd: batch dim {i}")
    k = idx.shape[-1]
    return [_sym(idx.dims[:-1] + data.dims[b + k:], outs[0])]


@sym_rule("one_hot")
def _one_hot(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    d = ts[0].dims
    axis = _norm(attrs["axis"], len(d) + 1)
    return [_sym(d[:axis] + (attrs["depth"],) + d[axis:], outs[0])]


@sym_rule("scatter_elements", "scatter_elements_reduce", "scatter_nd", "scatter_nd_reduce")
def _scatter(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    return [ts[0].sym]


@sym_rule("reverse_sequence")
def _reverse_sequence(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    x, lens = ts
    b = _norm(attrs["batch_axis"], x.ndim)
    _same_dim(lens.dims[0], x.dims[b], "reverse_sequence: sequence_lens against the batch")
    # Each sequence reverses within its length, which never exceeds the runtime extent.
    return [x.sym]


@sym_rule("tensor_scatter")
def _tensor_scatter(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    from .ops.index import _tensor_scatter_axis

    cache, upd = ts[0], ts[1]
    axis = _tensor_scatter_axis(cache, attrs)
    for i, (u, c) in enumerate(zip(upd.dims, cache.dims)):
        if i != axis:
            _same_dim(u, c, f"tensor_scatter: update against cache on axis {i}")
    if len(ts) > 2:
        _same_dim(ts[2].dims[0], cache.dims[0], "tensor_scatter: write_indices against the batch")
    return [cache.sym]


# ---------------------------------------------------------------------- host (string) ops
@sym_rule("string_concat", "string_equal", "regex_full_match", "string_normalizer", "label_encoder",
          "cast_string")
def _host_static_only(ts: list[TensorType], attrs: Attrs, outs: list[TensorType]) -> list[SymOut]:
    # the executor's host ops (kiln.runtime.strings) work on whole object arrays; they do not
    # know the padded layout of a dynamic tensor
    raise UnsupportedOpError("string ops need static shapes; their inputs have symbolic dims "
                             + ", ".join(format_dims(t.dims) for t in ts))
