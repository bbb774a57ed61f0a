#!/usr/bin/env python3
"""Measure Kiln's coverage of the ONNX backend node test suite, against ONNX Runtime.

For every node test case of the ops in ``tests/onnx_node/node_cases.py:OPS`` (the case's op is its
single node's op type; ``*_expanded`` cases — the op's function body — count for the base op), run

* ONNX Runtime (CPU EP): the denominator, "cases ORT passes";
* Kiln (``kiln.frontend.onnx_backend.KilnBackend``, target ``llvm`` or ``$KILN_ONNX_BACKEND_TARGET``),

each case in a worker subprocess with a timeout (a crash or hang costs one case, not the run),
compare with the suite's expected outputs and tolerances, and write

* ``docs/op_coverage.md``: per op cases / ORT passes / Kiln passes / %, the overall %, and every
  failing case with a one-line reason;
* ``tests/onnx_node/included_cases.py``: the cases Kiln passes (the pytest node suite runs these),
  with the slowest ones marked slow so the default run stays fast;
* ``build/op_coverage.json``: raw results (status, reason, seconds per case and backend).

Usage::

    python tools/op_coverage.py                      # both backends, all cases, write all outputs
    python tools/op_coverage.py --backend ort        # ORT baseline only (no Kiln needed)
    python tools/op_coverage.py -k 'test_(add|conv)' --no-write   # a subset, print only
    python tools/op_coverage.py --report-only        # rewrite the doc/include list from the json

Kiln runs with a fresh, empty ``KILN_CACHE_DIR`` unless ``--cache-dir`` is given, so that the
per-case times it records are those of a cold CI run.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import re
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_DIR = os.path.join(ROOT, "tests", "onnx_node")
sys.path.insert(0, NODE_DIR)

import node_cases  # noqa: E402

DOC = os.path.join(ROOT, "docs", "op_coverage.md")
INCLUDE = os.path.join(NODE_DIR, "included_cases.py")
RESULTS = os.path.join(ROOT, "build", "op_coverage.json")

# Budget for the default (non-slow) pytest run of the node suite, in seconds of recorded
# cold-cache case time (serial, one core). Slowest cases beyond it are marked slow, keeping
# the fastest passing case of every op in the default run.
DEFAULT_BUDGET_S = 150.0


# ---------------------------------------------------------------------------------------------
# backends (run in the worker)
class OrtRep:
    def __init__(self, model_bytes: bytes):
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.sess.get_inputs()]

    def run(self, inputs):
        import numpy as np

        feeds = {n: x if isinstance(x, (list, tuple)) or x is None else np.asarray(x)
                 for n, x in zip(self.names, inputs)}
        return self.sess.run(None, feeds)


def _first_line(s: str, n: int = 220) -> str:
    s = " ".join(x.strip() for x in str(s).strip().splitlines()[:3] if x.strip())
    s = re.sub(r"\s+", " ", s)
    return s if len(s) <= n else s[: n - 3] + "..."


def describe_mismatch(refs, outs) -> str:
    import numpy as np

    if len(outs) != len(refs):
        return f"{len(outs)} outputs, expected {len(refs)}"
    for i, (r, o) in enumerate(zip(refs, outs)):
        if isinstance(r, (list, tuple)) or r is None:
            continue
        o = np.asarray(o)
        if o.shape != r.shape:
            return f"output {i}: shape {o.shape}, expected {r.shape}"
        if o.dtype != r.dtype:
            return f"output {i}: dtype {o.dtype}, expected {r.dtype}"
        if r.dtype == object or r.size == 0:
            continue
        try:
            rf = r.astype(np.float64)
            of = o.astype(np.float64)
        except (TypeError, ValueError):  # not numeric (strings, objects): compared above by dtype only
            continue
        bad = ~np.isclose(of, rf, rtol=1e-3, atol=1e-7, equal_nan=True)
        if bad.any():
            with np.errstate(all="ignore"):
                d = np.abs(of - rf)
                d = d[np.isfinite(d)]
                mx = float(d.max()) if d.size else float("nan")
            nan_o, nan_r = int(np.isnan(of).sum()), int(np.isnan(rf).sum())
            extra = f", NaNs {nan_o} vs expected {nan_r}" if nan_o != nan_r else ""
            return (f"output {i} ({r.dtype}{list(r.shape)}): {int(bad.sum())}/{r.size} values "
                    f"differ, max abs diff {mx:.3g}{extra}")
    return "values differ"


def _kiln_frame(tb) -> str:
    """Innermost frame inside kiln's sources (not the backend itself): 'kiln/x/y.py:123'."""
    where = ""
    for fs in traceback.extract_tb(tb):
        p = fs.filename.replace("\\", "/")
        if "/kiln/" in p and not p.endswith("onnx_backend.py"):
            where = "kiln/" + p.rsplit("/kiln/", 1)[1] + f":{fs.lineno}"
    return where


