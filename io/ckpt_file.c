/*
 * io/ckpt_file.c — writes and reads the checkpoint container described in
 * ckpt_file.h. Writing goes through a temporary file and a rename so a crash
 * never leaves a half-written checkpoint under the real name; reading checks
 * the CRC before it parses anything the CRC covers, then checks every length
 * against the file size all the same.
 */
#define _GNU_SOURCE /* O_DIRECTORY, fdopen, fileno */
#include "io/ckpt_file.h"

#include "base/errf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define HEADER_BYTES 24 /* magic 8, version 4, count 4, fingerprint 8 */
#define TRAILER_BYTES 4
/* name length, one name byte (its NUL), dtype, ndim, byte length: the least
 * a record can take, used to refuse absurd counts before allocating. */
#define MIN_RECORD_BYTES (4 + 1 + 4 + 4 + 8)

struct loom_ckpt_file {
	unsigned char *buf; /* the whole file, LOOM_CKPT_ALIGN-aligned */
	size_t size;
	uint64_t fingerprint;
	int count;
	loom_ckpt_record *recs;
};

/* zlib's crc32 takes a 32-bit length; payloads may be larger. */
static uLong crc_update(uLong crc, const void *p, size_t n)
{
	const unsigned char *b = p;

	while (n) {
		uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
		crc = crc32(crc, b, chunk);
		b += chunk;
		n -= chunk;
	}
	return crc;
}

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++)
		v |= (uint32_t)p[i] << (8 * i);
	return v;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static size_t pad_to_align(size_t off)
{
	return (LOOM_CKPT_ALIGN - off % LOOM_CKPT_ALIGN) % LOOM_CKPT_ALIGN;
}

/* ---------------------------------------------------------------- write */

/* Streams bytes to the temporary file, keeping the running CRC and offset. */
typedef struct ckpt_writer {
	FILE *f;
	uLong crc;
	size_t off;
} ckpt_writer;

static int w_bytes(ckpt_writer *w, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (fwrite(p, 1, n, w->f) != n)
		return -1;
	w->crc = crc_update(w->crc, p, n);
	w->off += n;
	return 0;
}

static int w_record(ckpt_writer *w, const loom_ckpt_record *r)
{
	static const unsigned char zeros[LOOM_CKPT_ALIGN];
	unsigned char head[4 + 4 + 8 * LOOM_MAX_DIMS + 8];
	size_t name_len = strlen(r->name) + 1;
	size_t k = 0;
	unsigned char len4[4];

	put_u32(len4, (uint32_t)name_len);
	if (w_bytes(w, len4, 4) || w_bytes(w, r->name, name_len))
		return -1;
	put_u32(head + k, (uint32_t)r->dtype);
	k += 4;
	put_u32(head + k, (uint32_t)r->ndim);
	k += 4;
	for (int d = 0; d < r->ndim; d++, k += 8)
		put_u64(head + k, (uint64_t)r->dims[d]);
	put_u64(head + k, (uint64_t)r->bytes);
	k += 8;
	if (w_bytes(w, head, k))
		return -1;
	if (w_bytes(w, zeros, pad_to_align(w->off)))
		return -1;
	return w_bytes(w, r->data, r->bytes);
}

static loom_status check_records(const char *path, const loom_ckpt_record *recs,
				 int n, char *err, size_t errlen)
{
	if (n < 0 || (n > 0 && !recs))
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
			    "checkpoint '%s': %d records at %p", path, n,
			    (const void *)recs);
	for (int i = 0; i < n; i++) {
		const loom_ckpt_record *r = &recs[i];

		if (!r->name || !r->name[0] || strlen(r->name) >= UINT32_MAX)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				    "checkpoint '%s': record %d has no name", path, i);
		if (r->ndim < 0 || r->ndim > LOOM_MAX_DIMS)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				    "checkpoint '%s': record '%s' has ndim %d (0..%d)",
				    path, r->name, r->ndim, LOOM_MAX_DIMS);
		for (int d = 0; d < r->ndim; d++)
			if (r->dims[d] < 0)
				return loom_errnf(err, errlen, LOOM_ERR_INVALID,
					    "checkpoint '%s': record '%s' dim %d is %lld",
					    path, r->name, d, (long long)r->dims[d]);
		if (r->bytes && !r->data)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				    "checkpoint '%s': record '%s' has %zu bytes but no data",
				    path, r->name, r->bytes);
		/* Quadratic, but checkpoints hold hundreds of tensors, not millions,
		 * and a duplicate would make loom_ckpt_find silently pick one. */
		for (int j = 0; j < i; j++)
			if (strcmp(recs[j].name, r->name) == 0)
				return loom_errnf(err, errlen, LOOM_ERR_INVALID,
					    "checkpoint '%s': record name '%s' appears twice",
					    path, r->name);
	}
	return LOOM_OK;
}

