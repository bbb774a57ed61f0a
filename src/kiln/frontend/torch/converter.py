"""``torch.export`` ExportedProgram -> Kiln IR.

Owns: the ATen converter registry (:func:`aten_op`), the conversion :class:`Context`, the walk
over the program's FX graph, and the two public entry points :func:`from_exported_program` and
:func:`from_torch`. It must never import ``torch`` at module level (torch is an optional
dependency and ``import kiln.frontend`` must not pay for it): every torch import is inside a
function. Like the rest of the frontend layer it imports only ``kiln.ir`` and ``kiln.runtime``
(and the ONNX frontend's :class:`~kiln.frontend.onnx.converter.Context`, whose folding ``emit``
it reuses).

Decomposition
-------------
An exported program holds whatever ATen ops the model called (``aten.conv2d``, ``aten.linear``,
``aten.hardswish``, ``aten.upsample_bilinear2d.vec``...). Converting every one of the ~2,000 ATen
overloads is not possible, so the program is first lowered with
``ep.run_decompositions(table)`` to the *core ATen* opset (~180 ops, stable across torch
releases). The table is torch's default one **minus every op Kiln has a converter for**: an op
Kiln converts directly is kept whole, because Kiln has a faster kernel for it than for its
decomposition (``linear`` -> one ``dense`` instead of ``permute + addmm``; ``hardswish`` -> one
``hard_swish`` instead of five elementwise ops; ``adaptive_avg_pool2d`` -> one ``reduce_mean``).
So registering a converter for a high-level op is all it takes to keep that op whole; nothing
else in this file changes.

Conversion
----------
Before anything is converted, every call in the decomposed graph is looked up in the registry
and all ops without a converter are reported in one :class:`UnsupportedOpError`, with the FX
nodes that call them. Parameters and buffers become parameter placeholders (graph inputs) named
by their fully qualified name (``layer1.0.conv1.weight``) and returned in ``params``; tensors
shared by several names (tied weights) stay one parameter. Lifted tensor constants and
non-float buffers become IR constants. Graph inputs are the program's user inputs under their
user-facing names. Each FX node's result is checked against the shape and dtype torch recorded
for it (``node.meta["val"]``): a Kiln converter bug is an error naming the node, not a wrong
number later. Any other exception a converter raises is re-raised as an :class:`InputError`
naming the FX node.

Dynamic shapes
--------------
A program exported with ``torch.export.Dim`` s has sympy symbols in its shapes. Each becomes a
Kiln symbol (:mod:`.symbols`: named after its ``Dim``, ranged by ``ep.range_constraints``), the
inputs get symbolic dims, and every recorded shape is read through :meth:`Context.out_dims`
(symbolic) or :meth:`Context.out_shape` (upper bounds). SymInt nodes (``aten.sym_size.int``,
``operator.mul`` on sizes ...) are evaluated at import to their Kiln dim, which converters
receive in place of an ``int``; runtime asserts on them are dropped (the executor checks every
input's range).
"""

from __future__ import annotations

import importlib
import importlib.util
import operator
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...ir import Graph, Value, dead_code_elimination
from ...ir.types import DTYPES, np_dtype
from ...runtime import sym
from ...runtime.errors import InputError, KilnError, UnsupportedOpError
from ...runtime.sym import Dim
from ..dims import dim_value
from ..onnx.converter import Context as _BaseContext
from .symbols import expr_to_dim, symbol_table

__all__ = ["aten_op", "supported_ops", "Context", "Args", "from_exported_program", "from_torch",
           "decompose_program", "unsupported_calls", "torch_dtype", "to_numpy"]

ConverterFn = Callable[["Context", Any, "Args"], "Value | Sequence[Value | None]"]
_CONVERTERS: dict[str, ConverterFn] = {}

#: Op modules loaded by :func:`_load_converters`, in order. ``ops_transformer`` is written by
#: another engineer and may not exist yet: it is imported only when it is there.
_OP_MODULES = ("ops_core", "ops_vision")
_OPTIONAL_OP_MODULES = ("ops_transformer",)


