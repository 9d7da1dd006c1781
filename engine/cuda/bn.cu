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
 * loom_cuda_test_own_kernels hook. The split kernels below run training
 * nodes over several blocks per channel; the one-block kernels (double
 * accumulators, two passes for the variance) run eval and an empty
 * batch's training forward.
 *
 * Synchronised batch norm (attrs.bn.sync, engine/ddp.c) always runs here,
 * split as on the CPU (engine/cpu/ops_bn.c): a kernel writes this rank's
 * per-channel sums in f64 into the node's workspace, NCCL sums them over
 * the ranks in the compute stream's order (no host wait, so the step can
 * still become one CUDA graph), and the apply kernels take the global
 * statistics from there. Compiled, never yet run on a GPU.
 *
 * Last, loom_cuda_bn_note: the --dump-graph line on which of these paths
 * (or cuDNN's, bn_cudnn.cu) a batch-norm node takes, with its saved slot;
 * max pool's saved argmax (pool.cu) shares its wording.
 */
#include <stdio.h>

#include "comm/comm.h"
#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* Element k of channel ch's n * hw values. */
static __device__ __forceinline__ int64_t bn_index(int c, int64_t hw, int ch, int64_t k)
{
	int64_t i = k / hw, j = k - i * hw;
	return (i * c + ch) * hw + j;
}

/* Mean of channel ch's m = n * hw values (every thread gets it). */
static __device__ double bn_mean(int n, int c, int64_t hw, const void *x, int xdt, int ch)
{
	const int64_t m = (int64_t)n * hw;
	double s = 0;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x)
		s += loom_ld(x, xdt, bn_index(c, hw, ch, k));
	return loom_block_sum(s) / (double)m;
}

/* Mean and biased variance of channel ch (every thread gets them). */
static __device__ void bn_stats(int n, int c, int64_t hw, const void *x, int xdt, int ch,
				double *mean, double *var)
{
	const int64_t m = (int64_t)n * hw;
	const double mu = bn_mean(n, c, hw, x, xdt, ch);
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
	const double mu = bn_mean(n, c, hw, x, xdt, ch);
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

/* Training forward of channel ch from its mean and biased variance: the
 * affine, then the running statistics (unbias: m / (m - 1)). */
static __device__ void bn_train_chan(int n, int c, int64_t hw, const void *x, int xdt,
				     const void *gamma, int gdt, const void *beta, int bdt,
				     void *rmean, int rmdt, void *rvar, int rvdt, double momentum,
				     double eps, int relu, int ch, double mean, double var,
				     double unbias, void *y, int ydt)
{
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
	bn_train_chan(n, c, hw, x, xdt, gamma, gdt, beta, bdt, rmean, rmdt, rvar, rvdt, momentum,
		      eps, relu, ch, mean, var, unbias, y, ydt);
}

/* Synchronised batch norm's workspace, f64: [count | sum x | sum x^2 |
 * sum dy | sum dy x], c values each after the count (the CPU's layout). */
static __device__ void bn_global_stats(const double *w, int c, int ch, double *mean,
				       double *var)
{
	const double mu = w[1 + ch] / w[0];
	/* sum x^2 came from centred sums: the difference keeps the variance
	 * unless the mean is ~1e8 standard deviations away. */
	const double v = w[1 + c + ch] / w[0] - mu * mu;
	*mean = mu;
	*var = v > 0 ? v : 0;
}

/* This rank's sums of channel ch (dy NULL: the statistics only), from the
 * centred two-pass sums: sum x^2 = sum (x - mean)^2 + m mean^2 and sum dy x
 * = sum dy (x - mean) + mean sum dy. */
__global__ void loom_bn_local_sums_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					  const void *dy, int dydt, double *w)
{
	const int ch = blockIdx.x;
	const double m = (double)n * hw;
	double mean, var, sdy = 0, sdyx = 0;
	if (dy)
		bn_bwd_sums(n, c, hw, x, xdt, dy, dydt, ch, &mean, &var, &sdy, &sdyx);
	else
		bn_stats(n, c, hw, x, xdt, ch, &mean, &var);
	if (threadIdx.x != 0)
		return;
	if (ch == 0)
		w[0] = m;
	w[1 + ch] = mean * m;
	w[1 + c + ch] = var * m + mean * mean * m;
	if (dy) {
		w[1 + 2 * c + ch] = sdy;
		w[1 + 3 * c + ch] = sdyx + mean * sdy;
	}
}

