/*
 * engine/cuda/layernorm.cu — layer norm over the last dim on the GPU: the
 * forward (one warp per row with 128-bit loads; a block per row past the
 * warp grid's launch limit), dx with dgamma and dbeta in one pass (its siblings,
 * graph/fuse.c), the separate dx and chunked dgamma kernels, dx added into
 * the residual's other gradient (graph/fuse.c's loom_fuse_ln_bwd_accum,
 * LOOM_CUDA_LN_BWD_ACCUM: every dx kernel takes the addend), and the
 * entries of LAYERNORM and its two backward ops. CPU twin:
 * engine/cpu/layernorm.c (same formulas, statistics in double). Status as
 * the rest of engine/cuda (README.md): run on an H200 through the GPU
 * suite, except the chunked gamma gradient, written after that run.
 */
#include <stdint.h>
#include <stdio.h>

#include "base/options.h"
#include "engine/cuda/dtype.cuh"

static const int threads = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

/* x rounded into dtype dt and read back: what a store then a load gives. */
static __device__ __forceinline__ float ln_round(int dt, float x)
{
	switch (dt) {
	case LOOM_F16: return __half2float(__float2half_rn(x));
	case LOOM_BF16: return __bfloat162float(__float2bfloat16_rn(x));
	default: return x;
	}
}

/* dx's value at element i, added into the addend acc where there is one
 * (LOOM_NODE_ACCUM): dx rounded into its dtype as the unfused node stored
 * it, then the addend added in fp32 as autodiff's sum (loom_add_kernel)
 * did; the caller stores the result in dx's dtype. acc may be dx itself
 * (the memory plan's in-place sum): each element is read before it is
 * written, by the thread that writes it. */
static __device__ __forceinline__ float ln_acc(const void *acc, int accdt, int dxdt, int64_t i,
					       float v)
{
	return acc ? loom_ld(acc, accdt, i) + ln_round(dxdt, v) : v;
}

/* m and the max |v[k]| as stored in dt (an FP8 cast's amax: the values
 * its reader loads), NaN-blind as the cast's own pass. */
template <int W>
static __device__ __forceinline__ float ln_vmax(int dt, const float v[W], float m)
{
#pragma unroll
	for (int k = 0; k < W; k++) {
		const float a = fabsf(loom_stored(dt, v[k]));
		m = a > m ? a : m;
	}
	return m;
}

/* Mean and 1 / sqrt(var + eps) of row r (every thread of the block). */
static __device__ void ln_stats(const void *x, int xdt, int64_t r, int c, double eps,
				double *mean, double *rstd)
{
	double s = 0;
	for (int j = threadIdx.x; j < c; j += blockDim.x)
		s += loom_ld(x, xdt, r * c + j);
	double m = loom_block_sum(s) / c, ss = 0;
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		double d = loom_ld(x, xdt, r * c + j) - m;
		ss += d * d;
	}
	*mean = m;
	*rstd = 1.0 / sqrt(loom_block_sum(ss) / c + eps);
}

/* One block per row; amax not NULL: the max |y| stored into it
 * (loom_amax_commit, an FP8 cast's amax: fp8.cu). */
__global__ void loom_layernorm_fwd_kernel(int c, const void *x, int xdt, const void *g, int gdt,
					  const void *b, int bdt, double eps, void *y, int ydt,
					  unsigned *amax)
{
	const int64_t r = blockIdx.x;
	double m, rs;
	float ym = 0.0f;
	ln_stats(x, xdt, r, c, eps, &m, &rs);
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		const float v = (float)((loom_ld(x, xdt, r * c + j) - m) * rs * loom_ld(g, gdt, j) +
					loom_ld(b, bdt, j));
		const float a = fabsf(loom_stored(ydt, v));
		ym = a > ym ? a : ym;
		loom_st(y, ydt, r * c + j, v);
	}
	loom_amax_commit(amax, ym);
}

/* One block per row: dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat));
 * amax not NULL: the max |dx| stored (after the addend) into it
 * (loom_amax_commit: an FP8 cast's amax, fp8.cu). */
__global__ void loom_layernorm_bwd_data_kernel(int c, const void *x, int xdt, const void *g,
					       int gdt, const void *dy, int dydt, double eps,
					       void *dx, int dxdt, const void *acc, int accdt,
					       unsigned *amax)
{
	const int64_t r = blockIdx.x;
	double m, rs, a = 0, b = 0;
	ln_stats(x, xdt, r, c, eps, &m, &rs);
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		double gd = (double)loom_ld(g, gdt, j) * loom_ld(dy, dydt, r * c + j);
		a += gd;
		b += gd * (loom_ld(x, xdt, r * c + j) - m) * rs;
	}
	a = loom_block_sum(a) / c;
	b = loom_block_sum(b) / c;
	float ym = 0.0f;
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		double xh = (loom_ld(x, xdt, r * c + j) - m) * rs;
		double gd = (double)loom_ld(g, gdt, j) * loom_ld(dy, dydt, r * c + j);
		const float d = ln_acc(acc, accdt, dxdt, r * c + j, (float)(rs * (gd - a - xh * b)));
		ym = ln_vmax<1>(dxdt, &d, ym);
		loom_st(dx, dxdt, r * c + j, d);
	}
	loom_amax_commit(amax, ym);
}

/* One block per row: its mean and rstd into stats[2r], stats[2r + 1]. */
__global__ void loom_layernorm_stats_kernel(int c, const void *x, int xdt, double eps,
					    double *stats)
{
	const int64_t r = blockIdx.x;
	double m, rs;
	ln_stats(x, xdt, r, c, eps, &m, &rs);
	if (threadIdx.x == 0) {
		stats[2 * r] = m;
		stats[2 * r + 1] = rs;
	}
}

/* dgamma[j] = sum over rows of dy xhat, in double, through dtype.cuh's
 * column sums (loom_colsum_part, then loom_colsum_fold_kernel): the order
 * of additions depends only on the shape (deterministic, as the CPU's
 * is). One thread per column over all rows (the first version) ran 768
 * threads for GPT-2: 75 of 166 ms of its step on an H200. */
