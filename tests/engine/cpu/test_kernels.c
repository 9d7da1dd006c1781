/*
 * tests/engine/cpu/test_kernels.c — the CPU kernels against naive fp64 loops
 * written here, on random data and awkward shapes (stride 2, padding,
 * non-square, batch 1, odd sizes), in f32 (loose bound) and f64 (tight).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "engine/cpu/kernels.h"
#include "graph/unary.h"

#define TOL_F32 1e-4
#define TOL_F64 1e-11

/* ---- data helpers ------------------------------------------------------ */

/* The same values in both precisions: doubles are rounded to float first so
 * that the f32 kernel and the fp64 reference see identical inputs. */
typedef struct buf {
	size_t n;
	double *d;
	float *f;
} buf;

static uint64_t rng_state = 88172645463325252ull;

static double urand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static buf buf_new(size_t n)
{
	buf b = {n, malloc((n ? n : 1) * sizeof(double)), malloc((n ? n : 1) * sizeof(float))};
	cr_assert(b.d && b.f);
	return b;
}

static buf buf_rand(size_t n, double lo, double hi)
{
	buf b = buf_new(n);
	for (size_t i = 0; i < n; i++) {
		b.f[i] = (float)(lo + (hi - lo) * urand());
		b.d[i] = b.f[i];
	}
	return b;
}

/* An output buffer full of NaN: a kernel that accumulates into its output or
 * skips an element instead of overwriting it shows up as NaN. */
static buf buf_nan(size_t n)
{
	buf b = buf_new(n);
	for (size_t i = 0; i < n; i++) {
		b.d[i] = NAN;
		b.f[i] = NAN;
	}
	return b;
}

static void buf_free(buf *b)
{
	free(b->d);
	free(b->f);
}

static double got_at(const buf *b, int dbl, size_t i)
{
	return dbl ? b->d[i] : (double)b->f[i];
}

/* Max abs error relative to max(1, max |ref|), against the precision's bound. */
static void expect_close(const char *what, int dbl, const buf *got, const double *ref,
			 size_t n)
{
	double scale = 1, err = 0;
	size_t worst = 0;
	for (size_t i = 0; i < n; i++)
		scale = fmax(scale, fabs(ref[i]));
	for (size_t i = 0; i < n; i++) {
		double e = fabs(got_at(got, dbl, i) - ref[i]);
		if (!(e <= err)) { /* also catches NaN */
			err = isnan(e) ? INFINITY : e;
			worst = i;
		}
	}
	double tol = dbl ? TOL_F64 : TOL_F32;
	cr_assert(err / scale <= tol,
		  "%s (%s): element %zu is %.10g, expected %.10g (rel err %.3g > %.3g)", what,
		  dbl ? "f64" : "f32", worst, got_at(got, dbl, worst), ref[worst],
		  err / scale, tol);
}

/* ---- convolution --------------------------------------------------------- */

static loom_conv_shape conv_shape(int n, int c_in, int h, int w, int c_out, int kh, int kw,
				  int stride, int pad)
{
	loom_conv_shape s = {n, c_in, h, w, c_out, kh, kw, stride, pad,
			     (h + 2 * pad - kh) / stride + 1, (w + 2 * pad - kw) / stride + 1};
	return s;
}

#define X_AT(s, n, c, i, j) ((((size_t)(n) * (s)->c_in + (c)) * (s)->h_in + (i)) * (s)->w_in + (j))
#define Y_AT(s, n, c, i, j) ((((size_t)(n) * (s)->c_out + (c)) * (s)->h_out + (i)) * (s)->w_out + (j))
#define W_AT(s, o, c, i, j) ((((size_t)(o) * (s)->c_in + (c)) * (s)->kh + (i)) * (s)->kw + (j))

/* Visits every (output, input, weight) triple the convolution touches once;
 * forward, both adjoints are this loop with a different body. */
#define CONV_FOR_EACH(s, body)                                                          \
	for (int n_ = 0; n_ < (s)->n; n_++)                                             \
		for (int o_ = 0; o_ < (s)->c_out; o_++)                                 \
			for (int oh_ = 0; oh_ < (s)->h_out; oh_++)                      \
				for (int ow_ = 0; ow_ < (s)->w_out; ow_++)              \
					for (int c_ = 0; c_ < (s)->c_in; c_++)          \
						for (int ki_ = 0; ki_ < (s)->kh; ki_++) \
							for (int kj_ = 0; kj_ < (s)->kw; kj_++) { \
								int ih_ = oh_ * (s)->stride - (s)->pad + ki_; \
								int iw_ = ow_ * (s)->stride - (s)->pad + kj_; \
								if (ih_ < 0 || ih_ >= (s)->h_in || iw_ < 0 || iw_ >= (s)->w_in) \
									continue;         \
								size_t yi = Y_AT(s, n_, o_, oh_, ow_); \
								size_t xi = X_AT(s, n_, c_, ih_, iw_); \
								size_t wi = W_AT(s, o_, c_, ki_, kj_); \
								body;                     \
							}

static void ref_conv_fwd(const loom_conv_shape *s, const double *x, const double *w,
			 const double *b, double *y)
{
	size_t ny = (size_t)s->n * s->c_out * s->h_out * s->w_out;
	size_t plane = (size_t)s->h_out * s->w_out;
	for (size_t i = 0; i < ny; i++)
		y[i] = b ? b[(i / plane) % s->c_out] : 0;
	CONV_FOR_EACH(s, y[yi] += x[xi] * w[wi]);
}

static void ref_conv_bwd_data(const loom_conv_shape *s, const double *dy, const double *w,
			      double *dx)
{
	memset(dx, 0, sizeof(double) * s->n * s->c_in * s->h_in * s->w_in);
	CONV_FOR_EACH(s, dx[xi] += dy[yi] * w[wi]);
}

static void ref_conv_bwd_filter(const loom_conv_shape *s, const double *dy, const double *x,
				double *dw)
{
	memset(dw, 0, sizeof(double) * s->c_out * s->c_in * s->kh * s->kw);
	CONV_FOR_EACH(s, dw[wi] += dy[yi] * x[xi]);
}

