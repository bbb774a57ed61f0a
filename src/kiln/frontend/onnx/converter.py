"""ONNX GraphProto -> Kiln IR.

The converter walks the ONNX nodes in order and calls one converter function per op type
(registered with :func:`onnx_op`). While converting it folds every node whose inputs are all
constants, so shape computations (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``) end up
as static attributes. Initializers become parameter placeholders (graph inputs) whose arrays are
returned in ``params``; converters may still read their values when an input must be static
(a Reshape shape, Resize scales, ...). Parameters only used that way disappear from the graph.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...ir import Graph, Value, get_op
from ...ir.types import DTYPES, TensorType, np_dtype
from ...runtime.errors import InputError, KilnError, UnsupportedOpError

__all__ = ["from_onnx", "load_onnx", "onnx_op", "Context", "supported_ops", "convert_nodes"]

ConverterFn = Callable[["Context", Any, list, dict], "list[Value] | Value"]
_CONVERTERS: dict[str, ConverterFn] = {}

#: Results of frontend folding larger than this (elements) stay as runtime ops unless they are
#: no larger than their inputs (so e.g. an Expand of a scalar to a huge shape is not materialised).
FOLD_LIMIT = 1 << 16
#: Non-float initializers and tiny float ones become constants rather than params.
SMALL_INIT = 16


def onnx_op(*op_types: str) -> Callable[[ConverterFn], ConverterFn]:
    """Register a converter ``fn(ctx, node, inputs, attrs)`` for ONNX op types."""

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


def onnx_dtype(elem_type: int) -> str:
    """IR dtype name of an ONNX TensorProto element type; UnsupportedOpError if none."""
    import onnx

    try:
        name = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # noqa: BLE001
        name = None
    if elem_type == onnx.TensorProto.BFLOAT16:
        name = "bfloat16"
    if name not in DTYPES:
        tname = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
        raise UnsupportedOpError(f"ONNX element type {tname} is not supported")
    return name


def tensor_to_array(t: Any) -> np.ndarray:
    """NumPy array of a TensorProto (bfloat16 via ml_dtypes)."""
    import onnx
    from onnx import numpy_helper

    if t.data_type == onnx.TensorProto.STRING:
        raise UnsupportedOpError(f"string tensor {t.name!r} is not supported")
    arr = numpy_helper.to_array(t)
    if t.data_type == onnx.TensorProto.BFLOAT16 and arr.dtype != np_dtype("bfloat16"):
        arr = arr.astype(np_dtype("bfloat16"))
    onnx_dtype(t.data_type)
    return arr


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
        #: ONNX name -> IR value of the graph being converted (subgraphs read outer names).
        self.env: dict[str, Value] = {}

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
        if inputs and op != "constant" and all(v.is_constant for v in inputs):
            opdef = get_op(op)
            try:
                opdef.check_num_inputs(len(inputs))
                norm = opdef.normalize_attrs(attrs)
                types = opdef.type_rel([v.type for v in inputs], norm)
            except InputError as exc:
                raise InputError(f"{op} node {name!r}: {exc}") from None
            in_size = sum(v.type.size for v in inputs)
            if sum(t.size for t in types) <= max(FOLD_LIMIT, in_size):
                outs = opdef.ref([v.const_value for v in inputs], norm)
                return [self.const(np.asarray(o).astype(np_dtype(t.dtype), copy=False)
                                   .reshape(t.shape)) for o, t in zip(outs, types)]
        return self.graph.add_node(op, inputs, attrs, name=name)

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
        if arr is None:
            raise UnsupportedOpError(
                f"{self.where}: input {what!r} must be a constant (Kiln compiles static "
                f"shapes); it is computed at run time. Pass it via from_onnx(freeze=...) if it "
                f"is a graph input.")
        return arr

    def static_ints(self, v: Value | None, what: str) -> tuple[int, ...]:
        """A static 0-/1-D integer input as a tuple of int."""
        return tuple(int(x) for x in np.asarray(self.static(v, what)).reshape(-1))

    def is_static(self, v: Value | None) -> bool:
        """Whether ``v`` is a constant or parameter."""
        return self.try_static(v) is not None

    # -------------------------------------------------------------- shape helpers
    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        """Reshape to a static shape (no-op when equal)."""
        shape = tuple(int(d) for d in shape)
        if shape == v.shape:
            return v
        return self.emit1("reshape", v, newshape=shape)

    def cast(self, v: Value, dtype: str) -> Value:
        """Cast (no-op when the dtype matches)."""
        return v if v.dtype == dtype else self.emit1("cast", v, dtype=dtype)

    def unsupported(self, msg: str) -> UnsupportedOpError:
        """An UnsupportedOpError naming the current node."""
        return UnsupportedOpError(f"{self.where}: {msg}")

    def bad(self, msg: str) -> InputError:
        """An InputError naming the current node."""
        return InputError(f"{self.where}: {msg}")


def _attrs_of(node: Any) -> dict[str, Any]:
    import onnx

    res: dict[str, Any] = {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.TENSOR:
            res[a.name] = tensor_to_array(a.t)
        elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            res[a.name] = a  # control flow: unsupported, but keep the node listable
        elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
            res[a.name] = a
        else:
            v = onnx.helper.get_attribute_value(a)
            if isinstance(v, bytes):
                v = v.decode("utf-8")
            elif isinstance(v, list) and v and isinstance(v[0], bytes):
                v = [x.decode("utf-8") for x in v]
            res[a.name] = v
    return res


def load_onnx(model_or_path: Any) -> Any:
    """Load a ModelProto from a path / bytes, or return a ModelProto unchanged."""
    import onnx

    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model_or_path))
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        if not os.path.exists(path):
            from ...runtime.errors import KilnFileNotFoundError

            raise KilnFileNotFoundError(f"ONNX model {path!r} does not exist")
        try:
            return onnx.load(path)
        except Exception as exc:  # noqa: BLE001
            from ...runtime.errors import FormatError

            raise FormatError(f"cannot parse ONNX model {path!r}: {exc}") from exc
    raise InputError(f"expected an onnx.ModelProto or a path, got {type(model_or_path).__name__}")


def _all_nodes(graph: Any) -> list[Any]:
    """The nodes of ``graph`` and, recursively, of its subgraphs (Loop / If bodies)."""
    import onnx

    res = []
    for node in graph.node:
        res.append(node)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                res.extend(_all_nodes(a.g))
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    res.extend(_all_nodes(sub))
    return res


def _check_supported(graph: Any) -> None:
    missing: dict[str, list[str]] = {}
    for i, node in enumerate(_all_nodes(graph)):
        domain = node.domain or ""
        key = node.op_type if domain in ("", "ai.onnx") else f"{domain}.{node.op_type}"
        if domain not in ("", "ai.onnx") or node.op_type not in _CONVERTERS:
            missing.setdefault(key, []).append(node.name or f"#{i}")
    if missing:
        parts = [f"{op} (nodes: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''})"
                 for op, names in sorted(missing.items())]
        raise UnsupportedOpError(
            f"the model uses {len(missing)} unsupported ONNX op type(s): " + "; ".join(parts))


def _input_type(vi: Any, shape: Sequence[int] | None, dtype: str | None) -> TensorType:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedOpError(f"graph input {vi.name!r} is not a tensor")
    dt = dtype or onnx_dtype(tt.elem_type)
    if shape is not None:
        return TensorType(tuple(int(d) for d in shape), dt)
    if not tt.HasField("shape"):
        raise InputError(f"graph input {vi.name!r} has no shape; pass shape={{{vi.name!r}: ...}}")
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(d.dim_value)
        else:
            sym = d.dim_param or "?"
            raise InputError(f"graph input {vi.name!r} has a dynamic dimension ({sym!r}); "
                             f"pass shape={{{vi.name!r}: (...)}} to from_onnx")
    return TensorType(tuple(dims), dt)


def from_onnx(model_or_path: Any, shape: Mapping[str, Sequence[int]] | None = None,
              dtype: str | Mapping[str, str] | None = None,
              freeze: Mapping[str, np.ndarray] | bool | None = None,
              ) -> tuple[Graph, dict[str, np.ndarray]]:
    """Convert an ONNX model to a Kiln graph.

    Parameters
    ----------
    model_or_path : onnx.ModelProto, str, os.PathLike or bytes
        The model.
    shape : dict, optional
        ``{input_name: shape}`` overriding (or fixing dynamic) input shapes.
    dtype : str or dict, optional
        Input dtype override: one dtype for every floating-point input, or
        ``{input_name: dtype}``.
    freeze : dict or bool, optional
        ``{input_name: array}`` turns runtime inputs into constants (shape tensors fed as inputs,
        as in the ONNX node tests). ``True`` turns every initializer into a constant too.

    Returns
    -------
    graph : Graph
        Inputs are the model's runtime inputs followed by the parameter placeholders.
    params : dict of str to numpy.ndarray
        Initializer values still used by the graph.

    Raises
    ------
    UnsupportedOpError
        Unsupported op types (all listed in one message) or unsupported variants.
    InputError
        Missing/dynamic shapes, unknown names in ``shape``/``freeze``, type mismatches.
    """
    _load_converters()
    model = load_onnx(model_or_path)
    opset = 1
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            opset = imp.version
    g = model.graph
    _check_supported(g)
    freeze_all = freeze is True
    freeze_map = dict(freeze) if isinstance(freeze, Mapping) else {}
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
    env: dict[str, Value] = {}
    ctx.env = env
    for vi in real_inputs:
        if vi.name in freeze_map:
            arr = np.asarray(freeze_map[vi.name])
            want = onnx_dtype(vi.type.tensor_type.elem_type)
            env[vi.name] = ctx.const(arr.astype(np_dtype(want), copy=False))
            continue
        if isinstance(dtype, Mapping):
            dt = dtype.get(vi.name)
        else:
            # A single dtype retypes the floating-point inputs only (index / mask inputs keep
            # their integer / bool types).
            src = onnx_dtype(vi.type.tensor_type.elem_type)
            dt = dtype if dtype is not None and src in ("float16", "bfloat16", "float32",
                                                        "float64") else None
        ty = _input_type(vi, shape.get(vi.name), dt)
        env[vi.name] = ctx.graph.add_input(vi.name, ty.shape, ty.dtype)

    params: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if t.name in freeze_map:
            env[t.name] = ctx.const(np.asarray(freeze_map[t.name]))
            continue
        arr = tensor_to_array(t)
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
    outputs = []
    for vi in g.output:
        if vi.name not in env:
            raise UnsupportedOpError(f"graph output {vi.name!r} is "
                                     f"{missing_outputs.get(vi.name, 'not computed')}")
        outputs.append(env[vi.name])
    ctx.graph.outputs = outputs
    graph = _prune(ctx.graph, set(params))
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
    for node in nodes:
        ctx.node = node
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
            res = _CONVERTERS[node.op_type](ctx, node, ins, _attrs_of(node))
        except UnsupportedOpError:
            raise
        except KilnError as exc:
            msg = str(exc)
            prefix = f"ONNX {node.op_type} node {node.name!r}: "
            raise type(exc)(msg if node.name and repr(node.name) in msg else prefix + msg) \
                from None
        if isinstance(res, Value):
            res = [res]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i < len(res) and res[i] is not None:
                env[name] = res[i]
                if name_values and res[i].name is None:
                    res[i].name = name
            else:
                missing_outputs[name] = f"output {i} ({name!r}) of {node.op_type} node " \
                                        f"{node.name!r}"


def _prune(graph: Graph, param_names: set[str]) -> Graph:
    """Drop dead nodes and parameters that no node uses any more."""
    from ...transform.simplify import dead_code_elimination

    graph = dead_code_elimination(graph)
    used = set(graph.outputs)
    for n in graph.nodes:
        used.update(n.inputs)
    graph.inputs = [v for v in graph.inputs if v.name not in param_names or v in used]
    return graph
