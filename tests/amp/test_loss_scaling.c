/*
 * tests/amp/test_loss_scaling.c — why loss scaling exists and what it does
 * to a step: a gradient that underflows in fp16 is lost without a scale and
 * kept with one; an overflowing step is skipped without touching anything,
 * the scale backs off and grows back; and when the scale collapses below 1
 * the program names the op that first produced inf/NaN.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "engine/program_internal.h"
#include "loom.h"

static loom_compile_opts opts(loom_opt_level level)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = level;
	o.amp.half = LOOM_F16;
	return o;
}

static loom_program *compile(loom_graph *g, loom_value loss, const loom_compile_opts *o)
{
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

/* The compiled node that is op and called name. */
static loom_value compiled(const loom_program *p, loom_op op, const char *name)
{
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (p->plan.g->nodes[v].op == op && strcmp(p->plan.g->nodes[v].name, name) == 0)
			return v;
	cr_assert_fail("no %s in the compiled graph", name);
	return LOOM_NONE;
}

/* ------------------------------------------------------------ underflow */

enum { UN = 4, UIN = 8, UHID = 8, UOUT = 4 };

/*
 * loss = mean(fc2(fc1(x))), no biases, x ~ 1e-4, fc2.weight ~ 1e-4 and
 * fc1.weight = 0. Then d loss / d fc1.weight = sum_n (W2^T dy)_j x_ni with
 * dy = 1/16: about 1.5e-8, under half of fp16's smallest subnormal
 * (2.98e-8), so it rounds to 0 in fp16 unless the loss is scaled.
 */
typedef struct under {
	loom_program *p;
	loom_value w1, w2;
} under;

static under build_under(loom_opt_level level)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { UN, UIN };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value h = loom_layer_linear(g, "fc1", x, UHID, 0);
	loom_value y = loom_layer_linear(g, "fc2", h, UOUT, 0);
	loom_value loss = loom_mean(g, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o = opts(level);
	o.optim.lr = 1.0;
	under u = { compile(g, loss, &o), 1, 3 };
	loom_graph_free(g);

	double w1[UHID * UIN] = { 0 }, w2[UOUT * UHID];
	for (int i = 0; i < UOUT * UHID; i++)
		w2[i] = 1e-4 * (1 + (i % 3) / 4.0);
	cr_assert_eq(loom_write_f64(u.p, u.w1, w1, UHID * UIN), LOOM_OK);
	cr_assert_eq(loom_write_f64(u.p, u.w2, w2, UOUT * UHID), LOOM_OK);
	float xv[UN * UIN];
	for (int i = 0; i < UN * UIN; i++)
		xv[i] = 0.8e-4f * (1 + (i % 5) / 5.0f);
	cr_assert_eq(loom_set_input(u.p, "x", xv, LOOM_F32, UN * UIN), LOOM_OK);
	return u;
}

/* fc1's fp32 master weights (O2). */
static void read_master(loom_program *p, const char *name, double *dst, int n)
{
	loom_value m = compiled(p, LOOM_OP_BUFFER, name);
	cr_assert_eq(p->plan.g->nodes[m].dtype, LOOM_F32);
	const float *f = loom_value_ptr(p, m);
	for (int i = 0; i < n; i++)
		dst[i] = f[i];
}