static void check_conv(loom_conv_shape s, int with_bias)
{
	size_t nx = (size_t)s.n * s.c_in * s.h_in * s.w_in;
	size_t ny = (size_t)s.n * s.c_out * s.h_out * s.w_out;
	size_t nw = (size_t)s.c_out * s.c_in * s.kh * s.kw;
	buf x = buf_rand(nx, -1, 1), w = buf_rand(nw, -1, 1), b = buf_rand(s.c_out, -1, 1);
	buf dy = buf_rand(ny, -1, 1);
	double *ry = malloc(ny * sizeof(double)), *rdx = malloc(nx * sizeof(double));
	double *rdw = malloc(nw * sizeof(double));
	char what[160];

	ref_conv_fwd(&s, x.d, w.d, with_bias ? b.d : NULL, ry);
	ref_conv_bwd_data(&s, dy.d, w.d, rdx);
	ref_conv_bwd_filter(&s, dy.d, x.d, rdw);
	snprintf(what, sizeof what, "n%d c%d %dx%d -> c%d k%dx%d s%d p%d%s", s.n, s.c_in, s.h_in,
		 s.w_in, s.c_out, s.kh, s.kw, s.stride, s.pad, with_bias ? " bias" : "");

	for (int dbl = 0; dbl < 2; dbl++) {
		void *ws = malloc(loom_cpu_conv2d_workspace(&s, dbl ? 8 : 4) + 1);
		buf y = buf_nan(ny), dx = buf_nan(nx), dw = buf_nan(nw);
		char msg[200];
		if (dbl) {
			loom_cpu_conv2d_fwd_f64(&s, x.d, w.d, with_bias ? b.d : NULL, y.d, ws);
			loom_cpu_conv2d_bwd_data_f64(&s, dy.d, w.d, dx.d, ws);
			loom_cpu_conv2d_bwd_filter_f64(&s, dy.d, x.d, dw.d, ws);
		} else {
			loom_cpu_conv2d_fwd_f32(&s, x.f, w.f, with_bias ? b.f : NULL, y.f, ws);
			loom_cpu_conv2d_bwd_data_f32(&s, dy.f, w.f, dx.f, ws);
			loom_cpu_conv2d_bwd_filter_f32(&s, dy.f, x.f, dw.f, ws);
		}
		snprintf(msg, sizeof msg, "conv fwd %s", what);
		expect_close(msg, dbl, &y, ry, ny);
		snprintf(msg, sizeof msg, "conv bwd_data %s", what);
		expect_close(msg, dbl, &dx, rdx, nx);
		snprintf(msg, sizeof msg, "conv bwd_filter %s", what);
		expect_close(msg, dbl, &dw, rdw, nw);
		buf_free(&y), buf_free(&dx), buf_free(&dw);
		free(ws);
	}
	buf_free(&x), buf_free(&w), buf_free(&b), buf_free(&dy);
	free(ry), free(rdx), free(rdw);
}

Test(conv, square_stride1_pad)
{
	check_conv(conv_shape(2, 3, 7, 7, 4, 3, 3, 1, 1), 1);
}

Test(conv, non_square_odd)
{
	check_conv(conv_shape(3, 3, 7, 9, 5, 3, 3, 1, 1), 0);
	check_conv(conv_shape(2, 3, 9, 7, 2, 3, 2, 2, 0), 1);
}

Test(conv, stride2_batch1)
{
	check_conv(conv_shape(1, 2, 8, 8, 3, 3, 3, 2, 1), 1);
	check_conv(conv_shape(1, 2, 5, 5, 3, 3, 3, 3, 2), 0);
}

Test(conv, even_kernel_stride2_many_images)
{
	check_conv(conv_shape(7, 3, 6, 6, 7, 4, 4, 2, 1), 1);
}

Test(conv, pointwise)
{
	check_conv(conv_shape(3, 4, 5, 6, 5, 1, 1, 1, 0), 1);
	check_conv(conv_shape(2, 4, 5, 6, 5, 1, 1, 2, 0), 0);
}

Test(conv, convnet_layers)
{
	check_conv(conv_shape(3, 1, 28, 28, 16, 5, 5, 1, 2), 1);
	check_conv(conv_shape(3, 16, 14, 14, 32, 5, 5, 1, 2), 1);
}

/* bwd_data and bwd_filter are the adjoints of the forward: for any x, w, dy,
 * <conv(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_filter(dy, x)>. */
Test(conv, adjoint_identity_f64)
{
	loom_conv_shape s = conv_shape(3, 2, 9, 8, 3, 3, 5, 2, 2);
	size_t nx = (size_t)s.n * s.c_in * s.h_in * s.w_in;
	size_t ny = (size_t)s.n * s.c_out * s.h_out * s.w_out;
	size_t nw = (size_t)s.c_out * s.c_in * s.kh * s.kw;
	buf x = buf_rand(nx, -1, 1), w = buf_rand(nw, -1, 1), dy = buf_rand(ny, -1, 1);
	double *y = malloc(ny * 8), *dx = malloc(nx * 8), *dw = malloc(nw * 8);
	void *ws = malloc(loom_cpu_conv2d_workspace(&s, 8));
	loom_cpu_conv2d_fwd_f64(&s, x.d, w.d, NULL, y, ws);
	loom_cpu_conv2d_bwd_data_f64(&s, dy.d, w.d, dx, ws);
	loom_cpu_conv2d_bwd_filter_f64(&s, dy.d, x.d, dw, ws);
	double a = 0, b = 0, c = 0;
	for (size_t i = 0; i < ny; i++)
		a += y[i] * dy.d[i];
	for (size_t i = 0; i < nx; i++)
		b += x.d[i] * dx[i];
	for (size_t i = 0; i < nw; i++)
		c += w.d[i] * dw[i];
	cr_assert(fabs(a - b) <= 1e-10 * fabs(a) && fabs(a - c) <= 1e-10 * fabs(a),
		  "<y,dy> %.15g, <x,dx> %.15g, <w,dw> %.15g", a, b, c);
	buf_free(&x), buf_free(&w), buf_free(&dy);
	free(y), free(dx), free(dw), free(ws);
}

/* ---- batch norm ---------------------------------------------------------- */

static size_t nchw(int n, int c, int64_t hw, int i, int ch, int64_t j)
{
	return ((size_t)i * c + ch) * hw + j;
}

static void ref_bn_stats(int n, int c, int64_t hw, const double *x, int ch, double *mean,
			 double *var)
{
	double m = (double)n * hw, s = 0, q = 0;
	for (int i = 0; i < n; i++)
		for (int64_t j = 0; j < hw; j++)
			s += x[nchw(n, c, hw, i, ch, j)];
	for (int i = 0; i < n; i++)
		for (int64_t j = 0; j < hw; j++) {
			double d = x[nchw(n, c, hw, i, ch, j)] - s / m;
			q += d * d;
		}
	*mean = s / m;
	*var = q / m;
}

