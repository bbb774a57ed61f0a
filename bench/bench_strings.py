"""Per-element and per-call cost of the string host ops (``docs/strings.md``).

Each host op of :mod:`kiln.runtime.strings` runs on ``--n`` e-mail-like strings (best of
``--repeat`` rounds of 3 calls), and ``string_concat`` on a single element shows the fixed
cost of one call. These are the functions the graph executor calls for a ``__host`` node.

Usage::

    python bench/bench_strings.py [--n 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import platform
import timeit

import numpy as np

from kiln.runtime import strings


def main() -> None:
    """Print ns per element for each host op and us per call for a one-element concat."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.n
    x = np.array([f"user{i}@example.com" for i in range(n)], dtype=object)
    cases = [
        ("string_concat", {}, [x, x]),
        ("string_equal", {}, [x, x]),
        ("regex_full_match", {"pattern": r"[a-z0-9]+@[a-z]+\.com"}, [x]),
        ("string_normalizer", {"case_change_action": "UPPER", "is_case_sensitive": False}, [x]),
        (
            "label_encoder",
            {
                "keys": ["user1@example.com"],
                "values": [1],
                "default": 0,
                "keys_dtype": "string",
                "values_dtype": "int64",
            },
            [x],
        ),
        ("cast_string", {"dtype": "string"}, [np.arange(n, dtype=np.float32)]),
    ]
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    for name, attrs, ins in cases:
        fn = strings.get_host_op(name)
        t = min(timeit.repeat(lambda fn=fn, ins=ins, attrs=attrs: fn(ins, attrs), number=3, repeat=args.repeat)) / 3
        print(f"{name:18s} {t / n * 1e9:7.0f} ns/element")
    one = [np.array(["a"], dtype=object)] * 2
    fn = strings.get_host_op("string_concat")
    t = min(timeit.repeat(lambda: fn(one, {}), number=10_000, repeat=args.repeat)) / 10_000
    print(f"string_concat, one element: {t * 1e6:.1f} us/call")


if __name__ == "__main__":
    main()
