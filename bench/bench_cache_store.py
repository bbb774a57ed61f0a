"""Cost of storing compiled kernels into a compile cache that already holds many entries.

Fills a fresh ``KILN_CACHE_DIR`` with ``--existing`` 1 KiB entries, then times ``--stores``
new entries two ways: scanning the whole cache after every store (what the cache did before it
kept a running size estimate; reproduced with ``cache._RESCAN_EVERY = 1``) and the current
bookkeeping. The cap is the default, so nothing is evicted: only the bookkeeping is timed.

Usage::

    python bench/bench_cache_store.py [--existing 5000] [--stores 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--existing", type=int, default=5000, help="entries in the cache before timing")
    ap.add_argument("--stores", type=int, default=200, help="new entries stored per variant")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="kiln_cache_bench_")
    os.environ["KILN_CACHE_DIR"] = root
    from kiln.codegen import cache

    def writer(data: bytes):  # noqa: ANN202 - cache's produce callback
        def produce(path: str) -> None:
            with open(path, "wb") as f:
                f.write(data)
        return produce

    try:
        for i in range(args.existing):
            cache.cached_file(cache.make_key(f"existing-{i}"), "o", writer(b"x" * 1024))
        default_every = cache._RESCAN_EVERY
        for every, label in ((1, "scan after every store (before)"), (default_every, "running estimate (now)")):
            cache._RESCAN_EVERY = every
            cache._estimate.clear()
            t0 = time.perf_counter()
            for i in range(args.stores):
                cache.cached_file(cache.make_key(f"{label}-{i}"), "o", writer(b"y" * 1024))
            dt = time.perf_counter() - t0
            print(f"{label:34s} {args.stores} stores into {args.existing} entries: {dt:.2f} s "
                  f"({dt / args.stores * 1000:.1f} ms per store)")
        cache._RESCAN_EVERY = default_every
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
