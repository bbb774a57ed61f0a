"""ASan + UBSan over generated C kernels: no out-of-bounds access, no undefined behaviour.

Each group of :mod:`tests.sanitizers.kernel_cases` runs in a child Python whose kernels are
built for the ``c`` target with ``-fsanitize=address -fsanitize=undefined
-fno-omit-frame-pointer`` (through the target's ``-cflags`` option) and which has the ASan
runtime preloaded, since Python itself is not built with it. A test fails when the child
exits non-zero or when a sanitizer printed a report. Skipped, with the reason, where the C
compiler has no ASan runtime. See ``docs/dev/fuzzing.md``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.contrib.cc import get_cc
from kiln.runtime.errors import CompileError

from tests.sanitizers.kernel_cases import DEFAULT_CFLAGS, expected_ok_lines

ROOT = Path(__file__).resolve().parents[2]

#: Markers of a sanitizer report in the child's output.
REPORT_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: UndefinedBehaviorSanitizer",
                  "SUMMARY: AddressSanitizer", "SUMMARY: UndefinedBehaviorSanitizer")


def _asan_runtime() -> tuple[str | None, str]:
    """(path of the compiler's libasan.so, "") or (None, why the job cannot run)."""
    if not sys.platform.startswith("linux"):
        return None, f"LD_PRELOAD of the ASan runtime is only wired up on Linux, not {sys.platform}"
    try:
        cc = shlex.split(get_cc())
    except CompileError as err:
        return None, str(err)
    try:
        out = subprocess.run(cc + ["-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"cannot ask {cc[0]} for its ASan runtime: {err}"
    path = out.stdout.strip()
    # gcc prints the bare name back when it has no such library (clang keeps its own elsewhere).
    if out.returncode != 0 or not os.path.isabs(path) or not os.path.exists(path):
        return None, f"{shlex.join(cc)} has no ASan runtime (-print-file-name=libasan.so gave {path!r})"
    return path, ""


LIBASAN, WHY_NOT = _asan_runtime()
pytestmark = pytest.mark.skipif(LIBASAN is None, reason=f"ASan/UBSan job skipped: {WHY_NOT}")


def run_under_sanitizers(groups: list[str], tmp_path: Path, timeout: int = 300) -> str:
    """Run ``kernel_cases`` groups in a sanitized child; return its output, fail on any report."""
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=f"{LIBASAN} {env.get('LD_PRELOAD', '')}".strip(),
        # Python and NumPy leak by design at exit; abort on the first error of any kind.
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:exitcode=86",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87",
        KILN_SAN_CFLAGS=os.environ.get("KILN_SAN_CFLAGS", DEFAULT_CFLAGS),
        KILN_CACHE_DIR=str(tmp_path / "cache"),  # sanitized builds never meet plain ones
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    proc = subprocess.run([sys.executable, "-m", "tests.sanitizers.kernel_cases", *groups], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    reports = [m for m in REPORT_MARKERS if m in out]
    assert proc.returncode == 0 and not reports, (
        f"sanitized run of {groups} exited {proc.returncode} with reports {reports}:\n{out[-6000:]}"
    )
    # A clean run proves nothing unless the kernels were really instrumented: every library
    # the child compiled (all land in its private cache) must call into both runtimes.
    libs = sorted((tmp_path / "cache").rglob("*.so"))
    assert libs, f"the sanitized run of {groups} compiled no library"
    for lib in libs:
        data = lib.read_bytes()
        assert b"__asan_report" in data and b"__ubsan_handle" in data, f"{lib} is not instrumented"
    return out


@pytest.mark.parametrize("groups", [
    ["elemwise"],
    ["nn", "conv_nchwc"],
    ["reduce", "transform", "index_bounds", "softmax"],
    ["fused", "cnn"],
], ids=lambda g: "+".join(g))
def test_kernels_clean_under_asan_ubsan(groups, tmp_path):
    out = run_under_sanitizers(groups, tmp_path)
    oks = [line for line in out.splitlines() if line.startswith("ok ")]
    assert len(oks) == sum(expected_ok_lines(g) for g in groups), out[-3000:]


def test_gather_on_zero_size_axis(tmp_path):
    # Gather along an empty axis once read past the data in the fused take kernel
    # (heap-buffer-overflow); every index is out of range there, so it must be a KernelError.
    out = run_under_sanitizers(["gather_zero_axis"], tmp_path)
    assert out.count("ok gather_zero_axis") == expected_ok_lines("gather_zero_axis"), out[-3000:]


@pytest.mark.parametrize("group,report", [
    ("self_check_overflow", "ERROR: AddressSanitizer: heap-buffer-overflow"),
    ("self_check_ub", "runtime error: signed integer overflow"),
])
def test_sanitizer_job_can_fail(group, report, tmp_path):
    """The job must be able to fail: a kernel writing one element past its output (ASan) and
    one overflowing a signed int (UBSan) are both reported, and the child does not exit 0."""
    with pytest.raises(AssertionError, match=report):
        run_under_sanitizers([group], tmp_path)
