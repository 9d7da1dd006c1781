/*
 * mnist.c — MNIST and Fashion-MNIST splits: a pair of IDX files (images N x H
 * x W, labels N) checked against each other, turned into a loom_dataset.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_internal.h"
#include "loom_data.h"

#define MNIST_CLASSES 10

/* Whether path exists: 1 yes, 0 no, -1 cannot tell (a directory that may
 * not be searched, say), with err saying why. */
static int mnist_exists(const char *dir, const char *path, char *err,
			size_t errlen)
{
	int e;

	if (access(path, F_OK) == 0)
		return 1;
	e = errno;
	if (e == ENOENT)
		return 0;
	loom_data_fail(err, errlen, "mnist '%s': cannot look for '%s': %s", dir,
		       path, strerror(e));
	return -1;
}

/* Picks <dir>/<stem>, else <dir>/<stem>.gz: the raw file first because it
 * needs no decompression when someone has unpacked the archive. */
static loom_status mnist_find(const char *dir, const char *stem, char *path,
			      size_t pathlen, char *err, size_t errlen)
{
	int r;

	if ((size_t)snprintf(path, pathlen, "%s/%s", dir, stem) >= pathlen)
		goto too_long;
	if ((r = mnist_exists(dir, path, err, errlen)) != 0)
		return r > 0 ? LOOM_OK : LOOM_ERR_IO;
	if ((size_t)snprintf(path, pathlen, "%s/%s.gz", dir, stem) >= pathlen)
		goto too_long;
	if ((r = mnist_exists(dir, path, err, errlen)) != 0)
		return r > 0 ? LOOM_OK : LOOM_ERR_IO;
	loom_data_fail(err, errlen,
		       "mnist '%s': neither %s nor %s.gz is in the directory",
		       dir, stem, stem);
	return LOOM_ERR_NOT_FOUND;
too_long:
	loom_data_fail(err, errlen, "mnist '%s': path too long", dir);
	return LOOM_ERR_INVALID;
}

static loom_status mnist_check_dir(const char *dir, char *err, size_t errlen)
{
	struct stat st;

	if (stat(dir, &st) != 0) {
		int e = errno;

		if (e == ENOENT || e == ENOTDIR) {
			loom_data_fail(err, errlen,
				       "mnist: directory '%s' does not exist; install the Debian package dataset-fashion-mnist (it provides %s) or pass the directory that holds the IDX files",
				       dir, LOOM_FASHION_MNIST_DIR);
			return LOOM_ERR_NOT_FOUND;
		}
		loom_data_fail(err, errlen, "mnist: cannot stat '%s': %s", dir,
			       strerror(e));
		return LOOM_ERR_IO;
	}
	if (!S_ISDIR(st.st_mode)) {
		loom_data_fail(err, errlen, "mnist: '%s' is not a directory",
			       dir);
		return LOOM_ERR_INVALID;
	}
	return LOOM_OK;
}

/* Checks the pair and moves it into ds; on failure ds is left untouched. */
static loom_status mnist_assemble(const char *ipath, loom_idx *img,
				  const char *lpath, const loom_idx *lab,
				  loom_dataset *ds, char *err, size_t errlen)
{
	int32_t *labels;
	size_t i;

	if (img->ndim != 3) {
		loom_data_fail(err, errlen,
			       "mnist images '%s': %d dims, expected 3 (N x H x W)",
			       ipath, img->ndim);
		return LOOM_ERR_FORMAT;
	}
	if (lab->ndim != 1) {
		loom_data_fail(err, errlen,
			       "mnist labels '%s': %d dims, expected 1 (N)",
			       lpath, lab->ndim);
		return LOOM_ERR_FORMAT;
	}
	if (img->dims[0] != lab->dims[0]) {
		loom_data_fail(err, errlen,
			       "mnist: images '%s' hold %lld images but labels '%s' hold %lld labels",
			       ipath, (long long)img->dims[0], lpath,
			       (long long)lab->dims[0]);
		return LOOM_ERR_FORMAT;
	}
	if (img->dims[1] > INT32_MAX || img->dims[2] > INT32_MAX) {
		loom_data_fail(err, errlen,
			       "mnist images '%s': image size %lld x %lld too large",
			       ipath, (long long)img->dims[1],
			       (long long)img->dims[2]);
		return LOOM_ERR_FORMAT;
	}
	for (i = 0; i < lab->count; i++) {
		if (lab->data[i] >= MNIST_CLASSES) {
			loom_data_fail(err, errlen,
				       "mnist labels '%s': label %u at index %zu is out of range [0, %d)",
				       lpath, lab->data[i], i, MNIST_CLASSES);
			return LOOM_ERR_FORMAT;
		}
	}
	labels = malloc((lab->count ? lab->count : 1) * sizeof(*labels));
	if (!labels) {
		loom_data_fail(err, errlen, "mnist labels '%s': out of memory",
			       lpath);
		return LOOM_ERR_NOMEM;
	}
	for (i = 0; i < lab->count; i++)
		labels[i] = lab->data[i];

	ds->n = img->dims[0];
	ds->c = 1;
	ds->h = (int)img->dims[1];
	ds->w = (int)img->dims[2];
	ds->classes = MNIST_CLASSES;
	ds->labels = labels;
	/* The image bytes are already in dataset layout: take them over
	 * rather than copy 47 MB. */
	ds->images = img->data;
	img->data = NULL;
	return LOOM_OK;
}

loom_status loom_mnist_load(const char *dir, const char *split,
			    loom_dataset *ds, char *err, size_t errlen)
{
	char stem[64], ipath[4096], lpath[4096];
	loom_idx img = {0}, lab = {0};
	loom_status st;

	st = loom_data_start(ds, sizeof(*ds), "loom_mnist_load: ds is NULL", err, errlen);
	if (st != LOOM_OK)
		return st;
	if (!dir)
		dir = LOOM_FASHION_MNIST_DIR;
	if (!split || (strcmp(split, "train") && strcmp(split, "t10k"))) {
		loom_data_fail(err, errlen,
			       "mnist: split '%s' is unknown, expected \"train\" or \"t10k\"",
			       split ? split : "(null)");
		return LOOM_ERR_INVALID;
	}
	st = mnist_check_dir(dir, err, errlen);
	if (st != LOOM_OK)
		return st;

	snprintf(stem, sizeof(stem), "%s-images-idx3-ubyte", split);
	st = mnist_find(dir, stem, ipath, sizeof(ipath), err, errlen);
	if (st != LOOM_OK)
		return st;
	snprintf(stem, sizeof(stem), "%s-labels-idx1-ubyte", split);
	st = mnist_find(dir, stem, lpath, sizeof(lpath), err, errlen);
	if (st != LOOM_OK)
		return st;

	st = loom_idx_load(ipath, &img, err, errlen);
	if (st != LOOM_OK)
		return st;
	st = loom_idx_load(lpath, &lab, err, errlen);
	if (st != LOOM_OK)
		goto out_free_img;
	st = mnist_assemble(ipath, &img, lpath, &lab, ds, err, errlen);

	loom_idx_free(&lab);
out_free_img:
	loom_idx_free(&img);
	return st;
}

void loom_dataset_free(loom_dataset *ds)
{
	if (!ds)
		return;
	free(ds->images);
	free(ds->labels);
	memset(ds, 0, sizeof(*ds));
}