Test(loss_scaling, fp16_underflow_lost_without_scaling_kept_with_it)
{
	enum { NW = UHID * UIN };
	double g0[NW], g2[NW], g3[NW], w0[NW], w3[NW], m2[NW], h2[NW];

	/* fp32: the true gradient, tiny but there. */
	under o0 = build_under(LOOM_O0);
	cr_assert_eq(loom_run(o0.p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(o0.p));
	cr_assert_eq(loom_read_grad_f64(o0.p, o0.w1, g0, NW), LOOM_OK);
	cr_assert_eq(loom_read_f64(o0.p, o0.w1, w0, NW), LOOM_OK);
	for (int i = 0; i < NW; i++) {
		cr_assert(g0[i] > 5e-9 && g0[i] < 2.9e-8, "fp32 grad[%d] = %g is not in fp16's "
			  "underflow range", i, g0[i]);
		cr_assert_float_eq(w0[i], -g0[i], 1e-6 * g0[i]);
	}

	/* O3: fp16 without scaling: the gradient rounds to 0, nothing moves. */
	under o3 = build_under(LOOM_O3);
	cr_assert_eq(loom_run(o3.p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(o3.p));
	loom_program_info info;
	loom_program_info_get(o3.p, &info);
	cr_assert_eq(info.loss_scale, 1.0);
	cr_assert_eq(loom_read_grad_f64(o3.p, o3.w1, g3, NW), LOOM_OK);
	cr_assert_eq(loom_read_f64(o3.p, o3.w1, w3, NW), LOOM_OK);
	for (int i = 0; i < NW; i++) {
		cr_assert_eq(g3[i], 0.0, "O3 grad[%d] = %g survived fp16", i, g3[i]);
		cr_assert_eq(w3[i], 0.0);
	}
	cr_assert_eq(loom_step_count(o3.p), 1);

	/* O2: scaled by 2^16 the fp16 gradient is representable; unscaled
	 * into the fp32 master it gives the fp32 update. */
	under o2 = build_under(LOOM_O2);
	loom_program_info_get(o2.p, &info);
	cr_assert_eq(info.loss_scale, 65536.0);
	cr_assert_eq(loom_run(o2.p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(o2.p));
	cr_assert_eq(loom_step_count(o2.p), 1, "the step was skipped");
	cr_assert_eq(loom_read_grad_f64(o2.p, o2.w1, g2, NW), LOOM_OK);
	read_master(o2.p, "fc1.weight.master", m2, NW);
	cr_assert_eq(loom_read_f64(o2.p, o2.w1, h2, NW), LOOM_OK);
	for (int i = 0; i < NW; i++) {
		/* The half gradient holds the scaled value. */
		cr_assert_float_eq(g2[i], g0[i] * 65536.0, 1e-2 * g0[i] * 65536.0,
				   "O2 scaled grad[%d] %g, fp32 %g x 2^16", i, g2[i], g0[i]);
		cr_assert_neq(m2[i], 0.0, "O2 master[%d] did not move", i);
		cr_assert_float_eq(m2[i], w0[i], 1e-2 * fabs(w0[i]),
				   "O2 master[%d] %.6g, fp32 update %.6g", i, m2[i], w0[i]);
		/* The half copy of a 1e-8 weight is 0 itself: the update lives
		 * in the master, which is why O2 keeps one. */
		cr_assert_eq(h2[i], (double)loom_f16_to_f32(loom_f32_to_f16((float)m2[i])));
	}
	loom_program_free(o0.p);
	loom_program_free(o2.p);
	loom_program_free(o3.p);
}

/* ------------------------------------------------------------ overflow */

enum { ON = 4, OIN = 4, OOUT = 3 };

static loom_program *build_over(int growth_interval, loom_optim_kind kind)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { ON, OIN }, yd[1] = { ON };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, OOUT, 1), y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o = opts(LOOM_O2);
	o.amp.growth_interval = growth_interval;
	o.optim.kind = kind;
	o.optim.lr = 0.05;
	o.optim.momentum = 0.9;
	loom_program *p = compile(g, loss, &o);
	loom_graph_free(g);
	return p;
}

/* A clean batch (|x| <= 0.25: the scaled gradients fit in fp16), or one
 * with x = big that makes the scaled weight gradient overflow. */
static void feed_over(loom_program *p, int k, float big)
{
	float x[ON * OIN];
	int32_t y[ON] = { 0, 1, 2, 0 };
	for (int i = 0; i < ON * OIN; i++)
		x[i] = big != 0 ? big : 0.25f * (float)sin(1.3 * i + k);
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, ON * OIN), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, ON), LOOM_OK);
}

