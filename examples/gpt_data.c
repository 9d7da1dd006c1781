/*
 * examples/gpt_data.c — text and llm.c token files into token ids
 * (gpt_data.h). Text is read straight into its ids, a chunk at a time (the
 * text never held beside them); llm.c shards are mapped read-only and
 * converted a window at a time, as a batch needs them.
 */
#include "examples/gpt_data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void gpt_tokens_free(gpt_tokens *t)
{
	free(t->ids);
	memset(t, 0, sizeof(*t));
}

/* What a file that is not regular is, for the message. */
static const char *kind_of(mode_t m)
{
	return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a FIFO" :
	       S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* Half the machine's memory, the most a corpus's ids may take; 0: unknown. */
static uint64_t memory_bound(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 0;
}

/* n tokens (of the named file or folder, `bytes` long), held as ids by
 * each of host_ranks processes, fit the bounds, or err says which and by
 * how much. */
static int check_bound(const char *name, uint64_t bytes, uint64_t n, int host_ranks, char *err,
		       size_t errlen)
{
	uint64_t mem = memory_bound(), ranks = host_ranks > 1 ? (uint64_t)host_ranks : 1;
	if (n > GPT_DATA_MAX_TOKENS) {
		snprintf(err, errlen, "%s: %llu bytes, %llu tokens: more than the %llu tokens the "
			 "reader takes (each held as a 4-byte id)", name, (unsigned long long)bytes,
			 (unsigned long long)n, (unsigned long long)GPT_DATA_MAX_TOKENS);
		return -1;
	}
	if (mem && n * 4 * ranks > mem) {
		char each[96] = "";
		if (ranks > 1)
			snprintf(each, sizeof(each), " (%.1f GiB for each of the %llu ranks on this host)",
				 n * 4 / 1073741824.0, (unsigned long long)ranks);
		snprintf(err, errlen, "%s: %llu bytes, %llu tokens: their ids would take %.1f GiB%s, "
			 "more than half of this machine's memory (%.1f GiB)", name,
			 (unsigned long long)bytes, (unsigned long long)n,
			 n * 4 * ranks / 1073741824.0, each, mem * 2 / 1073741824.0);
		return -1;
	}
	return 0;
}

/* path must be a regular file (a device, a FIFO or a socket is refused
 * before it is opened: /dev/zero never ends, a FIFO blocks). */
static int regular_file(const char *path, struct stat *sb, const char *takes, char *err,
			size_t errlen)
{
	if (stat(path, sb) != 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(sb->st_mode)) {
		snprintf(err, errlen, "%s is %s, not a regular file (the reader takes %s)", path,
			 kind_of(sb->st_mode), takes);
		return -1;
	}
	return 0;
}

/* The bytes of regular file path as ids[*n ...], at most cap - *n of them:
 * a file longer than when it was measured is refused. */
static int read_text(const char *path, int32_t *ids, int64_t *n, int64_t cap, char *err,
		     size_t errlen)
{
	unsigned char chunk[65536];
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	size_t got;
	while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0) {
		if ((int64_t)got > cap - *n) {
			fclose(f);
			snprintf(err, errlen, "%s grew while it was read (more than %lld bytes)",
				 path, (long long)cap);
			return -1;
		}
		for (size_t i = 0; i < got; i++)
			ids[*n + (int64_t)i] = chunk[i];
		*n += (int64_t)got;
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

/* The regular files of folder dir in name order (*names, *n of them) and
 * their bytes together. */
static int list_dir(const char *dir, char ***names, size_t *n, uint64_t *bytes, char *err,
		    size_t errlen)
{
	DIR *d = opendir(dir);
	size_t cap_n = 0;
	*names = NULL;
	*n = 0;
	*bytes = 0;
	if (!d) {
		snprintf(err, errlen, "%s: %s", dir, strerror(errno));
		return -1;
	}
	for (struct dirent *e; (e = readdir(d));) {
		char path[4096];
		struct stat sb;
		if (skipped(e->d_name))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
			continue;
		if (*n == cap_n) {
			cap_n = cap_n ? 2 * cap_n : 64;
			char **nn = realloc(*names, cap_n * sizeof(**names));
			if (!nn)
				goto nomem;
			*names = nn;
		}
		if (!((*names)[*n] = strdup(e->d_name)))
			goto nomem;
		++*n;
		*bytes += (uint64_t)sb.st_size;
	}
	closedir(d);
	if (*n) /* an empty folder has no list: qsort takes no NULL */
		qsort(*names, *n, sizeof(**names), cmp_str);
	return 0;
nomem:
	closedir(d);
	snprintf(err, errlen, "%s: out of memory", dir);
	return -1;
}

int gpt_text_load(const char *path, gpt_tokens *out, char *err, size_t errlen)
{
	return gpt_text_load_shared(path, 1, out, err, errlen);
}

int gpt_text_load_shared(const char *path, int host_ranks, gpt_tokens *out, char *err,
			 size_t errlen)
{
	struct stat sb;
	char **names = NULL;
	size_t n_names = 0;
	uint64_t bytes;
	int rc = -1;
	memset(out, 0, sizeof(*out));
	err[0] = 0;
	if (stat(path, &sb) != 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	int dir = S_ISDIR(sb.st_mode);
	if (dir ? list_dir(path, &names, &n_names, &bytes, err, errlen) :
		  regular_file(path, &sb, "a text file or a folder of them", err, errlen))
		goto out;
	if (!dir)
		bytes = (uint64_t)sb.st_size;
	if (dir && n_names == 0) {
		snprintf(err, errlen, "%s: no text files in this folder", path);
		goto out;
	}
	if (check_bound(path, bytes, bytes, host_ranks, err, errlen))
		goto out;
	out->ids = malloc(sizeof(int32_t) * (size_t)(bytes ? bytes : 1));
	if (!out->ids) {
		snprintf(err, errlen, "%s: out of memory for %llu tokens", path,
			 (unsigned long long)bytes);
		goto out;
	}
	rc = 0;
	if (!dir)
		rc = read_text(path, out->ids, &out->n, (int64_t)bytes, err, errlen);
	for (size_t i = 0; i < n_names && rc == 0; i++) {
		char file[4096];
		snprintf(file, sizeof(file), "%s/%s", path, names[i]);
		rc = read_text(file, out->ids, &out->n, (int64_t)bytes, err, errlen);
	}
	if (rc == 0 && dir && out->n == 0) {
		snprintf(err, errlen, "%s: no text files in this folder", path);
		rc = -1;
	}
	out->vocab = 256;
out:
	for (size_t i = 0; i < n_names; i++)
		free(names[i]);
	free(names);
	if (rc)
		gpt_tokens_free(out);
	return rc;
}

static int32_t le32(const unsigned char *p)
{
	return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
			 (uint32_t)p[3] << 24);
}

int gpt_tokens_header(const unsigned char *head, uint64_t len, const char *name, int64_t *n,
		      char *err, size_t errlen)
{
	const uint64_t hb = 4 * GPT_LLMC_HEADER_INTS;
	if (len < hb) {
		snprintf(err, errlen, "%s: %llu bytes, shorter than the %llu-byte llm.c header", name,
			 (unsigned long long)len, (unsigned long long)hb);
		return -1;
	}
	if (le32(head) != GPT_LLMC_MAGIC) {
		snprintf(err, errlen, "%s: magic %d, expected %d (an llm.c token file)", name,
			 le32(head), GPT_LLMC_MAGIC);
		return -1;
	}
	if (le32(head + 4) != GPT_LLMC_VERSION) {
		snprintf(err, errlen, "%s: version %d, expected %d", name, le32(head + 4),
			 GPT_LLMC_VERSION);
		return -1;
	}
	*n = (uint32_t)le32(head + 8);
	if ((len - hb) / 2 != (uint64_t)*n || (len - hb) % 2) {
		snprintf(err, errlen, "%s: header says %lld tokens, the file holds %llu bytes of them "
			 "(truncated or padded)", name, (long long)*n, (unsigned long long)(len - hb));
		return -1;
	}
	if (*n < 2) {
		snprintf(err, errlen, "%s: %lld tokens, at least 2 needed", name, (long long)*n);
		return -1;
	}
	return 0;
}

/* n uint16 tokens (little-endian) into ids, returning the largest. */
static int decode(const unsigned char *p, int64_t n, int32_t *ids)
{
	int vmax = 0;
	for (int64_t i = 0; i < n; i++) {
		ids[i] = p[2 * i] | p[2 * i + 1] << 8;
		vmax = ids[i] > vmax ? ids[i] : vmax;
	}
	return vmax;
}

int gpt_tokens_parse(const unsigned char *buf, size_t len, const char *name, gpt_tokens *out,
		     char *err, size_t errlen)
{
	int64_t n;
	memset(out, 0, sizeof(*out));
	if (gpt_tokens_header(buf, len, name, &n, err, errlen) ||
	    check_bound(name, len, (uint64_t)n, 1, err, errlen))
		return -1;
	out->ids = malloc(sizeof(int32_t) * (size_t)n);
	if (!out->ids) {
		snprintf(err, errlen, "%s: out of memory for %lld tokens", name, (long long)n);
		return -1;
	}
	out->vocab = decode(buf + 4 * GPT_LLMC_HEADER_INTS, n, out->ids) + 1;
	out->n = n;
	return 0;
}

int gpt_tokens_load(const char *path, gpt_tokens *out, char *err, size_t errlen)
{
	unsigned char head[4 * GPT_LLMC_HEADER_INTS], chunk[65536];
	struct stat sb;
	int64_t n, at = 0;
	int vmax = 0;
	FILE *f = NULL;
	err[0] = 0;
	memset(out, 0, sizeof(*out));
	if (regular_file(path, &sb, "an llm.c token file", err, errlen))
		return -1;
	if (!(f = fopen(path, "rb"))) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	uint64_t len = (uint64_t)sb.st_size;
	size_t got = fread(head, 1, sizeof(head), f);
	if (gpt_tokens_header(head, got < sizeof(head) ? got : len, path, &n, err, errlen) ||
	    check_bound(path, len, (uint64_t)n, 1, err, errlen))
		goto fail;
	if (!(out->ids = malloc(sizeof(int32_t) * (size_t)n))) {
		snprintf(err, errlen, "%s: out of memory for %lld tokens", path, (long long)n);
		goto fail;
	}
	while (at < n && (got = fread(chunk, 1, (size_t)(n - at) * 2 < sizeof(chunk) ?
						      (size_t)(n - at) * 2 : sizeof(chunk), f)) > 0) {
		int64_t k = (int64_t)got / 2;
		int v = decode(chunk, k, out->ids + at);
		vmax = v > vmax ? v : vmax;
		at += k;
		if (got % 2)
			break;
	}
	if (at != n || fgetc(f) != EOF) {
		snprintf(err, errlen, "%s: %s while it was read (the header says %lld tokens)", path,
			 at != n ? "shrank" : "grew", (long long)n);
		goto fail;
	}
	fclose(f);
	out->n = n;
	out->vocab = vmax + 1;
	return 0;
fail:
	if (f)
		fclose(f);
	gpt_tokens_free(out);
	return -1;
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

/* ---------------------------------------------------------------- shards */

void gpt_shards_close(gpt_shards *s)
{
	for (int i = 0; i < s->count; i++) {
		if (s->shard[i].map)
			munmap((void *)s->shard[i].map, s->shard[i].len);
		free(s->shard[i].path);
	}
	free(s->shard);
	memset(s, 0, sizeof(*s));
}

/* path's header checked and the file mapped into sh. 0, or -1 with err. */
static int map_shard(const char *path, gpt_shard *sh, char *err, size_t errlen)
{
	struct stat sb;
	int64_t n;
	if (regular_file(path, &sb, "llm.c token files, a folder or a glob of them", err, errlen))
		return -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	/* Measured again on the open file: the one mapped. */
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
		snprintf(err, errlen, "%s: changed while it was opened", path);
		close(fd);
		return -1;
	}
	uint64_t len = (uint64_t)sb.st_size;
	void *map = NULL;
	if (len >= 4 * GPT_LLMC_HEADER_INTS &&
	    (map = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
		snprintf(err, errlen, "%s: cannot map it: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	close(fd); /* the mapping keeps the file */
	if (gpt_tokens_header(map, len, path, &n, err, errlen)) {
		if (map)
			munmap(map, (size_t)len);
		return -1;
	}
	sh->map = map;
	sh->len = (size_t)len;
	sh->n = n;
	return 0;
}

static int ends_with_bin(const char *name)
{
	size_t n = strlen(name);
	return n > 4 && !strcmp(name + n - 4, ".bin");
}

/* A folder's *.bin files (list_dir's regular files), sorted by name. */
static int dir_shards(const char *dir, char ***paths, size_t *n, char *err, size_t errlen)
{
	char **names;
	size_t k;
	uint64_t bytes;
	int rc = 0;
	if (list_dir(dir, &names, &k, &bytes, err, errlen))
		return -1;
	if (!(*paths = calloc(k + 1, sizeof(char *))))
		rc = -1;
	for (size_t i = 0; i < k; i++) {
		char p[4096];
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		if (rc == 0 && ends_with_bin(names[i]) && !((*paths)[(*n)++] = strdup(p)))
			rc = -1;
		free(names[i]);
	}
	free(names);
	if (rc)
		snprintf(err, errlen, "%s: out of memory", dir);
	else if (*n == 0) {
		snprintf(err, errlen, "%s: no .bin files in this folder (llm.c token shards)", dir);
		rc = -1;
	}
	return rc;
}

/* A glob's matches, sorted by name (glob's own order is the locale's). */
static int glob_shards(const char *spec, char ***paths, size_t *n, char *err, size_t errlen)
{
	glob_t g;
	int rc = glob(spec, 0, NULL, &g);
	if (rc == GLOB_NOMATCH) {
		snprintf(err, errlen, "%s: no file matches this pattern", spec);
		return -1;
	}
	if (rc != 0) {
		snprintf(err, errlen, "%s: %s", spec, rc == GLOB_NOSPACE ? "out of memory" :
			 "the pattern's folders cannot be read");
		globfree(&g);
		return -1;
	}
	rc = 0;
	if (!(*paths = calloc(g.gl_pathc, sizeof(char *))))
		rc = -1;
	for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
		if (!((*paths)[(*n)++] = strdup(g.gl_pathv[i])))
			rc = -1;
	globfree(&g);
	if (rc)
		snprintf(err, errlen, "%s: out of memory", spec);
	else
		qsort(*paths, *n, sizeof(char *), cmp_str);
	return rc;
}

/* The shard paths spec names (*n of them; on failure what was made is
 * still in *paths, for the caller to free): a folder's *.bin, a glob's
 * matches, or spec itself (a file, or anything else that exists or has no
 * pattern: map_shard says what is wrong with it). */
static int shard_paths(const char *spec, char ***paths, size_t *n, char *err, size_t errlen)
{
	struct stat sb;
	int exists = stat(spec, &sb) == 0;
	*paths = NULL;
	*n = 0;
	if (exists && S_ISDIR(sb.st_mode))
		return dir_shards(spec, paths, n, err, errlen);
	if (!exists && strpbrk(spec, "*?["))
		return glob_shards(spec, paths, n, err, errlen);
	if (!(*paths = calloc(1, sizeof(char *))) || !((*paths)[0] = strdup(spec))) {
		snprintf(err, errlen, "%s: out of memory", spec);
		return -1;
	}
	*n = 1;
	return 0;
}

int gpt_shards_open(const char *spec, gpt_shards *out, char *err, size_t errlen)
{
	char **paths;
	size_t n;
	int rc = -1;
	memset(out, 0, sizeof(*out));
	err[0] = 0;
	if (shard_paths(spec, &paths, &n, err, errlen))
		goto out;
	if (n > 1u << 30 || !(out->shard = calloc(n, sizeof(gpt_shard)))) {
		snprintf(err, errlen, "%s: out of memory for %zu shards", spec, n);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		gpt_shard *sh = &out->shard[out->count];
		if (map_shard(paths[i], sh, err, errlen))
			goto out;
		sh->path = paths[i];
		paths[i] = NULL;
		sh->first = out->n;
		out->n += sh->n;
		out->count++;
	}
	rc = 0;
out:
	for (size_t i = 0; paths && i < n; i++)
		free(paths[i]);
	free(paths);
	if (rc)
		gpt_shards_close(out);
	return rc;
}

int gpt_shards_max_id(const gpt_shards *s)
{
	/* Chunks start at multiples of 16 MiB (even, and a multiple of any page
	 * size), so a token's two bytes never straddle two. */
	const size_t chunk = (size_t)16 << 20, head = 4 * GPT_LLMC_HEADER_INTS;
	int vmax = 0;
	for (int i = 0; i < s->count; i++) {
		const gpt_shard *sh = &s->shard[i];
		for (size_t at = 0; at < sh->len; at += chunk) {
			size_t end = sh->len - at < chunk ? sh->len : at + chunk;
			for (size_t k = at < head ? head : at; k + 1 < end; k += 2) {
				int v = sh->map[k] | sh->map[k + 1] << 8;
				vmax = v > vmax ? v : vmax;
			}
			/* Back to the page cache: the scan is no part of this
			 * process's resident set. */
			(void)madvise((void *)(sh->map + at), end - at, MADV_DONTNEED);
		}
	}
	return vmax;
}

/* The shard of s holding token t (0 <= t < s->n). */
static const gpt_shard *shard_of(const gpt_shards *s, int64_t t)
{
	int lo = 0, hi = s->count - 1;
	while (lo < hi) {
		int mid = lo + (hi - lo + 1) / 2;
		if (s->shard[mid].first <= t)
			lo = mid;
		else
			hi = mid - 1;
	}
	return &s->shard[lo];
}

int gpt_span_read(const gpt_span *s, int64_t at, int64_t len, int vocab, int32_t *out,
		  char *err, size_t errlen)
{
	if (at < 0 || len < 0 || at > s->n || len > s->n - at) {
		snprintf(err, errlen, "tokens %lld to %lld: outside the %lld of this span",
			 (long long)at, (long long)(at + len), (long long)s->n);
		return -1;
	}
	int64_t t = s->from + at;
	if (s->ids) {
		memcpy(out, s->ids + t, sizeof(int32_t) * (size_t)len);
		for (int64_t k = 0; vocab > 0 && k < len; k++)
			if (out[k] >= vocab) {
				snprintf(err, errlen, "token %lld is id %d, not below the vocabulary %d",
					 (long long)(t + k), out[k], vocab);
				return -1;
			}
		return 0;
	}
	while (len > 0) {
		const gpt_shard *sh = shard_of(s->shards, t);
		int64_t in = t - sh->first, k = sh->n - in < len ? sh->n - in : len;
		const unsigned char *p = sh->map + 4 * GPT_LLMC_HEADER_INTS + 2 * in;
		for (int64_t j = 0; j < k; j++) {
			out[j] = p[2 * j] | p[2 * j + 1] << 8;
			if (vocab > 0 && out[j] >= vocab) {
				snprintf(err, errlen, "%s: token %lld is id %d, not below the vocabulary "
					 "%d (--vocab)", sh->path, (long long)(in + j), out[j], vocab);
				return -1;
			}
		}
		out += k;
		t += k;
		len -= k;
	}
	return 0;
}
