/*
 * tests/engine/cpu/kernels_timing.c — times the CPU kernels on the classic
 * MNIST ConvNet at batch 100 (f32) and prints ms per kernel and per layer,
 * forward + backward. Run: bazel run //tests/engine/cpu:kernels_timing [reps]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cpu/kernels.h"

#define BATCH 100

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float *rnd(size_t n)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)rand() / RAND_MAX - 0.5f;
	return p;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Everything one conv + BN + relu + pool block needs. */
struct block {
	loom_conv_shape cs;
	loom_pool_shape ps;
	float *x, *w, *b, *conv, *bn, *act, *pool;
	float *dpool, *dact, *dbn, *dconv, *dx, *dw, *db, *gamma, *beta, *rm, *rv;
	float *dgamma, *dbeta;
	void *ws;
	int need_dx;
};

static void block_init(struct block *k, int c_in, int hw, int c_out, int need_dx)
{
	loom_conv_shape cs = {BATCH, c_in, hw, hw, c_out, 5, 5, 1, 2, hw, hw};
	loom_pool_shape ps = {BATCH, c_out, hw, hw, 2, 2, 0, hw / 2, hw / 2};
	size_t in = (size_t)BATCH * c_in * hw * hw, out = (size_t)BATCH * c_out * hw * hw;
	size_t po = out / 4;
	k->cs = cs;
	k->ps = ps;
	k->need_dx = need_dx;
	k->x = rnd(in), k->w = rnd((size_t)c_out * c_in * 25), k->b = rnd(c_out);
	k->conv = rnd(out), k->bn = rnd(out), k->act = rnd(out), k->pool = rnd(po);
	k->dpool = rnd(po), k->dact = rnd(out), k->dbn = rnd(out), k->dconv = rnd(out);
	k->dx = rnd(in), k->dw = rnd((size_t)c_out * c_in * 25), k->db = rnd(c_out);
	k->gamma = rnd(c_out), k->beta = rnd(c_out), k->rm = rnd(c_out), k->rv = rnd(c_out);
	k->dgamma = rnd(c_out), k->dbeta = rnd(c_out);
	for (int i = 0; i < c_out; i++)
		k->rv[i] = 1;
	k->ws = malloc(loom_cpu_conv2d_workspace(&cs, sizeof(float)));
}

#define NK 12
static const char *knames[NK] = {
	"conv fwd", "bn fwd", "relu fwd", "pool fwd", "pool bwd", "relu bwd",
	"bn bwd data", "bn bwd gamma+beta", "conv bwd filter+bias", "conv bwd data",
	"", ""};

