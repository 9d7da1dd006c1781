/*
 * test_ckpt_file.c — the checkpoint container: bit-exact round trips, every
 * kind of damage detected with the right status, and failed writes that leave
 * the previous checkpoint alone.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/ckpt_file.h"

static char dir[4096];
static char err[512];

/* Each test runs in its own process and gets its own directory. */
static void make_dir(void)
{
	const char *base = getenv("TEST_TMPDIR");

	snprintf(dir, sizeof dir, "%s/ckptXXXXXX", base && base[0] ? base : "/tmp");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static char *path_in_dir(const char *name)
{
	char *p;

	cr_assert_geq(asprintf(&p, "%s/%s", dir, name), 0);
	return p;
}

static int exists(const char *path)
{
	struct stat sb;

	return stat(path, &sb) == 0;
}

static unsigned char *slurp(const char *path, size_t *size)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf;
	long n;

	cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = malloc((size_t)n + 1);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*size = (size_t)n;
	return buf;
}

static void spit(const char *path, const void *buf, size_t n)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "create %s: %s", path, strerror(errno));
	cr_assert_eq(fwrite(buf, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

/* Fixture tensors: values chosen so that a byte order or offset mistake
 * cannot go unnoticed (no zeros, no repeated words). */
static float weights[2][3] = { { 1.5f, -2.25f, 3.0e-8f }, { -0.0f, 65504.0f, 1e30f } };
static uint16_t halves[5] = { 0x3c00, 0xc000, 0x7bff, 0x0001, 0x8400 };
static int32_t labels[4] = { 7, -1, 2147483647, 0 };
static double scalar = 3.141592653589793;

static int fixture(loom_ckpt_record *r)
{
	r[0] = (loom_ckpt_record){ .name = "layer1.weight", .dtype = LOOM_F32, .ndim = 2,
				   .dims = { 2, 3 }, .data = weights, .bytes = sizeof weights };
	r[1] = (loom_ckpt_record){ .name = "layer1.bias.half", .dtype = LOOM_F16, .ndim = 1,
				   .dims = { 5 }, .data = halves, .bytes = sizeof halves };
	r[2] = (loom_ckpt_record){ .name = "labels", .dtype = LOOM_I32, .ndim = 4,
				   .dims = { 1, 2, 1, 2 }, .data = labels, .bytes = sizeof labels };
	r[3] = (loom_ckpt_record){ .name = "lr", .dtype = LOOM_F64, .ndim = 0,
				   .data = &scalar, .bytes = sizeof scalar };
	r[4] = (loom_ckpt_record){ .name = "empty", .dtype = LOOM_F32, .ndim = 6,
				   .dims = { 1, 0, 3, 1, 1, 2 }, .data = NULL, .bytes = 0 };
	return 5;
}

/* One small record, so that the every-byte test stays quick. */
static char *write_small(const char *name)
{
	static const float v[3] = { 1.0f, 2.0f, -4.0f };
	loom_ckpt_record r = { .name = "w", .dtype = LOOM_F32, .ndim = 1, .dims = { 3 },
			       .data = v, .bytes = sizeof v };
	char *p = path_in_dir(name);

	cr_assert_eq(loom_ckpt_write(p, 42, &r, 1, err, sizeof err), LOOM_OK, "%s", err);
	return p;
}

static loom_status read_status(const char *path)
{
	loom_ckpt_file *f = (loom_ckpt_file *)1;
	loom_status st;

	err[0] = 0;
	st = loom_ckpt_read(path, &f, err, sizeof err);
	if (st == LOOM_OK)
		loom_ckpt_free(f);
	else
		cr_assert_null(f, "a failed read must leave *out NULL");
	return st;
}

TestSuite(ckpt_file, .init = make_dir);

Test(ckpt_file, round_trip_is_bit_exact)
{
	loom_ckpt_record recs[8];
	int n = fixture(recs);
	char *p = path_in_dir("model.ckpt");
	char *tmp = path_in_dir("model.ckpt.tmp");
	loom_ckpt_file *f;

	cr_assert_eq(loom_ckpt_write(p, 0xfeedface12345678ull, recs, n, err, sizeof err),
		     LOOM_OK, "%s", err);
	cr_assert(!exists(tmp), "the .tmp file must be gone after a write");
	cr_assert_eq(loom_ckpt_read(p, &f, err, sizeof err), LOOM_OK, "%s", err);
	cr_assert_eq(loom_ckpt_fingerprint(f), 0xfeedface12345678ull);
	cr_assert_eq(loom_ckpt_count(f), n);
	for (int i = 0; i < n; i++) {
		const loom_ckpt_record *r = loom_ckpt_at(f, i);

		cr_assert_not_null(r);
		cr_assert_str_eq(r->name, recs[i].name);
		cr_assert_eq(r->dtype, recs[i].dtype);
		cr_assert_eq(r->ndim, recs[i].ndim);
		for (int d = 0; d < r->ndim; d++)
			cr_assert_eq(r->dims[d], recs[i].dims[d], "%s dim %d", r->name, d);
		cr_assert_eq(r->bytes, recs[i].bytes);
		if (r->bytes)
			cr_assert_eq(memcmp(r->data, recs[i].data, r->bytes), 0, "%s", r->name);
		cr_assert_eq((uintptr_t)r->data % LOOM_CKPT_ALIGN, 0,
			     "%s payload is not %d-byte aligned", r->name, LOOM_CKPT_ALIGN);
		cr_assert_eq(loom_ckpt_find(f, recs[i].name), r);
	}
	cr_assert_null(loom_ckpt_at(f, -1));
	cr_assert_null(loom_ckpt_at(f, n));
	cr_assert_null(loom_ckpt_find(f, "layer1"));
	loom_ckpt_free(f);
	free(p);
	free(tmp);
}

Test(ckpt_file, overwrite_and_zero_records)
{
	loom_ckpt_record recs[8];
	int n = fixture(recs);
	char *p = path_in_dir("model.ckpt");
	loom_ckpt_file *f;

	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_OK, "%s", err);
	cr_assert_eq(loom_ckpt_write(p, 2, NULL, 0, err, sizeof err), LOOM_OK, "%s", err);
	cr_assert_eq(loom_ckpt_read(p, &f, err, sizeof err), LOOM_OK, "%s", err);
	cr_assert_eq(loom_ckpt_count(f), 0);
	cr_assert_eq(loom_ckpt_fingerprint(f), 2);
	cr_assert_null(loom_ckpt_find(f, "lr"));
	loom_ckpt_free(f);
	free(p);
}

Test(ckpt_file, every_flipped_byte_is_detected)
{
	char *p = write_small("small.ckpt");
	char *bad = path_in_dir("bad.ckpt");
	size_t size;
	unsigned char *orig = slurp(p, &size);
	static const unsigned char masks[] = { 0x01, 0x80, 0xff };

	cr_assert_gt(size, 64u);
	for (size_t off = 0; off < size; off++) {
		for (size_t m = 0; m < sizeof masks; m++) {
			orig[off] ^= masks[m];
			spit(bad, orig, size);
			orig[off] ^= masks[m];
			loom_status st = read_status(bad);

			cr_assert_neq(st, LOOM_OK, "flip 0x%02x at offset %zu of %zu went unnoticed",
				      masks[m], off, size);
			cr_assert_not_null(strstr(err, bad), "message does not name the file: %s", err);
			/* The CRC is checked before any field but the magic. */
			cr_assert_eq(st, off < 8 ? LOOM_ERR_FORMAT : LOOM_ERR_CORRUPT,
				     "offset %zu: %s", off, err);
		}
	}
	cr_assert_eq(read_status(p), LOOM_OK, "%s", err);
	free(orig);
	free(p);
	free(bad);
}

Test(ckpt_file, truncation_and_trailing_bytes)
{
	char *p = write_small("small.ckpt");
	char *bad = path_in_dir("short.ckpt");
	size_t size;
	unsigned char *orig = slurp(p, &size);
	size_t cuts[] = { 0, 3, 8, 12, 23, 24, 27, 30, 40, size / 2, size - 12, size - 5,
			  size - 4, size - 1 };
	unsigned char *longer;

	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		/* Too short for a header and the trailer it is malformed; any longer
		 * the last four bytes are no longer the CRC of the rest. */
		loom_status want = cuts[i] < 28 ? LOOM_ERR_FORMAT : LOOM_ERR_CORRUPT;

		spit(bad, orig, cuts[i]);
		cr_assert_eq(read_status(bad), want, "cut at %zu of %zu: %s", cuts[i], size, err);
		cr_assert_not_null(strstr(err, bad), "%s", err);
		if (cuts[i] >= 8)
			cr_assert_not_null(strstr(err, "truncated"), "cut at %zu: %s", cuts[i], err);
	}

	longer = calloc(1, size + 8);
	memcpy(longer, orig, size);
	spit(bad, longer, size + 8);
	cr_assert_eq(read_status(bad), LOOM_ERR_CORRUPT, "%s", err);
	free(longer);
	free(orig);
	free(p);
	free(bad);
}

