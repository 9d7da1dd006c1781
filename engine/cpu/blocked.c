/*
 * engine/cpu/blocked.c — kernels of values in nChw8c (blocked.h): batch
 * norm, the per-channel sum and max pooling run a block of 8 channels at
 * a time, the 8 channels in the 8 lanes of one AVX2 register, so a value
 * that oneDNN's blocked convolutions made stays blocked between them. The
 * loops are compiled for x86-64-v3 and plain x86-64, picked at load
 * (target_clones).
 */
#include <math.h>
#include <string.h>

#include "engine/cpu/blocked.h"
#include "engine/cpu/team.h"

#define BLK 8
#define SUM_BLOCK 512 /* rows summed in f32 before the double sums, as bn_impl.h */
#define PAR_MIN 32768 /* elements below which a kernel stays on one thread (cpu_internal.h) */

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

static int threads_for(int64_t elems)
{
	return elems >= PAR_MIN ? loom_cpu_team_threads() : 1;
}

/* ------------------------------------------------------------ reorders */

/* Element (i, ch, k) of a [n, c, hw] value in format f. */
static inline int64_t off_of(loom_format f, int c, int64_t hw, int64_t i, int ch, int64_t k)
{
	switch (f) {
	case LOOM_FORMAT_NHWC:
		return (i * hw + k) * c + ch;
	case LOOM_FORMAT_NCHW8C:
		return ((i * (c / BLK) + ch / BLK) * hw + k) * BLK + ch % BLK;
	default:
		return (i * c + ch) * hw + k;
	}
}

typedef struct reorder_args {
	loom_format from, to;
	size_t esz;
	int c;
	int64_t hw;
	const char *src;
	char *dst;
} reorder_args;

/* nchw <-> nChw8c, 4-byte elements: one (image, block) at a time. */
CLONES static void reorder8_part(void *arg, int64_t lo, int64_t hi)
{
	const reorder_args *a = arg;
	const int cb = a->c / BLK;
	const int64_t hw = a->hw;
	for (int64_t p = lo; p < hi; p++) {
		int64_t i = p / cb, b = p % cb;
		const float *s = (const float *)a->src;
		float *d = (float *)a->dst;
		const int64_t plain = (i * a->c + b * BLK) * hw, blk = p * hw * BLK;
		if (a->to == LOOM_FORMAT_NCHW8C)
			for (int64_t k = 0; k < hw; k++)
				for (int j = 0; j < BLK; j++)
					d[blk + k * BLK + j] = s[plain + j * hw + k];
		else
			for (int j = 0; j < BLK; j++)
				for (int64_t k = 0; k < hw; k++)
					d[plain + j * hw + k] = s[blk + k * BLK + j];
	}
}

/* Any pair of formats, any element size: one image at a time. */
static void reorder_any_part(void *arg, int64_t lo, int64_t hi)
{
	const reorder_args *a = arg;
	for (int64_t i = lo; i < hi; i++)
		for (int ch = 0; ch < a->c; ch++)
			for (int64_t k = 0; k < a->hw; k++)
				memcpy(a->dst + a->esz * off_of(a->to, a->c, a->hw, i, ch, k),
				       a->src + a->esz * off_of(a->from, a->c, a->hw, i, ch, k),
				       a->esz);
}

void loom_cpu_reorder(loom_format from, loom_format to, size_t esz, int n, int c, int64_t hw,
		      const void *src, void *dst)
{
	reorder_args a = { from, to, esz, c, hw, src, dst };
	int64_t total = (int64_t)n * c * hw;
	if (from == to) {
		memcpy(dst, src, esz * (size_t)total);
		return;
	}
	int pair8 = (from == LOOM_FORMAT_NCHW && to == LOOM_FORMAT_NCHW8C) ||
		    (from == LOOM_FORMAT_NCHW8C && to == LOOM_FORMAT_NCHW);
	if (pair8 && esz == 4)
		loom_cpu_team_for((int64_t)n * (c / BLK), threads_for(total), reorder8_part, &a);
	else
		loom_cpu_team_for(n, threads_for(total), reorder_any_part, &a);
}

