"""Graphviz drawings of ``kiln inspect --graph``: a model's fused groups as DOT clusters.

Owns the DOT text of an imported model (:func:`dot_from_fused`) and of a compiled library's
graph JSON (:func:`dot_from_graph_json`), and writing it: SVG/PNG/PDF through the ``dot``
program when it is installed, else the DOT text with a note on how to render it. Runtime only;
the IR's op registry is consulted lazily, to split fused function names back into ops.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from ..runtime.errors import InputError, KilnError, KilnFileNotFoundError

__all__ = ["dot_from_fused", "dot_from_graph_json", "split_func_name", "write_graph"]


def _dot_str(s: Any) -> str:
    """A double-quoted DOT string."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lbl(*lines: Any) -> str:
    """A multi-line DOT label."""
    return _dot_str("\n".join(str(x) for x in lines))


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


_DOT_HEAD = [
    "  rankdir=TB;",
    '  graph [fontname="Helvetica", fontsize=10, compound=true, newrank=true];',
    '  node [fontname="Helvetica", fontsize=10, shape=box, style="rounded,filled", fillcolor="#ffffff"];',
    '  edge [fontname="Helvetica", fontsize=8, color="#555555"];',
]

_PATTERN_COLOR = {
    "ELEMWISE": "#e8f4ea", "BROADCAST": "#e8f4ea", "INJECTIVE": "#eef0fb", "COMM_REDUCE": "#fdf3e1",
    "OUT_ELEMWISE_FUSABLE": "#fbe9e7", "OPAQUE": "#eeeeee", "TUPLE": "#eeeeee",
}


