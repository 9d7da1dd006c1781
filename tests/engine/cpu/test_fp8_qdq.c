/*
 * tests/engine/cpu/test_fp8_qdq.c — FP8_QDQ's CPU kernel (engine/cpu/fp8_qdq.c)
 * against base/fp8.h's scalar converters and a scale found by doubling:
 * random tensors over a wide range (E4M3 and E5M2 subnormals included),
 * the top of the range (rounding up to the largest finite value), all-zero
 * tensors (scale 1, zeros out, no NaN), a NaN element; and the node in a
 * bf16 program, whose results must be exactly the f32 kernel's (every
 * dequantized value is a bf16); a stored rounding's codes and scale
 * decoded (loom_cpu_fp8_decode) into f32, bf16 and f16 give the bits of
 * the rounding cast to that dtype, down to f32's subnormals.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp8.h"
#include "base/splitmix.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/ops.h"
#include "graph/ops/ops.h"
#include "loom.h"

static float fmax_of(loom_dtype fmt)
{
	return fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
}

/* The scale by its definition: the largest power of two s, s * amax <= fmax. */
static double scale_by_doubling(double amax, double fmax)
{
	if (!(amax > 0) || isinf(amax))
		return 1;
	double s = 1;
	while (s * amax > fmax)
		s /= 2;
	while (2 * s * amax <= fmax && s < 0x1p117)
		s *= 2;
	return s;
}

static void ref_qdq(const float *x, float *y, int n, loom_dtype fmt)
{
	double amax = 0;
	for (int i = 0; i < n; i++)
		if (fabsf(x[i]) > amax)
			amax = fabsf(x[i]);
	double s = scale_by_doubling(amax, fmax_of(fmt));
	for (int i = 0; i < n; i++) {
		float q = (float)(x[i] * s);
		double d = fmt == LOOM_FP8_E4M3 ? loom_e4m3_to_f32(loom_f32_to_e4m3(q)) :
						  loom_e5m2_to_f32(loom_f32_to_e5m2(q));
		y[i] = (float)(d / s);
	}
}

/* Bits, so that -0 and NaN compare as what they are. */
static void same_bits(const float *a, const float *b, int n, const char *what)
{
	for (int i = 0; i < n; i++) {
		uint32_t x, y;
		memcpy(&x, &a[i], 4);
		memcpy(&y, &b[i], 4);
		cr_assert(x == y || (isnan(a[i]) && isnan(b[i])), "%s: element %d: %.9g, want %.9g",
			  what, i, a[i], b[i]);
	}
}

/* x = m 2^e, m in [-1, 1), e spread over `range` binades below `top`. */
static void fill_wide(uint64_t *rng, float *x, int n, int top, int range)
{
	for (int i = 0; i < n; i++) {
		double m = (double)(loom_splitmix64(rng) >> 11) / 9007199254740992.0 * 2 - 1;
		x[i] = (float)ldexp(m, top - (int)(loom_splitmix64(rng) % (uint64_t)range));
	}
}

Test(fp8_qdq, scale_is_the_largest_power_of_two_under_fmax)
{
	uint64_t rng = 7;
	for (int k = 0; k < 20000; k++) {
		float a;
		fill_wide(&rng, &a, 1, 60, 120);
		a = fabsf(a);
		for (int f = 0; f < 2; f++) {
			float fm = f ? LOOM_E5M2_MAX : LOOM_E4M3_MAX;
			cr_assert_eq((double)loom_fp8_scale(a, fm), scale_by_doubling(a, fm),
				     "amax %a fmax %g", a, fm);
		}
	}
	/* at the edges of a binade: amax exactly fmax / 2^k, and just above */
	cr_assert_eq(loom_fp8_scale(448.0f / 8, LOOM_E4M3_MAX), 8.0f);
	cr_assert_eq(loom_fp8_scale(nextafterf(448.0f / 8, 1e9f), LOOM_E4M3_MAX), 4.0f);
	cr_assert_eq(loom_fp8_scale(0, LOOM_E4M3_MAX), 1.0f);
	cr_assert_eq(loom_fp8_scale(INFINITY, LOOM_E4M3_MAX), 1.0f);
	cr_assert_eq(loom_fp8_scale(NAN, LOOM_E5M2_MAX), 1.0f);
	cr_assert_eq(loom_fp8_scale(1e-38f, LOOM_E5M2_MAX), 0x1p117f, "capped at 2^117");
}

