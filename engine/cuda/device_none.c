/*
 * device_none.c — device discovery for builds without a CUDA toolkit: the
 * same API, answering "no CUDA", so callers need no #ifdef.
 */
#include "engine/cuda/device.h"

#include <stdio.h>

int loom_cuda_compiled(void)
{
	return 0;
}

int loom_cuda_device_count(void)
{
	return 0;
}

int loom_cuda_available(void)
{
	return 0;
}

loom_status loom_cuda_device_name(int dev, char *buf, size_t len)
{
	if (!buf || len == 0)
		return LOOM_ERR_INVALID;
	snprintf(buf, len, "no CUDA device %d: loom was built without CUDA", dev);
	return LOOM_ERR_UNSUPPORTED;
}
