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
#include <stdarg.h>
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
    /* Through the service pointer: a loader may route errors to another library's buffer. */
    KilnAPISetLastError("workspace: only CPU workspace is provided by the default allocator");
    return NULL;
  }
  size_t size = (size_t)((nbytes + 63) / 64 * 64);
  if (size == 0) size = 64;
  void* p = NULL;
  if (posix_memalign(&p, 64, size) != 0) {
    KilnAPISetLastError("workspace: out of memory");
    return NULL;
  }
  return p;
}

static int32_t kiln_default_free_workspace(int32_t device_type, int32_t device_id, void* ptr) {
  (void)device_type; (void)device_id;
  free(ptr);
  return 0;
}

/* ---------------- thread pool ----------------
 *
 * One launch runs at a time (pool_launch_mu; a launch that finds the pool busy -- a nested
 * launch from a task, or a second caller thread -- runs its tasks serially instead).
 *
 * Correct by construction: a task can only be claimed through pool_claim, one 64-bit word
 * holding (epoch << 32 | tasks not yet claimed). The launcher writes the launch's
 * description (body, cdata, num_task, pending) first and then publishes it with a single
 * release store of a new epoch and the full task count; a claim is a compare-and-swap that
 * takes one task from that count. So
 *   - the unclaimed count is non-zero only while its launch is in flight: a worker that
 *     wakes late, or is still looping after the previous launch, either claims a task of
 *     the launch in flight or finds nothing -- it can never take a task of a launch that
 *     is not yet published, nor decrement a counter before the launcher has set it;
 *   - the description is read only after a successful claim (which acquires the publishing
 *     store), and the launcher rewrites it only after every claimed task has finished
 *     (pool_pending reaches 0), so a worker never sees half of two launches.
 * The epoch half tells sleeping/spinning workers that a new launch exists (and makes a
 * compare-and-swap of a stale word fail even if two launches have the same task count).
 *
 * When a library is loaded through kiln.runtime, the loader points its service pointers
 * (__KilnBackendParallelLaunch, __KilnBackendGetNumThreads, __KilnBackendSetNumThreads,
 * __KilnAPISetLastError) at those of the first library loaded, so N libraries share one
 * pool, one set of worker threads and one error buffer (see kiln/runtime/shared_crt.py;
 * that library is never unloaded). A library used from C on its own keeps its defaults.
 */
#define KILN_MAX_THREADS 256
#define KILN_POOL_SPINS 200000 /* ~ a few ms of pause before a worker sleeps */

static pthread_mutex_t pool_launch_mu = PTHREAD_MUTEX_INITIALIZER; /* one launch at a time */
static pthread_mutex_t pool_sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_sleep_cv = PTHREAD_COND_INITIALIZER;
static _Atomic uint64_t pool_claim;  /* epoch << 32 | tasks of the launch not yet claimed */
static atomic_int pool_pending;      /* tasks of the launch not yet finished */
static atomic_int pool_error;        /* a task of the launch failed */
static atomic_int pool_sleepers;     /* workers blocked (or about to block) on pool_sleep_cv */
static atomic_int pool_num_threads;  /* 0: not decided yet */
/* Written only by the launcher, holding pool_launch_mu, while no launch is in flight. */
static uint32_t pool_epoch;
static int32_t pool_started; /* workers created (the launcher is thread 0) */
static KilnParallelLambda pool_body;
static void* pool_cdata;
static int32_t pool_num_task;
/* The first failing task's message: it was recorded in the thread-local error of the thread that
 * ran the task, which may be a worker; the launching thread re-records it as its own. */
static char pool_error_msg[sizeof(kiln_last_error)];

