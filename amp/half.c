/*
 * amp/half.c — array converters between fp32 and fp16/bf16 storage. They run
 * on every activation in the CPU emulation of AMP, so they are split across
 * OpenMP threads in fixed chunks and kept vectorizable within a chunk.
 */
#include "amp/half.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

/* Elements per OpenMP work item: big enough to amortise scheduling, small
 * enough that a few million elements spread over every core. */
#define LOOM_HALF_CHUNK ((int64_t)1 << 15)
/* Below this a single thread is faster than waking the team. */
#define LOOM_HALF_PAR_MIN ((int64_t)1 << 17)

static void f32_to_f16_range(const float *src, uint16_t *dst, int64_t n)
{
	int64_t i = 0;

#ifdef __F16C__
	/* the immediate rounding mode overrides MXCSR, as the GPU's _rn does */
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(src + i);
		__m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT |
					       _MM_FROUND_NO_EXC);
		_mm_storeu_si128((__m128i *)(dst + i), h);
	}
#endif
	for (; i < n; i++)
		dst[i] = loom_f32_to_f16(src[i]);
}

static void f16_to_f32_range(const uint16_t *src, float *dst, int64_t n)
{
	int64_t i = 0;

#ifdef __F16C__
	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm_loadu_si128((const __m128i *)(src + i));
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
	}
#endif
	for (; i < n; i++)
		dst[i] = loom_f16_to_f32(src[i]);
}

static void f32_to_bf16_range(const float *src, uint16_t *dst, int64_t n)
{
	/* the scalar converter is branch-light enough for the compiler to
	 * vectorize; no x86-64-v3 instruction does this conversion */
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_f32_to_bf16(src[i]);
}

static void bf16_to_f32_range(const uint16_t *src, float *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_bf16_to_f32(src[i]);
}

void loom_f32_to_f16_array(const float *src, uint16_t *dst, int64_t n)
{
	int64_t chunks = (n + LOOM_HALF_CHUNK - 1) / LOOM_HALF_CHUNK;

	if (n <= 0)
		return;
#pragma omp parallel for schedule(static) if (n >= LOOM_HALF_PAR_MIN)
	for (int64_t c = 0; c < chunks; c++) {
		int64_t lo = c * LOOM_HALF_CHUNK;
		int64_t len = n - lo < LOOM_HALF_CHUNK ? n - lo : LOOM_HALF_CHUNK;

		f32_to_f16_range(src + lo, dst + lo, len);
	}
}

void loom_f16_to_f32_array(const uint16_t *src, float *dst, int64_t n)
{
	int64_t chunks = (n + LOOM_HALF_CHUNK - 1) / LOOM_HALF_CHUNK;

	if (n <= 0)
		return;
#pragma omp parallel for schedule(static) if (n >= LOOM_HALF_PAR_MIN)
	for (int64_t c = 0; c < chunks; c++) {
		int64_t lo = c * LOOM_HALF_CHUNK;
		int64_t len = n - lo < LOOM_HALF_CHUNK ? n - lo : LOOM_HALF_CHUNK;

		f16_to_f32_range(src + lo, dst + lo, len);
	}
}

void loom_f32_to_bf16_array(const float *src, uint16_t *dst, int64_t n)
{
	int64_t chunks = (n + LOOM_HALF_CHUNK - 1) / LOOM_HALF_CHUNK;

	if (n <= 0)
		return;
#pragma omp parallel for schedule(static) if (n >= LOOM_HALF_PAR_MIN)
	for (int64_t c = 0; c < chunks; c++) {
		int64_t lo = c * LOOM_HALF_CHUNK;
		int64_t len = n - lo < LOOM_HALF_CHUNK ? n - lo : LOOM_HALF_CHUNK;

		f32_to_bf16_range(src + lo, dst + lo, len);
	}
}

void loom_bf16_to_f32_array(const uint16_t *src, float *dst, int64_t n)
{
	int64_t chunks = (n + LOOM_HALF_CHUNK - 1) / LOOM_HALF_CHUNK;

	if (n <= 0)
		return;
#pragma omp parallel for schedule(static) if (n >= LOOM_HALF_PAR_MIN)
	for (int64_t c = 0; c < chunks; c++) {
		int64_t lo = c * LOOM_HALF_CHUNK;
		int64_t len = n - lo < LOOM_HALF_CHUNK ? n - lo : LOOM_HALF_CHUNK;

		bf16_to_f32_range(src + lo, dst + lo, len);
	}
}

int loom_half_uses_f16c(void)
{
#ifdef __F16C__
	return 1;
#else
	return 0;
#endif
}
