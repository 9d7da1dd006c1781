/*
 * bench/bf16_peak.c — the core's peak multiply-add rate in fp32 (vfmadd231ps)
 * and in bf16 (vdpbf16ps, avx512_bf16), one thread, 512-bit registers, many
 * independent accumulators: what bf16 products can gain on this CPU at best.
 *   bf16_peak [rounds]
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench_util.h"

#define ACC 12
#define ITERS 25000000L

/* GFLOP/s of ITERS x ACC vfmadd231ps zmm (16 lanes, 2 flops each). */
__attribute__((target("avx512f"))) static double fp32_rate(float *sink)
{
	__m512 a[ACC], x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
	for (int i = 0; i < ACC; i++)
		a[i] = _mm512_setzero_ps();
	double t0 = bench_now();
	/* Written out so that the accumulators stay in registers (a loop
	 * over k kept them in memory and measured store-forwarding). */
	for (long i = 0; i < ITERS; i++) {
#define F(k) a[k] = _mm512_fmadd_ps(x, y, a[k]);
		F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#undef F
		__asm__ volatile("" ::"v"(a[0]), "v"(a[1]), "v"(a[2]), "v"(a[3]));
	}
	double dt = bench_now() - t0;
	for (int i = 0; i < ACC; i++)
		*sink += _mm512_reduce_add_ps(a[i]);
	return ITERS * ACC * 32.0 / dt / 1e9;
}

/* GFLOP/s of ITERS x ACC vdpbf16ps zmm (16 lanes, 2 products each). */
__attribute__((target("avx512f,avx512bf16"))) static double bf16_rate(float *sink)
{
	__m512 a[ACC];
	__m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f80);
	for (int i = 0; i < ACC; i++)
		a[i] = _mm512_setzero_ps();
	double t0 = bench_now();
	for (long i = 0; i < ITERS; i++) {
#define B(k) a[k] = _mm512_dpbf16_ps(a[k], x, y);
		B(0) B(1) B(2) B(3) B(4) B(5) B(6) B(7) B(8) B(9) B(10) B(11)
#undef B
		__asm__ volatile("" ::"v"(a[0]), "v"(a[1]), "v"(a[2]), "v"(a[3]));
	}
	double dt = bench_now() - t0;
	for (int i = 0; i < ACC; i++)
		*sink += _mm512_reduce_add_ps(a[i]);
	return ITERS * ACC * 64.0 / dt / 1e9;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 3;
	float sink = 0;
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
		printf("bf16_peak: this CPU has no avx512_bf16\n");
		return 0;
	}
	for (int r = 0; r < rounds; r++) {
		double f = fp32_rate(&sink), b = bf16_rate(&sink);
		printf("round %d: fp32 vfmadd231ps %.1f GFLOP/s, bf16 vdpbf16ps %.1f GFLOP/s, "
		       "bf16 / fp32 %.2f\n",
		       r + 1, f, b, b / f);
	}
	return sink == 1234.5f; /* keeps the sums alive */
}
