/*
 * test_device.c — CUDA device discovery (count 0 and no crash on a machine
 * without a GPU, every device's name on one with), and the checked-call
 * helper's messages. The one test that needs a device skips without one,
 * or fails with LOOM_REQUIRE_GPU=1 (need_gpu.h).
 */
#include <criterion/criterion.h>

#include <string.h>

#include "base/check.h"
#include "engine/cuda/device.h"
#include "tests/engine/cuda/need_gpu.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

Test(cuda_device, compiled_matches_build)
{
#if LOOM_HAVE_CUDA
	cr_assert_eq(loom_cuda_compiled(), 1);
#else
	cr_assert_eq(loom_cuda_compiled(), 0);
#endif
}

Test(cuda_device, count_and_available_agree)
{
	int n = loom_cuda_device_count();

	cr_assert_geq(n, 0);
	cr_assert_eq(loom_cuda_available(), n > 0);
	/* Asked twice: a failed first probe must not poison the second. */
	cr_assert_eq(loom_cuda_device_count(), n);
}

/* Runs everywhere, never skips: the first device number past the count is
 * refused with a message naming it and the count (0 on a machine without
 * a GPU, where device 0 is that number). */
Test(cuda_device, device_past_the_count_is_named)
{
	char name[256], want[64];
	int n = loom_cuda_device_count();

	cr_assert_eq(loom_cuda_available(), n > 0);
	cr_assert_neq(loom_cuda_device_name(n, name, sizeof name), LOOM_OK);
	snprintf(want, sizeof want, "no CUDA device %d", n);
	cr_assert_not_null(strstr(name, want), "%s", name);
}

Test(cuda_device, name_of_each_device)
{
	char name[256];
	int n = loom_cuda_device_count();

	LOOM_NEED_GPU();
	for (int d = 0; d < n; d++) {
		cr_assert_eq(loom_cuda_device_name(d, name, sizeof name), LOOM_OK, "%s", name);
		cr_assert_not_null(strstr(name, "(sm_"), "%s", name);
		cr_log_info("device %d: %s", d, name);
	}
	cr_assert_eq(loom_cuda_device_name(n, name, sizeof name), LOOM_ERR_INVALID);
}

Test(cuda_device, name_rejects_bad_buffer)
{
	cr_assert_eq(loom_cuda_device_name(0, NULL, 16), LOOM_ERR_INVALID);
}

Test(cuda_check, helper_formats_file_line_callee_message)
{
	char err[128];

	cr_assert_eq(loom_check_failed("out of memory", 2, "cudaMalloc(&p, 1 << 30)",
				       "engine/cuda/x.cu", 42, err, sizeof err),
		     LOOM_ERR_BACKEND);
	cr_assert_str_eq(err, "engine/cuda/x.cu:42: cudaMalloc: out of memory (2)");
}

Test(cuda_check, helper_survives_small_and_missing_buffers)
{
	char err[12];

	cr_assert_eq(loom_check_failed("out of memory", 2, "cudaMalloc(&p, n)", "f.cu", 7,
				       err, sizeof err),
		     LOOM_ERR_BACKEND);
	cr_assert_str_eq(err, "f.cu:7: cud");
	cr_assert_eq(loom_check_failed(NULL, 1, NULL, NULL, 0, NULL, 0), LOOM_ERR_BACKEND);
}

/* A stand-in library: its own status type, success value and strings, to
 * show that a new library's check is one line on LOOM_CHECK_CALL. */
typedef enum { FAKE_OK = 0, FAKE_BUSY = 5 } fake_status;
static int fake_calls;

static const char *fake_string(fake_status s)
{
	return s == FAKE_BUSY ? "device busy" : "fine";
}

static fake_status fake_call(fake_status s)
{
	fake_calls++;
	return s;
}

#define FAKE_CHECK(call, err, errlen) \
	LOOM_CHECK_CALL(fake_status, FAKE_OK, fake_string, call, err, errlen)

Test(cuda_check, generic_check_evaluates_once)
{
	char err[128] = "untouched";
	loom_status st;

	st = FAKE_CHECK(fake_call(FAKE_OK), err, sizeof err);
	cr_assert_eq(st, LOOM_OK);
	cr_assert_eq(fake_calls, 1);
	cr_assert_str_eq(err, "untouched", "success must leave the buffer alone");

	st = FAKE_CHECK(fake_call(FAKE_BUSY), err, sizeof err);
	cr_assert_eq(st, LOOM_ERR_BACKEND);
	cr_assert_eq(fake_calls, 2);
	cr_assert_not_null(strstr(err, "test_device.c:"), "%s", err);
	cr_assert_not_null(strstr(err, ": fake_call: device busy (5)"), "%s", err);
}

#if LOOM_HAVE_CUDA
static cudaError_t fake_cuda_malloc(void **p, size_t n)
{
	(void)n;
	*p = NULL;
	return cudaErrorMemoryAllocation;
}

Test(cuda_check, cuda_error_becomes_backend_status)
{
	char err[256];
	void *p;
	loom_status st;

	st = LOOM_CUDA_CHECK(fake_cuda_malloc(&p, (size_t)1 << 40), err, sizeof err);
	cr_assert_eq(st, LOOM_ERR_BACKEND);
	cr_assert_not_null(strstr(err, "test_device.c:"), "%s", err);
	cr_assert_not_null(strstr(err, ": fake_cuda_malloc: out of memory (2)"), "%s", err);
}
#endif
