/*
 * tests/engine/test_program.c — the program API around a step: compile
 * errors, set_input / read / write errors with their messages, batch norm in
 * training and eval mode against a hand computation of PyTorch's rule,
 * loom_program_info's sizes, and device selection on a machine without CUDA.
 */
#include <stdio.h>

#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "engine/program_internal.h"
#include "loom.h"

static loom_compile_opts cpu_opts(void)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	return o;
}

/* x [5, 4] -> linear "fc" 4->3 -> CE with labels y. Values: x 0, y 1,
 * fc.weight 2, fc.bias 3, logits 4, loss 5. */
static loom_graph *linear_graph(loom_dtype dt, loom_value *loss)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	loom_value x = loom_input(g, "x", dt, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	*loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, 3, 1), y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	return g;
}

static loom_program *compile_linear(const loom_compile_opts *o)
{
	loom_value loss;
	loom_graph *g = linear_graph(LOOM_F32, &loss);
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

static int has(const char *msg, const char *part)
{
	return strstr(msg, part) != NULL;
}

Test(program, set_input_errors_name_the_input)
{
	loom_compile_opts o = cpu_opts();
	loom_program *p = compile_linear(&o);
	float x[20] = { 0 };
	int32_t y[5] = { 0, 1, 2, 0, 1 };

	cr_assert_eq(loom_set_input(p, "nope", x, LOOM_F32, 20), LOOM_ERR_NOT_FOUND);
	cr_assert(has(loom_program_error(p), "'nope'"), "%s", loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F64, 20), LOOM_ERR_DTYPE);
	cr_assert(has(loom_program_error(p), "'x'") && has(loom_program_error(p), "f64"), "%s",
		  loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 19), LOOM_ERR_SHAPE);
	cr_assert(has(loom_program_error(p), "19") && has(loom_program_error(p), "[5, 4]"), "%s",
		  loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "x", NULL, LOOM_F32, 20), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_input(p, NULL, x, LOOM_F32, 20), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_input(NULL, "x", x, LOOM_F32, 20), LOOM_ERR_INVALID);
	/* A parameter is not an input. */
	cr_assert_eq(loom_set_input(p, "fc.weight", x, LOOM_F32, 12), LOOM_ERR_NOT_FOUND);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 5), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 20), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* A successful run clears the last message. */
	cr_assert_str_eq(loom_program_error(p), "");
	loom_program_free(p);
}

Test(program, read_and_write_errors)
{
	loom_compile_opts o = cpu_opts();
	loom_program *p = compile_linear(&o);
	float f[12];
	double d[12];

	cr_assert_eq(loom_read(p, 2, f, 12), LOOM_OK);
	cr_assert_eq(loom_read(p, 2, f, 11), LOOM_ERR_SHAPE);
	cr_assert(has(loom_program_error(p), "11"), "%s", loom_program_error(p));
	cr_assert_eq(loom_read(p, 9999, f, 12), LOOM_ERR_INVALID);
	cr_assert_eq(loom_read(p, -3, f, 12), LOOM_ERR_INVALID);
	cr_assert_eq(loom_read(p, 2, NULL, 12), LOOM_ERR_INVALID);
	/* The logits are an activation, not kept unless marked. */
	cr_assert_eq(loom_read_f64(p, 4, d, 15), LOOM_ERR_STATE);
	cr_assert(has(loom_program_error(p), "loom_mark_output"), "%s", loom_program_error(p));
	/* Gradients exist only for parameters. */
	cr_assert_eq(loom_read_grad_f64(p, 0, d, 20), LOOM_ERR_INVALID);
	cr_assert_eq(loom_read_grad_f64(p, 2, d, 12), LOOM_OK);
	/* Only parameters and buffers can be written. */
	cr_assert_eq(loom_write_f64(p, 0, d, 12), LOOM_ERR_INVALID);
	cr_assert_eq(loom_write_f64(p, 2, d, 11), LOOM_ERR_SHAPE);
	for (int i = 0; i < 12; i++)
		d[i] = i * 0.25 - 1;
	cr_assert_eq(loom_write_f64(p, 2, d, 12), LOOM_OK);
	cr_assert_eq(loom_read(p, 2, f, 12), LOOM_OK);
	for (int i = 0; i < 12; i++)
		cr_assert_eq(f[i], (float)d[i]);
	cr_assert_eq(loom_run(p, (loom_run_mode)99), LOOM_ERR_INVALID);
	loom_program_free(p);
}

