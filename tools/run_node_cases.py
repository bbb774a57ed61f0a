"""Run ONNX backend node-suite cases chosen by a regular expression through Kiln's backend.

A quick look that writes nothing: it takes any case of the installed onnx's suite (from the
cache of ``tests/onnx_node/node_cases.py``), compares outputs exactly as the pytest node suite
does (shape, dtype, then the case's rtol/atol), and notes where the verdict differs from
``tests/onnx_node/expected_status.txt``, the file ``python tools/op_coverage.py`` regenerates.

Usage::

    python tools/run_node_cases.py 'test_(gathernd|scatternd|onehot)'
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the node-suite helpers live in the tests package (tests/onnx_node)
sys.path.insert(0, ROOT)

from tests.onnx_node import expectations, node_cases  # noqa: E402


def main() -> int:
    """Run the chosen cases; exit 0 when every one passes."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pattern", help="regular expression matched (re.match) against case names")
    args = ap.parse_args()

    from kiln.frontend.onnx_backend import KilnBackend

    cases = node_cases.load_cases()
    _, expected = expectations.load() if os.path.exists(expectations.PATH) else (None, {})
    chosen = sorted(n for n in cases if re.match(args.pattern, n))
    passed = 0
    stale = []
    for name in chosen:
        exp = expected.get(name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                node_cases.run_case(cases[name], KilnBackend)
        except Exception as err:  # noqa: BLE001 - every failure is reported, whatever raised it
            msg = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
            note = "  [expected: pass]" if exp is not None and exp.passes else ""
            print(f"FAIL {name}: {type(err).__name__}: {msg}{note}")
            if note:
                stale.append(name)
        else:
            passed += 1
            note = f"  [expected: {exp.status}]" if exp is not None and not exp.passes else ""
            print(f"PASS {name}{note}")
            if note:
                stale.append(name)
    print(f"{passed}/{len(chosen)} passed")
    if stale:
        print(f"{len(stale)} verdict(s) differ from {os.path.relpath(expectations.PATH, ROOT)}; "
              f"after a fix, run `{expectations.REGENERATE} -k '{args.pattern}'`")
    return 0 if passed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
