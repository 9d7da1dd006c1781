/*
 * io/safetensors.c — reads and writes the safetensors container
 * (safetensors.h). The header is JSON and goes through jansson; every
 * number in it is checked against the file's size before anything is
 * indexed with it, and the tensors must tile the data exactly, as the
 * reference reader demands, so a file loom accepts is one PyTorch accepts.
 */
#include "io/safetensors.h"

#include "base/errf.h"
#include "base/free_each.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct loom_st_file {
	unsigned char *owned; /* the buffer loom_st_read made, else NULL */
	loom_st_tensor *t;
	char **names;         /* t[i].name, owned */
	int n;
	json_t *meta;         /* __metadata__ (a reference), or NULL */
};

static const struct {
	const char *name;
	size_t size;
} dtypes[LOOM_ST_DTYPE_COUNT] = {
	[LOOM_ST_F64] = { "F64", 8 },	  [LOOM_ST_F32] = { "F32", 4 },
	[LOOM_ST_F16] = { "F16", 2 },	  [LOOM_ST_BF16] = { "BF16", 2 },
	[LOOM_ST_I64] = { "I64", 8 },	  [LOOM_ST_I32] = { "I32", 4 },
	[LOOM_ST_I16] = { "I16", 2 },	  [LOOM_ST_I8] = { "I8", 1 },
	[LOOM_ST_U64] = { "U64", 8 },	  [LOOM_ST_U32] = { "U32", 4 },
	[LOOM_ST_U16] = { "U16", 2 },	  [LOOM_ST_U8] = { "U8", 1 },
	[LOOM_ST_BOOL] = { "BOOL", 1 },	  [LOOM_ST_F8_E4M3] = { "F8_E4M3", 1 },
	[LOOM_ST_F8_E5M2] = { "F8_E5M2", 1 },
};

const char *loom_st_dtype_name(loom_st_dtype dt)
{
	return (unsigned)dt < LOOM_ST_DTYPE_COUNT ? dtypes[dt].name : "?";
}

size_t loom_st_dtype_size(loom_st_dtype dt)
{
	return (unsigned)dt < LOOM_ST_DTYPE_COUNT ? dtypes[dt].size : 0;
}

static int dtype_from_name(const char *s, loom_st_dtype *out)
{
	for (int i = 0; i < LOOM_ST_DTYPE_COUNT; i++)
		if (strcmp(s, dtypes[i].name) == 0) {
			*out = (loom_st_dtype)i;
			return 0;
		}
	return -1;
}

/* numel * size of a shape, or -1 when it does not fit in 62 bits. */
static int64_t shape_bytes(const int64_t *dims, int ndim, size_t size)
{
	const int64_t limit = INT64_C(1) << 62;
	int64_t b = (int64_t)size;
	for (int d = 0; d < ndim; d++) {
		if (dims[d] < 0)
			return -1;
		if (dims[d] && b > limit / dims[d])
			return -1;
		b *= dims[d];
	}
	return b;
}

void loom_st_free(loom_st_file *f)
{
	if (!f)
		return;
	LOOM_FREE_EACH(f->names, f->n);
	free(f->t);
	json_decref(f->meta);
	free(f->owned);
	free(f);
}