def aten_op(*names: str) -> Callable[[ConverterFn], ConverterFn]:
    """Register a converter ``fn(ctx, node, args)`` for ATen op overloads.

    Parameters
    ----------
    *names : str
        Overload names as ``str(node.target)`` spells them: ``"aten.conv2d.default"``.

    Raises
    ------
    KilnError
        If an overload already has a converter (two modules converting the same op would make
        the result depend on import order).
    """

    def deco(fn: ConverterFn) -> ConverterFn:
        for name in names:
            if not name.startswith("aten.") or name.count(".") != 2:
                raise KilnError(f"aten_op({name!r}): expected 'aten.<op>.<overload>'")
            old = _CONVERTERS.get(name)
            if old is not None and old is not fn:
                raise KilnError(f"ATen op {name!r} already has a converter "
                                f"({old.__module__}.{old.__qualname__}); "
                                f"{fn.__module__}.{fn.__qualname__} cannot register it again")
            _CONVERTERS[name] = fn
        return fn

    return deco


def supported_ops() -> list[str]:
    """ATen overloads the PyTorch frontend converts (``"aten.add.Tensor"``, ...)."""
    _load_converters()
    return sorted(_CONVERTERS)


def _load_converters() -> None:
    for mod in _OP_MODULES:
        importlib.import_module(f".{mod}", __package__)
    for mod in _OPTIONAL_OP_MODULES:
        if importlib.util.find_spec(f"{__package__}.{mod}") is not None:
            importlib.import_module(f".{mod}", __package__)


