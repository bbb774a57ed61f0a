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
 * Dynamic shapes (version 2): a model built with symbolic dimensions (docs/dynamic_shapes.md,
 * e.g. batch in 1..8) runs every input shape in range. Its symbols are KilnModelNumSymbols /
 * KilnModelGetSymbolInfo; KilnModelGetInputDims / KilnModelGetOutputDims name the symbolic dims;
 * KilnModelGetInputInfo / KilnModelGetOutputInfo report the upper bounds (the storage, and the
 * largest byte size). Set an input of any shape in range with KilnModelSetInputShaped (or
 * KilnModelSetInputTensor); after KilnModelRun, KilnModelGetOutputShape is an output's actual
 * shape and KilnModelGetOutput copies exactly that, compact. A dim out of range, a static dim that
 * differs, a wrong ndim (KilnModelSet*) and inputs that disagree on a symbol (KilnModelRun) are
 * KILN_ERR_SHAPE with a message naming the input, the dim, the symbol and its range. Dims that
 * kernels decide at run time (data-dependent dims: NonZero's count, ...) are symbols too: the run
 * takes each value from its kernel and re-shapes what follows; a value outside the symbol's range
 * is KILN_ERR_SHAPE from KilnModelRun, naming the graph node. Runtime control flow (ONNX If / Loop
 * kept as graph nodes) runs: a Loop's scan outputs have the iteration count as a data-dependent dim,
 * and a loop running past the bound they were planned for is KILN_ERR_SHAPE naming the node.
 *
 * Version 2 only adds to version 1: every version-1 function keeps its meaning for a static model,
 * so a program written for version 1 may accept a library whose KilnModelAPIVersion() is >= 1.
 *
 * Documented in docs/c_api.md. Depends only on kiln/c_runtime_api.h (DLPack types).
 */
#ifndef KILN_MODEL_H_
#define KILN_MODEL_H_

#include <kiln/c_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_MODEL_API_VERSION 2

typedef enum {
  KILN_OK = 0,
  KILN_ERR_ARGUMENT = 1,  /* NULL pointer, index out of range, unknown name, buffer too small */
  KILN_ERR_SHAPE = 2,     /* a tensor's shape differs from the model's (or is out of a symbol's range) */
  KILN_ERR_DTYPE = 3,     /* a tensor's dtype differs from the model's */
  KILN_ERR_FORMAT = 4,    /* a params file or the library's blob is corrupt or does not fit */
  KILN_ERR_IO = 5,        /* a params file cannot be read */
  KILN_ERR_MEMORY = 6,    /* out of memory */
  KILN_ERR_KERNEL = 7,    /* a kernel failed while running (message names the graph node) */
  KILN_ERR_UNSUPPORTED = 8, /* this model cannot run through the C API (e.g. device code) */
  KILN_ERR_STATE = 9,     /* run before every input was set */
} KilnStatus;

/* Shape and dtype of one input or output. `shape` points into the model (valid until it is freed).
 * For a dynamic tensor, `shape` and `nbytes` are the upper bounds (what its storage holds). */
typedef struct {
  const char* name;
  int32_t ndim;
  const int64_t* shape;
  DLDataType dtype;
  uint64_t nbytes;
} KilnTensorInfo;

/* A symbol (dynamic dimension) of the model and the values an input may give it, lo..hi. */
typedef struct {
  const char* name;
  int64_t lo;
  int64_t hi;
} KilnSymbolInfo;

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

/* Symbols of a dynamic model (0 for a static one), and symbol `index`'s name and range. */
KILN_DLL int32_t KilnModelNumSymbols(const KilnModel* model);
KILN_DLL int32_t KilnModelGetSymbolInfo(const KilnModel* model, int32_t index, KilnSymbolInfo* info);
/* The dims of input / output `index` as expressions: dims[k] = NULL for a static dim (its size is
 * the info's shape[k]), else the dim's symbolic expression ("batch", "batch*seq", "(seq+1)//2").
 * `capacity` is the room in `dims` (at least the tensor's ndim). Strings live as long as the model. */
KILN_DLL int32_t KilnModelGetInputDims(const KilnModel* model, int32_t index, const char** dims, int32_t capacity);
KILN_DLL int32_t KilnModelGetOutputDims(const KilnModel* model, int32_t index, const char** dims, int32_t capacity);

/* Copy `nbytes` of compact row-major data (exactly the input's size) into input `index`.
 * For a dynamic input this sets it at its upper-bound shape (KilnModelGetInputInfo); use
 * KilnModelSetInputShaped for any other shape. */
KILN_DLL int32_t KilnModelSetInput(KilnModel* model, int32_t index, const void* data, uint64_t nbytes);
KILN_DLL int32_t KilnModelSetInputByName(KilnModel* model, const char* name, const void* data, uint64_t nbytes);
/* Copy compact row-major data of shape `shape` (`ndim` dims; nbytes = its exact size) into input
 * `index`. Each dim must be the model's static dim or, for a symbolic one, in its symbol's range;
 * a symbol that appears in several dims (of this or other inputs) must have one value. */
KILN_DLL int32_t KilnModelSetInputShaped(KilnModel* model, int32_t index, const int64_t* shape, int32_t ndim,
                                         const void* data, uint64_t nbytes);
/* Copy a CPU DLTensor into input `index`, checking its dtype, shape (as KilnModelSetInputShaped)
 * and layout (compact row-major). */
KILN_DLL int32_t KilnModelSetInputTensor(KilnModel* model, int32_t index, const DLTensor* tensor);

/* Run the model once on the inputs set so far (every input must have been set: KILN_ERR_STATE;
 * dynamic inputs must agree on every symbol, and a data-dependent dim a kernel reports must be in
 * its symbol's range: KILN_ERR_SHAPE). */
KILN_DLL int32_t KilnModelRun(KilnModel* model);

/* Output `index`'s actual shape as the last run computed it (before any run: its shape at every
 * symbol's upper bound): writes its ndim dims into `shape` (room for `capacity`) and, if `nbytes`
 * is not NULL, its compact byte size. For a static output, its shape. */
KILN_DLL int32_t KilnModelGetOutputShape(KilnModel* model, int32_t index, int64_t* shape, int32_t capacity,
                                         uint64_t* nbytes);
/* Copy output `index`, compact row-major at its actual shape, into `data` (nbytes at least its
 * size: KilnModelGetOutputShape's, never more than KilnModelGetOutputInfo's). */
KILN_DLL int32_t KilnModelGetOutput(KilnModel* model, int32_t index, void* data, uint64_t nbytes);
/* The model's own buffer of output `index` (valid until the next run or free; do not write).
 * A dynamic output's buffer is padded: it is laid out row-major for the upper-bound shape
 * (KilnModelGetOutputInfo) and the actual data is its sub-box [0:a0, 0:a1, ...]; when only the
 * first dim is dynamic, that is a compact prefix. KilnModelGetOutput gives a compact copy. */
KILN_DLL const void* KilnModelOutputData(const KilnModel* model, int32_t index);

/* KILN_MODEL_API_VERSION of the library (a header/library mismatch check). */
KILN_DLL int32_t KilnModelAPIVersion(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_MODEL_H_ */