/* One header entry into *t, its offsets into off[2]; data_size bounds them. */
static loom_status parse_entry(const char *what, const char *name, json_t *e,
			       uint64_t data_size, loom_st_tensor *t, uint64_t off[2], char *err,
			       size_t errlen)
{
	json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape"),
	       *offs = json_object_get(e, "data_offsets");
	if (!json_is_object(e))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: tensor '%s': entry is not an object",
			    what, name);
	if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: tensor '%s': needs \"dtype\" (a string), \"shape\" and "
			    "\"data_offsets\" (arrays)", what, name);
	if (dtype_from_name(json_string_value(dt), &t->dtype))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'",
			    what, name, json_string_value(dt));
	size_t nd = json_array_size(shape);
	if (nd > LOOM_ST_MAX_DIMS)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: tensor '%s': %zu dims, at most %d are supported", what, name, nd,
			    LOOM_ST_MAX_DIMS);
	t->ndim = (int)nd;
	for (size_t d = 0; d < nd; d++) {
		json_t *x = json_array_get(shape, d);
		if (!json_is_integer(x) || json_integer_value(x) < 0)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				    "%s: tensor '%s': shape[%zu] is not a non-negative integer",
				    what, name, d);
		t->dims[d] = json_integer_value(x);
	}
	if (json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
	    !json_is_integer(json_array_get(offs, 1)))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: tensor '%s': data_offsets is not two integers", what, name);
	json_int_t b = json_integer_value(json_array_get(offs, 0)),
		   en = json_integer_value(json_array_get(offs, 1));
	if (b < 0 || en < b)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: tensor '%s': data_offsets [%lld, %lld] are not 0 <= begin <= end",
			    what, name, (long long)b, (long long)en);
	if ((uint64_t)en > data_size)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: tensor '%s': data_offsets [%lld, %lld] run past the data "
			    "(%llu bytes after the header)", what, name, (long long)b,
			    (long long)en, (unsigned long long)data_size);
	int64_t need = shape_bytes(t->dims, t->ndim, loom_st_dtype_size(t->dtype));
	if (need < 0 || (uint64_t)need != (uint64_t)(en - b))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes, its "
			    "shape of %s needs %lld", what, name, (long long)b, (long long)en,
			    (long long)(en - b), loom_st_dtype_name(t->dtype), (long long)need);
	off[0] = (uint64_t)b;
	off[1] = (uint64_t)en;
	t->bytes = (size_t)(en - b);
	return LOOM_OK;
}

static loom_status parse_metadata(const char *what, json_t *m, char *err, size_t errlen)
{
	const char *k;
	json_t *v;
	if (!json_is_object(m))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: __metadata__ is not an object", what);
	json_object_foreach(m, k, v) {
		if (!json_is_string(v))
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				    "%s: __metadata__ '%s' is not a string", what, k);
	}
	return LOOM_OK;
}

/* Tensors sorted by their first byte, for the tiling check. */
typedef struct span {
	uint64_t begin, end;
	int i;
} span;

static int span_cmp(const void *a, const void *b)
{
	const span *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return x->i - y->i;
}

/* The tensors must cover [0, data_size) exactly: no overlap, no gap. */
static loom_status check_tiling(const char *what, const loom_st_file *f, span *s,
				uint64_t data_size, char *err, size_t errlen)
{
	uint64_t at = 0;
	qsort(s, f->n, sizeof(*s), span_cmp);
	for (int k = 0; k < f->n; k++) {
		if (s[k].begin < at)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				    "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
				    what, f->t[s[k - 1].i].name, (unsigned long long)s[k - 1].begin,
				    (unsigned long long)s[k - 1].end, f->t[s[k].i].name,
				    (unsigned long long)s[k].begin, (unsigned long long)s[k].end);
		if (s[k].begin > at)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				    "%s: %llu bytes before tensor '%s' belong to no tensor", what,
				    (unsigned long long)(s[k].begin - at), f->t[s[k].i].name);
		at = s[k].end;
	}
	if (at != data_size)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: %llu bytes after the last tensor belong to no tensor", what,
			    (unsigned long long)(data_size - at));
	return LOOM_OK;
}

static loom_status parse_header(const char *what, json_t *root, const unsigned char *data,
				uint64_t data_size, loom_st_file *f, char *err, size_t errlen)
{
	size_t cap = json_object_size(root);
	const char *k;
	json_t *v;
	span *s = calloc(cap ? cap : 1, sizeof(*s));
	f->t = calloc(cap ? cap : 1, sizeof(*f->t));
	f->names = calloc(cap ? cap : 1, sizeof(*f->names));
	loom_status st = LOOM_OK;
	if (!s || !f->t || !f->names) {
		free(s);
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "%s: out of memory", what);
	}
	json_object_foreach(root, k, v) {
		if (strcmp(k, "__metadata__") == 0) {
			if ((st = parse_metadata(what, v, err, errlen)) != LOOM_OK)
				goto out;
			f->meta = json_incref(v);
			continue;
		}
		loom_st_tensor *t = &f->t[f->n];
		uint64_t off[2] = { 0, 0 };
		if ((st = parse_entry(what, k, v, data_size, t, off, err, errlen)) != LOOM_OK)
			goto out;
		if (!(f->names[f->n] = strdup(k))) {
			st = loom_errnf(err, errlen, LOOM_ERR_NOMEM, "%s: out of memory", what);
			goto out;
		}
		t->name = f->names[f->n];
		t->data = data + off[0];
		s[f->n] = (span){ off[0], off[1], f->n };
		f->n++;
	}
	st = check_tiling(what, f, s, data_size, err, errlen);
