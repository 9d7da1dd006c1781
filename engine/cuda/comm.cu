/*
 * engine/cuda/comm.cu — gradient accumulation's sums on the device (an
 * ACCUM step of engine/exec.c; engine/cpu/accum.c does the same on the
 * host). The buckets' collectives themselves are the executor's: it orders
 * the communication stream after the compute stream with the backend's
 * events and hands NCCL the stream (stream_handle).
 * Compiled, never yet run (no GPU where it was written).
 */
#include "base/check.h"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* sum += g, or (fold) g += sum and sum = 0; sums are f32 (f64 for f64). */
__global__ void loom_accum_kernel(void *sum, void *g, int dt, int64_t n, int fold)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		if (dt == LOOM_F64) {
			double *s = (double *)sum, *x = (double *)g;
			if (fold)
				x[i] += s[i], s[i] = 0;
			else
				s[i] += x[i];
		} else {
			float *s = (float *)sum;
			if (fold)
				loom_st(g, dt, i, loom_ld(g, dt, i) + s[i]), s[i] = 0;
			else
				s[i] += loom_ld(g, dt, i);
		}
	}
}

// ----------------------------------------------------------------------------
// kernel launchers

loom_status loom_cuda_accum(loom_cuda_ctx *c, const loom_plan *p, int s, int fold)
{
	const loom_accum_seg *seg = &p->accum[s];
	int64_t blocks = (seg->count + 255) / 256;
	if (seg->count == 0)
		return LOOM_OK;
	loom_accum_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, c->stream>>>(
		c->arena->accum + seg->off, loom_arena_ptr(c->arena, p, seg->v), seg->dtype,
		seg->count, fold);
	return LOOM_CUDA_LAUNCHED(c->err);
}
