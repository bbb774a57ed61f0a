"""ONNX GraphProto -> Kiln IR.

The converter walks the ONNX nodes in order and calls one converter function per op type
(registered with :func:`onnx_op`). While converting it folds every node whose inputs are all
constants, so shape computations (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``) end up
as static attributes. Initializers become parameter placeholders (graph inputs) whose arrays are
returned in ``params``; converters may still read their values when an input must be static
(a Reshape shape, Resize scales, ...). Parameters only used that way disappear from the graph.
A node of an op type without a converter is evaluated at import when its inputs are static
(:mod:`.fold`); only unsupported nodes that may see runtime values make the import fail.

A model is untrusted input: every way it can be malformed ends in a Kiln error naming the
offending node, tensor or value, never in a raw Python exception. Three layers see to it:
:func:`load_onnx` turns undecodable bytes into a :class:`FormatError`; before a converter runs,
the node is checked against its ONNX schema (input count, required inputs and attributes,
attribute types) and its attributes come in a :class:`NodeAttrs` that names a missing one; and
any exception a converter still raises is re-raised as an :class:`InputError` naming the node
(chained, so a Kiln bug stays debuggable). Declared sizes are capped by
:data:`MAX_TENSOR_ELEMENTS` before anything is allocated for them.
"""

from __future__ import annotations

import functools
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...ir import Graph, Value, dead_code_elimination, get_op
from ...ir.types import DTYPES, TensorType, np_dtype
from ...runtime import sym
from ..dims import dim_value
from ...runtime.errors import (FormatError, InputError, KilnError, KilnFileNotFoundError,
                               UnsupportedOpError)
from ...runtime.sym import Dim
from . import symvalues
from .fold import DATA_DEPENDENT, blocking_nodes, converter_key, fold_node, is_default_domain, static_names

__all__ = ["from_onnx", "load_onnx", "onnx_op", "Context", "supported_ops", "convert_nodes", "symbol_names",
           "NodeAttrs", "check_size", "MAX_TENSOR_ELEMENTS", "conversion_errors"]

ConverterFn = Callable[["Context", Any, list, dict], "list[Value] | Value"]
_CONVERTERS: dict[str, ConverterFn] = {}

#: Results of frontend folding larger than this (elements) stay as runtime ops unless they are
#: no larger than their inputs (so e.g. an Expand of a scalar to a huge shape is not materialised).
FOLD_LIMIT = 1 << 16
#: Non-float initializers and tiny float ones become constants rather than params.
SMALL_INIT = 16
#: Largest number of elements a model may declare for one tensor (graph input, initializer,
#: constant, node output): 2**32, i.e. 16 GiB of float32. Far above any tensor of a model Kiln
#: deploys, and low enough that a corrupt or hostile dim (2**40, 2**62) is refused at import
#: instead of surfacing as a MemoryError here or an overflow in a code generator.
MAX_TENSOR_ELEMENTS = 1 << 32


def check_size(shape: Sequence[int], what: str) -> None:
    """InputError unless ``shape`` has non-negative dims and at most MAX_TENSOR_ELEMENTS elements.

    Parameters
    ----------
    shape : sequence of int
        A declared shape.
    what : str
        The thing that declares it, for the message (``"graph input 'x'"``).
    """
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise InputError(f"{what} declares a negative dimension in shape {tuple(dims)}")
    # math.prod on Python ints: no int64 wrap-around for absurd dims
    if math.prod(dims) > MAX_TENSOR_ELEMENTS:
        raise InputError(f"{what} declares shape {tuple(dims)} with {math.prod(dims)} elements; "
                         f"Kiln accepts at most {MAX_TENSOR_ELEMENTS} elements per tensor")


def onnx_op(*op_types: str) -> Callable[[ConverterFn], ConverterFn]:
    """Register a converter ``fn(ctx, node, inputs, attrs)`` for ONNX op types.

    An op outside the default domain is registered as ``"domain.OpType"`` (``"ai.onnx.ml.Binarizer"``).
    """

    def deco(fn: ConverterFn) -> ConverterFn:
        for t in op_types:
            _CONVERTERS[t] = fn
        return fn

    return deco


def supported_ops() -> list[str]:
    """ONNX op types the frontend converts."""
    _load_converters()
    return sorted(_CONVERTERS)


def _load_converters() -> None:
    from . import ops_control, ops_math, ops_nn, ops_tensor  # noqa: F401
    from . import ops_attention, ops_index, ops_integer, ops_loss, ops_recurrent, ops_spatial  # noqa: F401
    from . import ops_ml  # noqa: F401
    from . import ops_text  # noqa: F401  (TfIdfVectorizer)
    from . import ops_dynamic  # noqa: F401  (after ops_index, ops_math, ops_tensor: takes over Compress, TopK, Range)
    from . import ops_string  # noqa: F401  (after ops_math: wraps Equal for strings)
    from . import ops_sequence  # noqa: F401  (after ops_control, ops_tensor: wraps If, Loop, Identity)


def _elem_type_name(elem_type: int) -> str:
    import onnx

    if elem_type in onnx.TensorProto.DataType.values():
        return onnx.TensorProto.DataType.Name(elem_type)
    return f"#{elem_type} (not an ONNX element type)"


def onnx_dtype(elem_type: int) -> str:
    """IR dtype name of an ONNX TensorProto element type; UnsupportedOpError if none."""
    import onnx

    try:
        name = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # noqa: BLE001  (onnx raises KeyError / ValueError / TypeError)
        name = None
    if elem_type == onnx.TensorProto.BFLOAT16:
        name = "bfloat16"
    if elem_type == onnx.TensorProto.STRING:
        name = "string"
    if name not in DTYPES:
        raise UnsupportedOpError(f"ONNX element type {_elem_type_name(elem_type)} is not "
                                 f"supported")
    return name