static void block_run(struct block *k, double *t)
{
	const loom_conv_shape *cs = &k->cs;
	int64_t hw = (int64_t)cs->h_out * cs->w_out;
	int c = cs->c_out;
	int64_t out = (int64_t)BATCH * c * hw;
	double t0 = now_ms(), t1;
#define LAP(i)                    \
	t1 = now_ms();            \
	t[i] += t1 - t0;          \
	t0 = t1;
	loom_cpu_conv2d_fwd_f32(cs, k->x, k->w, k->b, k->conv, k->ws);
	LAP(0);
	loom_cpu_bn_fwd_train_f32(BATCH, c, hw, k->conv, k->gamma, k->beta, k->rm, k->rv,
				  0.1, 1e-5, k->bn);
	LAP(1);
	loom_cpu_relu_fwd_f32(out, k->bn, k->act);
	LAP(2);
	loom_cpu_maxpool2d_fwd_f32(&k->ps, k->act, k->pool);
	LAP(3);
	loom_cpu_maxpool2d_bwd_f32(&k->ps, k->act, k->dpool, k->dact);
	LAP(4);
	loom_cpu_relu_bwd_f32(out, k->bn, k->dact, k->dbn);
	LAP(5);
	loom_cpu_bn_bwd_data_f32(BATCH, c, hw, k->conv, k->gamma, k->dbn, 1e-5, k->dconv);
	LAP(6);
	loom_cpu_bn_bwd_gamma_f32(BATCH, c, hw, k->conv, k->dbn, 1e-5, k->dgamma);
	loom_cpu_channel_sum_f32(BATCH, c, hw, k->dbn, k->dbeta);
	LAP(7);
	loom_cpu_conv2d_bwd_filter_f32(cs, k->dconv, k->x, k->dw, k->ws);
	loom_cpu_channel_sum_f32(BATCH, c, hw, k->dconv, k->db);
	LAP(8);
	if (k->need_dx)
		loom_cpu_conv2d_bwd_data_f32(cs, k->dconv, k->w, k->dx, k->ws);
	LAP(9);
#undef LAP
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 50;
	struct block b1, b2;
	block_init(&b1, 1, 28, 16, 0);
	block_init(&b2, 16, 14, 32, 1);
	float *lw = rnd(10 * 1568), *lb = rnd(10), *logits = rnd(BATCH * 10);
	float *dlogits = rnd(BATCH * 10), *dlw = rnd(10 * 1568), *dlb = rnd(10), loss, dl = 1;
	int32_t labels[BATCH];
	for (int i = 0; i < BATCH; i++)
		labels[i] = i % 10;

	double *t1 = calloc((size_t)reps * NK, sizeof(double));
	double *t2 = calloc((size_t)reps * NK, sizeof(double));
	double *tl = calloc((size_t)reps, sizeof(double));
	double *tot = calloc((size_t)reps, sizeof(double));
	for (int r = -5; r < reps; r++) {
		double a[NK] = {0}, b[NK] = {0}, s = now_ms();
		block_run(&b1, a);
		block_run(&b2, b);
		double l0 = now_ms();
		loom_cpu_linear_fwd_f32(BATCH, 1568, 10, b2.pool, lw, lb, logits);
		int bad;
		loom_cpu_softmax_ce_fwd_f32(BATCH, 10, logits, labels, &loss, &bad);
		loom_cpu_softmax_ce_bwd_f32(BATCH, 10, logits, labels, &dl, dlogits);
		loom_cpu_gemm_f32(1, 0, 10, 1568, BATCH, 1, dlogits, b2.pool, 0, dlw);
		loom_cpu_channel_sum_f32(BATCH, 10, 1, dlogits, dlb);
		loom_cpu_gemm_f32(0, 0, BATCH, 1568, 10, 1, dlogits, lw, 0, b2.dpool);
		double e = now_ms();
		if (r < 0)
			continue;
		for (int i = 0; i < NK; i++) {
			t1[i * reps + r] = a[i];
			t2[i * reps + r] = b[i];
		}
		tl[r] = e - l0;
		tot[r] = e - s;
	}
	printf("ConvNet kernels, f32, batch %d, median of %d reps (ms)\n", BATCH, reps);
	printf("%-22s %10s %10s\n", "kernel", "conv1", "conv2");
	double s1 = 0, s2 = 0;
	for (int i = 0; i < 10; i++) {
		qsort(t1 + i * reps, reps, sizeof(double), cmp_d);
		qsort(t2 + i * reps, reps, sizeof(double), cmp_d);
		double m1 = t1[i * reps + reps / 2], m2 = t2[i * reps + reps / 2];
		s1 += m1, s2 += m2;
		printf("%-22s %10.3f %10.3f\n", knames[i], m1, m2);
	}
	qsort(tl, reps, sizeof(double), cmp_d);
	qsort(tot, reps, sizeof(double), cmp_d);
	printf("%-22s %10.3f %10.3f\n", "block fwd+bwd (sum)", s1, s2);
	printf("%-22s %10.3f\n", "linear+CE fwd+bwd", tl[reps / 2]);
	printf("%-22s %10.3f  (%.0f images/s, kernels only)\n", "step total", tot[reps / 2],
	       BATCH / (tot[reps / 2] / 1e3));
	return 0;
}