__global__ void loom_bn_fwd_apply_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					 const void *gamma, int gdt, const void *beta, int bdt,
					 void *rmean, int rmdt, void *rvar, int rvdt,
					 double momentum, double eps, int relu, const double *w,
					 void *y, int ydt)
{
	const int ch = blockIdx.x;
	const double m = w[0];
	const double unbias = m > 1 ? m / (m - 1) : 1;
	double mean, var;
	bn_global_stats(w, c, ch, &mean, &var);
	bn_train_chan(n, c, hw, x, xdt, gamma, gdt, beta, bdt, rmean, rmdt, rvar, rvdt, momentum,
		      eps, relu, ch, mean, var, unbias, y, ydt);
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

/* dx of channel ch from the mean, biased variance, sum dy and sum
 * dy (x - mean) over m values. */
static __device__ void bn_dx_chan(int n, int c, int64_t hw, const void *x, int xdt,
				  const void *gamma, int gdt, const void *dy, int dydt, double eps,
				  int ch, double mean, double var, double sdy, double sdyx, double m,
				  void *dx, int dxdt)
{
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

/* Synchronised backward from the workspace: dx (dg NULL) from the global
 * sums of all four, or dgamma (dx NULL) from the global statistics and
 * this rank's dy sums (the gradient buckets sum dgamma over the ranks). */
__global__ void loom_bn_bwd_apply_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					 const void *gamma, int gdt, const void *dy, int dydt,
					 double eps, const double *w, void *dx, int dxdt, void *dg,
					 int dgdt)
{
	const int ch = blockIdx.x;
	double mean, var;
	bn_global_stats(w, c, ch, &mean, &var);
	const double sdy = w[1 + 2 * c + ch];
	const double sdyx = w[1 + 3 * c + ch] - mean * sdy; /* sum dy (x - mean) */
	if (dx)
		bn_dx_chan(n, c, hw, x, xdt, gamma, gdt, dy, dydt, eps, ch, mean, var, sdy, sdyx,
			   w[0], dx, dxdt);
	else if (threadIdx.x == 0)
		loom_st(dg, dgdt, ch, (float)(sdyx / sqrt(var + eps)));
}

/*
 * The split kernels: each channel's
 * n * hw values cut into P chunks of about LOOM_CUDA_BN_CHUNK values, one
 * block per (channel, chunk), so that a large batch fills the device (one
 * block per channel left 64 blocks for ResNet's first layers). A chunk's
 * partial sums (f64) go to the workspace; the next kernel folds a
 * channel's P partials in chunk order in every block that needs them, so
 * the result does not depend on scheduling (deterministic). The variance
 * is E[x^2] - mean^2 in f64, as synchronised batch norm's sums. The
 * forward saves the channel's mean and biased variance (f64) where the
 * plan gave it a slot, and the backward reads them instead of a pass over
 * x; the backward writes dgamma and dbeta with dx when they are its
 * siblings (graph/fuse.c). Compiled, not yet run on a GPU.
 */

/* Chunk p's range [*k0, *k1) of a channel's m values cut into P chunks. */
static __device__ __forceinline__ void bn_chunk(int64_t m, int P, int p, int64_t *k0, int64_t *k1)
{
	const int64_t len = (m + P - 1) / P;
	*k0 = (int64_t)p * len;
	*k1 = *k0 + len < m ? *k0 + len : m;
}

/* Partial sums of chunk (ch = blockIdx.x, p = blockIdx.y): sum x and sum
 * x^2 (dy NULL), or sum dy and sum dy (x - mean) with mean from stat
 * (stat[ch]: mean, stat[c + ch]: biased variance), dy masked by ry > 0
 * where ry is given (the relu's backward fused). part[(ch P + p) 2 + 0/1]. */
__global__ void loom_bn_part_kernel(int n, int c, int64_t hw, const void *x, int xdt,
				    const void *dy, int dydt, const void *ry, int rydt,
				    const double *stat, double *part)
{
	const int ch = blockIdx.x, p = blockIdx.y, P = gridDim.y;
	const int64_t m = (int64_t)n * hw;
	int64_t k0, k1;
	bn_chunk(m, P, p, &k0, &k1);
	double a = 0, b = 0;
	if (!dy) {
		for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
			double v = loom_ld(x, xdt, bn_index(c, hw, ch, k));
			a += v;
			b += v * v;
		}
	} else {
		const double mu = stat[ch];
		for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
			int64_t o = bn_index(c, hw, ch, k);
			/* A fused relu backward: dy where y > 0, as relu_bwd */
			double g = !ry || loom_ld(ry, rydt, o) > 0.0f ? loom_ld(dy, dydt, o) : 0.0f;
			a += g;
			b += g * (loom_ld(x, xdt, o) - mu);
		}
	}
	a = loom_block_sum(a);
	b = loom_block_sum(b);
	if (threadIdx.x == 0) {
		part[((int64_t)ch * P + p) * 2] = a;
		part[((int64_t)ch * P + p) * 2 + 1] = b;
	}
}

