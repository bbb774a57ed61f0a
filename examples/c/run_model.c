/*
 * run_model: run a Kiln-compiled model from C, with no Python in the process.
 *
 *   run_model MODEL.so [options] [INPUT.bin ...]     (the library is dlopen'ed)
 *   run_model_static [options] [INPUT.bin ...]       (built with -DKILN_STATIC, model.a linked in)
 *
 * Options:
 *   --params FILE   weights from a params file instead of the library's own
 *   --out PREFIX    write output i to PREFIX<i>.bin (raw, row-major)
 *   --repeat N      run N times and print the median latency
 *   --info          print the inputs and outputs and exit
 *
 * Each INPUT.bin holds one input's raw row-major bytes, in input order; inputs not given are
 * zero-filled. Exit status: 0 on success, else the failing call's KilnStatus (message on stderr).
 *
 * Build (see examples/c/README.md):
 *   cc -O2 -I "$(python -c 'import kiln.runtime as r; print(r.include_path())')" run_model.c -o run_model -ldl
 *   cc -O2 -DKILN_STATIC -I ... run_model.c model.a -o run_model_static -lm -lpthread
 */
#include <kiln/kiln_model.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KILN_STATIC
#define API(name) name
#else
#include <dlfcn.h>
/* The functions this program uses, looked up in the library by name. */
static struct {
  int32_t (*KilnModelCreate)(const char*, KilnModel**);
  void (*KilnModelFree)(KilnModel*);
  int32_t (*KilnModelNumInputs)(const KilnModel*);
  int32_t (*KilnModelNumOutputs)(const KilnModel*);
  int32_t (*KilnModelGetInputInfo)(const KilnModel*, int32_t, KilnTensorInfo*);
  int32_t (*KilnModelGetOutputInfo)(const KilnModel*, int32_t, KilnTensorInfo*);
  int32_t (*KilnModelSetInput)(KilnModel*, int32_t, const void*, uint64_t);
  int32_t (*KilnModelRun)(KilnModel*);
  int32_t (*KilnModelGetOutput)(KilnModel*, int32_t, void*, uint64_t);
  int32_t (*KilnModelAPIVersion)(void);
  const char* (*KilnGetLastError)(void);
} api;
#define API(name) api.name

static int load_api(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "run_model: cannot load %s: %s\n", path, dlerror());
    return 0;
  }
