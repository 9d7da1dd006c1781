/*
 * engine/cpu/peak.c — register-only multiply-add loops that measure the
 * core's peak fp32 and bf16 rates (peak.h). Each runs 12 independent
 * accumulators, enough to cover the FMA latency on every x86 core we know,
 * written out so that they stay in registers (a loop over them kept them
 * in memory and measured store-forwarding).
 */
#include <immintrin.h>
#include <time.h>

#include "engine/cpu/peak.h"

#define ACC 12

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/*
 * One loop: NAME for TARGET, ACC accumulators of VEC zeroed by ZERO, INPUTS
 * declaring the x and y of each step, STEP(acc) one multiply-add (FLOPS per
 * step), REG the asm constraint that holds four of them in registers, SUM
 * of an accumulator what goes into *sink so that nothing is dropped.
 */
#define PEAK_LOOP(NAME, TARGET, VEC, ZERO, INPUTS, STEP, REG, SUM, FLOPS)                     \
	__attribute__((target(TARGET))) static double NAME(long iters, float *sink)           \
	{                                                                                     \
		VEC a[ACC];                                                                   \
		INPUTS;                                                                       \
		for (int i = 0; i < ACC; i++)                                                 \
			a[i] = ZERO;                                                          \
		double t0 = now();                                                            \
		for (long i = 0; i < iters; i++) {                                            \
			a[0] = STEP(a[0]), a[1] = STEP(a[1]), a[2] = STEP(a[2]);              \
			a[3] = STEP(a[3]), a[4] = STEP(a[4]), a[5] = STEP(a[5]);              \
			a[6] = STEP(a[6]), a[7] = STEP(a[7]), a[8] = STEP(a[8]);              \
			a[9] = STEP(a[9]), a[10] = STEP(a[10]), a[11] = STEP(a[11]);          \
			__asm__ volatile("" ::REG(a[0]), REG(a[1]), REG(a[2]), REG(a[3]));    \
		}                                                                             \
		double dt = now() - t0;                                                       \
		for (int i = 0; i < ACC; i++)                                                 \
			*sink += SUM(a[i]);                                                   \
		return dt > 0 ? iters * ACC * (FLOPS) / dt / 1e9 : 0;                         \
	}

#define FMA256(acc) _mm256_fmadd_ps(x, y, acc)
#define FMA512(acc) _mm512_fmadd_ps(x, y, acc)
#define DPBF16(acc) _mm512_dpbf16_ps(acc, x, y)

PEAK_LOOP(fp32_avx2, "avx2,fma", __m256, _mm256_setzero_ps(),
	  __m256 x = _mm256_set1_ps(1.0001f); __m256 y = _mm256_set1_ps(0.9999f), FMA256, "x",
	  _mm256_cvtss_f32, 16.0)
PEAK_LOOP(fp32_avx512, "avx512f", __m512, _mm512_setzero_ps(),
	  __m512 x = _mm512_set1_ps(1.0001f); __m512 y = _mm512_set1_ps(0.9999f), FMA512, "v",
	  _mm512_reduce_add_ps, 32.0)
PEAK_LOOP(bf16_avx512, "avx512f,avx512bf16", __m512, _mm512_setzero_ps(),
	  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
	  __m512bh y = (__m512bh)_mm512_set1_epi16(0x3f80), DPBF16, "v", _mm512_reduce_add_ps,
	  64.0)

int loom_cpu_peak_supported(loom_cpu_peak k)
{
	__builtin_cpu_init();
	switch (k) {
	case LOOM_CPU_PEAK_FP32_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	case LOOM_CPU_PEAK_FP32_AVX512:
		return __builtin_cpu_supports("avx512f");
	case LOOM_CPU_PEAK_BF16_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
	}
	return 0;
}

double loom_cpu_peak_gflops(loom_cpu_peak k, long iters, float *sink)
{
	if (!loom_cpu_peak_supported(k) || iters < 1)
		return 0;
	switch (k) {
	case LOOM_CPU_PEAK_FP32_AVX2:
		return fp32_avx2(iters, sink);
	case LOOM_CPU_PEAK_FP32_AVX512:
		return fp32_avx512(iters, sink);
	case LOOM_CPU_PEAK_BF16_AVX512:
		return bf16_avx512(iters, sink);
	}
	return 0;
}
