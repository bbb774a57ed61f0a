/*
 * Checks of the model C API that need C: error statuses and messages, and instances used from
 * several threads. Linked with a model library built by tests/capi/test_c_api.py, whose first
 * input is float32 and whose output 0 is what the Python executor computed.
 *
 *   capi_check errors MODEL_INPUT.bin BAD_PARAMS_FILE
 *   capi_check threads MODEL_INPUT.bin EXPECTED_OUTPUT0.bin
 * Prints one line per check ("ok <name>" or "FAIL <name>: ...") and exits non-zero on a failure.
 */
#include <kiln/kiln_model.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

static void check(int cond, const char* name, const char* detail) {
  if (cond) {
    printf("ok %s\n", name);
  } else {
    printf("FAIL %s: %s\n", name, detail);
    ++failures;
  }
}

static void* read_all(const char* path, size_t* n) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* buf = malloc(size > 0 ? (size_t)size : 1);
  *n = fread(buf, 1, (size_t)size, f);
  fclose(f);
  return buf;
}

static int errors(const char* input_path, const char* bad_params) {
  KilnModel* m = NULL;
  int32_t st;
  check(KilnModelCreate(NULL, NULL) == KILN_ERR_ARGUMENT, "create_null_out", KilnGetLastError());
  st = KilnModelCreate("/nonexistent/kiln.params", &m);
  check(st == KILN_ERR_IO && m == NULL && strstr(KilnGetLastError(), "/nonexistent/kiln.params"), "params_missing",
        KilnGetLastError());
  st = KilnModelCreate(bad_params, &m);
  check(st == KILN_ERR_FORMAT && m == NULL && strstr(KilnGetLastError(), "params file"), "params_corrupt",
        KilnGetLastError());
  st = KilnModelCreate(NULL, &m);
  check(st == KILN_OK && m != NULL, "create", KilnGetLastError());
  if (!m) return 1;
  KilnTensorInfo info;
  check(KilnModelGetInputInfo(m, 0, &info) == KILN_OK, "input_info", KilnGetLastError());
  check(KilnModelGetInputInfo(m, 99, &info) == KILN_ERR_ARGUMENT && strstr(KilnGetLastError(), "99"),
        "input_index_range", KilnGetLastError());
  check(KilnModelRun(m) == KILN_ERR_STATE && strstr(KilnGetLastError(), info.name), "run_before_set",
        KilnGetLastError());
  check(KilnModelInputIndex(m, "no_such_input") == -1 && strstr(KilnGetLastError(), "no_such_input") &&
            strstr(KilnGetLastError(), info.name),
        "unknown_name", KilnGetLastError());
  check(KilnModelSetInputByName(m, "no_such_input", "", 0) == KILN_ERR_ARGUMENT, "set_unknown_name",
        KilnGetLastError());
  size_t n = 0;
  void* x = read_all(input_path, &n);
  check(KilnModelSetInput(m, 0, x, n - 4) == KILN_ERR_SHAPE && strstr(KilnGetLastError(), "bytes"), "short_input",
        KilnGetLastError());
  int64_t shape[8];
  for (int32_t k = 0; k < info.ndim; ++k) shape[k] = info.shape[k];
  DLTensor t = {x, {kDLCPU, 0}, info.ndim, {kDLInt, 32, 1}, shape, NULL, 0};
  check(KilnModelSetInputTensor(m, 0, &t) == KILN_ERR_DTYPE && strstr(KilnGetLastError(), "float32"),
        "tensor_dtype", KilnGetLastError());
  t.dtype = info.dtype;
  shape[0] += 1;
  check(KilnModelSetInputTensor(m, 0, &t) == KILN_ERR_SHAPE, "tensor_shape", KilnGetLastError());
  shape[0] -= 1;
  check(KilnModelSetInputTensor(m, 0, &t) == KILN_OK, "tensor_ok", KilnGetLastError());
  for (int32_t i = 1; i < KilnModelNumInputs(m); ++i) {
    KilnTensorInfo o;
    KilnModelGetInputInfo(m, i, &o);
    void* z = calloc(1, o.nbytes + 1);
    KilnModelSetInput(m, i, z, o.nbytes);
    free(z);
  }
  check(KilnModelRun(m) == KILN_OK, "run", KilnGetLastError());
  KilnTensorInfo o;
  KilnModelGetOutputInfo(m, 0, &o);
  char small[4];
  check(o.nbytes <= 4 || KilnModelGetOutput(m, 0, small, 4) == KILN_ERR_ARGUMENT, "output_buffer_small",
        KilnGetLastError());
  check(KilnModelOutputData(m, 5) == NULL, "output_data_range", KilnGetLastError());
  KilnModelFree(m);
  KilnModelFree(NULL);
  free(x);
  return failures;
}

typedef struct {
  KilnModel* model;
  const void* x;
  size_t nx;
  const float* expected;
  size_t n_expected;
  int runs;
  int bad;
} Job;

static void* worker(void* arg) {
  Job* j = arg;
  float* out = malloc(j->n_expected * sizeof(float));
  for (int r = 0; r < j->runs; ++r) {
    if (KilnModelSetInput(j->model, 0, j->x, j->nx) != KILN_OK || KilnModelRun(j->model) != KILN_OK ||
        KilnModelGetOutput(j->model, 0, out, j->n_expected * sizeof(float)) != KILN_OK) {
      ++j->bad;
      continue;
    }
    for (size_t i = 0; i < j->n_expected; ++i)
      if (fabsf(out[i] - j->expected[i]) > 1e-4f * (1.0f + fabsf(j->expected[i]))) {
        ++j->bad;
        break;
      }
  }
  free(out);
  return NULL;
}

static int threads(const char* input_path, const char* expected_path) {
  size_t nx = 0, ne = 0;
  void* x = read_all(input_path, &nx);
  float* expected = read_all(expected_path, &ne);
  enum { N = 4 };
  KilnModel* models[N];
  Job jobs[N];
  pthread_t tids[N];
  for (int i = 0; i < N; ++i) {
    if (KilnModelCreate(NULL, &models[i]) != KILN_OK) {
      printf("FAIL create: %s\n", KilnGetLastError());
      return 1;
    }
  }
  /* four instances at once, then one instance shared by four threads (the same input, so any
   * interleaving of their calls gives the same output) */
  for (int shared = 0; shared < 2; ++shared) {
    for (int i = 0; i < N; ++i) {
      jobs[i] = (Job){shared ? models[0] : models[i], x, nx, expected, ne / sizeof(float), 30, 0};
      pthread_create(&tids[i], NULL, worker, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < N; ++i) {
      pthread_join(tids[i], NULL);
      bad += jobs[i].bad;
    }
    check(bad == 0, shared ? "one_instance_four_threads" : "four_instances_four_threads", "wrong or failed runs");
  }
  for (int i = 0; i < N; ++i) KilnModelFree(models[i]);
  free(x);
  free(expected);
  return failures;
}

int main(int argc, char** argv) {
  if (argc == 4 && !strcmp(argv[1], "errors")) return errors(argv[2], argv[3]) ? 1 : 0;
  if (argc == 4 && !strcmp(argv[1], "threads")) return threads(argv[2], argv[3]) ? 1 : 0;
  fprintf(stderr, "usage: capi_check errors|threads INPUT.bin FILE\n");
  return 2;
}
