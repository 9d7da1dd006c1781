/*
 * tests/graph/test_gradcheck.c — every op's gradient rule (and the CPU
 * backward kernels behind it) against central finite differences, in f64.
 * Each differentiated tensor is a parameter so that its gradient is readable;
 * each op's output is reduced to a scalar through a fixed random projection so
 * that symmetric mistakes (a transposed index, a missing term that sums to
 * zero over a channel) cannot cancel out.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/splitmix.h"
#include "base/fp8.h"
#include "graph/graph_internal.h"
#include "graph/ops/ops.h"
#include "loom.h"
#include "tests/graph/gradcheck_cases.h"
#include "tests/graph/nets.h"

/* How a parameter's test values are drawn. */
typedef enum fill_kind {
	FILL_UNIFORM,  /* U(-1, 1) */
	FILL_AWAY0,    /* |x| in [0.2, 1], random sign: no ReLU kink within reach */
	FILL_DISTINCT, /* a shuffled ladder of distinct values: no max-pool ties */
	FILL_NEAR1,    /* U(0.5, 1.5): batch-norm scales */
	FILL_FP8,      /* +-(1 + j/4) 2^-e, j, e in 0..3: E5M2 and E4M3 values at any scale */
} fill_kind;

typedef struct gc_param {
	loom_value v;
	fill_kind fill;
	char name[64];
	size_t numel;
	int expect_zero; /* the gradient is zero by construction (bias before BN) */
	double *val; /* the test values, restored after each perturbation */
} gc_param;

typedef struct gc_input {
	char name[64];
	loom_dtype dt;
	void *data;
	size_t count;
} gc_input;

#define GC_MAX 32

typedef struct gc {
	loom_graph *g;
	uint64_t rng;
	gc_param par[GC_MAX];
	int npar;
	gc_input in[4];
	int nin;
	int nproj; /* for unique projection names */
} gc;

/* splitmix64: a fixed, portable stream, so a failure reproduces exactly. */
static uint64_t rnd_u64(gc *c)
{
	return loom_splitmix64(&c->rng);
}

static double rnd_unit(gc *c)
{
	return (double)(rnd_u64(c) >> 11) / 9007199254740992.0;
}

static void gc_init(gc *c, uint64_t seed)
{
	memset(c, 0, sizeof(*c));
	c->rng = seed;
	cr_assert_eq(loom_graph_new(&c->g), LOOM_OK);
}

static void gc_fini(gc *c)
{
	for (int i = 0; i < c->npar; i++)
		free(c->par[i].val);
	for (int i = 0; i < c->nin; i++)
		free(c->in[i].data);
	loom_graph_free(c->g);
}

static loom_value gc_param_new(gc *c, const char *name, fill_kind fill, int ndim,
			       const int64_t *dims)
{
	cr_assert_lt(c->npar, GC_MAX);
	loom_value v = loom_param(c->g, name, LOOM_F64, ndim, dims, LOOM_INIT_ZEROS, 0);
	cr_assert_neq(v, LOOM_NONE, "param '%s': %s", name, loom_graph_error(c->g));
	gc_param *p = &c->par[c->npar++];
	p->v = v;
	p->fill = fill;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->numel = 1;
	for (int i = 0; i < ndim; i++)
		p->numel *= (size_t)dims[i];
	return v;
}

/* Registers a parameter created elsewhere (the shared ConvNet). */
static void gc_adopt(gc *c, loom_value v, const char *name, fill_kind fill)
{
	cr_assert_lt(c->npar, GC_MAX);
	loom_shape s = loom_value_shape(c->g, v);
	gc_param *p = &c->par[c->npar++];
	p->v = v;
	p->fill = fill;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->numel = (size_t)loom_shape_numel(&s);
}

static void gc_labels(gc *c, const char *name, size_t n, int classes)
{
	gc_input *in = &c->in[c->nin++];
	snprintf(in->name, sizeof(in->name), "%s", name);
	in->dt = LOOM_I32;
	in->count = n;
	int32_t *d = malloc(n * sizeof(*d));
	for (size_t i = 0; i < n; i++)
		d[i] = (int32_t)(rnd_u64(c) % (uint64_t)classes);
	in->data = d;
}

static void gc_input_f64(gc *c, const char *name, size_t n)
{
	gc_input *in = &c->in[c->nin++];
	snprintf(in->name, sizeof(in->name), "%s", name);
	in->dt = LOOM_F64;
	in->count = n;
	double *d = malloc(n * sizeof(*d));
	for (size_t i = 0; i < n; i++)
		d[i] = 2 * rnd_unit(c) - 1;
	in->data = d;
}

/* sum(linear(reshape(y, [1, numel]), r)) with r a fresh random parameter:
 * a fixed random linear functional of y. r's own gradient (y itself) is
 * checked along with everything else. */
static loom_value gc_project(gc *c, loom_value y)
{
	loom_shape s = loom_value_shape(c->g, y);
	int64_t numel = loom_shape_numel(&s);
	int64_t fd[2] = { 1, numel }, rd[2] = { 1, numel };
	char name[32];
	snprintf(name, sizeof(name), "proj%d", c->nproj++);
	loom_value r = gc_param_new(c, name, FILL_UNIFORM, 2, rd);
	loom_value flat = loom_reshape(c->g, y, 2, fd);
	return loom_sum(c->g, loom_linear(c->g, flat, r, LOOM_NONE));
}

