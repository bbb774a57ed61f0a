/*
 * graph_runner: run a Kiln library's kernels in the order of its graph, from C, with no Python.
 *
 * Used by tests/cross to run libraries cross-compiled for another CPU under qemu-user, where
 * the Python runtime cannot load them. It reads a "plan" that tests/cross/qemu.py writes from
 * the factory's graph JSON (one buffer per storage id, one DLTensor per entry, the kernel calls
 * in order), dlopens the library, and calls every kernel through the packed convention of
 * kiln/c_runtime_api.h exactly as the graph executor does: each argument a DLTensor handle.
 *
 *   graph_runner LIB PLAN [REPEAT]
 *
 * Plan (whitespace-separated, paths without blanks):
 *   KILNPLAN 1
 *   buffers B   then B sizes in bytes
 *   tensors T   then T lines: buffer ndim dim... code bits lanes
 *   calls C     then C lines: func_name nargs tensor...
 *   load L      then L lines: buffer nbytes path (inputs and params, read before the first run)
 *   save S      then S lines: buffer nbytes path (outputs, written after the last run)
 * Prints "run_ms <best of REPEAT runs>" and exits 0, or prints the failing call and the
 * library's last error and exits 1.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kiln/c_runtime_api.h>

typedef struct {
  KilnBackendPackedCFunc fn;
  char name[256];
  int32_t nargs;
  KilnValue* args;
  int32_t* codes;
} Call;

static int fail(const char* what, const char* detail) {
  fprintf(stderr, "graph_runner: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  return 1;
}

static int expect(FILE* f, const char* word, long* count) {
  char tok[64];
  if (fscanf(f, "%63s %ld", tok, count) != 2 || strcmp(tok, word) != 0 || *count < 0) return 0;
  return 1;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char** argv) {
  if (argc < 3) return fail("usage: graph_runner LIB PLAN [REPEAT]", NULL);
  int repeat = argc > 3 ? atoi(argv[3]) : 1;
  if (repeat < 1) repeat = 1;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fail("dlopen failed", dlerror());
  const char* (*last_error)(void) = (const char* (*)(void))dlsym(lib, "KilnGetLastError");
  FILE* f = fopen(argv[2], "r");
  if (!f) return fail("cannot open plan", argv[2]);
  char magic[16];
  int version = 0;
  if (fscanf(f, "%15s %d", magic, &version) != 2 || strcmp(magic, "KILNPLAN") || version != 1)
    return fail("not a version 1 plan", argv[2]);

  long nbuf, nten, ncall, nload, nsave;
  if (!expect(f, "buffers", &nbuf)) return fail("bad plan: buffers", NULL);
  void** bufs = calloc((size_t)nbuf + 1, sizeof(void*));
  long long* sizes = calloc((size_t)nbuf + 1, sizeof(long long));
  for (long i = 0; i < nbuf; ++i) {
    long long size;
    if (fscanf(f, "%lld", &size) != 1 || size < 0) return fail("bad plan: buffer size", NULL);
    sizes[i] = size;
    size_t rounded = ((size_t)size + 63) / 64 * 64 + 64;  /* 64-byte aligned, like the executor */
    bufs[i] = aligned_alloc(64, rounded);
    if (!bufs[i]) return fail("out of memory", NULL);
    memset(bufs[i], 0, rounded);
  }
  if (!expect(f, "tensors", &nten)) return fail("bad plan: tensors", NULL);
  DLTensor* ts = calloc((size_t)nten + 1, sizeof(DLTensor));
  for (long i = 0; i < nten; ++i) {
    long b;
    int ndim, code, bits, lanes;
    if (fscanf(f, "%ld %d", &b, &ndim) != 2 || b < 0 || b >= nbuf || ndim < 0 || ndim > 32)
      return fail("bad plan: tensor", NULL);
    ts[i].data = bufs[b];
    ts[i].device.device_type = kDLCPU;
    ts[i].ndim = ndim;
    ts[i].shape = calloc((size_t)ndim + 1, sizeof(int64_t));
    for (int d = 0; d < ndim; ++d) {
      long long dim;
      if (fscanf(f, "%lld", &dim) != 1) return fail("bad plan: shape", NULL);
      ts[i].shape[d] = dim;
    }
    if (fscanf(f, "%d %d %d", &code, &bits, &lanes) != 3) return fail("bad plan: dtype", NULL);
    ts[i].dtype.code = (uint8_t)code;
    ts[i].dtype.bits = (uint8_t)bits;
    ts[i].dtype.lanes = (uint16_t)lanes;
  }
  if (!expect(f, "calls", &ncall)) return fail("bad plan: calls", NULL);
  Call* calls = calloc((size_t)ncall + 1, sizeof(Call));
  for (long i = 0; i < ncall; ++i) {
    Call* c = &calls[i];
    if (fscanf(f, "%255s %d", c->name, &c->nargs) != 2 || c->nargs < 0) return fail("bad plan: call", NULL);
    c->fn = (KilnBackendPackedCFunc)dlsym(lib, c->name);
    if (!c->fn) return fail("function not in the library", c->name);
    c->args = calloc((size_t)c->nargs + 1, sizeof(KilnValue));
    c->codes = calloc((size_t)c->nargs + 1, sizeof(int32_t));
    for (int a = 0; a < c->nargs; ++a) {
      long t;
      if (fscanf(f, "%ld", &t) != 1 || t < 0 || t >= nten) return fail("bad plan: argument", c->name);
      c->args[a].v_handle = &ts[t];
      c->codes[a] = kKilnDLTensorHandle;
    }
  }
  char path[4096];
  if (!expect(f, "load", &nload)) return fail("bad plan: load", NULL);
  for (long i = 0; i < nload; ++i) {
    long b;
    long long n;
    if (fscanf(f, "%ld %lld %4095s", &b, &n, path) != 3 || b < 0 || b >= nbuf || n < 0 || n > sizes[b])
      return fail("bad plan: load line", NULL);
    FILE* in = fopen(path, "rb");
    if (!in || fread(bufs[b], 1, (size_t)n, in) != (size_t)n) return fail("cannot read", path);
    fclose(in);
  }
  if (!expect(f, "save", &nsave)) return fail("bad plan: save", NULL);
  long* save_buf = calloc((size_t)nsave + 1, sizeof(long));
  long long* save_n = calloc((size_t)nsave + 1, sizeof(long long));
  char** save_path = calloc((size_t)nsave + 1, sizeof(char*));
  for (long i = 0; i < nsave; ++i) {
    if (fscanf(f, "%ld %lld %4095s", &save_buf[i], &save_n[i], path) != 3 || save_buf[i] < 0 ||
        save_buf[i] >= nbuf || save_n[i] < 0 || save_n[i] > sizes[save_buf[i]])
      return fail("bad plan: save line", NULL);
    save_path[i] = strdup(path);
  }
  fclose(f);

  double best = -1;
  for (int r = 0; r < repeat; ++r) {
    double t0 = now_ms();
    for (long i = 0; i < ncall; ++i) {
      KilnValue ret;
      int32_t rcode = 0;
      if (calls[i].fn(calls[i].args, calls[i].codes, calls[i].nargs, &ret, &rcode, NULL) != 0) {
        fprintf(stderr, "graph_runner: call %ld (%s) failed: %s\n", i, calls[i].name,
                last_error ? last_error() : "?");
        return 1;
      }
    }
    double dt = now_ms() - t0;
    if (best < 0 || dt < best) best = dt;
  }
  for (long i = 0; i < nsave; ++i) {
    FILE* out = fopen(save_path[i], "wb");
    if (!out || fwrite(bufs[save_buf[i]], 1, (size_t)save_n[i], out) != (size_t)save_n[i])
      return fail("cannot write", save_path[i]);
    fclose(out);
  }
  printf("run_ms %.3f\n", best);
  return 0;
}
