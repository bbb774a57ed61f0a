"""Regenerate the ``.tar`` library seeds of ``tests/fuzz/corpus/tar/``.

Two real ``export_library(... .tar)`` outputs: a tiny conv model built for target ``c`` (with
a module blob holding the graph and params) and a lone C source module (no blob). Member
metadata (mtime, owner, mode) is normalized so the files are byte-for-byte reproducible for
a given Kiln version. Run from the repository root (needs a C compiler)::

    python -m tests.fuzz.make_tar_corpus
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path

from tests.fuzz.make_corpus import _tiny_model

CORPUS = Path(__file__).resolve().parent / "corpus" / "tar"

KERNEL = r"""
#include <kiln/c_runtime_api.h>
KILN_DLL int32_t add_one(KilnValue* a, int32_t* c, int32_t n, KilnValue* rv, int32_t* rc, void* h) { return 0; }
"""


def normalized(path: str) -> bytes:
    """The archive at ``path`` rewritten with fixed member metadata, in the same order."""
    out = io.BytesIO()
    with tarfile.open(path, "r:") as src, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()  # type: ignore[union-attr]
            info = tarfile.TarInfo(m.name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            dst.addfile(info, io.BytesIO(data))
    return out.getvalue()


def tar_seeds() -> dict[str, bytes]:
    """``{file name: archive bytes}`` of the two seeds."""
    import kiln
    import kiln.runtime as rt

    g, params = _tiny_model()
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model.tar")
        kiln.build(g, target="c", params=params).export_library(model)
        seeds["c_model.tar"] = normalized(model)
        kernel = os.path.join(tmp, "kernel.tar")
        rt.csource_module(KERNEL, ["add_one"]).export_library(kernel, options=["-O1", "-DKILN_SEED=1"])
        seeds["c_kernel.tar"] = normalized(kernel)
    return seeds


def main() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in tar_seeds().items():
        (CORPUS / name).write_bytes(data)
        print(f"tar/{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
