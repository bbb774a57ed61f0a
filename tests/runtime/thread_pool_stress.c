/*
 * Stress harness for the crt thread pool (compiled with kiln_crt.c by test_thread_pool.py).
 *
 *   thread_pool_stress LAUNCHES MAX_TASKS THREADS TASK_WORK
 *
 * Issues LAUNCHES back-to-back KilnBackendParallelLaunch calls, the k-th with
 * 2 + k % (MAX_TASKS - 1) tasks, and checks after each that every task ran exactly once.
 * Small bodies (TASK_WORK empty iterations each: enough that workers take part) and no
 * pause between launches make the window between two launches as narrow as it gets, which is where a pool that publishes a launch in several steps
 * loses a task count (the launcher then spins forever) or runs a task twice.
 *
 * Prints "ok <launches> launches, <n> tasks run by workers" and exits 0; exits 1 (with a
 * message) on a wrong count or a failed launch. A hang is detected by the caller's timeout.
 */
#include <kiln/c_runtime_api.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_t main_thread;
static int task_work; /* iterations of busy work per task, so that workers get to claim tasks */
static atomic_long worker_tasks; /* tasks run by pool workers: shows the pool really helped */

static int32_t count_task(int32_t task_id, int32_t num_task, void* cdata) {
  (void)num_task;
  for (volatile int i = 0; i < task_work; ++i) {
  }
  atomic_fetch_add_explicit(&((atomic_int*)cdata)[task_id], 1, memory_order_relaxed);
  if (!pthread_equal(pthread_self(), main_thread)) atomic_fetch_add_explicit(&worker_tasks, 1, memory_order_relaxed);
  return 0;
}

static int32_t fail_last_task(int32_t task_id, int32_t num_task, void* cdata) {
  (void)cdata;
  return task_id == num_task - 1 ? -1 : 0;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s LAUNCHES MAX_TASKS THREADS TASK_WORK\n", argv[0]);
    return 2;
  }
  long launches = atol(argv[1]);
  int max_tasks = atoi(argv[2]);
  int threads = atoi(argv[3]);
  task_work = atoi(argv[4]);
  if (launches < 1 || max_tasks < 2 || threads < 1 || task_work < 0) {
    fprintf(stderr, "bad arguments\n");
    return 2;
  }
  main_thread = pthread_self();
  KilnSetNumThreads(threads);
  if (KilnGetNumThreads() != threads) {
    fprintf(stderr, "KilnGetNumThreads() = %d after KilnSetNumThreads(%d)\n", KilnGetNumThreads(), threads);
    return 1;
  }
  atomic_int* hits = calloc((size_t)max_tasks, sizeof(atomic_int));
  if (!hits) return 2;
  for (long k = 0; k < launches; ++k) {
    int n = 2 + (int)(k % (max_tasks - 1));
    if (KilnBackendParallelLaunch(count_task, hits, n) != 0) {
      fprintf(stderr, "launch %ld failed\n", k);
      return 1;
    }
    for (int t = 0; t < n; ++t) {
      int h = atomic_load_explicit(&hits[t], memory_order_relaxed);
      if (h != 1) {
        fprintf(stderr, "launch %ld (%d tasks): task %d ran %d times\n", k, n, t, h);
        return 1;
      }
      atomic_store_explicit(&hits[t], 0, memory_order_relaxed);
    }
    /* Now and then a failing task: the launch must report it and the pool stay usable. */
    if (k % 9973 == 0 && KilnBackendParallelLaunch(fail_last_task, NULL, n) == 0) {
      fprintf(stderr, "launch %ld: a failing task was not reported\n", k);
      return 1;
    }
  }
  printf("ok %ld launches, %ld tasks run by workers\n", launches, atomic_load(&worker_tasks));
  free(hits);
  return 0;
}
