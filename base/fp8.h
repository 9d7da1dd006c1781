/*
 * base/fp8.h — the two 8-bit float formats of FP8 training, stored as
 * uint8_t: E4M3 (OCP "e4m3fn": bias 7, largest finite 448, no infinities,
 * NaN only as 0x7f/0xff) for forward activations and weights, E5M2 (IEEE-like:
 * bias 15, largest finite 57344, infinities, NaNs) for gradients.
 *
 * Narrowing is round to nearest even and saturating, as CUDA's
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) and Transformer Engine do:
 * any magnitude that would round past the largest finite value, infinity
 * included, becomes that value with its sign; NaN stays NaN. Widening is
 * exact. The scalar converters are plain integer code with selects instead
 * of branches, so loops over them vectorize.
 */
#ifndef LOOM_BASE_FP8_H
#define LOOM_BASE_FP8_H

#include <math.h>
#include <stdint.h>

#include "base/half.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The scalar converters and the scale run in CUDA kernels too
 * (engine/cuda/fp8.cu), so both sides round with the same code. */
#ifdef __CUDACC__
#define LOOM_FP8_HD __host__ __device__
#else
#define LOOM_FP8_HD
#endif

#define LOOM_E4M3_MAX 448.0f   /* 0x7e: 1.75 * 2^8 */
#define LOOM_E5M2_MAX 57344.0f /* 0x7b: 1.75 * 2^15 */
#define LOOM_E4M3_NAN 0x7fu    /* the one NaN of each sign; | 0x80 for -NaN */
#define LOOM_E5M2_NAN 0x7eu    /* the quiet NaN narrowing gives, | 0x80 for -NaN */

/*
 * Each format has its own converters, written out with its constants,
 * rather than one function taking the format: GCC 12 jump-threads such a
 * function's selects into branches before inlining it, and the array loops
 * of fp8.c stop vectorizing (three times slower).
 *
 * Rounds off the low `shift` bits of a 24-bit significand (implicit bit set)
 * to nearest, ties to even: adding half an ulp less one plus the kept LSB
 * carries exactly when the rest is above half, or is half and the LSB is odd.
 * shift is 1..31; past 24 everything rounds to 0, as it should.
 */
static inline LOOM_FP8_HD uint32_t loom_fp8_round_sub(uint32_t mant, uint32_t shift)
{
	uint32_t half = 1u << (shift - 1u);

	return (mant + (half - 1u) + ((mant >> shift) & 1u)) >> shift;
}

/*
 * fp32 -> fp8 narrowing, one function per format with its constants as
 * literals (see above): DROP low bits go (23 - mantissa bits), REBIAS is
 * 127 - bias, SUB_TOP = 150 - k for the subnormal step 2^-k, MIN_NORMAL and
 * SAT_FROM are the fp32 bits of the smallest normal and of the first
 * magnitude that saturates to the code SAT, NAN the format's NaN.
 *
 * normal: rebias and round off DROP bits; a carry out of the mantissa bumps
 * the exponent, and nothing below SAT_FROM carries past the largest finite
 * value. subnormal: |x| = mant * 2^(e - 150), counted in steps of 2^-k; the
 * shift is clamped to 1..31 only so that the unselected lanes stay defined.
 */
#define LOOM_FP8_NARROW_FN(NAME, DROP, REBIAS, SUB_TOP, MIN_NORMAL, SAT_FROM, SAT, NAN)            \
	static inline LOOM_FP8_HD uint8_t NAME(float f)                                             \
	{                                                                                           \
		uint32_t x = loom_f32_bits(f);                                                      \
		uint32_t sign = (x >> 24) & 0x80u;                                                  \
		uint32_t ax = x & 0x7fffffffu;                                                      \
		uint32_t norm = (ax + ((1u << ((DROP) - 1u)) - 1u) + ((ax >> (DROP)) & 1u) -         \
				 ((REBIAS) << 23)) >> (DROP);                                       \
		uint32_t e = ax >> 23;                                                              \
		uint32_t shift = (SUB_TOP) - (e < (SUB_TOP) - 31u ? (SUB_TOP) - 31u :               \
					      e > (SUB_TOP) - 1u ? (SUB_TOP) - 1u : e);             \
		uint32_t sub = loom_fp8_round_sub((ax & 0x7fffffu) | 0x800000u, shift);             \
		uint32_t r = ax < (MIN_NORMAL) ? sub : norm;                                        \
 \
		r = ax >= (SAT_FROM) ? (SAT) : r;                                                   \
		r = ax > 0x7f800000u ? (NAN) : r;                                                   \
		return (uint8_t)(sign | r);                                                         \
	}

/*
 * fp32 -> E4M3, round to nearest even, saturating: |x| >= 448 (everything
 * from 448 to 464 rounds to 448 and everything above would overflow) and
 * ±inf give ±448 (0x7e/0xfe); NaN gives 0x7f with the sign; ±0 and values
 * that round to zero keep their sign. Below 2^-6 (0x3c800000) the result is
 * a subnormal m * 2^-9, m = 0..7 (8 carries into the smallest normal, 0x08).
 */
LOOM_FP8_NARROW_FN(loom_f32_to_e4m3, 20u, 120u, 141u, 0x3c800000u, 0x43e00000u, 0x7eu,
		   LOOM_E4M3_NAN)

