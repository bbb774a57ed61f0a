/* A stand-in for libcuda.so.1 used by Kiln's tests on machines without a GPU.
 *
 * It implements the driver-API entry points kiln.runtime.cuda_driver calls, with "device" memory
 * in host RAM (a CUdeviceptr is a malloc'ed address) so that the runtime's ctypes plumbing
 * (signatures, argument marshalling, copies, launch dimensions) is exercised for real.
 * It cannot run PTX: cuLaunchKernel records the launch and calls a hook the test installs
 * (mock_set_launch_hook), which emulates the kernel on the host with the very parameter
 * pointers the runtime passed. Environment: KILN_MOCK_CUDA_DEVICES (device count, default 1;
 * 0 makes cuInit fail with CUDA_ERROR_NO_DEVICE), KILN_MOCK_CUDA_VERSION (default 12040).
 * A PTX image whose ".version" is above the mock driver's ISA (8.4) is rejected with
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION, as a real old driver does.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;

typedef struct { char *image; size_t size; } mock_module;
typedef struct { char name[256]; } mock_function;

typedef void (*launch_hook_t)(const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, void **params);

static launch_hook_t g_hook = 0;
static long g_live = 0;
static long g_launches = 0;
static int g_ctx = 0x1234;
static char g_last_kernel[256];
static unsigned g_last_dims[7];

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

void mock_set_launch_hook(launch_hook_t h) { g_hook = h; }
long mock_live_allocs(void) { return g_live; }
long mock_launch_count(void) { return g_launches; }
const char *mock_last_kernel(void) { return g_last_kernel; }
unsigned mock_last_dim(int i) { return g_last_dims[i]; }

CUresult cuInit(unsigned flags) { (void)flags; return env_int("KILN_MOCK_CUDA_DEVICES", 1) > 0 ? 0 : 100; }
CUresult cuDriverGetVersion(int *v) { *v = env_int("KILN_MOCK_CUDA_VERSION", 12040); return 0; }
CUresult cuDeviceGetCount(int *n) { *n = env_int("KILN_MOCK_CUDA_DEVICES", 1); return 0; }
CUresult cuDeviceGet(int *d, int ordinal) {
    if (ordinal < 0 || ordinal >= env_int("KILN_MOCK_CUDA_DEVICES", 1)) return 101; /* INVALID_DEVICE */
    *d = ordinal;
    return 0;
}
CUresult cuDeviceGetName(char *buf, int len, int dev) { snprintf(buf, len, "Kiln Mock GPU %d", dev); return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    switch (attr) {
        case 1: *v = 1024; break;          /* max threads per block */
        case 2: *v = 1024; break;
        case 3: *v = 1024; break;
        case 4: *v = 64; break;
        case 8: *v = 49152; break;         /* shared memory per block */
        case 10: *v = 32; break;           /* warp size */
        case 16: *v = 132; break;          /* SMs */
        case 75: *v = 9; break;            /* compute capability */
        case 76: *v = 0; break;
        default: *v = 0;
    }
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *n, int dev) { (void)dev; *n = (size_t)80 << 30; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &g_ctx; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &g_ctx ? 0 : 201; /* INVALID_CONTEXT */ }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    void *m = malloc(n);
    if (!m) return 2; /* OUT_OF_MEMORY */
    g_live++;
    *p = (CUdeviceptr)(uintptr_t)m;
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); g_live--; return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)70 << 30; *t = (size_t)80 << 30; return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) { (void)st; return cuMemcpyHtoD_v2(d, s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoH_v2(d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) { (void)st; return cuMemcpyDtoD_v2(d, s, n); }
CUresult cuMemcpyPeer(CUdeviceptr d, void *dc, CUdeviceptr s, void *sc, size_t n) { (void)dc; (void)sc; return cuMemcpyDtoD_v2(d, s, n); }
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = malloc(1); return 0; }
CUresult cuStreamDestroy_v2(void *s) { free(s); return 0; }
CUresult cuStreamSynchronize(void *s) { (void)s; return 0; }

CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned n, int *opts, void **vals) {
    (void)n; (void)opts; (void)vals;
    const char *img = (const char *)image;
    const char *v = strstr(img, ".version ");
    if (v) {
        int maj = 0, min = 0;
        if (sscanf(v + 9, "%d.%d", &maj, &min) == 2 && (maj > 8 || (maj == 8 && min > 4))) return 222;
    }
    mock_module *m = (mock_module *)malloc(sizeof(mock_module));
    m->size = strlen(img);
    m->image = strdup(img);
    *mod = m;
    return 0;
}
CUresult cuModuleUnload(void *mod) { mock_module *m = (mock_module *)mod; free(m->image); free(m); return 0; }
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    mock_module *m = (mock_module *)mod;
    char pat[300];
    snprintf(pat, sizeof pat, ".entry %s(", name);
    if (!strstr(m->image, pat)) return 500; /* NOT_FOUND */
    mock_function *f = (mock_function *)malloc(sizeof(mock_function));
    snprintf(f->name, sizeof f->name, "%s", name);
    *fn = f;
    return 0;
}
CUresult cuFuncSetAttribute(void *fn, int attr, int value) { (void)fn; (void)attr; (void)value; return 0; }
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *stream, void **params, void **extra) {
    (void)stream; (void)extra;
    mock_function *f = (mock_function *)fn;
    if (bx * by * bz > 1024) return 1; /* INVALID_VALUE */
    g_launches++;
    snprintf(g_last_kernel, sizeof g_last_kernel, "%s", f->name);
    unsigned dims[7] = {gx, gy, gz, bx, by, bz, shared};
    memcpy(g_last_dims, dims, sizeof dims);
    if (g_hook) g_hook(f->name, gx, gy, gz, bx, by, bz, shared, params);
    return 0;
}
CUresult cuGetErrorName(CUresult rc, const char **s) {
    switch (rc) {
        case 100: *s = "CUDA_ERROR_NO_DEVICE"; break;
        case 222: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
        case 500: *s = "CUDA_ERROR_NOT_FOUND"; break;
        default: *s = "CUDA_ERROR_MOCK";
    }
    return 0;
}
CUresult cuGetErrorString(CUresult rc, const char **s) { (void)rc; *s = "mock driver error"; return 0; }
