/*
 * tests/examples/cifar_fixture.c — writes a small CIFAR-10 directory in the
 * real binary format (records of 1 label byte + 3072 pixel bytes, R, G, B
 * planes of 32x32) holding an easy task: each class has its own colour and
 * a bright square in its own place, under noise, so that a few epochs of a
 * narrow ResNet learn it even through random crops and flips.
 *
 *   cifar_fixture DIR NTRAIN NTEST   (NTRAIN split over the five batch files)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint32_t rng = 12345;

static uint32_t next(void)
{
	rng = rng * 1664525u + 1013904223u;
	return rng >> 8;
}

static int write_file(const char *path, long first, long n)
{
	unsigned char rec[3073];
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	for (long i = first; i < first + n; i++) {
		int k = (int)(next() % 10);
		rec[0] = (unsigned char)k;
		/* The square sits at one of 10 places, away from the 4-pixel
		 * border a crop may lose. */
		int sy = 6 + (k / 5) * 10, sx = 5 + (k % 5) * 4;
		for (int c = 0; c < 3; c++)
			for (int y = 0; y < 32; y++)
				for (int x = 0; x < 32; x++) {
					int v = 40 + ((k >> c) & 1) * 80 + (int)(next() % 40);
					if (y >= sy && y < sy + 8 && x >= sx && x < sx + 8)
						v = 230;
					rec[1 + c * 1024 + y * 32 + x] = (unsigned char)v;
				}
		if (fwrite(rec, 1, sizeof(rec), f) != sizeof(rec)) {
			fclose(f);
			return -1;
		}
	}
	return fclose(f);
}

int main(int argc, char **argv)
{
	char path[4096];
	if (argc != 4) {
		fprintf(stderr, "usage: cifar_fixture DIR NTRAIN NTEST\n");
		return 2;
	}
	long ntrain = atol(argv[2]), ntest = atol(argv[3]);
	for (int b = 0; b < 5; b++) {
		long lo = ntrain * b / 5, hi = ntrain * (b + 1) / 5;
		snprintf(path, sizeof(path), "%s/data_batch_%d.bin", argv[1], b + 1);
		if (write_file(path, lo, hi - lo)) {
			perror(path);
			return 1;
		}
	}
	snprintf(path, sizeof(path), "%s/test_batch.bin", argv[1]);
	if (write_file(path, 0, ntest)) {
		perror(path);
		return 1;
	}
	return 0;
}
