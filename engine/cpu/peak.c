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

__attribute__((target("avx2,fma"))) static double fp32_avx2(long iters, float *sink)
{
	__m256 a[ACC], x = _mm256_set1_ps(1.0001f), y = _mm256_set1_ps(0.9999f);
	for (int i = 0; i < ACC; i++)
		a[i] = _mm256_setzero_ps();
	double t0 = now();
	for (long i = 0; i < iters; i++) {
#define F(k) a[k] = _mm256_fmadd_ps(x, y, a[k]);
		F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#undef F
		__asm__ volatile("" ::"x"(a[0]), "x"(a[1]), "x"(a[2]), "x"(a[3]));
	}
	double dt = now() - t0;
	float s[8];
	for (int i = 0; i < ACC; i++) {
		_mm256_storeu_ps(s, a[i]);
		*sink += s[0];
	}
	return dt > 0 ? iters * ACC * 16.0 / dt / 1e9 : 0;
}

__attribute__((target("avx512f"))) static double fp32_avx512(long iters, float *sink)
{
	__m512 a[ACC], x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
	for (int i = 0; i < ACC; i++)
		a[i] = _mm512_setzero_ps();
	double t0 = now();
	for (long i = 0; i < iters; i++) {
#define F(k) a[k] = _mm512_fmadd_ps(x, y, a[k]);
		F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#undef F
		__asm__ volatile("" ::"v"(a[0]), "v"(a[1]), "v"(a[2]), "v"(a[3]));
	}
	double dt = now() - t0;
	for (int i = 0; i < ACC; i++)
		*sink += _mm512_reduce_add_ps(a[i]);
	return dt > 0 ? iters * ACC * 32.0 / dt / 1e9 : 0;
}

__attribute__((target("avx512f,avx512bf16"))) static double bf16_avx512(long iters, float *sink)
{
	__m512 a[ACC];
	__m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f80);
	for (int i = 0; i < ACC; i++)
		a[i] = _mm512_setzero_ps();
	double t0 = now();
	for (long i = 0; i < iters; i++) {
#define B(k) a[k] = _mm512_dpbf16_ps(a[k], x, y);
		B(0) B(1) B(2) B(3) B(4) B(5) B(6) B(7) B(8) B(9) B(10) B(11)
#undef B
		__asm__ volatile("" ::"v"(a[0]), "v"(a[1]), "v"(a[2]), "v"(a[3]));
	}
	double dt = now() - t0;
	for (int i = 0; i < ACC; i++)
		*sink += _mm512_reduce_add_ps(a[i]);
	return dt > 0 ? iters * ACC * 64.0 / dt / 1e9 : 0;
}

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
