/*
 * Kiln model C API: run a compiled model from C, C++, Rust, ... with no Python in the process.
 *
 * Every library `kiln build` (or `factory.export_library`) writes for a CPU graph defines these
 * functions: the shared library (`model.so`, linked or dlopen'ed) and the static archive
 * (`model.a`, linked into the application). They run the same kernels, in the same order, as
 * `kiln.runtime`'s graph executor: the op sequence, memory plan, shapes and names are C tables
 * generated when the library is written (no graph JSON is read in C), and the weights are read
 * from the library's own module blob or from a params file (docs/params_format.md).
 *
 * Errors: every function that can fail returns a KilnStatus; KILN_OK is 0. The message of the last
 * failure on the calling thread is KilnGetLastError() (it names the input, entry or node and what
 * was expected). No function aborts the process on bad input.
 *
 * Threads: an instance may be used from any thread; calls on one instance are serialised by a
 * lock it owns, and separate instances run independently (their kernels share one thread pool,
 * whose size is KilnSetNumThreads / KILN_NUM_THREADS).
 *
 * Shapes: this version runs static graphs; for a library with dynamic dimensions KilnModelCreate
 * returns KILN_ERR_UNSUPPORTED naming them. KilnModelSetInputTensor takes the caller's shape and
 * dtype and checks them, which is how inputs with symbolic dimensions will be set.
 *
 * Documented in docs/c_api.md. Depends only on kiln/c_runtime_api.h (DLPack types).
 */
#ifndef KILN_MODEL_H_
#define KILN_MODEL_H_

#include <kiln/c_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_MODEL_API_VERSION 1

typedef enum {
  KILN_OK = 0,
  KILN_ERR_ARGUMENT = 1,  /* NULL pointer, index out of range, unknown name, buffer too small */
  KILN_ERR_SHAPE = 2,     /* a tensor's shape differs from the model's */
  KILN_ERR_DTYPE = 3,     /* a tensor's dtype differs from the model's */
  KILN_ERR_FORMAT = 4,    /* a params file or the library's blob is corrupt or does not fit */
  KILN_ERR_IO = 5,        /* a params file cannot be read */
  KILN_ERR_MEMORY = 6,    /* out of memory */
  KILN_ERR_KERNEL = 7,    /* a kernel failed while running (message names the graph node) */
  KILN_ERR_UNSUPPORTED = 8, /* this model cannot run through the C API (e.g. device code) */
  KILN_ERR_STATE = 9,     /* run before every input was set */
} KilnStatus;

/* Shape and dtype of one input or output. `shape` points into the model (valid until it is freed). */
typedef struct {
  const char* name;
  int32_t ndim;
  const int64_t* shape;
  DLDataType dtype;
  uint64_t nbytes;
} KilnTensorInfo;

typedef struct KilnModel KilnModel;

/* Create an instance. params_path NULL: the weights the library carries; else a params file
 * (kiln build --params-file / kiln.runtime.save_param_dict_to_file) that must hold every param. */
KILN_DLL int32_t KilnModelCreate(const char* params_path, KilnModel** out);
/* Free an instance (NULL is ignored). */
KILN_DLL void KilnModelFree(KilnModel* model);

KILN_DLL int32_t KilnModelNumInputs(const KilnModel* model);
KILN_DLL int32_t KilnModelNumOutputs(const KilnModel* model);
/* Index of the input called `name`, or -1 (and the last error says which names exist). */
KILN_DLL int32_t KilnModelInputIndex(const KilnModel* model, const char* name);
KILN_DLL int32_t KilnModelGetInputInfo(const KilnModel* model, int32_t index, KilnTensorInfo* info);
KILN_DLL int32_t KilnModelGetOutputInfo(const KilnModel* model, int32_t index, KilnTensorInfo* info);

/* Copy `nbytes` of compact row-major data (exactly the input's size) into input `index`. */
KILN_DLL int32_t KilnModelSetInput(KilnModel* model, int32_t index, const void* data, uint64_t nbytes);
KILN_DLL int32_t KilnModelSetInputByName(KilnModel* model, const char* name, const void* data, uint64_t nbytes);
/* Copy a CPU DLTensor into input `index`, checking its dtype, shape and layout. */
KILN_DLL int32_t KilnModelSetInputTensor(KilnModel* model, int32_t index, const DLTensor* tensor);

/* Run the model once on the inputs set so far. */
KILN_DLL int32_t KilnModelRun(KilnModel* model);

/* Copy output `index` (nbytes must be at least its size) into `data`. */
KILN_DLL int32_t KilnModelGetOutput(KilnModel* model, int32_t index, void* data, uint64_t nbytes);
/* The model's own buffer of output `index` (valid until the next run or free; do not write). */
KILN_DLL const void* KilnModelOutputData(const KilnModel* model, int32_t index);

/* KILN_MODEL_API_VERSION of the library (a header/library mismatch check). */
KILN_DLL int32_t KilnModelAPIVersion(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_MODEL_H_ */
