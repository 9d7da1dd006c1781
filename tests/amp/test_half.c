/*
 * tests/amp/test_half.c — fp16/bf16 conversions held to IEEE round to nearest
 * even, bit for bit: edge values, every one of the 2^16 halves, and millions
 * of random floats against an independent oracle and against the other path
 * (F16C vs portable). Built twice: with F16C and with -mno-f16c.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/half.h"

#ifndef LOOM_EXPECT_F16C
#define LOOM_EXPECT_F16C 1
#endif

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
	/* xorshift64*: reproducible, no libc rand() state shared with others */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static int is_nan_f16(uint16_t h)
{
	return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static int is_nan_bf16(uint16_t b)
{
	return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

/* The value of a finite half, computed independently of the code under test. */
static double f16_value(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	int m = h & 0x3ff;
	double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);

	return (h & 0x8000u) ? -v : v;
}

/*
 * Oracle for fp32 -> fp16: binary search the ordered positive halves for the
 * neighbours of |x| and pick the nearer, ties to the even pattern. 2^16 plays
 * the role of the next value after 65504, so anything rounding there is inf.
 */
static uint16_t oracle_f32_to_f16(float x)
{
	uint32_t bits = loom_f32_bits(x);
	uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
	double a = fabs((double)x);
	int lo = 0, hi = 0x7bff;

	if (isnan(x))
		return (uint16_t)(sign | 0x7e00u | ((bits >> 13) & 0x3ffu));
	if (isinf(x))
		return sign | 0x7c00u;
	if (a >= 65536.0)
		return sign | 0x7c00u;
	/* largest pattern p with value(p) <= a */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;

		if (f16_value((uint16_t)mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	{
		double below = f16_value((uint16_t)lo);
		double above = lo == 0x7bff ? 65536.0 : f16_value((uint16_t)(lo + 1));
		double dlo = a - below, dhi = above - a;
		int p = lo;

		if (dhi < dlo || (dhi == dlo && (lo & 1)))
			p = lo + 1; /* 0x7bff + 1 is 0x7c00: inf */
		return (uint16_t)(sign | p);
	}
}

/* Oracle for fp32 -> bf16: the two neighbours are the truncation and the next
 * pattern up; distances measured in double, which holds them exactly. */
static uint16_t oracle_f32_to_bf16(float x)
{
	uint32_t bits = loom_f32_bits(x);
	uint32_t t = bits & 0xffff0000u;
	double a, below, above;

	if (isnan(x))
		return (uint16_t)((bits >> 16) | 0x40u);
	if (isinf(x) || t == bits)
		return (uint16_t)(bits >> 16);
	a = fabs((double)x);
	below = fabs((double)loom_f32_from_bits(t));
	if ((t & 0x7fffffffu) == 0x7f7f0000u)
		above = ldexp(1.0, 128); /* the next one up is inf */
	else
		above = fabs((double)loom_f32_from_bits(t + 0x10000u));
	if (above - a < a - below || (above - a == a - below && ((t >> 16) & 1u)))
		t += 0x10000u;
	return (uint16_t)(t >> 16);
}

/* Converts through the scalar and the array path and checks they agree. */
static uint16_t to_f16(float x)
{
	uint16_t s = loom_f32_to_f16(x), a = 0;

	loom_f32_to_f16_array(&x, &a, 1);
	cr_assert_eq(s, a, "scalar 0x%04x vs array 0x%04x for %a", s, a, (double)x);
	return s;
}

static uint16_t to_bf16(float x)
{
	uint16_t s = loom_f32_to_bf16(x), a = 0;

	loom_f32_to_bf16_array(&x, &a, 1);
	cr_assert_eq(s, a, "scalar 0x%04x vs array 0x%04x for %a", s, a, (double)x);
	return s;
}

Test(half, build_uses_expected_path)
{
	cr_assert_eq(loom_half_uses_f16c(), LOOM_EXPECT_F16C);
}

Test(half, f16_overflow_edges)
{
	cr_assert_eq(to_f16(65504.0f), 0x7bff);
	cr_assert_eq(to_f16(-65504.0f), 0xfbff);
	cr_assert_eq(to_f16(65520.0f), 0x7c00);  /* tie, 0x7bff odd: up to inf */
	cr_assert_eq(to_f16(-65520.0f), 0xfc00);
	cr_assert_eq(to_f16(65519.99f), 0x7bff);
	cr_assert_eq(to_f16(nextafterf(65520.0f, 0.0f)), 0x7bff);
	cr_assert_eq(to_f16(1e10f), 0x7c00);
	cr_assert_eq(to_f16(3.4e38f), 0x7c00);
	cr_assert_eq(to_f16(INFINITY), 0x7c00);
	cr_assert_eq(to_f16(-INFINITY), 0xfc00);
}

Test(half, f16_subnormal_edges)
{
	cr_assert_eq(to_f16(0x1p-14f), 0x0400);            /* min normal */
	cr_assert_eq(to_f16(1023 * 0x1p-24f), 0x03ff);     /* max subnormal */
	cr_assert_eq(to_f16(0x1p-24f), 0x0001);            /* min subnormal */
	cr_assert_eq(to_f16(-0x1p-24f), 0x8001);
	cr_assert_eq(to_f16(0x1p-25f), 0x0000);            /* tie to even 0 */
	cr_assert_eq(to_f16(-0x1p-25f), 0x8000);
	cr_assert_eq(to_f16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
	cr_assert_eq(to_f16(3 * 0x1p-26f), 0x0001);        /* 0.75 ulp: up */
	cr_assert_eq(to_f16(3 * 0x1p-25f), 0x0002);        /* 1.5 ulp: tie to 2 */
	cr_assert_eq(to_f16(5 * 0x1p-25f), 0x0002);        /* 2.5 ulp: tie to 2 */
	cr_assert_eq(to_f16(1023.5f * 0x1p-24f), 0x0400);  /* carries into normal */
	cr_assert_eq(to_f16(0x1p-30f), 0x0000);
	cr_assert_eq(to_f16(0x1p-149f), 0x0000);           /* fp32 subnormal */
	cr_assert_eq(to_f16(1e-3f), 0x1419);
}

Test(half, f16_zero_nan)
{
	uint16_t h;

	cr_assert_eq(to_f16(0.0f), 0x0000);
	cr_assert_eq(to_f16(-0.0f), 0x8000);
	h = to_f16(NAN);
	cr_assert(is_nan_f16(h) && (h & 0x200u), "NaN -> 0x%04x", h);
	h = to_f16(-NAN);
	cr_assert(is_nan_f16(h) && (h & 0x8000u), "-NaN -> 0x%04x", h);
	/* signalling NaN whose payload lies below the kept bits: still NaN */
	h = to_f16(loom_f32_from_bits(0x7f800001u));
	cr_assert_eq(h, 0x7e00);
	h = to_f16(loom_f32_from_bits(0xffa00000u));
	cr_assert_eq(h, 0xfe00 | (0x200000u >> 13));
}

Test(half, f16_ties_to_even_normal)
{
	cr_assert_eq(to_f16(1.0f), 0x3c00);
	cr_assert_eq(to_f16(1.0f + 0x1p-11f), 0x3c00);        /* tie down to even */
	cr_assert_eq(to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);    /* tie up to 1+2^-9 */
	cr_assert_eq(to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
	cr_assert_eq(to_f16(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00);
	cr_assert_eq(to_f16(2049.0f), 0x6800);                 /* 2048 */
	cr_assert_eq(to_f16(2051.0f), 0x6802);                 /* 2052 */
	cr_assert_eq(to_f16(2.0f - 0x1p-12f), 0x4000);         /* carries into 2 */
	cr_assert_eq(to_f16(-1.5f), 0xbe00);
	cr_assert_eq(to_f16(0.1f), 0x2e66);
}

Test(half, f16_to_f32_edges)
{
	float v;

	cr_assert_eq(loom_f16_to_f32(0x7bff), 65504.0f);
	cr_assert_eq(loom_f16_to_f32(0x0400), 0x1p-14f);
	cr_assert_eq(loom_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
	cr_assert_eq(loom_f16_to_f32(0x0001), 0x1p-24f);
	cr_assert_eq(loom_f16_to_f32(0x8001), -0x1p-24f);
	cr_assert_eq(loom_f16_to_f32(0x3c01), 1.0f + 0x1p-10f);
	v = loom_f16_to_f32(0x8000);
	cr_assert(v == 0.0f && signbit(v));
	cr_assert_eq(loom_f16_to_f32(0x7c00), INFINITY);
	cr_assert_eq(loom_f16_to_f32(0xfc00), -INFINITY);
	cr_assert_eq(loom_f32_bits(loom_f16_to_f32(0x7e00)), 0x7fc00000u);
	/* signalling half NaN comes back quiet with its payload and sign */
	cr_assert_eq(loom_f32_bits(loom_f16_to_f32(0xfc01)), 0xffc02000u);
}

/* Every half: the value is right, and f16 -> f32 -> f16 is the identity
 * (a signalling NaN comes back as the same NaN made quiet). */
Test(half, f16_all_65536)
{
	static float f[65536];
	static uint16_t h[65536], back[65536];

	for (uint32_t i = 0; i < 65536; i++)
		h[i] = (uint16_t)i;
	loom_f16_to_f32_array(h, f, 65536);
	loom_f32_to_f16_array(f, back, 65536);
	for (uint32_t i = 0; i < 65536; i++) {
		uint16_t u = (uint16_t)i;
		float s = loom_f16_to_f32(u);

		cr_assert_eq(loom_f32_bits(s), loom_f32_bits(f[i]),
			     "0x%04x: scalar %a array %a", u, (double)s, (double)f[i]);
		if (is_nan_f16(u)) {
			cr_assert(isnan(s));
			cr_assert_eq(signbit(s) != 0, (u & 0x8000u) != 0);
			cr_assert_eq(back[i], u | 0x200u, "0x%04x -> 0x%04x", u, back[i]);
		} else {
			if ((u & 0x7fffu) == 0x7c00u)
				cr_assert(isinf(s) && (s < 0) == ((u & 0x8000u) != 0));
			else
				cr_assert_eq((double)s, f16_value(u), "0x%04x", u);
			cr_assert_eq(back[i], u, "0x%04x -> 0x%04x", u, back[i]);
		}
		cr_assert_eq(loom_f32_to_f16(s), back[i]);
	}
}

/* Floats worth hitting on purpose: the neighbours of every half boundary and
 * midpoint, plus the specials. */
static int64_t fill_edge_floats(float *x, int64_t cap)
{
	int64_t n = 0;

	for (uint32_t i = 0; i < 0x7c00u && n + 12 <= cap; i++) {
		float v = (float)f16_value((uint16_t)i);
		float mid = (float)((f16_value((uint16_t)i) +
				     (i == 0x7bffu ? 65536.0 : f16_value((uint16_t)(i + 1)))) / 2);

		x[n++] = v;
		x[n++] = -v;
		x[n++] = nextafterf(v, INFINITY);
		x[n++] = nextafterf(v, 0.0f);
		x[n++] = mid;
		x[n++] = -mid;
		x[n++] = nextafterf(mid, INFINITY);
		x[n++] = nextafterf(mid, 0.0f);
		x[n++] = -nextafterf(mid, 0.0f);
		x[n++] = INFINITY;
		x[n++] = loom_f32_from_bits(0x7f800000u | (i << 8) | 1u); /* NaNs */
		x[n++] = loom_f32_from_bits(0xff800000u | ((i & 0x3ffu) << 13) | (i & 0x1fffu) | 1u);
	}
	return n;
}

/* Random bit patterns (every exponent, NaNs included) and random floats in
 * and around the half range, where rounding is interesting. */
static void fill_random_floats(float *x, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		uint32_t u = rng_u32();

		if (i & 1) {
			/* exponent 96 .. 159: 2^-31 .. 2^32 */
			u = (u & 0x807fffffu) | ((96u + (rng_u32() & 63u)) << 23);
		}
		x[i] = loom_f32_from_bits(u);
	}
}

Test(half, f16_random_and_edges_match_oracle)
{
	const int64_t n_rand = 4000000;
	const int64_t cap = n_rand + 12 * 0x7c00;
	float *x = malloc((size_t)cap * sizeof(*x));
	uint16_t *h = malloc((size_t)cap * sizeof(*h));
	float *back = malloc((size_t)cap * sizeof(*back));
	int64_t n;

	cr_assert(x && h && back);
	n = fill_edge_floats(x, cap);
	fill_random_floats(x + n, n_rand);
	n += n_rand;
	loom_f32_to_f16_array(x, h, n);
	loom_f16_to_f32_array(h, back, n);
	for (int64_t i = 0; i < n; i++) {
		uint16_t s = loom_f32_to_f16(x[i]);
		uint16_t o = oracle_f32_to_f16(x[i]);

		cr_assert_eq(h[i], s, "array 0x%04x scalar 0x%04x for 0x%08x",
			     h[i], s, loom_f32_bits(x[i]));
		cr_assert_eq(s, o, "scalar 0x%04x oracle 0x%04x for 0x%08x",
			     s, o, loom_f32_bits(x[i]));
		cr_assert_eq(loom_f32_bits(back[i]), loom_f32_bits(loom_f16_to_f32(s)));
	}
	free(back);
	free(h);
	free(x);
}

Test(half, bf16_edges)
{
	float v;
	uint16_t b;

	cr_assert_eq(to_bf16(1.0f), 0x3f80);
	cr_assert_eq(to_bf16(1.0f + 0x1p-8f), 0x3f80);         /* tie down to even */
	cr_assert_eq(to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);     /* tie up */
	cr_assert_eq(to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
	cr_assert_eq(to_bf16(-2.0f), 0xc000);
	/* max bf16 (2 - 2^-7) * 2^127 stays; above its midpoint goes to inf */
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x7f7f0000u)), 0x7f7f);
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x7f7f7fffu)), 0x7f7f);
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x7f7f8000u)), 0x7f80);
	cr_assert_eq(to_bf16(3.4028235e38f), 0x7f80);           /* FLT_MAX */
	cr_assert_eq(to_bf16(-3.4028235e38f), 0xff80);
	cr_assert_eq(loom_bf16_to_f32(0x7f7f), 0x1.fep127f);
	cr_assert_eq(to_bf16(INFINITY), 0x7f80);
	cr_assert_eq(to_bf16(-INFINITY), 0xff80);
	/* fp32 subnormals are kept */
	cr_assert_eq(to_bf16(0x1p-133f), 0x0001);
	cr_assert_eq(loom_bf16_to_f32(0x0001), 0x1p-133f);
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x00018000u)), 0x0002); /* tie up */
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x00008000u)), 0x0000); /* tie down */
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x00008001u)), 0x0001);
	cr_assert_eq(to_bf16(0x1p-149f), 0x0000);
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x007fffffu)), 0x0080); /* to min normal */
	cr_assert_eq(to_bf16(0.0f), 0x0000);
	cr_assert_eq(to_bf16(-0.0f), 0x8000);
	v = loom_bf16_to_f32(0x8000);
	cr_assert(v == 0.0f && signbit(v));
	b = to_bf16(NAN);
	cr_assert(is_nan_bf16(b) && (b & 0x40u), "NaN -> 0x%04x", b);
	/* a NaN whose payload is only in the dropped bits must not become inf */
	cr_assert_eq(to_bf16(loom_f32_from_bits(0x7f800001u)), 0x7fc0);
	cr_assert_eq(to_bf16(loom_f32_from_bits(0xff80ffffu)), 0xffc0);
	cr_assert(isnan(loom_bf16_to_f32(0x7fc0)));
}

