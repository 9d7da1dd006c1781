/*
 * amp/scaler.c — the loss-scale state machine and the fused unscale + overflow
 * check. engine/cuda mirrors loom_scaler_update in a one-thread kernel, so
 * keep it branch-for-branch simple and free of anything a kernel lacks.
 */
#include "amp/scaler.h"

#include <math.h>

#include "amp/half.h"

#ifdef __F16C__
#include <immintrin.h>
#endif

#define LOOM_UNSCALE_CHUNK ((int64_t)1 << 15)
#define LOOM_UNSCALE_PAR_MIN ((int64_t)1 << 17)

int loom_scaler_init(loom_scaler *s, float init_scale, int32_t growth_interval,
		     int dynamic)
{
	if (!s || !isfinite(init_scale) || !(init_scale > 0.0f))
		return 1;
	if (dynamic && growth_interval < 1)
		return 1;
	s->scale = init_scale;
	s->growth_factor = LOOM_SCALER_GROWTH_FACTOR;
	s->backoff_factor = LOOM_SCALER_BACKOFF_FACTOR;
	s->max_scale = LOOM_SCALER_MAX_SCALE;
	s->growth_tracker = 0;
	s->growth_interval = dynamic ? growth_interval : 0;
	s->dynamic = dynamic ? 1 : 0;
	s->pad_ = 0;
	s->skipped_steps = 0;
	s->below_one_steps = 0;
	/* apex clamps growth at the cap; a start above it would otherwise
	 * shrink on the first growth, which reads like a backoff */
	if (s->dynamic && s->scale > s->max_scale)
		s->scale = s->max_scale;
	return 0;
}

int loom_scaler_update(loom_scaler *s, int found_inf)
{
	int apply = 1;

	if (found_inf) {
		if (s->dynamic) {
			float next = s->scale * s->backoff_factor;

			/* no floor (apex has none), but 0 would make every
			 * later gradient 0 and its unscale 0 * inf */
			if (next > 0.0f)
				s->scale = next;
		}
		s->growth_tracker = 0;
		s->skipped_steps++;
		apply = 0;
	} else if (s->dynamic) {
		int32_t clean = s->growth_tracker + 1;

		if (clean >= s->growth_interval) {
			float next = s->scale * s->growth_factor;

			s->scale = next < s->max_scale ? next : s->max_scale;
			clean = 0;
		}
		s->growth_tracker = clean;
	}
	if (s->dynamic && s->scale < 1.0f)
		s->below_one_steps++;
	return apply;
}

int loom_scaler_collapsed(const loom_scaler *s)
{
	return s->dynamic && s->scale < 1.0f;
}

float loom_scaler_inv_scale(const loom_scaler *s)
{
	return 1.0f / s->scale;
}

/* 1 when the float with these bits is inf or NaN: all exponent bits set.
 * A bit test rather than isfinite() so that the loops below vectorize. */
static inline uint32_t nonfinite_bits(uint32_t u)
{
	return (u & 0x7f800000u) == 0x7f800000u;
}

static uint32_t unscale_f32_range(float *g, int64_t n, float inv_scale)
{
	uint32_t bad = 0;

	for (int64_t i = 0; i < n; i++) {
		float v = g[i] * inv_scale;

		g[i] = v;
		bad |= nonfinite_bits(loom_f32_bits(v));
	}
	return bad;
}

static uint32_t unscale_f16_range(const uint16_t *h, float *g, int64_t n,
				  float inv_scale)
{
	uint32_t bad = 0;
	int64_t i = 0;

#ifdef __F16C__
	__m256 vs = _mm256_set1_ps(inv_scale);
	__m256i expo = _mm256_set1_epi32(0x7f800000);
	__m256i acc = _mm256_setzero_si256();

	for (; i + 8 <= n; i += 8) {
		__m128i x = _mm_loadu_si128((const __m128i *)(h + i));
		__m256 v = _mm256_mul_ps(_mm256_cvtph_ps(x), vs);
		__m256i e = _mm256_and_si256(_mm256_castps_si256(v), expo);

		_mm256_storeu_ps(g + i, v);
		acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(e, expo));
	}
	bad = !_mm256_testz_si256(acc, acc);
#endif
	for (; i < n; i++) {
		float v = loom_f16_to_f32(h[i]) * inv_scale;

		g[i] = v;
		bad |= nonfinite_bits(loom_f32_bits(v));
	}
	return bad;
}

static uint32_t unscale_bf16_range(const uint16_t *h, float *g, int64_t n,
				   float inv_scale)
{
	uint32_t bad = 0;

	for (int64_t i = 0; i < n; i++) {
		float v = loom_bf16_to_f32(h[i]) * inv_scale;

		g[i] = v;
		bad |= nonfinite_bits(loom_f32_bits(v));
	}
	return bad;
}

/* The source formats one chunked driver unscales. */
enum unscale_src { UNSCALE_F32, UNSCALE_F16, UNSCALE_BF16 };

/*
 * Splits n elements into chunks over the threads and unscales each with its
 * range function; returns 1 when every result is finite. For f32 the
 * multiply is in place (src is NULL, g32 the gradient).
 */
static int unscale_chunked(enum unscale_src kind, const uint16_t *src, float *g32, int64_t n,
			   float inv_scale)
{
	int64_t chunks = (n + LOOM_UNSCALE_CHUNK - 1) / LOOM_UNSCALE_CHUNK;
	uint32_t bad = 0;

	if (n <= 0)
		return 1;
#pragma omp parallel for schedule(static) reduction(| : bad) \
	if (n >= LOOM_UNSCALE_PAR_MIN)
	for (int64_t c = 0; c < chunks; c++) {
		int64_t lo = c * LOOM_UNSCALE_CHUNK;
		int64_t len = n - lo < LOOM_UNSCALE_CHUNK ? n - lo : LOOM_UNSCALE_CHUNK;

		switch (kind) {
		case UNSCALE_F32:
			bad |= unscale_f32_range(g32 + lo, len, inv_scale);
			break;
		case UNSCALE_F16:
			bad |= unscale_f16_range(src + lo, g32 + lo, len, inv_scale);
			break;
		default:
			bad |= unscale_bf16_range(src + lo, g32 + lo, len, inv_scale);
			break;
		}
	}
	return !bad;
}

int loom_amp_unscale_check_f32(float *grad, int64_t n, float inv_scale)
{
	return unscale_chunked(UNSCALE_F32, NULL, grad, n, inv_scale);
}

int loom_amp_unscale_f16_to_f32(const uint16_t *g16, float *g32, int64_t n,
				float inv_scale)
{
	return unscale_chunked(UNSCALE_F16, g16, g32, n, inv_scale);
}

int loom_amp_unscale_bf16_to_f32(const uint16_t *g16, float *g32, int64_t n,
				 float inv_scale)
{
	return unscale_chunked(UNSCALE_BF16, g16, g32, n, inv_scale);
}
