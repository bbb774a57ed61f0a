"""Reader and validator of the graph JSON executed by the graph executor.

The layout is the well-known graph-executor one (see ``docs/graph_json_format.md``). This
module only parses and checks it; it allocates nothing and imports nothing but the standard
library and the dtype table, so it is safe to use from tools (``kiln inspect``) too.

Every problem raises :class:`~kiln.runtime.errors.FormatError` whose message names the field
and, where there is one, the node (index and name), so a hand-edited or corrupt graph can be
fixed without reading this code.

The graph JSON is a trust boundary: it comes from files users download. The reader therefore
never lets a malformed document escape as another exception (``RecursionError`` on deep
nesting, ``UnicodeDecodeError``, ``MemoryError`` on a shape that declares petabytes), bounds
every declared size *before* the executor allocates anything, and checks that the memory plan
is safe to execute (entries sharing a storage id are never live at the same time).
"""

from __future__ import annotations

import json
import math
import os
import reprlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .errors import FormatError, InputError

__all__ = [
    "GraphNode",
    "Graph",
    "load_graph_json",
    "RESERVED_FUNCS",
    "MAX_DEPTH",
    "MAX_NESTING",
    "MAX_NDIM",
    "DEFAULT_MAX_BYTES",
    "MAX_BYTES_ENV",
]

#: Function names the executor implements itself instead of looking them up in the library.
RESERVED_FUNCS = ("__nop", "__copy", "__concat", "__if", "__loop", "__host")

#: The control-flow functions and the node attributes holding their nested graphs.
SUBGRAPH_ATTRS: dict[str, tuple[str, ...]] = {"__if": ("then_branch", "else_branch"), "__loop": ("body",)}

#: Deepest nesting of JSON containers accepted. A valid graph needs 5 levels (attrs.shape ->
#: [tag, values] -> shape -> dims); the margin leaves room for tools' metadata.
MAX_DEPTH = 32

#: Deepest nesting of control-flow graphs (an ``__if`` in a branch of an ``__if``...). Each level
#: costs 4 container levels (nodes -> node -> attrs -> graph), so :data:`MAX_DEPTH` admits 6.
MAX_NESTING = 6

#: Most dimensions an entry may have (NumPy's own limit is 64; kernels never need more).
MAX_NDIM = 32

#: Default cap on the bytes one graph may ask the executor to allocate (all storages
#: together): 2**47 B = 128 TiB, the whole user address space of x86-64 and AArch64 with
#: 48-bit virtual addresses, so no real graph is refused and no absurd one is attempted.
DEFAULT_MAX_BYTES = 1 << 47

