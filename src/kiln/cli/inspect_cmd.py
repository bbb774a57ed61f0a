"""``kiln inspect LIB.so|LIB.tar|MODEL.onnx``: show what a Kiln library (or a model) holds.

For a library everything is read from the file (ELF section/symbol tables, or the tar
members); no code from the library is loaded, and no module loader runs. This is the way to
look at an untrusted library (``docs/security.md``). The file is checked exactly as
``load_module`` checks it before ``dlopen`` (digest trailer, ELF tables, tar caps and
manifest, blob), so a file ``load_module`` rejects gives the same one-line error here. Device modules
(``cuda``, ``opencl``, plug-ins) are summarized by the payload describer their module type
registers (:func:`kiln.runtime.registry.register_payload_describer`), which only parses bytes. ONNX models, the
compiled-graph summary and ``--graph`` drawing are at the end of this file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tarfile
from typing import TYPE_CHECKING, Any, Iterator

from ..runtime import cpu_features
from ..runtime.errors import FormatError, InputError, KilnError, KilnFileNotFoundError
from .args import (DEFAULT_CLI_TARGET, add_input_shape_option, add_target_option, check_target,
                   parse_dim_ranges, parse_input_shapes, require_file)
from .fmt import fmt_bytes
from .graph_stats import graph_json_stats, memory_text
from .model_io import import_onnx, is_pt2, load_onnx_model, load_pt2

if TYPE_CHECKING:
    from ..runtime.graph_json import Graph

__all__ = ["register", "run", "inspect_library", "describe_payload"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``inspect`` subcommand."""
    p = subparsers.add_parser(
        "inspect",
        help="show the module tree, functions and blob of a library (runs no library code)",
        description="Show the module tree, exported functions, device modules (their kernels, launch "
        "sizes and binary sizes) and blob sizes of a .so or .tar written by export_library. The file is "
        "parsed, never loaded: no device runtime is needed.",
        epilog="Also: an ONNX model or a torch.export .pt2 archive (inputs, outputs, op counts, Kiln "
        "support; --ir, --plan), the "
        "compiled model inside a library (graph, params, memory plan), and --graph drawings. "
        "examples: kiln inspect model.onnx --ir; kiln inspect model.so --graph model.svg",
    )
    p.add_argument("library", metavar="LIB.so|LIB.tar|MODEL.onnx|MODEL.pt2",
                   help="path of a .so or .tar library, of an ONNX model or of a torch.export "
                   "archive (torch.export.save)")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of text")
    p.add_argument("--graph", metavar="OUT.svg|OUT.dot",
                   help="draw the graph with its fused groups as clusters (SVG needs graphviz "
                   "'dot'; without it DOT is written)")
    p.add_argument("--ir", action="store_true", help="(ONNX model) also print the imported Kiln IR")
    p.add_argument("--plan", action="store_true",
                   help="(ONNX model) also compile it in memory and show kernels and the memory plan")
    add_input_shape_option(p, "(ONNX model) fix an input's shape, e.g. data:1,3,224,224")
    add_target_option(p, f"(ONNX model, --plan) target (default '{DEFAULT_CLI_TARGET}')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.library.lower().endswith(".onnx") or is_pt2(args.library) or args.graph:
        return _run_extended(args)
    info = inspect_library(args.library)
    model = compiled_model_info(args.library)
    if model is not None:
        info["compiled_model"] = {k: v for k, v in model.items() if k != "graph_json"}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(_format(info))
        if model is not None:
            print(_format_compiled_model(model, info.get("functions", ())))
    return 0


# ------------------------------------------------------------------------------------
def _tree_info(raw: Any, where: str) -> dict[str, Any]:
    from ..runtime import blob as _blob

    d = _blob.decode(raw, where)
    entries = []
    for i, e in enumerate(d.entries):
        ent: dict[str, Any] = {"index": i, "type_key": e.type_key,
                               "payload_bytes": None if e.payload is None else len(e.payload)}
        if e.payload is not None:
            desc = describe_payload(e.type_key, e.payload)
            if desc is not None:
                ent["device_module"] = desc
            if e.type_key == "IsaDispatch":
                ent["variants"] = _variants_info(e.payload, where)
        entries.append(ent)
    return {
        "blob_bytes": len(raw),
        "entries": entries,
        "row_ptr": d.row_ptr,
        "child_indices": d.child_indices,
    }


def _variants_info(payload: bytes, where: str) -> list[dict[str, Any]]:
    """The builds of a portable library, and which one this machine would run (no code loaded)."""
    from ..runtime.isa_dispatch import loadbinary_IsaDispatch

    mod = loadbinary_IsaDispatch(payload)
    try:
        chosen: str | None = mod.selected_variant()
    except KilnError:
        chosen = None
    arch, host = cpu_features.host_cpu()
    out = []
    for v in mod.variants:
        missing = v.missing(arch, host)
        out.append({"mod_name": v.mod_name, "arch": v.arch, "features": list(v.features),
                    "runs_here": missing == [], "selected": v.mod_name == chosen})
    return out


def describe_payload(type_key: str, payload: bytes) -> dict[str, Any] | None:
    """What the module type's registered describer says about a blob payload, or None.

    Device module types (``cuda``, ``opencl``, plug-ins) register a describer with
    :func:`kiln.runtime.registry.register_payload_describer`; it only parses bytes, so this
    needs neither the device runtime nor any code from the library. A describer that fails
    is reported in the result (``"error"``) instead of aborting the inspection.
    """
    from ..runtime.registry import get_payload_describer

    fn = get_payload_describer(type_key)
    if fn is None:
        return None
    try:
        desc = fn(payload)
    except Exception as err:  # noqa: BLE001 - a corrupt device payload must not hide the rest
        return {"error": f"{type(err).__name__}: {err}"}
    return dict(desc) if isinstance(desc, dict) else {"error": f"describer returned {type(desc).__name__}"}


def _format_device_module(desc: dict[str, Any], pad: str) -> list[str]:
    """Text lines for a device-module description (format, sizes, functions, kernels)."""
    if "error" in desc:
        return [f"{pad}cannot describe payload: {desc['error']}"]
    head = []
    if desc.get("format"):
        head.append(str(desc["format"]) + (f" for {desc['arch']}" if desc.get("arch") else ""))
    if desc.get("binary_bytes") is not None:
        head.append(f"binary {fmt_bytes(int(desc['binary_bytes']))}")
    if desc.get("source_bytes"):
        head.append(f"source {fmt_bytes(int(desc['source_bytes']))}")
    funcs, kernels = desc.get("functions") or [], desc.get("kernels") or []
    head.append(f"{len(funcs)} functions, {len(kernels)} kernels")
    lines = [f"{pad}device code: {', '.join(head)}"]
    for k in kernels:
        dims = ""
        if k.get("grid") is not None and k.get("block") is not None:
            dims = f"  grid {'x'.join(str(v) for v in k['grid'])} block {'x'.join(str(v) for v in k['block'])}"
        if k.get("shared_bytes"):
            dims += f" shared {fmt_bytes(int(k['shared_bytes']))}"
        lines.append(f"{pad}  kernel {k.get('name', '?')}{dims}")
    return lines


def _isa_info(note: bytes | None, where: str) -> dict[str, Any] | None:
    """The library's CPU requirement and what it means on this machine (None: not recorded)."""
    if note is None:
        return None
    arch, feats = cpu_features.decode_requirement(note, where)
    host_arch, host = cpu_features.host_cpu()
    if host_arch != arch:
        here = f"this machine is {host_arch}: it cannot run it"
    elif host is None:
        here = "this machine's features cannot be read"
    else:
        missing = [f for f in feats if f not in host]
        here = f"this machine lacks {', '.join(missing)}" if missing else "this machine has them all"
    return {"arch": arch, "features": feats, "here": here}


def _inspect_so(path: str) -> dict[str, Any]:
    from ..runtime import blob as _blob
    from ..runtime.export import open_library_elf
    from ..runtime.library_module import CRT_FUNCTIONS

    elf = open_library_elf(path)
    funcs = elf.exported_functions()
    info: dict[str, Any] = {
        "path": path,
        "kind": "so",
        "file_bytes": os.path.getsize(path),
        "functions": [f for f in funcs if f not in CRT_FUNCTIONS and f not in ("_init", "_fini")],
        "has_crt": all(f in funcs for f in ("KilnRunSequence", "KilnGetLastError")),
        "has_c_api": "KilnModelCreate" in funcs,
        "blob": None,
        "isa": _isa_info(elf.section_data(cpu_features.ISA_SECTION), path),
    }
    sec = elf.section_data(_blob.SECTION_NAME)
    if sec is not None:
        raw = _blob.unpack(sec, f"{path}: section {_blob.SECTION_NAME}")
        info["blob"] = _tree_info(raw, f"{path}: module blob")
        info["blob"]["section"] = _blob.SECTION_NAME
        info["blob"]["section_bytes"] = len(sec)
    return info


def _inspect_tar(path: str) -> dict[str, Any]:
    from ..contrib.tar import open_archive
    from ..runtime import blob as _blob
    from ..runtime.tar_manifest import MANIFEST_NAME, parse_manifest

    with open_archive(path) as arch, _format_errors(path, "tar archive"):
        files = [{"name": n, "bytes": arch.size_of(n)} for n in arch.names()]
        if arch.size_of(MANIFEST_NAME) is None:
            raise FormatError(f"{path}: not a Kiln library archive (no {MANIFEST_NAME})")
        man = parse_manifest(arch.read(MANIFEST_NAME), f"{path}: {MANIFEST_NAME}")
        named = [m["file"] for m in man["modules"]] + [man["crt"], *man["addons"]]
        for name in named + ([man["blob"]] if man["blob"] else []):
            if arch.size_of(name) is None:
                raise FormatError(f"{path}: {MANIFEST_NAME}: manifest names {name!r} but the archive "
                                  "does not contain it")
        blob_info = None
        if man["blob"]:
            packed = arch.read(man["blob"])
            raw = _blob.unpack(packed, f"{path}: {man['blob']}")
            blob_info = _tree_info(raw, f"{path}: module blob")
            blob_info["file"] = man["blob"]
    funcs: list[str] = []
    for m in man.get("modules", []) or []:
        if isinstance(m, dict):
            funcs.extend(m.get("functions") or [])
    return {
        "path": path,
        "kind": "tar",
        "file_bytes": os.path.getsize(path),
        "files": files,
        "modules": man.get("modules", []),
        "options": man.get("options", []),
        "isa": None if man.get("isa") is None else _isa_info(
            json.dumps(man["isa"]).encode(), f"{path}: {MANIFEST_NAME}"),
        "functions": sorted(set(funcs)),
        "blob": blob_info,
    }


def inspect_library(path: str) -> dict[str, Any]:
    """Describe the library at ``path`` as a JSON-able dict (never loads it).

    Raises
    ------
    KilnFileNotFoundError
        If the file does not exist.
    FormatError
        If it is neither an ELF library nor a Kiln ``.tar``, or its blob is malformed.
    """
    if not os.path.exists(path):
        raise KilnFileNotFoundError(f"no such file: {path}")
    if not os.path.isfile(path):
        raise FormatError(f"{path}: not a file")
    with _format_errors(path, "library"):
        return _inspect_tar(path) if _is_tar(path) else _inspect_so(path)


def _is_tar(path: str) -> bool:
    """The same choice ``load_module`` makes: by extension, then by content."""
    from ..contrib.tar import looks_like_tar

    if path.endswith(".tar"):
        return True
    return not path.endswith((".so", ".dylib")) and looks_like_tar(path)


@contextlib.contextmanager
def _format_errors(path: str, what: str) -> Iterator[None]:
    """Report a parser choking on bad bytes as a FormatError, as ``load_module`` does.

    ``kiln.runtime.blob.deserialize`` turns a loader's unexpected exception into a
    FormatError; inspect parses the same payloads itself, so it does the same here.
    """
    from ..runtime.errors import KilnError

    try:
        yield
    except FormatError as err:
        if path in str(err):
            raise
        raise FormatError(f"{path}: {err}") from err  # a parser that does not know the file name
    except KilnError:
        raise
    except (tarfile.TarError, EOFError, OSError) as err:
        raise FormatError(f"{path}: not a valid tar archive ({err})") from err
    except Exception as err:  # noqa: BLE001 - e.g. UnicodeDecodeError, RecursionError, OverflowError
        raise FormatError(f"{path}: malformed {what}: {type(err).__name__}: {err}") from err


# ------------------------------------------------------------------------------------
def _format(info: dict[str, Any]) -> str:
    lines = [f"library: {info['path']} ({info['kind']}, {fmt_bytes(info['file_bytes'])})"]
    funcs = info["functions"]
    lines.append(f"functions ({len(funcs)}): {', '.join(funcs) if funcs else '-'}")
    if info["kind"] == "so":
        lines.append(f"kiln crt: {'yes' if info['has_crt'] else 'no'}")
        lines.append(f"C API (kiln/kiln_model.h): {'yes' if info.get('has_c_api') else 'no'}")
    else:
        for f in info["files"]:
            lines.append(f"  file {f['name']}: {fmt_bytes(f['bytes'])}")
        if info.get("options"):
            lines.append(f"compile options: {' '.join(info['options'])}")
    isa = info.get("isa")
    if isa is not None:
        lines.append(f"cpu requirement: {isa['arch']} {' '.join(isa['features']) or '-'} ({isa['here']})")
    blob = info["blob"]
    lines.append("module tree:")
    if blob is None:
        root = "library" if info["kind"] == "so" else "_lib"
        lines.append(f"  [0] {root}  (no blob: the compiled code is the only module)")
        return "\n".join(lines)
    entries = blob["entries"]
    row_ptr, child = blob["row_ptr"], blob["child_indices"]
    seen: set[int] = set()

    def show(i: int, depth: int) -> None:
        e = entries[i]
        pad = "  " * (depth + 1)
        if e["type_key"] == "_lib":
            desc = "compiled code in this library"
        else:
            desc = f"payload {fmt_bytes(e['payload_bytes'])}"
        if i in seen:
            lines.append(f"{pad}[{i}] {e['type_key']}  (already shown)")
            return
        seen.add(i)
        lines.append(f"{pad}[{i}] {e['type_key']}  ({desc})")
        if e.get("device_module") is not None:
            lines.extend(_format_device_module(e["device_module"], pad + "    "))
        for v in e.get("variants") or ():
            mark = "selected here" if v["selected"] else ("runs here" if v["runs_here"] else "not on this CPU")
            lines.append(f"{pad}    variant {v['mod_name']}: {v['arch']} {' '.join(v['features'])} ({mark})")
        for c in child[row_ptr[i] : row_ptr[i + 1]]:
            show(c, depth + 1)

    show(0, 0)
    for i in range(len(entries)):  # entries not reachable from the root (should not happen)
        if i not in seen:
            show(i, 0)
    where = blob.get("section") or blob.get("file")
    lines.append(f"blob: {fmt_bytes(blob['blob_bytes'])} in {where}, {len(entries)} module entries + _import_tree")
    lines.append(f"import tree: row_ptr={row_ptr} child_indices={child}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------
# Extensions: the compiled model inside a library, ONNX models, and --graph drawings.
# ------------------------------------------------------------------------------------
def _raw_blob(path: str) -> Any:
    """The module blob of a library (no length header), or None; never loads the library."""
    from ..runtime import blob as _blob

    if _is_tar(path):
        from ..contrib.tar import open_archive
        from ..runtime.tar_manifest import MANIFEST_NAME, parse_manifest

        with open_archive(path) as arch, _format_errors(path, "tar archive"):
            if arch.size_of(MANIFEST_NAME) is None:
                raise FormatError(f"{path}: not a Kiln library archive (no {MANIFEST_NAME})")
            man = parse_manifest(arch.read(MANIFEST_NAME), f"{path}: {MANIFEST_NAME}")
            if not man["blob"]:
                return None
            packed = arch.read(man["blob"])
        return _blob.unpack(packed, f"{path}: blob")
    from ..runtime.export import open_library_elf

    sec = open_library_elf(path).section_data(_blob.SECTION_NAME)
    return None if sec is None else _blob.unpack(sec, f"{path}: section {_blob.SECTION_NAME}")


def compiled_model_info(path: str) -> dict[str, Any] | None:
    """Graph, params and memory plan of the compiled model in a library, or None when the
    library holds no executor factory. Read from the blob with the parser ``load_module`` uses
    (:func:`kiln.runtime.executor_factory.read_factory_payload`); nothing is loaded.

    Raises
    ------
    FormatError
        If the blob, the factory payload or its graph JSON is malformed.
    """
    from ..runtime import blob as _blob
    from ..runtime.executor_factory import TYPE_KEY, read_factory_payload
    from ..runtime.graph_json import load_graph_json
    from ..runtime.sequences import describe_values

    raw = _raw_blob(path)
    if raw is None:
        return None
    d = _blob.decode(raw, f"{path}: module blob")
    entry = next((e for e in d.entries if e.type_key == TYPE_KEY), None)
    if entry is None or entry.payload is None:
        return None
    with _format_errors(path, f"compiled model ({TYPE_KEY} payload)"):
        payload = read_factory_payload(entry.payload, f"{path}: {TYPE_KEY} payload")
        graph_json, mod_name, params = payload.graph_json, payload.mod_name, payload.params
        graph = load_graph_json(graph_json)
        st = graph_json_stats(graph, list(params))
        inputs, outputs = _graph_inputs(graph, set(params)), _graph_outputs(graph)
    return {
        "mod_name": mod_name,
        "graph_json": graph_json,
        "graph_json_bytes": len(graph_json),
        "inputs": inputs,
        "outputs": outputs,
        "params": {"count": len(params), "bytes": sum(int(v.nbytes) for v in params.values())},
        "kernel_calls": st.kernel_calls,
        "unique_functions": st.unique_functions,
        "nop_aliases": st.nop_calls,
        "memory": st.memory(),
        "param_names": sorted(params),
        "dim_ranges": {k: list(v) for k, v in graph.dim_ranges.items()},
        "values": describe_values(graph),  # sequence / optional inputs and outputs (or None)
    }


def _entry_dims(g: Graph, eid: int) -> list[int | str]:
    """An entry's dims: symbolic ones (a dynamic library) as their expressions."""
    return list(g.sym_shape[eid] if g.sym_shape is not None else g.shape[eid])


def _graph_inputs(g: Graph, params: set[str]) -> list[dict[str, Any]]:
    return [{"name": g.nodes[n].name, "shape": _entry_dims(g, g.entry_id(n)), "dtype": g.dltype[g.entry_id(n)]}
            for n in g.arg_nodes if g.nodes[n].name not in params]


def _graph_outputs(g: Graph) -> list[dict[str, Any]]:
    return [{"shape": _entry_dims(g, g.entry_id(n, i)), "dtype": g.dltype[g.entry_id(n, i)]} for n, i, _ in g.heads]


def _tensor_line(t: dict[str, Any]) -> str:
    name = f"{t['name']}: " if t.get("name") is not None else ""
    return f"{name}{t['dtype']} [{', '.join(str(d) for d in t['shape'])}]"


def _format_compiled_model(m: dict[str, Any], functions: Any = ()) -> str:
    lines = [f"compiled model '{m['mod_name']}':"]
    linked = "_lookup_linked_param" in functions
    if linked:
        lines.append("  (--link-params library: the weights are compiled into the code, so the argument "
                     "list below holds the inputs and the linked params)")
    lines += [f"  {'arg   ' if linked else 'input '} {_tensor_line(t)}" for t in m["inputs"]]
    lines += [f"  output {i}: {_tensor_line(t)}" for i, t in enumerate(m["outputs"])]
    if m.get("values"):  # the tensors above regroup into these sequence / optional values
        lines += [f"  input  {n}: {t} (set_input takes a list / None)" for n, t in m["values"]["inputs"].items()]
        lines += [f"  value output {i} ({o['name']}): {o['type']} <- output(s) {', '.join(map(str, o['heads'])) or '-'}"
                  for i, o in enumerate(m["values"]["outputs"])]
    if m.get("dim_ranges"):
        lines.append("  dynamic dims: " + ", ".join(f"{k} in {lo}..{hi}" for k, (lo, hi) in m["dim_ranges"].items())
                     + " (memory planned for the upper bounds)")
    lines.append(f"  kernels: {m['kernel_calls']} calls, {m['unique_functions']} unique functions"
                 + (f", {m['nop_aliases']} no-work __nop / __concat nodes" if m["nop_aliases"] else ""))
    lines.append(f"  params: {m['params']['count']} tensors, {fmt_bytes(m['params']['bytes'])}")
    lines.append(f"  memory plan: {m['memory']['num_storages']} storages; {memory_text(m['memory'])}")
    return "\n".join(lines)


def inspect_onnx(path: str, shapes: dict[str, Any] | None = None,
                 dim_ranges: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Inputs, outputs, op counts and Kiln support of an ONNX model (JSON-able dict).

    Support is checked by converting the model (with ``shapes`` fixing input shapes, as
    ``--input-shape`` does), so unsupported variants of supported op types (a 3-D Conv, an
    attribute value Kiln lacks, a dtype) are found too: ``conversion`` lists every node that
    fails, not only the first. A model whose inputs have no static shape is only checked
    against the table of op types, and ``conversion`` says why.
    """
    model = load_onnx_model(path)
    g = model.graph
    import onnx

    def ttype(vi: Any) -> dict[str, Any]:
        # a sequence / optional shows its element tensor's type, wrapped: sequence<float32>
        wrap, tp = [], vi.type
        while tp.WhichOneof("value") in ("sequence_type", "optional_type"):
            kind = tp.WhichOneof("value")
            wrap.append(kind.split("_")[0])
            tp = tp.sequence_type.elem_type if kind == "sequence_type" else tp.optional_type.elem_type
        tt = tp.tensor_type
        dims: list[Any] = []
        for dd in tt.shape.dim:
            dims.append(dd.dim_value if dd.HasField("dim_value") else (dd.dim_param or "?"))
        try:
            dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "?"
            if tt.elem_type == onnx.TensorProto.STRING:
                dt = "string"  # NumPy's name is "object"; Kiln's dtype is "string"
        except Exception:  # noqa: BLE001
            dt = onnx.TensorProto.DataType.Name(tt.elem_type).lower()
        for w in reversed(wrap):
            dt = f"{w}<{dt}>"
        return {"name": vi.name, "dtype": dt, "shape": dims}

    inits = {t.name for t in g.initializer}
    counts: dict[str, int] = {}
    for n in g.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    n_values = 0
    for t in g.initializer:
        c = 1
        for dd in t.dims:
            c *= dd
        n_values += c
    try:
        from ..frontend import supported_ops

        supported = set(supported_ops())
        unsupported = sorted(k for k in counts if k not in supported)
    except Exception:  # noqa: BLE001 - the frontend is optional for a plain summary
        unsupported = None
    conversion = _conversion_check(model, shapes, dim_ranges) if unsupported is not None else None
    if conversion is not None and conversion["checked"]:
        # Op types without a converter that are not evaluated at import (constant inputs) are
        # the ones conversion reports by type; a folded one is supported in this model.
        failed = {e["op_type"] for e in conversion["errors"]}
        unsupported = [k for k in unsupported or () if k in failed]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {
        "path": path,
        "kind": "onnx",
        "file_bytes": os.path.getsize(path),
        "graph_name": g.name,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "ir_version": model.ir_version,
        "opset": opset,
        "inputs": [ttype(vi) for vi in g.input if vi.name not in inits],
        "outputs": [ttype(vi) for vi in g.output],
        "initializers": {"count": len(g.initializer), "values": n_values},
        "nodes": len(g.node),
        "op_counts": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "unsupported_ops": unsupported,
        "conversion": conversion,
    }


def inspect_pt2(path: str) -> tuple[dict[str, Any], Any, Any]:
    """Inputs, outputs, ATen op counts and Kiln support of a ``torch.export`` archive.

    Ops are counted after the decomposition the frontend applies (core ATen, keeping the ops
    Kiln converts whole), i.e. what Kiln actually converts. Support is checked by converting
    the program; the IR and params come back too (``None`` when conversion fails) so ``--ir``
    and ``--plan`` need not convert again.

    Returns
    -------
    info : dict
        JSON-able summary (``kind`` = ``"pt2"``).
    graph, params
        The imported IR and params, or ``None``.
    """
    from ..frontend.torch import converter as torch_fe
    from ..runtime.errors import KilnError

    ep = load_pt2(path)

    def ttype(name: str, val: Any) -> dict[str, Any]:
        shape = [int(d) if str(d).isdigit() else str(d) for d in getattr(val, "shape", ())]
        return {"name": name, "dtype": str(getattr(val, "dtype", "?")).removeprefix("torch."),
                "shape": shape}

    nodes = {n.name: n for n in ep.graph.nodes}
    sig = ep.graph_signature
    inputs = [ttype(s.arg.name, nodes[s.arg.name].meta.get("val")) for s in sig.input_specs
              if s.kind.name == "USER_INPUT"]
    outputs = [ttype(s.arg.name, nodes[s.arg.name].meta.get("val")) for s in sig.output_specs
               if s.kind.name == "USER_OUTPUT" and s.arg.name in nodes]
    n_values = sum(int(t.numel()) for t in ep.state_dict.values())
    graph: Any = None
    params: Any = None
    conversion: dict[str, Any]
    counts: dict[str, int] = {}
    unsupported: list[str] = []
    try:
        dec = torch_fe.decompose_program(ep)
        for n in dec.graph.nodes:
            if n.op == "call_function" and not str(n.target).startswith("<"):
                counts[str(n.target)] = counts.get(str(n.target), 0) + 1
        unsupported = sorted(torch_fe.unsupported_calls(dec))
        graph, params = torch_fe.from_exported_program(dec, decompose=False)
        conversion = {"checked": True, "errors": []}
    except KilnError as err:
        conversion = {"checked": True, "errors": [str(err)]}
    except Exception as err:  # noqa: BLE001 - torch's decomposition can fail on odd programs
        conversion = {"checked": False, "reason": f"{type(err).__name__}: {err}"}
    info = {
        "path": path,
        "kind": "pt2",
        "file_bytes": os.path.getsize(path),
        "inputs": inputs,
        "outputs": outputs,
        "state_dict": {"count": len(ep.state_dict), "values": n_values},
        "nodes": sum(counts.values()),
        "op_counts": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "unsupported_ops": unsupported,
        "conversion": conversion,
    }
    return info, graph, params


def _io_lines(info: dict[str, Any]) -> list[str]:
    """The inputs and outputs of an ONNX model's or a torch.export program's summary."""
    lines = [f"inputs ({len(info['inputs'])}):"] + [f"  {_tensor_line(t)}" for t in info["inputs"]]
    return lines + [f"outputs ({len(info['outputs'])}):"] + [f"  {_tensor_line(t)}" for t in info["outputs"]]


def _format_pt2(info: dict[str, Any]) -> str:
    lines = [f"model: {info['path']} (torch.export program, {fmt_bytes(info['file_bytes'])})"]
    lines += _io_lines(info)
    sd = info["state_dict"]
    lines.append(f"parameters and buffers: {sd['count']} ({sd['values']} values)")
    lines.append(f"ATen calls after decomposition: {info['nodes']} ({len(info['op_counts'])} ops)")
    lines.append("op counts: " + ", ".join(f"{k} {v}" for k, v in info["op_counts"].items()))
    conv = info["conversion"]
    if not conv["checked"]:
        lines.append(f"kiln support: not checked: {conv['reason']}")
    elif info["unsupported_ops"]:
        lines.append(f"kiln support: UNSUPPORTED ops: {', '.join(info['unsupported_ops'])}")
    elif conv["errors"]:
        lines.append("kiln support: the program cannot be converted:")
        lines += [f"  {e}" for e in conv["errors"]]
    else:
        lines.append(f"kiln support: all {len(info['op_counts'])} ops are supported")
    return "\n".join(lines)


def _conversion_check(model: Any, shapes: dict[str, Any] | None,
                      dim_ranges: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Every node the ONNX frontend cannot convert (``checked`` False, with the ``reason``,
    when the model as a whole cannot be converted, e.g. for dynamic input shapes)."""
    from ..frontend.onnx.converter import conversion_errors
    from ..runtime.errors import KilnError

    try:
        errors, skipped = conversion_errors(model, shapes or None, dim_ranges=dim_ranges or None)
    except KilnError as err:
        return {"checked": False, "reason": str(err)}
    return {"checked": True, "errors": errors, "skipped_nodes": skipped}


def _format_onnx(info: dict[str, Any]) -> str:
    lines = [f"model: {info['path']} (ONNX, {fmt_bytes(info['file_bytes'])}, ir_version {info['ir_version']}, "
             f"opset {info['opset']}" + (f", producer {info['producer']}" if info["producer"] else "") + ")"]
    lines += _io_lines(info)
    ini = info["initializers"]
    lines.append(f"initializers: {ini['count']} ({ini['values']} values)")
    lines.append(f"nodes: {info['nodes']} ({len(info['op_counts'])} op types)")
    lines.append("op counts: " + ", ".join(f"{k} {v}" for k, v in info["op_counts"].items()))
    uns = info["unsupported_ops"]
    conv = info.get("conversion")
    errors = conv["errors"] if conv and conv["checked"] else []
    if uns is None:
        lines.append("kiln support: unknown (the ONNX frontend is not available)")
    elif uns:
        lines.append(f"kiln support: UNSUPPORTED op types: {', '.join(uns)}")
    elif not errors:
        lines.append(f"kiln support: all {len(info['op_counts'])} op types are supported")
    if errors and conv is not None:
        more = f"; {conv['skipped_nodes']} more depend on them" if conv["skipped_nodes"] else ""
        lines.append(f"kiln support: {len(errors)} node(s) cannot be converted{more}:")
        lines += [f"  {e['error']}" for e in errors]
    elif conv and not conv["checked"]:
        lines.append(f"kiln support: op variants (attributes, ranks, dtypes) not checked: {conv['reason']} "
                     "(--input-shape NAME:D1,D2,... fixes an input's shape; --dim NAME=LO..HI keeps a dim dynamic)")
    return "\n".join(lines)


def _run_extended(args: argparse.Namespace) -> int:
    from .graphviz import dot_from_fused, dot_from_graph_json

    path = args.library
    is_onnx = path.lower().endswith(".onnx")
    if is_onnx or is_pt2(path):
        shapes = parse_input_shapes(args.input_shape)
        dim_ranges = parse_dim_ranges(args.dim)
        graph: Any = None  # imported only when --ir, --plan or --graph needs the IR
        params: Any = None
        info: dict[str, Any]
        if is_onnx:
            require_file(path, "ONNX model")
            info = inspect_onnx(path, shapes, dim_ranges)
            text = [_format_onnx(info)]
            if args.ir or args.plan or args.graph:
                graph, params = import_onnx(path, shapes, dim_ranges)
        else:
            if shapes:
                raise InputError(f"--input-shape does not apply to {path}: a torch.export "
                                 f"program's input shapes are fixed when it is exported")
            info, graph, params = inspect_pt2(path)
            text = [_format_pt2(info)]
            if graph is None and (args.ir or args.plan or args.graph):
                # --ir / --plan need the IR: fail with the converter's own error
                graph, params = import_onnx(path, None)
        if args.ir:
            info["ir"] = str(graph)
            text += ["", "Kiln IR (as imported):", info["ir"]]
        if args.plan:
            check_target(args.target)
            from .. import build as kiln_build

            factory = kiln_build(graph, target=args.target, params=params)
            st = graph_json_stats(factory.get_graph_json(), list(factory.get_graph_params()))
            plan = {"kernel_calls": st.kernel_calls, "unique_functions": st.unique_functions,
                    "fused_groups": st.kernel_calls + st.nop_calls, "memory": st.memory()}
            info["plan"] = plan
            text += ["", f"when built (target {args.target}): {plan['fused_groups']} fused groups, "
                     f"{st.kernel_calls} kernel calls, {st.unique_functions} unique functions",
                     f"memory plan: {st.num_storages} storages; {memory_text(st.memory())}"]
        if args.graph:
            from ..driver import fuse

            fused = fuse(graph, params)
            dot = dot_from_fused(fused, title=os.path.basename(path))
            info["graph"] = _write_drawing(dot, args.graph, text, len(fused.groups), "fused groups")
    else:
        info = inspect_library(path)
        model = compiled_model_info(path)
        text = [_format(info)]
        if model is not None:
            info["compiled_model"] = {k: v for k, v in model.items() if k != "graph_json"}
            text.append(_format_compiled_model(model, info.get("functions", ())))
        if args.graph:
            if model is None:
                raise FormatError(f"{path}: holds no compiled model (no GraphExecutorFactory), nothing to draw")
            dot = dot_from_graph_json(model["graph_json"], model["param_names"], title=os.path.basename(path))
            info["graph"] = _write_drawing(dot, args.graph, text, model["kernel_calls"], "kernels")
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print("\n".join(text))
    return 0


def _write_drawing(dot: str, out: str, text: list[str], n: int, what: str) -> dict[str, Any]:
    """Write ``dot`` to ``out``, add a line saying what was written to ``text``, and return the
    JSON record of it; a note (DOT written instead of SVG) goes to stderr."""
    from .graphviz import write_graph

    written, note = write_graph(dot, out)
    if note in ("DOT", "SVG", "PNG", "PDF"):
        text.append(f"graph: wrote {written} ({note}, {n} {what} as clusters)")
        return {"path": written, "format": note.lower()}
    text.append(f"graph: wrote {written} (DOT, {n} {what} as clusters)")
    print(f"kiln: note: {note}", file=sys.stderr)
    return {"path": written, "format": "dot", "note": note}
