/*
 * tests/examples/test_gpt_data.c — examples/gpt_data.c: llm.c token files
 * round-trip through the writer and the reader; a truncated, padded,
 * wrong-magic or wrong-version file is refused naming the fault; text
 * files and folders read byte by byte (fortune's .dat indexes skipped);
 * a device, a FIFO or a socket refused before it is opened, a corpus over
 * the size bound refused naming the file and its size.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
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

/* /dev/zero never ends and a FIFO blocks its reader: both refused at once,
 * as text and as token files, naming what they are (the suite's timeout
 * catches a reader that opens the FIFO). */
Test(gpt_data, devices_and_fifos_refused, .timeout = 20)
{
	char err[256];
	gpt_tokens t;
	cr_assert_eq(gpt_text_load("/dev/zero", &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "/dev/zero is a character device, not a regular file"), "%s", err);
	cr_assert_null(t.ids);
	cr_assert_eq(gpt_tokens_load("/dev/zero", &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "/dev/zero is a character device"), "%s", err);
	cr_assert_eq(mkfifo(path("fifo"), 0600), 0);
	cr_assert_eq(gpt_text_load(path("fifo"), &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "fifo is a FIFO, not a regular file (the reader takes a text file"),
		  "%s", err);
	cr_assert_eq(gpt_tokens_load(path("fifo"), &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "fifo is a FIFO"), "%s", err);
	/* In a folder, what is not a regular file is passed over. */
	mkdir(path("g"), 0700);
	write_bytes("g/a", "ok", 2);
	cr_assert_eq(mkfifo(path("g/b"), 0600), 0);
	cr_assert_eq(gpt_text_load(path("g"), &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t.n, 2);
	gpt_tokens_free(&t);
}

/* A sparse file one byte over the bound: refused from its size, before a
 * byte is read, naming the file and the size. */
Test(gpt_data, a_corpus_over_the_bound_refused_naming_its_size)
{
	char err[256], want[64];
	gpt_tokens t;
	int fd = open(path("big.txt"), O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, (off_t)GPT_DATA_MAX_TOKENS + 1), 0);
	close(fd);
	cr_assert_eq(gpt_text_load(path("big.txt"), &t, err, sizeof(err)), -1);
	snprintf(want, sizeof(want), "big.txt: %llu bytes", GPT_DATA_MAX_TOKENS + 1);
	cr_assert(strstr(err, want) && strstr(err, "more than"), "%s", err);
	cr_assert_null(t.ids);
	/* The same bytes in a folder: the folder named with their total. */
	mkdir(path("h"), 0700);
	char from[512];
	snprintf(from, sizeof(from), "%s", path("big.txt"));
	cr_assert_eq(rename(from, path("h/big.txt")), 0);
	cr_assert_eq(gpt_text_load(path("h"), &t, err, sizeof(err)), -1);
	snprintf(want, sizeof(want), "h: %llu bytes", GPT_DATA_MAX_TOKENS + 1);
	cr_assert(strstr(err, want), "%s", err);
	/* A token file whose header claims 2^32 - 1 tokens and whose size
	 * agrees (sparse): over the bound too. */
	int32_t head[256] = { GPT_LLMC_MAGIC, GPT_LLMC_VERSION, -1 };
	write_bytes("big.bin", head, sizeof(head));
	cr_assert_eq(truncate(path("big.bin"), 1024 + 2 * (off_t)0xffffffffu), 0);
	cr_assert_eq(gpt_tokens_load(path("big.bin"), &t, err, sizeof(err)), -1);
	cr_assert(strstr(err, "big.bin: 8589935614 bytes, 4294967295 tokens"), "%s", err);
	cr_assert_null(t.ids);
}

/* Token files read a chunk at a time: more tokens than one chunk holds
 * come back whole. */
Test(gpt_data, tokens_longer_than_a_chunk)
{
	enum { N = 100003 };
	int32_t *ids = malloc(sizeof(int32_t) * N);
	char err[256];
	gpt_tokens t;
	for (int i = 0; i < N; i++)
		ids[i] = (i * 7919) % 65536;
	cr_assert_eq(gpt_tokens_save(path("c.bin"), ids, N, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(gpt_tokens_load(path("c.bin"), &t, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(t.n, N);
	for (int i = 0; i < N; i++)
		cr_assert_eq(t.ids[i], ids[i], "token %d", i);
	gpt_tokens_free(&t);
	free(ids);
}
