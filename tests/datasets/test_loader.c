/*
 * test_loader.c — loom_loader on a synthetic dataset whose pixels encode their
 * image's index: batch counts, the partial last batch, normalised values, and
 * that images and labels stay paired under a shuffling, multi-rank sampler.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "loom_data.h"

TestSuite(loader);

/* n images of c x h x w; pixel k of image i is (i * 31 + k) mod 256, and the
 * label is i mod classes, so a batch can be checked against its indices. */
static loom_dataset make_ds(int64_t n, int c, int h, int w)
{
	loom_dataset ds = {.n = n, .c = c, .h = h, .w = w, .classes = 10};
	size_t elems = (size_t)c * h * w, k;
	int64_t i;

	ds.images = malloc((size_t)n * elems);
	ds.labels = malloc((size_t)n * sizeof(int32_t));
	for (i = 0; i < n; i++) {
		for (k = 0; k < elems; k++)
			ds.images[i * elems + k] = (uint8_t)((i * 31 + (int64_t)k) % 256);
		ds.labels[i] = (int32_t)(i % 10);
	}
	return ds;
}

static loom_sampler *make_sampler(int64_t n, int rank, int world, int shuffle)
{
	loom_sampler *s = NULL;
	char err[256];

	cr_assert_eq(loom_sampler_new(n, rank, world, shuffle, 7, 0, &s, err,
				      sizeof(err)), LOOM_OK, "%s", err);
	return s;
}

static loom_loader *make_loader(const loom_dataset *ds, const loom_sampler *s,
				int b, int drop_last, float mean, float std)
{
	loom_loader *l = NULL;
	char err[256];

	cr_assert_eq(loom_loader_new(ds, s, b, drop_last, mean, std, &l, err,
				     sizeof(err)), LOOM_OK, "%s", err);
	return l;
}

/* Every image of the batch holds the expected normalised pixels of its index
 * and the label of that same index. */
static void check_batch(const loom_dataset *ds, const int64_t *idx, int count,
			const float *images, const int32_t *labels, float mean,
			float std)
{
	size_t elems = (size_t)ds->c * ds->h * ds->w, k;
	int i;

	for (i = 0; i < count; i++) {
		for (k = 0; k < elems; k++) {
			double x = ds->images[idx[i] * elems + k];
			double want = (x / 255.0 - mean) / std;

			cr_assert_float_eq(images[i * elems + k], want, 1e-5,
					   "image %d pixel %zu: %f, expected %f",
					   i, k, images[i * elems + k], want);
		}
		cr_assert_eq(labels[i], ds->labels[idx[i]]);
	}
}

Test(loader, batches_and_partial_last)
{
	loom_dataset ds = make_ds(10, 1, 2, 3);
	loom_sampler *s = make_sampler(10, 0, 1, 0);
	loom_loader *l = make_loader(&ds, s, 4, 0, 0.5f, 0.25f);
	loom_loader *ld = make_loader(&ds, s, 4, 1, 0.5f, 0.25f);
	float images[4 * 6];
	int32_t labels[4];
	int count, b;

	cr_assert_eq(loom_loader_num_batches(l), 3);
	cr_assert_eq(loom_loader_num_batches(ld), 2);
	cr_assert_eq(loom_loader_batch_size(l), 4);
	cr_assert_eq(loom_loader_image_elems(l), 6);
	for (b = 0; b < 3; b++) {
		cr_assert_eq(loom_loader_get(l, b, images, labels, &count), LOOM_OK,
			     "%s", loom_loader_error(l));
		cr_assert_eq(count, b < 2 ? 4 : 2);
		check_batch(&ds, loom_sampler_indices(s) + 4 * b, count, images,
			    labels, 0.5f, 0.25f);
	}
	cr_assert_eq(loom_loader_get(ld, 2, images, labels, &count), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_loader_error(ld), "batch 2 out of range [0, 2)"),
		  "%s", loom_loader_error(ld));
	cr_assert_eq(count, 0);
	loom_loader_free(l);
	loom_loader_free(ld);
	loom_sampler_free(s);
	free(ds.images);
	free(ds.labels);
}

