/*
 * test_mnist.c — loom_mnist_load on hand-made splits (raw and gzip, good and
 * inconsistent), plus the real Fashion-MNIST when its Debian package is in.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "idx_fixture.h"
#include "loom_data.h"

static char dir[256];

static void setup(void)
{
	cr_assert_eq(fx_tmpdir(dir, sizeof(dir)), 0, "cannot create a temp dir");
}

TestSuite(mnist, .init = setup);

/* Writes a split of n images of h x w with labels lab (n of them) and
 * pixel (i, k) = i * 10 + k, the label count possibly different (nl). */
static void write_split(const char *split, int gz, uint32_t n, uint32_t h,
			uint32_t w, const uint8_t *lab, uint32_t nl)
{
	uint32_t idims[3] = {n, h, w};
	size_t size = (size_t)n * h * w, i;
	uint8_t *img = malloc(size ? size : 1);
	char name[128], path[512];

	for (i = 0; i < size; i++)
		img[i] = (uint8_t)((i / (h * w)) * 10 + i % (h * w));
	snprintf(name, sizeof(name), "%s-images-idx3-ubyte%s", split, gz ? ".gz" : "");
	cr_assert_eq(fx_write_idx(dir, name, gz, 0x08, 3, idims, img, size, path), 0);
	snprintf(name, sizeof(name), "%s-labels-idx1-ubyte%s", split, gz ? ".gz" : "");
	cr_assert_eq(fx_write_idx(dir, name, gz, 0x08, 1, &nl, lab, nl, path), 0);
	free(img);
}

static void good_split(int gz)
{
	const uint8_t lab[3] = {7, 0, 9};
	char err[512];
	loom_dataset ds;
	int i;

	write_split("train", gz, 3, 2, 4, lab, 3);
	cr_assert_eq(loom_mnist_load(dir, "train", &ds, err, sizeof(err)), LOOM_OK,
		     "%s", err);
	cr_assert_eq(ds.n, 3);
	cr_assert_eq(ds.c, 1);
	cr_assert_eq(ds.h, 2);
	cr_assert_eq(ds.w, 4);
	cr_assert_eq(ds.classes, 10);
	for (i = 0; i < 3; i++)
		cr_assert_eq(ds.labels[i], lab[i]);
	for (i = 0; i < 24; i++)
		cr_assert_eq(ds.images[i], (i / 8) * 10 + i % 8);
	loom_dataset_free(&ds);
	cr_assert_null(ds.images);
	cr_assert_eq(ds.n, 0);
}

Test(mnist, raw_split) { good_split(0); }
Test(mnist, gzip_split) { good_split(1); }

/* Expects status st and every non-NULL want[] in the message. */
static void expect_fail(const char *d, const char *split, loom_status st,
			const char *want1, const char *want2, const char *want3)
{
	char err[1024];
	loom_dataset ds;
	loom_status got = loom_mnist_load(d, split, &ds, err, sizeof(err));

	cr_assert_eq(got, st, "status %d, expected %d: %s", got, st, err);
	cr_assert(strstr(err, want1), "message lacks \"%s\": %s", want1, err);
	if (want2)
		cr_assert(strstr(err, want2), "message lacks \"%s\": %s", want2, err);
	if (want3)
		cr_assert(strstr(err, want3), "message lacks \"%s\": %s", want3, err);
	cr_assert_null(ds.images);
	cr_assert_null(ds.labels);
}

Test(mnist, count_mismatch)
{
	const uint8_t lab[2] = {1, 2};

	write_split("t10k", 1, 3, 2, 2, lab, 2);
	expect_fail(dir, "t10k", LOOM_ERR_FORMAT,
		    "t10k-images-idx3-ubyte.gz' hold 3 images",
		    "t10k-labels-idx1-ubyte.gz' hold 2 labels", NULL);
}

Test(mnist, label_out_of_range)
{
	const uint8_t lab[3] = {1, 10, 2};

	write_split("train", 0, 3, 2, 2, lab, 3);
	expect_fail(dir, "train", LOOM_ERR_FORMAT, "train-labels-idx1-ubyte'",
		    "label 10 at index 1 is out of range [0, 10)", NULL);
}

Test(mnist, missing_dir_names_package)
{
	char missing[512];

	snprintf(missing, sizeof(missing), "%s/not-here", dir);
	expect_fail(missing, "train", LOOM_ERR_NOT_FOUND, missing,
		    "does not exist", "Debian package dataset-fashion-mnist");
}

Test(mnist, missing_labels)
{
	uint32_t idims[3] = {1, 1, 1};
	uint8_t px = 0;
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "train-images-idx3-ubyte", 0, 0x08, 3,
				  idims, &px, 1, path), 0);
	expect_fail(dir, "train", LOOM_ERR_NOT_FOUND,
		    "neither train-labels-idx1-ubyte nor train-labels-idx1-ubyte.gz",
		    dir, NULL);
}

