/*
 * tests/engine/cpu/test_cpu_path.c — the CPU path chosen from cpuid, and the
 * GEMM and native-bf16 kernels of that path against plain f64 loops on
 * random shapes, ragged ones included (not multiples of any vector width).
 * BUILD runs this file once per path the test machine can force
 * (LOOM_CPU_ISA), since a process picks its path once.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "engine/cpu/conv_dnnl.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/peak.h"
#include "loom.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

static int irand(int lo, int hi)
{
	return lo + (int)(urand() * (hi - lo + 1));
}

/* Random floats in [-1, 1), rounded to bf16 when bf16 is set so that the
 * f32 and bf16 kernels see the same values. */
static float *frand(size_t n, int bf16)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));
	for (size_t i = 0; i < n; i++) {
		p[i] = (float)(urand() * 2 - 1);
		if (bf16)
			p[i] = loom_bf16_to_f32(loom_f32_to_bf16(p[i]));
	}
	return p;
}

static uint16_t *to_bf16(const float *f, size_t n)
{
	uint16_t *p = malloc(sizeof(uint16_t) * (n ? n : 1));
	for (size_t i = 0; i < n; i++)
		p[i] = loom_f32_to_bf16(f[i]);
	return p;
}

/* Each result is compared with the f64 sum of the same products, to within
 * fp32 rounding of a sum of `terms` products: the bound is relative to the
 * sum of their magnitudes, which is what fp32 accumulation can lose. */
static void expect_close(const char *what, const float *got, const double *ref,
			 const double *mag, size_t n, int terms)
{
	double tol = 4e-7 * (terms + 8);
	for (size_t i = 0; i < n; i++) {
		double err = fabs(got[i] - ref[i]);
		cr_assert(err <= tol * (mag[i] + 1e-30) + 1e-30,
			  "%s[%zu]: got %.9g, want %.9g (|err| %.3g, bound %.3g)", what, i,
			  got[i], ref[i], err, tol * mag[i]);
	}
}

Test(cpu_path, choice_follows_cpu_and_cap)
{
	loom_cpu_isa best = loom_cpu_isa_detect(), got = loom_cpu_isa_get();
	const char *cap = getenv("LOOM_CPU_ISA");
	cr_assert(got <= best, "path %s above what the CPU has (%s)", loom_cpu_isa_name(got),
		  loom_cpu_isa_name(best));
	if (!cap || !*cap)
		cr_assert_eq(got, best, "no cap, yet path %s, not %s", loom_cpu_isa_name(got),
			     loom_cpu_isa_name(best));
	else if (got < best)
		cr_assert_str_eq(loom_cpu_isa_name(got), cap);
	cr_assert_eq(loom_cpu_bf16_native(), got == LOOM_CPU_ISA_AVX512_BF16);

	char line[128];
	loom_cpu_set_threads(1);
	loom_cpu_describe(line, sizeof(line));
	cr_assert(strstr(line, "cpu: 1 thread, ") == line, "line '%s'", line);
	cr_assert(strstr(line, loom_cpu_isa_name(got)), "line '%s' names no path", line);
	loom_cpu_set_threads(0);
}

/* The peak loops run where the CPU has the instructions, and only there. */
Test(cpu_path, peak_loops_measure_a_rate)
{
	float sink = 0;
	for (int k = LOOM_CPU_PEAK_FP32_AVX2; k <= LOOM_CPU_PEAK_BF16_AVX512; k++) {
		double r = loom_cpu_peak_gflops((loom_cpu_peak)k, 20000, &sink);
		if (loom_cpu_peak_supported((loom_cpu_peak)k))
			cr_assert(r > 0.1 && r < 1e5, "kind %d: %g GFLOP/s", k, r);
		else
			cr_assert_eq(r, 0, "kind %d measured without the instructions: %g", k, r);
	}
	cr_assert(isfinite(sink));
	cr_assert_eq(loom_cpu_peak_gflops(LOOM_CPU_PEAK_FP32_AVX2, 0, &sink), 0);
}

/* Native bf16 only on a path with avx512_bf16; there, chosen from the
 * measured ratio; the start-up line says which and why. */
