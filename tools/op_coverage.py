#!/usr/bin/env python3
"""Measure Kiln's coverage of the whole ONNX backend node test suite, against ONNX Runtime.

For every node test case of the installed onnx (1884 in onnx 1.23.2; a case's op is its single
node's op type, ``*_expanded`` cases — the op's function body — count for the base op), run

* ONNX Runtime (CPU EP), the reference: which cases a mature runtime passes;
* Kiln (``kiln.frontend.onnx_backend.KilnBackend``, target ``llvm`` or ``$KILN_ONNX_BACKEND_TARGET``),

in worker subprocesses with a timeout (a crash or hang costs one case, not the run), compare with
the suite's expected outputs and tolerances, and write

* ``tests/onnx_node/expected_status.txt``: every case's expected Kiln status (pass / fail with a
  reason / crash), which ``tests/onnx_node/test_node_suite.py`` enforces both ways;
* ``docs/op_coverage.md``: whole-suite pass counts of Kiln next to ORT's, a per-op table, the op
  types ORT passes and Kiln does not, the cases Kiln passes and ORT fails, and every failing case
  with its reason;
* ``build/op_coverage.json``: raw results (status, reason, seconds per case and backend).

Kiln compiles the cases as the pytest suite does (``tests/onnx_node/batching.py``): the cases that
can be merged and use only op types Kiln converts (and were not failing before) are built many to
a model; only passes are taken from a batch, and every other case runs alone, so each failure is
recorded with its own error.

Usage::

    python tools/op_coverage.py                      # the whole suite, both backends, write all
    python tools/op_coverage.py -k 'test_(trilu|gathernd)'   # re-measure some cases, update them
    python tools/op_coverage.py --backend ort        # ORT only (no Kiln needed)
    python tools/op_coverage.py -k 'test_add' --no-write     # a subset, print only
    python tools/op_coverage.py --report-only        # rewrite the outputs from build/op_coverage.json

A run of a subset updates only those cases' lines (the others keep their recorded results). A case
that was expected to pass and fails now is a regression: it stays ``pass`` (so the test suite
shows it) unless ``--allow-drop`` accepts it. Kiln runs with a fresh, empty ``KILN_CACHE_DIR``
unless ``--cache-dir`` is given, so the recorded times are those of a cold CI run.
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
# the node-suite helpers live in the tests package (tests/onnx_node); a tool run from a checkout
# imports them from there
sys.path.insert(0, ROOT)

from tests.onnx_node import batching, expectations, node_cases  # noqa: E402

DOC = os.path.join(ROOT, "docs", "op_coverage.md")
RESULTS = os.path.join(ROOT, "build", "op_coverage.json")

# Budget for the default (non-slow) pytest run of the node suite, in seconds of recorded
# cold-cache case time (serial, one core). Slowest cases beyond it are marked slow, keeping
# the fastest passing case of every op in the default run.
DEFAULT_BUDGET_S = 150.0
# Cases per merged model in the Kiln run (smaller than the pytest suite's: a batch that fails
# to build is split and rebuilt, and here batches may hold cases that have never passed).
DEFAULT_BATCH = 32


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


class _Alone(Exception):
    """Raised by the batch runner's ``run_single``: the case did not pass in its batch."""


def run_batch(cases, names: list[str]) -> tuple[dict[str, dict], list[str]]:
    """Build ``names`` as merged models (``batching.BatchRunner``); return the passes and the
    cases that must run alone (mismatched in, or could not be built with, their batch)."""
    from kiln.frontend.onnx_backend import KilnBackend

    def alone(case, backend):
        raise _Alone(case.name)

    t0 = time.perf_counter()
    runner = batching.BatchRunner(cases, names, KilnBackend, batch_size=len(names),
                                  run_single=alone)
    passed, rest = [], []
    for n in names:
        try:
            runner.check(n)
        except _Alone:
            rest.append(n)
        else:
            passed.append(n)
    each = (time.perf_counter() - t0) / max(len(names), 1)
    return {n: {"status": "pass", "reason": "", "time": each, "batched": True} for n in passed}, rest


