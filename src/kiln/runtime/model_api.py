"""The C API of a library: the tables ``kiln_model.c`` that drive ``kiln_model_api.c``.

Every library :func:`~kiln.runtime.export_library` writes for an executor factory carries the C
API of ``kiln/kiln_model.h`` (``docs/c_api.md``): create an instance, set inputs, run, read
outputs, with no Python and no graph JSON reader in C. This module turns the factory's graph
(already validated by :mod:`.graph_json`) into C tables — entries, storage slots, the op
sequence with its kernel symbols, inputs, outputs, params — laid out as
``kiln/kiln_model_desc.h`` declares, plus the one per-model function ``KilnModelCreate``. The
implementation shared by every model is ``crt/kiln_model_api.c``; export compiles both into the
library (``.so``, ``.a`` and ``.tar`` alike).

The tables mirror what :class:`~kiln.runtime.graph_executor.GraphExecutor` builds at creation:
one buffer per storage slot sized for its largest root entry (entries at their byte offsets:
the inputs of a ``__concat`` live inside its output), ``__nop`` outputs viewing their
input's memory, ``__copy`` as a copy, ``flatten_data`` kernels given 1-D tensors. A graph the C
API cannot run (entries placed on a device, a kernel not compiled into the library) still gets a
``KilnModelCreate``, which fails with the reason instead of the library failing to link.

A graph with dynamic dimensions (``attrs.sym_shape``, ``docs/dynamic_shapes.md``) also gets what
:class:`~kiln.runtime.dynamic_shapes.DynamicShapes` computes at load: its symbols (name, range,
the input dim each is read from), every distinct symbolic dim as C ``int64_t`` arithmetic in one
generated function of the symbol values (floor division as :mod:`.sym` floors), and for each
dim of the shapes table the expression that gives it. ``crt/kiln_model_api.c`` binds the symbols
from the inputs' shapes and writes the actual shapes into the entries' DLTensors before a run.
A *data-dependent* symbol (NonZero's count, ``kiln.tir.set_extent``) is given by no input: its
row names the op whose kernel reports it (``input`` -1, ``dim`` the op's index), and the C side
ends the kernel run after that op, reads and checks the value and re-shapes what follows, as
:class:`~kiln.runtime.graph_executor.GraphExecutor` does; ``dim_expr_after`` says per expression
after which op its value is known in a run (before, it is neither checked nor written). Such
tables are version 3 (:data:`DATA_DEPENDENT_TABLES_VERSION`); every other model's stay version
2, byte for byte as before, so a reader that knows only version 2 refuses exactly the tables it would run wrongly.

Runtime control flow (``__if`` / ``__loop`` nodes, run in Python by :mod:`.control_flow`): each
nested graph gets a whole table set of its own, made by the same code (prefix
``<parent prefix>c<node id><t|e|b>_``, so an If in a Loop body nests), and the node is an op of
kind ``KILN_OP_IF`` / ``KILN_OP_LOOP`` with a ``KilnControlDesc`` row naming them, with the
pairs of nested and enclosing entries its arguments are bound to zero copy. A nested graph's
symbols are the enclosing graph's (symbol rows with input -2 naming the enclosing symbol); a
loop's scan-output count is a data-dependent symbol whose row names the loop's op. Such tables
are version 4 (:data:`CONTROL_FLOW_TABLES_VERSION`).

Runtime layer: standard library only.
"""

from __future__ import annotations

import bisect
import os
import re
from typing import TYPE_CHECKING, Collection, Sequence

from . import cpu_features as _cpu
from . import dtype as _dtype
from . import sym as _sym
from .dynamic_shapes import data_dim_sources
from .errors import InputError
from .graph_json import Graph

if TYPE_CHECKING:  # pragma: no cover
    from .graph_json import GraphNode
    from .module import Module

__all__ = ["MODEL_FILE", "API_FILE", "API_VERSION", "DATA_DEPENDENT_TABLES_VERSION", "CONTROL_FLOW_TABLES_VERSION",
           "API_FUNCTIONS", "model_api_source", "write_model_api", "api_source_path"]

