"""A parallel task's error reaches the thread that launched it.

The error message is thread-local (``KilnGetLastError`` answers for the calling thread), and
the tasks of ``KilnBackendParallelLaunch`` run on pool threads. A kernel whose parallel body
fails on a worker (an index out of range in a gather, a failed workspace allocation) must
still leave the worker's message, not a stale one, for the executor to report.
"""

from __future__ import annotations

import time

import pytest

import kiln.runtime as rt
from kiln.runtime.errors import KernelError

# The launching thread keeps its own task busy (bounded wait) until a task on another thread
# has failed, so the failure deterministically happens on a worker.
KERNEL = r"""
#include <kiln/c_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef struct { pthread_t caller; atomic_int failed; } fail_closure_t;

static int32_t fail_body(int32_t task_id, int32_t num_task, void* cdata) {
  fail_closure_t* c = (fail_closure_t*)cdata;
  (void)task_id; (void)num_task;
  if (!pthread_equal(pthread_self(), c->caller)) {
    KilnAPISetLastError("task failed on a worker thread");
    atomic_store(&c->failed, 1);
    return -1;
  }
  struct timespec ts = {0, 100000};
  for (int i = 0; i < 50000 && !atomic_load(&c->failed); ++i) nanosleep(&ts, NULL);
  return 0;
}

static int32_t noop_body(int32_t task_id, int32_t num_task, void* cdata) {
  (void)task_id; (void)num_task; (void)cdata;
  return 0;
}

/* Creates the pool's workers (a worker created during a launch only joins later ones). */
KILN_DLL int32_t warm_pool(KilnValue* args, int32_t* type_codes, int32_t num_args, KilnValue* out_ret_value,
                           int32_t* out_ret_tcode, void* resource_handle) {
  (void)args; (void)type_codes; (void)num_args; (void)out_ret_value; (void)out_ret_tcode; (void)resource_handle;
  return KilnBackendParallelLaunch(noop_body, NULL, 2);
}

KILN_DLL int32_t fail_on_worker(KilnValue* args, int32_t* type_codes, int32_t num_args, KilnValue* out_ret_value,
                                int32_t* out_ret_tcode, void* resource_handle) {
  (void)args; (void)type_codes; (void)num_args; (void)out_ret_value; (void)out_ret_tcode; (void)resource_handle;
  fail_closure_t c;
  c.caller = pthread_self();
  atomic_init(&c.failed, 0);
  KilnAPISetLastError("stale message of the launching thread");
  return KilnBackendParallelLaunch(fail_body, &c, 2);
}
"""


def test_worker_error_message_reaches_the_launching_thread():
    mod = rt.csource_module(KERNEL, ["warm_pool", "fail_on_worker"])
    f = mod["fail_on_worker"]
    mod.set_num_threads(2)
    mod["warm_pool"]()
    time.sleep(0.3)  # a new worker reads the pool's generation when it first runs: let it start
    try:
        if mod.library().get_num_threads() < 2:
            pytest.skip("the thread pool has one thread here")
        with pytest.raises(KernelError, match="task failed on a worker thread"):
            f()
    finally:
        mod.set_num_threads(0)
