/*
 * engine/cuda/comm.cu — the CUDA entry of a gradient bucket's all-reduce:
 * an event marks the compute stream's work so far (the bucket's last
 * gradient), the communication stream waits for it, and NCCL sums the
 * bucket from there (comm/nccl.cu), so the rest of backward overlaps it.
 * The optimizer waits for every bucket before it reads one. Also gradient
 * accumulation's sums (engine/cpu/ops_comm.c does the same on the host).
 * Compiled, never yet run (no GPU where it was written).
 */
#include "comm/comm.h"
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
		c->arena.accum + seg->off, loom_arena_ptr(&c->arena, p, seg->v), seg->dtype,
		seg->count, fold);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* The event this entry records on the compute stream; record and wait are
 * back to back on the host, so one event serves every bucket. */
#define COMM_EVENT 0

loom_status loom_cuda_op_allreduce(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
				   const loom_cuda_io *io)
{
	int k = p->g->nodes[v].a.ar.bucket;
	loom_status st;
	if (!p->comm || k < 0 || k >= p->buckets.n || !c->pending)
		return loom_errf(c->err, LOOM_ERR_STATE, "all-reduce node %d: no process group", (int)v);
	/* Gradient accumulation (DDP's no_sync): the bucket joins its sum,
	 * nothing is sent; the step after folds the sum in first. */
	if (c->flags & LOOM_EXEC_ACCUMULATE)
		return loom_cuda_accum(c, p, k, 0);
	if (c->pending[k])
		return loom_errf(c->err, LOOM_ERR_STATE,
				 "all-reduce of bucket %d started again before it ended", k);
	if ((c->flags & LOOM_EXEC_FOLD) && (st = loom_cuda_accum(c, p, k, 1)) != LOOM_OK)
		return st;
	st = LOOM_CUDA_CHECK(cudaEventRecord(c->events[COMM_EVENT], c->stream), c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaStreamWaitEvent(c->comm, c->events[COMM_EVENT], 0), c->err,
				     sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	const loom_bucket *b = &p->buckets.b[k];
	st = loom_comm_allreduce_start(p->comm, io->out, (size_t)b->count, b->dtype, (void *)c->comm,
				       &c->pending[k]);
	if (st != LOOM_OK) {
		c->pending[k] = NULL;
		return loom_errf(c->err, st, "%s", loom_pg_error(p->comm->pg));
	}
	c->n_pending++;
	return LOOM_OK;
}

loom_status loom_cuda_comm_wait_all(loom_cuda_ctx *c)
{
	loom_status first = LOOM_OK;
	for (int k = 0; k < c->n_buckets && c->n_pending; k++) {
		if (!c->pending[k])
			continue;
		loom_status st = loom_comm_wait(c->group, c->pending[k]);
		c->pending[k] = NULL;
		c->n_pending--;
		if (st != LOOM_OK && first == LOOM_OK)
			first = loom_errf(c->err, st, "%s", loom_pg_error(c->group->pg));
	}
	return first;
}
