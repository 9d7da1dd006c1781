/*
 * base/half.h — fp16 (IEEE binary16) and bf16 storage as uint16_t, converted
 * exactly as the hardware does, so the CPU emulation of AMP matches a GPU bit
 * for bit: round to nearest even, overflow to inf, subnormals kept, NaN stays
 * a quiet NaN with its sign, ±0 kept.
 *
 * The scalar converters are static inline so kernels can inline them; they
 * are plain integer code and are also the portable path of the array
 * converters, which use F16C when the compiler has it.
 */
#ifndef LOOM_BASE_HALF_H
#define LOOM_BASE_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The bit casts run in CUDA kernels too (base/fp8.h's converters). */
#ifdef __CUDACC__
#define LOOM_BITS_HD __host__ __device__
#else
#define LOOM_BITS_HD
#endif

static inline LOOM_BITS_HD uint32_t loom_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline LOOM_BITS_HD float loom_f32_from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * fp32 -> fp16, round to nearest even. NaN: quiet bit set and the top ten
 * payload bits kept, which is what vcvtps2ph and CUDA's __float2half_rn do.
 */
static inline uint16_t loom_f32_to_f16(float f)
{
	uint32_t x = loom_f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;

	if (ax > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
	/* 65520 is the midpoint between 65504 (odd mantissa) and 2^16: ties go up */
	if (ax >= 0x477ff000u)
		return (uint16_t)(sign | 0x7c00u);
	if (ax >= 0x38800000u) {
		/* normal: rebias the exponent (127 -> 15) and round off 13 bits;
		 * a carry out of the mantissa correctly bumps the exponent */
		ax += 0xfffu + ((ax >> 13) & 1u);
		return (uint16_t)(sign | ((ax - (112u << 23)) >> 13));
	}
	/* below 2^-25 everything rounds to zero; 2^-25 itself ties to even 0 */
	if (ax < 0x33000000u)
		return (uint16_t)sign;
	{
		/* subnormal: value = m * 2^-24 with m = mantissa >> (126 - e) */
		uint32_t e = ax >> 23;
		uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126u - e; /* 14 .. 24 */
		uint32_t q = mant >> shift;
		uint32_t rem = mant & ((1u << shift) - 1u);
		uint32_t half = 1u << (shift - 1u);

		/* q may carry into 0x400, which is the smallest normal: correct */
		if (rem > half || (rem == half && (q & 1u)))
			q++;
		return (uint16_t)(sign | q);
	}
}

/* fp16 -> fp32, exact. A NaN comes back quiet with its payload. */
static inline float loom_f16_to_f32(uint16_t h)
{
	uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
	uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
	uint32_t mant = (uint32_t)h & 0x3ffu;

	if (e == 0x1fu) {
		if (mant == 0)
			return loom_f32_from_bits(sign | 0x7f800000u);
		return loom_f32_from_bits(sign | 0x7fc00000u | (mant << 13));
	}
	if (e == 0) {
		/* zero or subnormal: m * 2^-24 is exact in fp32 and normal there */
		float v = (float)mant * 0x1p-24f;

		return loom_f32_from_bits(sign | loom_f32_bits(v));
	}
	return loom_f32_from_bits(sign | ((e + 112u) << 23) | (mant << 13));
}

/*
 * fp32 -> bf16, round to nearest even on the bit pattern: that also rounds
 * fp32 subnormals correctly (bf16 has fp32's exponent range) and carries the
 * largest values into inf. NaN: quiet bit set, top payload bits kept.
 */
static inline uint16_t loom_f32_to_bf16(float f)
{
	uint32_t x = loom_f32_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact: a widening shift, as every implementation does it.
 * loom's own narrowing never makes a signalling NaN, so none is quieted. */
static inline float loom_bf16_to_f32(uint16_t b)
{
	return loom_f32_from_bits((uint32_t)b << 16);
}

/*
 * Array converters over n elements (n <= 0 does nothing); src and dst must
 * not overlap. Large arrays are split across OpenMP threads. The fp16 ones
 * use F16C when built with it and agree bit for bit with the scalar ones.
 */
void loom_f32_to_f16_array(const float *src, uint16_t *dst, int64_t n);
void loom_f16_to_f32_array(const uint16_t *src, float *dst, int64_t n);
void loom_f32_to_bf16_array(const float *src, uint16_t *dst, int64_t n);
void loom_bf16_to_f32_array(const uint16_t *src, float *dst, int64_t n);

/* 1 when the array converters of this build use F16C, 0 on the portable path. */
int loom_half_uses_f16c(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_HALF_H */
