/*
 * engine/cuda/backend_none.c — the CUDA backend's entry points for builds
 * without a toolkit: no backend (loom_compile then picks the CPU), and a
 * test hook that does nothing.
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
