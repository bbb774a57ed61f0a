/*
 * run_model: run a Kiln-compiled model from C, with no Python in the process.
 *
 *   run_model MODEL.so [options] [INPUT.bin ...]     (the library is dlopen'ed)
 *   run_model_static [options] [INPUT.bin ...]       (built with -DKILN_STATIC, model.a linked in)
 *
 * Options:
 *   --params FILE            weights from a params file instead of the library's own
 *   --out PREFIX             write output i to PREFIX<i>.bin (raw, row-major, at its actual shape)
 *   --repeat N               run N times and print the median latency
 *   --shape NAME:D0,D1,...   the actual shape of input NAME, for a model built with dynamic dims
 *                            (repeatable; "NAME:" is a scalar)
 *   --info                   print the inputs and outputs (for a dynamic model also its symbols,
 *                            their ranges and each tensor's symbolic dims) and exit
 *
 * Each INPUT.bin holds one input's raw row-major bytes, in input order, exactly as many as its shape
 * takes: the --shape given for it, else the shape --info prints (for a dynamic input, its upper
 * bounds). Inputs not given are zero-filled. One line per input and output gives its shape; an
 * output's is the shape the run produced. Exit status: 0 on success, 2 on a usage or file error,
 * else the failing call's KilnStatus (message on stderr).
 *
 * Build (see examples/c/README.md):
 *   cc -O2 -I "$(python -c 'import kiln.runtime as r; print(r.include_path())')" run_model.c -o run_model -ldl
 *   cc -O2 -DKILN_STATIC -I ... run_model.c model.a -o run_model_static -lm -lpthread
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, also under -std=c99 */

#include <kiln/kiln_model.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DIMS 32  /* room for any tensor's dims; the API checks it against the real rank */
#define MAX_ARGS 256 /* input files, and --shape options */

#ifdef KILN_STATIC
#define API(name) name
#else
#include <dlfcn.h>
/* The functions this program uses, looked up in the library by name. */
static struct {
  int32_t (*KilnModelAPIVersion)(void);
  const char* (*KilnGetLastError)(void);
  int32_t (*KilnModelCreate)(const char*, KilnModel**);
  void (*KilnModelFree)(KilnModel*);
  int32_t (*KilnModelNumInputs)(const KilnModel*);
  int32_t (*KilnModelNumOutputs)(const KilnModel*);
  int32_t (*KilnModelInputIndex)(const KilnModel*, const char*);
  int32_t (*KilnModelGetInputInfo)(const KilnModel*, int32_t, KilnTensorInfo*);
  int32_t (*KilnModelGetOutputInfo)(const KilnModel*, int32_t, KilnTensorInfo*);
  int32_t (*KilnModelNumSymbols)(const KilnModel*);
  int32_t (*KilnModelGetSymbolInfo)(const KilnModel*, int32_t, KilnSymbolInfo*);
  int32_t (*KilnModelGetInputDims)(const KilnModel*, int32_t, const char**, int32_t);
  int32_t (*KilnModelGetOutputDims)(const KilnModel*, int32_t, const char**, int32_t);
  int32_t (*KilnModelSetInput)(KilnModel*, int32_t, const void*, uint64_t);
  int32_t (*KilnModelSetInputShaped)(KilnModel*, int32_t, const int64_t*, int32_t, const void*, uint64_t);
  int32_t (*KilnModelRun)(KilnModel*);
  int32_t (*KilnModelGetOutputShape)(KilnModel*, int32_t, int64_t*, int32_t, uint64_t*);
  int32_t (*KilnModelGetOutput)(KilnModel*, int32_t, void*, uint64_t);
} api;
#define API(name) api.name
#endif

/* A library of a later version only adds functions (kiln_model.h), so this program runs it too. */
static int api_version_ok(void) {
  int32_t version = API(KilnModelAPIVersion)();
  if (version >= KILN_MODEL_API_VERSION) return 1;
  fprintf(stderr, "run_model: library API version %d, this program needs %d or later\n", (int)version,
          KILN_MODEL_API_VERSION);
  return 0;
}