static void check_bn(int n, int c, int64_t hw)
{
	const double eps = 1e-5, mom = 0.1;
	size_t nx = (size_t)n * c * hw;
	/* A mean well away from 0 catches one-pass variance formulas. */
	buf x = buf_rand(nx, 2, 5), dy = buf_rand(nx, -1, 1);
	buf g = buf_rand(c, 0.5, 1.5), be = buf_rand(c, -1, 1);
	buf rm0 = buf_rand(c, -1, 1), rv0 = buf_rand(c, 0.5, 2);
	double *ry = malloc(nx * 8), *rdx = malloc(nx * 8), *rye = malloc(nx * 8);
	double *rdg = malloc(c * 8), *rdb = malloc(c * 8), *rrm = malloc(c * 8),
	       *rrv = malloc(c * 8);
	double m = (double)n * hw;

	for (int ch = 0; ch < c; ch++) {
		double mean, var, sdy = 0, sdyxh = 0;
		ref_bn_stats(n, c, hw, x.d, ch, &mean, &var);
		double istd = 1 / sqrt(var + eps);
		double istde = 1 / sqrt(rv0.d[ch] + eps);
		for (int i = 0; i < n; i++)
			for (int64_t j = 0; j < hw; j++) {
				size_t k = nchw(n, c, hw, i, ch, j);
				double xh = (x.d[k] - mean) * istd;
				ry[k] = xh * g.d[ch] + be.d[ch];
				rye[k] = (x.d[k] - rm0.d[ch]) * istde * g.d[ch] + be.d[ch];
				sdy += dy.d[k];
				sdyxh += dy.d[k] * xh;
			}
		for (int i = 0; i < n; i++)
			for (int64_t j = 0; j < hw; j++) {
				size_t k = nchw(n, c, hw, i, ch, j);
				double xh = (x.d[k] - mean) * istd;
				rdx[k] = g.d[ch] * istd / m * (m * dy.d[k] - sdy - xh * sdyxh);
			}
		rdg[ch] = sdyxh;
		rdb[ch] = sdy;
		rrm[ch] = (1 - mom) * rm0.d[ch] + mom * mean;
		rrv[ch] = (1 - mom) * rv0.d[ch] + mom * var * m / (m - 1);
	}

	for (int dbl = 0; dbl < 2; dbl++) {
		buf y = buf_nan(nx), ye = buf_nan(nx), dx = buf_nan(nx);
		buf dg = buf_nan(c), db = buf_nan(c), rm = buf_new(c), rv = buf_new(c);
		memcpy(rm.d, rm0.d, c * 8), memcpy(rv.d, rv0.d, c * 8);
		memcpy(rm.f, rm0.f, c * 4), memcpy(rv.f, rv0.f, c * 4);
		if (dbl) {
			loom_cpu_bn_fwd_train_f64(n, c, hw, x.d, g.d, be.d, rm.d, rv.d, mom, eps, y.d);
			loom_cpu_bn_fwd_eval_f64(n, c, hw, x.d, g.d, be.d, rm0.d, rv0.d, eps, ye.d);
			loom_cpu_bn_bwd_data_f64(n, c, hw, x.d, g.d, dy.d, eps, dx.d);
			loom_cpu_bn_bwd_gamma_f64(n, c, hw, x.d, dy.d, eps, dg.d);
			loom_cpu_channel_sum_f64(n, c, hw, dy.d, db.d);
		} else {
			loom_cpu_bn_fwd_train_f32(n, c, hw, x.f, g.f, be.f, rm.f, rv.f, mom, eps, y.f);
			loom_cpu_bn_fwd_eval_f32(n, c, hw, x.f, g.f, be.f, rm0.f, rv0.f, eps, ye.f);
			loom_cpu_bn_bwd_data_f32(n, c, hw, x.f, g.f, dy.f, eps, dx.f);
			loom_cpu_bn_bwd_gamma_f32(n, c, hw, x.f, dy.f, eps, dg.f);
			loom_cpu_channel_sum_f32(n, c, hw, dy.f, db.f);
		}
		expect_close("bn fwd train", dbl, &y, ry, nx);
		expect_close("bn fwd eval", dbl, &ye, rye, nx);
		expect_close("bn bwd data", dbl, &dx, rdx, nx);
		expect_close("bn dgamma", dbl, &dg, rdg, c);
		expect_close("bn dbeta (channel sum)", dbl, &db, rdb, c);
		expect_close("bn running mean", dbl, &rm, rrm, c);
		expect_close("bn running var", dbl, &rv, rrv, c);
		buf_free(&y), buf_free(&ye), buf_free(&dx), buf_free(&dg), buf_free(&db);
		buf_free(&rm), buf_free(&rv);
	}
	buf_free(&x), buf_free(&dy), buf_free(&g), buf_free(&be), buf_free(&rm0), buf_free(&rv0);
	free(ry), free(rdx), free(rye), free(rdg), free(rdb), free(rrm), free(rrv);
}

Test(bn, shapes)
{
	check_bn(4, 3, 25);
	check_bn(1, 5, 49);
	check_bn(7, 2, 1);
	check_bn(100, 16, 784); /* big enough for the parallel path */
}

Test(bn, running_stats_exact)
{
	/* One channel, values 1..4: mean 2.5, biased var 1.25, unbiased 5/3. */
	double x[4] = {1, 2, 3, 4}, y[4], rm = 0, rv = 1;
	loom_cpu_bn_fwd_train_f64(2, 1, 2, x, NULL, NULL, &rm, &rv, 0.1, 0, y);
	cr_assert_float_eq(rm, 0.25, 1e-15);
	cr_assert_float_eq(rv, 0.9 + 0.1 * 5.0 / 3.0, 1e-15);
	cr_assert_float_eq(y[0], -1.5 / sqrt(1.25), 1e-15, "normalised with the biased var");
}

/* The three kernels apart, the one kernel with and without its siblings'
 * outputs, then a byte comparison of each result, for one element type
 * (check_bn_bwd_same_bits's locals). */
