/*
 * tests/examples/test_gpt_data.c — examples/gpt_data.c: llm.c token files
 * round-trip through the writer and the reader; a truncated, padded,
 * wrong-magic or wrong-version file is refused naming the fault; text
 * files and folders read byte by byte (fortune's .dat indexes skipped);
 * a device, a FIFO or a socket refused before it is opened, a corpus over
 * the size bound refused naming the file and its size (the text's counting
 * the ranks of the host); llm.c shards mapped from one file, a folder or a
 * glob read as the same tokens, a bad shard refused naming it, an id over
 * the vocabulary named with its shard, no bound on mapped data.
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

/* ------------------------------------------------------------- shards */

/* ids[0..n) cut into k shards of a new folder d, named d/x_train_00000i.bin
 * (with a README and a .idx beside them, which a folder's *.bin leaves). */
static void write_shards(const char *d, const int32_t *ids, int64_t n, int k)
{
	char err[256], name[128];
	mkdir(path(d), 0700);
	for (int i = 0; i < k; i++) {
		int64_t a = n * i / k, b = n * (i + 1) / k;
		snprintf(name, sizeof(name), "%s/x_train_%06d.bin", d, i + 1);
		cr_assert_eq(gpt_tokens_save(path(name), ids + a, b - a, err, sizeof(err)), 0, "%s",
			     err);
	}
	snprintf(name, sizeof(name), "%s/README", d);
	write_bytes(name, "not a shard", 11);
	snprintf(name, sizeof(name), "%s/x.idx", d);
	write_bytes(name, "no", 2);
}

/* Every window of T + 1 tokens (crossing shard boundaries too) read from
 * the span over a equals the one over b. */
