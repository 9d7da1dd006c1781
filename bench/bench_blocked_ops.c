/*
 * bench/bench_blocked_ops.c — batch norm (training forward, backward) and max
 * pooling (forward, backward) on f32 nChw8c values, loom's own loops
 * (engine/cpu/blocked.c) against oneDNN's batch_normalization and pooling
 * primitives on the same memory, run by run alternately; per op the median
 * CPU milliseconds (the process's CPU clock) and wall milliseconds, and the
 * largest difference between the two results.
 *   bench_blocked_ops [--reps N] [--threads T] [--batch B] [--set resnet50|resnet18|pool|all] (pool: the pooling rows only)
 *
 * What each side computes (so that the comparison is of the same work):
 *   bn fwd: loom computes the batch mean and variance, normalizes, and
 *     updates the running statistics (C elements); oneDNN (forward_training,
 *     scale and shift) computes the batch mean and variance, which it
 *     returns, and normalizes.
 *   bn bwd: loom's backward takes x and recomputes the batch statistics;
 *     oneDNN's takes the mean and variance its forward returned.
 *   pool fwd: oneDNN forward_training also writes the workspace (the argmax)
 *     its backward reads; loom writes y only.
 *   pool bwd: loom recomputes each window's argmax from x; oneDNN reads the
 *     workspace.
 *   pool+relu fwd: loom's fused relu against oneDNN's eltwise relu post-op
 *     (forward only: oneDNN's pooling backward has no relu).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "engine/cpu/blocked.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/pool_dnnl.h"
#include "loom.h"
#include "oneapi/dnnl/dnnl.h"

#define CHECK(call)                                                                    \
	do {                                                                           \
		dnnl_status_t st_ = (call);                                            \
		if (st_ != dnnl_success) {                                             \
			fprintf(stderr, "bench_blocked_ops: %s failed (%d) at line %d\n", \
				#call, (int)st_, __LINE__);                            \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

static dnnl_engine_t eng;
static dnnl_stream_t strm;

static double cpu_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

static float *falloc(size_t n)
{
	float *p = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
	if (!p) {
		fprintf(stderr, "bench_blocked_ops: out of memory (%zu floats)\n", n);
		exit(1);
	}
	return p;
}

static void fill(float *p, size_t n, unsigned *seed, float lo, float hi)
{
	for (size_t i = 0; i < n; i++) {
		*seed = *seed * 1664525u + 1013904223u;
		p[i] = lo + (hi - lo) * (float)((*seed >> 8) * (1.0 / 16777216.0));
	}
}

/* max |a - b| / max(1, max |b|) */
static double rel_diff(const float *a, const float *b, size_t n)
{
	double d = 0, m = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)a[i] - b[i]);
		if (e > d || e != e)
			d = e;
		if (fabs(b[i]) > m)
			m = fabs(b[i]);
	}
	return d / (m > 1 ? m : 1);
}

static dnnl_memory_t mem(const dnnl_memory_desc_t *md, void *p)
{
	dnnl_memory_t m;
	CHECK(dnnl_memory_create(&m, md, eng, p));
	return m;
}

static void nchw8c_md(dnnl_memory_desc_t *md, int n, int c, int h, int w)
{
	dnnl_dims_t d = { n, c, h, w };
	CHECK(dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, dnnl_nChw8c));
}

static void vec_md(dnnl_memory_desc_t *md, int c)
{
	dnnl_dims_t d = { c };
	CHECK(dnnl_memory_desc_init_by_tag(md, 1, d, dnnl_f32, dnnl_a));
}

static dnnl_primitive_t prim(dnnl_primitive_desc_t pd)
{
	dnnl_primitive_t p;
	CHECK(dnnl_primitive_create(&p, pd));
	return p;
}

static void exec(dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args)
{
	CHECK(dnnl_primitive_execute(p, strm, nargs, args));
	CHECK(dnnl_stream_wait(strm));
}

/* Times of the runs of one op on one side. */
typedef struct series {
	double *cpu, *wall;
} series;

static double median(double *v, int n)
{
	qsort(v, n, sizeof(double), bench_cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void print_row(const char *op, const char *shape, int threads, series *l, series *d,
		      int reps, double diff, const char *impl)
{
	double lc = median(l->cpu, reps), dc = median(d->cpu, reps);
	double lw = median(l->wall, reps), dw = median(d->wall, reps);
	printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2fx | %.1e | %s |\n", op, shape,
	       threads, lc * 1e3, dc * 1e3, lw * 1e3, dw * 1e3, lc / dc, diff, impl);
	fflush(stdout);
}

static const char *impl_of(dnnl_primitive_desc_t pd)
{
	const char *s = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s);
	return s;
}