/* Channel ch's P partials summed in chunk order (thread 0 sums, the block
 * gets the result). */
static __device__ void bn_fold(const double *part, int ch, int P, double *a, double *b)
{
	__shared__ double ab[2];
	if (threadIdx.x == 0) {
		double s = 0, q = 0;
		for (int p = 0; p < P; p++) {
			s += part[((int64_t)ch * P + p) * 2];
			q += part[((int64_t)ch * P + p) * 2 + 1];
		}
		ab[0] = s;
		ab[1] = q;
	}
	__syncthreads();
	*a = ab[0];
	*b = ab[1];
}

/* Mean and biased variance of channel ch from its sum x and sum x^2. */
static __device__ void bn_moments(double s, double q, double m, double *mean, double *var)
{
	const double mu = s / m, v = q / m - mu * mu;
	*mean = mu;
	*var = v > 0 ? v : 0;
}

/* The backward's statistics when no forward saved them: stat[ch] and
 * stat[c + ch] from the partials (one block of 32 per channel). */
__global__ void loom_bn_stat_kernel(int c, double m, int P, const double *part, double *stat)
{
	const int ch = blockIdx.x;
	double s, q, mean, var;
	bn_fold(part, ch, P, &s, &q);
	bn_moments(s, q, m, &mean, &var);
	if (threadIdx.x == 0) {
		stat[ch] = mean;
		stat[c + ch] = var;
	}
}

/* Training forward of chunk (ch, p): the fold, then y over the chunk (the
 * one-block kernel's affine and fused relu); block (ch, 0) updates the
 * running statistics and saves mean and variance into save (if any). */
__global__ void loom_bn_fwd_split_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					 const void *gamma, int gdt, const void *beta, int bdt,
					 void *rmean, int rmdt, void *rvar, int rvdt,
					 double momentum, double eps, int relu, const double *part,
					 double *save, void *y, int ydt)
{
	const int ch = blockIdx.x, p = blockIdx.y, P = gridDim.y;
	const int64_t m = (int64_t)n * hw;
	const double unbias = m > 1 ? (double)m / (double)(m - 1) : 1;
	double s, q, mean, var;
	bn_fold(part, ch, P, &s, &q);
	bn_moments(s, q, (double)m, &mean, &var);
	double g = gamma ? loom_ld(gamma, gdt, ch) : 1, bt = beta ? loom_ld(beta, bdt, ch) : 0;
	double scale = g / sqrt(var + eps);
	const float sc = (float)scale, sh = (float)(bt - mean * scale);
	int64_t k0, k1;
	bn_chunk(m, P, p, &k0, &k1);
	for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
		int64_t o = bn_index(c, hw, ch, k);
		float v = fmaf(loom_ld(x, xdt, o), sc, sh);
		loom_st(y, ydt, o, relu && v < 0.0f ? 0.0f : v);
	}
	if (p != 0 || threadIdx.x != 0)
		return;
	if (rmean)
		loom_st(rmean, rmdt, ch,
			(float)((1 - momentum) * loom_ld(rmean, rmdt, ch) + momentum * mean));
	if (rvar)
		loom_st(rvar, rvdt, ch,
			(float)((1 - momentum) * loom_ld(rvar, rvdt, ch) + momentum * var * unbias));
	if (save) {
		save[ch] = mean;
		save[c + ch] = var;
	}
}

