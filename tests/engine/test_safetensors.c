/*
 * tests/engine/test_safetensors.c — the safetensors container
 * (io/safetensors.c): a round trip, and every fault the reader refuses,
 * each with a message that names it.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"

/* A file image: the length, the header as given (no padding), data. */
static unsigned char *image(const char *header, const void *data, size_t dlen, size_t *size)
{
	size_t h = strlen(header);
	unsigned char *b = malloc(8 + h + dlen + 1);
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)h >> (8 * i));
	memcpy(b + 8, header, h);
	if (dlen)
		memcpy(b + 8 + h, data, dlen);
	*size = 8 + h + dlen;
	return b;
}

/* Parses header + dlen zero bytes; expects a refusal whose message holds want. */
static void refused(const char *header, size_t dlen, const char *want)
{
	unsigned char zeros[256] = { 0 };
	size_t size;
	char err[512] = "";
	loom_st_file *f = (loom_st_file *)1;
	unsigned char *b = image(header, zeros, dlen, &size);
	loom_status st = loom_st_parse(b, size, "t.safetensors", &f, err, sizeof(err));
	cr_expect_eq(st, LOOM_ERR_FORMAT, "accepted %s", header);
	cr_expect_null(f);
	cr_expect(strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
	cr_expect(strstr(err, "t.safetensors") != NULL, "message '%s' lacks the file", err);
	free(b);
}

Test(safetensors, round_trip_in_order_with_metadata)
{
	char path[] = "/tmp/loom-st-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	float w[6] = { 1, -2, 3.5f, 0, 1e-30f, -7 };
	uint16_t h[2] = { 0x3c00, 0xc000 };
	int64_t nbt = 123;
	loom_st_tensor t[3] = {
		{ .name = "layer1.0.weight", .dtype = LOOM_ST_F32, .ndim = 2, .dims = { 2, 3 },
		  .data = w, .bytes = sizeof(w) },
		{ .name = "b", .dtype = LOOM_ST_F16, .ndim = 1, .dims = { 2 }, .data = h,
		  .bytes = sizeof(h) },
		{ .name = "layer1.1.num_batches_tracked", .dtype = LOOM_ST_I64, .ndim = 0,
		  .data = &nbt, .bytes = 8 },
	};
	const char *meta[] = { "format", "pt" };
	char err[512];
	cr_assert_eq(loom_st_write(path, t, 3, meta, 1, err, sizeof(err)), LOOM_OK, "%s", err);
	loom_st_file *f = NULL;
	cr_assert_eq(loom_st_read(path, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_st_count(f), 3);
	for (int i = 0; i < 3; i++) {
		const loom_st_tensor *r = loom_st_at(f, i);
		cr_expect_str_eq(r->name, t[i].name);
		cr_expect_eq(r->dtype, t[i].dtype);
		cr_expect_eq(r->ndim, t[i].ndim);
		cr_expect_eq(r->bytes, t[i].bytes);
		cr_expect_eq(memcmp(r->dims, t[i].dims, sizeof(int64_t) * r->ndim), 0);
		cr_expect_eq(memcmp(r->data, t[i].data, r->bytes), 0, "%s's bytes", r->name);
	}
	cr_expect_eq(loom_st_find(f, "b"), loom_st_at(f, 1));
	cr_expect_null(loom_st_find(f, "c"));
	cr_expect_null(loom_st_at(f, 3));
	cr_expect_str_eq(loom_st_metadata(f, "format"), "pt");
	cr_expect_null(loom_st_metadata(f, "other"));
	loom_st_free(f);

	/* The header is padded to 8 bytes and the data starts right after. */
	FILE *fp = fopen(path, "rb");
	unsigned char len8[8];
	cr_assert_eq(fread(len8, 1, 8, fp), 8u);
	fseek(fp, 0, SEEK_END);
	long size = ftell(fp);
	fclose(fp);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | len8[i];
	cr_expect_eq(hl % 8, 0u);
	cr_expect_eq((uint64_t)size, 8 + hl + sizeof(w) + sizeof(h) + 8);
	unlink(path);
}

Test(safetensors, writer_refuses_bad_tensors)
{
	float w[2] = { 0 };
	char err[512] = "";
	loom_st_tensor t[2] = {
		{ .name = "a", .dtype = LOOM_ST_F32, .ndim = 1, .dims = { 2 }, .data = w, .bytes = 8 },
		{ .name = "a", .dtype = LOOM_ST_F32, .ndim = 1, .dims = { 2 }, .data = w, .bytes = 8 },
	};
	cr_expect_eq(loom_st_write("/tmp/loom-st-dup", t, 2, NULL, 0, err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_expect(strstr(err, "two tensors are called 'a'"), "%s", err);
	t[1].name = "b";
	t[1].bytes = 4;
	cr_expect_eq(loom_st_write("/tmp/loom-st-dup", t, 2, NULL, 0, err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_expect(strstr(err, "'b'"), "%s", err);
	cr_expect_neq(access("/tmp/loom-st-dup", F_OK), 0, "a refused write left a file");
}

Test(safetensors, truncated_before_the_length)
{
	unsigned char b[5] = { 8, 0, 0, 0, 0 };
	char err[512] = "";
	loom_st_file *f = NULL;
	cr_expect_eq(loom_st_parse(b, sizeof(b), "t.safetensors", &f, err, sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_expect(strstr(err, "truncated"), "%s", err);
	cr_expect_null(f);
}

Test(safetensors, header_length_beyond_the_file)
{
	size_t size;
	unsigned char *b = image("{}", NULL, 0, &size);
	b[0] = 200; /* claims 200 header bytes, the file has 2 */
	char err[512] = "";
	loom_st_file *f = NULL;
	cr_expect_eq(loom_st_parse(b, size, "t.safetensors", &f, err, sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_expect(strstr(err, "header length 200 runs past the end"), "%s", err);
	b[0] = 2;
	b[7] = 0x80; /* a length near 2^63 must not wrap */
	cr_expect_eq(loom_st_parse(b, size, "t.safetensors", &f, err, sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_expect(strstr(err, "runs past the end"), "%s", err);
	free(b);
}

Test(safetensors, a_cut_file_is_refused)
{
	/* A valid file cut short: its last tensor now runs past the data. */
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
		"run past the data");
}

Test(safetensors, header_not_json)
{
	refused("{\"a\": [1, 2,", 0, "not valid JSON");
	refused("[1, 2]", 0, "not a JSON object");
	refused("hello", 0, "not a JSON object");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		"\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		"duplicate");
}

Test(safetensors, offsets_out_of_range)
{
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8,
		"tensor 'a': data_offsets [8, 16] run past the data");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
		"tensor 'a': data_offsets [8, 0] are not 0 <= begin <= end");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
		"tensor 'a'");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e3]}}", 8,
		"tensor 'a': data_offsets is not two integers");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
		"tensor 'a': data_offsets [0, 8] hold 8 bytes, its shape of F32 needs 12");
	/* A shape whose byte count overflows 64 bits. */
	refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
		"\"data_offsets\":[0,8]}}", 8, "tensor 'a'");
}

Test(safetensors, overlapping_tensors)
{
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
		"tensors 'a' [0, 8) and 'b' [4, 12) overlap");
}

Test(safetensors, gaps_and_trailing_bytes)
{
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
		"4 bytes before tensor 'a' belong to no tensor");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
		"4 bytes after the last tensor");
}

