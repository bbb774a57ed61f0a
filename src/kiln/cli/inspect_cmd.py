"""``kiln inspect LIB.so|LIB.tar``: show what a Kiln library holds without running it.

Everything is read from the file (ELF section/symbol tables, or the tar members); no code
from the library is loaded, and no module loader runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tarfile
from typing import Any

from ..runtime.errors import FormatError, KilnFileNotFoundError

__all__ = ["register", "run", "inspect_library"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``inspect`` subcommand."""
    p = subparsers.add_parser(
        "inspect",
        help="show the module tree, functions and blob of a library (runs no library code)",
        description="Show the module tree, exported functions and blob sizes of a .so or .tar "
        "written by export_library. The file is parsed, never loaded.",
    )
    p.add_argument("library", help="path of a .so or .tar library")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    info = inspect_library(args.library)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(_format(info))
    return 0


# ------------------------------------------------------------------------------------
def _tree_info(raw: Any, where: str) -> dict[str, Any]:
    from ..runtime import blob as _blob

    d = _blob.decode(raw, where)
    return {
        "blob_bytes": len(raw),
        "entries": [
            {"index": i, "type_key": e.type_key, "payload_bytes": None if e.payload is None else len(e.payload)}
            for i, e in enumerate(d.entries)
        ],
        "row_ptr": d.row_ptr,
        "child_indices": d.child_indices,
    }


def _inspect_so(path: str) -> dict[str, Any]:
    from ..runtime import blob as _blob
    from ..runtime.elf import ElfFile
    from ..runtime.library_module import CRT_FUNCTIONS

    elf = ElfFile(path)
    funcs = elf.exported_functions()
    info: dict[str, Any] = {
        "path": path,
        "kind": "so",
        "file_bytes": os.path.getsize(path),
        "functions": [f for f in funcs if f not in CRT_FUNCTIONS and f not in ("_init", "_fini")],
        "has_crt": all(f in funcs for f in ("KilnRunSequence", "KilnGetLastError")),
        "blob": None,
    }
    sec = elf.section_data(_blob.SECTION_NAME)
    if sec is not None:
        raw = _blob.unpack(sec, f"{path}: section {_blob.SECTION_NAME}")
        info["blob"] = _tree_info(raw, f"{path}: module blob")
        info["blob"]["section"] = _blob.SECTION_NAME
        info["blob"]["section_bytes"] = len(sec)
    return info


def _inspect_tar(path: str) -> dict[str, Any]:
    from ..runtime import blob as _blob
    from ..runtime.export import MANIFEST_NAME

    try:
        with tarfile.open(path, "r:*") as tf:
            members = {m.name: m for m in tf.getmembers() if m.isfile()}
            files = [{"name": n, "bytes": m.size} for n, m in members.items()]

            def read(name: str) -> bytes:
                m = members.get(name)
                fh = tf.extractfile(m) if m is not None else None
                if fh is None:
                    raise FormatError(f"{path}: archive has no member {name!r}")
                with fh:
                    return fh.read()

            if MANIFEST_NAME not in members:
                raise FormatError(f"{path}: not a Kiln library archive (no {MANIFEST_NAME})")
            try:
                man = json.loads(read(MANIFEST_NAME).decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as err:
                raise FormatError(f"{path}: {MANIFEST_NAME} is not valid JSON ({err})") from err
            if not isinstance(man, dict):
                raise FormatError(f"{path}: {MANIFEST_NAME} is not a JSON object")
            blob_info = None
            if man.get("blob"):
                packed = read(str(man["blob"]))
                raw = _blob.unpack(packed, f"{path}: {man['blob']}")
                blob_info = _tree_info(raw, f"{path}: module blob")
                blob_info["file"] = man["blob"]
    except (tarfile.TarError, EOFError, OSError) as err:
        raise FormatError(f"{path}: not a valid tar archive ({err})") from err
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
    is_tar = path.endswith(".tar")
    if not is_tar and not path.endswith(".so"):
        try:
            is_tar = tarfile.is_tarfile(path)
        except OSError:
            is_tar = False
    return _inspect_tar(path) if is_tar else _inspect_so(path)


# ------------------------------------------------------------------------------------
def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n}"


def _format(info: dict[str, Any]) -> str:
    lines = [f"library: {info['path']} ({info['kind']}, {_size(info['file_bytes'])})"]
    funcs = info["functions"]
    lines.append(f"functions ({len(funcs)}): {', '.join(funcs) if funcs else '-'}")
    if info["kind"] == "so":
        lines.append(f"kiln crt: {'yes' if info['has_crt'] else 'no'}")
    else:
        for f in info["files"]:
            lines.append(f"  file {f['name']}: {_size(f['bytes'])}")
        if info.get("options"):
            lines.append(f"compile options: {' '.join(info['options'])}")
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
            desc = f"payload {_size(e['payload_bytes'])}"
        if i in seen:
            lines.append(f"{pad}[{i}] {e['type_key']}  (already shown)")
            return
        seen.add(i)
        lines.append(f"{pad}[{i}] {e['type_key']}  ({desc})")
        for c in child[row_ptr[i] : row_ptr[i + 1]]:
            show(c, depth + 1)

    show(0, 0)
    for i in range(len(entries)):  # entries not reachable from the root (should not happen)
        if i not in seen:
            show(i, 0)
    where = blob.get("section") or blob.get("file")
    lines.append(f"blob: {_size(blob['blob_bytes'])} in {where}, {len(entries)} module entries + _import_tree")
    lines.append(f"import tree: row_ptr={row_ptr} child_indices={child}")
    return "\n".join(lines)
