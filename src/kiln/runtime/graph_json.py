"""Reader and validator of the graph JSON executed by the graph executor.

The layout is the well-known graph-executor one (see ``docs/graph_json_format.md``). This
module only parses and checks it; it allocates nothing and imports nothing but the standard
library and the dtype table, so it is safe to use from tools (``kiln inspect``) too.

Every problem raises :class:`~kiln.runtime.errors.FormatError` whose message names the field
and, where there is one, the node (index and name), so a hand-edited or corrupt graph can be
fixed without reading this code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import FormatError

__all__ = ["GraphNode", "Graph", "load_graph_json", "RESERVED_FUNCS"]

#: Function names the executor implements itself instead of looking them up in the library.
RESERVED_FUNCS = ("__nop", "__copy")


@dataclass(frozen=True)
class GraphNode:
    """One node of the graph.

    Attributes
    ----------
    op : str
        ``"null"`` for an input or parameter, ``"tvm_op"`` for a kernel call.
    name : str
        Node name; for ``"null"`` nodes it is the input/param name users refer to.
    inputs : tuple of (int, int, int)
        ``(node_id, output_index, version)`` of each input entry.
    func_name : str
        Kernel function name (``""`` for ``"null"`` nodes). ``__nop``/``__copy`` are reserved.
    num_inputs, num_outputs : int
        Declared input/output counts (checked against ``inputs`` and ``node_row_ptr``).
    flatten_data : bool
        Pass every argument of the kernel as a 1-D tensor.
    attrs : dict
        The node's raw ``attrs`` object, for tools that want extra keys.
    """

    op: str
    name: str
    inputs: tuple[tuple[int, int, int], ...]
    func_name: str = ""
    num_inputs: int = 0
    num_outputs: int = 1
    flatten_data: bool = False
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_op(self) -> bool:
        """True for a kernel-call (``tvm_op``) node."""
        return self.op == "tvm_op"


@dataclass(frozen=True)
class Graph:
    """A validated graph.

    Attributes
    ----------
    nodes : tuple of GraphNode
    arg_nodes : tuple of int
        Node ids of inputs and parameters (all ``"null"`` nodes).
    heads : tuple of (int, int, int)
        Graph outputs as ``(node_id, output_index, version)``.
    node_row_ptr : tuple of int
        ``node_row_ptr[nid]`` is the entry id of node ``nid``'s first output.
    dltype : tuple of str
        Data type of every entry.
    shape : tuple of tuple of int
        Shape of every entry.
    storage_id : tuple of int
        Storage slot of every entry; entries with equal ids share memory.
    device_index : tuple of int or None
        DLPack device type code of every entry, or None when the graph runs on one device.
    json_text : str
        The JSON text the graph was read from (re-serialized if a dict was given).
    """

    nodes: tuple[GraphNode, ...]
    arg_nodes: tuple[int, ...]
    heads: tuple[tuple[int, int, int], ...]
    node_row_ptr: tuple[int, ...]
    dltype: tuple[str, ...]
    shape: tuple[tuple[int, ...], ...]
    storage_id: tuple[int, ...]
    device_index: tuple[int, ...] | None
    json_text: str

    @property
    def num_entries(self) -> int:
        """Number of data entries (node outputs) in the graph."""
        return self.node_row_ptr[-1]

    def entry_id(self, nid: int, index: int = 0) -> int:
        """Entry id of output ``index`` of node ``nid`` (``node_row_ptr[nid] + index``)."""
        return self.node_row_ptr[nid] + index

    def node_entries(self, nid: int) -> range:
        """Entry ids of all outputs of node ``nid``."""
        return range(self.node_row_ptr[nid], self.node_row_ptr[nid + 1])


# ---------------------------------------------------------------------------------------------
# parsing helpers


def _where(nid: int | None, name: str | None) -> str:
    if nid is None:
        return "graph JSON"
    return f"graph JSON node {nid}" + (f" ({name!r})" if name else "")


def _fail(msg: str, nid: int | None = None, name: str | None = None) -> FormatError:
    return FormatError(f"{_where(nid, name)}: {msg}")


def _is_int(v: Any) -> bool:
    # bool is an int subclass; a JSON `true` is never a valid index.
    return isinstance(v, int) and not isinstance(v, bool)


def _int_attr(attrs: Mapping[str, Any], key: str, nid: int, name: str, default: int | None) -> int:
    """Read a string-valued integer attribute (``"2"``); plain JSON ints are accepted too."""
    if key not in attrs:
        if default is None:
            raise _fail(f"attrs.{key} is missing (required for 'tvm_op' nodes)", nid, name)
        return default
    v = attrs[key]
    if _is_int(v):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    raise _fail(f"attrs.{key} must be an integer written as a string, got {v!r}", nid, name)


def _entry_ref(ref: Any, what: str, nid: int | None, name: str | None) -> tuple[int, int, int]:
    if (
        not isinstance(ref, (list, tuple))
        or len(ref) not in (2, 3)
        or not all(_is_int(x) for x in ref)
    ):
        raise _fail(f"{what} must be [node_id, output_index, version], got {ref!r}", nid, name)
    version = ref[2] if len(ref) == 3 else 0
    return int(ref[0]), int(ref[1]), int(version)


def _typed_list(attrs: Mapping[str, Any], key: str, tag: str, required: bool) -> list | None:
    if key not in attrs:
        if required:
            raise _fail(f"attrs.{key} is missing (expected [{tag!r}, [...]])")
        return None
    v = attrs[key]
    if (
        not isinstance(v, (list, tuple))
        or len(v) != 2
        or v[0] != tag
        or not isinstance(v[1], (list, tuple))
    ):
        shown = repr(v)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise _fail(f"attrs.{key} must be [{tag!r}, [...]], got {shown}")
    return list(v[1])


def _check_dtype(name: str, eid: int) -> None:
    from . import dtype as _dtype

    try:
        _dtype.to_dl(name)
    except Exception as e:  # the dtype module raises its own error type; normalize it here
        raise _fail(f"attrs.dltype[{eid}] = {name!r} is not a known data type ({e})") from None


def load_graph_json(graph: str | bytes | Mapping[str, Any]) -> Graph:
    """Parse and validate a graph JSON.

    Parameters
    ----------
    graph : str, bytes or dict
        The JSON text, or an already-decoded JSON object.

    Returns
    -------
    Graph
        The validated graph.

    Raises
    ------
    FormatError
        The text is not JSON, a required field is missing or malformed, sizes disagree, an
        input reference is out of range, or a storage id is negative. The message names the
        field and the node.
    """
    if isinstance(graph, (bytes, bytearray)):
        graph = graph.decode("utf-8")
    if isinstance(graph, str):
        text = graph
        try:
            obj = json.loads(graph)
        except json.JSONDecodeError as e:
            raise FormatError(f"graph JSON: not valid JSON ({e})") from None
    elif isinstance(graph, Mapping):
        obj = graph
        text = json.dumps(graph)
    else:
        raise FormatError(f"graph JSON: expected a str or dict, got {type(graph).__name__}")
    if not isinstance(obj, Mapping):
        raise FormatError(f"graph JSON: top level must be an object, got {type(obj).__name__}")

    for key in ("nodes", "arg_nodes", "heads", "node_row_ptr", "attrs"):
        if key not in obj:
            raise _fail(f"required key {key!r} is missing")
    raw_nodes = obj["nodes"]
    if not isinstance(raw_nodes, list):
        raise _fail("'nodes' must be a list")
    num_nodes = len(raw_nodes)

    # node_row_ptr first: every later check needs each node's output count.
    row_ptr = obj["node_row_ptr"]
    if not isinstance(row_ptr, list) or not all(_is_int(x) for x in row_ptr):
        raise _fail("'node_row_ptr' must be a list of integers")
    if len(row_ptr) != num_nodes + 1:
        raise _fail(
            f"'node_row_ptr' has {len(row_ptr)} items, expected len(nodes) + 1 = {num_nodes + 1}"
        )
    if row_ptr and row_ptr[0] != 0:
        raise _fail(f"'node_row_ptr' must start at 0, got {row_ptr[0]}")
    for i in range(num_nodes):
        if row_ptr[i + 1] < row_ptr[i]:
            raise _fail(f"'node_row_ptr' must be non-decreasing (item {i + 1})")

    nodes: list[GraphNode] = []
    for nid, rn in enumerate(raw_nodes):
        if not isinstance(rn, Mapping):
            raise _fail("must be an object", nid)
        name = rn.get("name")
        if not isinstance(name, str):
            raise _fail("field 'name' is missing or not a string", nid)
        op = rn.get("op")
        if op not in ("null", "tvm_op"):
            raise _fail(f"field 'op' must be 'null' or 'tvm_op', got {op!r}", nid, name)
        raw_inputs = rn.get("inputs", [])
        if not isinstance(raw_inputs, list):
            raise _fail("field 'inputs' must be a list", nid, name)
        inputs = []
        for k, ref in enumerate(raw_inputs):
            src, idx, ver = _entry_ref(ref, f"inputs[{k}]", nid, name)
            if not 0 <= src < nid:
                # Nodes are in topological order; a forward or self reference is a corrupt graph.
                raise _fail(
                    f"inputs[{k}] refers to node {src}, which is not an earlier node (0..{nid - 1})",
                    nid,
                    name,
                )
            n_out = row_ptr[src + 1] - row_ptr[src]
            if not 0 <= idx < n_out:
                raise _fail(
                    f"inputs[{k}] refers to output {idx} of node {src}, which has {n_out} output(s)",
                    nid,
                    name,
                )
            inputs.append((src, idx, ver))
        attrs = rn.get("attrs", rn.get("param", {}))  # very old graphs call it "param"
        if attrs is None:
            attrs = {}
        if not isinstance(attrs, Mapping):
            raise _fail("field 'attrs' must be an object", nid, name)
        n_out = row_ptr[nid + 1] - row_ptr[nid]
        if op == "null":
            if inputs:
                raise _fail("a 'null' (input) node cannot have inputs", nid, name)
            if n_out != 1:
                raise _fail(f"a 'null' node has exactly 1 output, node_row_ptr gives {n_out}", nid, name)
            nodes.append(GraphNode("null", name, (), attrs=dict(attrs)))
            continue
        func_name = attrs.get("func_name")
        if not isinstance(func_name, str) or not func_name:
            raise _fail("attrs.func_name is missing or not a non-empty string", nid, name)
        num_inputs = _int_attr(attrs, "num_inputs", nid, name, None)
        num_outputs = _int_attr(attrs, "num_outputs", nid, name, None)
        flatten = _int_attr(attrs, "flatten_data", nid, name, 0)
        if num_inputs != len(inputs):
            raise _fail(
                f"attrs.num_inputs = {num_inputs} but 'inputs' lists {len(inputs)} entries", nid, name
            )
        if num_outputs != n_out:
            raise _fail(
                f"attrs.num_outputs = {num_outputs} but node_row_ptr gives {n_out} outputs", nid, name
            )
        if flatten not in (0, 1):
            raise _fail(f"attrs.flatten_data must be '0' or '1', got {attrs['flatten_data']!r}", nid, name)
        if func_name == "__nop" and (len(inputs) < 1 or num_outputs != 1):
            raise _fail("'__nop' needs at least 1 input and exactly 1 output", nid, name)
        if func_name == "__copy" and (len(inputs) != 1 or num_outputs != 1):
            raise _fail("'__copy' needs exactly 1 input and 1 output", nid, name)
        nodes.append(
            GraphNode(
                "tvm_op", name, tuple(inputs), func_name, num_inputs, num_outputs, bool(flatten), dict(attrs)
            )
        )

    arg_nodes = obj["arg_nodes"]
    if not isinstance(arg_nodes, list) or not all(_is_int(x) for x in arg_nodes):
        raise _fail("'arg_nodes' must be a list of node ids")
    for k, nid in enumerate(arg_nodes):
        if not 0 <= nid < num_nodes:
            raise _fail(f"arg_nodes[{k}] = {nid} is out of range (0..{num_nodes - 1})")
        if nodes[nid].op != "null":
            raise _fail(f"arg_nodes[{k}] refers to a 'tvm_op' node; arguments must be 'null'", nid, nodes[nid].name)
    if len(set(arg_nodes)) != len(arg_nodes):
        raise _fail("'arg_nodes' lists a node twice")
    names = [nodes[n].name for n in arg_nodes]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise _fail(f"input/param names must be unique, duplicated: {dup}")

    raw_heads = obj["heads"]
    if not isinstance(raw_heads, list):
        raise _fail("'heads' must be a list")
    heads = []
    for k, ref in enumerate(raw_heads):
        src, idx, ver = _entry_ref(ref, f"heads[{k}]", None, None)
        if not 0 <= src < num_nodes:
            raise _fail(f"heads[{k}] refers to node {src}, out of range (0..{num_nodes - 1})")
        n_out = row_ptr[src + 1] - row_ptr[src]
        if not 0 <= idx < n_out:
            raise _fail(f"heads[{k}] refers to output {idx} of node {src}, which has {n_out} output(s)")
        heads.append((src, idx, ver))

    gattrs = obj["attrs"]
    if not isinstance(gattrs, Mapping):
        raise _fail("'attrs' must be an object")
    num_entries = row_ptr[-1] if row_ptr else 0
    dltype = _typed_list(gattrs, "dltype", "list_str", True)
    shape = _typed_list(gattrs, "shape", "list_shape", True)
    storage_id = _typed_list(gattrs, "storage_id", "list_int", True)
    device_index = _typed_list(gattrs, "device_index", "list_int", False)
    for key, lst in (("dltype", dltype), ("shape", shape), ("storage_id", storage_id), ("device_index", device_index)):
        if lst is not None and len(lst) != num_entries:
            raise _fail(
                f"attrs.{key} has {len(lst)} items but the graph has node_row_ptr[-1] = {num_entries} entries"
            )
    assert dltype is not None and shape is not None and storage_id is not None
    for eid, dt in enumerate(dltype):
        if not isinstance(dt, str):
            raise _fail(f"attrs.dltype[{eid}] must be a string, got {dt!r}")
        _check_dtype(dt, eid)
    shapes: list[tuple[int, ...]] = []
    for eid, s in enumerate(shape):
        if not isinstance(s, (list, tuple)) or not all(_is_int(d) and d >= 0 for d in s):
            raise _fail(f"attrs.shape[{eid}] must be a list of non-negative integers, got {s!r}")
        shapes.append(tuple(int(d) for d in s))
    for eid, sid in enumerate(storage_id):
        if not _is_int(sid) or sid < 0:
            raise _fail(f"attrs.storage_id[{eid}] = {sid!r}: storage ids must be non-negative integers")
    if device_index is not None:
        for eid, d in enumerate(device_index):
            if not _is_int(d) or d <= 0:
                raise _fail(f"attrs.device_index[{eid}] = {d!r} is not a DLPack device type code (>= 1)")

    return Graph(
        nodes=tuple(nodes),
        arg_nodes=tuple(int(x) for x in arg_nodes),
        heads=tuple(heads),
        node_row_ptr=tuple(int(x) for x in row_ptr),
        dltype=tuple(dltype),
        shape=tuple(shapes),
        storage_id=tuple(int(x) for x in storage_id),
        device_index=None if device_index is None else tuple(int(x) for x in device_index),
        json_text=text,
    )