#define BN_BWD_SAME_BITS(SFX, F, SZ)                                                        \
	do {                                                                                 \
		loom_cpu_bn_bwd_data_##SFX(n, c, hw, x.F, g.F, dy.F, 1e-5, dx.F);               \
		loom_cpu_bn_bwd_gamma_##SFX(n, c, hw, x.F, dy.F, 1e-5, dg.F);                   \
		loom_cpu_channel_sum_##SFX(n, c, hw, dy.F, db.F);                               \
		loom_cpu_bn_bwd_##SFX(n, c, hw, x.F, g.F, dy.F, 1e-5, dx1.F, dg1.F, db1.F);     \
		loom_cpu_bn_bwd_##SFX(n, c, hw, x.F, g.F, dy.F, 1e-5, dx2.F, NULL, NULL);       \
		cr_assert(!memcmp(dx.F, dx1.F, nx * SZ) && !memcmp(dx.F, dx2.F, nx * SZ),       \
			  #SFX " dx %dx%dx%ld", n, c, (long)hw);                                \
		cr_assert(!memcmp(dg.F, dg1.F, c * SZ), #SFX " dgamma %dx%dx%ld", n, c,         \
			  (long)hw);                                                            \
		cr_assert(!memcmp(db.F, db1.F, c * SZ), #SFX " dbeta %dx%dx%ld", n, c,          \
			  (long)hw);                                                            \
	} while (0)

/* loom_cpu_bn_bwd makes dx, dgamma and dbeta from one set of sums; each
 * must equal, bit for bit, what the three kernels make apart (the CPU
 * backend swaps one for the other, and the golden steps are exact). */
static void check_bn_bwd_same_bits(int n, int c, int64_t hw)
{
	size_t nx = (size_t)n * c * hw;
	buf x = buf_rand(nx, -3, 7), dy = buf_rand(nx, -1, 1), g = buf_rand(c, 0.5, 1.5);
	for (int dbl = 0; dbl < 2; dbl++) {
		buf dx = buf_nan(nx), dg = buf_nan(c), db = buf_nan(c);
		buf dx1 = buf_nan(nx), dg1 = buf_nan(c), db1 = buf_nan(c), dx2 = buf_nan(nx);
		if (dbl)
			BN_BWD_SAME_BITS(f64, d, 8);
		else
			BN_BWD_SAME_BITS(f32, f, 4);
		buf_free(&dx), buf_free(&dg), buf_free(&db);
		buf_free(&dx1), buf_free(&dg1), buf_free(&db1), buf_free(&dx2);
	}
	buf_free(&x), buf_free(&dy), buf_free(&g);
}

Test(bn, bwd_one_pass_same_bits)
{
	check_bn_bwd_same_bits(4, 3, 25);
	check_bn_bwd_same_bits(7, 2, 1);
	check_bn_bwd_same_bits(3, 5, 13);
	check_bn_bwd_same_bits(2, 3, 1500); /* a block of 1024 and a ragged one */
	check_bn_bwd_same_bits(100, 32, 196); /* the ConvNet's, in parallel */
	check_bn_bwd_same_bits(100, 16, 784);
}

/* The backward against a finite difference of L = sum dy * bn(x). */
Test(bn, bwd_finite_difference_f64)
{
	const int n = 3, c = 2, hw = 5;
	const double eps = 1e-5, h = 1e-6;
	buf x = buf_rand(n * c * hw, -2, 2), dy = buf_rand(n * c * hw, -1, 1);
	double g[2] = {0.7, 1.3}, be[2] = {0.1, -0.2}, y[30], dx[30];
	loom_cpu_bn_bwd_data_f64(n, c, hw, x.d, g, dy.d, eps, dx);
	for (int k = 0; k < n * c * hw; k += 7) {
		double lp = 0, lm = 0, keep = x.d[k];
		x.d[k] = keep + h;
		loom_cpu_bn_fwd_train_f64(n, c, hw, x.d, g, be, NULL, NULL, 0.1, eps, y);
		for (int i = 0; i < n * c * hw; i++)
			lp += dy.d[i] * y[i];
		x.d[k] = keep - h;
		loom_cpu_bn_fwd_train_f64(n, c, hw, x.d, g, be, NULL, NULL, 0.1, eps, y);
		for (int i = 0; i < n * c * hw; i++)
			lm += dy.d[i] * y[i];
		x.d[k] = keep;
		cr_assert_float_eq(dx[k], (lp - lm) / (2 * h), 1e-6, "dx[%d]", k);
	}
	buf_free(&x), buf_free(&dy);
}

/* ---- max pooling --------------------------------------------------------- */

static loom_pool_shape pool_shape(int n, int c, int h, int w, int k, int stride, int pad)
{
	loom_pool_shape s = {n, c, h, w, k, stride, pad, (h + 2 * pad - k) / stride + 1,
			     (w + 2 * pad - k) / stride + 1};
	return s;
}

/* Naive pool: argmax over the clipped window, strict '>' in row-major order. */
static void ref_pool(const loom_pool_shape *s, const double *x, const double *dy, double *y,
		     double *dx)
{
	size_t in = (size_t)s->h_in * s->w_in, out = (size_t)s->h_out * s->w_out;
	memset(dx, 0, sizeof(double) * s->n * s->c * in);
	for (size_t p = 0; p < (size_t)s->n * s->c; p++)
		for (int oh = 0; oh < s->h_out; oh++)
			for (int ow = 0; ow < s->w_out; ow++) {
				double best = -INFINITY;
				long at = -1;
				for (int i = 0; i < s->k; i++)
					for (int j = 0; j < s->k; j++) {
						int ih = oh * s->stride - s->pad + i;
						int iw = ow * s->stride - s->pad + j;
						if (ih < 0 || ih >= s->h_in || iw < 0 || iw >= s->w_in)
							continue;
						double v = x[p * in + (size_t)ih * s->w_in + iw];
						if (at < 0 || v > best)
							best = v, at = (long)ih * s->w_in + iw;
					}
				y[p * out + (size_t)oh * s->w_out + ow] = best;
				dx[p * in + at] += dy[p * out + (size_t)oh * s->w_out + ow];
			}
}

static void run_pool(const loom_pool_shape *s, int dbl, const buf *x, const buf *dy, buf *y,
		     buf *dx)
{
	if (dbl) {
		loom_cpu_maxpool2d_fwd_f64(s, x->d, y->d);
		loom_cpu_maxpool2d_bwd_f64(s, x->d, dy->d, dx->d);
	} else {
		loom_cpu_maxpool2d_fwd_f32(s, x->f, y->f);
		loom_cpu_maxpool2d_bwd_f32(s, x->f, dy->f, dx->f);
	}
}

static void check_pool(loom_pool_shape s, double lo, double hi, int quantise)
{
	size_t nx = (size_t)s.n * s.c * s.h_in * s.w_in, ny = (size_t)s.n * s.c * s.h_out * s.w_out;
	buf x = buf_rand(nx, lo, hi), dy = buf_rand(ny, -1, 1);
	/* Few distinct values: many ties, which must go to the first element. */
	if (quantise)
		for (size_t i = 0; i < nx; i++)
			x.f[i] = (float)(x.d[i] = floor(x.d[i]));
	double *ry = malloc(ny * 8), *rdx = malloc(nx * 8);
	ref_pool(&s, x.d, dy.d, ry, rdx);
	for (int dbl = 0; dbl < 2; dbl++) {
		buf y = buf_nan(ny), dx = buf_nan(nx);
		run_pool(&s, dbl, &x, &dy, &y, &dx);
		expect_close("maxpool fwd", dbl, &y, ry, ny);
		expect_close("maxpool bwd", dbl, &dx, rdx, nx);
		buf_free(&y), buf_free(&dx);
	}
	buf_free(&x), buf_free(&dy);
	free(ry), free(rdx);
}

/* The fused relu + pool against relu, then pool, then relu's backward. */
static void check_relu_pool(loom_pool_shape s, int quantise)
{
	size_t nx = (size_t)s.n * s.c * s.h_in * s.w_in, ny = (size_t)s.n * s.c * s.h_out * s.w_out;
	buf x = buf_rand(nx, -1, 1), dy = buf_rand(ny, -1, 1);
	if (quantise) /* many ties and many windows that are all <= 0 */
		for (size_t i = 0; i < nx; i++)
			x.f[i] = (float)(x.d[i] = floor(2 * x.d[i]) / 2);
	double *rx = malloc(nx * 8), *ry = malloc(ny * 8), *rdx = malloc(nx * 8);
	for (size_t i = 0; i < nx; i++)
		rx[i] = x.d[i] > 0 ? x.d[i] : 0;
	ref_pool(&s, rx, dy.d, ry, rdx);
	for (size_t i = 0; i < nx; i++)
		rdx[i] = x.d[i] > 0 ? rdx[i] : 0;
	s.relu = 1;
	for (int dbl = 0; dbl < 2; dbl++) {
		buf y = buf_nan(ny), dx = buf_nan(nx);
		run_pool(&s, dbl, &x, &dy, &y, &dx);
		expect_close("relu+maxpool fwd", dbl, &y, ry, ny);
		expect_close("relu+maxpool bwd", dbl, &dx, rdx, nx);
		buf_free(&y), buf_free(&dx);
	}
	buf_free(&x), buf_free(&dy);
	free(rx), free(ry), free(rdx);
}

Test(pool, fused_relu_equals_relu_then_pool)
{
	check_relu_pool(pool_shape(2, 3, 8, 8, 2, 2, 0), 0);
	check_relu_pool(pool_shape(2, 3, 8, 8, 2, 2, 0), 1);
	check_relu_pool(pool_shape(1, 2, 7, 9, 2, 2, 0), 1);
	check_relu_pool(pool_shape(2, 2, 7, 6, 3, 2, 1), 1);
	check_relu_pool(pool_shape(100, 32, 14, 14, 2, 2, 0), 0);
}

Test(pool, shapes)
{
	check_pool(pool_shape(2, 3, 8, 8, 2, 2, 0), -1, 1, 0);
	check_pool(pool_shape(1, 2, 7, 9, 2, 2, 0), -1, 1, 0); /* odd: last row/col unread */
	check_pool(pool_shape(2, 2, 7, 6, 3, 2, 1), -1, 1, 0);
	check_pool(pool_shape(1, 3, 5, 5, 3, 1, 1), -1, 1, 0);
	check_pool(pool_shape(3, 2, 6, 5, 2, 1, 0), -1, 1, 0);
	check_pool(pool_shape(100, 16, 28, 28, 2, 2, 0), -1, 1, 0);
}

Test(pool, ties_go_to_first)
{
	check_pool(pool_shape(2, 3, 8, 8, 2, 2, 0), 0, 3, 1);
	check_pool(pool_shape(2, 3, 9, 7, 3, 2, 1), 0, 3, 1);
	check_pool(pool_shape(2, 3, 6, 6, 3, 1, 1), 0, 2, 1);

	/* And explicitly: a constant plane sends each window's gradient to its
	 * top-left element. */
	for (int dbl = 0; dbl < 2; dbl++) {
		loom_pool_shape s = pool_shape(1, 1, 4, 4, 2, 2, 0);
		buf x = buf_new(16), dy = buf_new(4), y = buf_nan(4), dx = buf_nan(16);
		for (int i = 0; i < 16; i++)
			x.d[i] = x.f[i] = 7;
		for (int i = 0; i < 4; i++)
			dy.d[i] = dy.f[i] = i + 1;
		run_pool(&s, dbl, &x, &dy, &y, &dx);
		for (int i = 0; i < 16; i++) {
			int r = i / 4, c = i % 4;
			double want = (r % 2 == 0 && c % 2 == 0) ? (r / 2) * 2 + c / 2 + 1 : 0;
			cr_assert_eq(got_at(&dx, dbl, i), want, "dx[%d] = %g, want %g", i,
				     got_at(&dx, dbl, i), want);
		}
		buf_free(&x), buf_free(&dy), buf_free(&y), buf_free(&dx);
	}
}

Test(pool, nan_wins_in_forward_and_backward)
{
	/* A NaN anywhere in a 2x2 window is its max (PyTorch), and gets the
	 * window's gradient; the other windows keep the fast path's answer. */
	for (int dbl = 0; dbl < 2; dbl++) {
		for (int at = 0; at < 4; at++) {
			loom_pool_shape s = pool_shape(1, 1, 4, 4, 2, 2, 0);
			buf x = buf_new(16), dy = buf_new(4), y = buf_nan(4), dx = buf_nan(16);
			for (int i = 0; i < 16; i++)
				x.d[i] = x.f[i] = i;
			int r = at / 2, c = at % 2; /* NaN at this spot of window 0 */
			x.d[r * 4 + c] = x.f[r * 4 + c] = NAN;
			for (int i = 0; i < 4; i++)
				dy.d[i] = dy.f[i] = i + 1;
			run_pool(&s, dbl, &x, &dy, &y, &dx);
			cr_assert(isnan(got_at(&y, dbl, 0)), "window 0 max is NaN");
			for (int i = 0; i < 16; i++) {
				int ir = i / 4, ic = i % 4;
				double want = 0;
				if (ir < 2 && ic < 2)
					want = (ir == r && ic == c) ? 1 : 0;
				else if (ir % 2 == 1 && ic % 2 == 1) /* the max of an increasing window */
					want = (ir / 2) * 2 + ic / 2 + 1;
				cr_assert_eq(got_at(&dx, dbl, i), want, "NaN at %d: dx[%d] = %g, want %g",
					     at, i, got_at(&dx, dbl, i), want);
			}
			buf_free(&x), buf_free(&dy), buf_free(&y), buf_free(&dx);
		}
	}
}

Test(pool, padding_never_wins)
{
	/* All inputs negative: a zero-padded max would return 0 on the border. */
	for (int dbl = 0; dbl < 2; dbl++) {
		loom_pool_shape s = pool_shape(2, 2, 5, 6, 3, 2, 1);
		size_t nx = 2 * 2 * 30, ny = (size_t)2 * 2 * s.h_out * s.w_out;
		buf x = buf_rand(nx, -3, -1), dy = buf_rand(ny, 1, 2);
		buf y = buf_nan(ny), dx = buf_nan(nx);
		run_pool(&s, dbl, &x, &dy, &y, &dx);
		double gsum = 0, dsum = 0;
		for (size_t i = 0; i < ny; i++) {
			cr_assert(got_at(&y, dbl, i) < -0.99, "y[%zu] = %g", i, got_at(&y, dbl, i));
			dsum += dy.d[i];
		}
		for (size_t i = 0; i < nx; i++)
			gsum += got_at(&dx, dbl, i);
		cr_assert_float_eq(gsum, dsum, 1e-4, "all of dy lands on real inputs");
		buf_free(&x), buf_free(&dy), buf_free(&y), buf_free(&dx);
	}
}

/* ---- dense ---------------------------------------------------------------- */

static void check_gemm(int ta, int tb, int m, int n, int k, double alpha, double beta)
{
	buf a = buf_rand((size_t)m * k, -1, 1), b = buf_rand((size_t)k * n, -1, 1);
	buf c = buf_rand((size_t)m * n, -1, 1);
	double *ref = malloc((size_t)m * n * 8);
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0;
			for (int l = 0; l < k; l++)
				s += (ta ? a.d[(size_t)l * m + i] : a.d[(size_t)i * k + l]) *
				     (tb ? b.d[(size_t)j * k + l] : b.d[(size_t)l * n + j]);
			ref[(size_t)i * n + j] = alpha * s + beta * c.d[(size_t)i * n + j];
		}
	loom_cpu_gemm_f64(ta, tb, m, n, k, alpha, a.d, b.d, beta, c.d);
	loom_cpu_gemm_f32(ta, tb, m, n, k, alpha, a.f, b.f, beta, c.f);
	expect_close("gemm", 1, &c, ref, (size_t)m * n);
	expect_close("gemm", 0, &c, ref, (size_t)m * n);
	buf_free(&a), buf_free(&b), buf_free(&c);
	free(ref);
}