Test(ckpt_file, wrong_magic)
{
	char *bad = path_in_dir("notes.txt");
	static const char text[] = "these are not the tensors you are looking for\n";

	spit(bad, text, sizeof text - 1);
	cr_assert_eq(read_status(bad), LOOM_ERR_FORMAT);
	cr_assert_not_null(strstr(err, "not a loom checkpoint"), "%s", err);
	cr_assert_not_null(strstr(err, bad), "%s", err);
	free(bad);
}

Test(ckpt_file, other_format_version)
{
	char *p = write_small("small.ckpt");
	char *bad = path_in_dir("future.ckpt");
	size_t size;
	unsigned char *buf = slurp(p, &size);
	uint32_t crc;

	/* A well-formed file from a later loom: only the version differs, and
	 * the CRC is valid, so the version must be what is reported. */
	buf[8] = 7;
	crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), buf, (uInt)(size - 4));
	for (int i = 0; i < 4; i++)
		buf[size - 4 + i] = (unsigned char)(crc >> (8 * i));
	spit(bad, buf, size);
	cr_assert_eq(read_status(bad), LOOM_ERR_MISMATCH, "%s", err);
	cr_assert_not_null(strstr(err, "version 7"), "%s", err);
	cr_assert_not_null(strstr(err, "version 1"), "%s", err);
	cr_assert_not_null(strstr(err, bad), "%s", err);
	free(buf);
	free(p);
	free(bad);
}