#ifndef KILN_STATIC
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
  SYM(KilnModelAPIVersion) SYM(KilnGetLastError)
  /* before the other names: an older library lacks some, and the version says why */
  if (!api_version_ok()) return 0;
  SYM(KilnModelCreate) SYM(KilnModelFree) SYM(KilnModelNumInputs) SYM(KilnModelNumOutputs)
  SYM(KilnModelInputIndex) SYM(KilnModelGetInputInfo) SYM(KilnModelGetOutputInfo)
  SYM(KilnModelNumSymbols) SYM(KilnModelGetSymbolInfo) SYM(KilnModelGetInputDims) SYM(KilnModelGetOutputDims)
  SYM(KilnModelSetInput) SYM(KilnModelSetInputShaped) SYM(KilnModelRun) SYM(KilnModelGetOutputShape)
  SYM(KilnModelGetOutput)
#undef SYM
  return 1;
}
#endif

/* ----------------------------------------------------------------------------- options */

/* One --shape NAME:D0,D1,... option. */
typedef struct {
  const char* name;
  int32_t index; /* of the input called `name`, once the model is created */
  int32_t ndim;
  int64_t dims[MAX_DIMS];
} GivenShape;

typedef struct {
  const char* params;
  const char* out_prefix;
  int repeat;
  int info_only;
  const char* files[MAX_ARGS];
  int num_files;
  GivenShape shapes[MAX_ARGS];
  int num_shapes;
} Options;

/* Parses "NAME:D0,D1,..." into `s`; 0 if it is malformed. */
static int parse_shape(char* arg, GivenShape* s) {
  /* the last ':', as input names may hold one ("input:0") and dims never do */
  char* colon = strrchr(arg, ':');
  if (!colon || colon == arg) return 0;
  s->ndim = 0;
  char* p = colon + 1;
  while (*p) {
    char* end;
    long long d = strtoll(p, &end, 10);
    if (end == p || d < 0 || s->ndim == MAX_DIMS) return 0;
    s->dims[s->ndim++] = d;
    if (*end == '\0') break;
    if (*end != ',' || end[1] == '\0') return 0;
    p = end + 1;
  }
  *colon = '\0'; /* argv's strings are the program's to modify: `arg` is now the name alone */
  s->name = arg;
  return 1;
}

/* Reads the options after the library's path; 0 (after saying why) on a malformed one. */
static int parse_options(int argc, char** argv, int argi, Options* opt) {
  memset(opt, 0, sizeof *opt);
  opt->repeat = 1;
  for (; argi < argc; ++argi) {
    const char* a = argv[argi];
    int has_value = argi + 1 < argc;
    if (!strcmp(a, "--params") && has_value) {
      opt->params = argv[++argi];
    } else if (!strcmp(a, "--out") && has_value) {
      opt->out_prefix = argv[++argi];
    } else if (!strcmp(a, "--repeat") && has_value) {
      opt->repeat = atoi(argv[++argi]);
    } else if (!strcmp(a, "--info")) {
      opt->info_only = 1;
    } else if (!strcmp(a, "--shape") && has_value) {
      ++argi;
      if (opt->num_shapes == MAX_ARGS || !parse_shape(argv[argi], &opt->shapes[opt->num_shapes])) {
        fprintf(stderr, "run_model: bad --shape '%s' (expected NAME:D0,D1,... with dims >= 0)\n", argv[argi]);
        return 0;
      }
      ++opt->num_shapes;
    } else if (opt->num_files < MAX_ARGS) {
      opt->files[opt->num_files++] = a;
    }
  }
  if (opt->repeat < 1) opt->repeat = 1;
  return 1;
}

/* ----------------------------------------------------------------------------- printing */

static int fail(int32_t status, const char* what) {
  fprintf(stderr, "run_model: %s failed (status %d): %s\n", what, (int)status, API(KilnGetLastError)());
  return (int)status;
}