Test(half, bf16_all_65536)
{
	static float f[65536];
	static uint16_t b[65536], back[65536];

	for (uint32_t i = 0; i < 65536; i++)
		b[i] = (uint16_t)i;
	loom_bf16_to_f32_array(b, f, 65536);
	loom_f32_to_bf16_array(f, back, 65536);
	for (uint32_t i = 0; i < 65536; i++) {
		uint16_t u = (uint16_t)i;

		cr_assert_eq(loom_f32_bits(f[i]), (uint32_t)u << 16);
		if (is_nan_bf16(u))
			cr_assert_eq(back[i], u | 0x40u, "0x%04x -> 0x%04x", u, back[i]);
		else
			cr_assert_eq(back[i], u, "0x%04x -> 0x%04x", u, back[i]);
	}
}

Test(half, bf16_random_match_oracle)
{
	const int64_t n = 4000000 + 3;
	float *x = malloc((size_t)n * sizeof(*x));
	uint16_t *b = malloc((size_t)n * sizeof(*b));

	cr_assert(x && b);
	fill_random_floats(x, n);
	loom_f32_to_bf16_array(x, b, n);
	for (int64_t i = 0; i < n; i++) {
		uint16_t o = oracle_f32_to_bf16(x[i]);

		cr_assert_eq(b[i], o, "array 0x%04x oracle 0x%04x for 0x%08x",
			     b[i], o, loom_f32_bits(x[i]));
		cr_assert_eq(loom_f32_to_bf16(x[i]), o);
	}
	free(b);
	free(x);
}

