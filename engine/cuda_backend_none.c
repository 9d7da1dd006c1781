/*
 * engine/cuda_backend_none.c — the CUDA backend's entry point in builds
 * without it: loom_compile then runs everything on the CPU backend.
 */
#include "engine/program_internal.h"

const loom_backend *loom_cuda_backend_get(void)
{
	return NULL;
}
