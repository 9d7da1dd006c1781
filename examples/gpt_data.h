/*
 * examples/gpt_data.h — the text a GPT trains on, as token ids: any text
 * file (or a folder of them) read byte by byte (vocabulary 256), or an
 * llm.c token file (.bin: a 256-int32 header — magic 20240520, version 1,
 * token count — then uint16 tokens), or a set of such shards (a folder or a
 * glob, as llm.c's fineweb_train_*.bin) memory-mapped read-only and read a
 * window at a time. Plain C over files: no engine calls, so tests/fuzz can
 * drive the parsers alone. Errors come back as a message naming the file
 * and the fault.
 */
#ifndef LOOM_EXAMPLES_GPT_DATA_H
#define LOOM_EXAMPLES_GPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define GPT_LLMC_MAGIC 20240520
#define GPT_LLMC_VERSION 1
#define GPT_LLMC_HEADER_INTS 256

/* The most tokens a corpus read into ids may hold (2^31: 8 GiB of ids). A
 * corpus whose ids, once per rank of the host, would take more than half of
 * the machine's memory is refused too; either message names the file and
 * its size. Mapped shards (gpt_shards_open) are held by no rank, so neither
 * bound applies to them. */
#define GPT_DATA_MAX_TOKENS (1ull << 31)

/* Token ids of a corpus. */
typedef struct gpt_tokens {
	int32_t *ids;
	int64_t n;
	int vocab; /* 256 for bytes; for .bin files the largest id + 1 */
} gpt_tokens;

/* The bytes of path: a regular file, or every regular file of a folder
 * (sorted by name, fortune's .dat and .u8 indexes skipped), read straight
 * into the ids (4 bytes per byte of text, the text never held beside
 * them). A device, FIFO or socket is refused before it is opened (/dev/zero
 * never ends, a FIFO blocks), as is a corpus over the bounds above. 0, or
 * -1 with err. */
int gpt_text_load(const char *path, gpt_tokens *out, char *err, size_t errlen);
/* The same where host_ranks processes of this host each hold a copy (the
 * memory bound counts them all; gpt_text_load is host_ranks 1). */
int gpt_text_load_shared(const char *path, int host_ranks, gpt_tokens *out, char *err,
			 size_t errlen);

/* An llm.c token file, a regular file (header checked: magic, version,
 * count matching the file's size; within the bounds above), read a chunk
 * at a time into the ids. 0, or -1 with err naming the fault. */
int gpt_tokens_load(const char *path, gpt_tokens *out, char *err, size_t errlen);
/* The same from bytes in memory (what the fuzz target drives). */
int gpt_tokens_parse(const unsigned char *buf, size_t len, const char *name, gpt_tokens *out,
		     char *err, size_t errlen);
/* Writes tokens (each < 65536) as an llm.c token file. 0, or -1 with err. */
int gpt_tokens_save(const char *path, const int32_t *ids, int64_t n, char *err, size_t errlen);

void gpt_tokens_free(gpt_tokens *t);

/* The header of an llm.c token file of len bytes (its first min(len, 1024)
 * at head): magic, version, and a count of at least 2 tokens that fills the
 * rest of the file exactly. *n, or -1 with err naming name and the fault. */
int gpt_tokens_header(const unsigned char *head, uint64_t len, const char *name, int64_t *n,
		      char *err, size_t errlen);

/* One llm.c shard, mapped read-only (MAP_PRIVATE, PROT_READ): the ranks
 * of a host share its pages in the page cache, none holds a copy. */
typedef struct gpt_shard {
	char *path;
	const unsigned char *map; /* the whole file: header, then n uint16 */
	size_t len;
	int64_t n;     /* its tokens */
	int64_t first; /* its first token's index in the set */
} gpt_shard;

/* A set of shards, read as one stream of tokens in name order. */
typedef struct gpt_shards {
	gpt_shard *shard;
	int count;
	int64_t n; /* the tokens of all shards */
} gpt_shards;

/* spec: an llm.c token file, a folder (its *.bin files, sorted by name) or
 * a glob ('dir/fineweb_train_*.bin', sorted). Every shard is a regular file
 * whose header is checked (gpt_tokens_header) and mapped before this
 * returns: a bad one is refused naming it, before any training. 0, or -1
 * with err and nothing held. */
int gpt_shards_open(const char *spec, gpt_shards *out, char *err, size_t errlen);
void gpt_shards_close(gpt_shards *s);
/* The largest id of the set: reads every token once, giving each chunk's
 * pages back to the page cache as it goes (madvise), so the scan does not
 * stay in this process's resident set. */
int gpt_shards_max_id(const gpt_shards *s);

/* Tokens [from, from + n) of a corpus: ids held in memory (text) or a set
 * of mapped shards. A split (the held-out tenth) is two spans of one
 * corpus, not a copy. */
typedef struct gpt_span {
	const int32_t *ids;       /* held ids, or NULL */
	const gpt_shards *shards; /* else these */
	int64_t from, n;
} gpt_span;

/* Tokens [at, at + len) of s into out as int32 (uint16 shards converted
 * here, for these tokens only), each checked below vocab (0: unchecked).
 * 0, or -1 with err: a range outside s, or an id out of range naming its
 * shard and position there. */
int gpt_span_read(const gpt_span *s, int64_t at, int64_t len, int vocab, int32_t *out,
		  char *err, size_t errlen);

#endif /* LOOM_EXAMPLES_GPT_DATA_H */
