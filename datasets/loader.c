/*
 * loader.c — batches over a dataset in sampler order, converted from bytes to
 * normalised NCHW floats. The conversion goes through a 256-entry table, so
 * every pixel costs one load, and one OpenMP loop spreads a batch's images
 * over the cores.
 */
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "loom_data.h"

/* Below this many pixels a batch converts faster on one thread than the
 * OpenMP team takes to wake. */
#define LOADER_PARALLEL_PIXELS 65536

struct loom_loader {
	const loom_dataset *ds;
	const loom_sampler *s;
	int batch_size;
	int drop_last;
	size_t image_elems;
	/* byte -> (byte / 255 - mean) / std, one table per channel (all the
	 * same unless loom_loader_set_normalize gave per-channel values). */
	float (*lut)[256];
	/* Random crop with zero padding and horizontal flip (CIFAR training):
	 * pad 0 and flip 0 leave images as stored. */
	int pad, flip;
	uint64_t aug_seed;
	loom_error err; /* the last failure (base/errf.h) */
};

static loom_status loader_check(const loom_dataset *ds, const loom_sampler *s,
				int batch_size, float std, char *err,
				size_t errlen)
{
	if (!ds || !s) {
		loom_data_fail(err, errlen, "loader: %s is NULL",
			       !ds ? "dataset" : "sampler");
		return LOOM_ERR_INVALID;
	}
	if (ds->n < 0 || ds->c < 1 || ds->h < 1 || ds->w < 1 ||
	    (ds->n > 0 && (!ds->images || !ds->labels))) {
		loom_data_fail(err, errlen,
			       "loader: dataset is malformed (n %lld, c %d, h %d, w %d)",
			       (long long)ds->n, ds->c, ds->h, ds->w);
		return LOOM_ERR_INVALID;
	}
	if (loom_sampler_size(s) != ds->n) {
		loom_data_fail(err, errlen,
			       "loader: sampler was built for %lld items but the dataset has %lld",
			       (long long)loom_sampler_size(s), (long long)ds->n);
		return LOOM_ERR_MISMATCH;
	}
	if (batch_size < 1) {
		loom_data_fail(err, errlen,
			       "loader: batch size %d, expected >= 1",
			       batch_size);
		return LOOM_ERR_INVALID;
	}
	if (!(std > 0.0f)) {
		loom_data_fail(err, errlen,
			       "loader: std %g, expected > 0", (double)std);
		return LOOM_ERR_INVALID;
	}
	return LOOM_OK;
}

loom_status loom_loader_new(const loom_dataset *ds, const loom_sampler *s,
			    int batch_size, int drop_last, float mean,
			    float std, loom_loader **out, char *err,
			    size_t errlen)
{
	loom_loader *l;
	loom_status st;
	int v;

	st = loom_data_start(out, sizeof(*out), "loom_loader_new: out is NULL", err, errlen);
	if (st != LOOM_OK)
		return st;
	st = loader_check(ds, s, batch_size, std, err, errlen);
	if (st != LOOM_OK)
		return st;
	l = calloc(1, sizeof(*l));
	if (!l) {
		loom_data_fail(err, errlen, "loader: out of memory");
		return LOOM_ERR_NOMEM;
	}
	l->ds = ds;
	l->s = s;
	l->batch_size = batch_size;
	l->drop_last = drop_last != 0;
	l->image_elems = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
	l->lut = malloc(sizeof(*l->lut) * (size_t)ds->c);
	if (!l->lut) {
		free(l);
		loom_data_fail(err, errlen, "loader: out of memory");
		return LOOM_ERR_NOMEM;
	}
	for (int c = 0; c < ds->c; c++)
		for (v = 0; v < 256; v++)
			l->lut[c][v] = ((float)v / 255.0f - mean) / std;
	*out = l;
	return LOOM_OK;
}

void loom_loader_free(loom_loader *l)
{
	if (l)
		free(l->lut);
	free(l);
}

loom_status loom_loader_set_normalize(loom_loader *l, const float *mean, const float *std)
{
	if (!l)
		return LOOM_ERR_INVALID;
	if (!mean || !std) {
		loom_error_set(&l->err, LOOM_ERR_INVALID, "loader: per-channel %s is NULL",
			       !mean ? "mean" : "std");
		return LOOM_ERR_INVALID;
	}
	for (int c = 0; c < l->ds->c; c++)
		if (!(std[c] > 0.0f)) {
			loom_error_set(&l->err, LOOM_ERR_INVALID,
				       "loader: std of channel %d is %g, expected > 0", c, (double)std[c]);
			return LOOM_ERR_INVALID;
		}
	for (int c = 0; c < l->ds->c; c++)
		for (int v = 0; v < 256; v++)
			l->lut[c][v] = ((float)v / 255.0f - mean[c]) / std[c];
	return LOOM_OK;
}

