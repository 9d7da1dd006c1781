/*
 * cifar.c — CIFAR-10 in its binary distribution (data_batch_1..5.bin,
 * test_batch.bin: records of 1 label byte + 3072 pixel bytes, channel-major
 * 32x32 RGB) read into a loom_dataset, and a synthetic data set of any shape
 * for machines that have no copy of the real one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/splitmix.h"
#include "data_internal.h"
#include "loom_data.h"

#define CIFAR_PIXELS (3 * 32 * 32)
#define CIFAR_RECORD (1 + CIFAR_PIXELS)
#define CIFAR_CLASSES 10
#define CIFAR_TRAIN_FILES 5

static const char cifar_where[] =
	"the CIFAR-10 binary version (cifar-10-binary.tar.gz, published at "
	"https://www.cs.toronto.edu/~kriz/cifar.html), unpacked";

/* Size of one batch file in whole records; an error names the file. */
static loom_status cifar_records(const char *path, int64_t *records, char *err, size_t errlen)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		int e = errno;
		if (e == ENOENT) {
			loom_data_fail(err, errlen, "cifar10: missing batch file %s (expected %s)",
				       path, cifar_where);
			return LOOM_ERR_NOT_FOUND;
		}
		loom_data_fail(err, errlen, "cifar10: cannot read %s: %s", path, strerror(e));
		return LOOM_ERR_IO;
	}
	if (!S_ISREG(st.st_mode)) {
		loom_data_fail(err, errlen, "cifar10: %s is not a regular file", path);
		return LOOM_ERR_FORMAT;
	}
	if (st.st_size <= 0 || st.st_size % CIFAR_RECORD != 0) {
		loom_data_fail(err, errlen,
			       "cifar10: %s has %lld bytes, not a whole number of %d-byte records "
			       "(1 label byte + 3072 pixel bytes)",
			       path, (long long)st.st_size, CIFAR_RECORD);
		return LOOM_ERR_FORMAT;
	}
	*records = st.st_size / CIFAR_RECORD;
	return LOOM_OK;
}

/* Reads `records` records of path into ds at image `at`. */
static loom_status cifar_read(const char *path, int64_t records, loom_dataset *ds, int64_t at,
			      char *err, size_t errlen)
{
	unsigned char rec[CIFAR_RECORD];
	loom_status st = LOOM_OK;
	FILE *f = fopen(path, "rb");
	if (!f) {
		loom_data_fail(err, errlen, "cifar10: cannot open %s: %s", path, strerror(errno));
		return errno == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO;
	}
	for (int64_t r = 0; r < records; r++) {
		if (fread(rec, 1, sizeof(rec), f) != sizeof(rec)) {
			loom_data_fail(err, errlen, "cifar10: %s: short read at record %lld (the file changed?)",
				       path, (long long)r);
			st = LOOM_ERR_IO;
			break;
		}
		if (rec[0] >= CIFAR_CLASSES) {
			loom_data_fail(err, errlen,
				       "cifar10: %s: record %lld has label %d, expected 0..%d",
				       path, (long long)r, rec[0], CIFAR_CLASSES - 1);
			st = LOOM_ERR_FORMAT;
			break;
		}
		ds->labels[at + r] = rec[0];
		memcpy(ds->images + (at + r) * CIFAR_PIXELS, rec + 1, CIFAR_PIXELS);
	}
	fclose(f);
	return st;
}

/* ds's images (n of per bytes) and labels; out of memory frees both and
 * fails naming what. */
static loom_status dataset_alloc(loom_dataset *ds, int64_t n, size_t per, const char *what,
				 char *err, size_t errlen)
{
	ds->images = malloc((size_t)n * per);
	ds->labels = malloc((size_t)n * sizeof(int32_t));
	if (!ds->images || !ds->labels) {
		loom_dataset_free(ds);
		loom_data_fail(err, errlen, "%s: out of memory for %lld images", what, (long long)n);
		return LOOM_ERR_NOMEM;
	}
	return LOOM_OK;
}

