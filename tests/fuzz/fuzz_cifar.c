/*
 * tests/fuzz/fuzz_cifar.c — libFuzzer target for loom_cifar10_load
 * (datasets/cifar.c). The reader takes a directory, so each input becomes
 * test_batch.bin in a directory under /dev/shm (or TMPDIR) made once. A load
 * either succeeds with one image per whole 3073-byte record and every label
 * below 10, or fails with a message and an empty data set.
 */
#include "fuzz_common.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "loom_data.h"

static char dir[256];

static void make_dir(void)
{
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/loom-fuzz-cifar-%d", base ? base : "/tmp", (int)getpid());
	FUZZ_CHECK(mkdir(dir, 0700) == 0 || access(dir, W_OK) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[300], err[512];
	loom_dataset ds;
	loom_status st;

	if (!dir[0])
		make_dir();
	snprintf(path, sizeof(path), "%s/test_batch.bin", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	FUZZ_CHECK(fd >= 0);
	for (size_t off = 0; off < size;) {
		ssize_t w = write(fd, data + off, size - off);
		FUZZ_CHECK(w > 0);
		off += (size_t)w;
	}
	close(fd);
	st = loom_cifar10_load(dir, "test", &ds, err, sizeof(err));
	if (st == LOOM_OK) {
		FUZZ_CHECK(size > 0 && size % 3073 == 0);
		FUZZ_CHECK(ds.n == (int64_t)(size / 3073));
		FUZZ_CHECK(ds.c == 3 && ds.h == 32 && ds.w == 32 && ds.classes == 10);
		for (int64_t i = 0; i < ds.n; i++)
			FUZZ_CHECK(ds.labels[i] >= 0 && ds.labels[i] < 10 &&
				   ds.labels[i] == data[i * 3073]);
		FUZZ_CHECK(memcmp(ds.images, data + 1, 3072) == 0);
		loom_dataset_free(&ds);
	} else {
		FUZZ_CHECK(err[0] != 0 && strstr(err, "cifar10"));
		FUZZ_CHECK(ds.n == 0 && ds.images == NULL && ds.labels == NULL);
	}
	return 0;
}