__global__ void loom_layernorm_bwd_gamma_part_kernel(int64_t rows, int64_t per, int c,
						     const void *x, int xdt, const void *dy,
						     int dydt, const double *stats, double *part)
{
	const auto term = [=](int64_t r, int j) {
		return (double)loom_ld(dy, dydt, r * c + j) *
		       (loom_ld(x, xdt, r * c + j) - stats[2 * r]) * stats[2 * r + 1];
	};
	loom_colsum_part<double>(rows, per, c, term, part);
}

/* The chunking of loom_layernorm_bwd_gamma_part_kernel: at most
 * LOOM_LN_CHUNKS chunks of at least 32 rows (4 per thread row). */
#define LOOM_LN_CHUNKS 256
static void ln_chunks(int64_t rows, int64_t *per, int *chunks)
{
	int64_t p = (rows + LOOM_LN_CHUNKS - 1) / LOOM_LN_CHUNKS;
	if (p < 32)
		p = 32;
	*per = p;
	*chunks = (int)((rows + p - 1) / p);
}

/*
 * Layer norm, one pass per row each way (the kernels above where a row or
 * the grid is too large for these). Rows are read W elements at a
 * time: W = 8 (128-bit loads of f16/bf16, two float4 of f32) where the
 * last dim is a multiple of 8 and every pointer 16-byte aligned, else 1.
 * Statistics and sums in double, as above and on the CPU.
 */
