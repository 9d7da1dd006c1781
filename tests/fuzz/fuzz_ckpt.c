/*
 * tests/fuzz/fuzz_ckpt.c — libFuzzer target for the checkpoint reader
 * (io/ckpt_file.c) and the range checks loom_load applies on top to the
 * run-time scalars (io/ckpt_meta.c). A CRC stops almost every mutation
 * at the first check, so when bit 0 of the first byte is set the harness
 * reseals the rest with a valid CRC first, as a faulty writer would: the
 * parser behind it then sees every lie a file can tell.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "io/ckpt_file.h"

static void reseal(unsigned char *b, size_t n)
{
	uint32_t crc;

	if (n < 4)
		return;
	crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)(n - 4));
	for (int i = 0; i < 4; i++)
		b[n - 4 + i] = (unsigned char)(crc >> (8 * i));
}

/* What loom_load does with the scalars once they pass: the conversions
 * must be defined (UBSan checks float-to-integer overflow). */
static void use_meta(const loom_ckpt_record *r)
{
	double m[LOOM_CKPT_META_COUNT];
	char err[256];

	if (r->dtype != LOOM_F64 || r->ndim != 1 || r->dims[0] != LOOM_CKPT_META_COUNT ||
	    r->bytes != sizeof(m))
		return;
	memcpy(m, r->data, sizeof(m));
	if (loom_ckpt_check_meta(m, err, sizeof(err)) != LOOM_OK) {
		FUZZ_CHECK(strstr(err, "field"));
		return;
	}
	volatile int64_t step = (int64_t)m[LOOM_CKPT_META_STEP];
	volatile float scale = (float)m[LOOM_CKPT_META_SCALE];
	volatile int32_t tracker = (int32_t)m[LOOM_CKPT_META_TRACKER];
	volatile int64_t skipped = (int64_t)m[LOOM_CKPT_META_SKIPPED];
	volatile int64_t below = (int64_t)m[LOOM_CKPT_META_BELOW];
	FUZZ_CHECK(step >= 0 && scale > 0 && tracker >= 0 && skipped >= 0 && below >= 0);
	FUZZ_CHECK(step + skipped >= 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char *b;
	size_t n;
	char path[64], err[512];
	loom_ckpt_file *f = NULL;
	int fd;

	if (size < 1)
		return 0;
	n = size - 1;
	b = malloc(n ? n : 1);
	FUZZ_CHECK(b);
	memcpy(b, data + 1, n);
	if (data[0] & 1)
		reseal(b, n);
	fd = fuzz_memfile(b, n, path, sizeof(path));
	err[0] = 0;
	if (loom_ckpt_read(path, &f, err, sizeof(err)) == LOOM_OK) {
		FUZZ_CHECK(f);
		for (int i = 0; i < loom_ckpt_count(f); i++) {
			const loom_ckpt_record *r = loom_ckpt_at(f, i);

			FUZZ_CHECK(r && r->name && r->name[0]);
			FUZZ_CHECK(r->ndim >= 0 && r->ndim <= LOOM_MAX_DIMS);
			for (int d = 0; d < r->ndim; d++)
				FUZZ_CHECK(r->dims[d] >= 0);
			FUZZ_CHECK(loom_ckpt_find(f, r->name));
			/* Every payload byte lies inside the file (ASan checks). */
			if (r->bytes) {
				const volatile unsigned char *p = r->data;
				(void)p[0];
				(void)p[r->bytes - 1];
			}
			if (strcmp(r->name, LOOM_CKPT_META) == 0)
				use_meta(r);
		}
		FUZZ_CHECK(loom_ckpt_at(f, loom_ckpt_count(f)) == NULL);
		loom_ckpt_free(f);
	} else {
		FUZZ_CHECK(f == NULL);
		FUZZ_CHECK(err[0] != 0);
	}
	close(fd);
	free(b);
	return 0;
}
