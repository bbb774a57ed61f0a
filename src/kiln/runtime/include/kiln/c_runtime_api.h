/*
 * Kiln C runtime ABI.
 *
 * Every function a Kiln library exports has the packed signature KilnBackendPackedCFunc.
 * Tensors cross the boundary as DLPack DLTensor pointers.  Runtime services (error
 * message, workspace memory, parallel launch) are reached through function pointers that
 * the library itself defines with working defaults (see kiln_crt.c) and that a loader may
 * overwrite, so a library links against nothing but libc (and libpthread / libm).
 *
 * The layout of every struct here is part of the documented ABI (docs/calling_convention.md)
 * and is mirrored by kiln/runtime/_ffi.py; change both together.
 */
#ifndef KILN_C_RUNTIME_API_H_
#define KILN_C_RUNTIME_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_DLL __attribute__((visibility("default")))
#define KILN_ABI_VERSION 1

/* ---- DLPack (v0.8 layout, the one every framework exchanges) ---- */
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
} DLDeviceType;

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  /* DLPack 1.1's low-precision floats (Kiln stores every element in one byte, even float4;
   * int4 / uint4 / int2 / uint2 are kDLInt / kDLUInt with 4 or 2 bits, also one byte each) */
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13,
  kDLFloat8_e8m0fnu = 14,
  kDLFloat4_e2m1fn = 17,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* NULL means compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

/* ---- Packed calling convention ---- */
typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;
  const char* v_str;
} KilnValue;

typedef enum {
  kKilnArgInt = 0,
  kKilnArgUInt = 1,
  kKilnArgFloat = 2,
  kKilnOpaqueHandle = 3,
  kKilnNullptr = 4,
  kKilnDLTensorHandle = 7,
  kKilnStr = 11,
} KilnArgTypeCode;

typedef int32_t (*KilnBackendPackedCFunc)(KilnValue* args, int32_t* type_codes, int32_t num_args,
                                          KilnValue* out_ret_value, int32_t* out_ret_tcode,
                                          void* resource_handle);

/* A parallel body: called once per task id in [0, num_task). */
typedef int32_t (*KilnParallelLambda)(int32_t task_id, int32_t num_task, void* cdata);

/* ---- Runtime services (defined in kiln_crt.c, overridable by the loader) ---- */
extern void* (*__KilnBackendAllocWorkspace)(int32_t device_type, int32_t device_id, uint64_t nbytes,
                                           int32_t dtype_code_hint, int32_t dtype_bits_hint);
extern int32_t (*__KilnBackendFreeWorkspace)(int32_t device_type, int32_t device_id, void* ptr);
extern int32_t (*__KilnBackendParallelLaunch)(KilnParallelLambda body, void* cdata, int32_t num_task);
extern void (*__KilnAPISetLastError)(const char* msg);
/* The thread count of the pool __KilnBackendParallelLaunch uses (behind KilnSet/GetNumThreads).
 * The Python loader points these three pool services and __KilnAPISetLastError of every library
 * at those of one library, so a process has one pool (kiln/runtime/shared_crt.py). */
extern int32_t (*__KilnBackendGetNumThreads)(void);
extern void (*__KilnBackendSetNumThreads)(int32_t num_threads);

/* Convenience wrappers used by generated code. */
static inline void* KilnBackendAllocWorkspace(int32_t device_type, int32_t device_id, uint64_t nbytes,
                                              int32_t dtype_code_hint, int32_t dtype_bits_hint) {
  return __KilnBackendAllocWorkspace(device_type, device_id, nbytes, dtype_code_hint, dtype_bits_hint);
}
static inline int32_t KilnBackendFreeWorkspace(int32_t device_type, int32_t device_id, void* ptr) {
  return __KilnBackendFreeWorkspace(device_type, device_id, ptr);
}
static inline int32_t KilnBackendParallelLaunch(KilnParallelLambda body, void* cdata, int32_t num_task) {
  return __KilnBackendParallelLaunch(body, cdata, num_task);
}
static inline void KilnAPISetLastError(const char* msg) { __KilnAPISetLastError(msg); }

/* ---- Exported by kiln_crt.c into every library ---- */

/* One bound kernel call of an executor: the executor builds an array of these once. */
typedef struct {
  KilnBackendPackedCFunc fn;
  KilnValue* args;
  int32_t* type_codes;
  int32_t num_args;
  int32_t reserved;
} KilnOpCall;

/* Runs calls[0..n) in order; returns -1 on success, else the index of the failing call. */
KILN_DLL int32_t KilnRunSequence(const KilnOpCall* calls, int32_t n);
/* Message recorded by the last failing call on this thread ("" if none). */
KILN_DLL const char* KilnGetLastError(void);
/* Thread count used by KilnBackendParallelLaunch (0 = KILN_NUM_THREADS or all cores). */
KILN_DLL void KilnSetNumThreads(int32_t n);
KILN_DLL int32_t KilnGetNumThreads(void);
KILN_DLL int32_t KilnABIVersion(void);
/* Kernel support (hidden: each library binds its own). Records the printf-formatted message as
 * this thread's last error and returns -1 (a kernel's error return). */
__attribute__((visibility("hidden"), format(printf, 1, 2))) int32_t KilnErrorf(const char* fmt, ...);
/* "float32", "int64", "bool", ... and "(1, 3, 224, 224)" into buf (hidden; for error messages). */
__attribute__((visibility("hidden"))) const char* KilnDTypeText(uint8_t code, uint8_t bits, uint16_t lanes, char* buf,
                                                               size_t n);
__attribute__((visibility("hidden"))) const char* KilnShapeText(int32_t ndim, const int64_t* shape, char* buf, size_t n);
/* Checks packed argument i against the
 * buffer a kernel was compiled for: a CPU DLTensor of dtype (code, bits), the given shape, compact
 * row-major; on a mismatch records "<fn>: argument <i> (<name>) ..." and returns -1, else 0.
 * A dynamic dim is given as -1 - max in shape: the tensor's extent may be 0..max, and its strides
 * (when not NULL) must be those of the max shape (the padded layout of dynamic dimensions). */
__attribute__((visibility("hidden"))) int32_t KilnCheckTensorArg(const char* fn, int32_t i, const char* name,
                                                                 const int32_t* type_codes, const KilnValue* args,
                                                                 int32_t ndim, const int64_t* shape, uint8_t code,
                                                                 uint8_t bits);

#ifdef __cplusplus
}
#endif
#endif /* KILN_C_RUNTIME_API_H_ */