#: The generated tables (one per library).
MODEL_FILE = "kiln_model.c"
#: The fixed implementation, copied from the package.
API_FILE = "kiln_model_api.c"
#: ``KILN_MODEL_API_VERSION`` of ``kiln/kiln_model.h`` that these tables are written for
#: (2: dynamic dimensions; the tables gained the symbol fields of ``KilnModelDesc``).
API_VERSION = 2
#: ``KilnModelDesc.api_version`` of tables with data-dependent symbols (``kiln_model_desc.h``);
#: the layout is version 2's plus ``dim_expr_after`` at the end (left out of version-2 tables);
#: a symbol row with ``input`` -1 is what an older reader cannot run.
DATA_DEPENDENT_TABLES_VERSION = 3
#: ``KilnModelDesc.api_version`` of tables with runtime control flow (``__if`` / ``__loop`` ops):
#: version 3's layout (``dim_expr_after`` NULL without data-dependent symbols) plus ``num_controls``
#: and ``controls``, each nested graph a ``KilnModelDesc`` of its own. Every other model's tables
#: keep version 2 or 3, byte for byte; an older reader refuses these.
CONTROL_FLOW_TABLES_VERSION = 4
#: The functions ``kiln/kiln_model.h`` declares (every model library exports them; they are C
#: services, not packed kernels).
API_FUNCTIONS: frozenset[str] = frozenset({
    "KilnModelCreate", "KilnModelFree", "KilnModelNumInputs", "KilnModelNumOutputs", "KilnModelInputIndex",
    "KilnModelGetInputInfo", "KilnModelGetOutputInfo", "KilnModelSetInput", "KilnModelSetInputByName",
    "KilnModelSetInputTensor", "KilnModelRun", "KilnModelGetOutput", "KilnModelOutputData", "KilnModelAPIVersion",
    "KilnModelSetInputShaped", "KilnModelGetOutputShape", "KilnModelGetInputDims", "KilnModelGetOutputDims",
    "KilnModelNumSymbols", "KilnModelGetSymbolInfo",
})
#: Dynamic inputs and outputs are copied into / out of their padded storage with a fixed-size
#: stride array in C; no model comes near this.
_MAX_DYNAMIC_NDIM = 32

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: LLVM feature name -> the word /proc/cpuinfo uses for it (the C side matches cpuinfo words).
_CPUINFO_SPELLING = {llvm: flag for flag, llvm in _cpu.CPUINFO_RENAME.items()}
#: Every x86-64 CPU has these; /proc/cpuinfo lists them as "sse sse2" anyway, but never mind.
_ALWAYS_X86 = frozenset({"sse", "sse2"})
_LINKED_LOOKUP = "_lookup_linked_param"
#: Control-flow node -> its nested graphs (node attributes), in the order of KilnControlDesc.nested.
_CONTROL_KINDS = {"__if": ("then_branch", "else_branch"), "__loop": ("body",)}