out:
	free(s);
	return st;
}

static uint64_t get_u64le(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

loom_status loom_st_parse(const void *buf, size_t size, const char *what, loom_st_file **out,
			  char *err, size_t errlen)
{
	const unsigned char *b = buf;
	json_error_t je;
	loom_status st;

	if (!out)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "safetensors: no output given");
	*out = NULL;
	what = what ? what : "buffer";
	if (!buf && size)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s: no buffer given", what);
	if (size < 8)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: truncated: %zu bytes, too short for the 8-byte header length",
			    what, size);
	uint64_t hlen = get_u64le(b);
	if (hlen > size - 8)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: header length %llu runs past the end of the file (%zu bytes "
			    "after the length): truncated or not a safetensors file", what,
			    (unsigned long long)hlen, size - 8);
	if (hlen > LOOM_ST_MAX_HEADER)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: header length %llu is over the %u-byte limit", what,
			    (unsigned long long)hlen, LOOM_ST_MAX_HEADER);
	if (hlen < 2 || b[8] != '{')
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: the header is not a JSON object (it must start with '{')", what);
	json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
			    "%s: the header is not valid JSON (line %d, column %d: %s)", what,
			    je.line, je.column, je.text);
	loom_st_file *f = calloc(1, sizeof(*f));
	if (!f) {
		json_decref(root);
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "%s: out of memory", what);
	}
	if (!json_is_object(root))
		st = loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: the header is not a JSON object", what);
	else
		st = parse_header(what, root, b + 8 + hlen, size - 8 - hlen, f, err, errlen);
	json_decref(root);
	if (st != LOOM_OK) {
		loom_st_free(f);
		return st;
	}
	*out = f;
	return LOOM_OK;
}

loom_status loom_st_read(const char *path, loom_st_file **out, char *err, size_t errlen)
{
	struct stat sb;
	if (!out)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "safetensors: no output given");
	*out = NULL;
	if (!path || !path[0])
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "safetensors: no path given");
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return loom_errnf(err, errlen, errno == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO,
			    "%s: %s", path, strerror(errno));
	if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
		fclose(fp);
		return loom_errnf(err, errlen, LOOM_ERR_IO, "%s: not a regular file", path);
	}
	size_t size = (size_t)sb.st_size;
	unsigned char *buf = malloc(size ? size : 1);
	if (!buf) {
		fclose(fp);
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "%s: out of memory for %zu bytes", path,
			    size);
	}
	size_t got = fread(buf, 1, size, fp);
	int bad = ferror(fp);
	fclose(fp);
	if (bad || got != size) {
		free(buf);
		return loom_errnf(err, errlen, LOOM_ERR_IO, "%s: read %zu of %zu bytes", path, got, size);
	}
	loom_status st = loom_st_parse(buf, size, path, out, err, errlen);
	if (st != LOOM_OK) {
		free(buf);
		return st;
	}
	(*out)->owned = buf;
	return LOOM_OK;
}

int loom_st_count(const loom_st_file *f)
{
	return f ? f->n : 0;
}

const loom_st_tensor *loom_st_at(const loom_st_file *f, int i)
{
	return f && i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const loom_st_tensor *loom_st_find(const loom_st_file *f, const char *name)
{
	for (int i = 0; f && name && i < f->n; i++)
		if (strcmp(f->t[i].name, name) == 0)
			return &f->t[i];
	return NULL;
}

const char *loom_st_metadata(const loom_st_file *f, const char *key)
{
	if (!f || !f->meta || !key)
		return NULL;
	return json_string_value(json_object_get(f->meta, key));
}

/* ---------------------------------------------------------------- writing */

static loom_status check_tensors(const char *path, const loom_st_tensor *t, int n, char *err,
				 size_t errlen)
{
	for (int i = 0; i < n; i++) {
		const char *name = t[i].name;
		if (!name || !name[0] || strcmp(name, "__metadata__") == 0)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s: tensor %d has no usable name",
				    path, i);
		for (int j = 0; j < i; j++)
			if (strcmp(t[j].name, name) == 0)
				return loom_errnf(err, errlen, LOOM_ERR_INVALID,
					    "%s: two tensors are called '%s'", path, name);
		if ((unsigned)t[i].dtype >= LOOM_ST_DTYPE_COUNT || t[i].ndim < 0 ||
		    t[i].ndim > LOOM_ST_MAX_DIMS)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				    "%s: tensor '%s': bad dtype or ndim", path, name);
		int64_t need = shape_bytes(t[i].dims, t[i].ndim, loom_st_dtype_size(t[i].dtype));
		if (need < 0 || (uint64_t)need != t[i].bytes || (!t[i].data && t[i].bytes))
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				    "%s: tensor '%s': %zu bytes of data for a shape that needs "
				    "%lld", path, name, t[i].bytes, (long long)need);
	}
	return LOOM_OK;
}

