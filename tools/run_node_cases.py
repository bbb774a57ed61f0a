"""Run ONNX backend node-suite cases chosen by a regular expression through Kiln's backend.

Unlike the pytest node suite (which runs the generated list in ``tests/onnx_node``), this
takes any case of the installed onnx's suite, so a newly supported op can be measured before
the list is regenerated with ``tools/op_coverage.py``.

Usage::

    python tools/run_node_cases.py 'test_(gathernd|scatternd|onehot)'
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pattern", help="regular expression matched (re.match) against case names")
    args = ap.parse_args()

    from onnx.backend.test.loader import load_model_tests

    from kiln.frontend.onnx_backend import KilnBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = load_model_tests(kind="node")
    chosen = sorted((t for t in tests if re.match(args.pattern, t.name)), key=lambda t: t.name)
    passed = 0
    for t in chosen:
        try:
            rep = KilnBackend.prepare(t.model, "CPU")
            for inputs, expected in t.data_sets:
                for got, want in zip(rep.run(inputs), expected):
                    np.testing.assert_allclose(np.asarray(got), want, rtol=float(t.rtol), atol=float(t.atol))
        except Exception as err:  # noqa: BLE001 - every failure is reported, whatever raised it
            print(f"FAIL {t.name}: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}")
        else:
            passed += 1
            print(f"PASS {t.name}")
    print(f"{passed}/{len(chosen)} passed")
    return 0 if passed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