#define TIME(ser, i, stmt)                                          \
	do {                                                        \
		double c0_ = cpu_now(), w0_ = bench_now();          \
		stmt;                                               \
		(ser).wall[i] = bench_now() - w0_;                  \
		(ser).cpu[i] = cpu_now() - c0_;                     \
	} while (0)

/* Times side a's and side b's statements of rep r, a first on even reps
 * and b first on odd ones, so that neither always follows the other. */
#define TIME_PAIR(r, sa, stmt_a, sb, stmt_b)     \
	do {                                     \
		if ((r) % 2 == 0) {              \
			TIME(sa, r, stmt_a);     \
			TIME(sb, r, stmt_b);     \
		} else {                         \
			TIME(sb, r, stmt_b);     \
			TIME(sa, r, stmt_a);     \
		}                                \
	} while (0)

static series mk_series(int reps)
{
	series s = { malloc(sizeof(double) * reps), malloc(sizeof(double) * reps) };
	return s;
}

static void free_series(series *s)
{
	free(s->cpu);
	free(s->wall);
}

/* ---------------------------------------------------------------- batch norm */

static void bench_bn(int n, int c, int hw_side, int threads, int reps)
{
	const double eps = 1e-5, momentum = 0.1;
	const int64_t hw = (int64_t)hw_side * hw_side;
	const size_t total = (size_t)n * c * hw;
	unsigned seed = 1234u + (unsigned)c;
	float *x = falloc(total), *dy = falloc(total), *yl = falloc(total), *yd = falloc(total);
	float *dxl = falloc(total), *dxd = falloc(total);
	float *gamma = falloc(c), *beta = falloc(c), *rm = falloc(c), *rv = falloc(c);
	float *mean = falloc(c), *var = falloc(c);
	float *dgl = falloc(c), *dbl = falloc(c), *dgd = falloc(c), *dbd = falloc(c);
	fill(x, total, &seed, -1.5f, 2.5f);
	fill(dy, total, &seed, -1, 1);
	fill(gamma, c, &seed, 0.5f, 1.5f);
	fill(beta, c, &seed, -0.5f, 0.5f);
	for (int i = 0; i < c; i++) {
		rm[i] = 0;
		rv[i] = 1;
	}

	dnnl_memory_desc_t dmd, vmd;
	nchw8c_md(&dmd, n, c, hw_side, hw_side);
	vec_md(&vmd, c);
	const unsigned flags = dnnl_use_scale | dnnl_use_shift;
	dnnl_batch_normalization_desc_t fd, bd;
	dnnl_primitive_desc_t fpd, bpd;
	CHECK(dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &dmd,
							 (float)eps, flags));
	CHECK(dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL));
	CHECK(dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &dmd, &dmd,
							  (float)eps, flags));
	CHECK(dnnl_primitive_desc_create(&bpd, &bd, NULL, eng, fpd));
	dnnl_primitive_t fp = prim(fpd), bp = prim(bpd);
	dnnl_memory_t mx = mem(&dmd, x), my = mem(&dmd, yd), mdy = mem(&dmd, dy),
		      mdx = mem(&dmd, dxd), mg = mem(&vmd, gamma), mb = mem(&vmd, beta),
		      mmean = mem(&vmd, mean), mvar = mem(&vmd, var), mdg = mem(&vmd, dgd),
		      mdb = mem(&vmd, dbd);
	dnnl_exec_arg_t fargs[] = { { DNNL_ARG_SRC, mx },     { DNNL_ARG_DST, my },
				    { DNNL_ARG_SCALE, mg },   { DNNL_ARG_SHIFT, mb },
				    { DNNL_ARG_MEAN, mmean }, { DNNL_ARG_VARIANCE, mvar } };
	dnnl_exec_arg_t bargs[] = { { DNNL_ARG_SRC, mx },
				    { DNNL_ARG_DIFF_DST, mdy },
				    { DNNL_ARG_MEAN, mmean },
				    { DNNL_ARG_VARIANCE, mvar },
				    { DNNL_ARG_SCALE, mg },
				    { DNNL_ARG_SHIFT, mb },
				    { DNNL_ARG_DIFF_SRC, mdx },
				    { DNNL_ARG_DIFF_SCALE, mdg },
				    { DNNL_ARG_DIFF_SHIFT, mdb } };
	const int nf = sizeof(fargs) / sizeof(fargs[0]), nb = sizeof(bargs) / sizeof(bargs[0]);

	/* One run each to warm up, and the check. */
	loom_cpu_bn8_fwd_train(n, c, hw, x, gamma, beta, rm, rv, momentum, eps, yl);
	exec(fp, nf, fargs);
	loom_cpu_bn8_bwd(n, c, hw, x, gamma, dy, eps, dxl, dgl, dbl);
	exec(bp, nb, bargs);
	double dfwd = rel_diff(yl, yd, total);
	double dbwd = rel_diff(dxl, dxd, total), dg = rel_diff(dgl, dgd, c),
	       db = rel_diff(dbl, dbd, c);
	if (dg > dbwd)
		dbwd = dg;
	if (db > dbwd)
		dbwd = db;