def _worker(conn, backend: str, env: dict) -> None:
    os.environ.update(env)
    import warnings

    warnings.simplefilter("ignore")
    if backend == "kiln":
        # import before taking a job: a tree that does not import kills the worker at once,
        # which the pool notices, rather than being recorded as every case's failure
        import kiln.frontend.onnx_backend  # noqa: F401
    cases = node_cases.load_cases()
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        if isinstance(job, str):
            conn.send((job, {job: run_one(cases[job], backend)}, []))
        else:
            conn.send((job, *run_batch(cases, list(job))))


# ---------------------------------------------------------------------------------------------
# the pool: one in-flight job (a case, or a tuple of cases built together) per worker; timeouts
# and crashes restart the worker
class Pool:
    def __init__(self, backend: str, jobs: int, timeout: float, env: dict):
        self.backend, self.jobs, self.timeout, self.env = backend, jobs, timeout, env
        self.ctx = mp.get_context("spawn")

    def _spawn(self):
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(child, self.backend, self.env), daemon=True)
        p.start()
        child.close()
        return {"proc": p, "conn": parent, "job": None, "t0": 0.0}

    def _limit(self, job) -> float:
        # a batch builds one bigger model; it gets the time of a few single cases
        return self.timeout if isinstance(job, str) else 3 * self.timeout

    def run(self, jobs: list, progress=None) -> dict[str, dict]:
        todo = collections.deque(jobs)
        total = sum(1 if isinstance(j, str) else len(j) for j in jobs)
        results: dict[str, dict] = {}
        workers = [self._spawn() for _ in range(min(self.jobs, len(jobs)) or 1)]

        def feed(w):
            w["job"] = None
            if todo:
                w["job"] = todo.popleft()
                w["t0"] = time.perf_counter()
                w["conn"].send(w["job"])

        def done(res: dict[str, dict], alone: list[str]):
            for name, r in res.items():
                results[name] = r
                if progress:
                    progress(name, r, len(results), total)
            todo.extend(alone)  # after the other queued jobs: singles are fast to balance

        for w in workers:
            feed(w)
        deaths = 0  # in a row: a worker that cannot even start (Kiln fails to import) stops the run
        while any(w["job"] for w in workers):
            busy = [w for w in workers if w["job"]]
            ready = mpc.wait([w["conn"] for w in busy], timeout=1.0)
            for i, w in enumerate(workers):
                job = w["job"]
                if not job:
                    continue
                if w["conn"] in ready:
                    try:
                        _, res, alone = w["conn"].recv()
                        done(res, alone)
                        feed(w)
                        deaths = 0
                        continue
                    except (EOFError, OSError):
                        w["proc"].join(5)
                        code = w["proc"].exitcode
                        res = {"status": "crash", "reason": f"worker died (exit code {code})"}
                        deaths += 1
                        if deaths > 2 * self.jobs + 4:
                            for x in workers:
                                x["proc"].kill()
                            raise SystemExit(f"op_coverage: {deaths} {self.backend} workers died in a row "
                                             "(see their tracebacks above): is the tree importable?") from None
                elif time.perf_counter() - w["t0"] > self._limit(job):
                    w["proc"].kill()
                    w["proc"].join(5)
                    res = {"status": "timeout", "reason": f"timed out after {self._limit(job):.0f} s"}
                else:
                    continue
                if isinstance(job, str):
                    done({job: dict(res, time=time.perf_counter() - w["t0"])}, [])
                else:  # a batch crashed or hung: its cases are retried alone
                    done({}, list(job))
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


