/*
 * tests/amp/test_scaler.c — the dynamic loss-scale state machine (apex /
 * GradScaler semantics).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>

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