Test(program, marked_output_is_readable)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 3 }, yd[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F64, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_linear(g, "fc", x, 2, 0);
	cr_assert_eq(loom_mark_output(g, h), LOOM_OK);
	loom_value loss = loom_softmax_cross_entropy(g, h, y);
	loom_compile_opts o = cpu_opts();
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	double w[6] = { 1, 2, 3, -1, 0, 0.5 }, xv[6] = { 1, 1, 1, 2, 0, -2 }, out[4];
	int32_t yv[2] = { 0, 1 };
	cr_assert_eq(loom_write_f64(p, 2, w, 6), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F64, 6), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 2), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_FORWARD), LOOM_OK);
	cr_assert_eq(loom_read_f64(p, h, out, 4), LOOM_OK);
	double want[4] = { 6, -0.5, -4, -3 };
	for (int i = 0; i < 4; i++)
		cr_assert_float_eq(out[i], want[i], 1e-15, "h[%d] = %g", i, out[i]);
	/* CE of row 0 (logits 6, -0.5, label 0) and row 1 (-4, -3, label 1). */
	double l = (log(1 + exp(-6.5)) + log(1 + exp(-1.0))) / 2;
	cr_assert_float_eq(loom_loss(p), l, 1e-14, "loss %.17g want %.17g", loom_loss(p), l);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(program, label_out_of_range_fails_the_step)
{
	loom_compile_opts o = cpu_opts();
	loom_program *p = compile_linear(&o);
	float x[20] = { 0 };
	int32_t y[5] = { 0, 1, 3, 0, 1 };
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 20), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 5), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_ERR_INVALID);
	cr_assert(has(loom_program_error(p), "label 3") && has(loom_program_error(p), "[0, 3)"), "%s",
		  loom_program_error(p));
	cr_assert_eq(loom_step_count(p), 0);
	loom_program_free(p);
}

