"""The module blob: how a module tree is stored inside an exported library.

Layout (all integers little-endian u64; see ``docs/module_blob_format.md``)::

    count                              number of entries, INCLUDING the _import_tree entry
    count-1 times:                     one entry per module group, DFS order, root first
        key_len, key bytes             type key; "_lib" for the group compiled into the library
        [payload_len, payload bytes]   only for non-"_lib" entries: the module's save_to_binary()
    key_len, "_import_tree"
    row_ptr:        n, n u64           CSR over entries: children of entry i are
    child_indices:  m, m u64           child_indices[row_ptr[i]:row_ptr[i+1]]

In the library the blob is the symbol ``__kiln_dev_mblob`` in section ``.kiln_mblob``:
an 8-byte little-endian payload length followed by the blob. A tree that is a single DSO
group (only code compiled into the library) has no blob.

:func:`serialize_chunks` / :func:`pack_chunks` give the same bytes as a list of buffers, with
tensor data referenced rather than copied (a module may offer ``save_to_binary_chunks()``
for that), so ``export_library`` writes a blob of hundreds of megabytes in one pass.

Grouping: every DSO-exportable module (C / LLVM code) reachable from another DSO module
through DSO-only imports joins that module's group, because they all end up in the same
``.so``. Groups are numbered in DFS pre-order of first discovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .binary import Reader, Writer
from .errors import FormatError, KilnError, LoaderNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    from .module import Module

__all__ = [
    "SECTION_NAME",
    "SYMBOL_NAME",
    "LIB_KEY",
    "IMPORT_TREE_KEY",
    "ModuleGroups",
    "group_modules",
    "collect_dso_modules",
    "serialize",
    "serialize_chunks",
    "pack",
    "pack_chunks",
    "unpack",
    "BlobEntry",
    "DecodedBlob",
    "decode",
    "deserialize",
    "resolve_loaders",
]

SECTION_NAME = ".kiln_mblob"
SYMBOL_NAME = "__kiln_dev_mblob"
LIB_KEY = "_lib"
IMPORT_TREE_KEY = "_import_tree"
_MAX_KEY_LEN = 4096


# ------------------------------------------------------------------------------------
# grouping and serialization
# ------------------------------------------------------------------------------------
@dataclass
class ModuleGroups:
    """A module tree split into blob entries.

    Attributes
    ----------
    groups : list of list of Module
        Entry ``i``'s modules; a DSO group may hold several, any other group exactly one.
    is_dso : list of bool
        Whether entry ``i`` is compiled into the library (written as ``_lib``).
    row_ptr, child_indices : list of int
        The import tree over entries, CSR.
    """

    groups: list[list["Module"]] = field(default_factory=list)
    is_dso: list[bool] = field(default_factory=list)
    row_ptr: list[int] = field(default_factory=list)
    child_indices: list[int] = field(default_factory=list)

    @property
    def needs_blob(self) -> bool:
        """False when the tree is one DSO group: the library alone restores it."""
        return not (len(self.groups) == 1 and self.is_dso[0])

    @property
    def dso_modules(self) -> list["Module"]:
        """All DSO modules, in entry order then DFS order within the group."""
        return [m for g, d in zip(self.groups, self.is_dso) if d for m in g]


def group_modules(root: "Module") -> ModuleGroups:
    """Split the tree under ``root`` into blob entries (see module docstring)."""
    out = ModuleGroups()
    index: dict[int, int] = {}  # id(module) -> entry index

    def dso_group(start: "Module") -> list["Module"]:
        # Everything reachable from ``start`` through DSO-only imports not yet in a group.
        group: list[Module] = []
        for m in start.walk(follow=lambda c: c.is_dso_exportable and id(c) not in index):
            index[id(m)] = len(out.groups)
            group.append(m)
        return group

    def visit(m: "Module") -> None:
        if id(m) in index:
            return
        if m.is_dso_exportable:
            group = dso_group(m)
            out.groups.append(group)
            out.is_dso.append(True)
        else:
            index[id(m)] = len(out.groups)
            group = [m]
            out.groups.append(group)
            out.is_dso.append(False)
        for member in group:
            for child in member.imported_modules:
                visit(child)

    visit(root)
    out.row_ptr = [0]
    for gi, group in enumerate(out.groups):
        children: list[int] = []
        for member in group:
            for child in member.imported_modules:
                ci = index[id(child)]
                if ci != gi and ci not in children:  # edges inside a merged group vanish
                    children.append(ci)
        out.child_indices.extend(children)
        out.row_ptr.append(len(out.child_indices))
    return out


def collect_dso_modules(root: "Module") -> list["Module"]:
    """Every DSO-exportable module in the tree (each once, blob order)."""
    return group_modules(root).dso_modules


def _defining_class(cls: type, name: str) -> type | None:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _payload_chunks(m: "Module") -> list[bytes | memoryview]:
    """The module's ``save_to_binary`` bytes, as uncopied pieces where the module offers them.

    A module may define ``save_to_binary_chunks()`` returning buffers whose concatenation is
    its ``save_to_binary()`` (the executor factory does, so its weights are never joined).
    It is used only when it is at least as specific as ``save_to_binary``: a subclass that
    overrides ``save_to_binary`` alone must not be serialized by its parent's chunk method.
    """
    cls = type(m)
    chunk_cls = _defining_class(cls, "save_to_binary_chunks")
    bin_cls = _defining_class(cls, "save_to_binary")
    if chunk_cls is not None and bin_cls is not None and issubclass(chunk_cls, bin_cls):
        parts = list(getattr(m, "save_to_binary_chunks")())  # noqa: B009 - optional protocol
        what = f"{cls.__name__}.save_to_binary_chunks() yielded"
    else:
        parts = [m.save_to_binary()]
        what = f"{cls.__name__}.save_to_binary() returned"
    out: list[bytes | memoryview] = []
    for part in parts:
        if isinstance(part, bytes):
            out.append(part)
        elif isinstance(part, bytearray):
            out.append(bytes(part))  # frozen now: its owner may reuse it before the blob is written
        elif isinstance(part, memoryview):
            out.append(part.cast("B"))  # 1-D bytes, so len() is the byte count
        else:
            raise KilnError(f"{what} {type(part).__name__}, expected bytes")
    return out


def serialize_chunks(root: "Module", groups: ModuleGroups | None = None) -> list[bytes | memoryview] | None:
    """Serialize the tree under ``root`` to blob pieces (without the 8-byte header).

    The concatenation of the pieces is :func:`serialize`'s output; tensor data is referenced,
    not copied, so a blob of hundreds of megabytes is written to its file in one pass.

    Parameters
    ----------
    root : Module
        Root of the tree.
    groups : ModuleGroups, optional
        ``group_modules(root)``, when the caller already has it.

    Returns
    -------
    list of bytes or memoryview, or None
        1-D byte buffers; ``None`` when no blob is needed (the tree is a single DSO group).
        The modules' data must stay unchanged until the pieces have been consumed.

    Raises
    ------
    KilnError
        If a module is neither DSO-exportable nor binary-serializable.
    """
    g = groups or group_modules(root)
    if not g.needs_blob:
        return None
    w = Writer()
    w.u64(len(g.groups) + 1)
    for group, dso in zip(g.groups, g.is_dso):
        if dso:
            w.string(LIB_KEY)
            continue
        m = group[0]
        if not m.is_binary_serializable:
            hint = ""
            if m.type_key == "library":
                hint = f"; a loaded library cannot be re-exported (copy {getattr(m, 'path', 'the file')} instead)"
            raise KilnError(
                f"cannot export module of type {m.type_key!r}: it is neither DSO-exportable nor "
                f"binary-serializable{hint}"
            )
        parts = _payload_chunks(m)
        w.string(m.type_key)
        w.u64(sum(len(p) for p in parts))
        for p in parts:
            w.raw(p)
    w.string(IMPORT_TREE_KEY)
    w.u64_vector(g.row_ptr)
    w.u64_vector(g.child_indices)
    return w.chunks()


def serialize(root: "Module", groups: ModuleGroups | None = None) -> bytes | None:
    """Serialize the tree under ``root`` to blob bytes (without the 8-byte header).

    Returns
    -------
    bytes or None
        ``None`` when no blob is needed (the tree is a single DSO group).

    Raises
    ------
    KilnError
        If a module is neither DSO-exportable nor binary-serializable.
    """
    chunks = serialize_chunks(root, groups)
    return None if chunks is None else b"".join(chunks)


def pack_chunks(blob: "bytes | memoryview | list[bytes | memoryview]") -> list[bytes | memoryview]:
    """:func:`pack` without the copy: the 8-byte length header, then the blob's pieces.

    Parameters
    ----------
    blob : bytes-like or list of bytes-like
        The blob, whole or as :func:`serialize_chunks` pieces.

    Returns
    -------
    list of bytes or memoryview
        Pieces whose concatenation is ``pack(blob)``.
    """
    parts = [blob] if isinstance(blob, (bytes, bytearray, memoryview)) else list(blob)
    w = Writer()
    views = [memoryview(p).cast("B") for p in parts]
    w.u64(sum(v.nbytes for v in views))
    for p, v in zip(parts, views):
        w.raw(p if isinstance(p, bytes) else v)
    return w.chunks()


def pack(blob: bytes) -> bytes:
    """Prefix the blob with its 8-byte little-endian length (the section/symbol content)."""
    return b"".join(pack_chunks(blob))


def unpack(section: bytes | memoryview, where: str = "blob section") -> memoryview:
    """Strip and check the 8-byte length header written by :func:`pack`.

    Raises
    ------
    FormatError
        If the header is missing or claims more bytes than present.
    """
    r = Reader(section, where)
    n = r.u64("length header")
    if n > r.remaining:
        raise r.error(f"header declares {n} payload bytes but only {r.remaining} follow (truncated)", 0)
    return r.view(n, "blob")  # no copy: blobs can hold hundreds of MB of weights


# ------------------------------------------------------------------------------------
# decoding
# ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlobEntry:
    """One decoded module entry: type key, payload (``None`` for ``_lib``) and its offset."""

    type_key: str
    payload: bytes | None
    offset: int


@dataclass(frozen=True)
class DecodedBlob:
    """The parsed blob: module entries (without ``_import_tree``) and the import tree."""

    entries: list[BlobEntry]
    row_ptr: list[int]
    child_indices: list[int]

    def children(self, i: int) -> list[int]:
        return self.child_indices[self.row_ptr[i] : self.row_ptr[i + 1]]


def _read_key(r: Reader) -> str:
    start = r.pos
    n = r.u64("type key length")
    if n == 0 or n > _MAX_KEY_LEN:
        raise r.error(f"implausible type key length {n}", start)
    r.pos = start
    return r.string("type key")


def decode(data: bytes | memoryview, where: str = "module blob") -> DecodedBlob:
    """Parse and validate blob bytes (no loaders run; used by ``kiln inspect`` too).

    Raises
    ------
    FormatError
        On any structural problem, with the byte offset.
    """
    r = Reader(data, where)
    count = r.u64("entry count")
    # Each entry takes at least 9 bytes (8-byte key length + a 1-byte key), so this bounds
    # the loop before allocating anything for a corrupt count.
    if count < 2 or count > len(data) // 9:
        need = ("needs at least one module and the _import_tree" if count < 2
                else "too many to fit: truncated or corrupt")
        raise r.error(f"implausible entry count {count} ({need})", 0)
    entries: list[BlobEntry] = []
    tree: tuple[list[int], list[int]] | None = None
    for i in range(count):
        start = r.pos
        key = _read_key(r)
        if key == IMPORT_TREE_KEY:
            if i != count - 1:
                raise r.error(
                    f"_import_tree found as entry {i}, but the entry count {count} (which includes it) puts it "
                    f"at entry {count - 1}: wrong entry count",
                    start,
                )
            row_ptr = r.u64_vector("import tree row_ptr")
            child = r.u64_vector("import tree child_indices")
            tree = (row_ptr, child)
        elif key == LIB_KEY:
            entries.append(BlobEntry(key, None, start))
        else:
            entries.append(BlobEntry(key, r.sized_bytes(f"payload of entry {i} ({key!r})"), start))
    if tree is None:
        raise r.error(f"missing _import_tree entry (entry count {count} includes it)")
    r.expect_end(f"the declared {count} entries")
    row_ptr, child = tree
    n = len(entries)
    if len(row_ptr) != n + 1:
        raise FormatError(f"{where}: import tree row_ptr has {len(row_ptr)} items, expected {n + 1} (entries + 1)")
    if row_ptr[0] != 0 or row_ptr[-1] != len(child):
        raise FormatError(
            f"{where}: import tree row_ptr must start at 0 and end at {len(child)} (child count), "
            f"got {row_ptr[0]}..{row_ptr[-1]}"
        )
    for i in range(n):
        if row_ptr[i] > row_ptr[i + 1]:
            raise FormatError(f"{where}: import tree row_ptr decreases at index {i} ({row_ptr[i]} > {row_ptr[i + 1]})")
    for j, c in enumerate(child):
        if c >= n:
            raise FormatError(f"{where}: import tree child_indices[{j}] = {c} is out of range (0..{n - 1})")
    return DecodedBlob(entries, row_ptr, child)


def resolve_loaders(d: DecodedBlob) -> dict[str, Any]:
    """Look up the loader of every type key in ``d`` (raises before any loader runs)."""
    from .registry import get_loader

    return {e.type_key: get_loader(e.type_key) for e in d.entries if e.type_key != LIB_KEY}


def deserialize(data: "bytes | memoryview | DecodedBlob", lib: "Module | None", where: str = "module blob") -> "Module":
    """Rebuild the module tree from blob bytes.

    Parameters
    ----------
    data : bytes or DecodedBlob
        The blob (without the 8-byte header), or its :func:`decode` result.
    lib : Module or None
        The loaded library; every ``_lib`` entry becomes this one module.
    where : str
        Names the source in error messages.

    Returns
    -------
    Module
        Entry 0, the root.

    Raises
    ------
    LoaderNotFoundError
        If a type key has no loader (names the key and the available loaders).
    FormatError
        On a malformed blob or a loader that fails to parse its payload.
    """
    d = data if isinstance(data, DecodedBlob) else decode(data, where)
    # Resolve every loader before running any, so a missing one fails fast and cleanly.
    loaders = resolve_loaders(d)
    modules: list[Module] = []
    for i, e in enumerate(d.entries):
        if e.type_key == LIB_KEY:
            if lib is None:
                raise FormatError(f"{where}: entry {i} is '_lib' but no library is available")
            modules.append(lib)
            continue
        try:
            m = loaders[e.type_key](e.payload)
        except (LoaderNotFoundError, FormatError):
            raise
        except KilnError:
            raise
        except Exception as err:  # noqa: BLE001 - a loader choking on bad bytes is a format problem
            raise FormatError(
                f"{where}: loader 'loadbinary_{e.type_key}' failed on entry {i} at offset {e.offset}: "
                f"{type(err).__name__}: {err}"
            ) from err
        from .module import Module as _Module

        if not isinstance(m, _Module):
            raise FormatError(f"{where}: loader 'loadbinary_{e.type_key}' returned {type(m).__name__}, not a Module")
        modules.append(m)
    for i, m in enumerate(modules):
        for c in d.children(i):
            child = modules[c]
            # Several "_lib" entries are one library: drop the library importing itself and
            # repeated edges that only arise from that merge.
            if m is lib and (child is lib or any(x is child for x in m.imported_modules)):
                continue
            m.import_module(child)
    return modules[0]
