"""The fast export path: blob written as an ELF object, crt object reuse, gold + input build id.

Every library the fast path writes must hold exactly the section bytes the assembler path
(``devc.S`` + ``.incbin``, still used for custom ``fcompile`` functions) writes, load and run
the same, and be readable by ``kiln inspect``.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
import kiln.runtime as rt
from kiln.contrib import cc as contrib_cc
from kiln.ir import Graph
from kiln.runtime import blob, cc, elf_object, export, registry
from kiln.runtime.binary import Writer
from kiln.runtime.elf import ElfFile
from kiln.runtime.errors import InputError, KilnError
from kiln.runtime.executor_factory import ExecutorFactoryModule
from kiln.runtime.module import Module
from kiln.runtime.params import save_param_dict, save_param_dict_chunks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF libraries only")

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t alpha(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


class Payload(Module):
    """A serializable module with a fixed payload (no loader needed to inspect the section)."""

    type_key = "test_fast_export_payload"

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data

    def save_to_binary(self) -> bytes:
        return self.data


@pytest.fixture(autouse=True)
def payload_loader():
    registry.register_loader(Payload.type_key, lambda p: Payload(bytes(p)), override=True)
    yield
    registry.remove_global_func("loadbinary_" + Payload.type_key)


def tree(payload: bytes) -> Module:
    root = rt.csource_module(KERNEL, ["alpha"])
    root.import_module(Payload(payload))
    return root


def symbols(path: str) -> dict[str, tuple[int, int, str, int]]:
    """name -> (info, other, section name, size) from .symtab, parsed by hand."""
    e = ElfFile(path)
    tab = next(s for s in e.sections if s.name == ".symtab")
    data = e.section_data(tab) or b""
    names = e.section_data(e.sections[tab.link]) or b""
    out = {}
    for off in range(0, len(data), 24):
        name, info, other, shndx, _value, size = struct.unpack_from("<IBBHQQ", data, off)
        if name:
            out[names[name:names.index(b"\0", name)].decode()] = (info, other, e.sections[shndx].name, size)
    return out


def section_align(path: str, name: str) -> tuple[int, int, int]:
    """(type, flags, addralign) of a section."""
    with open(path, "rb") as f:
        raw = f.read()
    shoff, = struct.unpack_from("<Q", raw, 40)
    e = ElfFile(path)
    i = next(k for k, s in enumerate(e.sections) if s.name == name)
    _n, typ, flags, _a, _o, _s, _l, _i, align, _e = struct.unpack_from("<IIQQQQIIQQ", raw, shoff + 64 * i)
    return typ, flags, align


def build_id(path: str) -> bytes | None:
    data = ElfFile(path).section_data(".note.gnu.build-id")
    if data is None:
        return None
    namesz, descsz, _ = struct.unpack_from("<III", data, 0)
    start = 12 + ((namesz + 3) & ~3)
    return data[start:start + descsz]


# ------------------------------------------------------------------------------------
# the object writer
# ------------------------------------------------------------------------------------
def host_header() -> elf_object.ObjectHeader:
    hdr = elf_object.read_object_header(cc.compile_object_cached(rt.crt_source_path()))
    if not hdr.writable:
        pytest.skip(f"host objects are not ELF64 LE on a supported machine ({hdr})")
    return hdr


def test_object_matches_what_the_assembler_makes(tmp_path):
    packed = blob.pack(b"hello blob" * 7)
    pieces = [packed[:5], memoryview(packed)[5:40], bytearray(packed[40:])]
    ours = str(tmp_path / "ours.o")
    size = elf_object.write_data_object(ours, pieces, blob.SECTION_NAME, blob.SYMBOL_NAME, host_header())
    assert size == len(packed)

    ws = tmp_path / "ws"
    ws.mkdir()
    _, asm = export._write_blob_files(str(ws), packed)
    theirs = str(tmp_path / "theirs.o")
    subprocess.run([*cc.get_cc().split(), "-c", asm, "-o", theirs], check=True)

    for p in (ours, theirs):
        e = ElfFile(p)
        assert e.e_type == 1  # ET_REL
        assert e.section_data(blob.SECTION_NAME) == packed
        assert e.find_section(".note.GNU-stack") is not None
    assert ElfFile(ours).e_machine == ElfFile(theirs).e_machine
    assert section_align(ours, blob.SECTION_NAME) == section_align(theirs, blob.SECTION_NAME) == (1, 0x2, 8)
    assert symbols(ours)[blob.SYMBOL_NAME] == symbols(theirs)[blob.SYMBOL_NAME]
    info, other, section, sym_size = symbols(ours)[blob.SYMBOL_NAME]
    assert (info >> 4, info & 0xF, other, sym_size) == (1, 1, 0, len(packed))  # GLOBAL OBJECT DEFAULT
    assert section == blob.SECTION_NAME


def test_unsupported_targets_are_refused(tmp_path):
    for hdr in (elf_object.ObjectHeader(machine=3, elf_class=1),  # i386, ELF32
                elf_object.ObjectHeader(machine=elf_object.EM_AARCH64, data=2),  # big-endian
                elf_object.ObjectHeader(machine=21)):  # ppc64: not known to work
        assert not hdr.writable
        with pytest.raises(InputError, match="unsupported target"):
            elf_object.write_data_object(str(tmp_path / "x.o"), [b"x"], ".s", "sym", hdr)


# ------------------------------------------------------------------------------------
# serialization in pieces
# ------------------------------------------------------------------------------------
def test_pieces_concatenate_to_the_documented_bytes():
    params = {"w": np.arange(12, dtype="float32").reshape(3, 4), "s": np.float64(2.5),
              "e": np.zeros((0, 3), "int8"), "h": rt.ndarray.array(np.ones(5, "float16"))}
    assert b"".join(save_param_dict_chunks(params)) == save_param_dict(params)

    g = Graph("g")
    g.outputs = [g.add("add", g.add_input("a", (3, 4)), g.add_input("w", (3, 4)))]
    factory = kiln.build(g, target="c", params={"w": params["w"]})
    whole = factory.save_to_binary()
    assert b"".join(factory.save_to_binary_chunks()) == whole
    assert b"".join(blob.serialize_chunks(factory)) == blob.serialize(factory)
    # The payload sits in the blob byte for byte, after its type key and length.
    key = factory.type_key.encode()
    s = blob.serialize(factory)
    at = s.index(key) + len(key)
    assert int.from_bytes(s[at:at + 8], "little") == len(whole) and s[at + 8:at + 8 + len(whole)] == whole
    assert b"".join(blob.pack_chunks(blob.serialize_chunks(factory))) == blob.pack(s)


def test_writer_counts_bytes():
    w = Writer()
    w.u64(1)
    w.raw(memoryview(np.zeros((2, 3), "float32")))
    w.string("ab")
    w.u64_vector([1, 2, 3])
    assert w.nbytes == len(w.getvalue()) == 8 + 24 + 10 + 32


def test_subclass_overriding_save_to_binary_alone_is_serialized_by_it():
    class Custom(ExecutorFactoryModule):
        def save_to_binary(self) -> bytes:
            return b"custom bytes"

    g = Graph("g")
    g.outputs = [g.add("add", g.add_input("a", (2,)), g.add_input("b", (2,)))]
    lib = kiln.build(g, target="c").get_lib()
    f = Custom(kiln.build(g, target="c").get_graph_json(), lib)
    assert b"custom bytes" in blob.serialize(f)


def test_bad_chunk_type_is_reported():
    class Bad(Payload):
        def save_to_binary_chunks(self):
            return [b"ok", "not bytes"]

    root = rt.csource_module(KERNEL, ["alpha"])
    root.import_module(Bad(b""))
    with pytest.raises(KilnError, match=r"Bad.save_to_binary_chunks\(\) yielded str, expected bytes"):
        blob.serialize(root)


# ------------------------------------------------------------------------------------
# crt object and linker
# ------------------------------------------------------------------------------------
def test_crt_object_is_compiled_once_per_options():
    a = cc.compile_object_cached(rt.crt_source_path())
    assert cc.compile_object_cached(rt.crt_source_path()) == a and os.path.isfile(a)
    b = cc.compile_object_cached(rt.crt_source_path(), ["-O1"])
    assert b != a and os.path.isfile(b)
    with pytest.raises(rt.CompileError):
        cc.compile_object_cached(rt.crt_source_path(), ["-DKILN_TEST_X=(", "-include", "no/such/header.h"])


def test_workspace_holds_the_blob_object_only(tmp_path):
    ws = tmp_path / "ws"
    tree(b"payload").export_library(str(tmp_path / "t.so"), workspace_dir=str(ws))
    names = sorted(os.listdir(ws))
    if elf_object.read_object_header(cc.compile_object_cached(rt.crt_source_path())).writable:
        assert names == ["devc.o", "lib0.c"]
    else:  # pragma: no cover - other hosts keep the assembler path
        assert names == ["devc.S", "devc.blob", "lib0.c"]


@pytest.mark.parametrize("linker", ["auto", "kiln-no-such-linker"])
def test_large_blob_link_path(tmp_path, monkeypatch, linker):
    """Gold (or a failing linker, then the default one) with a build id hashed from the inputs."""
    monkeypatch.setattr(export, "_FAST_LINK_MIN_BYTES", 0)  # exercise the large-blob path cheaply
    if linker != "auto":
        monkeypatch.setattr(cc, "fast_linker", lambda cc=None: linker)
    root = tree(os.urandom(4096))
    a = root.export_library(str(tmp_path / "a.so"))
    b = root.export_library(str(tmp_path / "b.so"))
    assert open(a, "rb").read() == open(b, "rb").read()  # reproducible, build id included
    bid = build_id(a)
    assert bid is not None and len(bid) == 20 and bid != bytes(20)
    other = tree(os.urandom(4096)).export_library(str(tmp_path / "c.so"))
    assert build_id(other) != bid
    assert rt.load_module(a).imported_modules[0].data == root.imported_modules[0].data


def test_linker_options_keep_the_default_link(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_FAST_LINK_MIN_BYTES", 0)
    seen = []
    real = cc.create_shared
    monkeypatch.setattr(cc, "create_shared", lambda *a, **k: (seen.append(k), real(*a, **k))[1])
    tree(b"x" * 64).export_library(str(tmp_path / "a.so"), options=["-Wl,--build-id=sha1"])
    assert seen[-1].get("linker") is None
    assert not any("--build-id=0x" in o for o in seen[-1]["options"])


# ------------------------------------------------------------------------------------
# a model, both paths
# ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """An LLVM-compiled model whose weights (17 MiB) take the large-blob path."""
    d = tmp_path_factory.mktemp("fast_export")
    shape = (1088, 4096)
    g = Graph("big")
    g.outputs = [g.add("add", g.add_input("a", shape), g.add_input("w", shape))]
    w = np.random.default_rng(0).standard_normal(shape).astype("float32")
    factory = kiln.build(g, target="llvm", params={"w": w})
    fast = factory.export_library(str(d / "fast.so"))
    # A custom fcompile gets the plain inputs: crt source and devc.S (the assembler path).
    slow = factory.export_library(str(d / "slow.so"), fcompile=contrib_cc.cross_compiler(cc.get_cc()))
    return factory, w, fast, slow


def test_model_section_bytes_are_identical(model):
    factory, _, fast, slow = model
    sec_fast = ElfFile(fast).section_data(blob.SECTION_NAME)
    sec_slow = ElfFile(slow).section_data(blob.SECTION_NAME)
    assert len(sec_fast) > export._FAST_LINK_MIN_BYTES
    assert sec_fast == sec_slow == blob.pack(blob.serialize(factory))
    assert symbols_dyn(fast) == symbols_dyn(slow)


def symbols_dyn(path: str) -> tuple[int, int]:
    """(info, size) of the blob symbol in .dynsym."""
    e = ElfFile(path)
    tab = next(s for s in e.sections if s.name == ".dynsym")
    data = e.section_data(tab) or b""
    names = e.section_data(e.sections[tab.link]) or b""
    for off in range(0, len(data), 24):
        name, info, _other, _shndx, _value, size = struct.unpack_from("<IBBHQQ", data, off)
        if names[name:].split(b"\0", 1)[0] == blob.SYMBOL_NAME.encode():
            return info, size
    raise AssertionError("blob symbol not exported")


def test_model_loads_and_runs_the_same(model):
    _, w, fast, slow = model
    x = np.random.default_rng(1).standard_normal(w.shape).astype("float32")
    outs = []
    for path in (fast, slow):
        m = kiln.GraphModule(rt.load_module(path)["default"](kiln.cpu()))
        m.run(a=x)
        outs.append(m.get_output(0).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], x + w, rtol=1e-6)


def test_model_is_reproducible_and_has_a_build_id(model, tmp_path):
    factory, _, fast, _ = model
    again = factory.export_library(str(tmp_path / "again.so"))
    assert open(again, "rb").read() == open(fast, "rb").read()
    assert build_id(fast) not in (None, bytes(20))


def test_inspect_reads_the_fast_library(model):
    _, _, fast, _ = model
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "inspect", fast, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "GraphExecutorFactory" in proc.stdout


def test_tar_member_named_like_the_blob_object(tmp_path):
    """Loading a .tar regenerates the blob object in its own directory, never over a member."""
    src = tmp_path / "addon.c"
    src.write_text(KERNEL.replace("alpha", "addon_fn"))
    addon = tmp_path / "devc.o"
    subprocess.run([*cc.get_cc().split(), "-fPIC", "-I", rt.include_path(), "-c", str(src), "-o", str(addon)],
                   check=True)
    root = tree(b"payload bytes")
    tar = root.export_library(str(tmp_path / "t.tar"), addons=[str(addon)])
    m = rt.load_module(tar)
    m["addon_fn"]()  # the addon object was linked, not replaced by the blob object
    assert m.imported_modules[0].data == b"payload bytes"