/* Sealed with a valid CRC but a dim of -1: the writer never makes one, so
 * the reader refuses it and names the record. */
Test(ckpt_file, negative_dim_refused)
{
	char *p = write_small("small.ckpt");
	char *bad = path_in_dir("negdim.ckpt");
	size_t size;
	unsigned char *buf = slurp(p, &size);
	uint32_t crc;

	/* header 24 | name length 4 | "w\0" | dtype 4 | ndim 4 | dims[0] at 38 */
	cr_assert_eq(buf[28], 'w');
	for (int i = 0; i < 8; i++)
		buf[38 + i] = 0xff;
	crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), buf, (uInt)(size - 4));
	for (int i = 0; i < 4; i++)
		buf[size - 4 + i] = (unsigned char)(crc >> (8 * i));
	spit(bad, buf, size);
	cr_assert_eq(read_status(bad), LOOM_ERR_FORMAT, "%s", err);
	cr_assert_not_null(strstr(err, "record 'w' dim 0 is -1"), "%s", err);
	free(buf);
	free(p);
	free(bad);
}

Test(ckpt_file, missing_file)
{
	char *p = path_in_dir("nothing-here.ckpt");

	cr_assert_eq(read_status(p), LOOM_ERR_NOT_FOUND, "%s", err);
	cr_assert_not_null(strstr(err, p), "%s", err);
	free(p);
}