/* Backward of chunk (ch, p) from the statistics and the dy partials: dx
 * over the chunk (dx non-NULL, the one-block kernel's formula); block
 * (ch, 0) writes dgamma and dbeta where asked. */
__global__ void loom_bn_bwd_split_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					 const void *gamma, int gdt, const void *dy, int dydt,
					 const void *ry, int rydt, double eps, const double *stat,
					 const double *part, void *dx, int dxdt, void *dg, int dgdt,
					 void *db, int dbdt)
{
	const int ch = blockIdx.x, p = blockIdx.y, P = gridDim.y;
	const int64_t m = (int64_t)n * hw;
	const double mean = stat[ch], var = stat[c + ch];
	double sdy, sdyx;
	bn_fold(part, ch, P, &sdy, &sdyx);
	const double istd = 1 / sqrt(var + eps);
	if (p == 0 && threadIdx.x == 0) {
		if (dg)
			loom_st(dg, dgdt, ch, (float)(sdyx * istd));
		if (db)
			loom_st(db, dbdt, ch, (float)sdy);
	}
	if (!dx)
		return;
	double kk = (gamma ? loom_ld(gamma, gdt, ch) : 1) * istd;
	double bb = -kk * (sdyx / (double)m) * istd * istd;
	double d = -kk * (sdy / (double)m) - bb * mean;
	const float a = (float)kk, b = (float)bb, dd = (float)d;
	int64_t k0, k1;
	bn_chunk(m, P, p, &k0, &k1);
	for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
		int64_t o = bn_index(c, hw, ch, k);
		/* dx may be y's or dy's bytes (the fused relu backward): each
		 * element is read before it is written, by the same thread. */
		float g = !ry || loom_ld(ry, rydt, o) > 0.0f ? loom_ld(dy, dydt, o) : 0.0f;
		float v = g * a + loom_ld(x, xdt, o) * b + dd;
		loom_st(dx, dxdt, o, v);
	}
}

// ----------------------------------------------------------------------------
// kernel launchers

static const int threads = 512;

/* The split kernels' chunk: about this many values of a channel per block,
 * at most LOOM_CUDA_BN_MAX_CHUNKS blocks per channel. */
#define LOOM_CUDA_BN_CHUNK 8192
#define LOOM_CUDA_BN_MAX_CHUNKS 64
static const int split_threads = 256;

static int bn_nchunks(int64_t m)
{
	int64_t p = (m + LOOM_CUDA_BN_CHUNK - 1) / LOOM_CUDA_BN_CHUNK;
	return p < 1 ? 1 : p > LOOM_CUDA_BN_MAX_CHUNKS ? LOOM_CUDA_BN_MAX_CHUNKS : (int)p;
}

size_t loom_cuda_bn_split_ws(const loom_plan *plan, loom_value v)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	if (x->shape.ndim != 4)
		return 0;
	const size_t c = (size_t)x->shape.dims[1];
	const int P = bn_nchunks(x->shape.dims[0] * x->shape.dims[2] * x->shape.dims[3]);
	/* [partials: c P pairs | statistics: mean, variance per channel] */
	return loom_cuda_align(sizeof(double) * (2 * c * (size_t)P + 2 * c));
}

/* The split kernels' launches. fwd: the statistics' partials, then the
 * forward (save: its slot, or NULL). bwd: the statistics (stat: the
 * forward's saved slot, or NULL: computed here into ws), the dy
 * partials, then dx (NULL: none), dgamma, dbeta (NULL: not asked). */
