/*
 * tests/fuzz/fuzz_gpt_tokens.c — libFuzzer target for the llm.c token-file
 * reader of examples/gpt_data.c: the input is the file, given to
 * gpt_tokens_parse as a buffer of exactly its size (ASan sees a read past
 * the end) and to gpt_tokens_load through a memfd. Byte 0 bit 0 set: the
 * harness writes a valid header (magic, version, the count the size
 * implies) over the first 12 bytes, so mutations reach the tokens. A parse
 * either succeeds with n tokens matching the size, each < 65536 and below
 * the vocabulary it reports, or fails with a message and nothing allocated.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "examples/gpt_data.h"

static void check(int rc, const gpt_tokens *t, size_t size, const char *err)
{
	if (rc != 0) {
		FUZZ_CHECK(rc == -1 && err[0] && !t->ids && t->n == 0);
		return;
	}
	FUZZ_CHECK(t->ids && t->n >= 2 && (size_t)t->n * 2 + 1024 == size);
	FUZZ_CHECK(t->vocab >= 1 && t->vocab <= 65536);
	for (int64_t i = 0; i < t->n; i++)
		FUZZ_CHECK(t->ids[i] >= 0 && t->ids[i] < t->vocab);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned char *buf = malloc(size ? size : 1);
	char err[512], path[64];
	gpt_tokens t;
	FUZZ_CHECK(buf);
	memcpy(buf, data, size);
	if (size >= 12 && (data[0] & 1)) {
		int32_t head[3] = { GPT_LLMC_MAGIC, GPT_LLMC_VERSION,
				    (int32_t)(size >= 1024 ? (size - 1024) / 2 : 0) };
		memcpy(buf, head, sizeof(head));
	}
	err[0] = 0;
	int rc = gpt_tokens_parse(buf, size, "fuzz.bin", &t, err, sizeof(err));
	check(rc, &t, size, err);
	gpt_tokens_free(&t);

	int fd = fuzz_memfile(buf, size, path, sizeof(path));
	err[0] = 0;
	rc = gpt_tokens_load(path, &t, err, sizeof(err));
	check(rc, &t, size, err);
	gpt_tokens_free(&t);
	close(fd);
	free(buf);
	return 0;
}