/* The old checkpoint must survive, byte for byte, and no .tmp stay behind. */
static void assert_untouched(const char *p, const unsigned char *before, size_t size)
{
	char tmp[4200];
	size_t now_size;
	unsigned char *now = slurp(p, &now_size);

	cr_assert_eq(now_size, size);
	cr_assert_eq(memcmp(now, before, size), 0, "the old checkpoint was changed");
	snprintf(tmp, sizeof tmp, "%s.tmp", p);
	cr_assert(!exists(tmp), "%s was left behind", tmp);
	free(now);
}

Test(ckpt_file, write_into_missing_directory)
{
	loom_ckpt_record recs[8];
	int n = fixture(recs);
	char *p = path_in_dir("no/such/dir/model.ckpt");

	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_ERR_IO);
	cr_assert_not_null(strstr(err, p), "%s", err);
	cr_assert(!exists(p));
	free(p);
}

Test(ckpt_file, failed_write_midway_keeps_old_file)
{
	char *p = write_small("model.ckpt");
	size_t size;
	unsigned char *before = slurp(p, &size);
	static float big[64 * 1024];
	loom_ckpt_record r = { .name = "big", .dtype = LOOM_F32, .ndim = 1,
			       .dims = { 64 * 1024 }, .data = big, .bytes = sizeof big };
	struct rlimit lim = { .rlim_cur = 4096, .rlim_max = RLIM_INFINITY };

	/* A file size limit makes the write fail half way even as root, where
	 * permissions would not; this test runs in its own process. */
	signal(SIGXFSZ, SIG_IGN);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	cr_assert_eq(loom_ckpt_write(p, 9, &r, 1, err, sizeof err), LOOM_ERR_IO);
	cr_assert_not_null(strstr(err, p), "%s", err);
	assert_untouched(p, before, size);
	cr_assert_eq(read_status(p), LOOM_OK, "%s", err);
	free(before);
	free(p);
}

Test(ckpt_file, failed_rename_keeps_old_file)
{
	char *p = path_in_dir("taken");
	char *inside = path_in_dir("taken/file");
	char *tmp = path_in_dir("taken.tmp");
	static const float v[2] = { 1, 2 };
	loom_ckpt_record r = { .name = "v", .dtype = LOOM_F32, .ndim = 1, .dims = { 2 },
			       .data = v, .bytes = sizeof v };

	/* A non-empty directory cannot be renamed over. */
	cr_assert_eq(mkdir(p, 0755), 0);
	spit(inside, "x", 1);
	cr_assert_eq(loom_ckpt_write(p, 1, &r, 1, err, sizeof err), LOOM_ERR_IO);
	cr_assert_not_null(strstr(err, "rename"), "%s", err);
	cr_assert(exists(inside));
	cr_assert(!exists(tmp), "%s was left behind", tmp);
	free(p);
	free(inside);
	free(tmp);
}

Test(ckpt_file, invalid_records_are_refused)
{
	char *p = write_small("model.ckpt");
	size_t size;
	unsigned char *before = slurp(p, &size);
	loom_ckpt_record recs[8];
	int n = fixture(recs);

	recs[3].name = recs[0].name;
	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_ERR_INVALID);
	cr_assert_not_null(strstr(err, "twice"), "%s", err);
	n = fixture(recs);
	recs[1].ndim = LOOM_MAX_DIMS + 1;
	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_ERR_INVALID);
	n = fixture(recs);
	recs[2].dims[1] = -3;
	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_ERR_INVALID);
	n = fixture(recs);
	recs[0].data = NULL;
	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_ERR_INVALID);
	n = fixture(recs);
	recs[4].name = "";
	cr_assert_eq(loom_ckpt_write(p, 1, recs, n, err, sizeof err), LOOM_ERR_INVALID);
	cr_assert_eq(loom_ckpt_write(p, 1, NULL, 2, err, sizeof err), LOOM_ERR_INVALID);
	assert_untouched(p, before, size);
	free(before);
	free(p);
}
