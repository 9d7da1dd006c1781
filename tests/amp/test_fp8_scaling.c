/*
 * tests/amp/test_fp8_scaling.c — amp/fp8_scaling.h on its own: the amax
 * history's ring and the scale from its max (TE's formula, margin
 * included), a non-finite amax kept out of the history, and the
 * checkpoint form's round trip and refusals (nothing changed on one).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "amp/fp8_scaling.h"

#define E4M3 448.0f

static void one_tensor(loom_fp8_state *s, int delayed, int len, int margin)
{
	cr_assert_eq(loom_fp8_state_init(s, 1, delayed, len, margin), 0);
	s->t[0].fmax = E4M3;
}

/* A step whose amax is a, cast with scale c. */
static void step(loom_fp8_state *s, float a)
{
	s->t[0].amax = a;
	s->t[0].cur_scale = s->t[0].scale;
	loom_fp8_step_end(s);
}

Test(fp8_scaling, history_ring_and_margin)
{
	loom_fp8_state s;
	one_tensor(&s, 1, 3, 0);
	cr_assert_eq(s.t[0].scale, 1.0f);
	step(&s, 1.0f); /* 448 / 1 -> 2^8 */
	cr_assert_eq(s.t[0].scale, 256.0f);
	cr_assert_eq(s.filled, 1);
	step(&s, 7.0f); /* 448 / 7 = 64 */
	cr_assert_eq(s.t[0].scale, 64.0f);
	step(&s, 2.0f);
	step(&s, 2.0f); /* 7 still among the last 3 */
	cr_assert_eq(s.t[0].scale, 64.0f);
	cr_assert_eq(s.filled, 3);
	step(&s, 2.0f); /* 7 left: 448 / 2 -> 2^7 */
	cr_assert_eq(s.t[0].scale, 128.0f);
	cr_assert_eq(s.t[0].last_amax, 2.0f);
	cr_assert_eq(s.t[0].amax, 0.0f, "the step in progress starts empty");
	loom_fp8_state_free(&s);

	one_tensor(&s, 1, 3, 2);
	step(&s, 1.0f);
	cr_assert_eq(s.t[0].scale, 64.0f, "2^8 / 2^2");
	loom_fp8_state_free(&s);
}

Test(fp8_scaling, nonfinite_amax_stays_out)
{
	loom_fp8_state s;
	one_tensor(&s, 1, 4, 0);
	step(&s, 1.0f);
	step(&s, INFINITY);
	cr_assert_eq(s.t[0].scale, 256.0f, "an overflowing step's inf says nothing of the range");
	cr_assert(isinf(s.t[0].last_amax));
	loom_fp8_state_free(&s);
}

Test(fp8_scaling, current_keeps_no_history)
{
	loom_fp8_state s;
	one_tensor(&s, 0, 16, 0);
	cr_assert_null(s.history);
	step(&s, 3.0f);
	cr_assert_eq(s.t[0].last_amax, 3.0f);
	cr_assert_eq(s.filled, 0);
	cr_assert_eq(loom_fp8_uses_history(&s), 0);
	loom_fp8_state_free(&s);
}

Test(fp8_scaling, pack_round_trip_and_refusals)
{
	loom_fp8_state a, b;
	one_tensor(&a, 1, 4, 0);
	one_tensor(&b, 1, 4, 0);
	step(&a, 1.0f);
	step(&a, 5.0f);
	a.t[0].saturated = 3;
	step(&a, 2.0f);
	size_t n = loom_fp8_state_floats(&a);
	cr_assert_eq(n, 2 + 4 + 4);
	float buf[10], bad[10];
	char err[256];
	loom_fp8_state_pack(&a, buf);
	cr_assert_eq(loom_fp8_state_unpack(&b, buf, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(b.filled, a.filled);
	cr_assert_eq(b.pos, a.pos);
	cr_assert_eq(b.t[0].scale, a.t[0].scale);
	cr_assert_eq(memcmp(b.history, a.history, 4 * sizeof(float)), 0);
	step(&a, 1.0f);
	step(&b, 1.0f);
	cr_assert_eq(b.t[0].scale, a.t[0].scale, "the restored state goes on alike");

	struct {
		int at;
		float v;
		const char *says;
	} cases[] = {
		{ 0, 5.0f, "history count" },  /* more than the history holds */
		{ 1, 4.0f, "position" },       /* past the ring */
		{ 2, 3.0f, "scale" },          /* not a power of two */
		{ 2, 0.0f, "scale" },
		{ 3, NAN, "amax" },
		{ 7, -1.0f, "history" },       /* a negative amax in the history */
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		loom_fp8_state_pack(&b, buf);
		memcpy(bad, buf, sizeof(bad));
		bad[cases[k].at] = cases[k].v;
		float before = b.t[0].scale;
		cr_assert_eq(loom_fp8_state_unpack(&b, bad, err, sizeof(err)), 1, "case %zu", k);
		cr_assert(strstr(err, cases[k].says), "case %zu: %s", k, err);
		cr_assert_eq(b.t[0].scale, before, "case %zu changed the state", k);
	}
	loom_fp8_state_free(&a);
	loom_fp8_state_free(&b);
}
