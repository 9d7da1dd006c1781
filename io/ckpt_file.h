/*
 * io/ckpt_file.h — the checkpoint container: named tensors plus a graph
 * fingerprint, written atomically and checked end to end with a CRC32.
 * It knows nothing of programs; loom_save/loom_load decide what goes in.
 *
 * Layout (all integers little-endian):
 *   header   "LOOMCKPT" | u32 version | u32 record count | u64 fingerprint
 *   record   u32 name length (with its NUL) | name bytes incl. NUL
 *            | i32 dtype | u32 ndim | i64 dims[ndim] | u64 byte length
 *            | zero padding up to a 64-byte file offset | payload
 *   trailer  u32 CRC32 (zlib) of every byte before it
 * Payloads start 64-byte aligned so that a reader can use them in place.
 */
#ifndef LOOM_IO_CKPT_FILE_H
#define LOOM_IO_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_CKPT_MAGIC "LOOMCKPT"
#define LOOM_CKPT_VERSION 1u
#define LOOM_CKPT_ALIGN 64

/* One tensor. dtype is a loom_dtype code, stored as is and not interpreted
 * here; bytes need not equal numel * dtype size (the loader checks that). */
typedef struct loom_ckpt_record {
	const char *name; /* unique, non-empty */
	int dtype;
	int ndim;         /* 0 .. LOOM_MAX_DIMS */
	int64_t dims[LOOM_MAX_DIMS];
	const void *data; /* may be NULL only when bytes == 0 */
	size_t bytes;
} loom_ckpt_record;

/* A checkpoint read into memory; records point into its one buffer. */
typedef struct loom_ckpt_file loom_ckpt_file;

/*
 * Writes n records to path.tmp, flushes and fsyncs it, renames it over path
 * and fsyncs the directory. On failure the .tmp file is removed and a file
 * already at path is left as it was. err (may be NULL) receives a message
 * that names the path. LOOM_ERR_INVALID for bad records (empty or duplicate
 * name, ndim out of range, negative dim, NULL data), LOOM_ERR_IO otherwise.
 */
loom_status loom_ckpt_write(const char *path, uint64_t fingerprint,
			    const loom_ckpt_record *recs, int n, char *err,
			    size_t errlen);

/*
 * Reads and checks a whole checkpoint. *out is NULL on failure. Checks, in
 * order, each message naming the path:
 *   LOOM_ERR_NOT_FOUND (no such file), LOOM_ERR_IO, LOOM_ERR_NOMEM;
 *   LOOM_ERR_FORMAT: no magic (not a loom checkpoint), or too short to hold
 *     a header and the trailer;
 *   LOOM_ERR_CORRUPT: the CRC does not match. It is checked before any other
 *     field is read, so any damage to the bytes it covers, a cut or an
 *     appended tail included, is reported as corruption;
 *   LOOM_ERR_MISMATCH: another format version, in an intact file;
 *   LOOM_ERR_FORMAT: an intact file whose records do not add up (a foreign
 *     or faulty writer). Every length is checked against the file size.
 */
loom_status loom_ckpt_read(const char *path, loom_ckpt_file **out, char *err,
			   size_t errlen);

/* The record called name, NULL if there is none. */
const loom_ckpt_record *loom_ckpt_find(const loom_ckpt_file *f, const char *name);
int loom_ckpt_count(const loom_ckpt_file *f);
/* Records in file order; NULL when i is out of range. */
const loom_ckpt_record *loom_ckpt_at(const loom_ckpt_file *f, int i);
uint64_t loom_ckpt_fingerprint(const loom_ckpt_file *f);
/* Frees f and everything its records point to. NULL is fine. */
void loom_ckpt_free(loom_ckpt_file *f);

/* ---------------------------------------------------------------- meta */

/* The record in which loom_save keeps a program's run-time scalars: F64,
 * one dim of LOOM_CKPT_META_COUNT, in this order. */
#define LOOM_CKPT_META "loom.meta"
enum {
	LOOM_CKPT_META_STEP,    /* optimizer steps taken */
	LOOM_CKPT_META_LR,      /* the learning rate in force */
	LOOM_CKPT_META_SCALE,   /* the loss scale */
	LOOM_CKPT_META_TRACKER, /* clean steps since the scale last changed */
	LOOM_CKPT_META_SKIPPED, /* steps skipped for inf/NaN gradients */
	LOOM_CKPT_META_BELOW,   /* steps taken with the scale below 1 */
	LOOM_CKPT_META_COUNT
};

/*
 * Checks the scalars' ranges: counters are integers in [0, 2^53] (the
 * tracker in [0, INT32_MAX]), step + skipped at most 2^53, the learning rate
 * finite and >= 0, the loss scale in (0, FLT_MAX] and not 0 once a float.
 * A CRC only proves the bytes are some writer's; this proves they can be
 * used (a NaN step would make the conversion to an integer undefined).
 * LOOM_ERR_FORMAT with err naming the field ("field 'step' is -5, ...").
 */
loom_status loom_ckpt_check_meta(const double *meta, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_IO_CKPT_FILE_H */