def tensor_to_array(t: Any, what: str | None = None) -> np.ndarray:
    """NumPy array of a TensorProto (bfloat16 via ml_dtypes).

    Parameters
    ----------
    t : onnx.TensorProto
    what : str, optional
        How to name the tensor in errors (default: ``tensor '<name>'``).

    Raises
    ------
    UnsupportedOpError
        String tensors and element types Kiln has no dtype for.
    InputError
        Dims that are negative or declare more than :data:`MAX_TENSOR_ELEMENTS` elements.
    FormatError
        Data that does not match the dims and element type (wrong byte count, external data
        that was not loaded, ...).
    """
    import onnx
    from onnx import numpy_helper

    what = what or f"tensor {t.name!r}"
    if t.data_type == onnx.TensorProto.STRING:
        check_size(t.dims, what)
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.string_data) != math.prod(t.dims):
            raise FormatError(f"{what}: a string tensor of shape {tuple(t.dims)} must hold "
                              f"{math.prod(t.dims)} string_data entries, it has {len(t.string_data)}")
        from ...runtime.strings import to_string_array

        return to_string_array(np.array(list(t.string_data), dtype=object).reshape(tuple(t.dims)), what)
    dtype = onnx_dtype(t.data_type)
    check_size(t.dims, what)
    try:
        arr = numpy_helper.to_array(t)
    except Exception as exc:  # noqa: BLE001  (numpy / onnx raise ValueError, TypeError, ...)
        raise FormatError(f"{what}: its data does not hold a {_elem_type_name(t.data_type)} "
                          f"tensor of shape {tuple(t.dims)} ({type(exc).__name__}: {exc})"
                          ) from exc
    if dtype == "bfloat16" and arr.dtype != np_dtype("bfloat16"):
        arr = arr.astype(np_dtype("bfloat16"))
    return arr


class NodeAttrs(dict):
    """A node's attributes by name; reading a missing one raises an InputError naming the node.

    Converters index required attributes (``attrs["ends"]``) and ``.get`` optional ones, so a
    model that omits a required attribute gets "Slice node 's': required attribute 'ends' is
    missing" instead of a bare ``KeyError``.
    """

    def __init__(self, values: Mapping[str, Any], where: str, opset: int) -> None:
        super().__init__(values)
        self.where = where
        self.opset = opset

    def __missing__(self, key: str) -> Any:
        raise InputError(f"{self.where}: required attribute {key!r} is missing (the node has "
                         f"{sorted(map(str, self)) or 'no attributes'}; opset {self.opset})")