static void print_shape(FILE* f, int32_t ndim, const int64_t* shape) {
  fprintf(f, "(");
  for (int32_t k = 0; k < ndim; ++k) fprintf(f, k ? ", %lld" : "%lld", (long long)shape[k]);
  fprintf(f, ")");
}

/* One summary line: `shape` and `nbytes` are the tensor's actual ones where they differ from `t`'s. */
static void print_tensor(const char* kind, int32_t i, const KilnTensorInfo* t, const int64_t* shape,
                         uint64_t nbytes) {
  printf("%s %d '%s': dtype code %d bits %d, shape ", kind, (int)i, t->name, t->dtype.code, t->dtype.bits);
  print_shape(stdout, t->ndim, shape);
  printf(", %llu bytes\n", (unsigned long long)nbytes);
}

/* --info's lines for input or output i; for a dynamic model the shape and size are the upper
 * bounds, and a second line gives each dim as the model declares it ("batch", "seq*2", or 16). */
static int print_declared(KilnModel* model, int is_input, int32_t i, int dynamic) {
  KilnTensorInfo t;
  const char* dims[MAX_DIMS];
  int32_t st = is_input ? API(KilnModelGetInputInfo)(model, i, &t) : API(KilnModelGetOutputInfo)(model, i, &t);
  if (st != KILN_OK) return fail(st, is_input ? "KilnModelGetInputInfo" : "KilnModelGetOutputInfo");
  print_tensor(is_input ? "input" : "output", i, &t, t.shape, t.nbytes);
  if (!dynamic) return 0;
  st = is_input ? API(KilnModelGetInputDims)(model, i, dims, MAX_DIMS)
                : API(KilnModelGetOutputDims)(model, i, dims, MAX_DIMS);
  if (st != KILN_OK) return fail(st, is_input ? "KilnModelGetInputDims" : "KilnModelGetOutputDims");
  printf("  dims (");
  for (int32_t k = 0; k < t.ndim; ++k) {
    if (k) printf(", ");
    if (dims[k]) printf("%s", dims[k]);          /* a symbolic dim */
    else printf("%lld", (long long)t.shape[k]);  /* a static one */
  }
  printf(")\n");
  return 0;
}

static int print_model_info(KilnModel* model) {
  int32_t num_symbols = API(KilnModelNumSymbols)(model);
  if (num_symbols > 0) printf("dynamic dims: the shapes below are the upper bounds of these ranges\n");
  for (int32_t j = 0; j < num_symbols; ++j) {
    KilnSymbolInfo s;
    int32_t st = API(KilnModelGetSymbolInfo)(model, j, &s);
    if (st != KILN_OK) return fail(st, "KilnModelGetSymbolInfo");
    printf("symbol %d '%s': %lld..%lld\n", (int)j, s.name, (long long)s.lo, (long long)s.hi);
  }
  int rc = 0;
  for (int32_t i = 0; i < API(KilnModelNumInputs)(model) && rc == 0; ++i)
    rc = print_declared(model, 1, i, num_symbols > 0);
  for (int32_t i = 0; i < API(KilnModelNumOutputs)(model) && rc == 0; ++i)
    rc = print_declared(model, 0, i, num_symbols > 0);
  return rc;
}

/* ----------------------------------------------------------------------------- running */

/* Bytes of a compact row-major tensor: whole bytes per element, as the API counts them. A size
 * past 64 bits (a mistyped --shape) is UINT64_MAX, which no allocation gets. */
static uint64_t tensor_bytes(DLDataType dtype, int32_t ndim, const int64_t* shape) {
  uint64_t size = ((uint64_t)dtype.bits * (dtype.lanes ? dtype.lanes : 1) + 7) / 8;
  for (int32_t k = 0; k < ndim; ++k)
    if (shape[k] == 0) return 0;
  for (int32_t k = 0; k < ndim; ++k) {
    if (size > UINT64_MAX / (uint64_t)shape[k]) return UINT64_MAX;
    size *= (uint64_t)shape[k];
  }
  return size;
}

