"""ONNX sequence and optional values whose *structure* is known at import.

Kiln compiles static structures: a sequence is converted to a :class:`SeqValue`, a tuple of IR
values (one per element; element shapes may differ), and an optional to an :class:`OptValue`
(an IR value, a :class:`SeqValue`, or nothing). Their lengths and element types are fixed when
the model is imported: by the ops that build them (``SequenceConstruct``, ``SplitToSequence``,
``SequenceInsert``, ...) or, for a graph input, by ``from_onnx(shape={name: [elem dims, ...]})``
(``freeze={name: None}`` for an absent optional). The element *values* stay runtime values:
every element is an ordinary tensor of the graph, computed by generated kernels.

* Sequence ops (``SequenceAt``, ``SequenceErase``, ``SequenceLength``, ...) are list operations
  at import; their positions must be compile-time constants.
* ``SequenceMap`` converts its body once per element (each copy sees that element's shape), as
  ``Loop`` unrolls its body; a ``Loop`` carrying a sequence is unrolled the same way (its trip
  count and condition must be known at import).
* A runtime ``If`` may return sequences / optionals when both branches give the same
  structure: the elements become ordinary outputs of the ``if`` node.
* A sequence whose *length* is decided at run time is a :class:`StackedSeq`: one ``[T, *elem]``
  tensor whose leading dim ``T`` is symbolic (the data-dependent iteration count of a runtime
  ``Loop``). A runtime ``Loop`` whose body only appends one fixed-shape element per iteration
  to a carried sequence builds one from a scan output of the IR ``loop`` node;
  ``SequenceLength``, ``SequenceAt``, ``ConcatFromSequence``, ``SequenceInsert`` at the end and
  ``Identity`` read it, and it can be a graph output. Other ops on it are refused.
* Graph inputs and outputs of sequence / optional type are flattened into tensor inputs and
  outputs; ``value_layouts`` (attached to the graph, written by ``kiln.build`` into the graph
  JSON as ``kiln_values``) tells :class:`kiln.GraphModule` how to regroup them, so
  ``set_input`` takes and ``get_output`` returns a Python list (or ``None``).
  See ``docs/sequences.md``.

Must be imported after :mod:`.ops_control` and :mod:`.ops_tensor` (it wraps the ``If``,
``Loop`` and ``Identity`` converters).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ...ir import Value
from ...ir.types import TensorType
from ...ir.ops.control import Subgraph
from ...runtime import sym
from ...runtime.errors import InputError, UnsupportedOpError
from . import ops_control
from .converter import _CONVERTERS, Context, onnx_dtype, onnx_op, tensor_to_array

__all__ = ["SeqValue", "StackedSeq", "OptValue", "is_container", "container_input", "flatten_outputs", "stacked_spec",
           "LAYOUTS_ATTR"]

#: Attribute of an IR ``Graph`` holding the layouts of its sequence / optional inputs and
#: outputs (the ``kiln_values`` object of the graph JSON, ``docs/sequences.md``).
LAYOUTS_ATTR = "value_layouts"

#: Longest sequence Kiln builds at import (each element is a value of the graph).
MAX_ELEMENTS = 4096


class SeqValue:
    """An ONNX sequence with a structure known at import: one IR value per element.

    Parameters
    ----------
    items : sequence of Value
        The elements, in order (their shapes may differ; their dtype is ``elem_dtype``).
    elem_dtype : str
        The element dtype (needed for an empty sequence).
    """

    def __init__(self, items: Sequence[Value], elem_dtype: str) -> None:
        self.items = tuple(items)
        self.elem_dtype = elem_dtype
        self.name: str | None = None  # the converter names values after their ONNX outputs

    def __repr__(self) -> str:
        return f"SeqValue({self.elem_dtype}, {[str(v.type) for v in self.items]})"


class StackedSeq:
    """An ONNX sequence whose length is decided at run time, its elements of one static shape.

    Stored as one tensor ``[T, *elem_shape]``; its leading dim ``T`` is the length (symbolic:
    the data-dependent iteration count of a runtime ``Loop``, plus any static prefix). In the
    padded layout the valid elements are a compact prefix of the storage.

    Parameters
    ----------
    data : Value
        The stacked elements.
    elem_dtype : str
        The element dtype (``data``'s).
    """

    def __init__(self, data: Value, elem_dtype: str) -> None:
        self.data = data
        self.elem_dtype = elem_dtype
        self.name: str | None = None

    @property
    def length(self) -> Any:
        """The length: an int or a symbolic dim expression."""
        return self.data.type.dims[0]

    @property
    def elem_shape(self) -> tuple[int, ...]:
        """The static shape of every element."""
        return tuple(self.data.shape[1:])

    def __repr__(self) -> str:
        return f"a sequence<{self.elem_dtype}> of runtime length {self.length}, elements {self.elem_shape}"


class _BodySeq:
    """Inside the body of a runtime ``Loop``: a loop-carried sequence that the loop turns into a
    scan output (:func:`_runtime_seq_loop`). Only ``SequenceInsert`` at its end, ``SequenceLength``
    and ``Identity`` may read it.

    Parameters
    ----------
    onnx_name : str
        The body input it stands for.
    elem_dtype : str
    prefix : SeqValue
        The loop's initial value (a static prefix of elements of one shape).
    iter_name : str
        The body's iteration-number input (the length is ``len(prefix) + i``).
    why : str
        What the loop needs, for error messages.
    """

    def __init__(self, onnx_name: str, elem_dtype: str, prefix: SeqValue, iter_name: str, why: str) -> None:
        self.name: str | None = onnx_name
        self.onnx_name, self.elem_dtype, self.prefix = onnx_name, elem_dtype, prefix
        self.iter_name, self.why = iter_name, why
        #: values computed by SequenceLength of this sequence: a SequenceInsert at one of them
        #: appends
        self.length_values: set[Value] = set()


class _Appended:
    """Inside a runtime ``Loop`` body: ``seq`` with ``elem`` appended (the body's next value)."""

    def __init__(self, seq: _BodySeq, elem: Value) -> None:
        self.seq, self.elem = seq, elem
        self.name: str | None = None


class OptValue:
    """An ONNX optional with a structure known at import: a value, or nothing.

    Parameters
    ----------
    value : Value, SeqValue or None
        The held value; ``None`` for an empty optional.
    """

    def __init__(self, value: "Value | SeqValue | StackedSeq | None") -> None:
        self.value = value
        self.name: str | None = None

    def __repr__(self) -> str:
        return f"OptValue({self.value!r})"


Item = Value | SeqValue | StackedSeq | OptValue | None


def is_container(v: Any) -> bool:
    """Whether ``v`` is a sequence or optional value (not an IR tensor value)."""
    return isinstance(v, (SeqValue, StackedSeq, OptValue, _BodySeq, _Appended))


def structure(v: Item) -> Any:
    """A hashable description of ``v``'s structure and element types (for comparing branches)."""
    if isinstance(v, SeqValue):
        return ("seq", v.elem_dtype, tuple(x.type for x in v.items))
    if isinstance(v, StackedSeq):
        return ("stacked", v.elem_dtype, v.data.type)
    if isinstance(v, OptValue):
        return ("opt", structure(v.value))
    if v is None:
        return None
    return ("tensor", v.type)


def flatten(v: Item) -> list[Value]:
    """The tensor values of ``v``, in layout order."""
    if isinstance(v, SeqValue):
        return list(v.items)
    if isinstance(v, StackedSeq):
        return [v.data]
    if isinstance(v, OptValue):
        return flatten(v.value)
    return [] if v is None else [v]


def rebuild(like: Item, flat: list[Value]) -> Item:
    """``like``'s structure filled with ``flat`` (consumed from the front)."""
    if isinstance(like, SeqValue):
        return SeqValue([flat.pop(0) for _ in like.items], like.elem_dtype)
    if isinstance(like, StackedSeq):
        return StackedSeq(flat.pop(0), like.elem_dtype)
    if isinstance(like, OptValue):
        return OptValue(rebuild(like.value, flat))  # type: ignore[arg-type]
    return None if like is None else flat.pop(0)


#: What a sequence of runtime length supports, for error messages.
_STACKED_OPS = ("SequenceLength, SequenceAt, ConcatFromSequence, SequenceInsert at the end, Identity "
                "and returning it as a graph output")


def _seq(ctx: Context, v: Any, what: str) -> SeqValue:
    """``v`` as a sequence of a length known at import (the list operations need one)."""
    v = _any_seq(ctx, v, what)
    if isinstance(v, StackedSeq):
        raise ctx.unsupported(
            f"input {what!r} is {v!r}; Kiln supports {_STACKED_OPS} on a sequence whose length is "
            "decided at run time"
        )
    return v


def _any_seq(ctx: Context, v: Any, what: str) -> SeqValue | StackedSeq:
    """``v`` as a sequence (of a length known at import or decided at run time)."""
    if isinstance(v, OptValue):
        v = v.value
    if isinstance(v, (_BodySeq, _Appended)):
        bs = v if isinstance(v, _BodySeq) else v.seq
        raise ctx.unsupported(
            f"{bs.why}; the body reads the loop-carried sequence {bs.onnx_name!r} in another way (input {what!r}"
            f"{' after the element is appended' if isinstance(v, _Appended) else ''})"
        )
    if isinstance(v, StackedSeq):
        return v
    if not isinstance(v, SeqValue):
        raise ctx.bad(f"input {what!r} must be a sequence, got {'nothing' if v is None else v.type}")
    return v


def _tensor(ctx: Context, v: Any, what: str) -> Value:
    if not isinstance(v, Value):
        raise ctx.bad(f"input {what!r} must be a tensor, got {v!r}")
    return v


def _position(ctx: Context, v: Value | None, n: int, default: int, insert: bool) -> int:
    if v is None:
        return default
    pos = ctx.static_ints(v, "position")
    if len(pos) != 1:
        raise ctx.bad(f"position must hold one integer, got {list(pos)}")
    p = pos[0]
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ctx.bad(f"position {p} is out of range for a sequence of {n} element(s) (valid: {-n}..{hi})")
    return p + n if p < 0 else p


def _check_len(ctx: Context, n: int) -> None:
    if n > MAX_ELEMENTS:
        raise ctx.unsupported(f"a sequence of {n} elements; Kiln builds at most {MAX_ELEMENTS}")


# ----------------------------------------------------------------------------- sequence ops
@onnx_op("SequenceEmpty")
def _sequence_empty(ctx: Context, node, ins, attrs):
    return [SeqValue((), onnx_dtype(int(attrs.get("dtype", 1))))]


@onnx_op("SequenceConstruct")
def _sequence_construct(ctx: Context, node, ins, attrs):
    items = [_tensor(ctx, v, f"inputs[{k}]") for k, v in enumerate(ins)]
    if not items:
        raise ctx.bad("SequenceConstruct needs at least one input")
    dts = {v.dtype for v in items}
    if len(dts) != 1:
        raise ctx.bad(f"the elements of a sequence must share one dtype, got {sorted(dts)}")
    _check_len(ctx, len(items))
    return [SeqValue(items, items[0].dtype)]


@onnx_op("SequenceInsert")
def _sequence_insert(ctx: Context, node, ins, attrs):
    pos = ins[2] if len(ins) > 2 else None
    if isinstance(ins[0], _BodySeq):
        return [_append_in_body(ctx, ins[0], _tensor(ctx, ins[1], "tensor"), pos)]
    s = _any_seq(ctx, ins[0], "input_sequence")
    t = _tensor(ctx, ins[1], "tensor")
    if t.dtype != s.elem_dtype:
        raise ctx.bad(f"inserting a {t.dtype} tensor into a sequence of {s.elem_dtype}")
    if isinstance(s, StackedSeq):
        return [_append_stacked(ctx, s, t, pos)]
    n = len(s.items)
    _check_len(ctx, n + 1)
    p = _position(ctx, ins[2] if len(ins) > 2 else None, n, n, insert=True)
    return [SeqValue(s.items[:p] + (t,) + s.items[p:], s.elem_dtype)]


@onnx_op("SequenceErase")
def _sequence_erase(ctx: Context, node, ins, attrs):
    s = _seq(ctx, ins[0], "input_sequence")
    n = len(s.items)
    if n == 0:
        raise ctx.bad("erasing from an empty sequence")
    p = _position(ctx, ins[1] if len(ins) > 1 else None, n, n - 1, insert=False)
    return [SeqValue(s.items[:p] + s.items[p + 1 :], s.elem_dtype)]


@onnx_op("SequenceAt")
def _sequence_at(ctx: Context, node, ins, attrs):
    s = _any_seq(ctx, ins[0], "input_sequence")
    if ins[1] is None:
        raise ctx.bad("the position input is missing")
    if isinstance(s, StackedSeq):
        return [_stacked_at(ctx, s, ins[1])]
    n = len(s.items)
    return [s.items[_position(ctx, ins[1], n, 0, insert=False)]]


@onnx_op("SequenceLength")
def _sequence_length(ctx: Context, node, ins, attrs):
    v = ins[0].value if isinstance(ins[0], OptValue) else ins[0]
    if isinstance(v, _BodySeq):
        # inside the body of the loop that appends to it: the prefix, then one element per
        # finished iteration
        it = _tensor(ctx, ctx.env[v.iter_name], "iteration number")
        n = ctx.emit1("add", it, ctx.const(np.array(len(v.prefix.items), dtype=np.int64)))
        v.length_values.add(n)
        return [n]
    s = _any_seq(ctx, v, "input_sequence")
    if isinstance(s, StackedSeq):
        return [_stacked_length(ctx, s)]
    return [ctx.const(np.array(len(s.items), dtype=np.int64))]


# ----------------------------------------------------------------------------- runtime-length sequences
def _stacked_length(ctx: Context, s: StackedSeq) -> Value:
    """The length of ``s`` as an int64 scalar: a ``dim_value`` reading the runtime extent."""
    d = s.length
    if isinstance(d, int):
        return ctx.const(np.array(d, dtype=np.int64))
    shape = ctx.shape_value(np.array(d, dtype=object), "int64")
    return ctx.materialize(shape, "the length of a sequence decided at run time")


def _stacked_at(ctx: Context, s: StackedSeq, pos: Value) -> Value:
    """Element ``pos`` of ``s``: a ``take`` on axis 0, which checks the index against the runtime
    length (a negative one counts from the end, an out-of-range one is a run-time error)."""
    pos = _tensor(ctx, pos, "position")
    if pos.type.size != 1 or pos.dtype not in ("int32", "int64"):
        raise ctx.bad(f"position must be a one-element int32 / int64 tensor, got {pos.type}")
    return ctx.emit1("take", s.data, ctx.reshape(pos, ()), axis=0)


def _append_stacked(ctx: Context, s: StackedSeq, t: Value, pos: Value | None) -> StackedSeq:
    """``SequenceInsert`` at the end of a runtime-length sequence: one more row."""
    if pos is not None:
        raise ctx.unsupported(
            "inserting at a position into a sequence whose length is decided at run time; "
            f"Kiln supports {_STACKED_OPS} on such a sequence (SequenceInsert without a position appends)"
        )
    if t.shape != s.elem_shape or ctx.is_dynamic(t):
        raise ctx.unsupported(
            f"appending an element of dims {ctx.dims(t)} to a sequence of runtime length whose elements "
            f"are {s.elem_shape}: Kiln stacks elements of one static shape only"
        )
    return StackedSeq(ctx.emit1("concatenate", s.data, ctx.reshape(t, (1,) + t.shape), axis=0), s.elem_dtype)


def _append_in_body(ctx: Context, bs: _BodySeq, t: Value, pos: Value | None) -> _Appended:
    """``SequenceInsert`` into a loop-carried sequence inside a runtime ``Loop`` body."""
    if t.dtype != bs.elem_dtype:
        raise ctx.bad(f"inserting a {t.dtype} tensor into a sequence of {bs.elem_dtype}")
    if pos is not None and pos not in bs.length_values:
        raise ctx.unsupported(
            f"{bs.why}; the body inserts into {bs.onnx_name!r} at a position that is not its length "
            "(SequenceInsert without a position, or at SequenceLength of the sequence, appends)"
        )
    return _Appended(bs, t)


@onnx_op("SplitToSequence")
def _split_to_sequence(ctx: Context, node, ins, attrs):
    x = _tensor(ctx, ins[0], "input")
    if ctx.is_dynamic(x):
        raise ctx.unsupported(f"splitting a tensor of symbolic dims {ctx.dims(x)} into a sequence")
    ndim = len(x.shape)
    axis = ctx.axis(int(attrs.get("axis", 0)), ndim)
    dim = x.shape[axis]
    split = ins[1] if len(ins) > 1 else None
    keep = True
    if split is None:
        sizes: tuple[int, ...] = (1,) * dim
        keep = bool(attrs.get("keepdims", 1))
    else:
        arr = np.asarray(ctx.static(split, "split"))
        vals = [int(a) for a in arr.reshape(-1)]
        if any(s < 0 for s in vals):
            raise ctx.bad(f"split sizes must be non-negative, got {vals}")
        if arr.ndim == 0:
            if vals[0] <= 0:
                raise ctx.bad(f"a scalar split must be positive, got {vals[0]}")
            sizes = tuple(min(vals[0], dim - i) for i in range(0, dim, vals[0]))
        else:
            sizes = tuple(vals)
            if sum(sizes) != dim:
                raise ctx.bad(f"split sizes {list(sizes)} do not add up to dim {dim} (axis {axis})")
    _check_len(ctx, len(sizes))
    items: list[Value] = []
    if len(sizes) == 1:
        items = [ctx.emit1("identity", x)]
    elif sizes:
        items = list(ctx.emit("split", [x], {"sections": sizes, "axis": axis}))
    if not keep:
        items = [ctx.reshape(v, v.shape[:axis] + v.shape[axis + 1 :]) for v in items]
    return [SeqValue(items, x.dtype)]


@onnx_op("ConcatFromSequence")
def _concat_from_sequence(ctx: Context, node, ins, attrs):
    s = _any_seq(ctx, ins[0], "input_sequence")
    new_axis = bool(attrs.get("new_axis", 0))
    if isinstance(s, StackedSeq):
        return [_concat_stacked(ctx, s, int(attrs["axis"]), new_axis)]
    if not s.items:
        raise ctx.bad("concatenating an empty sequence")
    ndim = len(s.items[0].shape)
    axis = ctx.axis(int(attrs["axis"]), ndim + 1 if new_axis else ndim)
    items = list(s.items)
    if new_axis:
        items = [ctx.reshape(v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in items]
    if len(items) == 1:
        # one element: the result must still be a value of this node (a reshape is one already)
        return [items[0] if new_axis else ctx.emit1("identity", items[0])]
    return [ctx.emit1("concatenate", *items, axis=axis)]


def _concat_stacked(ctx: Context, s: StackedSeq, axis: int, new_axis: bool) -> Value:
    """``ConcatFromSequence`` of a runtime-length sequence, from its ``[T, *elem]`` tensor.

    ``new_axis`` stacks: the tensor itself, the length axis moved to ``axis`` (a transpose).
    Otherwise the length axis is merged into ``axis``: ``[T, d0, ...] -> [T*d0, ...]``, a free
    alias in the padded layout (the valid rows are a compact prefix); for ``axis > 0`` the
    length axis is first moved in front of ``d_axis``.
    """
    x, shape = s.data, s.elem_shape
    ndim = len(shape)
    if not new_axis and ndim == 0:
        raise ctx.bad("concatenating scalars needs new_axis=1")
    a = ctx.axis(axis, ndim + 1 if new_axis else ndim)
    if a > 0:
        perm = list(range(1, a + 1)) + [0] + list(range(a + 1, ndim + 1))
        x = ctx.emit1("transpose", x, axes=perm)
    if new_axis:
        # the result must be a value of this node, even when no transpose was needed
        return x if a > 0 else ctx.emit1("identity", x)
    dims = list(ctx.dims(x))
    merged = sym.mul(dims[a], dims[a + 1])
    return ctx.reshape_dims(x, dims[:a] + [merged] + dims[a + 2 :])


@onnx_op("SequenceMap")
def _sequence_map(ctx: Context, node, ins, attrs):
    body = attrs["body"].g
    if not ins or ins[0] is None:
        raise ctx.bad("the input sequence is missing")
    first = _seq(ctx, ins[0], "input_sequence")
    n = len(first.items)
    if len(body.input) != len(ins):
        raise ctx.bad(f"body takes {len(body.input)} inputs, the node passes {len(ins)}")
    for k, v in enumerate(ins):
        if isinstance(v, (SeqValue, OptValue)) and len(_seq(ctx, v, f"additional_inputs[{k}]").items) != n:
            raise ctx.bad(
                f"input {k} is a sequence of {len(_seq(ctx, v, '').items)} element(s), "
                f"input 0 of {n}; SequenceMap needs equal lengths"
            )
    consts = {t.name: ctx.const(tensor_to_array(t)) for t in body.initializer}
    outs: list[list[Value]] = [[] for _ in body.output]
    for i in range(n):
        bindings = {vi.name: (_seq(ctx, v, "").items[i] if is_container(v) else v) for vi, v in zip(body.input, ins)}
        for k, v in enumerate(ops_control._run_subgraph(ctx, node, body, consts, bindings)):
            outs[k].append(_tensor(ctx, v, f"body output {k}"))
    result = []
    for k, (vals, vo) in enumerate(zip(outs, body.output)):
        if vals:
            dt = vals[0].dtype
        else:
            tt = vo.type.tensor_type if vo.type.HasField("tensor_type") else None
            if tt is None or not tt.elem_type:
                raise ctx.unsupported(
                    f"body output {k} of a SequenceMap over an empty sequence has no declared element type"
                )
            dt = onnx_dtype(tt.elem_type)
        result.append(SeqValue(vals, dt))
    return result


# ----------------------------------------------------------------------------- optional ops
@onnx_op("Optional")
def _optional(ctx: Context, node, ins, attrs):
    return [OptValue(ins[0] if ins else None)]


@onnx_op("OptionalHasElement")
def _optional_has_element(ctx: Context, node, ins, attrs):
    v = ins[0] if ins else None
    has = v.value is not None if isinstance(v, OptValue) else v is not None
    return [ctx.const(np.array(has))]


@onnx_op("OptionalGetElement")
def _optional_get_element(ctx: Context, node, ins, attrs):
    v = ins[0] if ins else None
    if isinstance(v, OptValue):
        v = v.value
    if v is None:
        raise ctx.bad("OptionalGetElement on an empty optional")
    return [v]


_tensor_identity = _CONVERTERS["Identity"]


@onnx_op("Identity")
def _identity(ctx: Context, node, ins, attrs):
    """A sequence / optional passes through (its elements are values already); tensors as before."""
    v = ins[0] if ins else None
    if isinstance(v, SeqValue):
        return [SeqValue(v.items, v.elem_dtype)]
    if isinstance(v, StackedSeq):
        return [StackedSeq(v.data, v.elem_dtype)]
    if isinstance(v, OptValue):
        return [OptValue(v.value)]
    if isinstance(v, (_BodySeq, _Appended)):
        return [v]  # (inside a runtime Loop body: the same sequence)
    return _tensor_identity(ctx, node, ins, attrs)


# ----------------------------------------------------------------------------- control flow
_tensor_if, _tensor_loop = _CONVERTERS["If"], _CONVERTERS["Loop"]


def _declares_container(graph) -> bool:
    return any(vo.type.WhichOneof("value") not in (None, "tensor_type") for vo in graph.output)


@onnx_op("If")
def _if(ctx: Context, node, ins, attrs):
    """``If`` whose branches may give sequences / optionals.

    With a condition known at import the chosen branch is inlined, containers included. At run
    time both branches must give the same structure (lengths, element types): the elements
    become ordinary outputs of an IR ``if`` node.
    """
    then_b, else_b = attrs["then_branch"].g, attrs["else_branch"].g
    if not (_declares_container(then_b) or _declares_container(else_b)):
        return _tensor_if(ctx, node, ins, attrs)
    if not ins or ins[0] is None:
        raise ctx.bad("the condition input is missing")
    arr = ctx.try_static(ins[0])
    if arr is not None:
        flat = np.asarray(arr).reshape(-1)
        if flat.size != 1:
            raise ctx.bad(f"the condition must hold one element, it has {flat.size}")
        branch = then_b if bool(flat[0]) else else_b
        consts = {t.name: ctx.const(tensor_to_array(t)) for t in branch.initializer}
        outs = ops_control._run_subgraph(ctx, node, branch, consts, {}, what="branch")
        return [_distinct(ctx, v, ins) for v in outs]
    return _runtime_if(ctx, node, ins[0], then_b, else_b)


def _distinct(ctx: Context, v: Any, ins: Sequence[Any]) -> Any:
    if is_container(v):
        return v
    outer = set(ctx.env.values())
    return ctx.emit1("identity", v) if v in ins or v in outer else v


def _convert_branch(ctx: Context, node, graph, label: str, captures) -> tuple[Any, list[Item]]:
    """An If branch as an IR graph whose outputs are the flattened container outputs."""
    items: list[Item] = []

    def flat_outputs(sub: Any, outs: list[Any]) -> list[Value]:
        items.extend(outs)
        flat = [v for o in outs for v in flatten(o)]
        # a branch output that is one of its inputs (or repeated) is still a value of its own
        seen: set[Value] = set(sub.inputs)
        for k, v in enumerate(flat):
            if v in seen or v.is_constant:
                flat[k] = ctx.emit1("identity", v)
            seen.add(flat[k])
        return flat

    sub = ops_control._convert_subgraph(ctx, node, graph, label, (), captures, flat_outputs)
    return sub, items


def _runtime_if(ctx: Context, node, cond: Value, then_b, else_b) -> list[Item]:
    if cond.type.size != 1:
        raise ctx.bad(f"the condition must hold one element, it has {cond.type.size}")
    if cond.dtype != "bool":
        cond = ctx.cast(cond, "bool")
    captures = ops_control._captures(ctx, [then_b, else_b], set())  # refuses outer sequences
    then_g, then_outs = _convert_branch(ctx, node, then_b, "then", captures)
    else_g, else_outs = _convert_branch(ctx, node, else_b, "else", captures)
    a, b = [structure(v) for v in then_outs], [structure(v) for v in else_outs]
    if a != b:
        raise ctx.unsupported(
            f"the branches give sequences / optionals of different structure (then {a}, else {b}); "
            "Kiln fixes a sequence's length and element types at compile time, so the condition "
            "must be known at compile time (freeze it)"
        )
    if not then_g.outputs:
        return [rebuild(o, []) for o in then_outs]
    ins = [cond] + [v for _, v in captures if not v.is_constant]
    # (a copy: rebuild consumes it, and emit may hand back the node's own output list)
    flat = list(ctx.emit("if", ins, {"then_branch": Subgraph(then_g), "else_branch": Subgraph(else_g)}))
    return [rebuild(o, flat) for o in then_outs]


@onnx_op("Loop")
def _loop(ctx: Context, node, ins, attrs):
    """``Loop`` carrying sequences / optionals.

    With trip count and condition known at import it is unrolled (the sequences' structure
    changes with the iterations). Otherwise, and past :data:`ops_control.MAX_UNROLL`
    iterations, the loop runs at run time when its sequences only grow by one element per
    iteration (:func:`_runtime_seq_loop`).
    """
    carried = list(ins[2:])
    if not any(is_container(v) for v in carried):
        return _tensor_loop(ctx, node, ins, attrs)
    body = attrs["body"].g
    n_carried = len(carried)
    if len(body.input) != 2 + n_carried:
        raise ctx.bad(f"body takes {len(body.input)} inputs, expected 2 + {n_carried}")
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0:
        raise ctx.bad(f"body has {len(body.output)} outputs, expected at least 1 + {n_carried}")
    if any(v is None for v in carried):
        raise ctx.bad("loop-carried initial values may not be omitted")
    m_v = ins[0] if len(ins) > 0 else None
    cond_v = ins[1] if len(ins) > 1 else None
    if m_v is None and cond_v is None:
        raise ctx.unsupported("a Loop without trip count or condition runs forever")

    def at_run_time(why: str, trip: int | None = None) -> list[Item]:
        return _runtime_seq_loop(ctx, node, body, m_v, cond_v, list(ins[2:]), n_scan, why, trip)

    static_trip: int | None = None
    if m_v is not None:
        arr = ctx.try_static(m_v)
        if arr is None:
            return at_run_time("its trip count M")
        static_trip = int(np.asarray(arr).reshape(()))
    trip = ops_control.MAX_UNROLL + 1 if static_trip is None else static_trip
    cond = True
    if cond_v is not None:
        arr = ctx.try_static(cond_v)
        if arr is None:
            return at_run_time("its condition", static_trip)
        cond = bool(np.asarray(arr).reshape(()))
    consts = {t.name: ctx.const(tensor_to_array(t)) for t in body.initializer}
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    it = 0
    while cond and it < trip:
        if it >= ops_control.MAX_UNROLL:
            # the copies made so far are dead code (pruned at the end of the import)
            return at_run_time(f"it runs more than {ops_control.MAX_UNROLL} iterations", static_trip)
        bindings: dict[str, Any] = {
            body.input[0].name: ctx.const(np.array(it, dtype=np.int64)),
            body.input[1].name: ctx.const(np.array(cond)),
        }
        bindings.update({vi.name: v for vi, v in zip(body.input[2:], carried)})
        outs = ops_control._run_subgraph(ctx, node, body, consts, bindings)
        c = ctx.try_static(outs[0])
        if c is None:
            return at_run_time("the body's continue condition", static_trip)
        cond = bool(np.asarray(c).reshape(()))
        carried = list(outs[1 : 1 + n_carried])
        for k, v in enumerate(outs[1 + n_carried :]):
            scans[k].append(_tensor(ctx, v, f"scan output {k}"))
        it += 1
    results: list[Any] = [_distinct(ctx, v, ins) for v in carried]
    for k, vals in enumerate(scans):
        if not vals:
            raise ctx.unsupported(f"scan output {k} of a zero-iteration Loop has no static type")
        rows = [ctx.reshape(v, (1,) + v.shape) for v in vals]
        results.append(rows[0] if len(rows) == 1 else ctx.emit1("concatenate", *rows, axis=0))
    return results


def _runtime_seq_loop(
    ctx: Context, node, body, m_v: Value | None, cond_v: Value | None, carried: list[Any], n_scan: int,
    why: str, trip: int | None,
) -> list[Item]:
    """A ``Loop`` carrying sequences, run at run time: each sequence becomes a scan output.

    A loop-carried sequence qualifies when its initial value holds elements of one static shape
    (often none) and the body appends one element of that shape per iteration (``SequenceInsert``
    without a position or at ``SequenceLength`` of it), reading it in no other way. The body
    then converts with the sequence replaced by a :class:`_BodySeq`; the appended element is
    one more scan output of the IR ``loop`` node (``[T, *elem]``, ``T`` the data-dependent
    iteration count), and the result is a :class:`StackedSeq` (the initial elements
    concatenated in front). A sequence the body leaves unchanged keeps its initial value.
    """
    need = (
        f"the Loop node {node.name!r} is decided at run time ({why}) and carries a sequence; Kiln compiles "
        "that only when "
        "the body appends one element of a fixed shape per iteration (SequenceInsert at the end) and "
        "reads the sequence in no other way (otherwise the loop must be unrolled: freeze its trip "
        "count and condition)"
    )
    n_carried = len(carried)
    seqs: dict[int, _BodySeq] = {}
    for k, v in enumerate(carried):
        if not is_container(v):
            continue
        name = body.input[2 + k].name
        if not isinstance(v, SeqValue):
            raise ctx.unsupported(
                f"{need}; loop-carried value {k} ({name!r}) starts as {v!r}, not a sequence of a length "
                "known at compile time"
            )
        shapes = {x.type for x in v.items}
        if len(shapes) > 1 or any(t.is_dynamic for t in shapes):
            raise ctx.unsupported(
                f"{need}; the initial elements of loop-carried sequence {k} ({name!r}) have different "
                f"or symbolic shapes ({sorted(str(t) for t in shapes)}), Kiln stacks elements of one static shape"
            )
        seqs[k] = _BodySeq(name, v.elem_dtype, v, body.input[0].name, need)
    tensors = [v for k, v in enumerate(carried) if k not in seqs]
    leading = [(body.input[0].name, TensorType((), "int64")), (body.input[1].name, TensorType((), "bool"))]
    leading += [(body.input[2 + k].name, v.type) for k, v in enumerate(carried) if k not in seqs]
    captures = ops_control._captures(ctx, [body], {vi.name for vi in body.input})
    appended: dict[int, Value] = {}

    def outputs(sub: Any, outs: list[Any]) -> list[Value]:
        ctx.node = node  # (errors and values from here on belong to the Loop node)
        flat = [_tensor(ctx, outs[0], "the body's condition")]
        for k, o in enumerate(outs[1 : 1 + n_carried]):
            bs = seqs.get(k)
            if bs is None:
                flat.append(_tensor(ctx, o, f"the body's loop-carried output {k}"))
            elif isinstance(o, _Appended) and o.seq is bs:
                elem = o.elem
                first = bs.prefix.items[0] if bs.prefix.items else None
                if ctx.is_dynamic(elem) or (first is not None and elem.shape != first.shape):
                    raise ctx.unsupported(
                        f"{need}; the body appends elements of dims {ctx.dims(elem)} to loop-carried sequence "
                        f"{k} ({bs.onnx_name!r})"
                        + (f", whose initial elements are {first.shape}" if first is not None else "")
                        + ": Kiln stacks elements of one static shape (ragged sequences need the loop unrolled)"
                    )
                appended[k] = elem
            elif o is not bs:
                raise ctx.unsupported(
                    f"{need}; the body's next value of loop-carried sequence {k} ({bs.onnx_name!r}) is not "
                    f"that sequence with one element appended (got {o!r})"
                )
        for j, o in enumerate(outs[1 + n_carried :]):
            flat.append(_tensor(ctx, o, f"scan output {j}"))
        seen = set(sub.inputs) | set(flat)
        for k, elem in appended.items():
            # an appended element that is a body input or another output still gets rows of its own
            if elem in seen:
                appended[k] = elem = ctx.emit1("identity", elem)
            seen.add(elem)
            flat.append(elem)
        return flat

    bindings: dict[str, Any] = {bs.onnx_name: bs for bs in seqs.values()}
    body_g = ops_control._convert_subgraph(ctx, node, body, "body", leading, captures, outputs, bindings)
    n_all = n_scan + len(appended)
    ops_control.check_scan_nesting(ctx, n_all, why)
    if not tensors and not n_all:
        raise ctx.unsupported("a runtime Loop that leaves its sequences unchanged and has no other output "
                              "computes nothing Kiln can return")
    m, c = ops_control.loop_controls(ctx, m_v, cond_v)
    outs = ops_control.emit_loop(ctx, node, body_g, m, c, tensors, captures, n_all, why, trip)
    tensor_outs = list(outs[: len(tensors)])
    scan_outs = list(outs[len(tensors) : len(tensors) + n_scan])
    stacks = dict(zip(appended, outs[len(tensors) + n_scan :]))
    results: list[Item] = []
    for k, v in enumerate(carried):
        if k not in seqs:
            results.append(tensor_outs.pop(0))
        elif k in stacks:
            results.append(_with_prefix(ctx, seqs[k].prefix, stacks[k]))
        else:
            results.append(v)
    return results + scan_outs


def _with_prefix(ctx: Context, prefix: SeqValue, stack: Value) -> StackedSeq:
    """The runtime-length sequence ``prefix`` followed by the rows of ``stack``."""
    if not prefix.items:
        return StackedSeq(stack, prefix.elem_dtype)
    rows = [ctx.reshape(x, (1,) + x.shape) for x in prefix.items]
    return StackedSeq(ctx.emit1("concatenate", *rows, stack, axis=0), prefix.elem_dtype)


# ----------------------------------------------------------------------------- graph inputs / outputs
def _elem_tensor_type(ctx: Context, tp, what: str) -> tuple[str, Any]:
    """(kind, payload) of an ONNX TypeProto: ("tensor", tensor_type), ("sequence", elem TypeProto),
    ("optional", elem TypeProto)."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return "tensor", tp.tensor_type
    if kind == "sequence_type":
        return "sequence", tp.sequence_type.elem_type
    if kind == "optional_type":
        return "optional", tp.optional_type.elem_type
    raise UnsupportedOpError(
        f"{what} has type {kind}; Kiln supports tensors, sequences of tensors and optionals of those"
    )


def container_input(
    ctx: Context, vi, spec: Any, frozen: Mapping[str, Any], dtype: str | None
) -> tuple[Any, dict[str, Any]]:
    """The import-time value of a sequence / optional graph input, and its layout.

    Parameters
    ----------
    ctx : Context
    vi : onnx.ValueInfoProto
        The graph input (of sequence or optional type).
    spec : any
        ``shape=`` for it: a list of element dims for a sequence (one entry per element), or
        ``(length symbol, *element dims)`` for a sequence of runtime length; the dims of an
        optional tensor; None if not given.
    frozen : dict
        ``freeze=``: a value here makes the input a constant (``None``: an absent optional; a
        list of arrays: a constant sequence).
    dtype : str, optional
        Element dtype override.

    Returns
    -------
    value : SeqValue, StackedSeq or OptValue
    layout : dict
        Its ``kiln_values`` input layout (``docs/sequences.md``); ``{}`` for a frozen input
        (but an absent optional frozen to None keeps a layout: it takes ``None``).
    """
    name = vi.name
    what = f"graph input {name!r}"
    kind, payload = _elem_tensor_type(ctx, vi.type, what)
    if name in frozen:
        # an absent optional stays an input that takes only None (the module's interface keeps
        # it); any other frozen value is a constant, no longer an input
        absent = kind == "optional" and frozen[name] is None
        return _frozen(ctx, kind, payload, frozen[name], what), {"kind": "optional", "value": None} if absent else {}
    if kind == "optional":
        inner_kind, inner = _elem_tensor_type(ctx, payload, what + " (its element)")
        if inner_kind == "tensor":
            if spec is None:
                raise InputError(
                    f"{what} is an optional tensor: pass shape={{{name!r}: dims}} (or "
                    f"freeze={{{name!r}: None}} for an absent value)"
                )
            arg = f"{name}.value"
            v = _add_input(ctx, arg, spec, dtype or onnx_dtype(inner.elem_type), what)
            return OptValue(v), {"kind": "optional", "value": {"kind": "tensor", "arg": arg}}
        if inner_kind != "sequence":
            raise UnsupportedOpError(f"{what}: an optional of {inner_kind} is not supported")
        seq, lay = _seq_input(ctx, name, inner, spec, dtype, what)
        return OptValue(seq), {"kind": "optional", "value": lay}
    if kind != "sequence":
        raise UnsupportedOpError(f"{what}: unexpected type {kind}")
    return _seq_input(ctx, name, payload, spec, dtype, what)


def stacked_spec(spec: Any) -> bool:
    """Whether a ``shape=`` entry declares a sequence of runtime length: ``("n", 3)`` (a length
    symbol, then the dims every element has), not ``[(2, 3), (4, 3)]`` (one entry per element)."""
    return (
        isinstance(spec, Sequence)
        and not isinstance(spec, (str, bytes))
        and len(spec) > 0
        and isinstance(spec[0], str)
    )


def _seq_input(
    ctx: Context, name: str, elem_tp, spec: Any, dtype: str | None, what: str
) -> tuple[SeqValue | StackedSeq, dict[str, Any]]:
    kind, tt = _elem_tensor_type(ctx, elem_tp, what + " (its elements)")
    if kind != "tensor":
        raise UnsupportedOpError(f"{what}: a sequence of {kind} values is not supported")
    if stacked_spec(spec):
        return _stacked_input(ctx, name, tt, spec, dtype, what)
    if spec is None or isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise InputError(
            f"{what} is a sequence: pass shape={{{name!r}: [dims of element 0, dims of "
            f"element 1, ...]}} (Kiln fixes a sequence's length and element shapes "
            f"at compile time), got {spec!r}"
        )
    if not tt.elem_type and dtype is None:
        raise InputError(f"{what}: the model does not declare the element type; pass dtype=")
    dt = dtype or onnx_dtype(tt.elem_type)
    _check_len(ctx, len(spec))
    items, args = [], []
    for k, dims in enumerate(spec):
        arg = f"{name}.{k}"
        items.append(_add_input(ctx, arg, dims, dt, f"{what} element {k}"))
        args.append({"kind": "tensor", "arg": arg})
    return SeqValue(items, dt), {"kind": "sequence", "elem_dtype": dt, "items": args}


def _stacked_input(
    ctx: Context, name: str, tt, spec: Any, dtype: str | None, what: str
) -> tuple[StackedSeq, dict[str, Any]]:
    """A sequence input of runtime length: one tensor argument ``<name>.stacked`` of dims
    ``(n, *elem)`` (``n``'s range from ``dim_ranges=``, declared with the tensor inputs')."""
    if not tt.elem_type and dtype is None:
        raise InputError(f"{what}: the model does not declare the element type; pass dtype=")
    dt = dtype or onnx_dtype(tt.elem_type)
    elem = tuple(spec[1:])
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in elem):
        raise InputError(
            f"shape= for {what} declares a sequence of runtime length {spec[0]!r}: the element dims after it "
            f"must be non-negative ints (every element has one static shape), got {tuple(elem)!r}"
        )
    arg = f"{name}.stacked"
    dims = (sym.canonical(spec[0]),) + tuple(int(d) for d in elem)
    ctx.check_size(ctx.upper(dims), what)
    try:
        v = ctx.graph.add_input(arg, dims, dt)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None
    lay = {"kind": "sequence", "elem_dtype": dt, "stacked": {"kind": "tensor", "arg": arg}}
    return StackedSeq(v, dt), lay


def _add_input(ctx: Context, name: str, dims: Any, dt: str, what: str) -> Value:
    if (
        isinstance(dims, (str, bytes))
        or not isinstance(dims, Sequence)
        or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims)
    ):
        raise InputError(f"shape= for {what} must be a sequence of non-negative ints, got {dims!r}")
    shape = tuple(int(d) for d in dims)
    ctx.check_size(shape, what)
    try:
        return ctx.graph.add_input(name, shape, dt)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None


def _frozen(ctx: Context, kind: str, payload, value: Any, what: str) -> Item:
    if kind == "optional":
        if value is None:
            return OptValue(None)
        inner_kind, inner = _elem_tensor_type(ctx, payload, what)
        held = _frozen(ctx, inner_kind, inner, value, what)
        assert not isinstance(held, OptValue)  # (ONNX has no optional of an optional)
        return OptValue(held)
    if kind == "sequence":
        if not isinstance(value, (list, tuple)):
            raise InputError(f"freeze= for {what} (a sequence) must be a list of arrays, got {type(value).__name__}")
        _, tt = _elem_tensor_type(ctx, payload, what)
        dt = onnx_dtype(tt.elem_type) if tt.elem_type else None
        arrs = [np.asarray(a) for a in value]
        if dt is None and not arrs:
            raise InputError(f"{what}: an empty frozen sequence without a declared element type")
        dt = dt or str(arrs[0].dtype)
        _check_len(ctx, len(arrs))
        return SeqValue([ctx.const(a.astype(dt, copy=False)) for a in arrs], dt)
    if value is None:
        raise InputError(f"freeze= for {what} (a tensor) is None")
    return ctx.const(np.asarray(value).astype(onnx_dtype(payload.elem_type), copy=False))


def flatten_outputs(
    ctx: Context, outputs: Sequence[Item], names: Sequence[str]
) -> tuple[list[Value], list[dict[str, Any]] | None]:
    """The graph's tensor outputs and the ``kiln_values`` layouts regrouping them.

    Parameters
    ----------
    ctx : Context
    outputs : sequence of Value, SeqValue, StackedSeq or OptValue
        The model's outputs, in order.
    names : sequence of str
        Their ONNX names.

    Returns
    -------
    flat : list of Value
        The tensor outputs of the IR graph (a sequence's elements in order; a runtime-length
        sequence's one ``[T, *elem]`` tensor). An element that is a graph input, a constant or
        repeated gets an ``identity`` of its own.
    outputs_layout : list of dict, or None
        One layout per model output (``{"kind": "tensor", "head": i}``, ...); None when every
        output is a tensor (the graph JSON then stays as before).
    """
    flat: list[Value] = []
    seen: set[Value] = set(ctx.graph.inputs)

    def head(v: Value) -> dict[str, Any]:
        if v in seen or v.is_constant:
            v = ctx.emit1("identity", v)
        seen.add(v)
        flat.append(v)
        return {"kind": "tensor", "head": len(flat) - 1}

    def layout(v: Item) -> dict[str, Any]:
        if isinstance(v, SeqValue):
            return {"kind": "sequence", "elem_dtype": v.elem_dtype, "items": [head(x) for x in v.items]}
        if isinstance(v, StackedSeq):
            return {"kind": "sequence", "elem_dtype": v.elem_dtype, "stacked": head(v.data)}
        if isinstance(v, OptValue):
            return {"kind": "optional", "value": None if v.value is None else layout(v.value)}
        assert v is not None
        flat.append(v)  # a tensor output stays what the tensor-only import gives
        seen.add(v)
        return {"kind": "tensor", "head": len(flat) - 1}

    if not any(is_container(v) for v in outputs):
        return [v for v in outputs if isinstance(v, Value)], None
    lays = []
    for v, name in zip(outputs, names):
        lay = layout(v)
        lay["name"] = str(name)
        lays.append(lay)
    return flat, lays