def run_one(case, backend: str) -> dict:
    import numpy as np

    t0 = time.perf_counter()
    stage = "prepare"
    try:
        if backend == "ort":
            rep = OrtRep(case.model_bytes)
        else:
            from kiln.frontend.onnx_backend import KilnBackend

            rep = KilnBackend.prepare(case.model, "CPU")
        stage = "run"
        for inputs, refs in case.data_sets:
            outs = list(rep.run(inputs))
            try:
                with np.errstate(all="ignore"):
                    node_cases.assert_outputs(case, refs, outs)
            except AssertionError as e:
                return {"status": "mismatch", "reason": describe_mismatch(refs, outs),
                        "detail": _first_line(e, 400), "time": time.perf_counter() - t0}
        res = {"status": "pass", "reason": "", "time": time.perf_counter() - t0}
        frozen = getattr(rep, "last_frozen", None)
        if frozen:
            res["frozen"] = frozen
            res["all_frozen"] = set(frozen) >= set(rep.input_names)
            res["fallback"] = sorted(set(frozen) - set(rep.freeze_names))
        return res
    except Exception as e:  # noqa: BLE001
        notes = getattr(e, "__notes__", None) or []
        from_backend = [n.split(": ", 1)[1] for n in notes if n.startswith("[kiln onnx backend]")]
        st = from_backend[0] if from_backend else stage
        return {"status": "error", "stage": st, "etype": type(e).__name__,
                "where": _kiln_frame(e.__traceback__),
                "reason": f"{st}: {type(e).__name__}: {_first_line(e)}",
                "time": time.perf_counter() - t0}


def _worker(conn, backend: str, env: dict) -> None:
    os.environ.update(env)
    import warnings

    warnings.simplefilter("ignore")
    cases = node_cases.load_cases()
    while True:
        try:
            name = conn.recv()
        except EOFError:
            return
        if name is None:
            return
        conn.send((name, run_one(cases[name], backend)))


# ---------------------------------------------------------------------------------------------
# the pool: one in-flight case per worker; timeouts and crashes restart the worker
class Pool:
    def __init__(self, backend: str, jobs: int, timeout: float, env: dict):
        self.backend, self.jobs, self.timeout, self.env = backend, jobs, timeout, env
        self.ctx = mp.get_context("spawn")

    def _spawn(self):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, self.backend, self.env), daemon=True)
        p.start()
        child.close()
        return {"proc": p, "conn": parent, "case": None, "t0": 0.0}

    def run(self, names: list[str], progress=None) -> dict[str, dict]:
        todo = collections.deque(names)
        results: dict[str, dict] = {}
        workers = [self._spawn() for _ in range(min(self.jobs, len(names)) or 1)]

        def feed(w):
            if todo:
                w["case"] = todo.popleft()
                w["t0"] = time.perf_counter()
                w["conn"].send(w["case"])

        def done(name, res):
            results[name] = res
            if progress:
                progress(name, res, len(results), len(names))

        for w in workers:
            feed(w)
        while any(w["case"] for w in workers):
            busy = [w for w in workers if w["case"]]
            ready = mpc.wait([w["conn"] for w in busy], timeout=1.0)
            for i, w in enumerate(workers):
                if not w["case"]:
                    continue
                if w["conn"] in ready:
                    try:
                        name, res = w["conn"].recv()
                        done(name, res)
                        w["case"] = None
                        feed(w)
                        continue
                    except (EOFError, OSError):
                        w["proc"].join(5)
                        code = w["proc"].exitcode
                        res = {"status": "crash", "reason": f"worker died (exit code {code})",
                               "time": time.perf_counter() - w["t0"]}
                elif time.perf_counter() - w["t0"] > self.timeout:
                    w["proc"].kill()
                    w["proc"].join(5)
                    res = {"status": "timeout", "reason": f"timed out after {self.timeout:.0f} s",
                           "time": time.perf_counter() - w["t0"]}
                else:
                    continue
                done(w["case"], res)
                workers[i] = w = self._spawn()
                feed(w)
        for w in workers:
            try:
                w["conn"].send(None)
            except OSError:
                pass
            w["proc"].join(5)
            if w["proc"].is_alive():
                w["proc"].kill()
        return results