#define BN_FWD_LOOM() \
	loom_cpu_bn8_fwd_train(n, c, hw, x, gamma, beta, rm, rv, momentum, eps, yl)
	series lf = mk_series(reps), df = mk_series(reps), lb = mk_series(reps),
	       db_ = mk_series(reps);
	for (int r = 0; r < reps; r++) {
		TIME_PAIR(r, lf, BN_FWD_LOOM(), df, exec(fp, nf, fargs));
		TIME_PAIR(r, lb, loom_cpu_bn8_bwd(n, c, hw, x, gamma, dy, eps, dxl, dgl, dbl), db_,
			  exec(bp, nb, bargs));
	}
#undef BN_FWD_LOOM
	char shape[64];
	snprintf(shape, sizeof(shape), "%dx%dx%dx%d", n, c, hw_side, hw_side);
	print_row("bn fwd train", shape, threads, &lf, &df, reps, dfwd, impl_of(fpd));
	print_row("bn bwd", shape, threads, &lb, &db_, reps, dbwd, impl_of(bpd));

	/* loom's backward on the statistics its forward kept (engine/cpu/side.c's
	 * LOOM_CPU_DNNL_BN=saved) against making them again from x. */
	double *sm = malloc(sizeof(double) * 2 * c);
	float *dxs = falloc(total), *dgs = falloc(c), *dbs = falloc(c);
	loom_cpu_bn8_fwd_train_save(n, c, hw, x, gamma, beta, rm, rv, momentum, eps, yl, sm, sm + c);
	loom_cpu_bn8_bwd_saved(n, c, hw, x, gamma, dy, eps, sm, sm + c, dxs, dgs, dbs);
	double dsv = rel_diff(dxl, dxs, total);
	series kb = mk_series(reps), kf = mk_series(reps);
	for (int r = 0; r < reps; r++)
		TIME_PAIR(r, lf,
			  loom_cpu_bn8_fwd_train(n, c, hw, x, gamma, beta, rm, rv, momentum, eps, yl),
			  kf,
			  loom_cpu_bn8_fwd_train_save(n, c, hw, x, gamma, beta, rm, rv, momentum, eps,
						      yd, sm, sm + c));
	print_row("bn fwd train, loom's statistics kept", shape, threads, &lf, &kf, reps,
		  rel_diff(yl, yd, total), "loom (kept)");
	free_series(&kf);
	for (int r = 0; r < reps; r++)
		TIME_PAIR(r, lb, loom_cpu_bn8_bwd(n, c, hw, x, gamma, dy, eps, dxl, dgl, dbl), kb,
			  loom_cpu_bn8_bwd_saved(n, c, hw, x, gamma, dy, eps, sm, sm + c, dxs, dgs, dbs));
	print_row("bn bwd, loom's statistics kept", shape, threads, &lb, &kb, reps, dsv,
		  "loom (kept)");
	free_series(&kb);
	free(sm);
	free(dxs);
	free(dgs);
	free(dbs);

	free_series(&lf);
	free_series(&df);
	free_series(&lb);
	free_series(&db_);
	dnnl_memory_t ms[] = { mx, my, mdy, mdx, mg, mb, mmean, mvar, mdg, mdb };
	for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
		dnnl_memory_destroy(ms[i]);
	dnnl_primitive_destroy(fp);
	dnnl_primitive_destroy(bp);
	dnnl_primitive_desc_destroy(fpd);
	dnnl_primitive_desc_destroy(bpd);
	float *fs[] = { x,    dy,   yl, yd, dxl,  dxd, gamma, beta,
			rm,   rv,   mean, var, dgl, dbl, dgd, dbd };
	for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++)
		free(fs[i]);
}