def torch_dtype(dtype: Any) -> str:
    """IR dtype name of a ``torch.dtype``; UnsupportedOpError if Kiln has none."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise UnsupportedOpError(f"torch dtype {dtype} is not supported")
    return name


def to_numpy(t: Any) -> np.ndarray:
    """A detached CPU NumPy copy of a ``torch.Tensor`` (bfloat16 via ml_dtypes)."""
    import torch

    t = t.detach().cpu()
    torch_dtype(t.dtype)
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np_dtype("bfloat16")).copy()
    return t.contiguous().numpy().copy()


class Args(dict):
    """An FX node's arguments by schema name, defaults filled in.

    Tensor arguments are IR :class:`Value` s (lists of them for ``Tensor[]``), the rest are
    Python values. Reading an argument the schema does not have raises an InputError naming
    the node instead of a bare ``KeyError``.
    """

    def __init__(self, values: Mapping[str, Any], where: str) -> None:
        super().__init__(values)
        self.where = where

    def __missing__(self, key: str) -> Any:
        raise InputError(f"{self.where}: no argument {key!r} (it has {sorted(self)})")


class Context(_BaseContext):
    """State shared by the ATen converters.

    The ONNX frontend's context minus ONNX: :meth:`emit` folds nodes whose inputs are all
    constants, :meth:`static` reads constants and parameters, :meth:`bad` /
    :meth:`unsupported` make errors naming the FX node being converted (``ctx.node``).
    """

    def __init__(self, name: str, symbols: Mapping[str, str] | None = None) -> None:
        super().__init__(0, name)
        #: sympy symbol name -> Kiln symbol name (:func:`.symbols.symbol_table`).
        self.symbols: dict[str, str] = dict(symbols or {})
        #: Values holding ``start + arange(n)`` along their only non-unit dim: value -> (n, start).
        #: Advanced indexing with them over symbolic dims is a reshape (transformers' masks).
        self.iotas: dict[Value, tuple[Dim, int]] = {}

    @property
    def where(self) -> str:
        n = self.node
        return f"FX node {n.name!r} ({n.target})" if n is not None else "graph"

    def static(self, v: Value | None, what: str) -> np.ndarray:
        """The array of ``v``; UnsupportedOpError if it is only known at run time."""
        arr = self.try_static(v)
        if arr is None and v in self.sym_values:
            raise UnsupportedOpError(f"{self.where}: input {what!r} is computed from symbolic "
                                     f"sizes and this converter needs it constant")
        if arr is None:
            raise UnsupportedOpError(f"{self.where}: input {what!r} must be a constant; it is "
                                     f"computed at run time")
        return arr

    def scalar(self, value: Any, like: Value) -> Value:
        """A 0-d constant of ``like``'s dtype holding the Python number ``value``."""
        return self.const(np.asarray(value, dtype=np_dtype(like.dtype)))

    def dim(self, d: Any) -> Dim:
        """A torch size (``int``, ``SymInt``, or a Kiln dim already) as a canonical Kiln dim."""
        if isinstance(d, str):
            return sym.canonical(d)
        if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
            return int(d)
        node = getattr(d, "node", None)
        expr = getattr(node, "expr", None)
        if expr is None:
            raise self.bad(f"expected a size, got {type(d).__name__} {d!r}")
        try:
            return expr_to_dim(expr, self.symbols)
        except UnsupportedOpError as exc:
            raise self.unsupported(str(exc)) from None

    def out_dims(self, index: int = 0) -> tuple[Dim, ...]:
        """The dims torch recorded for output ``index`` (ints, symbolic ones as Kiln dims)."""
        val = self.node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = val[index]
        if val is None or not hasattr(val, "shape"):
            raise self.bad("torch recorded no output shape for this node")
        return tuple(self.dim(d) for d in val.shape)

    def out_shape(self, index: int = 0) -> tuple[int, ...]:
        """The shape torch recorded for output ``index``; upper bounds for symbolic dims."""
        return self.upper(self.out_dims(index))

    def size_value(self, d: Dim, dtype: str) -> Value:
        """A 0-d value of ``dtype`` holding the size ``d``: a constant, or a symbolic shape value
        that :meth:`emit` evaluates at import or computes at run time (never its upper bound)."""
        if isinstance(d, int):
            return self.const(np.asarray(d, dtype=np_dtype(dtype)))
        return self.shape_value(np.array(d, dtype=object), dtype)

    def materialize(self, v: Value, reason: str = "") -> Value:
        """The symbolic size value ``v`` as a tensor computed at run time.

        Each symbolic dim ``d`` is a ``dim_value`` node over values that carry its symbols
        (:func:`kiln.frontend.dims.dim_value`): its kernel reads their runtime extents.
        """
        arr = self.sym_values[v]
        parts = []
        for x in arr.reshape(-1):
            d = sym.canonical(x) if isinstance(x, str) else int(x)
            if isinstance(d, int):
                parts.append(self.const(np.array([d], dtype=np.int64)))
                continue
            lo, hi = sym.bounds(d, self.graph.dim_ranges)
            if lo < 1:
                raise self.unsupported(f"the size {d} is needed as tensor data ({reason}), but "
                                       f"it may be {lo} (range {lo}..{hi})")
            parts.append(dim_value(self.graph, d))
        out = parts[0] if len(parts) == 1 else self.emit1("concatenate", *parts, axis=0)
        return self.reshape(self.cast(out, v.dtype), v.shape)

    def broadcast_dims(self, v: Value, dims: Sequence[Dim]) -> Value:
        """``broadcast_to`` the dims ``dims`` (symbolic ones through ``sym_shape``)."""
        dims = tuple(sym.canonical(d) for d in dims)
        if tuple(v.type.dims) == dims:
            return v
        self.check_size(self.upper(dims), "the output")
        if any(isinstance(d, str) for d in dims):
            return self.emit1("broadcast_to", v, shape=self.upper(dims), sym_shape=dims)
        return self.emit1("broadcast_to", v, shape=dims)

    def out_dtype(self, index: int = 0) -> str:
        """The dtype torch recorded for output ``index`` of the current node."""
        val = self.node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = val[index]
        if val is None or not hasattr(val, "dtype"):
            raise self.bad("torch recorded no output dtype for this node")
        return torch_dtype(val.dtype)