# ---------------------------------------------------------------------------------------------
# reporting
def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def write_doc(cases, res: dict, path: str, meta: dict) -> str:
    ort, kiln = res.get("ort", {}), res.get("kiln", {})
    by_op = collections.defaultdict(list)
    for c in cases.values():
        by_op[c.op].append(c)
    lines = [
        "# ONNX node-suite coverage",
        "",
        "Generated by `python tools/op_coverage.py` — do not edit by hand.",
        "",
        f"- date: {meta.get('date', '?')}; onnx {meta.get('onnx', '?')}, onnxruntime "
        f"{meta.get('onnxruntime', '?')}; Kiln target `{meta.get('target', 'llvm')}`",
        "- cases: every ONNX backend *node* test case of the listed ops (the case's op is its "
        "single node's op type; `*_expanded` cases run the op's function body, made of other "
        "ops, and count for the base op).",
        "- regenerate: `python tools/op_coverage.py` (ORT + Kiln, ~1 min on 2 cores; also "
        "rewrites `tests/onnx_node/included_cases.py`); run the node suite: "
        "`python -m pytest tests/onnx_node` (`KILN_NODE_SUITE_FAST=1` leaves the slow ones out).",
        "- denominator: the cases ONNX Runtime (CPU EP) passes; Kiln's % is the share of "
        "those Kiln passes. Comparison: the suite's own (shape, dtype, `allclose` with the "
        "case's rtol/atol, default 1e-3/1e-7).",
        "",
    ]
    tot = collections.Counter()
    rows = []
    for op in node_cases.OPS:
        cs = by_op.get(op, [])
        o = [c for c in cs if ort.get(c.name, {}).get("status") == "pass"]
        k = [c for c in o if kiln.get(c.name, {}).get("status") == "pass"]
        ne = [c for c in o if not c.expanded]
        nek = [c for c in ne if kiln.get(c.name, {}).get("status") == "pass"]
        tot.update(cases=len(cs), ort=len(o), kiln=len(k), ort_ne=len(ne), kiln_ne=len(nek))
        rows.append(f"| {op} | {len(cs)} | {len(o)} | {len(k)} | {_pct(len(k), len(o))} |")
    if kiln:
        lines += [
            f"**Overall: Kiln passes {tot['kiln']} of the {tot['ort']} cases ONNX Runtime "
            f"passes ({_pct(tot['kiln'], tot['ort'])})**; without the `*_expanded` cases: "
            f"{tot['kiln_ne']} of {tot['ort_ne']} ({_pct(tot['kiln_ne'], tot['ort_ne'])}). "
            f"Goal: ≥ 95%.",
            "",
        ]
    lines += [
        f"{tot['cases']} cases of {len(node_cases.OPS)} ops; ONNX Runtime passes {tot['ort']}.",
        "",
        "| op | cases | ORT passes | Kiln passes (of ORT's) | Kiln % |",
        "|---|---:|---:|---:|---:|",
        *rows,
        f"| **total** | **{tot['cases']}** | **{tot['ort']}** | **{tot['kiln']}** | "
        f"**{_pct(tot['kiln'], tot['ort'])}** |",
        "",
    ]
    if kiln:
        times = sorted(r["time"] for n, r in kiln.items() if r.get("status") == "pass")
        if times:
            lines += [
                f"Kiln time per passing case (prepare + compile + run + compare, cold kernel "
                f"cache, {meta.get('jobs', '?')} workers): median {times[len(times) // 2]:.2f} s,"
                f" mean {sum(times) / len(times):.2f} s, max {times[-1]:.2f} s, total "
                f"{sum(times):.0f} s.",
                "",
            ]
        fails = [c for c in cases.values() if ort.get(c.name, {}).get("status") == "pass"
                 and kiln.get(c.name, {}).get("status") != "pass"]
        lines += ["## Cases ONNX Runtime passes and Kiln fails", ""]
        if not fails:
            lines += ["None.", ""]
        for op in node_cases.OPS:
            fs = sorted((c for c in fails if c.op == op), key=lambda c: c.name)
            if not fs:
                continue
            lines.append(f"### {op}")
            lines.append("")
            for c in fs:
                r = kiln.get(c.name, {"status": "not run", "reason": "not run"})
                why = r.get("reason") or r["status"]
                where = f" ({r['where']})" if r.get("where") else ""
                lines.append(f"- `{c.name}` — {r['status']}: {_md(why)}{where}")
            lines.append("")
        const = sorted(n for n, r in kiln.items() if r.get("all_frozen"))
        if const:
            lines += ["## Passing cases compiled to constants (counted as passes)", "",
                      "Every input of these decides output shapes, so the backend freezes them "
                      "all and the model folds to a constant at import; they test the import and "
                      "constant folding, not a kernel:", "",
                      ", ".join(f"`{n}`" for n in const), ""]
        fb = sorted(n for n, r in kiln.items() if r.get("fallback"))
        if fb:
            lines += ["## Cases that needed the freeze fallback", "",
                      "The frontend asked for constants the backend's static analysis did not "
                      "find; the backend froze every non-float input:", "",
                      *[f"- `{n}`: {', '.join(kiln[n]['fallback'])}" for n in fb], ""]
        extra = sorted(n for n, r in kiln.items() if r.get("status") == "pass"
                       and ort.get(n, {}).get("status") != "pass")
        if extra:
            lines += ["## Cases Kiln passes and ONNX Runtime fails (not counted)", "",
                      *[f"- `{n}`" for n in extra], ""]
    ort_fail = sorted(n for n in cases if ort.get(n, {}).get("status") != "pass")
    lines += ["## Cases ONNX Runtime fails (not counted)", ""]
    for n in ort_fail:
        r = ort.get(n, {"status": "not run", "reason": "not run"})
        kr = kiln.get(n)
        kk = ""
        if kr:
            kk = " — Kiln: pass" if kr["status"] == "pass" else \
                f" — Kiln: {kr['status']}: {_md(kr.get('reason') or '')}"
        lines.append(f"- `{n}` — {r['status']}: {_md(r.get('reason') or '')}{kk}")
    lines.append("")
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text)
    return text


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'")