Test(cpu_path, bf16_choice_from_the_measured_peak)
{
	char line[160];
	double ratio = loom_cpu_bf16_measured_ratio();
	loom_cpu_describe(line, sizeof(line));
	if (loom_cpu_isa_get() != LOOM_CPU_ISA_AVX512_BF16) {
		cr_assert_eq(loom_cpu_bf16_use_native(), 0);
		cr_assert_eq(ratio, 0);
		cr_assert(strstr(line, "bf16 emulated (no avx512_bf16)"), "line '%s'", line);
		return;
	}
	cr_assert(ratio > 0.05 && ratio < 20, "ratio %g", ratio);
	const char *e = getenv("LOOM_CPU_BF16");
	if (!e || !*e)
		cr_assert_eq(loom_cpu_bf16_use_native(), ratio >= 1.5, "ratio %g", ratio);
	cr_assert(strstr(line, loom_cpu_bf16_use_native() ? "bf16 native (vdpbf16ps " :
							     "bf16 emulated (vdpbf16ps "),
		  "line '%s'", line);
}

static void bf16_emulate_env(void)
{
	setenv("LOOM_CPU_BF16", "emulate", 1);
}

Test(cpu_path, bf16_emulate_by_variable, .init = bf16_emulate_env)
{
	char line[160];
	cr_assert_eq(loom_cpu_bf16_use_native(), 0);
	loom_cpu_describe(line, sizeof(line));
	cr_assert(strstr(line, "bf16 emulated ("), "line '%s'", line);
}

/* Row-major reference of C = alpha op(A) op(B) + beta C0, with the summed
 * magnitudes of each result's terms. */
static void ref_gemm(int ta, int tb, int m, int n, int k, double alpha, const float *a,
		     const float *b, double beta, const float *c0, double *c, double *mag)
{
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = 0, g = 0;
			for (int p = 0; p < k; p++) {
				double av = ta ? a[(size_t)p * m + i] : a[(size_t)i * k + p];
				double bv = tb ? b[(size_t)j * k + p] : b[(size_t)p * n + j];
				s += av * bv;
				g += fabs(av * bv);
			}
			double c0v = c0 ? c0[(size_t)i * n + j] : 0;
			c[(size_t)i * n + j] = alpha * s + beta * c0v;
			mag[(size_t)i * n + j] = fabs(alpha) * g + fabs(beta * c0v);
		}
}

/* One product on each path a test may take: the chosen f32 GEMM
 * (loom_cpu_gemm_f32 splits it over threads), and the bf16 GEMM. */
static void check_gemm(int ta, int tb, int m, int n, int k, double alpha, double beta, int bf16)
{
	float *a = frand((size_t)m * k, bf16), *b = frand((size_t)k * n, bf16);
	float *c = frand((size_t)m * n, 0);
	double *ref = malloc(sizeof(double) * m * n), *mag = malloc(sizeof(double) * m * n);
	ref_gemm(ta, tb, m, n, k, alpha, a, b, beta, c, ref, mag);
	char what[96];
	snprintf(what, sizeof(what), "%s gemm %c%c %dx%dx%d", bf16 ? "bf16" : "f32",
		 ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k);
	if (!bf16) {
		loom_cpu_gemm_f32(ta, tb, m, n, k, alpha, a, b, beta, c);
	} else {
		uint16_t *ah = to_bf16(a, (size_t)m * k), *bh = to_bf16(b, (size_t)k * n);
		int rc = loom_cpu_gemm_bf16f32(ta, tb, m, n, k, alpha, ah, bh, beta, c);
		free(ah);
		free(bh);
		cr_assert_eq(rc, loom_cpu_bf16_native() ? 0 : -1, "%s: rc %d", what, rc);
		if (rc)
			goto out;
	}
	expect_close(what, c, ref, mag, (size_t)m * n, k);
out:
	free(a);
	free(b);
	free(c);
	free(ref);
	free(mag);
}

Test(cpu_path, sgemm_random_ragged_shapes)
{
	static const int dims[] = { 1, 2, 3, 7, 15, 17, 31, 33, 63, 65, 100, 129 };
	const int nd = sizeof(dims) / sizeof(dims[0]);
	for (int it = 0; it < 40; it++)
		check_gemm(it & 1, (it >> 1) & 1, dims[irand(0, nd - 1)], dims[irand(0, nd - 1)],
			   dims[irand(0, nd - 1)], it % 3 ? 1.0 : 0.5, it % 4 ? 0.0 : 1.0, 0);
	/* big enough that loom_cpu_gemm_f32 splits it over threads */
	check_gemm(0, 1, 257, 129, 130, 1, 0, 0);
	check_gemm(1, 0, 130, 301, 67, 1, 1, 0);
}

