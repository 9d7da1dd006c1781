/*
 * tests/fuzz/fuzz_common.h — what the libFuzzer targets share: the readers
 * under test take a path, so each input goes to an anonymous in-memory file
 * (memfd) and is read back through /proc/self/fd, never touching the disk.
 */
#ifndef LOOM_TESTS_FUZZ_COMMON_H
#define LOOM_TESTS_FUZZ_COMMON_H

#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* An invariant the code under test promised and broke: crash so that
 * libFuzzer keeps the input. */
#define FUZZ_CHECK(cond)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			fprintf(stderr, "%s:%d: %s does not hold\n", __FILE__,  \
				__LINE__, #cond);                               \
			abort();                                                \
		}                                                               \
	} while (0)

/* Writes n bytes to a fresh memfd and its /proc path into path; returns the
 * fd (close it when done). Aborts if the kernel refuses: that is the harness
 * failing, not the code under test. */
static inline int fuzz_memfile(const void *data, size_t n, char *path, size_t pathlen)
{
	const char *p = data;
	int fd = memfd_create("loom-fuzz", MFD_CLOEXEC);

	FUZZ_CHECK(fd >= 0);
	while (n) {
		ssize_t w = write(fd, p, n);
		FUZZ_CHECK(w > 0);
		p += w;
		n -= (size_t)w;
	}
	snprintf(path, pathlen, "/proc/self/fd/%d", fd);
	return fd;
}

#endif /* LOOM_TESTS_FUZZ_COMMON_H */
