/*
 * tests/engine/test_fp8_report.c — amp.fp8's per-tensor scales as the plan
 * keeps them (amp/fp8_scaling.h) and loom_amp_report: on one fp8 linear
 * layer whose input is all ones (amax 1: E4M3 scale 2^8) and then holds
 * three 4s, delayed scaling casts the second step with the first step's
 * scale, so exactly the three 4s saturate (4 * 256 > 448), and the next
 * scale follows the history's max; current scaling saturates nothing.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "tests/engine/print_text.h"

#define N 4
#define K 8

typedef struct net {
	loom_graph *g;
	loom_value loss;
	loom_program *p;
} net;

static void build(net *m, int recipe, int history, int margin)
{
	cr_assert_eq(loom_graph_new(&m->g), LOOM_OK);
	int64_t xd[] = { N, K }, wd[] = { 2, K }, yd[] = { N };
	loom_value x = loom_input(m->g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(m->g, "y", LOOM_I32, 1, yd);
	loom_value w = loom_param(m->g, "w", LOOM_F32, 2, wd, LOOM_INIT_KAIMING_UNIFORM, K);
	m->loss = loom_softmax_cross_entropy(m->g, loom_linear(m->g, x, w, LOOM_NONE), y);
	cr_assert_eq(loom_graph_status(m->g), LOOM_OK, "%s", loom_graph_error(m->g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.lr = 0.01;
	o.amp.level = LOOM_O1;
	o.amp.half = LOOM_BF16;
	o.amp.fp8 = 1;
	o.amp.fp8_all_products = 1; /* the one product is first and last */
	o.amp.fp8_scaling = recipe;
	o.amp.fp8_history = history;
	o.amp.fp8_margin = margin;
	m->p = NULL;
	cr_assert_eq(loom_compile(m->g, m->loss, &o, &m->p), LOOM_OK, "%s", loom_last_error());
}

static void done(net *m)
{
	loom_program_free(m->p);
	loom_graph_free(m->g);
}

/* One step with x all ones, but `big` elements 4. */
static void step(net *m, int big)
{
	float x[N * K];
	int32_t y[N] = { 0, 1, 0, 1 };
	for (int i = 0; i < N * K; i++)
		x[i] = i < big ? 4.0f : 1.0f;
	cr_assert_eq(loom_set_input(m->p, "x", x, LOOM_F32, N * K), LOOM_OK);
	cr_assert_eq(loom_set_input(m->p, "y", y, LOOM_I32, N), LOOM_OK);
	cr_assert_eq(loom_run(m->p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(m->p));
}

/* The input x's rounding (the only tensor whose amax is a step's x's). */
static loom_fp8_tensor_info x_tensor(net *m)
{
	loom_fp8_tensor_info ti, found = { 0 };
	int n = 0;
	for (int i = 0; i < loom_fp8_tensor_count(m->p); i++) {
		cr_assert_eq(loom_fp8_tensor_get(m->p, i, &ti), LOOM_OK);
		if (ti.format == LOOM_FP8_E4M3 && strstr(ti.name, "x") == ti.name)
			found = ti, n++;
	}
	if (n != 1)
		loom_amp_report(m->p, stderr);
	cr_assert_eq(n, 1, "%d tensors named for x", n);
	return found;
}

Test(fp8_report, tensors_of_one_product)
{
	net m;
	build(&m, LOOM_FP8_SCALING_DELAYED, 0, 0);
	/* x and w in E4M3, the output gradient in E5M2 */
	cr_assert_eq(loom_fp8_tensor_count(m.p), 3);
	int e5m2 = 0, named = 0;
	loom_fp8_tensor_info ti;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(loom_fp8_tensor_get(m.p, i, &ti), LOOM_OK);
		e5m2 += ti.format == LOOM_FP8_E5M2;
		/* each by its tensor: the named leaves', the unnamed product
		 * output's gradient by its op and node ("linear#5.grad.e5m2") */
		if (ti.format == LOOM_FP8_E4M3)
			named += !strcmp(ti.name, "x.e4m3") || !strcmp(ti.name, "w.e4m3");
		else
			named += !strncmp(ti.name, "linear#", 7) &&
				 strlen(ti.name) > 17 &&
				 !strcmp(ti.name + strlen(ti.name) - 10, ".grad.e5m2");
	}
	cr_assert_eq(e5m2, 1);
	cr_assert_eq(named, 3, "the report's names (%d of 3 as expected)", named);
	cr_assert_eq(loom_fp8_tensor_get(m.p, 3, &ti), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_program_error(m.p), "fp8 tensor 3"), "%s", loom_program_error(m.p));
	done(&m);
}