static void fill(gc *c, gc_param *p)
{
	p->val = malloc(p->numel * sizeof(double));
	switch (p->fill) {
	case FILL_UNIFORM:
		for (size_t i = 0; i < p->numel; i++)
			p->val[i] = 2 * rnd_unit(c) - 1;
		break;
	case FILL_AWAY0:
		for (size_t i = 0; i < p->numel; i++)
			p->val[i] = (0.2 + 0.8 * rnd_unit(c)) * (rnd_u64(c) & 1 ? 1 : -1);
		break;
	case FILL_NEAR1:
		for (size_t i = 0; i < p->numel; i++)
			p->val[i] = 0.5 + rnd_unit(c);
		break;
	case FILL_FP8:
		for (size_t i = 0; i < p->numel; i++)
			p->val[i] = ldexp(1 + (double)(rnd_u64(c) % 4) / 4, -(int)(rnd_u64(c) % 4)) *
				    (rnd_u64(c) & 1 ? 1 : -1);
		break;
	case FILL_DISTINCT:
		/* A Fisher-Yates shuffle of a ladder in (-1, 1): neighbours are
		 * 2/numel apart, far beyond the finite-difference step. */
		for (size_t i = 0; i < p->numel; i++)
			p->val[i] = -1 + 2 * (i + 0.5) / (double)p->numel;
		for (size_t i = p->numel - 1; i > 0; i--) {
			size_t j = (size_t)(rnd_u64(c) % (i + 1));
			double t = p->val[i];
			p->val[i] = p->val[j];
			p->val[j] = t;
		}
		break;
	}
}

static double forward_loss(loom_program *p)
{
	loom_status st = loom_run(p, LOOM_RUN_FORWARD);
	cr_assert_eq(st, LOOM_OK, "forward: %s", loom_program_error(p));
	return loom_loss(p);
}

/*
 * Compiles loss, checks the analytic gradient of every registered parameter
 * against (L(x + h) - L(x - h)) / 2h, element by element, and fails on the
 * worst element with |a - n| > rtol * max(|a|, |n|, floor).
 */
static void gc_check_h(gc *c, loom_value loss, double rtol, double h)
{
	const double floor = 1e-3;
	cr_assert_eq(loom_graph_status(c->g), LOOM_OK, "build: %s", loom_graph_error(c->g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(c->g, loss, &o, &p), LOOM_OK, "compile: %s", loom_last_error());

	for (int i = 0; i < c->npar; i++) {
		fill(c, &c->par[i]);
		cr_assert_eq(loom_write_f64(p, c->par[i].v, c->par[i].val, c->par[i].numel), LOOM_OK,
			     "write '%s': %s", c->par[i].name, loom_program_error(p));
	}
	for (int i = 0; i < c->nin; i++)
		cr_assert_eq(loom_set_input(p, c->in[i].name, c->in[i].data, c->in[i].dt,
					    c->in[i].count),
			     LOOM_OK, "set_input: %s", loom_program_error(p));

	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "grad run: %s", loom_program_error(p));
	double l0 = loom_loss(p);
	cr_assert(isfinite(l0));
	/* The forward half of a GRAD run is the forward run. */
	double lf = forward_loss(p);
	cr_assert_float_eq(lf, l0, 1e-12 * (1 + fabs(l0)));

	for (int i = 0; i < c->npar; i++) {
		gc_param *pp = &c->par[i];
		double *an = malloc(pp->numel * sizeof(double));
		/* Re-run GRAD at the unperturbed values before each read, so the
		 * check does not rely on FORWARD runs leaving gradients alone. */
		cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
		cr_assert_eq(loom_read_grad_f64(p, pp->v, an, pp->numel), LOOM_OK, "read_grad '%s': %s",
			     pp->name, loom_program_error(p));
		double worst = 0, wa = 0, wn = 0, maxn = 0, maxa = 0;
		size_t wi = 0;
		for (size_t k = 0; k < pp->numel; k++) {
			double x = pp->val[k];
			pp->val[k] = x + h;
			loom_write_f64(p, pp->v, pp->val, pp->numel);
			double lp = forward_loss(p);
			pp->val[k] = x - h;
			loom_write_f64(p, pp->v, pp->val, pp->numel);
			double lm = forward_loss(p);
			pp->val[k] = x;
			double num = (lp - lm) / (2 * h);
			double den = fmax(fmax(fabs(an[k]), fabs(num)), floor);
			double err = fabs(an[k] - num) / den;
			if (!(err <= worst)) { /* NaN counts as worst */
				worst = err;
				wi = k;
				wa = an[k];
				wn = num;
			}
			maxn = fmax(maxn, fabs(num));
			maxa = fmax(maxa, fabs(an[k]));
		}
		cr_assert_eq(loom_write_f64(p, pp->v, pp->val, pp->numel), LOOM_OK);
		free(an);
		cr_assert(worst <= rtol,
			  "gradient of '%s' (%zu elements): worst element %zu: analytic %.12g, "
			  "numeric %.12g, relative error %.3g > %.1g (step %g)",
			  pp->name, pp->numel, wi, wa, wn, worst, rtol, h);
		/* A check of zeros against zeros proves nothing, unless zero is
		 * the point. */
		if (pp->expect_zero)
			cr_assert_lt(maxa, 1e-9, "gradient of '%s' should vanish, max %g", pp->name,
				     maxa);
		else
			cr_assert_gt(maxn, 1e-6, "gradient of '%s' is all zero: the test checks nothing",
				     pp->name);
	}
	loom_program_free(p);
}

static void gc_check(gc *c, loom_value loss, double rtol)
{
	gc_check_h(c, loss, rtol, 1e-5);
}

/* ------------------------------------------------------------------ conv2d */

typedef struct conv_case {
	int n, cin, cout, h, w, kh, kw, stride, pad, bias;
} conv_case;

static void check_conv(conv_case k, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t xd[4] = { k.n, k.cin, k.h, k.w }, wd[4] = { k.cout, k.cin, k.kh, k.kw };
	int64_t bd[1] = { k.cout };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 4, wd);
	loom_value b = k.bias ? gc_param_new(&c, "b", FILL_UNIFORM, 1, bd) : LOOM_NONE;
	loom_value y = loom_conv2d(c.g, x, w, b, k.stride, k.pad);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(c.g));
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

