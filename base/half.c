/*
 * base/half.c — array converters between fp32 and fp16/bf16 storage. They run
 * on every activation in the CPU emulation of AMP, so they are split across
 * OpenMP threads in fixed chunks and kept vectorizable within a chunk.
 */
#include "base/half.h"

/*
 * The F16C loops are compiled for F16C whatever the build's baseline (plain
 * x86-64 since the CPU path is picked at run time, see .bazelrc) and taken
 * when the CPU has it. LOOM_HALF_NO_F16C (//base:half_portable) leaves them
 * out, so that the tests can hold the portable loops to them bit for bit.
 */
#if defined(__x86_64__) && !defined(LOOM_HALF_NO_F16C)
#define LOOM_HALF_F16C 1
#include <immintrin.h>
#define LOOM_F16C_FN __attribute__((target("avx,f16c")))

static int have_f16c(void)
{
	static int has = -1; /* every thread computes the same answer */
	int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
	if (h < 0) {
		__builtin_cpu_init();
		h = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
		__atomic_store_n(&has, h, __ATOMIC_RELAXED);
	}
	return h;
}

/* the immediate rounding mode overrides MXCSR, as the GPU's _rn does */
static LOOM_F16C_FN int64_t f32_to_f16_f16c(const float *src, uint16_t *dst, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(src + i);
		__m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm_storeu_si128((__m128i *)(dst + i), h);
	}
	return i;
}

static LOOM_F16C_FN int64_t f16_to_f32_f16c(const uint16_t *src, float *dst, int64_t n)
{
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm_loadu_si128((const __m128i *)(src + i));
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
	}
	return i;
}

/* The bf16 loops are plain integer arithmetic on the bit patterns: the
 * scalar converters of half.h compiled for AVX2 (16 lanes of 16 bits
 * instead of SSE2's 8), the same bits. Taken when the CPU has AVX2. */
#define LOOM_AVX2_FN __attribute__((target("avx2")))

static int have_avx2(void)
{
	static int has = -1;
	int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
	if (h < 0) {
		__builtin_cpu_init();
		h = __builtin_cpu_supports("avx2");
		__atomic_store_n(&has, h, __ATOMIC_RELAXED);
	}
	return h;
}

/* The scalar bf16 converters are branch-light enough for the compiler to
 * vectorize; no x86-64-v3 instruction does these conversions. Both do all
 * n elements. */
static LOOM_AVX2_FN int64_t f32_to_bf16_avx2(const float *src, uint16_t *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_f32_to_bf16(src[i]);
	return n;
}

static LOOM_AVX2_FN int64_t bf16_to_f32_avx2(const uint16_t *src, float *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_bf16_to_f32(src[i]);
	return n;
}

/* The fast path of a range conversion where the CPU has it: it converts
 * the first i elements (whole vectors, or all of them). */
#define HALF_FAST(has, fast) do { if (has()) i = fast(src, dst, n); } while (0)
#else
#define HALF_FAST(has, fast) do { } while (0)
#endif

/* Elements per OpenMP work item: big enough to amortise scheduling, small
 * enough that a few million elements spread over every core. */
#define LOOM_HALF_CHUNK ((int64_t)1 << 15)
/* Below this a single thread is faster than waking the team. */
#define LOOM_HALF_PAR_MIN ((int64_t)1 << 17)

/* A range conversion: the fast path's share, then the scalar converter. */
#define HALF_RANGE(name, S, D, has, fast, convert)         \
	static void name(const S *src, D *dst, int64_t n)  \
	{                                                  \
		int64_t i = 0;                             \
		HALF_FAST(has, fast);                      \
		for (; i < n; i++)                         \
			dst[i] = convert(src[i]);          \
	}

HALF_RANGE(f32_to_f16_range, float, uint16_t, have_f16c, f32_to_f16_f16c, loom_f32_to_f16)
HALF_RANGE(f16_to_f32_range, uint16_t, float, have_f16c, f16_to_f32_f16c, loom_f16_to_f32)
HALF_RANGE(f32_to_bf16_range, float, uint16_t, have_avx2, f32_to_bf16_avx2, loom_f32_to_bf16)
HALF_RANGE(bf16_to_f32_range, uint16_t, float, have_avx2, bf16_to_f32_avx2, loom_bf16_to_f32)

/* The array conversions: chunks of LOOM_HALF_CHUNK over the threads, each
 * converted by its range function. */
#define HALF_ARRAY(name, S, D, range)                                              \
	void name(const S *src, D *dst, int64_t n)                                  \
	{                                                                           \
		int64_t chunks = (n + LOOM_HALF_CHUNK - 1) / LOOM_HALF_CHUNK;       \
		if (n <= 0)                                                         \
			return;                                                     \
		_Pragma("omp parallel for schedule(static) if (n >= LOOM_HALF_PAR_MIN)") \
		for (int64_t c = 0; c < chunks; c++) {                              \
			int64_t lo = c * LOOM_HALF_CHUNK;                           \
			int64_t len = n - lo < LOOM_HALF_CHUNK ? n - lo : LOOM_HALF_CHUNK; \
			range(src + lo, dst + lo, len);                             \
		}                                                                   \
	}

HALF_ARRAY(loom_f32_to_f16_array, float, uint16_t, f32_to_f16_range)
HALF_ARRAY(loom_f16_to_f32_array, uint16_t, float, f16_to_f32_range)
HALF_ARRAY(loom_f32_to_bf16_array, float, uint16_t, f32_to_bf16_range)
HALF_ARRAY(loom_bf16_to_f32_array, uint16_t, float, bf16_to_f32_range)

int loom_half_uses_f16c(void)
{
#ifdef LOOM_HALF_F16C
	return have_f16c();
#else
	return 0;
#endif
}