#: Environment variable that lowers (or raises) :data:`DEFAULT_MAX_BYTES`, in bytes.
MAX_BYTES_ENV = "KILN_GRAPH_MAX_BYTES"


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
    subgraphs : dict of str to Graph
        The validated nested graphs of an ``__if`` (``then_branch``, ``else_branch``) or
        ``__loop`` (``body``) node; empty for every other node.
    """

    op: str
    name: str
    inputs: tuple[tuple[int, int, int], ...]
    func_name: str = ""
    num_inputs: int = 0
    num_outputs: int = 1
    flatten_data: bool = False
    attrs: Mapping[str, Any] = field(default_factory=dict)
    subgraphs: Mapping[str, "Graph"] = field(default_factory=dict)

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
    alias_root : tuple of int
        ``alias_root[eid]`` is the entry whose memory ``eid`` uses: itself, or for a
        ``__nop`` output (transitively) its input. Only roots own storage.
    storage_offset : tuple of int or None
        Byte offset of every entry inside its storage (``attrs.storage_offset``), or None
        when all are 0. Non-zero only for the inputs of a ``__concat`` (a concatenation
        written in place: its inputs live back to back inside its output) and their aliases.
    sym_shape : tuple of tuple of (int or str), or None
        For a graph with dynamic dimensions (``attrs.sym_shape``): every entry's dims, a
        symbolic dim as a :mod:`kiln.runtime.sym` expression; ``shape`` then holds the upper
        bounds the storage is planned for. None for a static graph.
    dim_ranges : dict of str to (int, int)
        ``lo..hi`` of every symbol (``attrs.dim_ranges``); empty for a static graph.
    data_dims : frozenset of str
        The symbols a kernel decides at run time (``"data"`` in their ``dim_ranges`` row).
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
    alias_root: tuple[int, ...]
    sym_shape: tuple[tuple[int | str, ...], ...] | None = None
    dim_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    data_dims: frozenset[str] = frozenset()
    storage_offset: tuple[int, ...] | None = None

    def entry_offset(self, eid: int) -> int:
        """Byte offset of entry ``eid`` inside its storage (0 unless placed by a ``__concat``)."""
        return 0 if self.storage_offset is None else self.storage_offset[eid]

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

    def entry_bytes(self, eid: int) -> int:
        """Size in bytes of entry ``eid`` (its shape times its dtype's item size)."""
        return _nbytes(self.shape[eid], self.dltype[eid])


# ---------------------------------------------------------------------------------------------
# parsing helpers


# Values quoted in messages come from an untrusted file: show a bounded prefix, never a
# megabyte-long name or a list nested a thousand levels deep.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 6, 60, 60
_show = _REPR.repr


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    from . import dtype as _dtype

    return math.prod(shape) * _dtype.itemsize(dtype)


def _where(nid: int | None, name: str | None) -> str:
    if nid is None:
        return "graph JSON"
    return f"graph JSON node {nid}" + (f" ({_show(name)})" if name else "")


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
    raise _fail(f"attrs.{key} must be an integer written as a string, got {_show(v)}", nid, name)


def _entry_ref(ref: Any, what: str, nid: int | None, name: str | None) -> tuple[int, int, int]:
    if (
        not isinstance(ref, (list, tuple))
        or len(ref) not in (2, 3)
        or not all(_is_int(x) for x in ref)
    ):
        raise _fail(f"{what} must be [node_id, output_index, version], got {_show(ref)}", nid, name)
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
        raise _fail(f"attrs.{key} must be [{tag!r}, [...]], got {_show(v)}")
    return list(v[1])


def _check_dtype(name: str, eid: int) -> None:
    from . import dtype as _dtype

    try:
        _dtype.to_dl(name)
    except Exception as e:  # noqa: BLE001 - the dtype module raises its own error type; normalize it here
        raise _fail(f"attrs.dltype[{eid}] = {_show(name)} is not a known data type ({e})") from None


def _max_bytes_default() -> int:
    raw = os.environ.get(MAX_BYTES_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise InputError(f"{MAX_BYTES_ENV}={raw!r}: expected a positive number of bytes")
    return value


def _check_depth(obj: Any) -> None:
    """Reject containers nested deeper than :data:`MAX_DEPTH` (iteratively: no recursion).

    A dict handed in by a caller may even be cyclic; the depth bound stops that walk too.
    """
    stack: list[tuple[Any, int, str]] = [(obj, 1, "top level")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            raise _fail(f"{where}: containers are nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, Mapping):
            children: Any = value.items()
        elif isinstance(value, (list, tuple)):
            children = enumerate(value)
        else:
            continue
        for key, child in children:
            if isinstance(child, (Mapping, list, tuple)):
                # Name the top-level key the nesting is under: enough to find it in the file.
                stack.append((child, depth + 1, f"{_show(key)}" if depth == 1 else where))


def _decode(graph: Any) -> tuple[Mapping[str, Any], str]:
    """The JSON object and its text, from text, UTF-8 bytes or an already-decoded dict."""
    if isinstance(graph, (bytes, bytearray, memoryview)):
        try:
            graph = bytes(graph).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"graph JSON: not UTF-8 text (byte {e.start}: {e.reason})") from None
    if isinstance(graph, str):
        text = graph
        try:
            obj = json.loads(graph)
        except RecursionError:
            raise _fail(f"containers are nested more than {MAX_DEPTH} levels deep") from None
        except ValueError as e:  # JSONDecodeError, and integers too long to convert
            raise FormatError(f"graph JSON: not valid JSON ({_show(str(e))})") from None
        _check_depth(obj)
    elif isinstance(graph, Mapping):
        obj = graph
        _check_depth(obj)
        try:
            text = json.dumps(graph)
        except (TypeError, ValueError) as e:
            raise FormatError(f"graph JSON: the dict is not JSON-serializable ({e})") from None
    else:
        raise FormatError(f"graph JSON: expected a str, bytes or dict, got {type(graph).__name__}")
    if not isinstance(obj, Mapping):
        raise FormatError(f"graph JSON: top level must be an object, got {type(obj).__name__}")
    return obj, text


def _parse_row_ptr(obj: Mapping[str, Any], num_nodes: int) -> list[int]:
    row_ptr = obj["node_row_ptr"]
    if not isinstance(row_ptr, list) or not all(_is_int(x) for x in row_ptr):
        raise _fail("'node_row_ptr' must be a list of integers")
    if len(row_ptr) != num_nodes + 1:
        raise _fail(
            f"'node_row_ptr' has {len(row_ptr)} items, expected len(nodes) + 1 = {num_nodes + 1}"
        )
    if row_ptr and row_ptr[0] != 0:
        raise _fail(f"'node_row_ptr' must start at 0, got {_show(row_ptr[0])}")
    for i in range(num_nodes):
        if row_ptr[i + 1] < row_ptr[i]:
            raise _fail(f"'node_row_ptr' must be non-decreasing (item {i + 1})")
    return row_ptr


def _parse_node(nid: int, rn: Any, row_ptr: Sequence[int]) -> GraphNode:
    if not isinstance(rn, Mapping):
        raise _fail("must be an object", nid)
    name = rn.get("name")
    if not isinstance(name, str):
        raise _fail("field 'name' is missing or not a string", nid)
    op = rn.get("op")
    if op not in ("null", "tvm_op"):
        raise _fail(f"field 'op' must be 'null' or 'tvm_op', got {_show(op)}", nid, name)
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
        return GraphNode("null", name, (), attrs=dict(attrs))
    func_name = attrs.get("func_name")
    if not isinstance(func_name, str) or not func_name:
        raise _fail("attrs.func_name is missing or not a non-empty string", nid, name)
    num_inputs = _int_attr(attrs, "num_inputs", nid, name, None)
    num_outputs = _int_attr(attrs, "num_outputs", nid, name, None)
    flatten = _int_attr(attrs, "flatten_data", nid, name, 0)
    if num_inputs != len(inputs):
        raise _fail(f"attrs.num_inputs = {num_inputs} but 'inputs' lists {len(inputs)} entries", nid, name)
    if num_outputs != n_out:
        raise _fail(f"attrs.num_outputs = {num_outputs} but node_row_ptr gives {n_out} outputs", nid, name)
    if flatten not in (0, 1):
        raise _fail(f"attrs.flatten_data must be '0' or '1', got {_show(attrs['flatten_data'])}", nid, name)
    if func_name == "__nop" and (len(inputs) < 1 or num_outputs != 1):
        raise _fail("'__nop' needs at least 1 input and exactly 1 output", nid, name)
    if func_name == "__concat" and (len(inputs) < 1 or num_outputs != 1):
        raise _fail("'__concat' needs at least 1 input and exactly 1 output", nid, name)
    if func_name == "__copy" and (len(inputs) != 1 or num_outputs != 1):
        raise _fail("'__copy' needs exactly 1 input and 1 output", nid, name)
    if func_name == "__if" and (len(inputs) < 1 or num_outputs < 1):
        raise _fail("'__if' needs at least 1 input (the condition) and 1 output", nid, name)
    if func_name == "__loop" and (len(inputs) < 2 or num_outputs < 1):
        raise _fail("'__loop' needs at least 2 inputs (trip count, condition) and 1 output", nid, name)
    return GraphNode("tvm_op", name, tuple(inputs), func_name, num_inputs, num_outputs, bool(flatten), dict(attrs))


def _parse_shapes(shape: list, dltype: Sequence[str], max_bytes: int) -> list[tuple[int, ...]]:
    """Shapes as int tuples; every entry's byte size is bounded before anything allocates it."""
    shapes: list[tuple[int, ...]] = []
    for eid, s in enumerate(shape):
        if not isinstance(s, (list, tuple)) or not all(_is_int(d) and d >= 0 for d in s):
            raise _fail(f"attrs.shape[{eid}] must be a list of non-negative integers, got {_show(s)}")
        if len(s) > MAX_NDIM:
            raise _fail(f"attrs.shape[{eid}] has {len(s)} dimensions, more than the {MAX_NDIM} supported")
        dims = tuple(int(d) for d in s)
        # Zero dimensions do not excuse the others: (0, 10**30) still cannot be a 64-bit shape.
        nbytes = _nbytes(tuple(max(d, 1) for d in dims), dltype[eid])
        if nbytes > max_bytes:
            raise _fail(
                f"attrs.shape[{eid}] = {_show(list(dims))} ({dltype[eid]}) declares {nbytes} bytes, more "
                f"than the limit of {max_bytes} bytes (set {MAX_BYTES_ENV} to change it)"
            )
        shapes.append(dims)
    return shapes


def _parse_dynamic(gattrs: Mapping[str, Any], shapes: Sequence[tuple[int, ...]]
                   ) -> tuple[tuple[tuple[int | str, ...], ...] | None, dict[str, tuple[int, int]], frozenset[str]]:
    """``attrs.sym_shape`` and ``attrs.dim_ranges`` of a graph with dynamic dimensions.

    Every symbolic dim must parse, use only declared symbols, and fit the entry's planned
    (upper-bound) extent at the top of the ranges: the storage was sized for that.
    """
    from . import sym

    raw_sym = _typed_list(gattrs, "sym_shape", "list_sym_shape", False)
    raw_ranges = _typed_list(gattrs, "dim_ranges", "list_dim_range", False)
    if raw_sym is None:
        if raw_ranges:
            raise _fail("attrs.dim_ranges is given without attrs.sym_shape")
        return None, {}, frozenset()
    ranges: dict[str, tuple[int, int]] = {}
    data: set[str] = set()
    for k, r in enumerate(raw_ranges or []):
        if not (isinstance(r, list) and len(r) in (3, 4) and isinstance(r[0], str) and _is_int(r[1])
                and _is_int(r[2]) and (len(r) == 3 or r[3] == "data")):
            raise _fail(f"attrs.dim_ranges[{k}] must be [name, lo, hi] or [name, lo, hi, \"data\"], got {_show(r)}")
        try:
            name = sym.check_name(r[0])
            ranges[name] = sym.check_range(name, (r[1], r[2]), allow_zero=len(r) == 4)
        except InputError as err:
            raise _fail(f"attrs.dim_ranges[{k}]: {err}") from None
        if len(r) == 4:
            data.add(name)
    if len(raw_sym) != len(shapes):
        raise _fail(f"attrs.sym_shape has {len(raw_sym)} items but the graph has {len(shapes)} entries")
    out: list[tuple[int | str, ...]] = []
    for eid, (dims, planned) in enumerate(zip(raw_sym, shapes)):
        if not isinstance(dims, list) or len(dims) != len(planned):
            raise _fail(f"attrs.sym_shape[{eid}] must be a list of {len(planned)} dims, got {_show(dims)}")
        row: list[int | str] = []
        for k, (d, hi) in enumerate(zip(dims, planned)):
            if _is_int(d):
                if d != hi:
                    raise _fail(f"attrs.sym_shape[{eid}][{k}] = {d} differs from attrs.shape[{eid}][{k}] = {hi}")
                row.append(int(d))
                continue
            try:
                if not isinstance(d, str):
                    raise InputError(f"expected an int or an expression string, got {_show(d)}")
                canon = sym.canonical(d)
                missing = sym.symbols(canon) - ranges.keys()
                if missing:
                    raise InputError(f"dimension(s) {sorted(missing)} have no attrs.dim_ranges entry")
                top = sym.bounds(canon, ranges)[1]
            except InputError as err:
                raise _fail(f"attrs.sym_shape[{eid}][{k}] = {_show(d)}: {err}") from None
            if top > hi:
                raise _fail(f"attrs.sym_shape[{eid}][{k}] = {d!r} reaches {top}, more than the {hi} planned "
                            f"(attrs.shape[{eid}][{k}])")
            row.append(canon)
        out.append(tuple(row))
    return tuple(out), ranges, frozenset(data)


def _alias_roots(nodes: Sequence[GraphNode], row_ptr: Sequence[int], shapes: Sequence[tuple[int, ...]],
                 dltype: Sequence[str], device_index: Sequence[int] | None) -> list[int]:
    """``root[eid]``: the entry whose memory ``eid`` uses (``__nop`` outputs alias their input)."""
    root = list(range(row_ptr[-1]))
    for nid, node in enumerate(nodes):
        if node.func_name != "__nop":
            continue
        src, idx, _ = node.inputs[0]
        in_eid, out_eid = row_ptr[src] + idx, row_ptr[nid]
        if _nbytes(shapes[out_eid], dltype[out_eid]) > _nbytes(shapes[in_eid], dltype[in_eid]):
            raise _fail(
                f"'__nop' output is larger than its input (entry {out_eid} {shapes[out_eid]} "
                f"{dltype[out_eid]} vs entry {in_eid} {shapes[in_eid]} {dltype[in_eid]})",
                nid,
                node.name,
            )
        if device_index is not None and device_index[out_eid] != device_index[in_eid]:
            raise _fail("'__nop' output is on a different device than its input (attrs.device_index)", nid, node.name)
        root[out_eid] = root[in_eid]
    return root


def _parse_control(nodes: list[GraphNode], row_ptr: Sequence[int], shapes: Sequence[tuple[int, ...]],
                   dltype: Sequence[str], max_bytes: int, nesting: int,
                   sym_shape: Sequence[tuple[int | str, ...]] | None = None,
                   data_dims: frozenset[str] = frozenset(),
                   dim_ranges: Mapping[str, tuple[int, int]] | None = None) -> None:
    """Parse and check the nested graphs of ``__if`` / ``__loop`` nodes (in place in ``nodes``).

    Every nested graph is a complete graph JSON, validated recursively (at most
    :data:`MAX_NESTING` levels); its argument nodes are bound to entries of this node by
    position (its declared inputs, then its params through ``<attr>_params``) and its heads
    to the node's outputs, so each pair must agree in shape (planned and symbolic) and dtype.
    Nested graphs are on the CPU. A nested graph with ``sym_shape`` takes its symbols from this
    graph at run time: each of them (but the data-dependent ones it decides itself) must be a
    symbol of this graph with the same range, so both plan the same upper-bound storage and a
    padded entry can be bound zero copy. A loop's scan outputs (``num_scan``) stack one body
    head per iteration: a scan output is ``[bound, *head dims]`` with the data-dependent
    iteration count (one symbol shared by all of them) as its leading dim.
    """
    for nid, node in enumerate(nodes):
        keys = SUBGRAPH_ATTRS.get(node.func_name)
        if keys is None:
            continue
        if nesting >= MAX_NESTING:
            raise _fail(f"control flow is nested more than {MAX_NESTING} levels deep", nid, node.name)
        ins = [row_ptr[s] + i for s, i, _ in node.inputs]
        outs = list(range(row_ptr[nid], row_ptr[nid + 1]))

        def sig(e: int) -> tuple[tuple[int, ...], str]:
            return shapes[e], dltype[e]

        def dims(e: int) -> tuple[int | str, ...]:
            return sym_shape[e] if sym_shape is not None else shapes[e]

        scalars = [(ins[0], "bool", "the condition")]
        n_carried = n_scan = 0
        if node.func_name == "__loop":
            n_carried = _int_attr(node.attrs, "num_carried", nid, node.name, None)
            n_scan = _int_attr(node.attrs, "num_scan", nid, node.name, 0)
            if n_scan < 0 or not 0 <= n_carried <= len(ins) - 2 or n_carried + n_scan != len(outs) or not outs:
                raise _fail(f"attrs.num_carried = {n_carried} and attrs.num_scan = {n_scan} must add up to the "
                            f"number of outputs ({len(outs)}), and num_carried be at most the {len(ins) - 2} "
                            "inputs after the trip count and condition", nid, node.name)
            if n_scan:
                _check_scan_outputs(outs[n_carried:], shapes, sym_shape, data_dims, nid, node.name)
            scalars = [(ins[0], "int64", "the trip count"), (ins[1], "bool", "the condition")]
        for e, dt, what in scalars:
            if dltype[e] != dt or math.prod(shapes[e]) != 1:
                raise _fail(f"{what} (entry {e}: {list(shapes[e])} {dltype[e]}) must be a one-element {dt} "
                            "tensor", nid, node.name)
        subs: dict[str, Graph] = {}
        for key in keys:
            raw = node.attrs.get(key)
            if not isinstance(raw, Mapping):
                raise _fail(f"attrs.{key} must be a graph JSON object", nid, node.name)
            try:
                sub = _load(raw, max_bytes, nesting + 1)
            except FormatError as err:
                raise _fail(f"attrs.{key}: {err}", nid, node.name) from None
            if sub.device_index is not None and set(sub.device_index) != {1}:
                raise _fail(f"attrs.{key}: a nested graph must be on the CPU", nid, node.name)
            _check_nested_dims(sub, dim_ranges or {}, f"attrs.{key}", nid, node.name)

            def sub_dims(a: int, sub: Graph = sub) -> tuple[int | str, ...]:
                return sub.sym_shape[a] if sub.sym_shape is not None else sub.shape[a]

            params = node.attrs.get(f"{key}_params", [])
            if not isinstance(params, list) or not all(_is_int(k) and 1 <= k < len(ins) for k in params):
                raise _fail(f"attrs.{key}_params must be a list of input positions 1..{len(ins) - 1}, "
                            f"got {_show(params)}", nid, node.name)
            args = [sub.entry_id(n) for n in sub.arg_nodes]
            n_decl = len(args) - len(params)
            # what each declared argument of the nested graph is bound to: a node entry, or (for a
            # loop's iteration number and condition) a scalar the executor provides
            if node.func_name == "__if":
                want: list[Any] = ins[1: 1 + n_decl] if n_decl <= len(ins) - 1 else None  # type: ignore[assignment]
            else:
                want = [((1,), "int64"), ((1,), "bool")] + ins[2: n_decl] if n_decl <= len(ins) else None  # type: ignore[assignment]
            if want is None or len(want) != n_decl or n_decl < 0:
                raise _fail(f"attrs.{key} has {len(args)} arguments, which does not fit the node's {len(ins)} "
                            f"inputs and {len(params)} params", nid, node.name)
            bound = list(want) + [ins[k] for k in params]
            for k, (a, b) in enumerate(zip(args, bound)):
                if isinstance(b, tuple):  # an executor-provided scalar: any one-element shape
                    if sub.dltype[a] != b[1] or math.prod(sub.shape[a]) != 1 or sub_dims(a) != sub.shape[a]:
                        raise _fail(f"attrs.{key} argument {k} must be a one-element {b[1]} tensor", nid, node.name)
                elif (sub.shape[a], sub.dltype[a]) != sig(b) or sub_dims(a) != dims(b):
                    raise _fail(f"attrs.{key} argument {k} ({list(sub_dims(a))} planned {list(sub.shape[a])} "
                                f"{sub.dltype[a]}) does not match the node's entry {b} ({list(dims(b))} planned "
                                f"{list(shapes[b])} {dltype[b]})", nid, node.name)
            heads = [sub.entry_id(n, i) for n, i, _ in sub.heads]
            want_heads: list[Any] = list(outs) if node.func_name == "__if" else [((1,), "bool")] + outs
            # a scan head is one row of its output: the output's shape without the leading dim
            if n_scan:
                want_heads[1 + n_carried:] = [(shapes[e][1:], dltype[e], dims(e)[1:]) for e in outs[n_carried:]]
            if len(heads) != len(want_heads):
                raise _fail(f"attrs.{key} has {len(heads)} outputs, expected {len(want_heads)}", nid, node.name)
            for k, (a, b) in enumerate(zip(heads, want_heads)):
                if isinstance(b, tuple) and len(b) == 3:
                    ok = (sub.shape[a], sub.dltype[a], sub_dims(a)) == b
                else:
                    ok = (sub.dltype[a] == b[1] and math.prod(sub.shape[a]) == 1 and sub_dims(a) == sub.shape[a]) \
                        if isinstance(b, tuple) else (sub.shape[a], sub.dltype[a]) == sig(b) and sub_dims(a) == dims(b)
                if not ok:
                    raise _fail(f"attrs.{key} output {k} ({list(sub_dims(a))} planned {list(sub.shape[a])} "
                                f"{sub.dltype[a]}) does not match what the node expects", nid, node.name)
            if node.func_name == "__loop":
                for k in range(n_carried):  # carried: initial value, body input and output agree
                    if sig(ins[2 + k]) != sig(outs[k]) or dims(ins[2 + k]) != dims(outs[k]):
                        raise _fail(f"carried value {k}: initial entry {ins[2 + k]} and output entry {outs[k]} "
                                    "differ in shape or dtype", nid, node.name)
            subs[key] = sub
        nodes[nid] = GraphNode(node.op, node.name, node.inputs, node.func_name, node.num_inputs,
                               node.num_outputs, node.flatten_data, node.attrs, subs)


def _check_scan_outputs(outs: Sequence[int], shapes: Sequence[tuple[int, ...]],
                        sym_shape: Sequence[tuple[int | str, ...]] | None, data_dims: frozenset[str],
                        nid: int, name: str) -> None:
    """A loop's scan outputs: leading dim the one data-dependent iteration count, bounded by
    the planned extent; the other dims static or of input-bound (not data-dependent) symbols."""
    from . import sym

    if sym_shape is None:
        raise _fail("a '__loop' with scan outputs (attrs.num_scan) needs attrs.sym_shape: the leading dim of "
                    "a scan output is the data-dependent iteration count", nid, name)
    counts = set()
    for e in outs:
        dims = sym_shape[e]
        if not dims or not isinstance(dims[0], str) or dims[0] not in data_dims \
                or sym.dims_symbols(dims[1:]) & data_dims:
            raise _fail(f"scan output entry {e} has dims {_show(list(dims))}; expected a data-dependent symbol "
                        "(the iteration count) as its leading dim and static or input-bound dims after it", nid, name)
        counts.add(dims[0])
    if len(counts) != 1:
        raise _fail(f"the scan outputs' leading dims {sorted(counts)} differ; they all count the same "
                    "iterations", nid, name)
    if len({shapes[e][0] for e in outs}) != 1:
        raise _fail("the scan outputs are planned for different iteration counts (attrs.shape)", nid, name)


def _check_nested_dims(sub: Graph, ranges: Mapping[str, tuple[int, int]], where: str, nid: int,
                       name: str) -> None:
    """A nested graph's symbols: those it does not decide itself come from the enclosing graph,
    which must declare each with the same range (both plan the same upper-bound storage)."""
    for n, rng in sub.dim_ranges.items():
        if n in sub.data_dims:
            if n in ranges:
                raise _fail(f"{where}: its data-dependent dimension {n!r} is also a dimension of the enclosing "
                            "graph", nid, name)
        elif n not in ranges:
            raise _fail(f"{where}: its dimension {n!r} is not a dimension of the enclosing graph, which gives "
                        "a nested graph its symbols' values", nid, name)
        elif tuple(ranges[n]) != tuple(rng):
            raise _fail(f"{where}: its dimension {n!r} has range {rng[0]}..{rng[1]}, the enclosing graph's "
                        f"{ranges[n][0]}..{ranges[n][1]}", nid, name)


def _check_copies(nodes: Sequence[GraphNode], row_ptr: Sequence[int], shapes: Sequence[tuple[int, ...]],
                  dltype: Sequence[str]) -> None:
    """A ``__copy`` moves one tensor between devices: same shape and dtype on both sides."""
    for nid, node in enumerate(nodes):
        if node.func_name != "__copy":
            continue
        src, idx, _ = node.inputs[0]
        a, b = row_ptr[src] + idx, row_ptr[nid]
        if shapes[a] != shapes[b] or dltype[a] != dltype[b]:
            raise _fail(
                f"'__copy' output (entry {b}: {list(shapes[b])} {dltype[b]}) must have its input's shape and "
                f"dtype (entry {a}: {list(shapes[a])} {dltype[a]})",
                nid,
                node.name,
            )


def _concat_units(nodes: Sequence[GraphNode], row_ptr: Sequence[int], heads: Sequence[tuple[int, int, int]],
                  shapes: Sequence[tuple[int, ...]], dltype: Sequence[str], storage_id: Sequence[int],
                  offsets: Sequence[int], root: Sequence[int]) -> list[int]:
    """Check every ``__concat`` and return ``unit[eid]``: the entry standing for the memory unit
    ``eid`` belongs to (its alias root, or one entry per in-place concatenation and its inputs).

    A ``__concat`` runs nothing: its inputs must already lie back to back, in order, inside its
    output's bytes (same storage id, offsets adding up), be written by kernels (or be another
    ``__concat``), share its dtype, and no graph output may be part of it (an output may be
    bound to a user's buffer, which the pieces would not be written into).
    """
    parent = list(range(row_ptr[-1]))

    def find(e: int) -> int:
        while parent[e] != e:
            parent[e] = parent[parent[e]]
            e = parent[e]
        return e

    placed: set[int] = set()
    for nid, node in enumerate(nodes):
        if node.func_name != "__concat":
            continue
        out = row_ptr[nid]
        pos = offsets[out]
        seen: set[int] = set()
        for j, (src, idx, _) in enumerate(node.inputs):
            e = row_ptr[src] + idx
            producer = nodes[src]
            if not producer.is_op or (producer.func_name in RESERVED_FUNCS and producer.func_name != "__concat"):
                what = "an input or param" if not producer.is_op else f"a {producer.func_name!r} node"
                raise _fail(f"'__concat' input {j} (entry {e}) is written by {what}; the inputs of a concatenation "
                            "written in place must be written by kernels", nid, node.name)
            if e in seen or root[e] != e:
                raise _fail(f"'__concat' input {j} (entry {e}) is listed twice or is an alias", nid, node.name)
            seen.add(e)
            if dltype[e] != dltype[out]:
                raise _fail(f"'__concat' input {j} (entry {e}) is {dltype[e]}, its output {dltype[out]}",
                            nid, node.name)
            if storage_id[e] != storage_id[out] or offsets[e] != pos:
                raise _fail(f"'__concat' input {j} (entry {e}) must lie at byte {pos} of storage {storage_id[out]} "
                            f"(right after the inputs before it), attrs place it at byte {offsets[e]} of storage "
                            f"{storage_id[e]}", nid, node.name)
            pos += _nbytes(shapes[e], dltype[e])
            parent[find(e)] = find(out)
        if pos - offsets[out] != _nbytes(shapes[out], dltype[out]):
            raise _fail(f"'__concat' inputs hold {pos - offsets[out]} bytes, its output "
                        f"{_nbytes(shapes[out], dltype[out])}", nid, node.name)
        placed.update(seen)
        placed.add(out)
    for e, r in enumerate(root):
        if r != e and offsets[e] != offsets[r]:
            raise _fail(f"attrs.storage_offset: entry {e} is an alias of entry {r} but has another byte offset "
                        f"({offsets[e]} vs {offsets[r]})")
    for src, idx, _ in heads:
        if root[row_ptr[src] + idx] in placed:
            raise _fail(f"graph output (node {src} output {idx}) is part of a concatenation written in place "
                        "('__concat'); outputs need memory of their own")
    return [find(r) for r in root]


def _check_storage(nodes: Sequence[GraphNode], row_ptr: Sequence[int], heads: Sequence[tuple[int, int, int]],
                   shapes: Sequence[tuple[int, ...]], dltype: Sequence[str], storage_id: Sequence[int],
                   device_index: Sequence[int] | None, root: Sequence[int], max_bytes: int,
                   offsets: Sequence[int]) -> None:
    """Check the memory plan: bounded in total, one device per storage, no live overlap.

    Lifetimes are measured in node positions (nodes run in list order). The storage of a
    unit (an alias group: a root and its ``__nop`` views; or an in-place concatenation with
    its inputs) is live from the node that writes the first member to the last node that
    reads any member; the reads of a ``__nop`` or ``__concat`` are not uses, as they do
    nothing at run time. Graph inputs and params are live for the whole run (from before the
    first node: ``-1``), because they are read again by later runs without a new
    ``set_input``; graph outputs are live from their producer to the end of the run. Two
    units may share a storage id only when one's last use comes strictly before the other
    is written, so a kernel never writes memory it (or anyone after it) still reads. Inside
    one unit, the entries kernels write must not overlap.
    """
    num_entries = row_ptr[-1]
    end_of_run = len(nodes)
    producer = [0] * num_entries
    for nid in range(len(nodes)):
        for e in range(row_ptr[nid], row_ptr[nid + 1]):
            producer[e] = nid
    first: dict[int, int] = {}
    for e in range(num_entries):
        w = -1 if not nodes[producer[e]].is_op else producer[e]
        first[root[e]] = min(first.get(root[e], w), w)
    last = {r: (end_of_run if s < 0 else s) for r, s in first.items()}
    pieces: dict[int, list[int]] = {}  # unit -> entries kernels write into it
    for e in range(num_entries):
        if root[e] != e and nodes[producer[e]].func_name not in ("__nop", "__concat"):
            pieces.setdefault(root[e], []).append(e)
    for r, es in pieces.items():
        es = sorted(es + ([r] if nodes[producer[r]].func_name != "__concat" else []), key=lambda x: offsets[x])
        for a, b in zip(es, es[1:]):
            if offsets[a] + _nbytes(shapes[a], dltype[a]) > offsets[b]:
                raise _fail(f"attrs.storage_offset: entries {a} and {b} overlap inside one concatenation's memory")
    for nid, node in enumerate(nodes):
        if node.func_name in ("__nop", "__concat"):
            continue
        for src, idx, _ in node.inputs:
            r = root[row_ptr[src] + idx]
            last[r] = max(last[r], nid)
    for src, idx, _ in heads:
        last[root[row_ptr[src] + idx]] = end_of_run

    by_sid: dict[int, list[int]] = {}
    sid_bytes: dict[int, int] = {}
    for e in range(num_entries):
        sid = storage_id[root[e]]
        sid_bytes[sid] = max(sid_bytes.get(sid, 0), offsets[e] + _nbytes(shapes[e], dltype[e]))
    for r in sorted(first):
        sid = storage_id[r]
        if device_index is not None and by_sid.get(sid) and device_index[by_sid[sid][0]] != device_index[r]:
            other = by_sid[sid][0]
            raise _fail(
                f"attrs.storage_id: entries {other} and {r} share storage_id {sid} but are on different "
                f"devices (device_index {device_index[other]} and {device_index[r]})"
            )
        by_sid.setdefault(sid, []).append(r)
    total = sum(sid_bytes.values())
    if total > max_bytes:
        raise _fail(
            f"the memory plan needs {total} bytes in {len(sid_bytes)} storages, more than the limit of "
            f"{max_bytes} bytes (set {MAX_BYTES_ENV} to change it)"
        )

    def describe(e: int) -> str:
        nid = producer[e]
        when = "the whole run" if first[e] < 0 else f"node {first[e]} to " + (
            "the end of the run" if last[e] >= end_of_run else f"node {last[e]}"
        )
        return f"entry {e} (node {nid} {_show(nodes[nid].name)} output {e - row_ptr[nid]}, live {when})"

    for sid, group in by_sid.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda e: (first[e], last[e]))
        longest = group[0]  # the earlier entry that stays live the longest so far
        for e in group[1:]:
            if first[e] <= last[longest]:
                raise _fail(
                    f"attrs.storage_id: {describe(longest)} and {describe(e)} share storage_id {sid} "
                    "while both are live; the second would overwrite the first"
                )
            if last[e] > last[longest]:
                longest = e


def load_graph_json(graph: str | bytes | Mapping[str, Any], max_bytes: int | None = None) -> Graph:
    """Parse and validate a graph JSON.

    Parameters
    ----------
    graph : str, bytes or dict
        The JSON text (bytes must be UTF-8), or an already-decoded JSON object.
    max_bytes : int, optional
        Most bytes the graph's storage may need, per entry and in total. Default: the
        environment variable ``KILN_GRAPH_MAX_BYTES``, else :data:`DEFAULT_MAX_BYTES`.

    Returns
    -------
    Graph
        The validated graph.

    Raises
    ------
    FormatError
        The text is not UTF-8 or not JSON, is nested deeper than :data:`MAX_DEPTH`, a
        required field is missing or malformed, sizes disagree, an input reference is out of
        range, a storage id is negative, a shape declares more than ``max_bytes``, or two
        entries sharing a storage id are live at the same time, or a nested control-flow
        graph is malformed or does not fit its node. The message names the field and the
        node or entries.
    """
    if max_bytes is None:
        max_bytes = _max_bytes_default()
    return _load(graph, max_bytes, 0)


def _load(graph: str | bytes | Mapping[str, Any], max_bytes: int, nesting: int) -> Graph:
    """:func:`load_graph_json` of a graph nested ``nesting`` control-flow levels deep."""
    obj, text = _decode(graph)

    for key in ("nodes", "arg_nodes", "heads", "node_row_ptr", "attrs"):
        if key not in obj:
            raise _fail(f"required key {key!r} is missing")
    raw_nodes = obj["nodes"]
    if not isinstance(raw_nodes, list):
        raise _fail("'nodes' must be a list")
    num_nodes = len(raw_nodes)

    # node_row_ptr first: every later check needs each node's output count.
    row_ptr = _parse_row_ptr(obj, num_nodes)
    nodes = [_parse_node(nid, rn, row_ptr) for nid, rn in enumerate(raw_nodes)]

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
        raise _fail(f"input/param names must be unique, duplicated: {_show(dup)}")

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
    offsets = _typed_list(gattrs, "storage_offset", "list_int", False)
    for key, lst in (("dltype", dltype), ("shape", shape), ("storage_id", storage_id), ("device_index", device_index),
                     ("storage_offset", offsets)):
        if lst is not None and len(lst) != num_entries:
            raise _fail(
                f"attrs.{key} has {len(lst)} items but the graph has node_row_ptr[-1] = {num_entries} entries"
            )
    assert dltype is not None and shape is not None and storage_id is not None
    for eid, dt in enumerate(dltype):
        if not isinstance(dt, str):
            raise _fail(f"attrs.dltype[{eid}] must be a string, got {_show(dt)}")
        _check_dtype(dt, eid)
    shapes = _parse_shapes(shape, dltype, max_bytes)
    for eid, sid in enumerate(storage_id):
        if not _is_int(sid) or sid < 0:
            raise _fail(f"attrs.storage_id[{eid}] = {_show(sid)}: storage ids must be non-negative integers")
    if offsets is not None:
        for eid, off in enumerate(offsets):
            if not _is_int(off) or off < 0:
                raise _fail(f"attrs.storage_offset[{eid}] = {_show(off)}: byte offsets must be non-negative integers")
    if device_index is not None:
        for eid, d in enumerate(device_index):
            if not _is_int(d) or d <= 0:
                raise _fail(f"attrs.device_index[{eid}] = {_show(d)} is not a DLPack device type code (>= 1)")
    sym_shape, dim_ranges, data_dims = _parse_dynamic(gattrs, shapes)
    _parse_control(nodes, row_ptr, shapes, dltype, max_bytes, nesting, sym_shape, data_dims, dim_ranges)
    _check_copies(nodes, row_ptr, shapes, dltype)
    root = _alias_roots(nodes, row_ptr, shapes, dltype, device_index)
    offs = [0] * num_entries if offsets is None else [int(x) for x in offsets]
    for nid, node in enumerate(nodes):
        if node.func_name == "__concat" and (sym_shape is not None or (
                device_index is not None and device_index[row_ptr[nid]] != 1)):
            raise _fail("a concatenation written in place ('__concat') needs static shapes on the CPU", nid, node.name)
    unit = _concat_units(nodes, row_ptr, heads, shapes, dltype, storage_id, offs, root)
    _check_storage(nodes, row_ptr, heads, shapes, dltype, storage_id, device_index, unit, max_bytes, offs)

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
        alias_root=tuple(root),
        sym_shape=sym_shape,
        dim_ranges=dim_ranges,
        data_dims=data_dims,
        storage_offset=None if offsets is None else tuple(offs),
    )