static void case_conv2d_3x3_pad0_bias_batch1(void)
{
	check_conv((conv_case){ 1, 1, 2, 5, 5, 3, 3, 1, 0, 1 }, 1);
}

static void case_conv2d_3x3_pad1_nobias_nonsquare_batch3(void)
{
	check_conv((conv_case){ 3, 2, 3, 6, 7, 3, 3, 1, 1, 0 }, 2);
}

static void case_conv2d_3x3_stride2_pad1_bias(void)
{
	check_conv((conv_case){ 3, 3, 2, 7, 5, 3, 3, 2, 1, 1 }, 3);
}

static void case_conv2d_5x5_pad2_bias(void)
{
	check_conv((conv_case){ 1, 2, 4, 6, 8, 5, 5, 1, 2, 1 }, 4);
}

static void case_conv2d_2x2_stride2_pad0_nobias(void)
{
	check_conv((conv_case){ 3, 4, 1, 5, 6, 2, 2, 2, 0, 0 }, 5);
}

static void case_conv2d_1x1_bias(void)
{
	check_conv((conv_case){ 1, 3, 5, 4, 4, 1, 1, 1, 0, 1 }, 6);
}

static void case_conv2d_stride2_pad2_nonsquare_batch3(void)
{
	check_conv((conv_case){ 3, 2, 2, 8, 9, 3, 3, 2, 2, 1 }, 7);
}

static void case_conv2d_nonsquare_kernel(void)
{
	check_conv((conv_case){ 3, 2, 3, 6, 5, 3, 2, 1, 1, 1 }, 8);
}

/* ------------------------------------------------------------- batchnorm2d */