def kiln_jobs(cases, names: list[str], previous: dict[str, expectations.Expected],
              batch_size: int) -> list:
    """The Kiln run's jobs: batches (tuples) first, then single cases (names)."""
    if batch_size <= 1:
        return list(names)
    from kiln.frontend.onnx.converter import supported_ops

    known = set(supported_ops())

    def batchable(n: str) -> bool:
        c = cases[n]
        prev = previous.get(n)
        if prev is not None and (not prev.passes or prev.alone):
            # it failed last time (most likely it still does), or it needs the backend's
            # freeze-more retry: either would fail its batch, and splitting one costs rebuilds
            return False
        ops = {nd.op_type for nd in c.model.graph.node}
        return ops <= known and batching.batch_blocker(c) is None

    batches, _ = batching.plan_batches(cases, [n for n in names if batchable(n)], batch_size)
    in_batch = {n for b in batches for n in b.names}
    return [tuple(b.names) for b in batches] + [n for n in names if n not in in_batch]


# ---------------------------------------------------------------------------------------------
# reporting
def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("`", "'")


def _passes(res: dict, name: str) -> bool:
    return res.get(name, {}).get("status") == "pass"


def kiln_reason(r: dict | None, short: bool = False) -> str:
    """One line saying why Kiln failed a case (from its recorded result). ``short`` (for the
    expectation file) shortens the unsupported-op message and leaves out the source line of the
    innermost Kiln frame, which changes with every edit of that file."""
    if not r:
        return "not measured"
    if r["status"] == "mismatch":
        return f"mismatch: {r.get('reason', '')}"
    if r["status"] == "error" and short:
        # the expectation file's short form of the frontend's unsupported-op message
        reason = re.sub(r"the model uses \d+ unsupported ONNX op type\(s\): (.*?) \(nodes: [^)]*\)",
                        r"unsupported op type(s): \1", r.get("reason") or "error")
        where = r.get("where", "").rsplit(":", 1)[0]
        return reason + (f" ({where})" if where else "")
    if r["status"] == "error":
        where = f" ({r['where']})" if r.get("where") else ""
        return (r.get("reason") or "error") + where
    return f"{r['status']}: {r.get('reason', '')}"


def coverage(cases, res: dict) -> dict:
    """Whole-suite and per-op counts, and the op types ORT passes at least once and Kiln never."""
    ort, kiln = res.get("ort", {}), res.get("kiln", {})
    by_op: dict[str, list] = collections.defaultdict(list)
    for c in cases.values():
        by_op[c.op].append(c.name)
    rows = []
    for op in sorted(by_op, key=str.lower):
        ns = by_op[op]
        o = {n for n in ns if _passes(ort, n)}
        k = {n for n in ns if _passes(kiln, n)}
        rows.append({"op": op, "cases": len(ns), "ort": len(o), "kiln": len(k), "both": len(o & k)})
    names = list(cases)
    return {
        "total": len(names),
        "ort": sum(_passes(ort, n) for n in names),
        "kiln": sum(_passes(kiln, n) for n in names),
        "both": sum(_passes(ort, n) and _passes(kiln, n) for n in names),
        "rows": rows,
        "ort_only_ops": [r["op"] for r in rows if r["ort"] and not r["kiln"]],
        "kiln_only": sorted(n for n in names if _passes(kiln, n) and not _passes(ort, n)),
    }


def _constant_cases(cases, kiln: dict) -> list[str]:
    """Passing cases in which every data input decides a shape: the backend freezes them all
    and the model folds to a constant at import."""
    from kiln.frontend.onnx_backend import shape_inputs

    out = []
    for n, r in kiln.items():
        if r.get("status") != "pass" or n not in cases:
            continue
        model = cases[n].model
        inits = {t.name for t in model.graph.initializer}
        data = [i.name for i in model.graph.input if i.name not in inits]
        if data and set(shape_inputs(model)) >= set(data):
            out.append(n)
    return sorted(out)


