"""Libraries with parallel kernels, shared by the thread-pool and library-lifetime tests.

``par_add_one`` runs on the crt thread pool (``KilnBackendParallelLaunch``), so loading and
running one of these libraries exercises the loader's routing to the process-wide pool.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import kiln.runtime as rt
from tests.executor.executor_helpers import GraphBuilder

KERNELS = r"""
#include <kiln/c_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef struct {
  const float* a;
  float* b;
  int64_t n;
} AddOne;

static int32_t add_one_chunk(int32_t task, int32_t num_task, void* cdata) {
  AddOne* c = (AddOne*)cdata;
  int64_t lo = c->n * task / num_task, hi = c->n * (task + 1) / num_task;
  for (int64_t i = lo; i < hi; ++i) c->b[i] = c->a[i] + 1.0f;
  return 0;
}

/* par_add_one(in, out): out = in + 1 (float32), in KilnGetNumThreads() parallel chunks. */
KILN_DLL int32_t par_add_one(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  if (n != 2 || codes[0] != kKilnDLTensorHandle || codes[1] != kKilnDLTensorHandle) {
    KilnAPISetLastError("par_add_one: expected (DLTensor* in, DLTensor* out)");
    return -1;
  }
  const DLTensor* x = (const DLTensor*)args[0].v_handle;
  DLTensor* y = (DLTensor*)args[1].v_handle;
  AddOne c = {(const float*)((const char*)x->data + x->byte_offset),
              (float*)((char*)y->data + y->byte_offset), 1};
  for (int i = 0; i < x->ndim; ++i) c.n *= x->shape[i];
  return KilnBackendParallelLaunch(add_one_chunk, &c, KilnGetNumThreads());
}

typedef struct {
  atomic_int failed;
  atomic_int launcher_tasks;
  pthread_t launcher;
} FailOnWorker;

/* The first task the launching thread claims waits, up to 5 s, until a task on another thread
 * has failed; every other task fails. Which task id each thread claims is a race (a spinning
 * worker may claim task 0 first), so the wait is keyed by thread, not by task id: the failure
 * happens on a pool worker unless no worker claimed a task within 5 s, and the message says
 * where it happened. */
static int32_t fail_on_worker(int32_t task, int32_t num_task, void* cdata) {
  FailOnWorker* c = (FailOnWorker*)cdata;
  (void)task; (void)num_task;
  int on_launcher = pthread_equal(pthread_self(), c->launcher);
  if (on_launcher && atomic_fetch_add(&c->launcher_tasks, 1) == 0) {
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < 5000 && !atomic_load(&c->failed); ++i) nanosleep(&ms, NULL);
    if (atomic_load(&c->failed)) return 0;
  }
  KilnAPISetLastError(on_launcher ? "par_fail: task failed on the launching thread"
                                  : "par_fail: task failed on a pool thread");
  atomic_store(&c->failed, 1);
  return -1;
}

/* par_fail(): a two-task parallel loop in which one task (normally on a pool worker) fails with a message. */
KILN_DLL int32_t par_fail(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc, void* h) {
  FailOnWorker c;
  atomic_init(&c.failed, 0);
  atomic_init(&c.launcher_tasks, 0);
  c.launcher = pthread_self();
  return KilnBackendParallelLaunch(fail_on_worker, &c, 2);
}
"""

SHAPE = (64,)


def factory(kernels: str = KERNELS) -> rt.ExecutorFactoryModule:
    """A one-kernel model, y = par_add_one(x) on a float32 vector of ``SHAPE``."""
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    y = b.op("par_add_one", [x], name="y")
    return rt.ExecutorFactoryModule(b.json([y]), rt.csource_module(kernels, ["par_add_one", "par_fail"]), {})


LINKED_PARAM = r"""
#include <string.h>
static float w_data[64] __attribute__((aligned(64))) = {W_VALUES};

/* The link_params protocol (docs/compiler.md): the address of param "w", data in the library. */
KILN_DLL int32_t _lookup_linked_param(KilnValue* args, int32_t* codes, int32_t n, KilnValue* rv, int32_t* rc,
                                      void* h) {
  int found = n == 1 && codes[0] == kKilnStr && strcmp(args[0].v_str, "w") == 0;
  rv->v_handle = found ? w_data : NULL;
  *rc = found ? kKilnOpaqueHandle : kKilnNullptr;
  return 0;
}
""".replace("W_VALUES", ", ".join(str(i) for i in range(64)))


def linked_param_factory() -> rt.ExecutorFactoryModule:
    """y = par_add_one(w), where w = arange(64) is a param linked into the library."""
    b = GraphBuilder()
    w = b.input("w", SHAPE)
    y = b.op("par_add_one", [w], name="y")
    lib = rt.csource_module(KERNELS + LINKED_PARAM, ["par_add_one", "par_fail", "_lookup_linked_param"])
    return rt.ExecutorFactoryModule(b.json([y]), lib, {})


def export(path: str | os.PathLike, linked_param: bool = False) -> str:
    """Export :func:`factory` (or :func:`linked_param_factory`) to ``path`` (``.so`` or ``.tar``)."""
    (linked_param_factory() if linked_param else factory()).export_library(os.fspath(path))
    return os.fspath(path)


def run_fresh(script: str, *args: str, timeout: float = 120) -> str:
    """Run a Python snippet in a fresh interpreter (a process no other library has touched)."""
    env = dict(os.environ)
    env.pop("KILN_NUM_THREADS", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