/* ------------------------------------------------------------ batch norm */

typedef struct bn8_args {
	int n, c;
	int64_t hw;
	const float *x, *gamma, *beta, *dy, *rmean_in, *rvar_in;
	float *running_mean, *running_var, *y, *dx, *dgamma, *dbeta, *out;
	double momentum, eps;
	double *save_mean, *save_var;            /* the forward keeps its statistics */
	const double *saved_mean, *saved_var;    /* the backward reads them */
} bn8_args;

/* Block b's 8 channel sums of x over the batch and the plane. */
static inline void sums8(const bn8_args *a, const float *x, int64_t b, double s[BLK])
{
	const int cb = a->c / BLK;
	for (int j = 0; j < BLK; j++)
		s[j] = 0;
	for (int i = 0; i < a->n; i++) {
		const float *p = x + ((int64_t)i * cb + b) * a->hw * BLK;
		for (int64_t k0 = 0; k0 < a->hw; k0 += SUM_BLOCK) {
			int64_t e = k0 + SUM_BLOCK < a->hw ? k0 + SUM_BLOCK : a->hw;
			float bs[BLK] = { 0 };
			for (int64_t k = k0; k < e; k++)
				for (int j = 0; j < BLK; j++)
					bs[j] += p[k * BLK + j];
			for (int j = 0; j < BLK; j++)
				s[j] += bs[j];
		}
	}
}

/* Block b's mean and biased variance (two passes). */
static inline void stats8(const bn8_args *a, int64_t b, double mean[BLK], double var[BLK])
{
	const int cb = a->c / BLK;
	const double m = (double)a->n * a->hw;
	float mt[BLK];
	sums8(a, a->x, b, mean);
	for (int j = 0; j < BLK; j++) {
		mean[j] /= m;
		mt[j] = (float)mean[j];
		var[j] = 0;
	}
	for (int i = 0; i < a->n; i++) {
		const float *p = a->x + ((int64_t)i * cb + b) * a->hw * BLK;
		for (int64_t k0 = 0; k0 < a->hw; k0 += SUM_BLOCK) {
			int64_t e = k0 + SUM_BLOCK < a->hw ? k0 + SUM_BLOCK : a->hw;
			float bq[BLK] = { 0 };
			for (int64_t k = k0; k < e; k++)
				for (int j = 0; j < BLK; j++) {
					float d = p[k * BLK + j] - mt[j];
					bq[j] += d * d;
				}
			for (int j = 0; j < BLK; j++)
				var[j] += bq[j];
		}
	}
	for (int j = 0; j < BLK; j++)
		var[j] /= m;
}

/* y = x * scale + shift over block b. */
static inline void affine8(const bn8_args *a, int64_t b, const float scale[BLK],
			   const float shift[BLK])
{
	const int cb = a->c / BLK;
	for (int i = 0; i < a->n; i++) {
		int64_t o = ((int64_t)i * cb + b) * a->hw * BLK;
		const float *p = a->x + o;
		float *q = a->y + o;
		for (int64_t k = 0; k < a->hw; k++)
			for (int j = 0; j < BLK; j++)
				q[k * BLK + j] = p[k * BLK + j] * scale[j] + shift[j];
	}
}

CLONES static void bn8_train_part(void *arg, int64_t lo, int64_t hi)
{
	const bn8_args *a = arg;
	const double m = (double)a->n * a->hw, unbias = m > 1 ? m / (m - 1) : 1;
	for (int64_t b = lo; b < hi; b++) {
		double mean[BLK], var[BLK];
		float scale[BLK], shift[BLK];
		stats8(a, b, mean, var);
		for (int j = 0; j < BLK; j++) {
			int ch = (int)b * BLK + j;
			double g = a->gamma ? a->gamma[ch] : 1, bt = a->beta ? a->beta[ch] : 0;
			double sc = g / sqrt(var[j] + a->eps);
			if (a->save_mean) {
				a->save_mean[ch] = mean[j];
				a->save_var[ch] = var[j];
			}
			scale[j] = (float)sc;
			shift[j] = (float)(bt - mean[j] * sc);
			if (a->running_mean)
				a->running_mean[ch] = (float)((1 - a->momentum) * a->running_mean[ch] +
							      a->momentum * mean[j]);
			if (a->running_var)
				a->running_var[ch] = (float)((1 - a->momentum) * a->running_var[ch] +
							     a->momentum * var[j] * unbias);
		}
		affine8(a, b, scale, shift);
	}
}