class Context:
    """State shared by the op converters.

    Attributes
    ----------
    graph : Graph
        The graph being built.
    opset : int
        Opset of the default ONNX domain.
    node : onnx.NodeProto
        The node being converted.
    """

    def __init__(self, opset: int, name: str) -> None:
        self.graph = Graph(name)
        self.opset = opset
        self.node: Any = None
        self.param_values: dict[Value, np.ndarray] = {}
        #: Opset per domain ("" included), for evaluating nodes at import (:mod:`.fold`).
        self.opsets: dict[str, int] = {"": opset}
        #: (errors, [skipped]) while :func:`conversion_errors` runs: the top-level
        #: :func:`convert_nodes` records node errors there instead of raising.
        self.collect: tuple[list[dict[str, str]], list[int]] | None = None
        #: ONNX name -> IR value of the graph being converted (subgraphs read outer names).
        self.env: dict[str, Value] = {}
        #: Symbolic shape values (:mod:`.symvalues`): value -> object array of its dims. Such a
        #: value is never added to the graph; :meth:`emit` evaluates ops on it at import.
        self.sym_values: dict[Value, np.ndarray] = {}
        #: ONNX names static at import (:func:`.fold.static_names`): data-dependent ops on them
        #: are evaluated at import instead of compiled
        self.onnx_static: set[str] = set()

    # -------------------------------------------------------------- emitting
    @property
    def where(self) -> str:
        n = self.node
        return f"{n.op_type} node {n.name!r}" if n is not None else "graph"

    def emit(self, op: str, inputs: Sequence[Value], attrs: dict[str, Any] | None = None
             ) -> list[Value]:
        """Add a node, or fold it to constants when every input is a constant."""
        inputs = list(inputs)
        name = self.node.name if self.node is not None else None
        if self.sym_values and any(v in self.sym_values for v in inputs):
            return self._emit_symbolic(op, inputs, attrs)
        # An op given symbolic output dims (``sym_shape``) is never folded: its constant would
        # have the upper-bound shape.
        dynamic = attrs is not None and any(k.startswith("sym_") and a is not None
                                            for k, a in attrs.items())
        if inputs and op != "constant" and not dynamic and all(v.is_constant for v in inputs):
            try:
                opdef, norm, types = _checked(op, inputs, attrs)
            except InputError as exc:
                raise InputError(f"{op} node {name!r}: {exc}") from None
            in_size = sum(v.type.size for v in inputs)
            if sum(t.size for t in types) <= max(FOLD_LIMIT, in_size):
                outs = opdef.ref([v.const_value for v in inputs], norm)
                return [self.const(np.asarray(o).astype(np_dtype(t.dtype), copy=False)
                                   .reshape(t.shape)) for o, t in zip(outs, types)]
        return self.graph.add_node(op, inputs, attrs, name=name)

    def _emit_symbolic(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None
                       ) -> list[Value]:
        """:meth:`emit` of an op reading a symbolic shape value: evaluated at import when the
        dims determine the result, else emitted on the value computed at run time
        (:meth:`materialize`) — never on the upper bounds."""
        try:
            opdef, norm, types = _checked(op, inputs, attrs)
        except InputError as exc:
            raise self.bad(f"{op}: {exc}") from None
        if all(v.is_constant or v in self.sym_values for v in inputs):
            vals = [self.sym_values[v] if v in self.sym_values else symvalues.to_object(_const(v))
                    for v in inputs]
            try:
                outs = symvalues.evaluate(op, opdef.ref, vals, norm, [t.dtype for t in types],
                                          self.graph.dim_ranges)
            except (symvalues.Unresolved, InputError) as exc:
                reason = str(exc)
            else:
                return [self.shape_value(o, t.dtype) for o, t in zip(outs, types)]
        else:
            reason = "it is combined with a tensor computed at run time"
        # Not a function of the dims alone (sqrt(seq), seq as an index stride): compute the
        # dims as tensor data at run time and emit the op on that.
        ins = [self.materialize(v, reason) if v in self.sym_values else v for v in inputs]
        return self.emit(op, ins, attrs)

    def materialize(self, v: Value, reason: str = "") -> Value:
        """The symbolic shape value ``v`` as a tensor computed at run time.

        A symbolic dim ``d`` is a ``dim_value`` node over values that carry its symbols
        (:func:`kiln.frontend.dims.dim_value`): the kernel reads their runtime extents. Raises an
        UnsupportedOpError naming the node for a dim that may be negative.
        """
        arr = self.sym_values[v]
        parts = []
        for x in arr.reshape(-1):
            try:
                d = symvalues.to_dim(x)
            except symvalues.Unresolved as exc:
                raise self.unsupported(f"the shape value {symvalues.describe(arr)}: {exc}") from None
            if isinstance(d, int):
                parts.append(self.const(np.array([d], dtype=np.int64)))
                continue
            lo, hi = sym.bounds(d, self.graph.dim_ranges)
            if lo < 0:
                raise UnsupportedOpError(
                    f"{self.where}: the shape value {symvalues.describe(arr)} is needed as "
                    f"tensor data ({reason}), but its entry {d} may be negative ({lo}..{hi}), "
                    f"which Kiln cannot compute from the symbolic dims")
            parts.append(dim_value(self.graph, d))
        out = parts[0] if len(parts) == 1 else self.emit1("concatenate", *parts, axis=0)
        out = self.cast(out, v.dtype)
        return self.reshape(out, v.shape)

    def shape_value(self, content: Any, dtype: str) -> Value:
        """A value holding ``content`` (an array of dims): a constant when every entry is an
        int, else a symbolic shape value (:attr:`sym_values`) of dtype ``dtype``."""
        arr = np.asarray(content, dtype=object) if not isinstance(content, np.ndarray) \
            or content.dtype != object else content
        if not symvalues.has_symbols(arr):
            return self.const(np.asarray(arr.tolist(), dtype=np_dtype(dtype)).reshape(arr.shape))
        v = Value(TensorType(arr.shape, dtype))  # never added to the graph
        self.sym_values[v] = arr
        return v

    def emit1(self, op: str, *inputs: Value, **attrs: Any) -> Value:
        """Single-output :meth:`emit` with keyword attributes."""
        return self.emit(op, inputs, attrs)[0]

    def const(self, value: Any, dtype: Any = None, name: str | None = None) -> Value:
        """A constant value (``name``: the ONNX tensor it comes from, if any)."""
        return self.graph.add_constant(value, dtype=dtype, name=name)

    # -------------------------------------------------------------- static values
    def try_static(self, v: Value | None) -> np.ndarray | None:
        """The array of a constant or parameter value, else ``None``."""
        if v is None:
            return None
        if v.is_constant:
            return v.const_value
        return self.param_values.get(v)

    def static(self, v: Value | None, what: str) -> np.ndarray:
        """The array of ``v``; UnsupportedOpError if it is only known at run time."""
        arr = self.try_static(v)
        if arr is None and v in self.sym_values:
            raise UnsupportedOpError(
                f"{self.where}: input {what!r} is the shape value "
                f"{symvalues.describe(self.sym_values[v])}, which holds symbolic dims, and this "
                f"converter needs it static; pin the dims with from_onnx(shape=...)")
        if arr is None:
            raise UnsupportedOpError(
                f"{self.where}: input {what!r} must be a constant (Kiln compiles static "
                f"shapes); it is computed at run time. Pass it via from_onnx(freeze=...) if it "
                f"is a graph input.")
        return arr

    def static_ints(self, v: Value | None, what: str) -> tuple[int, ...]:
        """A static 0-/1-D integer input as a tuple of int."""
        arr = np.asarray(self.static(v, what)).reshape(-1)
        if arr.dtype.kind not in "iub" and not np.isfinite(arr.astype(np.float64)).all():
            raise self.bad(f"input {what!r} must hold integers, got {arr[:8].tolist()}")
        return tuple(int(x) for x in arr)

    def sym_ints(self, v: Value | None, what: str) -> tuple[Dim, ...]:
        """A 0-/1-D integer input as dims: ints, or symbolic expressions for a shape value
        computed from symbolic dims (:attr:`sym_values`)."""
        if v is not None and v in self.sym_values:
            return tuple(symvalues.to_dim(x) for x in self.sym_values[v].reshape(-1))
        return self.static_ints(v, what)

    def dims(self, v: Value) -> tuple[Dim, ...]:
        """The dims of ``v``: ints, and symbolic expressions for its symbolic dims."""
        return tuple(v.type.dims)

    def is_dynamic(self, v: Value) -> bool:
        """Whether ``v`` has a symbolic dim."""
        return v.type.sym is not None

    def upper(self, dims: Sequence[Dim]) -> tuple[int, ...]:
        """The static upper-bound shape of ``dims`` over the graph's dim ranges."""
        return tuple(symvalues.dim_hi(d, self.graph.dim_ranges) for d in dims)

    def reshape_dims(self, v: Value, dims: Sequence[Dim]) -> Value:
        """Reshape to ``dims`` (ints or symbolic); no-op when equal."""
        dims = tuple(sym.canonical(d) for d in dims)
        if dims == tuple(v.type.dims):
            return v
        if not any(isinstance(d, str) for d in dims):
            return self.emit1("reshape", v, newshape=dims)
        return self.emit1("reshape", v, newshape=self.upper(dims), sym_shape=dims)

    def is_static(self, v: Value | None) -> bool:
        """Whether ``v`` is a constant or parameter."""
        return self.try_static(v) is not None

    # -------------------------------------------------------------- shape helpers
    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        """Reshape to a static shape (no-op when equal).

        For a value with symbolic dims, ``shape`` is read as its upper-bound shape with unit
        dims inserted or removed (the converters' bias / broadcast reshapes); any other
        reshape of it needs :meth:`reshape_dims`.
        """
        shape = tuple(int(d) for d in shape)
        if v.type.sym is not None:
            return self.reshape_dims(v, self._unit_reshape(v, shape))
        if shape == v.shape:
            return v
        return self.emit1("reshape", v, newshape=shape)

    def _unit_reshape(self, v: Value, shape: tuple[int, ...]) -> tuple[Dim, ...]:
        """The dims of ``v`` laid out as ``shape``, which differs from ``v.shape`` in unit dims."""
        src = [(d, s) for d, s in zip(v.shape, v.type.dims) if not (d == 1 and s == 1)]
        out: list[Dim] = []
        k = 0
        for d in shape:
            if k < len(src) and src[k][0] == d:
                out.append(src[k][1])
                k += 1
            elif d == 1:
                out.append(1)
            else:
                k = -1
                break
        if k != len(src):
            raise self.unsupported(f"reshaping {v.type} with symbolic dims to the static shape "
                                   f"{shape} is not supported")
        return tuple(out)

    def cast(self, v: Value, dtype: str) -> Value:
        """Cast (no-op when the dtype matches)."""
        return v if v.dtype == dtype else self.emit1("cast", v, dtype=dtype)

    def axis(self, axis: int, ndim: int, what: str = "axis") -> int:
        """``axis`` normalised into ``[0, ndim)``; InputError naming the node if out of range."""
        if not -ndim <= axis < ndim:
            raise self.bad(f"{what} {axis} is out of range for a {ndim}-D input "
                           f"(expected {-ndim} <= {what} < {ndim})")
        return axis + ndim if axis < 0 else axis

    def check_size(self, shape: Sequence[int], what: str) -> None:
        """:func:`check_size` of a shape this node is about to materialise."""
        check_size(shape, f"{self.where}: {what}")

    def unsupported(self, msg: str) -> UnsupportedOpError:
        """An UnsupportedOpError naming the current node."""
        return UnsupportedOpError(f"{self.where}: {msg}")

    def bad(self, msg: str) -> InputError:
        """An InputError naming the current node."""
        return InputError(f"{self.where}: {msg}")