static void check_bn(int n, int ch, int h, int w, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t xd[4] = { n, ch, h, w }, cd[1] = { ch };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	loom_value gm = gc_param_new(&c, "gamma", FILL_NEAR1, 1, cd);
	loom_value bt = gc_param_new(&c, "beta", FILL_UNIFORM, 1, cd);
	loom_value rm = loom_buffer(c.g, "rm", LOOM_F64, 1, cd, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(c.g, "rv", LOOM_F64, 1, cd, LOOM_INIT_ONES);
	loom_value y = loom_batchnorm2d(c.g, x, gm, bt, rm, rv, 0.1, 1e-5);
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

static void case_batchnorm2d_train(void)
{
	check_bn(3, 4, 5, 6, 11);
}

static void case_batchnorm2d_train_batch1(void)
{
	check_bn(1, 2, 4, 3, 12);
}

/* A sum projection makes dL/dx vanish per channel (sum of x-hat is zero);
 * the gradient of x must then be ~0 while beta's is the element count. */
static void case_batchnorm2d_sum_is_invariant(void)
{
	gc c;
	gc_init(&c, 13);
	int64_t xd[4] = { 2, 3, 4, 4 }, cd[1] = { 3 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	loom_value gm = loom_param(c.g, "gamma", LOOM_F64, 1, cd, LOOM_INIT_ONES, 0);
	loom_value bt = loom_param(c.g, "beta", LOOM_F64, 1, cd, LOOM_INIT_ZEROS, 0);
	loom_value rm = loom_buffer(c.g, "rm", LOOM_F64, 1, cd, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(c.g, "rv", LOOM_F64, 1, cd, LOOM_INIT_ONES);
	loom_value loss = loom_sum(c.g, loom_batchnorm2d(c.g, x, gm, bt, rm, rv, 0.1, 1e-5));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	loom_program *p;
	cr_assert_eq(loom_compile(c.g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	fill(&c, &c.par[0]);
	loom_write_f64(p, x, c.par[0].val, c.par[0].numel);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	double dx[96], db[3];
	cr_assert_eq(loom_read_grad_f64(p, x, dx, 96), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(p, bt, db, 3), LOOM_OK);
	for (int i = 0; i < 96; i++)
		cr_assert(fabs(dx[i]) < 1e-9, "dx[%d] = %g, expected 0", i, dx[i]);
	for (int i = 0; i < 3; i++)
		cr_assert_float_eq(db[i], 32.0, 1e-12);
	loom_program_free(p);
	gc_fini(&c);
}

/* -------------------------------------------------------------------- relu */

static void case_global_avgpool(void)
{
	gc c;
	gc_init(&c, 23);
	int64_t xd[4] = { 2, 3, 4, 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	gc_check(&c, gc_project(&c, loom_global_avgpool(c.g, x)), 1e-6);
	gc_fini(&c);
}

static void case_relu(void)
{
	gc c;
	gc_init(&c, 21);
	int64_t xd[4] = { 2, 3, 4, 5 };
	loom_value x = gc_param_new(&c, "x", FILL_AWAY0, 4, xd);
	gc_check(&c, gc_project(&c, loom_relu(c.g, x)), 1e-6);
	gc_fini(&c);
}

/* Every unary op of graph/unary.h, through zero too (gelu is smooth there,
 * unlike relu): a Test per row, named gradcheck/unary_<op>. An op defined
 * on part of FILL_UNIFORM's range needs a case of its own besides. */
static void unary_case(loom_value (*build)(loom_graph *, loom_value), int seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t xd[4] = { 2, 3, 4, 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	gc_check(&c, gc_project(&c, build(c.g, x)), 1e-6);
	gc_fini(&c);
}

#define UNARY_TEST(NAME, low) \
	Test(gradcheck, unary_##low) { unary_case(loom_##low, 24 + LOOM_OP_##NAME); }
LOOM_UNARY_OPS(UNARY_TEST)
#undef UNARY_TEST

/* GELU's variant (attrs.ew.tanh), which the rows above do not reach. */

static void case_gelu_tanh(void)
{
	gc c;
	gc_init(&c, 25);
	int64_t xd[3] = { 2, 3, 7 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 3, xd);
	gc_check(&c, gc_project(&c, loom_gelu_tanh(c.g, x)), 1e-6);
	gc_fini(&c);
}

static void case_relu_2d(void)
{
	gc c;
	gc_init(&c, 22);
	int64_t xd[2] = { 7, 3 };
	loom_value x = gc_param_new(&c, "x", FILL_AWAY0, 2, xd);
	gc_check(&c, gc_project(&c, loom_relu(c.g, x)), 1e-6);
	gc_fini(&c);
}

/* --------------------------------------------------------------- maxpool2d */

static void check_pool(int n, int ch, int h, int w, int k, int s, int pad, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t xd[4] = { n, ch, h, w };
	loom_value x = gc_param_new(&c, "x", FILL_DISTINCT, 4, xd);
	loom_value y = loom_maxpool2d(c.g, x, k, s, pad);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(c.g));
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

static void case_maxpool2d_k2_s2(void)
{
	check_pool(3, 2, 6, 8, 2, 2, 0, 31);
}

static void case_maxpool2d_k2_s2_odd(void)
{
	check_pool(1, 3, 7, 5, 2, 2, 0, 32);
}

static void case_maxpool2d_k3_s2_pad1(void)
{
	check_pool(3, 2, 7, 7, 3, 2, 1, 33);
}

static void case_maxpool2d_k3_s2_pad1_nonsquare(void)
{
	check_pool(2, 2, 6, 9, 3, 2, 1, 34);
}

/* ------------------------------------------------------- linear and matmul */

static void check_linear(int bias, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t xd[2] = { 3, 5 }, wd[2] = { 4, 5 }, bd[1] = { 4 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 2, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	loom_value b = bias ? gc_param_new(&c, "b", FILL_UNIFORM, 1, bd) : LOOM_NONE;
	gc_check(&c, gc_project(&c, loom_linear(c.g, x, w, b)), 1e-6);
	gc_fini(&c);
}

static void case_linear_bias(void)
{
	check_linear(1, 41);
}

static void case_linear_nobias(void)
{
	check_linear(0, 42);
}

static void case_matmul(void)
{
	gc c;
	gc_init(&c, 43);
	int64_t ad[2] = { 3, 5 }, bd[2] = { 5, 4 };
	loom_value a = gc_param_new(&c, "a", FILL_UNIFORM, 2, ad);
	loom_value b = gc_param_new(&c, "b", FILL_UNIFORM, 2, bd);
	gc_check(&c, gc_project(&c, loom_matmul(c.g, a, b)), 1e-6);
	gc_fini(&c);
}

/* The same parameter on both sides: a a, so both gradient terms land on a. */
static void case_matmul_square_self(void)
{
	gc c;
	gc_init(&c, 44);
	int64_t ad[2] = { 4, 4 };
	loom_value a = gc_param_new(&c, "a", FILL_UNIFORM, 2, ad);
	gc_check(&c, gc_project(&c, loom_matmul(c.g, a, a)), 1e-6);
	gc_fini(&c);
}

/* --------------------------------------------------------------------- add */

static void case_add(void)
{
	gc c;
	gc_init(&c, 51);
	int64_t d[3] = { 2, 3, 4 };
	loom_value a = gc_param_new(&c, "a", FILL_UNIFORM, 3, d);
	loom_value b = gc_param_new(&c, "b", FILL_UNIFORM, 3, d);
	gc_check(&c, gc_project(&c, loom_add(c.g, a, b)), 1e-6);
	gc_fini(&c);
}

static void case_add_same_value_twice(void)
{
	gc c;
	gc_init(&c, 52);
	int64_t d[2] = { 3, 4 };
	loom_value a = gc_param_new(&c, "a", FILL_UNIFORM, 2, d);
	gc_check(&c, gc_project(&c, loom_add(c.g, a, a)), 1e-6);
	gc_fini(&c);
}

/* x + x of an intermediate: the accumulated gradient flows on through relu. */
static void case_add_intermediate_twice(void)
{
	gc c;
	gc_init(&c, 53);
	int64_t d[2] = { 4, 3 };
	loom_value a = gc_param_new(&c, "a", FILL_AWAY0, 2, d);
	loom_value r = loom_relu(c.g, a);
	gc_check(&c, gc_project(&c, loom_add(c.g, r, loom_add(c.g, r, r))), 1e-6);
	gc_fini(&c);
}

/* ------------------------------------------------------ reshape / flatten */

static void case_reshape_then_linear(void)
{
	gc c;
	gc_init(&c, 61);
	int64_t xd[3] = { 2, 3, 4 }, nd[2] = { 4, -1 }, wd[2] = { 5, 6 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 3, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	loom_value r = loom_reshape(c.g, x, 2, nd);
	gc_check(&c, gc_project(&c, loom_linear(c.g, r, w, LOOM_NONE)), 1e-6);
	gc_fini(&c);
}

static void case_flatten_then_linear(void)
{
	gc c;
	gc_init(&c, 62);
	int64_t xd[4] = { 2, 3, 2, 2 }, wd[2] = { 4, 12 }, bd[1] = { 4 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	loom_value b = gc_param_new(&c, "b", FILL_UNIFORM, 1, bd);
	gc_check(&c, gc_project(&c, loom_linear(c.g, loom_flatten(c.g, x), w, b)), 1e-6);
	gc_fini(&c);
}

/* ------------------------------------------------------------- reductions */

static void case_sum(void)
{
	gc c;
	gc_init(&c, 71);
	int64_t xd[2] = { 3, 5 }, wd[2] = { 4, 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 2, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	gc_check(&c, loom_sum(c.g, loom_linear(c.g, x, w, LOOM_NONE)), 1e-6);
	gc_fini(&c);
}

static void case_mean(void)
{
	gc c;
	gc_init(&c, 72);
	int64_t xd[2] = { 3, 5 }, wd[2] = { 4, 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 2, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	gc_check(&c, loom_mean(c.g, loom_linear(c.g, x, w, LOOM_NONE)), 1e-6);
	gc_fini(&c);
}

/* Exact values: d sum / dx = 1 and d mean / dx = 1/numel everywhere. */
static void case_sum_and_mean_exact(void)
{
	gc c;
	gc_init(&c, 73);
	int64_t xd[3] = { 2, 3, 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 3, xd);
	loom_value y = gc_param_new(&c, "y", FILL_UNIFORM, 3, xd);
	loom_value loss = loom_add(c.g, loom_sum(c.g, x), loom_mean(c.g, y));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	loom_program *p;
	cr_assert_eq(loom_compile(c.g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	double sx = 0, sy = 0;
	for (int i = 0; i < 2; i++) {
		fill(&c, &c.par[i]);
		loom_write_f64(p, c.par[i].v, c.par[i].val, 30);
	}
	for (int k = 0; k < 30; k++) {
		sx += c.par[0].val[k];
		sy += c.par[1].val[k];
	}
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	cr_assert_float_eq(loom_loss(p), sx + sy / 30, 1e-12);
	double gx[30], gy[30];
	cr_assert_eq(loom_read_grad_f64(p, x, gx, 30), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(p, y, gy, 30), LOOM_OK);
	for (int k = 0; k < 30; k++) {
		cr_assert_float_eq(gx[k], 1.0, 1e-15);
		cr_assert_float_eq(gy[k], 1.0 / 30, 1e-15);
	}
	loom_program_free(p);
	gc_fini(&c);
}

/* ------------------------------------------------ softmax cross-entropy */

static void case_softmax_cross_entropy(void)
{
	gc c;
	gc_init(&c, 81);
	int64_t ld[2] = { 5, 4 };
	loom_value logits = gc_param_new(&c, "logits", FILL_UNIFORM, 2, ld);
	int64_t yd[1] = { 5 };
	loom_value labels = loom_input(c.g, "labels", LOOM_I32, 1, yd);
	gc_labels(&c, "labels", 5, 4);
	gc_check(&c, loom_softmax_cross_entropy(c.g, logits, labels), 1e-6);
	gc_fini(&c);
}

/* Cross-entropy over a flattened view of a 4-d tensor, after a linear layer. */
static void case_softmax_cross_entropy_flattened(void)
{
	gc c;
	gc_init(&c, 82);
	int64_t xd[4] = { 3, 2, 3, 2 }, wd[2] = { 5, 12 }, bd[1] = { 5 }, yd[1] = { 3 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	loom_value b = gc_param_new(&c, "b", FILL_UNIFORM, 1, bd);
	loom_value labels = loom_input(c.g, "labels", LOOM_I32, 1, yd);
	gc_labels(&c, "labels", 3, 5);
	loom_value z = loom_linear(c.g, loom_flatten(c.g, x), w, b);
	gc_check(&c, loom_softmax_cross_entropy(c.g, z, labels), 1e-6);
	gc_fini(&c);
}

/* Large logits: the log-sum-exp must be stabilised or this overflows. */
static void case_softmax_cross_entropy_large_logits(void)
{
	gc c;
	gc_init(&c, 83);
	int64_t xd[2] = { 4, 3 }, wd[2] = { 6, 3 }, yd[1] = { 4 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 2, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	int64_t bd[1] = { 6 };
	loom_value b = loom_param(c.g, "big", LOOM_F64, 1, bd, LOOM_INIT_ZEROS, 0);
	loom_value labels = loom_input(c.g, "labels", LOOM_I32, 1, yd);
	gc_labels(&c, "labels", 4, 6);
	loom_value z = loom_linear(c.g, x, w, b);
	loom_value loss = loom_softmax_cross_entropy(c.g, z, labels);
	/* b is not checked numerically; it only shifts all logits by ~800. */
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	loom_program *p;
	cr_assert_eq(loom_compile(c.g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	double big[6] = { 800, 801, 799, 800.5, 802, 798 };
	cr_assert_eq(loom_write_f64(p, b, big, 6), LOOM_OK);
	for (int i = 0; i < 2; i++) {
		fill(&c, &c.par[i]);
		loom_write_f64(p, c.par[i].v, c.par[i].val, c.par[i].numel);
	}
	loom_set_input(p, "labels", c.in[0].data, LOOM_I32, 4);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	cr_assert(isfinite(loom_loss(p)), "loss %g", loom_loss(p));
	double gb[6], sum = 0;
	cr_assert_eq(loom_read_grad_f64(p, b, gb, 6), LOOM_OK);
	for (int i = 0; i < 6; i++) {
		cr_assert(isfinite(gb[i]));
		sum += gb[i];
	}
	/* Softmax minus one-hot sums to zero over classes. */
	cr_assert(fabs(sum) < 1e-12, "sum of dlogits %g", sum);
	loom_program_free(p);
	gc_fini(&c);
}

/* ------------------------------------------------------------------ chains */

static void case_convnet(void)
{
	gc c;
	gc_init(&c, 91);
	loom_test_convnet m = loom_test_convnet_build(c.g, LOOM_F64, 3, 8, 3, 4, 3);
	gc_adopt(&c, m.conv1_w, "conv1.weight", FILL_UNIFORM);
	gc_adopt(&c, m.conv1_b, "conv1.bias", FILL_UNIFORM);
	gc_adopt(&c, m.bn1_g, "bn1.weight", FILL_NEAR1);
	gc_adopt(&c, m.bn1_b, "bn1.bias", FILL_UNIFORM);
	gc_adopt(&c, m.conv2_w, "conv2.weight", FILL_UNIFORM);
	gc_adopt(&c, m.conv2_b, "conv2.bias", FILL_UNIFORM);
	gc_adopt(&c, m.bn2_g, "bn2.weight", FILL_NEAR1);
	gc_adopt(&c, m.bn2_b, "bn2.bias", FILL_UNIFORM);
	gc_adopt(&c, m.fc_w, "fc.weight", FILL_UNIFORM);
	gc_adopt(&c, m.fc_b, "fc.bias", FILL_UNIFORM);
	/* Batch norm removes any per-channel shift: a conv bias right before it
	 * has an exactly zero gradient, analytic and numeric. */
	c.par[1].expect_zero = 1;
	c.par[5].expect_zero = 1;
	gc_input_f64(&c, "image", 3 * 8 * 8);
	gc_labels(&c, "labels", 3, 3);
	gc_check(&c, m.loss, 1e-6);
	gc_fini(&c);
}

/* x + conv2(relu(bn(conv1(x)))): x feeds both the block and the shortcut, so
 * its gradient is the sum of two paths. */
static void case_residual_block(void)
{
	gc c;
	gc_init(&c, 92);
	int64_t xd[4] = { 2, 3, 5, 5 }, wd[4] = { 3, 3, 3, 3 }, cd[1] = { 3 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 4, xd);
	loom_value w1 = gc_param_new(&c, "w1", FILL_UNIFORM, 4, wd);
	loom_value gm = gc_param_new(&c, "gamma", FILL_NEAR1, 1, cd);
	loom_value bt = gc_param_new(&c, "beta", FILL_UNIFORM, 1, cd);
	loom_value w2 = gc_param_new(&c, "w2", FILL_UNIFORM, 4, wd);
	loom_value b2 = gc_param_new(&c, "b2", FILL_UNIFORM, 1, cd);
	loom_value rm = loom_buffer(c.g, "rm", LOOM_F64, 1, cd, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(c.g, "rv", LOOM_F64, 1, cd, LOOM_INIT_ONES);
	loom_value h = loom_conv2d(c.g, x, w1, LOOM_NONE, 1, 1);
	h = loom_relu(c.g, loom_batchnorm2d(c.g, h, gm, bt, rm, rv, 0.1, 1e-5));
	h = loom_conv2d(c.g, h, w2, b2, 1, 1);
	gc_check(&c, gc_project(&c, loom_add(c.g, x, h)), 1e-6);
	gc_fini(&c);
}

/* -------------------------------------------------------------------- cast */

/* The AMP pass's cast (no public builder): x f64 -> dt -> f64. The function
 * is linear in x with steps of dt's rounding, so a wide finite-difference
 * step h measures the slope within 2 * ulp(1) / (2 h) (rounding of x + h and
 * x - h), with no truncation error: 1e-2 and 0.25 keep that below 2e-5 for
 * f32 and below 2e-2 for bf16, while a missing or doubled gradient is off by
 * 100%. */
static void check_cast(loom_dtype dt, double h, double rtol, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t xd[2] = { 3, 7 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 2, xd);
	loom_shape s = loom_value_shape(c.g, x);
	loom_value lo = loom_node_add(c.g, LOOM_OP_CAST, dt, s, 1, &x);
	loom_value back = loom_node_add(c.g, LOOM_OP_CAST, LOOM_F64, s, 1, &lo);
	cr_assert_neq(back, LOOM_NONE, "%s", loom_graph_error(c.g));
	gc_check_h(&c, gc_project(&c, back), rtol, h);
	gc_fini(&c);
}

static void case_cast_through_f32(void)
{
	check_cast(LOOM_F32, 1e-2, 1e-4, 41);
}

static void case_cast_through_f16(void)
{
	check_cast(LOOM_F16, 0.25, 2e-2, 42);
}

static void case_cast_through_bf16(void)
{
	check_cast(LOOM_BF16, 0.25, 3e-2, 43);
}

/* ------------------------------------------------------------------- fp8 */

/* The AMP pass's fp8 rounding (graph/ops/fp8.c; no public builder) of x,
 * unflagged so that later handles keep their numbers. */
static loom_value fp8_qdq(gc *c, loom_value x, loom_dtype fwd, loom_dtype bwd)
{
	loom_value y = loom_fp8_qdq_node(c->g, x, fwd, bwd);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(c->g));
	c->g->nodes[y].flags &= ~(uint32_t)LOOM_NODE_AMP;
	return y;
}

/* v rounded as the CPU kernel does: amax, power-of-two scale, fp8 and back. */
static void qdq_ref(const double *x, double *y, size_t n, loom_dtype fmt)
{
	double amax = 0;
	for (size_t i = 0; i < n; i++)
		amax = fmax(amax, fabs(x[i]));
	float fm = fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
	double s = loom_fp8_scale((float)amax, fm);
	for (size_t i = 0; i < n; i++) {
		float q = (float)(x[i] * s);
		y[i] = (fmt == LOOM_FP8_E4M3 ? loom_e4m3_to_f32(loom_f32_to_e4m3(q)) :
					       loom_e5m2_to_f32(loom_f32_to_e5m2(q))) / s;
	}
}

/*
 * The backward's E5M2 rounding: forward the identity, so finite
 * differences see dy itself; the projection's weights, FP8 values (exact
 * in E5M2 at any power-of-two scale), make dy exactly representable and
 * the rounding the identity on it: the analytic gradient must match.
 */
static void case_fp8_qdq_grad_e5m2(void)
{
	gc c;
	gc_init(&c, 151);
	int64_t xd[2] = { 4, 6 }, rd[2] = { 1, 24 }, fd[2] = { 1, 24 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 2, xd);
	loom_value y = fp8_qdq(&c, x, LOOM_F32, LOOM_FP8_E5M2);
	loom_value r = gc_param_new(&c, "r", FILL_FP8, 2, rd);
	loom_value l = loom_sum(c.g, loom_linear(c.g, loom_reshape(c.g, y, 2, fd), r, LOOM_NONE));
	gc_check(&c, l, 1e-6);
	gc_fini(&c);
}

/*
 * The forward's E4M3 rounding is a step function (finite differences see
 * zero), trained straight through: x's gradient must be the projection's
 * weights r exactly, as without the rounding, and r's gradient the rounded
 * x, exactly qdq_ref's; at FP8 values x it is x itself. Then the E5M2
 * rounding of the gradient on weights that are not E5M2 values rounds.
 */
static void fp8_straight_through(int fp8_values, loom_dtype fwd, loom_dtype bwd, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	enum { N = 40 };
	int64_t xd[2] = { 5, 8 }, rd[2] = { 1, N };
	loom_value x = loom_param(c.g, "x", LOOM_F64, 2, xd, LOOM_INIT_ZEROS, 0);
	loom_value y = fp8_qdq(&c, x, fwd, bwd);
	loom_value r = loom_param(c.g, "r", LOOM_F64, 2, rd, LOOM_INIT_ZEROS, 0);
	loom_value l = loom_sum(c.g, loom_linear(c.g, loom_reshape(c.g, y, 2, rd), r, LOOM_NONE));
	cr_assert_eq(loom_graph_status(c.g), LOOM_OK, "%s", loom_graph_error(c.g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(c.g, l, &o, &p), LOOM_OK, "%s", loom_last_error());
	double xv[N], rv[N], gx[N], gr[N], want[N];
	gc_param px = { .fill = fp8_values ? FILL_FP8 : FILL_UNIFORM, .numel = N };
	gc_param pr = { .fill = FILL_UNIFORM, .numel = N };
	fill(&c, &px);
	fill(&c, &pr);
	memcpy(xv, px.val, sizeof(xv));
	memcpy(rv, pr.val, sizeof(rv));
	free(px.val);
	free(pr.val);
	cr_assert_eq(loom_write_f64(p, x, xv, N), LOOM_OK);
	cr_assert_eq(loom_write_f64(p, r, rv, N), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_grad_f64(p, x, gx, N), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(p, r, gr, N), LOOM_OK);
	if (fwd == LOOM_F32)
		memcpy(want, xv, sizeof(want));
	else
		qdq_ref(xv, want, N, fwd);
	int rounded = 0;
	for (int i = 0; i < N; i++) {
		cr_assert_eq(gr[i], want[i], "r's gradient %d: %.17g, the rounded x %.17g", i, gr[i],
			     want[i]);
		rounded += want[i] != xv[i];
		if (fp8_values)
			cr_assert_eq(gr[i], xv[i], "x %d, an FP8 value, moved: %.17g", i, gr[i]);
	}
	if (!fp8_values && fwd != LOOM_F32)
		cr_assert_gt(rounded, N / 2, "the rounding rounded only %d of %d", rounded, N);
	if (bwd == LOOM_F32)
		memcpy(want, rv, sizeof(want));
	else
		qdq_ref(rv, want, N, bwd);
	for (int i = 0; i < N; i++)
		cr_assert_eq(gx[i], want[i], "x's gradient %d: %.17g, want %.17g (r %.17g)", i, gx[i],
			     want[i], rv[i]);
	loom_program_free(p);
	gc_fini(&c);
}

static void case_fp8_qdq_e4m3_straight_through(void)
{
	fp8_straight_through(1, LOOM_FP8_E4M3, LOOM_F32, 152);
	fp8_straight_through(0, LOOM_FP8_E4M3, LOOM_F32, 153);
	fp8_straight_through(0, LOOM_FP8_E5M2, LOOM_F32, 154);
	fp8_straight_through(0, LOOM_F32, LOOM_FP8_E5M2, 155);
}

/* ------------------------------------------------------------ transformer */

/* 8 ids over a vocabulary of 5: some ids repeat (their rows' gradients
 * add), some never occur (zero rows, checked as such). */
static void case_embedding_repeated_ids(void)
{
	gc c;
	gc_init(&c, 101);
	int64_t td[2] = { 5, 3 }, id[2] = { 2, 4 };
	loom_value t = gc_param_new(&c, "table", FILL_UNIFORM, 2, td);
	loom_value ids = loom_input(c.g, "ids", LOOM_I32, 2, id);
	gc_input *in = &c.in[c.nin++];
	snprintf(in->name, sizeof(in->name), "ids");
	in->dt = LOOM_I32;
	in->count = 8;
	int32_t *d = malloc(8 * sizeof(*d));
	const int32_t ids_v[8] = { 3, 0, 3, 1, 0, 3, 1, 0 }; /* 2 and 4 unused */
	memcpy(d, ids_v, sizeof(ids_v));
	in->data = d;
	loom_value y = loom_embedding(c.g, ids, t);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(c.g));
	loom_shape s = loom_value_shape(c.g, y);
	cr_assert(s.ndim == 3 && s.dims[0] == 2 && s.dims[1] == 4 && s.dims[2] == 3);
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

/* GPT-2's weight tying: one table is the token embedding and the output
 * projection; its gradient is the sum of the scatter-add and the product. */
static void case_embedding_tied_output(void)
{
	gc c;
	gc_init(&c, 102);
	int64_t td[2] = { 6, 4 }, id[2] = { 2, 3 }, yd[1] = { 6 };
	loom_value t = gc_param_new(&c, "wte", FILL_UNIFORM, 2, td);
	loom_value ids = loom_input(c.g, "ids", LOOM_I32, 2, id);
	gc_labels(&c, "ids", 6, 6);
	loom_value labels = loom_input(c.g, "labels", LOOM_I32, 1, yd);
	gc_labels(&c, "labels", 6, 6);
	loom_value h = loom_embedding(c.g, ids, t);
	loom_value logits = loom_linear(c.g, h, t, LOOM_NONE); /* [2, 3, 6] */
	int64_t fd[2] = { 6, 6 };
	loom_value flat = loom_reshape(c.g, logits, 2, fd);
	gc_check(&c, loom_softmax_cross_entropy(c.g, flat, labels), 1e-6);
	gc_fini(&c);
}

static void case_layernorm_3d(void)
{
	gc c;
	gc_init(&c, 103);
	int64_t xd[3] = { 2, 3, 5 }, pd[1] = { 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 3, xd);
	loom_value gm = gc_param_new(&c, "gamma", FILL_NEAR1, 1, pd);
	loom_value bt = gc_param_new(&c, "beta", FILL_UNIFORM, 1, pd);
	gc_check(&c, gc_project(&c, loom_layernorm(c.g, x, gm, bt, 1e-5)), 1e-6);
	gc_fini(&c);
}

/* A row of 2 (the smallest with a variance) and a tiny eps. */
static void case_layernorm_2d_narrow(void)
{
	gc c;
	gc_init(&c, 104);
	int64_t xd[2] = { 4, 2 }, pd[1] = { 2 };
	loom_value x = gc_param_new(&c, "x", FILL_AWAY0, 2, xd);
	loom_value gm = gc_param_new(&c, "gamma", FILL_NEAR1, 1, pd);
	loom_value bt = gc_param_new(&c, "beta", FILL_UNIFORM, 1, pd);
	gc_check(&c, gc_project(&c, loom_layernorm(c.g, x, gm, bt, 1e-3)), 1e-6);
	gc_fini(&c);
}

static void case_rms_norm_3d(void)
{
	gc c;
	gc_init(&c, 113);
	int64_t xd[3] = { 2, 3, 5 }, pd[1] = { 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 3, xd);
	loom_value gm = gc_param_new(&c, "gamma", FILL_NEAR1, 1, pd);
	gc_check(&c, gc_project(&c, loom_rms_norm(c.g, x, gm, 1e-5)), 1e-6);
	gc_fini(&c);
}

/* A row of 2 and a large eps (its share of the denominator shows). */
static void case_rms_norm_2d_narrow(void)
{
	gc c;
	gc_init(&c, 114);
	int64_t xd[2] = { 4, 2 }, pd[1] = { 2 };
	loom_value x = gc_param_new(&c, "x", FILL_AWAY0, 2, xd);
	loom_value gm = gc_param_new(&c, "gamma", FILL_NEAR1, 1, pd);
	gc_check(&c, gc_project(&c, loom_rms_norm(c.g, x, gm, 0.5)), 1e-6);
	gc_fini(&c);
}

/* linear over the last dim of [B, T, C]: no reshape around it. */
static void case_linear_3d_bias(void)
{
	gc c;
	gc_init(&c, 105);
	int64_t xd[3] = { 2, 3, 4 }, wd[2] = { 5, 4 }, bd[1] = { 5 };
	loom_value x = gc_param_new(&c, "x", FILL_UNIFORM, 3, xd);
	loom_value w = gc_param_new(&c, "w", FILL_UNIFORM, 2, wd);
	loom_value b = gc_param_new(&c, "b", FILL_UNIFORM, 1, bd);
	loom_value y = loom_linear(c.g, x, w, b);
	loom_shape s = loom_value_shape(c.g, y);
	cr_assert(s.ndim == 3 && s.dims[2] == 5);
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

/* Causal self-attention over a qkv parameter [b, t, 3 * nh * hs]. */
static void check_attention(int b, int t, int nh, int hs, uint64_t seed)
{
	gc c;
	gc_init(&c, seed);
	int64_t qd[3] = { b, t, 3 * nh * hs };
	loom_value qkv = gc_param_new(&c, "qkv", FILL_UNIFORM, 3, qd);
	loom_value y = loom_causal_self_attention(c.g, qkv, nh);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(c.g));
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

static void case_attention_t1(void)
{
	check_attention(2, 1, 2, 3, 106); /* one position: only v matters */
}

static void case_attention_t4_h1(void)
{
	check_attention(1, 4, 1, 4, 107);
}

static void case_attention_t5_h3(void)
{
	check_attention(2, 5, 3, 2, 108);
}

/* The softmax half alone, read whole (masked entries included: they are
 * 0 whatever q and k are). */
static void case_attn_probs_t4_h2(void)
{
	gc c;
	gc_init(&c, 109);
	int64_t qd[3] = { 2, 4, 12 };
	loom_value qkv = gc_param_new(&c, "qkv", FILL_UNIFORM, 3, qd);
	loom_value p = loom_attention_probs(c.g, qkv, 2);
	cr_assert_neq(p, LOOM_NONE, "%s", loom_graph_error(c.g));
	loom_shape s = loom_value_shape(c.g, p);
	cr_assert(s.ndim == 4 && s.dims[1] == 2 && s.dims[2] == 4 && s.dims[3] == 4);
	/* q and k get a gradient, v none: qkv's v columns are checked as the
	 * zeros they must be by the finite differences too. */
	gc_check(&c, gc_project(&c, p), 1e-6);
	gc_fini(&c);
}

/* The product half with free probabilities (not a softmax): every entry
 * of P, above the diagonal too, has its gradient dy v^T. */
static void case_attention_free_probs(void)
{
	gc c;
	gc_init(&c, 110);
	int64_t qd[3] = { 2, 3, 12 }, pd[4] = { 2, 2, 3, 3 };
	loom_value qkv = gc_param_new(&c, "qkv", FILL_UNIFORM, 3, qd);
	loom_value p = gc_param_new(&c, "p", FILL_UNIFORM, 4, pd);
	loom_value y = loom_attention_apply(c.g, p, qkv, 2);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(c.g));
	gc_check(&c, gc_project(&c, y), 1e-6);
	gc_fini(&c);
}

/* One Test per row of tests/graph/gradcheck_cases.h: a new case is a
 * case_<name> function here and a row there, naming the op it checks. */
#define GRADCHECK_TEST(op, name) \
	Test(gradcheck, name) { case_##name(); }
LOOM_GRADCHECK_CASES(GRADCHECK_TEST)
