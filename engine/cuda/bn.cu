/*
 * engine/cuda/bn.cu — batch norm over NCHW: training forward (batch
 * statistics, running statistics updated in place with the unbiased
 * variance), eval forward, and the two backward nodes the graph has
 * (BN_BWD_DATA, BN_BWD_GAMMA; dbeta is a CHANNEL_SUM). CPU twin:
 * engine/cpu/bn_impl.h, followed formula for formula.
 *
 * The fallback of bn_cudnn.cu: cuDNN runs batch norm where it takes the
 * dtypes (f32 or f16 data with f32 parameters: O0, O1, O2); these kernels
 * run the rest (O3's half parameters, bf16) and everything under the
 * loom_cuda_test_own_kernels hook. One block per channel, double
 * accumulators, two passes for the variance.
 */
#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* Element k of channel ch's n * hw values. */
static __device__ __forceinline__ int64_t bn_index(int c, int64_t hw, int ch, int64_t k)
{
	int64_t i = k / hw, j = k - i * hw;
	return (i * c + ch) * hw + j;
}

/* Mean and biased variance of channel ch (every thread gets them). */
static __device__ void bn_stats(int n, int c, int64_t hw, const void *x, int xdt, int ch,
				double *mean, double *var)
{
	const int64_t m = (int64_t)n * hw;
	double s = 0;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x)
		s += loom_ld(x, xdt, bn_index(c, hw, ch, k));
	const double mu = loom_block_sum(s) / (double)m;
	double q = 0;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
		double d = loom_ld(x, xdt, bn_index(c, hw, ch, k)) - mu;
		q += d * d;
	}
	*mean = mu;
	*var = loom_block_sum(q) / (double)m;
}

/* bn_chan_bwd_sums: mean, var, sum dy, sum dy * (x - mean). */
static __device__ void bn_bwd_sums(int n, int c, int64_t hw, const void *x, int xdt,
				   const void *dy, int dydt, int ch, double *mean, double *var,
				   double *sdy, double *sdyx)
{
	const int64_t m = (int64_t)n * hw;
	double s = 0;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x)
		s += loom_ld(x, xdt, bn_index(c, hw, ch, k));
	const double mu = loom_block_sum(s) / (double)m;
	double q = 0, a = 0, b = 0;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
		int64_t o = bn_index(c, hw, ch, k);
		double d = loom_ld(x, xdt, o) - mu;
		double g = loom_ld(dy, dydt, o);
		q += d * d;
		a += g;
		b += g * d;
	}
	*mean = mu;
	*var = loom_block_sum(q) / (double)m;
	*sdy = loom_block_sum(a);
	*sdyx = loom_block_sum(b);
}

/* y = x * scale + shift with scale and shift rounded to fp32 first, as the
 * CPU's f32 kernel passes them as T; then a fused relu (attrs.bn.relu,
 * graph/fuse.c) in fp32 before the one rounding, as the CPU applies it. */
static __device__ void bn_affine(int n, int c, int64_t hw, const void *x, int xdt, int ch,
				 float scale, float shift, int relu, void *y, int ydt)
{
	const int64_t m = (int64_t)n * hw;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
		int64_t o = bn_index(c, hw, ch, k);
		float v = fmaf(loom_ld(x, xdt, o), scale, shift);
		loom_st(y, ydt, o, relu && v < 0.0f ? 0.0f : v); /* NaN passes through */
	}
}

__global__ void loom_bn_fwd_train_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					 const void *gamma, int gdt, const void *beta, int bdt,
					 void *rmean, int rmdt, void *rvar, int rvdt,
					 double momentum, double eps, int relu, void *y, int ydt)
{
	const int ch = blockIdx.x;
	const double m = (double)n * hw;
	const double unbias = m > 1 ? m / (m - 1) : 1;
	double mean, var;
	bn_stats(n, c, hw, x, xdt, ch, &mean, &var);
	double g = gamma ? loom_ld(gamma, gdt, ch) : 1, bt = beta ? loom_ld(beta, bdt, ch) : 0;
	double scale = g / sqrt(var + eps);
	bn_affine(n, c, hw, x, xdt, ch, (float)scale, (float)(bt - mean * scale), relu, y, ydt);
	if (threadIdx.x == 0) {
		if (rmean)
			loom_st(rmean, rmdt, ch,
				(float)((1 - momentum) * loom_ld(rmean, rmdt, ch) + momentum * mean));
		if (rvar)
			loom_st(rvar, rvdt, ch,
				(float)((1 - momentum) * loom_ld(rvar, rvdt, ch) +
					momentum * var * unbias));
	}
}

__global__ void loom_bn_fwd_eval_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					const void *gamma, int gdt, const void *beta, int bdt,
					const void *rmean, int rmdt, const void *rvar, int rvdt,
					double eps, int relu, void *y, int ydt)
{
	const int ch = blockIdx.x;
	double g = gamma ? loom_ld(gamma, gdt, ch) : 1, bt = beta ? loom_ld(beta, bdt, ch) : 0;
	double scale = g / sqrt((double)loom_ld(rvar, rvdt, ch) + eps);
	/* The CPU rounds running_mean * scale through T = float first. */
	bn_affine(n, c, hw, x, xdt, ch, (float)scale,
		  (float)(bt - loom_ld(rmean, rmdt, ch) * scale), relu, y, ydt);
}