Test(program, compile_errors)
{
	loom_value loss;
	loom_graph *g = linear_graph(LOOM_F32, &loss);
	loom_compile_opts o = cpu_opts();
	loom_program *p = (loom_program *)1;

	cr_assert_eq(loom_compile(g, loss, &o, NULL), LOOM_ERR_INVALID);
	cr_assert_eq(loom_compile(NULL, loss, &o, &p), LOOM_ERR_INVALID);
	cr_assert_null(p);
	/* The logits are not a scalar. */
	cr_assert_eq(loom_compile(g, 4, &o, &p), LOOM_ERR_SHAPE);
	cr_assert(has(loom_last_error(), "not a scalar"), "%s", loom_last_error());
	cr_assert_eq(loom_compile(g, 999, &o, &p), LOOM_ERR_INVALID);
	o.device = (loom_device)17;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_ERR_INVALID);
	cr_assert(has(loom_last_error(), "device"), "%s", loom_last_error());

	/* A graph in error is refused with its first message. */
	int64_t bad[2] = { 7, 7 };
	loom_value z = loom_input(g, "z", LOOM_F32, 2, bad);
	cr_assert_eq(loom_add(g, z, 2), LOOM_NONE);
	o = cpu_opts();
	cr_assert_neq(loom_compile(g, loss, &o, &p), LOOM_OK);
	cr_assert_null(p);
	cr_assert_str_eq(loom_last_error(), loom_graph_error(g));
	/* A NULL opts means the defaults. */
	loom_graph_free(g);
	g = linear_graph(LOOM_F32, &loss);
	cr_assert_eq(loom_compile(g, loss, NULL, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_get_lr(p), 0.01);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ---------------------------------------------------------- batch norm */

enum { BN_N = 3, BN_C = 2, BN_H = 2, BN_W = 3, BN_HW = BN_H * BN_W,
       BN_TOTAL = BN_N * BN_C * BN_HW };

typedef struct bn_prog {
	loom_program *p;
	loom_value x, gamma, beta, rm, rv, y;
} bn_prog;

/* x -> batchnorm "bn" -> y (kept), loss = mean(y). */
static bn_prog bn_build(void)
{
	bn_prog b;
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[4] = { BN_N, BN_C, BN_H, BN_W };
	b.x = loom_input(g, "x", LOOM_F64, 4, xd);
	b.y = loom_layer_batchnorm2d(g, "bn", b.x);
	b.gamma = 1;
	b.beta = 2;
	b.rm = 3;
	b.rv = 4;
	cr_assert_eq(loom_mark_output(g, b.y), LOOM_OK);
	loom_value loss = loom_mean(g, b.y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o = cpu_opts();
	o.optim.kind = LOOM_OPTIM_NONE;
	cr_assert_eq(loom_compile(g, loss, &o, &b.p), LOOM_OK, "%s", loom_last_error());
	cr_assert_str_eq(b.p->plan.g->nodes[b.rm].name, "bn.running_mean");
	cr_assert_str_eq(b.p->plan.g->nodes[b.rv].name, "bn.running_var");
	loom_graph_free(g);
	return b;
}

static void bn_batch(int k, double *x)
{
	for (int i = 0; i < BN_TOTAL; i++)
		x[i] = sin(0.7 * i + k) * (1 + k) + 0.5 * ((i / BN_HW) % BN_C) + k;
}

/* Batch mean and biased / unbiased variance of channel c. */
static void stats(const double *x, int c, double *mean, double *var_b, double *var_u)
{
	double s = 0, q = 0, m = BN_N * BN_HW;
	for (int n = 0; n < BN_N; n++)
		for (int j = 0; j < BN_HW; j++)
			s += x[(n * BN_C + c) * BN_HW + j];
	*mean = s / m;
	for (int n = 0; n < BN_N; n++)
		for (int j = 0; j < BN_HW; j++) {
			double d = x[(n * BN_C + c) * BN_HW + j] - *mean;
			q += d * d;
		}
	*var_b = q / m;
	*var_u = q / (m - 1);
}

Test(program, batchnorm_running_stats_follow_pytorch)
{
	bn_prog b = bn_build();
	double gamma[BN_C] = { 1.5, -0.5 }, beta[BN_C] = { 0.25, 2 };
	cr_assert_eq(loom_write_f64(b.p, b.gamma, gamma, BN_C), LOOM_OK);
	cr_assert_eq(loom_write_f64(b.p, b.beta, beta, BN_C), LOOM_OK);
	double rm[BN_C] = { 0, 0 }, rv[BN_C] = { 1, 1 }, got[BN_C];
	double x[BN_TOTAL], y[BN_TOTAL];
	for (int k = 0; k < 3; k++) {
		bn_batch(k, x);
		cr_assert_eq(loom_set_input(b.p, "x", x, LOOM_F64, BN_TOTAL), LOOM_OK);
		/* A GRAD run for k = 1: backward must not update the statistics twice. */
		cr_assert_eq(loom_run(b.p, k == 1 ? LOOM_RUN_GRAD : LOOM_RUN_FORWARD), LOOM_OK,
			     "%s", loom_program_error(b.p));
		cr_assert_eq(loom_read_f64(b.p, b.y, y, BN_TOTAL), LOOM_OK);
		for (int c = 0; c < BN_C; c++) {
			double m, vb, vu;
			stats(x, c, &m, &vb, &vu);
			/* torch: running = (1 - momentum) running + momentum stat,
			 * momentum 0.1, the variance unbiased (divided by m - 1). */
			rm[c] = 0.9 * rm[c] + 0.1 * m;
			rv[c] = 0.9 * rv[c] + 0.1 * vu;
			for (int n = 0; n < BN_N; n++)
				for (int j = 0; j < BN_HW; j++) {
					int i = (n * BN_C + c) * BN_HW + j;
					double want = (x[i] - m) / sqrt(vb + 1e-5) * gamma[c] + beta[c];
					cr_assert_float_eq(y[i], want, 1e-12, "train y[%d] %g want %g", i,
							   y[i], want);
				}
		}
		cr_assert_eq(loom_read_f64(b.p, b.rm, got, BN_C), LOOM_OK);
		for (int c = 0; c < BN_C; c++)
			cr_assert_float_eq(got[c], rm[c], 1e-13, "step %d running_mean[%d] %.17g want %.17g",
					   k, c, got[c], rm[c]);
		cr_assert_eq(loom_read_f64(b.p, b.rv, got, BN_C), LOOM_OK);
		for (int c = 0; c < BN_C; c++)
			cr_assert_float_eq(got[c], rv[c], 1e-13, "step %d running_var[%d] %.17g want %.17g",
					   k, c, got[c], rv[c]);
	}
	loom_program_free(b.p);
}

Test(program, batchnorm_eval_uses_running_stats)
{
	bn_prog b = bn_build();
	double x[BN_TOTAL], ytrain[BN_TOTAL], yeval[BN_TOTAL], rm[BN_C], rv[BN_C], rm2[BN_C],
		rv2[BN_C];
	for (int k = 0; k < 3; k++) {
		bn_batch(k, x);
		cr_assert_eq(loom_set_input(b.p, "x", x, LOOM_F64, BN_TOTAL), LOOM_OK);
		cr_assert_eq(loom_run(b.p, LOOM_RUN_FORWARD), LOOM_OK);
	}
	cr_assert_eq(loom_read_f64(b.p, b.rm, rm, BN_C), LOOM_OK);
	cr_assert_eq(loom_read_f64(b.p, b.rv, rv, BN_C), LOOM_OK);

	bn_batch(7, x);
	cr_assert_eq(loom_set_input(b.p, "x", x, LOOM_F64, BN_TOTAL), LOOM_OK);
	cr_assert_eq(loom_run(b.p, LOOM_RUN_EVAL), LOOM_OK);
	cr_assert_eq(loom_read_f64(b.p, b.y, yeval, BN_TOTAL), LOOM_OK);
	/* Eval leaves the statistics alone. */
	cr_assert_eq(loom_read_f64(b.p, b.rm, rm2, BN_C), LOOM_OK);
	cr_assert_eq(loom_read_f64(b.p, b.rv, rv2, BN_C), LOOM_OK);
	cr_assert_arr_eq(rm, rm2, sizeof(rm));
	cr_assert_arr_eq(rv, rv2, sizeof(rv));
	for (int i = 0; i < BN_TOTAL; i++) {
		int c = (i / BN_HW) % BN_C;
		double want = (x[i] - rm[c]) / sqrt(rv[c] + 1e-5); /* gamma 1, beta 0 */
		cr_assert_float_eq(yeval[i], want, 1e-12, "eval y[%d] %g want %g", i, yeval[i], want);
	}
	cr_assert_eq(loom_run(b.p, LOOM_RUN_FORWARD), LOOM_OK);
	cr_assert_eq(loom_read_f64(b.p, b.y, ytrain, BN_TOTAL), LOOM_OK);
	double maxdiff = 0;
	for (int i = 0; i < BN_TOTAL; i++)
		maxdiff = fmax(maxdiff, fabs(ytrain[i] - yeval[i]));
	cr_assert_gt(maxdiff, 0.1, "train and eval outputs agree (max diff %g)", maxdiff);
	loom_program_free(b.p);
}

/* ---------------------------------------------------------- info */

Test(program, info_sizes_o0)
{
	loom_compile_opts o = cpu_opts();
	o.optim.kind = LOOM_OPTIM_ADAMW;
	loom_program *p = compile_linear(&o);
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_str_eq(i.backend, "cpu");
	cr_assert_eq(i.n_params, 2);
	cr_assert_eq(i.n_param_elems, 15);
	cr_assert_eq(i.param_bytes, 15 * 4);
	cr_assert_eq(i.grad_bytes, 15 * 4);
	cr_assert_eq(i.master_bytes, 0);
	/* Adam's m and v per parameter, each rounded up to 64 bytes. */
	cr_assert_eq(i.optim_state_bytes, 2 * (64 + 64));
	cr_assert_eq(i.n_nodes, p->plan.g->n);
	cr_assert_gt(i.n_nodes, 6, "no backward nodes: %d", i.n_nodes);
	cr_assert_eq(i.arena_bytes, p->plan.mp.persist_bytes + p->plan.mp.act_bytes + p->plan.ws_bytes +
					    p->plan.state_bytes);
	cr_assert_geq(i.arena_bytes, i.param_bytes + i.grad_bytes + i.optim_state_bytes);
	cr_assert_leq(i.activation_bytes, i.activation_naive_bytes);
	cr_assert_eq(i.loss_scale, 1.0);
	cr_assert_eq(i.skipped_steps, 0);
	loom_program_free(p);

	/* SGD without momentum keeps no state; with momentum one buffer. */
	o.optim.kind = LOOM_OPTIM_SGD;
	p = compile_linear(&o);
	loom_program_info_get(p, &i);
	cr_assert_eq(i.optim_state_bytes, 0);
	loom_program_free(p);
	o.optim.momentum = 0.9;
	p = compile_linear(&o);
	loom_program_info_get(p, &i);
	cr_assert_eq(i.optim_state_bytes, 64 + 64);
	loom_program_free(p);
}

Test(program, info_sizes_o2)
{
	loom_compile_opts o = cpu_opts();
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.amp.level = LOOM_O2;
	loom_program *p = compile_linear(&o);
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_eq(i.n_params, 2);
	cr_assert_eq(i.n_param_elems, 15);
	cr_assert_eq(i.param_bytes, 15 * 2, "half weights: %zu", i.param_bytes);
	cr_assert_eq(i.grad_bytes, 15 * 2);
	cr_assert_eq(i.master_bytes, 15 * 4);
	/* The optimizer state is kept in the masters' f32. */
	cr_assert_eq(i.optim_state_bytes, 2 * (64 + 64));
	cr_assert_eq(i.loss_scale, 65536.0);
	loom_program_free(p);
}

/* ---------------------------------------------------------- devices */

Test(program, cuda_without_a_device_fails_clearly)
{
	loom_compile_opts o = cpu_opts();
	o.device = LOOM_DEVICE_CUDA;
	loom_value loss;
	loom_graph *g = linear_graph(LOOM_F32, &loss);
	loom_program *p = (loom_program *)1;
	loom_status st = loom_compile(g, loss, &o, &p);
	if (st == LOOM_OK) {
		/* A machine with a GPU: the program runs on it. */
		loom_program_info i;
		loom_program_info_get(p, &i);
		cr_assert(has(i.backend, "cuda"), "%s", i.backend);
		loom_program_free(p);
		loom_graph_free(g);
		cr_skip_test("a CUDA device is present; this checks the CPU-only case");
	}
	cr_assert_eq(st, LOOM_ERR_UNSUPPORTED, "%s", loom_status_string(st));
	cr_assert(has(loom_last_error(), "cuda") && has(loom_last_error(), "CUDA"), "%s",
		  loom_last_error());
	/* The handle comes back with the same message (loom.h, SQLite's model). */
	cr_assert_not_null(p);
	cr_assert_str_eq(loom_program_error(p), loom_last_error());
	loom_program_free(p);

	/* AUTO falls back to the CPU. */
	o.device = LOOM_DEVICE_AUTO;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_str_eq(i.backend, "cpu");
	float x[20] = { 0 };
	int32_t y[5] = { 0 };
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 20), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 5), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	/* x = 0: the logits are the bias, U(-1/2, 1/2), so the loss is near
	 * log(3) but not at it. */
	cr_assert(fabs(loom_loss(p) - log(3.0)) < 0.5, "loss %g", loom_loss(p));
	cr_assert_eq(loom_step_count(p), 1);
	loom_program_free(p);
	loom_graph_free(g);
}

