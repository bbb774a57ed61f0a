/* Ceilings of an AVX-512 convolution micro-kernel on this core: FP32 FMA peak on zmm registers,
 * and what the input broadcasts of a blocked (NCHWc) conv tile cost with 16-lane vectors.  Each
 * loop is the inner reduction step of a register tile, its loads from one cached line, timed
 * over 50M iterations (best of 5).  The AVX2 twin is fma_ceiling.c.
 *
 *   cc -O2 bench/fma_ceiling_avx512.c -o /tmp/fma_ceiling_avx512 && /tmp/fma_ceiling_avx512
 *
 * x86-64 with AVX-512F only (inline assembly, AT&T syntax); on a host without it the program
 * says so and exits 2.  Results: bench/RESULTS.md, "Conv micro-kernel ceilings". */
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float buf[1024] __attribute__((aligned(64)));

#define Z(r) "vpxord %%zmm" #r ",%%zmm" #r ",%%zmm" #r "\n"
#define ZERO                                                                                             \
  Z(0) Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13) Z(14) Z(15) Z(16) Z(17)       \
  Z(18) Z(19) Z(20) Z(21) Z(22) Z(23) Z(24) Z(25) Z(26) Z(27) Z(28) Z(29) Z(30) Z(31)
/* every vector register (xmm16-31 exist only with AVX-512: run() is compiled for it) */
#define CLOBBERS "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",   \
                 "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", \
                 "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28",          \
                 "xmm29", "xmm30", "xmm31", "memory"
/* one FMA into accumulator acc from registers only */
#define F(acc) "vfmadd231ps %%zmm30,%%zmm31,%%zmm" #acc "\n"
/* ob = 16 (one vector per pixel): the input value broadcast by the FMA's own memory operand */
#define E1(off, acc) "vfmadd231ps " #off "(%1)%{1to16%},%%zmm31,%%zmm" #acc "\n"
/* ob = 16, the broadcast as its own instruction */
#define B1(off, acc) "vbroadcastss " #off "(%1),%%zmm29\n vfmadd231ps %%zmm29,%%zmm31,%%zmm" #acc "\n"
/* ob = 32 (two vectors per pixel): one broadcast, two FMAs with the weights in zmm31, zmm30 */
#define B2(off, a, b) "vbroadcastss " #off "(%1),%%zmm29\n vfmadd231ps %%zmm29,%%zmm31,%%zmm" #a "\n" \
                      " vfmadd231ps %%zmm29,%%zmm30,%%zmm" #b "\n"

static const long N = 50000000;

__attribute__((target("avx512f"))) static void run(double *best) {
  double t0 = now(), g;
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n" F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
                   F(12) F(13) F(14) F(15) "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 16 * 32.0 / (now() - t0) / 1e9;
  if (g > best[0]) best[0] = g;
  t0 = now();
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n" F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)
                   "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 8 * 32.0 / (now() - t0) / 1e9;
  if (g > best[1]) best[1] = g;
  t0 = now();
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%zmm31\n"
                   E1(64, 0) E1(68, 1) E1(72, 2) E1(76, 3) E1(80, 4) E1(84, 5) E1(88, 6) E1(92, 7)
                   E1(96, 8) E1(100, 9) E1(104, 10) E1(108, 11) E1(112, 12) E1(116, 13)
                   "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 14 * 32.0 / (now() - t0) / 1e9;
  if (g > best[2]) best[2] = g;
  t0 = now();
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%zmm31\n"
                   B1(64, 0) B1(68, 1) B1(72, 2) B1(76, 3) B1(80, 4) B1(84, 5) B1(88, 6) B1(92, 7)
                   B1(96, 8) B1(100, 9) B1(104, 10) B1(108, 11) B1(112, 12) B1(116, 13)
                   "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 14 * 32.0 / (now() - t0) / 1e9;
  if (g > best[3]) best[3] = g;
  t0 = now();
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%zmm31\n vmovups 64(%1),%%zmm30\n"
                   B2(128, 0, 1) B2(132, 2, 3) B2(136, 4, 5) B2(140, 6, 7) B2(144, 8, 9) B2(148, 10, 11)
                   B2(152, 12, 13) "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 14 * 32.0 / (now() - t0) / 1e9;
  if (g > best[4]) best[4] = g;
  t0 = now();
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%zmm31\n vmovups 64(%1),%%zmm30\n"
                   B2(128, 0, 1) B2(132, 2, 3) B2(136, 4, 5) B2(140, 6, 7)
                   "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 8 * 32.0 / (now() - t0) / 1e9;
  if (g > best[5]) best[5] = g;
  t0 = now();
  __asm__ volatile(ZERO "mov %0,%%rcx\n 1:\n vmovups (%1),%%zmm31\n vmovups 64(%1),%%zmm30\n"
                   B2(128, 0, 1) B2(132, 2, 3) B2(136, 4, 5) B2(140, 6, 7) B2(144, 8, 9) B2(148, 10, 11)
                   B2(152, 12, 13) B2(156, 14, 15) B2(160, 16, 17) B2(164, 18, 19) B2(168, 20, 21)
                   B2(172, 22, 23) B2(176, 24, 25) B2(180, 26, 27)
                   "dec %%rcx\n jnz 1b\n" ::"r"(N), "r"(buf) : CLOBBERS);
  g = N * 28 * 32.0 / (now() - t0) / 1e9;
  if (g > best[6]) best[6] = g;
}

int main(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    printf("this CPU has no AVX-512F\n");
    return 2;
  }
  double best[7] = {0, 0, 0, 0, 0, 0, 0};
  for (int round = 0; round < 5; round++) run(best);
  printf("FMA peak, 16 independent zmm accumulators, no loads:          %6.1f GFLOP/s\n", best[0]);
  printf("FMA, 8 independent zmm accumulators, no loads:                %6.1f GFLOP/s\n", best[1]);
  printf("ob 16, 14 pixels: FMA with embedded broadcast, 14 accumulators: %6.1f GFLOP/s\n", best[2]);
  printf("ob 16, 14 pixels: vbroadcastss per FMA, 14 accumulators:       %6.1f GFLOP/s\n", best[3]);
  printf("ob 32,  7 pixels: 1 broadcast per 2 FMAs, 14 accumulators:      %6.1f GFLOP/s\n", best[4]);
  printf("ob 32,  4 pixels: 1 broadcast per 2 FMAs, 8 accumulators:       %6.1f GFLOP/s\n", best[5]);
  printf("ob 32, 14 pixels: 1 broadcast per 2 FMAs, 28 accumulators:      %6.1f GFLOP/s\n", best[6]);
  return 0;
}