#define SYM(name)                                                                          \
  if (!(*(void**)&api.name = dlsym(lib, #name))) {                                         \
    fprintf(stderr, "run_model: %s has no %s (not a Kiln model library?)\n", path, #name); \
    return 0;                                                                              \
  }
  SYM(KilnModelCreate) SYM(KilnModelFree) SYM(KilnModelNumInputs) SYM(KilnModelNumOutputs)
  SYM(KilnModelGetInputInfo) SYM(KilnModelGetOutputInfo) SYM(KilnModelSetInput) SYM(KilnModelRun)
  SYM(KilnModelGetOutput) SYM(KilnModelAPIVersion) SYM(KilnGetLastError)
#undef SYM
  return 1;
}
#endif

static int fail(int32_t status, const char* what) {
  fprintf(stderr, "run_model: %s failed (status %d): %s\n", what, (int)status, API(KilnGetLastError)());
  return (int)status;
}

static void print_info(const char* kind, int32_t i, const KilnTensorInfo* t) {
  printf("%s %d '%s': dtype code %d bits %d, shape (", kind, (int)i, t->name, t->dtype.code, t->dtype.bits);
  for (int32_t k = 0; k < t->ndim; ++k) printf(k ? ", %lld" : "%lld", (long long)t->shape[k]);
  printf("), %llu bytes\n", (unsigned long long)t->nbytes);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const char* params = NULL;
  const char* out_prefix = NULL;
  int repeat = 1, info_only = 0, argi = 1;
#ifndef KILN_STATIC
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL.so [--params FILE] [--out PREFIX] [--repeat N] [--info] [INPUT.bin ...]\n",
            argv[0]);
    return 2;
  }
  if (!load_api(argv[argi++])) return 2;
#endif
  const char* inputs[256];
  int num_files = 0;
  for (; argi < argc; ++argi) {
    if (!strcmp(argv[argi], "--params") && argi + 1 < argc) params = argv[++argi];
    else if (!strcmp(argv[argi], "--out") && argi + 1 < argc) out_prefix = argv[++argi];
    else if (!strcmp(argv[argi], "--repeat") && argi + 1 < argc) repeat = atoi(argv[++argi]);
    else if (!strcmp(argv[argi], "--info")) info_only = 1;
    else if (num_files < 256) inputs[num_files++] = argv[argi];
  }
  if (API(KilnModelAPIVersion)() != KILN_MODEL_API_VERSION) {
    fprintf(stderr, "run_model: library API version %d, this program was built for %d\n",
            (int)API(KilnModelAPIVersion)(), KILN_MODEL_API_VERSION);
    return 2;
  }
  KilnModel* model = NULL;
  int32_t st = API(KilnModelCreate)(params, &model);
  if (st != KILN_OK) return fail(st, "KilnModelCreate");
  int32_t n_in = API(KilnModelNumInputs)(model), n_out = API(KilnModelNumOutputs)(model);
  if (num_files > n_in) {
    fprintf(stderr, "run_model: %d input files for a model with %d inputs\n", num_files, (int)n_in);
    API(KilnModelFree)(model);
    return 2;
  }
  int rc = 0;
  for (int32_t i = 0; i < n_in && rc == 0; ++i) {
    KilnTensorInfo t;
    if ((st = API(KilnModelGetInputInfo)(model, i, &t)) != KILN_OK) rc = fail(st, "KilnModelGetInputInfo");
    else print_info("input", i, &t);
    if (rc || info_only) continue;
    void* buf = calloc(1, t.nbytes ? t.nbytes : 1);
    size_t got = t.nbytes;
    if (i < num_files) {
      FILE* f = fopen(inputs[i], "rb");
      if (!f) {
        fprintf(stderr, "run_model: cannot open %s\n", inputs[i]);
        rc = 2;
      } else {
        /* read one byte more than needed: a longer file is an error the API reports */
        void* big = realloc(buf, t.nbytes + 1);
        buf = big ? big : buf;
        got = fread(buf, 1, t.nbytes + 1, f);
        fclose(f);
      }
    }
    if (rc == 0 && (st = API(KilnModelSetInput)(model, i, buf, got)) != KILN_OK) rc = fail(st, "KilnModelSetInput");
    free(buf);
  }
  for (int32_t i = 0; i < n_out && rc == 0; ++i) {
    KilnTensorInfo t;
    if ((st = API(KilnModelGetOutputInfo)(model, i, &t)) != KILN_OK) rc = fail(st, "KilnModelGetOutputInfo");
    else print_info("output", i, &t);
  }
  if (rc || info_only) {
    API(KilnModelFree)(model);
    return rc;
  }
  double* times = calloc((size_t)(repeat > 0 ? repeat : 1), sizeof(double));
  for (int r = 0; r < (repeat > 0 ? repeat : 1) && rc == 0; ++r) {
    double t0 = now_ms();
    if ((st = API(KilnModelRun)(model)) != KILN_OK) rc = fail(st, "KilnModelRun");
    times[r] = now_ms() - t0;
  }
  if (rc == 0 && repeat > 1) {
    qsort(times, (size_t)repeat, sizeof(double), cmp_double);
    printf("median latency: %.3f ms over %d runs\n", times[repeat / 2], repeat);
  }
  free(times);
  for (int32_t i = 0; i < n_out && rc == 0 && out_prefix; ++i) {
    KilnTensorInfo t;
    API(KilnModelGetOutputInfo)(model, i, &t);
    void* buf = malloc(t.nbytes ? t.nbytes : 1);
    if ((st = API(KilnModelGetOutput)(model, i, buf, t.nbytes)) != KILN_OK) {
      rc = fail(st, "KilnModelGetOutput");
    } else {
      char path[4096];
      snprintf(path, sizeof path, "%s%d.bin", out_prefix, (int)i);
      FILE* f = fopen(path, "wb");
      if (!f || fwrite(buf, 1, t.nbytes, f) != t.nbytes) {
        fprintf(stderr, "run_model: cannot write %s\n", path);
        rc = 2;
      }
      if (f) fclose(f);
    }
    free(buf);
  }
  API(KilnModelFree)(model);
  return rc;
}
