/*
 * tests/base/test_fp8.c — E4M3 and E5M2 conversions (base/fp8.h) bit for bit:
 * every bf16 pattern narrowed and every fp8 byte widened against ml_dtypes
 * (tests/base/data, written once by tools/fp8_golden.py), hand-written edge
 * rows, and random fp32 values against an independent nearest-even oracle.
 *
 * The saturation rule, the same in the tool and here: round to nearest even;
 * a magnitude that rounds past the largest finite value (448, 57344), inf
 * included, becomes that value with its sign (CUDA's __NV_SATFINITE); NaN
 * stays NaN as 0x7f (E4M3) or 0x7e (E5M2) with its sign. ml_dtypes' own
 * astype overflows instead, so the tool clipped to ±max before converting.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "base/fp8.h"
#include "base/splitmix.h"
#include "loom.h"

#define DATA "tests/base/data/"

typedef struct fmt {
	const char *name;
	int mbits, bias;
	uint8_t maxcode, nan;
	int has_inf;
	uint8_t (*narrow)(float);
	float (*widen)(uint8_t);
	void (*narrow_array)(const float *, uint8_t *, int64_t);
	void (*widen_array)(const uint8_t *, float *, int64_t);
	const float *lut;
} fmt;

static const fmt E4M3 = { "e4m3", 3, 7, 0x7e, LOOM_E4M3_NAN, 0,
			  loom_f32_to_e4m3, loom_e4m3_to_f32, loom_f32_to_e4m3_array,
			  loom_e4m3_to_f32_array, loom_e4m3_f32_lut };
static const fmt E5M2 = { "e5m2", 2, 15, 0x7b, LOOM_E5M2_NAN, 1,
			  loom_f32_to_e5m2, loom_e5m2_to_f32, loom_f32_to_e5m2_array,
			  loom_e5m2_to_f32_array, loom_e5m2_f32_lut };

static int fp8_is_nan(const fmt *f, uint8_t b)
{
	return f->has_inf ? (b & 0x7f) > 0x7c : (b & 0x7f) == 0x7f;
}

/* The golden file, exactly n bytes, or the test fails saying which. */
static void read_golden(const char *name, void *buf, size_t n)
{
	FILE *f = fopen(name, "rb");
	size_t got;
	int extra;

	cr_assert_not_null(f, "%s: missing (a data dep of the test; tools/fp8_golden.py writes it)",
			   name);
	got = fread(buf, 1, n, f);
	extra = fgetc(f);
	fclose(f);
	cr_assert(got == n && extra == EOF, "%s: %zu bytes or more, want %zu", name, got, n);
}

/* The value of a positive finite code, from the format's definition. */
static double code_value(const fmt *f, int c)
{
	int e = c >> f->mbits, m = c & ((1 << f->mbits) - 1);

	if (e == 0)
		return ldexp(m, 1 - f->bias - f->mbits);
	return ldexp((1 << f->mbits) + m, e - f->bias - f->mbits);
}

/*
 * Oracle for fp32 -> fp8: the largest code not above |x| by binary search,
 * then the nearer of it and the next, ties to the even code; anything at or
 * above max saturates. Distances in double are exact (each is below one fp8
 * step and a multiple of the smaller of the two ulps).
 */
