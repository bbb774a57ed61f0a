/*
 * The C API's own cost per KilnModelRun (tests/capi/bench_run_overhead.py): a tiny model, so that
 * the lock, the shape bookkeeping and the dispatch dominate the kernels. Prints the best of 7
 * batches of 200,000 runs, in ns per run.
 *
 *   capi_bench_run MODEL.so MODE DYNAMIC
 *
 * DYNAMIC 1: the model's one input is float32 (n,) with n in 1..8, set with KilnModelSetInputShaped;
 * 0: float32 (8,). MODE 1 sets the input again before every run, alternating shapes (7,) and (8,),
 * so that every run evaluates and writes the shapes; MODE 0 sets it once.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <kiln/kiln_model.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int32_t (*CreateFn)(const char*, KilnModel**);
typedef int32_t (*RunFn)(KilnModel*);
typedef int32_t (*SetShapedFn)(KilnModel*, int32_t, const int64_t*, int32_t, const void*, uint64_t);
typedef int32_t (*SetFn)(KilnModel*, int32_t, const void*, uint64_t);

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: capi_bench_run MODEL.so MODE DYNAMIC\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "capi_bench_run: %s\n", dlerror());
    return 2;
  }
  int mode = atoi(argv[2]), dynamic = atoi(argv[3]);
  CreateFn create;
  RunFn run;
  SetShapedFn set_shaped;
  SetFn set;
  *(void**)&create = dlsym(lib, "KilnModelCreate");
  *(void**)&run = dlsym(lib, "KilnModelRun");
  *(void**)&set_shaped = dlsym(lib, "KilnModelSetInputShaped");
  *(void**)&set = dlsym(lib, "KilnModelSetInput");
  KilnModel* m;
  if (!create || !run || !set_shaped || !set || create(NULL, &m) != KILN_OK) return 1;
  float x[8] = {1, -2, 3, -4, 5, -6, 7, -8};
  int64_t full[1] = {8}, part[1] = {7};
  if ((dynamic ? set_shaped(m, 0, full, 1, x, sizeof x) : set(m, 0, x, sizeof x)) != KILN_OK) return 1;
  const int n = 200000;
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    double t0 = now_ns();
    for (int i = 0; i < n; ++i) {
      if (mode) set_shaped(m, 0, (i & 1) ? part : full, 1, x, (i & 1) ? 28 : 32);
      if (run(m) != KILN_OK) return 1;
    }
    double t = (now_ns() - t0) / n;
    if (t < best) best = t;
  }
  printf("%.1f\n", best);
  return 0;
}
