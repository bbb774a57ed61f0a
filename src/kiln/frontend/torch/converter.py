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

Kiln graphs have static shapes; programs exported with dynamic dimensions (``torch.export.Dim``)
are refused with an :class:`UnsupportedOpError` rather than silently specialised.
"""

from __future__ import annotations

import importlib
import importlib.util
import operator
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...ir import Graph, Value, dead_code_elimination
from ...ir.types import DTYPES, np_dtype
from ...runtime.errors import InputError, KilnError, UnsupportedOpError
from ..onnx.converter import Context as _BaseContext

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

    def __init__(self, name: str) -> None:
        super().__init__(0, name)

    @property
    def where(self) -> str:
        n = self.node
        return f"FX node {n.name!r} ({n.target})" if n is not None else "graph"

    def static(self, v: Value | None, what: str) -> np.ndarray:
        """The array of ``v``; UnsupportedOpError if it is only known at run time."""
        arr = self.try_static(v)
        if arr is None:
            raise UnsupportedOpError(f"{self.where}: input {what!r} must be a constant (Kiln "
                                     f"compiles static shapes); it is computed at run time")
        return arr

    def scalar(self, value: Any, like: Value) -> Value:
        """A 0-d constant of ``like``'s dtype holding the Python number ``value``."""
        return self.const(np.asarray(value, dtype=np_dtype(like.dtype)))

    def out_shape(self, index: int = 0) -> tuple[int, ...]:
        """The shape torch recorded for output ``index`` of the current node."""
        val = self.node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = val[index]
        if val is None or not hasattr(val, "shape"):
            raise self.bad("torch recorded no output shape for this node")
        return tuple(int(d) for d in val.shape)

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
               ) -> tuple[Graph, dict[str, np.ndarray]]:
    """Export a ``torch.nn.Module`` with ``torch.export.export`` and convert it.

    Parameters
    ----------
    module : torch.nn.Module
        The model; put it in ``eval()`` mode first (batch norm and dropout are converted in
        their inference form).
    example_inputs : sequence of torch.Tensor
        Positional example inputs; their shapes become the graph's static input shapes.
    dynamic_shapes : None
        Only ``None``: Kiln has no symbolic dimensions yet.

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
        ``dynamic_shapes`` given, or ATen ops without a converter (all listed in one message).
    InputError
        ``example_inputs`` not a sequence, or a node torch produced that Kiln cannot convert.
    """
    _reject_dynamic(dynamic_shapes)
    import torch

    if isinstance(example_inputs, torch.Tensor) or not isinstance(example_inputs, (tuple, list)):
        raise InputError(f"example_inputs must be a tuple of tensors, got "
                         f"{type(example_inputs).__name__}")
    ep = torch.export.export(module, tuple(example_inputs))
    return from_exported_program(ep)


def from_exported_program(ep: Any, decompose: bool = True,
                          ) -> tuple[Graph, dict[str, np.ndarray]]:
    """Convert a ``torch.export.ExportedProgram`` to a Kiln graph.

    Parameters
    ----------
    ep : torch.export.ExportedProgram
        The program, e.g. from ``torch.export.export`` or ``torch.export.load``.
    decompose : bool
        Lower the program to core ATen first, keeping the ops Kiln converts directly (see the
        module docstring). ``False`` converts the graph as it is.

    Returns
    -------
    graph : Graph
        Inputs are the user inputs (by their names in the program) followed by the parameter
        placeholders (by fully qualified name).
    params : dict of str to numpy.ndarray
        Parameter and buffer values still used by the graph.

    Raises
    ------
    UnsupportedOpError
        Dynamic input dimensions, non-tensor inputs that are not constants, ATen ops without a
        converter (all listed in one message, before anything is converted) or unsupported
        variants of supported ops (naming the FX node).
    InputError
        A node Kiln cannot convert for another reason (naming the FX node).
    """
    import torch

    if not isinstance(ep, torch.export.ExportedProgram):
        raise InputError(f"from_exported_program expects a torch.export.ExportedProgram, got "
                         f"{type(ep).__name__}")
    _check_static(ep)
    if decompose:
        ep = decompose_program(ep)
    _load_converters()
    _check_supported(ep)
    return _convert(ep)


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
            if node.target is operator.getitem:
                continue
            key = _target_key(node.target)
            if key not in _CONVERTERS:
                missing.setdefault(key, []).append(node.name)
        elif node.op in ("call_module", "call_method"):
            missing.setdefault(f"{node.op} {node.target}", []).append(node.name)
    return missing


# ------------------------------------------------------------------ checks
def _reject_dynamic(dynamic_shapes: Any) -> None:
    if dynamic_shapes is not None:
        raise UnsupportedOpError(
            "dynamic_shapes is not supported yet: Kiln compiles static shapes and has no "
            "symbolic dimensions. Export with dynamic_shapes=None and build one library per "
            "input shape.")


def _check_static(ep: Any) -> None:
    import torch

    for node in ep.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) or (isinstance(val, torch.Tensor) and not all(
                isinstance(d, int) for d in val.shape)):
            raise UnsupportedOpError(
                f"input {node.name!r} has dynamic dimensions ({tuple(val.shape) if hasattr(val, 'shape') else val}); "
                f"dynamic dims (torch.export.Dim) are not supported yet: export with static "
                f"shapes")


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
def _convert(ep: Any) -> tuple[Graph, dict[str, np.ndarray]]:
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

    ctx = Context("main")
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
            env[node] = ctx.graph.add_input(spec.arg.name, tuple(int(d) for d in val.shape),
                                            torch_dtype(val.dtype))
        elif isinstance(val, (int, float, bool)) or val is None:
            env[node] = val  # export specialised the program on this value
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
    want = tuple(int(d) for d in val.shape)
    if v.shape != want:
        raise InputError(f"{ctx.where}: Kiln computed shape {v.shape}, torch recorded {want}")
    return ctx.cast(v, torch_dtype(val.dtype))