def api_source_path() -> str:
    """Path of ``kiln_model_api.c`` in the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "crt", API_FILE)


def _c_str(s: str) -> str:
    # A C string literal: quotes and backslashes escaped, non-ASCII (and control characters) as
    # their UTF-8 bytes in octal, which is valid C whatever follows.
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


def _unsupported_reason(g: Graph, defined: set[str] | None, params: Collection[str] = (),
                        nested: bool = False) -> str | None:
    """Why the C API cannot run ``g`` (None: it can). ``params`` names the argument nodes that
    are weights; the others are the inputs whose shapes give a dynamic graph's symbols. A
    ``nested`` graph (a branch or body) takes its symbols from the enclosing graph instead."""
    if g.device_index is not None:
        codes = sorted({c for c in g.device_index if c != 1})
        if codes:
            return (f"the graph places entries on device type(s) {codes}; the C API runs graphs whose every entry "
                    f"is on the CPU (device type 1)")
    strings = [e for e, dt in enumerate(g.dltype) if dt == _dtype.STRING]
    if strings:
        return (f"graph entry {strings[0]} is a string tensor; the C API has no string type (string tensors and "
                "the host ops on them run in the Python runtime only, docs/strings.md)")
    if '"kiln_values"' in g.json_text:
        return ("the graph has sequence / optional inputs or outputs (kiln_values, docs/sequences.md); the C API "
                "has tensors only (use the Python runtime, whose GraphModule takes and returns lists)")
    for node in g.nodes:
        if node.is_op and node.func_name in _CONTROL_KINDS:
            why = _control_reason(node, defined)
            if why is not None:
                return why
            continue
        if not node.is_op or node.func_name in ("__nop", "__copy", "__concat"):
            continue
        if not _C_IDENT.match(node.func_name):
            return f"graph node {node.name!r} calls {node.func_name!r}, which is not a C identifier"
        if defined is not None and node.func_name not in defined:
            return (f"graph node {node.name!r} calls {node.func_name!r}, which no module compiled into this "
                    f"library defines")
    for e, dt in enumerate(g.dltype):
        try:
            _dtype.to_dl(dt)
        except Exception:  # noqa: BLE001 - any unsupported spelling makes the model unsupported, not the export
            return f"graph entry {e} has dtype {dt!r}, which the C API has no DLPack code for"
    return _dynamic_reason(g, params, nested) if g.sym_shape is not None else None


def _control_reason(node: "GraphNode", defined: set[str] | None) -> str | None:
    """Why the C API cannot run control-flow node ``node`` (None: it can): a nested graph it
    cannot run, or one deciding data-dependent dims of its own (which Kiln's importer never
    writes). A nested graph's other symbols are the enclosing graph's (the reader checked them)."""
    keys = _CONTROL_KINDS[node.func_name]
    if set(node.subgraphs) != set(keys):
        return (f"graph node {node.name!r} is runtime control flow ({node.func_name}) without its nested graph(s) "
                f"{', '.join(keys)} (the graph JSON reader requires them)")
    for key in keys:
        sub = node.subgraphs[key]
        if sub.data_dims:
            return (f"graph node {node.name!r} is runtime control flow ({node.func_name}) whose nested graph "
                    f"{key!r} decides data-dependent dimension(s) {sorted(sub.data_dims)} of its own; the C API "
                    "runs nested graphs whose symbols are the enclosing graph's (Kiln's importer writes no other)")
        why = _unsupported_reason(sub, defined, (), nested=True)
        if why is not None:
            return f"graph node {node.name!r} ({node.func_name}), nested graph {key!r}: {why}"
    return None


def _dynamic_reason(g: Graph, params: Collection[str], nested: bool = False) -> str | None:
    # What DynamicShapes refuses at load, refused at export: a symbol no input dim gives, a
    # data-dependent one no kernel output carries. Plus what the C side needs: weights of fixed
    # shape, inputs and outputs of a bounded rank, a data-dependent dim reported by a kernel.
    assert g.sym_shape is not None
    inputs = [(g.nodes[n].name, g.entry_id(n)) for n in g.arg_nodes if g.nodes[n].name not in params]
    for nid in g.arg_nodes:
        name, e = g.nodes[nid].name, g.entry_id(nid)
        if name in params and any(isinstance(d, str) for d in g.sym_shape[e]):
            return f"weight {name!r} has dynamic dimensions {_dims_text(g.sym_shape[e])}; weights have fixed shapes"
    for name, e in inputs:
        used = sorted(_sym.dims_symbols(g.sym_shape[e]) & g.data_dims)
        if used:
            return (f"input {name!r} has dims {_dims_text(g.sym_shape[e])} with data-dependent dimension(s) {used}, "
                    "which a kernel decides at run time, not the caller")
    plain = {d for _, e in inputs for d in g.sym_shape[e] if isinstance(d, str) and d in g.dim_ranges}
    try:
        _data_dim_ops(g)
    except InputError as err:
        return str(err)
    # a nested graph's symbols are given by the enclosing graph, whatever its inputs' dims
    unbound = [n for n in g.dim_ranges if n not in plain and n not in g.data_dims and not nested]
    if unbound:
        where = [f"{d!r} of input {n!r}" for n, e in inputs for d in dict.fromkeys(g.sym_shape[e])
                 if isinstance(d, str) and _sym.symbols(d) & set(unbound)]
        return (f"dynamic dimension(s) {unbound} are not a plain dimension of any input"
                f"{' (only inside ' + ', '.join(where) + ')' if where else ''}, so no input shape can give their "
                "value; give the model an input with that dim (or pin it)")
    for e in [e for _, e in inputs] + [g.entry_id(nid, idx) for nid, idx, _ in g.heads]:
        if len(g.shape[e]) > _MAX_DYNAMIC_NDIM and any(isinstance(d, str) for d in g.sym_shape[e]):
            return (f"graph entry {e} has {len(g.shape[e])} dims; dynamic inputs and outputs have at most "
                    f"{_MAX_DYNAMIC_NDIM}")
    return None


def _data_dim_ops(g: Graph) -> dict[str, int]:
    """``symbol -> node id`` of the kernel that reports each data-dependent dim: the node writing
    the entry :func:`~kiln.runtime.dynamic_shapes.data_dim_sources` reads it from (a ``__loop``
    for the iteration count of its scan outputs).

    Raises
    ------
    InputError
        A data-dependent dim no kernel output carries, or one an executor-level node writes.
    """
    out: dict[str, int] = {}
    for name, (eid, _) in data_dim_sources(g).items():
        nid = bisect.bisect_right(g.node_row_ptr, eid) - 1
        node = g.nodes[nid]
        if node.is_op and node.func_name == "__loop" and eid - g.node_row_ptr[nid] >= _num_carried(node):
            out[name] = nid  # the iteration count of a loop's scan outputs: the loop reports it
            continue
        if not node.is_op or node.func_name in ("__nop", "__copy", "__concat", "__if", "__loop"):
            raise InputError(f"data-dependent dimension {name!r} is first the dim of graph entry {eid}, an output of "
                             f"node {node.name!r} ({node.func_name if node.is_op else 'an input'}), not of a kernel "
                             "that reports it")
        if node.flatten_data:
            raise InputError(f"data-dependent dimension {name!r} is reported by node {node.name!r}, a flatten_data "
                             "kernel (which sees 1-D tensors, so it cannot report a dim)")
        out[name] = nid
    return out


def _num_carried(node: "GraphNode") -> int:
    return int(node.attrs.get("num_carried", 0))


def _dims_text(dims: Sequence[int | str]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


class _CExpr:
    """A C ``int64_t`` expression, built by :func:`kiln.runtime.sym.expand` with ``+ * //``."""

    def __init__(self, text: str) -> None:
        self.text = text

    @staticmethod
    def _c(v: object) -> str:
        if isinstance(v, _CExpr):
            return v.text
        n = int(v)  # type: ignore[call-overload]
        return str(n) if n >= 0 else f"({n})"

    def __add__(self, other: object) -> "_CExpr":
        if not isinstance(other, _CExpr) and int(other) < 0:  # type: ignore[call-overload]
            return _CExpr(f"({self.text} - {-int(other)})")  # type: ignore[call-overload]
        return _CExpr(f"({self.text} + {self._c(other)})")

    def __radd__(self, other: object) -> "_CExpr":
        return _CExpr(f"({self._c(other)} + {self.text})")

    def __mul__(self, other: object) -> "_CExpr":
        return _CExpr(f"({self.text} * {self._c(other)})")

    def __rmul__(self, other: object) -> "_CExpr":
        return _CExpr(f"({self._c(other)} * {self.text})")

    def __floordiv__(self, other: object) -> "_CExpr":
        # sym's "//" is floor division by a positive constant; C's "/" truncates
        return _CExpr(f"KilnFloorDiv({self.text}, {self._c(other)})")