Test(cpu_path, bf16_gemm_random_ragged_shapes)
{
	static const int dims[] = { 1, 2, 3, 7, 15, 17, 31, 33, 63, 65, 100, 129 };
	const int nd = sizeof(dims) / sizeof(dims[0]);
	for (int it = 0; it < 40; it++)
		check_gemm(it & 1, (it >> 1) & 1, dims[irand(0, nd - 1)], dims[irand(0, nd - 1)],
			   dims[irand(0, nd - 1)], 1.0, it % 4 ? 0.0 : 1.0, 1);
	check_gemm(0, 1, 100, 10, 1568, 1, 1, 1); /* the ConvNet's linear layer */
}

/* ---- convolution: the f32 kernels of the path, and the bf16 ones --------- */

#define X_AT(s, n, c, i, j) ((((size_t)(n) * (s)->c_in + (c)) * (s)->h_in + (i)) * (s)->w_in + (j))
#define Y_AT(s, n, c, i, j) ((((size_t)(n) * (s)->c_out + (c)) * (s)->h_out + (i)) * (s)->w_out + (j))
#define W_AT(s, o, c, i, j) ((((size_t)(o) * (s)->c_in + (c)) * (s)->kh + (i)) * (s)->kw + (j))

static size_t xs(const loom_conv_shape *s)
{
	return (size_t)s->n * s->c_in * s->h_in * s->w_in;
}

static size_t ys(const loom_conv_shape *s)
{
	return (size_t)s->n * s->c_out * s->h_out * s->w_out;
}

static size_t wsz(const loom_conv_shape *s)
{
	return (size_t)s->c_out * s->c_in * s->kh * s->kw;
}

/* y, dx and dw of one conv in f64, with the magnitudes of their terms. */
static void ref_conv(const loom_conv_shape *s, const float *x, const float *w, const float *b,
		     const float *dy, double *y, double *ym, double *dx, double *dxm, double *dw,
		     double *dwm)
{
	for (size_t i = 0; i < ys(s); i++)
		y[i] = ym[i] = 0;
	for (size_t i = 0; i < xs(s); i++)
		dx[i] = dxm[i] = 0;
	for (size_t i = 0; i < wsz(s); i++)
		dw[i] = dwm[i] = 0;
	for (int n = 0; n < s->n; n++)
		for (int o = 0; o < s->c_out; o++)
			for (int oh = 0; oh < s->h_out; oh++)
				for (int ow = 0; ow < s->w_out; ow++)
					for (int c = 0; c < s->c_in; c++)
						for (int ki = 0; ki < s->kh; ki++)
							for (int kj = 0; kj < s->kw; kj++) {
								int ih = oh * s->stride - s->pad + ki;
								int iw = ow * s->stride - s->pad + kj;
								if (ih < 0 || ih >= s->h_in || iw < 0 ||
								    iw >= s->w_in)
									continue;
								size_t yi = Y_AT(s, n, o, oh, ow);
								size_t xi = X_AT(s, n, c, ih, iw);
								size_t wi = W_AT(s, o, c, ki, kj);
								y[yi] += (double)x[xi] * w[wi];
								ym[yi] += fabs((double)x[xi] * w[wi]);
								dx[xi] += (double)dy[yi] * w[wi];
								dxm[xi] += fabs((double)dy[yi] * w[wi]);
								dw[wi] += (double)dy[yi] * x[xi];
								dwm[wi] += fabs((double)dy[yi] * x[xi]);
							}
	for (size_t i = 0; b && i < ys(s); i++) {
		double bv = b[(i / ((size_t)s->h_out * s->w_out)) % s->c_out];
		y[i] += bv;
		ym[i] += fabs(bv);
	}
}

/* How check_conv runs the conv: loom's im2col kernels, or oneDNN's
 * primitives (conv_dnnl.c) in NCHW or in their own blocked layouts. */
enum { CONV_LOOM, CONV_DNNL_NCHW, CONV_DNNL_BLOCKED };

/* The three directions on oneDNN primitives, or -1 where the path has none:
 * the portable path never has them, bf16 only on avx512_bf16, f32 on every
 * other path must. */