def _text(raw: bytes, node: Any, attr: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{node.op_type} node {node.name!r}: attribute {attr!r} is not UTF-8 "
                         f"text ({raw[:32]!r})") from None


def _attrs_of(node: Any) -> dict[str, Any]:
    import onnx

    res: dict[str, Any] = {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.TENSOR:
            res[a.name] = tensor_to_array(a.t, f"{node.op_type} node {node.name!r}: attribute "
                                               f"{a.name!r}")
        elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            res[a.name] = a  # control flow: unsupported, but keep the node listable
        elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
            res[a.name] = a
        else:
            v = onnx.helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = _text(v, node, a.name)
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [_text(x, node, a.name) for x in v]
            res[a.name] = v
    return res


def load_onnx(model_or_path: Any) -> Any:
    """Load a ModelProto from a path / bytes, or return a ModelProto unchanged."""
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (bytes, bytearray, memoryview)):
        data = bytes(model_or_path)
        if not data:
            raise FormatError("the ONNX model is empty (0 bytes); expected a serialized "
                              "ModelProto")
        try:
            model = onnx.load_from_string(data)
        except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError, RuntimeWarning, ...)
            raise FormatError(f"cannot parse {len(data)} bytes as an ONNX ModelProto: "
                              f"{exc}") from exc
        what = f"{len(data)} bytes"
    elif isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.exists(path):
            raise KilnFileNotFoundError(f"ONNX model {path!r} does not exist")
        try:
            model = onnx.load(path)
        except Exception as exc:  # noqa: BLE001
            raise FormatError(f"cannot parse ONNX model {path!r}: {exc}") from exc
        what = f"ONNX model {path!r}"
    else:
        raise InputError(f"expected an onnx.ModelProto, bytes or a path, got "
                         f"{type(model_or_path).__name__}")
    # Protobuf decodes many byte strings (even b"\x00"-free junk) as a ModelProto with no
    # graph: that is not a model.
    if not model.HasField("graph"):
        raise FormatError(f"{what}: decodes as a ModelProto without a graph; not an ONNX "
                          f"model")
    return model


def _check_supported(graph: Any, static: set[str]) -> None:
    """One UnsupportedOpError listing every unsupported node that may see a runtime value.

    Unsupported nodes fed only by constants and shapes are not listed: they are evaluated at
    import (:mod:`.fold`) when the conversion reaches them.
    """
    missing: dict[str, list[str]] = {}
    for key, name in blocking_nodes(graph, static, _CONVERTERS):
        missing.setdefault(key, []).append(name)
    if missing:
        parts = [f"{op} (nodes: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''})"
                 for op, names in sorted(missing.items())]
        raise UnsupportedOpError(
            f"the model uses {len(missing)} unsupported ONNX op type(s): " + "; ".join(parts)
            + " (these depend on runtime inputs; one fed only by initializers and shapes "
              "would be evaluated at import)")


def _check_graph(graph: Any) -> None:
    """Reject graph-level structure that no node converter can repair."""
    if not graph.output:
        raise InputError(f"graph {graph.name!r} has no outputs; a model must declare at least "
                         f"one")
    for what, vis in (("output", graph.output), ("input", graph.input)):
        seen: set[str] = set()
        for vi in vis:
            if not vi.name:
                raise InputError(f"graph {graph.name!r} has an {what} with an empty name")
            if vi.name in seen:
                raise InputError(f"graph {graph.name!r} declares {what} {vi.name!r} twice; "
                                 f"{what} names must be unique")
            seen.add(vi.name)
            kind = vi.type.WhichOneof("value") if vi.HasField("type") else None
            if kind not in (None, "tensor_type", "sequence_type", "optional_type"):
                # a sequence / optional / map value would come back as a plain tensor: refuse it
                raise UnsupportedOpError(
                    f"graph {graph.name!r} {what} {vi.name!r} has type {kind}; Kiln supports tensor values "
                    "sequences and optionals only (map types are not supported)")


