/*
 * tests/examples/gpt_shards_fixture.c — llm.c token shards for
 * test_gpt_shards.sh, written with examples/gpt_data.c's gpt_tokens_save:
 *
 *   gpt_shards_fixture text TEXT FILE DIR K   TEXT's bytes as tokens: all in
 *                                             FILE, and cut into K shards
 *                                             DIR/x_train_00000i.bin
 *   gpt_shards_fixture fill N K ID DIR        K shards of N tokens, each ID
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "examples/gpt_data.h"

static int save_cut(const int32_t *ids, int64_t n, const char *dir, int k)
{
	char err[512], name[4200];
	mkdir(dir, 0700);
	for (int i = 0; i < k; i++) {
		int64_t a = n * i / k, b = n * (i + 1) / k;
		snprintf(name, sizeof(name), "%s/x_train_%06d.bin", dir, i + 1);
		if (gpt_tokens_save(name, ids + a, b - a, err, sizeof(err))) {
			fprintf(stderr, "gpt_shards_fixture: %s\n", err);
			return 1;
		}
	}
	return 0;
}

/* k shards of n tokens, each id, a block at a time (a big set is written
 * without holding it). */
static int fill(int64_t n, int k, int id, const char *dir)
{
	static uint16_t block[1 << 16];
	int32_t head[GPT_LLMC_HEADER_INTS] = { GPT_LLMC_MAGIC, GPT_LLMC_VERSION, (int32_t)n };
	char name[4200];
	if (n < 2 || n > INT32_MAX || k < 1 || id < 0 || id > 65535)
		return 2;
	for (size_t i = 0; i < sizeof(block) / 2; i++)
		block[i] = (uint16_t)id; /* little-endian hosts, as llm.c's files */
	mkdir(dir, 0700);
	for (int i = 0; i < k; i++) {
		snprintf(name, sizeof(name), "%s/x_train_%06d.bin", dir, i + 1);
		FILE *f = fopen(name, "wb");
		int bad = !f || fwrite(head, sizeof(head), 1, f) != 1;
		for (int64_t at = 0; at < n && !bad; at += 1 << 16) {
			size_t m = n - at < (1 << 16) ? (size_t)(n - at) : (size_t)1 << 16;
			bad = fwrite(block, 2, m, f) != m;
		}
		if (!f || fclose(f) != 0 || bad) {
			fprintf(stderr, "gpt_shards_fixture: %s: write failed\n", name);
			return 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	char err[512];
	int rc = 1;
	if (argc == 6 && !strcmp(argv[1], "text")) {
		gpt_tokens t;
		if (gpt_text_load(argv[2], &t, err, sizeof(err)) ||
		    gpt_tokens_save(argv[3], t.ids, t.n, err, sizeof(err))) {
			fprintf(stderr, "gpt_shards_fixture: %s\n", err);
			return 1;
		}
		rc = save_cut(t.ids, t.n, argv[4], atoi(argv[5]));
		gpt_tokens_free(&t);
		return rc;
	}
	if (argc == 6 && !strcmp(argv[1], "fill"))
		return fill(atoll(argv[2]), atoi(argv[3]), atoi(argv[4]), argv[5]);
	fprintf(stderr, "usage: gpt_shards_fixture text TEXT FILE DIR K | fill N K ID DIR\n");
	return 2;
}
