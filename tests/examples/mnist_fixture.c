/*
 * tests/examples/mnist_fixture.c — the examples' suites' small MNIST-format
 * dataset and program runs (mnist_fixture.h).
 */
#include "tests/examples/mnist_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

const char *mnist_fixture_dir(void)
{
	static char dir[4096];
	if (!dir[0]) {
		const char *base = getenv("TEST_TMPDIR");
		snprintf(dir, sizeof(dir), "%s/loomexXXXXXX", base && base[0] ? base : "/tmp");
		if (!mkdtemp(dir)) {
			dir[0] = 0;
			return NULL;
		}
	}
	return dir;
}

const char *mnist_fixture_in_dir(const char *name)
{
	static char buf[8][4200];
	static int k;
	const char *dir = mnist_fixture_dir();
	if (!dir)
		return NULL;
	char *b = buf[k++ % 8];
	snprintf(b, sizeof(buf[0]), "%s/%s", dir, name);
	return b;
}

int mnist_fixture_split(const char *dir, const char *split, int n)
{
	char path[4300];
	unsigned char head[16] = { 0, 0, 8, 3, 0, 0, (unsigned char)(n >> 8), (unsigned char)n,
				   0, 0, 0, 28, 0, 0, 0, 28 };
	unsigned char lh[8] = { 0, 0, 8, 1, 0, 0, (unsigned char)(n >> 8), (unsigned char)n };
	FILE *f;

	if (!dir)
		return -1;
	snprintf(path, sizeof(path), "%s/%s-images-idx3-ubyte", dir, split);
	if (!(f = fopen(path, "wb")))
		return -1;
	fwrite(head, 1, 16, f);
	for (int i = 0; i < n; i++)
		for (int p = 0; p < 28 * 28; p++)
			fputc((p * (i % 10 + 1) + p / 28 * (i % 10)) & 255, f);
	if (fclose(f))
		return -1;
	snprintf(path, sizeof(path), "%s/%s-labels-idx1-ubyte", dir, split);
	if (!(f = fopen(path, "wb")))
		return -1;
	fwrite(lh, 1, 8, f);
	for (int i = 0; i < n; i++)
		fputc(i % 10, f);
	return fclose(f) ? -1 : 0;
}

int mnist_fixture_run(const char *bin, const char *dir, const char *args, char *out, size_t len)
{
	char cmd[8192];
	if (!dir) {
		snprintf(out, len, "no fixture directory");
		return -1;
	}
	snprintf(cmd, sizeof(cmd), "%s --data %s --device cpu --threads 1 %s 2>&1", bin, dir, args);
	FILE *p = popen(cmd, "r");
	if (!p) {
		snprintf(out, len, "popen failed: %s", cmd);
		return -1;
	}
	size_t got = fread(out, 1, len - 1, p);
	out[got] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
