/*
 * tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors
 * reader (io/safetensors.c). The input is parsed from a buffer of
 * exactly its size (ASan sees any read past it). When bit 0 of the first
 * byte is set, the harness rewrites the 8-byte header length to the length
 * of the JSON text that follows (up to the first byte after its closing
 * brace, or all of it), so that mutations of the header get past the length
 * check and reach jansson and the offset checks.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "io/safetensors.h"

static void fix_length(unsigned char *b, size_t n)
{
	if (n < 8)
		return;
	size_t h = n - 8;
	for (size_t i = n; i > 8; i--)
		if (b[i - 1] == '}') {
			h = i - 8;
			break;
		}
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)((uint64_t)h >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[512];
	loom_st_file *f = NULL;

	if (size < 1)
		return 0;
	size_t n = size - 1;
	unsigned char *b = malloc(n ? n : 1);
	FUZZ_CHECK(b);
	memcpy(b, data + 1, n);
	if (data[0] & 1)
		fix_length(b, n);
	err[0] = 0;
	if (loom_st_parse(b, n, "fuzz", &f, err, sizeof(err)) == LOOM_OK) {
		FUZZ_CHECK(f);
		size_t total = 0;
		for (int i = 0; i < loom_st_count(f); i++) {
			const loom_st_tensor *t = loom_st_at(f, i);
			FUZZ_CHECK(t && t->name);
			FUZZ_CHECK(t->ndim >= 0 && t->ndim <= LOOM_ST_MAX_DIMS);
			size_t want = loom_st_dtype_size(t->dtype);
			FUZZ_CHECK(want > 0);
			for (int d = 0; d < t->ndim; d++) {
				FUZZ_CHECK(t->dims[d] >= 0);
				want *= (size_t)t->dims[d];
			}
			FUZZ_CHECK(want == t->bytes);
			FUZZ_CHECK(loom_st_find(f, t->name));
			/* Every tensor's bytes lie inside the input (ASan checks). */
			if (t->bytes) {
				const volatile unsigned char *p = t->data;
				FUZZ_CHECK(p >= b && p + t->bytes <= b + n);
				(void)p[0];
				(void)p[t->bytes - 1];
			}
			total += t->bytes;
		}
		/* The tensors tile the data: together no larger than it. */
		FUZZ_CHECK(total <= n);
		FUZZ_CHECK(loom_st_at(f, loom_st_count(f)) == NULL);
		(void)loom_st_metadata(f, "format");
		loom_st_free(f);
	} else {
		FUZZ_CHECK(f == NULL);
		FUZZ_CHECK(err[0] != 0);
	}
	free(b);
	return 0;
}
