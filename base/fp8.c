/*
 * base/fp8.c — the E4M3 and E5M2 value tables (every byte as fp32) and the
 * array converters between fp32 and fp8 storage (base/fp8.h).
 */
#include <math.h>

#include "base/fp8.h"

/*
 * Each table entry is a constant expression, written from the formats'
 * definitions rather than from the scalar converters, so that the test that
 * holds the two to each other compares two derivations. Magnitudes are
 * integers times a power of two, exact in fp32:
 *   E4M3 normal (1 + m/8) 2^(e-7) = ((8 + m) << e) 2^-10, subnormal m 2^-9;
 *   E5M2 normal (1 + m/4) 2^(e-15) = ((4 + m) << e) 2^-17, subnormal m 2^-16.
 */
#define SIGNED(b, mag) (((b) & 0x80) ? -(mag) : (mag))
#define E4M3_E(b) (((b) >> 3) & 0xf)
#define E4M3_M(b) ((b) & 7)
#define E4M3_VAL(b)                                                                      \
	SIGNED(b, ((b) & 0x7f) == 0x7f ? NAN                                             \
		  : (float)(E4M3_E(b) ? (8ull + E4M3_M(b)) << E4M3_E(b) : E4M3_M(b) << 1) * \
			    0x1p-10f)
#define E5M2_E(b) (((b) >> 2) & 0x1f)
#define E5M2_M(b) ((b) & 3)
#define E5M2_VAL(b)                                                                      \
	SIGNED(b, E5M2_E(b) == 31 ? (E5M2_M(b) ? NAN : INFINITY)                         \
		  : (float)(E5M2_E(b) ? (4ull + E5M2_M(b)) << E5M2_E(b) : E5M2_M(b) << 1) * \
			    0x1p-17f)

#define ROW4(F, b) F(b), F((b) + 1), F((b) + 2), F((b) + 3)
#define ROW16(F, b) ROW4(F, b), ROW4(F, (b) + 4), ROW4(F, (b) + 8), ROW4(F, (b) + 12)
#define ROW64(F, b) ROW16(F, b), ROW16(F, (b) + 16), ROW16(F, (b) + 32), ROW16(F, (b) + 48)
#define ROW256(F) ROW64(F, 0), ROW64(F, 64), ROW64(F, 128), ROW64(F, 192)

const float loom_e4m3_f32_lut[256] = { ROW256(E4M3_VAL) };
const float loom_e5m2_f32_lut[256] = { ROW256(E5M2_VAL) };

/* The narrowing loops vectorize; they are compiled for x86-64-v3 (AVX2, 8
 * lanes of 32 bits) besides the plain x86-64 baseline and picked at load,
 * as engine/cpu/blocked.c does, and likewise not under ASan. About 1.3 ns
 * an element against 4 on the baseline (one core, 2^24 elements). */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

CLONES void loom_f32_to_e4m3_array(const float *src, uint8_t *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_f32_to_e4m3(src[i]);
}

CLONES void loom_f32_to_e5m2_array(const float *src, uint8_t *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_f32_to_e5m2(src[i]);
}

void loom_e4m3_to_f32_array(const uint8_t *src, float *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_e4m3_f32_lut[src[i]];
}

void loom_e5m2_to_f32_array(const uint8_t *src, float *dst, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = loom_e5m2_f32_lut[src[i]];
}