def _dynamic_tables(g: Graph, inputs: Sequence[tuple[str, int]], shape_offset: Sequence[int], p: str,
                    decided_by: dict[str, int] | None = None, given: dict[str, int] | None = None
                    ) -> tuple[list[str], list[str]]:
    """Lines of a dynamic graph's symbol tables and dim-expression function, and the
    ``KilnModelDesc`` fields that name them (in the struct's order).

    Every distinct symbolic dim of the graph is one expression; the first ``num_symbols`` are the
    symbols themselves, in ``attrs.dim_ranges`` order. ``dim_expr`` has one row per dim of the
    shapes table: -1 for a static dim, else the expression giving it. ``decided_by`` maps each
    data-dependent symbol to the index (in the ops table) of the op whose kernel reports it;
    its row is ``{name, lo, hi, -1, op}``. ``given`` maps each symbol of a nested graph to its
    index among the enclosing graph's symbols, which gives its value before each run: its row is
    ``{name, lo, hi, -2, index}``. ``dim_expr_after`` (version 3 and 4 only) gives per
    expression the last such op of the symbols it uses, -1 for none: within a run the C side
    neither checks nor writes a dim before its value is known.
    """
    assert g.sym_shape is not None
    names = list(g.dim_ranges)
    index = {n: j for j, n in enumerate(names)}
    source: dict[str, tuple[int, int]] = {}
    for i, (_, e) in enumerate(inputs):
        for k, d in enumerate(g.sym_shape[e]):
            if isinstance(d, str) and d in index and d not in source:
                source[d] = (i, k)
    exprs: dict[str, int] = {n: j for j, n in enumerate(names)}
    dim_expr: list[int] = []
    for e in range(g.num_entries):
        assert len(dim_expr) == shape_offset[e]
        for d in g.sym_shape[e]:
            if isinstance(d, int):
                dim_expr.append(-1)
            else:
                dim_expr.append(exprs.setdefault(d, len(exprs)))
    env = {n: _CExpr(f"s[{j}]") for j, n in enumerate(names)}
    body = [f"  v[{j}] = s[{j}];" for j in range(len(names))]
    expr_rows = []
    for text, j in exprs.items():
        first = min(index[n] for n in _sym.symbols(text))
        expr_rows.append(f"  {{{_c_str(text)}, {first}}},")
        if j >= len(names):
            c = _sym.expand(text, env)
            body.append(f"  v[{j}] = {c.text if isinstance(c, _CExpr) else int(c)};")  # type: ignore[call-overload]
    decided_by = decided_by or {}
    given = given or {}
    where = {n: (-1, decided_by[n]) if n in decided_by else (-2, given[n]) if n in given else source[n]
             for n in names}
    sym_rows = [f"  {{{_c_str(n)}, {lo}LL, {hi}LL, {where[n][0]}, {where[n][1]}}},"
                for n, (lo, hi) in g.dim_ranges.items()]
    per_line = 16
    dim_rows = ["  " + ", ".join(str(v) for v in dim_expr[i:i + per_line]) + ","
                for i in range(0, len(dim_expr), per_line)]
    lines = [
        "",
        f"static const KilnSymbolDesc {p}symbols[] = {{", *sym_rows, "};",
        f"static const KilnDimExprDesc {p}dim_exprs[] = {{", *expr_rows, "};",
        f"static const int32_t {p}dim_expr[] = {{", *(dim_rows or ["  0"]), "};",
        "",
        f"/* The value of every symbolic dim (v[i], {p}dim_exprs[i]) from the symbols' values s[]. */",
        f"static void {p}eval_dims(const int64_t* s, int64_t* v) {{", *body, "}",
    ]
    fields = [f"  {len(names)}, {p}symbols,", f"  {len(exprs)}, {p}dim_exprs, {p}eval_dims, {p}dim_expr,"]
    if decided_by:  # version 3: a field version-2 tables leave out
        after = [max((decided_by[n] for n in _sym.symbols(text) if n in decided_by), default=-1) for text in exprs]
        lines += ["", "/* Per dim expression: the last op reporting a data-dependent symbol it uses (-1: none). */",
                  f"static const int32_t {p}dim_expr_after[] = {{",
                  *("  " + ", ".join(str(v) for v in after[i:i + per_line]) + ","
                    for i in range(0, len(after), per_line)), "};"]
        fields.append(f"  {p}dim_expr_after,")
    return lines, fields


