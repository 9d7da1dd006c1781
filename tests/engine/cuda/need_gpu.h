/*
 * tests/engine/cuda/need_gpu.h — the one "needs a CUDA device" check of the
 * CUDA suites. Without a usable device a test skips, naming why; with
 * LOOM_REQUIRE_GPU=1 (the GPU bundle sets it) it fails instead, so a GPU
 * host whose driver, container or sandbox hides the device cannot turn the
 * suite into a green run of skips.
 */
#ifndef LOOM_TESTS_ENGINE_CUDA_NEED_GPU_H
#define LOOM_TESTS_ENGINE_CUDA_NEED_GPU_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "engine/cuda/device.h"

/* LOOM_REQUIRE_GPU is set to anything but "" or "0". */
static inline int loom_test_require_gpu(void)
{
	const char *v = getenv("LOOM_REQUIRE_GPU");
	return v && *v && strcmp(v, "0") != 0;
}

/* NULL when this process can run on a CUDA device, else why not (in buf). */
static inline const char *loom_test_no_gpu(char *buf, size_t len)
{
	int n;

	if (!loom_cuda_compiled())
		return "this build has no CUDA toolkit";
	n = loom_cuda_device_count();
	if (n > 0)
		return NULL;
	/* The driver's own reason ("no CUDA driver: libcuda.so.1: ...",
	 * "cuInit: CUDA_ERROR_NO_DEVICE ..."), else the bare count. */
	const char *why = loom_cuda_probe_error();
	if (why && *why)
		snprintf(buf, len, "none is usable: %s", why);
	else
		snprintf(buf, len, "none is usable: loom_cuda_device_count() is %d", n);
	return buf;
}

#define LOOM_NEED_GPU()                                                                 \
	do {                                                                            \
		char why_buf_[512];                                                     \
		const char *why_ = loom_test_no_gpu(why_buf_, sizeof(why_buf_));         \
		if (why_ && loom_test_require_gpu())                                    \
			cr_assert_fail("needs a CUDA device (LOOM_REQUIRE_GPU=1): %s", why_); \
		if (why_)                                                               \
			cr_skip_test("needs a CUDA device: %s", why_);                  \
	} while (0)

#endif /* LOOM_TESTS_ENGINE_CUDA_NEED_GPU_H */