/* Makes the rename itself durable. Some file systems refuse fsync on a
 * directory (EINVAL); there is nothing more to do on those. */
static int sync_parent_dir(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir;
	int fd, rc = 0;

	if (!slash)
		dir = strdup(".");
	else if (slash == path)
		dir = strdup("/");
	else
		dir = strndup(path, (size_t)(slash - path));
	if (!dir)
		return -1;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(dir);
	if (fd < 0)
		return -1;
	if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
		rc = -1;
	close(fd);
	return rc;
}

loom_status loom_ckpt_write(const char *path, uint64_t fingerprint,
			    const loom_ckpt_record *recs, int n, char *err,
			    size_t errlen)
{
	unsigned char head[HEADER_BYTES], crc4[4];
	ckpt_writer w = { .f = NULL, .crc = crc32(0L, Z_NULL, 0), .off = 0 };
	loom_status st;
	char *tmp;
	int fd, saved;

	if (!path || !path[0])
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "checkpoint: no path given");
	st = check_records(path, recs, n, err, errlen);
	if (st != LOOM_OK)
		return st;

	if (asprintf(&tmp, "%s.tmp", path) < 0)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "checkpoint '%s': out of memory", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "checkpoint '%s': cannot create '%s': %s",
			  path, tmp, strerror(errno));
		goto out_free_tmp;
	}
	w.f = fdopen(fd, "wb");
	if (!w.f) {
		saved = errno;
		close(fd);
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "checkpoint '%s': %s", path,
			  strerror(saved));
		goto out_unlink;
	}

	memcpy(head, LOOM_CKPT_MAGIC, 8);
	put_u32(head + 8, LOOM_CKPT_VERSION);
	put_u32(head + 12, (uint32_t)n);
	put_u64(head + 16, fingerprint);
	if (w_bytes(&w, head, sizeof head))
		goto out_write_error;
	for (int i = 0; i < n; i++)
		if (w_record(&w, &recs[i]))
			goto out_write_error;
	put_u32(crc4, (uint32_t)w.crc);
	if (fwrite(crc4, 1, 4, w.f) != 4 || fflush(w.f) != 0 || fsync(fileno(w.f)) != 0)
		goto out_write_error;
	if (fclose(w.f) != 0) {
		w.f = NULL;
		goto out_write_error;
	}
	w.f = NULL;

	if (rename(tmp, path) != 0) {
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "checkpoint '%s': cannot rename '%s' over it: %s",
			  path, tmp, strerror(errno));
		goto out_unlink;
	}
	/* The new file is in place; a failure here only means it may not
	 * survive a power cut, which the caller should still hear about. */
	if (sync_parent_dir(path) != 0)
		st = loom_errnf(err, errlen, LOOM_ERR_IO,
			  "checkpoint '%s': written, but syncing its directory failed: %s",
			  path, strerror(errno));
	else
		st = LOOM_OK;
	goto out_free_tmp;

out_write_error:
	st = loom_errnf(err, errlen, LOOM_ERR_IO, "checkpoint '%s': writing '%s' failed: %s",
		  path, tmp, strerror(errno));
	if (w.f)
		fclose(w.f);
out_unlink:
	unlink(tmp);
out_free_tmp:
	free(tmp);
	return st;
}

/* ---------------------------------------------------------------- read */