loom_status loom_cifar10_load(const char *dir, const char *split, loom_dataset *ds, char *err,
			      size_t errlen)
{
	char paths[CIFAR_TRAIN_FILES][4096];
	int64_t records[CIFAR_TRAIN_FILES], total = 0;
	int nfiles;
	struct stat sb;
	loom_status st;

	st = loom_data_start(ds, sizeof(*ds), "cifar10: no dataset to fill", err, errlen);
	if (st != LOOM_OK)
		return st;
	if (!dir || !split) {
		loom_data_fail(err, errlen, "cifar10: a directory and a split are required");
		return LOOM_ERR_INVALID;
	}
	if (strcmp(split, "train") != 0 && strcmp(split, "test") != 0) {
		loom_data_fail(err, errlen, "cifar10: unknown split '%s' (train or test)", split);
		return LOOM_ERR_INVALID;
	}
	if (stat(dir, &sb) != 0) {
		int e = errno;
		loom_data_fail(err, errlen,
			       "cifar10: directory '%s' %s; it must hold data_batch_1.bin .. "
			       "data_batch_5.bin and test_batch.bin from %s (or train on --synthetic data)",
			       dir, e == ENOENT ? "does not exist" : strerror(e), cifar_where);
		return e == ENOENT ? LOOM_ERR_NOT_FOUND : LOOM_ERR_IO;
	}
	if (!S_ISDIR(sb.st_mode)) {
		loom_data_fail(err, errlen, "cifar10: '%s' is not a directory", dir);
		return LOOM_ERR_INVALID;
	}
	nfiles = strcmp(split, "train") == 0 ? CIFAR_TRAIN_FILES : 1;
	for (int i = 0; i < nfiles; i++) {
		int len = nfiles == 1 ? snprintf(paths[i], sizeof(paths[i]), "%s/test_batch.bin", dir) :
					snprintf(paths[i], sizeof(paths[i]), "%s/data_batch_%d.bin", dir, i + 1);
		if (len < 0 || (size_t)len >= sizeof(paths[i])) {
			loom_data_fail(err, errlen, "cifar10: directory path too long: '%s'", dir);
			return LOOM_ERR_INVALID;
		}
		if ((st = cifar_records(paths[i], &records[i], err, errlen)) != LOOM_OK)
			return st;
		total += records[i];
	}
	if ((st = dataset_alloc(ds, total, CIFAR_PIXELS, "cifar10", err, errlen)) != LOOM_OK)
		return st;
	for (int i = 0, at = 0; i < nfiles; at += (int)records[i], i++) {
		if ((st = cifar_read(paths[i], records[i], ds, at, err, errlen)) != LOOM_OK) {
			loom_dataset_free(ds);
			return st;
		}
	}
	ds->n = total;
	ds->c = 3;
	ds->h = ds->w = 32;
	ds->classes = CIFAR_CLASSES;
	return LOOM_OK;
}

loom_status loom_synthetic_load(int64_t n, int c, int h, int w, int classes, uint64_t seed,
				loom_dataset *ds, char *err, size_t errlen)
{
	loom_status st = loom_data_start(ds, sizeof(*ds), "synthetic: no dataset to fill", err, errlen);
	if (st != LOOM_OK)
		return st;
	if (n < 1 || c < 1 || h < 1 || w < 1 || classes < 1 || classes > 1 << 20 ||
	    (int64_t)c * h * w > (int64_t)1 << 30 || n > ((int64_t)1 << 40) / ((int64_t)c * h * w)) {
		loom_data_fail(err, errlen,
			       "synthetic: %lld images of %dx%dx%d in %d classes is not a usable size",
			       (long long)n, c, h, w, classes);
		return LOOM_ERR_INVALID;
	}
	size_t per = (size_t)c * h * w;
	if ((st = dataset_alloc(ds, n, per, "synthetic", err, errlen)) != LOOM_OK)
		return st;
	/* splitmix64: the same bytes for the same seed on every machine. */
	uint64_t s = seed;
	for (int64_t i = 0; i < n; i++) {
		uint64_t z = loom_splitmix64(&s);
		ds->labels[i] = (int32_t)(z % (uint64_t)classes);
		for (size_t k = 0; k < per; k++) {
			z ^= z << 13, z ^= z >> 7, z ^= z << 17;
			ds->images[i * per + k] = (uint8_t)(z >> 24);
		}
	}
	ds->n = n;
	ds->c = c;
	ds->h = h;
	ds->w = w;
	ds->classes = classes;
	return LOOM_OK;
}
