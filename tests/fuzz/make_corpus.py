"""Regenerate the params and module-blob seed files of ``tests/fuzz/corpus/``.

The seeds are small real Kiln outputs, so the mutation fuzzers start from valid files and
reach deep into the loaders. Run from the repository root (needs a C compiler)::

    python -m tests.fuzz.make_corpus            # rewrites corpus/params/* and corpus/blob/*

The output is deterministic for a given Kiln version; commit the changed files together with
any change to the params or blob formats.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

CORPUS = Path(__file__).resolve().parent / "corpus"


def params_seeds() -> dict[str, bytes]:
    """A few ``save_param_dict`` outputs: several dtypes, 0-d, empty, many-dim, unicode names."""
    from kiln.runtime import save_param_dict

    rng = np.random.default_rng(0)
    return {
        "empty_dict.params": save_param_dict({}),
        "f32_i8_bf16.params": save_param_dict({
            "w": rng.standard_normal((2, 3)).astype("float32"),
            "q": np.arange(-4, 4, dtype="int8"),
            "bf": np.array([1.5, -2.0, 3.25], dtype=bfloat16),
        }),
        "zero_d_and_empty.params": save_param_dict({
            "scalar": np.array(7.0, dtype="float64"),
            "none": np.zeros((0, 4), dtype="float16"),
            "flag": np.array([True, False]),
        }),
        # Zero-size tensors of several ranks: a huge value in one of their dims must not pass.
        # 8-byte names keep every later u64 field 8-byte aligned, where the fuzzer's aligned
        # boundary-integer mutation lands.
        "empty_tensors.params": save_param_dict({
            "empty_1d": np.zeros((0,), "int8"),
            "empty_3d": np.zeros((3, 0, 5), "bool"),
            "empty_4d": np.zeros((1, 1, 0, 2), "float32"),
        }),
        "ints_unicode.params": save_param_dict({
            "größe": np.arange(6, dtype="uint16").reshape(1, 2, 3),
            "i64": np.array([-(2**62), 2**62], dtype="int64"),
            "u8": np.frombuffer(b"kiln", dtype="uint8").copy(),
        }),
    }


def _tiny_model():
    from kiln import ir

    g = ir.Graph("tiny")
    x = g.add_input("x", (1, 2, 4, 4), "float32")
    w = g.add_input("w", (3, 2, 1, 1), "float32")
    b = g.add_input("b", (3,), "float32")
    y = g.add("conv2d", x, w)
    y = g.add("relu", g.add("add", y, g.add("reshape", b, newshape=(1, 3, 1, 1))))
    g.outputs = [y]
    rng = np.random.default_rng(1)
    # w has more than INLINE_MAX_ELEMENTS elements, so it stays a param inside the blob.
    params = {"w": rng.standard_normal((3, 2, 1, 1)).astype("float32"), "b": np.ones(3, "float32")}
    return g, params


def blob_seeds() -> dict[str, bytes]:
    """Module blobs (without the 8-byte header) from real exports of a tiny conv model."""
    import kiln
    from kiln.runtime import blob
    from kiln.runtime.elf import ElfFile

    g, params = _tiny_model()
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        # opencl / cuda (PTX via NVRTC) add a device-module payload next to the factory's.
        for name, target, p in (("c_graph_params", "c", params), ("c_no_params", "c", None),
                                ("opencl", "opencl", params), ("cuda", "cuda", params)):
            try:
                factory = kiln.build(g, target=target, params=p)
            except kiln.KilnError as err:  # e.g. no NVRTC: keep the seed already checked in
                print(f"skipping {name}: {err}")
                continue
            so = os.path.join(tmp, f"{name}.so")
            factory.export_library(so)
            section = ElfFile(so).section_data(blob.SECTION_NAME)
            seeds[f"{name}.blob"] = bytes(blob.unpack(section))
    return seeds


def main() -> None:
    for folder, seeds in (("params", params_seeds()), ("blob", blob_seeds())):
        (CORPUS / folder).mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (CORPUS / folder / name).write_bytes(data)
            print(f"{folder}/{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
