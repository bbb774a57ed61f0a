/*
 * A scripted driver of the model C API for models with dynamic dimensions (tests/capi/
 * test_c_api_dynamic.py): loads a model library (dlopen), then runs commands given on the command
 * line on one instance, printing one line per command:
 *
 *   info                   the symbols and every input's / output's dims
 *   set I SHAPE FILE       KilnModelSetInputShaped(I, SHAPE, bytes of FILE); SHAPE is "3x16" ("-" for a scalar)
 *   tensor I SHAPE FILE    KilnModelSetInputTensor with a DLTensor of that shape over FILE's bytes
 *   setfull I FILE         KilnModelSetInput(I, bytes of FILE)
 *   run                    KilnModelRun
 *   get I FILE             KilnModelGetOutputShape + KilnModelGetOutput (a buffer of the info's size) -> FILE
 *   getsmall I             KilnModelGetOutput with a buffer one byte short of the actual size
 *   padded I FILE          the KilnModelOutputData buffer (the info's byte size) -> FILE
 *
 * Each line is "<command> <status>" then the shape (get) or the error message. Exit status 0.
 *
 *   capi_dynamic MODEL.so [COMMAND ARGS...]...   (no command: only create the instance)
 */
#include <kiln/kiln_model.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API_FUNCTIONS(X)                                                                                   \
  X(int32_t, KilnModelCreate, (const char*, KilnModel**))                                                  \
  X(void, KilnModelFree, (KilnModel*))                                                                     \
  X(int32_t, KilnModelNumInputs, (const KilnModel*))                                                       \
  X(int32_t, KilnModelNumOutputs, (const KilnModel*))                                                      \
  X(int32_t, KilnModelGetInputInfo, (const KilnModel*, int32_t, KilnTensorInfo*))                          \
  X(int32_t, KilnModelGetOutputInfo, (const KilnModel*, int32_t, KilnTensorInfo*))                         \
  X(int32_t, KilnModelNumSymbols, (const KilnModel*))                                                      \
  X(int32_t, KilnModelGetSymbolInfo, (const KilnModel*, int32_t, KilnSymbolInfo*))                         \
  X(int32_t, KilnModelGetInputDims, (const KilnModel*, int32_t, const char**, int32_t))                    \
  X(int32_t, KilnModelGetOutputDims, (const KilnModel*, int32_t, const char**, int32_t))                   \
  X(int32_t, KilnModelSetInput, (KilnModel*, int32_t, const void*, uint64_t))                              \
  X(int32_t, KilnModelSetInputShaped, (KilnModel*, int32_t, const int64_t*, int32_t, const void*, uint64_t)) \
  X(int32_t, KilnModelSetInputTensor, (KilnModel*, int32_t, const DLTensor*))                              \
  X(int32_t, KilnModelRun, (KilnModel*))                                                                   \
  X(int32_t, KilnModelGetOutputShape, (KilnModel*, int32_t, int64_t*, int32_t, uint64_t*))                 \
  X(int32_t, KilnModelGetOutput, (KilnModel*, int32_t, void*, uint64_t))                                   \
  X(const void*, KilnModelOutputData, (const KilnModel*, int32_t))                                         \
  X(int32_t, KilnModelAPIVersion, (void))                                                                  \
  X(const char*, KilnGetLastError, (void))

#define DECLARE(ret, name, args) ret(*name) args;
static struct {
  API_FUNCTIONS(DECLARE)
} api;

static void* read_all(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "capi_dynamic: cannot open %s\n", path);
    exit(2);
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* buf = malloc(size > 0 ? (size_t)size : 1);
  *n = fread(buf, 1, (size_t)size, f);
  fclose(f);
  return buf;
}

static void write_all(const char* path, const void* data, size_t n) {
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) {
    fprintf(stderr, "capi_dynamic: cannot write %s\n", path);
    exit(2);
  }
  fclose(f);
}

static int32_t parse_shape(const char* text, int64_t* shape) {
  int32_t n = 0;
  if (!strcmp(text, "-")) return 0;
  for (const char* p = text; *p && n < 16;) {
    char* end;
    shape[n++] = strtoll(p, &end, 10);
    p = *end == 'x' ? end + 1 : end;
    if (end == p && *end) break;
  }
  return n;
}

static void print_shape(int32_t ndim, const int64_t* shape) {
  printf("(");
  for (int32_t k = 0; k < ndim; ++k) printf(k ? ", %lld" : "%lld", (long long)shape[k]);
  printf(")");
}

static void report(const char* cmd, int32_t status) {
  printf("%s %d", cmd, (int)status);
  if (status != KILN_OK) printf(" %s", api.KilnGetLastError());
  printf("\n");
}