/*
 * fp32 -> E5M2, round to nearest even, saturating: |x| >= 57344 (up to the
 * tie at 61440 it rounds there, beyond it would overflow) and ±inf give
 * ±57344 (0x7b/0xfb); NaN gives 0x7e with the sign; ±0 keeps its sign.
 * Below 2^-14 (0x38800000) the result is a subnormal m * 2^-16, m = 0..3.
 */
LOOM_FP8_NARROW_FN(loom_f32_to_e5m2, 21u, 112u, 134u, 0x38800000u, 0x47600000u, 0x7bu,
		   LOOM_E5M2_NAN)

/* bf16 -> fp8: through fp32, which holds every bf16 exactly, so this is one
 * rounding, the same as narrowing the bf16's value directly. */
static inline uint8_t loom_bf16_to_e4m3(uint16_t b)
{
	return loom_f32_to_e4m3(loom_bf16_to_f32(b));
}

static inline uint8_t loom_bf16_to_e5m2(uint16_t b)
{
	return loom_f32_to_e5m2(loom_bf16_to_f32(b));
}

/*
 * fp8 -> fp32 widening, exact, one function per format like the narrowing:
 * MANT mantissa bits, REBIAS 127 - bias, SUB_STEP the subnormal step 2^-k;
 * codes from SPECIAL up are the NaNs, INF (if the format has it, else a
 * code past 0x7f) is infinity. An fp8 NaN has no payload to keep: it gives
 * the quiet NaN 0x7fc00000 with the sign.
 *
 * normal: the fields widened in place, the exponent rebiased; subnormal:
 * m * SUB_STEP, the product is exact.
 */
#define LOOM_FP8_WIDEN_FN(NAME, MANT, REBIAS, SUB_STEP, SPECIAL, INF)                        \
	static inline LOOM_FP8_HD float NAME(uint8_t b)                                     \
	{                                                                                   \
		uint32_t sign = ((uint32_t)b & 0x80u) << 24;                                \
		uint32_t ab = (uint32_t)b & 0x7fu;                                          \
		uint32_t norm = (ab << (23 - (MANT))) + ((REBIAS) << 23);                   \
		uint32_t sub = loom_f32_bits((float)(ab & ((1u << (MANT)) - 1u)) * (SUB_STEP)); \
		uint32_t r = ab < (1u << (MANT)) ? sub : norm;                              \
                                                                                            \
		r = ab >= (SPECIAL) ? (ab == (INF) ? 0x7f800000u : 0x7fc00000u) : r;        \
		return loom_f32_from_bits(sign | r);                                        \
	}

/* E4M3 -> fp32: every E4M3 value is a normal fp32; 0x7f/0xff are NaN, no
 * infinity (0x80 is never a magnitude). */
LOOM_FP8_WIDEN_FN(loom_e4m3_to_f32, 3, 120u, 0x1p-9f, 0x7fu, 0x80u)

/* E5M2 -> fp32: ±inf (0x7c) stay infinite, 0x7d..0x7f are NaN. */
LOOM_FP8_WIDEN_FN(loom_e5m2_to_f32, 2, 112u, 0x1p-16f, 0x7cu, 0x7cu)

/*
 * The scale of current scaling, a power of two so that x * scale, the fp8
 * rounding and the division back are exact but for the rounding itself:
 * the largest 2^k with amax * 2^k <= fmax (fmax: LOOM_E4M3_MAX or
 * LOOM_E5M2_MAX), i.e. 2^floor(log2(fmax / amax)) without the division's
 * rounding. 1 when amax is 0, not finite or NaN (an all-zero tensor stays
 * zero, a NaN stays NaN). k is at most 117, so that the smallest value that
 * comes back, an E5M2 subnormal 2^-16 / 2^117, is still a bf16 (whose
 * subnormals end at 2^-133): below amax 2^-100 the rounding is coarser than
 * the format allows, and the result stays exact in bf16.
 */
static inline LOOM_FP8_HD float loom_fp8_scale(float amax, float fmax)
{
	int ea, ef;

	if (!(amax > 0) || !(amax <= 3.4028234663852886e38f))
		return 1.0f;
	float ma = frexpf(amax, &ea), mf = frexpf(fmax, &ef);
	int k = ef - ea - (ma > mf);

	return ldexpf(1.0f, k > 117 ? 117 : k);
}

/*
 * The 256 values of each format as fp32, index = the byte: the same bits as
 * loom_e4m3_to_f32 / loom_e5m2_to_f32 (tests/base:test_fp8 holds them to it),
 * one load instead of the arithmetic.
 */
extern const float loom_e4m3_f32_lut[256];
extern const float loom_e5m2_f32_lut[256];

/*
 * Array converters over n elements (n <= 0 does nothing); src and dst must
 * not overlap. The same bits as the scalar converters; widening reads the
 * tables above.
 */
void loom_f32_to_e4m3_array(const float *src, uint8_t *dst, int64_t n);
void loom_f32_to_e5m2_array(const float *src, uint8_t *dst, int64_t n);
void loom_e4m3_to_f32_array(const uint8_t *src, float *dst, int64_t n);
void loom_e5m2_to_f32_array(const uint8_t *src, float *dst, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_FP8_H */