static int dnnl_conv3(const loom_conv_shape *s, int bf16, int blocked, const void *x,
		      const void *w, const float *b, const void *dy, float *y, float *dx,
		      float *dw, const char *what)
{
	loom_cpu_dnnl_conv *c[3];
	int have = loom_cpu_isa_get() != LOOM_CPU_ISA_PORTABLE && (!bf16 || loom_cpu_bf16_native());
	for (int k = 0; k < 3; k++) {
		c[k] = loom_cpu_dnnl_conv_new((loom_cpu_conv_kind)k, s, bf16, k == 0, blocked);
		cr_assert_eq(c[k] != NULL, have, "%s: primitive %d %s", what, k,
			     have ? "missing" : "on a path without oneDNN");
	}
	if (!have)
		return -1;
	const void *a[3] = { x, dy, dy }, *bb[3] = { w, w, x };
	float *out[3] = { y, dx, dw };
	for (int k = 0; k < 3; k++) {
		size_t n = loom_cpu_dnnl_conv_ws(c[k]);
		void *ws = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
		/* garbage in the workspace and the result: nothing may read it */
		memset(ws, 0xff, (n + 63) / 64 * 64 + 64);
		cr_assert_eq(loom_cpu_dnnl_conv_run(c[k], a[k], bb[k], k == 0 ? b : NULL, out[k], ws),
			     0, "%s: run %d", what, k);
		free(ws);
		loom_cpu_dnnl_conv_free(c[k]);
	}
	return 0;
}

static void check_conv_on(int mode, int n, int c_in, int h, int w, int c_out, int kh, int kw,
			  int stride, int pad, int bf16)
{
	loom_conv_shape s = { n, c_in, h, w, c_out, kh, kw, stride, pad,
			      (h + 2 * pad - kh) / stride + 1, (w + 2 * pad - kw) / stride + 1 };
	float *x = frand(xs(&s), bf16), *wt = frand(wsz(&s), bf16), *dy = frand(ys(&s), bf16);
	float *b = frand(s.c_out, 0);
	float *y = malloc(sizeof(float) * ys(&s)), *dx = malloc(sizeof(float) * xs(&s));
	float *dw = malloc(sizeof(float) * wsz(&s));
	double *ry = malloc(sizeof(double) * ys(&s)), *rym = malloc(sizeof(double) * ys(&s));
	double *rdx = malloc(sizeof(double) * xs(&s)), *rdxm = malloc(sizeof(double) * xs(&s));
	double *rdw = malloc(sizeof(double) * wsz(&s)), *rdwm = malloc(sizeof(double) * wsz(&s));
	void *ws = aligned_alloc(64, loom_cpu_conv2d_workspace(&s, 4));
	ref_conv(&s, x, wt, b, dy, ry, rym, rdx, rdxm, rdw, rdwm);

	char what[128];
	snprintf(what, sizeof(what), "%s %s conv n%d %dx%dx%d->%d k%dx%d s%d p%d",
		 mode == CONV_LOOM ? "im2col" : mode == CONV_DNNL_NCHW ? "onednn nchw" :
									"onednn blocked",
		 bf16 ? "bf16" : "f32", n, c_in, h, w, c_out, kh, kw, stride, pad);
	for (size_t i = 0; i < ys(&s); i++)
		y[i] = NAN;
	for (size_t i = 0; i < xs(&s); i++)
		dx[i] = NAN;
	for (size_t i = 0; i < wsz(&s); i++)
		dw[i] = NAN;
	if (mode != CONV_LOOM) {
		uint16_t *xh = to_bf16(x, xs(&s)), *wh = to_bf16(wt, wsz(&s));
		uint16_t *dyh = to_bf16(dy, ys(&s));
		int rc = bf16 ? dnnl_conv3(&s, 1, mode == CONV_DNNL_BLOCKED, xh, wh, b, dyh, y, dx,
					   dw, what) :
				dnnl_conv3(&s, 0, mode == CONV_DNNL_BLOCKED, x, wt, b, dy, y, dx,
					   dw, what);
		free(xh);
		free(wh);
		free(dyh);
		if (rc)
			goto out;
	} else if (!bf16) {
		loom_cpu_conv2d_fwd_f32(&s, x, wt, b, y, ws);
		loom_cpu_conv2d_bwd_data_f32(&s, dy, wt, dx, ws);
		loom_cpu_conv2d_bwd_filter_f32(&s, dy, x, dw, ws);
	} else {
		uint16_t *xh = to_bf16(x, xs(&s)), *wh = to_bf16(wt, wsz(&s));
		uint16_t *dyh = to_bf16(dy, ys(&s));
		int want = loom_cpu_bf16_native() ? 0 : -1;
		cr_assert_eq(loom_cpu_conv2d_fwd_bf16(&s, xh, wh, b, y, ws), want, "%s fwd", what);
		cr_assert_eq(loom_cpu_conv2d_bwd_data_bf16(&s, dyh, wh, dx, ws), want, "%s", what);
		cr_assert_eq(loom_cpu_conv2d_bwd_filter_bf16(&s, dyh, xh, dw, ws), want, "%s", what);
		free(xh);
		free(wh);
		free(dyh);
		if (want)
			goto out;
	}
	int k = c_in * kh * kw, p = s.h_out * s.w_out;
	char part[160];
	snprintf(part, sizeof(part), "%s y", what);
	expect_close(part, y, ry, rym, ys(&s), k + 1);
	snprintf(part, sizeof(part), "%s dx", what);
	expect_close(part, dx, rdx, rdxm, xs(&s), c_out * kh * kw);
	snprintf(part, sizeof(part), "%s dw", what);
	expect_close(part, dw, rdw, rdwm, wsz(&s), n * p);
out:
	free(x);
	free(wt);
	free(dy);
	free(b);
	free(y);
	free(dx);
	free(dw);
	free(ry);
	free(rym);
	free(rdx);
	free(rdxm);
	free(rdw);
	free(rdwm);
	free(ws);
}

