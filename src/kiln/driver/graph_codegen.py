"""Executor codegen: fused + lowered graph -> graph JSON, params and memory plan.

The JSON is the well-known graph-executor layout (``docs/compiler.md`` and the runtime's
``docs/graph_json_format.md``):

* node order: the graph inputs (in the graph's input order), then the params (first-use
  order), then one ``tvm_op`` node per kernel call in execution order — TVM's
  ``GraphExecutorCodegen`` order, so ``add(add(a, b), c)`` gives ``a, b, c, add, add``;
* ``arg_nodes`` lists every ``null`` node; ``heads`` the graph outputs;
* ``attrs.dltype`` / ``attrs.shape`` / ``attrs.storage_id`` describe every entry
  (``entry_id(nid, i) = node_row_ptr[nid] + i``); storage ids come from
  :func:`kiln.transform.memory_plan.plan_memory`.

Heterogeneous graphs (calls on more than one device, or on a non-CPU device): every
kernel call carries the DLPack device type it runs on. A graph input or param lives on the
device of its first reader. Where a call reads a value that lives on another device, a
``__copy`` node (one input, one output, same shape) is inserted right before it — once per
(value, device) — and later readers on that device reuse the copy. ``attrs.device_index``
(``list_int``) gives the device type of every entry, and storage is planned per device.

Param naming: a param keeps the model's name when it is an unmodified initializer (same name,
same data as what the user bound); anything the compiler made (folded, BN-scaled, split off a
bigger constant...) is called ``p0, p1, ...``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..ir import Graph, Value
from ..runtime.errors import KilnError
from ..transform.memory_plan import MemoryPlan, PlanOp, plan_memory

__all__ = ["KernelCall", "GraphCodegenResult", "generate_graph_json", "original_param_arrays"]


@dataclass
class KernelCall:
    """One kernel invocation in execution order.

    Attributes
    ----------
    func_name : str
        Kernel symbol, ``"__nop"`` for an aliasing reshape, or ``"__concat"`` for a
        concatenation written in place (see :mod:`kiln.transform.inplace_concat`).
    args : list of Value
        Input values passed to the kernel (in placeholder order; inlined constants excluded).
    outputs : list of Value
        Values the kernel writes.
    node_name : str
        Name of the graph JSON node (defaults to ``func_name``).
    device : int
        DLPack device type the call runs on (1 = CPU).
    attrs : dict
        Extra node attributes (the nested graphs of ``__if`` / ``__loop``).
    """

    func_name: str
    args: list[Value]
    outputs: list[Value]
    node_name: str = ""
    device: int = 1
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GraphCodegenResult:
    """Output of :func:`generate_graph_json`.

    Attributes
    ----------
    graph : dict
        The graph JSON object.
    params : dict of str to numpy.ndarray
        Param arrays keyed by their arg-node name.
    memory_plan : MemoryPlan
    value_entry : dict
        ``Value -> entry id`` (for debugging and tests).
    """

    graph: dict[str, Any]
    params: dict[str, np.ndarray]
    memory_plan: MemoryPlan
    value_entry: dict[Value, int] = field(default_factory=dict)

    @property
    def json(self) -> str:
        """The graph JSON text."""
        return json.dumps(self.graph, indent=2)


def original_param_arrays(graph: Graph, params: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """Name -> array of what the user handed in: bound params and named constants of ``graph``.

    The result is what :func:`generate_graph_json` compares against to decide whether a
    param keeps its model name.
    """
    out: dict[str, np.ndarray] = {}
    for n in graph.nodes:
        if n.op == "constant":
            name = n.name or n.outputs[0].name
            if name:
                out[name] = n.attrs["value"]
    for k, v in (params or {}).items():
        if hasattr(v, "numpy") and not isinstance(v, np.ndarray):
            v = v.numpy()
        out[k] = np.asarray(v)
    return out


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if np.shares_memory(a, b) or a.size == 0:
        return True
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def generate_graph_json(graph: Graph, calls: Sequence[KernelCall],
                        originals: Mapping[str, np.ndarray] | None = None) -> GraphCodegenResult:
    """Build the graph JSON, the params dict and the memory plan.

    Parameters
    ----------
    graph : Graph
        The compiled graph (its inputs become input nodes, its outputs the heads).
    calls : sequence of KernelCall
        Kernel calls in execution order.
    originals : dict, optional
        From :func:`original_param_arrays`; decides which params keep their names.

    Returns
    -------
    GraphCodegenResult
    """
    originals = dict(originals or {})
    calls, vdev = _insert_copies(graph, calls)
    nodes: list[dict[str, Any]] = []
    row_ptr = [0]
    dltype: list[str] = []
    shape: list[list[int]] = []
    entry_bytes: list[int] = []
    sym_shape: list[list[int | str]] = []  # every entry's dims, symbolic ones as expressions
    ventry: dict[Value, tuple[int, int]] = {}  # value -> (node id, output index)

    def add_entries(vals: Sequence[Value]) -> None:
        for v in vals:
            dltype.append(v.dtype)
            shape.append([int(d) for d in v.shape])
            sym_shape.append(list(v.type.dims))
            entry_bytes.append(v.type.nbytes)
        row_ptr.append(row_ptr[-1] + len(vals))

    used_names = {v.name for v in graph.inputs}
    arg_nodes: list[int] = []
    for v in graph.inputs:
        ventry[v] = (len(nodes), 0)
        arg_nodes.append(len(nodes))
        nodes.append({"op": "null", "name": v.name, "inputs": []})
        add_entries([v])

    # Params: constants read by a kernel (or returned as outputs), in first-use order.
    param_vals: list[Value] = []
    seen: set[Value] = set()
    produced = {o for c in calls for o in c.outputs}
    for v in [a for c in calls for a in c.args] + list(graph.outputs):
        if v.is_constant and v not in seen:
            seen.add(v)
            param_vals.append(v)
        elif v.node is None and v not in ventry and v not in produced:
            raise KilnError(f"value {v!r} is read by a kernel but is not a graph input")
    params: dict[str, np.ndarray] = {}
    counter = 0
    for v in param_vals:
        arr = v.const_value
        cand = v.node.name or v.name
        if cand and cand not in used_names and cand in originals and _same_array(arr, originals[cand]):
            name = cand
        else:
            while f"p{counter}" in used_names or f"p{counter}" in originals:
                counter += 1
            name = f"p{counter}"
            counter += 1
        used_names.add(name)
        params[name] = arr
        ventry[v] = (len(nodes), 0)
        arg_nodes.append(len(nodes))
        nodes.append({"op": "null", "name": name, "inputs": []})
        add_entries([v])

    node_names: dict[str, int] = {}
    for c in calls:
        for a in c.args:
            if a not in ventry:
                raise KilnError(f"kernel {c.func_name}: input {a!r} is produced by no earlier call")
        nid = len(nodes)
        base = c.node_name or c.func_name
        # Unique node names help the debug executor's per-node report.
        k = node_names.get(base, 0)
        node_names[base] = k + 1
        name = base if k == 0 else f"{base}_{k}"
        nodes.append({
            "op": "tvm_op",
            "name": name,
            "attrs": {
                "func_name": c.func_name,
                "num_inputs": str(len(c.args)),
                "num_outputs": str(len(c.outputs)),
                "flatten_data": "0",
                **c.attrs,
            },
            "inputs": [[*ventry[a], 0] for a in c.args],
        })
        for i, o in enumerate(c.outputs):
            ventry[o] = (nid, i)
        add_entries(c.outputs)

    heads = []
    for v in graph.outputs:
        if v not in ventry:
            raise KilnError(f"graph output {v!r} is produced by no kernel")
        heads.append([*ventry[v], 0])

    def eid(v: Value) -> int:
        nid, i = ventry[v]
        return row_ptr[nid] + i

    plan_ops = [PlanOp(tuple(eid(a) for a in c.args), tuple(eid(o) for o in c.outputs),
                       c.func_name == "__nop", c.func_name == "__concat") for c in calls]
    fixed = [row_ptr[n] for n in arg_nodes]
    device_index = [1] * len(entry_bytes)
    for v in ventry:
        device_index[eid(v)] = vdev.get(v, 1)
    hetero = any(d != 1 for d in device_index)
    plan = plan_memory(entry_bytes, plan_ops, fixed, [eid(v) for v in graph.outputs],
                       devices=device_index if hetero else None)
    gjson: dict[str, Any] = {
        "nodes": nodes,
        "arg_nodes": arg_nodes,
        "heads": heads,
        "attrs": {
            "dltype": ["list_str", dltype],
            "shape": ["list_shape", shape],
            "storage_id": ["list_int", plan.storage_ids],
        },
        "node_row_ptr": row_ptr,
    }
    if hetero:
        gjson["attrs"]["device_index"] = ["list_int", device_index]
    if any(plan.storage_offsets):
        # Only graphs with concatenations written in place carry it (older readers refuse
        # '__concat' anyway); other graphs stay byte-identical.
        gjson["attrs"]["storage_offset"] = ["list_int", plan.storage_offsets]
    if any(isinstance(d, str) for dims in sym_shape for d in dims):
        # Only graphs with dynamic dimensions carry these: static graphs stay byte-identical.
        gjson["attrs"]["sym_shape"] = ["list_sym_shape", sym_shape]
        ranges = sorted(graph.dim_ranges.items())
        gjson["attrs"]["dim_ranges"] = ["list_dim_range", [
            [n, lo, hi] + (["data"] if n in graph.data_dims else []) for n, (lo, hi) in ranges]]
    return GraphCodegenResult(gjson, params, plan, {v: eid(v) for v in ventry})


def _insert_copies(graph: Graph, calls: Sequence[KernelCall]) -> tuple[list[KernelCall], dict[Value, int]]:
    """Decide the device of every value and put ``__copy`` calls at device boundaries.

    Returns the new call list and ``value -> device type``. ``__nop`` aliases run on their
    input's device (an alias cannot change device).
    """
    vdev: dict[Value, int] = {}
    for c in calls:  # inputs and params: the device of their first reader
        dev = c.device
        for a in c.args:
            if (a.node is None or a.is_constant) and a not in vdev:
                vdev[a] = dev
    for v in graph.inputs:
        vdev.setdefault(v, 1)
    out: list[KernelCall] = []
    copies: dict[tuple[Value, int], Value] = {}
    for c in calls:
        if c.func_name in ("__nop", "__concat"):  # no work, memory of their inputs' device
            src = c.args[0]
            dev = vdev.setdefault(src, c.device)
            out.append(KernelCall(c.func_name, list(c.args), list(c.outputs), c.node_name, dev, c.attrs))
            for o in c.outputs:
                vdev[o] = dev
            continue
        args: list[Value] = []
        for a in c.args:
            adev = vdev.setdefault(a, c.device)
            if adev != c.device:
                cp = copies.get((a, c.device))
                if cp is None:
                    cp = Value(a.type, None, 0, f"{a.name or 'v'}_copy")
                    copies[(a, c.device)] = cp
                    vdev[cp] = c.device
                    out.append(KernelCall("__copy", [a], [cp], "__copy", c.device))
                a = cp
            args.append(a)
        out.append(KernelCall(c.func_name, args, list(c.outputs), c.node_name, c.device, c.attrs))
        for o in c.outputs:
            vdev[o] = c.device
    for v in graph.outputs:
        vdev.setdefault(v, 1)
    return out, vdev
