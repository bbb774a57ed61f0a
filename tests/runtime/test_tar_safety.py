"""The ``.tar`` trust boundary: uncompressed archives only, caps before extraction, and an
allow-list for the compiler options a manifest may carry (``docs/security.md``)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

import kiln.runtime as rt
from kiln.contrib.tar import untar
from kiln.runtime.errors import FormatError, InputError
from kiln.runtime.tar_manifest import is_allowed_option
from tests.runtime.tar_support import write_tar

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t seven(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


def _library_tar(path, options: list[str]) -> str:
    """A loadable one-kernel archive whose manifest records ``options``."""
    man = {"format": "kiln-library-tar", "version": 1, "modules": [{"file": "lib0.c", "type_key": "c"}],
           "crt": "kiln_crt.c", "blob": None, "addons": [], "options": options}
    with open(rt.crt_source_path(), "rb") as f:
        crt = f.read()
    return write_tar(path, {"lib0.c": KERNEL.encode(), "kiln_crt.c": crt,
                            "kiln_manifest.json": json.dumps(man).encode()})


# ------------------------------------------------------------------ compression and caps
def test_gzip_bomb_is_refused_before_decompression(tmp_path):
    # 64 MiB of zeros compresses to ~64 KiB: "r:*" used to inflate it all onto the disk.
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 64 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    bomb = tmp_path / "bomb.tar"
    bomb.write_bytes(gzip.compress(inner.getvalue(), compresslevel=1, mtime=0))
    assert bomb.stat().st_size < 1 << 20
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(FormatError, match="gzip-compressed"):
        untar(bomb, out)
    assert list(out.iterdir()) == []
    with pytest.raises(FormatError, match="gzip-compressed"):
        rt.load_module(str(bomb))


def test_member_count_cap_is_enforced_before_extraction(tmp_path, monkeypatch):
    arch = write_tar(tmp_path / "many.tar", {f"f{i}.c": b"x" for i in range(6)})
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("KILN_TAR_MAX_MEMBERS", "5")
    with pytest.raises(FormatError, match="more than 5 members.*KILN_TAR_MAX_MEMBERS"):
        untar(arch, out)
    assert list(out.iterdir()) == []
    monkeypatch.setenv("KILN_TAR_MAX_MEMBERS", "6")
    assert len(untar(arch, out)) == 6


def test_total_size_cap_is_enforced_before_extraction(tmp_path, monkeypatch):
    arch = write_tar(tmp_path / "big.tar", {"a.c": b"a" * 600, "b.c": b"b" * 600})
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("KILN_TAR_MAX_BYTES", "1000")
    with pytest.raises(FormatError, match="more than 1000 bytes.*KILN_TAR_MAX_BYTES"):
        untar(arch, out)
    assert list(out.iterdir()) == []  # the first member fit, but nothing was written
    monkeypatch.setenv("KILN_TAR_MAX_BYTES", "not-a-number")
    with pytest.raises(InputError, match="KILN_TAR_MAX_BYTES"):
        untar(arch, out)


def test_duplicate_and_sparse_members_are_refused(tmp_path):
    dup = tmp_path / "dup.tar"
    with tarfile.open(dup, "w") as tf:
        for data in (b"first", b"second"):
            info = tarfile.TarInfo("a.c")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(FormatError, match="appears twice"):
        untar(dup, tmp_path)
    sparse = tmp_path / "sparse.tar"
    with tarfile.open(sparse, "w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("s.bin")
        info.type = tarfile.GNUTYPE_SPARSE
        tf.addfile(info)
    with pytest.raises(FormatError, match="sparse|not a regular file"):
        untar(sparse, tmp_path)


def test_non_ustar_file_is_not_a_tar(tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\0" * 2048)
    with pytest.raises(FormatError, match="ustar"):
        rt.load_module(str(junk))


# ------------------------------------------------------------------ compiler options
def test_option_allow_list():
    for ok in ["-O0", "-O3", "-Os", "-Ofast", "-march=native", "-mcpu=cortex-a72", "-mtune=znver3", "-mavx2",
               "-mno-avx512f", "-ffp-contract=fast", "-fno-math-errno", "-fopenmp", "-DADDON_VALUE=42",
               "-DNDEBUG", "-UFOO", "-lm", "-lpthread", "-g", "-w", "-Wall", "-Wno-unused-function",
               "-std=gnu11", "-pthread"]:
        assert is_allowed_option(ok), ok
    for bad in ["-Wl,-Map=/tmp/m", "-Wa,-adhln=/tmp/x", "-Wp,-MD,/tmp/d", "-MD", "-MF", "-MMD", "-o", "@/etc/passwd",
                "-B/tmp", "-specs=/tmp/s", "-fplugin=/tmp/p.so", "-fdump-tree-all", "-fprofile-generate=/tmp",
                "-I/etc", "-L/tmp", "-include", "/etc/passwd", "--sysroot=/", "-Xlinker", "-save-temps",
                "-DX=$(id)", "-D X", "-lfoo", "-march=../../x", "-x", "", "-", "lib0.c"]:
        assert not is_allowed_option(bad), bad


@pytest.mark.parametrize("options,name", [
    (["-Wl,-Map={out}/map.txt"], "-Wl,-Map="),
    (["-MD", "-MF", "{out}/deps.d"], "-MD"),
    (["@{secret}"], "@"),
])
def test_manifest_options_that_write_or_read_files_are_refused(tmp_path, options, name):
    out = tmp_path / "outside"
    out.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT\n")
    opts = [o.format(out=out, secret=secret) for o in options]
    arch = _library_tar(tmp_path / "lib.tar", opts)
    with pytest.raises(FormatError, match="is not allowed in a .tar library") as exc:
        rt.load_module(arch)
    assert name in str(exc.value)
    assert "TOP-SECRET" not in str(exc.value)
    assert list(out.iterdir()) == []  # before the allow-list, the map / dep file appeared here


def test_allowed_options_still_compile_and_load(tmp_path):
    mod = rt.load_module(_library_tar(tmp_path / "ok.tar", ["-O1", "-DKILN_TEST=1", "-Wall"]))
    assert mod.get_function("seven") is not None


def test_export_refuses_options_a_loader_would_refuse(tmp_path):
    mod = rt.csource_module(KERNEL, ["seven"])
    with pytest.raises(InputError, match="-Wl,-z,now"):
        mod.export_library(str(tmp_path / "x.tar"), options=["-Wl,-z,now"])
    assert not (tmp_path / "x.tar").exists()
    mod.export_library(str(tmp_path / "x.so"), options=["-Wl,-z,now"])  # a .so is linked here, by you


@pytest.mark.parametrize("field,value,match", [
    ("crt", "-o", "invalid file name"),
    ("crt", "../kiln_crt.c", "invalid file name"),
    ("addons", ["script.ld"], "must end in one of"),
    ("modules", [{"file": "lib0.txt"}], "must end in one of"),
])
def test_manifest_file_names_are_checked(tmp_path, field, value, match):
    arch = _library_tar(tmp_path / "lib.tar", [])
    with tarfile.open(arch) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
    man = json.loads(members["kiln_manifest.json"])
    man[field] = value
    members["kiln_manifest.json"] = json.dumps(man).encode()
    with pytest.raises(FormatError, match=match):
        rt.load_module(write_tar(tmp_path / "bad.tar", members))


def _with_size_field(src: str, dst, field: bytes) -> str:
    """``src`` with the first member's 12-byte size field replaced and its checksum fixed."""
    buf = bytearray(open(src, "rb").read())
    buf[124:136] = field
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % (sum(buf[:512]) & 0o777777)
    with open(dst, "wb") as f:
        f.write(bytes(buf))
    return str(dst)


@pytest.mark.parametrize("field", [b"77777777777\0", b"\x80" + b"\xff" * 11], ids=["octal-8GiB", "base256-huge"])
def test_member_size_past_the_end_is_a_format_error(tmp_path, field):
    # Found by tests/fuzz/test_fuzz_tar.py: a huge size made tarfile raise a bare ValueError.
    arch = _with_size_field(write_tar(tmp_path / "a.tar", {"a.c": b"x", "b.c": b"y"}), tmp_path / "big.tar", field)
    with pytest.raises(FormatError, match="past the end of the archive|not a valid tar archive"):
        untar(arch, tmp_path)