Test(fp8_qdq, random_tensors_match_base_fp8)
{
	enum { N = 4099 };
	float *x = malloc(4 * N), *y = malloc(4 * N), *want = malloc(4 * N);
	uint64_t rng = 42;
	for (int t = 0; t < 24; t++) {
		loom_dtype fmt = t & 1 ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3;
		/* 12 to 28 binades below 2^(t - 12): many elements fall in
		 * each format's subnormals, some round to zero */
		int n = N - t * 37;
		fill_wide(&rng, x, n, t - 12, 12 + (t % 5) * 4);
		ref_qdq(x, want, n, fmt);
		loom_cpu_fp8_qdq_f32(x, y, n, fmt);
		same_bits(y, want, n, fmt == LOOM_FP8_E4M3 ? "e4m3" : "e5m2");
		/* in place gives the same */
		loom_cpu_fp8_qdq_f32(x, x, n, fmt);
		same_bits(x, want, n, "in place");
	}
	free(x);
	free(y);
	free(want);
}

/* With current scaling nothing is out of range: the amax lands in
 * (fmax / 2, fmax], and only its rounding can reach the top, which
 * saturates to fmax exactly, never past it. */
Test(fp8_qdq, the_top_rounds_to_the_largest_finite_value)
{
	float x[4] = { 440.0f, -447.0f, 1.0f, 0.3f }, y[4];
	loom_cpu_fp8_qdq_f32(x, y, 4, LOOM_FP8_E4M3);
	cr_assert_eq(y[0], 448.0f);
	cr_assert_eq(y[1], -448.0f);
	cr_assert_eq(y[2], 1.0f);
	float e[3] = { 57000.0f, -61000.0f, 2.0f }, z[3];
	loom_cpu_fp8_qdq_f32(e, z, 3, LOOM_FP8_E5M2);
	/* amax 61000 > 57344: scale 1/2, and 30500 rounds down to 28672 */
	cr_assert_eq(z[1], -57344.0f, "%g", z[1]);
	cr_assert_eq(z[0], 57344.0f, "%g", z[0]);
	/* scaled: amax 3.4 has scale 2^7 (435.2 <= 448), and 3.45 rounds
	 * with it to 448 / 128 = 3.5 */
	float s[2] = { 3.45f, -3.4f }, t[2];
	loom_cpu_fp8_qdq_f32(s, t, 2, LOOM_FP8_E4M3);
	cr_assert_eq(t[0], 3.5f, "%g", t[0]);
	float want[2];
	ref_qdq(s, want, 2, LOOM_FP8_E4M3);
	same_bits(t, want, 2, "scaled top");
}

Test(fp8_qdq, all_zero_tensors_stay_zero)
{
	float x[9] = { 0, -0.0f, 0, 0, 0, 0, 0, -0.0f, 0 }, y[9];
	for (int f = 0; f < 2; f++) {
		memset(y, 0x55, sizeof(y));
		loom_cpu_fp8_qdq_f32(x, y, 9, f ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3);
		same_bits(y, x, 9, "zeros");
	}
}

Test(fp8_qdq, a_nan_stays_nan_and_leaves_the_scale_to_the_rest)
{
	float x[4] = { 1.0f, NAN, 0.3f, -2.0f }, y[4], want[4] = { 1.0f, NAN, 0.3f, -2.0f };
	float rest[3] = { 1.0f, 0.3f, -2.0f }, rw[3];
	ref_qdq(rest, rw, 3, LOOM_FP8_E4M3);
	want[0] = rw[0];
	want[2] = rw[1];
	want[3] = rw[2];
	loom_cpu_fp8_qdq_f32(x, y, 4, LOOM_FP8_E4M3);
	same_bits(y, want, 4, "nan");
}

/* The node in a program: a bf16 input through FP8_QDQ, read back; the
 * kernel's raw path (bf16 in, bf16 out) against the f32 kernel on the
 * widened input, exactly. */