def dot_from_fused(fused: Any, param_names: Sequence[str] = (), title: str = "") -> str:
    """DOT text for a :class:`~kiln.transform.fuse.FusedGraph`: one cluster per fused group.

    Graph inputs are ellipses, parameters are omitted (their count is in the label of the
    group that reads them), ``__nop`` aliases are dashed, outputs are double octagons.
    """
    g = fused.graph
    params = set(param_names)
    node_id: dict[Any, str] = {}
    lines = ["digraph kiln {", *_DOT_HEAD]
    label = title or g.name
    lines.append(f"  label={_dot_str(f'{label}: {len(fused.groups)} fused groups')}; labelloc=t;")
    src_of: dict[Any, str] = {}
    for i, v in enumerate(g.inputs):
        if v.name in params:
            continue
        nid = f"in{i}"
        src_of[v] = nid
        lines.append(f"  {nid} [shape=ellipse, fillcolor=\"#e3f2fd\", "
                     "label=" + _lbl(v.name, f'{_shape_str(v.shape)} {v.dtype}') + "];")
    for gi, grp in enumerate(fused.groups):
        kind = "__nop" if grp.is_nop else grp.pattern.name
        color = _PATTERN_COLOR.get(kind, "#f5f5f5")
        nparams = sum(1 for v in grp.inputs if v.node is None and v.name in params)
        glabel = f"group {gi}: {kind}" + (f" ({nparams} params)" if nparams else "")
        lines.append(f"  subgraph cluster_g{gi} {{")
        style = "dashed" if grp.is_nop else "rounded,filled"
        lines.append(f"    label={_dot_str(glabel)}; style={_dot_str(style)}; fillcolor={_dot_str(color)}; "
                     f"color=\"#888888\";")
        for k, n in enumerate(grp.nodes):
            nid = f"g{gi}_{k}"
            node_id[n] = nid
            extra = ", penwidth=2" if grp.anchor is n and not grp.is_nop else ""
            out_shape = _shape_str(n.outputs[0].shape) if n.outputs else ""
            lines.append(f"    {nid} [label=" + _lbl(n.op, out_shape) + f"{extra}];")
        lines.append("  }")
    for n, nid in node_id.items():
        for v in n.inputs:
            if v.node is not None and v.node in node_id:
                lines.append(f"  {node_id[v.node]} -> {nid};")
            elif v in src_of:
                lines.append(f"  {src_of[v]} -> {nid};")
    for i, v in enumerate(g.outputs):
        oid = f"out{i}"
        lines.append(f"  {oid} [shape=doubleoctagon, fillcolor=\"#fff8e1\", "
                     "label=" + _lbl(f'output {i}', f'{_shape_str(v.shape)} {v.dtype}') + "];")
        src = node_id.get(v.node) if v.node is not None else src_of.get(v)
        if src:
            lines.append(f"  {src} -> {oid};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _group_ops(node: Any) -> list[str]:
    """The ops fused into a graph-JSON kernel node, from its attrs when the driver records
    them, else guessed from the ``fused_<op>_<op>`` function-name convention."""
    attrs = node.attrs or {}
    for key in ("ops", "fused_ops", "op_names"):
        v = attrs.get(key)
        if isinstance(v, (list, tuple)) and v:
            return [str(x) for x in v]
        if isinstance(v, str) and v:
            return [x for x in v.replace("+", ",").split(",") if x]
    return split_func_name(node.func_name)


def split_func_name(func_name: str) -> list[str]:
    """``kilngen_default_fused_conv2d_bias_add_relu_1`` -> ``[conv2d, bias_add, relu]``.

    Op names are matched greedily (longest first) against the IR's op registry; a name that
    does not follow the convention comes back whole."""
    _, sep, rest = func_name.partition("_fused_")
    if not sep:
        return [func_name]
    rest = re.sub(r"_\d+$", "", rest)
    try:
        from ..ir import list_ops

        known = sorted(list_ops(), key=len, reverse=True)
    except Exception:  # noqa: BLE001 - the compiler side is optional here
        return [rest]
    ops: list[str] = []
    pos = 0
    while pos < len(rest):
        for op in known:
            if rest.startswith(op, pos) and (pos + len(op) == len(rest) or rest[pos + len(op)] == "_"):
                ops.append(op)
                pos += len(op) + 1
                break
        else:
            return [rest]
    return ops or [rest]


def dot_from_graph_json(graph_json: Any, param_names: Sequence[str] = (), title: str = "") -> str:
    """DOT text for a compiled model's graph JSON: each kernel (a fused group) is a cluster
    holding its fused ops; inputs are ellipses; params are omitted; ``__nop`` is dashed."""
    from ..runtime.graph_json import Graph, load_graph_json

    g = graph_json if isinstance(graph_json, Graph) else load_graph_json(graph_json)
    params = set(param_names)
    lines = ["digraph kiln {", *_DOT_HEAD]
    nk = sum(1 for n in g.nodes if n.is_op and n.func_name != "__nop")
    lines.append("  label=" + _dot_str((title or 'compiled graph') + f': {nk} kernels') + "; labelloc=t;")
    first: dict[int, str] = {}   # node id -> DOT id edges go into
    last: dict[int, str] = {}    # node id -> DOT id edges leave from
    for nid, node in enumerate(g.nodes):
        e = g.entry_id(nid)
        if not node.is_op:
            if node.name in params:
                continue
            first[nid] = last[nid] = f"n{nid}"
            lines.append(f"  n{nid} [shape=ellipse, fillcolor=\"#e3f2fd\", "
                         "label=" + _lbl(node.name, f'{_shape_str(g.shape[e])} {g.dltype[e]}') + "];")
            continue
        shape = _shape_str(g.shape[e])
        if node.func_name in ("__nop", "__copy"):
            first[nid] = last[nid] = f"n{nid}"
            label = f"{node.func_name} (alias)" if node.func_name == "__nop" else node.func_name
            lines.append(f"  n{nid} [style=dashed, label={_dot_str(label)}];")
            continue
        ops = _group_ops(node)
        nparams = sum(1 for (src, _, _) in node.inputs if not g.nodes[src].is_op and g.nodes[src].name in params)
        glabel = node.func_name + (f" ({nparams} params)" if nparams else "")
        lines.append(f"  subgraph cluster_n{nid} {{")
        lines.append(f"    label={_dot_str(glabel)}; "
                     'style="rounded,filled"; fillcolor="#fbe9e7"; color="#888888";')
        for k, op in enumerate(ops):
            lab = _lbl(op, shape) if k == len(ops) - 1 else _dot_str(op)
            lines.append(f"    n{nid}_{k} [label={lab}];")
            if k:
                lines.append(f"    n{nid}_{k - 1} -> n{nid}_{k};")
        lines.append("  }")
        first[nid], last[nid] = f"n{nid}_0", f"n{nid}_{len(ops) - 1}"
    for nid, node in enumerate(g.nodes):
        if nid not in first or not node.is_op:
            continue
        for (src, idx, _) in node.inputs:
            if src in last:
                lab = _shape_str(g.shape[g.entry_id(src, idx)])
                lines.append(f"  {last[src]} -> {first[nid]} [label={_dot_str(lab)}];")
    for i, (src, idx, _) in enumerate(g.heads):
        e = g.entry_id(src, idx)
        lines.append(f"  out{i} [shape=doubleoctagon, fillcolor=\"#fff8e1\", "
                     "label=" + _lbl(f'output {i}', f'{_shape_str(g.shape[e])} {g.dltype[e]}') + "];")
        if src in last:
            lines.append(f"  {last[src]} -> out{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(dot_text: str, out_path: str) -> tuple[str, str]:
    """Write a drawing: SVG (or PNG/PDF) through graphviz ``dot`` when the extension asks for it
    and ``dot`` is installed, else the DOT text.

    Returns
    -------
    (str, str)
        The path written, and either its format (``"SVG"``, ``"PNG"``, ``"PDF"``, ``"DOT"``) or,
        when ``dot`` is missing and DOT was written next to ``out_path`` instead, a note saying so
        and how to render it.

    Raises
    ------
    KilnFileNotFoundError
        If the output directory does not exist.
    InputError
        If the extension is not one of .svg, .png, .pdf, .dot, .gv.
    KilnError
        If ``dot`` fails.
    """
    import shutil  # only a drawing needs them: keep `kiln --help` from loading subprocess
    import subprocess

    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise KilnFileNotFoundError(f"output directory does not exist: {out_dir}")
    base, ext = os.path.splitext(out_path)
    fmt = ext.lower().lstrip(".")
    if fmt in ("dot", "gv"):
        with open(out_path, "w", encoding="utf-8") as f:
            f.write(dot_text)
        return out_path, "DOT"
    if fmt not in ("svg", "png", "pdf"):
        raise InputError(f"--graph {out_path}: unknown format {ext or '(none)'!r}; use .svg, .png, .pdf or .dot")
    dot = shutil.which("dot")
    if dot is None:
        dot_path = base + ".dot"
        with open(dot_path, "w", encoding="utf-8") as f:
            f.write(dot_text)
        return dot_path, (f"graphviz 'dot' is not installed, so wrote DOT instead of {fmt.upper()}; "
                          f"render it with: dot -T{fmt} {dot_path} -o {out_path}")
    proc = subprocess.run([dot, f"-T{fmt}", "-o", out_path], input=dot_text, text=True,
                          capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise KilnError(f"graphviz dot failed: {' '.join(proc.stderr.split())[:300]}")
    return out_path, fmt.upper()
