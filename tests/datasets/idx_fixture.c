/*
 * idx_fixture.c — writes the IDX files the datasets/ suites read back, so the
 * tests need no data on disk and can break files in exactly one way each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "idx_fixture.h"

int fx_tmpdir(char *buf, size_t len)
{
	const char *base = getenv("TEST_TMPDIR");

	if (!base || !*base)
		base = "/tmp";
	if ((size_t)snprintf(buf, len, "%s/loom_data_XXXXXX", base) >= len)
		return -1;
	return mkdtemp(buf) ? 0 : -1;
}

int fx_write(const char *dir, const char *name, int gz, const void *bytes,
	     size_t len, char *path)
{
	snprintf(path, 512, "%s/%s", dir, name);
	if (gz) {
		gzFile f = gzopen(path, "wb");
		int ok;

		if (!f)
			return -1;
		ok = len == 0 || gzwrite(f, bytes, (unsigned)len) == (int)len;
		return gzclose(f) == Z_OK && ok ? 0 : -1;
	} else {
		FILE *f = fopen(path, "wb");
		int ok;

		if (!f)
			return -1;
		ok = fwrite(bytes, 1, len, f) == len;
		return fclose(f) == 0 && ok ? 0 : -1;
	}
}

uint8_t *fx_idx(int type, int ndim, const uint32_t *dims, const void *payload,
		size_t payload_len, size_t *len)
{
	size_t n = 4 + 4 * (size_t)ndim + payload_len;
	uint8_t *b = malloc(n ? n : 1);
	int d;

	if (!b)
		return NULL;
	b[0] = 0;
	b[1] = 0;
	b[2] = (uint8_t)type;
	b[3] = (uint8_t)ndim;
	for (d = 0; d < ndim; d++) {
		b[4 + 4 * d] = (uint8_t)(dims[d] >> 24);
		b[5 + 4 * d] = (uint8_t)(dims[d] >> 16);
		b[6 + 4 * d] = (uint8_t)(dims[d] >> 8);
		b[7 + 4 * d] = (uint8_t)dims[d];
	}
	if (payload_len)
		memcpy(b + 4 + 4 * ndim, payload, payload_len);
	*len = n;
	return b;
}

int fx_write_idx(const char *dir, const char *name, int gz, int type, int ndim,
		 const uint32_t *dims, const void *payload, size_t payload_len,
		 char *path)
{
	size_t len;
	uint8_t *b = fx_idx(type, ndim, dims, payload, payload_len, &len);
	int rc;

	if (!b)
		return -1;
	rc = fx_write(dir, name, gz, b, len, path);
	free(b);
	return rc;
}