Test(dense, gemm_all_transposes)
{
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			check_gemm(ta, tb, 7, 5, 3, 1, 0);
			check_gemm(ta, tb, 13, 17, 31, 0.5, 0.25);
			check_gemm(ta, tb, 1, 9, 4, -2, 1);
		}
}

Test(dense, linear_fwd)
{
	const int n = 5, in = 13, out = 7;
	buf x = buf_rand(n * in, -1, 1), w = buf_rand(out * in, -1, 1), b = buf_rand(out, -1, 1);
	double ref[35], refnb[35];
	for (int i = 0; i < n; i++)
		for (int o = 0; o < out; o++) {
			double s = 0;
			for (int l = 0; l < in; l++)
				s += x.d[i * in + l] * w.d[o * in + l];
			refnb[i * out + o] = s;
			ref[i * out + o] = s + b.d[o];
		}
	for (int dbl = 0; dbl < 2; dbl++) {
		buf y = buf_nan(n * out), ynb = buf_nan(n * out);
		if (dbl) {
			loom_cpu_linear_fwd_f64(n, in, out, x.d, w.d, b.d, y.d);
			loom_cpu_linear_fwd_f64(n, in, out, x.d, w.d, NULL, ynb.d);
		} else {
			loom_cpu_linear_fwd_f32(n, in, out, x.f, w.f, b.f, y.f);
			loom_cpu_linear_fwd_f32(n, in, out, x.f, w.f, NULL, ynb.f);
		}
		expect_close("linear fwd", dbl, &y, ref, n * out);
		expect_close("linear fwd, no bias", dbl, &ynb, refnb, n * out);
		buf_free(&y), buf_free(&ynb);
	}
	buf_free(&x), buf_free(&w), buf_free(&b);
}

