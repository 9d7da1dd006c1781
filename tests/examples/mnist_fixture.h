/*
 * tests/examples/mnist_fixture.h — what the examples' Criterion suites share:
 * a small hand-made MNIST-format dataset and a run of an example program on
 * it (its output captured). Plain C, no Criterion: callers assert.
 */
#ifndef LOOM_TESTS_EXAMPLES_MNIST_FIXTURE_H
#define LOOM_TESTS_EXAMPLES_MNIST_FIXTURE_H

#include <stddef.h>

/* The fixture's private directory under $TEST_TMPDIR (or /tmp), made on
 * the first call; NULL if it cannot be made. */
const char *mnist_fixture_dir(void);

/* dir/name in one of 8 buffers that take turns (several in one call's
 * arguments); NULL if the directory cannot be made. */
const char *mnist_fixture_in_dir(const char *name);

/* dir/SPLIT-images-idx3-ubyte and dir/SPLIT-labels-idx1-ubyte: n images of
 * 28x28 (pixels from the label), image i labelled i % 10. 0, or -1 when a
 * file cannot be written. */
int mnist_fixture_split(const char *dir, const char *split, int n);

/* Runs `bin --data dir --device cpu --threads 1 args`, stdout and stderr
 * into out (len bytes, terminated); its exit status, -1 if it did not exit. */
int mnist_fixture_run(const char *bin, const char *dir, const char *args, char *out, size_t len);

#endif /* LOOM_TESTS_EXAMPLES_MNIST_FIXTURE_H */