# ------------------------------------------------------------------ public API
def from_torch(module: Any, example_inputs: Sequence[Any], dynamic_shapes: Any = None,
               dim_ranges: Mapping[str, tuple[int, int]] | None = None,
               ) -> tuple[Graph, dict[str, np.ndarray]]:
    """Export a ``torch.nn.Module`` with ``torch.export.export`` and convert it.

    Parameters
    ----------
    module : torch.nn.Module
        The model; put it in ``eval()`` mode first (batch norm and dropout are converted in
        their inference form).
    example_inputs : sequence of torch.Tensor
        Positional example inputs; their shapes become the graph's input shapes, except the
        dims ``dynamic_shapes`` makes symbolic.
    dynamic_shapes : optional
        Passed to ``torch.export.export``: ``{"x": {0: torch.export.Dim("batch", max=64)}}``.
        Each ``Dim`` becomes a Kiln symbolic dim of that name whose range is the Dim's
        ``min..max`` (a ``min`` below 1 is raised to 1); a Dim needs a ``max`` (or an entry
        in ``dim_ranges``), since Kiln stores every tensor at its largest shape.
    dim_ranges : mapping of str to (int, int), optional
        ``{name: (lo, hi)}`` setting the range of a symbolic dim, keyed by the Dim name (or the
        torch symbol, ``"s17"``); it must lie inside the range torch exported for.

    Returns
    -------
    graph : Graph
        Inputs are the module's tensor arguments (by their ``forward`` parameter names)
        followed by the parameter placeholders.
    params : dict of str to numpy.ndarray
        Parameters and buffers by fully qualified name.

    Raises
    ------
    UnsupportedOpError
        ATen ops without a converter (all listed in one message), or an op that cannot handle
        a symbolic dim (naming the FX node).
    InputError
        ``example_inputs`` not a sequence, a symbolic dim without an upper bound, or a node
        torch produced that Kiln cannot convert.
    """
    import torch

    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        raise InputError(f"example_inputs must be a tuple of tensors, got "
                         f"{type(example_inputs).__name__}")
    ep = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    return from_exported_program(ep, dim_ranges=dim_ranges)


def from_exported_program(ep: Any, decompose: bool = True,
                          dim_ranges: Mapping[str, tuple[int, int]] | None = None,
                          ) -> tuple[Graph, dict[str, np.ndarray]]:
    """Convert a ``torch.export.ExportedProgram`` to a Kiln graph.

    Parameters
    ----------
    ep : torch.export.ExportedProgram
        The program, e.g. from ``torch.export.export`` or ``torch.export.load``.
    decompose : bool
        Lower the program to core ATen first, keeping the ops Kiln converts directly (see the
        module docstring). ``False`` converts the graph as it is.
    dim_ranges : mapping of str to (int, int), optional
        Range overrides for the program's symbolic dims, as in :func:`from_torch`.

    Returns
    -------
    graph : Graph
        Inputs are the user inputs (by their names in the program) followed by the parameter
        placeholders (by fully qualified name). With ``torch.export.Dim`` s, ``graph.dim_ranges``
        holds the symbols and the inputs their symbolic dims.
    params : dict of str to numpy.ndarray
        Parameter and buffer values still used by the graph.

    Raises
    ------
    UnsupportedOpError
        Non-tensor inputs that are not constants (SymInt inputs included), ATen ops without a
        converter (all listed in one message, before anything is converted) or unsupported
        variants of supported ops (naming the FX node).
    InputError
        A symbolic dim without an upper bound (export with ``Dim(..., max=N)`` or pass
        ``dim_ranges``), or a node Kiln cannot convert for another reason (naming the FX node).
    """
    import torch

    if not isinstance(ep, torch.export.ExportedProgram):
        raise InputError(f"from_exported_program expects a torch.export.ExportedProgram, got "
                         f"{type(ep).__name__}")
    # ranges first: an unbounded Dim is reported before the (slow) decomposition
    symbol_table(ep, dim_ranges=dim_ranges)
    original = ep
    if decompose:
        ep = decompose_program(ep)
    _load_converters()
    _check_supported(ep)
    names, ranges = symbol_table(ep, original=original, dim_ranges=dim_ranges)
    return _convert(ep, names, ranges)