template <int W>
static __device__ __forceinline__ void ln_ldv(const void *p, int dt, int64_t i, float v[W])
{
	if constexpr (W == 8) {
		if (dt == LOOM_F32) {
			const float4 a = *(const float4 *)((const float *)p + i);
			const float4 b = *(const float4 *)((const float *)p + i + 4);
			v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
			v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
		} else if (dt == LOOM_F16) {
			const uint4 u = *(const uint4 *)((const __half *)p + i);
			const __half *h = (const __half *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				v[k] = __half2float(h[k]);
		} else {
			const uint4 u = *(const uint4 *)((const __nv_bfloat16 *)p + i);
			const __nv_bfloat16 *h = (const __nv_bfloat16 *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				v[k] = __bfloat162float(h[k]);
		}
	} else {
#pragma unroll
		for (int k = 0; k < W; k++)
			v[k] = loom_ld(p, dt, i + k);
	}
}

template <int W>
static __device__ __forceinline__ void ln_stv(void *p, int dt, int64_t i, const float v[W])
{
	if constexpr (W == 8) {
		if (dt == LOOM_F32) {
			*(float4 *)((float *)p + i) = make_float4(v[0], v[1], v[2], v[3]);
			*(float4 *)((float *)p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
		} else if (dt == LOOM_F16) {
			uint4 u;
			__half *h = (__half *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				h[k] = __float2half_rn(v[k]);
			*(uint4 *)((__half *)p + i) = u;
		} else {
			uint4 u;
			__nv_bfloat16 *h = (__nv_bfloat16 *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				h[k] = __float2bfloat16_rn(v[k]);
			*(uint4 *)((__nv_bfloat16 *)p + i) = u;
		}
	} else {
#pragma unroll
		for (int k = 0; k < W; k++)
			loom_st(p, dt, i + k, v[k]);
	}
}

/* ln_acc over W elements from i: the addend read with the row's loads. */
template <int W>
static __device__ __forceinline__ void ln_accv(const void *acc, int accdt, int dxdt, int64_t i,
					       float v[W])
{
	if (!acc)
		return;
	float a[W];
	ln_ldv<W>(acc, accdt, i, a);
#pragma unroll
	for (int k = 0; k < W; k++)
		v[k] = a[k] + ln_round(dxdt, v[k]);
}

static __device__ __forceinline__ double warp_sum(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* The backward's loads at column j of row o (element o + j): x, dy and
 * gamma, W of each. */
template <int W>
static __device__ __forceinline__ void ln_bwd_ldv(const void *x, int xdt, const void *dy, int dydt,
						  const void *g, int gdt, int64_t o, int j,
						  float xv[W], float dv[W], float gv[W])
{
	ln_ldv<W>(x, xdt, o + j, xv);
	ln_ldv<W>(dy, dydt, o + j, dv);
	ln_ldv<W>(g, gdt, j, gv);
}

/* The rest of a warp's row r once its mean m is known: rstd (a second
 * pass, from L1), the saved statistics, y = (x - mean) rstd gamma + beta;
 * the lane's max |y| as stored, returned (an FP8 cast's amax). */
template <int W>
static __device__ __forceinline__ float ln_warp_finish(int64_t r, int c, int lane, const void *x,
						       int xdt, double m, const void *g, int gdt,
						       const void *b, int bdt, double eps, void *y,
						       int ydt, double *stats)
{
	float ym = 0.0f;
	const int64_t o = r * c;
	float v[W], gv[W], bv[W];
	double ss = 0;
	for (int j = lane * W; j < c; j += 32 * W) {
		ln_ldv<W>(x, xdt, o + j, v);
#pragma unroll
		for (int k = 0; k < W; k++)
			ss += (v[k] - m) * (v[k] - m);
	}
	const double rs = 1.0 / sqrt(warp_sum(ss) / c + eps);
	if (stats && lane == 0) { /* saved for the backward */
		stats[2 * r] = m;
		stats[2 * r + 1] = rs;
	}
	for (int j = lane * W; j < c; j += 32 * W) {
		ln_ldv<W>(x, xdt, o + j, v);
		ln_ldv<W>(g, gdt, j, gv);
		ln_ldv<W>(b, bdt, j, bv);
#pragma unroll
		for (int k = 0; k < W; k++) {
			v[k] = (float)((v[k] - m) * rs * gv[k] + bv[k]);
			const float a = fabsf(loom_stored(ydt, v[k]));
			ym = a > ym ? a : ym;
		}
		ln_stv<W>(y, ydt, o + j, v);
	}
	return ym;
}

/* One warp per row, both forward warp kernels': row r's W values from
 * column j by ld(r c + j, v) (the sum as stored, for the residual kernel)
 * into the row's total, the mean, then ln_warp_finish over xs (the row as
 * ld left it); amax not NULL: the block's max |y| into it
 * (loom_amax_commit: every thread of the block takes part, a warp past
 * the last row with 0). */
template <int W, typename Ld>
static __device__ __forceinline__ void ln_fwd_warp_rows(int64_t rows, int c, Ld ld, const void *xs,
							int xsdt, const void *g, int gdt,
							const void *b, int bdt, double eps, void *y,
							int ydt, double *stats, unsigned *amax)
{
	const int lane = threadIdx.x & 31;
	const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	float ym = 0.0f;
	if (r < rows) {
		float v[W];
		double s = 0;
		for (int j = lane * W; j < c; j += 32 * W) {
			ld(r * c + j, v);
#pragma unroll
			for (int k = 0; k < W; k++)
				s += v[k];
		}
		ym = ln_warp_finish<W>(r, c, lane, xs, xsdt, warp_sum(s) / c, g, gdt, b, bdt, eps, y,
				       ydt, stats);
	}
	loom_amax_commit(amax, ym);
}

/* One warp per row: ln_fwd_warp_rows over x. */
template <int W>
__global__ void loom_layernorm_fwd_warp_kernel(int64_t rows, int c, const void *x, int xdt,
					       const void *g, int gdt, const void *b, int bdt,
					       double eps, void *y, int ydt, double *stats,
					       unsigned *amax)
{
	ln_fwd_warp_rows<W>(
		rows, c, [&](int64_t i, float v[W]) { ln_ldv<W>(x, xdt, i, v); }, x, xdt, g, gdt, b,
		bdt, eps, y, ydt, stats, amax);
}

/*
 * The residual add with the layer norm that reads it (graph/fuse.c's
 * loom_fuse_ln_residual; llm.c's fused_residual_forward), one warp per
 * row: sum = a + b in fp32, stored in the sum's dtype (as
 * loom_add_kernel), each lane reading back what it stored (the rounded
 * value the layer norm reads unfused) into the row's total; then
 * ln_warp_finish over the stored sum, the forward warp kernel's own
 * arithmetic (ln_fwd_warp_rows; amax: the layer norm's y, as there).
 * LOOM_CUDA_LN_RESIDUAL; never run on a GPU yet.
 */
template <int W>
__global__ void loom_ln_residual_fwd_kernel(int64_t rows, int c, const void *a, int adt,
					    const void *b, int bdt, void *sum, int sdt,
					    const void *g, int gdt, const void *beta, int betadt,
					    double eps, void *y, int ydt, double *stats,
					    unsigned *amax)
{
	const auto add = [&](int64_t i, float v[W]) {
		float w[W];
		ln_ldv<W>(a, adt, i, v);
		ln_ldv<W>(b, bdt, i, w);
#pragma unroll
		for (int k = 0; k < W; k++)
			v[k] += w[k];
		ln_stv<W>(sum, sdt, i, v);
		ln_ldv<W>(sum, sdt, i, v);
	};
	ln_fwd_warp_rows<W>(rows, c, add, sum, sdt, g, gdt, beta, betadt, eps, y, ydt, stats,
			    amax);
}

/*
 * dx, dgamma and dbeta in one pass over x and dy: block k takes the rows
 * of chunk k (ln_chunks) one after the other, all its threads on a row;
 * each thread owns the same columns in every row, so it adds the chunk's
 * dy xhat and dy into its own columns of shared memory (acc: 2c doubles)
 * with no atomics, in row order; the chunks' parts go to part_g, part_b
 * ([chunks, c]) and loom_colsum_fold_kernel adds them in
 * chunk order. Every sum's order depends only on the shape: the same bits
 * every run. The row's statistics are recomputed from the row the block
 * reads anyway (no saved mean/rstd to keep alive between the passes); the
 * passes after the first over a row are meant to hit the cache.
 */
static const int ln_bwd_threads = 128;
/* 2c doubles of shared memory (32 KiB), with the block sums' own under the
 * 48 KiB a launch gets without opting in. */
#define LOOM_LN_FUSED_MAX_C 2048

template <int W>
__global__ void loom_layernorm_bwd_fused_kernel(int64_t rows, int64_t per, int c, const void *x,
						int xdt, const void *g, int gdt, const void *dy,
						int dydt, double eps, void *dx, int dxdt,
						double *part_g, double *part_b, const double *stats,
						const void *addend, int addt, unsigned *amax)
{
	extern __shared__ double acc[];
	float ym = 0.0f; /* the max |dx| stored: an FP8 cast's amax */
	const int64_t k = blockIdx.x, r0 = k * per, r1 = r0 + per < rows ? r0 + per : rows;
	const int step = blockDim.x * W;
	float xv[W], dv[W], gv[W];
	for (int j = threadIdx.x * W; j < c; j += step)
#pragma unroll
		for (int q = 0; q < W; q++)
			acc[j + q] = acc[c + j + q] = 0;
	for (int64_t r = r0; r < r1; r++) {
		const int64_t o = r * c;
		double s = 0, ss = 0, a = 0, b = 0, m, rs;
		if (stats) { /* saved by the forward */
			m = stats[2 * r];
			rs = stats[2 * r + 1];
		} else {
			for (int j = threadIdx.x * W; j < c; j += step) {
				ln_ldv<W>(x, xdt, o + j, xv);
#pragma unroll
				for (int q = 0; q < W; q++)
					s += xv[q];
			}
			m = loom_block_sum(s) / c;
			for (int j = threadIdx.x * W; j < c; j += step) {
				ln_ldv<W>(x, xdt, o + j, xv);
#pragma unroll
				for (int q = 0; q < W; q++)
					ss += (xv[q] - m) * (xv[q] - m);
			}
			rs = 1.0 / sqrt(loom_block_sum(ss) / c + eps);
		}
		for (int j = threadIdx.x * W; j < c; j += step) {
			ln_bwd_ldv<W>(x, xdt, dy, dydt, g, gdt, o, j, xv, dv, gv);
#pragma unroll
			for (int q = 0; q < W; q++) {
				const double xh = (xv[q] - m) * rs, gd = (double)gv[q] * dv[q];
				a += gd;
				b += gd * xh;
				acc[j + q] += (double)dv[q] * xh;
				acc[c + j + q] += dv[q];
			}
		}
		a = loom_block_sum(a) / c;
		b = loom_block_sum(b) / c;
		for (int j = threadIdx.x * W; j < c; j += step) {
			ln_bwd_ldv<W>(x, xdt, dy, dydt, g, gdt, o, j, xv, dv, gv);
#pragma unroll
			for (int q = 0; q < W; q++) {
				const double xh = (xv[q] - m) * rs, gd = (double)gv[q] * dv[q];
				xv[q] = (float)(rs * (gd - a - xh * b));
			}
			ln_accv<W>(addend, addt, dxdt, o + j, xv);
			ym = ln_vmax<W>(dxdt, xv, ym);
			ln_stv<W>(dx, dxdt, o + j, xv);
		}
	}
	for (int j = threadIdx.x * W; j < c; j += step)
#pragma unroll
		for (int q = 0; q < W; q++) {
			part_g[k * c + j + q] = acc[j + q];
			part_b[k * c + j + q] = acc[c + j + q];
		}
	loom_amax_commit(amax, ym);
}

/*
 * LOOM_CUDA_LN_BWD=warp: dx, dgamma and dbeta in fp32, one warp per row
 * (llm.c's layout, our own code). Warp k of the grid takes rows
 * [k per, (k + 1) per) one after the other; lane l owns the same columns
 * of every row (G groups of W: columns (q 32 + l) W ... + W - 1), so its
 * share of dgamma and dbeta stays in registers across the rows. The row's
 * mean and rstd are the forward's (saved) or recomputed in fp32. At the
 * end the block's warps add their registers into shared memory in warp
 * order and the block writes one part of 2c floats (dgamma's c, then
 * dbeta's); loom_layernorm_bwd_warp_fold_kernel
 * adds the parts in block order: the same bits every run, two launches
 * per layer norm (the one-pass kernel above takes three, in double).
 * Columns up to 32 W G (1024 for both instantiations); wider rows keep
 * the one-pass kernel.
 */
static const int ln_warp_threads = 256;
#define LOOM_LN_WARP_MAX_C 1024
#define LOOM_LN_WARP_PARTS 2048 /* at most this many warps over the rows */

static __device__ __forceinline__ float warp_sum_f(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* A lane's column groups q < G that lie in the row (c columns): f(j),
 * j = (q 32 + lane) W the group's first column; the loop unrolled U
 * times. */
template <int W, int G, int U, typename F>
static __device__ __forceinline__ void ln_lane_cols(int c, int lane, F f)
{
#pragma unroll(U)
	for (int q = 0; q < G; q++) {
		const int j = (q * 32 + lane) * W;
		if (j < c)
			f(j);
	}
}

/* The row's mean and rstd in fp32 (two passes, the second from L1). */
template <int W, int G>
static __device__ void ln_row_stats_f(const void *x, int xdt, int64_t o, int c, float eps,
				      int lane, float *mean, float *rstd)
{
	float v[W], s = 0, ss = 0;
	ln_lane_cols<W, G, G>(c, lane, [&](int j) {
		ln_ldv<W>(x, xdt, o + j, v);
#pragma unroll
		for (int k = 0; k < W; k++)
			s += v[k];
	});
	const float m = warp_sum_f(s) / c;
	ln_lane_cols<W, G, G>(c, lane, [&](int j) {
		ln_ldv<W>(x, xdt, o + j, v);
#pragma unroll
		for (int k = 0; k < W; k++)
			ss += (v[k] - m) * (v[k] - m);
	});
	*mean = m;
	*rstd = rsqrtf(warp_sum_f(ss) / c + eps);
}

template <int W, int G>
__global__ void loom_layernorm_bwd_warp_kernel(int64_t rows, int64_t per, int c, const void *x,
					       int xdt, const void *g, int gdt, const void *dy,
					       int dydt, float eps, void *dx, int dxdt,
					       const double *stats, float *part, const void *acc,
					       int accdt, unsigned *amax)
{
	extern __shared__ float sacc[]; /* 2c: the block's dgamma, then dbeta */
	float ym = 0.0f; /* the max |dx| stored: an FP8 cast's amax */
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
	const int64_t r0 = ((int64_t)blockIdx.x * nwarps + warp) * per;
	const int64_t r1 = r0 + per < rows ? r0 + per : rows;
	float dg[G * W], db[G * W], xv[W], dv[W], gv[W];
#pragma unroll
	for (int k = 0; k < G * W; k++)
		dg[k] = db[k] = 0;
	for (int64_t r = r0; r < r1; r++) {
		const int64_t o = r * c;
		float m, rs, a = 0, b = 0;
		if (stats) {
			m = (float)stats[2 * r];
			rs = (float)stats[2 * r + 1];
		} else {
			ln_row_stats_f<W, G>(x, xdt, o, c, eps, lane, &m, &rs);
		}
		/* Its own loop over q (q indexes dg and db), not ln_lane_cols:
		 * through the lambda nvcc unrolled it otherwise (the kernel some
		 * 3 times smaller, neither version measured). */
#pragma unroll
		for (int q = 0; q < G; q++) {
			const int j = (q * 32 + lane) * W;
			if (j >= c)
				continue;
			ln_bwd_ldv<W>(x, xdt, dy, dydt, g, gdt, o, j, xv, dv, gv);
#pragma unroll
			for (int k = 0; k < W; k++) {
				const float xh = (xv[k] - m) * rs, gd = gv[k] * dv[k];
				a += gd;
				b += gd * xh;
				dg[q * W + k] += dv[k] * xh;
				db[q * W + k] += dv[k];
			}
		}
		a = warp_sum_f(a) / c;
		b = warp_sum_f(b) / c;
		/* This loop keeps nothing in registers across q, so the scalar
		 * kernel (W = 1, G = 32) leaves it rolled: unrolled 32 times with
		 * the loads' and the addend's dtype switches, its PTX alone was
		 * 520k lines and the file took over 25 minutes to compile. */
		ln_lane_cols<W, G, W == 1 ? 1 : G>(c, lane, [&](int j) {
			ln_bwd_ldv<W>(x, xdt, dy, dydt, g, gdt, o, j, xv, dv, gv);
#pragma unroll
			for (int k = 0; k < W; k++)
				xv[k] = rs * (gv[k] * dv[k] - a - (xv[k] - m) * rs * b);
			ln_accv<W>(acc, accdt, dxdt, o + j, xv);
			ym = ln_vmax<W>(dxdt, xv, ym);
			ln_stv<W>(dx, dxdt, o + j, xv);
		});
	}
	/* The warps' registers into shared memory, warp 0 first. */
	for (int w = 0; w < nwarps; w++) {
		if (w == warp)
#pragma unroll
			for (int q = 0; q < G; q++) {
				const int j = (q * 32 + lane) * W;
				if (j >= c)
					continue;
#pragma unroll
				for (int k = 0; k < W; k++) {
					sacc[j + k] = w ? sacc[j + k] + dg[q * W + k] : dg[q * W + k];
					sacc[c + j + k] = w ? sacc[c + j + k] + db[q * W + k] :
							      db[q * W + k];
				}
			}
		__syncthreads();
	}
	for (int j = threadIdx.x; j < 2 * c; j += blockDim.x)
		part[(int64_t)blockIdx.x * 2 * c + j] = sacc[j];
	loom_amax_commit(amax, ym);
}

static const int ln_cols = 32, ln_lanes = 8;

/* The blocks' parts added in block order: block x of 32 x 8 threads takes
 * 32 of the 2c columns, thread row y the parts y, y + 8, ...; then row 0
 * adds the 8 sums in y order. Column j < c is dgamma[j], else dbeta[j - c]
 * (either may be absent: NULL). */
__global__ void loom_layernorm_bwd_warp_fold_kernel(int nparts, int c, const float *part,
						    void *dg, int dgdt, void *db, int dbdt)
{
	__shared__ float sh[ln_lanes][ln_cols + 1];
	const int j = blockIdx.x * ln_cols + threadIdx.x;
	float s = 0;
	if (j < 2 * c)
		for (int k = threadIdx.y; k < nparts; k += ln_lanes)
			s += part[(int64_t)k * 2 * c + j];
	sh[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y || j >= 2 * c)
		return;
	float t = 0;
	for (int y = 0; y < ln_lanes; y++)
		t += sh[y][threadIdx.x];
	if (j < c && dg)
		loom_st(dg, dgdt, j, t);
	else if (j >= c && db)
		loom_st(db, dbdt, j - c, t);
}

// ----------------------------------------------------------------------------
// kernel launchers and op entries

/* LOOM_CUDA_LN_BWD=warp (default legacy), read when a plan is made: the
 * one-pass backward through loom_layernorm_bwd_warp_kernel (fp32, a warp
 * per row) where the row fits, instead of the block-per-chunk kernel in
 * double. Compiled, not yet run on a GPU. */
int loom_cuda_ln_bwd_warp_on;

/* LAYERNORM_BWD_GAMMA's workspace: the rows' statistics, then the chunks'
 * parts. */
size_t loom_cuda_ln_bwd_gamma_ws(const loom_plan *p, loom_value v)
{
	const loom_shape *xs = &loom_cuda_src(p, v, 0)->shape;
	int64_t rows = loom_shape_rows(xs), per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	return loom_cuda_align(2 * sizeof(double) * (size_t)rows) +
	       sizeof(double) * (size_t)chunks * (size_t)loom_shape_last(xs);
}

/* 128-bit loads fit: the last dim a multiple of 8, every pointer aligned. */
static int ln_vec8(int cc, const void *const *p, int np)
{
	if (cc % 8)
		return 0;
	for (int i = 0; i < np; i++)
		if ((uintptr_t)p[i] % 16)
			return 0;
	return 1;
}

static loom_status layernorm_fwd_warp(loom_cuda_ctx *c, int64_t rows, int cc, double eps,
				      const loom_cuda_io *io, double *stats, unsigned *amax)
{
	const void *ptrs[4] = { io->src[0], io->src[1], io->src[2], io->out };
	const int per_block = threads / 32;
	const unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
	if (ln_vec8(cc, ptrs, 4))
		loom_layernorm_fwd_warp_kernel<8><<<blocks, threads, 0, c->stream>>>(
			rows, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], eps, io->out, io->odt, stats, amax);
	else
		loom_layernorm_fwd_warp_kernel<1><<<blocks, threads, 0, c->stream>>>(
			rows, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], eps, io->out, io->odt, stats, amax);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* A grid of rows / 8 blocks: within the launch limit up to 2^34 rows. */
static int ln_fwd_warp_fits(int64_t rows)
{
	return rows / (threads / 32) < 2147483647LL;
}

/* Node w's rows to launch over, its FP8 cast's amax begun into *amax
 * (fp8.cu; NULL: none): 0 where there are none or *st is not LOOM_OK. */
static int64_t ln_rows_begin(loom_cuda_ctx *c, const loom_plan *p, loom_value w,
			     unsigned **amax, loom_status *st)
{
	*amax = NULL;
	*st = loom_cuda_fp8_amax_begin(c, w, amax);
	return *st == LOOM_OK ? loom_shape_rows(&loom_cuda_node(p, w)->shape) : 0;
}

loom_status loom_cuda_op_layernorm(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	const loom_node *n = loom_cuda_node(plan, v);
	unsigned *amax;
	loom_status st;
	const int64_t rows = ln_rows_begin(c, plan, v, &amax, &st);
	if (rows <= 0)
		return st;
	if (ln_fwd_warp_fits(rows))
		return layernorm_fwd_warp(c, rows, (int)loom_shape_last(&n->shape), n->a.ln.eps, io,
					  (double *)loom_cuda_saved_slot(c, v, v), amax);
	loom_layernorm_fwd_kernel<<<(unsigned)rows, threads, 0, c->stream>>>(
		(int)loom_shape_last(&n->shape), io->src[0], io->dt[0], io->src[1], io->dt[1],
		io->src[2], io->dt[2], n->a.ln.eps, io->out, io->odt, amax);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* LOOM_CUDA_LN_RESIDUAL's launcher: rows of c, the sum's pointers and
 * dtypes in s (a, b, sum), the layer norm's in n (gamma, beta, y). */
typedef struct ln_residual_ptrs {
	const void *a, *b, *g, *beta;
	void *sum, *y;
	int adt, bdt, sdt, gdt, betadt, ydt;
} ln_residual_ptrs;

static loom_status ln_residual_fwd(char *err, cudaStream_t stream, int64_t rows, int cc,
				   double eps, const ln_residual_ptrs *q, double *stats,
				   unsigned *amax)
{
	const void *ptrs[6] = { q->a, q->b, q->sum, q->g, q->beta, q->y };
	const int per_block = threads / 32;
	const unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
	if (ln_vec8(cc, ptrs, 6))
		loom_ln_residual_fwd_kernel<8><<<blocks, threads, 0, stream>>>(
			rows, cc, q->a, q->adt, q->b, q->bdt, q->sum, q->sdt, q->g, q->gdt, q->beta,
			q->betadt, eps, q->y, q->ydt, stats, amax);
	else
		loom_ln_residual_fwd_kernel<1><<<blocks, threads, 0, stream>>>(
			rows, cc, q->a, q->adt, q->b, q->bdt, q->sum, q->sdt, q->g, q->gdt, q->beta,
			q->betadt, eps, q->y, q->ydt, stats, amax);
	return LOOM_CUDA_LAUNCHED(err);
}

static int ln_residual_dtype(loom_dtype dt)
{
	return dt == LOOM_F32 || dt == LOOM_F16 || dt == LOOM_BF16;
}

/* Compile time (the backend's ln_residual_fusable): LOOM_CUDA_LN_RESIDUAL
 * on, float dtypes the kernel reads, rows within one grid. */
int loom_cuda_ln_residual_fusable(const loom_graph *g, loom_value a, loom_value ln)
{
	const loom_node *an = &g->nodes[a], *l = &g->nodes[ln];
	if (!loom_opt_bool(LOOM_OPT_CUDA_LN_RESIDUAL) || loom_shape_last(&l->shape) <= 0 ||
	    loom_shape_rows(&l->shape) / (threads / 32) >= 2147483647LL)
		return 0;
	const loom_value v[6] = { a, an->src[0], an->src[1], ln, l->src[1], l->src[2] };
	for (int i = 0; i < 6; i++)
		if (!ln_residual_dtype((loom_dtype)g->nodes[v[i]].dtype))
			return 0;
	return 1;
}

/* The layer norm add node v makes (graph/fuse.c), else LOOM_NONE. */
static loom_value ln_of_add(const loom_plan *p, loom_value v)
{
	if (v == LOOM_NONE || loom_cuda_node(p, v)->op != LOOM_OP_ADD)
		return LOOM_NONE;
	for (loom_value w = loom_sibling_first(p, v); w != LOOM_NONE; w = loom_sibling_next(p, w))
		if (loom_cuda_node(p, w)->op == LOOM_OP_LAYERNORM)
			return w;
	return LOOM_NONE;
}

int loom_cuda_ln_residual_makes(const loom_plan *p, loom_value v, loom_value w)
{
	return w != LOOM_NONE && ln_of_add(p, v) == w;
}

int loom_cuda_ln_residual(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
			  const loom_cuda_io *io, loom_status *st)
{
	const loom_value w = ln_of_add(p, v);
	if (w == LOOM_NONE)
		return 0;
	const loom_node *l = loom_cuda_node(p, w);
	ln_residual_ptrs q = {
		.a = io->src[0], .b = io->src[1],
		.g = loom_arena_ptr(c->arena, p, l->src[1]),
		.beta = loom_arena_ptr(c->arena, p, l->src[2]),
		.sum = io->out, .y = loom_arena_ptr(c->arena, p, w),
		.adt = io->dt[0], .bdt = io->dt[1], .sdt = io->odt,
		.gdt = loom_cuda_src(p, w, 1)->dtype, .betadt = loom_cuda_src(p, w, 2)->dtype,
		.ydt = l->dtype,
	};
	unsigned *amax; /* the layer norm's FP8 amax */
	const int64_t rows = ln_rows_begin(c, p, w, &amax, st);
	if (rows > 0)
		*st = ln_residual_fwd(c->err, c->stream, rows, (int)loom_shape_last(&l->shape),
				      l->a.ln.eps, &q, (double *)loom_cuda_saved_slot(c, w, w), amax);
	return 1;
}

/* Compile time (the backend's ln_bwd_accum_fusable): LOOM_CUDA_LN_BWD_ACCUM
 * on, and float dtypes the kernels read; every dx kernel (the warp, the
 * one-pass and the block-per-row one) takes the addend. */
int loom_cuda_ln_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other)
{
	const loom_node *dn = &g->nodes[d];
	/* layer norm's only: RMS norm has no CUDA kernel (the rule asks for both) */
	if (dn->op != LOOM_OP_LAYERNORM_BWD_DATA || !loom_opt_bool(LOOM_OPT_CUDA_LN_BWD_ACCUM) ||
	    loom_shape_last(&dn->shape) <= 0)
		return 0;
	const loom_value v[6] = { d, dn->src[0], dn->src[1], dn->src[2], s, g->nodes[s].src[other] };
	for (int i = 0; i < 6; i++)
		if (!ln_residual_dtype((loom_dtype)g->nodes[v[i]].dtype))
			return 0;
	return 1;
}

/* The fused backward's chunk parts: dgamma's, then dbeta's. */
static size_t ln_fused_ws(int64_t rows, int cc)
{
	int64_t per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	return 2 * loom_cuda_align(sizeof(double) * (size_t)chunks * (size_t)cc);
}

/* The warp backward's geometry: rows per warp, blocks of
 * ln_warp_threads / 32 warps (each block writes one part). */
static int ln_warp_fits(int64_t cc)
{
	return loom_cuda_ln_bwd_warp_on && cc > 0 && cc <= LOOM_LN_WARP_MAX_C;
}

static void ln_warp_grid(int64_t rows, int64_t *per, unsigned *blocks)
{
	const int64_t wpb = ln_warp_threads / 32;
	int64_t p = (rows + LOOM_LN_WARP_PARTS - 1) / LOOM_LN_WARP_PARTS;
	if (p < 1)
		p = 1;
	*per = p;
	*blocks = (unsigned)(((rows + p - 1) / p + wpb - 1) / wpb);
}

static size_t ln_warp_ws(int64_t rows, int cc)
{
	int64_t per;
	unsigned blocks;
	ln_warp_grid(rows, &per, &blocks);
	return loom_cuda_align(sizeof(float) * 2 * (size_t)cc * blocks);
}

loom_status loom_cuda_ln_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np)
{
	const loom_node *n = loom_cuda_node(p, v);
	const int64_t rows = loom_shape_rows(&n->shape), cc = loom_shape_last(&n->shape);
	(void)c;
	np->ln.dgamma = np->ln.dbeta = LOOM_NONE;
	np->ln.warp = 0;
	np->ws = 0;
	if (rows <= 0 || cc <= 0 || cc > LOOM_LN_FUSED_MAX_C)
		return LOOM_OK; /* the separate kernels */
	/* dgamma and dbeta, where graph/fuse.c made them this node's siblings. */
	for (loom_value w = loom_sibling_first(p, v); w != LOOM_NONE; w = loom_sibling_next(p, w)) {
		const loom_node *s = loom_cuda_node(p, w);
		if (s->op == LOOM_OP_LAYERNORM_BWD_GAMMA)
			np->ln.dgamma = w;
		else if (s->op == LOOM_OP_CHANNEL_SUM)
			np->ln.dbeta = w;
	}
	np->kind = LOOM_CUDA_PLAN_LN;
	/* The path is the plan's from here on: ws sized for one path, so the
	 * run takes that one whatever a later plan set the switch to. */
	np->ln.warp = ln_warp_fits(cc);
	np->ws = np->ln.warp ? ln_warp_ws(rows, (int)cc) : ln_fused_ws(rows, (int)cc);
	return LOOM_OK;
}

/* LOOM_CUDA_LN_BWD=warp: dx with the siblings dgamma and dbeta, a warp
 * per row in fp32, then one fold of the blocks' parts. dx is added into
 * the residual's other gradient where the plan fused the sum
 * (LOOM_CUDA_LN_BWD_ACCUM). */
static loom_status layernorm_bwd_warp(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				      const loom_cuda_io *io, unsigned *amax)
{
	const loom_node *n = loom_cuda_node(plan, v);
	const loom_cuda_ln_plan *lp = &c->plans[v].ln;
	const int64_t rows = loom_shape_rows(&n->shape);
	const int cc = (int)loom_shape_last(&n->shape);
	int accdt = LOOM_F32;
	const void *acc = loom_cuda_addend(plan, v, io, &accdt);
	const void *ptrs[5] = { io->src[0], io->src[1], io->src[2], io->out, acc };
	const size_t shm = 2 * sizeof(float) * (size_t)cc;
	const double *stats = (const double *)loom_cuda_saved_slot(c, v, LOOM_NONE);
	float *part = (float *)c->arena->ws;
	int64_t per;
	unsigned blocks;
	ln_warp_grid(rows, &per, &blocks);
	if (ln_vec8(cc, ptrs, acc ? 5 : 4))
		loom_layernorm_bwd_warp_kernel<8, 4><<<blocks, ln_warp_threads, shm, c->stream>>>(
			rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], (float)n->a.ln.eps, io->out, io->odt, stats, part, acc, accdt,
			amax);
	else
		loom_layernorm_bwd_warp_kernel<1, 32><<<blocks, ln_warp_threads, shm, c->stream>>>(
			rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], (float)n->a.ln.eps, io->out, io->odt, stats, part, acc, accdt,
			amax);
	loom_status st = LOOM_CUDA_LAUNCHED(c->err);
	if (st != LOOM_OK || (lp->dgamma == LOOM_NONE && lp->dbeta == LOOM_NONE))
		return st;
	void *dg = lp->dgamma == LOOM_NONE ? NULL : loom_arena_ptr(c->arena, plan, lp->dgamma);
	void *db = lp->dbeta == LOOM_NONE ? NULL : loom_arena_ptr(c->arena, plan, lp->dbeta);
	const int dgdt = dg ? loom_cuda_node(plan, lp->dgamma)->dtype : LOOM_F32;
	const int dbdt = db ? loom_cuda_node(plan, lp->dbeta)->dtype : LOOM_F32;
	dim3 grid((unsigned)((2 * cc + ln_cols - 1) / ln_cols)), block(ln_cols, ln_lanes);
	loom_layernorm_bwd_warp_fold_kernel<<<grid, block, 0, c->stream>>>((int)blocks, cc, part, dg,
									    dgdt, db, dbdt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* dx with its siblings dgamma and dbeta (those the plan found), in one
 * pass; then each sibling's chunk parts folded in order. */
static loom_status layernorm_bwd_fused(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				       const loom_cuda_io *io, unsigned *amax)
{
	const loom_node *n = loom_cuda_node(plan, v);
	const loom_cuda_ln_plan *lp = &c->plans[v].ln;
	const int64_t rows = loom_shape_rows(&n->shape);
	const int cc = (int)loom_shape_last(&n->shape);
	int64_t per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	double *part_g = (double *)c->arena->ws;
	double *part_b = (double *)((char *)c->arena->ws +
				    loom_cuda_align(sizeof(double) * (size_t)chunks * (size_t)cc));
	int accdt = LOOM_F32;
	const void *acc = loom_cuda_addend(plan, v, io, &accdt);
	const void *ptrs[5] = { io->src[0], io->src[1], io->src[2], io->out, acc };
	const size_t shm = 2 * sizeof(double) * (size_t)cc;
	const double *stats = (const double *)loom_cuda_saved_slot(c, v, LOOM_NONE);
	if (ln_vec8(cc, ptrs, acc ? 5 : 4))
		loom_layernorm_bwd_fused_kernel<8><<<(unsigned)chunks, ln_bwd_threads, shm, c->stream>>>(
			rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], n->a.ln.eps, io->out, io->odt, part_g, part_b, stats, acc, accdt,
			amax);
	else
		loom_layernorm_bwd_fused_kernel<1><<<(unsigned)chunks, ln_bwd_threads, shm, c->stream>>>(
			rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], n->a.ln.eps, io->out, io->odt, part_g, part_b, stats, acc, accdt,
			amax);
	loom_status st = LOOM_CUDA_LAUNCHED(c->err);
	const loom_value sib[2] = { lp->dgamma, lp->dbeta };
	const double *part[2] = { part_g, part_b };
	for (int i = 0; i < 2 && st == LOOM_OK; i++) {
		if (sib[i] == LOOM_NONE)
			continue;
		loom_colsum_fold_kernel<<<loom_cuda_blocks(cc, threads), threads, 0, c->stream>>>(
			chunks, cc, part[i], loom_arena_ptr(c->arena, plan, sib[i]), loom_cuda_node(plan, sib[i])->dtype);
		st = LOOM_CUDA_LAUNCHED(c->err);
	}
	return st;
}

loom_status loom_cuda_op_layernorm_bwd_data(loom_cuda_ctx *c, const loom_plan *plan,
					    loom_value v, const loom_cuda_io *io)
{
	const loom_node *n = loom_cuda_node(plan, v);
	unsigned *amax;
	loom_status st;
	const int64_t rows = ln_rows_begin(c, plan, v, &amax, &st);
	if (rows <= 0)
		return st;
	if (c->plans[v].kind == LOOM_CUDA_PLAN_LN && c->plans[v].ln.warp)
		return layernorm_bwd_warp(c, plan, v, io, amax);
	if (c->plans[v].kind == LOOM_CUDA_PLAN_LN)
		return layernorm_bwd_fused(c, plan, v, io, amax);
	int accdt = LOOM_F32;
	const void *acc = loom_cuda_addend(plan, v, io, &accdt);
	loom_layernorm_bwd_data_kernel<<<(unsigned)rows, threads, 0, c->stream>>>(
		(int)loom_shape_last(&n->shape), io->src[0], io->dt[0], io->src[1], io->dt[1],
		io->src[2], io->dt[2], n->a.ln.eps, io->out, io->odt, acc, accdt, amax);
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_layernorm_bwd_gamma(loom_cuda_ctx *c, const loom_plan *plan,
					     loom_value v, const loom_cuda_io *io)
{
	const loom_node *n = loom_cuda_node(plan, v), *x = loom_cuda_src(plan, v, 0);
	int64_t rows = loom_shape_rows(&x->shape);
	int cc = (int)loom_shape_last(&x->shape);
	double *stats = (double *)c->arena->ws;
	if (rows <= 0)
		return LOOM_OK;
	loom_layernorm_stats_kernel<<<(unsigned)rows, threads, 0, c->stream>>>(
		cc, io->src[0], io->dt[0], n->a.ln.eps, stats);
	loom_status st = LOOM_CUDA_LAUNCHED(c->err);
	if (st != LOOM_OK)
		return st;
	int64_t per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	double *part = (double *)((char *)c->arena->ws + loom_cuda_align(2 * sizeof(double) * (size_t)rows));
	if (cc <= 0)
		return LOOM_OK;
	dim3 grid((unsigned)((cc + LOOM_COLSUM_COLS - 1) / LOOM_COLSUM_COLS), (unsigned)chunks),
		block(LOOM_COLSUM_COLS, LOOM_COLSUM_LANES);
	loom_layernorm_bwd_gamma_part_kernel<<<grid, block, 0, c->stream>>>(
		rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], stats, part);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	loom_colsum_fold_kernel<<<loom_cuda_blocks(cc, threads), threads, 0, c->stream>>>(
		chunks, cc, part, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* --dump-graph: which path layer norm took. */
void loom_cuda_ln_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
		       size_t len)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	const int saves = np->saved_by == v, reads = np->saved_by != LOOM_NONE && np->saved_by != v;
	switch (loom_cuda_node(p, v)->op) {
	case LOOM_OP_LAYERNORM:
		snprintf(buf, len, "%s%s",
			 loom_cuda_ln_residual_makes(p, loom_cuda_node(p, v)->made_by, v) ?
				 "made by its residual add, a warp per row" :
			 ln_fwd_warp_fits(loom_shape_rows(&loom_cuda_node(p, v)->shape)) ?
				 "warp per row" : "block per row",
			 saves ? ", saves mean and rstd" : "");
		break;
	default: /* LAYERNORM_BWD_DATA */
		snprintf(buf, len, "%s%s%s", np->kind != LOOM_CUDA_PLAN_LN ? "separate kernels" :
					     np->ln.warp ? "warp per row in fp32 with dgamma, dbeta" :
					     "one pass with dgamma, dbeta",
			 reads ? ", reads the saved mean and rstd" : ", recomputes mean and rstd",
			 (loom_cuda_node(p, v)->flags & LOOM_NODE_ACCUM) ?
				 ", dx added into the residual's gradient" : "");
		break;
	}
}
