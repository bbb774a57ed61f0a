"""Fixed C text every generated translation unit starts with (helpers are ``static``).

:data:`C_PRELUDE` opens an include guard that :data:`C_PRELUDE_END` closes; between the two
:class:`~kiln.codegen.c.CCodeGen` puts the min / max / floor-division helpers, which every
C-style language defines alike (:meth:`kiln.codegen.cstyle.CStylePrinter.helper_source`).
"""

from __future__ import annotations

#: Includes, half-float conversions (up to the shared helpers).
C_PRELUDE = r"""
#include <kiln/c_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef KILN_PRELUDE_DEFINED
#define KILN_PRELUDE_DEFINED
/* float16 <-> float32.  Use the compiler's _Float16 when it has one (F16C instructions with
 * -mf16c), else exact round-to-nearest-even bit manipulation. */
#if defined(__FLT16_MAX__) && !defined(KILN_NO_FLOAT16)
static inline float kiln_h2f(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t kiln_f2h(float f) { _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
#else
static inline float kiln_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  float r;
  if (e == 0) {
    r = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */
    memcpy(&u, &r, 4); u |= sign; memcpy(&r, &u, 4);
    return r;
  }
  u = (e == 31) ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  memcpy(&r, &u, 4);
  return r;
}
static inline uint16_t kiln_f2h(float f) {
  uint32_t x; memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (a < 0x38800000u) { /* half subnormal: round(|f| * 2^24) */
    float af; memcpy(&af, &a, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(af * 16777216.0f));
  }
  a += 0xfffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}
#endif
/* bfloat16 is the top half of a float32; round to nearest even, keep NaNs quiet. */
static inline float kiln_bf2f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t kiln_f2bf(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
"""

#: Argument checking and error reporting of the packed functions; closes the include guard.
C_PRELUDE_END = r"""
#define kiln_arg_error KilnErrorf /* in the crt */
/* The error path of kiln.checked_index: an index read from data is outside [-n, n).  Cold and
 * out of line so that the check in the kernel's loop stays one compare and a not-taken branch. */
__attribute__((cold, noinline)) static int32_t kiln_index_error(const char* fn, const char* what, int64_t v,
                                                                int64_t n) {
  if (n == 0)
    return kiln_arg_error("%s: %s: index %lld is out of range: the axis has size 0, so no index is valid", fn,
                          what, (long long)v);
  return kiln_arg_error("%s: %s: index %lld is out of range [%lld, %lld]", fn, what, (long long)v,
                        -(long long)n, (long long)n - 1);
}
/* Checks one DLTensor argument against the buffer the kernel was compiled for (in the crt). */
static inline int32_t kiln_check_tensor(const char* fn, int32_t i, const char* name, int32_t* type_codes,
                                        KilnValue* args, int32_t ndim, const int64_t* shape, uint8_t code,
                                        uint8_t bits) {
  return KilnCheckTensorArg(fn, i, name, type_codes, args, ndim, shape, code, bits);
}
#endif /* KILN_PRELUDE_DEFINED */
"""