loom_status loom_loader_set_augment(loom_loader *l, int pad, int flip, uint64_t seed)
{
	if (!l)
		return LOOM_ERR_INVALID;
	if (pad < 0 || pad > l->ds->h || pad > l->ds->w) {
		loom_error_set(&l->err, LOOM_ERR_INVALID,
			       "loader: crop padding %d, expected 0..%d for %dx%d images", pad,
			       l->ds->h < l->ds->w ? l->ds->h : l->ds->w, l->ds->h, l->ds->w);
		return LOOM_ERR_INVALID;
	}
	l->pad = pad;
	l->flip = flip != 0;
	l->aug_seed = seed;
	return LOOM_OK;
}

/* splitmix64 of (seed, epoch, item): the augmentation an item gets depends
 * on nothing else (not the rank, the batch or the thread that loads it). */
static uint64_t aug_hash(uint64_t seed, int64_t epoch, int64_t item)
{
	uint64_t z = seed ^ ((uint64_t)epoch * 0x9e3779b97f4a7c15ull) ^
		     ((uint64_t)item * 0xd1b54a32d192ed03ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* One image through the tables, shifted by (dy, dx) inside a zero-padded
 * frame (padding is the value 0 before normalising, as torchvision pads
 * the uint8 image) and mirrored when flip. */
static void convert_augmented(const loom_loader *l, const uint8_t *in, float *o, int dy, int dx,
			      int flip)
{
	int h = l->ds->h, w = l->ds->w;
	for (int c = 0; c < l->ds->c; c++) {
		const float *lut = l->lut[c];
		const uint8_t *plane = in + (size_t)c * h * w;
		float *op = o + (size_t)c * h * w;
		for (int y = 0; y < h; y++) {
			int sy = y + dy;
			for (int x = 0; x < w; x++) {
				int sx = (flip ? w - 1 - x : x) + dx;
				op[(size_t)y * w + x] = sy < 0 || sy >= h || sx < 0 || sx >= w ?
								lut[0] :
								lut[plane[(size_t)sy * w + sx]];
			}
		}
	}
}

int64_t loom_loader_num_batches(const loom_loader *l)
{
	int64_t len;

	if (!l)
		return 0;
	len = loom_sampler_len(l->s);
	return l->drop_last ? len / l->batch_size
			    : (len + l->batch_size - 1) / l->batch_size;
}

int loom_loader_batch_size(const loom_loader *l)
{
	return l ? l->batch_size : 0;
}

size_t loom_loader_image_elems(const loom_loader *l)
{
	return l ? l->image_elems : 0;
}

loom_status loom_loader_get(loom_loader *l, int64_t batch, float *images,
			    int32_t *labels, int *count)
{
	const int64_t *idx;
	const uint8_t *src;
	int64_t nb, len, start;
	size_t elems;
	int n, i;

	if (!l)
		return LOOM_ERR_INVALID;
	if (count)
		*count = 0;
	if (!images || !labels || !count) {
		loom_error_set(&l->err, LOOM_ERR_INVALID,
			       "loader: %s buffer is NULL",
			       !images ? "images" : !labels ? "labels" : "count");
		return LOOM_ERR_INVALID;
	}
	nb = loom_loader_num_batches(l);
	if (batch < 0 || batch >= nb) {
		loom_error_set(&l->err, LOOM_ERR_INVALID,
			       "loader: batch %lld out of range [0, %lld)",
			       (long long)batch, (long long)nb);
		return LOOM_ERR_INVALID;
	}
	len = loom_sampler_len(l->s);
	start = batch * l->batch_size;
	n = (int)(len - start < l->batch_size ? len - start : l->batch_size);
	idx = loom_sampler_indices(l->s) + start;
	src = l->ds->images;
	elems = l->image_elems;

	size_t plane = (size_t)l->ds->h * l->ds->w;
	int64_t epoch = loom_sampler_epoch(l->s);

	#pragma omp parallel for schedule(static) if ((size_t)n * elems >= LOADER_PARALLEL_PIXELS)
	for (i = 0; i < n; i++) {
		const uint8_t *in = src + (size_t)idx[i] * elems;
		float *o = images + (size_t)i * elems;
		size_t k;

		if (l->pad || l->flip) {
			uint64_t r = aug_hash(l->aug_seed, epoch, idx[i]);
			int span = 2 * l->pad + 1;
			int dy = (int)(r % (uint64_t)span) - l->pad;
			int dx = (int)((r >> 16) % (uint64_t)span) - l->pad;
			convert_augmented(l, in, o, dy, dx, l->flip && ((r >> 32) & 1));
			continue;
		}
		for (k = 0; k < elems; k++)
			o[k] = l->lut[k / plane][in[k]];
	}
	for (i = 0; i < n; i++)
		labels[i] = l->ds->labels[idx[i]];
	*count = n;
	loom_error_clear(&l->err);
	return LOOM_OK;
}

const char *loom_loader_error(const loom_loader *l)
{
	return l ? l->err.msg : "loader is NULL";
}
