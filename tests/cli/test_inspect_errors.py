"""Bad files give ``kiln inspect`` the same one-line error as ``load_module`` -- no traceback.

Also: ``kiln run --compare`` reports ONNX Runtime's own refusal of the inputs on one line.
"""

from __future__ import annotations

import gzip
import json
import struct

import pytest

import kiln.runtime as rt
from kiln.runtime import blob as _blob
from kiln.runtime.errors import FormatError
from tests.cli.cli_support import assert_user_error, kiln
from tests.fuzz.fuzz_support import CORPUS_DIR
from tests.runtime.tar_support import read_members, write_tar

MODEL_TAR = CORPUS_DIR / "tar" / "c_model.tar"
KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t alpha(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


def _with_factory_payload(path, edit) -> str:
    """The model archive with its GraphExecutorFactory payload replaced by ``edit(payload)``."""
    members = read_members(MODEL_TAR)
    raw = bytes(_blob.unpack(members["devc.blob"]))
    entry = next(e for e in _blob.decode(raw).entries if e.type_key == "GraphExecutorFactory")
    old = bytes(entry.payload)
    at = raw.index(struct.pack("<Q", len(old)) + old)
    new = edit(old)
    raw = raw[:at] + struct.pack("<Q", len(new)) + new + raw[at + 8 + len(old):]
    members["devc.blob"] = _blob.pack(raw)
    return write_tar(path, members)


def _with_graph_json(path, graph_json: bytes) -> str:
    """The model archive with its GraphExecutorFactory graph JSON replaced by ``graph_json``."""

    def edit(old: bytes) -> bytes:
        (n,) = struct.unpack_from("<Q", old, 0)
        return struct.pack("<Q", len(graph_json)) + graph_json + old[8 + n:]

    return _with_factory_payload(path, edit)


def _bad_files(d) -> dict[str, str]:
    so = rt.csource_module(KERNEL, ["alpha"]).export_library(str(d / "good.so"))
    data = open(so, "rb").read()
    files = {}
    (d / "garbage.so").write_bytes(bytes(range(256)) * 8)
    files["garbage"] = str(d / "garbage.so")
    (d / "empty.so").write_bytes(b"")
    files["empty"] = str(d / "empty.so")
    (d / "truncated.so").write_bytes(data[: len(data) // 2])
    files["truncated"] = str(d / "truncated.so")
    flipped = bytearray(data)
    flipped[200] ^= 0xFF
    (d / "flipped.so").write_bytes(bytes(flipped))
    files["flipped"] = str(d / "flipped.so")
    (d / "gz.tar").write_bytes(gzip.compress(MODEL_TAR.read_bytes(), mtime=0))
    files["gzip"] = str(d / "gz.tar")
    members = read_members(MODEL_TAR)
    man = json.loads(members["kiln_manifest.json"])
    man["options"] = ["-O2", "-Wl,-Map=/tmp/kiln_map.txt"]
    members["kiln_manifest.json"] = json.dumps(man).encode()
    files["option"] = write_tar(d / "option.tar", members)
    files["utf8"] = _with_graph_json(d / "utf8.tar", b'{"nodes": "\xff\xfe"}')
    files["nesting"] = _with_graph_json(d / "nesting.tar", b"[" * 100_000 + b"]" * 100_000)
    # bytes after the params: the factory's loader refuses them, so inspect (which parses the
    # payload with that loader's parser) must too
    files["trailing"] = _with_factory_payload(d / "trailing.tar", lambda old: old + b"junk")
    return files


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    return _bad_files(tmp_path_factory.mktemp("bad"))


CASES = ["garbage", "empty", "truncated", "flipped", "gzip", "option", "utf8", "nesting", "trailing"]


@pytest.mark.parametrize("case", CASES)
def test_inspect_and_load_module_reject_the_same_files(bad_files, case):
    path = bad_files[case]
    with pytest.raises(FormatError):
        rt.load_module(path)
    proc = kiln("inspect", path)
    assert_user_error(proc, path)


def test_compare_reports_an_onnxruntime_refusal_on_one_line(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tests.cli.cli_support import tiny_model

    lib = str(tmp_path / "tiny.so")
    proc = kiln("build", tiny_model(str(tmp_path / "b1.onnx")), "-o", lib, "-q")
    assert proc.returncode == 0, proc.stderr
    other = tiny_model(str(tmp_path / "b2.onnx"), batch=2)  # ORT wants x of shape (2, 3, 8, 8)
    proc = kiln("run", lib, "--compare", other)
    assert_user_error(proc, "--compare", "onnxruntime rejected the inputs", "b2.onnx")


CONSTRUCTOR = r"""
#include <stdio.h>
#include <kiln/c_runtime_api.h>
__attribute__((constructor)) static void kiln_test_ran(void) {
  FILE* f = fopen("%s", "w");
  if (f) fclose(f);
}
KILN_DLL int32_t alpha(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


@pytest.mark.parametrize("ext", ["so", "tar"])
def test_inspect_never_runs_library_code(tmp_path, ext):
    """A library's constructor runs at load (that is the trust model); inspect must not load it."""
    marker = tmp_path / "constructor_ran"
    lib = rt.csource_module(CONSTRUCTOR % marker, ["alpha"]).export_library(str(tmp_path / f"ctor.{ext}"))
    proc = kiln("inspect", lib)
    assert proc.returncode == 0, proc.stderr
    assert "alpha" in proc.stdout and not marker.exists()
    rt.load_module(lib)
    assert marker.exists()  # the same file does run code when loaded