/* The --shape given for input i, or NULL (the last one given wins). */
static const GivenShape* given_shape(const Options* opt, int32_t i) {
  const GivenShape* found = NULL;
  for (int k = 0; k < opt->num_shapes; ++k)
    if (opt->shapes[k].index == i) found = &opt->shapes[k];
  return found;
}

/* Finds each --shape's input by name: the API's error lists the names there are. */
static int resolve_shapes(KilnModel* model, Options* opt) {
  for (int k = 0; k < opt->num_shapes; ++k) {
    GivenShape* s = &opt->shapes[k];
    s->index = API(KilnModelInputIndex)(model, s->name);
    if (s->index < 0) {
      fprintf(stderr, "run_model: --shape %s: %s\n", s->name, API(KilnGetLastError)());
      return KILN_ERR_ARGUMENT;
    }
  }
  return 0;
}

/* Fills `data` from `path`, which must hold exactly `nbytes` (the input's shape checked here, so
 * the message can name the file as well as the sizes). */
static int read_input(const char* path, const KilnTensorInfo* t, int32_t ndim, const int64_t* shape, void* data,
                      uint64_t nbytes) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "run_model: cannot open %s\n", path);
    return 2;
  }
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  int rc = 0;
  if (size < 0) {
    fprintf(stderr, "run_model: cannot read %s\n", path);
    rc = 2;
  } else if ((uint64_t)size != nbytes) {
    fprintf(stderr, "run_model: input '%s' of shape ", t->name);
    print_shape(stderr, ndim, shape);
    fprintf(stderr, " takes %llu bytes, but %s has %ld bytes\n", (unsigned long long)nbytes, path, size);
    rc = 2;
  } else if (fseek(f, 0, SEEK_SET) != 0 || fread(data, 1, (size_t)nbytes, f) != nbytes) {
    fprintf(stderr, "run_model: cannot read %s\n", path);
    rc = 2;
  }
  fclose(f);
  return rc;
}

/* Sets input i from `path` (NULL: zeros), at `given` if there is one, else at the info's shape
 * (a dynamic input's upper bounds: what KilnModelSetInput takes). */
static int set_input(KilnModel* model, int32_t i, const char* path, const GivenShape* given) {
  KilnTensorInfo t;
  int32_t st = API(KilnModelGetInputInfo)(model, i, &t);
  if (st != KILN_OK) return fail(st, "KilnModelGetInputInfo");
  int32_t ndim = given ? given->ndim : t.ndim;
  const int64_t* shape = given ? given->dims : t.shape;
  uint64_t nbytes = tensor_bytes(t.dtype, ndim, shape);
  void* data = nbytes <= SIZE_MAX ? calloc(1, nbytes ? (size_t)nbytes : 1) : NULL;
  if (!data) {
    fprintf(stderr, "run_model: input '%s' of shape ", t.name);
    print_shape(stderr, ndim, shape);
    fprintf(stderr, " is too large to allocate\n");
    return 2;
  }
  int rc = path ? read_input(path, &t, ndim, shape, data, nbytes) : 0;
  if (rc == 0) {
    if (given) st = API(KilnModelSetInputShaped)(model, i, shape, ndim, data, nbytes);
    else st = API(KilnModelSetInput)(model, i, data, nbytes);
    if (st != KILN_OK) rc = fail(st, given ? "KilnModelSetInputShaped" : "KilnModelSetInput");
  }
  free(data);
  if (rc == 0) print_tensor("input", i, &t, shape, nbytes); /* a set input has the model's rank */
  return rc;
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

/* Runs `repeat` times; more than once, prints the median latency. */
static int run_timed(KilnModel* model, int repeat) {
  double* times = calloc((size_t)repeat, sizeof(double));
  int rc = 0;
  for (int r = 0; r < repeat && rc == 0; ++r) {
    double t0 = now_ms();
    int32_t st = API(KilnModelRun)(model);
    if (st != KILN_OK) rc = fail(st, "KilnModelRun");
    if (times) times[r] = now_ms() - t0;
  }
  if (rc == 0 && repeat > 1 && times) {
    qsort(times, (size_t)repeat, sizeof(double), cmp_double);
    printf("median latency: %.3f ms over %d runs\n", times[repeat / 2], repeat);
  }
  free(times);
  return rc;
}

static int write_file(const char* path, const void* data, uint64_t nbytes) {
  FILE* f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, (size_t)nbytes, f) == nbytes;
  if (f && fclose(f) != 0) ok = 0;
  if (!ok) fprintf(stderr, "run_model: cannot write %s\n", path);
  return ok ? 0 : 2;
}