/* ---------------------------------------------------------------- max pooling */

/* oneDNN's max pooling (pooling_v2) of shape s on x (xmd) -> y (ymd), the
 * fused relu as an eltwise post-op where s has it, and its backward
 * dy -> dx through the forward's workspace. */
typedef struct dnnl_maxpool {
	dnnl_primitive_desc_t fpd, bpd;
	dnnl_primitive_t fp, bp;
	dnnl_memory_t mem[5]; /* x, y, dy, dx, the workspace */
	void *ws;
	dnnl_exec_arg_t fargs[3], bargs[3];
} dnnl_maxpool;

static void maxpool_make(dnnl_maxpool *p, const loom_pool_shape *s, const dnnl_memory_desc_t *xmd,
			 const dnnl_memory_desc_t *ymd, float *x, float *y, float *dy, float *dx)
{
	dnnl_dims_t st = { s->stride, s->stride }, ker = { s->k, s->k }, dil = { 0, 0 },
		    pl = { s->pad, s->pad };
	/* oneDNN's right padding: what makes the last window end at the input's end. */
	int pr_ = (s->h_out - 1) * s->stride + s->k - s->h_in - s->pad;
	dnnl_dims_t pr = { pr_, pr_ };
	dnnl_pooling_v2_desc_t fd, bd;
	dnnl_memory_desc_t wsmd;
	CHECK(dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, dnnl_pooling_max, xmd,
						ymd, st, ker, dil, pl, pr));
	dnnl_primitive_attr_t attr = NULL;
	if (s->relu) {
		dnnl_post_ops_t po;
		CHECK(dnnl_post_ops_create(&po));
		CHECK(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0, 0));
		CHECK(dnnl_primitive_attr_create(&attr));
		CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
		dnnl_post_ops_destroy(po);
	}
	CHECK(dnnl_primitive_desc_create(&p->fpd, &fd, attr, eng, NULL));
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	CHECK(dnnl_pooling_v2_backward_desc_init(&bd, dnnl_pooling_max, xmd, ymd, st, ker, dil,
						 pl, pr));
	CHECK(dnnl_primitive_desc_create(&p->bpd, &bd, NULL, eng, p->fpd));
	wsmd = *dnnl_primitive_desc_query_md(p->fpd, dnnl_query_workspace_md, 0);
	p->ws = aligned_alloc(64, (dnnl_memory_desc_get_size(&wsmd) + 63) & ~(size_t)63);
	p->fp = prim(p->fpd);
	p->bp = prim(p->bpd);
	p->mem[0] = mem(xmd, x);
	p->mem[1] = mem(ymd, y);
	p->mem[2] = mem(ymd, dy);
	p->mem[3] = mem(xmd, dx);
	p->mem[4] = mem(&wsmd, p->ws);
	p->fargs[0] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, p->mem[0] };
	p->fargs[1] = (dnnl_exec_arg_t){ DNNL_ARG_DST, p->mem[1] };
	p->fargs[2] = (dnnl_exec_arg_t){ DNNL_ARG_WORKSPACE, p->mem[4] };
	p->bargs[0] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_DST, p->mem[2] };
	p->bargs[1] = (dnnl_exec_arg_t){ DNNL_ARG_WORKSPACE, p->mem[4] };
	p->bargs[2] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_SRC, p->mem[3] };
}

static void maxpool_free(dnnl_maxpool *p)
{
	for (size_t i = 0; i < sizeof(p->mem) / sizeof(p->mem[0]); i++)
		dnnl_memory_destroy(p->mem[i]);
	dnnl_primitive_destroy(p->fp);
	dnnl_primitive_destroy(p->bp);
	dnnl_primitive_desc_destroy(p->fpd);
	dnnl_primitive_desc_destroy(p->bpd);
	free(p->ws);
}

/* Max pooling, loom's loops against oneDNN's primitive: on nChw8c
 * (blocked.c), and there also pool_dnnl.c's sliced primitives, or (nchw)
 * on NCHW (pool_impl.h; a ResNet stem after its im2col convolution of 3
 * channels stays NCHW). relu: the fused relu forward (loom's s.relu,
 * oneDNN's eltwise relu post-op) alone; oneDNN's pooling backward has no
 * relu, so no backward then. */