@functools.cache
def _schema(op_type: str, opset: int) -> Any:
    """The ONNX schema of ``op_type`` in effect at ``opset``, or None if onnx has none.

    An op used at an opset older than the op itself (Einsum at opset 11) gets its newest
    schema: the converters read such nodes with their newest semantics too.
    """
    import onnx.defs

    for args in ((op_type, max(int(opset), 1), ""), (op_type, "")):
        try:
            return onnx.defs.get_schema(*args)
        except Exception:  # noqa: BLE001,S112  (SchemaError: not defined at that opset)
            continue
    return None


def _check_node(node: Any, opset: int, attrs: Mapping[str, Any]) -> None:
    """Check ``node`` against its ONNX schema: input count, required inputs and attributes.

    Catches, with a message naming the node, what would otherwise fail deep inside a converter
    as an IndexError (too few inputs), AttributeError (an empty required input) or TypeError
    (an attribute of the wrong type). Ops that onnx has no schema for at this opset are left
    to their converter.
    """
    import onnx
    from onnx.defs import OpSchema

    schema = _schema(node.op_type, opset)
    if schema is None:
        return
    where = f"{node.op_type} node {node.name!r}"
    n = len(node.input)
    if not schema.min_input <= n <= schema.max_input:
        most = "any number of" if schema.max_input > 1 << 16 else f"at most {schema.max_input}"
        raise InputError(f"{where} has {n} input(s); {node.op_type}-{schema.since_version} "
                         f"takes at least {schema.min_input} and {most}")
    formals = list(schema.inputs)
    for i, name in enumerate(node.input):
        formal = formals[min(i, len(formals) - 1)] if formals else None
        if not name and formal is not None \
                and formal.option != OpSchema.FormalParameterOption.Optional:
            raise InputError(f"{where}: input {i} ({formal.name!r}) is required but the node "
                             f"leaves it empty")
    for name, spec in schema.attributes.items():
        if spec.required and name not in attrs:
            raise InputError(f"{where}: required attribute {name!r} is missing "
                             f"({node.op_type}-{schema.since_version})")
    # Converters read some attributes at every opset (AveragePool's dilations, new in 19), so
    # an attribute this opset's schema lacks is checked against the newest schema's type.
    newest = _schema(node.op_type, 1 << 30)
    for a in node.attribute:
        spec = schema.attributes.get(a.name) or newest.attributes.get(a.name)
        want = int(spec.type) if spec is not None else 0
        if want and a.type != want:
            names = onnx.AttributeProto.AttributeType
            got = names.Name(a.type) if a.type in names.values() else f"#{a.type}"
            raise InputError(f"{where}: attribute {a.name!r} must be of type "
                             f"{names.Name(want)}, got {got}")


_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def symbol_names(graph: Any, skip: set[str]) -> dict[str, str]:
    """ONNX ``dim_param`` -> Kiln symbol name, for the inputs of ``graph`` not in ``skip``.

    A dim_param that is not a valid symbol name (:func:`kiln.runtime.sym.check_name`) has every
    other character replaced by ``_`` (and ``_`` put before a leading digit); two dim_params
    that would collide get ``_2``, ``_3`` ... The same dim_param is the same symbol everywhere.
    """
    names: dict[str, str] = {}
    taken: set[str] = set()
    for vi in graph.input:
        if vi.name in skip or not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            p = str(d.dim_param) if d.HasField("dim_param") else ""
            if not p or p in names:
                continue
            base = _NOT_NAME.sub("_", p)
            base = "_" + base if base[0].isdigit() else base
            name, k = base, 2
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            names[p] = name
            taken.add(name)
    return names


def _input_dims(vi: Any, shape: Sequence[Dim] | None, params: Mapping[str, str]) -> tuple[Dim, ...]:
    """The dims of graph input ``vi``: from ``shape=`` when given, else from the model (a
    ``dim_param`` is the symbol ``params`` names)."""
    tt = vi.type.tensor_type
    if shape is not None:
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise InputError(f"shape= for graph input {vi.name!r} must be a sequence of dims, "
                             f"got {shape!r}")
        dims: list[Dim] = []
        for d in shape:
            if isinstance(d, str):
                try:
                    dims.append(sym.canonical(d))
                except InputError as exc:
                    raise InputError(f"shape= for graph input {vi.name!r}: {exc}") from None
            else:
                dims.append(int(d))
        return tuple(dims)
    if not tt.HasField("shape"):
        raise InputError(f"graph input {vi.name!r} has no shape; pass shape={{{vi.name!r}: ...}}")
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(params[str(d.dim_param)])
        else:
            raise InputError(f"graph input {vi.name!r} has a dynamic dimension ('?') without a "
                             f"name; pass shape={{{vi.name!r}: (...)}} to from_onnx")
    return tuple(dims)


def _declare_dims(graph: Graph, inputs: Mapping[str, tuple[Dim, ...]],
                  dim_ranges: Mapping[str, Sequence[int]], params: Mapping[str, str]) -> None:
    """Declare the range of every symbol the inputs use; InputError for a symbol without one,
    or a range for a dim the model does not have."""
    ranges: dict[str, tuple[int, int]] = {}
    for key, rng in dim_ranges.items():
        name = params.get(key, key)
        sym.check_name(name)
        ranges[name] = sym.check_range(name, rng)
    used: dict[str, tuple[str, Dim]] = {}
    for inp, dims in inputs.items():
        for d in dims:
            if isinstance(d, str):
                for s in sorted(sym.symbols(d)):
                    used.setdefault(s, (inp, d))
    shown = {v: k for k, v in params.items()}
    for s, (inp, _d) in used.items():
        if s not in ranges:
            orig = shown.get(s, s)
            named = f"dim_param {orig!r} (symbol {s!r})" if orig != s else f"{s!r}"
            raise InputError(
                f"graph input {inp!r} has the dynamic dimension {named} and no range for it; "
                f"pass dim_ranges={{{s!r}: (1, N)}} to from_onnx to import it as a symbolic "
                f"dim, or pin it with shape={{{inp!r}: (...)}}")
        graph.declare_dim(s, *ranges[s])
    known = set(params) | set(params.values()) | set(used)
    unknown = sorted(k for k in dim_ranges if k not in known)
    if unknown:
        raise InputError(f"dim_ranges= names unknown dimension(s) {unknown}; the model's "
                         f"dynamic dimensions: {sorted(params) or 'none'}")