Test(fp8_qdq, bf16_node_gives_the_f32_kernels_values)
{
	enum { N = 40000 }; /* past LOOM_CPU_PAR_MIN: the parallel loops */
	for (int f = 0; f < 2; f++) {
		loom_dtype fmt = f ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3;
		loom_graph *g = NULL;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		int64_t d[1] = { N };
		loom_value x = loom_input(g, "x", LOOM_BF16, 1, d);
		loom_value y = loom_fp8_qdq_node(g, x, fmt, LOOM_F32);
		cr_assert_neq(y, LOOM_NONE);
		g->nodes[y].flags &= ~(uint32_t)LOOM_NODE_AMP; /* a user's value */
		loom_mark_output(g, y);
		loom_value l = loom_sum(g, y);
		loom_compile_opts o;
		loom_compile_opts_default(&o);
		o.device = LOOM_DEVICE_CPU;
		o.optim.kind = LOOM_OPTIM_NONE;
		loom_program *p = NULL;
		cr_assert_eq(loom_compile(g, l, &o, &p), LOOM_OK, "%s", loom_last_error());
		float *xf = malloc(sizeof(float) * N), *want = malloc(sizeof(float) * N);
		double *got = malloc(sizeof(double) * N);
		uint16_t *xb = malloc(sizeof(uint16_t) * N);
		uint64_t rng = 99 + (uint64_t)f;
		fill_wide(&rng, xf, N, 2, 30);
		for (int i = 0; i < N; i++) {
			xb[i] = loom_f32_to_bf16(xf[i]);
			xf[i] = loom_bf16_to_f32(xb[i]);
		}
		loom_cpu_fp8_qdq_f32(xf, want, N, fmt);
		float amax = 0;
		for (int i = 0; i < N; i++)
			amax = fmaxf(amax, fabsf(xf[i]));
		float scale = loom_fp8_scale(amax, fmax_of(fmt));
		cr_assert_eq(loom_set_input(p, "x", xb, LOOM_BF16, N), LOOM_OK, "%s",
			     loom_program_error(p));
		cr_assert_eq(loom_run(p, LOOM_RUN_FORWARD), LOOM_OK, "%s", loom_program_error(p));
		cr_assert_eq(loom_read_f64(p, y, got, N), LOOM_OK, "%s", loom_program_error(p));
		int sub = 0;
		for (int i = 0; i < N; i++) {
			cr_assert_eq(got[i], (double)want[i], "%s element %d: %.9g, want %.9g",
				     f ? "e5m2" : "e4m3", i, got[i], want[i]);
			sub += want[i] != 0 && fabsf(want[i] * scale) < (f ? 0x1p-14f : 0x1p-6f);
		}
		cr_assert_gt(sub, 0, "no element fell into the format's subnormals");
		free(xf);
		free(want);
		free(got);
		free(xb);
		loom_program_free(p);
		loom_graph_free(g);
	}
}

/* A stored rounding (graph/ops/ops.h: the codes, then the scale at
 * loom_fp8_scale_off) decoded into f32, bf16 and f16 gives what the
 * unstored rounding writes in that dtype: its f32 values cast there. The
 * tops reach down to f32's subnormals (scales capped at 2^117), where a
 * decoded value may not be a bf16 and the cast must round as it did. */
Test(fp8_qdq, stored_codes_decode_to_the_roundings_bits)
{
	enum { N = 1500 };
	static const int tops[] = { 8, -4, -20, -120, -135 };
	static const loom_dtype dts[] = { LOOM_F32, LOOM_BF16, LOOM_F16 };
	float x[N], q[N];
	unsigned char stored[N + 8], want[4 * N], got[4 * N];
	uint64_t rng = 99;
	for (int t = 0; t < 10; t++) {
		loom_dtype fmt = t & 1 ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3;
		fill_wide(&rng, x, N, tops[t / 2], 16);
		loom_cpu_fp8_qdq_f32(x, q, N, fmt);
		float amax = 0;
		for (int i = 0; i < N; i++)
			amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
		float sc = loom_fp8_scale(amax, fmax_of(fmt));
		for (int i = 0; i < N; i++)
			stored[i] = fmt == LOOM_FP8_E4M3 ? loom_f32_to_e4m3(x[i] * sc) :
							   loom_f32_to_e5m2(x[i] * sc);
		memcpy(stored + loom_fp8_scale_off(N), &sc, sizeof(sc));
		for (int d = 0; d < 3; d++) {
			size_t sz = loom_dtype_size(dts[d]);
			loom_cpu_cast(LOOM_F32, q, dts[d], want, N);
			loom_cpu_fp8_decode(fmt, stored, N, dts[d], got);
			for (int i = 0; i < N; i++)
				cr_assert(memcmp(got + i * sz, want + i * sz, sz) == 0,
					  "top 2^%d %s to dtype %d: element %d (%a) decodes to other bits",
					  tops[t / 2], fmt == LOOM_FP8_E4M3 ? "e4m3" : "e5m2",
					  (int)dts[d], i, q[i]);
		}
	}
}