static inline void kiln_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int32_t kiln_decide_threads(void) {
  const char* env = getenv("KILN_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env) > KILN_MAX_THREADS ? KILN_MAX_THREADS : atoi(env);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > KILN_MAX_THREADS ? KILN_MAX_THREADS : (int32_t)n;
}

static void kiln_pool_set_num_threads(int32_t n) {
  /* No lock: a launch in flight only reads the count to decide which workers help. */
  atomic_store(&pool_num_threads, n > 0 ? (n > KILN_MAX_THREADS ? KILN_MAX_THREADS : n) : kiln_decide_threads());
}

static int32_t kiln_pool_get_num_threads(void) {
  int32_t n = atomic_load_explicit(&pool_num_threads, memory_order_relaxed);
  if (n == 0) {
    int32_t expected = 0;
    n = kiln_decide_threads();
    if (!atomic_compare_exchange_strong(&pool_num_threads, &expected, n)) n = expected;
  }
  return n;
}

/* Claims one task of the launch in flight: its id, or -1 when none is left to claim. */
static int32_t kiln_pool_claim(void) {
  uint64_t w = atomic_load_explicit(&pool_claim, memory_order_acquire);
  while ((uint32_t)w != 0) {
    if (atomic_compare_exchange_weak_explicit(&pool_claim, &w, w - 1, memory_order_acquire,
                                              memory_order_acquire)) {
      /* The claim acquired the launcher's publishing store: the description is current. */
      return pool_num_task - (int32_t)(uint32_t)w;
    }
  }
  return -1;
}

/* Runs tasks of the launch in flight until none is left to claim. */
static void kiln_pool_run_tasks(void) {
  int32_t t;
  while ((t = kiln_pool_claim()) >= 0) {
    if (pool_body(t, pool_num_task, pool_cdata) != 0 &&
        atomic_exchange_explicit(&pool_error, 1, memory_order_relaxed) == 0)
      snprintf(pool_error_msg, sizeof(pool_error_msg), "%s", kiln_last_error);
    /* Release: the launcher rewrites the description only after it reads pending == 0. */
    atomic_fetch_sub_explicit(&pool_pending, 1, memory_order_release);
  }
}

/* Returns once the epoch differs from `seen`: spins first, as back-to-back parallel loops
 * are the common case in a model run, then sleeps. */
static void kiln_pool_wait(uint32_t seen) {
  for (int spins = 0; spins < KILN_POOL_SPINS; ++spins) {
    if ((uint32_t)(atomic_load_explicit(&pool_claim, memory_order_relaxed) >> 32) != seen) return;
    kiln_cpu_relax();
  }
  pthread_mutex_lock(&pool_sleep_mu);
  /* Sequentially consistent increment and load, paired with the launcher's store of the
   * claim word and load of pool_sleepers: either the launcher sees this sleeper and
   * broadcasts, or this load sees the new epoch. */
  atomic_fetch_add(&pool_sleepers, 1);
  while ((uint32_t)(atomic_load(&pool_claim) >> 32) == seen) pthread_cond_wait(&pool_sleep_cv, &pool_sleep_mu);
  atomic_fetch_sub(&pool_sleepers, 1);
  pthread_mutex_unlock(&pool_sleep_mu);
}

static void* kiln_pool_worker(void* arg) {
  int32_t index = (int32_t)(intptr_t)arg;
  for (;;) {
    /* Read the epoch before helping: a launch published after this load ends the wait. */
    uint32_t seen = (uint32_t)(atomic_load_explicit(&pool_claim, memory_order_relaxed) >> 32);
    if (index < atomic_load_explicit(&pool_num_threads, memory_order_relaxed)) kiln_pool_run_tasks();
    kiln_pool_wait(seen);
  }
  return NULL;
}

static int32_t kiln_default_parallel_launch(KilnParallelLambda body, void* cdata, int32_t num_task) {
  int32_t nthreads = kiln_pool_get_num_threads();
  if (num_task <= 1 || nthreads <= 1 || pthread_mutex_trylock(&pool_launch_mu) != 0) {
    /* Serial fallback: one thread, one task, or a launch already running (nested, or on
     * another thread). */
    for (int32_t t = 0; t < num_task; ++t) {
      if (body(t, num_task, cdata) != 0) return -1;
    }
    return 0;
  }
  while (pool_started < nthreads - 1) {
    pthread_t th;
    if (pthread_create(&th, NULL, kiln_pool_worker, (void*)(intptr_t)(pool_started + 1)) != 0) break;
    pthread_detach(th);
    ++pool_started;
  }
  pool_body = body;
  pool_cdata = cdata;
  pool_num_task = num_task;
  atomic_store_explicit(&pool_error, 0, memory_order_relaxed);
  atomic_store_explicit(&pool_pending, num_task, memory_order_relaxed);
  ++pool_epoch;
  /* Publish: everything above becomes visible to whoever claims a task of this launch. */
  atomic_store(&pool_claim, ((uint64_t)pool_epoch << 32) | (uint32_t)num_task);
  if (atomic_load(&pool_sleepers) > 0) {
    pthread_mutex_lock(&pool_sleep_mu);
    pthread_cond_broadcast(&pool_sleep_cv);
    pthread_mutex_unlock(&pool_sleep_mu);
  }
  kiln_pool_run_tasks();
  /* Wait for the tasks workers claimed; yield after a while in case one of them was
   * preempted (more threads than free cores). */
  for (int spins = 0; atomic_load_explicit(&pool_pending, memory_order_acquire) != 0; ++spins) {
    if (spins < KILN_POOL_SPINS / 16) {
      kiln_cpu_relax();
    } else {
      sched_yield();
    }
  }
  int32_t err = atomic_load_explicit(&pool_error, memory_order_relaxed);
  if (err) kiln_default_set_last_error(pool_error_msg);
  pthread_mutex_unlock(&pool_launch_mu);
  return err ? -1 : 0;
}

/* ---------------- service pointers (loader may overwrite) ---------------- */
KILN_DLL void* (*__KilnBackendAllocWorkspace)(int32_t, int32_t, uint64_t, int32_t, int32_t) =
    kiln_default_alloc_workspace;
KILN_DLL int32_t (*__KilnBackendFreeWorkspace)(int32_t, int32_t, void*) = kiln_default_free_workspace;
KILN_DLL int32_t (*__KilnBackendParallelLaunch)(KilnParallelLambda, void*, int32_t) =
    kiln_default_parallel_launch;
KILN_DLL int32_t (*__KilnBackendGetNumThreads)(void) = kiln_pool_get_num_threads;
KILN_DLL void (*__KilnBackendSetNumThreads)(int32_t) = kiln_pool_set_num_threads;
KILN_DLL void (*__KilnAPISetLastError)(const char*) = kiln_default_set_last_error;

/* The thread count of whichever pool __KilnBackendParallelLaunch uses. */
KILN_DLL void KilnSetNumThreads(int32_t n) { __KilnBackendSetNumThreads(n); }
KILN_DLL int32_t KilnGetNumThreads(void) { return __KilnBackendGetNumThreads(); }

/* ---------------- kernel argument checks ---------------- */
/* Shared by the C and LLVM code generators, so that every kernel reports a bad argument in the
 * same words and a kernel's own code carries only a call and a constant shape table. */
__attribute__((visibility("hidden"))) const char* KilnDTypeText(uint8_t code, uint8_t bits, uint16_t lanes, char* buf,
                                                               size_t n) {
  const char* base = code == 0 ? "int" : code == 1 ? "uint" : code == 2 ? "float" : code == 4 ? "bfloat"
                   : code == 6 ? "bool" : "code";
  /* DLPack's float8 / float4 codes name their format; Kiln stores each element in one byte */
  const char* small = code == 10 ? "float8_e4m3fn" : code == 11 ? "float8_e4m3fnuz" : code == 12 ? "float8_e5m2"
                    : code == 13 ? "float8_e5m2fnuz" : code == 14 ? "float8_e8m0fnu" : code == 17 ? "float4_e2m1fn"
                    : NULL;
  if (small && lanes == 1) snprintf(buf, n, "%s", small);
  else if (code == 6) snprintf(buf, n, "bool");
  else if (lanes != 1) snprintf(buf, n, "%s%dx%d", base, bits, lanes);
  else snprintf(buf, n, "%s%d", base, bits);
  return buf;
}

__attribute__((visibility("hidden"))) const char* KilnShapeText(int32_t ndim, const int64_t* shape, char* buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int32_t i = 0; i < ndim && k < n; ++i)
    k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (k < n) snprintf(buf + k, n - k, ndim == 1 ? ",)" : ")");
  return buf;
}