def from_onnx(model_or_path: Any, shape: Mapping[str, Sequence[Dim]] | None = None,
              dtype: str | Mapping[str, str] | None = None,
              freeze: Mapping[str, np.ndarray] | bool | None = None,
              dim_ranges: Mapping[str, Sequence[int]] | None = None,
              ) -> tuple[Graph, dict[str, np.ndarray]]:
    """Convert an ONNX model to a Kiln graph.

    Parameters
    ----------
    model_or_path : onnx.ModelProto, str, os.PathLike or bytes
        The model.
    shape : dict, optional
        ``{input_name: dims}`` overriding input shapes. A dim is an ``int`` (pinned) or a
        symbolic expression (``"seq"``, ``"2*seq"``) whose symbols get ranges from
        ``dim_ranges``. An input not named keeps the model's dims: ``dim_value`` s and, for a
        ``dim_param``, the symbol of that name (made a valid name, see :func:`symbol_names`;
        inputs with the same dim_param share it). A sequence input takes one dims per element
        (``{"xs": [(2, 3), (4, 3)]}``: its length and element shapes are fixed at compile time),
        a present optional input its value's dims (``docs/sequences.md``).
    dtype : str or dict, optional
        Input dtype override: one dtype for every floating-point input, or
        ``{input_name: dtype}``.
    freeze : dict or bool, optional
        ``{input_name: array}`` turns runtime inputs into constants (shape tensors fed as inputs,
        as in the ONNX node tests). ``True`` turns every initializer into a constant too. For an
        optional input ``None`` compiles it as absent; for a sequence a list of arrays.
    dim_ranges : dict, optional
        ``{dim: (lo, hi)}``: the runtime range of each symbolic dim (``1 <= lo <= hi``), keyed
        by the model's dim_param or the symbol name. Every symbolic dim an input keeps needs
        one; values are stored at the upper bounds ``hi``. Without symbolic dims (every dim
        pinned) the graph is static, exactly as before.

    Returns
    -------
    graph : Graph
        Inputs are the model's runtime inputs followed by the parameter placeholders. With
        symbolic dims, ``graph.dim_ranges`` holds their ranges and value types their dims;
        shape computations on them (``Shape -> Gather -> Concat -> Reshape``, ``Range``,
        ``ConstantOfShape``, ``Expand``) are evaluated symbolically at import.
    params : dict of str to numpy.ndarray
        Initializer values still used by the graph.

    Raises
    ------
    UnsupportedOpError
        Unsupported op types (all listed in one message) or unsupported variants.
    InputError
        Missing/dynamic shapes, a symbolic dim without a range, unknown names in
        ``shape``/``freeze``/``dim_ranges``, type mismatches.
    """
    return _convert(model_or_path, shape, dtype, freeze, None, dim_ranges)


def conversion_errors(model_or_path: Any, shape: Mapping[str, Sequence[Dim]] | None = None,
                      dim_ranges: Mapping[str, Sequence[int]] | None = None,
                      ) -> tuple[list[dict[str, str]], int]:
    """Every node :func:`from_onnx` cannot convert, instead of only the first.

    Converts the whole model, recording each node's error (an op type without a converter
    that is not evaluated at import, an unsupported attribute value, rank or dtype, ...)
    and going on with the nodes that do not depend on a failed one.

    Parameters
    ----------
    model_or_path : onnx.ModelProto, str, os.PathLike or bytes
        The model.
    shape : dict, optional
        ``{input_name: dims}``, as for :func:`from_onnx`.
    dim_ranges : dict, optional
        ``{dim: (lo, hi)}``, as for :func:`from_onnx`.

    Returns
    -------
    errors : list of dict
        One ``{"node": name, "op_type": key, "error": message}`` per failed node, in graph
        order (``key`` is ``domain.Op`` outside the default domain).
    skipped : int
        Nodes not converted because an input comes from a failed node.

    Raises
    ------
    KilnError
        Errors that concern the whole model rather than a node (unreadable model, dynamic
        input shapes without ``shape``, unknown names in ``shape``).
    """
    errors: list[dict[str, str]] = []
    counts = [0]
    _convert(model_or_path, shape, None, None, (errors, counts), dim_ranges)
    return errors, counts[0]