/* Prints output i's line at the shape the run gave it and, with a prefix, writes it to PREFIX<i>.bin:
 * compact, exactly that shape's bytes (a dynamic output's are fewer than its info's). */
static int write_output(KilnModel* model, int32_t i, const char* prefix) {
  KilnTensorInfo t;
  int64_t shape[MAX_DIMS];
  uint64_t nbytes = 0;
  int32_t st = API(KilnModelGetOutputInfo)(model, i, &t);
  if (st != KILN_OK) return fail(st, "KilnModelGetOutputInfo");
  if ((st = API(KilnModelGetOutputShape)(model, i, shape, MAX_DIMS, &nbytes)) != KILN_OK)
    return fail(st, "KilnModelGetOutputShape");
  print_tensor("output", i, &t, shape, nbytes);
  if (!prefix) return 0;
  void* data = malloc(nbytes ? (size_t)nbytes : 1);
  if (!data) {
    fprintf(stderr, "run_model: cannot allocate %llu bytes for output %d\n", (unsigned long long)nbytes, (int)i);
    return 2;
  }
  int rc = 0;
  if ((st = API(KilnModelGetOutput)(model, i, data, nbytes)) != KILN_OK) {
    rc = fail(st, "KilnModelGetOutput");
  } else {
    char path[4096];
    snprintf(path, sizeof path, "%s%d.bin", prefix, (int)i);
    rc = write_file(path, data, nbytes);
  }
  free(data);
  return rc;
}

/* Sets every input, runs, and prints (and writes) every output. */
static int run_model(KilnModel* model, Options* opt) {
  int32_t num_inputs = API(KilnModelNumInputs)(model), num_outputs = API(KilnModelNumOutputs)(model);
  if (opt->num_files > num_inputs) {
    fprintf(stderr, "run_model: %d input files for a model with %d inputs\n", opt->num_files, (int)num_inputs);
    return 2;
  }
  int rc = resolve_shapes(model, opt);
  for (int32_t i = 0; i < num_inputs && rc == 0; ++i)
    rc = set_input(model, i, i < opt->num_files ? opt->files[i] : NULL, given_shape(opt, i));
  if (rc == 0) rc = run_timed(model, opt->repeat);
  for (int32_t i = 0; i < num_outputs && rc == 0; ++i) rc = write_output(model, i, opt->out_prefix);
  return rc;
}

int main(int argc, char** argv) {
  static Options opt; /* static: its arrays are large for the stack */
  int argi = 1;
#ifdef KILN_STATIC
  if (!api_version_ok()) return 2;
#else
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s MODEL.so [--params FILE] [--out PREFIX] [--repeat N] [--shape NAME:D0,D1,...] [--info] "
            "[INPUT.bin ...]\n",
            argv[0]);
    return 2;
  }
  if (!load_api(argv[argi++])) return 2;
#endif
  if (!parse_options(argc, argv, argi, &opt)) return 2;
  KilnModel* model = NULL;
  int32_t st = API(KilnModelCreate)(opt.params, &model);
  if (st != KILN_OK) return fail(st, "KilnModelCreate");
  int rc = opt.info_only ? print_model_info(model) : run_model(model, &opt);
  API(KilnModelFree)(model);
  return rc;
}