/* The shape a kernel expects: a dynamic dim (encoded -1 - max, see KilnCheckTensorArg) as "<=max". */
static const char* KilnExpectShapeText(int32_t ndim, const int64_t* shape, char* buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "(");
  for (int32_t i = 0; i < ndim && k < n; ++i) {
    if (shape[i] < 0) k += (size_t)snprintf(buf + k, n - k, i ? ", <=%lld" : "<=%lld", (long long)(-1 - shape[i]));
    else k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
  }
  if (k < n) snprintf(buf + k, n - k, ndim == 1 ? ",)" : ")");
  return buf;
}

__attribute__((visibility("hidden"), format(printf, 1, 2))) int32_t KilnErrorf(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  __KilnAPISetLastError(msg);
  return -1;
}

__attribute__((visibility("hidden"))) int32_t KilnCheckTensorArg(const char* fn, int32_t i, const char* name,
                                                                 const int32_t* type_codes, const KilnValue* args,
                                                                 int32_t ndim, const int64_t* shape, uint8_t code,
                                                                 uint8_t bits) {
  char a[160], b[160];
  if (type_codes[i] != kKilnDLTensorHandle)
    return KilnErrorf("%s: argument %d (%s) expected a DLTensor (type code 7), got type code %d", fn, i, name,
                           type_codes[i]);
  const DLTensor* t = (const DLTensor*)args[i].v_handle;
  if (t == NULL) return KilnErrorf("%s: argument %d (%s) is a NULL DLTensor", fn, i, name);
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
    return KilnErrorf("%s: argument %d (%s) expected a CPU tensor, got device type %d", fn, i, name,
                           (int)t->device.device_type);
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1)
    return KilnErrorf("%s: argument %d (%s) expected dtype %s, got %s", fn, i, name,
                           KilnDTypeText(code, bits, 1, a, sizeof(a)),
                           KilnDTypeText(t->dtype.code, t->dtype.bits, t->dtype.lanes, b, sizeof(b)));
  if (t->ndim != ndim)
    return KilnErrorf("%s: argument %d (%s) expected ndim %d with shape %s, got ndim %d with shape %s", fn, i,
                           name, ndim, KilnExpectShapeText(ndim, shape, a, sizeof(a)), t->ndim,
                           KilnShapeText(t->ndim, t->shape, b, sizeof(b)));
  /* A dynamic dim is encoded as -1 - max (so a max of 0 stays distinguishable from a static 0):
   * its extent may be anything in [0, max]; the storage is still laid out for max. */
  for (int32_t k = 0; k < ndim; ++k) {
    if (shape[k] < 0 ? (t->shape[k] < 0 || t->shape[k] > -1 - shape[k]) : t->shape[k] != shape[k])
      return KilnErrorf("%s: argument %d (%s) expected shape %s, got %s", fn, i, name,
                             KilnExpectShapeText(ndim, shape, a, sizeof(a)),
                             KilnShapeText(ndim, t->shape, b, sizeof(b)));
  }
  if (t->strides != NULL) {
    int64_t expect = 1;
    for (int32_t k = ndim - 1; k >= 0; --k) {
      /* strides of the max-shape layout; a dim of extent 1 may have any stride */
      int64_t mx = shape[k] < 0 ? -1 - shape[k] : shape[k];
      if (mx != 1 && t->shape[k] != 1 && t->strides[k] != expect)
        return KilnErrorf("%s: argument %d (%s) must be compact row-major (stride of dim %d is %lld, "
                               "expected %lld)", fn, i, name, k, (long long)t->strides[k], (long long)expect);
      expect *= mx;
    }
  }
  return 0;
}

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