/* Everything an optimizer step may change: parameters, masters, state. */
typedef struct snap {
	unsigned char *bytes;
	size_t n;
	int64_t step;
} snap;

static snap take(const loom_program *p)
{
	snap s = { malloc(1 << 16), 0, p->ts.step };
	for (int v = 0; v < p->plan.n_fwd; v++) {
		loom_op op = p->plan.g->nodes[v].op;
		if (op != LOOM_OP_PARAM && op != LOOM_OP_BUFFER)
			continue;
		cr_assert_leq(s.n + loom_value_bytes(p, v), (size_t)1 << 16);
		memcpy(s.bytes + s.n, loom_value_ptr(p, v), loom_value_bytes(p, v));
		s.n += loom_value_bytes(p, v);
	}
	cr_assert_leq(s.n + p->plan.state_bytes, (size_t)1 << 16);
	memcpy(s.bytes + s.n, p->arena.state, p->plan.state_bytes);
	s.n += p->plan.state_bytes;
	return s;
}

static void assert_all_finite(const loom_program *p)
{
	for (int v = 0; v < p->plan.n_fwd; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (n->op != LOOM_OP_PARAM && n->op != LOOM_OP_BUFFER)
			continue;
		int64_t cnt = loom_shape_numel(&n->shape);
		for (int64_t i = 0; i < cnt; i++) {
			float f = n->dtype == LOOM_F16 ? loom_f16_to_f32(((uint16_t *)loom_value_ptr(p, v))[i])
						       : ((float *)loom_value_ptr(p, v))[i];
			cr_assert(isfinite(f), "%s[%lld] = %g", n->name, (long long)i, f);
		}
	}
	/* Plain SGD keeps no state: state_off is meaningless there and
	 * reading it would run past the arena. */
	int n_states = p->plan.n_state;
	for (int s = 0; s < p->plan.n_params; s++) {
		const loom_param_slot *sl = &p->plan.params[s];
		cr_assert_eq(sl->state_dtype, LOOM_F32);
		for (int k = 0; k < n_states; k++) {
			const float *st = (const float *)(p->arena.state + sl->state_off[k]);
			cr_assert_leq(sl->state_off[k] + (size_t)sl->numel * sizeof(float),
				      p->plan.state_bytes);
			for (int64_t i = 0; i < sl->numel; i++)
				cr_assert(isfinite(st[i]), "optimizer state %d of slot %d [%lld] = %g",
					  k, s, (long long)i, st[i]);
		}
	}
}

static double scale_of(const loom_program *p)
{
	loom_program_info i;
	loom_program_info_get(p, &i);
	return i.loss_scale;
}

static int64_t skipped_of(const loom_program *p)
{
	loom_program_info i;
	loom_program_info_get(p, &i);
	return i.skipped_steps;
}

static void overflow_skips_step(loom_optim_kind kind, float big)
{
	loom_program *p = build_over(3, kind);
	cr_assert_gt(p->plan.state_bytes, 0);
	feed_over(p, 0, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_step_count(p), 1, "the clean first step was skipped");
	cr_assert_eq(scale_of(p), 65536.0);

	/* The overflowing step: nothing moves, the scale halves. */
	snap before = take(p);
	feed_over(p, 1, big);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	snap after = take(p);
	cr_assert_eq(before.n, after.n);
	for (size_t i = 0; i < before.n; i++)
		cr_assert_eq(before.bytes[i], after.bytes[i],
			     "byte %zu of the weights/masters/optimizer state changed on a skipped step", i);
	cr_assert_eq(loom_step_count(p), 1);
	cr_assert_eq(skipped_of(p), 1);
	cr_assert_eq(scale_of(p), 32768.0);
	assert_all_finite(p);

	/* Clean steps go on; the third in a row doubles the scale. */
	for (int k = 2; k < 5; k++) {
		snap pre = take(p);
		feed_over(p, k, 0);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		snap post = take(p);
		cr_assert_neq(memcmp(pre.bytes, post.bytes, pre.n), 0, "clean step %d changed nothing", k);
		cr_assert_eq(loom_step_count(p), k);
		cr_assert_eq(scale_of(p), k < 4 ? 32768.0 : 65536.0, "after clean step %d: scale %g",
			     k, scale_of(p));
		free(pre.bytes);
		free(post.bytes);
	}
	cr_assert_eq(skipped_of(p), 1);
	assert_all_finite(p);
	free(before.bytes);
	free(after.bytes);
	loom_program_free(p);
}

