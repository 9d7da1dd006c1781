/*
 * test_idx.c — loom_idx_load: exact round trips of raw and gzip files, and one
 * broken file per way a file can be broken, each checked for its status and
 * for a message that names the file and the fault.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "idx_fixture.h"
#include "loom_data.h"

static char dir[256];

static void setup(void)
{
	cr_assert_eq(fx_tmpdir(dir, sizeof(dir)), 0, "cannot create a temp dir");
}

TestSuite(idx, .init = setup);

/* 2 x 3 x 4 bytes, every value different so a misplaced byte shows. */
static void sample(uint8_t *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 7 + 3);
}

static void round_trip(int gz)
{
	uint32_t dims[3] = {2, 3, 4};
	uint8_t data[24];
	char path[512], err[512];
	loom_idx idx;
	loom_status st;

	sample(data, sizeof(data));
	cr_assert_eq(fx_write_idx(dir, gz ? "a.gz" : "a", gz, 0x08, 3, dims,
				  data, sizeof(data), path), 0);
	st = loom_idx_load(path, &idx, err, sizeof(err));
	cr_assert_eq(st, LOOM_OK, "%s", err);
	cr_assert_str_empty(err);
	cr_assert_eq(idx.type, LOOM_IDX_UBYTE);
	cr_assert_eq(idx.ndim, 3);
	cr_assert_eq(idx.dims[0], 2);
	cr_assert_eq(idx.dims[1], 3);
	cr_assert_eq(idx.dims[2], 4);
	cr_assert_eq(idx.count, 24);
	cr_assert_arr_eq(idx.data, data, sizeof(data));
	loom_idx_free(&idx);
	cr_assert_null(idx.data);
	cr_assert_eq(idx.count, 0);
}

Test(idx, raw_round_trip) { round_trip(0); }
Test(idx, gzip_round_trip) { round_trip(1); }