Test(dense, softmax_ce)
{
	const int n = 6, k = 5;
	/* Large logits: a softmax without the max subtracted overflows. */
	buf lg = buf_rand(n * k, -50, 120);
	int32_t labels[6] = {0, 4, 2, 2, 1, 3};
	double ref_loss = 0, ref_d[30], dloss = 2.5;
	for (int i = 0; i < n; i++) {
		double mx = -INFINITY, s = 0;
		for (int j = 0; j < k; j++)
			mx = fmax(mx, lg.d[i * k + j]);
		for (int j = 0; j < k; j++)
			s += exp(lg.d[i * k + j] - mx);
		ref_loss += (mx + log(s) - lg.d[i * k + labels[i]]) / n;
		for (int j = 0; j < k; j++)
			ref_d[i * k + j] = (exp(lg.d[i * k + j] - mx) / s - (j == labels[i])) *
					   dloss / n;
	}
	for (int dbl = 0; dbl < 2; dbl++) {
		buf loss = buf_nan(1), d = buf_nan(n * k), dl = buf_new(1);
		dl.d[0] = dl.f[0] = dloss;
		int bad = -7, rc;
		if (dbl) {
			rc = loom_cpu_softmax_ce_fwd_f64(n, k, lg.d, labels, loss.d, &bad);
			loom_cpu_softmax_ce_bwd_f64(n, k, lg.d, labels, dl.d, d.d);
		} else {
			rc = loom_cpu_softmax_ce_fwd_f32(n, k, lg.f, labels, loss.f, &bad);
			loom_cpu_softmax_ce_bwd_f32(n, k, lg.f, labels, dl.f, d.f);
		}
		cr_assert_eq(rc, 0);
		cr_assert_eq(bad, -7, "bad untouched on success");
		expect_close("softmax-ce loss", dbl, &loss, &ref_loss, 1);
		expect_close("softmax-ce dlogits", dbl, &d, ref_d, n * k);
		buf_free(&loss), buf_free(&d), buf_free(&dl);
	}
	buf_free(&lg);
}

Test(dense, softmax_ce_bad_label)
{
	double lg[12] = {0};
	float lgf[12] = {0};
	int32_t high[3] = {0, 3, 4}, neg[3] = {1, -1, 0};
	double loss = 123;
	float lossf = 123;
	int bad = -1;
	cr_assert_eq(loom_cpu_softmax_ce_fwd_f64(3, 4, lg, high, &loss, &bad), -1);
	cr_assert_eq(bad, 2, "index of the out-of-range label");
	cr_assert_eq(loss, 123, "loss not written");
	bad = -1;
	cr_assert_eq(loom_cpu_softmax_ce_fwd_f32(3, 4, lgf, neg, &lossf, &bad), -1);
	cr_assert_eq(bad, 1);
	cr_assert_eq(lossf, 123);
}

/* ---- elementwise ---------------------------------------------------------- */

Test(elementwise, relu_add_broadcast)
{
	/* Sizes on both sides of the parallel threshold. */
	const int64_t sizes[2] = {37, 100003};
	for (int t = 0; t < 2; t++) {
		int64_t n = sizes[t];
		buf x = buf_rand(n, -1, 1), dy = buf_rand(n, -1, 1), b = buf_rand(n, -1, 1);
		double *rr = malloc(n * 8), *rb = malloc(n * 8), *ra = malloc(n * 8);
		double *rs = malloc(n * 8), s = 1.5;
		buf sx = buf_new(1);
		sx.d[0] = sx.f[0] = -0.75;
		for (int64_t i = 0; i < n; i++) {
			rr[i] = x.d[i] > 0 ? x.d[i] : 0;
			rb[i] = x.d[i] > 0 ? dy.d[i] : 0;
			ra[i] = x.d[i] + b.d[i];
			rs[i] = -0.75 * s;
		}
		for (int dbl = 0; dbl < 2; dbl++) {
			buf y = buf_nan(n), dx = buf_nan(n), a = buf_nan(n), bc = buf_nan(n);
			if (dbl) {
				loom_cpu_relu_fwd_f64(n, x.d, y.d);
				loom_cpu_relu_bwd_f64(n, x.d, dy.d, dx.d);
				loom_cpu_add_f64(n, x.d, b.d, a.d);
				loom_cpu_broadcast_scalar_f64(n, sx.d, s, bc.d);
			} else {
				loom_cpu_relu_fwd_f32(n, x.f, y.f);
				loom_cpu_relu_bwd_f32(n, x.f, dy.f, dx.f);
				loom_cpu_add_f32(n, x.f, b.f, a.f);
				loom_cpu_broadcast_scalar_f32(n, sx.f, s, bc.f);
			}
			expect_close("relu fwd", dbl, &y, rr, n);
			expect_close("relu bwd", dbl, &dx, rb, n);
			expect_close("add", dbl, &a, ra, n);
			expect_close("broadcast", dbl, &bc, rs, n);
			buf_free(&y), buf_free(&dx), buf_free(&a), buf_free(&bc);
		}
		buf_free(&x), buf_free(&dy), buf_free(&b), buf_free(&sx);
		free(rr), free(rb), free(ra), free(rs);
	}
}

Test(elementwise, relu_propagates_nan)
{
	float x[3] = {NAN, -1, 2}, y[3];
	loom_cpu_relu_fwd_f32(3, x, y);
	cr_assert(isnan(y[0]) && y[1] == 0 && y[2] == 2);
}

/* GELU's f32 kernel (libmvec's SIMD erff/expf/tanhf, elementwise.c) against
 * graph/unary.h's formula in double, both forms, forward and backward: an
 * odd count (the loops' scalar tails) over the team's threshold, x out to
 * +-12 (erf's saturation, exp's underflow), a NaN passed through. */
Test(elementwise, gelu_f32_matches_the_formula_in_double)
{
	const int64_t n = 100003;
	float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n),
	      *y = malloc(sizeof(float) * n);
	cr_assert(x && dy && y);
	for (int64_t i = 0; i < n; i++) {
		x[i] = (float)(24.0 * urand() - 12.0);
		dy[i] = (float)(2.0 * urand() - 1.0);
	}
	x[7] = NAN;
	x[8] = 0;
	for (int form = 0; form < 2; form++)
		for (int bwd = 0; bwd < 2; bwd++) {
			loom_cpu_gelu_f32(n, x, bwd ? dy : NULL, form, y);
			double worst = 0;
			int64_t at = -1;
			for (int64_t i = 0; i < n; i++) {
				if (i == 7) {
					cr_expect(isnan(y[i]), "form %d bwd %d: NaN in, %g out", form, bwd, y[i]);
					continue;
				}
				double ref = loom_unary_gelu_f64(x[i], bwd ? dy[i] : 0.0, bwd, form);
				/* The f32 formula itself loses to cancellation in
				 * 1 + erf(x / sqrt 2) for x << 0 (an ulp of 1 times
				 * x / 2): an absolute part that grows with |x|, and a
				 * relative one; the error is in units of that bound. */
				double e = fabs(y[i] - ref) / (1e-5 * fabs(ref) + 1e-6 * (1 + fabs(x[i])));
				if (e > worst) {
					worst = e;
					at = i;
				}
			}
			cr_expect(worst <= 1, "form %d bwd %d: x %g gives %.9g, double %.9g (%g bounds)",
				  form, bwd, at >= 0 ? x[at] : 0.0, at >= 0 ? y[at] : 0.0,
				  at >= 0 ? loom_unary_gelu_f64(x[at], bwd ? dy[at] : 0.0, bwd, form) : 0.0,
				  worst);
		}
	free(x);
	free(dy);
	free(y);
}