Test(loss_scaling, overflow_skips_step_sgd_momentum)
{
	overflow_skips_step(LOOM_OPTIM_SGD, 1000.0f);
}

Test(loss_scaling, overflow_skips_step_adamw)
{
	overflow_skips_step(LOOM_OPTIM_ADAMW, 1000.0f);
}

/* A NaN in the batch poisons every gradient: skipped the same way. */
Test(loss_scaling, nan_input_skips_step)
{
	overflow_skips_step(LOOM_OPTIM_ADAMW, NAN);
}

/* Repeated overflow halves the scale each time, never applies an update,
 * and then recovers. */
Test(loss_scaling, repeated_overflow_backs_off_each_time)
{
	loom_program *p = build_over(3, LOOM_OPTIM_SGD);
	snap before = take(p);
	for (int k = 0; k < 5; k++) {
		feed_over(p, k, 30000.0f);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
		cr_assert_eq(scale_of(p), 65536.0 / (2 << k), "after overflow %d", k + 1);
	}
	snap after = take(p);
	cr_assert_eq(memcmp(before.bytes, after.bytes, before.n), 0);
	cr_assert_eq(loom_step_count(p), 0);
	cr_assert_eq(skipped_of(p), 5);
	feed_over(p, 9, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_step_count(p), 1);
	assert_all_finite(p);
	/* Nothing collapsed: no report. */
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_not_null(i.amp_report);
	cr_assert_str_eq(i.amp_report, "");
	free(before.bytes);
	free(after.bytes);
	loom_program_free(p);
}

/*
 * A step on which the scale grows (growth interval 1) updates exactly as one
 * on which it does not (interval 2000): the unscale divides by the scale the
 * gradients were multiplied by, not by the grown one (which would halve every
 * growth step's update).
 */
