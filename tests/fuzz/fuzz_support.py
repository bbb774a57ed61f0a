"""Shared pieces of Kiln's mutation-fuzzing harnesses (hypothesis based).

A harness takes a few real seed files (``tests/fuzz/corpus/<name>/``), lets hypothesis mutate
them with :func:`mutate`, feeds the result to a loader and checks with
:func:`assert_only_kiln_errors` that the loader either succeeds or raises a
:class:`~kiln.runtime.errors.KilnError` -- never a bare ``KeyError``/``struct.error``/
``MemoryError``, never a crash. Runs are deterministic (``derandomize=True``) so CI sees the
same cases every time; ``KILN_FUZZ_EXAMPLES`` makes a run longer (see ``docs/dev/fuzzing.md``).

The API here is imported by every ``tests/fuzz/test_fuzz_*.py``; keep it stable::

    from tests.fuzz.fuzz_support import FUZZ_SETTINGS, assert_only_kiln_errors, mutated, load_corpus

    @FUZZ_SETTINGS
    @given(mutated(load_corpus("params")))
    def test_params_loader(data):
        assert_only_kiln_errors(load_param_dict, data)
"""

from __future__ import annotations

import os
import random
import struct
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Sequence

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from kiln.runtime.errors import KilnError

__all__ = [
    "CORPUS_DIR",
    "FUZZ_EXAMPLES",
    "FUZZ_SETTINGS",
    "INTERESTING_INTS",
    "assert_only_kiln_errors",
    "load_corpus",
    "mutate",
    "mutated",
]

#: Where checked-in seed files live, one folder per harness.
CORPUS_DIR = Path(__file__).resolve().parent / "corpus"

#: Cases per harness; CI uses the default, a long local run sets ``KILN_FUZZ_EXAMPLES``.
FUZZ_EXAMPLES = int(os.environ.get("KILN_FUZZ_EXAMPLES", "10000"))

#: Standard settings for every fuzz harness: deterministic, no example database (the corpus is
#: the checked-in one), no per-example deadline (a shared 2-core CI box has noisy timings), and
#: no "explain" phase (it re-runs a failure under coverage tracing: slow, and the failing
#: input is printed in full anyway).
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)

#: Boundary values that break length and count checks: zero, one, sign bits, all-ones and
#: values near 2**32 / 2**60 / 2**63 that overflow naive ``offset + n`` or ``n * itemsize``.
INTERESTING_INTS: tuple[int, ...] = (
    0, 1, 2, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000,
    0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x100000000, 1 << 40, 1 << 60, 1 << 62,
    0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 0xFFFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFF8,
)

_WIDTHS = (1, 2, 4, 8)
_FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}
_FLIP, _SET, _INTERESTING, _INSERT, _DELETE, _DUPLICATE, _TRUNCATE, _SPLICE = range(8)


def _interesting(buf: bytearray, rng: random.Random) -> None:
    """Overwrite 1/2/4/8 bytes at a random offset with a boundary integer (little-endian)."""
    width = rng.choice(_WIDTHS)
    value = rng.choice(INTERESTING_INTS) & ((1 << (8 * width)) - 1)
    pos = rng.randrange(len(buf))
    if rng.random() < 0.5:  # aligned offsets hit the formats' u64 fields far more often
        pos -= pos % width
    buf[pos:pos + width] = struct.pack(_FORMATS[width], value)