def decompose_program(ep: Any) -> Any:
    """``ep`` lowered to core ATen, keeping every op Kiln converts whole (module docstring).

    Parameters
    ----------
    ep : torch.export.ExportedProgram

    Returns
    -------
    torch.export.ExportedProgram
        What :func:`from_exported_program` converts (``kiln inspect`` counts its ops).
    """
    _load_converters()
    return ep.run_decompositions(_decomposition_table())


def unsupported_calls(ep: Any) -> dict[str, list[str]]:
    """ATen ops of ``ep``'s graph without a converter -> the FX nodes calling them."""
    _load_converters()
    missing: dict[str, list[str]] = {}
    for node in ep.graph.nodes:
        if node.op == "call_function":
            if node.target is operator.getitem or _is_size_op(node):
                continue
            key = _target_key(node.target)
            if key not in _CONVERTERS:
                missing.setdefault(key, []).append(node.name)
        elif node.op in ("call_module", "call_method"):
            missing.setdefault(f"{node.op} {node.target}", []).append(node.name)
    return missing


# ------------------------------------------------------------------ checks
def _target_key(target: Any) -> str:
    return str(target)


def _decomposition_table() -> Any:
    import torch

    table = torch.export.default_decompositions()
    keep = set(_CONVERTERS)
    for op in list(table.keys()):
        if _target_key(op) in keep:
            table.pop(op)
    return table


def _check_supported(ep: Any) -> None:
    missing = unsupported_calls(ep)
    if missing:
        lines = [f"  {k} (FX nodes {', '.join(v[:5])}{', ...' if len(v) > 5 else ''})"
                 for k, v in sorted(missing.items())]
        raise UnsupportedOpError(
            f"the PyTorch frontend has no converter for {len(missing)} ATen op(s):\n"
            + "\n".join(lines))


