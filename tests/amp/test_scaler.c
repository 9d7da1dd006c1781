/*
 * tests/amp/test_scaler.c — the dynamic loss-scale state machine (apex /
 * GradScaler semantics) and the fused unscale + overflow check. Built twice:
 * with F16C and with -mno-f16c.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "amp/half.h"
#include "amp/scaler.h"

static loom_scaler make(float init, int32_t interval, int dynamic)
{
	loom_scaler s;

	cr_assert_eq(loom_scaler_init(&s, init, interval, dynamic), 0);
	return s;
}

Test(scaler, init_defaults)
{
	loom_scaler s = make(65536.0f, 2000, 1);

	cr_assert_eq(s.scale, 65536.0f);
	cr_assert_eq(s.growth_factor, 2.0f);
	cr_assert_eq(s.backoff_factor, 0.5f);
	cr_assert_eq(s.max_scale, 16777216.0f);
	cr_assert_eq(s.growth_interval, 2000);
	cr_assert_eq(s.growth_tracker, 0);
	cr_assert_eq(s.dynamic, 1);
	cr_assert_eq(s.skipped_steps, 0);
	cr_assert_eq(s.below_one_steps, 0);
	cr_assert_eq(loom_scaler_inv_scale(&s), 0x1p-16f);
	cr_assert_not(loom_scaler_collapsed(&s));
}

Test(scaler, init_rejects_bad_arguments)
{
	loom_scaler s = make(8.0f, 3, 1);

	cr_assert_eq(loom_scaler_init(NULL, 1.0f, 10, 1), 1);
	cr_assert_eq(loom_scaler_init(&s, 0.0f, 10, 1), 1);
	cr_assert_eq(loom_scaler_init(&s, -1.0f, 10, 1), 1);
	cr_assert_eq(loom_scaler_init(&s, INFINITY, 10, 1), 1);
	cr_assert_eq(loom_scaler_init(&s, NAN, 10, 1), 1);
	cr_assert_eq(loom_scaler_init(&s, 1.0f, 0, 1), 1);
	/* a rejected init leaves the state as it was */
	cr_assert_eq(s.scale, 8.0f);
	cr_assert_eq(s.growth_interval, 3);
	/* the interval means nothing to a static scale */
	cr_assert_eq(loom_scaler_init(&s, 128.0f, 0, 0), 0);
	cr_assert_eq(s.scale, 128.0f);
	/* a dynamic start above the cap is clamped to it */
	s = make(0x1p30f, 10, 1);
	cr_assert_eq(s.scale, 0x1p24f);
}

Test(scaler, overflow_skips_and_halves)
{
	loom_scaler s = make(65536.0f, 2000, 1);

	cr_assert_eq(loom_scaler_update(&s, 1), 0);
	cr_assert_eq(s.scale, 32768.0f);
	cr_assert_eq(s.skipped_steps, 1);
	cr_assert_eq(s.growth_tracker, 0);
	cr_assert_eq(loom_scaler_update(&s, 1), 0);
	cr_assert_eq(s.scale, 16384.0f);
	cr_assert_eq(s.skipped_steps, 2);
	cr_assert_eq(loom_scaler_update(&s, 0), 1);
	cr_assert_eq(s.scale, 16384.0f);
	cr_assert_eq(s.skipped_steps, 2);
	cr_assert_eq(s.growth_tracker, 1);
}

Test(scaler, grows_after_exactly_interval_clean_steps)
{
	loom_scaler s = make(65536.0f, 5, 1);

	for (int i = 1; i <= 4; i++) {
		cr_assert_eq(loom_scaler_update(&s, 0), 1);
		cr_assert_eq(s.scale, 65536.0f, "grew early at step %d", i);
		cr_assert_eq(s.growth_tracker, i);
	}
	cr_assert_eq(loom_scaler_update(&s, 0), 1);
	cr_assert_eq(s.scale, 131072.0f);
	cr_assert_eq(s.growth_tracker, 0);
	/* and again after another five, not sooner */
	for (int i = 0; i < 4; i++)
		loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 131072.0f);
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 262144.0f);
}

Test(scaler, default_interval_2000)
{
	loom_scaler s = make(65536.0f, LOOM_SCALER_GROWTH_INTERVAL, 1);

	for (int i = 0; i < 1999; i++)
		cr_assert_eq(loom_scaler_update(&s, 0), 1);
	cr_assert_eq(s.scale, 65536.0f);
	cr_assert_eq(s.growth_tracker, 1999);
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 131072.0f);
	cr_assert_eq(s.growth_tracker, 0);
}