def mutate(data: bytes, draw: Callable[[Any], Any], others: Sequence[bytes] = ()) -> bytes:
    """Apply 1-4 random byte-level mutations to ``data``.

    The mutations come from a ``random.Random`` seeded by one hypothesis draw: hypothesis's
    own per-draw bookkeeping would otherwise dominate the run time (about 1 ms per draw on a
    busy 2-core box), and a failing input is printed in full anyway, so shrinking the choice
    of mutations buys little.

    Parameters
    ----------
    data : bytes
        The seed to mutate (left unchanged).
    draw : callable
        The ``draw`` of a ``@st.composite`` strategy or of ``st.data()``.
    others : sequence of bytes, optional
        Other seeds for the splice operator (head of ``data`` + tail of another seed).

    Returns
    -------
    bytes
        The mutated bytes. Operators: bit flip, byte set, boundary integer at an offset,
        insert random chunk, delete chunk, duplicate chunk, truncate, splice.
    """
    rng = random.Random(draw(st.integers(0, 2**64 - 1)))
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randint(_FLIP, _SPLICE if others else _TRUNCATE)
        n = len(buf)
        if op in (_FLIP, _SET, _INTERESTING) and n == 0:
            op = _INSERT
        if op == _FLIP:
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == _SET:
            buf[rng.randrange(n)] = rng.randrange(256)
        elif op == _INTERESTING:
            _interesting(buf, rng)
        elif op == _INSERT:
            pos = rng.randint(0, n)
            buf[pos:pos] = rng.randbytes(rng.randint(1, 64))
        elif op == _DELETE:
            start = rng.randint(0, n)
            del buf[start:start + rng.randint(1, 64)]
        elif op == _DUPLICATE:
            start = rng.randint(0, n)
            chunk = buf[start:start + rng.randint(1, 64)]
            pos = rng.randint(0, n)
            buf[pos:pos] = chunk
        elif op == _TRUNCATE:
            del buf[rng.randint(0, n):]
        else:  # _SPLICE: head of this input + tail of another seed
            other = rng.choice(others)
            buf = buf[:rng.randint(0, n)] + other[rng.randint(0, len(other)):]
    return bytes(buf)


def mutated(seeds: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """A strategy drawing one of ``seeds`` and returning it mutated by :func:`mutate`.

    Parameters
    ----------
    seeds : sequence of bytes
        The corpus (non-empty), e.g. from :func:`load_corpus`.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[bytes]
    """
    if not seeds:
        raise ValueError("mutated() needs at least one seed")
    seeds = list(seeds)

    @st.composite
    def _strategy(draw: Callable[[Any], Any]) -> bytes:
        seed = draw(st.sampled_from(seeds))
        return mutate(seed, draw, seeds)

    return _strategy()


def load_corpus(name: str) -> list[bytes]:
    """Read every seed file of ``tests/fuzz/corpus/<name>/``, in file-name order.

    Parameters
    ----------
    name : str
        The harness's corpus folder.

    Returns
    -------
    list of bytes
        The seeds; the corpus must not be empty (a missing corpus fails loudly).
    """
    folder = CORPUS_DIR / name
    seeds = [p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()
             and not p.name.startswith(".") and p.suffix != ".md"] if folder.is_dir() else []
    if not seeds:
        raise FileNotFoundError(f"fuzz corpus {folder} is missing or empty")
    return seeds


def assert_only_kiln_errors(fn: Callable[[bytes], Any], data: bytes) -> Any:
    """Call ``fn(data)``; succeed if it returns or raises a ``KilnError``, fail otherwise.

    Parameters
    ----------
    fn : callable
        The loader under test.
    data : bytes
        The (mutated) input.

    Returns
    -------
    object or None
        ``fn``'s result, or ``None`` when it raised a ``KilnError``.

    Raises
    ------
    AssertionError
        When ``fn`` raises anything else (``MemoryError``, ``struct.error``, ``KeyError``, ...);
        the message carries the exception and the head of the input for reproduction.
    """
    try:
        return fn(data)
    except KilnError:
        return None
    except Exception as exc:  # any non-Kiln exception is the bug this helper exists to catch
        head = data[:64].hex()
        raise AssertionError(
            f"{getattr(fn, '__qualname__', fn)} raised {type(exc).__name__}: {exc} "
            f"(input {len(data)} bytes, head {head}) -- expected success or a KilnError"
        ) from exc


def peak_traced_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Peak Python heap bytes (``tracemalloc``) while ``fn(*args)`` runs; its exceptions propagate."""
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
