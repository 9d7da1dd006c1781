/*
 * tests/fuzz/fuzz_gpt_tokens.c — libFuzzer target for the llm.c token-file
 * readers of examples/gpt_data.c: the input is the file, given to
 * gpt_tokens_parse as a buffer of exactly its size (ASan sees a read past
 * the end), to gpt_tokens_load through a memfd, and to gpt_shards_open
 * (the shard header check and the read-only mapping gpt_ddp trains from)
 * through the same memfd, named as a file or, byte 0 bit 1 set, as a glob
 * matching it. Byte 0 bit 0 set: the harness writes a valid header (magic,
 * version, the count the size implies) over the first 12 bytes, so
 * mutations reach the tokens. A parse either succeeds with n tokens
 * matching the size, each < 65536 and below the vocabulary it reports, or
 * fails with a message and nothing allocated; the mapping agrees with the
 * parse: refused alike, or the same tokens through a span (whole, and a
 * window the input's bytes 1-4 place), the same largest id, and a
 * vocabulary one short refused naming the shard.
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

/* The memfd at path opened as a shard set agrees with the load (rc, t). */
static void check_shards(const char *path, const uint8_t *data, size_t size, int rc,
			 const gpt_tokens *t)
{
	char err[512], spec[80];
	gpt_shards s;
	size_t len = strlen(path);
	/* "/proc/self/fd/1[2]": a glob whose one match is the memfd. */
	if (size >= 1 && (data[0] & 2))
		snprintf(spec, sizeof(spec), "%.*s[%c]", (int)len - 1, path, path[len - 1]);
	else
		snprintf(spec, sizeof(spec), "%s", path);
	err[0] = 0;
	int src = gpt_shards_open(spec, &s, err, sizeof(err));
	FUZZ_CHECK(src == rc);
	if (src != 0) {
		FUZZ_CHECK(src == -1 && err[0] && !s.shard && s.count == 0);
		return;
	}
	FUZZ_CHECK(s.count == 1 && s.n == t->n && s.shard[0].first == 0);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)s.n);
	FUZZ_CHECK(ids);
	gpt_span all = { .shards = &s, .n = s.n };
	FUZZ_CHECK(gpt_span_read(&all, 0, s.n, t->vocab, ids, err, sizeof(err)) == 0);
	FUZZ_CHECK(memcmp(ids, t->ids, sizeof(int32_t) * (size_t)s.n) == 0);
	FUZZ_CHECK(gpt_shards_max_id(&s) == t->vocab - 1);
	if (t->vocab > 1) {
		err[0] = 0;
		FUZZ_CHECK(gpt_span_read(&all, 0, s.n, t->vocab - 1, ids, err, sizeof(err)) == -1);
		FUZZ_CHECK(strstr(err, path) && strstr(err, "not below the vocabulary"));
	}
	/* A window anywhere, in range or not: read whole, or refused. */
	if (size >= 5) {
		int64_t at = (int64_t)(data[1] | data[2] << 8) - 8, n = data[3] | data[4] << 8;
		gpt_span part = { .shards = &s, .from = s.n / 3, .n = s.n - s.n / 3 };
		int in = at >= 0 && at + n <= part.n;
		int32_t *w = malloc(sizeof(int32_t) * (size_t)(n + 1));
		FUZZ_CHECK(w);
		err[0] = 0;
		int wrc = gpt_span_read(&part, at, n, 0, w, err, sizeof(err));
		FUZZ_CHECK(wrc == (in ? 0 : -1));
		FUZZ_CHECK(!in ? err[0] != 0 :
				 memcmp(w, t->ids + part.from + at, sizeof(int32_t) * (size_t)n) == 0);
		free(w);
	}
	free(ids);
	gpt_shards_close(&s);
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
	check_shards(path, data, size, rc, &t);
	gpt_tokens_free(&t);
	close(fd);
	free(buf);
	return 0;
}
