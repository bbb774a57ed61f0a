"""Module blob: grouping, byte layout, and exact tree restoration through export/load."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import pytest

import kiln.runtime as rt
from kiln.runtime import blob
from kiln.runtime.elf import ElfFile

# Test-only serializable module types; the same source is exec'd in subprocesses so that
# their loaders exist there too.
TESTMODS = textwrap.dedent(
    """
    import json
    from kiln.runtime.module import Module
    from kiln.runtime.registry import register_loader

    class ConstModule(Module):
        type_key = "test_const"

        def __init__(self, name, value):
            super().__init__()
            self.name, self.value = name, value

        def _get_local_function(self, fname):
            return (lambda: self.value) if fname == "get_" + self.name else None

        def save_to_binary(self):
            return json.dumps([self.name, self.value]).encode()

    class TagModule(ConstModule):
        type_key = "test_tag"

    register_loader("test_const", lambda p: ConstModule(*json.loads(bytes(p))), override=True)
    register_loader("test_tag", lambda p: TagModule(*json.loads(bytes(p))), override=True)
    """
)
_ns: dict = {}
exec(TESTMODS, _ns)
ConstModule, TagModule = _ns["ConstModule"], _ns["TagModule"]

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t NAME(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  rv->v_int64 = VALUE;
  *rc = kKilnArgInt;
  return 0;
}
"""


def kernel(name: str, value: int) -> rt.CSourceModule:
    return rt.csource_module(KERNEL.replace("NAME", name).replace("VALUE", str(value)), [name])


def make_tree():
    """lib(c: k_root) -> [A(test_const), B(test_tag)]; A -> C(test_const)."""
    root = kernel("k_root", 7)
    a, b, c = ConstModule("a", 1), TagModule("b", 2), ConstModule("c", 3)
    root.import_module(a)
    root.import_module(b)
    a.import_module(c)
    return root, a, b, c


def u64(*v: int) -> bytes:
    return struct.pack(f"<{len(v)}Q", *v)


def s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return u64(len(b)) + b


def expected_tree_blob(a, b, c) -> bytes:
    # Entries in DFS order: 0 _lib, 1 A, 2 C (A's child, visited before B), 3 B.
    return b"".join(
        [
            u64(5),  # 4 modules + the _import_tree entry
            s("_lib"),
            s("test_const") + s(a.save_to_binary()),
            s("test_const") + s(c.save_to_binary()),
            s("test_tag") + s(b.save_to_binary()),
            s("_import_tree"),
            u64(5, 0, 2, 3, 3, 3),  # row_ptr: 0 -> {1, 3}, 1 -> {2}
            u64(3, 1, 3, 2),  # child_indices
        ]
    )


def test_serialize_layout_byte_by_byte():
    root, a, b, c = make_tree()
    data = blob.serialize(root)
    assert data == expected_tree_blob(a, b, c)
    d = blob.decode(data)
    assert [e.type_key for e in d.entries] == ["_lib", "test_const", "test_const", "test_tag"]
    assert d.row_ptr == [0, 2, 3, 3, 3] and d.child_indices == [1, 3, 2]
    assert blob.unpack(blob.pack(data)).tobytes() == data
    assert blob.pack(data)[:8] == u64(len(data))


def test_deserialize_without_library_code():
    root, a, b, c = make_tree()
    lib = ConstModule("lib", 0)  # stands in for the loaded library
    r = blob.deserialize(blob.serialize(root), lib)
    assert r is lib
    ra, rb = r.imported_modules
    assert (ra.type_key, ra.value, rb.type_key, rb.value) == ("test_const", 1, "test_tag", 2)
    (rc,) = ra.imported_modules
    assert rc.value == 3 and rc.imported_modules == [] and rb.imported_modules == []


def test_single_dso_group_has_no_blob():
    x, y = kernel("kx", 1), kernel("ky", 2)
    x.import_module(y)
    y.import_module(x)  # cycle
    g = blob.group_modules(x)
    assert g.groups == [[x, y]] and g.is_dso == [True] and not g.needs_blob
    assert blob.serialize(x) is None


