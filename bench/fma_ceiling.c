/* Ceilings of an AVX2 convolution micro-kernel on this core: FP32 FMA peak, and what the
 * broadcasts of a blocked (NCHWc) conv tile cost.  Each loop is the inner reduction step of a
 * register tile, with its loads from one cached line, timed over 50M iterations (best of 5).
 *
 *   cc -O2 bench/fma_ceiling.c -o /tmp/fma_ceiling && /tmp/fma_ceiling
 *
 * x86-64 with AVX2 + FMA only (inline assembly, AT&T syntax).  Results: bench/RESULTS.md,
 * "Conv micro-kernel ceilings". */
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float buf[1024] __attribute__((aligned(64)));

#define ZERO                                                                                            \
  "vxorps %%ymm0,%%ymm0,%%ymm0\n vxorps %%ymm1,%%ymm1,%%ymm1\n vxorps %%ymm2,%%ymm2,%%ymm2\n"           \
  "vxorps %%ymm3,%%ymm3,%%ymm3\n vxorps %%ymm4,%%ymm4,%%ymm4\n vxorps %%ymm5,%%ymm5,%%ymm5\n"           \
  "vxorps %%ymm6,%%ymm6,%%ymm6\n vxorps %%ymm7,%%ymm7,%%ymm7\n vxorps %%ymm8,%%ymm8,%%ymm8\n"           \
  "vxorps %%ymm9,%%ymm9,%%ymm9\n vxorps %%ymm10,%%ymm10,%%ymm10\n vxorps %%ymm11,%%ymm11,%%ymm11\n"     \
  "vxorps %%ymm12,%%ymm12,%%ymm12\n vxorps %%ymm13,%%ymm13,%%ymm13\n"
#define CLOBBERS "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                 "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory"
/* one FMA into accumulator acc from registers only */
#define F(acc) "vfmadd231ps %%ymm12,%%ymm13,%%ymm" #acc "\n"
/* ob = 8: broadcast one input value, one FMA with the weight vector in ymm15 */
#define B1(off, acc) "vbroadcastss " #off "(%1),%%ymm14\n vfmadd231ps %%ymm14,%%ymm15,%%ymm" #acc "\n"
/* ob = 16: broadcast one input value, two FMAs with the weight vectors in ymm15, ymm13 */
#define B2(off, a, b) "vbroadcastss " #off "(%1),%%ymm14\n vfmadd231ps %%ymm14,%%ymm15,%%ymm" #a "\n" \
                      " vfmadd231ps %%ymm14,%%ymm13,%%ymm" #b "\n"

static const long N = 50000000;

int main(void) {
  double best[4] = {0, 0, 0, 0};
  for (int round = 0; round < 5; round++) {
    double t0 = now(), g;
    __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n" F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
                     "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
    g = N * 12 * 16.0 / (now() - t0) / 1e9;
    if (g > best[0]) best[0] = g;
    t0 = now();
    __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%ymm15\n"
                     B1(4, 0) B1(8, 1) B1(12, 2) B1(16, 3) B1(20, 4) B1(24, 5) B1(28, 6) B1(32, 7)
                     B1(36, 8) B1(40, 9) B1(44, 10) B1(48, 11) B1(52, 12) B1(56, 13)
                     "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
    g = N * 14 * 16.0 / (now() - t0) / 1e9;
    if (g > best[1]) best[1] = g;
    t0 = now();
    __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%ymm15\n vmovups 32(%1),%%ymm13\n"
                     B2(64, 0, 1) B2(68, 2, 3) B2(72, 4, 5) B2(76, 6, 7) B2(80, 8, 9) B2(84, 10, 11)
                     "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
    g = N * 12 * 16.0 / (now() - t0) / 1e9;
    if (g > best[2]) best[2] = g;
    t0 = now();
    __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%ymm15\n vmovups 32(%1),%%ymm13\n"
                     B2(64, 0, 1) B2(68, 2, 3) B2(72, 4, 5) B2(76, 6, 7)
                     "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
    g = N * 8 * 16.0 / (now() - t0) / 1e9;
    if (g > best[3]) best[3] = g;
  }
  printf("FMA peak, 12 independent accumulators, no loads:        %6.1f GFLOP/s\n", best[0]);
  printf("ob 8,  14 pixels: 1 broadcast per FMA, 14 accumulators:  %6.1f GFLOP/s\n", best[1]);
  printf("ob 16,  6 pixels: 1 broadcast per 2 FMAs, 12 accumulators: %6.1f GFLOP/s\n", best[2]);
  printf("ob 16,  4 pixels: 1 broadcast per 2 FMAs, 8 accumulators: %6.1f GFLOP/s\n", best[3]);
  return 0;
}