def _old_included(path: str) -> list[str]:
    ns: dict = {}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), ns)  # noqa: S102 (our own generated file)
    except (OSError, SyntaxError):
        return []
    return list(ns.get("INCLUDED", []))


def write_include(cases, res: dict, path: str, budget: float,
                  allow_drop: bool = False) -> tuple[list, list]:
    kiln = res.get("kiln", {})
    passing = sorted(n for n, r in kiln.items() if r.get("status") == "pass" and n in cases)
    # A case that was included and fails now is a regression: keep it (the test suite must
    # show it) unless --allow-drop says it is known and accepted.
    dropped = sorted(set(_old_included(path)) - set(passing))
    if dropped:
        verb = "dropping" if allow_drop else "keeping (pass --allow-drop to drop)"
        print(f"REGRESSIONS: {len(dropped)} previously included case(s) fail now; {verb}:")
        for n in dropped:
            print(f"  {n}: {kiln.get(n, {}).get('reason', 'not run')}")
        if not allow_drop:
            passing = sorted(set(passing) | {n for n in dropped if n in cases})
    # keep the fastest passing case of each op in the default run; mark the slowest of the
    # others slow until the default run fits the budget
    def t(n):
        return kiln.get(n, {}).get("time", 0.0)

    fastest = {}
    for n in passing:
        op = cases[n].op
        if op not in fastest or t(n) < t(fastest[op]):
            fastest[op] = n
    total = sum(t(n) for n in passing)
    slow = []
    for n in sorted(passing, key=lambda n: -t(n)):
        if total <= budget:
            break
        if n in fastest.values():
            continue
        slow.append(n)
        total -= t(n)
    slow.sort()
    body = [
        '"""Node-suite cases Kiln passes: the pytest node suite runs exactly these.',
        "",
        "Generated by ``python tools/op_coverage.py`` from a full run (see docs/op_coverage.md);",
        "regenerate it after fixing ops rather than editing by hand. ``SLOW`` cases (the",
        "slowest to compile) are left out of quick runs by ``KILN_NODE_SUITE_FAST=1``.",
        '"""',
        "",
        "INCLUDED = [",
        *[f"    {n!r},  # {cases[n].op}" for n in passing],
        "]",
        "",
        "SLOW = {",
        *[f"    {n!r}," for n in slow],
        "}",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(body))
    return passing, slow


# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ort,kiln", help="ort, kiln or ort,kiln (default)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per case")
    ap.add_argument("-k", "--filter", default="", help="regex on case names")
    ap.add_argument("--ops", default="", help="comma-separated op names to restrict to")
    ap.add_argument("--cache-dir", default="", help="KILN_CACHE_DIR for Kiln (default: fresh)")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--include", default=INCLUDE)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                    help="seconds of default (non-slow) pytest run (recorded cold times)")
    ap.add_argument("--allow-drop", action="store_true",
                    help="drop previously included cases that fail now from the include list")
    ap.add_argument("--no-write", action="store_true", help="print only; write no files")
    ap.add_argument("--report-only", action="store_true",
                    help="no runs: rewrite the doc / include list from --results")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)

    import onnx

    cases = node_cases.load_cases()
    names = sorted(cases)
    if args.filter:
        rx = re.compile(args.filter)
        names = [n for n in names if rx.search(n)]
    if args.ops:
        ops = set(args.ops.split(","))
        names = [n for n in names if cases[n].op in ops]

    res: dict = {}
    if os.path.exists(args.results):
        with open(args.results) as f:
            res = json.load(f)
    meta = res.setdefault("meta", {})
    if not args.report_only:
        backends = [b.strip() for b in args.backend.split(",") if b.strip()]
        for b in backends:
            env = {"KILN_ONNX_NODE_CACHE": os.path.dirname(node_cases.cache_path()),
                   "OMP_NUM_THREADS": "1"}
            tmp = None
            if b == "kiln":
                if args.cache_dir:
                    env["KILN_CACHE_DIR"] = args.cache_dir
                else:
                    tmp = tempfile.mkdtemp(prefix="kiln-cov-cache-")
                    env["KILN_CACHE_DIR"] = tmp

            def progress(name, r, i, n, b=b):
                if not args.quiet:
                    mark = "ok " if r["status"] == "pass" else r["status"].upper()
                    extra = "" if r["status"] == "pass" else "  " + r.get("reason", "")[:150]
                    print(f"[{b} {i}/{n}] {mark} {name} {r['time']:.2f}s{extra}", flush=True)

            t0 = time.time()
            out = Pool(b, args.jobs, args.timeout, env).run(names, progress)
            wall = time.time() - t0
            res.setdefault(b, {}).update(out)
            npass = sum(1 for n in names if out[n]["status"] == "pass")
            print(f"== {b}: {npass}/{len(names)} pass, wall {wall:.0f} s with {args.jobs} "
                  f"workers", flush=True)
            if tmp:
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)
        import onnxruntime

        meta.update(date=datetime.date.today().isoformat(), onnx=onnx.__version__,
                    onnxruntime=onnxruntime.__version__, jobs=args.jobs,
                    target=os.environ.get("KILN_ONNX_BACKEND_TARGET") or "llvm")
        if not args.no_write:
            os.makedirs(os.path.dirname(args.results), exist_ok=True)
            with open(args.results, "w") as f:
                json.dump(res, f, indent=1, sort_keys=True)
    if not args.no_write:
        text = write_doc(cases, res, args.doc, meta)
        if res.get("kiln"):
            passing, slow = write_include(cases, res, args.include, args.budget,
                                          args.allow_drop)
            print(f"wrote {args.include}: {len(passing)} cases, {len(slow)} marked slow")
        print(f"wrote {args.doc}")
        for line in text.splitlines():
            if line.startswith("**Overall") or line.startswith("| **total"):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