static uint8_t oracle(const fmt *f, float x)
{
	uint8_t sign = signbit(x) ? 0x80 : 0;
	double a = fabs((double)x);
	int lo = 0, hi = f->maxcode;

	if (isnan(x))
		return sign | f->nan;
	if (a >= code_value(f, f->maxcode))
		return sign | f->maxcode;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;

		if (code_value(f, mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	{
		double dlo = a - code_value(f, lo), dhi = code_value(f, lo + 1) - a;
		int p = dhi < dlo || (dhi == dlo && (lo & 1)) ? lo + 1 : lo;

		return sign | (uint8_t)p;
	}
}

/* Every bf16 pattern against the golden: bit for bit, and a NaN in is the
 * canonical NaN out with the input's sign. */
static void check_bf16_golden(const fmt *f, const char *path, uint8_t (*from_bf16)(uint16_t))
{
	static uint8_t want[65536];
	int bad = 0, nans = 0;

	read_golden(path, want, sizeof(want));
	for (uint32_t i = 0; i < 65536; i++) {
		float x = loom_bf16_to_f32((uint16_t)i);
		uint8_t got = from_bf16((uint16_t)i);

		if (isnan(x)) {
			uint8_t canon = (uint8_t)((i >> 8) & 0x80) | f->nan;

			nans++;
			cr_expect(fp8_is_nan(f, want[i]), "%s: golden for NaN bf16 0x%04x is 0x%02x",
				  f->name, i, want[i]);
			if (got != canon && bad++ < 8)
				cr_expect_eq(got, canon, "%s: bf16 0x%04x (NaN) -> 0x%02x, want 0x%02x",
					     f->name, i, got, canon);
			continue;
		}
		if (got != want[i] && bad++ < 8)
			cr_expect_eq(got, want[i], "%s: bf16 0x%04x (%a) -> 0x%02x, ml_dtypes 0x%02x",
				     f->name, i, (double)x, got, want[i]);
	}
	cr_assert_eq(nans, 254, "%s: 254 NaN bf16 patterns", f->name);
	cr_assert_eq(bad, 0, "%s: %d of 65536 bf16 patterns differ", f->name, bad);
}

Test(fp8, bf16_to_e4m3_every_pattern)
{
	check_bf16_golden(&E4M3, DATA "bf16_to_e4m3.bin", loom_bf16_to_e4m3);
}

Test(fp8, bf16_to_e5m2_every_pattern)
{
	check_bf16_golden(&E5M2, DATA "bf16_to_e5m2.bin", loom_bf16_to_e5m2);
}

/* Every byte widened, by the scalar converter, the table and the array
 * converter: the golden's fp32 bits exactly, NaN as sign | 0x7fc00000. */
static void check_widen_golden(const fmt *f, const char *path)
{
	uint32_t want[256];
	uint8_t bytes[256];
	float arr[256];

	read_golden(path, want, sizeof(want)); /* little-endian, as x86-64 */
	for (int i = 0; i < 256; i++)
		bytes[i] = (uint8_t)i;
	f->widen_array(bytes, arr, 256);
	for (int i = 0; i < 256; i++) {
		uint32_t s = loom_f32_bits(f->widen((uint8_t)i));

		cr_assert_eq(s, want[i], "%s 0x%02x -> 0x%08x, ml_dtypes 0x%08x", f->name, i, s,
			     want[i]);
		cr_assert_eq(loom_f32_bits(f->lut[i]), s, "%s table[0x%02x]", f->name, i);
		cr_assert_eq(loom_f32_bits(arr[i]), s, "%s array 0x%02x", f->name, i);
		if (fp8_is_nan(f, (uint8_t)i))
			cr_assert_eq(s, ((uint32_t)(i & 0x80) << 24) | 0x7fc00000u, "%s 0x%02x",
				     f->name, i);
		else if (isinf(f->widen((uint8_t)i)))
			cr_assert_eq(f->narrow(f->widen((uint8_t)i)), (i & 0x80) | f->maxcode,
				     "%s 0x%02x: inf narrows to max", f->name, i);
		else
			/* and back: every finite byte is its own narrowing */
			cr_assert_eq(f->narrow(f->widen((uint8_t)i)), (uint8_t)i, "%s 0x%02x round trip",
				     f->name, i);
	}
}

Test(fp8, e4m3_every_byte_to_f32)
{
	check_widen_golden(&E4M3, DATA "e4m3_to_f32.bin");
}

Test(fp8, e5m2_every_byte_to_f32)
{
	check_widen_golden(&E5M2, DATA "e5m2_to_f32.bin");
	cr_assert(isinf(loom_e5m2_to_f32(0x7c)) && loom_e5m2_to_f32(0xfc) < 0, "0x7c/0xfc are ±inf");
}

/* One hand-written row: fp32 bits in, the byte each format gives. */
typedef struct edge {
	uint32_t in;
	uint8_t e4m3, e5m2;
	const char *what;
} edge;

#define F(x) 0x##x##u

static const edge edges[] = {
	{ F(00000000), 0x00, 0x00, "+0" },
	{ F(80000000), 0x80, 0x80, "-0 keeps its sign" },
	{ F(00000001), 0x00, 0x00, "the smallest fp32 subnormal" },
	{ F(80000001), 0x80, 0x80, "a negative fp32 subnormal rounds to -0" },
	{ F(3b000000), 0x01, 0x18, "2^-9: E4M3's smallest subnormal" },
	{ F(bb000000), 0x81, 0x98, "-2^-9" },
	{ F(37800000), 0x00, 0x01, "2^-16: E5M2's smallest subnormal" },
	{ F(3a800000), 0x00, 0x14, "2^-10: half E4M3's smallest, ties to even 0" },
	{ F(3a800001), 0x01, 0x14, "just above 2^-10 rounds up (a bit bf16 cannot hold)" },
	{ F(37000000), 0x00, 0x00, "2^-17: half E5M2's smallest, ties to even 0" },
	{ F(37000001), 0x00, 0x01, "just above 2^-17" },
	{ F(3b400000), 0x02, 0x1a, "1.5 * 2^-9: tie between subnormals 1 and 2, to 2" },
	{ F(3ba00000), 0x02, 0x1d, "2.5 * 2^-9: tie between 2 and 3, to 2" },
	{ F(3c700000), 0x08, 0x24, "7.5 * 2^-9: tie, carries into the smallest normal" },
	{ F(3c800000), 0x08, 0x24, "2^-6: E4M3's smallest normal" },
	{ F(38800000), 0x00, 0x04, "2^-14: E5M2's smallest normal" },
	{ F(3f800000), 0x38, 0x3c, "1" },
	{ F(3f880000), 0x38, 0x3c, "1.0625: E4M3 tie between 1 and 1.125, to 1" },
	{ F(3f880001), 0x39, 0x3c, "1.0625 + 1 ulp: up (sticky bit far below bf16)" },
	{ F(3f980000), 0x3a, 0x3d, "1.1875: E4M3 tie between 1.125 and 1.25, to 1.25" },
	{ F(3f900000), 0x39, 0x3c, "1.125: E5M2 tie between 1 and 1.25, to 1" },
	{ F(3fb00000), 0x3b, 0x3e, "1.375: E5M2 tie between 1.25 and 1.5, to 1.5" },
	{ F(3ff80000), 0x40, 0x40, "1.9375: tie, carries into the next exponent" },
	{ F(43d80000), 0x7e, 0x5f, "432: E4M3 tie between 416 and 448, to 448" },
	{ F(43d7ffff), 0x7d, 0x5f, "just below 432: 416" },
	{ F(43e00000), 0x7e, 0x5f, "448: E4M3's largest finite" },
	{ F(43e80000), 0x7e, 0x5f, "464: the tie above 448 rounds down to 448" },
	{ F(43e80001), 0x7e, 0x5f, "464 + 1 ulp would overflow: saturates" },
	{ F(43f00000), 0x7e, 0x60, "480" },
	{ F(c3f00000), 0xfe, 0xe0, "-480 saturates to -448" },
	{ F(47600000), 0x7e, 0x7b, "57344: E5M2's largest finite" },
	{ F(47680000), 0x7e, 0x7b, "59392: rounds down to 57344" },
	{ F(47700000), 0x7e, 0x7b, "61440: the tie above 57344 would go to inf: saturates" },
	{ F(47800000), 0x7e, 0x7b, "65536" },
	{ F(7f7fffff), 0x7e, 0x7b, "FLT_MAX" },
	{ F(7f800000), 0x7e, 0x7b, "+inf saturates" },
	{ F(ff800000), 0xfe, 0xfb, "-inf saturates" },
	{ F(7fc00000), 0x7f, 0x7e, "quiet NaN" },
	{ F(ffc00000), 0xff, 0xfe, "negative quiet NaN keeps its sign" },
	{ F(7f800001), 0x7f, 0x7e, "signalling NaN" },
	{ F(ffbfffff), 0xff, 0xfe, "negative NaN, every payload bit" },
};

Test(fp8, edge_rows)
{
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		const edge *r = &edges[i];
		float x = loom_f32_from_bits(r->in);
		uint8_t a4 = 0, a5 = 0;

		loom_f32_to_e4m3_array(&x, &a4, 1);
		loom_f32_to_e5m2_array(&x, &a5, 1);
		cr_expect_eq(loom_f32_to_e4m3(x), r->e4m3, "e4m3 of %s (0x%08x): 0x%02x, want 0x%02x",
			     r->what, r->in, loom_f32_to_e4m3(x), r->e4m3);
		cr_expect_eq(loom_f32_to_e5m2(x), r->e5m2, "e5m2 of %s (0x%08x): 0x%02x, want 0x%02x",
			     r->what, r->in, loom_f32_to_e5m2(x), r->e5m2);
		cr_expect(a4 == r->e4m3 && a5 == r->e5m2, "array converters on %s", r->what);
		/* the independent oracle agrees with each row too */
		cr_expect_eq(oracle(&E4M3, x), r->e4m3, "oracle e4m3 of %s", r->what);
		cr_expect_eq(oracle(&E5M2, x), r->e5m2, "oracle e5m2 of %s", r->what);
	}
	cr_expect_eq(loom_e4m3_to_f32(0x7e), LOOM_E4M3_MAX);
	cr_expect_eq(loom_e5m2_to_f32(0x7b), LOOM_E5M2_MAX);
	cr_expect_eq(loom_e4m3_to_f32(0x01), 0x1p-9f);
	cr_expect_eq(loom_e5m2_to_f32(0x01), 0x1p-16f);
}

/* fp32 values with every mantissa bit random (what bf16 cannot hold), most
 * with exponents around the fp8 ranges (2^-20 .. 2^17), some anywhere. */
Test(fp8, random_f32_against_oracle)
{
	enum { N = 1 << 20, CHUNK = 4096 };
	static float x[CHUNK];
	static uint8_t a4[CHUNK], a5[CHUNK];
	uint64_t seed = 42;
	int bad = 0;

	for (int done = 0; done < N; done += CHUNK) {
		for (int i = 0; i < CHUNK; i++) {
			uint64_t r64 = loom_splitmix64(&seed);
			uint32_t r = (uint32_t)r64, e = 107 + (uint32_t)(r64 >> 32) % 38;

			x[i] = loom_f32_from_bits(i % 8 == 0 ? r : (r & 0x807fffffu) | (e << 23));
		}
		loom_f32_to_e4m3_array(x, a4, CHUNK);
		loom_f32_to_e5m2_array(x, a5, CHUNK);
		for (int i = 0; i < CHUNK && bad < 8; i++) {
			uint8_t w4 = oracle(&E4M3, x[i]), w5 = oracle(&E5M2, x[i]);
			uint8_t s4 = loom_f32_to_e4m3(x[i]), s5 = loom_f32_to_e5m2(x[i]);

			if (s4 != w4 || s5 != w5 || a4[i] != s4 || a5[i] != s5) {
				bad++;
				cr_expect_fail("%a (0x%08x): e4m3 0x%02x (array 0x%02x), oracle 0x%02x; "
					       "e5m2 0x%02x (array 0x%02x), oracle 0x%02x",
					       (double)x[i], loom_f32_bits(x[i]), s4, a4[i], w4, s5,
					       a5[i], w5);
			}
		}
	}
	cr_assert_eq(bad, 0);
}

/* The public dtype values: one byte, named as the CLI and messages show them. */
Test(fp8, dtype_values)
{
	cr_expect_str_eq(loom_dtype_name(LOOM_FP8_E4M3), "fp8_e4m3");
	cr_expect_str_eq(loom_dtype_name(LOOM_FP8_E5M2), "fp8_e5m2");
	cr_expect_eq(loom_dtype_size(LOOM_FP8_E4M3), 1);
	cr_expect_eq(loom_dtype_size(LOOM_FP8_E5M2), 1);
	cr_expect_str_eq(loom_dtype_name(LOOM_DTYPE_COUNT), "?");
}
