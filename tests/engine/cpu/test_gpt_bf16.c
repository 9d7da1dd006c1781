/*
 * tests/engine/cpu/test_gpt_bf16.c — the native bf16 kernels of the op
 * families (engine/cpu/layernorm.c, attention.c, ...) against the f32
 * ones: layer norm and RMS norm (forward, dx, dgamma), the five attention
 * kernels, softmax cross-entropy and embedding, forward and backward, on
 * bf16 inputs in each mix of f32 and bf16 the AMP plans make (and RMS
 * norm's f32 forward against its formula). Each result must be the f32
 * kernel's rounded once (the bits backend.c's emulation gives) and so
 * within half a bf16 ulp of the f32 op; the converters (bf16_rows.c)
 * against half.h's scalar ones, NaN and subnormals included. Run once per
 * instruction-set path (BUILD).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double urand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}

/* One array, bf16-representable: f the f32 values, h the same as bf16. */
typedef struct arr {
	int64_t n;
	float *f;
	uint16_t *h;
} arr;

static arr arr_rand(int64_t n, double lo, double hi)
{
	arr a = { n, malloc(4 * (size_t)(n ? n : 1)), malloc(2 * (size_t)(n ? n : 1)) };
	cr_assert(a.f && a.h);
	for (int64_t i = 0; i < n; i++) {
		a.h[i] = loom_f32_to_bf16((float)(lo + (hi - lo) * urand()));
		a.f[i] = loom_bf16_to_f32(a.h[i]);
	}
	return a;
}

static void arr_free(arr *a)
{
	free(a->f);
	free(a->h);
}

static const void *as(const arr *a, unsigned half, int i)
{
	return half & LOOM_CPU_BF16_SRC(i) ? (const void *)a->h : (const void *)a->f;
}

/* An output of n elements in f32 or bf16, filled with a NaN pattern so a
 * skipped element shows. */
static void *out_new(int64_t n, unsigned half)
{
	size_t sz = (half & LOOM_CPU_BF16_OUT ? 2 : 4) * (size_t)(n ? n : 1);
	void *p = malloc(sz);
	cr_assert(p);
	memset(p, 0xff, sz);
	return p;
}

/* y against ref (the f32 kernel on the same inputs): rounded once. */
static void check_out(const char *what, unsigned half, int64_t n, const void *y, const float *ref)
{
	for (int64_t i = 0; i < n; i++) {
		if (half & LOOM_CPU_BF16_OUT) {
			uint16_t got = ((const uint16_t *)y)[i], want = loom_f32_to_bf16(ref[i]);
			float g = loom_bf16_to_f32(got);
			cr_assert_eq(got, want,
				     "%s (mask 0x%x): [%lld] = 0x%04x (%g), the f32 op rounded is "
				     "0x%04x (%.9g)",
				     what, half, (long long)i, got, g, want, ref[i]);
			cr_assert(fabsf(g - ref[i]) <= ldexpf(fabsf(ref[i]), -8) + 1e-37f,
				  "%s: [%lld] %g is more than half a bf16 ulp from %g", what,
				  (long long)i, g, ref[i]);
		} else {
			uint32_t a, b;
			memcpy(&a, (const float *)y + i, 4);
			memcpy(&b, ref + i, 4);
			cr_assert_eq(a, b, "%s (mask 0x%x): [%lld] = %.9g, the f32 op gives %.9g",
				     what, half, (long long)i, ((const float *)y)[i], ref[i]);
		}
	}
}

/* ------------------------------------------------------------ converters */

static void bf16_fill(uint16_t *p, int64_t n)
{
	static const uint16_t special[] = { 0x7fc0, 0xffc1, 0x7f81, 0x7f80, 0xff80, 0x0000,
					    0x8000, 0x0001, 0x807f, 0x0040, 0x7f7f, 0xff7f };
	for (int64_t i = 0; i < n; i++) {
		double u = urand();
		if (u < 0.1)
			p[i] = special[(int64_t)(urand() * 12) % 12];
		else
			p[i] = (uint16_t)(urand() * 65536);
	}
}