def write_doc(cases, res: dict, path: str, meta: dict) -> tuple[str, dict]:
    ort, kiln = res.get("ort", {}), res.get("kiln", {})
    cov = coverage(cases, res)
    regen = expectations.REGENERATE
    lines = [
        "# ONNX node-suite coverage",
        "",
        f"Generated by `{regen}` — do not edit by hand.",
        "",
        f"- date: {meta.get('date', '?')}; onnx {meta.get('onnx', '?')}, onnxruntime "
        f"{meta.get('onnxruntime', '?')}; Kiln target `{meta.get('target', 'llvm')}`",
        "- cases: every case of the installed onnx's backend *node* test suite. A case's op is its "
        "single node's op type (`domain.OpType` outside the default domain); `*_expanded` cases run "
        "the op's function body, made of other ops, and count for the base op.",
        f"- regenerate: `{regen}` (ORT + Kiln in worker processes with a time limit per case; "
        "2 min on 2 idle cores, up to 15 when they are busy). It rewrites this page and "
        "`tests/onnx_node/expected_status.txt`, the expected status of every case, which "
        "`python -m pytest tests/onnx_node` enforces both ways: a case expected to pass that fails, "
        "and a case expected to fail that passes, fail the suite. After adding or fixing an op, run "
        f"it (or `{regen} -k 'test_(op1|op2)'` to re-measure only those cases) and commit both "
        "files. `KILN_NODE_SUITE_FAST=1` leaves the slow passing cases out of a quick local run.",
        "- comparison: the suite's own (shape, dtype, `allclose` with the case's rtol/atol, default "
        "1e-3/1e-7), for ORT (CPU EP) and Kiln alike.",
        "",
    ]
    if kiln:
        lines += [
            f"**Whole suite: Kiln passes {cov['kiln']} of {cov['total']} cases "
            f"({_pct(cov['kiln'], cov['total'])}); ONNX Runtime passes {cov['ort']} "
            f"({_pct(cov['ort'], cov['total'])}). Of the cases ORT passes, Kiln passes "
            f"{cov['both']} ({_pct(cov['both'], cov['ort'])}).**",
            "",
            f"Op types of which ORT passes at least one case and Kiln none: "
            f"{len(cov['ort_only_ops'])} (listed [below](#op-types-ort-passes-and-kiln-does-not); "
            "the goal is none).",
            "",
        ]
    else:
        lines += [f"{cov['total']} cases; ONNX Runtime passes {cov['ort']}.", ""]
    lines += [
        "| op | cases | ORT passes | Kiln passes | Kiln passes of ORT's |",
        "|---|---:|---:|---:|---:|",
        *[f"| {r['op']} | {r['cases']} | {r['ort']} | {r['kiln']} | {r['both']} |" for r in cov["rows"]],
        f"| **total** | **{cov['total']}** | **{cov['ort']}** | **{cov['kiln']}** | "
        f"**{cov['both']}** |",
        "",
    ]
    if kiln:
        times = sorted(r["time"] for r in kiln.values() if r.get("status") == "pass" and "time" in r)
        if times:
            lines += [
                f"Kiln time per passing case (prepare + compile + run + compare, cold kernel cache, "
                f"{meta.get('jobs', '?')} workers; a batched case gets its share of its batch): "
                f"median {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s, total "
                f"{sum(times):.0f} s.",
                "",
            ]
        ort_of = {r["op"]: r for r in cov["rows"]}
        lines += ["## Op types ORT passes and Kiln does not", "",
                  "Op types of which ONNX Runtime passes at least one case and Kiln none (cases "
                  "ORT passes / cases):", ""]
        lines += [f"- `{op}`: {ort_of[op]['ort']} / {ort_of[op]['cases']}"
                  for op in cov["ort_only_ops"]] or ["None."]
        lines.append("")
        lines += ["## Cases Kiln passes and ONNX Runtime fails", ""]
        lines += [f"- `{n}` — ORT: {_md(ort.get(n, {}).get('reason') or 'not run')}"
                  for n in cov["kiln_only"]] or ["None."]
        lines.append("")
        lines += ["## Cases Kiln fails", "",
                  "Every case Kiln does not pass, by op, with the reason recorded in "
                  "`tests/onnx_node/expected_status.txt`; *(ORT also fails)* marks the cases "
                  "ONNX Runtime fails too.", ""]
        fails = [c for c in cases.values() if not _passes(kiln, c.name)]
        by_op: dict[str, list] = collections.defaultdict(list)
        for c in fails:
            by_op[c.op].append(c.name)
        for op in sorted(by_op, key=str.lower):
            lines += [f"### {op}", ""]
            for n in sorted(by_op[op]):
                also = " *(ORT also fails)*" if not _passes(ort, n) else ""
                lines.append(f"- `{n}`{also} — {_md(kiln_reason(kiln.get(n)))}")
            lines.append("")
        const = _constant_cases(cases, kiln)
        if const:
            lines += ["## Passing cases compiled to constants (counted as passes)", "",
                      "Every input of these decides output shapes, so the backend freezes them "
                      "all and the model folds to a constant at import; they test the import and "
                      "constant folding, not a kernel:", "",
                      ", ".join(f"`{n}`" for n in const), ""]
    else:
        ort_fail = sorted(n for n in cases if not _passes(ort, n))
        lines += ["## Cases ONNX Runtime fails", ""]
        lines += [f"- `{n}` — {_md(ort.get(n, {}).get('reason') or 'not run')}" for n in ort_fail]
        lines.append("")
    text = "\n".join(lines)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text, cov