CLONES static void bn8_eval_part(void *arg, int64_t lo, int64_t hi)
{
	const bn8_args *a = arg;
	for (int64_t b = lo; b < hi; b++) {
		float scale[BLK], shift[BLK];
		for (int j = 0; j < BLK; j++) {
			int ch = (int)b * BLK + j;
			double g = a->gamma ? a->gamma[ch] : 1, bt = a->beta ? a->beta[ch] : 0;
			double sc = g / sqrt((double)a->rvar_in[ch] + a->eps);
			scale[j] = (float)sc;
			shift[j] = (float)(bt - a->rmean_in[ch] * sc);
		}
		affine8(a, b, scale, shift);
	}
}

CLONES static void bn8_bwd_part(void *arg, int64_t lo, int64_t hi)
{
	const bn8_args *a = arg;
	const int cb = a->c / BLK;
	const double m = (double)a->n * a->hw;
	for (int64_t b = lo; b < hi; b++) {
		double mean[BLK], var[BLK], sdy[BLK] = { 0 }, sdyx[BLK] = { 0 };
		float mt[BLK];
		if (a->saved_mean)
			for (int j = 0; j < BLK; j++) {
				mean[j] = a->saved_mean[b * BLK + j];
				var[j] = a->saved_var[b * BLK + j];
			}
		else
			stats8(a, b, mean, var);
		for (int j = 0; j < BLK; j++)
			mt[j] = (float)mean[j];
		for (int i = 0; i < a->n; i++) {
			int64_t o = ((int64_t)i * cb + b) * a->hw * BLK;
			const float *p = a->x + o, *d = a->dy + o;
			for (int64_t k0 = 0; k0 < a->hw; k0 += SUM_BLOCK) {
				int64_t e = k0 + SUM_BLOCK < a->hw ? k0 + SUM_BLOCK : a->hw;
				float ba[BLK] = { 0 }, bb[BLK] = { 0 };
				for (int64_t k = k0; k < e; k++)
					for (int j = 0; j < BLK; j++) {
						float g = d[k * BLK + j];
						ba[j] += g;
						bb[j] += g * (p[k * BLK + j] - mt[j]);
					}
				for (int j = 0; j < BLK; j++) {
					sdy[j] += ba[j];
					sdyx[j] += bb[j];
				}
			}
		}
		float ca[BLK], cbv[BLK], cd[BLK];
		for (int j = 0; j < BLK; j++) {
			int ch = (int)b * BLK + j;
			double istd = 1 / sqrt(var[j] + a->eps);
			double k = (a->gamma ? a->gamma[ch] : 1) * istd;
			double bbv = -k * (sdyx[j] / m) * istd * istd;
			ca[j] = (float)k;
			cbv[j] = (float)bbv;
			cd[j] = (float)(-k * (sdy[j] / m) - bbv * mean[j]);
			if (a->dgamma)
				a->dgamma[ch] = (float)(sdyx[j] * istd);
			if (a->dbeta)
				a->dbeta[ch] = (float)sdy[j];
		}
		if (!a->dx)
			continue;
		for (int i = 0; i < a->n; i++) {
			int64_t o = ((int64_t)i * cb + b) * a->hw * BLK;
			const float *p = a->x + o, *d = a->dy + o;
			float *q = a->dx + o;
			for (int64_t k = 0; k < a->hw; k++)
				for (int j = 0; j < BLK; j++)
					q[k * BLK + j] = d[k * BLK + j] * ca[j] + p[k * BLK + j] * cbv[j] +
							 cd[j];
		}
	}
}