Test(bf16_rows, widen_round_and_acc_match_half_h)
{
	const int64_t ns[] = { 0, 1, 7, 8, 9, 31, 1003 };
	for (int k = 0; k < 7; k++) {
		int64_t n = ns[k];
		uint16_t *h = malloc(2 * (size_t)n + 2), *r = malloc(2 * (size_t)n + 2);
		float *f = malloc(4 * (size_t)n + 4), *acc = malloc(4 * (size_t)n + 4);
		uint32_t *bits = malloc(4 * (size_t)n + 4);
		bf16_fill(h, n);
		loom_cpu_bf16_widen(n, h, f);
		for (int64_t i = 0; i < n; i++) {
			uint32_t b;
			memcpy(&b, f + i, 4);
			cr_assert_eq(b, (uint32_t)h[i] << 16, "widen [%lld] of 0x%04x", (long long)i,
				     h[i]);
		}
		/* Rounding: every fp32 pattern class, ties and NaN payloads. */
		for (int64_t i = 0; i < n; i++) {
			bits[i] = (uint32_t)(urand() * 4294967296.0);
			if (i % 5 == 0)
				bits[i] = (bits[i] & 0xffff0000u) | 0x8000u; /* a tie */
			memcpy(f + i, bits + i, 4);
		}
		loom_cpu_bf16_round(n, f, r);
		for (int64_t i = 0; i < n; i++)
			cr_assert_eq(r[i], loom_f32_to_bf16(f[i]),
				     "round [%lld] of 0x%08x: 0x%04x, half.h gives 0x%04x",
				     (long long)i, bits[i], r[i], loom_f32_to_bf16(f[i]));
		for (int64_t i = 0; i < n; i++)
			acc[i] = f[i] = (float)(urand() * 8 - 4);
		loom_cpu_bf16_acc(n, h, acc);
		for (int64_t i = 0; i < n; i++) {
			float want = f[i] + loom_bf16_to_f32(h[i]);
			cr_assert(memcmp(&want, acc + i, 4) == 0 || (isnan(want) && isnan(acc[i])),
				  "acc [%lld]", (long long)i);
		}
		free(h), free(r), free(f), free(acc), free(bits);
	}
}

/* ------------------------------------------------------------ layer norm */

static const unsigned ln_masks[] = {
	LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_SRC(2) | LOOM_CPU_BF16_OUT,
	LOOM_CPU_BF16_OUT,                        /* O1: f32 in, bf16 out */
	LOOM_CPU_BF16_SRC(2) | LOOM_CPU_BF16_OUT, /* one bf16 source */
	LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(2),
};

static void check_layernorm(int64_t rows, int c)
{
	arr x = arr_rand(rows * c, -3, 3), g = arr_rand(c, 0.5, 1.5), b = arr_rand(c, -1, 1);
	arr dy = arr_rand(rows * c, -1, 1);
	float *ref = malloc(4 * (size_t)rows * c), *rg = malloc(4 * (size_t)c);
	double *ws = malloc(loom_cpu_norm_bwd_gamma_ws(c));
	char what[64];
	for (unsigned k = 0; k < sizeof(ln_masks) / sizeof(ln_masks[0]); k++) {
		unsigned half = ln_masks[k];
		void *y = out_new(rows * c, half), *dg = out_new(c, half);
		snprintf(what, sizeof(what), "layernorm %lldx%d", (long long)rows, c);
		loom_cpu_layernorm_fwd_f32(rows, c, x.f, g.f, b.f, 1e-5, ref);
		cr_assert(loom_cpu_layernorm_fwd_bf16(rows, c, as(&x, half, 0), as(&g, half, 1),
						      as(&b, half, 2), 1e-5, y, half));
		check_out(what, half, rows * c, y, ref);
		snprintf(what, sizeof(what), "layernorm dx %lldx%d", (long long)rows, c);
		loom_cpu_layernorm_bwd_data_f32(rows, c, x.f, g.f, dy.f, 1e-5, ref);
		cr_assert(loom_cpu_norm_bwd_data_bf16(loom_cpu_layernorm_bwd_data_f32, rows, c,
						      as(&x, half, 0), as(&g, half, 1),
						      as(&dy, half, 2), 1e-5, y, half));
		check_out(what, half, rows * c, y, ref);
		/* dgamma's sources are (x, dy): bits 0 and 1. */
		unsigned hg = (half & LOOM_CPU_BF16_OUT) | (half & LOOM_CPU_BF16_SRC(0)) |
			      (half & LOOM_CPU_BF16_SRC(2) ? LOOM_CPU_BF16_SRC(1) : 0);
		snprintf(what, sizeof(what), "layernorm dgamma %lldx%d", (long long)rows, c);
		loom_cpu_norm_bwd_gamma_f32(loom_cpu_layernorm_gamma_rows_f32, rows, c, x.f, dy.f,
					    1e-5, rg, ws);
		cr_assert(loom_cpu_norm_bwd_gamma_bf16(loom_cpu_layernorm_gamma_rows_f32, rows, c,
						       as(&x, hg, 0), as(&dy, hg, 1), 1e-5, dg, ws,
						       hg));
		check_out(what, hg, c, dg, rg);
		free(y), free(dg);
	}
	arr_free(&x), arr_free(&g), arr_free(&b), arr_free(&dy);
	free(ref), free(rg), free(ws);
}