static loom_status bn_split_fwd(char *err, cudaStream_t s, int n, int c, int64_t hw,
				const loom_cuda_io *io, const loom_node *nd, double *ws,
				double *save)
{
	const int P = bn_nchunks((int64_t)n * hw);
	dim3 grid((unsigned)c, (unsigned)P);
	loom_bn_part_kernel<<<grid, split_threads, 0, s>>>(n, c, hw, io->src[0], io->dt[0], NULL,
							 0, NULL, 0, NULL, ws);
	loom_bn_fwd_split_kernel<<<grid, split_threads, 0, s>>>(
		n, c, hw, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2], io->dt[2],
		io->src[3], io->dt[3], io->src[4], io->dt[4], nd->a.bn.momentum, nd->a.bn.eps,
		nd->a.bn.relu, ws, save, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(err);
}

typedef struct bn_split_out {
	void *dx, *dg, *db;
	int dxdt, dgdt, dbdt;
	const void *ry; /* the fused relu backward's y, or NULL */
	int rydt;
} bn_split_out;

static loom_status bn_split_bwd(char *err, cudaStream_t s, int n, int c, int64_t hw,
				const void *x, int xdt, const void *gamma, int gdt, const void *dy,
				int dydt, double eps, double *ws, const double *stat,
				const bn_split_out *o)
{
	const int P = bn_nchunks((int64_t)n * hw);
	dim3 grid((unsigned)c, (unsigned)P);
	if (!stat) {
		double *st = ws + 2 * (size_t)c * P;
		loom_bn_part_kernel<<<grid, split_threads, 0, s>>>(n, c, hw, x, xdt, NULL, 0, NULL,
								 0, NULL, ws);
		loom_bn_stat_kernel<<<c, 32, 0, s>>>(c, (double)n * hw, P, ws, st);
		stat = st;
	}
	loom_bn_part_kernel<<<grid, split_threads, 0, s>>>(n, c, hw, x, xdt, dy, dydt, o->ry,
							 o->rydt, stat, ws);
	loom_bn_bwd_split_kernel<<<grid, split_threads, 0, s>>>(
		n, c, hw, x, xdt, gamma, gdt, dy, dydt, o->ry, o->rydt, eps, stat, ws, o->dx, o->dxdt,
		o->dg, o->dgdt, o->db, o->dbdt);
	return LOOM_CUDA_LAUNCHED(err);
}

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

/* Synchronised batch norm's sums: this rank's into the workspace, then the
 * first 1 + reduce * c of them summed over the ranks in stream order. No
 * process group (world 1, the test hook of engine/ddp.c): the sums are
 * already everyone's. */
static loom_status bn_sync_sums(loom_cuda_ctx *cx, const loom_plan *plan, loom_value v,
				const loom_cuda_io *io, int ndy, int reduce, double *w)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	const int c = (int)x->shape.dims[1];
	loom_bn_local_sums_kernel<<<c, threads, 0, cx->stream>>>(
		(int)x->shape.dims[0], c, x->shape.dims[2] * x->shape.dims[3], io->src[0],
		io->dt[0], ndy >= 0 ? io->src[ndy] : NULL, ndy >= 0 ? io->dt[ndy] : 0, w);
	loom_status st = LOOM_CUDA_LAUNCHED(cx->err);
	if (st != LOOM_OK || !plan->comm)
		return st;
	st = loom_comm_allreduce_ordered(plan->comm, w, 1 + (size_t)reduce * c, LOOM_F64,
					 (void *)cx->stream);
	if (st != LOOM_OK)
		return loom_errnf(cx->err, LOOM_ERR_MAX, st, "batch-norm node %d: all-reduce of its statistics: %s",
				 (int)v, loom_pg_error(plan->comm->pg));
	return LOOM_OK;
}