static void print_dims(const char* kind, int32_t i, const KilnTensorInfo* t, const char** dims) {
  printf("%s %d '%s': (", kind, (int)i, t->name);
  for (int32_t k = 0; k < t->ndim; ++k) {
    if (dims[k]) printf(k ? ", %s" : "%s", dims[k]);
    else printf(k ? ", %lld" : "%lld", (long long)t->shape[k]);
  }
  printf(") upper ");
  print_shape(t->ndim, t->shape);
  printf(" %llu bytes\n", (unsigned long long)t->nbytes);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: capi_dynamic MODEL.so [COMMAND ARGS...]...\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "capi_dynamic: %s\n", dlerror());
    return 2;
  }
#define LOOKUP(ret, name, args)                                          \
  if (!(*(void**)&api.name = dlsym(lib, #name))) {                       \
    fprintf(stderr, "capi_dynamic: %s has no %s\n", argv[1], #name);     \
    return 2;                                                            \
  }
  API_FUNCTIONS(LOOKUP)
  if (api.KilnModelAPIVersion() != KILN_MODEL_API_VERSION) {
    fprintf(stderr, "capi_dynamic: library API version %d, expected %d\n", (int)api.KilnModelAPIVersion(),
            KILN_MODEL_API_VERSION);
    return 2;
  }
  KilnModel* m = NULL;
  int32_t st = api.KilnModelCreate(NULL, &m);
  report("create", st);
  if (st != KILN_OK) return 0;
  for (int a = 2; a < argc;) {
    const char* cmd = argv[a++];
    int64_t shape[16];
    KilnTensorInfo info;
    if (!strcmp(cmd, "info")) {
      printf("symbols %d\n", (int)api.KilnModelNumSymbols(m));
      for (int32_t j = 0; j < api.KilnModelNumSymbols(m); ++j) {
        KilnSymbolInfo y;
        api.KilnModelGetSymbolInfo(m, j, &y);
        printf("symbol %d '%s' %lld..%lld\n", (int)j, y.name, (long long)y.lo, (long long)y.hi);
      }
      for (int32_t i = 0; i < api.KilnModelNumInputs(m); ++i) {
        const char* dims[16];
        api.KilnModelGetInputInfo(m, i, &info);
        api.KilnModelGetInputDims(m, i, dims, 16);
        print_dims("input", i, &info, dims);
      }
      for (int32_t i = 0; i < api.KilnModelNumOutputs(m); ++i) {
        const char* dims[16];
        api.KilnModelGetOutputInfo(m, i, &info);
        api.KilnModelGetOutputDims(m, i, dims, 16);
        print_dims("output", i, &info, dims);
      }
    } else if (!strcmp(cmd, "set") || !strcmp(cmd, "tensor")) {
      int32_t i = atoi(argv[a]);
      int32_t ndim = parse_shape(argv[a + 1], shape);
      size_t n;
      void* x = read_all(argv[a + 2], &n);
      a += 3;
      if (!strcmp(cmd, "set")) {
        st = api.KilnModelSetInputShaped(m, i, shape, ndim, x, n);
      } else {
        api.KilnModelGetInputInfo(m, i, &info);
        DLTensor t = {x, {kDLCPU, 0}, ndim, info.dtype, shape, NULL, 0};
        st = api.KilnModelSetInputTensor(m, i, &t);
      }
      report(cmd, st);
      free(x);
    } else if (!strcmp(cmd, "setfull")) {
      int32_t i = atoi(argv[a]);
      size_t n;
      void* x = read_all(argv[a + 1], &n);
      a += 2;
      report(cmd, api.KilnModelSetInput(m, i, x, n));
      free(x);
    } else if (!strcmp(cmd, "run")) {
      report(cmd, api.KilnModelRun(m));
    } else if (!strcmp(cmd, "get") || !strcmp(cmd, "getsmall") || !strcmp(cmd, "padded")) {
      int32_t i = atoi(argv[a++]);
      const char* path = strcmp(cmd, "getsmall") ? argv[a++] : NULL;
      uint64_t n = 0;
      api.KilnModelGetOutputInfo(m, i, &info);
      st = api.KilnModelGetOutputShape(m, i, shape, 16, &n);
      if (st != KILN_OK) {
        report(cmd, st);
        continue;
      }
      if (!strcmp(cmd, "padded")) {
        write_all(path, api.KilnModelOutputData(m, i), (size_t)info.nbytes);
        report(cmd, KILN_OK);
        continue;
      }
      void* buf = malloc(info.nbytes + 1);
      st = api.KilnModelGetOutput(m, i, buf, !strcmp(cmd, "get") ? info.nbytes : n - 1);
      if (st == KILN_OK) {
        if (path) write_all(path, buf, (size_t)n);
        printf("%s %d ", cmd, (int)st);
        print_shape(info.ndim, shape);
        printf(" %llu bytes\n", (unsigned long long)n);
      } else {
        report(cmd, st);
      }
      free(buf);
    } else {
      fprintf(stderr, "capi_dynamic: unknown command %s\n", cmd);
      return 2;
    }
  }
  api.KilnModelFree(m);
  return 0;
}