/* The spacing of floats around x, subnormals included. */
static double float_ulp(double x)
{
	double u = x == 0 ? 0 : ldexp(1, ilogb(x) - 23);
	return u > 0x1p-149 ? u : 0x1p-149;
}

/* The softmax rows' exponentials (libmvec's exp in double, elementwise.c)
 * against exp in double here: each rounded value within half an ulp of
 * float plus libmvec's few double ulps, the sums to 1e-13 (only their
 * order differs); an odd count for the SIMD tails, exponents down to
 * underflow (-800), a NaN passed through. */
Test(elementwise, exp_rows_match_the_formula_in_double)
{
	const int64_t n = 1001;
	const double m = 3.7, g = -0.37;
	float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n),
	      *z = malloc(sizeof(float) * n);
	cr_assert(x && y && z);
	double sum = 0;
	for (int64_t i = 0; i < n; i++) {
		x[i] = (float)(i == 5 ? -800.0 : -90.0 + 95.0 * urand());
		sum += exp((double)x[i] - m);
	}
	double got = loom_cpu_exp_sum_f32(n, x, m);
	cr_expect(fabs(got - sum) <= 1e-13 * sum, "exp_sum %.17g, double %.17g", got, sum);
	loom_cpu_exp_scale_f32(n, x, m, g, y);
	memcpy(z, x, sizeof(float) * n);
	got = loom_cpu_exp_inplace_f32(n, z, m);
	cr_expect(fabs(got - sum) <= 1e-13 * sum, "exp_inplace's sum %.17g, double %.17g", got,
		  sum);
	for (int64_t i = 0; i < n; i++) {
		double e = exp((double)x[i] - m);
		cr_assert(fabs(z[i] - e) <= 0.50001 * float_ulp(e), "exp(%g - %g): %.9g, double %.17g",
			  x[i], m, z[i], e);
		cr_assert(fabs(y[i] - e * g) <= 0.50001 * float_ulp(e * g),
			  "exp(%g - %g) * %g: %.9g, double %.17g", x[i], m, g, y[i], e * g);
	}
	cr_expect(z[5] == 0 && y[5] == 0, "exp(-800) underflows to 0");
	x[9] = NAN;
	cr_expect(isnan(loom_cpu_exp_sum_f32(n, x, m)), "a NaN reaches the sum");
	loom_cpu_exp_scale_f32(n, x, m, g, y);
	cr_expect(isnan(y[9]) && !isnan(y[8]), "NaN in, NaN out, and only there");
	free(x);
	free(y);
	free(z);
}

Test(elementwise, sum_million_f32_accurate)
{
	const int64_t n = 1000000;
	float *x = malloc(n * sizeof(float));
	long double ref = 0;
	for (int64_t i = 0; i < n; i++) {
		x[i] = (float)urand();
		ref += x[i];
	}
	float got, want = (float)ref;
	loom_cpu_sum_f32(n, x, &got);
	/* A plain float loop is off by hundreds of ulps here. */
	float ulp = nextafterf(want, INFINITY) - want;
	cr_assert(fabsf(got - want) <= 2 * ulp, "sum %.9g, exact %.9Lg (ulp %g)", got, ref, ulp);

	double *xd = malloc(n * sizeof(double)), gotd;
	for (int64_t i = 0; i < n; i++)
		xd[i] = x[i];
	loom_cpu_sum_f64(n, xd, &gotd);
	cr_assert(fabsl(gotd - ref) <= 1e-9L, "f64 sum %.17g, exact %.17Lg", gotd, ref);
	free(x), free(xd);
}

Test(elementwise, channel_sum)
{
	const int n = 3, c = 4, hw = 11;
	buf x = buf_rand(n * c * hw, -1, 1);
	double ref[4] = {0};
	for (int i = 0; i < n; i++)
		for (int ch = 0; ch < c; ch++)
			for (int j = 0; j < hw; j++)
				ref[ch] += x.d[nchw(n, c, hw, i, ch, j)];
	for (int dbl = 0; dbl < 2; dbl++) {
		buf out = buf_nan(c);
		if (dbl)
			loom_cpu_channel_sum_f64(n, c, hw, x.d, out.d);
		else
			loom_cpu_channel_sum_f32(n, c, hw, x.f, out.f);
		expect_close("channel sum", dbl, &out, ref, c);
		buf_free(&out);
	}
	buf_free(&x);
}

/* hw == 1, a bias gradient over [rows, C]: the row-wise path (channels
 * side by side, in blocks of 512) adds in bn_chan_sum's order in double, so
 * each channel's sum is the double sum of its column in row order, rounded
 * once: equal bit for bit. c = 1100 spans three blocks and a tail, and the
 * size is over the team's threshold (both threads' ranges). */
Test(elementwise, channel_sum_rows_same_bits_as_the_ordered_double_sum)
{
	const int n = 61, c = 1100;
	buf x = buf_rand((size_t)n * c, -1, 1);
	double *ref = calloc(c, sizeof(double));
	cr_assert(ref);
	for (int i = 0; i < n; i++)
		for (int ch = 0; ch < c; ch++)
			ref[ch] += x.d[(size_t)i * c + ch];
	buf out = buf_nan(c);
	loom_cpu_channel_sum_f32(n, c, 1, x.f, out.f);
	loom_cpu_channel_sum_f64(n, c, 1, x.d, out.d);
	for (int ch = 0; ch < c; ch++) {
		cr_assert(out.f[ch] == (float)ref[ch], "f32 channel %d: %.9g, want %.9g", ch,
			  out.f[ch], (float)ref[ch]);
		cr_assert(out.d[ch] == ref[ch], "f64 channel %d: %.17g, want %.17g", ch, out.d[ch],
			  ref[ch]);
	}
	free(ref);
	buf_free(&out);
	buf_free(&x);
}

/* ---- global average pooling --------------------------------------------- */

Test(global_avgpool, mean_of_each_plane_and_its_adjoint)
{
	const int64_t nc = 6, hw = 49;
	buf x = buf_rand((size_t)(nc * hw), -1, 1), dy = buf_rand((size_t)nc, -1, 1);
	double ref[6];
	for (int64_t p = 0; p < nc; p++) {
		double s = 0;
		for (int64_t i = 0; i < hw; i++)
			s += x.d[p * hw + i];
		ref[p] = s / hw;
	}
	for (int dbl = 0; dbl < 2; dbl++) {
		buf y = buf_nan((size_t)nc), dx = buf_nan((size_t)(nc * hw));
		if (dbl) {
			loom_cpu_global_avgpool_fwd_f64(nc, hw, x.d, y.d);
			loom_cpu_global_avgpool_bwd_f64(nc, hw, dy.d, dx.d);
		} else {
			loom_cpu_global_avgpool_fwd_f32(nc, hw, x.f, y.f);
			loom_cpu_global_avgpool_bwd_f32(nc, hw, dy.f, dx.f);
		}
		expect_close("global_avgpool fwd", dbl, &y, ref, (size_t)nc);
		for (int64_t i = 0; i < nc * hw; i++)
			cr_assert_float_eq(got_at(&dx, dbl, i), dy.d[i / hw] / hw, 1e-6,
					   "dx[%lld]", (long long)i);
		buf_free(&y), buf_free(&dx);
	}
	buf_free(&x), buf_free(&dy);
}