size_t loom_cuda_bn_sync_ws(const loom_plan *plan, loom_value v)
{
	const loom_node *n = &plan->g->nodes[v];
	if (!n->a.bn.sync)
		return 0;
	return loom_cuda_align(sizeof(double) *
			       (1 + 4 * (size_t)plan->g->nodes[n->src[0]].shape.dims[1]));
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
	const int nb = (int)x->shape.dims[0], ch = (int)x->shape.dims[1];
	const int64_t hw = x->shape.dims[2] * x->shape.dims[3];
	if (c->train && !n->a.bn.sync && ch > 0 && nb * hw > 0)
		return bn_split_fwd(c->err, c->stream, nb, ch, hw, io, n, (double *)c->arena->ws,
				    (double *)loom_cuda_saved_slot(c, v, v));
	if (!c->train || !n->a.bn.sync || ch <= 0)
		return loom_cuda_bn_fwd(c->err, c->stream, c->train, nb, ch, hw, io->src[0],
					io->dt[0], io->src[1], io->dt[1], io->src[2], io->dt[2],
					io->src[3], io->dt[3], io->src[4], io->dt[4],
					n->a.bn.momentum, n->a.bn.eps, n->a.bn.relu, io->out,
					io->odt);
	double *w = (double *)c->arena->ws;
	loom_status st = bn_sync_sums(c, plan, v, io, -1, 2, w);
	if (st != LOOM_OK)
		return st;
	loom_bn_fwd_apply_kernel<<<ch, threads, 0, c->stream>>>(
		nb, ch, hw, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2], io->dt[2],
		io->src[3], io->dt[3], io->src[4], io->dt[4], n->a.bn.momentum, n->a.bn.eps,
		n->a.bn.relu, w, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* The synchronised backward nodes: dx from (x, gamma, dy), dgamma from
 * (x, dy); as on the CPU, whatever the run's mode. */
static loom_status bn_bwd_sync(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			       const loom_cuda_io *io, int want_dx)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	const int nb = (int)x->shape.dims[0], ch = (int)x->shape.dims[1];
	const int ndy = want_dx ? 2 : 1;
	double *w = (double *)c->arena->ws;
	if (ch <= 0)
		return LOOM_OK;
	loom_status st = bn_sync_sums(c, plan, v, io, ndy, want_dx ? 4 : 2, w);
	if (st != LOOM_OK)
		return st;
	loom_bn_bwd_apply_kernel<<<ch, threads, 0, c->stream>>>(
		nb, ch, x->shape.dims[2] * x->shape.dims[3], io->src[0], io->dt[0],
		want_dx ? io->src[1] : NULL, want_dx ? io->dt[1] : 0, io->src[ndy], io->dt[ndy],
		n->a.bn.eps, w, want_dx ? io->out : NULL, io->odt, want_dx ? NULL : io->out,
		io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_bn_bwd_data(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				     const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
		return loom_cuda_bn_run(plan, c, v, &c->plans[v], c->train, io->src, io->out);
	if (n->a.bn.sync)
		return bn_bwd_sync(c, plan, v, io, 1);
	const loom_cuda_bn_plan *bp = &c->plans[v].bn;
	bn_split_out o = { io->out, NULL, NULL, io->odt, 0, 0, NULL, 0 };
	const void *dy = io->src[2];
	int dydt = io->dt[2];
	if (bp->relu_bwd != LOOM_NONE && loom_cuda_relu_fusion_on(c)) {
		/* The relu backward did nothing: its sources instead. */
		dy = loom_arena_ptr(c->arena, plan, bp->relu_dy);
		dydt = plan->g->nodes[bp->relu_dy].dtype;
		o.ry = loom_arena_ptr(c->arena, plan, bp->relu_y);
		o.rydt = plan->g->nodes[bp->relu_y].dtype;
	}
	if (bp->own_makes && bp->dgamma != LOOM_NONE) {
		o.dg = loom_arena_ptr(c->arena, plan, bp->dgamma);
		o.dgdt = plan->g->nodes[bp->dgamma].dtype;
	}
	if (bp->own_makes && bp->dbeta != LOOM_NONE) {
		o.db = loom_arena_ptr(c->arena, plan, bp->dbeta);
		o.dbdt = plan->g->nodes[bp->dbeta].dtype;
	}
	if (loom_shape_numel(&x->shape) <= 0)
		return LOOM_OK;
	return bn_split_bwd(c->err, c->stream, (int)x->shape.dims[0], (int)x->shape.dims[1],
			    x->shape.dims[2] * x->shape.dims[3], io->src[0], io->dt[0], io->src[1],
			    io->dt[1], dy, dydt, n->a.bn.eps, (double *)c->arena->ws,
			    c->train ? (const double *)loom_cuda_saved_slot(c, v, LOOM_NONE) : NULL,
			    &o);
}

loom_status loom_cuda_op_bn_bwd_gamma(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				      const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	if (n->a.bn.sync)
		return bn_bwd_sync(c, plan, v, io, 0);
	bn_split_out o = { NULL, io->out, NULL, 0, io->odt, 0, NULL, 0 };
	if (loom_shape_numel(&x->shape) <= 0)
		return LOOM_OK;
	return bn_split_bwd(c->err, c->stream, (int)x->shape.dims[0], (int)x->shape.dims[1],
			    x->shape.dims[2] * x->shape.dims[3], io->src[0], io->dt[0], NULL, 0,
			    io->src[1], io->dt[1], n->a.bn.eps, (double *)c->arena->ws,
			    c->train ? (const double *)loom_cuda_saved_slot(c, v, LOOM_NONE) : NULL,
			    &o);
}

/* --dump-graph: how a batch-norm node runs (cuDNN or which own kernels,
 * its saved slot, the Ex reserve and fusions), a batch norm or an add that
 * batch norm + add + relu runs, and a max-pool node's saved argmax (the
 * saved region's wording, shared); nothing for the other nodes. */
void loom_cuda_bn_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
		       size_t len)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	const loom_node *n = &p->g->nodes[v];
	int bn = n->op == LOOM_OP_BATCHNORM2D || n->op == LOOM_OP_BN_BWD_DATA ||
		 n->op == LOOM_OP_BN_BWD_GAMMA;
	if (np->bn_add_by != LOOM_NONE) {
		snprintf(buf, len, "cudnn Ex nhwc, done by %d (batch norm + add + relu) in training",
			 (int)np->bn_add_by);
		return;
	}
	if (np->bn_add != LOOM_NONE) {
		snprintf(buf, len, "cudnn Ex BN_ADD_ACTIVATION in training: batch norm %d + add + relu",
			 (int)np->bn_add);
		return;
	}
	if (!bn && n->op != LOOM_OP_MAXPOOL2D && n->op != LOOM_OP_MAXPOOL2D_BWD)
		return;
	const char *how = !bn ? "own kernel" :
			  np->kind == LOOM_CUDA_PLAN_BN ?
				  (np->bn.nhwc ? (np->bn.ex ? (np->bn.ex_ops == (int)CUDNN_BATCHNORM_OPS_BN_ACTIVATION ?
								       "cudnn Ex nhwc, relu fused" : "cudnn Ex nhwc") :
						     "cudnn nhwc") :
						(np->bn.ex ? "cudnn Ex, relu fused" : "cudnn")) :
			  n->a.bn.sync ? "own kernels, synchronised" : "own split kernels";
	const char *saved = np->saved_by == LOOM_NONE ? "" :
			    np->saved_by == v ? (bn ? ", saves its statistics" : ", saves its argmax") :
					       (bn ? ", reads the saved statistics" : ", reads the saved argmax");
	const char *ex = !np->bn.bwd_ex ? "" :
			 np->bn.fuse.ops == LOOM_CUDA_BN_EX_ACT ?
				 ", backward Ex BN_ACTIVATION with the forward's reserve, the relu backward fused" :
			 np->bn.fuse.ops == LOOM_CUDA_BN_EX_ADD_ACT ?
				 ", backward Ex BN_ADD_ACTIVATION with the forward's reserve, writes dz" :
				 ", backward Ex with the forward's reserve";
	snprintf(buf, len, "%s%s%s%s%s%s", how, saved,
		 np->bn.reserve_slot ? " and the Ex reserve" : "",
		 np->bn.own_makes ? ", writes dgamma and dbeta" : "",
		 np->bn.relu_bwd != LOOM_NONE ? ", the relu backward fused" : "", ex);
}
