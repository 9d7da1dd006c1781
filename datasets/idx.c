/*
 * idx.c — the IDX file format of MNIST and Fashion-MNIST, read through zlib so
 * that raw and gzip files take the same path (gzread passes raw bytes through).
 * A file is accepted only when its header is sound and its payload is exactly
 * as long as the dims say: a short download and appended junk are both caught.
 * The dims are a claim, not a size to allocate: a raw file's claim is checked
 * against its size, and a gzip payload is read into a buffer that grows with
 * what actually arrives.
 */
#include <sys/stat.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "data_internal.h"
#include "loom_data.h"

/* gzread takes an unsigned length; reading in chunks keeps it in range. */
#define IDX_CHUNK (1u << 30)
/* The first payload buffer of a gzip file; it doubles as data arrives. */
#define IDX_FIRST_BUF (1u << 20)

static const char *idx_type_name(int type)
{
	switch (type) {
	case 0x08: return "unsigned byte";
	case 0x09: return "signed byte";
	case 0x0B: return "int16";
	case 0x0C: return "int32";
	case 0x0D: return "float32";
	case 0x0E: return "float64";
	default: return NULL;
	}
}

/* Reads up to len bytes; returns how many were read, or -1 on a zlib error
 * (short counts at the end of the stream are not errors here). */
static int64_t idx_read(gzFile f, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		size_t want = len - got;
		int n;

		if (want > IDX_CHUNK)
			want = IDX_CHUNK;
		n = gzread(f, (char *)buf + got, (unsigned)want);
		if (n < 0)
			return -1;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (int64_t)got;
}

/* zlib's own words for the last failure, or "" when there was none. */
static const char *idx_zerror(gzFile f)
{
	int code = Z_OK;
	const char *msg = gzerror(f, &code);

	return code == Z_OK || !msg ? "" : msg;
}

/* Counts what is left in the stream, so a message can say how much junk
 * follows the data. */
static int64_t idx_count_rest(gzFile f)
{
	char buf[4096];
	int64_t total = 0;
	int n;

	while ((n = gzread(f, buf, sizeof(buf))) > 0)
		total += n;
	return total;
}

static loom_status idx_open(const char *path, gzFile *out, int64_t *fsize,
			    char *err, size_t errlen)
{
	struct stat sb;
	int fd;
	gzFile f;

	/* open() first so that errno says why: gzopen may not set it. */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;

		loom_data_fail(err, errlen, "idx '%s': cannot open: %s", path,
			       strerror(e));
		return e == ENOENT || e == ENOTDIR ? LOOM_ERR_NOT_FOUND
						   : LOOM_ERR_IO;
	}
	*fsize = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
	f = gzdopen(fd, "rb");
	if (!f) {
		close(fd);
		loom_data_fail(err, errlen, "idx '%s': zlib cannot open it",
			       path);
		return LOOM_ERR_NOMEM;
	}
	*out = f;
	return LOOM_OK;
}

/* The magic number 00 00 <type> <ndim>: sets idx's type and ndim. */
static loom_status idx_read_magic(gzFile f, const char *path, loom_idx *idx,
				  char *err, size_t errlen)
{
	unsigned char magic[4];
	const char *tname;
	int64_t n;

	n = idx_read(f, magic, sizeof(magic));
	if (n < 0) {
		loom_data_fail(err, errlen, "idx '%s': read failed: %s", path,
			       idx_zerror(f));
		return LOOM_ERR_IO;
	}
	if (n < 4) {
		loom_data_fail(err, errlen,
			       "idx '%s': file too short for the 4-byte magic number (%lld bytes)",
			       path, (long long)n);
		return LOOM_ERR_FORMAT;
	}
	if (magic[0] != 0 || magic[1] != 0) {
		loom_data_fail(err, errlen,
			       "idx '%s': bad magic number %02x %02x %02x %02x: an IDX file starts with 00 00 <type> <ndim>",
			       path, magic[0], magic[1], magic[2], magic[3]);
		return LOOM_ERR_FORMAT;
	}
	tname = idx_type_name(magic[2]);
	if (!tname) {
		loom_data_fail(err, errlen,
			       "idx '%s': unknown element type 0x%02x in the magic number",
			       path, magic[2]);
		return LOOM_ERR_FORMAT;
	}
	if (magic[2] != LOOM_IDX_UBYTE) {
		loom_data_fail(err, errlen,
			       "idx '%s': element type 0x%02x (%s) is not supported, only 0x08 (unsigned byte)",
			       path, magic[2], tname);
		return LOOM_ERR_UNSUPPORTED;
	}
	if (magic[3] < 1 || magic[3] > LOOM_IDX_MAX_DIMS) {
		loom_data_fail(err, errlen,
			       "idx '%s': %d dims in the magic number, expected 1 to %d",
			       path, magic[3], LOOM_IDX_MAX_DIMS);
		return LOOM_ERR_FORMAT;
	}
	idx->type = magic[2];
	idx->ndim = magic[3];
	return LOOM_OK;
}

/* The ndim big-endian 32-bit sizes after the magic: sets idx's dims and
 * count. */
