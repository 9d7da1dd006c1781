/*
 * engine/cpu/bf16_rows.c — bf16 <-> f32 over one thread's run of elements,
 * for the op families' native bf16 kernels (kernels.h's *_bf16): widen (exact, a
 * shift), round (nearest even, NaN quieted as half.h's loom_f32_to_bf16
 * does: the same bits) and widen-and-add. Compiled per instruction set
 * (BUILD's VARIANT_SRCS); the avx2 copy does eight elements per step with
 * AVX2 integer shifts, adds and a blend (no avx512_bf16 needed), the base
 * copy is plain C. Serial: the callers own the threads.
 */
#include <stdint.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"

#define BF16_FN(name) LOOM_CPU_PASTE(name, LOOM_CPU_F32)

#ifdef __AVX2__
static inline __m256 widen8(const uint16_t *p)
{
	__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* x + 0x7fff + lsb, >> 16; NaN: x >> 16 | 0x40. Packed to 8 x u16. */
static inline __m128i round8(__m256 f)
{
	const __m256i x = _mm256_castps_si256(f);
	const __m256i hi = _mm256_srli_epi32(x, 16);
	__m256i r = _mm256_add_epi32(x, _mm256_set1_epi32(0x7fff));
	r = _mm256_add_epi32(r, _mm256_and_si256(hi, _mm256_set1_epi32(1)));
	r = _mm256_srli_epi32(r, 16);
	const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
	const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
	r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
	/* Every lane is <= 0xffff: the signed-to-unsigned pack is exact; it
	 * packs within 128-bit lanes, so gather quadwords 0 and 2. */
	r = _mm256_packus_epi32(r, r);
	r = _mm256_permute4x64_epi64(r, 0x08);
	return _mm256_castsi256_si128(r);
}
#endif

/* One row loop: STEP8 for elements i..i+7 with AVX2 (the avx2 copy), then
 * ONE for element i up to n; the base copy runs ONE alone. */
#ifdef __AVX2__
#define BF16_ROW(n, STEP8, ONE)                      \
	do {                                         \
		int64_t i = 0;                       \
		for (; i + 8 <= (n); i += 8)         \
			STEP8;                       \
		for (; i < (n); i++)                 \
			ONE;                         \
	} while (0)
#else
#define BF16_ROW(n, STEP8, ONE)                      \
	do {                                         \
		for (int64_t i = 0; i < (n); i++)    \
			ONE;                         \
	} while (0)
#endif

void BF16_FN(loom_cpu_bf16_widen)(int64_t n, const uint16_t *src, float *dst)
{
	BF16_ROW(n, _mm256_storeu_ps(dst + i, widen8(src + i)), dst[i] = loom_bf16_to_f32(src[i]));
}

void BF16_FN(loom_cpu_bf16_round)(int64_t n, const float *src, uint16_t *dst)
{
	BF16_ROW(n, _mm_storeu_si128((__m128i *)(dst + i), round8(_mm256_loadu_ps(src + i))),
		 dst[i] = loom_f32_to_bf16(src[i]));
}

void BF16_FN(loom_cpu_bf16_acc)(int64_t n, const uint16_t *src, float *acc)
{
	BF16_ROW(n, _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), widen8(src + i))),
		 acc[i] += loom_bf16_to_f32(src[i]));
}