# ------------------------------------------------------------------ conversion
def _convert(ep: Any, names: Mapping[str, str], ranges: Mapping[str, tuple[int, int]],
             ) -> tuple[Graph, dict[str, np.ndarray]]:
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

    ctx = Context("main", names)
    for name, (lo, hi) in ranges.items():
        ctx.graph.declare_dim(name, lo, hi)
    env: dict[Any, Any] = {}
    sig = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    params: dict[str, np.ndarray] = {}

    # runtime inputs first, parameter placeholders after them (the IR's convention)
    for spec in sig.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = placeholders[spec.arg.name]
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            ctx.node = node
            dims = tuple(ctx.dim(d) for d in val.shape)
            ctx.node = None
            env[node] = ctx.graph.add_input(spec.arg.name, dims, torch_dtype(val.dtype))
        elif isinstance(val, (int, float, bool)) or val is None:
            env[node] = val  # export specialised the program on this value
        elif isinstance(val, torch.SymInt):
            raise UnsupportedOpError(f"user input {spec.arg.name!r} is a dynamic int ({val}); "
                                     f"Kiln graph inputs are tensors (pass it as a tensor, or "
                                     f"as a static int)")
        else:
            raise UnsupportedOpError(f"user input {spec.arg.name!r} of type "
                                     f"{type(val).__name__} is not supported")

    by_storage: dict[tuple[Any, ...], Value] = {}
    for spec in sig.input_specs:
        node = placeholders[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = ep.state_dict.get(spec.target)
            if tensor is None:
                tensor = ep.constants.get(spec.target)
            if not isinstance(tensor, torch.Tensor):
                raise InputError(f"{spec.kind.name.lower()} {spec.target!r} (placeholder "
                                 f"{node.name!r}) has no tensor in the exported program")
            # Tied weights: two names, one storage -> one parameter.
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                   tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
            if key in by_storage and tensor.numel() > 0:
                env[node] = by_storage[key]
                continue
            arr = to_numpy(tensor)
            is_float = arr.dtype.kind == "f" or arr.dtype.name == "bfloat16"
            if spec.kind == InputKind.CONSTANT_TENSOR or not is_float:
                v = ctx.const(arr, name=spec.target)
            else:
                v = ctx.graph.add_input(spec.target, arr.shape, arr.dtype)
                ctx.param_values[v] = arr
                params[spec.target] = arr
            by_storage[key] = v
            env[node] = v
        else:
            raise UnsupportedOpError(f"input {node.name!r} of kind {spec.kind.name} is not "
                                     f"supported")

    out_node = None
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            out_node = node
            break
        ctx.node = node
        env[node] = _convert_node(ctx, node, env)
        _name_outputs(env[node], node.name)
    ctx.node = None
    if out_node is None:
        raise InputError("the exported program has no output node")

    flat = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) \
        else [out_node.args[0]]
    outputs: list[Value] = []
    for spec, arg in zip(sig.output_specs, flat):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue  # buffer mutations: inference has none worth keeping
        res: Any = env.get(arg) if isinstance(arg, torch.fx.Node) else arg
        if not isinstance(res, Value):
            raise UnsupportedOpError(f"output {spec.arg.name!r} is not a tensor "
                                     f"({type(res).__name__}); Kiln graphs return tensors")
        if res in ctx.sym_values:
            raise UnsupportedOpError(f"output {spec.arg.name!r} is computed from symbolic "
                                     f"sizes only; Kiln does not return sizes as tensor data")
        outputs.append(res)
    ctx.graph.outputs = outputs
    graph = dead_code_elimination(ctx.graph)
    used = set(graph.outputs)
    for n in graph.nodes:
        used.update(n.inputs)
    graph.inputs = [v for v in graph.inputs if v.name not in params or v in used]
    live = {v.name for v in graph.inputs}
    return graph, {k: v for k, v in params.items() if k in live}


def _name_outputs(res: Any, name: str) -> None:
    if isinstance(res, Value):
        if res.name is None and not res.is_input:
            res.name = name
    elif isinstance(res, list):
        for i, v in enumerate(res):
            if isinstance(v, Value) and v.name is None and not v.is_input:
                v.name = f"{name}.{i}"


def _lookup(env: Mapping[Any, Any], a: Any) -> Any:
    import torch

    if isinstance(a, torch.fx.Node):
        if a not in env:
            raise InputError(f"FX node {a.name!r} is used before it is defined")
        return env[a]
    if isinstance(a, (list, tuple)):
        return type(a)(_lookup(env, x) for x in a)
    if isinstance(a, dict):
        return {k: _lookup(env, x) for k, x in a.items()}
    return a


def _bind(ctx: Context, node: Any, env: Mapping[Any, Any]) -> Args:
    """The node's arguments by schema name, with defaults."""
    schema = getattr(node.target, "_schema", None)
    args = [_lookup(env, a) for a in node.args]
    kwargs = {k: _lookup(env, a) for k, a in node.kwargs.items()}
    if schema is None:
        return Args({**{str(i): a for i, a in enumerate(args)}, **kwargs}, ctx.where)
    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return Args(out, ctx.where)


def _convert_node(ctx: Context, node: Any, env: Mapping[Any, Any]) -> Any:
    """Converted result of one call: a Value, or a list for multi-output ops."""
    if node.target is operator.getitem:
        seq, idx = _lookup(env, node.args[0]), node.args[1]
        try:
            v = seq[idx]
        except (TypeError, IndexError):
            raise InputError(f"{ctx.where}: cannot take item {idx} of {type(seq).__name__}"
                             ) from None
        if v is None:
            src = node.args[0]
            raise UnsupportedOpError(f"FX node {node.name!r} uses output {idx} of "
                                     f"{src.name!r} ({src.target}), which Kiln does not compute")
        return v
    if _is_size_op(node):
        return _size_op(ctx, node)
    conv = _CONVERTERS[_target_key(node.target)]
    try:
        res = conv(ctx, node, _bind(ctx, node, env))
        if isinstance(res, Value):
            return _check_result(ctx, res, 0)
        res = list(res)
        return [_check_result(ctx, v, i) if v is not None else None for i, v in enumerate(res)]
    except KilnError as exc:
        msg = str(exc)
        raise type(exc)(msg if repr(node.name) in msg else f"{ctx.where}: {msg}") from None
    except Exception as exc:  # noqa: BLE001  (a converter bug or an unforeseen variant)
        raise InputError(f"{ctx.where} cannot be converted ({type(exc).__name__}: {exc})"
                         ) from exc