Test(safetensors, unknown_dtype_and_bad_entries)
{
	refused("{\"a\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		"tensor 'a': unknown dtype 'F12'");
	refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a': needs");
	refused("{\"a\":3}", 0, "tensor 'a': entry is not an object");
	refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,-1],\"data_offsets\":[0,0]}}", 0,
		"tensor 'a': shape[1]");
	refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
		1, "tensor 'a': 9 dims");
	refused("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ 'k' is not a string");
}

Test(safetensors, empty_and_scalar_files_parse)
{
	size_t size;
	char err[512];
	loom_st_file *f = NULL;
	unsigned char *b = image("{}  ", NULL, 0, &size);
	cr_expect_eq(loom_st_parse(b, size, NULL, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_eq(loom_st_count(f), 0);
	loom_st_free(f);
	free(b);
	int64_t one = 1;
	b = image("{\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
		  "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[8,8]}}", &one, 8,
		  &size);
	cr_expect_eq(loom_st_parse(b, size, NULL, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_eq(loom_st_count(f), 2);
	cr_expect_eq(loom_st_find(f, "s")->ndim, 0);
	cr_expect_eq(loom_st_find(f, "e")->bytes, 0u);
	loom_st_free(f);
	free(b);
}

Test(safetensors, missing_file_is_named)
{
	char err[512] = "";
	loom_st_file *f = NULL;
	cr_expect_eq(loom_st_read("/nonexistent/x.safetensors", &f, err, sizeof(err)),
		     LOOM_ERR_NOT_FOUND);
	cr_expect(strstr(err, "/nonexistent/x.safetensors"), "%s", err);
}