/* Lengths around the 8-wide vector body, the chunk size and the parallel
 * threshold: every element converted, nothing past the end touched. */
Test(half, array_lengths_and_bounds)
{
	const int64_t lens[] = { 0, 1, 7, 8, 9, 15, 17, (1 << 15) - 1, (1 << 15) + 1,
				 (1 << 17) - 1, (1 << 17) + 13, 3000007 };
	const int64_t max = 3000007;
	float *x = malloc((size_t)(max + 1) * sizeof(*x));
	float *y = malloc((size_t)(max + 1) * sizeof(*y));
	uint16_t *h = malloc((size_t)(max + 1) * sizeof(*h));

	cr_assert(x && y && h);
	fill_random_floats(x, max);
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		int64_t n = lens[k];

		h[n] = 0xabcd;
		loom_f32_to_f16_array(x, h, n);
		cr_assert_eq(h[n], 0xabcd, "f16 wrote past %lld", (long long)n);
		y[n] = 42.0f;
		loom_f16_to_f32_array(h, y, n);
		cr_assert_eq(y[n], 42.0f);
		for (int64_t i = 0; i < n; i++) {
			cr_assert_eq(h[i], loom_f32_to_f16(x[i]));
			cr_assert_eq(loom_f32_bits(y[i]),
				     loom_f32_bits(loom_f16_to_f32(h[i])));
		}
		h[n] = 0xabcd;
		loom_f32_to_bf16_array(x, h, n);
		cr_assert_eq(h[n], 0xabcd, "bf16 wrote past %lld", (long long)n);
		loom_bf16_to_f32_array(h, y, n);
		cr_assert_eq(y[n], 42.0f);
		for (int64_t i = 0; i < n; i++) {
			cr_assert_eq(h[i], loom_f32_to_bf16(x[i]));
			cr_assert_eq(loom_f32_bits(y[i]), (uint32_t)h[i] << 16);
		}
	}
	free(h);
	free(y);
	free(x);
}