__global__ void loom_bn_bwd_data_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					const void *gamma, int gdt, const void *dy, int dydt,
					double eps, void *dx, int dxdt)
{
	const int ch = blockIdx.x;
	const double m = (double)n * hw;
	double mean, var, sdy, sdyx;
	bn_bwd_sums(n, c, hw, x, xdt, dy, dydt, ch, &mean, &var, &sdy, &sdyx);
	double istd = 1 / sqrt(var + eps);
	double k = (gamma ? loom_ld(gamma, gdt, ch) : 1) * istd;
	double bb = -k * (sdyx / m) * istd * istd;
	double d = -k * (sdy / m) - bb * mean;
	const float a = (float)k, b = (float)bb, dd = (float)d;
	for (int64_t e = threadIdx.x; e < (int64_t)n * hw; e += blockDim.x) {
		int64_t o = bn_index(c, hw, ch, e);
		/* dp * a + xp * b + dd, in fp32 as the CPU's f32 kernel */
		float v = loom_ld(dy, dydt, o) * a + loom_ld(x, xdt, o) * b + dd;
		loom_st(dx, dxdt, o, v);
	}
}

__global__ void loom_bn_bwd_gamma_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					 const void *dy, int dydt, double eps, void *dg, int dgdt)
{
	const int ch = blockIdx.x;
	double mean, var, sdy, sdyx;
	bn_bwd_sums(n, c, hw, x, xdt, dy, dydt, ch, &mean, &var, &sdy, &sdyx);
	if (threadIdx.x == 0)
		loom_st(dg, dgdt, ch, (float)(sdyx / sqrt(var + eps)));
}

// ----------------------------------------------------------------------------
// kernel launchers

static const int threads = 512;

extern "C" loom_status loom_cuda_bn_fwd(char *err, cudaStream_t s, int train, int n,
					int c, int64_t hw, const void *x, int xdt, const void *gamma,
					int gdt, const void *beta, int bdt, void *rmean, int rmdt,
					void *rvar, int rvdt, double momentum, double eps, int relu,
					void *y, int ydt)
{
	if (c <= 0)
		return LOOM_OK;
	if (train)
		loom_bn_fwd_train_kernel<<<c, threads, 0, s>>>(n, c, hw, x, xdt, gamma, gdt, beta,
								bdt, rmean, rmdt, rvar, rvdt,
								momentum, eps, relu, y, ydt);
	else
		loom_bn_fwd_eval_kernel<<<c, threads, 0, s>>>(n, c, hw, x, xdt, gamma, gdt, beta,
							       bdt, rmean, rmdt, rvar, rvdt, eps, relu,
							       y, ydt);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_bn_bwd_data(char *err, cudaStream_t s, int n, int c,
					     int64_t hw, const void *x, int xdt, const void *gamma,
					     int gdt, const void *dy, int dydt, double eps, void *dx,
					     int dxdt)
{
	if (c <= 0)
		return LOOM_OK;
	loom_bn_bwd_data_kernel<<<c, threads, 0, s>>>(n, c, hw, x, xdt, gamma, gdt, dy, dydt, eps,
						       dx, dxdt);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_bn_bwd_gamma(char *err, cudaStream_t s, int n, int c,
					      int64_t hw, const void *x, int xdt, const void *dy,
					      int dydt, double eps, void *dg, int dgdt)
{
	if (c <= 0)
		return LOOM_OK;
	loom_bn_bwd_gamma_kernel<<<c, threads, 0, s>>>(n, c, hw, x, xdt, dy, dydt, eps, dg, dgdt);
	return LOOM_CUDA_LAUNCHED(err);
}

// ----------------------------------------------------------------------------
// op entries

loom_status loom_cuda_op_batchnorm2d(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				     const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
		return loom_cuda_bn_run(plan, c, v, &c->plans[v], c->train, io->src, io->out);
	return loom_cuda_bn_fwd(c->err, c->stream, c->train, (int)x->shape.dims[0],
				(int)x->shape.dims[1], x->shape.dims[2] * x->shape.dims[3],
				io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2], io->dt[2],
				io->src[3], io->dt[3], io->src[4], io->dt[4], n->a.bn.momentum,
				n->a.bn.eps, n->a.bn.relu, io->out, io->odt);
}

loom_status loom_cuda_op_bn_bwd_data(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				     const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
		return loom_cuda_bn_run(plan, c, v, &c->plans[v], c->train, io->src, io->out);
	return loom_cuda_bn_bwd_data(c->err, c->stream, (int)x->shape.dims[0],
				     (int)x->shape.dims[1], x->shape.dims[2] * x->shape.dims[3],
				     io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
				     io->dt[2], n->a.bn.eps, io->out, io->odt);
}

loom_status loom_cuda_op_bn_bwd_gamma(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				      const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	return loom_cuda_bn_bwd_gamma(c->err, c->stream, (int)x->shape.dims[0],
				      (int)x->shape.dims[1], x->shape.dims[2] * x->shape.dims[3],
				      io->src[0], io->dt[0], io->src[1], io->dt[1], n->a.bn.eps,
				      io->out, io->odt);
}