def _convert(model_or_path: Any, shape: Mapping[str, Sequence[Dim]] | None,
             dtype: str | Mapping[str, str] | None,
             freeze: Mapping[str, np.ndarray] | bool | None,
             collect: tuple[list[dict[str, str]], list[int]] | None,
             dim_ranges: Mapping[str, Sequence[int]] | None = None,
             ) -> tuple[Graph, dict[str, np.ndarray]]:
    """:func:`from_onnx`; with ``collect`` (errors, [skipped]) node errors are recorded there."""
    _load_converters()
    model = load_onnx(model_or_path)
    opset = 1
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            opset = imp.version
    g = model.graph
    _check_graph(g)
    freeze_all = freeze is True
    freeze_map = dict(freeze) if isinstance(freeze, Mapping) else {}
    if collect is None:  # collecting: each unsupported node is reported where it fails
        _check_supported(g, set(freeze_map))
    shape = dict(shape or {})

    init_names = {t.name for t in g.initializer}
    real_inputs = [vi for vi in g.input if vi.name not in init_names]
    real_names = {vi.name for vi in real_inputs}
    for what, names in (("shape", shape), ("freeze", freeze_map)):
        unknown = sorted(set(names) - real_names - (init_names if what == "freeze" else set()))
        if unknown:
            raise InputError(f"{what}= names unknown input(s) {unknown}; model inputs: "
                             f"{sorted(real_names)}")
    if isinstance(dtype, Mapping):
        unknown = sorted(set(dtype) - real_names)
        if unknown:
            raise InputError(f"dtype= names unknown input(s) {unknown}")

    ctx = Context(opset, g.name or "main")
    ctx.onnx_static = static_names(g, set(freeze_map))
    ctx.collect = collect
    ctx.opsets.update({imp.domain: imp.version for imp in model.opset_import
                       if imp.domain not in ("", "ai.onnx")})
    env: dict[str, Value] = {}
    ctx.env = env
    params_of = symbol_names(g, set(freeze_map) | init_names)
    runtime_inputs: list[tuple[Any, tuple[Dim, ...], str | None]] = []
    containers = {vi.name for vi in real_inputs if vi.type.WhichOneof("value") in ("sequence_type", "optional_type")}
    for vi in real_inputs:
        if vi.name in containers:
            continue  # ops_sequence.container_input, below
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"graph input {vi.name!r} is not a tensor")
        if vi.name in freeze_map:
            continue
        if isinstance(dtype, Mapping):
            dt = dtype.get(vi.name)
        else:
            # A single dtype retypes the floating-point inputs only (index / mask inputs keep
            # their integer / bool types).
            src = onnx_dtype(vi.type.tensor_type.elem_type)
            dt = dtype if dtype is not None and src in ("float16", "bfloat16", "float32",
                                                        "float64") else None
        runtime_inputs.append((vi, _input_dims(vi, shape.get(vi.name), params_of), dt))
    from .ops_sequence import stacked_spec

    # a sequence input of runtime length, shape={"xs": ("n", 3)}: its length symbol is declared
    # with the tensor inputs' (ops_sequence.container_input adds the input)
    stacked = {vi.name: (sym.canonical(shape[vi.name][0]),) for vi in real_inputs
               if vi.name in containers and vi.name not in freeze_map and stacked_spec(shape.get(vi.name))}
    _declare_dims(ctx.graph, {**{vi.name: dims for vi, dims, _ in runtime_inputs}, **stacked},
                  dict(dim_ranges or {}), params_of)
    runtime = {vi.name: (dims, dt) for vi, dims, dt in runtime_inputs}
    input_layouts: dict[str, Any] = {}
    for vi in real_inputs:
        if vi.name in containers:
            from .ops_sequence import container_input

            env[vi.name], lay = container_input(ctx, vi, shape.get(vi.name), freeze_map,
                                                dtype.get(vi.name) if isinstance(dtype, Mapping) else None)
            if lay:
                input_layouts[vi.name] = lay
            continue
        if vi.name in freeze_map:
            if freeze_map[vi.name] is None:
                raise InputError(f"freeze= gives None for graph input {vi.name!r}, a tensor; only an "
                                 f"optional input may be absent")
            arr = np.asarray(freeze_map[vi.name])
            want = onnx_dtype(vi.type.tensor_type.elem_type)
            env[vi.name] = ctx.const(arr.astype(np_dtype(want), copy=False))
            continue
        dims, dt = runtime[vi.name]
        dt = dt or onnx_dtype(vi.type.tensor_type.elem_type)
        what = f"shape= for graph input {vi.name!r}" if vi.name in shape else \
            f"graph input {vi.name!r}"
        check_size(ctx.upper(dims), what)
        try:
            env[vi.name] = ctx.graph.add_input(vi.name, dims, dt)
        except InputError as exc:
            raise InputError(f"{what}: {exc}") from None

    params: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if t.name in freeze_map:
            env[t.name] = ctx.const(np.asarray(freeze_map[t.name]))
            continue
        arr = tensor_to_array(t, f"initializer {t.name!r}")
        is_float = arr.dtype.kind == "f" or arr.dtype.name == "bfloat16"
        if freeze_all or not is_float or arr.size <= SMALL_INIT:
            # Keep the initializer's name so printed IR and errors can point at it.
            env[t.name] = ctx.const(arr, name=t.name)
        else:
            v = ctx.graph.add_input(t.name, arr.shape, arr.dtype)
            ctx.param_values[v] = arr
            params[t.name] = arr
            env[t.name] = v

    missing_outputs: dict[str, str] = {}
    convert_nodes(ctx, g.node, env, missing_outputs)
    if collect is not None:
        for vi in g.output:
            if vi.name not in env and vi.name in missing_outputs:
                collect[0].append({"node": str(vi.name), "op_type": "(graph output)",
                                   "error": f"graph output {vi.name!r} is "
                                            f"{missing_outputs[vi.name]}, which Kiln does not "
                                            f"compute"})
        if collect[0] or collect[1][0]:
            return ctx.graph, params  # incomplete: only the errors are wanted
    outputs = []
    for vi in g.output:
        if vi.name not in env:
            raise UnsupportedOpError(f"graph output {vi.name!r} is "
                                     f"{missing_outputs.get(vi.name, 'not computed')}")
        if env[vi.name] in ctx.sym_values:
            raise UnsupportedOpError(
                f"graph output {vi.name!r} is the shape value "
                f"{symvalues.describe(ctx.sym_values[env[vi.name]])}, computed from symbolic "
                f"dims; Kiln does not return symbolic dims as tensor data (pin them with shape=)")
        outputs.append(env[vi.name])
    from .ops_sequence import LAYOUTS_ATTR, flatten_outputs

    ctx.graph.outputs, output_layouts = flatten_outputs(ctx, outputs, [vi.name for vi in g.output])
    graph = _prune(ctx.graph, set(params))
    if input_layouts or output_layouts:
        # how the runtime regroups flattened sequence / optional values (docs/sequences.md)
        setattr(graph, LAYOUTS_ATTR, {"inputs": input_layouts, "outputs": output_layouts or [
            {"kind": "tensor", "head": k, "name": vi.name} for k, vi in enumerate(g.output)]})
    params = {k: v for k, v in params.items() if k in set(graph.input_names)}
    return graph, params


