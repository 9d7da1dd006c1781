/*
 * idx_fixture.h — helpers for the datasets/ suites: a private temp dir and
 * small hand-made IDX files, raw or gzip, well formed or broken on purpose.
 */
#ifndef LOOM_TESTS_IDX_FIXTURE_H
#define LOOM_TESTS_IDX_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

/* Creates a fresh dir under $TEST_TMPDIR (or /tmp) into buf (>= 256 bytes).
 * Returns 0 on success. */
int fx_tmpdir(char *buf, size_t len);

/* Writes len bytes to dir/name, gzip-compressed when gz; the full path goes
 * to path (>= 512 bytes). Returns 0 on success. */
int fx_write(const char *dir, const char *name, int gz, const void *bytes,
	     size_t len, char *path);

/* Builds an IDX image: magic 00 00 type ndim, big-endian dims, then
 * payload_len bytes of payload. Returns a malloc'd buffer, its size in *len. */
uint8_t *fx_idx(int type, int ndim, const uint32_t *dims, const void *payload,
		size_t payload_len, size_t *len);

/* Both of the above: an IDX file at dir/name. Returns 0 on success. */
int fx_write_idx(const char *dir, const char *name, int gz, int type, int ndim,
		 const uint32_t *dims, const void *payload, size_t payload_len,
		 char *path);

#endif /* LOOM_TESTS_IDX_FIXTURE_H */