Test(gpt_bf16, layernorm_forward_and_backward)
{
	check_layernorm(1, 1);
	check_layernorm(123, 100); /* blocks of 40 rows, a short last one */
	check_layernorm(300, 128); /* threads */
	check_layernorm(3, 4096);  /* one row per block */
}

Test(gpt_bf16, layernorm_declines_rows_wider_than_its_blocks)
{
	arr x = arr_rand(2 * 5000, -1, 1), g = arr_rand(5000, 0.5, 1.5);
	unsigned half = LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_OUT;
	uint16_t *y = out_new(2 * 5000, half);
	cr_assert_eq(loom_cpu_layernorm_fwd_bf16(2, 5000, x.h, g.f, g.f, 1e-5, y, half), 0);
	for (int i = 0; i < 2 * 5000; i++)
		cr_assert_eq(y[i], 0xffff, "a declining kernel wrote [%d]", i);
	free(y);
	arr_free(&x), arr_free(&g);
}

/* -------------------------------------------------------------- RMS norm */

static void check_rmsnorm(int64_t rows, int c)
{
	arr x = arr_rand(rows * c, -3, 3), g = arr_rand(c, 0.5, 1.5), dy = arr_rand(rows * c, -1, 1);
	float *ref = malloc(4 * (size_t)rows * c), *rg = malloc(4 * (size_t)c);
	double *ws = malloc(loom_cpu_norm_bwd_gamma_ws(c));
	char what[64];
	/* The f32 forward against the formula, x / sqrt(mean(x^2) + eps) * gamma. */
	loom_cpu_rmsnorm_fwd_f32(rows, c, x.f, g.f, 1e-5, ref);
	for (int64_t r = 0; r < rows; r++) {
		double ss = 0;
		for (int j = 0; j < c; j++)
			ss += (double)x.f[r * c + j] * x.f[r * c + j];
		for (int j = 0; j < c; j++) {
			double want = x.f[r * c + j] / sqrt(ss / c + 1e-5) * g.f[j];
			cr_assert(fabs(ref[r * c + j] - want) <= 1e-6 * fabs(want) + 1e-7,
				  "rms_norm [%lld, %d] = %.9g, the formula gives %.9g", (long long)r,
				  j, ref[r * c + j], want);
		}
	}
	for (unsigned k = 0; k < sizeof(ln_masks) / sizeof(ln_masks[0]); k++) {
		unsigned half = ln_masks[k];
		void *y = out_new(rows * c, half), *dg = out_new(c, half);
		snprintf(what, sizeof(what), "rms_norm %lldx%d", (long long)rows, c);
		loom_cpu_rmsnorm_fwd_f32(rows, c, x.f, g.f, 1e-5, ref);
		cr_assert(loom_cpu_rmsnorm_fwd_bf16(rows, c, as(&x, half, 0), as(&g, half, 1), 1e-5,
						    y, half));
		check_out(what, half, rows * c, y, ref);
		snprintf(what, sizeof(what), "rms_norm dx %lldx%d", (long long)rows, c);
		loom_cpu_rmsnorm_bwd_data_f32(rows, c, x.f, g.f, dy.f, 1e-5, ref);
		cr_assert(loom_cpu_norm_bwd_data_bf16(loom_cpu_rmsnorm_bwd_data_f32, rows, c,
						      as(&x, half, 0), as(&g, half, 1),
						      as(&dy, half, 2), 1e-5, y, half));
		check_out(what, half, rows * c, y, ref);
		/* dgamma's sources are (x, dy): bits 0 and 1. */
		unsigned hg = (half & LOOM_CPU_BF16_OUT) | (half & LOOM_CPU_BF16_SRC(0)) |
			      (half & LOOM_CPU_BF16_SRC(2) ? LOOM_CPU_BF16_SRC(1) : 0);
		snprintf(what, sizeof(what), "rms_norm dgamma %lldx%d", (long long)rows, c);
		loom_cpu_norm_bwd_gamma_f32(loom_cpu_rmsnorm_gamma_rows_f32, rows, c, x.f, dy.f,
					    1e-5, rg, ws);
		cr_assert(loom_cpu_norm_bwd_gamma_bf16(loom_cpu_rmsnorm_gamma_rows_f32, rows, c,
						       as(&x, hg, 0), as(&dy, hg, 1), 1e-5, dg, ws,
						       hg));
		check_out(what, hg, c, dg, rg);
		free(y), free(dg);
	}
	arr_free(&x), arr_free(&g), arr_free(&dy);
	free(ref), free(rg), free(ws);
}