def write_expected(cases, res: dict, path: str, budget: float, onnx_version: str,
                   allow_drop: bool = False) -> dict[str, expectations.Expected]:
    """Write the expectation file from the Kiln results (cases without one keep their old line)."""
    ort, kiln = res.get("ort", {}), res.get("kiln", {})
    old: dict[str, expectations.Expected] = {}
    if os.path.exists(path):
        _, old = expectations.load(path)
    status: dict[str, str] = {}
    reason: dict[str, str] = {}
    for n in cases:
        r = kiln.get(n)
        if r is None:
            prev = old.get(n, expectations.Expected("fail", "not measured yet"))
            status[n], reason[n] = prev.status, prev.reason  # a pass keeps its slow mark
        elif r["status"] == "pass":
            # a case the backend compiled only after freezing extra inputs is never batched
            status[n], reason[n] = "pass", ("alone" if r.get("fallback") else "")
        else:
            status[n] = "crash" if r["status"] in ("crash", "timeout") else "fail"
            why = kiln_reason(r, short=True)
            reason[n] = ("ORT also fails; " + why) if n in ort and not _passes(ort, n) else why
    # A case that was expected to pass and fails now is a regression: keep it expected to pass
    # (the test suite must show it) unless --allow-drop says it is known and accepted.
    dropped = sorted(n for n in cases if n in old and old[n].passes and status[n] != "pass")
    if dropped:
        verb = "accepting (--allow-drop)" if allow_drop else "keeping them 'pass' (--allow-drop accepts them)"
        print(f"REGRESSIONS: {len(dropped)} case(s) expected to pass fail now; {verb}:")
        for n in dropped:
            print(f"  {n}: {reason[n]}")
            if not allow_drop:
                status[n], reason[n] = "pass", ""
    passing = [n for n in cases if status[n] == "pass"]

    # keep the fastest passing case of each op in the default run; mark the slowest of the
    # others slow until the default run fits the budget. Only cases built alone count: a batched
    # case's share of its batch is small, and leaving it out would not shorten its batch's build.
    def t(n: str) -> float:
        r = kiln.get(n, {})
        return 0.0 if r.get("batched") else r.get("time", 0.0)

    fastest: dict[str, str] = {}
    for n in passing:
        op = cases[n].op
        if op not in fastest or t(n) < t(fastest[op]):
            fastest[op] = n
    total = sum(t(n) for n in passing)
    for n in sorted(passing, key=lambda n: -t(n)):
        if total <= budget:
            break
        if n in fastest.values():
            continue
        reason[n] = " ".join(["slow", *reason[n].split()])
        total -= t(n)
    out = {n: expectations.Expected(status[n], reason[n]) for n in cases}
    expectations.dump(out, onnx_version, path)
    return out


# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ort,kiln", help="ort, kiln or ort,kiln (default)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    ap.add_argument("-k", "--filter", default="", help="regex (re.search) on case names")
    ap.add_argument("--ops", default="", help="comma-separated op names to restrict to")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH,
                    help="Kiln cases per merged model (1: build every case alone)")
    ap.add_argument("--cache-dir", default="", help="KILN_CACHE_DIR for Kiln (default: fresh)")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--doc", default=DOC)
    ap.add_argument("--expected", default=expectations.PATH, help="the expectation file to write")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                    help="seconds of default (non-slow) pytest run (recorded cold times)")
    ap.add_argument("--allow-drop", action="store_true",
                    help="accept cases expected to pass that fail now (write them 'fail')")
    ap.add_argument("--no-write", action="store_true", help="print only; write no files")
    ap.add_argument("--report-only", action="store_true",
                    help="no runs: rewrite the doc / expectation file from --results")
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
    if res.get("meta", {}).get("onnx") not in (None, onnx.__version__):
        res = {}  # results of another onnx version's suite: start over
    # results of cases no longer in the suite would count in nothing; drop them
    for b in ("ort", "kiln"):
        if b in res:
            res[b] = {n: r for n, r in res[b].items() if n in cases}
    meta = res.setdefault("meta", {})
    previous: dict[str, expectations.Expected] = {}
    if os.path.exists(args.expected):
        _, previous = expectations.load(args.expected)
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
                jobs = kiln_jobs(cases, names, previous, args.batch)
            else:
                jobs = list(names)

            def progress(name, r, i, n, b=b):
                if not args.quiet:
                    mark = "ok " if r["status"] == "pass" else r["status"].upper()
                    extra = "" if r["status"] == "pass" else "  " + r.get("reason", "")[:150]
                    print(f"[{b} {i}/{n}] {mark} {name} {r.get('time', 0.0):.2f}s{extra}", flush=True)

            t0 = time.time()
            out = Pool(b, args.jobs, args.timeout, env).run(jobs, progress)
            wall = time.time() - t0
            res.setdefault(b, {}).update(out)
            npass = sum(1 for n in names if out.get(n, {}).get("status") == "pass")
            nb = sum(1 for j in jobs if not isinstance(j, str))
            print(f"== {b}: {npass}/{len(names)} pass, wall {wall:.0f} s with {args.jobs} "
                  f"workers" + (f" ({nb} batches planned)" if nb else ""), flush=True)
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
    if args.no_write:
        cov = coverage(cases, res)
    else:
        _, cov = write_doc(cases, res, args.doc, meta)
        print(f"wrote {args.doc}")
        if res.get("kiln"):
            exp = write_expected(cases, res, args.expected, args.budget, onnx.__version__,
                                 args.allow_drop)
            n_pass = sum(e.passes for e in exp.values())
            print(f"wrote {args.expected}: {len(exp)} cases, {n_pass} pass "
                  f"({sum(e.slow for e in exp.values())} marked slow)")
    print(f"whole suite: {cov['total']} cases; ORT passes {cov['ort']}, Kiln passes "
          f"{cov['kiln']} ({cov['both']} of ORT's {cov['ort']}; {len(cov['kiln_only'])} that ORT fails)")
    if res.get("kiln"):
        print(f"op types ORT passes at least once and Kiln never ({len(cov['ort_only_ops'])}): "
              + (", ".join(cov["ort_only_ops"]) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
