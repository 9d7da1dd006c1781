/*
 * device.cu — device discovery through the CUDA runtime. A missing driver or
 * device is an ordinary answer (0 devices), never an error to the caller.
 */
#include "engine/cuda/device.h"

#include <stdio.h>

#include <cuda_runtime_api.h>

#include "base/check.h"

extern "C" int loom_cuda_compiled(void)
{
	return 1;
}

extern "C" int loom_cuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		/* No driver or no device: clear the runtime's last error so that a
		 * later LOOM_CUDA_CHECK on an unrelated call does not report it. */
		(void)cudaGetLastError();
		return 0;
	}
	return n;
}

extern "C" int loom_cuda_available(void)
{
	return loom_cuda_device_count() > 0;
}

extern "C" loom_status loom_cuda_device_name(int dev, char *buf, size_t len)
{
	cudaDeviceProp prop;
	loom_status st;
	int n;

	if (!buf || len == 0)
		return LOOM_ERR_INVALID;
	n = loom_cuda_device_count();
	if (dev < 0 || dev >= n) {
		snprintf(buf, len, "no CUDA device %d (this machine has %d)", dev, n);
		return LOOM_ERR_INVALID;
	}
	st = LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev), buf, len);
	if (st != LOOM_OK)
		return st;
	snprintf(buf, len, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
		 (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
	return LOOM_OK;
}
