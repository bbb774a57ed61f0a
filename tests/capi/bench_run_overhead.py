"""What one ``KilnModelRun`` costs the C API itself, for a static model and one with an input
symbol: the measurement behind docs/c_api.md "Data-dependent dims" (a model without them costs
what it cost before the C API learned them). Not a test; run it::

    git show COMMIT:src/kiln/runtime/crt/kiln_model_api.c > /tmp/old_api.c   # an older version
    python -m tests.capi.bench_run_overhead [/tmp/old_api.c]

Each model (relu -> negative -> exp on 8 floats) is exported once with the package's
``kiln_model_api.c`` and, when given, once with the other file, and timed by
``capi_bench_run.c`` (best of 7 batches of 200,000 runs), alternating libraries three times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _export(kind: str, path: str, api: str | None) -> str:
    import kiln
    from kiln import ir
    from kiln.runtime import export, model_api

    g = ir.Graph(kind)
    if kind == "dynamic":
        g.declare_dim("n", 1, 8)
    y = g.add_input("x", ("n",) if kind == "dynamic" else (8,))
    for op in ("relu", "negative", "exp"):
        y = g.add(op, y)
    g.outputs = [y]
    factory = kiln.build(g, target="llvm")
    saved = model_api.api_source_path
    if api is not None:  # the other implementation, linked in by the same export
        model_api.api_source_path = export.api_source_path = lambda: api  # type: ignore[assignment]
    try:
        return factory.export_library(path)
    finally:
        model_api.api_source_path = export.api_source_path = saved  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    from kiln.runtime import include_path
    from kiln.runtime.cc import get_cc

    tmp = tempfile.mkdtemp()
    bench = os.path.join(tmp, "capi_bench_run")
    subprocess.run([*get_cc().split(), "-O2", "-I", include_path(), os.path.join(HERE, "capi_bench_run.c"), "-o",
                    bench, "-ldl"], check=True)
    versions = {"current": None} | ({"other": os.path.abspath(argv[0])} if argv else {})
    libs = {(k, v): _export(k, os.path.join(tmp, f"{k}_{v}.so"), api) for k in ("static", "dynamic")
            for v, api in versions.items()}
    cases = [("static", 0, 0), ("dynamic", 0, 1), ("dynamic", 1, 1)]
    for _ in range(3):
        for kind, mode, dyn in cases:
            times = {v: subprocess.run([bench, libs[kind, v], str(mode), str(dyn)], check=True, capture_output=True,
                                       text=True).stdout.strip() for v in versions}
            what = f"{kind}{', shape set before each run' if mode else ''}"
            print(f"{what:38s}" + "  ".join(f"{v} {t} ns" for v, t in times.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
