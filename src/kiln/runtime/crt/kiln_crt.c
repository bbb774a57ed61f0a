/*
 * The small C runtime compiled into every library Kiln produces.
 *
 * It gives a library everything it needs from a runtime without linking to one:
 * a thread-local error message, aligned workspace memory, a thread pool for
 * parallel loops, and KilnRunSequence, the native loop the graph executor uses so
 * that running a model costs one foreign call, not one per operator.
 */
#define _GNU_SOURCE
#include <kiln/c_runtime_api.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------- errors ---------------- */
static __thread char kiln_last_error[1024];

static void kiln_default_set_last_error(const char* msg) {
  snprintf(kiln_last_error, sizeof(kiln_last_error), "%s", msg ? msg : "");
}

KILN_DLL const char* KilnGetLastError(void) { return kiln_last_error; }
KILN_DLL int32_t KilnABIVersion(void) { return KILN_ABI_VERSION; }

/* ---------------- workspace ---------------- */
static void* kiln_default_alloc_workspace(int32_t device_type, int32_t device_id, uint64_t nbytes,
                                          int32_t code_hint, int32_t bits_hint) {
  (void)device_id; (void)code_hint; (void)bits_hint;
  if (device_type != kDLCPU) {
    kiln_default_set_last_error("workspace: only CPU workspace is provided by the default allocator");
    return NULL;
  }
  size_t size = (size_t)((nbytes + 63) / 64 * 64);
  if (size == 0) size = 64;
  void* p = NULL;
  if (posix_memalign(&p, 64, size) != 0) {
    kiln_default_set_last_error("workspace: out of memory");
    return NULL;
  }
  return p;
}

static int32_t kiln_default_free_workspace(int32_t device_type, int32_t device_id, void* ptr) {
  (void)device_type; (void)device_id;
  free(ptr);
  return 0;
}

/* ---------------- thread pool ---------------- */
#define KILN_MAX_THREADS 256

static pthread_mutex_t pool_launch_mu = PTHREAD_MUTEX_INITIALIZER; /* one launch at a time */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cv = PTHREAD_COND_INITIALIZER;
static int32_t pool_started = 0;     /* workers created (excluding the caller) */
static int32_t pool_num_threads = 0; /* 0: not decided yet */
static atomic_int pool_generation = 0;
static KilnParallelLambda pool_body;
static void* pool_cdata;
static int32_t pool_num_task;
static atomic_int pool_next_task;
static atomic_int pool_pending;  /* tasks not finished */
static atomic_int pool_error;

static int32_t kiln_decide_threads(void) {
  const char* env = getenv("KILN_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env) > KILN_MAX_THREADS ? KILN_MAX_THREADS : atoi(env);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > KILN_MAX_THREADS ? KILN_MAX_THREADS : (int32_t)n;
}

KILN_DLL void KilnSetNumThreads(int32_t n) {
  pthread_mutex_lock(&pool_launch_mu);
  pool_num_threads = n > 0 ? (n > KILN_MAX_THREADS ? KILN_MAX_THREADS : n) : kiln_decide_threads();
  pthread_mutex_unlock(&pool_launch_mu);
}

KILN_DLL int32_t KilnGetNumThreads(void) {
  if (pool_num_threads == 0) pool_num_threads = kiln_decide_threads();
  return pool_num_threads;
}

static void kiln_pool_drain(void) {
  for (;;) {
    int t = atomic_fetch_add(&pool_next_task, 1);
    if (t >= pool_num_task) break;
    if (pool_body(t, pool_num_task, pool_cdata) != 0) atomic_store(&pool_error, 1);
    atomic_fetch_sub(&pool_pending, 1);
  }
}

static void* kiln_pool_worker(void* arg) {
  (void)arg;
  int seen = atomic_load(&pool_generation);
  for (;;) {
    /* Spin briefly: back-to-back parallel loops are the common case in a model run. */
    int spins = 0;
    while (atomic_load(&pool_generation) == seen && spins < 200000) {
      ++spins;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    if (atomic_load(&pool_generation) == seen) {
      pthread_mutex_lock(&pool_mu);
      while (atomic_load(&pool_generation) == seen) pthread_cond_wait(&pool_cv, &pool_mu);
      pthread_mutex_unlock(&pool_mu);
    }
    seen = atomic_load(&pool_generation);
    kiln_pool_drain();
  }
  return NULL;
}

static int32_t kiln_default_parallel_launch(KilnParallelLambda body, void* cdata, int32_t num_task) {
  int32_t nthreads = KilnGetNumThreads();
  if (num_task <= 1 || nthreads <= 1 || pthread_mutex_trylock(&pool_launch_mu) != 0) {
    /* Serial fallback: one thread, one task, or a launch already running on another thread. */
    for (int32_t t = 0; t < num_task; ++t) {
      if (body(t, num_task, cdata) != 0) return -1;
    }
    return 0;
  }
  while (pool_started < nthreads - 1) {
    pthread_t th;
    if (pthread_create(&th, NULL, kiln_pool_worker, NULL) != 0) break;
    pthread_detach(th);
    ++pool_started;
  }
  pool_body = body;
  pool_cdata = cdata;
  pool_num_task = num_task;
  atomic_store(&pool_error, 0);
  atomic_store(&pool_next_task, 0);
  atomic_store(&pool_pending, num_task);
  pthread_mutex_lock(&pool_mu);
  atomic_fetch_add(&pool_generation, 1);
  pthread_cond_broadcast(&pool_cv);
  pthread_mutex_unlock(&pool_mu);
  kiln_pool_drain();
  while (atomic_load(&pool_pending) > 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  int32_t err = atomic_load(&pool_error);
  pthread_mutex_unlock(&pool_launch_mu);
  return err ? -1 : 0;
}

/* ---------------- service pointers (loader may overwrite) ---------------- */
KILN_DLL void* (*__KilnBackendAllocWorkspace)(int32_t, int32_t, uint64_t, int32_t, int32_t) =
    kiln_default_alloc_workspace;
KILN_DLL int32_t (*__KilnBackendFreeWorkspace)(int32_t, int32_t, void*) = kiln_default_free_workspace;
KILN_DLL int32_t (*__KilnBackendParallelLaunch)(KilnParallelLambda, void*, int32_t) =
    kiln_default_parallel_launch;
KILN_DLL void (*__KilnAPISetLastError)(const char*) = kiln_default_set_last_error;

/* ---------------- executor dispatch ---------------- */
KILN_DLL int32_t KilnRunSequence(const KilnOpCall* calls, int32_t n) {
  KilnValue ret;
  int32_t ret_code;
  for (int32_t i = 0; i < n; ++i) {
    const KilnOpCall* c = &calls[i];
    if (c->fn(c->args, c->type_codes, c->num_args, &ret, &ret_code, NULL) != 0) return i;
  }
  return -1;
}
