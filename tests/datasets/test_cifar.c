/*
 * tests/datasets/test_cifar.c — the CIFAR-10 binary reader on files this test
 * writes in the exact format (records of 1 label byte + 3072 pixel bytes),
 * every malformed case refused naming the file, and the synthetic data set.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom_data.h"

#define REC 3073

static char dir[256];

static void make_dir(void)
{
	snprintf(dir, sizeof(dir), "/tmp/loom_cifar_%d", (int)getpid());
	mkdir(dir, 0755);
}

static void clean_dir(void)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

/* Writes `records` records; record r has label (r + seed) % 10 and pixels
 * (r * 7 + k + seed) & 255. */
static void write_batch(const char *name, int records, int seed)
{
	char path[400];
	unsigned char rec[REC];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	cr_assert(f, "cannot write %s", path);
	for (int r = 0; r < records; r++) {
		rec[0] = (unsigned char)((r + seed) % 10);
		for (int k = 0; k < 3072; k++)
			rec[1 + k] = (unsigned char)((r * 7 + k + seed) & 255);
		cr_assert_eq(fwrite(rec, 1, REC, f), (size_t)REC);
	}
	fclose(f);
}

static void write_all(int records)
{
	char name[32];
	for (int i = 1; i <= 5; i++) {
		snprintf(name, sizeof(name), "data_batch_%d.bin", i);
		write_batch(name, records, i);
	}
	write_batch("test_batch.bin", records, 9);
}

TestSuite(cifar, .init = make_dir, .fini = clean_dir);

Test(cifar, reads_train_and_test_in_file_order)
{
	char err[512];
	loom_dataset ds;
	write_all(3);
	cr_assert_eq(loom_cifar10_load(dir, "train", &ds, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(ds.n, 15);
	cr_assert_eq(ds.c, 3);
	cr_assert_eq(ds.h, 32);
	cr_assert_eq(ds.w, 32);
	cr_assert_eq(ds.classes, 10);
	/* Image 4 is record 1 of data_batch_2 (seed 2). */
	cr_assert_eq(ds.labels[4], 3);
	cr_assert_eq(ds.images[4 * 3072 + 0], (1 * 7 + 0 + 2) & 255);
	cr_assert_eq(ds.images[4 * 3072 + 3071], (1 * 7 + 3071 + 2) & 255);
	loom_dataset_free(&ds);
	cr_assert_eq(loom_cifar10_load(dir, "test", &ds, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(ds.n, 3);
	cr_assert_eq(ds.labels[0], 9);
	loom_dataset_free(&ds);
}

Test(cifar, a_missing_batch_file_is_named)
{
	char err[512], path[400];
	loom_dataset ds;
	write_all(2);
	snprintf(path, sizeof(path), "%s/data_batch_4.bin", dir);
	unlink(path);
	cr_assert_eq(loom_cifar10_load(dir, "train", &ds, err, sizeof(err)), LOOM_ERR_NOT_FOUND);
	cr_assert(strstr(err, "data_batch_4.bin"), "%s", err);
	cr_assert_null(ds.images);
	cr_assert_eq(ds.n, 0);
}

Test(cifar, a_size_that_is_not_whole_records_is_named)
{
	char err[512], path[400];
	loom_dataset ds;
	write_all(2);
	snprintf(path, sizeof(path), "%s/test_batch.bin", dir);
	cr_assert_eq(truncate(path, 2 * REC - 5), 0);
	cr_assert_eq(loom_cifar10_load(dir, "test", &ds, err, sizeof(err)), LOOM_ERR_FORMAT);
	cr_assert(strstr(err, "test_batch.bin") && strstr(err, "6141 bytes"), "%s", err);
	cr_assert_eq(truncate(path, 0), 0);
	cr_assert_eq(loom_cifar10_load(dir, "test", &ds, err, sizeof(err)), LOOM_ERR_FORMAT);
}

Test(cifar, a_label_out_of_range_is_named)
{
	char err[512], path[400];
	loom_dataset ds;
	write_all(4);
	snprintf(path, sizeof(path), "%s/data_batch_3.bin", dir);
	FILE *f = fopen(path, "r+b");
	cr_assert(f);
	fseek(f, 2 * REC, SEEK_SET);
	fputc(10, f);
	fclose(f);
	cr_assert_eq(loom_cifar10_load(dir, "train", &ds, err, sizeof(err)), LOOM_ERR_FORMAT);
	cr_assert(strstr(err, "data_batch_3.bin") && strstr(err, "record 2") &&
			  strstr(err, "label 10"),
		  "%s", err);
	cr_assert_null(ds.images);
}

Test(cifar, a_missing_directory_says_what_to_download)
{
	char err[512];
	loom_dataset ds;
	cr_assert_eq(loom_cifar10_load("/nonexistent/cifar", "train", &ds, err, sizeof(err)),
		     LOOM_ERR_NOT_FOUND);
	cr_assert(strstr(err, "/nonexistent/cifar") && strstr(err, "data_batch_1.bin") &&
			  strstr(err, "cifar-10-binary"),
		  "%s", err);
	cr_assert_eq(loom_cifar10_load(dir, "validation", &ds, err, sizeof(err)), LOOM_ERR_INVALID);
	cr_assert(strstr(err, "validation"), "%s", err);
}

Test(cifar, synthetic_data_is_reproducible_and_in_range)
{
	char err[256];
	loom_dataset a, b, c;
	cr_assert_eq(loom_synthetic_load(50, 3, 8, 8, 10, 7, &a, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_synthetic_load(50, 3, 8, 8, 10, 7, &b, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(loom_synthetic_load(50, 3, 8, 8, 10, 8, &c, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(memcmp(a.images, b.images, 50 * 192), 0);
	cr_assert_eq(memcmp(a.labels, b.labels, 50 * sizeof(int32_t)), 0);
	cr_assert_neq(memcmp(a.images, c.images, 50 * 192), 0);
	int seen[10] = { 0 };
	for (int i = 0; i < 50; i++) {
		cr_assert(a.labels[i] >= 0 && a.labels[i] < 10);
		seen[a.labels[i]] = 1;
	}
	int classes = 0;
	for (int k = 0; k < 10; k++)
		classes += seen[k];
	cr_assert_geq(classes, 5, "50 labels fell in %d classes", classes);
	loom_dataset_free(&a);
	loom_dataset_free(&b);
	loom_dataset_free(&c);
	cr_assert_eq(loom_synthetic_load(0, 3, 8, 8, 10, 7, &a, err, sizeof(err)), LOOM_ERR_INVALID);
	cr_assert(strstr(err, "synthetic"), "%s", err);
}
