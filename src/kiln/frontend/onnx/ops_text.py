"""Converter of ``TfIdfVectorizer``: n-gram counts of integer token ids, then weighting.

The n-gram pool is an attribute, so it is compiled in: the converter validates it, turns it into
the constant tables of the ``ngram_count`` IR op (``kiln.ir.ops.ml``) and applies the TF / IDF /
TFIDF weighting with elementwise IR ops. String tokens (``pool_strings``) are first mapped to
int64 ids by the ``label_encoder`` host op (``docs/strings.md``), then counted the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime.dtype import STRING
from .converter import Context, onnx_op

_MODES = ("TF", "IDF", "TFIDF")


def _pool_tables(
    ctx: Context, pool: list[int], counts: list[int], indexes: list[int], lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``ngram_count`` tables ``(pool [G, L], pool_len [G], pool_col [G])`` of the n-grams
    whose length is in ``lo..hi``.

    N-gram number ``i`` of the pool (counted over every length, in pool order) adds to output
    column ``indexes[i]``. An n-gram listed twice counts once, in the column of its last listing,
    as in ONNX's reference and ONNX Runtime (both keep one entry per n-gram in a trie).
    """
    if any(b < a for a, b in zip(counts, counts[1:])) or (counts and (counts[0] < 0 or counts[-1] > len(pool))):
        raise ctx.bad(
            f"ngram_counts must be non-decreasing start offsets into pool_int64s (0..{len(pool)}), got {counts}"
        )
    grams: dict[tuple[int, ...], int] = {}
    ngram_id = 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        if (end - start) % size:
            raise ctx.bad(
                f"the {size}-grams of pool_int64s (entries {start}..{end - 1}) are {end - start} "
                f"values, not a multiple of {size}"
            )
        for at in range(start, end, size):
            if lo <= size <= hi:
                if ngram_id >= len(indexes):
                    raise ctx.bad(
                        f"ngram_indexes has {len(indexes)} entries, but pool_int64s holds more "
                        f"n-grams (the {size}-gram {pool[at : at + size]} is n-gram {ngram_id})"
                    )
                grams[tuple(pool[at : at + size])] = indexes[ngram_id]
            ngram_id += 1
    width = max((len(g) for g in grams), default=1)
    # no n-gram of a counted length: one unusable row (length 0) keeps the tables non-empty
    table = np.zeros((max(len(grams), 1), width), np.int64)
    lens = np.zeros(len(table), np.int32)
    cols = np.zeros(len(table), np.int32)
    for row, (gram, col) in enumerate(grams.items()):
        table[row, : len(gram)] = gram
        lens[row], cols[row] = len(gram), col
    return table, lens, cols


def _string_ids(ctx: Context, x: Any, pool: list[str]) -> tuple[Any, list[int]]:
    """String tokens as int64 ids (``label_encoder``, a host op), and the pool in the same ids.

    A token outside the pool becomes -1, which matches no pool id.
    """
    vocab = list(dict.fromkeys(pool))
    ids = {w: i for i, w in enumerate(vocab)}
    x_ids = ctx.emit1(
        "label_encoder",
        x,
        keys=tuple(vocab),
        values=tuple(range(len(vocab))),
        default=-1,
        keys_dtype=STRING,
        values_dtype="int64",
    )
    return x_ids, [ids[w] for w in pool]


@onnx_op("TfIdfVectorizer")
def _tfidf_vectorizer(ctx: Context, node: Any, ins: list, attrs: Any) -> Any:
    """Counts of the pool's n-grams in each row of a 1-D ``[C]`` or 2-D ``[N, C]`` token input,
    weighted by ``mode``; float32 ``[max(ngram_indexes) + 1]`` or ``[N, ...]``."""
    x = ins[0]
    strings = "pool_strings" in attrs
    if strings and "pool_int64s" in attrs:
        raise ctx.bad("only one of pool_strings and pool_int64s may be given")
    if x.dtype not in (STRING, "int32", "int64"):
        raise ctx.bad(f"input X must be string, int32 or int64 tokens, got {x.dtype}")
    if strings != (x.dtype == STRING):
        raise ctx.bad(f"input X is {x.dtype}: pool_strings needs string tokens, pool_int64s int32 or int64 ones")
    if len(x.shape) not in (1, 2):
        raise ctx.bad(f"input X must be 1-D [C] or 2-D [N, C], got shape {tuple(x.shape)}")
    mode = attrs["mode"]
    if mode not in _MODES:
        raise ctx.bad(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    lo, hi, skip = int(attrs["min_gram_length"]), int(attrs["max_gram_length"]), int(attrs["max_skip_count"])
    if not 1 <= lo <= hi:
        raise ctx.bad(f"need 1 <= min_gram_length <= max_gram_length, got {lo} and {hi}")
    if skip < 0:
        raise ctx.bad(f"max_skip_count must be >= 0, got {skip}")
    indexes = [int(i) for i in attrs["ngram_indexes"]]
    if not indexes or min(indexes) < 0:
        raise ctx.bad(f"ngram_indexes must be non-empty and >= 0, got {indexes[:16]}")
    name = "pool_strings" if strings else "pool_int64s"
    if not attrs.get(name):
        raise ctx.bad(f"attribute {name!r} is missing or empty (the n-gram pool)")
    if strings:
        x, pool = _string_ids(ctx, x, [str(v) for v in attrs["pool_strings"]])
    else:
        pool = [int(v) for v in attrs["pool_int64s"]]
    counts = [int(c) for c in attrs["ngram_counts"]]
    n_cols = max(indexes) + 1
    table, lens, cols = _pool_tables(ctx, pool, counts, indexes, lo, hi)
    counted = ctx.emit1(
        "ngram_count", x, ctx.const(table), ctx.const(lens), ctx.const(cols), num_cols=n_cols, max_skip_count=skip
    )
    weights = [float(w) for w in attrs.get("weights", [])]
    # weights scale output columns (ONNX's reference and ONNX Runtime index them by column)
    if weights and len(weights) < n_cols:
        raise ctx.bad(
            f"weights has {len(weights)} entries; it needs one per output column (max(ngram_indexes) + 1 = {n_cols})"
        )
    w = ctx.const(np.asarray(weights[:n_cols], np.float32)) if weights else None
    if mode == "TF":
        return counted
    if mode == "IDF":
        seen = ctx.cast(ctx.emit1("greater", counted, ctx.const(np.array(0.0, np.float32))), "float32")
        return seen if w is None else ctx.emit1("multiply", seen, w)
    return counted if w is None else ctx.emit1("multiply", counted, w)