/* Reads the whole file into a buffer aligned like the payloads inside it. */
static loom_status slurp(const char *path, unsigned char **out, size_t *size,
			 char *err, size_t errlen)
{
	struct stat sb;
	unsigned char *buf = NULL;
	size_t got = 0, cap;
	loom_status st = LOOM_OK;
	FILE *f;

	*out = NULL;
	f = fopen(path, "rb");
	if (!f)
		return loom_errnf(err, errlen, errno == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO,
			    "checkpoint '%s': cannot open: %s", path, strerror(errno));
	if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "checkpoint '%s': not a regular file", path);
		goto out_close;
	}
	/* aligned_alloc wants a multiple of the alignment, and at least one. */
	cap = (size_t)sb.st_size + LOOM_CKPT_ALIGN - (size_t)sb.st_size % LOOM_CKPT_ALIGN;
	buf = aligned_alloc(LOOM_CKPT_ALIGN, cap);
	if (!buf) {
		st = loom_errnf(err, errlen, LOOM_ERR_NOMEM, "checkpoint '%s': cannot hold %lld bytes",
			  path, (long long)sb.st_size);
		goto out_close;
	}
	got = fread(buf, 1, (size_t)sb.st_size, f);
	if (ferror(f)) {
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "checkpoint '%s': read failed: %s",
			  path, strerror(errno));
		free(buf);
		goto out_close;
	}
	*out = buf;
	*size = got;
out_close:
	fclose(f);
	return st;
}

/*
 * What must hold before any field is read: the magic (a file that is not a
 * checkpoint at all is told so, not called corrupt), room for a header and
 * the trailer, and the CRC. The CRC is the last four bytes whatever the file
 * holds, so the size alone finds it; checking it before the header and the
 * records means a damaged count, length or dtype is reported as damage rather
 * than misread as a malformed file or another version.
 */
static loom_status check_envelope(const loom_ckpt_file *f, const char *path, char *err,
				  size_t errlen)
{
	uint32_t want, have;

	if (f->size < 8 || memcmp(f->buf, LOOM_CKPT_MAGIC, 8) != 0)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "checkpoint '%s': not a loom checkpoint",
			    path);
	if (f->size < HEADER_BYTES + TRAILER_BYTES)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "checkpoint '%s': truncated header (%zu bytes)", path, f->size);
	want = get_u32(f->buf + f->size - TRAILER_BYTES);
	have = (uint32_t)crc_update(crc32(0L, Z_NULL, 0), f->buf, f->size - TRAILER_BYTES);
	if (want != have)
		return loom_errnf(err, errlen, LOOM_ERR_CORRUPT,
			    "checkpoint '%s': checksum mismatch (stored %08x, computed %08x): "
			    "the file is damaged, truncated or extended",
			    path, want, have);
	return LOOM_OK;
}

/* Walks the records, checking each length against what is left, and fills
 * f->recs. The CRC has vouched for these bytes, but only that they are what
 * some writer wrote: a foreign or buggy one could have put any number here,
 * so nothing read is trusted to stay in bounds. */
static loom_status parse_records(loom_ckpt_file *f, const char *path, char *err,
				 size_t errlen)
{
	const size_t end = f->size - TRAILER_BYTES;
	size_t off = HEADER_BYTES;

	for (int i = 0; i < f->count; i++) {
		loom_ckpt_record *r = &f->recs[i];
		uint32_t name_len, ndim;
		size_t pad;
		uint64_t bytes;

		if (end - off < 4)
			goto out_overrun;
		name_len = get_u32(f->buf + off);
		off += 4;
		if (name_len > end - off)
			goto out_overrun;
		if (name_len < 2 ||
		    memchr(f->buf + off, 0, name_len) != f->buf + off + name_len - 1)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				    "checkpoint '%s': record %d has a malformed name", path, i);
		r->name = (const char *)(f->buf + off);
		off += name_len;
		if (end - off < 8)
			goto out_overrun;
		r->dtype = (int)(int32_t)get_u32(f->buf + off);
		ndim = get_u32(f->buf + off + 4);
		off += 8;
		if (ndim > LOOM_MAX_DIMS)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				    "checkpoint '%s': record '%s' has ndim %u (at most %d)",
				    path, r->name, ndim, LOOM_MAX_DIMS);
		r->ndim = (int)ndim;
		if (end - off < 8 * (size_t)ndim + 8)
			goto out_overrun;
		for (uint32_t d = 0; d < ndim; d++, off += 8) {
			r->dims[d] = (int64_t)get_u64(f->buf + off);
			/* The writer refuses negative dims; a reader that
			 * multiplied one out would get a nonsense size. */
			if (r->dims[d] < 0)
				return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
					    "checkpoint '%s': malformed: record '%s' dim %u is %lld",
					    path, r->name, d, (long long)r->dims[d]);
		}
		bytes = get_u64(f->buf + off);
		off += 8;
		pad = pad_to_align(off);
		if (pad > end - off || bytes > end - off - pad)
			goto out_overrun;
		off += pad;
		r->data = f->buf + off;
		r->bytes = (size_t)bytes;
		off += (size_t)bytes;
		continue;
