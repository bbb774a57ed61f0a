"""The digest trailer of exported ``.so`` files: corruption is a FormatError before ``dlopen``."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

import kiln.runtime as rt
from kiln.runtime.digest import TRAILER_MAGIC, TRAILER_SIZE
from kiln.runtime.errors import FormatError

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t alpha(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("digest")
    root = rt.csource_module(KERNEL, ["alpha"])
    return root.export_library(str(d / "k.so"))


def test_export_appends_a_matching_trailer(lib):
    data = open(lib, "rb").read()
    assert data.endswith(TRAILER_MAGIC)
    image = data[:-TRAILER_SIZE]
    assert data[-TRAILER_SIZE:-TRAILER_SIZE + 32] == hashlib.sha256(image).digest()
    assert int.from_bytes(data[-16:-8], "little") == len(image)


def test_dynamic_loader_ignores_the_trailer(lib):
    # dlopen directly, bypassing Kiln: the trailing 48 bytes are invisible to ld.so.
    handle = ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    assert handle["alpha"] is not None
    assert rt.load_module(lib).get_function("alpha") is not None


def _write(path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def test_flipped_byte_is_a_format_error(lib, tmp_path):
    data = bytearray(open(lib, "rb").read())
    data[len(data) // 2] ^= 0x40
    with pytest.raises(FormatError, match="does not match its digest trailer"):
        rt.load_module(_write(tmp_path / "flip.so", bytes(data)))


def test_truncated_or_extended_file_is_a_format_error(lib, tmp_path):
    data = open(lib, "rb").read()
    with pytest.raises(FormatError, match="not a Kiln digest trailer"):
        rt.load_module(_write(tmp_path / "cut.so", data[:-10]))  # the trailer's tail is gone
    with pytest.raises(FormatError, match="records a .*-byte image"):
        rt.load_module(_write(tmp_path / "long.so", data[:-TRAILER_SIZE] + b"\0" * 16 + data[-TRAILER_SIZE:]))
    with pytest.raises(FormatError, match="not a Kiln digest trailer"):
        rt.load_module(_write(tmp_path / "junk.so", data + b"appended"))


def test_library_without_trailer_still_loads(lib, tmp_path):
    data = open(lib, "rb").read()
    plain = _write(tmp_path / "plain.so", data[:-TRAILER_SIZE])  # e.g. from an older Kiln
    assert rt.load_module(plain).get_function("alpha") is not None


_CORRUPT = textwrap.dedent(r"""
    import json, os, random, sys
    import kiln.runtime as rt
    from kiln.runtime.errors import FormatError
    src, work, trials = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = open(src, "rb").read()
    rng = random.Random(1234)
    counts = {"format_error": 0, "other_error": 0, "loaded": 0}
    for t in range(trials):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(buf))
            buf[pos] = (buf[pos] + rng.randint(1, 255)) % 256  # always a different byte
        path = os.path.join(work, "c%d.so" % t)
        with open(path, "wb") as f:
            f.write(buf)
        try:
            rt.load_module(path)
            counts["loaded"] += 1
        except FormatError:
            counts["format_error"] += 1
        except Exception as e:
            counts["other_error"] += 1
            print("OTHER", type(e).__name__, e, file=sys.stderr)
        os.remove(path)
    print(json.dumps(counts))
""")


def test_random_corruptions_never_reach_dlopen(tmp_path):
    """300 corrupted copies (1-3 random bytes changed): every one is a FormatError, no crash.

    Without the trailer, the issue's campaign saw 360 of ~900 such files crash the process.
    """
    import kiln
    from tests.fuzz.make_corpus import _tiny_model

    graph, params = _tiny_model()  # a real model: code, blob with graph and params, crt
    src = kiln.build(graph, target="c", params=params).export_library(str(tmp_path / "src.so"))
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", _CORRUPT, src, str(work), "300"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"the loading process died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts == {"format_error": 300, "other_error": 0, "loaded": 0}, proc.stderr[-2000:]