static void bench_pool(int n, int c, int side, int k, int stride, int pad, int relu, int nchw,
		       int threads, int reps)
{
	loom_pool_shape s = { .n = n, .c = c, .h_in = side, .w_in = side, .k = k, .stride = stride,
			      .pad = pad, .relu = relu };
	s.h_out = s.w_out = (int)loom_window_out(side, k, stride, pad);
	const size_t in = (size_t)n * c * side * side, out = (size_t)n * c * s.h_out * s.w_out;
	unsigned seed = (nchw ? 77u : 99u) + (unsigned)c;
	float *x = falloc(in), *dy = falloc(out), *yl = falloc(out), *yd = falloc(out);
	float *dxl = falloc(in), *dxd = falloc(in);
	fill(x, in, &seed, -1, 1);
	fill(dy, out, &seed, -1, 1);
	void (*lfwd)(const loom_pool_shape *, const float *, float *) =
		nchw ? loom_cpu_maxpool2d_fwd_f32 : loom_cpu_maxpool8_fwd;
	void (*lbwd)(const loom_pool_shape *, const float *, const float *, float *) =
		nchw ? loom_cpu_maxpool2d_bwd_f32 : loom_cpu_maxpool8_bwd;

	dnnl_memory_desc_t xmd, ymd;
	if (nchw) {
		dnnl_dims_t xd = { n, c, side, side }, yd4 = { n, c, s.h_out, s.w_out };
		CHECK(dnnl_memory_desc_init_by_tag(&xmd, 4, xd, dnnl_f32, dnnl_nchw));
		CHECK(dnnl_memory_desc_init_by_tag(&ymd, 4, yd4, dnnl_f32, dnnl_nchw));
	} else {
		nchw8c_md(&xmd, n, c, side, side);
		nchw8c_md(&ymd, n, c, s.h_out, s.w_out);
	}
	dnnl_maxpool mp;
	maxpool_make(&mp, &s, &xmd, &ymd, x, yd, dy, dxd);

	lfwd(&s, x, yl);
	exec(mp.fp, 3, mp.fargs);
	double dfwd = rel_diff(yl, yd, out), dbwd = 0;
	if (!relu) {
		lbwd(&s, x, dy, dxl);
		exec(mp.bp, 3, mp.bargs);
		dbwd = rel_diff(dxl, dxd, in);
	}

	series lf = mk_series(reps), df = mk_series(reps), lb = mk_series(reps),
	       db = mk_series(reps);
	for (int r = 0; r < reps; r++) {
		TIME_PAIR(r, lf, lfwd(&s, x, yl), df, exec(mp.fp, 3, mp.fargs));
		if (!relu)
			TIME_PAIR(r, lb, lbwd(&s, x, dy, dxl), db, exec(mp.bp, 3, mp.bargs));
	}
	char shape[64], what[64];
	const char *layout = nchw ? " NCHW" : "";
	snprintf(shape, sizeof(shape), "%dx%dx%dx%d k%d s%d p%d", n, c, side, side, k, stride, pad);
	snprintf(what, sizeof(what), "%s fwd%s", relu ? "maxpool+relu" : "maxpool", layout);
	print_row(what, shape, threads, &lf, &df, reps, dfwd, impl_of(mp.fpd));
	snprintf(what, sizeof(what), "maxpool bwd%s", layout);
	if (!relu)
		print_row(what, shape, threads, &lb, &db, reps, dbwd, impl_of(mp.bpd));

	/* engine/cpu/pool_dnnl.c as a step runs it: the batch in one slice per
	 * thread, each slice's primitives made for one thread. */
	loom_cpu_dnnl_pool *sp = nchw ? NULL : loom_cpu_dnnl_pool_new(&s);
	if (sp) {
		void *sws = aligned_alloc(64, loom_cpu_dnnl_pool_side(sp) + 64);
		loom_cpu_dnnl_pool_fwd(sp, x, yd, sws);
		double sf = rel_diff(yl, yd, out), sb = 0;
		loom_cpu_dnnl_pool_bwd(sp, x, dy, dxd, sws);
		loom_cpu_maxpool8_bwd(&s, x, dy, dxl);
		sb = rel_diff(dxl, dxd, in);
		for (int r = 0; r < reps; r++) {
			TIME_PAIR(r, lf, loom_cpu_maxpool8_fwd(&s, x, yl), df,
				  loom_cpu_dnnl_pool_fwd(sp, x, yd, sws));
			TIME_PAIR(r, lb, loom_cpu_maxpool8_bwd(&s, x, dy, dxl), db,
				  loom_cpu_dnnl_pool_bwd(sp, x, dy, dxd, sws));
		}
		print_row(relu ? "maxpool+relu fwd, sliced" : "maxpool fwd, sliced", shape, threads,
			  &lf, &df, reps, sf, "pool_dnnl.c");
		print_row(relu ? "maxpool+relu bwd, sliced" : "maxpool bwd, sliced", shape, threads,
			  &lb, &db, reps, sb, "pool_dnnl.c");
		free(sws);
		loom_cpu_dnnl_pool_free(sp);
	}

	free_series(&lf);
	free_series(&df);
	free_series(&lb);
	free_series(&db);
	maxpool_free(&mp);
	float *fs[] = { x, dy, yl, yd, dxl, dxd };
	for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++)
		free(fs[i]);
}

