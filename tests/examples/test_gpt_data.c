/*
 * tests/examples/test_gpt_data.c — examples/gpt_data.c: llm.c token files
 * round-trip through the writer and the reader; a truncated, padded,
 * wrong-magic or wrong-version file is refused naming the fault; text
 * files and folders read byte by byte (fortune's .dat indexes skipped).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "examples/gpt_data.h"

static char dir[256];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "%s/gptdata.XXXXXX", getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
	cr_assert(mkdtemp(dir));
}

static const char *path(const char *name)
{
	static char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

static void write_bytes(const char *name, const void *b, size_t n)
{
	FILE *f = fopen(path(name), "wb");
	cr_assert(f);
	cr_assert_eq(fwrite(b, 1, n, f), n);
	fclose(f);
}

TestSuite(gpt_data, .init = setup);

Test(gpt_data, tokens_round_trip)
{
	int32_t ids[5] = { 50256, 0, 17, 65535, 3 };
	char err[256];
	gpt_tokens t;
	cr_assert_eq(gpt_tokens_save(path("a.bin"), ids, 5, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(gpt_tokens_load(path("a.bin"), &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t.n, 5);
	cr_assert_eq(t.vocab, 65536);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(t.ids[i], ids[i]);
	gpt_tokens_free(&t);
}

/* A file cut short or with extra bytes: the header's count disagrees. */
Test(gpt_data, truncated_or_padded_refused)
{
	int32_t ids[4] = { 1, 2, 3, 4 };
	char err[256];
	gpt_tokens t;
	unsigned char buf[1024 + 8];
	cr_assert_eq(gpt_tokens_save(path("b.bin"), ids, 4, err, sizeof(err)), 0);
	FILE *f = fopen(path("b.bin"), "rb");
	cr_assert_eq(fread(buf, 1, sizeof(buf), f), sizeof(buf));
	fclose(f);
	cr_assert_eq(gpt_tokens_parse(buf, sizeof(buf) - 2, "b.bin", &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "b.bin") && strstr(err, "header says 4 tokens") && strstr(err, "truncated"),
		  "%s", err);
	cr_assert_eq(gpt_tokens_parse(buf, sizeof(buf) - 1, "b.bin", &t, err, sizeof(err)), -1);
	cr_assert_null(t.ids);
}

Test(gpt_data, wrong_magic_and_version_refused)
{
	int32_t head[256] = { 20240520, 2, 2 };
	uint16_t tok[2] = { 1, 2 };
	unsigned char buf[1028];
	char err[256];
	gpt_tokens t;
	memcpy(buf, head, 1024);
	memcpy(buf + 1024, tok, 4);
	cr_assert_eq(gpt_tokens_parse(buf, sizeof(buf), "v.bin", &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "version 2, expected 1"), "%s", err);
	head[0] = 20240501;
	head[1] = 1;
	memcpy(buf, head, 1024);
	cr_assert_eq(gpt_tokens_parse(buf, sizeof(buf), "m.bin", &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "m.bin: magic 20240501, expected 20240520"), "%s", err);
	head[0] = 20240520;
	memcpy(buf, head, 1024);
	cr_assert_eq(gpt_tokens_parse(buf, sizeof(buf), "ok.bin", &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t.n, 2);
	cr_assert_eq(t.ids[1], 2);
	gpt_tokens_free(&t);
}

Test(gpt_data, text_file_and_folder_bytes)
{
	char err[256];
	gpt_tokens t;
	mkdir(path("f"), 0700);
	write_bytes("f/b", "xy", 2);
	write_bytes("f/a", "\xffq", 2);
	write_bytes("f/a.dat", "INDEX", 5);
	cr_assert_eq(gpt_text_load(path("f"), &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t.n, 4);
	cr_assert_eq(t.vocab, 256);
	cr_assert(t.ids[0] == 255 && t.ids[1] == 'q' && t.ids[2] == 'x' && t.ids[3] == 'y');
	gpt_tokens_free(&t);
	cr_assert_eq(gpt_text_load(path("missing"), &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "missing: No such file"), "%s", err);
}