out_overrun:
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "checkpoint '%s': malformed: record %d of %d runs past the end of "
			    "the data (file has %zu bytes)",
			    path, i, f->count, f->size);
	}
	if (off != end)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "checkpoint '%s': malformed: %zu unexpected bytes after the last record",
			    path, end - off);
	return LOOM_OK;
}

/* Version and record count, read only once the CRC has passed. */
static loom_status parse_header(loom_ckpt_file *f, const char *path, char *err,
				size_t errlen)
{
	uint32_t version = get_u32(f->buf + 8), count = get_u32(f->buf + 12);

	if (version != LOOM_CKPT_VERSION)
		return loom_errnf(err, errlen, LOOM_ERR_MISMATCH,
			    "checkpoint '%s': format version %u, this build reads version %u",
			    path, version, LOOM_CKPT_VERSION);
	/* Bounds the allocation below by the file size, whatever count says. */
	if (count > (f->size - HEADER_BYTES - TRAILER_BYTES) / MIN_RECORD_BYTES ||
	    count > INT32_MAX)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "checkpoint '%s': malformed: %u records cannot fit in %zu bytes",
			    path, count, f->size);
	f->count = (int)count;
	f->fingerprint = get_u64(f->buf + 16);
	f->recs = calloc(count ? count : 1, sizeof *f->recs);
	if (!f->recs)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "checkpoint '%s': out of memory", path);
	return LOOM_OK;
}

loom_status loom_ckpt_read(const char *path, loom_ckpt_file **out, char *err,
			   size_t errlen)
{
	loom_ckpt_file *f;
	loom_status st;

	if (!out)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "checkpoint: no output handle");
	*out = NULL;
	if (!path || !path[0])
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "checkpoint: no path given");
	f = calloc(1, sizeof *f);
	if (!f)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "checkpoint '%s': out of memory", path);
	st = slurp(path, &f->buf, &f->size, err, errlen);
	if (st == LOOM_OK)
		st = check_envelope(f, path, err, errlen);
	if (st == LOOM_OK)
		st = parse_header(f, path, err, errlen);
	if (st == LOOM_OK)
		st = parse_records(f, path, err, errlen);
	if (st != LOOM_OK) {
		loom_ckpt_free(f);
		return st;
	}
	*out = f;
	return LOOM_OK;
}

const loom_ckpt_record *loom_ckpt_find(const loom_ckpt_file *f, const char *name)
{
	if (!f || !name)
		return NULL;
	for (int i = 0; i < f->count; i++)
		if (strcmp(f->recs[i].name, name) == 0)
			return &f->recs[i];
	return NULL;
}

int loom_ckpt_count(const loom_ckpt_file *f)
{
	return f ? f->count : 0;
}

const loom_ckpt_record *loom_ckpt_at(const loom_ckpt_file *f, int i)
{
	if (!f || i < 0 || i >= f->count)
		return NULL;
	return &f->recs[i];
}

uint64_t loom_ckpt_fingerprint(const loom_ckpt_file *f)
{
	return f ? f->fingerprint : 0;
}

void loom_ckpt_free(loom_ckpt_file *f)
{
	if (!f)
		return;
	free(f->recs);
	free(f->buf);
	free(f);
}