Test(loss_scaling, growth_step_update_equals_unscaled_gradient)
{
	loom_program *grows = build_over(1, LOOM_OPTIM_SGD);
	loom_program *stays = build_over(2000, LOOM_OPTIM_SGD);
	feed_over(grows, 0, 0);
	feed_over(stays, 0, 0);
	snap before = take(stays);
	cr_assert_eq(loom_run(grows, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_run(stays, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(scale_of(grows), 2 * 65536.0, "the scale grew on this step");
	cr_assert_eq(scale_of(stays), 65536.0);
	snap g = take(grows), s = take(stays);
	cr_assert_eq(g.n, s.n);
	cr_assert(memcmp(before.bytes, s.bytes, s.n) != 0, "the step changed the parameters");
	cr_assert(memcmp(g.bytes, s.bytes, s.n) == 0,
		  "the growth step's parameters and state differ from the plain step's");
	free(before.bytes);
	free(g.bytes);
	free(s.bytes);
	loom_program_free(grows);
	loom_program_free(stays);
}

/* Growth stops at apex's cap, 2^24. */
Test(loss_scaling, growth_capped)
{
	loom_program *p = build_over(1, LOOM_OPTIM_SGD);
	for (int k = 0; k < 12; k++) {
		feed_over(p, k, 0);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
		/* Scaled gradients may overflow as the scale climbs; a skip
		 * halves it, so it never passes the cap either way. */
		cr_assert_leq(scale_of(p), 16777216.0);
	}
	cr_assert_gt(scale_of(p), 65536.0, "the scale never grew: %g", scale_of(p));
	assert_all_finite(p);
	loom_program_free(p);
}

/* ------------------------------------------------------------ collapse */

/*
 * fc1's weights written to 30000: fc1's fp16 output overflows in the forward
 * pass, every step. With init scale 2 the scale goes 2 -> 1 -> 0.5: below 1
 * it has collapsed, and the next step names fc1.
 */
Test(loss_scaling, collapse_names_first_nonfinite_op)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 4 }, yd[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc1", x, 4, 1));
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc2", h, 3, 1), y);
	loom_compile_opts o = opts(LOOM_O2);
	o.amp.init_scale = 2;
	loom_program *p = compile(g, loss, &o);
	loom_graph_free(g);

	double w[16];
	for (int i = 0; i < 16; i++)
		w[i] = 30000.0;
	cr_assert_eq(loom_write_f64(p, 2, w, 16), LOOM_OK, "%s", loom_program_error(p));
	float xv[8] = { 10, 10, 10, 10, 10, 10, 10, 10 };
	int32_t yv[2] = { 0, 1 };
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 8), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 2), LOOM_OK);
	snap before = take(p);

	double scales[3] = { 1.0, 0.5, 0.25 };
	loom_program_info info;
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		loom_program_info_get(p, &info);
		cr_assert_eq(info.loss_scale, scales[k], "step %d: scale %g", k + 1, info.loss_scale);
		cr_assert_not_null(info.amp_report);
		if (k < 2)
			cr_assert_str_eq(info.amp_report, "", "reported before the collapse: %s",
					 info.amp_report);
	}
	char want[128];
	loom_value fc1 = compiled(p, LOOM_OP_LINEAR, "fc1");
	snprintf(want, sizeof(want), "linear 'fc1' (node %d)", (int)fc1);
	cr_assert_str_eq(info.amp_report, want);
	cr_assert_eq(info.skipped_steps, 3);
	cr_assert_eq(loom_step_count(p), 0);
	/* The report stays; the per-node checks stop. */
	cr_assert_eq(p->ts.diagnose, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	loom_program_info_get(p, &info);
	cr_assert_str_eq(info.amp_report, want);
	/* Nothing was applied: the huge weights are exactly as written, the
	 * masters too, and no inf reached them. */
	snap after = take(p);
	cr_assert_eq(memcmp(before.bytes, after.bytes, before.n), 0);
	assert_all_finite(p);
	free(before.bytes);
	free(after.bytes);
	loom_program_free(p);
}

/* The op named is where the trouble starts, not where it ends: fc2
 * overflowing (fc1 sane) names fc2. */
Test(loss_scaling, collapse_names_later_op)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 4 }, yd[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_linear(g, "fc1", x, 4, 0);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc2", h, 3, 0), y);
	loom_compile_opts o = opts(LOOM_O2);
	o.amp.init_scale = 1;
	loom_program *p = compile(g, loss, &o);
	loom_graph_free(g);
	/* fc1 = identity, fc2 = 30000: fc1's output 10 is fine, fc2's is not. */
	double w1[16] = { 0 }, w2[12];
	for (int i = 0; i < 4; i++)
		w1[i * 4 + i] = 1;
	for (int i = 0; i < 12; i++)
		w2[i] = 30000.0;
	cr_assert_eq(loom_write_f64(p, 2, w1, 16), LOOM_OK);
	cr_assert_eq(loom_write_f64(p, 4, w2, 12), LOOM_OK);
	float xv[8] = { 10, 10, 10, 10, 10, 10, 10, 10 };
	int32_t yv[2] = { 0, 1 };
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 8), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 2), LOOM_OK);
	for (int k = 0; k < 2; k++)
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	loom_program_info info;
	loom_program_info_get(p, &info);
	char want[128];
	snprintf(want, sizeof(want), "linear 'fc2' (node %d)", (int)compiled(p, LOOM_OP_LINEAR, "fc2"));
	cr_assert_str_eq(info.amp_report, want);
	loom_program_free(p);
}