/* The header's JSON, padded with spaces to a multiple of 8 bytes (so that
 * the data starts 8-aligned, as the reference writer does). */
static char *header_json(const loom_st_tensor *t, int n, const char *const *meta, int n_meta,
			 size_t *len)
{
	json_t *root = json_object(), *m = n_meta > 0 ? json_object() : NULL;
	int bad = !root || (n_meta > 0 && !m);
	for (int i = 0; i < n_meta && !bad; i++)
		bad |= json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1])) != 0;
	if (m && !bad)
		bad |= json_object_set(root, "__metadata__", m) != 0;
	uint64_t at = 0;
	for (int i = 0; i < n && !bad; i++) {
		json_t *shape = json_array();
		for (int d = 0; shape && d < t[i].ndim; d++)
			bad |= json_array_append_new(shape, json_integer(t[i].dims[d])) != 0;
		json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype",
				      loom_st_dtype_name(t[i].dtype), "shape", shape,
				      "data_offsets", (json_int_t)at, (json_int_t)(at + t[i].bytes));
		bad |= !e || json_object_set_new(root, t[i].name, e) != 0;
		at += t[i].bytes;
	}
	char *s = bad ? NULL : json_dumps(root, JSON_COMPACT);
	json_decref(m);
	json_decref(root);
	if (!s)
		return NULL;
	size_t l = strlen(s), padded = (l + 7) / 8 * 8;
	char *p = realloc(s, padded + 1);
	if (!p) {
		free(s);
		return NULL;
	}
	memset(p + l, ' ', padded - l);
	p[padded] = 0;
	*len = padded;
	return p;
}

loom_status loom_st_write(const char *path, const loom_st_tensor *t, int n,
			  const char *const *meta, int n_meta, char *err, size_t errlen)
{
	if (!path || !path[0] || n < 0 || (n && !t) || n_meta < 0 || (n_meta && !meta))
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "safetensors: bad arguments to write");
	loom_status st = check_tensors(path, t, n, err, errlen);
	if (st != LOOM_OK)
		return st;
	for (int i = 0; i < 2 * n_meta; i++)
		if (!meta[i])
			return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s: a NULL metadata string",
				    path);
	size_t hlen = 0;
	char *h = header_json(t, n, meta, n_meta, &hlen);
	if (!h)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "%s: out of memory for the header", path);
	char tmp[4200];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		free(h);
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s: path too long", path);
	}
	FILE *fp = fopen(tmp, "wb");
	if (!fp) {
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "%s: cannot create %s: %s", path, tmp,
			  strerror(errno));
		free(h);
		return st;
	}
	unsigned char len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
	int bad = fwrite(len8, 1, 8, fp) != 8 || fwrite(h, 1, hlen, fp) != hlen;
	for (int i = 0; i < n && !bad; i++)
		bad = t[i].bytes && fwrite(t[i].data, 1, t[i].bytes, fp) != t[i].bytes;
	bad = bad || fflush(fp) != 0 || fsync(fileno(fp)) != 0;
	int saved = errno;
	bad = (fclose(fp) != 0) || bad;
	free(h);
	if (bad || rename(tmp, path) != 0) {
		st = loom_errnf(err, errlen, LOOM_ERR_IO, "%s: writing failed: %s", path,
			  strerror(bad ? saved : errno));
		unlink(tmp);
		return st;
	}
	return LOOM_OK;
}