def test_non_dso_root_and_shared_children():
    # factory-like root importing the code and a shared child twice (diamond).
    root = ConstModule("root", 0)
    code = kernel("k", 1)
    shared = TagModule("s", 5)
    root.import_module(code)
    root.import_module(shared)
    code.import_module(shared)
    g = blob.group_modules(root)
    assert [len(x) for x in g.groups] == [1, 1, 1] and g.is_dso == [False, True, False]
    assert g.row_ptr == [0, 2, 3, 3] and g.child_indices == [1, 2, 2]
    lib = ConstModule("lib", 0)
    r = blob.deserialize(blob.serialize(root), lib)
    assert r.type_key == "test_const" and r.imported_modules[0] is lib
    assert r.imported_modules[1] is lib.imported_modules[0]  # one object, not two copies


LOAD_TREE = TESTMODS + textwrap.dedent(
    """
    import sys
    import kiln.runtime as rt
    m = rt.load_module(sys.argv[1])
    assert m.type_key == "library", m.type_key
    a, b = m.imported_modules
    (c,) = a.imported_modules
    assert [a.type_key, b.type_key, c.type_key] == ["test_const", "test_tag", "test_const"]
    assert (a.name, a.value, b.name, b.value, c.name, c.value) == ("a", 1, "b", 2, "c", 3)
    assert b.imported_modules == [] and c.imported_modules == []
    assert m["k_root"]() == 7
    assert m.get_function("get_c", query_imports=True)() == 3
    print("TREE OK")
    """
)


@pytest.fixture(scope="module")
def tree_so(tmp_path_factory):
    root, a, b, c = make_tree()
    path = str(tmp_path_factory.mktemp("blob") / "tree.so")
    root.export_library(path)
    return path, (a, b, c)


def test_export_load_restores_tree_in_fresh_process(tree_so):
    path, _ = tree_so
    proc = subprocess.run([sys.executable, "-c", LOAD_TREE, path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "TREE OK" in proc.stdout, proc.stdout + proc.stderr


def test_exported_section_holds_documented_bytes(tree_so):
    path, (a, b, c) = tree_so
    elf = ElfFile(path)
    sec = elf.section_data(".kiln_mblob")
    want = expected_tree_blob(a, b, c)
    assert sec[:8] == u64(len(want)) and sec[8 : 8 + len(want)] == want
    assert "k_root" in elf.exported_functions()


def test_tar_restores_tree(tmp_path):
    root, *_ = make_tree()
    path = root.export_library(str(tmp_path / "tree.tar"))
    proc = subprocess.run([sys.executable, "-c", LOAD_TREE, path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "TREE OK" in proc.stdout, proc.stdout + proc.stderr


def test_mutually_importing_dso_modules_become_one_library(tmp_path):
    x, y = kernel("kx", 11), kernel("ky", 22)
    x.import_module(y)
    y.import_module(x)
    path = x.export_library(str(tmp_path / "two.so"))
    assert ElfFile(path).find_section(".kiln_mblob") is None
    m = rt.load_module(path)
    assert m.type_key == "library" and m.imported_modules == []
    assert m["kx"]() == 11 and m["ky"]() == 22


def test_section_headers_stripped_falls_back_to_symbol(tree_so, tmp_path):
    path, _ = tree_so
    from kiln.runtime.digest import TRAILER_MAGIC, TRAILER_SIZE

    data = bytearray(open(path, "rb").read())
    if data.endswith(TRAILER_MAGIC):  # sstrip drops what follows the last segment: the digest too
        del data[-TRAILER_SIZE:]
    data[40:48] = bytes(8)  # e_shoff = 0: no section table, as after `sstrip`
    data[60:64] = bytes(4)  # e_shnum = e_shstrndx = 0
    stripped = tmp_path / "stripped.so"
    stripped.write_bytes(bytes(data))
    assert ElfFile(str(stripped)).sections == []
    m = rt.load_module(str(stripped))
    a, b = m.imported_modules
    assert (a.type_key, b.type_key, a.imported_modules[0].value) == ("test_const", "test_tag", 3)
    assert m["k_root"]() == 7
