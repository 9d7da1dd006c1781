/*
 * engine/cuda/device.c — which CUDA devices this machine has, asked of the
 * driver (base/cuda_plugin.c) without mapping the CUDA backend: a process
 * that ends up on the CPU never loads cuBLASLt, cuDNN or NCCL.
 */
#include "engine/cuda/device.h"

#include "base/cuda_plugin.h"

int loom_cuda_compiled(void)
{
	return loom_cuda_plugin_built();
}

int loom_cuda_device_count(void)
{
	return loom_cuda_probe(NULL, 0);
}

int loom_cuda_available(void)
{
	return loom_cuda_device_count() > 0;
}

const char *loom_cuda_probe_error(void)
{
	static __thread char why[512];

	if (loom_cuda_probe(why, sizeof why) > 0)
		return NULL;
	return why;
}

loom_status loom_cuda_device_name(int dev, char *buf, size_t len)
{
	return loom_cuda_probe_device_name(dev, buf, len);
}