Test(scaler, capped_at_max_scale)
{
	loom_scaler s = make(0x1p23f, 1, 1);

	cr_assert_eq(loom_scaler_update(&s, 0), 1);
	cr_assert_eq(s.scale, 0x1p24f);
	for (int i = 0; i < 10; i++) {
		cr_assert_eq(loom_scaler_update(&s, 0), 1);
		cr_assert_eq(s.scale, 0x1p24f);
		cr_assert_eq(s.growth_tracker, 0);
	}
	/* a cap that is not a power-of-two step away is reached exactly */
	s = make(0x1p23f * 1.5f, 1, 1);
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 0x1p24f);
}

Test(scaler, overflow_resets_growth_count)
{
	loom_scaler s = make(1024.0f, 3, 1);

	loom_scaler_update(&s, 0);
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.growth_tracker, 2);
	cr_assert_eq(loom_scaler_update(&s, 1), 0);
	cr_assert_eq(s.scale, 512.0f);
	cr_assert_eq(s.growth_tracker, 0);
	loom_scaler_update(&s, 0);
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 512.0f, "grew on a count that an overflow should have reset");
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 1024.0f);
}

Test(scaler, static_scale_never_changes)
{
	loom_scaler s = make(128.0f, 1, 0);
	int applied = 0, skipped = 0;

	for (int i = 0; i < 10000; i++) {
		int inf = (i % 7) == 3;
		int r = loom_scaler_update(&s, inf);

		cr_assert_eq(r, !inf);
		applied += r;
		skipped += !r;
		cr_assert_eq(s.scale, 128.0f);
	}
	cr_assert_eq(s.skipped_steps, skipped);
	cr_assert_eq(applied + skipped, 10000);
	cr_assert_eq(s.below_one_steps, 0);
	/* a static scale below one is the user's choice, not a collapse */
	s = make(0.25f, 0, 0);
	loom_scaler_update(&s, 1);
	cr_assert_eq(s.scale, 0.25f);
	cr_assert_not(loom_scaler_collapsed(&s));
}

Test(scaler, collapse_detection)
{
	loom_scaler s = make(4.0f, 2000, 1);

	loom_scaler_update(&s, 1);
	loom_scaler_update(&s, 1);
	cr_assert_eq(s.scale, 1.0f);
	cr_assert_not(loom_scaler_collapsed(&s));
	cr_assert_eq(s.below_one_steps, 0);
	loom_scaler_update(&s, 1);
	cr_assert_eq(s.scale, 0.5f);
	cr_assert(loom_scaler_collapsed(&s));
	cr_assert_eq(s.below_one_steps, 1);
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.below_one_steps, 2);
	cr_assert_eq(loom_scaler_inv_scale(&s), 2.0f);
}

Test(scaler, scale_never_reaches_zero)
{
	loom_scaler s = make(65536.0f, 2000, 1);

	for (int i = 0; i < 1000; i++)
		cr_assert_eq(loom_scaler_update(&s, 1), 0);
	/* halving stops at the smallest float: 2^-149 halves to 0 under RNE */
	cr_assert_eq(s.scale, 0x1p-149f);
	cr_assert_eq(s.skipped_steps, 1000);
	cr_assert(loom_scaler_collapsed(&s));
	/* and it can still grow back */
	s.growth_interval = 1;
	loom_scaler_update(&s, 0);
	cr_assert_eq(s.scale, 0x1p-148f);
}

/* ---------------------------------------------------------------- unscale */

Test(unscale, f32_exact_and_finite)
{
	float g[37];

	for (int i = 0; i < 37; i++)
		g[i] = (float)(i - 18) * 65536.0f;
	cr_assert_eq(loom_amp_unscale_check_f32(g, 37, 0x1p-16f), 1);
	for (int i = 0; i < 37; i++)
		cr_assert_eq(g[i], (float)(i - 18));
	cr_assert_eq(loom_amp_unscale_check_f32(g, 0, 0.5f), 1);
}

Test(unscale, f32_nonfinite_anywhere_fails)
{
	const int n = 43;
	const int where[] = { 0, 5, 8, 31, 40, 42 };
	float g[43];

	for (size_t k = 0; k < sizeof(where) / sizeof(where[0]); k++) {
		for (int bad = 0; bad < 3; bad++) {
			for (int i = 0; i < n; i++)
				g[i] = 2.0f;
			g[where[k]] = bad == 0 ? INFINITY : bad == 1 ? -INFINITY : NAN;
			cr_assert_eq(loom_amp_unscale_check_f32(g, n, 0.5f), 0,
				     "missed %d at %d", bad, where[k]);
			/* the rest is still unscaled: one pass did all of it */
			cr_assert_eq(g[(where[k] + 1) % n], 1.0f);
		}
	}
	/* an overflow of the multiply itself (scale below one) also fails */
	g[0] = 3e38f;
	cr_assert_eq(loom_amp_unscale_check_f32(g, 1, 4.0f), 0);
	cr_assert(isinf(g[0]));
}

