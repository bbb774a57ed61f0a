"""Every malformed input gives a Kiln exception with a clear message, never a crash."""

from __future__ import annotations

import json
import os
import random
import shutil
import struct

import pytest

import kiln.runtime as rt
from kiln.contrib import cc
from kiln.runtime import blob, registry
from kiln.runtime.errors import FormatError, KilnFileNotFoundError, LoaderNotFoundError
from kiln.runtime.module import Module
from tests.runtime.tar_support import write_tar

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t seven(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  rv->v_int64 = 7; *rc = kKilnArgInt; return 0;
}
"""


class Payload(Module):
    type_key = "test_err_payload"

    def __init__(self, data: bytes = b"xyz"):
        super().__init__()
        self.data = data

    def save_to_binary(self) -> bytes:
        return self.data


def u64(*v: int) -> bytes:
    return struct.pack(f"<{len(v)}Q", *v)


def s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return u64(len(b)) + b


def good_blob() -> bytes:
    # _lib -> [payload]
    return u64(3) + s("_lib") + s("test_err_payload") + s(b"xyz") + s("_import_tree") + u64(3, 0, 1, 1) + u64(1, 1)


@pytest.fixture(autouse=True)
def payload_loader():
    registry.register_loader("test_err_payload", lambda p: Payload(bytes(p)), override=True)
    yield
    registry.remove_global_func("loadbinary_test_err_payload")


def library_with_section(tmp_path, content: bytes, name: str = "lib.so") -> str:
    """Link a library whose .kiln_mblob section holds exactly ``content``."""
    from kiln.runtime.export import _write_blob_files

    ws = tmp_path / (name + ".ws")
    ws.mkdir()
    _, asm = _write_blob_files(str(ws), content)
    src = ws / "k.c"
    src.write_text(KERNEL)
    out = str(tmp_path / name)
    cc.create_shared(out, [str(src), rt.crt_source_path(), asm])
    return out


def test_good_blob_decodes():
    d = blob.decode(good_blob())
    assert [e.type_key for e in d.entries] == ["_lib", "test_err_payload"]


@pytest.mark.parametrize("cut", [0, 4, 8, 12, 20, 30, 50, -17, -9, -1])
def test_truncated_blob(cut):
    data = good_blob()[:cut]
    with pytest.raises(FormatError, match=r"offset \d+"):
        blob.decode(data)


BAD_BLOBS = [
    (u64(2) + good_blob()[8:], r"missing _import_tree entry \(entry count 2"),
    (u64(4) + good_blob()[8:], "found as entry 2, but the entry count 4 .* wrong entry count"),
    (u64(1 << 60) + good_blob()[8:], "implausible entry count"),
    (good_blob() + b"\0", "1 unexpected trailing bytes"),
    (u64(2) + s("_lib") + s("test_err_payload") + s(b"x"), "missing _import_tree"),
    (u64(3) + s("_lib") + s("test_err_payload") + s(b"x") + s("_import_tree") + u64(2, 0, 1) + u64(1, 1),
     "row_ptr has 2 items, expected 3"),
    (u64(3) + s("_lib") + s("test_err_payload") + s(b"x") + s("_import_tree") + u64(3, 0, 1, 2) + u64(1, 1),
     "must start at 0 and end at 1"),
    (u64(3) + s("_lib") + s("test_err_payload") + s(b"x") + s("_import_tree") + u64(3, 0, 3, 2) + u64(2, 1, 0),
     "decreases at index 1"),
    (u64(3) + s("_lib") + s("test_err_payload") + s(b"x") + s("_import_tree") + u64(3, 0, 1, 1) + u64(1, 5),
     r"child_indices\[0\] = 5 is out of range"),
    (u64(3) + u64(1 << 40) + b"_lib" + bytes(64), "implausible type key length"),
    (u64(3) + s(b"\xff\xfe") + s(b"x") + bytes(64), "type key is not valid UTF-8"),
    (u64(3) + s("_lib"), "implausible entry count 3 .*truncated"),
    (u64(3) + s("_lib") + s("k") + u64(1 << 62), "payload of entry 1"),
    (u64(3) + s("_import_tree") + s("_lib") + s("x"), "found as entry 0, but the entry count 3"),
]


@pytest.mark.parametrize("data, message", BAD_BLOBS, ids=[f"case{i}" for i in range(len(BAD_BLOBS))])
def test_wrong_counts_and_bad_csr(data, message):
    with pytest.raises(FormatError, match=message):
        blob.decode(data)


def test_random_corruption_never_crashes():
    rng = random.Random(0)
    base = good_blob()
    for _ in range(2000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = bytes(data[: rng.randint(0, len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            d = blob.decode(data)
        except FormatError:
            continue
        assert len(d.row_ptr) == len(d.entries) + 1


def test_unknown_type_key_lists_loaders():
    data = good_blob().replace(b"test_err_payload", b"test_err_nothere")
    with pytest.raises(LoaderNotFoundError) as info:
        blob.deserialize(data, Payload())
    msg = str(info.value)
    assert "'test_err_nothere'" in msg and "loadbinary_test_err_nothere" in msg
    assert "test_err_payload" in msg and "GraphExecutorFactory" in msg


def test_loader_failure_is_format_error():
    registry.register_loader("test_err_payload", lambda p: 1 / 0, override=True)
    with pytest.raises(FormatError, match="loadbinary_test_err_payload.*ZeroDivisionError"):
        blob.deserialize(good_blob(), Payload())


def test_exported_library_with_unknown_loader(tmp_path):
    root = rt.csource_module(KERNEL, ["seven"])
    root.import_module(Payload(b"abc"))
    path = root.export_library(str(tmp_path / "p.so"))
    registry.remove_global_func("loadbinary_test_err_payload")
    with pytest.raises(LoaderNotFoundError, match="test_err_payload.*available loaders"):
        rt.load_module(path)
    registry.register_loader("test_err_payload", lambda p: Payload(bytes(p)), override=True)
    m = rt.load_module(path)
    assert m["seven"]() == 7 and m.imported_modules[0].data == b"abc"


def test_library_with_truncated_and_corrupt_sections(tmp_path):
    short = library_with_section(tmp_path, u64(1000) + good_blob(), "short.so")
    with pytest.raises(FormatError, match=r"declares 1000 payload bytes .*truncated"):
        rt.load_module(short)
    bad = good_blob().replace(u64(3, 0, 1, 1), u64(3, 0, 9, 1))
    corrupt = library_with_section(tmp_path, blob.pack(bad), "corrupt.so")
    with pytest.raises(FormatError, match=r"corrupt.so.*row_ptr"):
        rt.load_module(corrupt)
    tiny = library_with_section(tmp_path, b"\x01\x02", "tiny.so")
    with pytest.raises(FormatError, match="truncated: expected 8 bytes of length header, only 2 left"):
        rt.load_module(tiny)


def test_missing_file(tmp_path):
    with pytest.raises(KilnFileNotFoundError, match="no such file"):
        rt.load_module(str(tmp_path / "nope.so"))
    with pytest.raises(KilnFileNotFoundError):
        rt.load_module(str(tmp_path / "nope.tar"))


def test_non_library_files(tmp_path):
    txt = tmp_path / "x.so"
    txt.write_text("this is not a library\n")
    with pytest.raises(FormatError, match="not an ELF file"):
        rt.load_module(str(txt))
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(FormatError):
        rt.load_module(str(empty))
    with pytest.raises(FormatError, match="not a file"):
        rt.load_module(str(tmp_path))


def test_truncated_elf(tmp_path):
    real = rt.csource_module(KERNEL, ["seven"]).export_library(str(tmp_path / "real.so"))
    data = open(real, "rb").read()
    for n in (10, 64, 200, len(data) // 2):
        p = tmp_path / f"cut{n}.so"
        p.write_bytes(data[:n])
        with pytest.raises(FormatError):
            rt.load_module(str(p))
    # A well-formed ELF that is not a shared library: dlopen refuses, Kiln reports it.
    obj = tmp_path / "k.o"
    src = tmp_path / "k.c"
    src.write_text("int f(void) { return 1; }\n")
    import subprocess

    subprocess.run([cc.get_cc(), "-c", str(src), "-o", str(obj)], check=True)
    shutil.copy(obj, tmp_path / "obj.so")
    with pytest.raises(FormatError, match="cannot load as a shared library"):
        rt.load_module(str(tmp_path / "obj.so"))


def test_corrupt_tar(tmp_path):
    garbage = tmp_path / "g.tar"
    garbage.write_bytes(os.urandom(3000))
    with pytest.raises(FormatError, match="not a valid tar archive"):
        rt.load_module(str(garbage))
    no_manifest = write_tar(tmp_path / "n.tar", {"lib0.c": KERNEL.encode()})
    with pytest.raises(FormatError, match="not a Kiln library archive"):
        rt.load_module(no_manifest)
    evil = write_tar(tmp_path / "e.tar", {"../evil.c": b"x"})
    with pytest.raises(FormatError, match="unsafe member name"):
        rt.load_module(evil)
    assert not (tmp_path.parent / "evil.c").exists()
    man = {"format": "kiln-library-tar", "version": 1, "modules": [{"file": "lib0.c"}], "crt": "kiln_crt.c"}
    missing = write_tar(tmp_path / "m.tar", {"kiln_manifest.json": json.dumps(man).encode()})
    with pytest.raises(FormatError, match="does not contain it"):
        rt.load_module(missing)
    bad_json = write_tar(tmp_path / "j.tar", {"kiln_manifest.json": b"{nope"})
    with pytest.raises(FormatError, match="not valid JSON"):
        rt.load_module(bad_json)
    man["blob"] = "devc.blob"
    crt = open(rt.crt_source_path(), "rb").read()
    bad_blob = write_tar(
        tmp_path / "b.tar",
        {"kiln_manifest.json": json.dumps(man).encode(), "lib0.c": KERNEL.encode(), "kiln_crt.c": crt,
         "devc.blob": blob.pack(good_blob()[:-3])},
    )
    with pytest.raises(FormatError, match="devc.blob|module blob"):
        rt.load_module(bad_blob)