CLONES static void chsum8_part(void *arg, int64_t lo, int64_t hi)
{
	const bn8_args *a = arg;
	for (int64_t b = lo; b < hi; b++) {
		double s[BLK];
		sums8(a, a->x, b, s);
		for (int j = 0; j < BLK; j++)
			a->out[b * BLK + j] = (float)s[j];
	}
}

static void bn8_run(bn8_args *a, loom_cpu_team_range_fn fn)
{
	loom_cpu_team_for(a->c / BLK, threads_for((int64_t)a->n * a->c * a->hw), fn, a);
}

void loom_cpu_bn8_fwd_train(int n, int c, int64_t hw, const float *x, const float *gamma,
			    const float *beta, float *running_mean, float *running_var,
			    double momentum, double eps, float *y)
{
	bn8_args a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma, .beta = beta,
		       .running_mean = running_mean, .running_var = running_var,
		       .momentum = momentum, .eps = eps, .y = y };
	bn8_run(&a, bn8_train_part);
}

void loom_cpu_bn8_fwd_train_save(int n, int c, int64_t hw, const float *x, const float *gamma,
				 const float *beta, float *running_mean, float *running_var,
				 double momentum, double eps, float *y, double *mean, double *var)
{
	bn8_args a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma, .beta = beta,
		       .running_mean = running_mean, .running_var = running_var,
		       .momentum = momentum, .eps = eps, .y = y, .save_mean = mean,
		       .save_var = var };
	bn8_run(&a, bn8_train_part);
}

void loom_cpu_bn8_fwd_eval(int n, int c, int64_t hw, const float *x, const float *gamma,
			   const float *beta, const float *running_mean,
			   const float *running_var, double eps, float *y)
{
	bn8_args a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma, .beta = beta,
		       .rmean_in = running_mean, .rvar_in = running_var, .eps = eps, .y = y };
	bn8_run(&a, bn8_eval_part);
}

void loom_cpu_bn8_bwd(int n, int c, int64_t hw, const float *x, const float *gamma,
		      const float *dy, double eps, float *dx, float *dgamma, float *dbeta)
{
	bn8_args a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma, .dy = dy, .eps = eps,
		       .dx = dx, .dgamma = dgamma, .dbeta = dbeta };
	bn8_run(&a, bn8_bwd_part);
}

void loom_cpu_bn8_bwd_saved(int n, int c, int64_t hw, const float *x, const float *gamma,
			    const float *dy, double eps, const double *mean, const double *var,
			    float *dx, float *dgamma, float *dbeta)
{
	bn8_args a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma, .dy = dy, .eps = eps,
		       .dx = dx, .dgamma = dgamma, .dbeta = dbeta, .saved_mean = mean,
		       .saved_var = var };
	bn8_run(&a, bn8_bwd_part);
}

void loom_cpu_channel_sum8(int n, int c, int64_t hw, const float *x, float *out)
{
	bn8_args a = { .n = n, .c = c, .hw = hw, .x = x, .out = out };
	bn8_run(&a, chsum8_part);
}

/* ------------------------------------------------------------ max pooling */

typedef struct pool8_args {
	const loom_pool_shape *s;
	const float *x, *dy;
	float *y;
	int64_t in_plane, out_plane; /* floats per nChw8c plane (pool8_run sets them) */
} pool8_args;

/* Whether v replaces the running max m (pool_impl.h's rule). */
static inline int takes(float m, float v)
{
	return v > m || (v != v && m == m);
}

/* Window (oh, ow) clipped to the image; 0 if it lies wholly in padding. */
static inline int window(const loom_pool_shape *s, int oh, int ow, int *hlo, int *hhi, int *wlo,
			 int *whi)
{
	int h0 = oh * s->stride - s->pad, w0 = ow * s->stride - s->pad;
	*hlo = h0 < 0 ? 0 : h0;
	*hhi = h0 + s->k < s->h_in ? h0 + s->k : s->h_in;
	*wlo = w0 < 0 ? 0 : w0;
	*whi = w0 + s->k < s->w_in ? w0 + s->k : s->w_in;
	return *hlo < *hhi && *wlo < *whi;
}

