/*
 * io/safetensors.h — the safetensors container (Hugging Face's format,
 * what safetensors.torch.save_file writes and load_file reads): an 8-byte
 * little-endian header length N, N bytes of JSON
 *   { "name": { "dtype": "F32", "shape": [16, 1, 5, 5],
 *               "data_offsets": [begin, end] }, ...,
 *     "__metadata__": { "key": "value", ... } }
 * (padded with spaces), then the tensors' bytes, offsets relative to the
 * first byte after the header. The JSON goes through jansson. This file
 * knows nothing of programs: io/weights.c maps tensors to parameters.
 */
#ifndef LOOM_IO_SAFETENSORS_H
#define LOOM_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The format's dtypes, by their names in the header. */
typedef enum loom_st_dtype {
	LOOM_ST_F64 = 0,
	LOOM_ST_F32,
	LOOM_ST_F16,
	LOOM_ST_BF16,
	LOOM_ST_I64,
	LOOM_ST_I32,
	LOOM_ST_I16,
	LOOM_ST_I8,
	LOOM_ST_U64,
	LOOM_ST_U32,
	LOOM_ST_U16,
	LOOM_ST_U8,
	LOOM_ST_BOOL,
	LOOM_ST_F8_E4M3,
	LOOM_ST_F8_E5M2,
	LOOM_ST_DTYPE_COUNT
} loom_st_dtype;

const char *loom_st_dtype_name(loom_st_dtype dt); /* "F32", ...; "?" if unknown */
size_t loom_st_dtype_size(loom_st_dtype dt);      /* bytes per element, 0 if unknown */

#define LOOM_ST_MAX_DIMS 8
/* The largest header accepted, as the reference (Rust) reader's limit. */
#define LOOM_ST_MAX_HEADER (100u << 20)

/* One tensor: read from a file (data points into the file's buffer, not
 * aligned), or given to the writer (data is the caller's). */
typedef struct loom_st_tensor {
	const char *name;
	loom_st_dtype dtype;
	int ndim; /* 0 (a scalar) .. LOOM_ST_MAX_DIMS */
	int64_t dims[LOOM_ST_MAX_DIMS];
	const void *data; /* may be NULL only when bytes == 0 */
	size_t bytes;     /* numel * dtype size, always */
} loom_st_tensor;

/* A parsed file; its tensors point into its buffer. */
typedef struct loom_st_file loom_st_file;

/*
 * Parses size bytes at buf (borrowed: it must outlive *out). *out is NULL on
 * failure, and err (may be NULL) names the fault, with `what` (a path, or
 * "buffer") in front. Every size and offset is checked against size before
 * use; refused with LOOM_ERR_FORMAT, in this order:
 *   fewer than 8 bytes (truncated: no header length);
 *   a header length beyond the file, or over LOOM_ST_MAX_HEADER;
 *   a header that is not JSON or not one object (jansson's message, with
 *   line and column), or repeats a name;
 *   an entry that is not an object, or lacks dtype, shape or data_offsets,
 *   or has an unknown dtype, more than LOOM_ST_MAX_DIMS dims, a negative
 *   dim, offsets that are not two integers with begin <= end, offsets
 *   beyond the data, or a byte count other than its shape's;
 *   __metadata__ that is not an object of strings;
 *   tensors that overlap, or leave a gap, or leave bytes after the last
 *   (the reference reader refuses these too).
 * LOOM_ERR_NOMEM when memory runs out.
 */
loom_status loom_st_parse(const void *buf, size_t size, const char *what, loom_st_file **out,
			  char *err, size_t errlen);

/* Reads the whole file at path and parses it (LOOM_ERR_NOT_FOUND, _IO, or
 * loom_st_parse's statuses; messages name the path). */
loom_status loom_st_read(const char *path, loom_st_file **out, char *err, size_t errlen);

int loom_st_count(const loom_st_file *f);
/* Tensors in header order; NULL when i is out of range. */
const loom_st_tensor *loom_st_at(const loom_st_file *f, int i);
/* The tensor called name, NULL if there is none. */
const loom_st_tensor *loom_st_find(const loom_st_file *f, const char *name);
/* The value of __metadata__[key], NULL if there is none. */
const char *loom_st_metadata(const loom_st_file *f, const char *key);
/* Frees f (and the buffer loom_st_read made). NULL is fine. */
void loom_st_free(loom_st_file *f);

/*
 * Writes n tensors, in the given order, and the metadata pairs
 * meta[0], meta[1], ... (2 * n_meta strings; may be NULL) to path.tmp,
 * fsyncs it and renames it over path. LOOM_ERR_INVALID for a bad tensor
 * (empty or duplicate name, unknown dtype, ndim out of range, negative dim,
 * bytes other than the shape's, NULL data), LOOM_ERR_IO when writing fails
 * (the .tmp file is removed, a file at path is left as it was).
 */
loom_status loom_st_write(const char *path, const loom_st_tensor *t, int n,
			  const char *const *meta, int n_meta, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_IO_SAFETENSORS_H */