Test(gpt_bf16, rms_norm_forward_and_backward)
{
	check_rmsnorm(1, 1);
	check_rmsnorm(123, 100); /* blocks of 40 rows, a short last one */
	check_rmsnorm(300, 128); /* threads */
	check_rmsnorm(3, 4096);  /* one row per block */
}

/* ------------------------------------------------------------- attention */

static const unsigned attn_masks[] = {
	LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_SRC(2) | LOOM_CPU_BF16_OUT,
	LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_SRC(2),
	LOOM_CPU_BF16_OUT,
	LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_OUT,
};

static void check_attention(loom_attn_shape s)
{
	const int64_t nq = (int64_t)s.b * s.t * 3 * s.c, np = (int64_t)s.b * s.nh * s.t * s.t;
	const int64_t ny = (int64_t)s.b * s.t * s.c;
	arr qkv = arr_rand(nq, -2, 2), p = arr_rand(np, 0, 1), dp = arr_rand(np, -1, 1);
	arr dy = arr_rand(ny, -1, 1);
	float *ref = malloc(4 * (size_t)(nq > np ? nq : np));
	float *kws = malloc(loom_cpu_attn_probs_bwd_ws(s.t, 4));
	char what[96];
	for (int k = LOOM_CPU_ATTN_PROBS_FWD; k <= LOOM_CPU_ATTENTION_BWD_QKV; k++) {
		const arr *src[3];
		int64_t nout;
		switch (k) {
		case LOOM_CPU_ATTN_PROBS_FWD:
			src[0] = &qkv, nout = np;
			loom_cpu_attn_probs_fwd_f32(&s, qkv.f, ref);
			break;
		case LOOM_CPU_ATTN_PROBS_BWD:
			src[0] = &qkv, src[1] = &p, src[2] = &dp, nout = nq;
			loom_cpu_attn_probs_bwd_f32(&s, qkv.f, p.f, dp.f, ref, kws);
			break;
		case LOOM_CPU_ATTENTION_FWD:
			src[0] = &p, src[1] = &qkv, nout = ny;
			loom_cpu_attention_fwd_f32(&s, p.f, qkv.f, ref);
			break;
		case LOOM_CPU_ATTENTION_BWD_PROBS:
			src[0] = &qkv, src[1] = &dy, nout = np;
			loom_cpu_attention_bwd_probs_f32(&s, qkv.f, dy.f, ref);
			break;
		default:
			src[0] = &p, src[1] = &dy, nout = nq;
			loom_cpu_attention_bwd_qkv_f32(&s, p.f, dy.f, ref);
			break;
		}
		for (unsigned m = 0; m < sizeof(attn_masks) / sizeof(attn_masks[0]); m++) {
			unsigned half = attn_masks[m];
			const void *in[3] = { NULL };
			for (int i = 0; i < 3; i++)
				if (k == LOOM_CPU_ATTN_PROBS_BWD || i < (k == LOOM_CPU_ATTN_PROBS_FWD ? 1 : 2))
					in[i] = as(src[i], half, i);
			void *out = out_new(nout, half);
			size_t wsb = loom_cpu_attn_bf16_ws(k, &s);
			void *ws = malloc(wsb);
			snprintf(what, sizeof(what), "attention kernel %d b%d t%d c%d nh%d", k, s.b, s.t,
				 s.c, s.nh);
			cr_assert(loom_cpu_attn_bf16(k, &s, in, out, ws, wsb, half));
			check_out(what, half, nout, out, ref);
			/* No room for one batch's copies: declined, nothing written. */
			if (half & LOOM_CPU_BF16_OUT) {
				memset(out, 0xff, 2 * (size_t)nout);
				cr_assert_eq(loom_cpu_attn_bf16(k, &s, in, out, ws, 32, half), 0);
				for (int64_t i = 0; i < nout; i++)
					cr_assert_eq(((uint16_t *)out)[i], 0xffff,
						     "%s: a declining kernel wrote [%lld]", what,
						     (long long)i);
			}
			free(out), free(ws);
		}
	}
	arr_free(&qkv), arr_free(&p), arr_free(&dp), arr_free(&dy);
	free(ref), free(kws);
}

Test(gpt_bf16, attention_kernels_forward_and_backward)
{
	check_attention((loom_attn_shape){ 1, 1, 2, 1 });
	check_attention((loom_attn_shape){ 3, 5, 6, 2 });
	check_attention((loom_attn_shape){ 2, 64, 128, 4 }); /* batches in turn, threads over heads */
	check_attention((loom_attn_shape){ 4, 96, 64, 2 });  /* threads over the batches */
}