Test(unscale, f16_recovers_values_only_scaling_made_representable)
{
	/* 2^-30 is below fp16's smallest subnormal; scaled by 2^16 it is 2^-14 */
	uint16_t g16[3];
	float g32[3];

	g16[0] = loom_f32_to_f16(0x1p-30f * 65536.0f);
	g16[1] = loom_f32_to_f16(0x1p-40f * 65536.0f); /* a half subnormal */
	g16[2] = loom_f32_to_f16(-3.0f * 0x1p-28f * 65536.0f);
	cr_assert_eq(g16[0], 0x0400);
	cr_assert_eq(g16[1], 0x0001);
	cr_assert_eq(loom_f32_to_f16(0x1p-30f), 0x0000, "unscaled it would be lost");
	cr_assert_eq(loom_amp_unscale_f16_to_f32(g16, g32, 3, 0x1p-16f), 1);
	cr_assert_eq(g32[0], 0x1p-30f);
	cr_assert_eq(g32[1], 0x1p-40f);
	cr_assert_eq(g32[2], -3.0f * 0x1p-28f);
}

Test(unscale, bf16_recovers_scaled_values)
{
	uint16_t g16[2];
	float g32[2];

	g16[0] = loom_f32_to_bf16(0x1p-130f * 65536.0f);
	g16[1] = loom_f32_to_bf16(1.5f * 65536.0f);
	cr_assert_eq(loom_amp_unscale_bf16_to_f32(g16, g32, 2, 0x1p-16f), 1);
	cr_assert_eq(g32[0], 0x1p-130f); /* an fp32 subnormal, exactly */
	cr_assert_eq(g32[1], 1.5f);
}

/* Long arrays (vector body, tails, OpenMP chunks): every value right, and an
 * inf or NaN in any position, including the last, fails the check. */
static void check_half_unscale(int bf16)
{
	const int64_t n = (1 << 18) + 11;
	const int64_t where[] = { 0, 7, 8, (1 << 15) - 1, (1 << 15), 200003, n - 1 };
	uint16_t *h = malloc((size_t)n * sizeof(*h));
	float *g = malloc((size_t)n * sizeof(*g));
	uint16_t inf = bf16 ? 0x7f80 : 0x7c00;
	uint16_t nan = bf16 ? 0xffc1 : 0xfe01;
	int (*unscale)(const uint16_t *, float *, int64_t, float) =
		bf16 ? loom_amp_unscale_bf16_to_f32 : loom_amp_unscale_f16_to_f32;

	cr_assert(h && g);
	for (int64_t i = 0; i < n; i++) {
		float v = (float)((i % 2001) - 1000) * 0.25f;

		h[i] = bf16 ? loom_f32_to_bf16(v) : loom_f32_to_f16(v);
	}
	cr_assert_eq(unscale(h, g, n, 0.125f), 1);
	for (int64_t i = 0; i < n; i++) {
		float v = bf16 ? loom_bf16_to_f32(h[i]) : loom_f16_to_f32(h[i]);

		cr_assert_eq(g[i], v * 0.125f, "at %lld", (long long)i);
	}
	for (size_t k = 0; k < sizeof(where) / sizeof(where[0]); k++) {
		uint16_t keep = h[where[k]];

		h[where[k]] = inf;
		cr_assert_eq(unscale(h, g, n, 0.125f), 0, "missed inf at %lld",
			     (long long)where[k]);
		h[where[k]] = nan;
		cr_assert_eq(unscale(h, g, n, 0.125f), 0, "missed NaN at %lld",
			     (long long)where[k]);
		cr_assert(isnan(g[where[k]]));
		h[where[k]] = keep;
	}
	cr_assert_eq(unscale(h, g, n, 0.125f), 1);
	free(g);
	free(h);
}

Test(unscale, f16_long_arrays)
{
	check_half_unscale(0);
}

Test(unscale, bf16_long_arrays)
{
	check_half_unscale(1);
}

Test(unscale, f32_long_array_any_position)
{
	const int64_t n = (1 << 18) + 5;
	float *g = malloc((size_t)n * sizeof(*g));

	cr_assert(g);
	for (int64_t i = 0; i < n; i++)
		g[i] = (float)(i % 1000);
	cr_assert_eq(loom_amp_unscale_check_f32(g, n, 0.5f), 1);
	for (int64_t i = 0; i < n; i++)
		cr_assert_eq(g[i], (float)(i % 1000) * 0.5f);
	g[n - 1] = NAN;
	cr_assert_eq(loom_amp_unscale_check_f32(g, n, 0.5f), 0);
	g[n - 1] = 1.0f;
	g[150001] = -INFINITY;
	cr_assert_eq(loom_amp_unscale_check_f32(g, n, 0.5f), 0);
	free(g);
}