def convert_nodes(ctx: Context, nodes: Sequence[Any], env: dict[str, Value],
                  missing_outputs: dict[str, str], name_values: bool = True) -> None:
    """Convert ONNX ``nodes`` in order, reading inputs from and writing outputs to ``env``.

    Parameters
    ----------
    ctx : Context
        The conversion state (``ctx.node`` is set to each node while it converts).
    nodes : sequence of onnx.NodeProto
        A graph's nodes, topologically sorted (as ONNX requires).
    env : dict of str to Value
        ONNX value name -> IR value; outer-scope names are visible to subgraphs through it.
    missing_outputs : dict of str to str
        Names of optional outputs Kiln does not compute -> a description for error messages.
    name_values : bool
        Give unnamed IR values their ONNX output names (off for unrolled loop bodies, whose
        names repeat every iteration).
    """
    # Only the outermost call collects: a Loop body's error fails the Loop node.
    collect, ctx.collect = ctx.collect, None
    try:
        _convert_nodes(ctx, nodes, env, missing_outputs, name_values, collect)
    finally:
        ctx.collect = collect


def _convert_nodes(ctx: Context, nodes: Sequence[Any], env: dict[str, Value],
                   missing_outputs: dict[str, str], name_values: bool,
                   collect: tuple[list[dict[str, str]], list[int]] | None) -> None:
    # ONNX name -> producing node, for evaluating unsupported nodes at import (:mod:`.fold`)
    producers = {o: n for n in nodes for o in n.output if o}
    failed: set[str] = set()  # outputs of nodes that failed while collecting errors
    for node in nodes:
        ctx.node = node
        if collect is not None and any(n in failed for n in node.input):
            collect[1][0] += 1
            failed.update(o for o in node.output if o)
            continue
        try:
            res = _convert_node(ctx, node, env, missing_outputs, producers)
        except KilnError as exc:
            if collect is None:
                raise
            key = converter_key(node)
            collect[0].append({"node": str(node.name), "op_type": str(key), "error": str(exc)})
            failed.update(o for o in node.output if o)
            continue
        for i, name in enumerate(node.output):
            if not name:
                continue
            v = res[i] if i < len(res) else None
            if v is not None:
                env[name] = v
                if name_values and v.name is None:
                    v.name = name
            else:
                missing_outputs[name] = f"output {i} ({name!r}) of {node.op_type} node " \
                                        f"{node.name!r}"


def _convert_node(ctx: Context, node: Any, env: dict[str, Value], missing_outputs: dict[str, str],
                  producers: dict[str, Any]) -> list[Value | None]:
    """The converted outputs of one node; every failure is a KilnError naming the node."""
    ins: list[Value | None] = []
    for name in node.input:
        if not name:
            ins.append(None)
        elif name in env:
            ins.append(env[name])
        elif name in missing_outputs:
            raise UnsupportedOpError(f"{node.op_type} node {node.name!r} uses "
                                     f"{missing_outputs[name]}, which Kiln does not compute")
        else:
            raise InputError(f"{node.op_type} node {node.name!r}: input {name!r} is not "
                             f"defined before use")
    try:
        conv = _CONVERTERS.get(converter_key(node))
        res: Any  # a converter returns one Value or a sequence of them
        if conv is not None and is_default_domain(node) and node.op_type in DATA_DEPENDENT \
                and all(n in ctx.onnx_static for n in node.input if n):
            # static inputs: a constant result of a static shape beats a data-dependent dim
            conv = None
        if conv is None:
            # No converter: _check_supported let it through because its inputs are static.
            # The reference evaluator reads the attributes itself (string ones included).
            res = fold_node(ctx, node, env, producers)
        else:
            attrs = NodeAttrs(_attrs_of(node), ctx.where, ctx.opset)
            if is_default_domain(node):  # the schema lookup is the default domain's
                _check_node(node, ctx.opset, attrs)
            res = conv(ctx, node, ins, attrs)
        res = [res] if isinstance(res, Value) else list(res)
        for i, v in enumerate(res[:len(node.output)]):
            if isinstance(v, Value) and node.output[i]:  # (not a sequence / optional)
                check_size(v.shape, f"output {i} ({node.output[i]!r})")
    except UnsupportedOpError:
        raise
    except KilnError as exc:
        msg = str(exc)
        prefix = f"ONNX {node.op_type} node {node.name!r}: "
        raise type(exc)(msg if node.name and repr(node.name) in msg else prefix + msg) \
            from None
    except Exception as exc:  # noqa: BLE001  (the model is untrusted input: see module doc)
        raise InputError(
            f"ONNX {node.op_type} node {node.name!r} (opset {ctx.opset}) cannot be "
            f"converted: its inputs {[v.type if v is not None else None for v in ins]} or "
            f"attributes {sorted(str(a.name) for a in node.attribute)} do not fit what "
            f"{node.op_type} expects ({type(exc).__name__}: {exc})") from exc
    return res


def _prune(graph: Graph, param_names: set[str]) -> Graph:
    """Drop dead nodes and parameters that no node uses any more."""
    graph = dead_code_elimination(graph)
    used = set(graph.outputs)
    for n in graph.nodes:
        used.update(n.inputs)
    graph.inputs = [v for v in graph.inputs if v.name not in param_names or v in used]
    return graph


def _const(v: Value) -> np.ndarray:
    arr = v.const_value
    assert arr is not None  # the caller checked is_constant
    return arr


def _checked(op: str, inputs: list[Value], attrs: dict[str, Any] | None) -> tuple[Any, dict[str, Any], list[Any]]:
    """``op``'s definition, normalised attributes and output types for ``inputs`` (what
    ``Graph.add_node`` checks), for evaluating the op at import."""
    opdef = get_op(op)
    opdef.check_num_inputs(len(inputs))
    norm = opdef.normalize_attrs(attrs)
    return opdef, norm, opdef.type_rel([v.type for v in inputs], norm)