Test(fp8_report, delayed_saturates_what_grew)
{
	net m;
	build(&m, LOOM_FP8_SCALING_DELAYED, 0, 0);
	step(&m, 0);
	loom_fp8_tensor_info ti = x_tensor(&m);
	/* the first step: no history, current scaling */
	cr_assert_eq(ti.amax, 1.0);
	cr_assert_eq(ti.scale, 256.0);
	cr_assert_eq(ti.next_scale, 256.0);
	cr_assert_eq(ti.saturated, 0);
	step(&m, 3);
	ti = x_tensor(&m);
	cr_assert_eq(ti.amax, 4.0);
	cr_assert_eq(ti.scale, 256.0, "cast with the history's scale, got %g", ti.scale);
	cr_assert_eq(ti.saturated, 3, "%lld saturated", (long long)ti.saturated);
	cr_assert_eq(ti.next_scale, 64.0, "448 / 4 -> 2^6, got %g", ti.next_scale);

	char *buf = print_text(loom_amp_report, m.p);
	cr_assert(strstr(buf, "fp8, delayed scaling"), "%s", buf);
	char want[160];
	snprintf(want, sizeof(want), "%-32s %5s %12g %12g %12s %10lld\n", ti.name, "e4m3", 256.0,
		 4.0, "64", 3LL);
	cr_assert(strstr(buf, want), "no line\n%s\nin\n%s", want, buf);
	free(buf);
	done(&m);
}

Test(fp8_report, current_saturates_nothing)
{
	net m;
	build(&m, LOOM_FP8_SCALING_CURRENT, 0, 0);
	step(&m, 0);
	step(&m, 3);
	loom_fp8_tensor_info ti = x_tensor(&m);
	cr_assert_eq(ti.amax, 4.0);
	cr_assert_eq(ti.scale, 64.0);
	cr_assert_eq(ti.saturated, 0);
	cr_assert_eq(ti.next_scale, 0, "current scaling keeps no next scale");
	done(&m);
}

/* A history of 2 steps forgets the 4s two steps later; a margin of 1
 * halves every scale. */
Test(fp8_report, history_window_and_margin)
{
	net m;
	build(&m, LOOM_FP8_SCALING_DELAYED, 2, 1);
	step(&m, 0);
	cr_assert_eq(x_tensor(&m).next_scale, 128.0);
	step(&m, 3);
	cr_assert_eq(x_tensor(&m).saturated, 3, "4 * 128 > 448");
	cr_assert_eq(x_tensor(&m).next_scale, 32.0);
	step(&m, 0);
	cr_assert_eq(x_tensor(&m).next_scale, 32.0, "the 4s are in the history still");
	step(&m, 0);
	cr_assert_eq(x_tensor(&m).next_scale, 128.0, "the 4s left the history");
	done(&m);
}

/* The scales are counted before step 1, in the memory report. */
Test(fp8_report, memory_report_counts_scales)
{
	net m;
	build(&m, LOOM_FP8_SCALING_DELAYED, 0, 0);
	char *buf = print_text(loom_program_memory_report, m.p);
	cr_assert(strstr(buf, "fp8 scales"), "%s", buf);
	cr_assert(strstr(buf, "(3 tensors, delayed scaling: amax history of 16 steps)"), "%s", buf);
	free(buf);
	done(&m);
}

/* The default recipe is delayed scaling (amp/amp_pass.c, measured in
 * bench/RESULTS.md). */
Test(fp8_report, default_is_delayed)
{
	net m;
	build(&m, LOOM_FP8_SCALING_DEFAULT, 0, 0);
	step(&m, 0);
	step(&m, 3);
	cr_assert_eq(x_tensor(&m).saturated, 3, "the second step cast with the first's scale");
	cr_assert_eq(x_tensor(&m).next_scale, 64.0);
	done(&m);
}

/* The recipe's settings where they mean nothing are refused by name. */
Test(fp8_report, settings_refused)
{
	net m;
	cr_assert_eq(loom_graph_new(&m.g), LOOM_OK);
	int64_t xd[] = { N, K }, wd[] = { 2, K }, yd[] = { N };
	loom_value x = loom_input(m.g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(m.g, "y", LOOM_I32, 1, yd);
	loom_value w = loom_param(m.g, "w", LOOM_F32, 2, wd, LOOM_INIT_KAIMING_UNIFORM, K);
	m.loss = loom_softmax_cross_entropy(m.g, loom_linear(m.g, x, w, LOOM_NONE), y);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = LOOM_O1;
	o.amp.half = LOOM_BF16;
	o.amp.fp8 = 1;
	o.amp.fp8_scaling = LOOM_FP8_SCALING_CURRENT;
	o.amp.fp8_history = 4;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_last_error(), "fp8_history"), "%s", loom_last_error());
	loom_program_free(p);
	o.amp.fp8_scaling = LOOM_FP8_SCALING_DELAYED;
	o.amp.fp8_history = 1025;
	p = NULL;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_INVALID);
	loom_program_free(p);
	o.amp.fp8 = 0;
	o.amp.fp8_history = 0;
	p = NULL;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_last_error(), "without fp8"), "%s", loom_last_error());
	loom_program_free(p);
	loom_graph_free(m.g);
}