def model_api_source(graph: Graph, params: Sequence[str], mod_name: str = "default",
                     defined: set[str] | None = None, linked_params: Sequence[str] = (),
                     has_blob: bool = True) -> str:
    """C source of the model tables and ``KilnModelCreate`` for ``graph``.

    Parameters are those of :func:`_tables`.
    """
    decls, lines = _tables(graph, params, mod_name, defined, linked_params, has_blob, "kiln_")
    create = ["KILN_DLL int32_t KilnModelCreate(const char* params_path, KilnModel** out) {",
              "  return KilnModelCreateFromDesc(&kiln_model_desc, params_path, out);", "}", ""]
    return "\n".join(_header(mod_name) + sorted(decls) + lines + create)


def portable_api_source(parts: Sequence[dict], mod_name: str = "default") -> str:
    """C source for a library of several builds (:class:`~kiln.runtime.IsaDispatchModule`).

    Parameters
    ----------
    parts : sequence of dict
        Per variant, best first: the keyword arguments of :func:`_tables` (``graph``,
        ``params``, ``mod_name``, ``defined``, ``linked_params``, ``has_blob``) plus
        ``features``, the CPU features it needs in LLVM's spelling.
    mod_name : str
        The dispatching module's name.

    Returns
    -------
    str
        Every variant's tables and a ``KilnModelCreate`` that picks the variant with
        ``KilnModelSelectVariant`` (``kiln_model_api.c``) before creating it.
    """
    decls: set[str] = set()
    lines: list[str] = []
    rows = []
    for i, part in enumerate(parts):
        kw = {k: v for k, v in part.items() if k != "features"}
        d, ln = _tables(prefix=f"kiln_v{i}_", **kw)
        decls |= d
        lines += ln
        flags = " ".join(sorted(_CPUINFO_SPELLING.get(f, f) for f in part["features"] if f not in _ALWAYS_X86))
        rows.append(f"  {{&kiln_v{i}_model_desc, {_c_str(part['mod_name'])}, {_c_str(flags)}}},")
    lines += ["static const KilnModelVariant kiln_variants[] = {", *rows, "};", "",
              "KILN_DLL int32_t KilnModelCreate(const char* params_path, KilnModel** out) {",
              f"  int32_t i = KilnModelSelectVariant(kiln_variants, {len(parts)});",
              "  if (i < 0) {",
              "    if (out) *out = NULL;",
              "    return KILN_ERR_UNSUPPORTED;",
              "  }",
              "  return KilnModelCreateFromDesc(kiln_variants[i].desc, params_path, out);",
              "}", ""]
    return "\n".join(_header(mod_name) + sorted(decls) + lines)


def _header(mod_name: str) -> list[str]:
    return [f"/* Kiln C API tables of model {mod_name!r}. Generated by kiln.runtime.model_api; see docs/c_api.md. */",
            "#include <kiln/kiln_model_desc.h>", ""]