CLONES static void pool8_fwd_part(void *arg, int64_t lo, int64_t hi)
{
	const pool8_args *a = arg;
	const loom_pool_shape *s = a->s;
	const int64_t in_plane = a->in_plane, out_plane = a->out_plane;
	for (int64_t pl = lo; pl < hi; pl++) {
		const float *xp = a->x + pl * in_plane;
		float *yp = a->y + pl * out_plane;
		for (int oh = 0; oh < s->h_out; oh++)
			for (int ow = 0; ow < s->w_out; ow++) {
				float m[BLK];
				int hlo, hhi, wlo, whi;
				float *o = yp + ((int64_t)oh * s->w_out + ow) * BLK;
				if (!window(s, oh, ow, &hlo, &hhi, &wlo, &whi)) {
					for (int j = 0; j < BLK; j++)
						o[j] = s->relu ? 0 : -INFINITY;
					continue;
				}
				const float *first = xp + ((int64_t)hlo * s->w_in + wlo) * BLK;
				for (int j = 0; j < BLK; j++)
					m[j] = first[j];
				for (int ih = hlo; ih < hhi; ih++)
					for (int iw = wlo; iw < whi; iw++) {
						const float *v = xp + ((int64_t)ih * s->w_in + iw) * BLK;
						for (int j = 0; j < BLK; j++)
							m[j] = takes(m[j], v[j]) ? v[j] : m[j];
					}
				for (int j = 0; j < BLK; j++)
					o[j] = s->relu && !(m[j] > 0 || m[j] != m[j]) ? 0 : m[j];
			}
	}
}

CLONES static void pool8_bwd_part(void *arg, int64_t lo, int64_t hi)
{
	const pool8_args *a = arg;
	const loom_pool_shape *s = a->s;
	const int64_t in_plane = a->in_plane, out_plane = a->out_plane;
	for (int64_t pl = lo; pl < hi; pl++) {
		const float *xp = a->x + pl * in_plane, *dp = a->dy + pl * out_plane;
		float *gp = a->y + pl * in_plane;
		memset(gp, 0, sizeof(float) * in_plane);
		for (int oh = 0; oh < s->h_out; oh++)
			for (int ow = 0; ow < s->w_out; ow++) {
				int hlo, hhi, wlo, whi;
				if (!window(s, oh, ow, &hlo, &hhi, &wlo, &whi))
					continue;
				int64_t best[BLK], at = ((int64_t)hlo * s->w_in + wlo) * BLK;
				float m[BLK];
				for (int j = 0; j < BLK; j++) {
					m[j] = xp[at + j];
					best[j] = at + j;
				}
				for (int ih = hlo; ih < hhi; ih++)
					for (int iw = wlo; iw < whi; iw++) {
						int64_t q = ((int64_t)ih * s->w_in + iw) * BLK;
						for (int j = 0; j < BLK; j++)
							if (takes(m[j], xp[q + j])) {
								m[j] = xp[q + j];
								best[j] = q + j;
							}
					}
				const float *g = dp + ((int64_t)oh * s->w_out + ow) * BLK;
				for (int j = 0; j < BLK; j++)
					if (!s->relu || m[j] > 0)
						gp[best[j]] += g[j];
			}
	}
}

static void pool8_run(pool8_args *a, loom_cpu_team_range_fn fn)
{
	const loom_pool_shape *s = a->s;
	int64_t planes = (int64_t)s->n * (s->c / BLK);
	a->in_plane = (int64_t)s->h_in * s->w_in * BLK;
	a->out_plane = (int64_t)s->h_out * s->w_out * BLK;
	loom_cpu_team_for(planes, threads_for((int64_t)s->n * s->c * s->h_in * s->w_in), fn, a);
}

void loom_cpu_maxpool8_fwd(const loom_pool_shape *s, const float *x, float *y)
{
	pool8_args a = { .s = s, .x = x, .y = y };
	pool8_run(&a, pool8_fwd_part);
}

void loom_cpu_maxpool8_bwd(const loom_pool_shape *s, const float *x, const float *dy,
			   float *dx)
{
	pool8_args a = { .s = s, .x = x, .dy = dy, .y = dx };
	pool8_run(&a, pool8_bwd_part);
}