Test(loader, normalisation_values)
{
	/* Pixels 0, 255 and 73 under the Fashion-MNIST constants. */
	uint8_t px[3] = {0, 255, 73};
	int32_t lab[3] = {0, 1, 2};
	loom_dataset ds = {.n = 3, .c = 1, .h = 1, .w = 1, .classes = 10,
			   .images = px, .labels = lab};
	loom_sampler *s = make_sampler(3, 0, 1, 0);
	loom_loader *l = make_loader(&ds, s, 3, 0, LOOM_FASHION_MNIST_MEAN,
				     LOOM_FASHION_MNIST_STD);
	float images[3];
	int32_t labels[3];
	int count;

	cr_assert_eq(loom_loader_get(l, 0, images, labels, &count), LOOM_OK);
	cr_assert_eq(count, 3);
	cr_assert_float_eq(images[0], -0.2860 / 0.3530, 1e-6);
	cr_assert_float_eq(images[1], (1.0 - 0.2860) / 0.3530, 1e-6);
	cr_assert_float_eq(images[2], (73 / 255.0 - 0.2860) / 0.3530, 1e-6);
	loom_loader_free(l);
	loom_sampler_free(s);
}

Test(loader, shuffled_ranks_keep_pairs)
{
	/* Three ranks, shuffled, padded, a batch large enough for the
	 * OpenMP path (100 x 28 x 28 > the serial threshold). */
	loom_dataset ds = make_ds(301, 1, 28, 28);
	size_t elems = 28 * 28;
	float *images = malloc(100 * elems * sizeof(float));
	int32_t labels[100];
	int r;

	for (r = 0; r < 3; r++) {
		loom_sampler *s = make_sampler(301, r, 3, 1);
		loom_loader *l = make_loader(&ds, s, 100, 0, 0.1f, 0.3f);
		int64_t b, seen = 0;
		int count;

		cr_assert_eq(loom_sampler_set_epoch(s, 2), LOOM_OK);
		cr_assert_eq(loom_loader_num_batches(l), 2); /* 101 per rank */
		for (b = 0; b < 2; b++) {
			cr_assert_eq(loom_loader_get(l, b, images, labels, &count),
				     LOOM_OK);
			check_batch(&ds, loom_sampler_indices(s) + 100 * b, count,
				    images, labels, 0.1f, 0.3f);
			seen += count;
		}
		cr_assert_eq(seen, 101);
		loom_loader_free(l);
		loom_sampler_free(s);
	}
	free(images);
	free(ds.images);
	free(ds.labels);
}