/* ---- bf16 in, bf16 out: the same bits as widen / f32 kernel / round ------ */

/* Raw bf16 patterns: most random over every class (so NaN payloads of both
 * signs, infinities, subnormals, zeros and huge values all occur), the rest
 * ordinary values in [-4, 4] and explicit specials. */
static void bf16_fill(uint16_t *p, int64_t n)
{
	static const uint16_t special[] = { 0x7fc0, 0xffc1, 0x7f81, 0x7f80, 0xff80, 0x0000,
					    0x8000, 0x0001, 0x807f, 0x0040, 0x7f7f, 0xff7f };
	for (int64_t i = 0; i < n; i++) {
		double u = urand();
		if (u < 0.1)
			p[i] = special[(int64_t)(urand() * 12) % 12];
		else if (u < 0.5)
			p[i] = (uint16_t)(urand() * 65536);
		else
			p[i] = loom_f32_to_bf16((float)(urand() * 8 - 4));
	}
}

static void check_ew_bf16(int op, int flag, int two, int64_t n)
{
	uint16_t *a = malloc(2 * (size_t)n), *b = malloc(2 * (size_t)n);
	uint16_t *y = malloc(2 * (size_t)n), *ref = malloc(2 * (size_t)n);
	float *fa = malloc(4 * (size_t)n), *fb = malloc(4 * (size_t)n), *fy = malloc(4 * (size_t)n);
	bf16_fill(a, n);
	bf16_fill(b, n);
	/* backend.c's emulation: widen, the f32 kernel, round */
	loom_bf16_to_f32_array(a, fa, n);
	loom_bf16_to_f32_array(b, fb, n);
	switch (op) {
	case LOOM_CPU_EW_ADD:
		loom_cpu_add_f32(n, fa, fb, fy);
		if (flag)
			loom_cpu_relu_fwd_f32(n, fy, fy);
		break;
	case LOOM_CPU_EW_RELU:
		loom_cpu_relu_fwd_f32(n, fa, fy);
		break;
	case LOOM_CPU_EW_RELU_BWD:
		loom_cpu_relu_bwd_f32(n, fa, fb, fy);
		break;
	default:
		loom_cpu_gelu_f32(n, fa, two ? fb : NULL, flag, fy);
	}
	loom_f32_to_bf16_array(fy, ref, n);
	memset(y, 0xab, 2 * (size_t)n);
	loom_cpu_ew_bf16(op, flag, n, a, two ? b : NULL, y);
	for (int64_t i = 0; i < n; i++)
		cr_assert_eq(y[i], ref[i],
			     "op %d flag %d n %lld: [%lld] = 0x%04x, the emulation gives 0x%04x "
			     "(a 0x%04x b 0x%04x)",
			     op, flag, (long long)n, (long long)i, y[i], ref[i], a[i], b[i]);
	free(a), free(b), free(y), free(ref), free(fa), free(fb), free(fy);
}

Test(ew_bf16, add_relu_gelu_and_backward_bit_for_bit)
{
	/* odd lengths, block edges (512), and sizes the team splits */
	const int64_t ns[] = { 1, 7, 31, 511, 513, 1000, 40003, 100001 };
	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
		check_ew_bf16(LOOM_CPU_EW_ADD, 0, 1, ns[k]);
		check_ew_bf16(LOOM_CPU_EW_ADD, 1, 1, ns[k]);
		check_ew_bf16(LOOM_CPU_EW_RELU, 0, 0, ns[k]);
		check_ew_bf16(LOOM_CPU_EW_RELU_BWD, 0, 1, ns[k]);
		for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
			check_ew_bf16(LOOM_CPU_EW_GELU, tanh_form, 0, ns[k]);
			check_ew_bf16(LOOM_CPU_EW_GELU, tanh_form, 1, ns[k]);
		}
	}
}

static void check_pool_bf16(loom_pool_shape s)
{
	int64_t nin = (int64_t)s.n * s.c * s.h_in * s.w_in;
	int64_t nout = (int64_t)s.n * s.c * s.h_out * s.w_out;
	uint16_t *x = malloc(2 * nin), *dy = malloc(2 * nout), *y = malloc(2 * nout),
		 *dx = malloc(2 * nin), *ry = malloc(2 * nout), *rdx = malloc(2 * nin);
	float *fx = malloc(4 * nin), *fdy = malloc(4 * nout), *fy = malloc(4 * nout),
	      *fdx = malloc(4 * nin);
	bf16_fill(x, nin);
	bf16_fill(dy, nout);
	loom_bf16_to_f32_array(x, fx, nin);
	loom_bf16_to_f32_array(dy, fdy, nout);
	loom_cpu_maxpool2d_fwd_f32(&s, fx, fy);
	loom_cpu_maxpool2d_bwd_f32(&s, fx, fdy, fdx);
	loom_f32_to_bf16_array(fy, ry, nout);
	loom_f32_to_bf16_array(fdx, rdx, nin);
	cr_assert_eq(loom_cpu_maxpool2d_bf16(&s, x, NULL, y), 1);
	cr_assert_eq(loom_cpu_maxpool2d_bf16(&s, x, dy, dx), 1);
	for (int64_t i = 0; i < nout; i++)
		cr_assert_eq(y[i], ry[i],
			     "maxpool bf16 %dx%d relu %d: y[%lld] 0x%04x, emulated 0x%04x", s.h_in,
			     s.w_in, s.relu, (long long)i, y[i], ry[i]);
	for (int64_t i = 0; i < nin; i++)
		cr_assert_eq(dx[i], rdx[i],
			     "maxpool bf16 %dx%d relu %d: dx[%lld] 0x%04x, emulated 0x%04x", s.h_in,
			     s.w_in, s.relu, (long long)i, dx[i], rdx[i]);
	free(x), free(dy), free(y), free(dx), free(ry), free(rdx), free(fx), free(fdy), free(fy),
		free(fdx);
}

Test(ew_bf16, maxpool_and_backward_bit_for_bit)
{
	for (int relu = 0; relu < 2; relu++) {
		loom_pool_shape s[] = {
			pool_shape(2, 3, 8, 8, 2, 2, 0),
			pool_shape(1, 2, 7, 9, 2, 2, 0),    /* odd: last row/col unread */
			pool_shape(3, 5, 9, 11, 3, 2, 1),   /* padding, overlapping windows */
			pool_shape(100, 16, 28, 28, 2, 2, 0), /* the ConvNet's: chunks, threads */
		};
		for (size_t k = 0; k < sizeof(s) / sizeof(s[0]); k++) {
			s[k].relu = relu;
			check_pool_bf16(s[k]);
		}
	}
	/* A plane too big for the stack buffer: declined, nothing written. */
	loom_pool_shape big = pool_shape(1, 1, 80, 80, 2, 2, 0);
	uint16_t x[1], y[1] = { 0x1234 };
	cr_assert_eq(loom_cpu_maxpool2d_bf16(&big, x, NULL, y), 0);
	cr_assert_eq(y[0], 0x1234);
}
