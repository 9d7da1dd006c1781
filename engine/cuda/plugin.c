/*
 * engine/cuda/plugin.c — the one symbol libloom_cuda.so exports: the table
 * through which base/cuda_plugin.c reaches the CUDA backend and the NCCL
 * collective once it has mapped the file (or finds it linked in, as in the
 * CUDA tests).
 */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "base/check.h"
#include "base/cuda_plugin.h"
#include "comm/comm_internal.h"
#include "engine/backend.h" /* loom_cuda_backend_get */
#include "engine/cuda/cuda_backend.h"

static int plugin_device_count(char *err, size_t errlen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		if (err && errlen)
			snprintf(err, errlen, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
				 cudaGetErrorString(e));
		(void)cudaGetLastError();
		return 0;
	}
	return n;
}

static loom_status plugin_nccl_unique_id(uint8_t *id, char *err, size_t errlen)
{
	return loom_nccl_unique_id(id, err, errlen);
}

static const loom_cuda_plugin plugin = {
	.abi = LOOM_CUDA_PLUGIN_ABI,
	.cuda_version = CUDART_VERSION,
	.device_count = plugin_device_count,
	.backend = loom_cuda_backend_get,
	.nccl_unique_id = plugin_nccl_unique_id,
	.nccl_backend_new = loom_nccl_backend_new,
	.nccl_use_device = loom_nccl_use_device,
	.test_poison = loom_cuda_test_poison,
	.test_own_kernels = loom_cuda_test_own_kernels,
	.test_library_use = loom_cuda_test_library_use,
	.test_fallbacks = loom_cuda_test_fallbacks,
	.test_sdpa_descriptors = loom_cuda_test_sdpa_descriptors,
	.test_gpt_fusions = loom_cuda_test_gpt_fusions,
};

const loom_cuda_plugin *loom_cuda_plugin_entry(void)
{
	return &plugin;
}