/* ---------------------------------------------------------------- shapes */

typedef struct bn_shape {
	int c, side;
	const char *set; /* "50", "18" or "both" */
} bn_shape;

/* The batch norms' (channels, side) of ResNet-50 and ResNet-18 at 224x224
 * that recur (not the one-off 128x56, 256x28 and 512x14 of ResNet-50's
 * stage entries). */
static const bn_shape bn_shapes[] = {
	{ 64, 112, "both" }, { 64, 56, "both" },  { 256, 56, "50" },
	{ 128, 28, "both" }, { 512, 28, "50" },
	{ 256, 14, "both" }, { 1024, 14, "50" }, { 512, 7, "both" },  { 2048, 7, "50" },
};

static int in_set(const char *shape_set, const char *want)
{
	if (!strcmp(want, "all") || !strcmp(shape_set, "both"))
		return 1;
	return !strcmp(want, "resnet50") ? !strcmp(shape_set, "50") : !strcmp(shape_set, "18");
}

int main(int argc, char **argv)
{
	int reps = 7, batch = 16, threads[2] = { 1, 2 }, nthreads = 2;
	const char *set = "all";
	int one = -1; /* --threads T: T alone, else 1 and 2 */
	if (bench_args(argc, argv,
		       "usage: bench_blocked_ops [--reps N] [--threads T] [--batch B] "
		       "[--set resnet50|resnet18|pool|all]",
		       "--reps=%d --batch=%d --threads=%d --set=%s", &reps, &batch, &one, &set))
		return 2;
	if (one != -1)
		threads[0] = one, nthreads = 1;
	if (reps < 1 || batch < 1) {
		fprintf(stderr, "bench_blocked_ops: --reps and --batch must be >= 1\n");
		return 2;
	}
	CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
	CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
	printf("f32 nChw8c, batch %d, %d runs each, loom and oneDNN alternating; ms: median per "
	       "call; ratio: loom CPU / oneDNN CPU; diff: max |loom - onednn| / max(1, max "
	       "|onednn|)\n\n",
	       batch, reps);
	printf("| op | NxCxHxW | threads | loom CPU ms | oneDNN CPU ms | loom wall ms | oneDNN "
	       "wall ms | ratio | diff | oneDNN impl |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
	for (int t = 0; t < nthreads; t++) {
		loom_cpu_set_threads(threads[t]); /* OpenMP's count: loom's team and oneDNN */
		/* The ResNet stem's max pool (3x3, stride 2, pad 1, 112 -> 56), then
		 * the same window on a 56 input. */
		bench_pool(batch, 64, 112, 3, 2, 1, 0, 0, threads[t], reps);
		bench_pool(batch, 64, 112, 3, 2, 1, 1, 0, threads[t], reps);
		bench_pool(batch, 64, 56, 3, 2, 1, 0, 0, threads[t], reps);
		bench_pool(batch, 64, 112, 3, 2, 1, 0, 1, threads[t], reps);
		if (!strcmp(set, "pool"))
			continue;
		for (size_t i = 0; i < sizeof(bn_shapes) / sizeof(bn_shapes[0]); i++)
			if (in_set(bn_shapes[i].set, set))
				bench_bn(batch, bn_shapes[i].c, bn_shapes[i].side, threads[t],
					 reps);
	}
	dnnl_stream_destroy(strm);
	dnnl_engine_destroy(eng);
	return 0;
}