def _check_result(ctx: Context, v: Value, index: int) -> Value:
    """``v`` cast to the dtype torch recorded; InputError if its shape differs from torch's."""
    val = ctx.node.meta.get("val")
    if isinstance(val, (list, tuple)):
        val = val[index] if index < len(val) else None
    if val is None or not hasattr(val, "shape"):
        return v
    want = tuple(ctx.dim(d) for d in val.shape)
    got = tuple(v.type.dims)
    if got != want and not _same_dims(got, want, ctx.graph.dim_ranges):
        shown = ", ".join(map(str, want))
        raise InputError(f"{ctx.where}: Kiln computed shape {v.type}, torch recorded "
                         f"({shown})")
    return ctx.cast(v, torch_dtype(val.dtype))


def _same_dims(a: Sequence[Dim], b: Sequence[Dim], ranges: Mapping[str, tuple[int, int]]
               ) -> bool:
    """Whether two dim tuples agree at the low, high and middle points of the ranges (floor
    divisions torch and Kiln write differently, ``(s+1)//2`` against ``s//2 + ...``)."""
    if len(a) != len(b) or not ranges:
        return False
    points = [{k: lo for k, (lo, _) in ranges.items()}, {k: hi for k, (_, hi) in ranges.items()},
              {k: (lo + hi) // 2 for k, (lo, hi) in ranges.items()},
              {k: min(lo + 1, hi) for k, (lo, hi) in ranges.items()}]
    try:
        return all(sym.evaluate(x, env) == sym.evaluate(y, env)
                   for env in points for x, y in zip(a, b))
    except KilnError:
        return False


#: Python operators torch.export records on SymInts (``b * 2``, ``s // 2``, ``s >= 1``).
_SIZE_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv,
                             operator.truediv, operator.mod, operator.neg, operator.pos,
                             operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
                             operator.ge, operator.and_, operator.or_, operator.not_})
#: ATen ops on sizes (evaluated from the recorded value) and runtime asserts (dropped).
_SIZE_ATEN = ("aten.sym_size.", "aten.sym_numel.", "aten.sym_stride.",
              "aten.sym_storage_offset.", "aten._assert_scalar.", "aten._assert_async.",
              "aten.sym_constrain_range", "aten._functional_assert_scalar.")


def _is_size_op(node: Any) -> bool:
    """Whether ``node`` computes a size (a SymInt / SymBool), not a tensor."""
    t = node.target
    if t in _SIZE_OPERATORS:
        return True
    if str(t).startswith(_SIZE_ATEN):
        return True
    name = getattr(t, "__name__", "")
    return getattr(t, "__module__", "") in ("torch", "torch.fx.experimental.sym_node") and \
        name.startswith(("sym_", "_sym_"))


def _size_op(ctx: Context, node: Any) -> Any:
    """A size computation evaluated at import: its Kiln dim, never the upper bound.

    torch recorded the result (``node.meta["val"]``) as a SymInt over the program's symbols,
    so its expression *is* the answer; runtime asserts and SymBools (which only feed asserts)
    become None.
    """
    import torch

    ctx.node = node
    val = node.meta.get("val")
    if isinstance(val, torch.SymInt):
        return ctx.dim(val)
    if isinstance(val, (bool, int, float)):
        return val
    return None