static int conv_mode;

static void check_conv(int n, int c_in, int h, int w, int c_out, int kh, int kw, int stride,
		       int pad, int bf16)
{
	check_conv_on(conv_mode, n, c_in, h, w, c_out, kh, kw, stride, pad, bf16);
}

static void conv_shapes(int bf16)
{
	check_conv(3, 5, 9, 7, 6, 3, 3, 1, 1, bf16);   /* ragged everything */
	check_conv(2, 3, 11, 13, 17, 5, 3, 2, 2, bf16); /* stride 2, odd kernel */
	check_conv(4, 7, 6, 6, 9, 1, 1, 1, 0, bf16);    /* pointwise: no im2col */
	check_conv(2, 4, 10, 10, 5, 2, 2, 2, 0, bf16);  /* even kernel */
	check_conv(5, 16, 14, 14, 32, 5, 5, 1, 2, bf16); /* the ConvNet's conv2 */
	check_conv(3, 1, 28, 28, 16, 5, 5, 1, 2, bf16); /* conv1: wide output */
	check_conv(2, 3, 112, 112, 8, 7, 7, 2, 3, bf16); /* a 224 ResNet stem's kind (oneDNN fwd) */
	check_conv(2, 1024, 3, 3, 8, 1, 1, 1, 0, bf16); /* pointwise, wide input (oneDNN dx on AVX2) */
	for (int it = 0; it < 6; it++) {
		int kh = irand(1, 4), kw = irand(1, 4), st = irand(1, 2);
		check_conv(irand(1, 4), irand(1, 9), irand(kh, 12), irand(kw, 12), irand(1, 11), kh,
			   kw, st, irand(0, kh - 1), bf16);
	}
}

Test(cpu_path, conv_f32_random_ragged_shapes)
{
	conv_shapes(0);
}

Test(cpu_path, conv_bf16_random_ragged_shapes)
{
	conv_shapes(1);
}

/* oneDNN's primitives (the backend's conv path on AVX2 and AVX-512), in the
 * layout the backend uses (blocked, reorders inside) and in NCHW. */
Test(cpu_path, conv_onednn_f32_random_ragged_shapes)
{
	conv_mode = CONV_DNNL_BLOCKED;
	conv_shapes(0);
	conv_mode = CONV_DNNL_NCHW;
	conv_shapes(0);
}

Test(cpu_path, conv_onednn_bf16_random_ragged_shapes)
{
	conv_mode = CONV_DNNL_BLOCKED;
	conv_shapes(1);
	conv_mode = CONV_DNNL_NCHW;
	conv_shapes(1);
}