static void same_windows(const gpt_shards *a, const gpt_shards *b, int T)
{
	gpt_span sa = { .shards = a, .n = a->n }, sb = { .shards = b, .n = b->n };
	int32_t wa[64], wb[64];
	char err[256];
	cr_assert_eq(a->n, b->n);
	for (int64_t s = 0; s + T + 1 <= a->n; s += 7) {
		cr_assert_eq(gpt_span_read(&sa, s, T + 1, 0, wa, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(gpt_span_read(&sb, s, T + 1, 0, wb, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(memcmp(wa, wb, sizeof(int32_t) * (size_t)(T + 1)), 0, "window at %lld",
			     (long long)s);
	}
}

/* llm.c's shards as its users have them: one file, a folder of shards and
 * a glob over them give the same tokens, in order, windows crossing the
 * shards' edges included; the largest id found by the scan. */
Test(gpt_data, shards_folder_and_glob_read_as_one_file)
{
	enum { N = 20011 };
	int32_t *ids = malloc(sizeof(int32_t) * N);
	char err[512], spec[600];
	gpt_shards one, dir, glob;
	for (int i = 0; i < N; i++)
		ids[i] = (i * 7919 + 13) % 50257;
	cr_assert_eq(gpt_tokens_save(path("one.bin"), ids, N, err, sizeof(err)), 0, "%s", err);
	write_shards("s", ids, N, 3);
	cr_assert_eq(gpt_shards_open(path("one.bin"), &one, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(gpt_shards_open(path("s"), &dir, err, sizeof(err)), 0, "%s", err);
	snprintf(spec, sizeof(spec), "%s/*_train_*.bin", path("s"));
	cr_assert_eq(gpt_shards_open(spec, &glob, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(one.count, 1);
	cr_assert_eq(dir.count, 3);
	cr_assert_eq(glob.count, 3);
	cr_assert(strstr(dir.shard[0].path, "x_train_000001.bin") &&
		  strstr(dir.shard[2].path, "x_train_000003.bin"));
	cr_assert_eq(one.n, N);
	same_windows(&one, &dir, 31);
	same_windows(&one, &glob, 31);
	gpt_span all = { .shards = &glob, .n = glob.n };
	int32_t *back = malloc(sizeof(int32_t) * N);
	cr_assert_eq(gpt_span_read(&all, 0, N, 50257, back, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(back, ids, sizeof(int32_t) * N), 0);
	int vmax = 0;
	for (int i = 0; i < N; i++)
		vmax = ids[i] > vmax ? ids[i] : vmax;
	cr_assert_eq(gpt_shards_max_id(&dir), vmax);
	cr_assert_eq(gpt_shards_max_id(&one), vmax);
	/* A span is a range of the set: the held-out tenth, read in place. */
	gpt_span tail = { .shards = &dir, .from = N - N / 10, .n = N / 10 };
	cr_assert_eq(gpt_span_read(&tail, 0, N / 10, 0, back, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(memcmp(back, ids + N - N / 10, sizeof(int32_t) * (N / 10)), 0);
	cr_assert_eq(gpt_span_read(&tail, 1, N / 10, 0, back, err, sizeof(err)), -1);
	cr_assert(strstr(err, "outside"), "%s", err);
	gpt_shards_close(&one);
	gpt_shards_close(&dir);
	gpt_shards_close(&glob);
	free(back);
	free(ids);
}

/* An id at or over the vocabulary is caught as its batch is converted,
 * naming the shard and the token's place in it. */
Test(gpt_data, an_id_over_the_vocabulary_named_with_its_shard)
{
	int32_t ids[40];
	char err[512];
	gpt_shards s;
	for (int i = 0; i < 40; i++)
		ids[i] = i == 33 ? 700 : i;
	write_shards("v", ids, 40, 2);
	cr_assert_eq(gpt_shards_open(path("v"), &s, err, sizeof(err)), 0, "%s", err);
	gpt_span all = { .shards = &s, .n = s.n };
	int32_t out[40];
	cr_assert_eq(gpt_span_read(&all, 0, 33, 512, out, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(gpt_span_read(&all, 30, 5, 512, out, err, sizeof(err)), -1);
	cr_assert(strstr(err, "x_train_000002.bin: token 13 is id 700, not below the vocabulary 512"),
		  "%s", err);
	gpt_shards_close(&s);
}

/* A bad shard among good ones is refused at open, naming it and what is
 * wrong: its magic, a file shorter than the header, a count that
 * disagrees with the size; nothing is left mapped. */
Test(gpt_data, a_bad_shard_refused_naming_the_file)
{
	int32_t ids[64];
	char err[512], spec[600], bad[512];
	gpt_shards s;
	for (int i = 0; i < 64; i++)
		ids[i] = i;
	static const struct {
		const char *what, *want;
	} cases[] = {
		{ "magic", "x_train_000002.bin: magic 20240501, expected 20240520" },
		{ "short", "x_train_000002.bin: 100 bytes, shorter than the 1024-byte llm.c header" },
		{ "count", "x_train_000002.bin: header says 21 tokens, the file holds 40 bytes" },
	};
	for (int c = 0; c < 3; c++) {
		char d[16];
		snprintf(d, sizeof(d), "bad%d", c);
		write_shards(d, ids, 64, 3);
		snprintf(bad, sizeof(bad), "%s/x_train_000002.bin", path(d));
		if (c == 0) {
			int32_t m = 20240501;
			FILE *f = fopen(bad, "r+b");
			cr_assert(f);
			cr_assert_eq(fwrite(&m, 4, 1, f), 1);
			fclose(f);
		} else {
			cr_assert_eq(truncate(bad, c == 1 ? 100 : 1024 + 40), 0);
		}
		cr_assert_eq(gpt_shards_open(path(d), &s, err, sizeof(err)), -1, "%s", cases[c].what);
		cr_assert(strstr(err, cases[c].want), "%s: %s", cases[c].what, err);
		cr_assert(s.count == 0 && !s.shard, "%s", cases[c].what);
		snprintf(spec, sizeof(spec), "%s/x_*.bin", path(d));
		cr_assert_eq(gpt_shards_open(spec, &s, err, sizeof(err)), -1, "%s", cases[c].what);
		cr_assert(strstr(err, cases[c].want), "%s (glob): %s", cases[c].what, err);
	}
	/* No shard at all: an empty folder, a glob matching nothing. */
	mkdir(path("empty"), 0700);
	cr_assert_eq(gpt_shards_open(path("empty"), &s, err, sizeof(err)), -1);
	cr_assert(strstr(err, "empty: no .bin files in this folder"), "%s", err);
	snprintf(spec, sizeof(spec), "%s/*.bin", path("empty"));
	cr_assert_eq(gpt_shards_open(spec, &s, err, sizeof(err)), -1);
	cr_assert(strstr(err, "no file matches this pattern"), "%s", err);
	cr_assert_eq(gpt_shards_open("/dev/zero", &s, err, sizeof(err)), -1);
	cr_assert(strstr(err, "/dev/zero is a character device, not a regular file"), "%s", err);
}

/* Mapped shards are held by no rank: a set over the copying reader's
 * bounds (2^32 - 1 tokens, sparse) is taken, and read in place. */
Test(gpt_data, mapped_shards_are_not_held_to_the_copy_bound)
{
	int32_t head[256] = { GPT_LLMC_MAGIC, GPT_LLMC_VERSION, -1 }, w[3];
	char err[512];
	gpt_shards s;
	mkdir(path("huge"), 0700);
	write_bytes("huge/a.bin", head, sizeof(head));
	cr_assert_eq(truncate(path("huge/a.bin"), 1024 + 2 * (off_t)0xffffffffu), 0);
	cr_assert_eq(gpt_shards_open(path("huge"), &s, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(s.n, 0xffffffffll);
	gpt_span all = { .shards = &s, .n = s.n };
	cr_assert_eq(gpt_span_read(&all, s.n - 3, 3, 2, w, err, sizeof(err)), 0, "%s", err);
	cr_assert(w[0] == 0 && w[1] == 0 && w[2] == 0);
	gpt_shards_close(&s);
}

/* Text is held as ids, one copy per rank: its bound counts the ranks of
 * the host, and says so. */
Test(gpt_data, the_text_bound_counts_the_ranks_of_the_host)
{
	enum { N = 1 << 20 };
	char err[512];
	gpt_tokens t;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	cr_assert(pages > 0 && page > 0);
	/* Enough ranks that N bytes of text, 4 N bytes of ids each, pass half
	 * the memory; half as many fit. */
	long long half = (long long)pages * page / 2, ranks = half / (4LL * N) + 1;
	cr_assert_lt(ranks, 1LL << 30);
	int fd = open(path("t.txt"), O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, N), 0);
	close(fd);
	cr_assert_eq(gpt_text_load_shared(path("t.txt"), (int)(ranks / 2), &t, err, sizeof(err)), 0,
		     "%s", err);
	gpt_tokens_free(&t);
	cr_assert_eq(gpt_text_load_shared(path("t.txt"), (int)ranks, &t, err, sizeof(err)), -1);
	char want[128];
	snprintf(want, sizeof(want), "for each of the %lld ranks on this host", ranks);
	cr_assert(strstr(err, "t.txt: 1048576 bytes") && strstr(err, want), "%s", err);
	cr_assert_null(t.ids);
}
