/*
 * tests/fuzz/fuzz_idx.c — libFuzzer target for loom_idx_load (datasets/idx.c).
 * The first byte picks how the rest reaches the reader: bit 0 clear, as is
 * (raw IDX, or gzip bytes the fuzzer mutates directly); set, gzip-compressed
 * here first, so that mutations reach the IDX parser behind zlib instead of
 * dying in zlib's own checks. A load either succeeds with data that matches
 * its dims, or fails with a message and an empty idx.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "loom_data.h"

/* gzip-wraps n bytes into a malloc'd buffer; its size in *out_n. */
static unsigned char *gzip_bytes(const uint8_t *data, size_t n, size_t *out_n)
{
	z_stream z = { 0 };
	size_t cap = n + n / 100 + 64;
	unsigned char *buf = malloc(cap);

	FUZZ_CHECK(buf);
	FUZZ_CHECK(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
	z.next_in = (unsigned char *)data;
	z.avail_in = (uInt)n;
	z.next_out = buf;
	z.avail_out = (uInt)cap;
	FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
	*out_n = z.total_out;
	deflateEnd(&z);
	return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char *gz = NULL;
	const void *body;
	size_t n;
	char path[64], err[512];
	loom_idx idx;
	loom_status st;
	int fd;

	if (size < 1)
		return 0;
	body = data + 1;
	n = size - 1;
	if (data[0] & 1) {
		gz = gzip_bytes(data + 1, size - 1, &n);
		body = gz;
	}
	fd = fuzz_memfile(body, n, path, sizeof(path));
	st = loom_idx_load(path, &idx, err, sizeof(err));
	if (st == LOOM_OK) {
		size_t count = 1;

		FUZZ_CHECK(idx.ndim >= 1 && idx.ndim <= LOOM_IDX_MAX_DIMS);
		for (int d = 0; d < idx.ndim; d++)
			count *= (size_t)idx.dims[d];
		FUZZ_CHECK(count == idx.count);
		FUZZ_CHECK(idx.data);
		/* The payload really is that long (ASan checks the read), and
		 * for a raw file it is the file's tail: nothing follows it. */
		if (count) {
			const uint8_t *b = body;
			int raw = !gz && !(n >= 2 && b[0] == 0x1f && b[1] == 0x8b);

			FUZZ_CHECK(!raw || idx.data[count - 1] == b[n - 1]);
		}
		loom_idx_free(&idx);
	} else {
		FUZZ_CHECK(err[0] != 0);
		FUZZ_CHECK(idx.data == NULL && idx.count == 0);
	}
	close(fd);
	free(gz);
	return 0;
}
