/*
 * examples/gpt_data.h — the text a GPT trains on, as token ids: any text
 * file (or a folder of them) read byte by byte (vocabulary 256), or an
 * llm.c token file (.bin: a 256-int32 header — magic 20240520, version 1,
 * token count — then uint16 tokens). Plain C over files: no engine calls,
 * so tests/fuzz can drive the parser alone. Errors come back as a message
 * naming the file and the fault.
 */
#ifndef LOOM_EXAMPLES_GPT_DATA_H
#define LOOM_EXAMPLES_GPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define GPT_LLMC_MAGIC 20240520
#define GPT_LLMC_VERSION 1
#define GPT_LLMC_HEADER_INTS 256

/* The most tokens a corpus may hold (2^31: 8 GiB of ids). A corpus whose
 * ids would take more than half of the machine's memory is refused too;
 * either message names the file and its size. */
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

#endif /* LOOM_EXAMPLES_GPT_DATA_H */