def _tables(graph: Graph, params: Sequence[str], mod_name: str = "default", defined: set[str] | None = None,
            linked_params: Sequence[str] = (), has_blob: bool = True, prefix: str = "kiln_",
            given: dict[str, int] | None = None) -> tuple[set[str], list[str]]:
    """Declarations and tables (``<prefix>model_desc``) of one build.

    Parameters
    ----------
    graph : Graph
        The validated graph JSON.
    params : sequence of str
        Names of the argument nodes that hold weights (the factory's params); the other
        argument nodes are the model's inputs, in graph order.
    mod_name : str
        The factory's module name (selects its params in the module blob).
    defined : set of str, optional
        Functions the library's compiled modules define; a kernel outside it makes the model
        unsupported (``None``: not checked).
    linked_params : sequence of str
        Params the library carries as linked constants (``link_params=True``).
    has_blob : bool
        Whether the library has a module blob (``__kiln_dev_mblob``) to read params from.
    prefix : str
        Prefix of the tables' C names.
    given : dict of str to int, optional
        For a nested graph (a branch or body): the enclosing graph's symbol index of each of its
        symbols, whose values the enclosing graph gives it before each run (``None``: the model).

    Returns
    -------
    (set of str, list of str)
        Declarations of the symbols the tables use, and the tables' lines.
    """
    g = graph
    param_set = set(params) | set(linked_params)
    why = _unsupported_reason(g, defined, param_set, nested=given is not None)
    arg_names = [g.nodes[n].name for n in g.arg_nodes]
    inputs = [(n, g.entry_id(nid)) for nid, n in zip(g.arg_nodes, arg_names) if n not in param_set]
    weights = [(n, g.entry_id(nid)) for nid, n in zip(g.arg_nodes, arg_names) if n in param_set]
    outputs = [(f"output{i}", g.entry_id(nid, idx)) for i, (nid, idx, _) in enumerate(g.heads)]

    # Storage slots: dense indices over the storage ids of root entries, sized for the largest.
    slot_of: dict[int, int] = {}
    slot_bytes: list[int] = []
    for e in range(g.num_entries):
        if g.alias_root[e] == e:
            sid = g.storage_id[e]
            if sid not in slot_of:
                slot_of[sid] = len(slot_bytes)
                slot_bytes.append(0)
            slot_bytes[slot_of[sid]] = max(slot_bytes[slot_of[sid]], g.entry_offset(g.alias_root[e]) + g.entry_bytes(e))

    shapes: list[int] = []
    shape_offset: list[int] = []
    entry_rows: list[str] = []
    for e in range(g.num_entries):
        shape_offset.append(len(shapes))
        dl = _dtype.to_dl(g.dltype[e]) if why is None else None
        code, bits = (dl.code, dl.bits) if dl is not None else (0, 0)
        slot = slot_of[g.storage_id[g.alias_root[e]]]
        entry_rows.append(f"  {{{slot}, {len(g.shape[e])}, {len(shapes)}, {{{code}, {bits}, 1}}, "
                          f"{g.entry_bytes(e)}ULL, {g.entry_offset(g.alias_root[e])}ULL}},")
        shapes.extend(g.shape[e])

    op_rows: list[str] = []
    op_args: list[int] = []
    kernels: list[str] = []
    op_of: dict[int, int] = {}  # node id -> its row in the ops table
    if why is None:
        for node_id, node in enumerate(g.nodes):
            if not node.is_op or node.func_name in ("__nop", "__concat"):
                continue  # no work: an alias, or a concatenation its inputs wrote in place
            op_of[node_id] = len(op_rows)
            args = [g.entry_id(s, i) for s, i, _ in node.inputs] + list(g.node_entries(node_id))
            if node.func_name == "__copy":
                fn, kind = "NULL", "KILN_OP_COPY"
            elif node.func_name in _CONTROL_KINDS:
                fn, kind = "NULL", "KILN_OP_IF" if node.func_name == "__if" else "KILN_OP_LOOP"
            else:
                fn, kind = node.func_name, "KILN_OP_CALL"
                kernels.append(node.func_name)
            op_rows.append(f"  {{{fn}, {_c_str(node.name)}, {_c_str(node.func_name)}, {kind}, {len(op_args)}, "
                           f"{len(args)}, {int(node.flatten_data)}}},")
            op_args.extend(args)

    def arr(ctype: str, name: str, rows: Sequence[str]) -> str:
        body = "\n".join(rows) if rows else "  {0}"
        return f"static const {ctype} {name}[] = {{\n{body}\n}};"

    def ints(values: Sequence[int], per_line: int = 16, suffix: str = "") -> list[str]:
        return ["  " + ", ".join(f"{v}{suffix}" for v in values[i:i + per_line]) + ","
                for i in range(0, len(values), per_line)]

    decls: set[str] = set()
    for k in set(kernels):
        decls.add(f"int32_t {k}(KilnValue*, int32_t*, int32_t, KilnValue*, int32_t*, void*);")
    linked = bool(linked_params) and why is None
    if linked:
        decls.add(f"int32_t {_LINKED_LOOKUP}(KilnValue*, int32_t*, int32_t, KilnValue*, int32_t*, void*);")
    blob = has_blob and why is None
    if blob:
        decls.add("extern const uint8_t __kiln_dev_mblob[];")
    p = prefix
    dynamic = ["  0, NULL,", "  0, NULL, NULL, NULL,"]
    dyn_lines: list[str] = []
    version = API_VERSION
    decided_by: dict[str, int] = {}
    if why is None and g.sym_shape is not None:
        decided_by = {n: op_of[nid] for n, nid in _data_dim_ops(g).items()}
        dyn_lines, dynamic = _dynamic_tables(g, inputs, shape_offset, p, decided_by, given)
        if decided_by:
            version = DATA_DEPENDENT_TABLES_VERSION
        if given:  # symbol rows with input -2: only a version-4 reader knows them
            version = CONTROL_FLOW_TABLES_VERSION
    ctl_lines: list[str] = []
    controls = [nid for nid in op_of if g.nodes[nid].func_name in _CONTROL_KINDS]
    if version == CONTROL_FLOW_TABLES_VERSION or controls:
        # version 4: the nested graphs' tables, then the controls table naming them
        version = CONTROL_FLOW_TABLES_VERSION
        symbol_index = {n: j for j, n in enumerate(g.dim_ranges)}
        for nid in controls:
            d, ln = _control_tables(g, nid, mod_name, defined, p, symbol_index)
            decls |= d
            ctl_lines += ln
        if not decided_by:
            dynamic.append("  NULL,")  # dim_expr_after
        dynamic.append(f"  {len(controls)}, {p + 'controls' if controls else 'NULL'},")
    if controls:
        ctl_lines.append(arr("KilnControlDesc", f"{p}controls", [f"  {{{op_of[nid]}, {len(g.nodes[nid].inputs)}, "
                                                                  f"{len(_CONTROL_KINDS[g.nodes[nid].func_name])}, "
                                                                  f"{p}c{nid}_nested, {_num_carried(g.nodes[nid])}, "
                                                                  f"{int(g.nodes[nid].attrs.get('num_scan', 0))}}},"
                                                                  for nid in controls]))
    lines = [
        "",
        arr("int64_t", f"{p}shapes", ints(shapes) if shapes else []),
        arr("KilnEntryDesc", f"{p}entries", entry_rows),
        arr("uint64_t", f"{p}storage_bytes", ints(slot_bytes, 8, "ULL")),
        arr("KilnOpDesc", f"{p}ops", op_rows),
        arr("int32_t", f"{p}op_args", ints(op_args)),
        arr("KilnNamedEntry", f"{p}inputs", [f"  {{{_c_str(n)}, {e}}}," for n, e in inputs]),
        arr("KilnNamedEntry", f"{p}outputs", [f"  {{{_c_str(n)}, {e}}}," for n, e in outputs]),
        arr("KilnNamedEntry", f"{p}params", [f"  {{{_c_str(n)}, {e}}}," for n, e in weights]),
        *dyn_lines,
        *ctl_lines,
        "",
        f"static const KilnModelDesc {p}model_desc = {{",
        f"  {version}, {_c_str(mod_name)}, {'NULL' if why is None else _c_str(why)},",
        f"  {g.num_entries}, {p}entries, {p}shapes,",
        f"  {len(slot_bytes)}, {p}storage_bytes,",
        f"  {len(op_rows)}, {p}ops, {p}op_args,",
        f"  {len(inputs)}, {p}inputs,",
        f"  {len(outputs)}, {p}outputs,",
        f"  {len(weights)}, {p}params,",
        f"  {'__kiln_dev_mblob' if blob else 'NULL'},",
        f"  {_LINKED_LOOKUP if linked else 'NULL'},",
        *dynamic,
        "};",
    ]
    return decls, lines