Test(loader, rejects_bad_arguments)
{
	loom_dataset ds = make_ds(10, 1, 2, 2);
	loom_sampler *s = make_sampler(10, 0, 1, 0);
	loom_sampler *s9 = make_sampler(9, 0, 1, 0);
	loom_loader *l = (loom_loader *)1;
	char err[256];
	float images[8];
	int32_t labels[2];
	int count;

	cr_assert_eq(loom_loader_new(&ds, s9, 4, 0, 0, 1, &l, err, sizeof(err)),
		     LOOM_ERR_MISMATCH);
	cr_assert_null(l);
	cr_assert(strstr(err, "sampler was built for 9 items but the dataset has 10"),
		  "%s", err);
	cr_assert_eq(loom_loader_new(&ds, s, 0, 0, 0, 1, &l, err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert(strstr(err, "batch size 0"), "%s", err);
	cr_assert_eq(loom_loader_new(&ds, s, 2, 0, 0, 0, &l, err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert(strstr(err, "std 0, expected > 0"), "%s", err);

	l = make_loader(&ds, s, 2, 0, 0, 1);
	cr_assert_eq(loom_loader_get(l, -1, images, labels, &count), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_loader_error(l), "batch -1 out of range [0, 5)"));
	cr_assert_eq(loom_loader_get(l, 0, NULL, labels, &count), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_loader_error(l), "images buffer is NULL"));
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_sampler_free(s9);
	free(ds.images);
	free(ds.labels);
}

Test(loader, empty_dataset)
{
	loom_dataset ds = {.n = 0, .c = 1, .h = 28, .w = 28, .classes = 10};
	loom_sampler *s = make_sampler(0, 0, 2, 1);
	loom_loader *l = make_loader(&ds, s, 8, 0, 0, 1);

	cr_assert_eq(loom_loader_num_batches(l), 0);
	loom_loader_free(l);
	loom_sampler_free(s);
}

Test(loader, per_channel_normalisation)
{
	loom_dataset ds = make_ds(4, 3, 2, 2);
	loom_sampler *s = make_sampler(4, 0, 1, 0);
	loom_loader *l = make_loader(&ds, s, 4, 0, 0.0f, 1.0f);
	const float mean[3] = { 0.1f, 0.2f, 0.3f }, std[3] = { 0.5f, 0.25f, 2.0f };
	float img[4 * 12];
	int32_t lab[4];
	int count;
	cr_assert_eq(loom_loader_set_normalize(l, mean, std), LOOM_OK);
	cr_assert_eq(loom_loader_get(l, 0, img, lab, &count), LOOM_OK);
	for (int i = 0; i < 4; i++)
		for (int k = 0; k < 12; k++) {
			int c = k / 4;
			float want = ((float)ds.images[i * 12 + k] / 255.0f - mean[c]) / std[c];
			cr_assert_float_eq(img[i * 12 + k], want, 1e-6f, "image %d elem %d", i, k);
		}
	const float bad[3] = { 1.0f, 0.0f, 1.0f };
	cr_assert_eq(loom_loader_set_normalize(l, mean, bad), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_loader_error(l), "channel 1"), "%s", loom_loader_error(l));
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
}

/* The crop is a shift inside a zero-padded frame and the flip a mirror: every
 * output pixel is either the padding value or a pixel of the same channel of
 * the same image; the choice repeats for the same (seed, epoch, item) and
 * changes with the epoch. */
Test(loader, crop_and_flip_are_reproducible_shifts)
{
	const int n = 16, c = 3, h = 6, w = 6, e = c * h * w;
	loom_dataset ds = make_ds(n, c, h, w);
	loom_sampler *s = make_sampler(n, 0, 1, 1);
	loom_loader *l = make_loader(&ds, s, n, 0, 0.0f, 1.0f);
	static float a[16 * 108], b[16 * 108], d[16 * 108];
	int32_t lab[16];
	int count, moved = 0;
	cr_assert_eq(loom_loader_set_augment(l, 2, 1, 99), LOOM_OK);
	cr_assert_eq(loom_loader_get(l, 0, a, lab, &count), LOOM_OK);
	cr_assert_eq(loom_loader_get(l, 0, b, lab, &count), LOOM_OK);
	cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "same epoch, different augmentation");
	const int64_t *idx = loom_sampler_indices(s);
	for (int i = 0; i < n; i++) {
		const uint8_t *in = ds.images + idx[i] * e;
		int found_shift = 0;
		for (int dy = -2; dy <= 2 && !found_shift; dy++)
			for (int dx = -2; dx <= 2 && !found_shift; dx++)
				for (int f = 0; f < 2 && !found_shift; f++) {
					int ok = 1;
					for (int k = 0; k < e && ok; k++) {
						int ch = k / (h * w), y = k / w % h, x = k % w;
						int sy = y + dy, sx = (f ? w - 1 - x : x) + dx;
						float want = sy < 0 || sy >= h || sx < 0 || sx >= w ?
								     0.0f :
								     in[ch * h * w + sy * w + sx] / 255.0f;
						ok = fabsf(a[i * e + k] - want) < 1e-6f;
					}
					if (ok) {
						found_shift = 1;
						moved += dy != 0 || dx != 0 || f;
					}
				}
		cr_assert(found_shift, "image %d is no crop/flip of item %lld", i, (long long)idx[i]);
	}
	cr_assert_geq(moved, n / 2, "only %d of %d images were augmented", moved, n);
	cr_assert_eq(loom_sampler_set_epoch(s, 1), LOOM_OK);
	cr_assert_eq(loom_loader_get(l, 0, d, lab, &count), LOOM_OK);
	cr_assert_neq(memcmp(a, d, sizeof(a)), 0, "epoch 1 repeats epoch 0's batch exactly");
	cr_assert_eq(loom_loader_set_augment(l, 7, 0, 1), LOOM_ERR_INVALID);
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
}
