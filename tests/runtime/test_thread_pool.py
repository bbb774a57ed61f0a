"""The crt thread pool: back-to-back launches never hang, and a process has one pool.

The stress test compiles ``thread_pool_stress.c`` with the crt into a program and runs it
under a timeout, so a pool that loses a task fails the test instead of hanging CI. The pool
before the epoch-packed claim word (it published a launch in several stores) hung or ran a
task twice in each configuration below on a 2-core Zen 3, in most runs within 1,000,000
launches.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

import kiln.runtime as rt
from kiln.contrib import cc
from tests.runtime import library_support as support

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "thread_pool_stress.c")

# (launches, max tasks per launch, threads, busy work per task): tiny tasks make the window
# between two launches narrowest; some work lets workers claim tasks; more threads than the
# 2 cores of CI makes preemption inside that window likely.
CONFIGS = [
    (1_000_000, 4, 2, 0),
    (1_000_000, 8, 4, 50),
    (1_000_000, 4, 2, 200),
    (1_000_000, 32, 3, 0),
]
TIMEOUT_S = 120  # a correct pool needs a few seconds per configuration on a busy 2-core box


@pytest.fixture(scope="module")
def stress_program(tmp_path_factory) -> str:
    exe = str(tmp_path_factory.mktemp("pool") / "thread_pool_stress")
    compiler = shlex.split(cc.get_cc())
    subprocess.run(
        [*compiler, "-O2", "-pthread", "-I", rt.include_path(), HARNESS, rt.crt_source_path(), "-o", exe],
        check=True,
        capture_output=True,
    )
    return exe


@pytest.mark.parametrize("launches,max_tasks,threads,work", CONFIGS)
def test_back_to_back_launches(stress_program, launches, max_tasks, threads, work):
    try:
        proc = subprocess.run(
            [stress_program, str(launches), str(max_tasks), str(threads), str(work)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the thread pool hung: {launches} launches not done in {TIMEOUT_S} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.match(r"ok (\d+) launches, (\d+) tasks run by workers", proc.stdout)
    assert m and int(m.group(1)) == launches, proc.stdout


# ------------------------------------------------------------------------------------------
# one pool per process

COUNT_THREADS = """
    import json, os, sys
    import numpy as np
    import kiln.runtime as rt
    from kiln.runtime import shared_crt

    paths, threads = sys.argv[1:-1], int(sys.argv[-1])
    before = len(os.listdir("/proc/self/task"))
    mods = [rt.load_module(p) for p in paths]
    mods[-1].get_lib().set_num_threads(threads)  # any library: the pool is the process's
    x = np.arange(64, dtype="float32")
    for mod in mods:
        m = rt.GraphModule(mod["default"](rt.cpu()))
        m.run(x=x)
        assert (m.get_output(0).numpy() == x + 1).all()
    print(json.dumps({
        "new_threads": len(os.listdir("/proc/self/task")) - before,
        "num_threads": [mod.get_lib().get_num_threads() for mod in mods],
        "owner": shared_crt.owner_path(),
    }))
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> str:
    return support.export(tmp_path_factory.mktemp("shared") / "m.so")


def test_twenty_libraries_share_one_pool(library, tmp_path):
    paths = []
    for i in range(20):  # 20 distinct files: the system loader maps each one separately
        paths.append(str(tmp_path / f"lib{i}.so"))
        shutil.copyfile(library, paths[-1])
    out = json.loads(support.run_fresh(COUNT_THREADS, *paths, "3"))
    # One pool of 3 threads: the caller plus 2 workers (one pool per library made 40).
    assert out["new_threads"] == 2, out
    assert out["num_threads"] == [3] * 20, out
    assert out["owner"] == paths[0]


FAIL_ON_WORKER = """
    import sys
    import numpy as np
    import kiln.runtime as rt
    from kiln.runtime.errors import KernelError

    owner, second = (rt.load_module(p) for p in sys.argv[1:3])
    second.get_lib().set_num_threads(2)
    x = rt.ndarray.array(np.zeros(64, "float32"))
    second.get_function("par_add_one", query_imports=True)(x, x)  # the worker is up and spinning
    try:
        second.get_function("par_fail", query_imports=True)()
    except KernelError as err:
        print(err)
"""


def test_task_error_on_a_worker_reaches_python(library, tmp_path):
    # The second library runs on the first one's pool; the failing task runs on a worker
    # thread, records its message with its library's error setter (routed to the owner's),
    # and the pool forwards it to the launching thread.
    paths = [str(tmp_path / "owner.so"), str(tmp_path / "second.so")]
    for p in paths:
        shutil.copyfile(library, p)
    out = support.run_fresh(FAIL_ON_WORKER, *paths)
    assert "par_fail: task failed on a pool thread" in out, out
