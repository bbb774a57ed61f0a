"""Sequence and optional inputs / outputs of a compiled graph (the ``kiln_values`` layouts).

Kiln compiles a sequence with a structure fixed at compile time: its length and its element
shapes and dtype. The frontend flattens a sequence graph input into one tensor argument per
element (``x.0``, ``x.1``, ...) and a sequence output into one head per element; an optional
holds its value's layout or nothing. A sequence whose length is decided at run time (its
elements of one static shape) is one tensor ``[T, *elem]`` instead, a *stacked* sequence whose
leading dim is its length. The graph JSON's top-level ``kiln_values`` object records how to
regroup them (``docs/sequences.md``); readers that predate it ignore it and see the flattened
tensors.

:class:`ValueLayouts` reads and validates that object; :class:`kiln.GraphModule` uses it so
that ``set_input(name, [a, b, c])`` / ``set_input(name, None)`` take, and ``get_output(i)``
returns, Python lists of arrays and ``None``.

Runtime layer: NumPy and the standard library only.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .errors import FormatError, InputError
from .ndarray import array as nd_array

if TYPE_CHECKING:
    from .graph_executor import GraphModule
    from .graph_json import Graph

__all__ = ["Layout", "ValueLayouts", "layouts_of", "KEY"]

#: Top-level graph JSON key of the layouts.
KEY = "kiln_values"

_KINDS = ("tensor", "sequence", "optional")


class Layout:
    """Where one (possibly structured) value lives among the graph's tensors.

    Attributes
    ----------
    kind : str
        ``"tensor"``, ``"sequence"`` or ``"optional"``.
    slot : str or int or None
        For a tensor: its argument name (an input) or head index (an output).
    items : tuple of Layout
        For a sequence: its elements (tensors); empty for a stacked sequence.
    stacked : Layout or None
        For a sequence whose length is decided at run time: the one tensor ``[T, *elem]``
        holding its ``T`` elements (``None`` for a sequence of a length fixed at compile time).
    elem_dtype : str or None
        For a sequence: the element dtype.
    value : Layout or None
        For an optional: the held value's layout, ``None`` when the graph was compiled for an
        absent value.
    """

    def __init__(
        self,
        kind: str,
        slot: str | int | None = None,
        items: Sequence["Layout"] = (),
        elem_dtype: str | None = None,
        value: "Layout | None" = None,
        stacked: "Layout | None" = None,
    ) -> None:
        self.kind, self.slot, self.items = kind, slot, tuple(items)
        self.elem_dtype, self.value, self.stacked = elem_dtype, value, stacked

    def describe(self) -> str:
        """The type as text: ``sequence<float32>[3]``, ``sequence<float32>[?]`` (a length decided at
        run time), ``optional<tensor>``, ``optional<none>``."""
        if self.kind == "sequence":
            return f"sequence<{self.elem_dtype}>[{'?' if self.stacked is not None else len(self.items)}]"
        if self.kind == "optional":
            return f"optional<{'none' if self.value is None else self.value.describe()}>"
        return "tensor"

    def slots(self) -> list[str | int]:
        """The argument names / head indices this value spans, in order."""
        if self.kind == "sequence":
            if self.stacked is not None:
                return self.stacked.slots()
            return [s for it in self.items for s in it.slots()]
        if self.kind == "optional":
            return [] if self.value is None else self.value.slots()
        assert self.slot is not None
        return [self.slot]


def _parse(obj: Any, slot_key: str, where: str, depth: int = 0) -> Layout:
    if not isinstance(obj, Mapping) or obj.get("kind") not in _KINDS:
        raise FormatError(f"graph JSON {KEY}: {where} must be an object with 'kind' one of {_KINDS}, got {obj!r:.80}")
    kind = obj["kind"]
    if kind == "tensor":
        slot = obj.get(slot_key)
        ok = isinstance(slot, str) if slot_key == "arg" else isinstance(slot, int) and not isinstance(slot, bool)
        if not ok:
            raise FormatError(
                f"graph JSON {KEY}: {where} (a tensor) needs {slot_key!r} "
                f"({'a name' if slot_key == 'arg' else 'an int'}), got {obj.get(slot_key)!r:.80}"
            )
        return Layout("tensor", slot)
    if depth >= 2:  # an optional of a sequence of tensors is the deepest ONNX value Kiln takes
        raise FormatError(f"graph JSON {KEY}: {where} is nested too deeply")
    if kind == "sequence":
        items, dt = obj.get("items"), obj.get("elem_dtype")
        if "stacked" in obj and isinstance(dt, str) and items is None:
            # a length decided at run time: one tensor whose leading dim is the length
            data = _parse(obj["stacked"], slot_key, f"{where}.stacked", depth + 1)
            if data.kind != "tensor":
                raise FormatError(f"graph JSON {KEY}: {where}.stacked must be a tensor layout")
            return Layout("sequence", elem_dtype=dt, stacked=data)
        if not isinstance(items, list) or not isinstance(dt, str):
            raise FormatError(
                f"graph JSON {KEY}: {where} (a sequence) needs 'items' (a list) or 'stacked' (a tensor "
                "layout), and 'elem_dtype' (a string)"
            )
        lays = [_parse(it, slot_key, f"{where}.items[{k}]", depth + 1) for k, it in enumerate(items)]
        if any(x.kind != "tensor" for x in lays):
            raise FormatError(f"graph JSON {KEY}: {where}: sequence elements must be tensors")
        return Layout("sequence", items=lays, elem_dtype=dt)
    if "value" not in obj:
        raise FormatError(f"graph JSON {KEY}: {where} (an optional) needs 'value' (null or a layout)")
    v = obj["value"]
    inner = None if v is None else _parse(v, slot_key, f"{where}.value", depth + 1)
    if inner is not None and inner.kind == "optional":
        raise FormatError(f"graph JSON {KEY}: {where}: an optional may not hold an optional")
    return Layout("optional", value=inner)


class ValueLayouts:
    """The ``kiln_values`` object of a graph: structured inputs by name, every output's layout.

    Parameters
    ----------
    obj : dict
        The object (``{"inputs": {name: layout}, "outputs": [layout, ...]}``).
    arg_names : sequence of str
        The graph's argument names (tensor slots of inputs must be among them).
    num_heads : int
        The number of graph heads (every head must belong to exactly one output).

    Raises
    ------
    FormatError
        A malformed object, an unknown argument, a head out of range or not covered once.
    """

    def __init__(self, obj: Any, arg_names: Sequence[str], num_heads: int) -> None:
        if (
            not isinstance(obj, Mapping)
            or not isinstance(obj.get("inputs", {}), Mapping)
            or not isinstance(obj.get("outputs"), list)
        ):
            raise FormatError(f"graph JSON {KEY} must be an object with 'inputs' (an object) and 'outputs' (a list)")
        args = set(arg_names)
        self.inputs: dict[str, Layout] = {}
        for name, lay in obj.get("inputs", {}).items():
            layout = _parse(lay, "arg", f"inputs[{name!r}]")
            if layout.kind == "tensor":
                raise FormatError(
                    f"graph JSON {KEY}: inputs[{name!r}] is a plain tensor; only sequence / optional inputs are listed"
                )
            if name in args:
                raise FormatError(f"graph JSON {KEY}: input {name!r} is also a tensor argument")
            unknown = [a for a in layout.slots() if a not in args]
            if unknown:
                raise FormatError(f"graph JSON {KEY}: inputs[{name!r}] names unknown argument {unknown[0]!r}")
            self.inputs[str(name)] = layout
        self.outputs: list[Layout] = []
        self.output_names: list[str] = []
        heads: list[int] = []
        for k, lay in enumerate(obj["outputs"]):
            self.outputs.append(_parse(lay, "head", f"outputs[{k}]"))
            name = lay.get("name", f"output {k}")
            self.output_names.append(str(name))
            heads += [int(h) for h in self.outputs[-1].slots()]
        if sorted(heads) != list(range(num_heads)):
            raise FormatError(
                f"graph JSON {KEY}: the outputs must cover heads 0..{num_heads - 1} once "
                f"each, they cover {sorted(heads)[:16]}"
            )

    def describe_inputs(self) -> dict[str, str]:
        """Structured input name -> its type as text (for ``kiln inspect``)."""
        return {n: lay.describe() for n, lay in self.inputs.items()}


def layouts_of(graph: "Graph") -> ValueLayouts | None:
    """The ``kiln_values`` layouts of a validated graph, or None for a tensor-only graph.

    Parameters
    ----------
    graph : kiln.runtime.graph_json.Graph

    Raises
    ------
    FormatError
        The object is malformed (:class:`ValueLayouts`).
    """
    text = graph.json_text
    if f'"{KEY}"' not in text:
        return None
    obj = json.loads(text).get(KEY)  # the reader parsed this text already: it is bounded JSON
    if obj is None:
        return None
    arg_names = [graph.nodes[n].name for n in graph.arg_nodes]
    return ValueLayouts(obj, arg_names, len(graph.heads))


# ----------------------------------------------------------------------------- GraphModule hooks
def set_structured(gm: "GraphModule", name: str, layout: Layout, value: Any) -> None:
    """Copy a list (sequence) / ``None`` or value (optional) into input ``name``'s tensors.

    Raises
    ------
    InputError
        ``value`` does not have the structure the graph was compiled for (names the input,
        the expected and the given structure).
    """
    what = f"input {name!r} ({layout.describe()})"
    if layout.kind == "optional":
        if layout.value is None:
            if value is not None:
                raise InputError(
                    f"{what}: the graph was compiled for an absent optional; pass None, got {type(value).__name__}"
                )
            return
        if value is None:
            raise InputError(
                f"{what}: the graph was compiled for a present value; None is not "
                f"accepted (compile another module for an absent one)"
            )
        layout = layout.value
        if layout.kind == "tensor":
            _copy(gm, name, layout, value, f"input {name!r}")
            return
    if layout.stacked is not None:
        _set_stacked(gm, name, layout, value, what)
        return
    if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
        raise InputError(
            f"{what}: expected a list of {len(layout.items)} {layout.elem_dtype} array(s), got {type(value).__name__}"
        )
    if len(value) != len(layout.items):
        raise InputError(
            f"{what}: expected a list of {len(layout.items)} element(s) (the length it "
            f"was compiled for), got {len(value)}"
        )
    # check every element's shape and dtype before copying any of them
    ex = gm.module
    for k, (item, v) in enumerate(zip(layout.items, value)):
        if v is None:
            raise InputError(f"{what}: element {k} is None")
        eid = ex.arg_eid[str(item.slot)]
        arr = v if hasattr(v, "shape") and hasattr(v, "dtype") else np.asarray(v)
        shape, dt = tuple(arr.shape), str(arr.dtype).removeprefix("torch.")
        want_shape, want_dt = tuple(ex.graph.shape[eid]), ex.graph.dltype[eid]
        if shape != want_shape or dt != want_dt:
            raise InputError(
                f"{what}: element {k} has shape {shape} dtype {dt}, the graph was "
                f"compiled for shape {want_shape} dtype {want_dt}"
            )
    for item, v in zip(layout.items, value):
        _copy(gm, name, item, v, f"input {name!r}")


def _set_stacked(gm: "GraphModule", name: str, layout: Layout, value: Any, what: str) -> None:
    """A list of same-shaped arrays into the one tensor of a runtime-length sequence input."""
    assert layout.stacked is not None
    if isinstance(value, np.ndarray) or not isinstance(value, (list, tuple)):
        raise InputError(f"{what}: expected a list of {layout.elem_dtype} arrays, got {type(value).__name__}")
    ex = gm.module
    arg = str(layout.stacked.slot)
    eid = ex.arg_eid[arg]
    elem, want_dt = tuple(ex.graph.shape[eid][1:]), ex.graph.dltype[eid]
    rows = []
    for k, v in enumerate(value):
        if v is None:
            raise InputError(f"{what}: element {k} is None")
        arr = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        if tuple(arr.shape) != elem or str(arr.dtype) != want_dt:
            raise InputError(
                f"{what}: element {k} has shape {tuple(arr.shape)} dtype {arr.dtype}, the graph was "
                f"compiled for elements of shape {elem} dtype {want_dt}"
            )
        rows.append(arr)
    # (the length's range is checked like any dynamic input's dim)
    stacked = np.stack(rows) if rows else np.zeros((0,) + elem, dtype=want_dt)
    gm._copy_in(arg, eid, stacked, f"input {name!r}")


def _copy(gm: "GraphModule", name: str, item: Layout, v: Any, what: str) -> None:
    arg = str(item.slot)
    gm._copy_in(arg, gm.module.arg_eid[arg], v, what)


def get_structured(gm: "GraphModule", layout: Layout) -> Any:
    """Output ``layout`` as an NDArray (tensor), a list of NDArrays (sequence) or None."""
    if layout.kind == "tensor":
        ex = gm.module
        eid = ex.output_eids[int(layout.slot)]  # type: ignore[arg-type]
        if ex.dyn is not None and ex.dyn.is_dynamic(eid):
            return gm._dynamic_copy(eid)
        arr = ex.arrays[eid]
        return arr.copyto(arr.device)
    if layout.kind == "sequence":
        if layout.stacked is not None:
            stacked = get_structured(gm, layout.stacked)
            rows = stacked.numpy()
            # (np.array, not ascontiguousarray: a row of a 1-D tensor is a 0-d element)
            return [nd_array(np.array(r), device=stacked.device) for r in rows]
        return [get_structured(gm, it) for it in layout.items]
    return None if layout.value is None else get_structured(gm, layout.value)


def describe_values(graph: "Graph") -> dict[str, Any] | None:
    """The sequence / optional inputs and outputs of a graph as text (for ``kiln inspect``).

    Returns
    -------
    dict or None
        ``{"inputs": {name: type}, "outputs": [{"name": ..., "type": ..., "heads": [...]}, ...]}``
        (every logical output, with the head indices it regroups), or None for a tensor-only
        graph.
    """
    lays = layouts_of(graph)
    if lays is None:
        return None
    return {
        "inputs": lays.describe_inputs(),
        "outputs": [
            {"name": n, "type": lay.describe(), "heads": [int(h) for h in lay.slots()]}
            for n, lay in zip(lays.output_names, lays.outputs)
        ],
    }
