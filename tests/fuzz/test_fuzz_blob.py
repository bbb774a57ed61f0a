"""Fuzz the module-blob loader: a corrupt blob section raises a KilnError, never anything else.

Seeds (``tests/fuzz/corpus/blob/``, made by ``python -m tests.fuzz.make_corpus``) are the
blobs of real exports: a graph-executor factory (graph JSON + params) next to ``_lib``, and
with an ``opencl`` or ``cuda`` device module. Each case goes through the same steps as
``load_module``: the 8-byte section header (:func:`blob.unpack`), the structural decode,
the payload describers ``kiln inspect`` uses, and the loaders (:func:`blob.deserialize`)
with a stand-in for the compiled library, so no native code runs.
"""

from __future__ import annotations

import struct
from typing import Any, Callable

import pytest
from hypothesis import given, settings

from kiln.runtime import blob
from kiln.runtime.errors import FormatError, KilnError
from kiln.runtime.module import Module
from kiln.runtime.registry import get_payload_describer

from tests.fuzz.fuzz_support import (
    CORPUS_DIR, FUZZ_EXAMPLES, FUZZ_SETTINGS, assert_only_kiln_errors, load_corpus, mutated, peak_traced_bytes,
)

SEEDS = [blob.pack(b) for b in load_corpus("blob")]  # the section content, header included


class _StubLibrary(Module):
    """Stands in for the loaded ``.so`` that every ``_lib`` entry becomes."""

    type_key = "library"

    def _get_local_function(self, name: str) -> Callable[..., Any] | None:
        return None


def _load(section: bytes) -> Module:
    decoded = blob.decode(blob.unpack(section, "fuzz section"), "fuzz blob")
    for entry in decoded.entries:
        describe = get_payload_describer(entry.type_key)
        if describe is not None:
            describe(entry.payload)
    root = blob.deserialize(decoded, _StubLibrary(), "fuzz blob")
    # A corrupt import tree may hold cycles (legal for modules): visiting it must terminate.
    seen, stack = set(), [root]
    while stack:
        m = stack.pop()
        if id(m) not in seen:
            seen.add(id(m))
            repr(m)
            stack.extend(m.imported_modules)
    return root


def _load_checked(section: bytes) -> Module:
    try:
        return _load(section)
    except FormatError as err:
        # deserialize wraps whatever a loader raises into a FormatError; running out of
        # memory or stack on a few KiB of input is still a loader bug, not a format error.
        if isinstance(err.__cause__, (MemoryError, RecursionError)):
            raise AssertionError(f"loader exhausted resources: {err}") from err
        raise


def test_corpus_seeds_load():
    """The seeds are valid blobs (device modules may lack their runtime: a DeviceError)."""
    for section in SEEDS:
        try:
            root = _load(section)
        except KilnError as err:
            assert "device module" in str(err), err
            continue
        assert root.type_key == "GraphExecutorFactory"


@FUZZ_SETTINGS
@given(mutated(SEEDS))
def test_fuzz_blob_loader(section):
    assert_only_kiln_errors(_load_checked, section)


# ---------------------------------------------------------------------------------------
# hostile sizes: fail fast, allocate nothing the input cannot justify
# ---------------------------------------------------------------------------------------
def _u64(*v: int) -> bytes:
    return struct.pack(f"<{len(v)}Q", *v)


def _key(k: bytes) -> bytes:
    return _u64(len(k)) + k


_TREE = _key(b"_import_tree")
HOSTILE = {
    "header declares 2**64-1 bytes": _u64(2**64 - 1) + bytes(92),
    "2**60 entries in 100 bytes": blob.pack((_u64(1 << 60) + bytes(92))[:92]),
    "key of 2**60 bytes": blob.pack(_u64(2) + _u64(1 << 60) + b"x" * 80),
    "payload of 2**63 bytes": blob.pack(_u64(2) + _key(b"opencl") + _u64(1 << 63) + bytes(64)),
    "row_ptr of 2**60 items": blob.pack(_u64(2) + _key(b"_lib") + _TREE + _u64(1 << 60) + bytes(64)),
    "child_indices of 2**64-1 items": blob.pack(_u64(2) + _key(b"_lib") + _TREE + _u64(2, 0, 0, 2**64 - 1)),
    "factory graph of 2**62 bytes": blob.pack(
        _u64(2) + _key(b"GraphExecutorFactory") + _u64(40) + _u64(1 << 62) + bytes(32) + _TREE + _u64(2, 0, 0, 0)
    ),
}


@pytest.mark.parametrize("section", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_sizes_fail_fast_without_allocating(section):
    peak = peak_traced_bytes(lambda: pytest.raises(FormatError, _load, section))
    assert peak < 64 * 1024, f"peak {peak} bytes while rejecting a {len(section)}-byte blob"


@settings(FUZZ_SETTINGS, max_examples=max(FUZZ_EXAMPLES // 20, 1))
@given(mutated(SEEDS))
def test_fuzz_allocation_bounded_by_input(section):
    # Payloads are copied out of the section once, so a few times its size bounds any load.
    peak = peak_traced_bytes(assert_only_kiln_errors, _load_checked, section)
    assert peak < 4 * len(section) + 512 * 1024, f"peak {peak} bytes for a {len(section)}-byte blob"


def test_opencl_payload_with_invalid_utf8_is_a_format_error():
    # Found by this harness: a corrupt byte in an opencl payload's kernel source escaped the
    # payload describer (``kiln inspect``) as a UnicodeDecodeError.
    from kiln.runtime.opencl_driver import describe_payload

    decoded = blob.decode((CORPUS_DIR / "blob" / "opencl.blob").read_bytes())
    (entry,) = [e for e in decoded.entries if e.type_key == "opencl"]
    payload = bytearray(entry.payload)
    payload[32] = 0xFF  # inside the source text (after the 16-byte head and its u64 length)
    with pytest.raises(FormatError, match="source is not valid UTF-8"):
        describe_payload(bytes(payload))
