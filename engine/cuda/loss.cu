/*
 * engine/cuda/loss.cu — softmax cross-entropy forward (mean over rows of
 * logsumexp - logit[label]) and backward ((softmax - onehot) * dloss / n).
 * CPU twin: loom_cpu_softmax_ce_fwd/bwd in engine/cpu/dense_impl.h, double
 * accumulation as there.
 *
 * A label outside [0, classes) cannot fail the launch: the kernel records
 * the node and the first bad row in the control block, writes no loss, the
 * optimizer kernels skip the update, and the next sync (the loss download
 * every loom_run ends with) reports it as the CPU backend does.
 */
#include <stdint.h>

#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* logsumexp of row i (every thread of the block gets it). */
static __device__ double ce_logsumexp(int classes, const void *logits, int ldt, int64_t row)
{
	double mx = -INFINITY;
	for (int j = threadIdx.x; j < classes; j += blockDim.x) {
		double v = loom_ld(logits, ldt, row + j);
		mx = v > mx ? v : mx;
	}
	mx = loom_block_max(mx);
	double s = 0;
	for (int j = threadIdx.x; j < classes; j += blockDim.x)
		s += exp((double)loom_ld(logits, ldt, row + j) - mx);
	return mx + log(loom_block_sum(s));
}

/* One block per row: row_ws[i] = logsumexp(row) - row[label]. */
__global__ void loom_ce_rows_kernel(int classes, const void *logits, int ldt,
				    const int32_t *labels, double *row_ws, int node,
				    loom_cuda_ctl *ctl)
{
	const int i = blockIdx.x;
	const int64_t row = (int64_t)i * classes;
	double lse = ce_logsumexp(classes, logits, ldt, row);
	if (threadIdx.x != 0)
		return;
	int32_t lab = labels[i];
	if (lab < 0 || lab >= classes) {
		int prev = atomicCAS(&ctl->ce_node, -1, node);
		if (prev == -1 || prev == node)
			atomicMin(&ctl->ce_row, i);
		row_ws[i] = 0;
		return;
	}
	row_ws[i] = lse - (double)loom_ld(logits, ldt, row + lab);
}

/* One block: the mean over rows, unless this node saw a bad label. */
__global__ void loom_ce_mean_kernel(int n, const double *row_ws, void *loss, int lossdt,
				    int node, const loom_cuda_ctl *ctl)
{
	double s = 0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += row_ws[i];
	s = loom_block_sum(s);
	if (threadIdx.x == 0 && ctl->ce_node != node)
		loom_st(loss, lossdt, 0, (float)(n > 0 ? s / n : 0));
}

/* One block per row. dlogits may be logits (LOOM_OPF_INPLACE): the block
 * has read its row for the logsumexp before the reduction's last barrier,
 * and each thread then reads element j before it writes it. */
__global__ void loom_ce_bwd_kernel(int n, int classes, const void *logits, int ldt,
				   const int32_t *labels, const void *dloss, int dldt,
				   void *dlogits, int dxdt)
{
	const int i = blockIdx.x;
	const int64_t row = (int64_t)i * classes;
	const double g = n > 0 ? (double)loom_ld(dloss, dldt, 0) / n : 0;
	double lse = ce_logsumexp(classes, logits, ldt, row);
	int32_t lab = labels[i];
	for (int j = threadIdx.x; j < classes; j += blockDim.x) {
		double e = exp((double)loom_ld(logits, ldt, row + j) - lse);
		/* A bad label (the forward reported it) only loses its one-hot term. */
		if (j == lab)
			e -= 1;
		loom_st(dlogits, dxdt, row + j, (float)(e * g));
	}
}

// ----------------------------------------------------------------------------
// kernel launchers

static const int threads = 128;

extern "C" loom_status loom_cuda_softmax_ce_fwd(char *err, cudaStream_t s, int n,
						int classes, const void *logits, int ldt,
						const int32_t *labels, void *loss, int lossdt,
						double *row_ws, int node, loom_cuda_ctl *ctl)
{
	loom_status st;
	if (n > 0 && classes > 0) {
		loom_ce_rows_kernel<<<n, threads, 0, s>>>(classes, logits, ldt, labels, row_ws,
							   node, ctl);
		if ((st = LOOM_CUDA_LAUNCHED(err)) != LOOM_OK)
			return st;
	}
	loom_ce_mean_kernel<<<1, 1024, 0, s>>>(classes > 0 ? n : 0, row_ws, loss, lossdt, node,
						ctl);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_softmax_ce_bwd(char *err, cudaStream_t s, int n,
						int classes, const void *logits, int ldt,
						const int32_t *labels, const void *dloss, int dldt,
						void *dlogits, int dxdt)
{
	if (n <= 0 || classes <= 0)
		return LOOM_OK;
	loom_ce_bwd_kernel<<<n, threads, 0, s>>>(n, classes, logits, ldt, labels, dloss, dldt,
						  dlogits, dxdt);
	return LOOM_CUDA_LAUNCHED(err);
}

// ----------------------------------------------------------------------------
// op entries

/* A bad label raises a flag in the control block; synchronize reports it. */
loom_status loom_cuda_op_softmax_ce(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				    const loom_cuda_io *io)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	return loom_cuda_softmax_ce_fwd(c->err, c->stream, (int)x->shape.dims[0],
					(int)x->shape.dims[1], io->src[0], io->dt[0],
					(const int32_t *)io->src[1], io->out, io->odt,
					(double *)c->arena->ws, v, c->ctl);
}

loom_status loom_cuda_op_softmax_ce_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
					const loom_cuda_io *io)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	return loom_cuda_softmax_ce_bwd(c->err, c->stream, (int)x->shape.dims[0],
					(int)x->shape.dims[1], io->src[0], io->dt[0],
					(const int32_t *)io->src[1], io->src[2], io->dt[2], io->out,
					io->odt);
}