/*
 * A directory that may not be searched is "permission denied", not "missing
 * files". Root passes every permission check, so as root the test drops to
 * nobody first (Criterion runs each test in a process of its own).
 */
Test(mnist, unsearchable_dir_is_permission_denied)
{
	const uint8_t lab[1] = {1};
	char locked[512], err[512];
	loom_dataset ds;
	loom_status st;

	if (geteuid() == 0) {
		/* Root searches any directory: drop to nobody, in a directory
		 * nobody can reach (TEST_TMPDIR may sit under root's 0700 home). */
		snprintf(dir, sizeof(dir), "/tmp/loom_locked_XXXXXX");
		cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
		cr_assert_eq(chmod(dir, 0777), 0);
		cr_assert_eq(setgid(65534), 0);
		cr_assert_eq(setuid(65534), 0);
	}
	snprintf(locked, sizeof(locked), "%s/locked", dir);
	cr_assert_eq(mkdir(locked, 0700), 0, "mkdir %s: %s", locked, strerror(errno));
	snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/locked");
	write_split("train", 0, 1, 1, 1, lab, 1);
	cr_assert_eq(chmod(locked, 0600), 0);
	st = loom_mnist_load(locked, "train", &ds, err, sizeof(err));
	chmod(locked, 0700);
	cr_assert_eq(st, LOOM_ERR_IO, "status %d: %s", (int)st, err);
	cr_assert(strstr(err, "Permission denied"), "%s", err);
	cr_assert(strstr(err, locked), "%s", err);
	cr_assert_null(strstr(err, "neither"), "%s", err);
}

Test(mnist, bad_split)
{
	expect_fail(dir, "test", LOOM_ERR_INVALID, "split 'test' is unknown", NULL,
		    NULL);
}

Test(mnist, images_wrong_ndim)
{
	uint32_t idims[2] = {2, 4};
	uint32_t n = 2;
	uint8_t px[8] = {0}, lab[2] = {0, 1};
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "train-images-idx3-ubyte", 0, 0x08, 2,
				  idims, px, 8, path), 0);
	cr_assert_eq(fx_write_idx(dir, "train-labels-idx1-ubyte", 0, 0x08, 1,
				  &n, lab, 2, path), 0);
	expect_fail(dir, "train", LOOM_ERR_FORMAT, "train-images-idx3-ubyte'",
		    "2 dims, expected 3", NULL);
}

Test(mnist, broken_file_is_reported)
{
	/* A truncated images file surfaces the IDX reader's message. */
	uint32_t idims[3] = {2, 2, 2}, n = 2;
	uint8_t px[8] = {0}, lab[2] = {0, 1};
	char path[512];

	cr_assert_eq(fx_write_idx(dir, "train-images-idx3-ubyte.gz", 1, 0x08, 3,
				  idims, px, 5, path), 0);
	cr_assert_eq(fx_write_idx(dir, "train-labels-idx1-ubyte.gz", 1, 0x08, 1,
				  &n, lab, 2, path), 0);
	expect_fail(dir, "train", LOOM_ERR_FORMAT, "train-images-idx3-ubyte.gz'",
		    "expected 8 bytes of data, got 5", NULL);
}

static int have_real_data(void)
{
	struct stat st;

	return stat(LOOM_FASHION_MNIST_DIR, &st) == 0 && S_ISDIR(st.st_mode);
}

static void real_split(const char *split, int64_t n)
{
	char err[1024];
	loom_dataset ds;
	int64_t hist[10] = {0}, i;

	if (!have_real_data())
		cr_skip_test("needs the Debian package dataset-fashion-mnist (%s)",
			     LOOM_FASHION_MNIST_DIR);
	cr_assert_eq(loom_mnist_load(NULL, split, &ds, err, sizeof(err)), LOOM_OK,
		     "%s", err);
	cr_assert_eq(ds.n, n);
	cr_assert_eq(ds.c, 1);
	cr_assert_eq(ds.h, 28);
	cr_assert_eq(ds.w, 28);
	for (i = 0; i < ds.n; i++)
		hist[ds.labels[i]]++;
	/* Fashion-MNIST is balanced: n / 10 of each class. */
	for (i = 0; i < 10; i++)
		cr_assert_eq(hist[i], n / 10, "class %lld has %lld images",
			     (long long)i, (long long)hist[i]);
	if (n == 60000) {
		/* The mean pixel over the training set is the mean the
		 * normalisation constant was taken from. */
		double sum = 0;
		size_t k, total = (size_t)ds.n * 28 * 28;

		for (k = 0; k < total; k++)
			sum += ds.images[k];
		cr_assert_float_eq(sum / total / 255.0, LOOM_FASHION_MNIST_MEAN, 1e-3);
	}
	loom_dataset_free(&ds);
}

Test(mnist, real_fashion_train) { real_split("train", 60000); }
Test(mnist, real_fashion_t10k) { real_split("t10k", 10000); }