/* ------------------------------------------------ softmax cross-entropy */

Test(gpt_bf16, softmax_cross_entropy_forward_and_backward)
{
	const int n = 37, classes = 50;
	arr x = arr_rand((int64_t)n * classes, -6, 6), dl = arr_rand(1, 0.5, 2);
	int32_t labels[37];
	float *ref = malloc(4 * (size_t)n * classes), ws[2 * 50], want, got;
	for (int i = 0; i < n; i++)
		labels[i] = (int)(urand() * classes) % classes;
	cr_assert_eq(loom_cpu_softmax_ce_fwd_f32(n, classes, x.f, labels, &want, NULL), 0);
	for (unsigned half = 0; half <= 1; half++) {
		cr_assert_eq(loom_cpu_softmax_ce_fwd_bf16(n, classes, as(&x, half, 0), labels, &got,
							  NULL, ws, half),
			     0);
		cr_assert(memcmp(&got, &want, 4) == 0, "loss %.9g, the f32 op gives %.9g", got,
			  want);
	}
	const unsigned masks[] = {
		LOOM_CPU_BF16_OUT, /* the plans': f32 logits and dloss, bf16 dlogits */
		LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(2) | LOOM_CPU_BF16_OUT,
		LOOM_CPU_BF16_SRC(0),
	};
	loom_cpu_softmax_ce_bwd_f32(n, classes, x.f, labels, dl.f, ref);
	for (int m = 0; m < 3; m++) {
		void *dx = out_new((int64_t)n * classes, masks[m]);
		cr_assert(loom_cpu_softmax_ce_bwd_bf16(n, classes, as(&x, masks[m], 0), labels,
						       as(&dl, masks[m], 2), dx, ws, masks[m]));
		check_out("softmax_ce dlogits", masks[m], (int64_t)n * classes, dx, ref);
		free(dx);
	}
	/* A bad label: -1, its row, no loss written. */
	labels[20] = classes;
	got = -7;
	int bad = -1;
	cr_assert_eq(loom_cpu_softmax_ce_fwd_bf16(n, classes, x.h, labels, &got, &bad, ws, 1), -1);
	cr_assert_eq(bad, 20);
	cr_assert_eq(got, -7);
	arr_free(&x), arr_free(&dl);
	free(ref);
}

/* ------------------------------------------------------------- embedding */

static void check_embedding(int64_t n, int v, int c)
{
	arr table = arr_rand((int64_t)v * c, -1, 1), dy = arr_rand(n * c, -1, 1);
	int32_t *ids = malloc(4 * (size_t)n);
	uint16_t *y = malloc(2 * (size_t)n * c);
	float *ref = malloc(4 * (size_t)v * c), *ws = malloc(4 * (size_t)v * c);
	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)(urand() * (v - 1)); /* the last row never used */
	cr_assert_eq(loom_cpu_embedding_fwd_bf16(n, v, c, ids, table.h, y, NULL), 0);
	for (int64_t i = 0; i < n * c; i++)
		cr_assert_eq(y[i], table.h[(int64_t)ids[i / c] * c + i % c], "gather [%lld]",
			     (long long)i);
	loom_cpu_embedding_bwd_f32(n, v, c, ids, dy.f, ref);
	const unsigned masks[] = { LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_OUT, LOOM_CPU_BF16_OUT,
				   LOOM_CPU_BF16_SRC(1) };
	for (int m = 0; m < 3; m++) {
		void *dt = out_new((int64_t)v * c, masks[m]);
		cr_assert(loom_cpu_embedding_bwd_bf16(n, v, c, ids, as(&dy, masks[m], 1), dt, ws,
						      masks[m]));
		check_out("embedding scatter-add", masks[m], (int64_t)v * c, dt, ref);
		free(dt);
	}
	ids[n - 1] = v;
	int64_t bad = -1;
	memset(y, 0xff, 2 * (size_t)n * c);
	cr_assert_eq(loom_cpu_embedding_fwd_bf16(n, v, c, ids, table.h, y, &bad), -1);
	cr_assert_eq(bad, n - 1);
	for (int64_t i = 0; i < n * c; i++)
		cr_assert_eq(y[i], 0xffff, "a refused gather wrote [%lld]", (long long)i);
	arr_free(&table), arr_free(&dy);
	free(ids), free(y), free(ref), free(ws);
}

Test(gpt_bf16, embedding_forward_and_backward)
{
	check_embedding(50, 13, 40);
	check_embedding(1000, 17, 64); /* threads over columns */
}
