/*
 * examples/gpt_data.c — text and llm.c token files into token ids
 * (gpt_data.h).
 */
#include "examples/gpt_data.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void gpt_tokens_free(gpt_tokens *t)
{
	free(t->ids);
	memset(t, 0, sizeof(*t));
}

/* Appends the bytes of file path to *buf (*len used, *cap allocated). */
static int append_file(const char *path, unsigned char **buf, size_t *len, size_t *cap,
		       char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	for (;;) {
		if (*cap - *len < 65536) {
			size_t nc = *cap ? *cap * 2 : 1 << 20;
			unsigned char *nb = realloc(*buf, nc);
			if (!nb) {
				fclose(f);
				snprintf(err, errlen, "%s: out of memory", path);
				return -1;
			}
			*buf = nb;
			*cap = nc;
		}
		size_t got = fread(*buf + *len, 1, *cap - *len, f);
		*len += got;
		if (got == 0)
			break;
	}
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		snprintf(err, errlen, "%s: read error", path);
		return -1;
	}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int skipped(const char *name)
{
	size_t n = strlen(name);
	return name[0] == '.' || (n > 4 && !strcmp(name + n - 4, ".dat")) ||
	       (n > 3 && !strcmp(name + n - 3, ".u8"));
}

/* Every regular file of folder dir, in name order. */
static int append_dir(const char *dir, unsigned char **buf, size_t *len, size_t *cap, char *err,
		      size_t errlen)
{
	DIR *d = opendir(dir);
	char **names = NULL;
	size_t n = 0, cap_n = 0;
	int rc = -1;
	if (!d) {
		snprintf(err, errlen, "%s: %s", dir, strerror(errno));
		return -1;
	}
	for (struct dirent *e; (e = readdir(d));) {
		if (skipped(e->d_name))
			continue;
		if (n == cap_n) {
			cap_n = cap_n ? 2 * cap_n : 64;
			char **nn = realloc(names, cap_n * sizeof(*names));
			if (!nn)
				goto out;
			names = nn;
		}
		if (!(names[n] = strdup(e->d_name)))
			goto out;
		n++;
	}
	qsort(names, n, sizeof(*names), cmp_str);
	rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		char path[4096];
		struct stat sb;
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
			rc = append_file(path, buf, len, cap, err, errlen);
	}
	if (rc == 0 && *len == 0) {
		snprintf(err, errlen, "%s: no text files in this folder", dir);
		rc = -1;
	}
out:
	if (rc && !err[0])
		snprintf(err, errlen, "%s: out of memory", dir);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return rc;
}

int gpt_text_load(const char *path, gpt_tokens *out, char *err, size_t errlen)
{
	struct stat sb;
	unsigned char *buf = NULL;
	size_t len = 0, cap = 0;
	memset(out, 0, sizeof(*out));
	err[0] = 0;
	if (stat(path, &sb) != 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	if ((S_ISDIR(sb.st_mode) ? append_dir(path, &buf, &len, &cap, err, errlen) :
				   append_file(path, &buf, &len, &cap, err, errlen))) {
		free(buf);
		return -1;
	}
	out->ids = malloc(sizeof(int32_t) * (len ? len : 1));
	if (!out->ids) {
		free(buf);
		snprintf(err, errlen, "%s: out of memory", path);
		return -1;
	}
	for (size_t i = 0; i < len; i++)
		out->ids[i] = buf[i];
	out->n = (int64_t)len;
	out->vocab = 256;
	free(buf);
	return 0;
}

static int32_t le32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

int gpt_tokens_parse(const unsigned char *buf, size_t len, const char *name, gpt_tokens *out,
		     char *err, size_t errlen)
{
	const size_t head = 4 * GPT_LLMC_HEADER_INTS;
	memset(out, 0, sizeof(*out));
	if (len < head) {
		snprintf(err, errlen, "%s: %zu bytes, shorter than the %zu-byte llm.c header", name,
			 len, head);
		return -1;
	}
	if (le32(buf) != GPT_LLMC_MAGIC) {
		snprintf(err, errlen, "%s: magic %d, expected %d (an llm.c token file)", name,
			 le32(buf), GPT_LLMC_MAGIC);
		return -1;
	}
	if (le32(buf + 4) != GPT_LLMC_VERSION) {
		snprintf(err, errlen, "%s: version %d, expected %d", name, le32(buf + 4),
			 GPT_LLMC_VERSION);
		return -1;
	}
	int64_t n = (uint32_t)le32(buf + 8);
	if ((len - head) / 2 != (size_t)n || (len - head) % 2) {
		snprintf(err, errlen, "%s: header says %lld tokens, the file holds %zu bytes of them "
			 "(truncated or padded)", name, (long long)n, len - head);
		return -1;
	}
	if (n < 2) {
		snprintf(err, errlen, "%s: %lld tokens, at least 2 needed", name, (long long)n);
		return -1;
	}
	out->ids = malloc(sizeof(int32_t) * (size_t)n);
	if (!out->ids) {
		snprintf(err, errlen, "%s: out of memory for %lld tokens", name, (long long)n);
		return -1;
	}
	int vmax = 0;
	for (int64_t i = 0; i < n; i++) {
		const unsigned char *p = buf + head + 2 * i;
		out->ids[i] = p[0] | p[1] << 8;
		vmax = out->ids[i] > vmax ? out->ids[i] : vmax;
	}
	out->n = n;
	out->vocab = vmax + 1;
	return 0;
}

int gpt_tokens_load(const char *path, gpt_tokens *out, char *err, size_t errlen)
{
	unsigned char *buf = NULL;
	size_t len = 0, cap = 0;
	err[0] = 0;
	memset(out, 0, sizeof(*out));
	if (append_file(path, &buf, &len, &cap, err, errlen)) {
		free(buf);
		return -1;
	}
	int rc = gpt_tokens_parse(buf, len, path, out, err, errlen);
	free(buf);
	return rc;
}

int gpt_tokens_save(const char *path, const int32_t *ids, int64_t n, char *err, size_t errlen)
{
	int32_t head[GPT_LLMC_HEADER_INTS] = { GPT_LLMC_MAGIC, GPT_LLMC_VERSION, (int32_t)n };
	FILE *f = fopen(path, "wb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	int bad = fwrite(head, sizeof(head), 1, f) != 1;
	for (int64_t i = 0; i < n && !bad; i++) {
		uint16_t v = (uint16_t)ids[i];
		bad = ids[i] < 0 || ids[i] > 65535 || fwrite(&v, 2, 1, f) != 1;
	}
	bad |= fclose(f) != 0;
	if (bad)
		snprintf(err, errlen, "%s: write failed (or a token outside [0, 65535])", path);
	return bad ? -1 : 0;
}