Test(idx, one_dim_labels)
{
	uint32_t dims[1] = {5};
	uint8_t data[5] = {9, 0, 1, 2, 255};
	char path[512], err[512];
	loom_idx idx;

	cr_assert_eq(fx_write_idx(dir, "l.gz", 1, 0x08, 1, dims, data, 5, path), 0);
	cr_assert_eq(loom_idx_load(path, &idx, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(idx.ndim, 1);
	cr_assert_eq(idx.count, 5);
	cr_assert_arr_eq(idx.data, data, 5);
	loom_idx_free(&idx);
}

/* Loads path, expecting status st and a message with both the path and
 * the substring want. */
static void expect_fail(const char *path, loom_status st, const char *want)
{
	char err[512];
	loom_idx idx;
	loom_status got = loom_idx_load(path, &idx, err, sizeof(err));

	cr_assert_eq(got, st, "status %d, expected %d: %s", got, st, err);
	cr_assert(strstr(err, path), "message does not name the file: %s", err);
	cr_assert(strstr(err, want), "message lacks \"%s\": %s", want, err);
	cr_assert_null(idx.data, "a failed load must leave idx empty");
	cr_assert_eq(idx.count, 0);
}

static void truncated(int gz)
{
	uint32_t dims[3] = {2, 3, 4};
	uint8_t data[24];
	char path[512];

	sample(data, sizeof(data));
	/* The header promises 24 bytes; only 20 follow. */
	cr_assert_eq(fx_write_idx(dir, "t", gz, 0x08, 3, dims, data, 20, path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "expected 24 bytes of data, got 20");
}

Test(idx, truncated_raw) { truncated(0); }
Test(idx, truncated_gzip) { truncated(1); }

Test(idx, truncated_gzip_stream)
{
	/* A download cut inside the compressed stream, not just a short
	 * payload: zlib sees an unfinished stream. */
	uint32_t dims[1] = {4000};
	uint8_t *data = malloc(4000);
	char path[512], cut[512];
	FILE *f;
	long size;
	char *buf;
	size_t i;

	for (i = 0; i < 4000; i++)
		data[i] = (uint8_t)((i * 2654435761u) >> 13);
	cr_assert_eq(fx_write_idx(dir, "full.gz", 1, 0x08, 1, dims, data, 4000, path), 0);
	f = fopen(path, "rb");
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	rewind(f);
	buf = malloc((size_t)size);
	cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	fclose(f);
	cr_assert_eq(fx_write(dir, "cut.gz", 0, buf, (size_t)size / 2, cut), 0);
	expect_fail(cut, LOOM_ERR_FORMAT, "expected 4000 bytes of data, got");
	free(buf);
	free(data);
}

/*
 * A header's dims are a claim: 2^50 bytes promised by a file of a few must be
 * refused as truncated, not tried as an allocation (which fails, or on an
 * overcommitting system succeeds and is then touched).
 */
static void huge_claim(int gz)
{
	uint32_t dims[3] = {1u << 20, 1u << 20, 1u << 10};
	uint8_t data[20];
	char path[512];

	sample(data, sizeof(data));
	cr_assert_eq(fx_write_idx(dir, gz ? "huge.gz" : "huge", gz, 0x08, 3, dims,
				  data, sizeof(data), path), 0);
	expect_fail(path, LOOM_ERR_FORMAT,
		    "truncated: expected 1125899906842624 bytes of data, got 20");
}

Test(idx, huge_claim_raw) { huge_claim(0); }
Test(idx, huge_claim_gzip) { huge_claim(1); }

/* A gzip payload larger than the first read buffer: it grows and the bytes
 * land where they belong, for an exact claim and for one 2^32 too big. */
static void grown_gzip(uint32_t claim, size_t have)
{
	uint8_t *data = malloc(have);
	char path[512], err[512];
	loom_idx idx;
	size_t i;

	for (i = 0; i < have; i++)
		data[i] = (uint8_t)((i * 2654435761u) >> 13);
	cr_assert_eq(fx_write_idx(dir, "big.gz", 1, 0x08, 1, &claim, data, have,
				  path), 0);
	if (claim == have) {
		cr_assert_eq(loom_idx_load(path, &idx, err, sizeof(err)), LOOM_OK,
			     "%s", err);
		cr_assert_eq(idx.count, have);
		cr_assert_arr_eq(idx.data, data, have);
		loom_idx_free(&idx);
	} else {
		char want[128];

		snprintf(want, sizeof(want), "expected %u bytes of data, got %zu",
			 claim, have);
		expect_fail(path, LOOM_ERR_FORMAT, want);
	}
	free(data);
}

Test(idx, gzip_larger_than_first_buffer) { grown_gzip(5u << 20 | 7, 5u << 20 | 7); }
Test(idx, gzip_claim_past_the_data) { grown_gzip(0xffffffffu, 3u << 20); }

Test(idx, wrong_magic)
{
	uint8_t bytes[] = {0x01, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7};
	char path[512];

	cr_assert_eq(fx_write(dir, "m", 0, bytes, sizeof(bytes), path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "bad magic number 01 00 08 01");
}

Test(idx, not_idx_at_all)
{
	/* A PNG header, say: the first bytes are not 00 00. */
	const char text[] = "\x89PNG\r\n\x1a\n....";
	char path[512];

	cr_assert_eq(fx_write(dir, "png", 1, text, sizeof(text) - 1, path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "bad magic number");
}

Test(idx, unsupported_type)
{
	uint32_t dims[1] = {1};
	float v = 1.0f;
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "f", 0, 0x0D, 1, dims, &v, 4, path), 0);
	expect_fail(path, LOOM_ERR_UNSUPPORTED,
		    "element type 0x0d (float32) is not supported, only 0x08");
}

Test(idx, unknown_type)
{
	uint32_t dims[1] = {1};
	uint8_t v = 1;
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "u", 0, 0x42, 1, dims, &v, 1, path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "unknown element type 0x42");
}

Test(idx, zero_dims)
{
	uint8_t v = 1;
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "z", 0, 0x08, 0, NULL, &v, 1, path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "0 dims in the magic number");
}

Test(idx, too_many_dims)
{
	uint8_t bytes[] = {0, 0, 0x08, 200};
	char path[512];

	cr_assert_eq(fx_write(dir, "d", 0, bytes, sizeof(bytes), path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "200 dims in the magic number, expected 1 to 8");
}

Test(idx, truncated_dims)
{
	/* Three dims announced, bytes for one and a half. */
	uint8_t bytes[] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0};
	char path[512];

	cr_assert_eq(fx_write(dir, "h", 0, bytes, sizeof(bytes), path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "header truncated: expected 3 dims (12 bytes), got 6");
}

Test(idx, short_magic)
{
	uint8_t bytes[] = {0, 0};
	char path[512];

	cr_assert_eq(fx_write(dir, "s", 0, bytes, sizeof(bytes), path), 0);
	expect_fail(path, LOOM_ERR_FORMAT, "too short for the 4-byte magic");
}

static void trailing(int gz)
{
	uint32_t dims[2] = {2, 2};
	uint8_t data[7] = {1, 2, 3, 4, 5, 6, 7};
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "tr", gz, 0x08, 2, dims, data, 7, path), 0);
	expect_fail(path, LOOM_ERR_FORMAT,
		    "3 trailing bytes after the expected 4 bytes of data");
}

Test(idx, trailing_raw) { trailing(0); }
Test(idx, trailing_gzip) { trailing(1); }

Test(idx, missing_file)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/nope-idx3-ubyte", dir);
	expect_fail(path, LOOM_ERR_NOT_FOUND, "cannot open: No such file");
}

Test(idx, null_arguments)
{
	char err[128];
	loom_idx idx;

	cr_assert_eq(loom_idx_load(NULL, &idx, err, sizeof(err)), LOOM_ERR_INVALID);
	cr_assert(strstr(err, "path is NULL"), "%s", err);
	cr_assert_eq(loom_idx_load("x", NULL, NULL, 0), LOOM_ERR_INVALID);
}

Test(idx, short_error_buffer)
{
	/* A tiny buffer gets a cut, terminated message, never an overflow. */
	char err[8];
	loom_idx idx;

	memset(err, 'x', sizeof(err));
	cr_assert_eq(loom_idx_load("/nonexistent/file", &idx, err, 6),
		     LOOM_ERR_NOT_FOUND);
	cr_assert_eq(strlen(err), 5);
	cr_assert_eq(err[7], 'x');
}
