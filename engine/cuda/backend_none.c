/*
 * engine/cuda/backend_none.c — the CUDA backend's entry points for builds
 * without a toolkit: no backend (loom_compile then picks the CPU), and test
 * hooks that do nothing.
 */
#include <stddef.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/program_internal.h"

const loom_backend *loom_cuda_backend_get(void)
{
	return NULL;
}

void loom_cuda_test_poison(int on)
{
	(void)on;
}

void loom_cuda_test_own_kernels(int on)
{
	(void)on;
}

void loom_cuda_test_library_use(const struct loom_program *p, int *bn_cudnn,
				int *bgrad_epilogue)
{
	(void)p;
	*bn_cudnn = *bgrad_epilogue = 0;
}

void loom_cuda_test_fallbacks(const struct loom_program *p, int *conv_f32, int *mm_unfused)
{
	(void)p;
	*conv_f32 = *mm_unfused = 0;
}