static loom_status idx_read_dims(gzFile f, const char *path, loom_idx *idx,
				 char *err, size_t errlen)
{
	unsigned char raw[4 * LOOM_IDX_MAX_DIMS];
	size_t count = 1;
	int64_t n;
	int d;

	n = idx_read(f, raw, 4 * (size_t)idx->ndim);
	if (n < 0) {
		loom_data_fail(err, errlen, "idx '%s': read failed: %s", path,
			       idx_zerror(f));
		return LOOM_ERR_IO;
	}
	if (n < 4 * idx->ndim) {
		loom_data_fail(err, errlen,
			       "idx '%s': header truncated: expected %d dims (%d bytes), got %lld bytes",
			       path, idx->ndim, 4 * idx->ndim, (long long)n);
		return LOOM_ERR_FORMAT;
	}
	for (d = 0; d < idx->ndim; d++) {
		const unsigned char *p = raw + 4 * d;
		uint32_t v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
			     (uint32_t)p[2] << 8 | (uint32_t)p[3];

		idx->dims[d] = v;
		/* A size that does not fit memory is a broken header, not a
		 * reason to try a huge allocation. */
		if (v != 0 && count > SIZE_MAX / v) {
			loom_data_fail(err, errlen,
				       "idx '%s': dims overflow the address space",
				       path);
			return LOOM_ERR_FORMAT;
		}
		count *= v;
	}
	idx->count = count;
	return LOOM_OK;
}

/* Checks the four-byte magic and the dims, filling type, ndim, dims, count. */
static loom_status idx_read_header(gzFile f, const char *path, loom_idx *idx,
				   char *err, size_t errlen)
{
	loom_status st = idx_read_magic(f, path, idx, err, errlen);

	if (st)
		return st;
	return idx_read_dims(f, path, idx, err, errlen);
}

static loom_status idx_truncated(gzFile f, const char *path, size_t count,
				 int64_t got, char *err, size_t errlen)
{
	const char *z = idx_zerror(f);

	/* A cut gzip stream also ends short; zlib then says why. */
	loom_data_fail(err, errlen,
		       "idx '%s': truncated: expected %zu bytes of data, got %lld%s%s",
		       path, count, (long long)got, *z ? "; zlib: " : "", z);
	return LOOM_ERR_FORMAT;
}

/*
 * Reads up to idx->count bytes into idx->data, allocating only as the data
 * arrives: a header may claim 2^32 elements in a file of a few bytes. The
 * buffer starts at IDX_FIRST_BUF and doubles, so it never exceeds twice what
 * was read. Returns the bytes read, or -1 with err set.
 */
static int64_t idx_read_growing(gzFile f, const char *path, loom_idx *idx,
				loom_status *st, char *err, size_t errlen)
{
	size_t cap = idx->count < IDX_FIRST_BUF ? idx->count : IDX_FIRST_BUF;
	size_t got = 0;

	for (;;) {
		/* malloc(0) may return NULL; one byte keeps "NULL = failed" true. */
		uint8_t *p = realloc(idx->data, cap ? cap : 1);
		int64_t n;

		if (!p) {
			loom_data_fail(err, errlen,
				       "idx '%s': cannot allocate %zu bytes for the data",
				       path, cap);
			*st = LOOM_ERR_NOMEM;
			return -1;
		}
		idx->data = p;
		n = idx_read(f, idx->data + got, cap - got);
		if (n < 0) {
			loom_data_fail(err, errlen, "idx '%s': read failed: %s",
				       path, idx_zerror(f));
			*st = LOOM_ERR_IO;
			return -1;
		}
		got += (size_t)n;
		if (got < cap || cap == idx->count)
			return (int64_t)got;
		cap = cap > idx->count / 2 ? idx->count : cap * 2;
	}
}

/* Reads exactly idx->count bytes of payload and makes sure nothing follows.
 * header is the bytes the header took; fsize the file's size (-1: unknown). */
static loom_status idx_read_payload(gzFile f, const char *path, loom_idx *idx,
				    int64_t header, int64_t fsize, char *err,
				    size_t errlen)
{
	loom_status st = LOOM_OK;
	unsigned char extra;
	int64_t n;

	/* A raw file holds exactly what is left of it: a claim beyond that is
	 * a truncated file, found without allocating the claim. */
	if (gzdirect(f) && fsize >= header &&
	    idx->count > (uint64_t)(fsize - header))
		return idx_truncated(f, path, idx->count, fsize - header, err,
				     errlen);
	n = idx_read_growing(f, path, idx, &st, err, errlen);
	if (n < 0)
		return st;
	if ((size_t)n < idx->count)
		return idx_truncated(f, path, idx->count, n, err, errlen);
	n = idx_read(f, &extra, 1);
	if (n != 0) {
		if (n < 0) {
			loom_data_fail(err, errlen,
				       "idx '%s': read failed after the data: %s",
				       path, idx_zerror(f));
			return LOOM_ERR_IO;
		}
		n = 1 + idx_count_rest(f);
		loom_data_fail(err, errlen,
			       "idx '%s': %lld trailing bytes after the expected %zu bytes of data",
			       path, (long long)n, idx->count);
		return LOOM_ERR_FORMAT;
	}
	return LOOM_OK;
}

loom_status loom_idx_load(const char *path, loom_idx *idx, char *err,
			  size_t errlen)
{
	gzFile f;
	int64_t fsize;
	loom_status st;

	st = loom_data_start(idx, sizeof(*idx), "loom_idx_load: idx is NULL", err, errlen);
	if (st != LOOM_OK)
		return st;
	if (!path) {
		loom_data_fail(err, errlen, "loom_idx_load: path is NULL");
		return LOOM_ERR_INVALID;
	}
	st = idx_open(path, &f, &fsize, err, errlen);
	if (st != LOOM_OK)
		return st;
	gzbuffer(f, 1 << 17);
	st = idx_read_header(f, path, idx, err, errlen);
	if (st == LOOM_OK)
		st = idx_read_payload(f, path, idx, 4 + 4 * (int64_t)idx->ndim,
				      fsize, err, errlen);
	gzclose(f);
	if (st != LOOM_OK)
		loom_idx_free(idx);
	return st;
}

void loom_idx_free(loom_idx *idx)
{
	if (!idx)
		return;
	free(idx->data);
	memset(idx, 0, sizeof(*idx));
}