def _control_tables(g: Graph, nid: int, mod_name: str, defined: set[str] | None, prefix: str,
                    symbol_index: dict[str, int]) -> tuple[set[str], list[str]]:
    """Declarations and lines of control-flow node ``nid``'s nested graphs (each a whole table set,
    ``<prefix>c<nid><t|e|b>_model_desc``, made by :func:`_tables`: an If in a Loop body nests) and
    of its ``<prefix>c<nid>_nested`` rows.

    A nested graph's arguments are all its inputs (its params are the enclosing graph's entries,
    so it loads none). Its binds pair every entry that uses an argument's memory (the argument and
    its ``__nop`` views) with the enclosing entry it is bound to zero copy before each run, as
    :mod:`.control_flow` binds them: an If's captured values and params, a Loop's carried values
    (the node's own outputs, where the loop keeps them), captured values and params. A Loop's
    iteration number and condition (arguments 0 and 1) stay in the body's own memory.
    """
    node = g.nodes[nid]
    ins = [g.entry_id(s, i) for s, i, _ in node.inputs]
    outs = list(g.node_entries(nid))
    n_carried = _num_carried(node)
    decls: set[str] = set()
    lines: list[str] = []
    rows = []
    for key in _CONTROL_KINDS[node.func_name]:
        sub = node.subgraphs[key]
        sp = f"{prefix}c{nid}{key[0]}_"
        # its symbols are the enclosing graph's (same names and ranges: the reader checked them)
        d, ln = _tables(sub, (), mod_name, defined, (), False, sp, {n: symbol_index[n] for n in sub.dim_ranges})
        decls |= d
        lines += ln
        params = [int(k) for k in node.attrs.get(f"{key}_params", [])]
        args = [sub.entry_id(n) for n in sub.arg_nodes]
        n_decl = len(args) - len(params)
        if node.func_name == "__if":
            to: list[int | None] = [ins[1 + k] for k in range(n_decl)]
        else:
            to = [None, None] + [outs[k] if k < n_carried else ins[2 + k] for k in range(n_decl - 2)]
        to += [ins[k] for k in params]
        binds: list[int] = []
        for a, parent in zip(args, to):
            if parent is not None:
                for e in range(sub.num_entries):
                    if sub.alias_root[e] == a:
                        binds += [e, parent]
        lines += ["", f"/* {node.name} {key}: (nested entry, enclosing entry) bound zero copy before each run */",
                  f"static const int32_t {sp}binds[] = {{",
                  *(["  " + ", ".join(map(str, binds[i:i + 16])) + "," for i in range(0, len(binds), 16)] or ["  0"]),
                  "};"]
        rows.append(f"  {{&{sp}model_desc, {_c_str(key)}, {len(binds) // 2}, {sp}binds}},")
    lines += [f"static const KilnNestedDesc {prefix}c{nid}_nested[] = {{", *rows, "};"]
    return decls, lines