/* The library prints through the user's callback, and back to stderr
 * after loom_set_log(NULL, NULL). */
typedef struct log_sink {
	int calls;
	char last[512];
} log_sink;

static void sink(void *user, const char *msg)
{
	log_sink *s = user;
	s->calls++;
	snprintf(s->last, sizeof(s->last), "%s", msg);
}

Test(program, log_goes_through_the_callback)
{
	log_sink s = { 0, "" };
	loom_compile_opts o = cpu_opts();
	o.verbose = 1;
	loom_set_log(sink, &s);
	loom_program *p = compile_linear(&o);
	loom_set_log(NULL, NULL);
	cr_assert_geq(s.calls, 1);
	cr_assert(has(s.last, "compiled"), "%s", s.last);
	loom_program_free(p);
}

/* loom_program_info's launch fields: the backend's counters as it counts
 * them, and why steps run eagerly, once the first training step decided. */
static void counted(void *ctx, loom_backend_counters *out)
{
	(void)ctx;
	*out = (loom_backend_counters){ .host_syncs = 9, .syncs_in_step = 2, .captures = 1,
					.replays = 7 };
}

Test(program, info_launch_counters)
{
	loom_compile_opts o = cpu_opts();
	loom_program *p = compile_linear(&o);
	float x[20] = { 0 };
	int32_t y[5] = { 0, 1, 2, 0, 1 };
	loom_program_info i;
	/* The CPU counts nothing and records no graph. */
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 20), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 5), LOOM_OK);
	loom_program_info_get(p, &i);
	cr_assert_str_eq(i.graph_note, "", "before the first step: %s", i.graph_note);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	loom_program_info_get(p, &i);
	cr_assert(i.graph_captures == 0 && i.graph_replays == 0 && i.host_syncs == 0 &&
		  i.syncs_in_step == 0);
	cr_assert(has(i.graph_note, "records no graphs"), "note: %s", i.graph_note);
	loom_program_free(p);
	/* A backend that counts: its figures, unchanged. */
	loom_backend be = loom_cpu_backend;
	loom_backend_timing tm = *loom_cpu_backend.timing;
	tm.counters = counted;
	be.timing = &tm;
	loom_test_backend = &be;
	p = compile_linear(&o);
	loom_test_backend = NULL;
	loom_program_info_get(p, &i);
	cr_assert_eq(i.host_syncs, 9);
	cr_assert_eq(i.syncs_in_step, 2);
	cr_assert_eq(i.graph_captures, 1);
	cr_assert_eq(i.graph_replays, 7);
	loom_program_free(p);
}