def _defined_functions(dso: Sequence["Module"]) -> set[str] | None:
    names: set[str] = set()
    for m in dso:
        funcs = m.list_functions() if hasattr(m, "list_functions") else None
        if funcs is None:
            return None
        names.update(funcs)
    return names


def write_model_api(workspace: str, root: "Module", dso: Sequence["Module"], has_blob: bool) -> list[str]:
    """Write ``kiln_model.c`` for ``root`` into ``workspace``.

    Parameters
    ----------
    workspace : str
        Directory for the generated file.
    root : Module
        The module being exported; an executor factory, or a
        :class:`~kiln.runtime.IsaDispatchModule` of several, has a C API.
    dso : sequence of Module
        The modules compiled into the library (their functions are the kernels the tables may
        name).
    has_blob : bool
        Whether the library will carry the module blob.

    Returns
    -------
    list of str
        The generated file and the package's ``kiln_model_api.c`` (compile both into the
        library), or ``[]`` when ``root`` has no C API.
    """
    from .executor_factory import ExecutorFactoryModule
    from .isa_dispatch import IsaDispatchModule

    defined = _defined_functions(dso)

    def part(factory: ExecutorFactoryModule) -> dict:
        linked: list[str] = []
        if defined is not None and _LINKED_LOOKUP in defined:
            for m in factory.imported_modules[0].walk() if factory.imported_modules else ():
                linked += list(getattr(m, "linked_param_names", ()) or ())
        weights = list(factory.params) + [n for n in factory.removed_params if n not in factory.params]
        return {"graph": factory._graph, "params": weights, "mod_name": factory.mod_name, "defined": defined,
                "linked_params": linked, "has_blob": has_blob}

    if isinstance(root, ExecutorFactoryModule):
        src = model_api_source(**part(root))
    elif isinstance(root, IsaDispatchModule):
        parts = [dict(part(root.factory(i)), features=v.features) for i, v in enumerate(root.variants)]
        src = portable_api_source(parts, root.mod_name)
    else:
        return []
    model_path = os.path.join(workspace, MODEL_FILE)
    with open(model_path, "w", encoding="utf-8") as f:
        f.write(src)
    return [model_path, api_source_path()]
